//! The consistency check: counts, score index and player records agree.

use super::reads::{player_key, Direction, POSITIONS_END};
use super::Shard;
use crate::board::Ties;
use crate::error::ShardError;
use crate::key::{self, TreeId};

impl Shard {
    /// Checks that each tree's counts equal its score index and players:
    /// the invariant a crash must never break.
    pub fn check(&self) -> Result<(), ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let inconsistent = |id: &TreeId, what: String| ShardError::Inconsistent(format!("{id:?}: {what}"));
        let summed: u64 = self.held.trees().map(|(_, t)| t.total()).sum();
        if summed != self.players {
            return Err(ShardError::Inconsistent(format!("{} players counted, the trees hold {summed}", self.players)));
        }
        for (id, tree) in self.held.trees() {
            tree.check().map_err(|e| inconsistent(&id, e))?;
            let Some(config) = self.held.config(id.board) else {
                return Err(inconsistent(&id, "tree of a board this shard has no config for".into()));
            };
            let (order, ties) = (config.order, config.ties);
            // Every index entry matches its player's record, and the tree
            // holds exactly the keys the index implies.
            let mut keys = Vec::with_capacity(tree.total() as usize);
            // Short names of a small tree that records leave out.
            let mut short_names = 0;
            for position in self.index_positions(id, &[], &POSITIONS_END, Direction::Forward) {
                let position = position?;
                let (sk, seq, player) =
                    key::parse_list_position(ties, &position).ok_or(ShardError::Corrupt("index key"))?;
                let record = match self.short_record(id, player)? {
                    Some(from_tree) => {
                        short_names += 1;
                        from_tree
                    }
                    None => self.unwritten_or_stored(&player_key(id, player))?,
                };
                let record =
                    record.ok_or_else(|| inconsistent(&id, format!("index lists {player:?} but no record exists")))?;
                if key::score_key(record.score, order) != sk || (ties == Ties::Ordinal && record.seq != seq) {
                    return Err(inconsistent(&id, format!("index and record of {player:?} disagree")));
                }
                keys.push(record.tree_key(player, ties, order));
            }
            // Stored records the overlay does not replace, and the overlay's
            // own; and the short names whose record is the tree itself.
            let mut players = short_names;
            for item in self.storage.players.prefix(id.prefix()) {
                players += usize::from(self.overlay.record(&item.key()?).is_none());
            }
            players += self.overlay.records_under(&id.prefix()).filter(|(_, record)| record.is_some()).count();
            if players != keys.len() {
                return Err(inconsistent(&id, format!("{players} player records but {} index entries", keys.len())));
            }
            keys.sort_unstable();
            let mut expected: Vec<(u128, u64)> = Vec::new();
            for key in keys {
                match expected.last_mut() {
                    Some((last, n)) if *last == key => *n += 1,
                    _ => expected.push((key, 1)),
                }
            }
            if tree.entries() != expected {
                return Err(inconsistent(
                    &id,
                    format!("count tree ({} players) disagrees with the score index", tree.total()),
                ));
            }
        }
        Ok(())
    }
}
