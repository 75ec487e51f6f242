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

use std::sync::Arc;
use std::time::{Duration, Instant};

use rankd_shards::commit::{Absorbed, Pipeline};
use rankd_shards::{Shard, ShardOptions};

use super::apply::apply;
use super::command::{Command, Held};
use super::commit_hooks::ShardCommitHooks;
use super::engine_cell::EngineCell;
use super::health::Health;
use super::link::Origin;
use super::relay::send_all;
use crate::clock::Clock;
use crate::operations::metrics::{Metrics, ShardMetrics};
use crate::request_path::dense_registry::{DenseRegistry, DenseShare};

/// Sealed batches whose runs may wait for the runs thread before the loop
/// waits for it. Each holds a frozen overlay (up to ~10 MB) in memory until
/// written, and the runs thread runs at a low priority, so a loop busy
/// enough to starve it would otherwise grow them without bound.
const MAX_UNWRITTEN_RUNS: usize = 4;

/// Commands a round looks ahead at a time, prefetching what they will
/// touch: each write's two leaves are up to ~1.3 KB, so 16 writes' worth
/// stays in a core's L2 until used.
const LOOK_AHEAD: usize = 16;

/// One shard's batch loop. See the module docs.
pub struct BatchLoop {
    /// The engine, shared with the router's in-place ranks.
    pub(super) engine: EngineCell,
    /// Group commit on the committer and runs threads.
    pub(super) pipeline: Pipeline<Vec<(Origin, Held)>>,
    /// Commands of the round being gathered, with the I/O thread each came from.
    queue: Vec<(Origin, Command)>,
    /// A round never holds more commands than this, bounding latency and memory.
    max_batch: usize,
    /// Answers of staged writes, held until their batch is sealed and
    /// durable, with the I/O thread each goes back to.
    held: Vec<(Origin, Held)>,
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
    /// fjall's compaction time when last published.
    pub(super) compacting_seen: Duration,
    /// Where the storage lives, to reopen it after a failed attempt.
    pub(super) location: (std::path::PathBuf, ShardOptions),
    /// While recovering: this shard's share of the dense indexes as its
    /// batches reported it, before the storage was reopened.
    pub(super) reported_dense: Option<DenseShare>,
    /// Something is staged that no held answer waits for (expired `wid`
    /// records to delete): the next seal must happen even without one.
    pub(super) staged_unanswered: bool,
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
        metrics.shards[index].players.set(shard.players() as i64);
        let hooks = ShardCommitHooks { metrics: metrics.clone(), index, relays };
        Self {
            location: shard.location(),
            engine: EngineCell::new(shard),
            pipeline: Pipeline::new(Arc::new(hooks)),
            queue: Vec::new(),
            max_batch: max_batch.max(1),
            held: Vec::new(),
            health: Health::new(Instant::now()),
            dense,
            metrics,
            index,
            clock,
            last_tick: i64::MIN,
            compacting_seen: Duration::ZERO,
            reported_dense: None,
            staged_unanswered: false,
        }
    }

    /// Makes the pipeline's threads sleep first, as a slow disk would.
    #[cfg(feature = "test-hooks")]
    pub fn with_slow_disk(mut self, slow_disk: rankd_shards::commit::SlowDisk) -> Self {
        self.pipeline = self.pipeline.with_slow_disk(slow_disk);
        self
    }

    /// Starts the committer and runs threads; `on_progress` is called on
    /// them as batches are answered and finished.
    pub fn start_pipeline(&mut self, on_progress: Arc<dyn Fn() + Send + Sync>) {
        if let Err(e) = self.pipeline.spawn(&self.index.to_string(), on_progress) {
            // Batches are then committed on the loop's thread: slower, still correct.
            tracing::error!(shard = self.index, error = %e, "starting the committer thread failed; committing inline");
        }
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
            if let Some(held) = self.execute(command) {
                self.held.push((origin, held));
            }
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
    /// returned to be held until its batch is durable.
    fn execute(&mut self, command: Command) -> Option<Held> {
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
        let mut engine = self.engine.lock();
        match (engine.as_mut(), refusal) {
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
        }
    }

    /// Adds the record-cache lookups since the last call to the metrics.
    pub(super) fn count_cache_lookups(&mut self) {
        if let Some(lookups) = self.engine.with(Shard::take_cache_lookups) {
            self.shard_metrics().count_lookups(lookups);
        }
    }

    /// Seals the staged writes into one batch and submits it with the held
    /// answers. Unless `force`d, waits while a batch is with the committer:
    /// the loop calls again when it is answered, and everything staged
    /// meanwhile joins that next batch.
    pub(super) fn seal_and_submit(&mut self, force: bool) {
        let nothing = self.held.is_empty() && !self.staged_unanswered;
        if nothing || (self.pipeline.syncs_in_flight() > 0 && !force) {
            return;
        }
        self.staged_unanswered = false;
        let held = std::mem::take(&mut self.held);
        let (metrics, observe) = (&self.metrics.shards[self.index], self.metrics.hot_path);
        let mut engine = self.engine.lock();
        let Some(shard) = engine.as_mut() else {
            metrics.mailbox_depth.sub(held.len() as i64);
            send_all(held.into_iter().map(|(_, held)| held), Some("shard storage is closed; retrying"));
            return;
        };
        let started = observe.then(Instant::now);
        let mut batch = shard.seal();
        let unwritten_runs = shard.unwritten_runs();
        metrics.unwritten_runs.set(unwritten_runs as i64);
        metrics.logged_changes.set(i64::try_from(shard.logged_changes()).unwrap_or(i64::MAX));
        if let Some(started) = started {
            metrics.seal_seconds.observe(started.elapsed().as_secs_f64());
            metrics.players.set(shard.players() as i64);
            metrics.unwritten_players.set(shard.unwritten_players() as i64);
        }
        // Normally empty: each write's changes were reported as it was staged.
        self.dense.apply(std::mem::take(&mut batch.dense).into_iter());
        let handle = shard.durability_handle();
        drop(engine);
        if self.pipeline.submit(batch, handle, held) {
            // Committed inline (no committer thread): a failed run degrades
            // the shard before another batch is sealed.
            self.catch_up();
        }
        if unwritten_runs > MAX_UNWRITTEN_RUNS {
            self.settle(); // see MAX_UNWRITTEN_RUNS
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

    fn catch_up(&mut self) {
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
        self.seal_and_submit(true);
        self.pipeline.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rankd_shards::{window, Board, BoardConfig, Mode, TreeId};

    use super::*;
    use crate::error::Error;
    use crate::request_path::shard::command::{reply, Pending, Written};

    struct Fixture {
        core: BatchLoop,
        board: Arc<Board>,
        tree: TreeId,
        _dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        let metrics = Metrics::new(1).unwrap();
        let parts = LoopParts {
            max_batch: 3,
            dense: DenseRegistry::new(16),
            metrics,
            index: 0,
            clock: Clock::default(),
            relays: Vec::new(),
        };
        let board = Arc::new(Board { id: 1, name: "b".into(), config: BoardConfig::default().into() });
        let tree = window::current_trees(&board, Clock::default().now())[0];
        Fixture { core: BatchLoop::new(shard, parts), board, tree, _dir: dir }
    }

    impl Fixture {
        fn write(&self, player: &str, score: i64, seq: u64) -> (Command, Pending<Written<i64>>) {
            let (reply, pending) = reply();
            let (board, player) = (self.board.clone(), player.into());
            let amount = rankd_shards::Amount::Score(score);
            let command = Command::Write { board, player, amount, mode: Mode::Set, seq, wid: None, reply };
            (command, pending)
        }

        fn get(&self, player: &str) -> (Command, Pending<Option<rankd_shards::Record>>) {
            let (reply, pending) = reply();
            (Command::Get { tree: self.tree, player: player.into(), reply }, pending)
        }

        /// Commands queued: the mailbox depth the link would have raised.
        fn enqueue(&mut self, commands: Vec<Command>) -> bool {
            self.core.shard_metrics().mailbox_depth.add(commands.len() as i64);
            self.core.enqueue(Origin(0), commands)
        }

        fn fsyncs(&self) -> u64 {
            self.core.shard_metrics().fsync_seconds.get_sample_count()
        }
    }

    fn score(pending: Pending<Written<i64>>) -> Result<i64, Error> {
        pending.blocking_recv().unwrap_or_else(|_| Err(Error::Internal("dropped".into()))).map(|w| w.value)
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
        let slow = rankd_shards::commit::SlowDisk { commit: Duration::from_millis(200), runs: Duration::ZERO };
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
        while progressed.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        f.core.on_commit_progress(); // what the actor does on CommitDone
        assert_eq!((score(second_answer), score(third_answer)), (Ok(2), Ok(3)));
        assert_eq!(f.fsyncs(), 2, "two writes shared the second fsync");
        assert_eq!(f.core.shard_metrics().writes_applied.get(), 3);
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
