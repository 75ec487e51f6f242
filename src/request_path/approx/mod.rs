//! Approximate ranks (`approx: true` on `rank` and `rank_of_score`):
//! answered from a per-tree summary of score buckets, without a fan-out.
//!
//! **What a summary is.** For one tree (a board's window in one period),
//! a sorted list of boundary keys and, for each, the players whose tree
//! key sorts before it, summed over every shard, with the tree's total
//! ([`summary::Summary`]). A rank key between two boundaries has between
//! their two counts before it; the answer interpolates linearly between
//! them and its `error` is the distance to the farther limit, so the exact
//! rank (as of the summary's counts) always lies within `rank ± error`.
//!
//! **How the boundaries are chosen.** Each shard proposes its own, read off
//! its count tree (`TreeView::bucket_bounds` in `rankd-shards`): starting
//! from the root, it splits the range holding the most players into its
//! child ranges (a leaf into its distinct keys), best first, until every
//! range holds at most `1 / buckets` of the shard's players (4096 buckets
//! by default) or the bucket budget is spent. That is an equi-depth
//! partition whatever the distribution: a Zipf or normal board gets narrow
//! buckets where its players crowd and wide ones in its sparse tails, so
//! the error stays under about `1 / buckets` of the board on any
//! distribution. Only a single score (a single key on ordinal boards,
//! which rank a score's players apart) cannot be split; its edges are then
//! exact, which is where every `rank_of_score` and every competition
//! `rank` of that score lands. Each bucket is cut down to the keys it
//! holds, so a key in a gap between buckets is exact too. Players are
//! spread over shards by a hash, so every shard sees the same distribution
//! and proposes nearly the same boundaries; the router takes their union
//! (thinned to a cap) and every shard counts at it in the next round.
//!
//! **Refresh.** The first ask for a tree builds its summary (two fan-out
//! rounds: one to find the boundaries, one to count at them) and starts
//! its refresher ([`refresh::run`]), which counts again every 250 ms, one
//! round each time (each shard also proposes the boundaries for the next).
//! Asks are then answered from the latest summary, with no shard round at
//! all for `rank_of_score` and only the player's own shard for `rank`. A
//! summary nobody asked about for a minute is dropped, and at most 64 are
//! held (the least recently asked is dropped for a new one), so memory
//! stays bounded whatever clients ask ([`cache::Summaries`]).
//!
//! - [`summary`]: the counts and the arithmetic (merge, estimate, bound);
//! - [`cache`]: the summaries held, their limits and eviction;
//! - [`refresh`]: the task that keeps one summary fresh.

pub mod cache;
pub mod refresh;
pub mod summary;

pub use cache::{Fresh, Held, Limits, Summaries};
pub use summary::{Estimate, Summary};

use crate::error::Error;

/// Why an approximate rank could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApproxError {
    /// Dense boards rank by distinct scores, which counts of players per
    /// bucket cannot bound.
    #[error("`approx` is not available on a dense board (its ranks count distinct scores, not players)")]
    Dense,
    /// A shard's answer did not fit the round.
    #[error(transparent)]
    Mismatch(#[from] summary::Mismatch),
    /// The summary's refresher ended before it made one.
    #[error("the approximate-rank summary stopped before it was made")]
    Stopped,
    /// A shard refused or failed the round.
    #[error(transparent)]
    Shard(Error),
}

impl From<ApproxError> for Error {
    /// The one place approximate-rank errors become protocol errors.
    fn from(error: ApproxError) -> Self {
        match error {
            ApproxError::Dense => Error::BadRequest(error.to_string()),
            ApproxError::Mismatch(_) | ApproxError::Stopped => Error::Internal(error.to_string()),
            ApproxError::Shard(error) => error,
        }
    }
}
