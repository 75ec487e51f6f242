//! Deleting data: periods that fell out of their board's `keep`, and
//! dropped boards, in bounded steps. Both need a settled shard, as they
//! scan storage.

use std::ops::Bound;

use fjall::PersistMode;

use super::storage::{board_meta_key, expiring_key};
use super::Shard;
use crate::error::ShardError;
use crate::key::TreeId;
use crate::window;

/// How far the deletion of one expiring tree has gone: the keyspace it is
/// in (players, index, leaves) and the last key deleted there. Kept in
/// memory only: after a restart the deletion starts over on what is left.
#[derive(Debug, Clone)]
pub(super) struct ExpiryCursor {
    tree: TreeId,
    keyspace: usize,
    after: Option<Vec<u8>>,
}

impl ExpiryCursor {
    fn new(tree: TreeId) -> Self {
        Self { tree, keyspace: 0, after: None }
    }
}

impl Shard {
    /// Whether [`Shard::expire`] has anything to do at the current time.
    pub fn has_expired(&self) -> bool {
        !self.expiring.is_empty() || self.newly_expired().next().is_some()
    }

    /// Readable trees whose period fell out of their board's `keep`. Asked
    /// once a second: only periodic trees are looked at (none without a
    /// windowed board), all-time trees, never expiring, are held apart.
    fn newly_expired(&self) -> impl Iterator<Item = TreeId> + '_ {
        let (now, held) = (self.now, &self.held);
        held.periodic_tree_ids()
            .filter(move |tree| held.config(tree.board).is_some_and(|config| window::expired(config, *tree, now)))
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
            self.forget_tree(tree);
            self.expiring.insert(*tree);
        }
        if !newly.is_empty() {
            // Drop the log that could replay them back and remember them.
            self.checkpoint_with(&newly, None)?;
        }
        let mut left = budget;
        while left > 0 {
            // The tree a step was part way through first: its cursor skips
            // the tombstones of what was deleted already.
            let cursor = self.expiry_cursor.take().filter(|cursor| self.expiring.contains(&cursor.tree));
            let Some(mut cursor) = cursor.or_else(|| self.expiring.first().map(|&tree| ExpiryCursor::new(tree))) else {
                break;
            };
            let storage = &self.storage;
            let keyspaces = [&storage.players, &storage.index, &storage.leaves];
            let prefix = cursor.tree.prefix();
            let mut batch = storage.db.batch().durability(Some(PersistMode::Buffer));
            while left > 0 {
                let Some(keyspace) = keyspaces.get(cursor.keyspace) else { break };
                let keys: Box<dyn Iterator<Item = fjall::Guard>> = match &cursor.after {
                    Some(after) => {
                        Box::new(keyspace.range::<&[u8], _>((Bound::Excluded(&after[..]), Bound::Unbounded)))
                    }
                    None => Box::new(keyspace.prefix(prefix)),
                };
                let mut exhausted = true;
                for item in keys {
                    if left == 0 {
                        exhausted = false;
                        break;
                    }
                    let key = item.key()?;
                    if !key.starts_with(&prefix) {
                        break;
                    }
                    batch.remove(keyspace, key.clone());
                    cursor.after = Some(key.to_vec());
                    left -= 1;
                }
                if exhausted {
                    (cursor.keyspace, cursor.after) = (cursor.keyspace + 1, None);
                }
            }
            let done = cursor.keyspace >= keyspaces.len();
            if done {
                batch.remove(&storage.meta, expiring_key(cursor.tree));
            }
            batch.commit()?;
            if done {
                self.expiring.remove(&cursor.tree);
                // Cache keys are hashes: the tree's records cannot be picked out.
                self.cache.get_mut().clear();
            } else {
                self.expiry_cursor = Some(cursor);
            }
        }
        Ok(newly)
    }

    /// Drops the board with `board_id`: its trees stop being readable at
    /// once and are marked for deletion, with its config deleted and a
    /// checkpoint (so no log replays the board back), in one durable batch;
    /// its stored keys then go in bounded steps like expired periods'
    /// ([`Shard::expire`]), a restart finishing what was left. So a drop
    /// costs one checkpoint whatever the board's size, and the name can be
    /// reused at once (a new board gets a new id). Needs a committed state;
    /// returns whether the board existed.
    pub fn drop_board(&mut self, board_id: u64) -> Result<bool, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let existed = self.held.remove_config(board_id).is_some();
        let dropped = self.held.trees_of(board_id);
        // Cache keys are hashes: the board's entries cannot be picked out.
        self.cache.get_mut().clear();
        self.overlay.forget(&board_id.to_be_bytes());
        for tree in &dropped {
            self.forget_tree(tree);
            self.expiring.insert(*tree);
        }
        if dropped.is_empty() {
            // Nothing of it is stored here but (maybe) its config.
            let mut batch = self.storage.db.batch().durability(Some(self.persist_mode()));
            batch.remove(&self.storage.meta, board_meta_key(board_id));
            batch.commit()?;
        } else {
            // A checkpoint under way may hold the board's leaves: this one
            // replaces it.
            self.checkpoint_with(&dropped, Some(board_id))?;
        }
        Ok(existed)
    }

    /// Trees whose stored keys are still being deleted (expired periods and
    /// dropped boards' trees).
    pub fn trees_being_deleted(&self) -> usize {
        self.expiring.len()
    }
}
