//! A shard's engine and what is staged in it, shared by its actor, the
//! committer and the I/O threads: whoever holds the lock exclusively may
//! stage a write or seal everything staged into the next batch; readers
//! share it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use rankd_shards::commit::Submitter;
use rankd_shards::Shard;

use super::apply::apply;
use super::batch_loop::LOOK_AHEAD;
use super::command::{Command, Held};
use super::link::Origin;
use super::relay::send_all;
use crate::clock::Clock;
use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::request_path::dense_registry::DenseRegistry;

/// Sealed batches whose runs may wait for the runs thread before writes
/// stop being staged anywhere but on the shard's own thread, which then
/// waits for it. Each holds a frozen overlay (up to ~10 MB) in memory until
/// written, and the runs thread runs at a low priority, so writers busy
/// enough to starve it would otherwise grow them without bound.
pub const MAX_UNWRITTEN_RUNS: usize = 4;

/// The answers a sealed batch carries to the committer.
pub type Acks = Vec<(Origin, Held)>;

/// What the cell's lock guards.
pub struct Engine {
    /// The storage and its count trees; absent only while the actor reopens
    /// a failed storage.
    pub shard: Option<Shard>,
    /// Answers of staged writes, held until their batch is durable, with
    /// the I/O thread each goes back to.
    pub held: Acks,
    /// Something is staged that no held answer waits for (expired `wid`
    /// records to delete): the next seal must happen even without one.
    pub staged_unanswered: bool,
    /// Hands sealed batches to the committer; present while its thread
    /// runs. Without it only the actor seals, and commits inline. Set
    /// through [`EngineCell::set_submitter`].
    pub submitter: Option<Submitter<Acks>>,
    /// Whether the actor takes writes (not degraded): writes are staged in
    /// place only then, so a refusal is always the actor's. Set through
    /// [`EngineCell::set_healthy`].
    pub healthy: bool,
}

impl Engine {
    /// Whether the runs thread is more than [`MAX_UNWRITTEN_RUNS`] behind:
    /// then nothing is sealed (each seal may freeze one more overlay) until
    /// the actor has waited for it.
    pub fn runs_behind(&self) -> bool {
        self.shard.as_ref().is_some_and(|shard| shard.unwritten_runs() > MAX_UNWRITTEN_RUNS)
    }

    /// Whether a seal now would have anything to take.
    fn has_staged(&self) -> bool {
        !self.held.is_empty() || self.staged_unanswered
    }
}

/// The engine behind one small read-write lock. The contract:
///
/// - every change is made under the exclusive lock, and so is every seal,
///   which takes everything staged and its answers together and submits it
///   before the lock is released: batches reach the committer in the order
///   they were sealed, whoever sealed them;
/// - the actor locks per command, not per round, so the lock is seldom held
///   for long; the router only ever `try_`locks, and when the lock is taken
///   it queues the request for the actor instead. Reads in place share the
///   lock, so the I/O threads' ranks do not push each other to the actor;
/// - a write is staged in place only while nothing sent to the shard is
///   still unapplied ([`EngineCell::unapplied`]), so it never overtakes a
///   request routed before it;
/// - while a batch is with the committer, a lone write is not applied in
///   place but left *waiting* for it: whoever next takes the lock
///   exclusively applies what waits first, in order, and the committer
///   applies it before it acknowledges its group.
///
/// Why share at all: a request queued for the actor costs two thread
/// wake-ups (to the shard and back) and a wait behind its round; a lone
/// rank read in place costs a few µs, and a lone write staged in place goes
/// from the I/O thread to the committer directly. After each group the
/// committer seals what was staged meanwhile itself, so the next fsync
/// does not wait for the actor to wake. Why wait for the committer rather
/// than apply in place: the committer applies a group's writes in one go,
/// their memory fetched ahead together, and two I/O threads no longer meet
/// at the lock and send the loser to the actor (see
/// docs/performance-history.md).
#[derive(Clone)]
pub struct EngineCell(Arc<Shared>);

/// See [`EngineCell::hold_writes_in_place`]: counted as one more unapplied
/// command while it lives.
pub struct InPlaceHold(EngineCell);

impl Drop for InPlaceHold {
    fn drop(&mut self) {
        self.0 .0.unapplied.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Shared {
    engine: RwLock<Engine>,
    /// Lone writes left for the committer while a batch syncs, oldest first.
    /// Locked only inside the engine's lock or without it, never the other
    /// way round.
    waiting: Mutex<Waiting>,
    /// How many writes wait, read without the lock.
    waiting_len: AtomicUsize,
    /// Commands sent to the actor and not yet applied.
    unapplied: AtomicUsize,
    /// What a seal reports to, and what a write staged in place needs.
    metrics: Arc<Metrics>,
    index: usize,
    dense: DenseRegistry,
    clock: Clock,
}

/// Writes waiting for the committer, and the committer they wait for.
struct Waiting {
    writes: Vec<(Origin, Command)>,
    /// The engine's submitter and health, mirrored here so that a write
    /// can be left without the engine's lock.
    submitter: Option<Submitter<Acks>>,
    healthy: bool,
}

/// What a cell needs besides its engine.
pub struct CellParts {
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// The shard's index among the shards.
    pub index: usize,
    /// The dense indexes, told of each write as it is staged.
    pub dense: DenseRegistry,
    /// Decides which period a write lands in.
    pub clock: Clock,
}

/// A cell as the committer's hooks hold it: not keeping the engine alive.
pub struct WeakEngineCell(Weak<Shared>);

impl WeakEngineCell {
    /// Applies the writes waiting for the committer, for the committer
    /// before it acknowledges its group: what arrived during the fsync is
    /// then staged before the answers wake the I/O threads, whose work
    /// would otherwise preempt it on a small machine. A turn at a time,
    /// so that reads in place are not held off for the whole group.
    pub fn apply_waiting(&self) {
        let Some(shared) = self.0.upgrade() else { return };
        let cell = EngineCell(shared);
        let waits = || cell.0.waiting_len.load(Ordering::Acquire) > 0;
        while waits() && cell.0.unapplied.load(Ordering::Acquire) == 0 {
            // Not behind the actor's longer holds: the answers go first
            // then, and the look after them applies what waits.
            let Some(mut engine) = cell.0.engine.try_write() else { return };
            cell.apply_waiting_turn(&mut engine);
        }
    }
}

/// A sealed batch no committer thread takes: its caller commits it inline.
pub struct Unsubmitted {
    /// What goes to the journal.
    pub batch: rankd_shards::SealedBatch,
    /// What makes it durable.
    pub handle: rankd_shards::DurabilityHandle,
    /// The answers it holds.
    pub held: Acks,
}

impl EngineCell {
    /// Holds `shard`.
    pub fn new(shard: Shard, parts: CellParts) -> Self {
        let CellParts { metrics, index, dense, clock } = parts;
        let engine =
            Engine { shard: Some(shard), held: Vec::new(), staged_unanswered: false, submitter: None, healthy: true };
        Self(Arc::new(Shared {
            engine: RwLock::new(engine),
            waiting: Mutex::new(Waiting { writes: Vec::new(), submitter: None, healthy: true }),
            waiting_len: AtomicUsize::new(0),
            unapplied: AtomicUsize::new(0),
            metrics,
            index,
            dense,
            clock,
        }))
    }

    /// The cell, not kept alive: for the committer's hooks, which the
    /// engine's submitter holds.
    pub fn downgrade(&self) -> WeakEngineCell {
        WeakEngineCell(Arc::downgrade(&self.0))
    }

    /// Runs `f` on the engine, waiting for the lock; `None` while the
    /// storage is being reopened. For the actor.
    pub fn with<R>(&self, f: impl FnOnce(&mut Shard) -> R) -> Option<R> {
        self.lock().shard.as_mut().map(f)
    }

    /// Runs `f` on the engine if no one holds or waits for it exclusively
    /// and the engine is present; never waits. For the router: readers on
    /// other I/O threads share it, so ranks in place do not push each other
    /// to the actor. Writes waiting for the committer are not applied
    /// first: a read is in place only when its connection has nothing else
    /// in flight, so what waits is other clients' and not acknowledged.
    pub fn try_read<R>(&self, f: impl FnOnce(&Shard) -> R) -> Option<R> {
        self.0.engine.try_read()?.shard.as_ref().map(f)
    }

    /// [`EngineCell::try_read`] for a read that must see every write routed
    /// before it, its own connection's too: the writes waiting for the
    /// committer are applied first, the lock taken exclusively for that
    /// moment. For a rank's count forwarded by its owner, which may follow
    /// its connection's write to this shard in one batch.
    pub fn try_read_applied<R>(&self, f: impl FnOnce(&Shard) -> R) -> Option<R> {
        if self.0.waiting_len.load(Ordering::Acquire) == 0 {
            return self.try_read(f);
        }
        let mut engine = self.0.engine.try_write()?;
        self.apply_waiting(&mut engine);
        RwLockWriteGuard::downgrade(engine).shard.as_ref().map(f)
    }

    /// Takes the engine out to reopen it; readers see `None` until
    /// [`EngineCell::put`].
    pub fn take(&self) -> Option<Shard> {
        self.lock().shard.take()
    }

    /// Puts a (re)opened engine back.
    pub fn put(&self, shard: Shard) {
        self.0.engine.write().shard = Some(shard);
    }

    /// The lock itself, for a caller that needs the engine and what is
    /// staged at once (applying a command, sealing a batch). The writes
    /// waiting for the committer are applied first: whatever the caller
    /// does comes after them, as they came before it.
    pub fn lock(&self) -> RwLockWriteGuard<'_, Engine> {
        let mut engine = self.0.engine.write();
        self.apply_waiting(&mut engine);
        engine
    }

    /// Applies the writes waiting for the committer, in the order they
    /// came, their memory fetched ahead together. A shard that stopped
    /// taking writes meanwhile refuses them, as its actor would.
    fn apply_waiting(&self, engine: &mut Engine) {
        if self.0.waiting_len.load(Ordering::Acquire) > 0 {
            self.apply_all_waiting(engine);
        }
    }

    /// [`EngineCell::apply_waiting`] without the quick look: for the
    /// committer, whose look must not miss a write left as it lowered the
    /// count of batches in flight (see [`EngineCell::leave_waiting`]). A
    /// waiting write was left behind nothing unapplied, so it goes before
    /// whatever the actor has queued since.
    fn apply_all_waiting(&self, engine: &mut Engine) {
        while self.apply_waiting_turn(engine) {}
    }

    /// Applies the oldest [`LOOK_AHEAD`] writes waiting, or fewer; returns
    /// whether there were any.
    fn apply_waiting_turn(&self, engine: &mut Engine) -> bool {
        let turn: Vec<(Origin, Command)> = {
            let mut waiting = self.0.waiting.lock();
            let taken = waiting.writes.len().min(LOOK_AHEAD);
            let turn = waiting.writes.drain(..taken).collect();
            self.0.waiting_len.store(waiting.writes.len(), Ordering::Release);
            turn
        };
        if turn.is_empty() {
            return false;
        }
        let shard = match (engine.shard.as_mut(), engine.healthy) {
            (Some(shard), true) => shard,
            _ => {
                self.0.metrics.shards[self.0.index].mailbox_depth.sub(turn.len() as i64);
                let refusal = "writes are refused until storage recovers";
                turn.into_iter().for_each(|(_, command)| command.refuse(Error::Internal(refusal.into())));
                return true;
            }
        };
        shard.set_time(self.0.clock.now());
        shard.prefetch(turn.iter().filter_map(|(_, command)| command.upcoming()));
        for (origin, command) in turn {
            if let Some(held) = apply(shard, command, &mut |_| ()) {
                engine.held.push((origin, held));
            }
        }
        self.0.dense.apply(shard.drain_dense_changes());
        true
    }

    /// Hands the engine the committer's submitter, or takes it away: without
    /// one, nothing is sealed in place or left waiting.
    pub fn set_submitter(&self, submitter: Option<Submitter<Acks>>) {
        let mut engine = self.0.engine.write();
        self.0.waiting.lock().submitter = submitter.clone();
        engine.submitter = submitter;
        // Nothing is left waiting from here if there is no committer.
        self.apply_all_waiting(&mut engine);
    }

    /// Marks the shard as taking writes or not (degraded): while it does
    /// not, writes are the actor's to refuse.
    pub fn set_healthy(&self, healthy: bool) {
        let mut engine = self.0.engine.write();
        self.0.waiting.lock().healthy = healthy;
        engine.healthy = healthy;
        // Refused if the shard stops taking writes: nothing of a failing
        // storage's last sync is staged on it.
        self.apply_all_waiting(&mut engine);
    }

    /// Commands sent to the actor and not yet applied: raised by the link
    /// as it sends, lowered by the actor under the lock once each is applied.
    pub fn unapplied(&self) -> &AtomicUsize {
        &self.0.unapplied
    }

    /// Holds off writes in place (and the committer's seals of them) until
    /// the hold is dropped: meanwhile they queue for the actor, which takes
    /// the hold to settle the shard (nothing staged, nothing in flight) for
    /// work that needs it. A steady stream of lone writes, each staged in
    /// place, would otherwise never leave the shard settled.
    pub fn hold_writes_in_place(&self) -> InPlaceHold {
        // Under the waiting list's lock, as writes are left waiting: none
        // is left after the hold, which the actor's next lock would miss.
        let _waiting = self.0.waiting.lock();
        self.0.unapplied.fetch_add(1, Ordering::AcqRel);
        InPlaceHold(self.clone())
    }

    /// Stages `command`, a write whose client waits for it alone, without
    /// the actor, if nothing sent to the shard before it is still
    /// unapplied; its answer comes once durable, as if queued. While a
    /// batch is with the committer the write is left waiting for it (see
    /// [`EngineCell`]). Otherwise it is applied here, on the caller's
    /// thread, if the lock is free, the shard healthy and its committer
    /// running, and sealed at once. Gives the command back otherwise, to
    /// be queued.
    pub fn try_write(&self, origin: Origin, command: Command) -> Result<(), Command> {
        // Only a score write: maintenance (a drop, a shutdown) must wait
        // for the pipeline first, which only the actor does.
        if !matches!(command, Command::Write { .. }) {
            return Err(command);
        }
        let command = match self.leave_waiting(origin, command) {
            Ok(()) => return Ok(()),
            Err(command) => command,
        };
        let Some(mut engine) = self.0.engine.try_write() else { return Err(command) };
        self.apply_waiting(&mut engine);
        let engine = &mut *engine;
        if self.0.unapplied.load(Ordering::Acquire) > 0 || engine.runs_behind() {
            return Err(command); // the actor waits for the runs thread first
        }
        let (Some(shard), Some(_), true) = (&mut engine.shard, &engine.submitter, engine.healthy) else {
            return Err(command);
        };
        let metrics = &self.0.metrics.shards[self.0.index];
        metrics.mailbox_depth.inc(); // lowered as the answer is sent, as for a queued write
        shard.set_time(self.0.clock.now());
        if let Some(held) = apply(shard, command, &mut |_| ()) {
            engine.held.push((origin, held));
        }
        self.0.dense.apply(shard.drain_dense_changes());
        if engine.submitter.as_ref().is_some_and(|submitter| submitter.syncs_in_flight() == 0) {
            self.seal(engine);
        }
        Ok(())
    }

    /// Leaves `command` for the committer if a batch is with it and nothing
    /// sent to the actor is unapplied. The committer looks at what waits
    /// after every group it answers, having lowered the count of batches in
    /// flight first; the count is read here under the waiting list's lock,
    /// which the committer's look takes too, so a write left here is always
    /// seen.
    fn leave_waiting(&self, origin: Origin, command: Command) -> Result<(), Command> {
        let mut waiting = self.0.waiting.lock();
        let syncing = waiting.submitter.as_ref().is_some_and(|submitter| submitter.syncs_in_flight() > 0);
        if !syncing || !waiting.healthy || self.0.unapplied.load(Ordering::Acquire) > 0 {
            return Err(command);
        }
        self.0.metrics.shards[self.0.index].mailbox_depth.inc(); // lowered as the answer is sent
        waiting.writes.push((origin, command));
        self.0.waiting_len.store(waiting.writes.len(), Ordering::Release);
        Ok(())
    }

    /// Seals what was staged while the committer worked; for the committer,
    /// after each group, so the next fsync need not wait for the actor. Not
    /// while the actor has commands to apply: it seals at the end of its
    /// round, and a batch sealed mid-round would only be smaller.
    ///
    /// Returns whether the actor must hear of the pipeline's progress now
    /// rather than when it next looks: the pipeline met a failure, the
    /// shard is recovering from one (a reopen waits for every batch to
    /// finish), or writes are staged that only the actor may seal, once it
    /// has waited for the runs thread. An actor with commands to apply
    /// looks at the end of its round anyway.
    pub fn seal_staged(&self) -> bool {
        let idle = || self.0.unapplied.load(Ordering::Acquire) == 0;
        // A look under the waiting list's lock, not the quick one: a write
        // left as this thread lowered the count in flight must be seen.
        if !idle() && self.0.waiting.lock().writes.is_empty() {
            return false; // without taking the lock the actor is busy with
        }
        let mut engine = self.0.engine.write();
        self.apply_all_waiting(&mut engine);
        let behind = engine.runs_behind();
        if engine.submitter.is_some() && idle() && !behind {
            self.seal(&mut engine);
        }
        !engine.healthy
            || engine.submitter.as_ref().is_none_or(Submitter::has_failure)
            || (behind && engine.has_staged())
    }

    /// Seals everything staged into one batch and hands it to the committer
    /// with the answers it holds; returns it if no committer runs. If the
    /// storage is closed, the answers are sent failed.
    pub fn seal(&self, engine: &mut Engine) -> Option<Box<Unsubmitted>> {
        if !engine.has_staged() {
            return None;
        }
        engine.staged_unanswered = false;
        let held = std::mem::take(&mut engine.held);
        let metrics = &self.0.metrics.shards[self.0.index];
        let Some(shard) = engine.shard.as_mut() else {
            metrics.mailbox_depth.sub(held.len() as i64);
            send_all(held.into_iter().map(|(_, held)| held), Some("shard storage is closed; retrying"));
            return None;
        };
        let started = self.0.metrics.hot_path.then(Instant::now);
        let mut batch = shard.seal();
        metrics.unwritten_runs.set(shard.unwritten_runs() as i64);
        metrics.logged_changes.set(i64::try_from(shard.logged_changes()).unwrap_or(i64::MAX));
        if let Some(started) = started {
            metrics.seal_seconds.observe(started.elapsed().as_secs_f64());
            metrics.players.set(shard.players() as i64);
            metrics.unwritten_players.set(shard.unwritten_players() as i64);
        }
        // Normally empty: each write's changes were reported as it was staged.
        self.0.dense.apply(std::mem::take(&mut batch.dense).into_iter());
        let handle = shard.durability_handle();
        match &engine.submitter {
            Some(submitter) => {
                submitter.submit(batch, handle, held);
                None
            }
            None => Some(Box::new(Unsubmitted { batch, handle, held })),
        }
    }
}

/// The cell's rules, on a batch loop's engine (the loop's test fixture).
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rankd_shards::Shard;

    use super::{EngineCell, Origin};
    use crate::request_path::shard::batch_loop::tests::{fixture, score, score_soon, Fixture};
    use crate::request_path::shard::command::{Command, Pending, Written};

    /// A loop whose commits take `commit_ms`, with a committer, and a first
    /// write ("a" at 1) staged in place and sealed: a batch is syncing.
    fn syncing(commit_ms: u64) -> (Fixture, EngineCell, Pending<Written<i64>>) {
        let mut f = fixture();
        let slow = rankd_shards::commit::SlowDisk { commit: Duration::from_millis(commit_ms), ..Default::default() };
        f.core = f.core.with_slow_disk(slow);
        f.core.start_pipeline(Arc::new(|| {}));
        let cell = f.core.engine();
        let (first, first_answer) = f.write("a", 1, 1);
        assert!(cell.try_write(Origin(0), first).is_ok(), "nothing in flight: sealed and handed over at once");
        (f, cell, first_answer)
    }

    #[test]
    fn lone_writes_staged_in_place_are_answered_once_durable_and_the_committer_seals_what_came_meanwhile() {
        let (mut f, cell, first_answer) = syncing(200);
        let (second, mut second_answer) = f.write("b", 2, 2);
        assert!(cell.try_write(Origin(0), second).is_ok(), "left for the committer while the first batch commits");
        assert!(second_answer.try_recv().is_err(), "held until its own batch is durable");
        assert_eq!(score_soon(first_answer), Ok(1));
        // No round ran on the shard's thread: the committer sealed it.
        assert_eq!(score_soon(second_answer), Ok(2));
        assert_eq!(f.fsyncs(), 2);
        let (get, got) = f.get("b");
        f.enqueue(vec![get]);
        f.core.run_round();
        assert_eq!(got.blocking_recv().unwrap().unwrap().map(|r| r.score), Some(2));
        assert_eq!(f.core.shard_metrics().mailbox_depth.get(), 0, "each answer lowered the depth it raised");
    }

    #[test]
    fn writes_that_come_while_a_batch_syncs_wait_for_the_committer_which_applies_them_in_order() {
        let (mut f, cell, first_answer) = syncing(500);
        // The same player twice, from two I/O threads: the later must win.
        let (second, second_answer) = f.write("b", 2, 2);
        let (third, third_answer) = f.write("b", 3, 3);
        assert!(cell.try_write(Origin(0), second).is_ok(), "left for the committer");
        assert!(cell.try_write(Origin(1), third).is_ok(), "left for the committer");
        assert_eq!(f.core.shard_metrics().mailbox_depth.get(), 3, "each waiting write counts as queued");
        assert_eq!(score_soon(first_answer), Ok(1));
        assert_eq!((score_soon(second_answer), score_soon(third_answer)), (Ok(2), Ok(3)));
        assert_eq!(f.fsyncs(), 2, "the two waiting writes shared the second fsync");
        assert_eq!(f.score_of("b"), Some(3), "applied in the order they came");
        assert_eq!(f.core.shard_metrics().mailbox_depth.get(), 0);
    }

    #[test]
    fn reads_behind_a_waiting_write_see_it_and_reads_in_place_do_not_wait_for_it() {
        let (mut f, cell, _) = syncing(300);
        let tree = f.tree;
        let (second, mut second_answer) = f.write("b", 7, 2);
        assert!(cell.try_write(Origin(0), second).is_ok(), "left for the committer");
        // Another client's read in place is answered at once, without the
        // write no one has acknowledged.
        let rank_of_b = |shard: &Shard| shard.rank_record(tree, "b").unwrap().map(|record| record.score);
        assert_eq!(cell.try_read(rank_of_b), Some(None));
        // A count forwarded for a rank pipelined behind the write on its
        // connection must see it: it applies what waits first.
        assert_eq!(cell.try_read_applied(rank_of_b), Some(Some(7)));
        // A read pipelined behind a write on its connection is queued for
        // the actor, which applies what waits first.
        let (third, third_answer) = f.write("c", 9, 3);
        assert!(cell.try_write(Origin(0), third).is_ok(), "left for the committer");
        let (get, got) = f.get("c");
        f.enqueue(vec![get]);
        f.core.run_round();
        assert_eq!(got.blocking_recv().unwrap().unwrap().map(|r| r.score), Some(9));
        assert!(second_answer.try_recv().is_err(), "still answered only once durable");
        assert_eq!((score_soon(second_answer), score_soon(third_answer)), (Ok(7), Ok(9)));
    }

    #[test]
    fn no_write_is_left_waiting_behind_a_command_for_the_actor_or_on_a_degraded_shard() {
        let (f, cell, first_answer) = syncing(200);
        let settling = cell.hold_writes_in_place();
        let (write, written) = f.write("b", 2, 2);
        let write = cell.try_write(Origin(0), write).expect_err("held off while the actor settles the shard");
        drop(settling);
        cell.set_healthy(false);
        let write = cell.try_write(Origin(0), write).expect_err("a degraded shard's refusals are the actor's");
        cell.set_healthy(true);
        assert!(cell.try_write(Origin(0), write).is_ok(), "left for the committer");
        assert_eq!((score_soon(first_answer), score_soon(written)), (Ok(1), Ok(2)));
    }

    #[test]
    fn a_write_goes_in_place_only_behind_nothing_unapplied_on_a_healthy_shard_with_a_committer() {
        let mut f = fixture();
        let cell = f.core.engine();
        let (write, written) = f.write("a", 1, 1);
        let write = cell.try_write(Origin(0), write).expect_err("no committer: the actor commits inline");
        f.core.start_pipeline(Arc::new(|| {}));
        let (get, got) = f.get("a");
        f.enqueue(vec![get]);
        let write = cell.try_write(Origin(0), write).expect_err("would overtake a command sent before it");
        f.core.run_round();
        assert_eq!(got.blocking_recv().unwrap().unwrap(), None, "the read came first");
        cell.set_healthy(false);
        let write = cell.try_write(Origin(0), write).expect_err("a degraded shard's refusals are the actor's");
        cell.set_healthy(true);
        let held_by_the_actor = cell.lock();
        let write = cell.try_write(Origin(0), write).expect_err("never waits for the lock");
        drop(held_by_the_actor);
        let settling = cell.hold_writes_in_place();
        let write = cell.try_write(Origin(0), write).expect_err("held off while the actor settles the shard");
        drop(settling);
        let (get, _) = f.get("a");
        assert!(cell.try_write(Origin(0), get).is_err(), "reads are not staged");
        let (reply, _) = crate::request_path::shard::command::reply();
        let drop = Command::DropBoard { board_id: f.board.id, reply };
        assert!(cell.try_write(Origin(0), drop).is_err(), "nor maintenance, which waits for the pipeline");
        assert!(cell.try_write(Origin(0), write).is_ok());
        assert_eq!(score_soon(written), Ok(1));
    }

    #[test]
    fn reads_in_place_share_the_engine_with_each_other_but_never_wait_for_a_writer() {
        let mut f = fixture();
        let (write, written) = f.write("a", 4, 1);
        f.enqueue(vec![write]);
        f.core.run_round();
        assert_eq!(score(written), Ok(4));
        let (cell, tree) = (f.core.engine(), f.tree);
        let rank_of_a = |shard: &Shard| shard.rank_record(tree, "a").unwrap().map(|record| record.score);
        // Another I/O thread's read is under way: this one shares the lock
        // rather than being queued for the actor.
        let nested = cell.try_read(|_| cell.try_read(rank_of_a));
        assert_eq!(nested, Some(Some(Some(4))));
        let held_by_the_actor = cell.lock();
        assert!(cell.try_read(rank_of_a).is_none(), "a read in place never waits: it is queued instead");
        drop(held_by_the_actor);
        assert_eq!(cell.try_read(rank_of_a), Some(Some(4)));
    }
}
