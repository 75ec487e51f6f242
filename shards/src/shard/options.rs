//! How a shard is opened, and the defaults the server starts from.

use crate::cache::cached_players_for;
use crate::dedup::DedupLimits;
use crate::tree;

/// When a committed batch counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync the journal before acknowledging (the default): survives power loss.
    #[default]
    Sync,
    /// Hand the journal to the OS before acknowledging: survives a crash of
    /// the process (kill -9), not of the machine.
    Buffered,
}

/// How a shard is opened.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// Count-tree branching factor; must match what the data dir was made with.
    pub branching: u32,
    /// When a commit returns.
    pub durability: Durability,
    /// fjall's block cache, bytes: keeps hot table blocks in memory for
    /// record-cache misses and list scans.
    pub cache_bytes: u64,
    /// Least logged tree changes between leaf checkpoints (see
    /// `Shard::checkpoint_due`).
    pub checkpoint_every: u64,
    /// Memtable size per keyspace, bytes. fjall's 64 MiB default costs
    /// several times that in skiplist nodes for small keys, and a smaller
    /// memtable is also faster to search.
    pub memtable_bytes: u64,
    /// Player records kept in memory (see `RecordCache` in `cache.rs`); 0 disables.
    /// [`cached_players_for`] turns a memory budget into this.
    pub cached_players: usize,
    /// fjall flush/compaction threads for this shard. One: with more, fjall
    /// 3's worker 0 hands compaction messages back to the queue while it
    /// waits for flushes, a costly ping-pong (see
    /// docs/performance-history.md); the shard's writer is single-threaded
    /// anyway.
    pub worker_threads: usize,
    /// Players with changed records that make the overlay be written as a
    /// run (see `overlay.rs`). Fewer means less memory and a shorter
    /// rebuild after a crash; more means fewer, larger runs for fjall to
    /// merge.
    pub run_every: usize,
    /// Count-tree leaves each sealed batch copies, at least, for a
    /// checkpoint being taken (see [`CountTree::begin_snapshot`](crate::CountTree::begin_snapshot)).
    pub checkpoint_slice_leaves: usize,
    /// How much sooner, as a share of the usual wait (0 to 1), the first
    /// checkpoint after opening comes: shard `i` of `n` given `i / n` keeps
    /// shards under an even load from taking their checkpoints together,
    /// when their memory peaks would add up and their writers compete for
    /// the CPU. Only ever sooner: a later one lengthens the log a restart
    /// replays (see docs/performance-history.md).
    pub checkpoint_phase: f64,
    /// Runs first on each checkpoint's leaf-writing thread: an embedder's
    /// say in how it is scheduled (the server lowers its priority, as the
    /// writing of runs is lowered, so requests come first).
    pub leaf_writer_start: Option<fn()>,
    /// Runs once the shard's storage is open, before its state loads: an
    /// embedder's say in how fjall's worker threads, started by the open,
    /// are scheduled. The server lowers them there, so the compactions an
    /// open starts do not take the cores from the load.
    pub storage_opened: Option<fn()>,
    /// How long idempotent writes' `wid`s are remembered, and in how much memory.
    pub dedup: DedupLimits,
}

impl Default for ShardOptions {
    fn default() -> Self {
        Self {
            branching: tree::DEFAULT_BRANCHING,
            durability: Durability::Sync,
            cache_bytes: 32 << 20,
            checkpoint_every: CHECKPOINT_EVERY,
            memtable_bytes: 8 << 20,
            cached_players: cached_players_for(64 << 20),
            worker_threads: 1,
            run_every: RUN_EVERY,
            checkpoint_slice_leaves: CHECKPOINT_SLICE_LEAVES,
            checkpoint_phase: 0.0,
            leaf_writer_start: None,
            storage_opened: None,
            dedup: DedupLimits::default(),
        }
    }
}

/// Default [`ShardOptions::run_every`]. A changed player costs the overlay
/// ~150 bytes (its record, and the old and new index entry), so ~10 MB a
/// shard.
pub const RUN_EVERY: usize = 65_536;

/// Default least logged tree changes between leaf checkpoints (see
/// `Shard::checkpoint_due`).
pub const CHECKPOINT_EVERY: u64 = 100_000;

/// Count-tree leaves a sealed batch copies for a checkpoint being taken,
/// at least (see [`CountTree::begin_snapshot`](crate::CountTree::begin_snapshot)
/// and `Shard::copy_checkpoint_slice`). Each slice holds up that batch's
/// requests: many short slices make a better tail latency than few long ones
/// (see docs/performance-history.md).
pub const CHECKPOINT_SLICE_LEAVES: usize = 256;
