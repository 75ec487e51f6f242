//! Metrics of approximate ranks: the bucket summaries held, their
//! refreshes, and how old the summary was that answered.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

use super::{Collectors, MetricsError};

/// The approximate-rank metrics.
#[derive(Clone)]
pub struct ApproxMetrics {
    /// Summaries held (one per board window period asked about lately).
    pub held: IntGauge,
    /// Summaries dropped to make room for another.
    pub evicted: IntCounter,
    /// Summaries made or refreshed.
    pub refreshes: IntCounter,
    /// Refreshes that failed (the last summary stays).
    pub refresh_failures: IntCounter,
    /// Time a refresh took, sent to counted.
    pub refresh_seconds: Histogram,
    /// Age of the summary each approximate answer came from.
    pub age_seconds: Histogram,
}

impl ApproxMetrics {
    /// Metrics registered nowhere, for tests of what updates them.
    #[cfg(test)]
    pub fn unregistered() -> Self {
        Self::new().map(|(metrics, _)| metrics).expect("valid metric names")
    }

    /// Creates the metrics, registered by [`super::Metrics`].
    pub(super) fn new() -> Result<(Self, Collectors), MetricsError> {
        let held = IntGauge::new(
            "rankd_approx_summaries",
            "Bucket summaries held for approximate ranks: one per board window period asked about in the last minute.",
        )?;
        let evicted = IntCounter::new(
            "rankd_approx_summaries_evicted_total",
            "Bucket summaries dropped to make room for another (at most 64 are held): a client cycling through more \
             boards than that rebuilds one per ask.",
        )?;
        let refreshes = IntCounter::new(
            "rankd_approx_refreshes_total",
            "Bucket summaries made or refreshed (each a shard round).",
        )?;
        let refresh_failures = IntCounter::new(
            "rankd_approx_refresh_failures_total",
            "Bucket summary refreshes that failed (a shard overloaded or stopped); the last summary keeps answering.",
        )?;
        let refresh_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rankd_approx_refresh_seconds",
                "Time a bucket summary refresh took, from its round's sending to the summary's publication.",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
        )?;
        let age_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rankd_approx_summary_age_seconds",
                "Age of the bucket summary an approximate rank was answered from: the error bound holds as of then.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 30.0]),
        )?;
        let families: Collectors = vec![
            Box::new(held.clone()),
            Box::new(evicted.clone()),
            Box::new(refreshes.clone()),
            Box::new(refresh_failures.clone()),
            Box::new(refresh_seconds.clone()),
            Box::new(age_seconds.clone()),
        ];
        Ok((Self { held, evicted, refreshes, refresh_failures, refresh_seconds, age_seconds }, families))
    }
}
