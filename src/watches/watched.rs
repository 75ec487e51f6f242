//! The watched boards as writers see them: whether a board is watched, and
//! a change counter each acknowledged write bumps. They live apart from the
//! registry so a write never waits for the registry's lock, and each board
//! changed since the evaluator's last look is queued once, so a look visits
//! the watches of changed boards only, not every watch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

/// One watched board's change count, and whether the board waits in
/// [`WatchedBoards`]' queue of changed boards.
#[derive(Debug)]
pub struct BoardChanges {
    /// The board's name.
    pub name: Box<str>,
    count: AtomicU64,
    queued: AtomicBool,
}

impl BoardChanges {
    fn new(name: &str) -> Arc<Self> {
        Arc::new(Self { name: name.into(), count: AtomicU64::new(0), queued: AtomicBool::new(false) })
    }

    /// How often acknowledged writes changed the board. SeqCst, against
    /// [`WatchedBoards::changed`]: a look that took the board off the queue
    /// reads every change made before it is queued again.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

/// The watched boards' change counters; the registry adds and removes
/// boards (holding its own lock first), writers bump them.
#[derive(Debug, Default)]
pub struct WatchedBoards {
    boards: RwLock<HashMap<String, Arc<BoardChanges>>>,
    /// Boards changed since the last [`WatchedBoards::take_changed`], each
    /// once. A writer takes this lock only for the first change to a board
    /// between two looks, and the evaluator only to swap the list out.
    changed: Mutex<Vec<Arc<BoardChanges>>>,
}

impl WatchedBoards {
    /// Whether any watch follows `board`.
    pub fn contains(&self, board: &str) -> bool {
        self.boards.read().contains_key(board)
    }

    /// An acknowledged write changed `board`: its watches are due a look.
    /// O(1), whatever the number of watches. True when this change queued
    /// the board (the first since the last look): only then need the
    /// evaluator be woken.
    pub fn changed(&self, board: &str) -> bool {
        let boards = self.boards.read();
        let Some(changes) = boards.get(board) else { return false };
        changes.count.fetch_add(1, Ordering::SeqCst);
        if changes.queued.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.changed.lock().push(changes.clone());
        true
    }

    /// The boards changed since the last call, each once. Each is off the
    /// queue before its count is read, so a change that lands after the
    /// read queues it again.
    pub fn take_changed(&self) -> Vec<Arc<BoardChanges>> {
        let changed = std::mem::take(&mut *self.changed.lock());
        for changes in &changed {
            changes.queued.store(false, Ordering::SeqCst);
        }
        changed
    }

    /// Starts counting `board`'s changes; returns its counter.
    pub(super) fn watch(&self, board: &str) -> Arc<BoardChanges> {
        self.boards.write().entry(board.to_owned()).or_insert_with(|| BoardChanges::new(board)).clone()
    }

    /// `board` has no watch left: writes to it count nothing.
    pub(super) fn unwatch(&self, board: &str) {
        self.boards.write().remove(board);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_changed_many_times_between_looks_is_queued_once() {
        let watched = WatchedBoards::default();
        let b = watched.watch("b");
        watched.watch("c");
        assert!(watched.changed("b"), "the first change queues the board");
        assert!(!watched.changed("b"), "a queued board is not queued again");
        assert!(!watched.changed("unwatched"));
        let taken = watched.take_changed();
        assert_eq!(taken.iter().map(|c| &*c.name).collect::<Vec<_>>(), ["b"]);
        assert_eq!(b.count(), 2);
        assert!(watched.take_changed().is_empty(), "nothing changed since");
        assert!(watched.changed("b"));
        assert_eq!(watched.take_changed().len(), 1, "queued again after its look");
        watched.unwatch("b");
        watched.changed("b");
        assert!(watched.take_changed().is_empty() && !watched.contains("b"));
    }

    /// Writers racing the evaluator: every change is either seen by the
    /// look that took its board off the queue, or queues the board again.
    #[test]
    fn no_change_is_missed_by_a_look_racing_writers() {
        const WRITES: u64 = 200_000;
        let watched = WatchedBoards::default();
        let b = watched.watch("b");
        let done = AtomicBool::new(false);
        let mut seen = 0;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..WRITES {
                    watched.changed("b");
                }
                done.store(true, Ordering::SeqCst);
            });
            loop {
                let finished = done.load(Ordering::SeqCst);
                for changes in watched.take_changed() {
                    seen = changes.count();
                }
                if finished {
                    break;
                }
            }
        });
        assert_eq!(seen, WRITES, "the last changes were neither read nor queued");
        assert_eq!(b.count(), WRITES);
        assert!(watched.take_changed().is_empty());
    }
}
