//! The tree-shard actor: a thin actix shell around [`rankd_shards::Shard`]
//! running the single-writer batch loop ("job aggregation") with pipelined
//! group commit.
//!
//! Each request lands in the actor's queue. When the mailbox is drained (a
//! self-notified `Flush` runs only after every queued message was handled) or
//! the queue reaches `max_batch`, one *round* runs: requests apply in arrival
//! order — writes staged in memory, reads answered at once from the staged
//! state. Staged writes are sealed into ONE fjall batch and handed, with
//! their answers, to the shard's *committer thread*, which writes the batch
//! to the journal and memtables, fsyncs, and only then answers. While a
//! batch is with the committer the actor keeps serving: reads are answered,
//! new writes are staged, and when the committer is done everything staged
//! meanwhile goes out as the next batch. When a batch carries runs (the
//! shard's unwritten player records and index entries, see
//! `rankd_shards::shard`), the committer hands them, once answered, to the
//! shard's *runs thread*, which writes them in order while later batches
//! are committed. So:
//!
//! - a write is acknowledged only once durable, and many writes share one
//!   fsync — the busier the shard, the bigger the batch;
//! - a read never waits for storage: not for a flush, not for memtable
//!   inserts, not for fjall's write stalls (it may reflect writes whose
//!   acknowledgment is still in flight, which protocol.md allows for reads
//!   concurrent with writes; it never reflects a write that was refused);
//! - reads never wait for the committer or the runs thread: lists read
//!   storage under the overlays of everything not yet written; only
//!   maintenance (dropping a board, expiry, shutdown) waits for both to be
//!   idle.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, Message};
use parking_lot::Mutex;
use rankd_shards::{
    Board, DenseChange, DenseIndex, Direction, DurabilityHandle, ListEntry, Mode, Order, Record, SealedBatch, Shard,
    ShardError, Ties, TreeId, Upcoming, UpcomingWrite, WrittenBatch,
};
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::operations::priority;

/// A shard's engine, shared by its actor, which changes it, and the
/// router, which answers a lone rank from it on the connections' thread
/// when the lock is free (see `router::IN_PLACE_MAX_BATCH`). A rank queued
/// for the shard waits behind the round and costs two thread wake-ups (to
/// the shard, and back), each ~33 µs on an idle 2-core VM (`perf bench
/// sched pipe`) and longer on a busy one. Read in place, a rank whose
/// record is cached costs a few µs; one that misses reads storage on the
/// connections' thread, as the shard would have (at 10M players, mostly).
/// The actor locks it per command, not per round, so it is seldom held.
/// `None` while a failed storage is being reopened.
pub type SharedShard = Arc<Mutex<Option<Shard>>>;

/// Distinct-score indexes of the dense-ranked trees, shared by all shards
/// (which update them as they seal batches) and the router (which reads them).
pub type DenseRegistry = Arc<Mutex<HashMap<TreeId, DenseIndex>>>;

/// What a shard is asked to do. One enum, so all kinds keep their FIFO order
/// in one mailbox.
#[derive(Debug)]
pub enum Command {
    /// Stage a write; replies [`Answer::Score`].
    Write { board: Arc<Board>, player: String, score: i64, mode: Mode, seq: u64 },
    /// Stage several writes, all or none; replies [`Answer::Scores`].
    WriteMany { board: Arc<Board>, entries: Vec<(String, i64, u64)>, mode: Mode },
    /// Stage a removal; replies [`Answer::Bool`].
    Remove { board: Arc<Board>, player: String },
    /// Persist a board's config; replies [`Answer::Done`].
    EnsureBoard { board: Arc<Board> },
    /// Delete a board; replies [`Answer::Bool`].
    DropBoard { board_id: u64 },
    /// A player's record; replies [`Answer::Record`].
    Get { tree: TreeId, player: String },
    /// A player's record and, on this shard, the players ranked before them
    /// and in total; replies [`Answer::Ranked`]. The owner's half of a rank
    /// in the round that finds the score: on one shard the whole rank is one
    /// message. On S shards the other S-1 count too, asked by the owner
    /// itself when `forward` names them (see [`Forward`]), else by the
    /// router once this answer is back.
    Rank { tree: TreeId, player: String, ties: Ties, order: Order, forward: Forward },
    /// Players before each key and in total; replies [`Answer::Counts`].
    CountBefore { tree: TreeId, keys: Vec<u128> },
    /// A slice of the list order; replies [`Answer::List`].
    List { tree: TreeId, ties: Ties, order: Order, position: Vec<u8>, direction: Direction, limit: usize },
    /// Commit everything before this and prepare a fast restart (checkpoint
    /// the trees, flush the memtables); replies [`Answer::Done`].
    Shutdown,
}

impl Command {
    /// Commands that change what is stored.
    fn is_write(&self) -> bool {
        matches!(
            self,
            Self::Write { .. }
                | Self::WriteMany { .. }
                | Self::Remove { .. }
                | Self::EnsureBoard { .. }
                | Self::DropBoard { .. }
        )
    }

    /// Maintenance that scans or rewrites storage needs every earlier write
    /// of the round committed and its runs written. (Lists do not: they read
    /// storage under the overlays of everything unwritten.)
    fn needs_committed_state(&self) -> bool {
        matches!(self, Self::DropBoard { .. } | Self::Shutdown)
    }

    /// Commands answered only once everything before them is durable.
    fn answers_after_sync(&self) -> bool {
        self.is_write() || matches!(self, Self::Shutdown)
    }
}

/// A shard's answer; the variant is fixed by the [`Command`].
#[derive(Debug)]
pub enum Answer {
    /// Stored score.
    Score(i64),
    /// Stored scores, in entry order.
    Scores(Vec<i64>),
    /// Yes/no.
    Bool(bool),
    /// A player's record, if present.
    Record(Option<Record>),
    /// `before[i]` for each key, and the tree's total.
    Counts { before: Vec<u64>, total: u64 },
    /// A player's record (if present) with this shard's count of players
    /// ranked before it and its total (both 0 when absent).
    Ranked { record: Option<Record>, before: u64, total: u64 },
    /// List entries.
    List(Vec<ListEntry>),
    /// Done.
    Done,
}

/// A command with the channel its answer goes back on (after the commit of
/// the round it is applied in).
pub type ShardItem = (Command, oneshot::Sender<Result<Answer, Error>>);

/// The other shards a rank's owner asks for their counts before the
/// player's rank key, each with the channel the router awaits that count
/// on (`CountBefore`'s answer). The owner sends them on as soon as it has
/// the record: one hop, owner to the other shard, where asking through the
/// router took two (owner to router, router to the other shard), each a
/// thread wake-up, and on a busy machine a wait for a core. Without a
/// record (or when its lookup fails) the channels are dropped, and the
/// router takes the owner's answer. Empty: the router asks them itself.
#[derive(Default)]
pub struct Forward(pub Vec<(ShardLink, oneshot::Sender<Result<Answer, Error>>)>);

impl Forward {
    /// Asks each shard for its count before `key` in `tree`.
    fn send(self, tree: TreeId, key: u128) {
        for (link, reply) in self.0 {
            link.send(vec![(Command::CountBefore { tree, keys: vec![key] }, reply)]);
        }
    }
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Forward(to {} shards)", self.0.len())
    }
}

/// One mailbox message: the commands a router batch has for this shard, in
/// order. Batching them makes a pipeline cost one mailbox push per shard.
pub struct ShardRequest {
    /// The commands and their reply channels.
    pub items: Vec<ShardItem>,
}

impl Message for ShardRequest {
    type Result = ();
}

/// A write's answer, computed when it was staged, waiting for its fsync.
type Held = (oneshot::Sender<Result<Answer, Error>>, Result<Answer, Error>);

/// Carries each committed group's answers to the connections' thread in
/// ONE hand-off; a task there sends them on. Sent one by one from the
/// committer, each answer could wake that thread by itself: woken by the
/// first, it preempted the committer, took what was ready, slept, and was
/// woken again by the next — at 1M players and ~220k sets/s, ~7.7k
/// involuntary switches a second on the committer and ~8.8k sleeps on the
/// connections' thread, for ~940 commits. Unbounded, but it only ever holds
/// answers to requests in flight, which the connections and the shard
/// queues bound.
#[derive(Clone)]
pub struct ReplyRelay(tokio::sync::mpsc::UnboundedSender<Vec<Held>>);

impl ReplyRelay {
    /// The relay, and the task that delivers what it carries: spawn the task
    /// on the thread that awaits the answers.
    pub fn new() -> (Self, impl std::future::Future<Output = ()>) {
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Vec<Held>>();
        let deliver = async move {
            while let Some(answers) = receiver.recv().await {
                answers.into_iter().for_each(send_answer);
            }
        };
        (Self(sender), deliver)
    }

    /// Hands `answers` over; sends them from here if the delivering task is gone.
    fn relay(&self, answers: Vec<Held>) {
        if let Err(tokio::sync::mpsc::error::SendError(answers)) = self.0.send(answers) {
            answers.into_iter().for_each(send_answer);
        }
    }
}

fn send_answer((reply, answer): Held) {
    let _ = reply.send(answer);
}

/// How the router reaches a shard: its address, and the count of commands
/// sent to it and not yet answered (raised here, lowered by the shard; it is
/// also the `rankd_shard_mailbox_depth` gauge).
///
/// The count is the mailbox bound: actix 0.13 enforces no capacity on
/// `do_send` (actix issue #329), so a link refuses work past `max_queue` and
/// answers it `overloaded` at once instead of queueing without limit.
#[derive(Clone)]
pub struct ShardLink {
    /// The actor.
    pub addr: actix::Addr<ShardActor>,
    /// Commands queued or in the current round.
    pub depth: prometheus::IntGauge,
    /// Most commands that may be queued.
    pub max_queue: usize,
    /// The actor's engine, read in place by lone ranks.
    pub engine: SharedShard,
}

impl ShardLink {
    /// Enqueues `command` now and returns where its answer will arrive.
    pub fn ask(&self, command: Command) -> oneshot::Receiver<Result<Answer, Error>> {
        let (reply, answer) = oneshot::channel();
        self.send(vec![(command, reply)]);
        answer
    }

    /// Enqueues several commands as one mailbox message, or answers them all
    /// `overloaded` if the shard's queue is full.
    pub fn send(&self, items: Vec<ShardItem>) {
        let queued = usize::try_from(self.depth.get()).unwrap_or(0);
        if queued + items.len() > self.max_queue {
            for (_, reply) in items {
                let _ = reply.send(Err(Error::Overloaded(format!(
                    "shard has {queued} commands queued (limit {}); retry later",
                    self.max_queue
                ))));
            }
            return;
        }
        self.send_unbounded(items);
    }

    /// Enqueues regardless of the bound: for control commands (shutdown)
    /// that must never be shed.
    pub fn send_unbounded(&self, items: Vec<ShardItem>) {
        self.depth.add(items.len() as i64);
        self.addr.do_send(ShardRequest { items });
    }
}

/// Testing only: sleeps that stand in for a slow disk, so tests can reach
/// what a slow or starved committer or runs thread sets off (overload,
/// backpressure) on a fast one.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlowDisk {
    /// Before each commit.
    pub commit: Duration,
    /// Before the runs of each answered group are written.
    pub runs: Duration,
}

/// Sent to self so a round runs once the mailbox is drained.
struct Flush;

impl Message for Flush {
    type Result = ();
}

/// Sent to self while a leaf-repacking pass is under way: one step per
/// message, so steps queue behind requests and never hold a round up long.
struct Repack;

impl Message for Repack {
    type Result = ();
}

/// From the committer or the runs thread: some batches are answered or
/// over (see [`CommitProgress`]).
struct CommitDone;

impl Message for CommitDone {
    type Result = ();
}

/// A sealed batch on its way to the committer thread.
struct CommitJob {
    /// The batch.
    batch: SealedBatch,
    /// Makes the batch durable.
    handle: DurabilityHandle,
    /// Which opening of the storage `handle` belongs to: one fsync covers
    /// every queued job of one opening.
    generation: u64,
    /// The answers to send once durable.
    replies: Vec<Held>,
}

/// How far the committer and the runs thread got, shared so the actor can
/// wait for them (a list needs every sealed batch over) without a mailbox
/// round trip.
#[derive(Default)]
struct CommitProgress {
    state: Mutex<Progress>,
    changed: parking_lot::Condvar,
}

impl CommitProgress {
    /// Counts jobs forward (`count` raises `answered` or `finished`), keeps
    /// a failure for the actor to take, and wakes whoever waits.
    fn report(&self, count: impl FnOnce(&mut Progress), failure: Option<String>) {
        let mut state = self.state.lock();
        count(&mut state);
        if failure.is_some() {
            state.failure = failure;
        }
        self.changed.notify_all();
    }
}

#[derive(Default)]
struct Progress {
    /// Jobs answered (written and synced, or failed), ever: the committer
    /// is free for the next batch once all sent are.
    answered: u64,
    /// Jobs over, ever: answered, and the runs they carried written (or
    /// failed), in the order they were sealed. Only then may the shard stop
    /// reading those runs from memory.
    finished: u64,
    /// Why a write, fsync or run failed, until the actor takes it.
    failure: Option<String>,
}

/// The jobs of one commit group once answered, on their way to the runs
/// thread: how many, and those whose runs are still to be written.
struct Answered {
    jobs: u64,
    generation: u64,
    /// Batches carrying runs or leaving a memtable full; empty if the group
    /// failed (nothing of it is known durable, so no run of it may be
    /// written).
    runs: Vec<WrittenBatch>,
}

/// The shard's committer thread: writes sealed batches — all that queued up
/// meanwhile — then makes them durable with one fsync, answers them and
/// tells the actor; the runs they carry go to the shard's runs thread.
///
/// Why two threads: writing a run takes ~0.1 s (65k records and ~130k index
/// entries in sorted tables, fsynced). On the committer it held up the next
/// batch's fsync, so every client waited for its acknowledgments and the
/// pipeline drained: at 1M players, 14 runs stalled writes for ~1.7 s of
/// every 10. A run only has to follow the fsync of its own batch and come
/// before the next run, which the runs thread's order guarantees.
fn run_committer(
    jobs: std::sync::mpsc::Receiver<CommitJob>,
    actor: actix::Addr<ShardActor>,
    progress: Arc<CommitProgress>,
    metrics: Arc<Metrics>,
    index: usize,
    slow_disk: SlowDisk,
    relay: Option<ReplyRelay>,
) {
    metrics.threads.register(&format!("commit-{index}"));
    let (to_runs, runs_queue) = std::sync::mpsc::channel::<Answered>();
    let runs_thread = {
        let (actor, progress, metrics) = (actor.clone(), progress.clone(), metrics.clone());
        std::thread::Builder::new()
            .name(format!("rankd-runs-{index}"))
            .spawn(move || run_runs(runs_queue, actor, progress, metrics, index, slow_disk.runs))
            .map_err(
                |e| tracing::error!(shard = index, error = %e, "starting the runs thread failed; writing runs inline"),
            )
            .ok()
    };
    // Only for runs written here, when the runs thread is missing.
    let mut failed_generation = None;
    let shard_metrics = &metrics.shards[index];
    while let Ok(first) = jobs.recv() {
        let mut queued = vec![first];
        queued.extend(jobs.try_iter());
        let mut queued = queued.into_iter().peekable();
        while let Some(head) = queued.next() {
            let generation = head.generation;
            let mut group = vec![head];
            while let Some(next) = queued.next_if(|job| job.generation == generation) {
                group.push(next);
            }
            let answered = commit_group(group, shard_metrics, &progress, slow_disk.commit, relay.as_ref());
            let unsent = match runs_thread {
                Some(_) => to_runs.send(answered).err().map(|std::sync::mpsc::SendError(answered)| answered),
                None => Some(answered),
            };
            if let Some(answered) = unsent {
                write_runs(answered, shard_metrics, &progress, &mut failed_generation);
            }
        }
        actor.do_send(CommitDone);
    }
    drop(to_runs);
    if let Some(thread) = runs_thread {
        let _ = thread.join();
    }
}

/// The shard's runs thread: writes the runs of answered batches in the
/// order they were sealed, and tells the actor as they finish.
fn run_runs(
    queue: std::sync::mpsc::Receiver<Answered>,
    actor: actix::Addr<ShardActor>,
    progress: Arc<CommitProgress>,
    metrics: Arc<Metrics>,
    index: usize,
    delay: Duration,
) {
    metrics.threads.register(&format!("runs-{index}"));
    priority::make_background("runs");
    let mut failed_generation = None;
    for answered in queue {
        if !delay.is_zero() {
            std::thread::sleep(delay); // testing: a slow disk, or a starved thread
        }
        write_runs(answered, &metrics.shards[index], &progress, &mut failed_generation);
        actor.do_send(CommitDone);
    }
}

/// Writes the runs of one answered group and records the jobs as over.
/// Once a run of a storage opening failed, no later run of that opening is
/// written: its marker would claim the failed run's records were covered,
/// and a restart would not rebuild them from the log (the actor reopens
/// the storage, which rebuilds every unwritten change).
fn write_runs(
    answered: Answered,
    metrics: &crate::operations::metrics::ShardMetrics,
    progress: &CommitProgress,
    failed_generation: &mut Option<u64>,
) {
    let Answered { jobs, generation, runs } = answered;
    let mut failure = None;
    if *failed_generation != Some(generation) {
        for batch in runs {
            let checkpoint = batch.carries_checkpoint();
            match batch.write_runs() {
                Ok(took) => {
                    metrics.run_seconds.observe(took.as_secs_f64());
                    if checkpoint {
                        metrics.checkpoints.inc();
                    }
                }
                Err(e) => {
                    // Everything answered is in the log; reopening rebuilds
                    // the overlay from it and writes the runs again.
                    metrics.commit_errors.inc();
                    metrics.degraded.set(1);
                    failure = Some(format!("writing runs failed: {e}"));
                    *failed_generation = Some(generation);
                    break;
                }
            }
        }
    } else {
        drop(runs);
    }
    // The batches (and their storage handles) are gone before the actor may
    // hear the jobs are over: a reopen needs them gone.
    progress.report(|state| state.finished += jobs, failure);
}

/// The actor. See the module docs.
pub struct ShardActor {
    /// The engine. `None` only while reopening after a storage failure
    /// failed; requests then fail with `internal` until it opens again.
    /// Locked per command, not per round, so that a lone rank can read it
    /// between two commands (see [`SharedShard`]).
    shard: SharedShard,
    /// Set when a commit or fsync failed: writes are refused (never falsely
    /// acknowledged) while reads go on, and the storage is reopened each
    /// second until writes work again.
    degraded: Option<String>,
    /// Commands of the round being gathered.
    queue: Vec<ShardItem>,
    flush_scheduled: bool,
    /// A [`Repack`] is in the mailbox.
    repack_scheduled: bool,
    /// A round never holds more requests than this, bounding latency and memory.
    max_batch: usize,
    /// Answers of staged writes, waiting for their batch to be committed.
    pending: Vec<Held>,
    /// Sealed batches handed to the committer and not yet answered.
    syncs_in_flight: usize,
    /// Sealed batches handed to the committer and not yet over (their runs
    /// written): while any is, the storage is held open elsewhere.
    unfinished: usize,
    /// Batches handed to the committer, ever.
    sent: u64,
    /// Of those, how many are known to be over (see [`Progress::finished`]).
    accounted: u64,
    progress: Arc<CommitProgress>,
    /// The committer thread's queue (see [`run_committer`]); set once started.
    commit_jobs: Option<std::sync::mpsc::Sender<CommitJob>>,
    committer: Option<std::thread::JoinHandle<()>>,
    /// Bumped whenever the storage is reopened (see [`CommitJob::generation`]).
    generation: u64,
    dense: DenseRegistry,
    metrics: Arc<Metrics>,
    /// This shard's index in `metrics.shards`.
    index: usize,
    /// Testing only: how slow to make the committer and the runs thread.
    slow_disk: SlowDisk,
    /// Where the committer hands committed answers; without one it sends them itself.
    relay: Option<ReplyRelay>,
    /// Decides which period of each window a round's writes land in.
    clock: Clock,
    /// The Unix second of the last once-a-second maintenance (storage
    /// gauges published, expired periods looked for).
    last_tick: i64,
    /// fjall's compaction time when last published (see `observe_storage`).
    compacting_seen: Duration,
    /// While degraded: when to try reopening the storage next.
    retry_recovery_at: Instant,
    /// Where the storage lives, to reopen it after a failed attempt.
    location: (std::path::PathBuf, rankd_shards::ShardOptions),
    /// While recovering: this shard's share of the dense indexes as its
    /// batches reported it, before the storage was reopened.
    reported_dense: Option<HashMap<TreeId, Vec<(u64, u64)>>>,
}

/// How long a shutdown waits for the memtables to be flushed; past it the
/// process exits anyway and the next start replays the journal (slower, but
/// nothing is lost). Well inside the 30 s an orchestrator usually grants
/// between SIGTERM and SIGKILL.
const SHUTDOWN_FLUSH_WAIT: Duration = Duration::from_secs(20);

/// How long a degraded shard waits between attempts to reopen its storage.
const RECOVERY_RETRY: Duration = Duration::from_secs(1);

/// Sealed batches whose runs may wait for the runs thread before the batch
/// loop waits for it. Each holds a frozen overlay (up to ~10 MB at the
/// default run size) in memory until written; the runs thread runs at a low
/// priority ([`crate::operations::priority`]), so a loop busy enough to starve it would
/// otherwise grow them without bound. Normally fewer than one is waiting.
const MAX_UNWRITTEN_RUNS: usize = 4;

/// Commands a round looks ahead at a time, prefetching what they will
/// touch (`Shard::prefetch`, which gives the figures). Each
/// write's two leaves are up to ~1.3 KB: 16 writes' worth stays well
/// inside a core's L2 until it is used.
const LOOK_AHEAD: usize = 16;

/// Keys of expired periods deleted per maintenance step: small enough that
/// a rollover never holds a round up for long.
const EXPIRY_BUDGET: usize = 4096;

/// Count-tree leaves looked at per [`Repack`] step. Measured at 10M players
/// on 2 shards (thread CPU time): a pass visits a shard's ~244k leaves and
/// moves 7-11% of them in 50-110 ms of CPU; with 512 a step took 0.15 ms on
/// average and at most 0.7 ms, so 256 keeps a step about as long as a
/// small round.
const REPACK_BUDGET: usize = 256;

impl ShardActor {
    /// Wraps an opened shard; `index` is its position among the shards.
    pub fn new(
        shard: Shard,
        max_batch: usize,
        dense: DenseRegistry,
        metrics: Arc<Metrics>,
        index: usize,
        clock: Clock,
    ) -> Self {
        Self {
            clock,
            last_tick: i64::MIN,
            compacting_seen: Duration::ZERO,
            retry_recovery_at: Instant::now(),
            location: shard.location(),
            reported_dense: None,
            shard: Arc::new(Mutex::new(Some(shard))),
            degraded: None,
            queue: Vec::new(),
            flush_scheduled: false,
            repack_scheduled: false,
            max_batch: max_batch.max(1),
            pending: Vec::new(),
            syncs_in_flight: 0,
            unfinished: 0,
            sent: 0,
            accounted: 0,
            progress: Arc::default(),
            commit_jobs: None,
            committer: None,
            generation: 0,
            dense,
            metrics,
            index,
            slow_disk: SlowDisk::default(),
            relay: None,
        }
    }

    /// The engine, for the router's lone ranks (see [`SharedShard`]).
    pub fn engine(&self) -> SharedShard {
        self.shard.clone()
    }

    /// Has the committer hand its answers to `relay` (see [`ReplyRelay`]).
    pub fn with_reply_relay(mut self, relay: ReplyRelay) -> Self {
        self.relay = Some(relay);
        self
    }

    /// Makes commits or runs sleep first (to test how slow disks show).
    #[cfg(feature = "test-hooks")]
    pub fn with_slow_disk(mut self, slow_disk: SlowDisk) -> Self {
        self.slow_disk = slow_disk;
        self
    }

    fn run_round(&mut self) {
        let now = self.clock.now();
        if let Some(shard) = self.shard.lock().as_mut() {
            shard.set_time(now);
        }
        let queue = std::mem::take(&mut self.queue);
        let observe = self.metrics.hot_path;
        if observe {
            self.metrics.shards[self.index].batch_size.observe(queue.len() as f64);
        }
        // Time spent applying: the whole round but its waits for the
        // committer (`settle`). Read per command, the clock was ~3% of this
        // thread's samples.
        let mut applying = Duration::ZERO;
        let mut since = observe.then(Instant::now);
        // Every LOOK_AHEAD commands, the writes among the next LOOK_AHEAD are
        // prefetched.
        let mut until_look_ahead = 0;
        let mut items = queue.into_iter();
        while let Some((command, reply)) = items.next() {
            if until_look_ahead == 0 {
                let upcoming = items.as_slice().iter().map(|(next, _)| next);
                self.look_ahead(std::iter::once(&command).chain(upcoming).take(LOOK_AHEAD));
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
            let after_sync = command.answers_after_sync();
            let answer = self.execute(command);
            if after_sync {
                self.pending.push((reply, answer));
            } else {
                // Counted before the reply, so a client that sees it sees its
                // lookups counted; the held replies go after the round's count.
                if observe {
                    self.count_cache_lookups();
                }
                self.metrics.shards[self.index].mailbox_depth.dec();
                let _ = reply.send(answer);
            }
        }
        if let Some(since) = since {
            applying += since.elapsed();
            self.metrics.shards[self.index].apply_seconds.observe(applying.as_secs_f64());
            self.count_cache_lookups();
        }
        self.commit_pending(false);
        self.maintain();
    }

    /// Prefetches what the writes, ranks and counts among `commands` will
    /// touch.
    fn look_ahead<'a>(&self, commands: impl Iterator<Item = &'a Command>) {
        let engine = self.shard.lock();
        let Some(shard) = engine.as_ref() else { return };
        shard.prefetch(commands.filter_map(|command| match command {
            Command::Write { board, player, score, mode, seq } => {
                Some(Upcoming::Write(UpcomingWrite { board, player, score: *score, mode: *mode, seq: *seq }))
            }
            Command::Rank { tree, player, ties, order, .. } => {
                Some(Upcoming::Rank { tree: *tree, player, ties: *ties, order: *order })
            }
            Command::CountBefore { tree, keys } => Some(Upcoming::CountBefore { tree: *tree, keys }),
            _ => None,
        }));
    }

    /// Adds the record-cache lookups since the last call to the metrics.
    fn count_cache_lookups(&mut self) {
        if let Some(shard) = self.shard.lock().as_mut() {
            self.metrics.shards[self.index].count_lookups(shard.take_cache_lookups());
        }
    }

    /// Between rounds: while degraded, try to reopen the storage. Once a
    /// second (not every round: rounds run thousands of times a second),
    /// publish the storage gauges and, unless degraded, look for periods
    /// that fell out of their board's `keep` and delete a bounded slice of
    /// expired data (waiting for the committer first if there is any:
    /// sustained writes must not starve expiry).
    fn maintain(&mut self) {
        // The committer and runs threads hold the storage open while they
        // have a batch; if they do, `CommitDone` calls again.
        if self.degraded.is_some() && self.unfinished == 0 && Instant::now() >= self.retry_recovery_at {
            self.try_recover();
        }
        let now = self.clock.now();
        if now == self.last_tick {
            return;
        }
        self.last_tick = now;
        self.observe_storage();
        if self.degraded.is_some() {
            return;
        }
        let has_expired = self.shard.lock().as_mut().is_some_and(|shard| {
            shard.set_time(now);
            shard.has_expired()
        });
        if !has_expired {
            return;
        }
        self.settle();
        if self.degraded.is_some() {
            return;
        }
        let mut engine = self.shard.lock();
        let Some(shard) = engine.as_mut() else { return };
        match shard.expire(EXPIRY_BUDGET) {
            Ok(expired) if !expired.is_empty() => {
                tracing::info!(shard = self.index, periods = expired.len(), "expired periods dropped");
                let mut dense = self.dense.lock();
                for tree in expired {
                    dense.remove(&tree);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(shard = self.index, error = %e, "deleting expired periods failed; will retry"),
        }
    }

    /// Publishes how the shard's storage keeps up (see [`rankd_shards::StorageStats`]).
    fn observe_storage(&mut self) {
        let engine = self.shard.lock();
        let Some(shard) = engine.as_ref() else { return };
        let stats = shard.storage_stats();
        let metrics = &self.metrics.shards[self.index];
        metrics.memtable_bytes.set(i64::try_from(stats.memtable_bytes).unwrap_or(i64::MAX));
        metrics.sealed_memtables.set(i64::try_from(stats.sealed_memtables).unwrap_or(i64::MAX));
        // fjall counts from zero again after a reopen: that interval is lost, not negative.
        metrics.compaction_seconds.inc_by(stats.compacting.saturating_sub(self.compacting_seen).as_secs_f64());
        self.compacting_seen = stats.compacting;
    }

    /// Queues the next repacking step if a pass is under way (a round's
    /// batch may have checkpointed and started one).
    fn schedule_repack(&mut self, ctx: &mut Context<Self>) {
        if !self.repack_scheduled && self.shard.lock().as_ref().is_some_and(Shard::is_repacking) {
            self.repack_scheduled = true;
            actix::AsyncContext::notify(ctx, Repack);
        }
    }

    /// Reopens the storage after a failure; on success writes resume.
    ///
    /// The batches that failed had already reported their dense changes
    /// (at seal, so that reads after their answers would see them); the
    /// reopened storage holds only what was durable, so this shard's share of
    /// the dense indexes is replaced with what it holds now.
    fn try_recover(&mut self) {
        let has_staged = self.shard.lock().as_ref().is_some_and(Shard::has_staged);
        if has_staged {
            self.commit_pending(true); // everything staged is reported first
            return;
        }
        let taken = self.shard.lock().take();
        let reopened = match taken {
            Some(shard) => {
                self.reported_dense.get_or_insert_with(|| shard.dense_score_counts());
                shard.reopen()
            }
            // An earlier attempt failed and dropped the shard: open it afresh.
            None => Shard::open(&self.location.0, self.location.1.clone()),
        };
        self.generation += 1;
        match reopened {
            Ok(mut shard) => {
                tracing::warn!(shard = self.index, "storage reopened; accepting writes again");
                // The reopened storage's workers were started by this thread.
                priority::make_fjall_workers_background();
                shard.set_time(self.clock.now());
                self.metrics.shards[self.index].players.set(shard.players() as i64);
                let reported = self.reported_dense.take().unwrap_or_default();
                replace_dense_share(&self.dense, shard.branching(), &reported, &shard.dense_score_counts());
                *self.shard.lock() = Some(shard);
                self.degraded = None;
                self.metrics.shards[self.index].degraded.set(0);
            }
            Err(e) => {
                self.retry_recovery_at = Instant::now() + RECOVERY_RETRY;
                // Opening failed too: retry next second. Reopening from the
                // data dir needs no in-memory state, so nothing is lost.
                tracing::error!(shard = self.index, error = %e, "reopening storage failed; retrying");
            }
        }
    }

    /// Marks the shard degraded after a failed commit or fsync.
    /// (The committer already counted the failure and raised the gauge,
    /// before answering the batch: a client told `internal` sees it.)
    fn degrade(&mut self, why: String) {
        self.retry_recovery_at = Instant::now() + RECOVERY_RETRY;
        tracing::error!(
            shard = self.index,
            error = %why,
            "commit failed; its writes are answered `internal` and writes stop until storage recovers"
        );
        self.degraded = Some(why);
    }

    /// Seals the staged writes into one batch and hands it with the pending
    /// answers to the committer. Unless `force`d, waits while a batch is with
    /// the committer: [`CommitDone`] calls again, and everything staged
    /// meanwhile joins the next batch — the group in group commit.
    fn commit_pending(&mut self, force: bool) {
        if self.pending.is_empty() || (self.syncs_in_flight > 0 && !force) {
            return;
        }
        let metrics = &self.metrics.shards[self.index];
        let replies = std::mem::take(&mut self.pending);
        let mut engine = self.shard.lock();
        let Some(shard) = engine.as_mut() else {
            answer_all(replies, Some("shard storage is closed; retrying"), metrics, None);
            return;
        };
        let started = self.metrics.hot_path.then(Instant::now);
        let mut batch = shard.seal();
        let unwritten_runs = shard.unwritten_runs();
        metrics.unwritten_runs.set(unwritten_runs as i64);
        metrics.logged_changes.set(i64::try_from(shard.logged_changes()).unwrap_or(i64::MAX));
        if let Some(started) = started {
            metrics.seal_seconds.observe(started.elapsed().as_secs_f64());
            metrics.players.set(shard.players() as i64);
            metrics.unwritten_players.set(shard.unwritten_players() as i64);
        }
        let dense = std::mem::take(&mut batch.dense);
        if !dense.is_empty() {
            update_dense(&self.dense, shard.branching(), dense);
        }
        let job = CommitJob { batch, handle: shard.durability_handle(), generation: self.generation, replies };
        drop(engine);
        self.sent += 1;
        self.syncs_in_flight += 1;
        self.unfinished += 1;
        let unsent = match &self.commit_jobs {
            Some(jobs) => jobs.send(job).err().map(|std::sync::mpsc::SendError(job)| job),
            None => Some(job),
        };
        if let Some(job) = unsent {
            // No committer (not started, or stopping): commit here. A failed
            // run degrades the shard before another batch is sealed, so no
            // later run of this opening is written after it.
            let answered = commit_group(vec![job], metrics, &self.progress, self.slow_disk.commit, None);
            write_runs(answered, metrics, &self.progress, &mut None);
            self.absorb_progress();
        } else if unwritten_runs > MAX_UNWRITTEN_RUNS {
            self.settle(); // see MAX_UNWRITTEN_RUNS
        }
    }

    /// Hands the staged writes to the committer and waits until it has
    /// written everything: for reads that scan storage and for maintenance.
    fn settle(&mut self) {
        self.commit_pending(true);
        {
            let mut progress = self.progress.state.lock();
            while progress.finished < self.sent {
                let timed_out = self.progress.changed.wait_for(&mut progress, Duration::from_secs(1)).timed_out();
                if timed_out && self.committer.as_ref().is_some_and(|thread| thread.is_finished()) {
                    tracing::error!(shard = self.index, "the committer thread is gone; not waiting for it");
                    break;
                }
            }
        }
        self.absorb_progress();
    }

    /// Catches up with the committer and the runs thread: batches they
    /// finished are storage's business now, and a failure they met degrades
    /// the shard.
    fn absorb_progress(&mut self) {
        let (answered, finished, failure) = {
            let mut progress = self.progress.state.lock();
            (progress.answered, progress.finished, progress.failure.take())
        };
        let newly = finished.saturating_sub(self.accounted);
        self.accounted = finished;
        self.syncs_in_flight = usize::try_from(self.sent.saturating_sub(answered)).unwrap_or(usize::MAX);
        self.unfinished = usize::try_from(self.sent.saturating_sub(finished)).unwrap_or(usize::MAX);
        if let Some(shard) = self.shard.lock().as_mut() {
            shard.landed(usize::try_from(newly).unwrap_or(usize::MAX));
            self.metrics.shards[self.index].unwritten_runs.set(shard.unwritten_runs() as i64);
        }
        if let Some(why) = failure {
            if self.degraded.is_none() {
                self.degrade(why);
            }
        }
    }

    fn execute(&mut self, command: Command) -> Result<Answer, Error> {
        let mut engine = self.shard.lock();
        let Some(shard) = engine.as_mut() else {
            return Err(Error::Internal("shard storage is closed; retrying".into()));
        };
        if let Some(reason) = &self.degraded {
            if command.is_write() {
                return Err(Error::Internal(format!("writes are refused until storage recovers ({reason})")));
            }
        }
        Self::apply(shard, command).map_err(Error::from)
    }

    fn apply(shard: &mut Shard, command: Command) -> Result<Answer, ShardError> {
        Ok(match command {
            Command::Write { board, player, score, mode, seq } => {
                Answer::Score(shard.write(&board, &player, score, mode, seq)?)
            }
            Command::WriteMany { board, entries, mode } => Answer::Scores(shard.write_many(&board, &entries, mode)?),
            Command::Remove { board, player } => Answer::Bool(shard.remove(&board, &player)?),
            Command::EnsureBoard { board } => {
                shard.ensure_board(&board);
                Answer::Done
            }
            Command::DropBoard { board_id } => Answer::Bool(shard.drop_board(board_id)?),
            Command::Get { tree, player } => Answer::Record(shard.get(tree, &player)?),
            Command::Rank { tree, player, ties, order, forward } => match shard.get(tree, &player)? {
                Some(record) => {
                    let key = record.rank_key(ties, order);
                    forward.send(tree, key); // first, so the others count while this one does
                    let before = shard.count_before_key(tree, key);
                    Answer::Ranked { record: Some(record), before, total: shard.count(tree) }
                }
                None => Answer::Ranked { record: None, before: 0, total: 0 },
            },
            Command::CountBefore { tree, keys } => {
                Answer::Counts { before: shard.count_before(tree, &keys), total: shard.count(tree) }
            }
            Command::List { tree, ties, order, position, direction, limit } => {
                Answer::List(shard.list(tree, ties, order, &position, direction, limit)?)
            }
            Command::Shutdown => {
                shard.prepare_shutdown(SHUTDOWN_FLUSH_WAIT)?;
                Answer::Done
            }
        })
    }
}

impl Actor for ShardActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The actor runs on its own arbiter's thread from here on.
        self.metrics.threads.register(&format!("shard-{}", self.index));
        let players = self.shard.lock().as_ref().map_or(0, Shard::players);
        self.metrics.shards[self.index].players.set(players as i64);
        let (jobs, queue) = std::sync::mpsc::channel();
        let actor = actix::AsyncContext::address(ctx);
        let (progress, metrics, index, slow_disk, relay) =
            (self.progress.clone(), self.metrics.clone(), self.index, self.slow_disk, self.relay.clone());
        match std::thread::Builder::new()
            .name(format!("rankd-commit-{index}"))
            .spawn(move || run_committer(queue, actor, progress, metrics, index, slow_disk, relay))
        {
            Ok(thread) => {
                self.commit_jobs = Some(jobs);
                self.committer = Some(thread);
            }
            // Batches are then written and synced on the actor thread:
            // slower, still correct.
            Err(e) => {
                tracing::error!(shard = index, error = %e, "starting the committer thread failed; committing inline")
            }
        }
        // Idle shards still drop expired periods; busy ones do it between rounds.
        actix::AsyncContext::run_interval(ctx, Duration::from_secs(1), |actor, _| actor.maintain());
    }

    fn stopping(&mut self, _: &mut Self::Context) -> actix::Running {
        // Never drop staged writes on the way out: seal them, let the
        // committer finish every batch (it answers them), then stop it.
        self.run_round();
        self.commit_pending(true);
        self.commit_jobs = None;
        if let Some(thread) = self.committer.take() {
            let _ = thread.join();
        }
        actix::Running::Stop
    }
}

impl Handler<ShardRequest> for ShardActor {
    type Result = ();

    fn handle(&mut self, request: ShardRequest, ctx: &mut Self::Context) {
        self.queue.extend(request.items);
        if self.queue.len() >= self.max_batch {
            self.run_round();
            self.schedule_repack(ctx);
        } else if !self.flush_scheduled {
            self.flush_scheduled = true;
            actix::AsyncContext::notify(ctx, Flush);
        }
    }
}

impl Handler<Flush> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: Flush, ctx: &mut Self::Context) {
        self.flush_scheduled = false;
        if !self.queue.is_empty() {
            self.run_round();
            self.schedule_repack(ctx);
        }
    }
}

impl Handler<Repack> for ShardActor {
    type Result = ();

    /// Looks at a slice of count-tree leaves and moves those on sparse
    /// allocator slabs (see [`Shard::repack_step`] and
    /// [`crate::operations::allocator::Packer`]).
    fn handle(&mut self, _: Repack, ctx: &mut Self::Context) {
        self.repack_scheduled = false;
        let mut engine = self.shard.lock();
        let Some(shard) = engine.as_mut() else { return };
        let mut packer = crate::operations::allocator::Packer::default();
        let done = shard.repack_step(REPACK_BUDGET, |leaf| packer.pick(leaf));
        drop(packer);
        drop(engine);
        let metrics = &self.metrics.shards[self.index];
        metrics.repack_visited.inc_by(done.visited as u64);
        metrics.repack_moved.inc_by(done.moved as u64);
        self.schedule_repack(ctx);
    }
}

impl Handler<CommitDone> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: CommitDone, _: &mut Self::Context) {
        self.absorb_progress();
        // What was staged while the committer worked is the next batch.
        self.commit_pending(false);
        if self.degraded.is_some() && self.unfinished == 0 {
            self.maintain(); // a recovery may have waited for the committer
        }
    }
}

/// Applies a sealed batch's changes of dense trees' score sets to the
/// engine-wide distinct-score indexes.
fn update_dense(registry: &DenseRegistry, branching: u32, changes: Vec<DenseChange>) {
    let mut dense = registry.lock();
    for change in changes {
        let Some(index) = dense_index(&mut dense, change.tree, branching) else { continue };
        if let Some(sk) = change.removed {
            index.remove(sk, 1);
        }
        if let Some(sk) = change.added {
            index.add(sk, 1);
        }
    }
}

/// Replaces one shard's share of the dense indexes: `reported` is what its
/// batches had reported, `holds` what its reopened storage holds. From an
/// empty `reported` this is how a starting engine builds them.
pub(crate) fn replace_dense_share(
    registry: &DenseRegistry,
    branching: u32,
    reported: &HashMap<TreeId, Vec<(u64, u64)>>,
    holds: &HashMap<TreeId, Vec<(u64, u64)>>,
) {
    let trees: std::collections::HashSet<TreeId> = reported.keys().chain(holds.keys()).copied().collect();
    let mut dense = registry.lock();
    for tree in trees {
        let (before, after) = (reported.get(&tree), holds.get(&tree));
        if before == after {
            continue;
        }
        let Some(index) = dense_index(&mut dense, tree, branching) else { continue };
        index.replace_share(before.map_or(&[][..], Vec::as_slice), after.map_or(&[][..], Vec::as_slice));
    }
}

/// The dense index of `tree`; a new period of a dense board starts its index here.
fn dense_index(dense: &mut HashMap<TreeId, DenseIndex>, tree: TreeId, branching: u32) -> Option<&mut DenseIndex> {
    match dense.entry(tree) {
        std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => DenseIndex::new(branching).ok().map(|index| e.insert(index)),
    }
}

/// Writes `jobs` (sealed batches of one storage opening, oldest first) in
/// order, makes them durable with one sync — syncing the journal covers
/// every batch written before — answers them and records that; returns the
/// runs they carry, which may be written now that they are durable (see
/// [`write_runs`]). After a failed write nothing more is written: the
/// batches after it are answered as failed too (the actor reopens the
/// storage).
fn commit_group(
    jobs: Vec<CommitJob>,
    metrics: &crate::operations::metrics::ShardMetrics,
    progress: &CommitProgress,
    delay: Duration,
    relay: Option<&ReplyRelay>,
) -> Answered {
    let count = jobs.len() as u64;
    let generation = jobs.first().map_or(0, |job| job.generation);
    let mut failure = None;
    let mut handle = None;
    let mut writes = 0;
    let writes_something = jobs.iter().any(|job| !job.batch.is_empty());
    let mut held = Vec::with_capacity(jobs.len());
    let mut written = Vec::with_capacity(jobs.len());
    for job in jobs {
        if failure.is_none() {
            if !delay.is_zero() {
                std::thread::sleep(delay); // testing: a slow disk
            }
            writes += job.batch.writes;
            match job.batch.write() {
                Ok(batch) => {
                    metrics.commit_seconds.observe((batch.took + delay).as_secs_f64());
                    written.push(batch);
                }
                Err(e) => failure = Some(format!("commit failed: {e}")),
            }
        }
        handle = Some(job.handle);
        held.push(job.replies);
    }
    if let (None, Some(handle)) = (&failure, &handle) {
        match handle.sync() {
            Ok(took) => {
                metrics.fsync_seconds.observe(took.as_secs_f64());
                metrics.writes_applied.inc_by(writes as u64);
            }
            Err(e) => failure = Some(format!("commit failed: {e}")),
        }
    }
    if failure.is_some() && writes_something {
        metrics.commit_errors.inc();
        metrics.degraded.set(1);
    }
    answer_all(held.into_iter().flatten(), failure.as_deref(), metrics, relay);
    let runs = match failure {
        None => written.into_iter().filter(WrittenBatch::has_work).collect(),
        Some(_) => Vec::new(),
    };
    // Answered, not over: the batches with runs keep their storage handles
    // until `write_runs` drops them, and only then are the jobs over (what a
    // reopen waits for).
    progress.report(|state| state.answered += count, failure);
    Answered { jobs: count, generation, runs }
}

/// Sends held answers (through `relay`, if given, in one hand-off) and
/// lowers the shard's queue depth by as many.
fn answer_all(
    replies: impl IntoIterator<Item = Held>,
    failure: Option<&str>,
    metrics: &crate::operations::metrics::ShardMetrics,
    relay: Option<&ReplyRelay>,
) {
    let answers: Vec<Held> =
        replies.into_iter().map(|(reply, answer)| (reply, unless_failed(answer, failure))).collect();
    metrics.mailbox_depth.sub(answers.len() as i64);
    match relay {
        Some(relay) => relay.relay(answers),
        None => answers.into_iter().for_each(send_answer),
    }
}

/// A held answer once its batch is over: if the commit or sync failed, a
/// success becomes `internal` (it may or may not have applied); a refusal
/// (which changed nothing) stays.
fn unless_failed(answer: Result<Answer, Error>, failure: Option<&str>) -> Result<Answer, Error> {
    match (failure, answer) {
        (Some(why), Ok(_)) => Err(Error::Internal(why.to_string())),
        (_, answer) => answer,
    }
}

macro_rules! answer_accessors {
    ($($fn:ident => $variant:ident($ty:ty)),* $(,)?) => {
        impl Answer {
            $(
                #[doc = concat!("The `", stringify!($variant), "` payload; any other variant is a routing bug.")]
                pub fn $fn(self) -> Result<$ty, Error> {
                    match self {
                        Self::$variant(v) => Ok(v),
                        other => Err(Error::Internal(format!("shard answered {other:?}, expected {}", stringify!($variant)))),
                    }
                }
            )*
        }
    };
}

answer_accessors!(
    into_score => Score(i64),
    into_scores => Scores(Vec<i64>),
    into_bool => Bool(bool),
    into_record => Record(Option<Record>),
    into_list => List(Vec<ListEntry>),
);

impl Answer {
    /// The `Counts` payload: per-key counts and the total.
    pub fn into_counts(self) -> Result<(Vec<u64>, u64), Error> {
        match self {
            Self::Counts { before, total } => Ok((before, total)),
            other => Err(Error::Internal(format!("shard answered {other:?}, expected Counts"))),
        }
    }

    /// The `Ranked` payload: the record, this shard's count before it, its total.
    pub fn into_ranked(self) -> Result<(Option<Record>, u64, u64), Error> {
        match self {
            Self::Ranked { record, before, total } => Ok((record, before, total)),
            other => Err(Error::Internal(format!("shard answered {other:?}, expected Ranked"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(board: u64) -> TreeId {
        TreeId { board, window: 0, period: 0 }
    }

    fn scores(answers: &[i64]) -> (Vec<Held>, Vec<oneshot::Receiver<Result<Answer, Error>>>) {
        answers
            .iter()
            .map(|&score| {
                let (reply, answer) = oneshot::channel();
                ((reply, Ok(Answer::Score(score))), answer)
            })
            .unzip()
    }

    async fn received(answers: Vec<oneshot::Receiver<Result<Answer, Error>>>) -> Vec<i64> {
        let mut out = Vec::new();
        for answer in answers {
            match answer.await {
                Ok(Ok(Answer::Score(score))) => out.push(score),
                other => panic!("expected a score, got {other:?}"),
            }
        }
        out
    }

    #[tokio::test]
    async fn relayed_answers_arrive_once_delivered_and_without_a_delivering_task() {
        let (relay, deliver) = ReplyRelay::new();
        let (held, mut answers) = scores(&[1, 2, 3]);
        relay.relay(held);
        // Nothing is sent until the delivering task runs.
        assert!(answers[0].try_recv().is_err());
        tokio::spawn(deliver);
        assert_eq!(received(answers).await, [1, 2, 3]);

        let (relay, deliver) = ReplyRelay::new();
        drop(deliver);
        let (held, answers) = scores(&[4, 5]);
        relay.relay(held); // the task is gone: sent from here
        assert_eq!(received(answers).await, [4, 5]);
    }

    #[test]
    fn replacing_a_share_touches_each_tree_once() {
        let registry: DenseRegistry = Arc::default();
        let reported = HashMap::from([(tree(1), vec![(10, 1), (20, 1)]), (tree(2), vec![(5, 1)])]);
        let holds = HashMap::from([(tree(1), vec![(20, 1)]), (tree(3), vec![(7, 2)])]);
        // Another shard holds 10 in tree 1 too.
        update_dense(&registry, 16, vec![DenseChange { tree: tree(1), removed: None, added: Some(10) }]);
        for (t, counts) in &reported {
            for &(sk, n) in counts {
                for _ in 0..n {
                    update_dense(&registry, 16, vec![DenseChange { tree: *t, removed: None, added: Some(sk) }]);
                }
            }
        }
        replace_dense_share(&registry, 16, &reported, &holds);
        let dense = registry.lock();
        // Tree 1 (in both maps): 10 still held by the other shard, 20 by this one.
        assert_eq!(dense[&tree(1)].distinct_before(u64::MAX), 2);
        assert_eq!(dense[&tree(2)].distinct_before(u64::MAX), 0, "only reported: taken out");
        assert_eq!(dense[&tree(3)].distinct_before(u64::MAX), 1, "only held: added");
    }
}
