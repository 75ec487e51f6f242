//! The server's own view of request latency, from its
//! `rankd_request_duration_seconds` histograms: how much of what the load
//! generator measured was the server, and how much the way there and back.
//!
//! On a busy 2-core machine the two differ a lot: much of a slow tail the
//! client sees is thread hand-offs between processes, not the server (see
//! docs/performance-history.md). The figures are estimates within the
//! server's bucket bounds (25 us, 50, 100, 250, 500, 1 ms, ...),
//! interpolated inside a bucket the way Prometheus's `histogram_quantile`
//! does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The server's request-latency histogram (rankd's
/// `rankd_request_duration_seconds`; the bench smoke test fails if the two
/// names part).
const REQUEST_DURATION: &str = "rankd_request_duration_seconds";

/// The bound, in seconds, whose share beyond it is reported: one of the
/// server's buckets (`metrics::LATENCY_BUCKETS`), so the share is exact.
const SLOW_SECONDS: f64 = 1e-3;

/// Each op's cumulative buckets: `(upper bound in seconds, requests at or
/// under it)`, in bound order, the last `+Inf`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Histograms(BTreeMap<String, Vec<(f64, f64)>>);

/// One op's latency as the server measured it over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpLatency {
    /// Requests the server answered.
    pub requests: u64,
    /// Median, microseconds (estimated within its bucket).
    pub p50_us: f64,
    /// 99th percentile, microseconds (estimated within its bucket).
    pub p99_us: f64,
    /// Share of requests (0 to 1) that took more than 1 ms: exact, 1 ms
    /// being a bucket bound.
    pub over_1ms: f64,
}

impl Histograms {
    /// The histograms in a Prometheus text page (empty if it has none).
    pub fn in_page(page: &str) -> Self {
        let mut ops: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for line in page.lines() {
            let buckets = line.strip_prefix(REQUEST_DURATION).and_then(|rest| rest.strip_prefix("_bucket{"));
            let Some((labels, value)) = buckets.and_then(|rest| rest.split_once("} ")) else {
                continue;
            };
            let label = |name: &str| {
                labels.split(',').find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
            };
            // Rust's float parsing reads Prometheus's `+Inf` as infinity.
            let bound = label("le").and_then(|le| le.parse::<f64>().ok());
            let (Some(op), Some(bound), Ok(count)) = (label("op"), bound, value.trim().parse()) else {
                continue;
            };
            ops.entry(op.to_string()).or_default().push((bound, count));
        }
        for buckets in ops.values_mut() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Self(ops)
    }

    /// What was observed from `earlier` to `self`.
    pub fn since(&self, earlier: &Histograms) -> Histograms {
        let ops = self.0.iter().map(|(op, buckets)| {
            let before = earlier.0.get(op);
            let buckets = buckets
                .iter()
                .map(|&(bound, count)| {
                    let was = before.and_then(|b| b.iter().find(|(le, _)| *le == bound)).map_or(0.0, |(_, c)| *c);
                    (bound, count - was)
                })
                .collect();
            (op.clone(), buckets)
        });
        Histograms(ops.collect())
    }

    /// Each op that saw requests, summarised.
    pub fn summary(&self) -> BTreeMap<String, OpLatency> {
        self.0.iter().filter_map(|(op, buckets)| Some((op.clone(), summarise(buckets)?))).collect()
    }
}

/// `None` without requests, or without the 1 ms bound or `+Inf`.
fn summarise(buckets: &[(f64, f64)]) -> Option<OpLatency> {
    let &(last, total) = buckets.last()?;
    if last != f64::INFINITY || total < 1.0 {
        return None;
    }
    let under_slow = buckets.iter().find(|(bound, _)| *bound == SLOW_SECONDS)?.1;
    Some(OpLatency {
        requests: total as u64,
        p50_us: quantile(buckets, 0.5) * 1e6,
        p99_us: quantile(buckets, 0.99) * 1e6,
        over_1ms: 1.0 - under_slow / total,
    })
}

/// The `q` quantile, seconds: linear within the bucket it falls in; in the
/// `+Inf` bucket, the largest finite bound (all that is known).
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    let wanted = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= wanted && count > below {
            if bound == f64::INFINITY {
                return lower;
            }
            return lower + (bound - lower) * (wanted - below) / (count - below);
        }
        (lower, below) = (bound, count);
    }
    lower
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(rank: [u64; 4]) -> String {
        let [fast, under_ms, under_10ms, all] = rank;
        format!(
            "# TYPE rankd_request_duration_seconds histogram\n\
             rankd_request_duration_seconds_bucket{{op=\"rank\",le=\"0.0005\"}} {fast}\n\
             rankd_request_duration_seconds_bucket{{op=\"rank\",le=\"0.001\"}} {under_ms}\n\
             rankd_request_duration_seconds_bucket{{op=\"rank\",le=\"0.01\"}} {under_10ms}\n\
             rankd_request_duration_seconds_bucket{{op=\"rank\",le=\"+Inf\"}} {all}\n\
             rankd_request_duration_seconds_bucket{{le=\"0.001\",op=\"set\"}} 0\n\
             rankd_request_duration_seconds_bucket{{le=\"+Inf\",op=\"set\"}} 0\n\
             rankd_request_duration_seconds_sum{{op=\"rank\"}} 1.5\n\
             rankd_shard_batch_apply_seconds_bucket{{shard=\"0\",le=\"0.001\"}} 7\n"
        )
    }

    #[test]
    fn summarises_what_a_run_added() {
        let before = Histograms::in_page(&page([100, 100, 100, 100]));
        let after = Histograms::in_page(&page([600, 1090, 1100, 1100]));
        let run = after.since(&before).summary();
        // `set` saw nothing; other histograms are not requests.
        assert_eq!(run.keys().collect::<Vec<_>>(), ["rank"]);
        let rank = &run["rank"];
        assert_eq!(rank.requests, 1000);
        assert!((rank.over_1ms - 0.01).abs() < 1e-12, "{rank:?}");
        // 500 of 1000 fall in the first bucket: its upper bound.
        assert!((rank.p50_us - 500.0).abs() < 1e-6, "{rank:?}");
        // The 990th is the 490th of 490 in (0.5 ms, 1 ms].
        assert!((rank.p99_us - 1000.0).abs() < 1e-6, "{rank:?}");
    }

    #[test]
    fn interpolates_within_a_bucket_and_stops_at_the_last_bound() {
        let buckets = [(0.001, 0.0), (0.002, 100.0), (f64::INFINITY, 100.0)];
        assert!((quantile(&buckets, 0.5) - 0.0015).abs() < 1e-12);
        assert!((quantile(&buckets, 0.99) - 0.00199).abs() < 1e-12);
        let slow = [(0.001, 10.0), (0.002, 10.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(&slow, 0.99), 0.002, "beyond the last bound, the last bound");
        assert_eq!(summarise(&[(0.002, 5.0), (f64::INFINITY, 5.0)]), None, "no 1 ms bound");
        assert_eq!(Histograms::in_page("rankd_ready 1\n"), Histograms::default());
    }
}
