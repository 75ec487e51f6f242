//! The tree-shard actor: a thin actix shell around [`rankd_shards::Shard`]
//! running the single-writer batch loop ("job aggregation") with pipelined
//! group commit.
//!
//! Each request lands in the actor's queue. When the mailbox is drained (a
//! self-notified `Flush` runs only after every queued message was handled) or
//! the queue reaches `max_batch`, one *round* runs: requests apply in arrival
//! order — writes staged in memory, reads answered at once from the staged
//! state. Staged writes are committed as ONE fjall batch and handed, with
//! their answers, to the shard's *sync thread*, which fsyncs and only then
//! answers them. While an fsync is in flight the actor keeps serving: reads
//! are answered, new writes are staged, and when the fsync ends everything
//! staged meanwhile goes out as the next batch. So:
//!
//! - a write is acknowledged only once durable, and many writes share one
//!   fsync — the busier the shard, the bigger the batch;
//! - a read never waits for a disk flush (it may reflect writes whose
//!   acknowledgment is still in flight, which protocol.md allows for reads
//!   concurrent with writes; it never reflects a write that was refused);
//! - the actor never blocks on fsync, because it only writes to the journal
//!   when no fsync holds the journal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, Message};
use parking_lot::Mutex;
use rankd_shards::{
    Board, DenseIndex, Direction, DurabilityHandle, ListEntry, Mode, Order, Record, Shard, ShardError, Ties, TreeId,
};
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::error::Error;
use crate::metrics::Metrics;

/// Distinct-score indexes of the dense-ranked trees, shared by all shards
/// (which update them at commit) and the router (which reads them).
pub type DenseRegistry = Arc<Mutex<std::collections::HashMap<TreeId, DenseIndex>>>;

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

    /// Reads that scan storage need every earlier write of the round committed.
    fn needs_committed_state(&self) -> bool {
        matches!(self, Self::List { .. } | Self::DropBoard { .. } | Self::Shutdown)
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
    /// List entries.
    List(Vec<ListEntry>),
    /// Done.
    Done,
}

/// A command with the channel its answer goes back on (after the commit of
/// the round it is applied in).
pub type ShardItem = (Command, oneshot::Sender<Result<Answer, Error>>);

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

/// Sent to self so a round runs once the mailbox is drained.
struct Flush;

impl Message for Flush {
    type Result = ();
}

/// From the sync thread: `jobs` batches' fsync ended (and their answers
/// were sent).
struct SyncDone {
    jobs: usize,
    /// Why the fsync failed, if it did: those batches were answered `internal`.
    failure: Option<String>,
}

impl Message for SyncDone {
    type Result = ();
}

/// A committed batch on its way to the sync thread.
struct SyncJob {
    /// Makes the batch durable.
    handle: DurabilityHandle,
    /// Which opening of the storage `handle` belongs to: one fsync covers
    /// every queued job of one opening.
    generation: u64,
    /// Writes in the batch (for `rankd_shard_writes_applied_total`).
    writes: usize,
    /// The answers to send once durable.
    replies: Vec<Held>,
}

/// The shard's sync thread: fsyncs committed batches — one fsync for
/// whatever queued up meanwhile — then answers them and tells the actor.
fn run_sync_thread(
    jobs: std::sync::mpsc::Receiver<SyncJob>,
    actor: actix::Addr<ShardActor>,
    metrics: Arc<Metrics>,
    index: usize,
) {
    let metrics = &metrics.shards[index];
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
            let jobs = group.len();
            let failure = make_durable(group, metrics);
            actor.do_send(SyncDone { jobs, failure });
        }
    }
}

/// The actor. See the module docs.
pub struct ShardActor {
    /// The engine. `None` only while reopening after a storage failure
    /// failed; requests then fail with `internal` until it opens again.
    shard: Option<Shard>,
    /// Set when a commit or fsync failed: writes are refused (never falsely
    /// acknowledged) while reads go on, and the storage is reopened each
    /// second until writes work again.
    degraded: Option<String>,
    /// Commands of the round being gathered.
    queue: Vec<ShardItem>,
    flush_scheduled: bool,
    /// A round never holds more requests than this, bounding latency and memory.
    max_batch: usize,
    /// Answers of staged writes, waiting for their batch to be committed.
    pending: Vec<Held>,
    /// Committed batches handed to the sync thread and not yet durable.
    syncs_in_flight: usize,
    /// The sync thread's queue (see [`run_sync_thread`]); set once started.
    sync_jobs: Option<std::sync::mpsc::Sender<SyncJob>>,
    sync_thread: Option<std::thread::JoinHandle<()>>,
    /// Bumped whenever the storage is reopened (see [`SyncJob::generation`]).
    generation: u64,
    dense: DenseRegistry,
    metrics: Arc<Metrics>,
    /// This shard's index in `metrics.shards`.
    index: usize,
    /// Testing only: sleep this long before each commit (a slow disk).
    commit_delay: Duration,
    /// Decides which period of each window a round's writes land in.
    clock: Clock,
    /// When expired periods were last looked for (Unix seconds).
    last_expiry_check: i64,
}

/// Keys of expired periods deleted per maintenance step: small enough that
/// a rollover never holds a round up for long.
const EXPIRY_BUDGET: usize = 4096;

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
            last_expiry_check: i64::MIN,
            shard: Some(shard),
            degraded: None,
            queue: Vec::new(),
            flush_scheduled: false,
            max_batch: max_batch.max(1),
            pending: Vec::new(),
            syncs_in_flight: 0,
            sync_jobs: None,
            sync_thread: None,
            generation: 0,
            dense,
            metrics,
            index,
            commit_delay: Duration::ZERO,
        }
    }

    /// Makes every commit sleep first (to test how slow disks show).
    pub fn with_commit_delay(mut self, delay: Duration) -> Self {
        self.commit_delay = delay;
        self
    }

    fn run_round(&mut self) {
        let now = self.clock.now();
        if let Some(shard) = &mut self.shard {
            shard.set_time(now);
        }
        let queue = std::mem::take(&mut self.queue);
        let observe = self.metrics.hot_path;
        if observe {
            self.metrics.shards[self.index].batch_size.observe(queue.len() as f64);
        }
        let mut applying = Duration::ZERO;
        for (command, reply) in queue {
            if command.needs_committed_state() {
                self.commit_pending(true);
            }
            let after_sync = command.answers_after_sync();
            let started = Instant::now();
            let answer = self.execute(command);
            applying += started.elapsed();
            if after_sync {
                self.pending.push((reply, answer));
            } else {
                self.metrics.shards[self.index].mailbox_depth.dec();
                let _ = reply.send(answer);
            }
        }
        if observe {
            self.metrics.shards[self.index].apply_seconds.observe(applying.as_secs_f64());
        }
        self.commit_pending(false);
        self.maintain();
    }

    /// Between rounds: once a second, look for periods that fell out of their
    /// board's `keep`; delete a bounded slice of expired data per call.
    fn maintain(&mut self) {
        let now = self.clock.now();
        if now == self.last_expiry_check {
            return;
        }
        if self.degraded.is_some() {
            // The sync thread holds the storage open while it has a batch;
            // if it does, `SyncDone` calls again once it is done.
            if self.syncs_in_flight == 0 {
                self.last_expiry_check = now;
                self.try_recover();
            }
            return;
        }
        let Some(shard) = &mut self.shard else { return };
        if shard.has_staged() {
            return; // a batch waits for the fsync in flight; look again after it
        }
        self.last_expiry_check = now;
        shard.set_time(now);
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

    /// Reopens the storage after a failure; on success writes resume.
    fn try_recover(&mut self) {
        let metrics = &self.metrics.shards[self.index];
        let reopened = match self.shard.take() {
            Some(shard) => shard.reopen(),
            None => Err(rankd_shards::ShardError::Corrupt("shard closed")),
        };
        self.generation += 1;
        match reopened {
            Ok(shard) => {
                tracing::warn!(shard = self.index, "storage reopened; accepting writes again");
                metrics.players.set(shard.players() as i64);
                self.shard = Some(shard);
                self.degraded = None;
                metrics.degraded.set(0);
            }
            Err(e) => {
                // Opening failed too: retry next second. Reopening from the
                // data dir needs no in-memory state, so nothing is lost.
                tracing::error!(shard = self.index, error = %e, "reopening storage failed; retrying");
            }
        }
    }

    /// Marks the shard degraded after a failed commit or fsync.
    fn degrade(&mut self, why: String) {
        let metrics = &self.metrics.shards[self.index];
        metrics.commit_errors.inc();
        metrics.degraded.set(1);
        tracing::error!(
            shard = self.index,
            error = %why,
            "commit failed; its writes are answered `internal` and writes stop until storage recovers"
        );
        self.degraded = Some(why);
    }

    /// Commits the staged writes as one batch and hands it with the pending
    /// answers to the sync thread. Unless `force`d (a read that scans storage
    /// needs the batch in the memtables), waits while an fsync is in flight:
    /// [`SyncDone`] calls again, and everything staged meanwhile joins the
    /// batch. Writing to the journal then would block on the fsync anyway.
    fn commit_pending(&mut self, force: bool) {
        if self.pending.is_empty() || (self.syncs_in_flight > 0 && !force) {
            return;
        }
        let metrics = &self.metrics.shards[self.index];
        let replies = std::mem::take(&mut self.pending);
        let Some(shard) = &mut self.shard else {
            answer_all(replies, Some("shard storage is closed; retrying"), metrics);
            return;
        };
        if !self.commit_delay.is_zero() && shard.has_staged() {
            std::thread::sleep(self.commit_delay);
        }
        let staged = shard.has_staged();
        let failure = match shard.commit_unsynced() {
            Ok(committed) => {
                if staged && self.metrics.hot_path {
                    metrics.commit_seconds.observe(committed.journal.as_secs_f64() + self.commit_delay.as_secs_f64());
                    metrics.players.set(shard.players() as i64);
                }
                if !committed.dense.is_empty() {
                    update_dense(&self.dense, shard.branching(), committed.dense);
                }
                let job = SyncJob {
                    handle: shard.durability_handle(),
                    generation: self.generation,
                    writes: committed.writes,
                    replies,
                };
                let unsent = match &self.sync_jobs {
                    Some(jobs) => jobs.send(job).err().map(|std::sync::mpsc::SendError(job)| job),
                    None => Some(job),
                };
                match unsent {
                    None => {
                        self.syncs_in_flight += 1;
                        None
                    }
                    // No sync thread (not started, or stopping): sync here.
                    Some(job) => make_durable(vec![job], metrics),
                }
            }
            Err(err) => {
                let why = format!("commit failed: {err}");
                answer_all(replies, Some(&why), metrics);
                Some(why)
            }
        };
        if let Some(why) = failure {
            self.degrade(why);
        }
    }

    fn execute(&mut self, command: Command) -> Result<Answer, Error> {
        let Some(shard) = &mut self.shard else {
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
            Command::CountBefore { tree, keys } => {
                Answer::Counts { before: shard.count_before(tree, &keys), total: shard.count(tree) }
            }
            Command::List { tree, ties, order, position, direction, limit } => {
                Answer::List(shard.list(tree, ties, order, &position, direction, limit)?)
            }
            Command::Shutdown => {
                shard.prepare_shutdown()?;
                Answer::Done
            }
        })
    }
}

impl Actor for ShardActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let players = self.shard.as_ref().map_or(0, Shard::players);
        self.metrics.shards[self.index].players.set(players as i64);
        let (jobs, queue) = std::sync::mpsc::channel();
        let (actor, metrics, index) = (actix::AsyncContext::address(ctx), self.metrics.clone(), self.index);
        match std::thread::Builder::new()
            .name(format!("rankd-sync-{index}"))
            .spawn(move || run_sync_thread(queue, actor, metrics, index))
        {
            Ok(thread) => {
                self.sync_jobs = Some(jobs);
                self.sync_thread = Some(thread);
            }
            // Commits then sync on the actor thread: slower, still correct.
            Err(e) => tracing::error!(shard = index, error = %e, "starting the sync thread failed; syncing inline"),
        }
        // Idle shards still drop expired periods; busy ones do it between rounds.
        actix::AsyncContext::run_interval(ctx, Duration::from_secs(1), |actor, _| actor.maintain());
    }

    fn stopping(&mut self, _: &mut Self::Context) -> actix::Running {
        // Never drop staged writes on the way out: commit them, let the sync
        // thread finish every batch (it answers them), then stop it.
        self.run_round();
        self.commit_pending(true);
        self.sync_jobs = None;
        if let Some(thread) = self.sync_thread.take() {
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
        } else if !self.flush_scheduled {
            self.flush_scheduled = true;
            actix::AsyncContext::notify(ctx, Flush);
        }
    }
}

impl Handler<Flush> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: Flush, _: &mut Self::Context) {
        self.flush_scheduled = false;
        if !self.queue.is_empty() {
            self.run_round();
        }
    }
}

impl Handler<SyncDone> for ShardActor {
    type Result = ();

    fn handle(&mut self, done: SyncDone, _: &mut Self::Context) {
        self.syncs_in_flight = self.syncs_in_flight.saturating_sub(done.jobs);
        if let Some(why) = done.failure {
            if self.degraded.is_none() {
                self.degrade(why);
            }
        }
        // What was staged during the fsync is the next batch.
        self.commit_pending(false);
        if self.degraded.is_some() && self.syncs_in_flight == 0 {
            self.maintain(); // a recovery may have waited for the sync thread
        }
    }
}

/// Applies a committed batch's changes of dense trees' score sets to the
/// engine-wide distinct-score indexes.
fn update_dense(registry: &DenseRegistry, branching: u32, changes: Vec<rankd_shards::DenseChange>) {
    let mut dense = registry.lock();
    for change in changes {
        // A new period of a dense board starts its index here.
        let index = match dense.entry(change.tree) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match DenseIndex::new(branching) {
                Ok(index) => e.insert(index),
                Err(_) => continue,
            },
        };
        if let Some(sk) = change.removed {
            index.remove(sk);
        }
        if let Some(sk) = change.added {
            index.add(sk, 1);
        }
    }
}

/// Makes `jobs` (batches of one storage opening, oldest first) durable with
/// one sync — syncing the journal covers every batch written before — then
/// answers them; returns why the sync failed, if it did.
fn make_durable(jobs: Vec<SyncJob>, metrics: &crate::metrics::ShardMetrics) -> Option<String> {
    let last = jobs.last()?;
    let failure = match last.handle.sync() {
        Ok(took) => {
            metrics.fsync_seconds.observe(took.as_secs_f64());
            metrics.writes_applied.inc_by(jobs.iter().map(|job| job.writes as u64).sum());
            None
        }
        Err(e) => Some(format!("commit failed: {e}")),
    };
    for job in jobs {
        // `job.handle` drops here: a reopen needs every handle gone.
        answer_all(job.replies, failure.as_deref(), metrics);
    }
    failure
}

/// Sends held answers and lowers the shard's queue depth by as many.
fn answer_all(replies: Vec<Held>, failure: Option<&str>, metrics: &crate::metrics::ShardMetrics) {
    metrics.mailbox_depth.sub(replies.len() as i64);
    for (reply, answer) in replies {
        let _ = reply.send(unless_failed(answer, failure));
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
}
