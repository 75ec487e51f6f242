//! A shard's engine, shared by its actor, which changes it, and the router,
//! which reads a lone rank from it in place.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rankd_shards::Shard;

/// The engine behind one small lock. The contract:
///
/// - the actor is the only writer; it locks per command, not per round, so
///   the lock is seldom held for long;
/// - the router only ever [`try_read`](Self::try_read)s: it never waits for
///   the actor, and when the lock is taken it queues the rank instead;
/// - the engine is absent only while the actor reopens a failed storage;
///   every access then sees `None` and answers accordingly.
///
/// Why share at all: a rank queued behind a round costs two thread
/// wake-ups (to the shard and back); read in place on the connections'
/// thread it costs a few µs (see docs/performance-history.md).
#[derive(Clone)]
pub struct EngineCell(Arc<Mutex<Option<Shard>>>);

impl EngineCell {
    /// Holds `shard`.
    pub fn new(shard: Shard) -> Self {
        Self(Arc::new(Mutex::new(Some(shard))))
    }

    /// Runs `f` on the engine, waiting for the lock; `None` while the
    /// storage is being reopened. For the actor.
    pub fn with<R>(&self, f: impl FnOnce(&mut Shard) -> R) -> Option<R> {
        self.0.lock().as_mut().map(f)
    }

    /// Runs `f` on the engine if the lock is free and the engine present;
    /// never waits. For the router. Mutable because a lookup updates the
    /// record cache.
    pub fn try_read<R>(&self, f: impl FnOnce(&mut Shard) -> R) -> Option<R> {
        self.0.try_lock()?.as_mut().map(f)
    }

    /// Takes the engine out to reopen it; readers see `None` until
    /// [`EngineCell::put`].
    pub fn take(&self) -> Option<Shard> {
        self.0.lock().take()
    }

    /// Puts a (re)opened engine back.
    pub fn put(&self, shard: Shard) {
        *self.0.lock() = Some(shard);
    }

    /// The lock itself, for a caller that needs the engine and other
    /// fields of its own at once (applying a command, sealing a batch).
    pub fn lock(&self) -> MutexGuard<'_, Option<Shard>> {
        self.0.lock()
    }
}
