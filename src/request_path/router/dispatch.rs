//! One op routed: answered here, or turned into its shards' first-round
//! commands and the future that finishes it.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::future::try_join_all;
use rankd_client::OpKind;
use rankd_shards::{incrs_stay_in_range, window, Amount, Board, BoardConfig, SharedBoard, Wid};

use super::boards::{Boards, Created};
use super::reads::{summed_counts, Read};
use super::{shard_of, Outbox, ReplyFuture, Router};
use crate::error::Error;
use crate::protocol::response::{BoardListing, FieldListing};
use crate::protocol::score::{self, ScoreInput};
use crate::protocol::{Op, Reply, View};
use crate::request_path::shard::command::{answer, reply};
use crate::request_path::shard::{Command, Forward, Pending, Written};
use crate::watches::WatchHub;

/// How routing left one op of a batch.
pub enum Routed {
    /// Answered while routing, without a shard.
    Ready(Result<Reply, Error>),
    /// A `set`: its shard's one answer, awaited in place. Sets make up
    /// write-heavy batches, and a future of their own each (boxed, then
    /// tracked by `join_all`) was two allocations and a task per request.
    Score(Pending<Written<i64>>),
    /// Anything more: a future of its own.
    Later(ReplyFuture),
}

/// A routed batch's replies, in order: all of them at once when routing
/// answered every op (lone ranks answered in place, refusals), so a
/// connection writes them without a future in between; else their future.
pub enum BatchReplies<F> {
    /// Every reply, known when the batch was routed.
    Ready(Vec<Result<Reply, Error>>),
    /// The replies once the shards have answered.
    Later(F),
}

impl<F: Future<Output = Vec<Result<Reply, Error>>>> BatchReplies<F> {
    /// The replies, however they come.
    pub async fn all(self) -> Vec<Result<Reply, Error>> {
        match self {
            Self::Ready(replies) => replies,
            Self::Later(replies) => replies.await,
        }
    }
}

/// The replies of a routed batch: ready if every op is.
pub fn batch_replies(routed: Vec<Routed>) -> BatchReplies<impl Future<Output = Vec<Result<Reply, Error>>>> {
    if routed.iter().all(|routed| matches!(routed, Routed::Ready(_))) {
        let ready = routed.into_iter().filter_map(|routed| match routed {
            Routed::Ready(reply) => Some(reply),
            Routed::Score(_) | Routed::Later(_) => None,
        });
        return BatchReplies::Ready(ready.collect());
    }
    BatchReplies::Later(replies(routed))
}

/// The replies of a routed batch, in order.
async fn replies(mut routed: Vec<Routed>) -> Vec<Result<Reply, Error>> {
    // The ops' own futures are polled together (a multi-step read sends its
    // next round only when polled), in place.
    let own = routed.iter_mut().filter_map(|routed| match routed {
        Routed::Later(future) => Some(future),
        _ => None,
    });
    let mut later = futures::future::join_all(own).await.into_iter();
    let mut replies = Vec::with_capacity(routed.len());
    for routed in routed {
        replies.push(match routed {
            Routed::Ready(reply) => reply,
            Routed::Score(pending) => answer(pending).await.map(|w| marked(Reply::Score, w)),
            Routed::Later(_) => later.next().unwrap_or_else(|| Err(Error::Internal("a reply went missing".into()))),
        });
    }
    replies
}

impl Router {
    /// Context for a read of `name` at `view`, or `None` if the board does
    /// not exist (reads of a missing board answer as for an empty board).
    fn read(&self, boards: &Boards, op: OpKind, name: &str, view: View) -> Result<Option<Read>, Error> {
        let Some((board, tree)) = boards.view(name, view, self.clock.now())? else { return Ok(None) };
        Ok(Some(Read {
            shards: self.shards.clone(),
            board,
            tree,
            dense: self.dense.clone(),
            fanout: self.metrics.fanout(op).cloned(),
        }))
    }

    fn owner(&self, player: &str) -> usize {
        shard_of(player, self.shards.len())
    }

    /// A [`Forward`] to every shard but `owner`, and where their counts
    /// will arrive.
    fn forward_to_all_but(&self, owner: usize) -> (Forward, Vec<Pending<crate::request_path::shard::Counts>>) {
        let (to, theirs) = (self.shards.iter().enumerate())
            .filter(|(i, _)| *i != owner)
            .map(|(_, link)| {
                let (sender, pending) = reply();
                ((link.clone(), sender), pending)
            })
            .unzip();
        (Forward(to), theirs)
    }

    /// Routes one op: its first-round shard commands go into `outbox`, and
    /// what it returns says how the op's reply will come. A rank may be
    /// answered `in_place` (see [`super::IN_PLACE_MAX_BATCH`]).
    pub(super) fn dispatch(&self, boards: &mut Boards, op: Op, outbox: &mut Outbox, in_place: bool) -> Routed {
        // A write to a watched board tells the watches once acknowledged.
        let watched = match &op {
            Op::Set { board, .. } | Op::SetMany { board, .. } | Op::Remove { board, .. } => {
                self.watches.is_watched(board).then(|| board.clone())
            }
            _ => None,
        };
        // A board with fields shows its packed scores as maps.
        let composite = op.board().and_then(|name| boards.get(name)).filter(|b| b.config.has_fields()).cloned();
        let scored = Scored(composite.as_deref().map(|board| &*board.config));
        let routed = presented(self.route(boards, op, outbox, in_place, scored), composite);
        match watched {
            None => routed,
            Some(board) => noticed(routed, self.watches.clone(), board),
        }
    }

    /// A lone rank, in place if it can be (as [`Router::dispatch`] with
    /// `in_place`), the registry held only while its board is found:
    /// reading the engines, and queueing the rank when that fails, happen
    /// after it is let go.
    pub(super) fn rank_unlocked(&self, board: &str, player: String, view: View, outbox: &mut Outbox) -> Routed {
        let read = self.read(&self.boards.lock(), OpKind::Rank, board, view);
        match read {
            Err(e) => Routed::Ready(Err(e)),
            Ok(None) => Routed::Ready(Ok(Reply::Rank(None))),
            Ok(Some(read)) => {
                // A board with fields shows its packed scores as maps.
                let composite = read.board.config.has_fields().then(|| read.board.clone());
                presented(self.rank(read, player, outbox, true), composite)
            }
        }
    }

    fn route(&self, boards: &mut Boards, op: Op, outbox: &mut Outbox, in_place: bool, scored: Scored) -> Routed {
        let ready = Routed::Ready;
        match op {
            Op::Ping => ready(Ok(Reply::Text("pong"))),
            // Answered by the connection, which knows its roles and watches.
            Op::Auth { .. } | Op::Watch(_) | Op::Unwatch { .. } | Op::Backup => {
                ready(Err(Error::Internal(format!("`{}` reached the router", op.kind()))))
            }
            Op::CreateBoard { board, config } => match boards.create(&board, config) {
                Err(e) => ready(Err(e)),
                Ok(Created::Exists) => ready(Ok(Reply::Bool(false))),
                Ok(Created::New(board)) => {
                    let pending = outbox.ask_all(|reply| Command::EnsureBoard { board: board.clone(), reply });
                    Routed::Later(Box::pin(async move {
                        try_join_all(pending.into_iter().map(answer)).await?;
                        Ok(Reply::Bool(true))
                    }))
                }
            },
            Op::DropBoard { board } => {
                let Some(board) = boards.remove(&board) else { return ready(Ok(Reply::Bool(false))) };
                let board_id = board.id;
                // From here reads see no board, which the drop's answer
                // has not acknowledged: watches must not push it.
                self.watches.dropping(&board.name);
                let pending = outbox.ask_all(|reply| Command::DropBoard { board_id, reply });
                let (dense, watches, name) = (self.dense.clone(), self.watches.clone(), board.name.clone());
                // The drop's end is awaited on a task of its own: a client
                // that leaves meanwhile must not leave its watches withheld
                // or its dense index held.
                let (ended, end) = tokio::sync::oneshot::channel();
                actix::spawn(async move {
                    let result = try_join_all(pending.into_iter().map(answer)).await;
                    match &result {
                        Ok(_) => {
                            dense.forget_board(board_id);
                            watches.dropped(&name);
                        }
                        Err(_) => watches.drop_failed(&name),
                    }
                    let _ = ended.send(result.map(|_| Reply::Bool(true)));
                });
                Routed::Later(Box::pin(async move {
                    end.await.unwrap_or_else(|_| Err(Error::Internal("the drop's task stopped".into())))
                }))
            }
            Op::Boards { prefix, after, limit } => {
                let now = self.clock.now();
                let boards = boards.page(&prefix, after.as_deref(), limit);
                let counts: Vec<Vec<Pending<_>>> = boards
                    .iter()
                    .map(|b| {
                        let tree = window::current_trees(b, now)[0];
                        outbox.ask_all(|reply| Command::CountBefore { tree, keys: Vec::new(), reply })
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
            Op::Set { board, player, score, mode, wid } => {
                let amount = match score::amount(scored.config(), score, mode) {
                    Ok(amount) => amount,
                    Err(e) => return ready(Err(e)),
                };
                let board = boards.for_write(&board);
                let seq = boards.next_seq();
                let owner = self.owner(&player);
                let (reply, pending) = reply();
                let write = Command::Write { board, player, amount, mode, seq, wid, reply };
                // Nothing of the batch is queued before it: it may go in place.
                let unqueued = in_place && outbox.is_empty();
                let staged = if unqueued { self.shards[owner].try_write(write) } else { Err(write) };
                match staged {
                    Ok(()) => self.metrics.writes_in_place.inc(),
                    Err(write) => outbox.push(owner, write),
                }
                Routed::Score(pending)
            }
            Op::SetMany { board, entries, mode, wid } => match amounts(scored.config(), entries, mode) {
                Ok(amounts) => self.set_many(boards, board, amounts, mode, wid, outbox),
                Err(e) => ready(Err(e)),
            },
            Op::Get { board, player, view } => match self.read(boards, OpKind::Get, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::MaybeScore(None))),
                Ok(Some(read)) => {
                    let tree = read.tree;
                    let pending = outbox.ask(self.owner(&player), |reply| Command::Get { tree, player, reply });
                    Routed::Later(Box::pin(async move {
                        Ok(Reply::MaybeScore(answer(pending).await?.map(|record| record.score)))
                    }))
                }
            },
            Op::Remove { board, player, wid } => {
                let Some(board) = boards.get(&board).cloned() else { return ready(Ok(Reply::Bool(false))) };
                let pending = outbox.ask(self.owner(&player), |reply| Command::Remove { board, player, wid, reply });
                Routed::Later(Box::pin(async move { answer(pending).await.map(|w| marked(Reply::Bool, w)) }))
            }
            Op::Count { board, view } => match self.read(boards, OpKind::Count, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Count(0))),
                Ok(Some(read)) => {
                    let tree = read.tree;
                    let started = Instant::now();
                    let pending = outbox.ask_all(|reply| Command::CountBefore { tree, keys: Vec::new(), reply });
                    Routed::Later(Box::pin(async move {
                        let count = summed_counts(pending, 0).await?.1;
                        read.observe_round(started);
                        Ok(Reply::Count(count))
                    }))
                }
            },
            Op::Rank { board, player, view } => match self.read(boards, OpKind::Rank, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Rank(None))),
                Ok(Some(read)) => self.rank(read, player, outbox, in_place),
            },
            Op::RankOfScore { board, score, view } => {
                let score = match score::whole(scored.config(), score) {
                    Ok(score) => score,
                    Err(e) => return ready(Err(e)),
                };
                match self.read(boards, OpKind::RankOfScore, &board, view) {
                    Err(e) => ready(Err(e)),
                    Ok(None) => ready(Ok(Reply::Count(1))),
                    Ok(Some(read)) => Routed::Later(read.rank_of_score(score, outbox)),
                }
            }
            Op::ApproxRank { board, player, view } => match self.read(boards, OpKind::Rank, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::ApproxRank(None))),
                Ok(Some(read)) => self.approx_rank(read, player, outbox, in_place),
            },
            Op::ApproxRankOfScore { board, score, view } => {
                let score = match score::whole(scored.config(), score) {
                    Ok(score) => score,
                    Err(e) => return ready(Err(e)),
                };
                match self.read(boards, OpKind::RankOfScore, &board, view) {
                    Err(e) => ready(Err(e)),
                    Ok(None) => {
                        ready(Ok(Reply::ApproxRankOfScore(rankd_client::ApproxRankOfScore { rank: 1, error: 0 })))
                    }
                    Ok(Some(read)) => self.approx_rank_of_score(read, score),
                }
            }
            Op::Top { board, limit, offset, view } => match self.read(boards, OpKind::Top, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Entries(Vec::new()))),
                Ok(Some(read)) => Routed::Later(Box::pin(read.top(limit, offset))),
            },
            Op::Ranks { board, players, view } => match self.read(boards, OpKind::Ranks, &board, view) {
                Err(e) => ready(Err(e)),
                Ok(None) => ready(Ok(Reply::Entries(Vec::new()))),
                Ok(Some(read)) => {
                    // Each player once, found on its own shard: one command
                    // per player, one mailbox message per shard.
                    let mut players = players;
                    players.sort_unstable();
                    players.dedup();
                    let tree = read.tree;
                    let found: Vec<_> = (players.iter())
                        .map(|player| {
                            let name = player.clone();
                            outbox.ask(self.owner(player), |reply| Command::Get { tree, player: name, reply })
                        })
                        .collect();
                    Routed::Later(Box::pin(read.ranks(players, found)))
                }
            },
            Op::Around { board, player, before, after, view } => {
                match self.read(boards, OpKind::Around, &board, view) {
                    Err(e) => ready(Err(e)),
                    Ok(None) => ready(Ok(Reply::Entries(Vec::new()))),
                    Ok(Some(read)) => {
                        let (tree, name) = (read.tree, player.clone());
                        let found = outbox.ask(self.owner(&player), |reply| Command::Get { tree, player: name, reply });
                        Routed::Later(Box::pin(read.around(found, player, before, after)))
                    }
                }
            }
        }
    }

    /// `set_many`: each shard gets its players' entries, all or none. With
    /// a `wid`, each shard records its own part: a retry after a crash that
    /// kept some parts applies only the others. It is a replay (`dup`) when
    /// every part was.
    fn set_many(
        &self,
        boards: &mut Boards,
        board: String,
        amounts: Vec<(String, Amount)>,
        mode: rankd_shards::Mode,
        wid: Option<Wid>,
        outbox: &mut Outbox,
    ) -> Routed {
        // Neither an empty write nor a refused one may create the board in
        // the registry alone: no shard would store it.
        if amounts.is_empty() {
            return Routed::Ready(Ok(marked(Reply::Scores, Written { value: Vec::new(), dup: false })));
        }
        if mode == rankd_shards::Mode::Incr && boards.get(&board).is_none() {
            // A new board holds no scores: only the request's own repeats
            // of a player can overflow.
            let entries = amounts.iter().map(|(player, amount)| (player.as_str(), *amount));
            if let Err(error) = incrs_stay_in_range(&BoardConfig::default(), entries, |_| Ok(None)) {
                return Routed::Ready(Err(error.into()));
            }
        }
        let board = boards.for_write(&board);
        let n = self.shards.len();
        let mut per_shard: Vec<ShardPart> = vec![ShardPart::default(); n];
        let total = amounts.len();
        for (i, (player, amount)) in amounts.into_iter().enumerate() {
            let seq = boards.next_seq();
            let part = &mut per_shard[shard_of(&player, n)];
            part.positions.push(i);
            part.entries.push((player, amount, seq));
        }
        if mode == rankd_shards::Mode::Incr && per_shard.iter().filter(|part| !part.entries.is_empty()).count() > 1 {
            if let Err(error) = self.check_incr_everywhere(&board, &per_shard, wid.as_ref(), outbox) {
                return Routed::Ready(Err(error));
            }
        }
        let mut positions = Vec::new();
        let mut pending = Vec::new();
        for (shard, ShardPart { positions: idx, entries }) in per_shard.into_iter().enumerate() {
            if !entries.is_empty() {
                positions.push(idx);
                let (board, wid) = (board.clone(), wid.clone());
                pending.push(outbox.ask(shard, |reply| Command::WriteMany { board, entries, mode, wid, reply }));
            }
        }
        Routed::Later(Box::pin(async move {
            let mut out = vec![0i64; total];
            let mut dup = true;
            for (idx, part) in positions.into_iter().zip(try_join_all(pending.into_iter().map(answer)).await?) {
                dup &= part.dup;
                for (i, score) in idx.into_iter().zip(part.value) {
                    out[i] = score;
                }
            }
            Ok(marked(Reply::Scores, Written { value: out, dup: dup && total > 0 }))
        }))
    }

    /// Before a `set_many` of `incr`s spanning shards: asks every shard
    /// whether its part stays in range, and waits. Each shard applies its
    /// part all or none, but an overflow on one must leave the others
    /// unwritten too ("a `bad_request` changes nothing"). The wait blocks
    /// this I/O thread while it holds the board registry, so no router can
    /// queue a write between these checks and the writes: rare (only this
    /// op), and as short as a shard round.
    fn check_incr_everywhere(
        &self,
        board: &SharedBoard,
        parts: &[ShardPart],
        wid: Option<&Wid>,
        outbox: &mut Outbox,
    ) -> Result<(), Error> {
        // Earlier requests of this batch first, as the writes will be.
        outbox.flush(&self.shards);
        let checks: Vec<_> = (parts.iter().zip(self.shards.iter()))
            .filter(|(part, _)| !part.entries.is_empty())
            .map(|(part, link)| {
                let entries = part.entries.iter().map(|(player, amount, _)| (player.clone(), *amount)).collect();
                link.ask(|reply| Command::CheckIncr { board: board.clone(), entries, wid: wid.cloned(), reply })
            })
            .collect();
        // Unconstrained: the replies must not spend this task's tokio budget;
        // once spent, a reply's wake-up would be deferred to this very
        // thread's scheduler, which is blocked here.
        futures::executor::block_on(tokio::task::unconstrained(try_join_all(checks.into_iter().map(answer)))).map(drop)
    }

    /// `rank`: in place when allowed and every shard's lock is free; else
    /// to the owner, who forwards to the other shards when the batch holds
    /// nothing else for them, or else the router asks them after.
    fn rank(&self, read: Read, player: String, outbox: &mut Outbox, in_place: bool) -> Routed {
        let owner = self.owner(&player);
        if in_place {
            let (reply, lookups) = read.rank_in_place(owner, &player);
            if self.metrics.hot_path {
                self.metrics.shards[owner].count_lookups(lookups);
                self.metrics.ranks_in_place.inc_by(u64::from(reply.is_some()));
            }
            if let Some(reply) = reply {
                return Routed::Ready(Ok(reply));
            }
        }
        let (tree, ties, order) = (read.tree, read.ties(), read.board.config.order);
        let forwarding = outbox.holds_only_for(owner);
        let (forward, theirs) =
            if forwarding { self.forward_to_all_but(owner) } else { (Forward::default(), Vec::new()) };
        let found = outbox.ask(owner, |reply| Command::Rank { tree, player, ties, order, forward, reply });
        Routed::Later(if forwarding {
            Box::pin(read.rank_forwarded(found, theirs))
        } else {
            Box::pin(read.rank(owner, found))
        })
    }
}

/// One shard's part of a `set_many`.
#[derive(Default, Clone)]
struct ShardPart {
    /// The entries' positions in the request.
    positions: Vec<usize>,
    /// The entries, with their arrival sequence.
    entries: Vec<(String, Amount, u64)>,
}

/// A `set_many`'s entries as the engine takes them, or the first entry's
/// refusal.
fn amounts(
    config: &BoardConfig,
    entries: Vec<(String, ScoreInput)>,
    mode: rankd_shards::Mode,
) -> Result<Vec<(String, Amount)>, Error> {
    (entries.into_iter().enumerate())
        .map(|(i, (player, score))| {
            let amount =
                score::amount(config, score, mode).map_err(|e| Error::BadRequest(format!("entries[{i}]: {e}")))?;
            Ok((player, amount))
        })
        .collect()
}

/// The config an op's scores are read under: its board's when that board
/// has fields (found once per op, in [`Router::dispatch`]), else a plain
/// one (a board that does not exist yet is created plain by its first
/// write, and reads as an empty plain board).
#[derive(Clone, Copy)]
struct Scored<'c>(Option<&'c BoardConfig>);

impl<'c> Scored<'c> {
    fn config(self) -> &'c BoardConfig {
        static PLAIN: std::sync::OnceLock<BoardConfig> = std::sync::OnceLock::new();
        self.0.unwrap_or_else(|| PLAIN.get_or_init(BoardConfig::default))
    }
}

/// An op's reply; on a board with fields (`composite`), its packed scores
/// shown as maps.
fn presented(routed: Routed, composite: Option<SharedBoard>) -> Routed {
    let Some(board) = composite else { return routed };
    match routed {
        Routed::Ready(reply) => Routed::Ready(reply.map(|reply| score::present(reply, &board))),
        Routed::Score(pending) => Routed::Later(Box::pin(async move {
            answer(pending).await.map(|w| score::present(marked(Reply::Score, w), &board))
        })),
        Routed::Later(reply) => Routed::Later(Box::pin(async move { reply.await.map(|r| score::present(r, &board)) })),
    }
}

/// A write to a watched board, reporting its acknowledgment to the watches.
fn noticed(routed: Routed, watches: Arc<WatchHub>, board: String) -> Routed {
    let reply: ReplyFuture = match routed {
        Routed::Ready(reply) => return Routed::Ready(reply),
        Routed::Score(pending) => Box::pin(async move { answer(pending).await.map(|w| marked(Reply::Score, w)) }),
        Routed::Later(reply) => reply,
    };
    Routed::Later(Box::pin(async move {
        let reply = reply.await;
        if reply.is_ok() {
            watches.changed(&board);
        }
        reply
    }))
}

/// A write's reply, marked as replayed when its `wid` had applied already.
fn marked<T>(reply: impl FnOnce(T) -> Reply, written: Written<T>) -> Reply {
    match written.dup {
        false => reply(written.value),
        true => Reply::Replayed(Box::new(reply(written.value))),
    }
}

fn board_info(board: &Board, count: u64) -> BoardListing {
    let config = &board.config;
    BoardListing {
        board: board.name.to_string(),
        order: config.order.as_str(),
        ties: config.ties.as_str(),
        windows: config.windows.iter().map(|w| w.as_str()).collect(),
        keep: config.keep,
        count,
        fields: (config.fields.iter())
            .map(|f| FieldListing { name: f.name.clone(), order: f.order.as_str(), min: f.min, max: f.max })
            .collect(),
    }
}
