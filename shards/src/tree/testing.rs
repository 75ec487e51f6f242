//! What the tree's tests share: an oracle, keys that stress the tree's
//! edges, and a model of the disk a checkpoint writes to.

use super::{CountTree, LeafEncoding, LeafId, LeafSlice, SlicePicker};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// The oracle: a plain multiset of keys.
#[derive(Default)]
pub(super) struct Oracle(pub(super) BTreeMap<u128, u64>);

impl Oracle {
    pub(super) fn add(&mut self, key: u128, delta: i64) {
        let c = self.0.entry(key).or_default();
        *c = c.saturating_add_signed(delta);
        if *c == 0 {
            self.0.remove(&key);
        }
    }
    /// `(key, count)` pairs in key order, as [`CountTree::entries`] gives them.
    pub(super) fn entries(&self) -> Vec<(u128, u64)> {
        self.0.iter().map(|(k, c)| (*k, *c)).collect()
    }
    pub(super) fn before(&self, key: u128) -> u64 {
        self.0.range(..key).map(|(_, c)| c).sum()
    }
}

pub(super) fn extreme_key() -> impl Strategy<Value = u128> {
    prop_oneof![
        Just(0u128),
        Just(u128::MAX),
        Just(1u128 << 127),
        (0u64..8).prop_map(|x| (u128::from(x) << 64) | 7),
        (any::<u64>(), 0u64..4).prop_map(|(hi, lo)| (u128::from(hi) << 64) | u128::from(lo)),
        any::<u128>(),
    ]
}

/// A leaf a checkpoint writes: its encoding, or `None` to delete it.
pub(super) type Written = (LeafId, Option<Vec<u8>>);

/// Appends to `out` the leaves `picker` writes for `slice`, the next
/// slice of its snapshot.
pub(super) fn pick_into(picker: &mut SlicePicker, slice: LeafSlice, encoding: LeafEncoding, out: &mut Vec<Written>) {
    picker
        .pick(slice, encoding, |id, bytes| {
            out.push((id, bytes));
            Ok::<(), ()>(())
        })
        .unwrap();
}

/// The leaves a checkpoint of `slice` (taken at once) writes, in order.
pub(super) fn written(slice: LeafSlice, encoding: LeafEncoding) -> Vec<Written> {
    let mut out = Vec::new();
    pick_into(&mut SlicePicker::default(), slice, encoding, &mut out);
    out
}

/// Writes a checkpoint's `written` leaves to `disk`: in key order, once each.
pub(super) fn store_written(disk: &mut BTreeMap<LeafId, Vec<u8>>, written: Vec<Written>) {
    assert!(written.windows(2).all(|w| w[0].0 < w[1].0), "changed leaves in key order, once each");
    for (id, bytes) in written {
        match bytes {
            Some(b) => disk.insert(id, b),
            None => disk.remove(&id),
        };
    }
}

/// Writes a checkpoint of `leaves` (taken at once) to `disk`.
pub(super) fn store(disk: &mut BTreeMap<LeafId, Vec<u8>>, leaves: LeafSlice, encoding: LeafEncoding) {
    store_written(disk, written(leaves, encoding));
}

pub(super) fn loaded(disk: &BTreeMap<LeafId, Vec<u8>>, branching: u32, encoding: LeafEncoding) -> CountTree {
    let mut fresh = CountTree::new(branching).unwrap();
    for (id, bytes) in disk {
        fresh.install_leaf(*id, bytes, encoding).unwrap();
    }
    fresh
}
