//! The look ahead: before a round applies a group of commands, the shard
//! asks the CPU for the memory each will wait for, so the waits overlap.

use super::reads::push_player_key;
use super::staging::combined;
use super::Shard;
use crate::board::{Amount, Board, Mode, Order, Ties};
use crate::cache::RecordCache;
use crate::key::TreeId;
use crate::record::Record;
use crate::window;

/// A command a round is about to apply, for [`Shard::prefetch`].
#[derive(Debug, Clone, Copy)]
pub enum Upcoming<'a> {
    /// A write about to be staged with [`Shard::write`].
    Write(UpcomingWrite<'a>),
    /// A player's rank: [`Shard::get`], then [`Shard::count_before_key`] at
    /// their [`Record::rank_key`].
    Rank {
        /// The tree ranked in.
        tree: TreeId,
        /// The player's name.
        player: &'a str,
        /// The tree's tie rule.
        ties: Ties,
        /// The tree's order.
        order: Order,
    },
    /// [`Shard::count_before`] these keys of `tree`.
    CountBefore {
        /// The tree counted in.
        tree: TreeId,
        /// The keys counted before.
        keys: &'a [u128],
    },
}

/// A write about to be staged, for [`Shard::prefetch`]: the arguments
/// [`Shard::write`] will get.
#[derive(Debug, Clone, Copy)]
pub struct UpcomingWrite<'a> {
    /// The board written to.
    pub board: &'a Board,
    /// The player's name.
    pub player: &'a str,
    /// What the write brings.
    pub amount: Amount,
    /// How it combines with the stored score.
    pub mode: Mode,
    /// The write's global arrival sequence.
    pub seq: u64,
}

/// The keys of `tree` a look ahead walks to, in `paths` (one entry a tree:
/// a round's commands nearly all go to one or a few trees).
fn tree_paths(paths: &mut Vec<(TreeId, Vec<u128>)>, tree: TreeId) -> &mut Vec<u128> {
    let at = paths.iter().position(|(t, _)| *t == tree).unwrap_or_else(|| {
        paths.push((tree, Vec::new()));
        paths.len() - 1
    });
    &mut paths[at].1
}

impl Shard {
    /// Asks the CPU for the memory the given commands, about to be applied,
    /// will wait for: each player's cached record, then the count-tree
    /// leaves a write's old and new score or a rank's key fall in, and the
    /// leaves of counted keys. Changes nothing.
    ///
    /// A command waits for memory at each of these (the shard holds far
    /// more than the CPU caches), one wait after another; asked for a group
    /// of commands together, in passes whose loads do not depend on each
    /// other, the waits overlap (see docs/performance-history.md).
    pub fn prefetch<'a>(&self, upcoming: impl IntoIterator<Item = Upcoming<'a>>) {
        let mut records: Vec<(Upcoming<'a>, TreeId, u128)> = Vec::new();
        let mut paths: Vec<(TreeId, Vec<u128>)> = Vec::new();
        let mut stored_key = Vec::new();
        let mut cache_key = |tree, player: &str| {
            stored_key.clear();
            push_player_key(&mut stored_key, tree, player);
            RecordCache::key(&stored_key)
        };
        for command in upcoming {
            match command {
                Upcoming::Write(write) => {
                    for tree in window::current_trees(write.board, self.now) {
                        records.push((command, tree, cache_key(tree, write.player)));
                    }
                }
                Upcoming::Rank { tree, player, .. } => records.push((command, tree, cache_key(tree, player))),
                Upcoming::CountBefore { tree, keys } => tree_paths(&mut paths, tree).extend_from_slice(keys),
            }
        }
        let cache = self.cache.lock();
        let olds: Vec<Option<Record>> = records.iter().map(|&(_, _, cached)| cache.peek(cached).flatten()).collect();
        drop(cache);
        for ((command, tree, _), old) in records.into_iter().zip(olds) {
            let keys = tree_paths(&mut paths, tree);
            match command {
                Upcoming::Write(write) => {
                    let (ties, order) = (write.board.config.ties, write.board.config.order);
                    keys.extend(old.map(|old| old.tree_key(write.player, ties, order)));
                    if let Ok(score) = combined(write.mode, &write.board.config, old.map(|r| r.score), write.amount) {
                        keys.push(Record { score, seq: write.seq }.tree_key(write.player, ties, order));
                    }
                }
                Upcoming::Rank { ties, order, .. } => {
                    keys.extend(old.map(|old| old.rank_key(ties, order)));
                }
                Upcoming::CountBefore { .. } => {}
            }
        }
        for (tree, keys) in paths {
            if let Some(count_tree) = self.held.tree(&tree) {
                count_tree.prefetch_many(&keys);
            }
        }
    }
}
