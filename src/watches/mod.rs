//! Watches (protocol 1.1): a connection asks to be told when a board's top
//! or a player's rank changes, and the server pushes the new value.
//!
//! The write path only marks: a router whose write to a watched board was
//! acknowledged tells the hub the board changed ([`WatchHub::changed`]); with
//! no watch open, that costs one atomic load per write. The looking is done
//! apart, by the [`evaluator`] on a thread of its own: it takes the watches
//! that are due ([`registry`]: changed or past a period boundary, and past
//! their `interval_ms`), reads their values through a router like any
//! client, then waits for a fence on every shard, so what it read is durable
//! before anything is pushed. A value equal to the watch's last push is
//! dropped; a new one goes into the connection's [`pushes`] box, which keeps
//! only the latest frame per watch. So the shards see a few reads per
//! interval per watched board, never one per write, and a client that reads
//! slowly gets the latest state, never a backlog.

pub mod evaluator;
pub mod pushes;
pub mod registry;
pub mod session;
pub mod watched;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rankd_client::frame::write_frame_with;
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::operations::metrics::Metrics;
use crate::protocol::request::WatchSpec;
pub use pushes::PushBox;
pub use registry::{Offered, Registry, WatchKey};
pub use session::WatchSession;
pub use watched::WatchedBoards;

/// The watches of every connection, shared by the routers (which report
/// changes), the connections (which open and end watches) and the evaluator.
pub struct WatchHub {
    registry: Mutex<Registry>,
    /// Open watches: lets a write skip the registry when there are none.
    open: AtomicUsize,
    /// Wakes the evaluator: a board changed or a watch opened.
    wake: Notify,
    /// Numbers connections, so watch ids need only be unique per connection.
    next_conn: AtomicU64,
    /// The watched boards' change counters: what writers touch.
    watched: Arc<WatchedBoards>,
    /// The clock reads take their periods from: at a boundary, watches of
    /// periodic windows are looked at again.
    clock: Clock,
    metrics: Arc<Metrics>,
}

impl WatchHub {
    /// A hub with no watch open, on the system clock.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_clock(metrics, Clock::default())
    }

    /// A hub with no watch open, on `clock`: the routers' own, so periods
    /// roll over for the watches when they do for reads (a test may shift
    /// it).
    pub fn with_clock(metrics: Arc<Metrics>, clock: Clock) -> Arc<Self> {
        let registry = Registry::default();
        Arc::new(Self {
            watched: registry.watched(),
            registry: Mutex::new(registry),
            open: AtomicUsize::new(0),
            wake: Notify::new(),
            next_conn: AtomicU64::new(1),
            clock,
            metrics,
        })
    }

    /// A number for a new connection's watches.
    pub fn connection(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens a watch; its first push comes at once.
    pub fn add(&self, key: WatchKey, spec: WatchSpec, pushes: Arc<PushBox>) {
        {
            let mut registry = self.registry.lock();
            registry.add(key, spec, pushes, Instant::now());
            self.set_open(&registry);
        }
        self.wake.notify_one();
    }

    /// Ends a watch; whether it was open. No push for it is put after this.
    pub fn remove(&self, key: WatchKey) -> bool {
        let mut registry = self.registry.lock();
        let removed = registry.remove(key);
        self.set_open(&registry);
        removed
    }

    /// Publishes how many watches are open. Called with the registry
    /// locked, so counts are stored in the order of the changes they count:
    /// a stale 0 stored last would leave an open watch's board unwatched.
    fn set_open(&self, registry: &Registry) {
        let open = registry.len();
        self.open.store(open, Ordering::Relaxed);
        self.metrics.watches.open.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// Whether a write to `board` must report its acknowledgment. Never
    /// waits for the registry, which the evaluator holds while it scans.
    pub fn is_watched(&self, board: &str) -> bool {
        self.open.load(Ordering::Relaxed) > 0 && self.watched.contains(board)
    }

    /// An acknowledged write changed `board`; never waits for the registry.
    /// Wakes the evaluator for the first change since its last look (it
    /// takes every change queued by then).
    pub fn changed(&self, board: &str) {
        if self.watched.changed(board) {
            self.wake.notify_one();
        }
    }

    /// A drop of `board` has begun: its watches push nothing until it
    /// ends (see [`Registry::dropping`]).
    pub fn dropping(&self, board: &str) {
        self.registry.lock().dropping(board);
    }

    /// A drop of `board` failed: its watches look again.
    pub fn drop_failed(&self, board: &str) {
        self.registry.lock().drop_failed(board);
        self.wake.notify_one();
    }

    /// `board` was dropped: each of its watches gets a last push, nil;
    /// those opened while it was being dropped look now (at the new board).
    pub fn dropped(&self, board: &str) {
        self.end_with(|registry| registry.dropped(board));
        self.wake.notify_one();
    }

    /// `keys` follow what cannot be read (a window or period their board
    /// does not have): each gets a last push, nil, as when a board is dropped.
    pub fn unreadable(&self, keys: impl IntoIterator<Item = WatchKey>) {
        self.end_with(|registry| registry.end(keys));
    }

    /// Ends the watches `end` takes out of the registry, each with a last
    /// push, nil.
    fn end_with(&self, end: impl FnOnce(&mut Registry) -> Vec<(WatchKey, Arc<PushBox>)>) {
        let mut registry = self.registry.lock();
        let ended = end(&mut registry);
        self.set_open(&registry);
        // Put with the registry locked: an unwatch that finds the watch
        // ended already forgets its last push, which must be there by then.
        for (key, pushes) in ended {
            pushes.put(key.watch, push_frame(key.watch, &[rmp::Marker::Null.to_u8()]), true);
            self.metrics.watches.pushes.inc();
        }
    }
}

/// A push as the connection writes it: `{"watch": id, "event": ...}`
/// framed, with `event` already encoded.
pub fn push_frame(watch: u64, event: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(event.len() + 24);
    write_frame_with(&mut out, |out| {
        let head = rmp::encode::write_map_len(out, 2).is_ok()
            && rmp::encode::write_str(out, "watch").is_ok()
            && rmp::encode::write_uint(out, watch).is_ok()
            && rmp::encode::write_str(out, "event").is_ok();
        out.extend_from_slice(event);
        head
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_frame_has_no_id_and_carries_the_event_as_is() {
        let mut event = Vec::new();
        rmp_serde::encode::write_named(&mut event, &Some(rankd_client::RankInfo { rank: 2, score: 9, count: 5 }))
            .unwrap();
        let frame = push_frame(4, &event);
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
        let value = rmpv::decode::read_value(&mut &frame[4..]).unwrap();
        assert_eq!(value["watch"], rmpv::Value::from(4));
        assert_eq!(value["event"]["rank"], rmpv::Value::from(2));
        assert_eq!(value.as_map().unwrap().len(), 2, "no id key");
    }

    fn spec(board: &str) -> WatchSpec {
        WatchSpec {
            board: board.into(),
            target: crate::protocol::request::WatchTarget::Top(3),
            view: Default::default(),
            interval: std::time::Duration::from_millis(10),
        }
    }

    /// The evaluator is woken whenever a look has something to do: a new
    /// watch, a board's first change since the last look, and the end of a
    /// drop, whose watches opened meanwhile (withheld until then) look at
    /// once rather than at the next clock check, a minute on.
    #[tokio::test]
    async fn the_evaluator_is_woken_when_a_look_has_work() {
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        let woken =
            || async { tokio::time::timeout(std::time::Duration::from_millis(20), hub.wake.notified()).await.is_ok() };
        let look = || {
            let due = hub.registry.lock().take_due(Instant::now()).0;
            due.iter().flat_map(|group| group.watches.iter().map(|w| w.0)).collect::<Vec<_>>()
        };
        let (first, second) = (WatchKey { conn: 1, watch: 1 }, WatchKey { conn: 1, watch: 2 });
        let pushes = Arc::new(PushBox::default());
        assert!(!woken().await, "nothing to look at");
        hub.add(first, spec("b"), pushes.clone());
        assert!(woken().await, "a new watch");
        assert_eq!(look(), [first]);
        hub.changed("b");
        hub.changed("b");
        assert!(woken().await, "a change");
        assert_eq!(look(), [first]);
        hub.dropping("b");
        hub.add(second, spec("b"), pushes);
        assert!(woken().await);
        assert_eq!(look(), [second]);
        let offer = |key| hub.registry.lock().offer(key, b"[]", || b"f".to_vec(), Instant::now());
        assert_eq!(offer(second), registry::Offered::Withheld, "the drop runs");
        hub.dropped("b");
        assert!(woken().await, "the drop's end");
        assert_eq!(look(), [second], "the watch opened during the drop looks again");
    }

    /// Threads opening and ending watches, while another looks at the
    /// registry: with it locked, the open count (what `is_watched` reads
    /// first) must be its length. It was once stored after the registry was
    /// unlocked, so a stale 0 could land over a newer 1 and the open
    /// watch's board seemed unwatched: its writes pushed nothing.
    #[test]
    fn the_open_count_always_matches_the_registry() {
        const THREADS: u64 = 3;
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        let running = AtomicUsize::new(THREADS as usize);
        let mut mismatches = 0;
        std::thread::scope(|scope| {
            for conn in 1..=THREADS {
                let (hub, running) = (&hub, &running);
                scope.spawn(move || {
                    let (board, pushes) = (format!("b{conn}"), Arc::new(PushBox::default()));
                    let key = WatchKey { conn, watch: 1 };
                    for _ in 0..100_000 {
                        hub.add(key, spec(&board), pushes.clone());
                        hub.remove(key);
                    }
                    // Each leaves one open.
                    hub.add(key, spec(&board), pushes);
                    running.fetch_sub(1, Ordering::Release);
                });
            }
            while running.load(Ordering::Acquire) > 0 {
                let registry = hub.registry.lock();
                mismatches += usize::from(hub.open.load(Ordering::Relaxed) != registry.len());
            }
        });
        assert_eq!(mismatches, 0, "the open count differed from the registry's");
        assert_eq!(hub.open.load(Ordering::Relaxed) as u64, THREADS);
        assert_eq!(hub.metrics.watches.open.get() as u64, THREADS);
    }

    /// Writers ask whether their board is watched, and say it changed,
    /// without the registry's lock, which the evaluator holds while it
    /// looks: with many watches open, writes would wait.
    #[test]
    fn writers_never_wait_for_the_registry() {
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        hub.add(WatchKey { conn: 1, watch: 1 }, spec("b"), Arc::new(PushBox::default()));
        assert_eq!(hub.registry.lock().take_due(Instant::now()).0.len(), 1, "its first look");
        let held = hub.registry.lock(); // the evaluator, mid-scan
        let (done, answered) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let hub = &hub;
            scope.spawn(move || {
                let watched = (hub.is_watched("b"), hub.is_watched("c"));
                hub.changed("b");
                let _ = done.send(watched);
            });
            let watched = answered.recv_timeout(std::time::Duration::from_secs(30));
            drop(held);
            assert_eq!(watched, Ok((true, false)), "a writer waited for the registry");
        });
        let later = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(hub.registry.lock().take_due(later).0.len(), 1, "the change counted: the watch is due again");
    }

    /// A board dropped while its watch is unwatched: whichever comes first,
    /// nothing is left waiting for the unwatched id (it could never be
    /// written, its watch being no longer announced).
    #[test]
    fn an_unwatch_racing_a_drop_leaves_no_push_behind() {
        const ROUNDS: usize = 20_000;
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        let mut session = WatchSession::new(hub.clone());
        let pushes = session.pushes();
        let (start, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let mut left = Vec::new();
        std::thread::scope(|scope| {
            let (hub, start, done) = (&hub, &start, &done);
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    hub.dropped("b");
                    done.wait();
                }
            });
            // Nothing here may panic between the barriers: the other
            // thread would wait forever.
            for _ in 0..ROUNDS {
                let id = session.open(spec("b")).ok();
                if let Some(id) = id {
                    session.announce(id);
                }
                start.wait();
                if let Some(id) = id {
                    session.close(id);
                }
                done.wait();
                let taken = pushes.take(|_| true);
                if taken.frames > 0 {
                    left.push((id, taken.ended));
                }
            }
        });
        assert_eq!(left, vec![], "pushes of unwatched watches were left");
    }
}
