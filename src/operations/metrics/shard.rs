//! Per-shard metrics: a shard's queue, its rounds and commits, the storage
//! work behind them and what the engine holds, one series per shard.

use prometheus::{
    Counter, CounterVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use super::{Collectors, LATENCY_BUCKETS};

/// Requests per batch.
const BATCH_BUCKETS: [f64; 12] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

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
    /// Trees (dropped boards', expired periods') whose keys are still being deleted.
    pub trees_being_deleted: IntGauge,
    /// Small, idle trees held frozen (one sorted leaf, inline).
    pub frozen_trees: IntGauge,
    /// Trees held in the compact form (one sorted leaf: every small board's),
    /// taking writes or in a checkpoint.
    pub compact_trees: IntGauge,
    /// Trees burst into count-tree nodes (boards past ~64 distinct keys here).
    pub burst_trees: IntGauge,
    /// Checkpoints written.
    pub checkpoints: IntCounter,
    /// Bytes in fjall's memtables, taking writes or sealed.
    pub memtable_bytes: IntGauge,
    /// Sealed memtables waiting for fjall's worker to flush them.
    pub sealed_memtables: IntGauge,
    /// Bytes the shard's storage takes on disk.
    pub disk_bytes: IntGauge,
    /// Bytes free for rankd on the shard directory's filesystem.
    pub disk_available_bytes: IntGauge,
    /// Time fjall's worker spent compacting.
    pub compaction_seconds: Counter,
    /// Player-record lookups the record cache answered.
    pub cache_hits: IntCounter,
    /// Player-record lookups that missed the record cache.
    pub cache_misses: IntCounter,
    /// Player records a write or a read took from a small board's count tree
    /// instead.
    pub tree_reads: IntCounter,
    /// Writes (set, set_many entries, removes) committed.
    pub writes_applied: IntCounter,
    /// Failures of the commit pipeline the shard took (nothing of a failed
    /// round was acknowledged); kept by the shard's `Health`.
    pub commit_errors: IntCounter,
    /// Count-tree leaves looked at by repacking passes.
    pub repack_visited: IntCounter,
    /// Of those, leaves moved to pack the allocator's slabs.
    pub repack_moved: IntCounter,
    /// Players held, over all boards.
    pub players: IntGauge,
    /// 1 while writes are refused after a storage failure; kept by the
    /// shard's `Health`, so it follows every failure whatever its kind.
    pub degraded: IntGauge,
    /// `wid` records of idempotent writes held (within the dedup horizon).
    pub dedup_records: IntGauge,
    /// Memory those records take, roughly.
    pub dedup_bytes: IntGauge,
    /// Records dropped before the horizon to stay under the memory bound.
    pub dedup_early_expiries: IntCounter,
}

impl ShardMetrics {
    /// Counts record-cache lookups taken from the shard's engine (by its
    /// actor after a round, or by the router after a rank in place).
    pub fn count_lookups(&self, lookups: rankd_shards::Lookups) {
        self.cache_hits.inc_by(lookups.hits);
        self.cache_misses.inc_by(lookups.misses);
        self.tree_reads.inc_by(lookups.from_trees);
    }
}

/// Creates the per-shard metric families and resolves the handles of
/// `shards` shards; returns the handles and the families to register.
pub(super) fn shard_metrics(shards: usize) -> Result<(Vec<ShardMetrics>, Collectors), prometheus::Error> {
    let shard_gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["shard"]);
    let shard_histogram = |name: &str, help: &str, buckets: &[f64]| {
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), &["shard"])
    };
    let shard_counter = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["shard"]);
    let mailbox = shard_gauge("rankd_shard_mailbox_depth", "Requests sent to the shard and not yet answered.")?;
    let batch =
        shard_histogram("rankd_shard_batch_size", "Requests applied per round (one atomic batch).", &BATCH_BUCKETS)?;
    let apply = shard_histogram(
        "rankd_shard_batch_apply_seconds",
        "Time applying a round's requests in memory.",
        &LATENCY_BUCKETS,
    )?;
    let seal = shard_histogram(
        "rankd_shard_seal_seconds",
        "Time sealing a round's batch for the committer (on the shard's thread, or on the committer or an I/O \
         thread that seals what was staged, one at a time); while a checkpoint is taken it copies a slice of the \
         count-tree leaves out, and every request to the shard waits.",
        &LATENCY_BUCKETS,
    )?;
    let commit = shard_histogram(
        "rankd_shard_commit_seconds",
        "Time writing a round's batch to the journal.",
        &LATENCY_BUCKETS,
    )?;
    let fsync = shard_histogram("rankd_shard_fsync_seconds", "Time making a round durable (fsync).", &LATENCY_BUCKETS)?;
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
    let trees_being_deleted = shard_gauge(
        "rankd_shard_trees_being_deleted",
        "Trees of dropped boards and expired periods whose stored keys the shard is still deleting, in bounded \
         steps once a second; they answer nothing meanwhile.",
    )?;
    let trees = IntGaugeVec::new(
        Opts::new(
            "rankd_shard_trees",
            "Count trees held (one per board window period with players on the shard), by form: `frozen` is one \
             sorted leaf of keys and counts kept inline while idle (small boards' trees between writes), \
             `compact` such a leaf taking writes or in a checkpoint, `tree` has burst into nodes (as of the last \
             checkpoint).",
        ),
        &["shard", "form"],
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
    let disk_bytes = shard_gauge(
        "rankd_shard_disk_bytes",
        "Bytes the shard's storage takes on disk (fjall's tables and journal), read once a second.",
    )?;
    let disk_available_bytes = shard_gauge(
        "rankd_shard_disk_available_bytes",
        "Bytes still free for rankd on the filesystem of the shard's directory (statvfs f_bavail), read once a \
         second: at zero commits fail and the shard refuses writes (rankd_shard_degraded).",
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
    let tree_reads = shard_counter(
        "rankd_shard_record_tree_reads_total",
        "Player records (of writes and reads) taken from a small board's count tree, asking neither the record cache \
         nor storage (names of up to 7 bytes on boards with competition or dense ties).",
    )?;
    let writes = shard_counter("rankd_shard_writes_applied_total", "Writes committed.")?;
    let errors = shard_counter(
        "rankd_shard_commit_errors_total",
        "Failures of the shard's commit pipeline: a journal write, fsync or runs write that failed, or a pipeline \
         thread that panicked. Each refuses the shard's writes until its storage reopens (rankd_shard_degraded); \
         failures met between two of the shard's looks at its pipeline count once.",
    )?;
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
    let dedup_records = shard_gauge(
        "rankd_dedup_records",
        "Records of idempotent writes' `wid`s held, each until the dedup horizon passes (--dedup-horizon-secs).",
    )?;
    let dedup_bytes = shard_gauge("rankd_dedup_bytes", "Memory the `wid` records take, roughly (--dedup-memory-mb).")?;
    let dedup_early = shard_counter(
        "rankd_dedup_early_expiries_total",
        "`wid` records dropped before the dedup horizon to stay under --dedup-memory-mb: retries of those writes \
         would apply again.",
    )?;
    let handles = (0..shards)
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
                trees_being_deleted: trees_being_deleted.with_label_values(&l),
                frozen_trees: trees.with_label_values(&[label.as_str(), "frozen"]),
                compact_trees: trees.with_label_values(&[label.as_str(), "compact"]),
                burst_trees: trees.with_label_values(&[label.as_str(), "tree"]),
                checkpoints: checkpoints.with_label_values(&l),
                memtable_bytes: memtable_bytes.with_label_values(&l),
                sealed_memtables: sealed_memtables.with_label_values(&l),
                disk_bytes: disk_bytes.with_label_values(&l),
                disk_available_bytes: disk_available_bytes.with_label_values(&l),
                compaction_seconds: compaction_seconds.with_label_values(&l),
                cache_hits: cache_hits.with_label_values(&l),
                cache_misses: cache_misses.with_label_values(&l),
                tree_reads: tree_reads.with_label_values(&l),
                writes_applied: writes.with_label_values(&l),
                commit_errors: errors.with_label_values(&l),
                repack_visited: repack_visited.with_label_values(&l),
                repack_moved: repack_moved.with_label_values(&l),
                players: players.with_label_values(&l),
                degraded: degraded.with_label_values(&l),
                dedup_records: dedup_records.with_label_values(&l),
                dedup_bytes: dedup_bytes.with_label_values(&l),
                dedup_early_expiries: dedup_early.with_label_values(&l),
            }
        })
        .collect();
    let families: Collectors = vec![
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
        Box::new(trees_being_deleted),
        Box::new(trees),
        Box::new(checkpoints),
        Box::new(memtable_bytes),
        Box::new(sealed_memtables),
        Box::new(disk_bytes),
        Box::new(disk_available_bytes),
        Box::new(compaction_seconds),
        Box::new(cache_hits),
        Box::new(cache_misses),
        Box::new(tree_reads),
        Box::new(writes),
        Box::new(errors),
        Box::new(repack_visited),
        Box::new(repack_moved),
        Box::new(players),
        Box::new(degraded),
        Box::new(dedup_records),
        Box::new(dedup_bytes),
        Box::new(dedup_early),
    ];
    Ok((handles, families))
}
