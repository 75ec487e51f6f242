//! Reads that need the shards' answers combined: counts summed, lists
//! merged, a rank's other shards asked after its owner found the score, and
//! a deep page found by searching the key space.

use std::sync::Arc;
use std::time::Instant;

use futures::future::try_join_all;
use rankd_client::{Entry, RankInfo};
use rankd_shards::key::{list_position, list_position_of_tree_key, rank_key, score_key, tree_key};
use rankd_shards::{ties, Direction, ListEntry, Lookups, Record, SharedBoard, Ties, TreeId};

use super::outbox::Outbox;
use crate::error::Error;
use crate::protocol::Reply;
use crate::request_path::dense_registry::DenseRegistry;
use crate::request_path::shard::command::answer;
use crate::request_path::shard::{Command, Counts, Pending, Ranked, Responder, ShardLink};

/// Counts before each of `keys` keys, summed over the shards answering, and
/// the total.
pub async fn summed_counts(pending: Vec<Pending<Counts>>, keys: usize) -> Result<(Vec<u64>, u64), Error> {
    let mut sums = vec![0u64; keys];
    let mut total = 0;
    for counts in try_join_all(pending.into_iter().map(answer)).await? {
        sums.iter_mut().zip(counts.before).for_each(|(sum, before)| *sum += before);
        total += counts.total;
    }
    Ok((sums, total))
}

/// A deep page's search stops once its start is at most this many players
/// before the offset: reading them costs less than more rounds.
const DIRECT_SKIP: u64 = 128;

/// What [`search`] found: a window `lo..` of the searched space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// Where it starts: the target lies at or after it.
    lo: u128,
    /// Players before `lo`.
    before: u64,
    /// Players in the window.
    players: u64,
    /// Whether the window is the one value `lo` (a crowded key or chunk).
    single: bool,
}

/// A 64-way search of a `u128` space holding `total` players for the window
/// where 0-based position `target` lies, `counts` answering how many
/// players lie before each pivot. Stops once the window starts at most
/// [`DIRECT_SKIP`] players before the target, or is one value.
async fn search<F, Fut>(target: u64, total: u64, counts: F) -> Result<Window, Error>
where
    F: Fn(Vec<u128>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<u64>, Error>>,
{
    // Invariants: `before` players lie before `lo` and at most `target` of
    // them; `end` players lie before `hi + 1` (all of them while `hi` is the
    // top), more than `target`.
    let (mut lo, mut hi, mut before, mut end) = (0u128, u128::MAX, 0u64, total);
    while lo < hi && target - before > DIRECT_SKIP {
        let span = hi - lo;
        let pivots: Vec<u128> = if span <= 64 {
            (1..=span).map(|i| lo + i).collect()
        } else {
            let step = span / 64;
            (1..64).map(|i| lo + step * i).chain(std::iter::once(hi)).collect()
        };
        let counts = counts(pivots.clone()).await?;
        match counts.iter().rposition(|&b| b <= target) {
            Some(i) => {
                (lo, before) = (pivots[i], counts[i]);
                if let (Some(next), Some(&next_before)) = (pivots.get(i + 1), counts.get(i + 1)) {
                    (hi, end) = (next - 1, next_before);
                }
            }
            None => (hi, end) = (pivots[0] - 1, counts[0]),
        }
    }
    Ok(Window { lo, before, players: end - before, single: lo == hi })
}

/// The context a multi-step read carries across awaits: one board's tree,
/// and the shards to ask.
#[derive(Clone)]
pub struct Read {
    pub shards: Arc<[ShardLink]>,
    pub board: SharedBoard,
    pub tree: TreeId,
    pub dense: DenseRegistry,
    /// Times each fan-out round of this read.
    pub fanout: Option<prometheus::Histogram>,
}

impl Read {
    pub fn ties(&self) -> Ties {
        self.board.config.ties
    }

    pub fn observe_round(&self, started: Instant) {
        if let Some(h) = &self.fanout {
            h.observe(started.elapsed().as_secs_f64());
        }
    }

    fn count_before(&self, keys: Vec<u128>) -> impl Fn(Responder<Counts>) -> Command {
        let tree = self.tree;
        move |reply| Command::CountBefore { tree, keys: keys.clone(), reply }
    }

    /// Counts before each key, summed over every shard, and the total.
    async fn counts(&self, keys: Vec<u128>) -> Result<(Vec<u64>, u64), Error> {
        self.counts_except(keys, None).await
    }

    /// [`Read::counts`] over every shard but `except` (a shard that already
    /// answered its part); no round at all when that leaves none.
    async fn counts_except(&self, keys: Vec<u128>, except: Option<usize>) -> Result<(Vec<u64>, u64), Error> {
        let n = keys.len();
        let ask = self.count_before(keys);
        let pending: Vec<Pending<Counts>> =
            (self.shards.iter().enumerate()).filter(|(i, _)| Some(*i) != except).map(|(_, s)| s.ask(&ask)).collect();
        if pending.is_empty() {
            return Ok((vec![0; n], 0));
        }
        let started = Instant::now();
        let counts = summed_counts(pending, n).await;
        self.observe_round(started);
        counts
    }

    /// A rank answered in place from the shards' engines, or `None` when a
    /// shard's lock is taken (its actor is applying a command) or reading
    /// the record failed: then it is queued the usual way, which reports
    /// the failure. Either way, also the owner's record-cache lookups taken
    /// here, for the caller to count. Each shard's count is exact at the
    /// moment it is read, which is what the protocol asks of a rank
    /// concurrent with writes.
    pub fn rank_in_place(&self, owner: usize, player: &str) -> (Option<Reply>, Lookups) {
        let (ties, order, tree) = (self.ties(), self.board.config.order, self.tree);
        let owned = self.shards[owner].engine.try_read(|shard| {
            let found = shard.rank_record(tree, player);
            let lookups = shard.take_cache_lookups();
            let own = match found {
                Ok(Some(record)) => {
                    let key = record.rank_key(ties, order);
                    Ok(Some((record, key, shard.count_before_key(tree, key), shard.count(tree))))
                }
                Ok(None) => Ok(None),
                Err(_) => Err(()),
            };
            (own, lookups)
        });
        let Some((own, lookups)) = owned else { return (None, Lookups::default()) };
        let (record, key, before, total) = match own {
            Ok(Some(own)) => own,
            Ok(None) => return (Some(Reply::Rank(None)), lookups),
            Err(()) => return (None, lookups),
        };
        let others = self.shards.iter().enumerate().filter(|(i, _)| *i != owner);
        let mut theirs =
            others.map(|(_, link)| link.engine.try_read(|s| (s.count_before_key(tree, key), s.count(tree))));
        let summed =
            theirs.try_fold((before, total), |(before, total), counts| counts.map(|(b, t)| (before + b, total + t)));
        (summed.map(|(before, total)| self.rank_reply(record, before, total)), lookups)
    }

    /// Ranks for list entries: one fan-out for the whole list (or none, for
    /// dense boards, whose ranks come from the distinct-score index).
    async fn ranked(&self, entries: Vec<ListEntry>) -> Result<Vec<Entry>, Error> {
        let order = self.board.config.order;
        let score_keys: Vec<u64> = entries.iter().map(|e| score_key(e.score, order)).collect();
        let ranks: Vec<u64> = if self.ties() == Ties::Dense {
            self.dense.ranks(self.tree, &score_keys)
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
        let (tree, ties, order) = (self.tree, self.ties(), self.board.config.order);
        let pending = self.shards.iter().map(|s| {
            let position = position.clone();
            s.ask(move |reply| Command::List { tree, ties, order, position, direction, limit, reply })
        });
        let mut all: Vec<ListEntry> = try_join_all(pending.map(answer)).await?.into_iter().flatten().collect();
        self.observe_round(started);
        match direction {
            Direction::Forward => all.sort_unstable_by(|a, b| a.position.cmp(&b.position)),
            Direction::Backward => all.sort_unstable_by(|a, b| b.position.cmp(&a.position)),
        }
        all.truncate(limit);
        Ok(all)
    }

    /// Players inside one crowded tree key (`key`, then the name chunks of
    /// `path`) before each pivot chunk, summed over every shard.
    async fn tie_counts(&self, key: u128, path: &[u128], pivots: Vec<u128>) -> Result<Vec<u64>, Error> {
        let tree = self.tree;
        let pending = self.shards.iter().map(|s| {
            let (path, pivots) = (path.to_vec(), pivots.clone());
            s.ask(move |reply| Command::TieCounts { tree, key, path, pivots, reply })
        });
        let started = Instant::now();
        let mut sums = vec![0u64; pivots.len()];
        for counts in try_join_all(pending.map(answer)).await? {
            sums.iter_mut().zip(counts).for_each(|(sum, before)| *sum += before);
        }
        self.observe_round(started);
        Ok(sums)
    }

    /// Where the list at 0-based position `offset` starts: a list position
    /// at or before it, and how many players lie between. Found by a 64-way
    /// search of the tree keys, then, inside a crowded key of a competition
    /// or dense board, of the names' chunks level by level
    /// (`rankd_shards::ties`), each round summing the shards' counts: about
    /// two dozen rounds however deep the offset and whatever the names,
    /// instead of reading `offset` entries per shard.
    async fn start_of(&self, offset: u64, total: u64) -> Result<(Vec<u8>, u64), Error> {
        let found = search(offset, total, |pivots| async { Ok(self.counts(pivots).await?.0) }).await?;
        let (key, mut skip) = (found.lo, offset - found.before);
        let mut window = found;
        let mut path = Vec::new();
        while self.ties() != Ties::Ordinal && window.single && skip > DIRECT_SKIP && path.len() < ties::MAX_DEPTH {
            let below = &path;
            window = search(skip, window.players, |pivots| self.tie_counts(key, below, pivots)).await?;
            skip -= window.before;
            path.push(window.lo);
        }
        let position = if path.is_empty() {
            list_position_of_tree_key(self.ties(), key)
        } else {
            let prefix = ties::group_prefix(key, &path);
            [&((key >> 64) as u64).to_be_bytes()[..], ties::first_name_from(&prefix)].concat()
        };
        Ok((position, skip))
    }

    /// `top`: `limit` players from 0-based position `offset`.
    pub async fn top(self, limit: usize, offset: u64) -> Result<Reply, Error> {
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
            let (start, skip) = self.start_of(offset, total).await?;
            (start, skip as usize)
        };
        let mut entries = self.merged(start, Direction::Forward, skip + limit).await?;
        entries.drain(..skip.min(entries.len()));
        Ok(Reply::Entries(self.ranked(entries).await?))
    }

    /// `around`: the player (found by `found`) and their neighbours.
    pub async fn around(
        self,
        found: Pending<Option<Record>>,
        player: String,
        before: usize,
        after: usize,
    ) -> Result<Reply, Error> {
        let Some(record) = answer(found).await? else {
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

    /// Finishes a rank whose first round went to the player's `owner`: the
    /// owner already counted its own players, so only the other shards are
    /// asked (none, on one shard).
    pub async fn rank(self, owner: usize, found: Pending<Ranked>) -> Result<Reply, Error> {
        let Ranked { record, before, total } = answer(found).await?;
        let Some(record) = record else {
            return Ok(Reply::Rank(None));
        };
        let key = record.rank_key(self.ties(), self.board.config.order);
        let (theirs, their_total) = self.counts_except(vec![key], Some(owner)).await?;
        Ok(self.rank_reply(record, before + theirs[0], total + their_total))
    }

    /// Finishes a rank whose owner asked the other shards itself (a
    /// `Forward`), their answers arriving on `theirs`.
    pub async fn rank_forwarded(self, found: Pending<Ranked>, theirs: Vec<Pending<Counts>>) -> Result<Reply, Error> {
        // Theirs first: the owner answers after it has forwarded, so by the
        // time theirs are in, its answer is too, and awaiting it first would
        // wake this thread once for it and once more for theirs. Without a
        // record the owner drops their channels and its answer says why.
        let (started, fanned_out) = (Instant::now(), !theirs.is_empty());
        let counts = summed_counts(theirs, 1).await;
        let Ranked { record, before, total } = answer(found).await?;
        let Some(record) = record else {
            return Ok(Reply::Rank(None));
        };
        let (theirs, their_total) = counts?;
        if fanned_out {
            self.observe_round(started); // a round across shards; none on one shard
        }
        Ok(self.rank_reply(record, before + theirs[0], total + their_total))
    }

    /// `ranks`: `players` (sorted, each once) as their owners `found` them;
    /// then one round to every shard counts before all of their keys at
    /// once (none for a dense board). Best first, in `top`'s order.
    pub async fn ranks(self, players: Vec<String>, found: Vec<Pending<Option<Record>>>) -> Result<Reply, Error> {
        let (ties, order) = (self.ties(), self.board.config.order);
        let records = try_join_all(found.into_iter().map(answer)).await?;
        let mut present: Vec<(Vec<u8>, String, Record)> = (players.into_iter().zip(records))
            .filter_map(|(player, record)| record.map(|record| (player, record)))
            .map(|(player, record)| {
                let position = list_position(ties, score_key(record.score, order), record.seq, &player);
                (position, player, record)
            })
            .collect();
        present.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let entries: Vec<ListEntry> = (present.into_iter())
            .map(|(position, player, record)| ListEntry { position, player, score: record.score, seq: record.seq })
            .collect();
        if entries.is_empty() {
            return Ok(Reply::Entries(Vec::new()));
        }
        Ok(Reply::Entries(self.ranked(entries).await?))
    }

    /// A rank's reply from its record and the players before it and in
    /// total, summed over the shards.
    fn rank_reply(&self, record: Record, before: u64, count: u64) -> Reply {
        let sk = score_key(record.score, self.board.config.order);
        let rank = 1 + if self.ties() == Ties::Dense { self.dense.distinct_before(self.tree, sk) } else { before };
        Reply::Rank(Some(RankInfo { rank, score: record.score, count }))
    }

    /// `rank_of_score`: its first round goes into `outbox`.
    pub fn rank_of_score(self, score: i64, outbox: &mut Outbox) -> super::ReplyFuture {
        let sk = score_key(score, self.board.config.order);
        if self.ties() == Ties::Dense {
            // The distinct-score index is read once every shard has applied
            // what was sent to it before (a count with no keys is the
            // cheapest such round), so a write sent before is seen.
            let (started, pending) = (Instant::now(), outbox.ask_all(self.count_before(Vec::new())));
            return Box::pin(async move {
                summed_counts(pending, 0).await?;
                self.observe_round(started);
                Ok(Reply::Count(1 + self.dense.distinct_before(self.tree, sk)))
            });
        }
        // Ordinal: a newcomer ranks after everyone already at the score.
        let key = match (self.ties(), sk.checked_add(1)) {
            (Ties::Ordinal, Some(next)) => tree_key(next, 0),
            (Ties::Ordinal, None) => u128::MAX,
            _ => tree_key(sk, 0),
        };
        let (started, pending) = (Instant::now(), outbox.ask_all(self.count_before(vec![key])));
        Box::pin(async move {
            let (before, total) = summed_counts(pending, 1).await?;
            self.observe_round(started);
            let better = if key == u128::MAX { total } else { before[0] };
            Ok(Reply::Count(better + 1))
        })
    }
}
