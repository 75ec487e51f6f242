//! Staging: writes and removals change the in-memory state at once (count
//! trees, overlay, record cache) and append to the open batch's log record,
//! which [`Shard::seal`] takes out.

use std::collections::HashMap;
use std::sync::Arc;

use super::apply::{apply_change, DenseChange, TreeCounts};
use super::reads::PlayerKey;
use super::storage::{board_meta_key, META_MAX_BOARD};
use super::Shard;
use crate::board::{Amount, Board, BoardConfig, Mode, Order, Ties};
use crate::error::ShardError;
use crate::fields::{self, FieldsError};
use crate::key::TreeId;
use crate::log;
use crate::record::Record;
use crate::window;

/// What the open batch will write: its log record, and meta keys with one
/// final value each (fjall must never see two values for one key in one
/// atomic batch).
#[derive(Default)]
pub(super) struct Staged {
    /// Meta keys to write (`None`: delete), one final value each.
    pub(super) meta: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Changes to dense trees' score sets, for the engine-wide indexes.
    pub(super) dense: Vec<DenseChange>,
    /// This batch's score changes, logged as one record ([`crate::log`]).
    pub(super) log: Vec<u8>,
    /// Score changes in `log`.
    pub(super) changes: u64,
    /// Whether `max_seq` rose, so the batch stores it.
    pub(super) seq_dirty: bool,
    /// Staged requests of any kind (so an empty batch is skipped).
    pub(super) ops: usize,
    /// Staged score writes and removals.
    pub(super) writes: usize,
}

/// One tree's part of a write or removal, read before anything is staged
/// (so that a read that fails stages nothing).
struct Planned {
    tree: TreeId,
    key: PlayerKey,
    /// The record the change replaces.
    old: Option<Record>,
    /// The tree's stored index entries, if the change takes it past the
    /// small-tree bound ([`Shard::plan_growth`]).
    growth: Option<Vec<Vec<u8>>>,
}

impl Shard {
    /// Whether the open batch holds writes not yet committed.
    pub fn has_staged(&self) -> bool {
        self.staged.ops > 0
    }

    /// Persists `board`'s config in this shard if it is not there yet.
    pub fn ensure_board(&mut self, board: &Board) {
        if let Some(held) = self.held.config_mut(board.id).filter(|held| **held == board.config) {
            // The router's copy from now on (a shard interns its own at open):
            // one config in memory, and the next compare is a pointer's.
            if !Arc::ptr_eq(held, &board.config) {
                *held = board.config.clone();
            }
            return;
        }
        self.held.insert_config(board.id, board.config.clone());
        self.staged.meta.insert(board_meta_key(board.id), Some(board.config.encode(&board.name)));
        if board.id > self.max_board_id {
            self.max_board_id = board.id;
            self.staged.meta.insert(META_MAX_BOARD.to_vec(), Some(board.id.to_be_bytes().to_vec()));
        }
        self.staged.ops += 1;
    }

    /// Stages a score write to every window of `board` and returns the score
    /// stored in its first window. `seq` is the write's global arrival
    /// sequence. An `incr` that would overflow changes nothing.
    pub fn write(&mut self, board: &Board, player: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ShardError> {
        self.write_amount(board, player, Amount::Score(score), mode, seq)
    }

    /// [`Shard::write`] of any [`Amount`]: a composite `incr` brings one
    /// delta per field.
    pub fn write_amount(
        &mut self,
        board: &Board,
        player: &str,
        amount: Amount,
        mode: Mode,
        seq: u64,
    ) -> Result<i64, ShardError> {
        let windows = window::current_trees(board, self.now);
        let mut plans = Vec::with_capacity(windows.len());
        for tree in windows {
            let key = PlayerKey::new(tree, player);
            let old = self.replaced_record(&board.config, tree, player, &key)?;
            let new = combined(mode, &board.config, old.map(|r| r.score), amount)?;
            let growth = if old.is_none() { self.plan_growth(board.config.ties, tree)? } else { None };
            plans.push((Planned { tree, key, old, growth }, new));
        }
        self.ensure_board(board);
        let Some(stored) = plans.first().map(|p| p.1) else {
            return Err(ShardError::Corrupt("a board without windows"));
        };
        for (planned, new) in plans {
            if planned.old.is_some_and(|o| o.score == new) {
                continue; // unchanged: keeps when the player reached it
            }
            self.stage(board, player, planned, Some(Record { score: new, seq }));
        }
        if seq > self.max_seq {
            self.max_seq = seq;
            self.staged.seq_dirty = true;
        }
        self.staged.ops += 1;
        self.staged.writes += 1;
        Ok(stored)
    }

    /// Stages `(player, score, seq)` writes in order, all or none: if one
    /// `incr` would overflow, nothing is staged.
    pub fn write_many(
        &mut self,
        board: &Board,
        entries: &[(String, Amount, u64)],
        mode: Mode,
    ) -> Result<Vec<i64>, ShardError> {
        if mode == Mode::Incr {
            self.check_incr(board, entries.iter().map(|(player, amount, _)| (player.as_str(), *amount)))?;
        }
        entries.iter().map(|(player, amount, seq)| self.write_amount(board, player, *amount, mode, *seq)).collect()
    }

    /// Whether `incr`s of `(player, score)` applied in order would all stay
    /// in range, in every window's current period: `Overflow` (or a
    /// field's range error) if not. Stages nothing, so a write spanning
    /// shards can ask each shard first.
    pub fn check_incr<'a>(
        &mut self,
        board: &Board,
        entries: impl Iterator<Item = (&'a str, Amount)> + Clone,
    ) -> Result<(), ShardError> {
        for tree in window::current_trees(board, self.now) {
            incrs_stay_in_range(&board.config, entries.clone(), |player| Ok(self.get(tree, player)?.map(|r| r.score)))?;
        }
        Ok(())
    }

    /// Stages removing `player` from the current period of every window;
    /// returns whether they were in the first window.
    pub fn remove(&mut self, board: &Board, player: &str) -> Result<bool, ShardError> {
        let mut first = None;
        for tree in window::current_trees(board, self.now) {
            let key = PlayerKey::new(tree, player);
            let old = self.replaced_record(&board.config, tree, player, &key)?;
            first.get_or_insert(old.is_some());
            if old.is_some() {
                self.stage(board, player, Planned { tree, key, old, growth: None }, None);
            }
        }
        self.staged.ops += 1;
        self.staged.writes += 1;
        Ok(first.unwrap_or(false))
    }

    /// Moves `player` from the planned tree's `old` record to `new`: in the
    /// count tree, the overlay and the record cache at once, in storage
    /// through the batch's log.
    fn stage(&mut self, board: &Board, player: &str, planned: Planned, new: Option<Record>) {
        let Planned { tree, key, old, growth } = planned;
        if new.is_some() {
            self.note_stored_name(player);
        }
        let left_out = self.leaves_short_names_out(board.config.ties);
        let change = log::Change { tree, player, old, new };
        log::push(&mut self.staged.log, &change);
        self.staged.changes += 1;
        self.cache.get_mut().put(key.cached, new);
        let overlay = Some((&mut self.overlay, key.stored));
        let counts = TreeCounts::Apply(self.held.tree_or_new(change.tree));
        let applied = apply_change(counts, overlay, &board.config, &change, left_out);
        if let Some(crossing) = applied.crossing {
            self.short_names_crossed(tree, crossing, growth.unwrap_or_default());
        }
        if board.config.ties == Ties::Dense {
            self.staged.dense.push(applied.dense);
        }
        self.players = self.players.saturating_add_signed(applied.keys.iter().flatten().map(|k| k.delta).sum());
        self.follow_ties(tree, board.config.ties, player, applied.keys);
    }
}

impl Shard {
    /// The changes of dense trees' score sets staged since the last call
    /// (or seal). A server that reports them as they are staged, not at
    /// seal, lets a dense rank right behind a write see it, as every other
    /// read does.
    pub fn drain_dense_changes(&mut self) -> std::vec::Drain<'_, DenseChange> {
        self.staged.dense.drain(..)
    }
}

/// Whether `incr`s of `(player, amount)` applied in order, to players whose
/// scores before them `before` gives, all stay in range: the check behind
/// [`Shard::check_incr`], and a router's for a board no shard stores yet
/// (where no player has a score), which a refused write must not create.
pub fn incrs_stay_in_range<'a>(
    config: &BoardConfig,
    entries: impl Iterator<Item = (&'a str, Amount)>,
    mut before: impl FnMut(&str) -> Result<Option<i64>, ShardError>,
) -> Result<(), ShardError> {
    let mut running: HashMap<&str, i64> = HashMap::new();
    for (player, amount) in entries {
        let current = match running.get(player) {
            Some(score) => Some(*score),
            None => before(player)?,
        };
        running.insert(player, combined(Mode::Incr, config, current, amount)?);
    }
    Ok(())
}

/// The score a write of `amount` in `mode` leaves a player with who had
/// `old`; an `incr` past the range (or past a field's) fails.
pub(super) fn combined(mode: Mode, config: &BoardConfig, old: Option<i64>, amount: Amount) -> Result<i64, ShardError> {
    match (mode, amount, old) {
        (Mode::Incr, Amount::Fields(deltas), old) if config.has_fields() => {
            Ok(fields::add(&config.fields, old, &deltas)?)
        }
        (_, Amount::Fields(_), _) => {
            Err(FieldsError::Mismatch("per-field amounts are an `incr` on a board with fields").into())
        }
        (Mode::Incr, Amount::Score(_), _) if config.has_fields() => {
            Err(FieldsError::Mismatch("an `incr` on a board with fields takes per-field amounts").into())
        }
        (Mode::Set, Amount::Score(score), _) | (Mode::Best | Mode::Incr, Amount::Score(score), None) => Ok(score),
        (Mode::Best, Amount::Score(score), Some(old)) => Ok(better(config.order, old, score)),
        (Mode::Incr, Amount::Score(delta), Some(old)) => old.checked_add(delta).ok_or(ShardError::Overflow),
    }
}

fn better(order: Order, a: i64, b: i64) -> i64 {
    match order {
        Order::Desc => a.max(b),
        Order::Asc => a.min(b),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{all_time_board, Shard, ShardOptions};
    use crate::board::Mode;

    /// A shard interns its own configs when it opens; the first write after
    /// takes the router's copy instead, and stores nothing again.
    #[test]
    fn a_reopened_shard_takes_the_routers_config_without_storing_it() {
        let dir = tempfile::tempdir().unwrap();
        let (board, _) = all_time_board();
        {
            let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
            shard.write(&board, "p", 1, Mode::Set, 1).unwrap();
            shard.commit().unwrap();
        }
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        let own = shard.held.config(board.id).cloned().expect("held");
        assert!(!Arc::ptr_eq(&own, &board.config) && own == board.config);
        shard.ensure_board(&board);
        assert!(Arc::ptr_eq(shard.held.config(board.id).expect("held"), &board.config));
        assert!(!shard.has_staged(), "nothing to store");
    }
}
