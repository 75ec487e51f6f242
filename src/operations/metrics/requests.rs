//! Per-request metrics: each op's outcomes and latency, and the latency of
//! the cross-shard read rounds some ops fan out into.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};
use rankd_client::{ErrorCode, OpKind};

use super::Collectors;

/// Ops that read from every shard; each has a fan-out latency series.
pub const FANOUT_OPS: [OpKind; 7] =
    [OpKind::Boards, OpKind::Count, OpKind::Rank, OpKind::RankOfScore, OpKind::Top, OpKind::Around, OpKind::Ranks];

/// How a request ended: `Ok`, or failed with a protocol error code.
pub type Outcome = Result<(), ErrorCode>;

/// The `outcome` label of each [`Outcome`], `ok` first, then every error
/// code in [`ErrorCode::ALL`] order (see [`outcome_index`]).
fn outcome_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once("ok").chain(ErrorCode::ALL.iter().map(|code| code.name()))
}

/// Where `outcome` sits among [`outcome_labels`].
fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Ok(()) => 0,
        Err(code) => 1 + code as usize,
    }
}

/// The request-latency histogram's name; `rankd-bench` reads it back
/// (`bench/src/server_latency.rs`).
pub(crate) const REQUEST_DURATION: &str = "rankd_request_duration_seconds";

/// Latency buckets from 25 µs to 10 s: rank reads sit at the bottom, durable
/// batches (fsync) in the middle, pathologies at the top.
pub(crate) const LATENCY_BUCKETS: [f64; 16] =
    [25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 10.0];

/// Pre-resolved handles for one op.
pub struct OpMetrics {
    /// `rankd_requests_total{op, outcome}`: `ok`, then each error code.
    pub outcomes: Vec<IntCounter>,
    /// `rankd_request_duration_seconds{op}`; none for `backup`, timed by
    /// `rankd_backup_duration_seconds` (its minutes would all land in +Inf).
    duration: Option<Histogram>,
}

impl OpMetrics {
    /// Counts one finished request.
    pub fn finish(&self, outcome: Outcome, elapsed: Duration) {
        self.count(outcome);
        if let Some(duration) = &self.duration {
            duration.observe(elapsed.as_secs_f64());
        }
    }

    /// Counts one request's outcome, untimed: a backup's (see `duration`).
    pub fn count(&self, outcome: Outcome) {
        self.outcomes[outcome_index(outcome)].inc();
    }
}

/// The per-request metric families, from which every op's handles are
/// resolved once, at start-up.
pub(super) struct RequestFamilies {
    /// Counts each op's requests by outcome.
    requests: IntCounterVec,
    /// Times each op's requests, decoding to reply.
    duration: HistogramVec,
    /// Times each fan-out op's cross-shard read rounds.
    fanout: HistogramVec,
}

impl RequestFamilies {
    /// Creates the families (registered by [`RequestFamilies::into_collectors`]).
    pub(super) fn new() -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new("rankd_requests_total", "Requests answered, by op and outcome (ok or error code)."),
            &["op", "outcome"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(REQUEST_DURATION, "Time from decoding a request to having its reply, by op.")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        )?;
        let fanout = HistogramVec::new(
            HistogramOpts::new(
                "rankd_fanout_duration_seconds",
                "Time of one cross-shard read round (all shards answered), by op.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        )?;
        Ok(Self { requests, duration, fanout })
    }

    /// The handles of the op labelled `name` (every outcome's series
    /// exists from now on, at zero); its latency only if `timed`.
    pub(super) fn op(&self, name: &str, timed: bool) -> OpMetrics {
        OpMetrics {
            outcomes: outcome_labels().map(|o| self.requests.with_label_values(&[name, o])).collect(),
            duration: timed.then(|| self.duration.with_label_values(&[name])),
        }
    }

    /// The fan-out histogram of every op, indexed by [`OpKind`] (`None` for
    /// ops that do not fan out).
    pub(super) fn fanout_by_op(&self) -> Vec<Option<Histogram>> {
        OpKind::ALL
            .iter()
            .map(|kind| FANOUT_OPS.contains(kind).then(|| self.fanout.with_label_values(&[kind.name()])))
            .collect()
    }

    /// The families, for the registry, once every handle is resolved.
    pub(super) fn into_collectors(self) -> Collectors {
        vec![Box::new(self.requests), Box::new(self.duration), Box::new(self.fanout)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_hold_one_millisecond() {
        // rankd-bench reports the share of requests over 1 ms from them.
        assert!(LATENCY_BUCKETS.contains(&1e-3));
    }
}
