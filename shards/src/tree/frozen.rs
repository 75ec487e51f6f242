//! A small board's tree at rest.
//!
//! Most boards of a server of a million are small and, most of the time,
//! idle: a compact tree (one sorted leaf) whose change is already in a
//! checkpoint and that no snapshot is copying. Such a tree needs none of a
//! live [`CountTree`]'s bookkeeping (its checkpoint round, its snapshot
//! epoch, the box of leaves changed), nor its entries' 20 bytes each:
//! frozen, it is its root leaf's entries packed (see `packed`), 15 bytes a
//! shard keeps in the board's own entry, holding the packed bytes when they
//! fit (a leaf of two players, as most boards of five have on each of two
//! shards) and a pointer to them otherwise. A rank and a count read the
//! packed bytes in place, other reads unpack them onto the stack
//! ([`TreeView`]); the first write thaws the tree back into a live one, and
//! it freezes again once a checkpoint has taken its change.

use std::fmt;
use std::ptr::NonNull;

use super::encoding::decode_leaf;
use super::node::{Entry, Leaf, Node};
use super::packed::{pack, Packed, PackedLeaf, Trim, Unpacked};
use super::{CorruptLeaf, CountTree, LeafEncoding, RootSnapshot, TreeView, LEAF_CAPACITY};

/// Packed bytes a frozen tree holds without an allocation.
const INLINE: usize = 14;

/// Bit of [`FrozenTree::head`]: the packed bytes are on the heap.
const ON_HEAP: u8 = 0x80;
/// Bit of [`FrozenTree::head`]: the packed tiebreaks are trimmed in front.
const TRIM_LEADING: u8 = 0x40;
/// Bits of [`FrozenTree::head`]: how many bytes are inline.
const INLINE_LEN: u8 = 0x0f;

/// An idle compact tree: see the module docs.
pub struct FrozenTree {
    /// [`ON_HEAP`], [`TRIM_LEADING`] and, inline, [`INLINE_LEN`].
    head: u8,
    body: Body,
}

/// 15 bytes, 1-aligned: with its variant's tag a board's entry keeps it in
/// 16 (see `shard::holdings`).
const _: () = assert!(std::mem::size_of::<FrozenTree>() == 15 && std::mem::align_of::<FrozenTree>() == 1);

/// The packed bytes, or where they are.
#[derive(Clone, Copy)]
#[repr(C, packed)]
union Body {
    inline: [u8; INLINE],
    heap: HeapBytes,
}

/// A boxed byte slice taken apart, its length a `u32` (a packed leaf is at
/// most a few KiB).
#[derive(Clone, Copy)]
#[repr(C, packed)]
struct HeapBytes {
    ptr: NonNull<u8>,
    len: u32,
}

// SAFETY: `FrozenTree` owns its heap bytes, if any, as a `Box<[u8]>` does,
// which is `Send` and `Sync`.
unsafe impl Send for FrozenTree {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for FrozenTree {}

impl FrozenTree {
    /// A compact leaf's entries (at most [`LEAF_CAPACITY`]), frozen.
    fn new(entries: &[Entry]) -> Self {
        debug_assert!(entries.len() <= LEAF_CAPACITY);
        let mut bytes = Packed::new();
        let trim = pack(entries, &mut bytes);
        let trim_bit = if trim == Trim::Leading { TRIM_LEADING } else { 0 };
        let bytes = bytes.as_slice();
        if bytes.len() <= INLINE {
            let mut inline = [0u8; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            return Self { head: trim_bit | bytes.len() as u8, body: Body { inline } };
        }
        Self { head: ON_HEAP | trim_bit, body: Body { heap: HeapBytes::new(bytes.into()) } }
    }

    #[inline]
    fn trim(&self) -> Trim {
        if self.head & TRIM_LEADING != 0 {
            Trim::Leading
        } else {
            Trim::Trailing
        }
    }

    /// The heap bytes, if that is where they are.
    #[inline]
    fn heap(&self) -> Option<HeapBytes> {
        if self.head & ON_HEAP == 0 {
            return None;
        }
        // SAFETY: `ON_HEAP` says `new` wrote this field (only this is read:
        // inline bytes read as a pointer could be null).
        Some(unsafe { self.body.heap })
    }

    /// The packed bytes.
    #[inline]
    pub(super) fn bytes(&self) -> &[u8] {
        match self.heap() {
            // SAFETY: a boxed slice (see `HeapBytes::new`) this tree owns
            // and frees only when dropped or moved, which `&self` excludes.
            Some(heap) => unsafe { std::slice::from_raw_parts(heap.ptr.as_ptr(), heap.len as usize) },
            // SAFETY: no `ON_HEAP`: `new` wrote the inline bytes.
            None => unsafe { &self.body.inline[..usize::from(self.head & INLINE_LEN)] },
        }
    }

    /// The packed leaf, to read in place.
    #[inline]
    pub(super) fn leaf(&self) -> PackedLeaf<'_> {
        PackedLeaf::new(self.bytes(), self.trim())
    }

    /// The entries, on the stack.
    fn unpack(&self) -> Unpacked {
        let mut entries = Unpacked::new();
        self.leaf().unpack_into(&mut entries);
        entries
    }

    /// The address of the heap bytes (`None` if inline), for the allocator
    /// to judge.
    pub(super) fn address(&self) -> Option<*const u8> {
        self.heap().map(|heap| heap.ptr.as_ptr().cast_const())
    }

    /// Moves the heap bytes to a fresh allocation (see `repack`).
    pub(super) fn move_buffer(&mut self) {
        if let Some(old) = self.heap() {
            self.body.heap = HeapBytes::new(self.bytes().into());
            // SAFETY: `old` came from `HeapBytes::new` and nothing else
            // points at it any more.
            drop(unsafe { old.into_boxed() });
        }
    }

    /// Its reads, for a shard whose trees branch `branching` ways.
    pub fn view(&self, branching: u32) -> TreeView<'_> {
        TreeView::frozen(self, branching.trailing_zeros())
    }

    /// The compact tree stored as `bytes`, its root leaf, loaded frozen
    /// (`None` if it holds no player): a restart makes a million small
    /// boards' trees without a live tree's box for each.
    pub fn load_root(bytes: &[u8], encoding: LeafEncoding) -> Result<Option<Self>, CorruptLeaf> {
        let leaf = decode_leaf(bytes, encoding)?;
        // Every key is inside the root's range; a root past the capacity
        // has burst before it was stored.
        if leaf.entries.len() > LEAF_CAPACITY {
            return Err(CorruptLeaf("a root leaf past the leaf capacity"));
        }
        Ok((!leaf.entries.is_empty()).then(|| Self::new(&leaf.entries)))
    }

    /// A live tree again, to change. `branching` is the shard's, validated
    /// when it opened.
    pub fn thaw(self, branching: u32) -> Box<CountTree> {
        let mut tree = CountTree::new(branching).expect("branching validated at open");
        // Unmarked (not changed since the last checkpoint) and of the new
        // tree's epoch (nothing a snapshot needs).
        let leaf = self.leaf();
        let mut entries = Vec::with_capacity(leaf.len());
        leaf.unpack_into(&mut entries);
        let entries = entries.into();
        tree.root = Node::Leaf(Leaf { entries, epoch: tree.epoch, marked: 0 });
        Box::new(tree)
    }
}

impl HeapBytes {
    fn new(bytes: Box<[u8]>) -> Self {
        let len = u32::try_from(bytes.len()).expect("a packed leaf is a few KiB");
        // `Box::into_raw` is never null.
        let ptr = NonNull::new(Box::into_raw(bytes).cast::<u8>()).unwrap_or(NonNull::dangling());
        Self { ptr, len }
    }

    /// The boxed slice back.
    ///
    /// # Safety
    /// Once only, for bytes from [`HeapBytes::new`].
    unsafe fn into_boxed(self) -> Box<[u8]> {
        let (ptr, len) = (self.ptr, self.len);
        // SAFETY: the caller's promise.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len as usize)) }
    }
}

impl Drop for FrozenTree {
    fn drop(&mut self) {
        if let Some(heap) = self.heap() {
            // SAFETY: the tree owned the bytes and is gone after this.
            drop(unsafe { heap.into_boxed() });
        }
    }
}

impl fmt::Debug for FrozenTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenTree").field("entries", &self.unpack().as_slice()).finish()
    }
}

impl CountTree {
    /// The tree frozen if it is compact and idle: its root's change (if
    /// any) taken by a checkpoint, no snapshot begun or handed out, nothing
    /// pending. Otherwise the tree, unchanged.
    pub fn freeze(self: Box<Self>) -> Result<FrozenTree, Box<Self>> {
        let idle = self.is_compact()
            && self.pending.is_none()
            && self.root_snapshot == RootSnapshot::Off
            && !self.root_changed();
        if !idle {
            return Err(self);
        }
        let Node::Leaf(root) = self.root else { unreachable!("compact: the root is a leaf") };
        Ok(FrozenTree::new(&root.entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::testing::{extreme_key, loaded, store};
    use crate::tree::LeafId;

    fn tree_of(keys: &[u128]) -> Box<CountTree> {
        let mut tree = Box::new(CountTree::new(16).expect("branching"));
        for &key in keys {
            tree.add(key, 1);
        }
        tree
    }

    /// A frozen leaf keeps its entries exactly: inline while they pack in
    /// 14 bytes, on the heap past that, through a move to a fresh
    /// allocation, and back into a live leaf.
    #[test]
    fn a_frozen_leaf_keeps_its_entries_inline_or_on_the_heap() {
        let named = |i: u64| u128::from(0x7fff_ffff_c465_3600 + i * 1000) << 64 | u128::from(0x7030 + i) << 48;
        for n in [1u64, 2, 3, 5, 64] {
            let entries: Vec<Entry> = (0..n).map(|i| Entry::new(named(i), i + 1)).collect();
            let mut frozen = FrozenTree::new(&entries);
            assert_eq!(frozen.unpack().as_slice(), entries.as_slice());
            assert_eq!(frozen.address().is_none(), n <= 2, "{n} entries: {} bytes packed", frozen.bytes().len());
            let before = frozen.address();
            frozen.move_buffer();
            assert!(before.is_none() || frozen.address() != before, "moved to a fresh allocation");
            assert_eq!(format!("{frozen:?}"), format!("FrozenTree {{ entries: {entries:?} }}"));
            let thawed = frozen.thaw(16);
            assert_eq!(thawed.entries(), entries.iter().map(|e| (e.key(), e.count())).collect::<Vec<_>>());
        }
    }

    #[test]
    fn only_an_idle_compact_tree_freezes() {
        // Changed since the last checkpoint: its root must still be written.
        let tree = tree_of(&[3, 5, 5, 9]);
        let mut tree = tree.freeze().expect_err("changed");
        // Its change taken: idle.
        tree.take_dirty();
        let frozen = tree.freeze().expect("idle");
        assert_eq!(frozen.view(16).entries(), [(3, 1), (5, 2), (9, 1)]);
        assert_eq!((frozen.view(16).total(), frozen.view(16).count_before(6)), (4, 3));

        // A snapshot begun and not yet handed out keeps it live.
        let mut tree = frozen.thaw(16);
        tree.add(11, 1);
        tree.begin_snapshot();
        let mut tree = tree.freeze().expect_err("snapshot waiting");
        tree.continue_snapshot(1);
        let mut tree = tree.freeze().expect_err("snapshot reached");
        assert!(tree.take_slice().is_some_and(|slice| !slice.is_idle()));
        let tree = tree.freeze().expect("handed out whole");

        // A burst tree never freezes, even clean.
        let mut burst = tree_of(&(0..=crate::tree::LEAF_CAPACITY as u128).map(|k| k << 100).collect::<Vec<_>>());
        burst.take_dirty();
        assert!(burst.freeze().is_err());
        drop(tree);
    }

    proptest::proptest! {
        /// A frozen tree answers every read as the live tree it was.
        #[test]
        fn a_frozen_tree_reads_as_it_did_live(
            branching in proptest::sample::select(crate::tree::BRANCHINGS.to_vec()),
            keys in proptest::collection::vec((extreme_key(), 1i64..4), 1..=crate::tree::LEAF_CAPACITY),
            probes in proptest::collection::vec(extreme_key(), 1..20),
        ) {
            let mut tree = Box::new(CountTree::new(branching).expect("branching"));
            for &(key, count) in &keys {
                tree.add(key, count);
            }
            tree.take_dirty();
            let (live, mut sorted) = (tree.view(), probes.clone());
            sorted.sort_unstable();
            let shape = crate::tree::BucketShape { per_bucket: 2, max_buckets: 16, split_ties: false };
            let expected = (
                live.total(), live.entries(), live.crowded_keys(3), live.bucket_bounds(shape),
                live.count_before_sorted(&sorted), probes.iter().map(|&k| live.count_before(k)).collect::<Vec<_>>(),
            );
            let frozen = tree.freeze().expect("compact and idle");
            let view = frozen.view(branching);
            view.check().map_err(proptest::test_runner::TestCaseError::fail)?;
            view.prefetch_many(&probes);
            proptest::prop_assert!(view.is_compact());
            proptest::prop_assert_eq!(expected, (
                view.total(), view.entries(), view.crowded_keys(3), view.bucket_bounds(shape),
                view.count_before_sorted(&sorted), probes.iter().map(|&k| view.count_before(k)).collect::<Vec<_>>(),
            ));
        }
    }

    #[test]
    fn a_thawed_tree_is_clean_and_takes_writes_and_checkpoints() {
        let mut tree = tree_of(&[7, 8]);
        tree.take_dirty();
        let frozen = tree.freeze().expect("idle");
        let mut tree = frozen.thaw(16);
        tree.check().expect("consistent");
        assert!(tree.take_dirty_set().is_empty(), "thawed unchanged: nothing to write");
        tree.add(8, -1);
        tree.add(2, 1);
        assert_eq!(tree.entries(), [(2, 1), (7, 1)]);
        assert_eq!(tree.take_dirty_set().into_iter().collect::<Vec<_>>(), [LeafId::ROOT]);
        // A snapshot of the thawed tree copies its root as it was.
        tree.add(9, 1);
        tree.begin_snapshot();
        tree.add(2, -1); // copied before it changes
        let mut disk = std::collections::BTreeMap::new();
        store(&mut disk, tree.take_slice().expect("a snapshot"), LeafEncoding::Fixed);
        assert_eq!(loaded(&disk, 16, LeafEncoding::Fixed).entries(), [(2, 1), (7, 1), (9, 1)]);
        assert_eq!(tree.entries(), [(7, 1), (9, 1)]);
    }
}
