//! The router: owns the board registry and the global arrival sequence,
//! hashes each player to a shard, and fans reads out to every shard.
//!
//! Placement: player `p` lives on shard `xxh3_64(p) % shards` (xxHash3,
//! 64-bit, seed 0, over the player's UTF-8 bytes) for every board. The hash
//! is part of the data-dir format: changing it would strand players.
//!
//! There is one router per I/O thread, each routing the connections of its
//! thread; they share the board registry and the arrival sequence
//! ([`SharedBoards`]). The connections of its thread call it directly: a
//! batch is routed, and its commands queued, in the call. Work from other
//! threads (the watch evaluator's reads and fences, a backup's images)
//! reaches it through its actor, [`RouterActor`], a thin shell over it.
//!
//! A router holds the registry's lock while it routes a
//! batch AND enqueues its first-round commands into the shards' mailboxes,
//! so requests reach each shard in the order they were routed, whichever
//! thread routed them (a write never overtakes the drop of its board, and
//! ordinal ties follow the sequence); later rounds of multi-step reads are
//! sent from the reply future. A batch of lone ranks, answered in place
//! from the shards' engines, holds it only to find its boards: the I/O
//! threads queued on it behind each other's reads.
//!
//! - [`actor`]: the router's actor, for callers on other threads;
//! - [`boards`]: the registry and the sequence (decided here alone);
//! - `name_order`: the boards in name order, compact, for `boards` pages;
//! - `dispatch`: one op routed to its shards' commands;
//! - [`outbox`]: a batch's commands, one mailbox message per shard;
//! - [`reads`]: combining the shards' answers (sums, merges, searches);
//! - `approx`: approximate ranks, from the bucket summaries.

pub mod actor;
mod approx;
pub mod boards;
mod dispatch;
mod name_index;
mod name_order;
pub mod outbox;
pub mod reads;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use rankd_shards::ShardImage;

pub use actor::{Dispatch, Fence, RouterActor, TakeImages};
pub use boards::{Boards, RouterState};
pub use dispatch::BatchReplies;

use crate::request_path::approx::Summaries;

use crate::clock::Clock;
use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::protocol::{Op, Reply};
use crate::request_path::dense_registry::DenseRegistry;
use crate::request_path::shard::command::answer;
use crate::request_path::shard::{Command, ShardLink};
use crate::watches::WatchHub;
use dispatch::Routed;
use outbox::Outbox;

/// The shard a player lives on. See the module docs; stable across versions.
pub fn shard_of(player: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(player.as_bytes()) % shards as u64) as usize
}

/// The largest batch whose ranks may be answered, and whose first `set`
/// staged, in place, in the shards' engines on this thread (see
/// `EngineCell`). Only a batch that is `alone` on its connection qualifies:
/// then nothing of its connection can still be queued for a shard, and its
/// client is waiting on it, so the thread wake-ups saved are latency saved.
/// A pipelining client keeps queueing: its requests are spread over the
/// shard threads, which more cores serve. Within the batch, a `set` goes in
/// place only while nothing of the batch is queued yet, and nothing after a
/// write does (a queued write is still in the [`Outbox`]).
pub const IN_PLACE_MAX_BATCH: usize = 4;

/// A reply still to come.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Result<Reply, Error>>>>;
/// Which ops of a batch may be handled in place: with in-place requests
/// `enabled`, a batch `alone` on its connection and at most
/// [`IN_PLACE_MAX_BATCH`] long, every op up to and including its first
/// write (nothing of the batch is queued for a shard before then, unless a
/// rank before it was). Asked op by op, in order.
pub struct InPlace(bool);

impl InPlace {
    /// The policy for a batch of `ops` ops.
    pub fn new(enabled: bool, alone: bool, ops: usize) -> Self {
        Self(enabled && alone && ops <= IN_PLACE_MAX_BATCH)
    }

    /// Whether the batch's first op may be answered in place.
    pub fn is_on(&self) -> bool {
        self.0
    }

    /// Whether `op`, the next of the batch, may be answered in place.
    pub fn allows(&mut self, op: &Op) -> bool {
        let may = self.0;
        self.0 &= !op.is_write();
        may
    }
}

/// The board registry and arrival sequence, shared by the routers of every
/// I/O thread.
pub type SharedBoards = Arc<Mutex<Boards>>;

/// What every router shares with the others.
#[derive(Clone)]
pub struct RouterParts {
    /// The board registry and arrival sequence.
    pub boards: SharedBoards,
    /// The dense indexes.
    pub dense: DenseRegistry,
    /// Decides which period a read of a periodic window targets.
    pub clock: Clock,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// Told when acknowledged writes change a watched board.
    pub watches: Arc<WatchHub>,
    /// The bucket summaries approximate ranks are answered from.
    pub approx: Arc<Summaries>,
}

/// The router of one I/O thread. See the module docs.
pub struct Router {
    /// The shards, reached from this router's I/O thread.
    shards: Arc<[ShardLink]>,
    metrics: Arc<Metrics>,
    boards: SharedBoards,
    dense: DenseRegistry,
    /// Decides which period a read of a periodic window targets.
    clock: Clock,
    /// Whether lone ranks and writes may be handled in place; off only in
    /// tests of the queued paths.
    in_place: bool,
    /// Told when acknowledged writes change a watched board.
    watches: Arc<WatchHub>,
    /// The bucket summaries approximate ranks are answered from.
    approx: Arc<Summaries>,
}

impl Router {
    /// A router over started shards (reached as from its own I/O thread),
    /// sharing `parts` with the other routers.
    pub fn new(shards: Vec<ShardLink>, parts: RouterParts) -> Self {
        let RouterParts { boards, dense, clock, metrics, watches, approx } = parts;
        Self { shards: shards.into(), metrics, boards, dense, clock, in_place: true, watches, approx }
    }

    /// Queues every lone rank and write for the shards instead
    /// (`--debug-queue-lone`).
    #[cfg(feature = "test-hooks")]
    pub fn queue_lone_requests(mut self) -> Self {
        self.in_place = false;
        self
    }

    /// Routes a client's batch of operations, in order, and queues their
    /// first-round commands for the shards, before it returns; what it
    /// returns gives their replies, at once if routing answered them all.
    /// `alone`: the batch is all its connection has in flight, its client
    /// waiting for these answers alone (see [`IN_PLACE_MAX_BATCH`]).
    pub fn dispatch_batch(
        &self,
        ops: Vec<Op>,
        alone: bool,
    ) -> BatchReplies<impl Future<Output = Vec<Result<Reply, Error>>>> {
        let mut outbox = Outbox::new(self.shards.len());
        let mut in_place = InPlace::new(self.in_place, alone, ops.len());
        if in_place.is_on() && ops.iter().all(|op| matches!(op, Op::Rank { .. })) {
            // Lone ranks hold the registry only to find their boards: they
            // queue nothing a write could be ordered against.
            let routed: Vec<Routed> = (ops.into_iter())
                .filter_map(|op| match op {
                    Op::Rank { board, player, view } => Some(self.rank_unlocked(&board, player, view, &mut outbox)),
                    _ => None, // none: all are ranks
                })
                .collect();
            outbox.send(&self.shards);
            return dispatch::batch_replies(routed);
        }
        let mut boards = self.boards.lock();
        if ops.len() > 1 {
            boards.prefetch(ops.iter().filter_map(Op::board));
        }
        let routed: Vec<Routed> = (ops.into_iter())
            .map(|op| {
                let allowed = in_place.allows(&op);
                self.dispatch(&mut boards, op, &mut outbox, allowed)
            })
            .collect();
        outbox.send(&self.shards);
        drop(boards);
        dispatch::batch_replies(routed)
    }

    /// Resolves once every shard has made durable everything it did before
    /// the fence reached it: a watch's reads are pushed only after one.
    pub fn fence(&self) -> impl Future<Output = Result<(), Error>> {
        let mut outbox = Outbox::new(self.shards.len());
        let pending = outbox.ask_all(|reply| Command::Fence { reply });
        outbox.send(&self.shards);
        async move {
            futures::future::try_join_all(pending.into_iter().map(answer)).await?;
            Ok(())
        }
    }

    /// An image of what every shard has committed, at one cut across
    /// shards: the registry is held while the requests are queued, as it
    /// is while any batch is, so each write (a `set_many` spanning shards
    /// too) was queued to all its shards before the images or to none.
    /// Each shard settles before its image, so every write acknowledged
    /// before is in it.
    pub fn take_images(&self) -> impl Future<Output = Result<Vec<ShardImage>, Error>> {
        let mut outbox = Outbox::new(self.shards.len());
        let boards = self.boards.lock();
        let pending = outbox.ask_all(|reply| Command::Image { reply });
        outbox.send(&self.shards);
        drop(boards);
        futures::future::try_join_all(pending.into_iter().map(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::Mode;

    #[test]
    fn placement_is_the_data_dir_format() {
        // Changing the hash would strand every stored player.
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b"alice"), 0x4da1_0dd6_1a01_16b0);
        assert_eq!((shard_of("alice", 1), shard_of("alice", 4), shard_of("alice", 7)), (0, 0, 5));
        let spread = (0..1000).map(|i| shard_of(&format!("p{i}"), 4)).fold([0; 4], |mut n, s| {
            n[s] += 1;
            n
        });
        assert!(spread.iter().all(|&n| n > 200), "{spread:?}");
    }

    #[test]
    fn ranks_are_answered_in_place_only_for_a_short_lone_batch_before_its_first_write() {
        let rank = || Op::Rank { board: "b".into(), player: "p".into(), view: Default::default() };
        let set = || Op::Set { board: "b".into(), player: "p".into(), score: 1.into(), mode: Mode::Set, wid: None };
        let allowed = |enabled, alone, ops: &[Op]| {
            let mut policy = InPlace::new(enabled, alone, ops.len());
            ops.iter().map(|op| policy.allows(op)).collect::<Vec<_>>()
        };
        assert_eq!(allowed(true, true, &[rank(), rank()]), [true, true]);
        assert_eq!(allowed(true, true, &[rank(), set(), rank()]), [true, true, false], "not after a write");
        assert_eq!(allowed(true, false, &[rank()]), [false], "not behind other requests in flight");
        assert_eq!(allowed(false, true, &[rank()]), [false], "not when turned off");
        assert_eq!(allowed(true, true, &[rank(), rank(), rank(), rank(), rank()]), [false; 5], "not in pipelines");
    }
}
