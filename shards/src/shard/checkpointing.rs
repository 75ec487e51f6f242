//! When and how a shard checkpoints its count trees: the leaves changed
//! since the last checkpoint are copied out a slice per sealed batch (copy
//! on write for leaves about to change), each slice handed to a
//! [`LeafWriter`] (`crate::checkpoint`) as it is copied; the batch that
//! copies the last slice carries the writer, finished after its runs, and
//! the deletion of the log records the leaves make redundant.

use std::collections::VecDeque;

use super::idle::IdleWatch;
use super::storage::{board_meta_key, expiring_key, LEAVES_THROUGH};
use super::Shard;
use crate::checkpoint::{leaf_key, LeafWriter};
use crate::error::ShardError;
use crate::key::TreeId;
use crate::tree::SlicePicker;

/// Slices a checkpoint's writer may fall behind before the shard stops
/// copying more (see `Shard::copy_checkpoint_slice`): the writer runs at
/// the lowest priority, and on a busy machine the copies would otherwise
/// pile up in memory as they did before they were written as they came.
const MAX_QUEUED_SLICES: usize = 64;

/// A checkpoint waits for at most this many times
/// [`ShardOptions::checkpoint_every`](super::ShardOptions::checkpoint_every)
/// logged changes: bounds the log a restart replays (see
/// docs/performance-history.md).
const CHECKPOINT_STRETCH: u64 = 4;

/// The shard's checkpoint state: the one being copied, if any, and whether
/// one was begun since opening (the first comes sooner).
#[derive(Default)]
pub(super) struct Checkpoints {
    /// While a checkpoint's leaves are being copied, a slice each sealed
    /// batch (see [`CountTree::begin_snapshot`](crate::CountTree::begin_snapshot)).
    pub(super) copying: Option<Checkpointing>,
    /// Whether a checkpoint was begun since opening (the first comes sooner
    /// by [`ShardOptions::checkpoint_phase`](super::ShardOptions::checkpoint_phase)).
    pub(super) begun: bool,
    /// What an idle shard saw at its last look (see `super::idle`).
    pub(super) idle: IdleWatch,
}

/// A checkpoint's leaves being copied, a slice each sealed batch, and
/// written as they come (see [`crate::checkpoint`]).
pub(super) struct Checkpointing {
    /// The number of the first log record the leaves do not include.
    through: u64,
    /// The trees still to copy, in key order: the writer appends every
    /// leaf to sorted tables.
    trees: VecDeque<TreeId>,
    /// Writes each slice as it is copied; finished by the batch that copies
    /// the last one.
    writer: LeafWriter,
    /// Whether the batch that ends it also has every memtable flushed: for
    /// a checkpoint an idle shard took (see `super::idle`).
    flush_memtables: bool,
}

impl Checkpointing {
    /// Whether the batch that ends it is to flush every memtable.
    pub(super) fn flushes_memtables(&self) -> bool {
        self.flush_memtables
    }
}

impl Shard {
    /// Whether a log of `logged` changes calls for a checkpoint. A checkpoint
    /// rewrites every leaf a change touched, and random changes touch nearly
    /// all leaves long before they number as many as the players, so a
    /// checkpoint costs about the whole tree and the longer the wait, the
    /// less each write pays for it: half the players' worth of changes (see
    /// docs/performance-history.md). The wait is between
    /// [`ShardOptions::checkpoint_every`](super::ShardOptions::checkpoint_every)
    /// and [`CHECKPOINT_STRETCH`] times that, so a restart replays a bounded
    /// log. The first after opening comes sooner by
    /// [`ShardOptions::checkpoint_phase`](super::ShardOptions::checkpoint_phase).
    pub(super) fn checkpoint_due(&self, logged: u64) -> bool {
        logged >= self.checkpoint_wait()
    }

    /// The logged changes after which a checkpoint is due (see
    /// [`Shard::checkpoint_due`]).
    pub(super) fn checkpoint_wait(&self) -> u64 {
        let least = self.options.checkpoint_every;
        let wanted = (self.players() / 2).clamp(least, least.saturating_mul(CHECKPOINT_STRETCH));
        let phase = if self.checkpoints.begun { 0.0 } else { self.options.checkpoint_phase.clamp(0.0, 1.0) };
        wanted - (wanted as f64 * phase) as u64
    }

    /// Writes every leaf changed since the last checkpoint and deletes the
    /// log records that led to them, in one atomic batch.
    pub fn checkpoint(&mut self) -> Result<(), ShardError> {
        self.checkpoint_with(&[], None)
    }

    /// [`Shard::checkpoint`], also marking `expiring` trees as being deleted
    /// (and the config of a `dropped` board deleted) in the same batch: once
    /// the log that could rebuild them is gone, the mark is what lets a
    /// restart finish deleting them.
    pub(super) fn checkpoint_with(&mut self, expiring: &[TreeId], dropped: Option<u64>) -> Result<(), ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        // Every batch is durable (settled): the overlay may be written.
        for tree in expiring {
            self.overlay.forget(&tree.prefix());
        }
        let empty = self.empty_overlay();
        let overlay = std::mem::replace(&mut self.overlay, empty);
        overlay.write_runs(&self.storage.players, &self.storage.index).map_err(|err| self.rolled_back(err))?;
        let mut batch = self.storage.db.batch().durability(Some(self.persist_mode()));
        for tree in expiring {
            batch.insert(&self.storage.meta, expiring_key(*tree), []);
        }
        if let Some(board_id) = dropped {
            batch.remove(&self.storage.meta, board_meta_key(board_id));
        }
        self.checkpoint_into(&mut batch);
        batch.commit().map_err(|err| self.rolled_back(err.into()))
    }

    /// Takes the changed leaves out of the trees at once and adds them, the
    /// marker of the log they hold, the deletion of that log and the runs'
    /// marker to `batch`, and starts a new log. `batch` may be written only
    /// once runs hold every change of that log: the log is the only other
    /// place those changes are kept. A checkpoint being copied in slices is
    /// dropped: this one includes everything it would have.
    pub(super) fn checkpoint_into(&mut self, batch: &mut fjall::OwnedWriteBatch) {
        self.abandon_checkpoint();
        let (leaves, encoding) = (&self.storage.leaves, self.leaf_encoding);
        self.held.visit_live_trees(|id, tree| {
            let written = SlicePicker::default().pick(tree.take_dirty(), encoding, |leaf, bytes| {
                match bytes {
                    Some(bytes) => batch.insert(leaves, leaf_key(id, leaf), bytes),
                    None => batch.remove(leaves, leaf_key(id, leaf)),
                }
                Ok::<(), std::convert::Infallible>(())
            });
            let Ok(()) = written;
        });
        batch.insert(leaves, LEAVES_THROUGH, self.log.next.to_be_bytes());
        self.log.logged = 0;
        self.close_log(batch, self.log.next);
    }

    /// Drops the checkpoint being copied, if any: the leaves it would have
    /// written count as changed again, and what its writer wrote is never
    /// read.
    pub(super) fn abandon_checkpoint(&mut self) {
        let handed_out = self.checkpoints.copying.take().map(|c| c.writer.abandon()).unwrap_or_default();
        self.held.visit_live_trees(|_, tree| tree.abandon_snapshot());
        for (id, leaves) in handed_out {
            if let Some(tree) = self.held.tree_mut(&id) {
                tree.mark_changed(leaves);
            }
        }
    }

    /// Starts a checkpoint of the trees as they are now, to be copied a slice
    /// each sealed batch ([`Shard::copy_checkpoint_slice`]) so no round waits
    /// for the whole copy, and written by a [`LeafWriter`] as it is copied.
    /// Changes from now on are logged for the next one. If the writer's
    /// thread cannot start, the checkpoint waits for the next batch.
    pub(super) fn begin_checkpoint(&mut self) {
        let through = self.log.next;
        let start = LeafWriter::start(
            self.storage.leaves.clone(),
            LEAVES_THROUGH,
            through,
            self.leaf_encoding,
            self.options.leaf_writer_start,
        );
        let writer = match start {
            Ok(writer) => writer,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not start a checkpoint's writer; trying again");
                return;
            }
        };
        // One pass: with a million small boards, each tree visited is a
        // wait for memory. Only trees that changed have leaves to copy.
        let (mut trees, mut burst) = (Vec::new(), 0);
        // A tree left idle is frozen (see `Holdings::visit_live_trees`).
        self.held.visit_live_trees(|id, tree| {
            tree.begin_snapshot();
            burst += usize::from(!tree.is_compact());
            if tree.has_snapshot() {
                trees.push(id);
            }
        });
        self.burst_trees = burst;
        trees.sort_unstable_by_key(TreeId::prefix);
        self.checkpoints.copying = Some(Checkpointing { through, trees: trees.into(), writer, flush_memtables: false });
        self.checkpoints.begun = true;
        self.log.logged = 0;
    }

    /// Copies the next slice of the checkpoint's leaves, at least one leaf
    /// per write in the batch being sealed, and hands it to the writer; true
    /// once all are copied (false with no checkpoint under way). A tree has
    /// no more leaves than players, and the next checkpoint is due after
    /// half the players' worth of changes or 100k: at a leaf a write, a
    /// copy is done before the next is due. While the writer is
    /// [`MAX_QUEUED_SLICES`] behind, nothing more is copied: the copies
    /// would only wait in memory.
    pub(super) fn copy_checkpoint_slice(&mut self, writes: usize) -> bool {
        let Some(checkpoint) = &mut self.checkpoints.copying else { return false };
        if checkpoint.writer.backlog() > MAX_QUEUED_SLICES {
            return false;
        }
        let mut budget = self.options.checkpoint_slice_leaves.max(writes).max(1);
        while let Some(&id) = checkpoint.trees.front() {
            if let Some(tree) = self.held.tree_mut(&id) {
                budget = tree.continue_snapshot(budget);
                if let Some(slice) = tree.take_slice().filter(|slice| !slice.is_idle()) {
                    checkpoint.writer.send(id, slice);
                }
                if tree.is_copying_snapshot() {
                    break; // the budget is spent
                }
            }
            checkpoint.trees.pop_front();
            // Handed out whole: a small tree not changed since is idle.
            self.held.freeze_if_idle(&id);
        }
        checkpoint.trees.is_empty()
    }

    /// Copies the next slice of the checkpoint under way (as many leaves
    /// as a batch of one write copies) while the shard has nothing to seal:
    /// slices are otherwise copied as batches are sealed, so an idle
    /// shard's copy would wait for the next write, and the trees it has not
    /// handed out could not freeze. The checkpoint still ends with the next
    /// sealed batch. Returns whether a step now would copy more (false also
    /// while the writer is behind).
    pub fn copy_checkpoint_step(&mut self) -> bool {
        if !self.checkpoint_copy_waits() {
            return false;
        }
        !self.copy_checkpoint_slice(1) && self.checkpoint_copy_waits()
    }

    /// Whether the checkpoint under way has leaves left to copy and its
    /// writer room for them.
    fn checkpoint_copy_waits(&self) -> bool {
        self.checkpoint_copy_left()
            && self.checkpoints.copying.as_ref().is_some_and(|c| c.writer.backlog() <= MAX_QUEUED_SLICES)
    }

    /// Has the batch that ends the checkpoint under way flush every
    /// memtable too (see `super::idle`).
    pub(super) fn flush_memtables_after_checkpoint(&mut self) {
        if let Some(checkpoint) = &mut self.checkpoints.copying {
            checkpoint.flush_memtables = true;
        }
    }

    /// Whether the checkpoint under way has leaves left to copy.
    pub fn checkpoint_copy_left(&self) -> bool {
        self.checkpoints.copying.as_ref().is_some_and(|c| !c.trees.is_empty())
    }

    /// Ends `checkpoint`, all of whose leaves are copied: adds to `batch`
    /// the deletion of the log they make redundant and the marker of the
    /// runs (which now cover every log record: this batch freezes the
    /// overlay), and returns the writer to finish once the runs are
    /// written. Trees made since the checkpoint began have nothing in it:
    /// their leaves go to the next.
    pub(super) fn finish_checkpoint(
        &mut self,
        batch: &mut fjall::OwnedWriteBatch,
        checkpoint: Checkpointing,
    ) -> LeafWriter {
        self.close_log(batch, checkpoint.through);
        checkpoint.writer
    }

    /// Adds to `batch` the deletion of the log records before `through`,
    /// which a checkpoint's leaves now hold, and the runs' marker.
    fn close_log(&mut self, batch: &mut fjall::OwnedWriteBatch, through: u64) {
        for number in self.log.first..through {
            batch.remove(&self.storage.changes, number.to_be_bytes());
        }
        self.mark_runs(batch);
        self.log.first = through;
        self.begin_repacking();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{all_time_board, ShardOptions};
    use super::*;
    use crate::board::{Mode, Order};
    use crate::key;

    /// Shards given phases take their checkpoints in turn: the first after
    /// opening comes sooner by the phase's share of the wait, the ones after
    /// it at the usual wait.
    #[test]
    fn the_first_checkpoint_comes_sooner_by_the_phase() {
        let (board, _) = all_time_board();
        let open = |phase: f64| {
            let dir = tempfile::tempdir().unwrap();
            let options = ShardOptions { checkpoint_every: 100, checkpoint_phase: phase, ..ShardOptions::default() };
            let mut shard = Shard::open(dir.path(), options).unwrap();
            // 150 players: half of them is under the least wait, 100 changes.
            for i in 0..150i64 {
                shard.write(&board, &format!("p{i}"), i, Mode::Set, i as u64 + 1).unwrap();
            }
            (dir, shard)
        };
        let (_dir, first) = open(0.0);
        assert!(!first.checkpoint_due(99) && first.checkpoint_due(100));
        let (_dir, mut second) = open(0.5);
        assert!(!second.checkpoint_due(49) && second.checkpoint_due(50), "half the wait sooner");
        second.begin_checkpoint();
        assert!(!second.checkpoint_due(99) && second.checkpoint_due(100), "then the usual wait");
    }

    /// Many small boards (compact trees, snapshot by a flag each) through
    /// checkpoints copied two trees a batch, with their players moved and
    /// removed while the copy is under way (a root about to change is
    /// copied first), one abandoned half-way by a checkpoint taken at once,
    /// and a reopen mid-copy: every board holds what it held, and the
    /// trees agree with the stored players. Boards left idle between
    /// checkpoints freeze and thaw again when written; a reopen loads the
    /// checkpointed ones frozen.
    #[test]
    fn small_boards_survive_checkpoints_copied_in_slices_abandoned_or_cut_short() {
        use crate::board::{Board, BoardConfig, Window};
        use std::collections::BTreeMap;
        let dir = tempfile::tempdir().unwrap();
        let options = ShardOptions { checkpoint_every: 40, checkpoint_slice_leaves: 2, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options).unwrap();
        let config = BoardConfig {
            order: Order::Desc,
            ties: crate::board::Ties::Ordinal,
            windows: vec![Window::All],
            keep: 1,
            fields: Vec::new(),
        };
        let boards: Vec<Board> =
            (1..=60).map(|id| Board { id, name: format!("b{id}").into(), config: config.clone().into() }).collect();
        // Board id -> player -> score.
        let mut oracle: BTreeMap<u64, BTreeMap<String, i64>> = BTreeMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut most_frozen = 0;
        for round in 0..400u64 {
            for _ in 0..1 + next(6) {
                let board = &boards[next(60) as usize];
                let player = format!("p{}", next(5));
                let players = oracle.entry(board.id).or_default();
                if next(5) == 0 && players.contains_key(&player) {
                    shard.remove(board, &player).unwrap();
                    players.remove(&player);
                } else {
                    let score = next(50) as i64;
                    shard.write(board, &player, score, Mode::Set, round + 1).unwrap();
                    players.insert(player, score);
                }
            }
            shard.commit().unwrap();
            most_frozen = most_frozen.max(shard.tree_forms().frozen);
            if round == 70 {
                assert!(shard.checkpoints.copying.is_some(), "the test must abandon a checkpoint under way");
                shard.checkpoint().unwrap();
            }
            if round > 100 && shard.checkpoints.copying.is_some() {
                break;
            }
        }
        assert!(shard.checkpoints.copying.is_some(), "the test must reopen with a checkpoint under way");
        assert!(most_frozen >= 10, "idle boards must freeze between checkpoints: at most {most_frozen} did");
        let shard = shard.reopen().unwrap();
        shard.check().unwrap();
        let forms = shard.tree_forms();
        assert!(forms.frozen > 0 && forms.burst == 0, "boards the log does not replay load frozen: {forms:?}");
        assert_eq!(forms.frozen + forms.compact, shard.held.tree_count());
        for board in &boards {
            let players = oracle.get(&board.id).cloned().unwrap_or_default();
            let tree = TreeId::all_time(board.id);
            assert_eq!(shard.count(tree), players.len() as u64, "board {}", board.id);
            for (player, score) in players {
                assert_eq!(shard.get(tree, &player).unwrap().map(|r| r.score), Some(score), "{player} of {}", board.id);
            }
        }
    }

    /// A shard that checkpoints only when asked, copying 4 leaves a slice,
    /// holding 100 boards of one player each (`p`, with score `i` on the
    /// board of id `i + 1`), committed.
    fn hundred_boards(dir: &std::path::Path) -> (Shard, Vec<crate::board::Board>) {
        use crate::board::{Board, BoardConfig};
        let options =
            ShardOptions { checkpoint_every: 1_000_000, checkpoint_slice_leaves: 4, ..ShardOptions::default() };
        let mut shard = Shard::open(dir, options).unwrap();
        let config: std::sync::Arc<BoardConfig> = BoardConfig::default().into();
        let boards: Vec<Board> =
            (1..=100).map(|id| Board { id, name: format!("b{id}").into(), config: config.clone() }).collect();
        for (i, board) in boards.iter().enumerate() {
            shard.write(board, "p", i as i64, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        (shard, boards)
    }

    /// A failed commit rebuilds the shard from disk (`Shard::rolled_back`)
    /// while a checkpoint may be under way. That checkpoint is dropped with
    /// the trees it was copying: carried on over the rebuilt trees (which
    /// hold no snapshot), it ended at once with most leaves never written,
    /// yet deleted the log holding their changes, and a reopen then lost
    /// them (boards came back without their player).
    #[test]
    fn a_rebuild_while_a_checkpoint_is_copied_drops_it_and_loses_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let (mut shard, boards) = hundred_boards(dir.path());
        shard.begin_checkpoint();
        shard.copy_checkpoint_step(); // a few trees handed out, most not
        shard.load(drop).unwrap(); // as after a failed commit
        assert!(shard.checkpoints.copying.is_none(), "the rebuild dropped the checkpoint under way");
        // The next batch would have ended a checkpoint carried on; a crash
        // (a reopen as after kill -9: no checkpoint taken on the way) then.
        shard.write(&boards[0], "q", 7, Mode::Set, 1000).unwrap();
        shard.commit().unwrap();
        let shard = shard.reopen().unwrap();
        shard.check().unwrap();
        for (i, board) in boards.iter().enumerate() {
            let tree = TreeId::all_time(board.id);
            assert_eq!(shard.get(tree, "p").unwrap().map(|r| r.score), Some(i as i64), "board {}", board.id);
            assert_eq!(shard.count(tree), 1 + u64::from(i == 0), "board {}", board.id);
        }
    }

    /// A checkpoint begun as the writes stop is copied by steps between
    /// rounds, a slice of 4 leaves each: every tree it hands out freezes
    /// without another write, and the next write's batch ends it; the
    /// boards survive a reopen.
    #[test]
    fn an_idle_shards_checkpoint_is_copied_by_steps_and_its_trees_freeze() {
        let dir = tempfile::tempdir().unwrap();
        let (mut shard, boards) = hundred_boards(dir.path());
        assert!(!shard.copy_checkpoint_step(), "no checkpoint under way: nothing to copy");
        shard.begin_checkpoint();
        assert_eq!(shard.tree_forms().compact, 100);
        let left = |shard: &Shard| shard.checkpoints.copying.as_ref().map_or(0, |c| c.trees.len());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while left(&shard) > 0 {
            let before = shard.tree_forms().frozen;
            if !shard.copy_checkpoint_step() && left(&shard) > 0 {
                // The writer is behind: a step copies nothing until it catches up.
                assert!(!shard.checkpoint_copy_waits() && shard.checkpoint_copy_left());
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(shard.tree_forms().frozen - before <= 4, "a step copies a batch's slice at most");
            assert!(std::time::Instant::now() < deadline, "the copy must finish");
        }
        assert_eq!(shard.tree_forms().frozen, 100, "every tree handed out froze");
        assert!(shard.checkpoints.copying.is_some(), "the checkpoint ends with a batch");
        assert!(!shard.checkpoint_copy_left());

        shard.write(&boards[0], "q", 7, Mode::Set, 1000).unwrap();
        shard.commit().unwrap();
        assert!(shard.checkpoints.copying.is_none(), "the next batch ended it");
        let shard = shard.reopen().unwrap();
        shard.check().unwrap();
        assert_eq!(shard.tree_forms().frozen, 99, "the first board changed after the checkpoint: replayed live");
        for (i, board) in boards.iter().enumerate() {
            let tree = TreeId::all_time(board.id);
            assert_eq!(shard.get(tree, "p").unwrap().map(|r| r.score), Some(i as i64));
        }
        assert_eq!(shard.count(TreeId::all_time(1)), 2);
    }

    /// A crash after a checkpoint's leaves are written but before the log
    /// deletion that follows them (the runs thread writes them in that
    /// order) leaves log records the leaves already hold: the restart must
    /// not count them twice, and the next checkpoint deletes them.
    #[test]
    fn leaves_written_without_their_log_deletion_are_not_replayed_into() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        let keys: Vec<u128> = (0..200).map(|s| key::tree_key(key::score_key(s, Order::Desc), 0)).collect();
        // Checkpoints are due after a few logged changes.
        let options = ShardOptions { checkpoint_every: 1, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        for i in 0..500i64 {
            shard.write(&board, &format!("p{i}"), i * 37 % 101, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        for i in 0..300i64 {
            shard.write(&board, &format!("p{}", i * 7 % 600), 100 + i % 97, Mode::Set, 1000 + i as u64).unwrap();
        }
        let sealed = shard.seal();
        let Some(runs) = sealed.write().unwrap().runs else { panic!("the batch should carry a checkpoint") };
        shard.durability_handle().sync().unwrap();
        runs.overlay.write_runs(&runs.players, &runs.index).unwrap();
        runs.checkpoint.expect("a checkpoint").finish().unwrap();
        // The crash: `runs.after` (log deletion, runs marker) is never written.
        drop(runs.after);
        let (count, before) = (shard.count(tree), shard.count_before(tree, &keys));
        let record = shard.get(tree, "p7").unwrap();
        assert!(count > 500, "the second batch adds players");
        drop((shard, runs.overlay, runs.players, runs.index));

        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        assert!(shard.storage.changes.iter().next().is_some(), "the test must leave log records behind");
        assert_eq!(shard.count(tree), count);
        assert_eq!(shard.count_before(tree, &keys), before);
        assert_eq!(shard.get(tree, "p7").unwrap(), record);
        shard.check().unwrap();

        shard.write(&board, "p1", 5, Mode::Set, 5000).unwrap();
        shard.commit().unwrap();
        shard.checkpoint().unwrap();
        assert!(shard.storage.changes.iter().next().is_none(), "a checkpoint deletes the records left behind");
        let (count, before) = (shard.count(tree), shard.count_before(tree, &keys));
        drop(shard);
        let shard = Shard::open(dir.path(), options).unwrap();
        assert_eq!(shard.count(tree), count);
        assert_eq!(shard.count_before(tree, &keys), before);
        shard.check().unwrap();
    }
}
