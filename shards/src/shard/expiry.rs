//! Deleting data: periods that fell out of their board's `keep`, and
//! dropped boards. Both need a settled shard, as they scan storage.

use fjall::PersistMode;

use super::storage::{board_meta_key, expiring_key};
use super::Shard;
use crate::error::ShardError;
use crate::key::TreeId;
use crate::window;

impl Shard {
    /// Whether [`Shard::expire`] has anything to do at the current time.
    pub fn has_expired(&self) -> bool {
        !self.expiring.is_empty() || self.newly_expired().next().is_some()
    }

    /// Readable trees whose period fell out of their board's `keep`.
    fn newly_expired(&self) -> impl Iterator<Item = TreeId> + '_ {
        let (now, boards) = (self.now, &self.boards);
        self.trees
            .keys()
            .copied()
            .filter(move |tree| boards.get(&tree.board).is_some_and(|b| window::expired(b, *tree, now)))
    }

    /// Moves periods that fell out of their board's `keep` out of the readable
    /// trees and deletes up to `budget` of their stored keys, in one batch
    /// that is not fsynced (losing it in a crash only means deleting again).
    /// Called between rounds, so a rollover never stalls writes behind a big
    /// delete. Returns the trees that newly expired.
    pub fn expire(&mut self, budget: usize) -> Result<Vec<TreeId>, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let newly: Vec<TreeId> = self.newly_expired().collect();
        for tree in &newly {
            self.trees.remove(tree);
            self.expiring.push_back(*tree);
        }
        if !newly.is_empty() {
            // Drop the log that could replay them back and remember them.
            self.checkpoint_with(&newly)?;
        }
        let mut left = budget;
        let storage = &self.storage;
        while left > 0 {
            let Some(&tree) = self.expiring.front() else { break };
            let prefix = tree.prefix();
            let mut batch = storage.db.batch().durability(Some(PersistMode::Buffer));
            for keyspace in [&storage.players, &storage.index, &storage.leaves] {
                for item in keyspace.prefix(prefix).take(left) {
                    batch.remove(keyspace, item.key()?);
                    left -= 1;
                }
            }
            let done = left > 0;
            if done {
                batch.remove(&storage.meta, expiring_key(tree));
            }
            batch.commit()?;
            if done {
                self.expiring.pop_front();
                // Cache keys are hashes: the tree's records cannot be picked out.
                self.cache.get_mut().clear();
            }
        }
        Ok(newly)
    }

    /// Stages deleting everything stored for the board with `board_id`.
    /// Needs a committed state (it scans storage); returns whether it existed.
    pub fn drop_board(&mut self, board_id: u64) -> Result<bool, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        // A checkpoint under way may have written the board's leaves
        // already: they would come back when it finished.
        self.abandon_checkpoint();
        let existed = self.boards.remove(&board_id).is_some();
        // Cache keys are hashes: the board's entries cannot be picked out.
        self.cache.get_mut().clear();
        let prefix = board_id.to_be_bytes();
        self.overlay.forget(&prefix);
        let storage = &self.storage;
        let mut batch = storage.db.batch().durability(Some(self.persist_mode()));
        for keyspace in [&storage.players, &storage.index, &storage.leaves] {
            for item in keyspace.prefix(prefix) {
                batch.remove(keyspace, item.key()?);
            }
        }
        batch.remove(&storage.meta, board_meta_key(board_id));
        batch.commit()?;
        self.trees.retain(|tree, _| tree.board != board_id);
        Ok(existed)
    }
}
