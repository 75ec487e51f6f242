//! Metrics of protocol 1.1's live features: watches and their pushes, and
//! replayed idempotent writes (the `wid` records themselves are per shard).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

use super::{Collectors, MetricsError};

/// The watch and dedup metrics.
pub struct WatchMetrics {
    /// Watches open over all connections.
    pub open: IntGauge,
    /// Pushes put for connections to write.
    pub pushes: IntCounter,
    /// Pushes that replaced one a slow reader had not been sent yet.
    pub coalesced: IntCounter,
    /// Looks at watched boards (one batch of reads and a fence each).
    pub looks: IntCounter,
    /// How long a look takes, from taking the due watches to offering what
    /// was read: how late a push may come after the write it shows.
    pub look_seconds: Histogram,
    /// Idempotent writes answered from their `wid` record, not applied again.
    pub dedup_hits: IntCounter,
}

impl WatchMetrics {
    pub(super) fn new() -> Result<(Self, Collectors), MetricsError> {
        let open = IntGauge::new("rankd_watches_open", "Watches open, over all connections.")?;
        let pushes = IntCounter::new(
            "rankd_watch_pushes_total",
            "Pushes sent to watching connections (each a changed value, or the nil that ends a watch).",
        )?;
        let coalesced = IntCounter::new(
            "rankd_watch_pushes_coalesced_total",
            "Pushes that replaced an earlier one a slow client had not read yet: it gets the latest state, never \
             a backlog.",
        )?;
        let looks = IntCounter::new(
            "rankd_watch_looks_total",
            "Looks at watched boards: one batch of reads of the boards that changed, then a fence on every shard.",
        )?;
        let look_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rankd_watch_look_duration_seconds",
                "Time a look at watched boards takes: taking the watches due (under the registry's lock), their \
                 reads, the fence that makes what they saw durable, and offering the values. A push comes about \
                 this long after the write it shows.",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
        )?;
        let dedup_hits = IntCounter::new(
            "rankd_dedup_hits_total",
            "Writes whose `wid` had applied already: answered with the first result (`dup`), changing nothing.",
        )?;
        let families: Collectors = vec![
            Box::new(open.clone()),
            Box::new(pushes.clone()),
            Box::new(coalesced.clone()),
            Box::new(looks.clone()),
            Box::new(look_seconds.clone()),
            Box::new(dedup_hits.clone()),
        ];
        Ok((Self { open, pushes, coalesced, looks, look_seconds, dedup_hits }, families))
    }
}
