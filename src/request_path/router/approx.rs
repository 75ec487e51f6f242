//! `rank` and `rank_of_score` with `approx: true`: answered from the tree's
//! bucket summary (see `request_path::approx`), never by a fan-out. A rank
//! reads its player's record on the player's own shard (in place when the
//! rank may be), then places the record's rank key in the summary.

use std::sync::Arc;

use rankd_client::{ApproxRankInfo, ApproxRankOfScore};
use rankd_shards::key::{score_key, tree_key};
use rankd_shards::{Record, Ties};

use super::dispatch::Routed;
use super::reads::Read;
use super::{Outbox, Router};
use crate::error::Error;
use crate::operations::metrics::ApproxMetrics;
use crate::protocol::Reply;
use crate::request_path::approx::{refresh, ApproxError, Estimate, Fresh, Held};
use crate::request_path::shard::command::answer;
use crate::request_path::shard::Command;

impl Router {
    /// The summary of `read`'s tree, made (and its refresher started on
    /// this thread) if none is held. Dense boards have none.
    fn summary(&self, read: &Read) -> Result<Arc<Held>, ApproxError> {
        if read.ties() == Ties::Dense {
            return Err(ApproxError::Dense);
        }
        let (held, new) = self.approx.ask(read.tree);
        if new {
            let split_ties = read.ties() == Ties::Ordinal;
            actix::spawn(refresh::run(self.approx.clone(), held.clone(), self.shards.clone(), split_ties));
        }
        Ok(held)
    }

    fn approx_metrics(&self) -> Option<ApproxMetrics> {
        self.metrics.hot_path.then(|| self.metrics.approx.clone())
    }

    /// `rank` with `approx`: the record from the player's shard (in place
    /// when allowed and its lock is free), the rest from the summary.
    pub(super) fn approx_rank(&self, read: Read, player: String, outbox: &mut Outbox, in_place: bool) -> Routed {
        let held = match self.summary(&read) {
            Ok(held) => held,
            Err(error) => return Routed::Ready(Err(error.into())),
        };
        let (owner, tree, metrics) = (super::shard_of(&player, self.shards.len()), read.tree, self.approx_metrics());
        if in_place {
            let found = read.shards[owner]
                .engine
                .try_read(|shard| (shard.rank_record(tree, &player), shard.take_cache_lookups()));
            if let Some((found, lookups)) = found {
                if self.metrics.hot_path {
                    self.metrics.shards[owner].count_lookups(lookups);
                }
                if let (Ok(record), Some(Ok(fresh))) = (found, held.now()) {
                    return Routed::Ready(Ok(rank_reply(&read, &fresh, record, metrics.as_ref())));
                }
            }
        }
        let found = outbox.ask(owner, |reply| Command::Get { tree, player, reply });
        Routed::Later(Box::pin(async move {
            let record = answer(found).await?;
            let fresh = held.ready().await?;
            Ok(rank_reply(&read, &fresh, record, metrics.as_ref()))
        }))
    }

    /// `rank_of_score` with `approx`: the summary alone.
    pub(super) fn approx_rank_of_score(&self, read: Read, score: i64) -> Routed {
        let held = match self.summary(&read) {
            Ok(held) => held,
            Err(error) => return Routed::Ready(Err(error.into())),
        };
        let metrics = self.approx_metrics();
        if let Some(Ok(fresh)) = held.now() {
            return Routed::Ready(Ok(rank_of_score_reply(&read, &fresh, score, metrics.as_ref())));
        }
        Routed::Later(Box::pin(async move {
            let fresh = held.ready().await.map_err(Error::from)?;
            Ok(rank_of_score_reply(&read, &fresh, score, metrics.as_ref()))
        }))
    }
}

fn observe_age(fresh: &Fresh, metrics: Option<&ApproxMetrics>) {
    if let Some(metrics) = metrics {
        metrics.age_seconds.observe(fresh.at.elapsed().as_secs_f64());
    }
}

/// A player's approximate rank: players before its rank key, estimated.
fn rank_reply(read: &Read, fresh: &Fresh, record: Option<Record>, metrics: Option<&ApproxMetrics>) -> Reply {
    observe_age(fresh, metrics);
    let Some(record) = record else { return Reply::ApproxRank(None) };
    let Estimate { before, error } = fresh.summary.before(record.rank_key(read.ties(), read.board.config.order));
    let count = fresh.summary.total();
    Reply::ApproxRank(Some(ApproxRankInfo { rank: before + 1, score: record.score, count, error }))
}

/// The approximate rank a newcomer with `score` would get: after the better
/// scores, and on an ordinal board after the equal ones too (as the exact
/// `rank_of_score` counts).
fn rank_of_score_reply(read: &Read, fresh: &Fresh, score: i64, metrics: Option<&ApproxMetrics>) -> Reply {
    observe_age(fresh, metrics);
    let sk = score_key(score, read.board.config.order);
    let key = match (read.ties(), sk.checked_add(1)) {
        (Ties::Ordinal, Some(next)) => tree_key(next, 0),
        (Ties::Ordinal, None) => u128::MAX, // counts everyone
        _ => tree_key(sk, 0),
    };
    let Estimate { before, error } = fresh.summary.before(key);
    Reply::ApproxRankOfScore(ApproxRankOfScore { rank: before + 1, error })
}
