//! rankd's engine: persistent count trees over fjall, applied in atomic
//! batches. No networking and no actors: the server wires this to the world,
//! and anything else may embed it.
//!
//! - [`tree`]: the count tree that makes ranks O(log n);
//! - [`key`]: order-preserving byte layouts of scores and storage keys;
//! - [`shard`]: one shard's storage and batch application;
//! - [`commit`]: group commit on a committer and a runs thread, so the
//!   shard's own thread never waits for storage;
//! - `cache`: the exact in-memory cache of player records, in huge pages
//!   (`huge_pages`);
//! - `checkpoint`: a checkpoint's leaves written while they are copied;
//! - `log`: the change log, a batch's only per-write storage;
//! - `overlay`: player records and index entries not yet written, and the
//!   sorted runs they are written in;
//! - `record`: a player's stored state in one tree ([`Record`]);
//! - [`ties`]: order statistics inside a tie, for deep pages;
//! - [`dedup`]: the `wid`s of idempotent writes applied lately;
//! - [`dense`]: distinct-score counting across shards for dense ranks;
//! - [`board`]: boards, orders, tie rules, windows and write modes;
//! - [`window`]: which period of a time window a moment falls in.

#![warn(missing_docs)]

pub mod board;
mod cache;
mod checkpoint;
pub mod commit;
pub mod dedup;
pub mod dense;
pub mod error;
pub mod fields;
mod huge_pages;
pub mod key;
mod log;
mod overlay;
mod record;
pub mod shard;
pub mod ties;
pub mod tree;
pub mod window;

pub use board::{Amount, Board, BoardConfig, ConfigInterner, Mode, Order, SharedBoard, Ties, Window};
/// For tests of hostile input: see [`cache::CRAFTED_PAIR`].
#[cfg(feature = "test-hooks")]
pub use cache::CRAFTED_PAIR;
pub use dedup::{DedupLimits, Outcome, Wid};
pub use dense::DenseIndex;
pub use error::ShardError;
pub use key::TreeId;
pub use record::Record;
pub use shard::{
    cached_players_for, incrs_stay_in_range, Committed, DenseChange, Direction, Durability, DurabilityHandle, IdleStep,
    ImageWriter, ListEntry, Lookups, SealedBatch, Shard, ShardImage, ShardOptions, StorageStats, TreeForms, Upcoming,
    UpcomingWrite, WrittenBatch, IMAGE_KEYSPACES, MEMTABLE_OVERRUN,
};
pub use tree::{CountTree, FrozenTree, Repacked, TreeView};

/// The hasher of the maps the hot paths touch (the record cache, staged
/// keys, the trees, a tree's dirty leaves): foldhash, several times cheaper
/// than std's SipHash on short keys (see docs/performance-history.md) and,
/// like it, seeded at random per process, so keys that clients choose
/// (names, scores) cannot be aimed at one bucket.
pub(crate) type FastHasher = foldhash::fast::RandomState;
