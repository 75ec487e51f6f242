//! Whether a shard's storage works, and when to try reopening it: the
//! failure and recovery rules of the batch loop.

use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};

use crate::error::Error;
use crate::operations::metrics::ShardMetrics;

/// How long a degraded shard waits between attempts to reopen its storage.
pub const RECOVERY_RETRY: Duration = Duration::from_secs(1);

/// After a commit, fsync or run fails, the storage is poisoned: writes are
/// refused (never falsely acknowledged) while reads go on from memory, and
/// once the pipeline has let go of the storage it is reopened, once a
/// second, until it opens again.
///
/// It keeps the shard's `rankd_shard_degraded` and
/// `rankd_shard_commit_errors_total` itself: whatever failed (a write, an
/// fsync, a run, or a pipeline thread that panicked, which no commit event
/// reports), the gauge is 1 exactly while writes are refused.
#[derive(Debug)]
pub struct Health {
    /// Why writes are refused, while they are.
    degraded: Option<String>,
    /// While degraded: when to try reopening next.
    retry_at: Instant,
    /// `rankd_shard_degraded`: 1 while `degraded` is set.
    gauge: IntGauge,
    /// `rankd_shard_commit_errors_total`: every failure recorded.
    errors: IntCounter,
}

impl Health {
    /// Healthy, shown in `metrics` (one shard's).
    pub fn new(now: Instant, metrics: &ShardMetrics) -> Self {
        metrics.degraded.set(0);
        Self { degraded: None, retry_at: now, gauge: metrics.degraded.clone(), errors: metrics.commit_errors.clone() }
    }

    /// Whether writes are refused.
    pub fn is_degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// The answer a write gets while the storage is failing.
    pub fn refusal(&self) -> Option<Error> {
        let why = self.degraded.as_ref()?;
        Some(Error::Internal(format!("writes are refused until storage recovers ({why})")))
    }

    /// Records a failure (each counts as a commit error); returns whether
    /// it is a new one (the first since the storage last worked), which the
    /// caller logs.
    pub fn failed(&mut self, why: String, now: Instant) -> bool {
        self.errors.inc();
        if self.degraded.is_some() {
            return false;
        }
        self.degraded = Some(why);
        self.retry_at = now + RECOVERY_RETRY;
        self.gauge.set(1);
        true
    }

    /// Whether to reopen the storage now: degraded, nothing of the old
    /// opening still in the pipeline (it holds the storage open), and the
    /// retry time reached.
    pub fn should_reopen(&self, now: Instant, unfinished: u64) -> bool {
        self.degraded.is_some() && unfinished == 0 && now >= self.retry_at
    }

    /// A reopen failed: try again later.
    pub fn reopen_failed(&mut self, now: Instant) {
        self.retry_at = now + RECOVERY_RETRY;
    }

    /// The storage reopened: writes resume.
    pub fn recovered(&mut self) {
        self.degraded = None;
        self.gauge.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_refuses_writes_until_a_reopen_after_the_pipeline_let_go() {
        let start = Instant::now();
        let metrics = crate::operations::metrics::Metrics::new(1).unwrap();
        let shown = &metrics.shards[0];
        let mut health = Health::new(start, shown);
        assert!(health.refusal().is_none() && !health.should_reopen(start, 0));
        assert!(health.failed("fsync failed".into(), start));
        assert!(!health.failed("again".into(), start), "only the first failure is new");
        assert_eq!((shown.degraded.get(), shown.commit_errors.get()), (1, 2), "both failures count");
        let refusal = health.refusal().map(|e| e.to_string()).unwrap_or_default();
        assert!(refusal.contains("fsync failed"), "{refusal}");
        assert!(!health.should_reopen(start, 0), "not before the retry time");
        let later = start + RECOVERY_RETRY;
        assert!(!health.should_reopen(later, 1), "not while the pipeline holds the storage");
        assert!(health.should_reopen(later, 0));
        health.reopen_failed(later);
        assert!(!health.should_reopen(later, 0) && health.should_reopen(later + RECOVERY_RETRY, 0));
        assert_eq!(shown.degraded.get(), 1, "still degraded after a failed reopen");
        health.recovered();
        assert!(!health.is_degraded() && health.refusal().is_none());
        assert_eq!(shown.degraded.get(), 0);
    }
}
