//! Prometheus metrics, and the HTTP endpoint that serves them.
//!
//! Naming follows Prometheus conventions: `rankd_` prefix, base units
//! (`_seconds`, `_bytes`), `_total` on counters, histograms for durations,
//! and labels of bounded cardinality only (op, outcome, shard, thread).
//!
//! The hot path never looks a label up: every handle a request touches is
//! resolved once at start-up ([`OpMetrics`], [`ShardMetrics`]), so updating a
//! metric is a few atomic adds — no lock, no allocation. Byte counters are
//! bumped once per socket read or write, not per request.
//!
//! - this file: [`Metrics`], the registry of them all, and the server-wide
//!   metrics (connections, bytes, readiness, the allocator, build info);
//! - `requests`: per op, outcomes and latency ([`OpMetrics`]), and the
//!   latency of cross-shard read rounds;
//! - `security`: failed `auth`s, TLS handshakes and certificate reloads;
//! - `approx`: approximate ranks' bucket summaries ([`ApproxMetrics`]);
//! - `watches`: watches, their pushes, and replayed idempotent writes;
//! - `backup`: backups' durations and bytes ([`BackupMetrics`]);
//! - `shard`: per shard, its rounds, commits and storage ([`ShardMetrics`]);
//! - `endpoint`: `/metrics`, `/healthz` and `/readyz` ([`serve`]).

mod approx;
mod backup;
pub(crate) mod bounded;
mod endpoint;
mod requests;
mod security;
mod shard;
mod watches;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::operations::thread_cpu::ThreadCpu;
use prometheus::{Encoder, Histogram, IntCounter, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use rankd_client::OpKind;

pub use approx::ApproxMetrics;
pub use backup::BackupMetrics;
pub use endpoint::serve;
pub(crate) use requests::LATENCY_BUCKETS;
pub use requests::{OpMetrics, Outcome, FANOUT_OPS};
pub use security::SecurityMetrics;
pub use shard::ShardMetrics;
pub use watches::WatchMetrics;

/// Metric families on their way to the registry.
type Collectors = Vec<Box<dyn prometheus::core::Collector>>;

/// All of rankd's metrics.
pub struct Metrics {
    /// Every metric below, gathered on each scrape.
    registry: Registry,
    /// Per op, indexed by [`OpKind`].
    ops: Vec<OpMetrics>,
    /// Frames that could not be decoded into a request (no op known).
    undecodable: OpMetrics,
    /// Each shard's handles, indexed by shard number, resolved once for
    /// its threads to update.
    pub shards: Vec<ShardMetrics>,
    /// Open client connections.
    pub connections_open: IntGauge,
    /// Accepted client connections.
    pub connections_accepted: IntCounter,
    /// Connections refused at the connection limit.
    pub connections_refused: IntCounter,
    /// Ranks answered in place from the shards' engines, without queueing
    /// for a shard (see `router::IN_PLACE_MAX_BATCH`).
    pub ranks_in_place: IntCounter,
    /// Writes staged in place on the I/O threads, without queueing for a
    /// shard (see `EngineCell::try_write`).
    pub writes_in_place: IntCounter,
    /// Boards in the registry.
    pub boards: IntGauge,
    /// Bytes read from clients.
    pub received_bytes: IntCounter,
    /// Requests whose connection ended before their answers were written.
    pub requests_abandoned: IntCounter,
    /// Bytes written to clients.
    pub sent_bytes: IntCounter,
    /// Failed `auth`s, TLS handshakes and reloads.
    pub security: SecurityMetrics,
    /// Watches, pushes and replayed idempotent writes.
    pub watches: WatchMetrics,
    /// Approximate ranks' bucket summaries.
    pub approx: ApproxMetrics,
    /// Backups' durations and bytes.
    pub backup: BackupMetrics,
    /// Cross-shard read round latency, indexed by [`OpKind`] (`None` for
    /// ops that do not fan out).
    fanout: Vec<Option<Histogram>>,
    /// Whether every shard is open and the listener accepts.
    pub ready: AtomicBool,
    /// `rankd_ready`: the same as a gauge, so an alert can see it.
    pub ready_gauge: IntGauge,
    /// Bytes the server's allocations hold, the bytes of the pages they
    /// sit in, and the bytes the allocator keeps resident (refreshed on each
    /// scrape): when RSS grows, these say whether it is live data,
    /// fragmentation or allocator slack.
    allocator: [IntGauge; 3],
    /// Whether per-request and per-batch metrics are updated. Only turned
    /// off to measure what they cost (`--debug-no-request-metrics`).
    pub hot_path: bool,
    /// CPU time by thread role (refreshed on each scrape); threads register
    /// their role here.
    pub threads: ThreadCpu,
}

/// Registration failed: a programming error (duplicate or invalid name).
#[derive(Debug, thiserror::Error)]
#[error("metrics registration: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// Creates and registers every metric for `shards` shards.
    pub fn new(shards: usize) -> Result<Arc<Self>, MetricsError> {
        Self::with_hot_path(shards, true)
    }

    /// Same, choosing whether per-request and per-batch metrics are updated.
    pub fn with_hot_path(shards: usize, hot_path: bool) -> Result<Arc<Self>, MetricsError> {
        let registry = Registry::new();
        let requests = requests::RequestFamilies::new()?;
        let ops = OpKind::ALL.iter().map(|kind| requests.op(kind.name(), *kind != OpKind::Backup)).collect();
        let undecodable = requests.op("undecodable", true);
        let fanout = requests.fanout_by_op();
        let (shard_metrics, shard_families) = shard::shard_metrics(shards)?;
        let (security, security_families) = SecurityMetrics::new()?;
        let (watches, watch_families) = WatchMetrics::new()?;
        let (approx, approx_families) = ApproxMetrics::new()?;
        let (backup, backup_families) = BackupMetrics::new()?;

        let connections_open = IntGauge::new("rankd_connections_open", "Client connections open.")?;
        let connections_accepted = IntCounter::new("rankd_connections_accepted_total", "Client connections accepted.")?;
        let connections_refused = IntCounter::new(
            "rankd_connections_refused_total",
            "Client connections refused at --max-connections (answered `overloaded`).",
        )?;
        let ranks_in_place = IntCounter::new(
            "rankd_ranks_in_place_total",
            "Ranks answered in place from the shards' engines on the I/O threads, without queueing behind \
             a shard's round: those a client waits for alone (nothing else of its connection in flight, at most 4 \
             in its batch, none after a write in it), when every shard's lock is free. The others are queued.",
        )?;
        let writes_in_place = IntCounter::new(
            "rankd_writes_in_place_total",
            "`set`s staged in place on the I/O threads and handed to the committer directly, without queueing \
             for a shard's round: those a client waits for alone (as for ranks in place), when nothing sent to \
             the shard is still unapplied and its lock is free. The others are queued.",
        )?;
        let boards = IntGauge::new(
            "rankd_boards",
            "Boards the server holds (created, or made by a first write, and not dropped). With \
             rankd_allocator_allocated_bytes: the memory a board costs.",
        )?;
        let requests_abandoned = IntCounter::new(
            "rankd_requests_abandoned_total",
            "Requests read whose answers were never written because their connection ended first (the client \
             left, or stopped reading past the idle timeout); not in rankd_requests_total. Writes among them may \
             have applied.",
        )?;
        let received_bytes = IntCounter::new("rankd_received_bytes_total", "Bytes read from clients.")?;
        let sent_bytes = IntCounter::new("rankd_sent_bytes_total", "Bytes written to clients.")?;
        let ready_gauge = IntGauge::new("rankd_ready", "1 while every shard is open and clients are accepted.")?;
        let build_info = IntGaugeVec::new(
            Opts::new("rankd_build_info", "Always 1; labels say which rankd this is."),
            &["version", "shards"],
        )?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), &shards.to_string()]).set(1);
        let allocator = [
            IntGauge::new(
                "rankd_allocator_allocated_bytes",
                "Bytes held by the server's live allocations (jemalloc).",
            )?,
            IntGauge::new(
                "rankd_allocator_active_bytes",
                "Bytes of the pages live allocations sit in: allocated plus fragmentation (jemalloc).",
            )?,
            IntGauge::new(
                "rankd_allocator_resident_bytes",
                "Bytes jemalloc keeps resident: live allocations plus its own slack.",
            )?,
        ];

        let server_wide: Collectors = vec![
            Box::new(connections_open.clone()),
            Box::new(connections_accepted.clone()),
            Box::new(connections_refused.clone()),
            Box::new(ranks_in_place.clone()),
            Box::new(writes_in_place.clone()),
            Box::new(boards.clone()),
            Box::new(received_bytes.clone()),
            Box::new(requests_abandoned.clone()),
            Box::new(sent_bytes.clone()),
            Box::new(build_info),
            Box::new(ready_gauge.clone()),
        ];
        for collector in requests
            .into_collectors()
            .into_iter()
            .chain(shard_families)
            .chain(security_families)
            .chain(watch_families)
            .chain(approx_families)
            .chain(backup_families)
            .chain(server_wide)
            .chain(allocator.iter().map(|gauge| Box::new(gauge.clone()) as Box<dyn prometheus::core::Collector>))
        {
            registry.register(collector)?;
        }
        #[cfg(target_os = "linux")]
        registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        let threads = ThreadCpu::new()?;
        registry.register(Box::new(threads.counter.clone()))?;

        Ok(Arc::new(Self {
            registry,
            ops,
            undecodable,
            shards: shard_metrics,
            connections_open,
            connections_accepted,
            connections_refused,
            ranks_in_place,
            writes_in_place,
            boards,
            received_bytes,
            requests_abandoned,
            sent_bytes,
            security,
            watches,
            approx,
            backup,
            fanout,
            ready: AtomicBool::new(false),
            ready_gauge,
            allocator,
            hot_path,
            threads,
        }))
    }

    /// Marks the server ready (or not) on `/readyz` and `rankd_ready`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
        self.ready_gauge.set(i64::from(ready));
    }

    /// The handles of `op`, or of undecodable frames when no op is known.
    pub fn op(&self, op: Option<OpKind>) -> &OpMetrics {
        op.map_or(&self.undecodable, |kind| &self.ops[kind as usize])
    }

    /// The fan-out histogram of `op`, if it fans out.
    pub fn fanout(&self, op: OpKind) -> Option<&Histogram> {
        self.fanout[op as usize].as_ref()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        self.refresh_allocator();
        self.threads.refresh();
        let mut out = Vec::new();
        // Encoding into a Vec only fails on invalid metric families, which
        // registration already rejected.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Reads the allocator's statistics; a failed read leaves the gauges.
    fn refresh_allocator(&self) {
        let Some(stats) = crate::operations::allocator::stats() else { return };
        for (gauge, bytes) in self.allocator.iter().zip([stats.allocated, stats.active, stats.resident]) {
            gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_client::ErrorCode;
    use std::time::Duration;

    #[test]
    fn handles_move_the_exposed_series() {
        let metrics = Metrics::new(2).unwrap();
        for _ in 0..5 {
            metrics.op(Some(OpKind::Set)).finish(Ok(()), Duration::from_micros(80));
        }
        metrics.op(Some(OpKind::Rank)).finish(Err(ErrorCode::BadRequest), Duration::from_micros(10));
        metrics.op(None).finish(Err(ErrorCode::BadFrame), Duration::from_micros(10));
        metrics.shards[1].commit_seconds.observe(0.3);
        // A backup's outcome is counted with the requests'; its time is not a request latency.
        metrics.op(Some(OpKind::Backup)).finish(Ok(()), Duration::from_secs(1800));
        metrics.backup.duration.observe(1800.0);
        let text = metrics.render();
        assert!(text.contains(r#"rankd_requests_total{op="set",outcome="ok"} 5"#), "{text}");
        assert!(text.contains(r#"rankd_requests_total{op="rank",outcome="bad_request"} 1"#));
        assert!(text.contains(r#"rankd_requests_total{op="undecodable",outcome="bad_frame"} 1"#));
        assert!(text.contains(r#"rankd_requests_total{op="set",outcome="internal"} 0"#));
        // A slow commit lands above the 250 ms bucket.
        assert!(text.contains(r#"rankd_shard_commit_seconds_bucket{shard="1",le="0.25"} 0"#));
        assert!(text.contains(r#"rankd_shard_commit_seconds_bucket{shard="1",le="0.5"} 1"#));
        assert!(text.contains("rankd_build_info{"));
        assert!(text.contains(r#"rankd_requests_total{op="backup",outcome="ok"} 1"#));
        assert!(!text.contains(r#"rankd_request_duration_seconds_count{op="backup"}"#));
        assert!(text.contains(r#"rankd_backup_duration_seconds_bucket{le="1200"} 0"#));
        assert!(text.contains(r#"rankd_backup_duration_seconds_bucket{le="1800"} 1"#));
    }
}
