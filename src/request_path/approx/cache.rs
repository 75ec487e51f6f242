//! The summaries held, one per tree asked about: found or made on an ask,
//! refreshed by a task of their own, dropped when idle or to make room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rankd_shards::TreeId;
use tokio::sync::watch;

use super::summary::Summary;
use super::ApproxError;
use crate::operations::metrics::ApproxMetrics;

/// How summaries are made and kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Buckets each shard aims for: a bucket holds about `1 / buckets` of
    /// the board, so the error stays under about that share.
    pub buckets: usize,
    /// Most boundaries a summary keeps (the shards' boundaries, merged,
    /// are thinned to it): 24 bytes each.
    pub max_bounds: usize,
    /// Time from the start of one refresh to the start of the next.
    pub interval: Duration,
    /// A summary nobody asked about for this long is dropped.
    pub idle: Duration,
    /// Most summaries held at once; making one more drops the one asked
    /// about least recently.
    pub max_held: usize,
}

impl Default for Limits {
    /// 4096 buckets (an error of at most ~0.025% of the board outside
    /// single scores), refreshed every 250 ms, at most 64 summaries of at
    /// most 16384 boundaries: ~0.6 MB each, ~40 MB in all.
    fn default() -> Self {
        Self {
            buckets: 4096,
            max_bounds: 16_384,
            interval: Duration::from_millis(250),
            idle: Duration::from_secs(60),
            max_held: 64,
        }
    }
}

/// A summary as published: its counts and when their round started.
#[derive(Debug, Clone)]
pub struct Fresh {
    /// The counts.
    pub summary: Arc<Summary>,
    /// When the round that counted them was sent.
    pub at: Instant,
}

/// What a held summary's readers see: nothing yet, the latest summary, or
/// why the first could not be made.
type Published = Option<Result<Fresh, ApproxError>>;

/// One tree's summary, as held.
pub struct Held {
    /// The tree summarised.
    pub tree: TreeId,
    /// The latest summary, to borrow or wait for.
    latest: watch::Sender<Published>,
    /// When it was last asked for, in milliseconds since the cache began.
    asked_ms: AtomicU64,
    /// Set once dropped from the cache: its refresher stops.
    dropped: AtomicBool,
}

impl Held {
    /// The latest summary, if one was made.
    pub fn now(&self) -> Option<Result<Fresh, ApproxError>> {
        self.latest.borrow().clone()
    }

    /// The latest summary, once the first is made.
    pub async fn ready(&self) -> Result<Fresh, ApproxError> {
        let mut seen = self.latest.subscribe();
        let published = seen.wait_for(Option::is_some).await.map_err(|_| ApproxError::Stopped)?;
        published.clone().unwrap_or(Err(ApproxError::Stopped))
    }

    /// Publishes a summary (or why the first failed).
    pub fn publish(&self, summary: Result<Fresh, ApproxError>) {
        self.latest.send_replace(Some(summary));
    }

    /// Whether the cache dropped it.
    pub fn dropped(&self) -> bool {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The summaries held, shared by every router. See the module docs.
pub struct Summaries {
    held: Mutex<HashMap<TreeId, Arc<Held>>>,
    limits: Limits,
    began: Instant,
    metrics: ApproxMetrics,
}

impl Summaries {
    /// An empty cache.
    pub fn new(limits: Limits, metrics: ApproxMetrics) -> Self {
        Self { held: Mutex::new(HashMap::new()), limits, began: Instant::now(), metrics }
    }

    /// How summaries are made and kept.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The metrics of summaries.
    pub fn metrics(&self) -> &ApproxMetrics {
        &self.metrics
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `tree`'s summary, marked as asked for now; `true` with it when it is
    /// new and the caller must start its refresher ([`super::refresh::run`]).
    pub fn ask(&self, tree: TreeId) -> (Arc<Held>, bool) {
        let now = self.now_ms();
        let mut held = self.held.lock();
        if let Some(summary) = held.get(&tree) {
            summary.asked_ms.store(now, Ordering::Relaxed);
            return (summary.clone(), false);
        }
        while held.len() >= self.limits.max_held.max(1) {
            let Some(oldest) = held.values().min_by_key(|h| h.asked_ms.load(Ordering::Relaxed)).map(|h| h.tree) else {
                break;
            };
            if let Some(dropped) = held.remove(&oldest) {
                dropped.dropped.store(true, Ordering::Relaxed);
                self.metrics.evicted.inc();
            }
        }
        let summary = Arc::new(Held {
            tree,
            latest: watch::Sender::new(None),
            asked_ms: AtomicU64::new(now),
            dropped: AtomicBool::new(false),
        });
        held.insert(tree, summary.clone());
        self.metrics.held.set(held.len() as i64);
        (summary, true)
    }

    /// Whether `summary` went unasked for longer than the idle limit.
    pub fn idle(&self, summary: &Held) -> bool {
        let idle_ms = u64::try_from(self.limits.idle.as_millis()).unwrap_or(u64::MAX);
        self.now_ms().saturating_sub(summary.asked_ms.load(Ordering::Relaxed)) > idle_ms
    }

    /// Drops `summary` (if it is still the one held for its tree).
    pub fn forget(&self, summary: &Arc<Held>) {
        summary.dropped.store(true, Ordering::Relaxed);
        let mut held = self.held.lock();
        if held.get(&summary.tree).is_some_and(|h| Arc::ptr_eq(h, summary)) {
            held.remove(&summary.tree);
        }
        self.metrics.held.set(held.len() as i64);
    }

    /// Summaries held.
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(board: u64) -> TreeId {
        TreeId { board, window: 0, period: 0 }
    }

    fn cache(max_held: usize, idle: Duration) -> Summaries {
        let limits = Limits { max_held, idle, ..Limits::default() };
        Summaries::new(limits, ApproxMetrics::unregistered())
    }

    #[test]
    fn holds_a_bounded_number_dropping_the_least_recently_asked() {
        let cache = cache(2, Duration::from_secs(60));
        let (a, new_a) = cache.ask(tree(1));
        std::thread::sleep(Duration::from_millis(3));
        let (b, _) = cache.ask(tree(2));
        std::thread::sleep(Duration::from_millis(3));
        let (again, new_again) = cache.ask(tree(1)); // asked again: now the most recent
        assert!(new_a && !new_again && Arc::ptr_eq(&a, &again));
        std::thread::sleep(Duration::from_millis(3));
        let (_, new_c) = cache.ask(tree(3));
        assert!(new_c && b.dropped() && !a.dropped(), "b was asked least recently");
        assert_eq!(cache.len(), 2);
        cache.forget(&b); // a dropped summary's refresher forgets it: no harm
        assert_eq!(cache.len(), 2);
        cache.forget(&a);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.metrics.evicted.get(), 1);
    }

    #[tokio::test]
    async fn readers_wait_for_the_first_summary() {
        let cache = Arc::new(cache(4, Duration::ZERO));
        let (held, _) = cache.ask(tree(1));
        assert!(held.now().is_none());
        let waiting = {
            let held = held.clone();
            tokio::spawn(async move { held.ready().await.map(|fresh| fresh.summary.total()) })
        };
        held.publish(Ok(Fresh { summary: Arc::new(Summary::default()), at: Instant::now() }));
        assert_eq!(waiting.await.unwrap(), Ok(0));
        std::thread::sleep(Duration::from_millis(2));
        assert!(cache.idle(&held), "idle past a zero limit");
    }
}
