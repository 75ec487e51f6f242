//! The single-writer batch loop of one shard, as a plain struct: what goes
//! in a round, when a batch is sealed, when the loop waits for the commit
//! pipeline. The actor (`actor.rs`) only feeds it messages.
//!
//! A *round* applies the queued commands in arrival order: writes are
//! staged in memory (their answers held), reads are answered at once from
//! the staged state. The staged writes are then sealed into ONE batch and
//! submitted to the shard's commit pipeline, which answers them once
//! durable. While a batch is with the committer the loop keeps serving:
//! reads are answered, new writes staged, and when the committer is done
//! everything staged meanwhile goes out as the next batch — the group in
//! group commit. So:
//!
//! - a write is acknowledged only once durable, and many writes share one
//!   fsync — the busier the shard, the bigger the batch;
//! - a read never waits for storage (it may reflect writes whose
//!   acknowledgment is still in flight, which protocol.md allows for reads
//!   concurrent with writes; it never reflects a write that was refused);
//! - only maintenance (dropping a board, expiry, shutdown) waits for the
//!   pipeline to finish everything, and a loop so far ahead of the runs
//!   thread that more than `MAX_UNWRITTEN_RUNS` frozen overlays wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rankd_shards::commit::{Absorbed, Pipeline, PipelineThread};
use rankd_shards::{Shard, ShardOptions};

use super::apply::apply;
use super::command::Command;
use super::commit_hooks::ShardCommitHooks;
use super::engine_cell::{Acks, CellParts, EngineCell, Unsubmitted};
use super::health::Health;
use super::link::Origin;
use crate::clock::Clock;
use crate::operations::metrics::{Metrics, ShardMetrics};
use crate::request_path::dense_registry::{DenseRegistry, DenseShare};

/// Commands a round looks ahead at a time, prefetching what they will
/// touch: each write's two leaves are up to ~1.3 KB, so 16 writes' worth
/// stays in a core's L2 until used.
pub(super) const LOOK_AHEAD: usize = 16;

/// One shard's batch loop. See the module docs.
pub struct BatchLoop {
    /// The engine and what is staged in it, shared with the committer and
    /// the routers' in-place requests.
    pub(super) engine: EngineCell,
    /// Group commit on the committer and runs threads.
    pub(super) pipeline: Pipeline<Acks>,
    /// Commands of the round being gathered, with the I/O thread each came from.
    queue: Vec<(Origin, Command)>,
    /// A round never holds more commands than this, bounding latency and memory.
    max_batch: usize,
    /// Whether writes work; the failure and recovery rules.
    pub(super) health: Health,
    pub(super) dense: DenseRegistry,
    pub(super) metrics: Arc<Metrics>,
    /// This shard's index among the shards (and in `metrics.shards`).
    pub(super) index: usize,
    /// Decides which period of each window a round's writes land in.
    pub(super) clock: Clock,
    /// The Unix second of the last once-a-second maintenance.
    pub(super) last_tick: i64,
    /// fjall's compaction time when last published (zero again once the
    /// storage is reopened: fjall counts from zero then).
    pub(super) compacting_seen: Duration,
    /// The dedup table's early expiries when last published; zero again
    /// once the storage is reopened, whose new table counts from zero.
    pub(super) dedup_early_seen: u64,
    /// Where the storage lives, to reopen it after a failed attempt.
    pub(super) location: (std::path::PathBuf, ShardOptions),
    /// While recovering: this shard's share of the dense indexes as its
    /// batches reported it, before the storage was reopened.
    pub(super) reported_dense: Option<DenseShare>,
}

/// What a loop is made of, besides its engine.
pub struct LoopParts {
    /// Most commands in one round.
    pub max_batch: usize,
    /// The dense indexes, shared with the other shards and the router.
    pub dense: DenseRegistry,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// This shard's index among the shards.
    pub index: usize,
    /// Decides which period a write lands in.
    pub clock: Clock,
    /// Where committed answers go, by the I/O thread they go back to (see
    /// [`super::relay`]); without them the committer sends them itself.
    pub relays: Vec<super::ReplyRelay>,
}

impl BatchLoop {
    /// A loop over an opened shard; it commits on the caller's thread
    /// until [`BatchLoop::start_pipeline`].
    pub fn new(shard: Shard, parts: LoopParts) -> Self {
        let LoopParts { max_batch, dense, metrics, index, clock, relays } = parts;
        // What the open rebuilt: the log it replayed, the overlay it refilled.
        let gauges = &metrics.shards[index];
        gauges.players.set(shard.players() as i64);
        gauges.logged_changes.set(i64::try_from(shard.logged_changes()).unwrap_or(i64::MAX));
        gauges.unwritten_players.set(shard.unwritten_players() as i64);
        let location = shard.location();
        let cell = CellParts { metrics: metrics.clone(), index, dense: dense.clone(), clock };
        let engine = EngineCell::new(shard, cell);
        let hooks = ShardCommitHooks { metrics: metrics.clone(), index, relays, engine: engine.downgrade() };
        Self {
            location,
            engine,
            pipeline: Pipeline::new(Arc::new(hooks)),
            queue: Vec::new(),
            max_batch: max_batch.max(1),
            health: Health::new(Instant::now(), &metrics.shards[index]),
            dense,
            metrics,
            index,
            clock,
            last_tick: i64::MIN,
            compacting_seen: Duration::ZERO,
            dedup_early_seen: 0,
            reported_dense: None,
        }
    }

    /// Makes the pipeline's threads sleep first, as a slow disk would.
    #[cfg(feature = "test-hooks")]
    pub fn with_slow_disk(mut self, slow_disk: rankd_shards::commit::SlowDisk) -> Self {
        self.set_slow_disk(slow_disk);
        self
    }

    /// Makes the pipeline's threads started after this sleep first, as a
    /// slow disk would (or panic, as a bug would).
    #[cfg(feature = "test-hooks")]
    pub fn set_slow_disk(&mut self, slow_disk: rankd_shards::commit::SlowDisk) {
        self.pipeline.set_slow_disk(slow_disk);
    }

    /// Starts the committer and runs threads. After each group the
    /// committer seals what was staged meanwhile, itself; `on_progress` is
    /// called on the threads when the actor must hear at once: a group's
    /// runs are written, the pipeline failed (or the shard recovers), or
    /// the runs thread is too far behind for the committer to seal.
    pub fn start_pipeline(&mut self, on_progress: Arc<dyn Fn() + Send + Sync>) {
        let engine = self.engine.clone();
        let on_progress = Arc::new(move |thread| {
            // A group the committer finished needs no word to the actor
            // (one wake-up of its thread a group, most of a lone write's
            // CPU besides the fsync): what was staged meanwhile is sealed
            // here, and the actor learns which batches finished when it
            // next looks (`catch_up`, every round and every second). The
            // runs thread's groups carry runs, which the actor must land
            // to free their overlays; failures must be heard at once, and
            // writes only the actor may seal (see `seal_staged`).
            if thread == PipelineThread::Committer && !engine.seal_staged() {
                return;
            }
            on_progress();
        });
        let started = self.pipeline.spawn(&self.index.to_string(), on_progress);
        self.hand_out_submitter(started);
    }

    /// Lets seals in place submit to the threads just started, if they did.
    fn hand_out_submitter(&mut self, started: std::io::Result<()>) {
        match started {
            Ok(()) => self.engine.set_submitter(self.pipeline.submitter()),
            // Batches are then committed on the loop's thread: slower, still correct.
            Err(e) => {
                tracing::error!(shard = self.index, error = %e, "starting the committer thread failed; committing inline")
            }
        }
    }

    /// If a pipeline thread died (a panic: a bug), starts new threads, the
    /// jobs it held counted failed. The shard is degraded by their failure
    /// and recovers as from a disk fault. Without this, a dead committer
    /// failed every write staged in place until a restart, and a dead runs
    /// thread left jobs never finished, so a wait for them never ended.
    pub(super) fn respawn_dead_pipeline(&mut self) {
        if !self.pipeline.thread_died() {
            return;
        }
        tracing::error!(shard = self.index, "a commit pipeline thread died; starting new ones");
        // No seal in place submits meanwhile, and the committer's queue
        // loses its last sender, so it ends. Not under the engine's lock: a
        // committer still running takes it to seal.
        self.engine.set_submitter(None);
        let started = self.pipeline.respawn();
        self.hand_out_submitter(started);
    }

    /// The engine, for the router's in-place ranks.
    pub fn engine(&self) -> EngineCell {
        self.engine.clone()
    }

    pub(super) fn shard_metrics(&self) -> &ShardMetrics {
        &self.metrics.shards[self.index]
    }

    /// Queues commands for the next round; returns whether the round is due
    /// now (the queue reached `max_batch`) rather than once the mailbox is
    /// drained.
    pub fn enqueue(&mut self, origin: Origin, commands: Vec<Command>) -> bool {
        self.queue.extend(commands.into_iter().map(|command| (origin, command)));
        self.queue.len() >= self.max_batch
    }

    /// Whether a round has anything to do.
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Applies every queued command in order, seals the staged writes for
    /// the pipeline (unless it is busy), then does what is due between
    /// rounds.
    pub fn run_round(&mut self) {
        let now = self.clock.now();
        self.engine.with(|shard| shard.set_time(now));
        let queue = std::mem::take(&mut self.queue);
        let observe = self.metrics.hot_path;
        if observe {
            self.shard_metrics().batch_size.observe(queue.len() as f64);
        }
        // Time spent applying: the whole round but its waits for the
        // pipeline (`settle`), read once per span, not per command.
        let mut applying = Duration::ZERO;
        let mut since = observe.then(Instant::now);
        let mut commands = queue.into_iter();
        let mut until_look_ahead = 0;
        while let Some((origin, command)) = commands.next() {
            if until_look_ahead == 0 {
                let next = commands.as_slice().iter().map(|(_, command)| command);
                self.look_ahead(std::iter::once(&command).chain(next).take(LOOK_AHEAD));
                until_look_ahead = LOOK_AHEAD;
            }
            until_look_ahead -= 1;
            if command.needs_committed_state() {
                if observe {
                    self.count_cache_lookups(); // settling answers held replies
                }
                applying += since.map_or(Duration::ZERO, |since| since.elapsed());
                self.settle();
                since = observe.then(Instant::now);
            }
            self.execute(origin, command);
        }
        if let Some(since) = since {
            applying += since.elapsed();
            self.shard_metrics().apply_seconds.observe(applying.as_secs_f64());
            self.count_cache_lookups();
        }
        self.seal_and_submit(false);
        self.maintain();
    }

    /// Prefetches what `commands` will touch.
    fn look_ahead<'a>(&self, commands: impl Iterator<Item = &'a Command>) {
        self.engine.with(|shard| shard.prefetch(commands.filter_map(Command::upcoming)));
    }

    /// Applies one command: a read is answered now, a write's answer is
    /// held until its batch is durable.
    fn execute(&mut self, origin: Origin, command: Command) {
        let refusal = if command.is_write() { self.health.refusal() } else { None };
        let (metrics, observe) = (&self.metrics.shards[self.index], self.metrics.hot_path);
        // Counted before a read's reply, so a client that sees it sees its
        // lookups counted; held replies are counted when sent.
        let before_reply = |shard: Option<&mut Shard>| {
            if let (true, Some(shard)) = (observe, shard) {
                metrics.count_lookups(shard.take_cache_lookups());
            }
            metrics.mailbox_depth.dec();
        };
        let mut guard = self.engine.lock();
        let engine = &mut *guard;
        let held = match (engine.shard.as_mut(), refusal) {
            (Some(shard), None) => {
                let held = apply(shard, command, &mut |shard| before_reply(Some(shard)));
                // Reported now, not at seal: later reads of the round see it.
                self.dense.apply(shard.drain_dense_changes());
                held
            }
            (None, _) => {
                before_reply(None);
                command.refuse(crate::error::Error::Internal("shard storage is closed; retrying".into()));
                None
            }
            (Some(_), Some(refusal)) => {
                before_reply(None);
                command.refuse(refusal);
                None
            }
        };
        engine.held.extend(held.map(|held| (origin, held)));
        // Applied, under the lock: a write staged in place may follow it now.
        let _ = self.engine.unapplied().fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Adds the record-cache lookups since the last call to the metrics.
    pub(super) fn count_cache_lookups(&mut self) {
        if let Some(lookups) = self.engine.with(|shard| shard.take_cache_lookups()) {
            self.shard_metrics().count_lookups(lookups);
        }
    }

    /// Seals the staged writes into one batch and submits it with the held
    /// answers. Unless `force`d, waits while a batch is with the committer:
    /// the committer seals what was staged meanwhile once it is done.
    ///
    /// First waits for the runs thread if it is too far behind (see
    /// [`super::engine_cell::MAX_UNWRITTEN_RUNS`]). The check is made under
    /// the lock the seal takes, as the committer's and the I/O threads'
    /// are, so no two sealers pass it together.
    pub(super) fn seal_and_submit(&mut self, force: bool) {
        let mut engine = self.engine.lock();
        if self.pipeline.syncs_in_flight() > 0 && !force {
            return;
        }
        if engine.runs_behind() {
            drop(engine);
            let absorbed = self.pipeline.settle();
            self.apply_progress(absorbed);
            engine = self.engine.lock();
        }
        if let Some(unsubmitted) = self.engine.seal(&mut engine) {
            drop(engine);
            let Unsubmitted { batch, handle, held } = *unsubmitted;
            // Committed inline (no committer thread): a failed run degrades
            // the shard before another batch is sealed.
            self.pipeline.submit(batch, handle, held);
            self.catch_up();
        }
    }

    /// Submits the staged writes and waits until the pipeline has finished
    /// everything: for maintenance that scans or rewrites storage.
    pub(super) fn settle(&mut self) {
        self.seal_and_submit(true);
        let absorbed = self.pipeline.settle();
        self.apply_progress(absorbed);
    }

    /// Catches up with the pipeline: batches it finished are storage's
    /// business now, and a failure it met degrades the shard. Then, what
    /// was staged while the committer worked is the next batch.
    pub fn on_commit_progress(&mut self) {
        self.catch_up();
        self.seal_and_submit(false);
        if self.health.is_degraded() && self.pipeline.unfinished() == 0 {
            self.maintain(); // a recovery may have waited for the pipeline
        }
    }

    pub(super) fn catch_up(&mut self) {
        let absorbed = self.pipeline.absorb();
        self.apply_progress(absorbed);
    }

    fn apply_progress(&mut self, Absorbed { finished, failure }: Absorbed) {
        if let Some(unwritten_runs) = self.engine.with(|shard| {
            shard.landed(finished);
            shard.unwritten_runs()
        }) {
            self.shard_metrics().unwritten_runs.set(unwritten_runs as i64);
        }
        if let Some(failure) = failure {
            self.engine.set_healthy(false);
            if self.health.failed(failure.to_string(), Instant::now()) {
                tracing::error!(
                    shard = self.index,
                    error = %failure,
                    "commit failed; its writes are answered `internal` and writes stop until storage recovers"
                );
            }
        }
    }

    /// Never drops staged writes on the way out: applies what is queued,
    /// seals it, lets the pipeline finish every batch (it answers them),
    /// then stops it.
    pub fn stop(&mut self) {
        self.run_round();
        // Nothing is sealed in place or left waiting from here; what was
        // is sealed now, and the committer runs until no one can submit to
        // it.
        self.engine.set_submitter(None);
        self.seal_and_submit(true);
        self.pipeline.stop();
    }
}

impl Drop for BatchLoop {
    /// The committer holds the engine (to seal after each group), and the
    /// engine a way to submit to the committer: this ends the cycle, so the
    /// pipeline's threads can stop.
    fn drop(&mut self) {
        self.engine.set_submitter(None);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rankd_shards::{window, Board, BoardConfig, Mode, SharedBoard, TreeId};

    use super::*;
    use crate::error::Error;
    use crate::request_path::shard::command::{reply, Pending, Written};

    pub struct Fixture {
        pub core: BatchLoop,
        pub board: SharedBoard,
        pub tree: TreeId,
        _dir: tempfile::TempDir,
    }

    pub fn fixture() -> Fixture {
        fixture_with(ShardOptions::default())
    }

    fn fixture_with(options: ShardOptions) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(dir.path(), options).unwrap();
        let metrics = Metrics::new(1).unwrap();
        let parts = LoopParts {
            max_batch: 3,
            dense: DenseRegistry::new(16),
            metrics,
            index: 0,
            clock: Clock::default(),
            relays: Vec::new(),
        };
        let board = SharedBoard::new(Board { id: 1, name: "b".into(), config: BoardConfig::default().into() });
        let tree = window::current_trees(&board, Clock::default().now())[0];
        Fixture { core: BatchLoop::new(shard, parts), board, tree, _dir: dir }
    }

    impl Fixture {
        pub fn write(&self, player: &str, score: i64, seq: u64) -> (Command, Pending<Written<i64>>) {
            let (reply, pending) = reply();
            let (board, player) = (self.board.clone(), player.into());
            let amount = rankd_shards::Amount::Score(score);
            let command = Command::Write { board, player, amount, mode: Mode::Set, seq, wid: None, reply };
            (command, pending)
        }

        /// An idempotent write: applied at most once per `wid`.
        fn write_once(&self, player: &str, seq: u64, wid: &str) -> (Command, Pending<Written<i64>>) {
            let (reply, pending) = reply();
            let (board, player, wid) = (self.board.clone(), player.into(), Some(wid.into()));
            let amount = rankd_shards::Amount::Score(1);
            (Command::Write { board, player, amount, mode: Mode::Set, seq, wid, reply }, pending)
        }

        pub fn get(&self, player: &str) -> (Command, Pending<Option<rankd_shards::Record>>) {
            let (reply, pending) = reply();
            (Command::Get { tree: self.tree, player: player.into(), reply }, pending)
        }

        /// Commands queued: the mailbox depth and unapplied count the link
        /// would have raised.
        pub fn enqueue(&mut self, commands: Vec<Command>) -> bool {
            self.core.shard_metrics().mailbox_depth.add(commands.len() as i64);
            self.core.engine.unapplied().fetch_add(commands.len(), Ordering::AcqRel);
            self.core.enqueue(Origin(0), commands)
        }

        /// After a pipeline thread's death: the next threads are free of
        /// the bug, and the actor's maintenance, run as often as it runs,
        /// sees the shard degrade on the failure and recover as from a
        /// disk fault.
        ///
        /// The metrics show it as they show a disk fault: the failure is
        /// counted, and the shard is shown degraded exactly while it is.
        fn recover_from_a_dead_thread(&mut self) {
            self.core.set_slow_disk(rankd_shards::commit::SlowDisk::default());
            let errors_before = self.core.shard_metrics().commit_errors.get();
            let deadline = Instant::now() + super::super::health::RECOVERY_RETRY * 10;
            let mut degraded = false;
            while !degraded || self.core.health.is_degraded() {
                assert!(Instant::now() < deadline, "the shard never recovered from the thread's death");
                self.core.maintain();
                let shown = self.core.shard_metrics().degraded.get();
                assert_eq!(shown, i64::from(self.core.health.is_degraded()), "rankd_shard_degraded is its health");
                degraded |= self.core.health.is_degraded();
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(!self.core.pipeline.thread_died());
            let errors = self.core.shard_metrics().commit_errors.get();
            assert!(errors > errors_before, "the death counts as a commit error: {errors_before}, then {errors}");
        }

        /// A player's score, read by a round of the actor.
        pub fn score_of(&mut self, player: &str) -> Option<i64> {
            let (get, got) = self.get(player);
            self.enqueue(vec![get]);
            self.core.run_round();
            got.blocking_recv().unwrap().unwrap().map(|record| record.score)
        }

        pub fn fsyncs(&self) -> u64 {
            self.core.shard_metrics().fsync_seconds.get_sample_count()
        }
    }

    pub fn score(pending: Pending<Written<i64>>) -> Result<i64, Error> {
        pending.blocking_recv().unwrap_or_else(|_| Err(Error::Internal("dropped".into()))).map(|w| w.value)
    }

    /// The answer (a dropped one as `Internal`), if it comes within 10 s: a
    /// test of who seals fails instead of hanging when no one does.
    pub fn score_soon(mut pending: Pending<Written<i64>>) -> Result<i64, Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match pending.try_recv() {
                Ok(answer) => return answer.map(|w| w.value),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    return Err(Error::Internal("dropped unanswered".into()))
                }
                Err(e) => panic!("no answer: {e}"),
            }
        }
    }

    #[test]
    fn reads_see_the_rounds_writes_at_once_and_writes_answer_once_durable() {
        let mut f = fixture();
        let (write, written) = f.write("p", 5, 1);
        let (get, got) = f.get("p");
        assert!(!f.enqueue(vec![write, get]), "a round of 2 waits for the drained mailbox (max 3)");
        f.core.run_round();
        assert_eq!(got.blocking_recv().unwrap().unwrap().map(|r| r.score), Some(5), "staged, not yet durable");
        // Without the pipeline's threads the batch is committed inline.
        assert_eq!(score(written), Ok(5));
        assert_eq!((f.fsyncs(), f.core.shard_metrics().mailbox_depth.get()), (1, 0));
        let full: Vec<Command> = (0..3).map(|i| f.write(&format!("q{i}"), i, 10 + i as u64).0).collect();
        assert!(f.enqueue(full), "a full queue runs a round at once");
    }

    #[test]
    fn writes_staged_while_a_batch_commits_join_the_next_batch() {
        let mut f = fixture();
        // A slow disk keeps the first batch with the committer while the
        // second round runs.
        let slow = rankd_shards::commit::SlowDisk { commit: Duration::from_millis(200), ..Default::default() };
        f.core = f.core.with_slow_disk(slow);
        let progressed = Arc::new(AtomicUsize::new(0));
        let seen = progressed.clone();
        f.core.start_pipeline(Arc::new(move || {
            seen.fetch_add(1, Ordering::SeqCst);
        }));
        let (first, first_answer) = f.write("a", 1, 1);
        f.enqueue(vec![first]);
        f.core.run_round(); // sealed and submitted: the committer has it
        let (second, second_answer) = f.write("b", 2, 2);
        let (third, third_answer) = f.write("c", 3, 3);
        f.enqueue(vec![second, third]);
        f.core.run_round(); // staged; sealed only once the first batch is answered
        let mut second_answer = second_answer;
        assert!(second_answer.try_recv().is_err(), "held while the first batch commits");
        assert_eq!(score(first_answer), Ok(1));
        // The committer seals what the round staged once the first batch is
        // answered, without the actor.
        assert_eq!((score_soon(second_answer), score_soon(third_answer)), (Ok(2), Ok(3)));
        assert_eq!(f.fsyncs(), 2, "two writes shared the second fsync");
        assert_eq!(f.core.shard_metrics().writes_applied.get(), 3);
        // Groups without runs, nothing failed: the actor was never woken.
        assert_eq!(progressed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_committer_that_panics_is_replaced_and_writes_in_place_commit_again() {
        let mut f = fixture();
        let panics = rankd_shards::commit::SlowDisk { committer_panics: true, ..Default::default() };
        f.core = f.core.with_slow_disk(panics);
        f.core.start_pipeline(Arc::new(|| {}));
        let cell = f.core.engine();
        let (first, first_answer) = f.write("a", 1, 1);
        assert!(cell.try_write(Origin(0), first).is_ok(), "in place, handed to the committer");
        assert!(score_soon(first_answer).is_err(), "its batch died with the committer: never acknowledged");
        f.recover_from_a_dead_thread();
        let (second, second_answer) = f.write("b", 2, 2);
        assert!(cell.try_write(Origin(0), second).is_ok(), "in place again");
        assert_eq!(score_soon(second_answer), Ok(2), "committed by the new committer");
        assert_eq!(f.score_of("a"), None, "the write that died with it is gone");
    }

    #[test]
    fn a_runs_thread_that_panics_is_replaced_and_no_job_of_it_is_waited_for_forever() {
        let mut f = fixture_with(ShardOptions { checkpoint_every: 1, ..ShardOptions::default() });
        let panics = rankd_shards::commit::SlowDisk { runs_panics: true, ..Default::default() };
        f.core = f.core.with_slow_disk(panics);
        f.core.start_pipeline(Arc::new(|| {}));
        let cell = f.core.engine();
        // A checkpoint after every change: the batches carry runs.
        for (seq, player) in ["a", "b", "c"].into_iter().enumerate() {
            let (write, answer) = f.write(player, seq as i64, seq as u64 + 1);
            assert!(cell.try_write(Origin(0), write).is_ok(), "in place, handed to the committer");
            assert_eq!(score_soon(answer), Ok(seq as i64), "durable before its run is written: acknowledged");
        }
        f.recover_from_a_dead_thread();
        assert_eq!(f.core.pipeline.unfinished(), 0, "the groups the runs thread held are counted");
        let (next, answer) = f.write("d", 3, 4);
        assert!(cell.try_write(Origin(0), next).is_ok(), "in place again");
        assert_eq!(score_soon(answer), Ok(3));
        for (score, player) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(f.score_of(player), Some(score as i64), "acknowledged: rebuilt from the log on reopening");
        }
    }

    /// The reopened storage's dedup table counts its early expiries from
    /// zero: the counter goes on rising by what it drops, not only once it
    /// has dropped more than before the reopen.
    #[test]
    fn early_wid_expiries_are_counted_across_a_storage_reopen() {
        // Every record is over the memory bound: each group goes at the
        // next once-a-second maintenance, early.
        let dedup = rankd_shards::DedupLimits { horizon_secs: 600, max_bytes: 1 };
        let mut f = fixture_with(ShardOptions { dedup, ..ShardOptions::default() });
        let idempotent_writes = |f: &mut Fixture, wids: &[&str]| {
            let (writes, answers): (Vec<_>, Vec<_>) =
                wids.iter().enumerate().map(|(i, wid)| f.write_once(&format!("p-{wid}"), i as u64 + 1, wid)).unzip();
            f.enqueue(writes);
            f.core.run_round();
            assert!(answers.into_iter().all(|answer| score(answer) == Ok(1)), "durable, acknowledged");
            f.core.last_tick = i64::MIN; // the once-a-second work is due again
            f.core.maintain();
            f.core.shard_metrics().dedup_early_expiries.get()
        };
        assert_eq!(idempotent_writes(&mut f, &["w1", "w2", "w3"]), 3);
        // Reopened as after a storage failure.
        f.core.engine.set_healthy(false);
        f.core.health.failed("a test's failure".into(), Instant::now());
        let deadline = Instant::now() + super::super::health::RECOVERY_RETRY * 10;
        while f.core.health.is_degraded() {
            assert!(Instant::now() < deadline, "the storage was never reopened");
            f.core.maintain();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(idempotent_writes(&mut f, &["w4", "w5"]), 5, "the reopened table's 2 count too");
    }

    #[test]
    fn maintenance_waits_for_every_batch_and_stopping_answers_everything() {
        let mut f = fixture();
        f.core.start_pipeline(Arc::new(|| {}));
        let (write, written) = f.write("p", 7, 1);
        let (drop_reply, dropped) = reply();
        f.enqueue(vec![write, Command::DropBoard { board_id: f.board.id, reply: drop_reply }]);
        f.core.run_round();
        // The write was made durable before the drop scanned storage.
        assert_eq!(score(written), Ok(7));
        let (late, late_answer) = f.write("q", 8, 2);
        f.enqueue(vec![late]);
        f.core.stop(); // applies the queued write and lets the pipeline finish
        assert_eq!(dropped.blocking_recv().unwrap(), Ok(true));
        assert_eq!(score(late_answer), Ok(8));
        f.core.pipeline.absorb();
        assert_eq!(f.core.pipeline.unfinished(), 0);
    }
}
