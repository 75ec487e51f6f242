//! A score change applied to the in-memory state: the one path live writes
//! and replay share, so a restart rebuilds exactly what the writes built.

use super::holdings::Holdings;
use super::short_index::{Crossing, LeftOut, SMALL_TREE};
use super::short_names::is_own_tiebreak;
use crate::board::BoardConfig;
use crate::key::{self, TreeId};
use crate::log;
use crate::overlay::Overlay;
use crate::tree::CountTree;

/// A change to the set of scores held in a dense-ranked tree, reported by
/// [`Shard::commit`](super::Shard::commit) so the engine-wide distinct-score
/// index can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseChange {
    /// The tree whose score set changed: each has its own distinct-score index.
    pub tree: TreeId,
    /// Score key that lost a player.
    pub removed: Option<u64>,
    /// Score key that gained a player.
    pub added: Option<u64>,
}

/// Where [`apply_change`] puts a change's count-tree changes.
pub(super) enum TreeCounts<'a> {
    /// Into the change's tree at once (live writes).
    Apply(&'a mut CountTree),
    /// Gathered, to go into the trees in key order (replay).
    Gather(&'a mut GatheredCounts),
}

/// Count-tree changes gathered during replay and applied in key order:
/// applied in log order each walks to a random leaf and misses the CPU
/// caches, sorted consecutive changes land in the same or the next leaf.
/// The counts are sums, so the order does not change them; equal keys are
/// summed first, so a removal never reaches a key before the addition that
/// the log had before it.
#[derive(Debug, Default)]
pub(super) struct GatheredCounts {
    /// `(tree, key, delta)` in log order until [`GatheredCounts::apply`]
    /// sorts them.
    changes: Vec<(TreeId, u128, i64)>,
}

impl GatheredCounts {
    /// Changes held before they are applied: bounds the buffer (48 bytes a
    /// change, so ~50 MB) on a long log.
    const MAX_HELD: usize = 1 << 20;

    fn push(&mut self, tree: TreeId, key: u128, delta: i64) {
        self.changes.push((tree, key, delta));
    }

    pub(super) fn is_full(&self) -> bool {
        self.changes.len() >= Self::MAX_HELD
    }

    /// Applies every gathered change to `trees`, in tree and key order. A
    /// tree the changes touch exists afterwards even where they cancel out,
    /// as it does when they are applied in log order.
    pub(super) fn apply(&mut self, trees: &mut Holdings) {
        self.changes.sort_unstable_by_key(|&(tree, key, _)| (tree, key));
        let mut changes = self.changes.drain(..).peekable();
        while let Some((tree, key, mut delta)) = changes.next() {
            while let Some((_, _, more)) = changes.next_if(|&(t, k, _)| (t, k) == (tree, key)) {
                delta += more;
            }
            let counts = trees.tree_or_new(tree);
            if delta != 0 {
                counts.add(key, delta);
            }
        }
    }
}

/// What [`apply_change`] did to the trees.
pub(super) struct Applied {
    /// The score keys the tree lost and gained, for dense ranks.
    pub(super) dense: DenseChange,
    /// Applied at once: each tree key changed (the old one, the new one)
    /// with its change and how many players hold it after, for the tie
    /// groups.
    pub(super) keys: [Option<KeyChange>; 2],
    /// Whether the change took its tree's player count across the bound
    /// below which its short names are kept out of the index.
    pub(super) crossing: Option<Crossing>,
}

/// A tree key's count changed by `delta`, to `count`.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyChange {
    pub(super) key: u128,
    pub(super) delta: i64,
    pub(super) count: u64,
}

/// Applies a score change to the in-memory state: the count tree always,
/// and the overlay's player record (under the player's storage key, given
/// with it) and index entries when given (a replayed change that runs
/// already hold leaves it out). Shared by live writes and replay, so a
/// restart rebuilds exactly what the writes built. With `left_out` a live
/// change to a small tree stages no index change or record for a short
/// name (see `short_index`); replay stages them all and settles afterwards.
pub(super) fn apply_change(
    mut counts: TreeCounts<'_>,
    mut overlay: Option<(&mut Overlay, Vec<u8>)>,
    config: &BoardConfig,
    change: &log::Change<'_>,
    left_out: LeftOut,
) -> Applied {
    let (order, ties) = (config.order, config.ties);
    let log::Change { tree, player, old, new } = *change;
    let (large, crossing) = match &counts {
        TreeCounts::Apply(count_tree) if left_out.any() => {
            let before = count_tree.total();
            let after = (before + u64::from(new.is_some())).saturating_sub(u64::from(old.is_some()));
            (before > SMALL_TREE, Crossing::of(before, after))
        }
        _ => (true, None),
    };
    let short = is_own_tiebreak(player);
    let (indexed, recorded) = (large || !(short && left_out.index), large || !(short && left_out.records));
    let mut dense = DenseChange { tree, removed: None, added: None };
    let mut keys = [None; 2];
    // Each record's score key and tree key, made once.
    let steps = [(old, -1i64), (new, 1)].map(|(record, delta)| {
        record.map(|record| (record, key::score_key(record.score, order), record.tree_key(player, ties, order), delta))
    });
    if let (TreeCounts::Apply(count_tree), [Some(_), Some((_, _, new_key, _))]) = (&counts, steps) {
        count_tree.prefetch(new_key);
    }
    for (step, (record, sk, tree_key, delta)) in steps.into_iter().enumerate().filter_map(|(i, s)| Some((i, s?))) {
        match &mut counts {
            TreeCounts::Apply(count_tree) => {
                let count = count_tree.add(tree_key, delta);
                keys[step] = Some(KeyChange { key: tree_key, delta, count });
            }
            TreeCounts::Gather(gathered) => gathered.push(tree, tree_key, delta),
        }
        if let Some((overlay, _)) = overlay.as_mut().filter(|_| indexed) {
            overlay.set_index(tree, sk, key::list_position_tail(ties, record.seq, player), delta > 0);
        }
        if delta > 0 {
            dense.added = Some(sk);
        } else {
            dense.removed = Some(sk);
        }
    }
    if let Some((overlay, key)) = overlay.filter(|_| recorded) {
        overlay.set_record(key, new);
    }
    Applied { dense, keys, crossing }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Replay's gathered changes, applied in key order, make the trees
        /// that applying them in log order makes: equal keys are summed first,
        /// so a removal the log has after an addition of the same key never
        /// meets an absent key.
        #[test]
        fn gathered_counts_make_the_trees_the_log_order_makes(
            ops in proptest::collection::vec((0u64..2, 0u128..40, proptest::bool::ANY), 1..400),
        ) {
            let mut in_order = Holdings::new(4);
            let mut sorted = Holdings::new(4);
            let mut gathered = GatheredCounts::default();
            let mut held: std::collections::HashMap<(TreeId, u128), u64> = Default::default();
            for (board, key, add) in ops {
                let tree = TreeId { board, window: 0, period: 0 };
                let count = held.entry((tree, key)).or_default();
                // The log only removes what it added before.
                let delta = if add || *count == 0 { 1 } else { -1 };
                *count = count.saturating_add_signed(delta);
                in_order.tree_or_new(tree).add(key, delta);
                gathered.push(tree, key, delta);
            }
            gathered.apply(&mut sorted);
            for (tree, expected) in in_order.trees() {
                proptest::prop_assert_eq!(sorted.tree(&tree).map(|t| t.entries()), Some(expected.entries()));
            }
            proptest::prop_assert_eq!(sorted.tree_count(), in_order.tree_count());
        }
    }
}
