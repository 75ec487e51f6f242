//! A summary's refresher: one task per held summary, on the I/O thread of
//! the router that first asked for it, counting the shards' buckets once
//! per interval until the summary is dropped.

use std::sync::Arc;
use std::time::Instant;

use futures::future::try_join_all;

use super::cache::{Fresh, Held, Summaries};
use super::summary::{union_bounds, Summary};
use super::ApproxError;
use crate::request_path::shard::command::answer;
use crate::request_path::shard::{Buckets, Command, ShardLink};

/// One round: every shard counts before `bounds` and proposes its own
/// bounds; answers the summary at `bounds` and the merged proposals.
async fn round(
    shards: &[ShardLink],
    summaries: &Summaries,
    tree: rankd_shards::TreeId,
    bounds: Arc<[u128]>,
    split_ties: bool,
) -> Result<(Summary, Vec<u128>), ApproxError> {
    let limits = summaries.limits();
    // Never shed by a full queue: protocol.md promises a refresh at least
    // once a second, and a busy shard would otherwise leave the summary
    // stale without a word. One command a shard, awaited before the next.
    let pending = shards.iter().map(|link| {
        let keys = bounds.clone();
        link.ask_unbounded(|reply| Command::Buckets { tree, keys, buckets: limits.buckets, split_ties, reply })
    });
    let parts: Vec<Buckets> = try_join_all(pending.map(answer)).await.map_err(ApproxError::Shard)?;
    let summary = Summary::merge(&bounds, parts.iter().map(|p| (p.before.as_slice(), p.total)))?;
    let next = union_bounds(parts.into_iter().map(|p| p.bounds), limits.max_bounds);
    Ok((summary, next))
}

/// Refreshes `held` until it is dropped or idle, then forgets it. The first
/// summary takes two rounds (the first finds the bounds to count at);
/// every later one, one (counting at the bounds the last proposed). A
/// failed first summary is published, so its askers get the error, and
/// the summary is forgotten (the next ask tries again); a failed later
/// refresh keeps the last summary.
pub async fn run(summaries: Arc<Summaries>, held: Arc<Held>, shards: Arc<[ShardLink]>, split_ties: bool) {
    let metrics = summaries.metrics().clone();
    let mut bounds: Arc<[u128]> = Arc::from(Vec::new());
    loop {
        let started = Instant::now();
        match round(&shards, &summaries, held.tree, bounds.clone(), split_ties).await {
            Ok((summary, next)) => {
                let unbounded = bounds.is_empty() && !next.is_empty();
                bounds = next.into();
                if unbounded {
                    continue; // counted at no bound: count again at the ones found
                }
                metrics.refreshes.inc();
                metrics.refresh_seconds.observe(started.elapsed().as_secs_f64());
                held.publish(Ok(Fresh { summary: Arc::new(summary), at: started }));
            }
            Err(error) => {
                metrics.refresh_failures.inc();
                tracing::warn!(%error, tree = ?held.tree, "approximate-rank summary refresh failed");
                if held.now().is_none_or(|published| published.is_err()) {
                    held.publish(Err(error));
                    summaries.forget(&held);
                    return;
                }
            }
        }
        let wait = summaries.limits().interval.saturating_sub(started.elapsed());
        tokio::time::sleep(wait).await;
        if held.dropped() || summaries.idle(&held) {
            summaries.forget(&held);
            return;
        }
    }
}
