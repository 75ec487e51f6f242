//! How many of the I/O threads serve connections: as few as the load needs.
//!
//! Every I/O thread a request's answer must wake costs a sleep and a
//! wake-up per commit group, and on a small machine those are most of a
//! depth-1 write's CPU (docs/performance-history.md, 2026-12-02): one busy
//! thread serves a light load for less CPU than two half-idle ones. So the
//! threads in use grow by one when one of them is near a full core, and
//! shrink by one when the rest could carry the load at three quarters of a
//! core each;
//! connections move at a quiet moment (nothing in flight) to the thread
//! that should have them. Redis's threaded I/O pauses its threads under a
//! light load for the same reason.
//!
//! [`Governor`] decides from each thread's busy share, sampled by the
//! thread itself ([`busy_sampler`]); [`IoBalance`] holds what the threads
//! share: the count in use, each thread's connections and busy share.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};

/// How often each thread samples its busy share, and the governor decides.
pub const PERIOD: Duration = Duration::from_millis(250);

/// A thread busier than this (of a core) brings one more thread in: near
/// a full core, its requests start to queue for it.
pub const GROW_ABOVE: f64 = 0.9;

/// The threads in use shrink by one when their load would keep one fewer
/// at most this busy each: below [`GROW_ABOVE`], so the fewer do not grow
/// back at once (and fewer threads spend less on the same load).
pub const SHRINK_FILL: f64 = 0.75;

/// Periods in a row the load must fit in fewer threads before they shrink:
/// a lull of a second does not send connections back and forth.
pub const SHRINK_AFTER: u32 = 4;

/// The decision: how many threads to use, from their busy shares.
#[derive(Debug, Clone)]
pub struct Governor {
    total: usize,
    active: usize,
    grow_above: f64,
    /// Periods in a row the load fitted in one thread fewer.
    light: u32,
}

impl Governor {
    /// `total` threads, all in use at first.
    pub fn new(total: usize, grow_above: f64) -> Self {
        let total = total.max(1);
        Self { total, active: total, grow_above, light: 0 }
    }

    /// The threads in use.
    pub fn active(&self) -> usize {
        self.active
    }

    /// One period's busy shares of the threads in use (of a core each, in
    /// thread order); the count to use from now on.
    pub fn decide(&mut self, busy: &[f64]) -> usize {
        let busy = &busy[..busy.len().min(self.active)];
        if self.active < self.total && busy.iter().any(|&share| share > self.grow_above) {
            self.active += 1;
            self.light = 0;
        } else if self.active > 1 && busy.iter().sum::<f64>() < SHRINK_FILL * (self.active - 1) as f64 {
            self.light += 1;
            if self.light >= SHRINK_AFTER {
                self.active -= 1;
                self.light = 0;
            }
        } else {
            self.light = 0;
        }
        self.active
    }
}

/// One thread's share of [`IoBalance`].
#[derive(Debug, Default)]
struct ThreadLoad {
    /// Connections served by the thread.
    connections: AtomicUsize,
    /// Its busy share over the last period, in thousandths of a core.
    busy_permille: AtomicU32,
}

/// What the I/O threads share to balance their connections.
pub struct IoBalance {
    threads: Box<[ThreadLoad]>,
    /// Threads in use: connections are placed on, and kept on, `0..active`.
    active: AtomicUsize,
    /// Whether the count in use follows the load (else all are used).
    adaptive: bool,
    /// `rankd_io_threads_active`.
    active_gauge: IntGauge,
    /// `rankd_connections_moved_total`.
    moved: IntCounter,
}

impl IoBalance {
    pub fn new(total: usize, adaptive: bool, active_gauge: IntGauge, moved: IntCounter) -> Self {
        let total = total.max(1);
        active_gauge.set(total as i64);
        Self {
            threads: (0..total).map(|_| ThreadLoad::default()).collect(),
            active: AtomicUsize::new(total),
            adaptive,
            active_gauge,
            moved,
        }
    }

    /// Whether the count in use follows the load.
    pub fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed).clamp(1, self.threads.len())
    }

    fn connections(&self, thread: usize) -> usize {
        self.threads[thread].connections.load(Ordering::Relaxed)
    }

    /// The thread in use with the fewest connections.
    fn least_loaded(&self) -> usize {
        (0..self.active()).min_by_key(|&thread| self.connections(thread)).unwrap_or(0)
    }

    /// Where a new connection goes; counted there from now on.
    pub fn place(&self) -> usize {
        let thread = self.least_loaded();
        self.threads[thread].connections.fetch_add(1, Ordering::Relaxed);
        thread
    }

    /// A connection on `thread` ended.
    pub fn left(&self, thread: usize) {
        self.threads[thread].connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Where a quiet connection on `here` should move, if anywhere: off a
    /// thread no longer in use, or off one holding two more connections
    /// than the least loaded. Counted there from now on.
    pub fn destination(&self, here: usize) -> Option<usize> {
        if !self.adaptive {
            return None;
        }
        let active = self.active();
        let there = self.least_loaded();
        let moves = here >= active || self.connections(here) > self.connections(there) + 1;
        if !moves || there == here {
            return None;
        }
        self.threads[here].connections.fetch_sub(1, Ordering::Relaxed);
        self.threads[there].connections.fetch_add(1, Ordering::Relaxed);
        self.moved.inc();
        Some(there)
    }

    /// Records `thread`'s busy share over the last period.
    fn record_busy(&self, thread: usize, share: f64) {
        let permille = (share * 1000.0).clamp(0.0, u32::MAX as f64) as u32;
        self.threads[thread].busy_permille.store(permille, Ordering::Relaxed);
    }

    /// The busy shares of the threads in use.
    fn busy(&self) -> Vec<f64> {
        let active = self.active();
        self.threads[..active].iter().map(|t| f64::from(t.busy_permille.load(Ordering::Relaxed)) / 1000.0).collect()
    }

    /// Applies the governor's decision.
    fn set_active(&self, active: usize) {
        let active = active.clamp(1, self.threads.len());
        if self.active.swap(active, Ordering::Relaxed) != active {
            self.active_gauge.set(active as i64);
            tracing::debug!(active, "I/O threads in use");
        }
    }
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (status == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

/// Runs on I/O thread `thread` for the server's life: samples the thread's
/// busy share every `period`; on thread 0 it also runs the governor.
pub async fn busy_sampler(balance: Arc<IoBalance>, thread: usize, period: Duration, grow_above: f64) {
    if !balance.adaptive {
        return;
    }
    let mut governor = Governor::new(balance.threads.len(), grow_above);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = (Instant::now(), thread_cpu_time());
    loop {
        ticks.tick().await;
        let now = (Instant::now(), thread_cpu_time());
        if let (Some(cpu), Some(before)) = (now.1, last.1) {
            let wall = now.0.duration_since(last.0).as_secs_f64();
            if wall > 0.0 {
                balance.record_busy(thread, cpu.saturating_sub(before).as_secs_f64() / wall);
            }
        }
        last = now;
        if thread == 0 {
            balance.set_active(governor.decide(&balance.busy()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balance(total: usize) -> IoBalance {
        let gauge = IntGauge::new("active", "active").unwrap();
        let moved = IntCounter::new("moved", "moved").unwrap();
        IoBalance::new(total, true, gauge, moved)
    }

    #[test]
    fn a_light_load_shrinks_the_threads_only_after_several_periods_in_a_row() {
        let mut governor = Governor::new(4, GROW_ABOVE);
        for _ in 0..SHRINK_AFTER - 1 {
            assert_eq!(governor.decide(&[0.2, 0.2, 0.2, 0.2]), 4);
        }
        // A busier period starts the count again.
        assert_eq!(governor.decide(&[0.7, 0.7, 0.7, 0.7]), 4);
        for _ in 0..SHRINK_AFTER - 1 {
            assert_eq!(governor.decide(&[0.2, 0.2, 0.2, 0.2]), 4);
        }
        assert_eq!(governor.decide(&[0.2, 0.2, 0.2, 0.2]), 3);
    }

    #[test]
    fn shrinking_stops_where_the_load_would_not_fit_and_never_below_one() {
        let mut governor = Governor::new(3, GROW_ABOVE);
        let mut decide_for = |busy: &[f64]| (0..SHRINK_AFTER).map(|_| governor.decide(busy)).last().unwrap();
        // 0.9 of a core in all: two threads at 0.45 each are within the fill.
        assert_eq!(decide_for(&[0.3, 0.3, 0.3]), 2);
        // Now on two: one thread would be at 0.9, past the fill.
        assert_eq!(decide_for(&[0.45, 0.45]), 2);
        assert_eq!(decide_for(&[0.1, 0.1]), 1);
        assert_eq!(decide_for(&[0.0]), 1);
    }

    #[test]
    fn a_thread_near_a_full_core_brings_one_more_in_at_once_up_to_all() {
        let mut governor = Governor::new(2, GROW_ABOVE);
        for _ in 0..SHRINK_AFTER {
            governor.decide(&[0.1, 0.1]);
        }
        assert_eq!(governor.active(), 1);
        assert_eq!(governor.decide(&[0.95]), 2);
        assert_eq!(governor.decide(&[0.95, 0.95]), 2);
        // Shares of threads not in use are not looked at.
        let mut governor = Governor::new(3, GROW_ABOVE);
        for _ in 0..SHRINK_AFTER {
            governor.decide(&[0.1, 0.1, 0.1]);
        }
        assert_eq!(governor.decide(&[0.2, 0.2, 0.99]), 2);
    }

    #[test]
    fn new_connections_go_to_the_least_loaded_thread_in_use() {
        let balance = balance(3);
        let placed: Vec<usize> = (0..6).map(|_| balance.place()).collect();
        assert_eq!(placed, [0, 1, 2, 0, 1, 2]);
        balance.set_active(2);
        assert_eq!((balance.place(), balance.place(), balance.place()), (0, 1, 0));
    }

    #[test]
    fn quiet_connections_leave_threads_no_longer_in_use_and_even_out_the_rest() {
        let balance = balance(2);
        for _ in 0..4 {
            balance.place();
        }
        assert_eq!(balance.destination(0), None, "balanced: nobody moves");
        balance.set_active(1);
        assert_eq!(balance.destination(0), None);
        assert_eq!(balance.destination(1), Some(0));
        assert_eq!(balance.destination(1), Some(0));
        assert_eq!((balance.connections(0), balance.connections(1)), (4, 0));
        assert_eq!(balance.moved.get(), 2);
        // Back to two: thread 0 gives away until within one of thread 1.
        balance.set_active(2);
        assert_eq!(balance.destination(0), Some(1));
        assert_eq!(balance.destination(0), Some(1));
        assert_eq!(balance.destination(0), None);
        assert_eq!(balance.destination(1), None);
    }

    #[test]
    fn a_fixed_balance_never_moves_a_connection() {
        let gauge = IntGauge::new("active", "active").unwrap();
        let moved = IntCounter::new("moved", "moved").unwrap();
        let balance = IoBalance::new(2, false, gauge, moved);
        for _ in 0..3 {
            balance.place();
        }
        balance.set_active(1);
        assert_eq!(balance.destination(1), None);
    }
}
