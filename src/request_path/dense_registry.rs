//! The distinct-score indexes of dense-ranked boards, across all shards.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use rankd_shards::{DenseChange, DenseIndex, TreeId};

/// A dense rank counts distinct better scores over the whole board, which no
/// shard knows alone: each shard reports how its trees' score sets change
/// as it stages each write, and the router reads the sum here. Shared by
/// the shards and the router; every call takes the lock once.
#[derive(Clone)]
pub struct DenseRegistry {
    /// One index per dense-ranked tree, shared by every shard and the router.
    indexes: Arc<Mutex<HashMap<TreeId, DenseIndex>>>,
    /// The branching factor new indexes' count trees are built with.
    branching: u32,
}

/// One shard's share of the indexes: per tree, `(score key, players)`.
pub type DenseShare = HashMap<TreeId, Vec<(u64, u64)>>;

impl DenseRegistry {
    /// Empty indexes over trees of `branching`.
    pub fn new(branching: u32) -> Self {
        Self { indexes: Arc::default(), branching }
    }

    /// Applies changes of dense trees' score sets (without taking the lock
    /// when there are none: most boards are not dense).
    pub fn apply(&self, changes: impl ExactSizeIterator<Item = DenseChange>) {
        if changes.len() == 0 {
            return;
        }
        let mut indexes = self.indexes.lock();
        for change in changes {
            let Some(index) = index_of(&mut indexes, change.tree, self.branching) else { continue };
            if let Some(sk) = change.removed {
                index.remove(sk, 1);
            }
            if let Some(sk) = change.added {
                index.add(sk, 1);
            }
        }
    }

    /// Replaces one shard's share: `reported` is what its batches had
    /// reported, `holds` what its (re)opened storage holds. From an empty
    /// `reported`, this is how a starting server builds the indexes.
    pub fn replace_share(&self, reported: &DenseShare, holds: &DenseShare) {
        let trees: HashSet<TreeId> = reported.keys().chain(holds.keys()).copied().collect();
        let mut indexes = self.indexes.lock();
        for tree in trees {
            let (before, after) = (reported.get(&tree), holds.get(&tree));
            if before == after {
                continue;
            }
            let Some(index) = index_of(&mut indexes, tree, self.branching) else { continue };
            index.replace_share(before.map_or(&[][..], Vec::as_slice), after.map_or(&[][..], Vec::as_slice));
        }
    }

    /// Distinct score keys better than `score_key` in `tree`.
    pub fn distinct_before(&self, tree: TreeId, score_key: u64) -> u64 {
        self.indexes.lock().get(&tree).map_or(0, |index| index.distinct_before(score_key))
    }

    /// The dense rank of each score key in `tree`, under one lock.
    pub fn ranks(&self, tree: TreeId, score_keys: &[u64]) -> Vec<u64> {
        let indexes = self.indexes.lock();
        let index = indexes.get(&tree);
        score_keys.iter().map(|&sk| 1 + index.map_or(0, |d| d.distinct_before(sk))).collect()
    }

    /// Forgets expired trees.
    pub fn forget(&self, trees: &[TreeId]) {
        let mut indexes = self.indexes.lock();
        for tree in trees {
            indexes.remove(tree);
        }
    }

    /// Forgets every tree of a dropped board.
    pub fn forget_board(&self, board: u64) {
        self.indexes.lock().retain(|tree, _| tree.board != board);
    }
}

/// The index of `tree`; a new period of a dense board starts its index here.
fn index_of(indexes: &mut HashMap<TreeId, DenseIndex>, tree: TreeId, branching: u32) -> Option<&mut DenseIndex> {
    match indexes.entry(tree) {
        Entry::Occupied(e) => Some(e.into_mut()),
        Entry::Vacant(e) => DenseIndex::new(branching).ok().map(|index| e.insert(index)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(board: u64) -> TreeId {
        TreeId { board, window: 0, period: 0 }
    }

    fn added(t: TreeId, sk: u64) -> DenseChange {
        DenseChange { tree: t, removed: None, added: Some(sk) }
    }

    #[test]
    fn replacing_a_share_touches_each_tree_once() {
        let registry = DenseRegistry::new(16);
        let reported = HashMap::from([(tree(1), vec![(10, 1), (20, 1)]), (tree(2), vec![(5, 1)])]);
        let holds = HashMap::from([(tree(1), vec![(20, 1)]), (tree(3), vec![(7, 2)])]);
        // Another shard holds 10 in tree 1 too.
        registry.apply([added(tree(1), 10)].into_iter());
        for (t, counts) in &reported {
            for &(sk, n) in counts {
                registry.apply((0..n as usize).map(|_| added(*t, sk)));
            }
        }
        registry.replace_share(&reported, &holds);
        // Tree 1 (in both maps): 10 still held by the other shard, 20 by this one.
        assert_eq!(registry.distinct_before(tree(1), u64::MAX), 2);
        assert_eq!(registry.distinct_before(tree(2), u64::MAX), 0, "only reported: taken out");
        assert_eq!(registry.distinct_before(tree(3), u64::MAX), 1, "only held: added");
        assert_eq!(registry.ranks(tree(1), &[5, 15, 25]), [1, 2, 3]);
    }

    #[test]
    fn dropped_boards_and_expired_trees_are_forgotten() {
        let registry = DenseRegistry::new(16);
        let other = TreeId { board: 1, window: 1, period: 7 };
        registry.apply([added(tree(1), 3), added(other, 3), added(tree(2), 3)].into_iter());
        registry.forget(&[other]);
        assert_eq!(registry.distinct_before(other, u64::MAX), 0);
        assert_eq!(registry.distinct_before(tree(1), u64::MAX), 1);
        registry.forget_board(1);
        assert_eq!((registry.distinct_before(tree(1), u64::MAX), registry.distinct_before(tree(2), u64::MAX)), (0, 1));
    }
}
