//! Requests in flight on the calling I/O thread's connections. A lone write
//! is committed on its I/O thread (see `shard::engine_cell`) only while no
//! other request there waits: its fsync holds the whole thread.

use std::cell::Cell;

thread_local! {
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// `requests` read on this thread are in flight.
pub fn started(requests: usize) {
    IN_FLIGHT.with(|n| n.set(n.get() + requests));
}

/// `requests` in flight on this thread were answered (or dropped).
pub fn ended(requests: usize) {
    IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(requests)));
}

/// Whether no request is in flight on this thread.
pub fn idle() -> bool {
    IN_FLIGHT.with(|n| n.get() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_thread() {
        assert!(idle());
        started(3);
        assert!(!idle());
        std::thread::spawn(|| assert!(idle(), "another thread's count")).join().unwrap();
        ended(2);
        assert!(!idle());
        ended(5);
        assert!(idle(), "never below zero");
    }
}
