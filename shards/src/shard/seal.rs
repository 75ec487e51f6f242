//! Sealing and committing: the open batch leaves the shard as one atomic
//! fjall batch ([`SealedBatch`]), is written and made durable on any thread,
//! then writes the runs (and checkpoint) it carries; until it is reported
//! landed, the overlay it froze stays readable from memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, PersistMode};

use super::apply::DenseChange;
use super::checkpointing::Checkpointing;
use super::storage::{Memtables, META_MAX_SEQ, META_RUNS_THROUGH};
use super::Shard;
use crate::checkpoint::LeafWriter;
use crate::error::ShardError;
use crate::overlay::Overlay;

/// What a successful [`Shard::commit`] did, for the caller's metrics and the
/// dense indexes.
#[derive(Debug, Default)]
pub struct Committed {
    /// Changes to dense trees' score sets.
    pub dense: Vec<DenseChange>,
    /// Score writes and removals committed.
    pub writes: usize,
    /// Time writing the batch to the journal and memtables.
    pub journal: Duration,
    /// Time making it durable (fsync, or handing it to the OS when buffered).
    pub sync: Duration,
}

/// A batch taken out of the shard by [`Shard::seal`], to be written by any
/// thread. Sealed batches must be written in the order they were sealed, and
/// none after one failed (the storage is poisoned then: reopen the shard).
pub struct SealedBatch {
    /// The fjall batch, `None` when the batch changed nothing stored.
    batch: Option<fjall::OwnedWriteBatch>,
    /// Changes to dense trees' score sets.
    pub dense: Vec<DenseChange>,
    /// Score writes and removals in the batch.
    pub writes: usize,
    /// Passed on to the written batch, which seals full memtables.
    memtables: Memtables,
    /// Whether the written batch seals every memtable holding anything,
    /// not only full ones: it ends a checkpoint an idle shard took.
    flush_memtables: bool,
    /// Runs to write once the batch is durable.
    runs: Option<Runs>,
}

/// The overlay a batch froze when sealed, to be written as runs once the
/// batch's log record is durable, and what follows them.
pub(super) struct Runs {
    /// The frozen overlay, shared with the shard's reads until it lands.
    pub(super) overlay: Arc<Overlay>,
    /// Where its player records go.
    pub(super) players: Keyspace,
    /// Where its index entries go.
    pub(super) index: Keyspace,
    /// At a checkpoint, the writer of its leaves: finished once the runs
    /// are written.
    pub(super) checkpoint: Option<LeafWriter>,
    /// Written last: the marker saying how far the runs reach and, at a
    /// checkpoint, the deletion of the log the leaves make redundant. Not
    /// synced itself: if a crash loses it, the log is still there, and the
    /// runs are written again (the leaves' own marker says which records
    /// they already hold).
    pub(super) after: fjall::OwnedWriteBatch,
}

impl SealedBatch {
    /// Whether the batch changes nothing stored.
    pub fn is_empty(&self) -> bool {
        self.batch.is_none() && self.runs.is_none()
    }

    /// Writes the batch to the journal and memtables, atomically, without
    /// making it durable (see [`DurabilityHandle::sync`]). Full memtables
    /// are left for [`WrittenBatch::write_runs`] to seal: sealing one makes
    /// fjall delete the files compactions have made obsolete, there and
    /// then, which can take long enough (a large unlink on a disk mounted
    /// with `discard`) to stall every acknowledgment if done here.
    pub fn write(self) -> Result<WrittenBatch, ShardError> {
        let started = Instant::now();
        if let Some(batch) = self.batch {
            batch.commit()?;
        }
        Ok(WrittenBatch {
            took: started.elapsed(),
            runs: self.runs,
            memtables: self.memtables,
            flush_memtables: self.flush_memtables,
        })
    }
}

/// A batch in the journal, perhaps not yet durable, with the runs it still
/// has to write.
pub struct WrittenBatch {
    /// How long writing the batch took.
    pub took: Duration,
    /// Runs still to write, now that the batch is in the journal.
    pub(super) runs: Option<Runs>,
    /// Full memtables to seal after the runs (see [`SealedBatch::write`]).
    memtables: Memtables,
    /// Seal every memtable holding anything, not only full ones.
    flush_memtables: bool,
}

impl WrittenBatch {
    /// Whether [`WrittenBatch::write_runs`] has anything to do: runs to
    /// write, or a full memtable to seal.
    pub fn has_work(&self) -> bool {
        self.runs.is_some() || self.flush_memtables || self.memtables.any_to_seal()
    }

    /// Whether the batch ends a checkpoint: [`WrittenBatch::write_runs`]
    /// writes its leaves.
    pub fn carries_checkpoint(&self) -> bool {
        self.runs.as_ref().is_some_and(|runs| runs.checkpoint.is_some())
    }

    /// Writes the runs the batch carries, if any, and what follows them,
    /// then seals full memtables (all that hold anything, at the end of an
    /// idle shard's checkpoint) for flushing; returns how long that took.
    /// Call only once the batch is durable
    /// ([`DurabilityHandle::sync`] returned after [`SealedBatch::write`]),
    /// for batches in the order they were sealed: a run must never reach
    /// storage before the log that covers it. A failure poisons nothing that
    /// was acknowledged (the log holds it), but the shard must be reopened.
    pub fn write_runs(self) -> Result<Duration, ShardError> {
        let started = Instant::now();
        if let Some(runs) = self.runs {
            runs.overlay.write_runs(&runs.players, &runs.index)?;
            if let Some(leaves) = runs.checkpoint {
                leaves.finish()?;
            }
            runs.after.commit()?;
        }
        if self.flush_memtables {
            self.memtables.rotate_all()?;
        } else {
            self.memtables.rotate_full()?;
        }
        Ok(started.elapsed())
    }
}

/// Makes everything a shard has committed so far durable: the group-commit
/// half of a write after [`Shard::seal`] and [`SealedBatch::write`], on
/// whichever thread commits (the server's committer).
#[derive(Clone)]
pub struct DurabilityHandle {
    /// The shard's database: persisting it covers every batch written.
    db: Database,
    /// fsync, or hand to the OS, per [`Durability`](super::Durability).
    mode: PersistMode,
}

impl DurabilityHandle {
    /// Flushes the journal to the OS and, under
    /// [`Durability::Sync`](super::Durability::Sync), fsyncs it; returns how
    /// long that took. One call covers every batch committed before it,
    /// which is what group commit shares. A failure poisons the storage
    /// (fjall refuses later writes): reopen the shard to go on.
    pub fn sync(&self) -> Result<Duration, ShardError> {
        let started = Instant::now();
        self.db.persist(self.mode)?;
        Ok(started.elapsed())
    }
}

impl Shard {
    /// Writes the open batch atomically and persists it, then writes the
    /// runs (and checkpoint) it carries: on one thread what a server splits
    /// between [`Shard::seal`] and its committer. On failure the in-memory
    /// state is rebuilt from disk, so it never runs ahead of what is stored,
    /// and the error is returned: none of the batch may be acknowledged.
    pub fn commit(&mut self) -> Result<Committed, ShardError> {
        if !self.has_staged() {
            return Ok(Committed::default());
        }
        let mut sealed = self.seal();
        let (dense, writes) = (std::mem::take(&mut sealed.dense), sealed.writes);
        let written = sealed.write().map_err(|err| self.rolled_back(err))?;
        let journal = written.took;
        let sync = self.durability_handle().sync().map_err(|err| self.rolled_back(err))?;
        written.write_runs().map_err(|err| self.rolled_back(err))?;
        self.landed(1);
        Ok(Committed { dense, writes, journal, sync })
    }

    /// After a failed write or sync: rebuilds the in-memory state from disk,
    /// so it never runs ahead of what is stored, and hands back the error.
    pub(super) fn rolled_back(&mut self, err: ShardError) -> ShardError {
        // Best effort: if even reading fails, later requests fail too.
        if let Err(reload) = self.load(drop) {
            tracing::error!(error = %reload, "reloading shard state after a failed commit failed");
        }
        err
    }

    /// Takes the open batch out of the shard as one atomic fjall batch — its
    /// log record, board configs and the sequence high-water mark — for any
    /// thread to write with [`SealedBatch::write`]. When the overlay is due
    /// to be written (or a checkpoint is), the batch also carries the frozen
    /// overlay and, for a checkpoint, the changed leaves, to be written once
    /// it is durable ([`WrittenBatch::write_runs`]). Pure memory work: the
    /// shard's thread never waits for storage here. The in-memory state
    /// already includes the batch, and stays readable from memory until
    /// [`Shard::landed`] reports the batch done.
    ///
    /// If writing a sealed batch fails, the in-memory state is ahead of
    /// storage: reopen the shard ([`Shard::reopen`]).
    pub fn seal(&mut self) -> SealedBatch {
        let staged = std::mem::take(&mut self.staged);
        let mut batch = self.storage.db.batch().durability(None);
        // The batch's `wid` records, as one value (see `crate::dedup`).
        if let Some((key, Some(records))) = self.dedup.seal_group(self.now) {
            batch.insert(&self.storage.meta, key, records);
        }
        for (key, value) in &staged.meta {
            match value {
                Some(v) => batch.insert(&self.storage.meta, key.as_slice(), v.as_slice()),
                None => batch.remove(&self.storage.meta, key.as_slice()),
            }
        }
        if staged.seq_dirty {
            batch.insert(&self.storage.meta, META_MAX_SEQ, self.max_seq.to_be_bytes());
        }
        if staged.changes > 0 {
            batch.insert(&self.storage.changes, self.log.next.to_be_bytes(), staged.log.as_slice());
            self.log.next += 1;
            self.log.logged += staged.changes;
        }
        if staged.changes > 0 && self.checkpoints.copying.is_none() && self.checkpoint_due(self.log.logged) {
            self.begin_checkpoint();
        }
        // The checkpoint under way, once its last slice is copied.
        let checkpoint = if self.copy_checkpoint_slice(staged.writes) { self.checkpoints.copying.take() } else { None };
        let flush_memtables = checkpoint.as_ref().is_some_and(Checkpointing::flushes_memtables);
        let runs =
            (checkpoint.is_some() || self.overlay.players() >= self.options.run_every).then(|| self.freeze(checkpoint));
        self.in_flight.push(runs.as_ref().map(|runs| runs.overlay.clone()));
        SealedBatch {
            batch: (!batch.is_empty()).then_some(batch),
            dense: staged.dense,
            writes: staged.writes,
            memtables: self.storage.memtables.clone(),
            flush_memtables,
            runs,
        }
    }

    /// Takes the overlay out for a sealed batch to write as runs once it is
    /// durable, with the marker that follows them and, when the copy of a
    /// `checkpoint` is done, the writer of its leaves and the deletion of
    /// the log they replace. Reads keep seeing the frozen overlay until the
    /// batch is reported done.
    fn freeze(&mut self, checkpoint: Option<Checkpointing>) -> Runs {
        let empty = self.empty_overlay();
        let mut overlay = std::mem::replace(&mut self.overlay, empty);
        overlay.freeze();
        let overlay = Arc::new(overlay);
        let mut after = self.storage.db.batch().durability(None);
        let checkpoint = match checkpoint {
            Some(checkpoint) => Some(self.finish_checkpoint(&mut after, checkpoint)),
            None => {
                self.mark_runs(&mut after);
                None
            }
        };
        let (players, index) = (self.storage.players.clone(), self.storage.index.clone());
        Runs { overlay, players, index, checkpoint, after }
    }

    /// An overlay for the changes from now on.
    pub(super) fn empty_overlay(&self) -> Overlay {
        Overlay::new(self.options.run_every)
    }

    /// Adds to `batch` the marker that runs now cover every log record so far.
    pub(super) fn mark_runs(&self, batch: &mut fjall::OwnedWriteBatch) {
        batch.insert(&self.storage.meta, META_RUNS_THROUGH, self.log.next.to_be_bytes());
    }

    /// Reports that the `count` oldest sealed batches not yet reported are
    /// written (or failed, and the shard will be reopened): storage now
    /// answers for their player records.
    pub fn landed(&mut self, count: usize) {
        self.in_flight.land(count);
    }

    /// Sealed batches carrying runs (frozen overlays) that have not landed:
    /// each holds its overlay in memory until its runs are written.
    pub fn unwritten_runs(&self) -> usize {
        self.in_flight.unwritten_runs()
    }

    /// Whether nothing is staged or sealed-but-unwritten: what reads that
    /// scan storage (lists, checks) and maintenance need.
    pub fn is_settled(&self) -> bool {
        !self.has_staged() && self.in_flight.is_empty()
    }

    /// What makes committed batches durable, detached from the shard so it
    /// can run on another thread. Holding one keeps the storage open: drop it
    /// before [`Shard::reopen`].
    pub fn durability_handle(&self) -> DurabilityHandle {
        DurabilityHandle { db: self.storage.db.clone(), mode: self.persist_mode() }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{all_time_board, ShardOptions};
    use super::*;
    use crate::board::Mode;

    /// Only sealed batches that carry runs count as unwritten runs, until
    /// they land.
    #[test]
    fn unwritten_runs_count_frozen_overlays_until_they_land() {
        let dir = tempfile::tempdir().unwrap();
        let (board, _) = all_time_board();
        let options = ShardOptions { run_every: 10, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options).unwrap();
        for batch in 0..4u64 {
            // Batches 0 and 2 change 10 players (a run is due), 1 and 3 one.
            let players = if batch % 2 == 0 { 10 } else { 1 };
            for i in 0..players {
                shard.write(&board, &format!("p{batch}-{i}"), i as i64, Mode::Set, batch * 100 + i + 1).unwrap();
            }
            assert_eq!(shard.seal().runs.is_some(), batch % 2 == 0, "batch {batch}");
        }
        assert_eq!(shard.unwritten_runs(), 2);
        shard.landed(1);
        assert_eq!(shard.unwritten_runs(), 1);
        shard.landed(3);
        assert_eq!(shard.unwritten_runs(), 0);
    }
}
