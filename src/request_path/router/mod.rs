//! The router actor: owns the board registry and the global arrival sequence,
//! hashes each player to a shard, and fans reads out to every shard.
//!
//! Placement: player `p` lives on shard `xxh3_64(p) % shards` (xxHash3, 64-bit,
//! seed 0, over the player's UTF-8 bytes) for every board. The hash is part
//! of the data-dir format: changing it would strand players.
//!
//! Every first message of a request is enqueued into the shards' mailboxes
//! synchronously while the router handles the request, so requests reach each
//! shard in the order the router received them; later rounds of multi-step
//! reads are sent from the reply future.

use std::collections::HashMap;
use std::sync::Arc;

use std::time::Instant;

use actix::{Actor, Context, Handler, Message, ResponseFuture};
use futures::future::try_join_all;
use rankd_shards::key::{list_position, list_position_of_tree_key, rank_key, score_key, tree_key};
use rankd_shards::{window, Board, BoardConfig, Direction, ListEntry, Lookups, Record, Ties, TreeId, Window};
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::protocol::{Op, Reply, View};
use crate::request_path::shard::{Answer, Command, DenseRegistry, Forward, ShardItem, ShardLink};
use rankd_client::{BoardInfo, Entry, OpKind, RankInfo};

/// The shard a player lives on. See the module docs; stable across versions.
pub fn shard_of(player: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(player.as_bytes()) % shards as u64) as usize
}

/// Asks the router to run a client's batch of operations, in order. The
/// connection sends everything it has decoded at once, so the router and
/// the shards handle a pipeline as a few messages, not one per request.
pub struct Dispatch {
    /// The ops, in the order sent.
    pub ops: Vec<Op>,
    /// Whether the batch is all its connection has in flight: its client
    /// waits for these answers alone (see [`IN_PLACE_MAX_BATCH`]).
    pub alone: bool,
}

/// The largest batch whose ranks may be answered in place, from the shards'
/// engines on this thread (see [`crate::request_path::shard::SharedShard`]). Only a batch
/// that is `alone` on its connection qualifies: then nothing sent before it
/// can still be queued for a shard, and its client is waiting on it, so the
/// two thread wake-ups saved are latency saved. A pipelining client keeps
/// queueing its ranks: they are spread over the shard threads, which more
/// cores serve (when a pipelining client's small batches were answered in
/// place too, all on this one thread, 8 × 64 pipelined ranks ran 8-10%
/// slower on 2 cores). Within the batch, a rank after a write is queued
/// too: that write is still in the `Outbox`.
pub const IN_PLACE_MAX_BATCH: usize = 4;

impl Message for Dispatch {
    type Result = Vec<Result<Reply, Error>>;
}

/// One shard's part of a `set_many`: entry positions, and the entries with
/// their arrival sequence.
#[derive(Default, Clone)]
struct ShardPart(Vec<usize>, Vec<(String, i64, u64)>);

/// What the router recovered from the shards at start-up.
pub struct RouterState {
    /// Boards by name.
    pub boards: Vec<Board>,
    /// Highest board id ever used.
    pub max_board_id: u64,
    /// Highest arrival sequence ever stored.
    pub max_seq: u64,
}

/// The router actor. See the module docs.
pub struct Router {
    shards: Arc<[ShardLink]>,
    metrics: Arc<Metrics>,
    boards: HashMap<String, Arc<Board>>,
    next_board_id: u64,
    next_seq: u64,
    dense: DenseRegistry,
    /// Decides which period a read of a periodic window targets.
    clock: Clock,
    /// Whether a lone rank may be answered in place (see
    /// [`IN_PLACE_MAX_BATCH`]); off only in tests of the queued paths.
    in_place_ranks: bool,
}

impl Actor for Router {
    type Context = Context<Self>;
}

type Pending = oneshot::Receiver<Result<Answer, Error>>;

/// The first-round shard commands of a client batch, gathered while the
/// router routes the batch and then sent as ONE message per shard: one
/// mailbox push and at most one wake-up of each shard thread per batch, not
/// per request. Commands keep their order within each shard.
struct Outbox {
    per_shard: Vec<Vec<ShardItem>>,
}

impl Outbox {
    fn new(shards: usize) -> Self {
        Self { per_shard: (0..shards).map(|_| Vec::new()).collect() }
    }

    fn ask(&mut self, shard: usize, command: Command) -> Pending {
        let (reply, answer) = oneshot::channel();
        self.per_shard[shard].push((command, reply));
        answer
    }

    /// Whether this batch holds nothing yet for any shard but `shard`. Then
    /// a command to `shard` may send on to the others itself (a rank's
    /// [`Forward`]) and still reach each of them after every earlier request
    /// of its connection: those of earlier batches were sent before this
    /// batch, and this one has none for them. (Later requests of the batch
    /// may land before it, as they may before a second round the router
    /// sends: a read concurrent with writes may reflect them.)
    fn holds_only_for(&self, shard: usize) -> bool {
        self.per_shard.iter().enumerate().all(|(i, items)| i == shard || items.is_empty())
    }

    fn ask_all(&mut self, command: impl Fn() -> Command) -> Vec<Pending> {
        (0..self.per_shard.len()).map(|i| self.ask(i, command())).collect()
    }

    fn send(self, links: &[ShardLink]) {
        for (link, items) in links.iter().zip(self.per_shard) {
            if !items.is_empty() {
                link.send(items);
            }
        }
    }
}

async fn answer(pending: Pending) -> Result<Answer, Error> {
    pending.await.map_err(|_| Error::Internal("shard stopped".into()))?
}

/// Counts before each key, summed over all shards, and the total.
async fn summed_counts(pending: Vec<Pending>, keys: usize) -> Result<(Vec<u64>, u64), Error> {
    let mut sums = vec![0u64; keys];
    let mut total = 0;
    for answers in try_join_all(pending.into_iter().map(answer)).await? {
        let (before, t) = answers.into_counts()?;
        sums.iter_mut().zip(before).for_each(|(s, b)| *s += b);
        total += t;
    }
    Ok((sums, total))
}

/// The context a multi-step read carries across awaits.
#[derive(Clone)]
struct Read {
    shards: Arc<[ShardLink]>,
    board: Arc<Board>,
    tree: TreeId,
    dense: DenseRegistry,
    /// Times each fan-out round of this read.
    fanout: Option<prometheus::Histogram>,
}

impl Read {
    fn ties(&self) -> Ties {
        self.board.config.ties
    }

    fn observe_round(&self, started: Instant) {
        if let Some(h) = &self.fanout {
            h.observe(started.elapsed().as_secs_f64());
        }
    }

    /// Counts before each key, summed over every shard, and the total.
    async fn counts(&self, keys: Vec<u128>) -> Result<(Vec<u64>, u64), Error> {
        self.counts_except(keys, None).await
    }

    /// [`Read::counts`] over every shard but `except` (a shard that already
    /// answered its part); no round at all when that leaves none.
    async fn counts_except(&self, keys: Vec<u128>, except: Option<usize>) -> Result<(Vec<u64>, u64), Error> {
        let pending: Vec<Pending> = (self.shards.iter().enumerate())
            .filter(|(i, _)| Some(*i) != except)
            .map(|(_, s)| s.ask(Command::CountBefore { tree: self.tree, keys: keys.clone() }))
            .collect();
        if pending.is_empty() {
            return Ok((vec![0; keys.len()], 0));
        }
        let started = Instant::now();
        let counts = summed_counts(pending, keys.len()).await;
        self.observe_round(started);
        counts
    }

    /// A rank answered in place from the shards' engines, or `None` when a
    /// shard's lock is taken (its actor is applying a command) or reading
    /// the record failed: then it is queued the usual way, which reports
    /// the failure. Either way, also the owner's record-cache lookups taken
    /// here, for the caller to count (a miss reads the record from storage
    /// here, as the shard would). Each shard's count is exact at the moment
    /// it is read, which is what the protocol asks of a rank concurrent
    /// with writes.
    fn rank_in_place(&self, owner: usize, player: &str) -> (Option<Reply>, Lookups) {
        let Some(mut engine) = self.shards[owner].engine.try_lock() else { return (None, Lookups::default()) };
        let Some(shard) = engine.as_mut() else { return (None, Lookups::default()) };
        let found = shard.get(self.tree, player);
        let lookups = shard.take_cache_lookups();
        let record = match found {
            Ok(Some(record)) => record,
            Ok(None) => return (Some(Reply::Rank(None)), lookups),
            Err(_) => return (None, lookups),
        };
        let key = record.rank_key(self.ties(), self.board.config.order);
        let own = (shard.count_before_key(self.tree, key), shard.count(self.tree));
        drop(engine);
        let summed = (self.shards.iter().enumerate().filter(|(i, _)| *i != owner)).try_fold(
            own,
            |(before, total), (_, link)| {
                let engine = link.engine.try_lock()?;
                let shard = engine.as_ref()?;
                Some((before + shard.count_before_key(self.tree, key), total + shard.count(self.tree)))
            },
        );
        (summed.map(|(before, total)| self.rank_reply(record, before, total)), lookups)
    }

    fn distinct_before(&self, score_key: u64) -> u64 {
        self.dense.lock().get(&self.tree).map_or(0, |d| d.distinct_before(score_key))
    }

    /// Ranks for list entries: one fan-out for the whole list (or none, for
    /// dense boards, whose ranks come from the distinct-score index).
    async fn ranked(&self, entries: Vec<ListEntry>) -> Result<Vec<Entry>, Error> {
        let order = self.board.config.order;
        let score_keys: Vec<u64> = entries.iter().map(|e| score_key(e.score, order)).collect();
        let ranks: Vec<u64> = if self.ties() == Ties::Dense {
            let dense = self.dense.lock();
            let index = dense.get(&self.tree);
            score_keys.iter().map(|&sk| 1 + index.map_or(0, |d| d.distinct_before(sk))).collect()
        } else {
            let keys: Vec<u128> =
                entries.iter().zip(&score_keys).map(|(e, &sk)| rank_key(self.ties(), sk, e.seq)).collect();
            self.counts(keys).await?.0.into_iter().map(|b| b + 1).collect()
        };
        Ok(entries.into_iter().zip(ranks).map(|(e, rank)| Entry { player: e.player, score: e.score, rank }).collect())
    }

    /// Lists from every shard, merged into list order.
    async fn merged(&self, position: Vec<u8>, direction: Direction, limit: usize) -> Result<Vec<ListEntry>, Error> {
        let started = Instant::now();
        let config = &self.board.config;
        let pending = self.shards.iter().map(|s| {
            s.ask(Command::List {
                tree: self.tree,
                ties: config.ties,
                order: config.order,
                position: position.clone(),
                direction,
                limit,
            })
        });
        let mut all = Vec::new();
        for list in try_join_all(pending.map(answer)).await? {
            all.extend(list.into_list()?);
        }
        self.observe_round(started);
        match direction {
            Direction::Forward => all.sort_unstable_by(|a, b| a.position.cmp(&b.position)),
            Direction::Backward => all.sort_unstable_by(|a, b| b.position.cmp(&a.position)),
        }
        all.truncate(limit);
        Ok(all)
    }

    /// The largest tree key `k` with fewer than or exactly `offset` players
    /// before it: the key of the player at 0-based position `offset`. Found by
    /// a 64-way search over the key space — about 22 fan-out rounds, however
    /// deep the offset — instead of reading `offset` entries per shard.
    async fn key_at(&self, offset: u64) -> Result<u128, Error> {
        let (mut lo, mut hi) = (0u128, u128::MAX);
        while lo < hi {
            let span = hi - lo;
            let pivots: Vec<u128> = if span <= 64 {
                (1..=span).map(|i| lo + i).collect()
            } else {
                let step = span / 64;
                (1..64).map(|i| lo + step * i).chain(std::iter::once(hi)).collect()
            };
            let (before, _) = self.counts(pivots.clone()).await?;
            match before.iter().rposition(|&b| b <= offset) {
                Some(i) => {
                    lo = pivots[i];
                    if let Some(next) = pivots.get(i + 1) {
                        hi = next - 1;
                    }
                }
                None => hi = pivots[0] - 1,
            }
        }
        Ok(lo)
    }

    async fn top(self, limit: usize, offset: u64) -> Result<Reply, Error> {
        if limit == 0 {
            return Ok(Reply::Entries(Vec::new()));
        }
        let (start, skip) = if offset == 0 {
            (Vec::new(), 0)
        } else {
            let (_, total) = self.counts(Vec::new()).await?;
            if offset >= total {
                return Ok(Reply::Entries(Vec::new()));
            }
            let key = self.key_at(offset).await?;
            let (before, _) = self.counts(vec![key]).await?;
            (list_position_of_tree_key(self.ties(), key), (offset - before[0]) as usize)
        };
        let mut entries = self.merged(start, Direction::Forward, skip + limit).await?;
        entries.drain(..skip.min(entries.len()));
        Ok(Reply::Entries(self.ranked(entries).await?))
    }

    async fn around(self, found: Pending, player: String, before: usize, after: usize) -> Result<Reply, Error> {
        let Some(record) = answer(found).await?.into_record()? else {
            return Ok(Reply::Entries(Vec::new()));
        };
        let sk = score_key(record.score, self.board.config.order);
        let position = list_position(self.ties(), sk, record.seq, &player);
        let (better, worse) = futures::try_join!(
            self.merged(position.clone(), Direction::Backward, before),
            self.merged(position, Direction::Forward, after + 1),
        )?;
        let entries = better.into_iter().rev().chain(worse).collect();
        Ok(Reply::Entries(self.ranked(entries).await?))
    }

    /// Finishes a rank whose first round went to the player's `owner` as
    /// [`Command::Rank`]: the owner already counted its own players, so only
    /// the other shards are asked (none, on one shard).
    async fn rank(self, owner: usize, found: Pending) -> Result<Reply, Error> {
        let (record, own_before, own_total) = answer(found).await?.into_ranked()?;
        let Some(record) = record else {
            return Ok(Reply::Rank(None));
        };
        let key = record.rank_key(self.ties(), self.board.config.order);
        let (theirs, total) = self.counts_except(vec![key], Some(owner)).await?;
        Ok(self.rank_reply(record, own_before + theirs[0], own_total + total))
    }

    /// Finishes a rank whose owner asked the other shards itself
    /// ([`Forward`]), their answers arriving on `theirs`.
    async fn rank_forwarded(self, found: Pending, theirs: Vec<Pending>) -> Result<Reply, Error> {
        // Theirs first: the owner answers after it has forwarded, so by the
        // time theirs are in, its answer is too, and awaiting it first would
        // wake this thread once for it and once more for theirs. Without a
        // record the owner drops their channels and its answer says why.
        let (started, fanned_out) = (Instant::now(), !theirs.is_empty());
        let counts = summed_counts(theirs, 1).await;
        let (record, own_before, own_total) = answer(found).await?.into_ranked()?;
        let Some(record) = record else {
            return Ok(Reply::Rank(None));
        };
        let (theirs, total) = counts?;
        if fanned_out {
            self.observe_round(started); // a round across shards; none on one shard
        }
        Ok(self.rank_reply(record, own_before + theirs[0], own_total + total))
    }

    /// A rank's reply from its record and the players before it and in
    /// total, summed over the shards.
    fn rank_reply(&self, record: Record, before: u64, count: u64) -> Reply {
        let sk = score_key(record.score, self.board.config.order);
        let rank = 1 + if self.ties() == Ties::Dense { self.distinct_before(sk) } else { before };
        Reply::Rank(Some(RankInfo { rank, score: record.score, count }))
    }

    fn rank_of_score(self, score: i64, outbox: &mut Outbox) -> ResponseFuture<Result<Reply, Error>> {
        let sk = score_key(score, self.board.config.order);
        if self.ties() == Ties::Dense {
            let rank = 1 + self.distinct_before(sk);
            return Box::pin(async move { Ok(Reply::Count(rank)) });
        }
        // Ordinal: a newcomer ranks after everyone already at the score.
        let key = match (self.ties(), sk.checked_add(1)) {
            (Ties::Ordinal, Some(next)) => tree_key(next, 0),
            (Ties::Ordinal, None) => u128::MAX,
            _ => tree_key(sk, 0),
        };
        let tree = self.tree;
        let (started, pending) = (Instant::now(), outbox.ask_all(|| Command::CountBefore { tree, keys: vec![key] }));
        Box::pin(async move {
            let (before, total) = summed_counts(pending, 1).await?;
            self.observe_round(started);
            let better = if key == u128::MAX { total } else { before[0] };
            Ok(Reply::Count(better + 1))
        })
    }
}

impl Router {
    /// A router over started shards, with the state they recovered.
    pub fn new(
        shards: Vec<ShardLink>,
        state: RouterState,
        dense: DenseRegistry,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        let boards = state.boards.into_iter().map(|b| (b.name.clone(), Arc::new(b))).collect();
        Self {
            shards: shards.into(),
            metrics,
            boards,
            next_board_id: state.max_board_id + 1,
            next_seq: state.max_seq + 1,
            dense,
            clock,
            in_place_ranks: true,
        }
    }

    /// Queues every rank for the shards instead (`--debug-queue-ranks`).
    #[cfg(feature = "test-hooks")]
    pub fn queue_all_ranks(mut self) -> Self {
        self.in_place_ranks = false;
        self
    }

    fn new_board(&mut self, name: &str, config: BoardConfig) -> Arc<Board> {
        let board = Arc::new(Board { id: self.next_board_id, name: name.to_string(), config });
        self.next_board_id += 1;
        self.boards.insert(name.to_string(), board.clone());
        board
    }

    /// The board a write goes to, created with the default config if new.
    fn board_for_write(&mut self, name: &str) -> Arc<Board> {
        match self.boards.get(name) {
            Some(board) => board.clone(),
            None => self.new_board(name, BoardConfig::default()),
        }
    }

    fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Context for a read of `name`, or `None` if the board does not exist
    /// (reads of a missing board answer as for an empty board).
    fn read(&self, op: OpKind, name: &str, view: View) -> Result<Option<Read>, Error> {
        let Some(board) = self.boards.get(name) else {
            // A missing board reads as empty, but the view must still be one
            // some board could have.
            if view.window == Some(Window::All) && view.period != 0 {
                return Err(Error::BadRequest("the `all` window has only period 0".into()));
            }
            return Ok(None);
        };
        let window = view.window.unwrap_or(board.config.windows[0]);
        if !board.config.windows.contains(&window) {
            return Err(Error::BadRequest(format!("board `{name}` has no `{window}` window")));
        }
        let oldest = if window == Window::All { 0 } else { -i64::from(board.config.keep) };
        if view.period < oldest {
            return Err(Error::BadRequest(format!(
                "period {} is out of range: board `{name}` keeps `{window}` periods 0 to {oldest}",
                view.period
            )));
        }
        let tree = window::tree_at(board, window, self.clock.now(), view.period)
            .ok_or_else(|| Error::BadRequest("period before the epoch".into()))?;
        Ok(Some(Read {
            shards: self.shards.clone(),
            board: board.clone(),
            tree,
            dense: self.dense.clone(),
            fanout: self.metrics.fanout(op).cloned(),
        }))
    }

    fn owner(&self, player: &str) -> usize {
        shard_of(player, self.shards.len())
    }

    /// A [`Forward`] to every shard but `owner`, and where their counts will
    /// arrive.
    fn forward_to_all_but(&self, owner: usize) -> (Forward, Vec<Pending>) {
        let (to, theirs) = (self.shards.iter().enumerate())
            .filter(|(i, _)| *i != owner)
            .map(|(_, link)| {
                let (reply, answer) = oneshot::channel();
                ((link.clone(), reply), answer)
            })
            .unzip();
        (Forward(to), theirs)
    }

    /// Routes one op: its first-round shard commands go into `outbox`, and
    /// what it returns says how the op's reply will come. A rank may be
    /// answered `in_place` (see [`IN_PLACE_MAX_BATCH`]).
    fn dispatch(&mut self, op: Op, outbox: &mut Outbox, in_place: bool) -> Routed {
        let ready = Routed::Ready;
        match op {
            Op::Ping => ready(Ok(Reply::Text("pong"))),
            Op::Auth { .. } => ready(Ok(Reply::Bool(true))),
            Op::CreateBoard { board, config } => {
                if let Some(existing) = self.boards.get(&board) {
                    return ready(if existing.config == config {
                        Ok(Reply::Bool(false))
                    } else {
                        Err(Error::Conflict(format!("board `{board}` exists with another config")))
                    });
                }
                let board = self.new_board(&board, config);
                let pending = outbox.ask_all(|| Command::EnsureBoard { board: board.clone() });
                Routed::Later(Box::pin(async move {
                    try_join_all(pending.into_iter().map(answer)).await?;
                    Ok(Reply::Bool(true))
                }))
            }
            Op::DropBoard { board } => {
                let Some(board) = self.boards.remove(&board) else { return ready(Ok(Reply::Bool(false))) };
                let id = board.id;
                let pending = outbox.ask_all(|| Command::DropBoard { board_id: id });
                let dense = self.dense.clone();
                Routed::Later(Box::pin(async move {
                    try_join_all(pending.into_iter().map(answer)).await?;
                    dense.lock().retain(|tree, _| tree.board != id);
                    Ok(Reply::Bool(true))
                }))
            }
            Op::Boards => {
                let now = self.clock.now();
                let mut boards: Vec<Arc<Board>> = self.boards.values().cloned().collect();
                boards.sort_by(|a, b| a.name.cmp(&b.name));
                let counts: Vec<Vec<Pending>> = boards
                    .iter()
                    .map(|b| {
                        let tree = window::current_trees(b, now)[0];
                        outbox.ask_all(|| Command::CountBefore { tree, keys: Vec::new() })
                    })
                    .collect();
                let (started, fanout) = (Instant::now(), self.metrics.fanout(OpKind::Boards).cloned());
                Routed::Later(Box::pin(async move {
                    let mut out = Vec::with_capacity(boards.len());
                    for (board, pending) in boards.iter().zip(counts) {
                        let (_, count) = summed_counts(pending, 0).await?;
                        out.push(board_info(board, count));
                    }
                    if let Some(h) = fanout {
                        h.observe(started.elapsed().as_secs_f64());
                    }
                    Ok(Reply::Boards(out))
                }))
            }
            Op::Set { board, player, score, mode } => {
                let board = self.board_for_write(&board);
                let seq = self.next_seq();
                Routed::Score(outbox.ask(self.owner(&player), Command::Write { board, player, score, mode, seq }))
            }
            Op::SetMany { board, entries, mode } => {
                let board = self.board_for_write(&board);
                let n = self.shards.len();
                let mut per_shard: Vec<ShardPart> = vec![ShardPart::default(); n];
                for (i, (player, score)) in entries.into_iter().enumerate() {
                    let seq = self.next_seq();
                    let slot = &mut per_shard[shard_of(&player, n)];
                    slot.0.push(i);
                    slot.1.push((player, score, seq));
                }
                let total: usize = per_shard.iter().map(|part| part.0.len()).sum();
                let mut positions = Vec::new();
                let mut pending = Vec::new();
                for (shard, ShardPart(idx, entries)) in per_shard.into_iter().enumerate() {
                    if !entries.is_empty() {
                        positions.push(idx);
                        pending.push(outbox.ask(shard, Command::WriteMany { board: board.clone(), entries, mode }));
                    }
                }
                Routed::Later(Box::pin(async move {
                    let mut out = vec![0i64; total];
                    for (idx, answers) in
                        positions.into_iter().zip(try_join_all(pending.into_iter().map(answer)).await?)
                    {
                        for (i, score) in idx.into_iter().zip(answers.into_scores()?) {
                            out[i] = score;
                        }
                    }
                    Ok(Reply::Scores(out))
                }))
            }
            Op::Get { board, player, view } => match self.read(OpKind::Get, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::MaybeScore(None))),
                Ok(Some(read)) => {
                    let pending = outbox.ask(self.owner(&player), Command::Get { tree: read.tree, player });
                    Routed::Later(Box::pin(async move {
                        Ok(Reply::MaybeScore(answer(pending).await?.into_record()?.map(|r| r.score)))
                    }))
                }
            },
            Op::Remove { board, player } => {
                let Some(board) = self.boards.get(&board).cloned() else { return ready(Ok(Reply::Bool(false))) };
                let pending = outbox.ask(self.owner(&player), Command::Remove { board, player });
                Routed::Later(Box::pin(async move { Ok(Reply::Bool(answer(pending).await?.into_bool()?)) }))
            }
            Op::Count { board, view } => match self.read(OpKind::Count, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Count(0))),
                Ok(Some(read)) => {
                    let tree = read.tree;
                    let (started, pending) =
                        (Instant::now(), outbox.ask_all(|| Command::CountBefore { tree, keys: Vec::new() }));
                    Routed::Later(Box::pin(async move {
                        let count = summed_counts(pending, 0).await?.1;
                        read.observe_round(started);
                        Ok(Reply::Count(count))
                    }))
                }
            },
            Op::Rank { board, player, view } => match self.read(OpKind::Rank, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Rank(None))),
                Ok(Some(read)) => {
                    let owner = self.owner(&player);
                    if in_place {
                        let (reply, lookups) = read.rank_in_place(owner, &player);
                        if self.metrics.hot_path {
                            self.metrics.shards[owner].count_lookups(lookups);
                            self.metrics.ranks_in_place.inc_by(u64::from(reply.is_some()));
                        }
                        if let Some(reply) = reply {
                            return ready(Ok(reply));
                        }
                    }
                    let (tree, ties, order) = (read.tree, read.ties(), read.board.config.order);
                    let forwarding = outbox.holds_only_for(owner);
                    let (forward, theirs) =
                        if forwarding { self.forward_to_all_but(owner) } else { (Forward::default(), Vec::new()) };
                    let found = outbox.ask(owner, Command::Rank { tree, player, ties, order, forward });
                    Routed::Later(if forwarding {
                        Box::pin(read.rank_forwarded(found, theirs))
                    } else {
                        Box::pin(read.rank(owner, found))
                    })
                }
            },
            Op::RankOfScore { board, score, view } => match self.read(OpKind::RankOfScore, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Count(1))),
                Ok(Some(read)) => Routed::Later(read.rank_of_score(score, outbox)),
            },
            Op::Top { board, limit, offset, view } => match self.read(OpKind::Top, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Entries(Vec::new()))),
                Ok(Some(read)) => Routed::Later(Box::pin(read.top(limit, offset))),
            },
            Op::Around { board, player, before, after, view } => match self.read(OpKind::Around, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Entries(Vec::new()))),
                Ok(Some(read)) => {
                    let found =
                        outbox.ask(self.owner(&player), Command::Get { tree: read.tree, player: player.clone() });
                    Routed::Later(Box::pin(read.around(found, player, before, after)))
                }
            },
        }
    }
}

impl Handler<Dispatch> for Router {
    type Result = ResponseFuture<Vec<Result<Reply, Error>>>;

    fn handle(&mut self, Dispatch { ops, alone }: Dispatch, _: &mut Self::Context) -> Self::Result {
        let mut outbox = Outbox::new(self.shards.len());
        let mut in_place = self.in_place_ranks && alone && ops.len() <= IN_PLACE_MAX_BATCH;
        let routed: Vec<Routed> = (ops.into_iter())
            .map(|op| {
                let may = in_place;
                in_place &= !op.is_write();
                self.dispatch(op, &mut outbox, may)
            })
            .collect();
        outbox.send(&self.shards);
        Box::pin(async move {
            let mut routed = routed;
            // The ops' own futures are polled together (a multi-step read
            // sends its next round only when polled), in place.
            let own = routed.iter_mut().filter_map(|routed| match routed {
                Routed::Later(future) => Some(future),
                _ => None,
            });
            let mut later = futures::future::join_all(own).await.into_iter();
            let mut replies = Vec::with_capacity(routed.len());
            for routed in routed {
                replies.push(match routed {
                    Routed::Ready(reply) => reply,
                    Routed::Score(pending) => new_score(pending).await,
                    Routed::Later(_) => {
                        later.next().unwrap_or_else(|| Err(Error::Internal("a reply went missing".into())))
                    }
                });
            }
            replies
        })
    }
}

/// How routing left one op of a batch.
enum Routed {
    /// Answered while routing, without a shard.
    Ready(Result<Reply, Error>),
    /// A `set`: its shard's one answer, awaited in place. Sets make up
    /// write-heavy batches, and a future of their own each (boxed, then
    /// tracked by `join_all`) was two allocations and a task per request.
    Score(Pending),
    /// Anything more: a future of its own.
    Later(ResponseFuture<Result<Reply, Error>>),
}

/// A `set`'s reply: the score it left.
async fn new_score(pending: Pending) -> Result<Reply, Error> {
    Ok(Reply::Score(answer(pending).await?.into_score()?))
}

fn board_info(board: &Board, count: u64) -> BoardInfo {
    BoardInfo {
        board: board.name.clone(),
        order: board.config.order.to_string(),
        ties: board.config.ties.to_string(),
        windows: board.config.windows.iter().map(ToString::to_string).collect(),
        keep: board.config.keep,
        count,
    }
}
