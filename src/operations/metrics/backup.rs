//! Backups: how long each took and the bytes streamed. They run for minutes
//! to hours, past the request histogram's top bucket (10 s), so they have
//! their own; their outcomes are `rankd_requests_total{op="backup"}`.

use prometheus::{Histogram, HistogramOpts, IntCounter};

use super::{Collectors, MetricsError};

/// From a tenth of a second (a small server's backup) to 2 hours.
const BACKUP_BUCKETS: [f64; 14] =
    [0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0];

/// The backup metrics.
pub struct BackupMetrics {
    /// Time of each backup that streamed, to its last frame.
    pub duration: Histogram,
    /// Bytes of backup frames written to clients, as they go.
    pub bytes: IntCounter,
}

impl BackupMetrics {
    pub(super) fn new() -> Result<(Self, Collectors), MetricsError> {
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "rankd_backup_duration_seconds",
                "Time of each backup that took its images, from the request to its last frame, whatever its \
                 outcome (rankd_requests_total{op=\"backup\"} counts outcomes, refusals included).",
            )
            .buckets(BACKUP_BUCKETS.to_vec()),
        )?;
        let bytes = IntCounter::new(
            "rankd_backup_bytes_total",
            "Bytes of backup frames written to clients (stored keys and values, framed), counted as they are \
             sent: its rate is a running backup's progress.",
        )?;
        let families: Collectors = vec![Box::new(duration.clone()), Box::new(bytes.clone())];
        Ok((Self { duration, bytes }, families))
    }
}
