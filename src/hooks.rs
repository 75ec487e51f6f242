//! Test and debug hooks: settings that make a fast machine behave like a
//! slow disk or a busy shard, move the clock, or switch a path off, so the
//! tests can reach what production only meets under load. Compiled only
//! with the `test-hooks` feature: a release build has none of them.

use std::time::Duration;

use clap::Args;

/// The hooks, as `rankd serve` flags.
#[derive(Debug, Clone, Default, Args)]
pub struct TestHooks {
    /// Every commit first sleeps this long (a slow disk).
    #[arg(long = "debug-commit-delay-ms", default_value_t = 0)]
    pub commit_delay_ms: u64,
    /// The runs thread sleeps this long before writing the runs of each
    /// group of answered batches (a slow disk, or a starved thread).
    #[arg(long = "debug-runs-delay-ms", default_value_t = 0)]
    pub runs_delay_ms: u64,
    /// Write changed players as runs every this many, so tests reach many runs.
    #[arg(long = "debug-run-every")]
    pub run_every: Option<usize>,
    /// Checkpoint the count trees after this many logged changes, so tests
    /// reach checkpoints and the repacking passes that follow them.
    #[arg(long = "debug-checkpoint-every")]
    pub checkpoint_every: Option<u64>,
    /// Copy at least this many count-tree leaves per sealed batch for a
    /// checkpoint, so tests spread checkpoints over many batches.
    #[arg(long = "debug-checkpoint-slice-leaves")]
    pub checkpoint_slice_leaves: Option<usize>,
    /// Seal memtables past this many KiB, so tests reach many fjall flushes
    /// and compactions.
    #[arg(long = "debug-memtable-kib")]
    pub memtable_kib: Option<u64>,
    /// Queue every lone rank and write for the shards, never handling one
    /// in place, so tests cover the queued paths with lone requests too.
    #[arg(long = "debug-queue-lone")]
    pub queue_lone: bool,
    /// Do not update per-request and per-batch metrics (to measure their cost).
    #[arg(long = "debug-no-request-metrics")]
    pub no_request_metrics: bool,
    /// Shift the server's clock by this many seconds, so a test can start
    /// just before a day, week or month boundary and watch it roll over.
    #[arg(long = "debug-clock-offset-secs", default_value_t = 0, allow_hyphen_values = true)]
    pub clock_offset_secs: i64,
    /// Approximate ranks aim for this many buckets per shard instead of
    /// 4096, so a test board of a few thousand players gets buckets of
    /// many players and wide error bounds to check.
    #[arg(long = "debug-approx-buckets")]
    pub approx_buckets: Option<usize>,
}

impl TestHooks {
    /// The sleep before each commit.
    pub fn commit_delay(&self) -> Duration {
        Duration::from_millis(self.commit_delay_ms)
    }

    /// The sleep before each group's runs are written.
    pub fn runs_delay(&self) -> Duration {
        Duration::from_millis(self.runs_delay_ms)
    }
}
