//! A small board's tree at rest.
//!
//! Most boards of a server of a million are small and, most of the time,
//! idle: a compact tree (one sorted leaf) whose change is already in a
//! checkpoint and that no snapshot is copying. Such a tree needs none of a
//! live [`CountTree`]'s bookkeeping (its checkpoint round, its snapshot
//! epoch, the box of leaves changed): frozen, it is its root leaf's entries
//! alone, 16 bytes a shard keeps inline in the board's entry instead of a
//! 48-byte box and the pointer to it. Reads take it as it is
//! ([`TreeView`]); the first write thaws it back into a live tree, and it
//! freezes again once a checkpoint has taken its change.

use super::encoding::decode_leaf;
use super::entries::Entries;
use super::node::{Leaf, Node, NodeRef};
use super::{CorruptLeaf, CountTree, LeafEncoding, RootSnapshot, TreeView};

/// An idle compact tree: see the module docs.
#[derive(Debug)]
pub struct FrozenTree {
    /// The root leaf's entries, sorted by key.
    pub(super) entries: Entries,
}

const _: () = assert!(std::mem::size_of::<FrozenTree>() == 16);

impl FrozenTree {
    /// Its reads, for a shard whose trees branch `branching` ways.
    pub fn view(&self, branching: u32) -> TreeView<'_> {
        TreeView { root: NodeRef::Leaf(&self.entries), bits: branching.trailing_zeros() }
    }

    /// The compact tree stored as `bytes`, its root leaf, loaded frozen
    /// (`None` if it holds no player): a restart makes a million small
    /// boards' trees without a live tree's box for each.
    pub fn load_root(bytes: &[u8], encoding: LeafEncoding) -> Result<Option<Self>, CorruptLeaf> {
        let leaf = decode_leaf(bytes, encoding)?;
        // Every key is inside the root's range.
        Ok((!leaf.entries.is_empty()).then_some(Self { entries: leaf.entries }))
    }

    /// A live tree again, to change. `branching` is the shard's, validated
    /// when it opened.
    pub fn thaw(self, branching: u32) -> Box<CountTree> {
        let mut tree = CountTree::new(branching).expect("branching validated at open");
        // Unmarked (not changed since the last checkpoint) and of the new
        // tree's epoch (nothing a snapshot needs).
        tree.root = Node::Leaf(Leaf { entries: self.entries, epoch: tree.epoch, marked: 0 });
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
        Ok(FrozenTree { entries: root.entries })
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
