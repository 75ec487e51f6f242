//! A small board's tree at rest.
//!
//! Most boards of a server of a million are small and, most of the time,
//! idle: a compact tree (one sorted leaf) whose change is already in a
//! checkpoint and that no snapshot is copying. Such a tree needs none of a
//! live [`CountTree`]'s bookkeeping (its checkpoint round, its snapshot
//! epoch, the box of leaves changed): frozen, it is its root leaf's entries
//! alone, 12 bytes a shard keeps inline in the board's entry instead of a
//! 48-byte box and the pointer to it. Reads take it as it is
//! ([`TreeView`]); the first write thaws it back into a live tree, and it
//! freezes again once a checkpoint has taken its change.

use std::fmt;
use std::ptr::NonNull;

use super::encoding::decode_leaf;
use super::entries::Entries;
use super::node::{Entry, Leaf, Node, NodeRef};
use super::{CorruptLeaf, CountTree, LeafEncoding, RootSnapshot, TreeView};

/// An idle compact tree: see the module docs.
#[derive(Debug)]
pub struct FrozenTree {
    /// The root leaf's entries, sorted by key.
    pub(super) entries: FrozenEntries,
}

/// 12 bytes, 4-aligned: with its variant's tag a board's entry keeps it in
/// 16 (see `shard::holdings`).
const _: () = assert!(std::mem::size_of::<FrozenTree>() == 12);

/// A frozen leaf's entries: a boxed slice (exactly as long as the leaf, as
/// nothing is added to it) whose length is a `u32`, packed to 12 bytes. A
/// frozen tree needs neither the spare capacity a live leaf keeps for its
/// next insert nor the field that says how much.
#[repr(C, packed(4))]
pub(super) struct FrozenEntries {
    ptr: NonNull<Entry>,
    len: u32,
}

// SAFETY: `FrozenEntries` owns its buffer of plain `Copy` data, as a
// `Box<[Entry]>` does, which is `Send` and `Sync`.
unsafe impl Send for FrozenEntries {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for FrozenEntries {}

impl FrozenEntries {
    /// A leaf's entries, their buffer cut to their length. A leaf never
    /// nears `u32::MAX` entries (see `entries`).
    fn new(entries: Entries) -> Self {
        let boxed = entries.into_vec().into_boxed_slice();
        let len = u32::try_from(boxed.len()).expect("a leaf's entries number far fewer than u32::MAX");
        // `Box::into_raw` is never null (dangling when nothing is allocated).
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<Entry>()).unwrap_or(NonNull::dangling());
        Self { ptr, len }
    }

    fn as_slice(&self) -> &[Entry] {
        let (ptr, len) = (self.ptr, self.len);
        // SAFETY: `ptr` and `len` came from a boxed slice this owns (see
        // `new`): initialized, aligned, non-null even when empty.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len as usize) }
    }

    /// The buffer back as the boxed slice it was.
    fn into_boxed(self) -> Box<[Entry]> {
        let this = std::mem::ManuallyDrop::new(self);
        let (ptr, len) = (this.ptr, this.len);
        // SAFETY: from the boxed slice `new` took apart, whose only owner
        // was `this`, which is never dropped.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len as usize)) }
    }

    /// The entries, as a live leaf holds them.
    fn into_entries(self) -> Entries {
        Entries::from(self.into_boxed().into_vec())
    }

    /// The address of the buffer, for the allocator to judge.
    pub(super) fn address(&self) -> *const u8 {
        let ptr = self.ptr;
        ptr.as_ptr().cast()
    }

    /// Moves the entries to a fresh allocation (see `repack`).
    pub(super) fn move_buffer(&mut self) {
        let fresh: Box<[Entry]> = self.as_slice().into();
        let len = self.len;
        let ptr = NonNull::new(Box::into_raw(fresh).cast::<Entry>()).unwrap_or(NonNull::dangling());
        drop(std::mem::replace(self, Self { ptr, len }));
    }
}

impl Drop for FrozenEntries {
    fn drop(&mut self) {
        let (ptr, len) = (self.ptr, self.len);
        // SAFETY: as in `into_boxed`; `self` is not used after this.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len as usize)) });
    }
}

impl fmt::Debug for FrozenEntries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl FrozenTree {
    /// Its reads, for a shard whose trees branch `branching` ways.
    pub fn view(&self, branching: u32) -> TreeView<'_> {
        TreeView { root: NodeRef::Leaf(self.entries.as_slice()), bits: branching.trailing_zeros() }
    }

    /// The compact tree stored as `bytes`, its root leaf, loaded frozen
    /// (`None` if it holds no player): a restart makes a million small
    /// boards' trees without a live tree's box for each.
    pub fn load_root(bytes: &[u8], encoding: LeafEncoding) -> Result<Option<Self>, CorruptLeaf> {
        let leaf = decode_leaf(bytes, encoding)?;
        // Every key is inside the root's range.
        Ok((!leaf.entries.is_empty()).then(|| Self { entries: FrozenEntries::new(leaf.entries) }))
    }

    /// A live tree again, to change. `branching` is the shard's, validated
    /// when it opened.
    pub fn thaw(self, branching: u32) -> Box<CountTree> {
        let mut tree = CountTree::new(branching).expect("branching validated at open");
        // Unmarked (not changed since the last checkpoint) and of the new
        // tree's epoch (nothing a snapshot needs).
        let entries = self.entries.into_entries();
        tree.root = Node::Leaf(Leaf { entries, epoch: tree.epoch, marked: 0 });
        Box::new(tree)
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
        Ok(FrozenTree { entries: FrozenEntries::new(root.entries) })
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

    /// The packed buffer keeps a leaf's entries exactly, through a move
    /// to a fresh allocation and back into a live leaf; empty too.
    #[test]
    fn frozen_entries_keep_the_leaf() {
        for n in [0u64, 1, 2, 5, 64] {
            let entries: Vec<Entry> = (0..n).map(|i| Entry::new(u128::from(i) * 3, i + 1)).collect();
            let mut frozen = FrozenEntries::new(Entries::from(entries.clone()));
            assert_eq!(frozen.as_slice(), entries.as_slice());
            let before = frozen.address();
            frozen.move_buffer();
            assert!(n == 0 || frozen.address() != before, "moved to a fresh allocation");
            assert_eq!(format!("{frozen:?}"), format!("{entries:?}"));
            assert_eq!(&*frozen.into_entries(), entries.as_slice());
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
