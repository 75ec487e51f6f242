//! Metrics of protocol 1.1's live features: watches and their pushes, and
//! replayed idempotent writes (the `wid` records themselves are per shard).

use prometheus::{IntCounter, IntGauge};

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
        let dedup_hits = IntCounter::new(
            "rankd_dedup_hits_total",
            "Writes whose `wid` had applied already: answered with the first result (`dup`), changing nothing.",
        )?;
        let families: Collectors = vec![
            Box::new(open.clone()),
            Box::new(pushes.clone()),
            Box::new(coalesced.clone()),
            Box::new(looks.clone()),
            Box::new(dedup_hits.clone()),
        ];
        Ok((Self { open, pushes, coalesced, looks, dedup_hits }, families))
    }
}
