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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::operations::thread_cpu::ThreadCpu;
use prometheus::{
    Counter, CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use rankd_client::{ErrorCode, OpKind};

/// Ops that read from every shard; each has a fan-out latency series.
pub const FANOUT_OPS: [OpKind; 6] =
    [OpKind::Boards, OpKind::Count, OpKind::Rank, OpKind::RankOfScore, OpKind::Top, OpKind::Around];

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

/// The request-latency histogram's name; `rankd bench` reads it back
/// (`src/bench/server_latency.rs`).
pub(crate) const REQUEST_DURATION: &str = "rankd_request_duration_seconds";

/// Latency buckets from 25 µs to 10 s: rank reads sit at the bottom, durable
/// batches (fsync) in the middle, pathologies at the top.
pub(crate) const LATENCY_BUCKETS: [f64; 16] =
    [25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 10.0];

/// Requests per batch.
const BATCH_BUCKETS: [f64; 12] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Pre-resolved handles for one op.
pub struct OpMetrics {
    /// `rankd_requests_total{op, outcome}`: `ok`, then each error code.
    pub outcomes: Vec<IntCounter>,
    /// `rankd_request_duration_seconds{op}`.
    pub duration: Histogram,
}

impl OpMetrics {
    /// Counts one finished request.
    pub fn finish(&self, outcome: Outcome, elapsed: Duration) {
        self.outcomes[outcome_index(outcome)].inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// Pre-resolved handles for one shard.
pub struct ShardMetrics {
    /// Requests sent to the shard and not yet answered.
    pub mailbox_depth: IntGauge,
    /// Requests per committed round.
    pub batch_size: Histogram,
    /// Applying a round's requests in memory.
    pub apply_seconds: Histogram,
    /// Sealing a round's batch on the shard's thread (with a checkpoint under
    /// way, a slice of its leaf copy).
    pub seal_seconds: Histogram,
    /// Writing a round's batch to the journal.
    pub commit_seconds: Histogram,
    /// Making it durable (fsync).
    pub fsync_seconds: Histogram,
    /// Writing the overlay as sorted runs (and a checkpoint's leaves).
    pub run_seconds: Histogram,
    /// Players whose changed records wait in memory for the next run.
    pub unwritten_players: IntGauge,
    /// Sealed runs held in memory until the runs thread writes them.
    pub unwritten_runs: IntGauge,
    /// Count-tree changes logged since the last checkpoint began.
    pub logged_changes: IntGauge,
    /// Checkpoints written.
    pub checkpoints: IntCounter,
    /// Bytes in fjall's memtables, taking writes or sealed.
    pub memtable_bytes: IntGauge,
    /// Sealed memtables waiting for fjall's worker to flush them.
    pub sealed_memtables: IntGauge,
    /// Time fjall's worker spent compacting.
    pub compaction_seconds: Counter,
    /// Player-record lookups the record cache answered.
    pub cache_hits: IntCounter,
    /// Player-record lookups that missed the record cache.
    pub cache_misses: IntCounter,
    /// Writes (set, set_many entries, removes) committed.
    pub writes_applied: IntCounter,
    /// Failed commits (nothing of the round was acknowledged).
    pub commit_errors: IntCounter,
    /// Count-tree leaves looked at by repacking passes.
    pub repack_visited: IntCounter,
    /// Of those, leaves moved to pack the allocator's slabs.
    pub repack_moved: IntCounter,
    /// Players held, over all boards.
    pub players: IntGauge,
    /// 1 while writes are refused after a storage failure.
    pub degraded: IntGauge,
}

impl ShardMetrics {
    /// Counts record-cache lookups taken from the shard's engine (by its
    /// actor after a round, or by the router after a rank in place).
    pub fn count_lookups(&self, lookups: rankd_shards::Lookups) {
        self.cache_hits.inc_by(lookups.hits);
        self.cache_misses.inc_by(lookups.misses);
    }
}

/// All of rankd's metrics.
pub struct Metrics {
    registry: Registry,
    /// Per op, indexed by [`OpKind`].
    ops: Vec<OpMetrics>,
    /// Frames that could not be decoded into a request (no op known).
    undecodable: OpMetrics,
    /// Per shard.
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
    /// Bytes read from clients.
    pub received_bytes: IntCounter,
    /// Bytes written to clients.
    pub sent_bytes: IntCounter,
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
    /// off to measure what they cost (`--no-request-metrics`).
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
        let requests = IntCounterVec::new(
            Opts::new("rankd_requests_total", "Requests answered, by op and outcome (ok or error code)."),
            &["op", "outcome"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(REQUEST_DURATION, "Time from decoding a request to having its reply, by op.")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        )?;
        let op = |name: &str| -> OpMetrics {
            OpMetrics {
                outcomes: outcome_labels().map(|o| requests.with_label_values(&[name, o])).collect(),
                duration: duration.with_label_values(&[name]),
            }
        };
        let ops = OpKind::ALL.iter().map(|kind| op(kind.name())).collect();
        let undecodable = op("undecodable");

        let shard_gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["shard"]);
        let shard_histogram = |name: &str, help: &str, buckets: &[f64]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), &["shard"])
        };
        let shard_counter = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["shard"]);
        let mailbox = shard_gauge("rankd_shard_mailbox_depth", "Requests sent to the shard and not yet answered.")?;
        let batch = shard_histogram(
            "rankd_shard_batch_size",
            "Requests applied per round (one atomic batch).",
            &BATCH_BUCKETS,
        )?;
        let apply = shard_histogram(
            "rankd_shard_batch_apply_seconds",
            "Time applying a round's requests in memory.",
            &LATENCY_BUCKETS,
        )?;
        let seal = shard_histogram(
            "rankd_shard_seal_seconds",
            "Time the shard's thread spends sealing a round's batch for the committer; while a checkpoint is \
             taken it copies a slice of the count-tree leaves out, and every request to the shard waits.",
            &LATENCY_BUCKETS,
        )?;
        let commit = shard_histogram(
            "rankd_shard_commit_seconds",
            "Time writing a round's batch to the journal.",
            &LATENCY_BUCKETS,
        )?;
        let fsync =
            shard_histogram("rankd_shard_fsync_seconds", "Time making a round durable (fsync).", &LATENCY_BUCKETS)?;
        let runs = shard_histogram(
            "rankd_shard_run_seconds",
            "Time writing the changed player records and index entries as sorted runs (and a checkpoint's leaves).",
            &LATENCY_BUCKETS,
        )?;
        let unwritten = shard_gauge(
            "rankd_shard_unwritten_players",
            "Players whose changed records are held in memory (and in the change log) until the next run.",
        )?;
        let unwritten_runs = shard_gauge(
            "rankd_shard_unwritten_runs",
            "Sealed runs (frozen overlays) held in memory until the runs thread writes them; past 4 the shard waits for it.",
        )?;
        let logged_changes = shard_gauge(
            "rankd_shard_logged_changes",
            "Count-tree changes logged since the shard's last checkpoint began: what a restart after a crash replays \
             into the trees (plus, while the checkpoint before is still being written, its share). Saw-tooths below \
             max(players / 2, 100k) per shard, at most 400k, when checkpoints keep up.",
        )?;
        let checkpoints = shard_counter(
            "rankd_shard_checkpoints_total",
            "Checkpoints written: changed count-tree leaves stored, and the change log they hold deleted.",
        )?;
        let memtable_bytes = shard_gauge(
            "rankd_shard_memtable_bytes",
            "Bytes held in the shard's fjall memtables, taking writes or sealed and waiting to be flushed. A memtable \
             is sealed at 8 MiB while the worker keeps up, and grows past that while it is behind.",
        )?;
        let sealed_memtables = shard_gauge(
            "rankd_shard_sealed_memtables",
            "Sealed memtables waiting for fjall's worker to flush them (it flushes and compacts in turn). From 2 in \
             a keyspace its full memtable keeps taking writes and grows; at 4 fjall would halt its writes.",
        )?;
        let compaction_seconds = CounterVec::new(
            Opts::new(
                "rankd_shard_compaction_seconds_total",
                "Time fjall's worker spent compacting the shard's tables. A rate near 1 means it compacts without \
                 pause and flushes wait behind compactions.",
            ),
            &["shard"],
        )?;
        let cache_hits = shard_counter(
            "rankd_shard_record_cache_hits_total",
            "Player-record lookups (writes and ranks) answered by the in-memory record cache.",
        )?;
        let cache_misses = shard_counter(
            "rankd_shard_record_cache_misses_total",
            "Player-record lookups that missed the record cache: read from unwritten changes or, mostly, storage (a larger --cache-mb makes fewer).",
        )?;
        let writes = shard_counter("rankd_shard_writes_applied_total", "Writes committed.")?;
        let errors = shard_counter("rankd_shard_commit_errors_total", "Failed commits.")?;
        let repack_visited = shard_counter(
            "rankd_shard_repack_leaves_visited_total",
            "Count-tree leaves looked at by repacking passes (one pass over every leaf after each checkpoint).",
        )?;
        let repack_moved = shard_counter(
            "rankd_shard_repack_leaves_moved_total",
            "Count-tree leaves moved off sparse allocator slabs, so the allocator can return emptied pages.",
        )?;
        let players = shard_gauge("rankd_shard_players", "Players held, over all boards.")?;
        let degraded = shard_gauge(
            "rankd_shard_degraded",
            "1 while the shard refuses writes after a storage failure (reads go on; it retries each second).",
        )?;
        let shard_metrics = (0..shards)
            .map(|i| {
                let label = i.to_string();
                let l = [label.as_str()];
                ShardMetrics {
                    mailbox_depth: mailbox.with_label_values(&l),
                    batch_size: batch.with_label_values(&l),
                    apply_seconds: apply.with_label_values(&l),
                    seal_seconds: seal.with_label_values(&l),
                    commit_seconds: commit.with_label_values(&l),
                    fsync_seconds: fsync.with_label_values(&l),
                    run_seconds: runs.with_label_values(&l),
                    unwritten_players: unwritten.with_label_values(&l),
                    unwritten_runs: unwritten_runs.with_label_values(&l),
                    logged_changes: logged_changes.with_label_values(&l),
                    checkpoints: checkpoints.with_label_values(&l),
                    memtable_bytes: memtable_bytes.with_label_values(&l),
                    sealed_memtables: sealed_memtables.with_label_values(&l),
                    compaction_seconds: compaction_seconds.with_label_values(&l),
                    cache_hits: cache_hits.with_label_values(&l),
                    cache_misses: cache_misses.with_label_values(&l),
                    writes_applied: writes.with_label_values(&l),
                    commit_errors: errors.with_label_values(&l),
                    repack_visited: repack_visited.with_label_values(&l),
                    repack_moved: repack_moved.with_label_values(&l),
                    players: players.with_label_values(&l),
                    degraded: degraded.with_label_values(&l),
                }
            })
            .collect();

        let connections_open = IntGauge::new("rankd_connections_open", "Client connections open.")?;
        let connections_accepted = IntCounter::new("rankd_connections_accepted_total", "Client connections accepted.")?;
        let connections_refused = IntCounter::new(
            "rankd_connections_refused_total",
            "Client connections refused at --max-connections (answered `overloaded`).",
        )?;
        let ranks_in_place = IntCounter::new(
            "rankd_ranks_in_place_total",
            "Ranks answered in place from the shards' engines on the connections' thread, without queueing behind \
             a shard's round: those a client waits for alone (nothing else of its connection in flight, at most 4 \
             in its batch, none after a write in it), when every shard's lock is free. The others are queued.",
        )?;
        let received_bytes = IntCounter::new("rankd_received_bytes_total", "Bytes read from clients.")?;
        let sent_bytes = IntCounter::new("rankd_sent_bytes_total", "Bytes written to clients.")?;
        let fanout = HistogramVec::new(
            HistogramOpts::new(
                "rankd_fanout_duration_seconds",
                "Time of one cross-shard read round (all shards answered), by op.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["op"],
        )?;
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

        for collector in [
            Box::new(requests) as Box<dyn prometheus::core::Collector>,
            Box::new(duration),
            Box::new(mailbox),
            Box::new(batch),
            Box::new(apply),
            Box::new(seal),
            Box::new(commit),
            Box::new(fsync),
            Box::new(runs),
            Box::new(unwritten),
            Box::new(unwritten_runs),
            Box::new(logged_changes),
            Box::new(checkpoints),
            Box::new(memtable_bytes),
            Box::new(sealed_memtables),
            Box::new(compaction_seconds),
            Box::new(cache_hits),
            Box::new(cache_misses),
            Box::new(writes),
            Box::new(errors),
            Box::new(repack_visited),
            Box::new(repack_moved),
            Box::new(players),
            Box::new(degraded),
            Box::new(connections_open.clone()),
            Box::new(connections_accepted.clone()),
            Box::new(connections_refused.clone()),
            Box::new(ranks_in_place.clone()),
            Box::new(received_bytes.clone()),
            Box::new(sent_bytes.clone()),
            Box::new(fanout.clone()),
            Box::new(build_info),
            Box::new(ready_gauge.clone()),
        ]
        .into_iter()
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
            received_bytes,
            sent_bytes,
            fanout: OpKind::ALL
                .iter()
                .map(|kind| FANOUT_OPS.contains(kind).then(|| fanout.with_label_values(&[kind.name()])))
                .collect(),
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

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let render = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = render.clone();
                async move {
                    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics.render())
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = metrics.ready.load(Ordering::Relaxed);
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        );
    actix_rt::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_move_the_exposed_series() {
        let metrics = Metrics::new(2).unwrap();
        for _ in 0..5 {
            metrics.op(Some(OpKind::Set)).finish(Ok(()), Duration::from_micros(80));
        }
        metrics.op(Some(OpKind::Rank)).finish(Err(ErrorCode::BadRequest), Duration::from_micros(10));
        metrics.op(None).finish(Err(ErrorCode::BadFrame), Duration::from_micros(10));
        metrics.shards[1].commit_seconds.observe(0.3);
        let text = metrics.render();
        assert!(text.contains(r#"rankd_requests_total{op="set",outcome="ok"} 5"#), "{text}");
        assert!(text.contains(r#"rankd_requests_total{op="rank",outcome="bad_request"} 1"#));
        assert!(text.contains(r#"rankd_requests_total{op="undecodable",outcome="bad_frame"} 1"#));
        assert!(text.contains(r#"rankd_requests_total{op="set",outcome="internal"} 0"#));
        // A slow commit lands above the 250 ms bucket.
        assert!(text.contains(r#"rankd_shard_commit_seconds_bucket{shard="1",le="0.25"} 0"#));
        assert!(text.contains(r#"rankd_shard_commit_seconds_bucket{shard="1",le="0.5"} 1"#));
        assert!(text.contains("rankd_build_info{"));
    }

    #[test]
    fn latency_buckets_hold_one_millisecond() {
        // rankd-bench reports the share of requests over 1 ms from them.
        assert!(LATENCY_BUCKETS.contains(&1e-3));
    }
}
