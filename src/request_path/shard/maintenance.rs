//! Between rounds: the once-a-second work (storage gauges, expired periods,
//! an idle shard's checkpoint), reopening a failed storage, and repacking
//! count-tree leaves.

use std::time::Instant;

use rankd_shards::{IdleStep, Shard};

use super::batch_loop::BatchLoop;
use crate::operations::allocator::Packer;
use crate::operations::priority;

/// Keys of expired periods and dropped boards deleted per maintenance step
/// (one a second, on the shard's thread): a batch of tombstones, not
/// fsynced, of a few milliseconds, so a rollover or a dropped board of
/// millions holds a round up only that long, and a 10M-player board (~20M
/// keys) is gone in about twenty minutes.
const EXPIRY_BUDGET: usize = 16_384;

/// Expired `wid` records deleted per second: at a 600 s horizon, enough
/// for 50,000 idempotent writes a second per shard; past that the records
/// wait longer, bounded in memory by the dedup table.
const WID_EXPIRY_BUDGET: usize = 50_000;

/// Count-tree leaves looked at per repacking step: keeps a step about as
/// long as a small round (see docs/performance-history.md).
const REPACK_BUDGET: usize = 256;

/// See [`BatchLoop::steps_waiting`].
#[derive(Debug, Clone, Copy, Default)]
pub struct StepsWaiting {
    pub repack: bool,
    pub copy: bool,
}

impl BatchLoop {
    /// Catches up with the pipeline; while degraded, tries to reopen the
    /// storage. Once a second (rounds run thousands of times a second),
    /// publishes the storage gauges and, unless degraded, deletes a bounded
    /// slice of expired periods (waiting for the pipeline first if it must:
    /// sustained writes must not starve expiry).
    pub fn maintain(&mut self) {
        // Batches finished since the actor last heard (the committer does
        // not wake it for each group), and any failure.
        self.respawn_dead_pipeline();
        self.catch_up();
        if self.health.should_reopen(Instant::now(), self.pipeline.unfinished()) {
            self.try_recover();
        }
        let now = self.clock.now();
        if now == self.last_tick {
            return;
        }
        self.last_tick = now;
        self.observe_storage();
        if self.health.is_degraded() {
            return;
        }
        self.expire_wids(now);
        self.settle_idle();
        let has_expired = self.engine.with(|shard| {
            shard.set_time(now);
            shard.has_expired()
        });
        if has_expired != Some(true) {
            return;
        }
        // Lone writes staged in place during the settle would leave the
        // shard unsettled again: they queue behind this step instead.
        let _held = self.engine.hold_writes_in_place();
        self.settle();
        if self.health.is_degraded() {
            return;
        }
        match self.engine.with(|shard| shard.expire(EXPIRY_BUDGET)) {
            Some(Ok(expired)) if !expired.is_empty() => {
                tracing::info!(shard = self.index, periods = expired.len(), "expired periods dropped");
                self.dense.forget(&expired);
            }
            Some(Err(e)) => {
                tracing::warn!(shard = self.index, error = %e, "deleting expired periods failed; will retry")
            }
            _ => {}
        }
    }

    /// Stages deleting a bounded number of `wid` records past the dedup
    /// horizon (or over its memory bound), for the next batch, and
    /// publishes what the table holds.
    fn expire_wids(&mut self, now: i64) {
        let Some((deleted, (records, bytes, early))) = self.engine.with(|shard| {
            shard.set_time(now);
            let deleted = if shard.has_expired_wids() { shard.expire_wids(WID_EXPIRY_BUDGET) } else { 0 };
            (deleted, shard.dedup_stats())
        }) else {
            return;
        };
        self.engine.lock().staged_unanswered |= deleted > 0;
        let metrics = &self.metrics.shards[self.index];
        metrics.dedup_records.set(i64::try_from(records).unwrap_or(i64::MAX));
        metrics.dedup_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        // What this opening's table dropped since the last look: a reopened
        // storage's table counts from zero (see `try_recover`).
        metrics.dedup_early_expiries.inc_by(early.saturating_sub(self.dedup_early_seen));
        self.dedup_early_seen = early;
        self.seal_and_submit(false);
    }

    /// Lets an idle shard put what its writes left in memory into storage
    /// (see `rankd_shards::Shard::settle_idle`): once a second, with
    /// nothing queued. Its checkpoint is copied by steps between requests
    /// (the actor schedules them after this); once copied, the batch that
    /// ends it is sealed here.
    fn settle_idle(&mut self) {
        if self.has_queued() {
            return;
        }
        let mut engine = self.engine.lock();
        if engine.shard.as_mut().map(Shard::settle_idle) != Some(IdleStep::Seal) {
            return;
        }
        // Marked under the same hold as the end was staged: whoever seals
        // next (this, the committer, an in-place write) takes it.
        engine.staged_unanswered = true;
        drop(engine);
        self.seal_and_submit(false);
    }

    /// Publishes how the shard's storage keeps up.
    fn observe_storage(&mut self) {
        let Some((stats, deleting, forms, logged, unwritten)) = self.engine.with(|shard| {
            let logged = shard.logged_changes();
            (shard.storage_stats(), shard.trees_being_deleted(), shard.tree_forms(), logged, shard.unwritten_players())
        }) else {
            return;
        };
        let metrics = &self.metrics.shards[self.index];
        // Also set as batches are sealed; here too for a shard with none.
        metrics.logged_changes.set(i64::try_from(logged).unwrap_or(i64::MAX));
        metrics.unwritten_players.set(i64::try_from(unwritten).unwrap_or(i64::MAX));
        metrics.frozen_trees.set(i64::try_from(forms.frozen).unwrap_or(i64::MAX));
        metrics.compact_trees.set(i64::try_from(forms.compact).unwrap_or(i64::MAX));
        metrics.burst_trees.set(i64::try_from(forms.burst).unwrap_or(i64::MAX));
        metrics.trees_being_deleted.set(i64::try_from(deleting).unwrap_or(i64::MAX));
        metrics.memtable_bytes.set(i64::try_from(stats.memtable_bytes).unwrap_or(i64::MAX));
        metrics.sealed_memtables.set(i64::try_from(stats.sealed_memtables).unwrap_or(i64::MAX));
        if let Some(bytes) = stats.disk_bytes {
            metrics.disk_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        if let Some(bytes) = available_bytes(&self.location.0) {
            metrics.disk_available_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        // fjall counts from zero again after a reopen (see `try_recover`).
        metrics.compaction_seconds.inc_by(stats.compacting.saturating_sub(self.compacting_seen).as_secs_f64());
        self.compacting_seen = stats.compacting;
    }

    /// Reopens the storage after a failure; on success writes resume.
    ///
    /// The batches that failed had already reported their dense changes
    /// (as they were staged, so that reads would see them); the reopened
    /// storage holds only what was durable, so this shard's share of the
    /// dense indexes is replaced with what it holds now.
    fn try_recover(&mut self) {
        if self.engine.with(|shard| shard.has_staged()) == Some(true) {
            self.seal_and_submit(true); // everything staged is answered first
            return;
        }
        // Reopening needs the old storage closed first (fjall locks it), and
        // until it succeeds reads have no engine to read from. So the disk is
        // asked first: while it cannot take a synced write, the degraded
        // shard keeps serving reads from what it holds.
        // A backup's image holds the storage open too (its lock): reopening
        // waits until the backup is streamed.
        if self.engine.with(|shard| shard.images_alive()) == Some(true) {
            self.health.reopen_failed(Instant::now());
            tracing::warn!(shard = self.index, "a backup holds the storage; reopening after it");
            return;
        }
        if self.engine.with(|_| ()).is_some() {
            if let Err(e) = storage_takes_synced_writes(&self.location.0) {
                self.health.reopen_failed(Instant::now());
                tracing::warn!(shard = self.index, error = %e, "storage still failing; serving reads, retrying");
                return;
            }
        }
        let reopened = match self.engine.take() {
            Some(shard) => {
                self.reported_dense.get_or_insert_with(|| shard.dense_score_counts());
                shard.reopen()
            }
            // An earlier attempt failed and dropped the shard: open it afresh.
            None => Shard::open(&self.location.0, self.location.1.clone()),
        };
        self.pipeline.reopened();
        match reopened {
            Ok(mut shard) => {
                tracing::warn!(shard = self.index, "storage reopened; accepting writes again");
                // The reopened storage's workers were started by this thread.
                priority::make_fjall_workers_background();
                shard.set_time(self.clock.now());
                self.shard_metrics().players.set(shard.players() as i64);
                let reported = self.reported_dense.take().unwrap_or_default();
                self.dense.replace_share(&reported, &shard.dense_score_counts());
                self.engine.put(shard);
                // The new opening's counters start from zero: all they count
                // from now on is new.
                (self.compacting_seen, self.dedup_early_seen) = (std::time::Duration::ZERO, 0);
                self.health.recovered(); // and `rankd_shard_degraded` with it
                self.engine.set_healthy(true);
            }
            Err(e) => {
                // Reopening from the data dir needs no in-memory state, so
                // nothing is lost: retry next second.
                self.health.reopen_failed(Instant::now());
                tracing::error!(shard = self.index, error = %e, "reopening storage failed; retrying");
            }
        }
    }

    /// Copies a step of the checkpoint under way if nothing waits to be
    /// applied or sealed (a round's seal copies its own slice); returns
    /// whether another step would copy more.
    pub fn checkpoint_copy_step(&mut self) -> bool {
        if self.has_queued() {
            return false;
        }
        let step = |shard: &mut Shard| !shard.has_staged() && shard.copy_checkpoint_step();
        self.engine.with(step) == Some(true)
    }

    /// The steps between requests the shard has waiting, found under one
    /// hold of its engine (asked after every round): a repacking pass (a
    /// sealed batch may have checkpointed and started one) and a
    /// checkpoint's leaves that no sealed batch has copied yet.
    pub fn steps_waiting(&self) -> StepsWaiting {
        let waiting =
            |shard: &mut Shard| StepsWaiting { repack: shard.is_repacking(), copy: shard.checkpoint_copy_left() };
        self.engine.with(waiting).unwrap_or_default()
    }

    /// Looks at a slice of count-tree leaves and moves those on sparse
    /// allocator slabs; one step at a time, so steps queue behind requests.
    pub fn repack_step(&mut self) {
        let Some(done) = self.engine.with(|shard| {
            let mut packer = Packer::default();
            shard.repack_step(REPACK_BUDGET, |leaf| packer.pick(leaf))
        }) else {
            return;
        };
        let metrics = self.shard_metrics();
        metrics.repack_visited.inc_by(done.visited as u64);
        metrics.repack_moved.inc_by(done.moved as u64);
    }
}

/// Bytes an unprivileged process may still write on the filesystem of
/// `path` (statvfs's `f_bavail`); `None` if it cannot be read.
fn available_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stats` is written by statvfs
    // before it is read, which happens only when the call succeeded.
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return None;
        }
        stats.assume_init()
    };
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ by platform
    Some((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// Whether the disk under a shard's directory takes a write and its fsync
/// (and a directory fsync): a probe file, removed again.
fn storage_takes_synced_writes(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join("rankd.probe");
    let mut probe = std::fs::File::create(&path)?;
    probe.write_all(b"rankd")?;
    probe.sync_all()?;
    std::fs::File::open(dir)?.sync_all()?;
    std::fs::remove_file(path)
}
