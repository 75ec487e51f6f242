//! One shard's engine: its count trees, players and score index, kept in its
//! own fjall database and changed in atomic batches.
//!
//! Writes are *staged*: they update the in-memory trees and the overlay of
//! unwritten player records and index entries at once (so later requests
//! see them) and append the change to the batch's log record.
//! [`Shard::commit`] writes the batch — that one log record, board configs
//! and the sequence high-water mark — as ONE fjall write batch and persists
//! it; the caller acknowledges the batch's requests only after that.
//!
//! The log record is a batch's only per-write storage. The count trees,
//! players and score index each reach storage in bulk, later, and the log
//! covers each until it has:
//!
//! - player records and index entries collect in an `Overlay` that reads
//!   consult first; every [`ShardOptions::run_every`] players it is written
//!   as one sorted run per keyspace (`overlay.rs`), after the log
//!   records it covers are durable, and a marker records how far the runs
//!   reach;
//! - count trees change in memory; once the log is long enough (see
//!   `Shard::checkpoint_due`) a snapshot of the changed leaves is taken,
//!   copied a slice per sealed batch with copy-on-write for leaves about to
//!   change (`CountTree::begin_snapshot`), each slice written straight
//!   into tables as it is copied (`checkpoint.rs`), with a marker of
//!   the log they include; once all are copied and a run of everything
//!   before them is written, the tables join the keyspace at once and the
//!   log records they make redundant are deleted.
//!
//! So a restart loads the leaves, replays the (bounded) log past their
//! marker into the trees, and rebuilds the overlay from the records past the
//! runs' marker: it never reads the players, and trees, players and index
//! never disagree after a crash.
//!
//! A server splits a commit in three: [`Shard::seal`] turns the open batch
//! into a [`SealedBatch`] on the shard's thread; another thread writes it to
//! the journal ([`SealedBatch::write`]), fsyncs, and then writes the runs and
//! checkpoint the batch may carry ([`WrittenBatch::write_runs`]), so the
//! shard's thread never waits for storage. Until [`Shard::landed`] says a
//! sealed batch is done, the overlay it carries stays readable from memory.

use std::collections::{HashMap, VecDeque};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::config::{FilterPolicy, PinningPolicy};
use fjall::{AbstractTree as _, CompressionType, Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::board::{Board, BoardConfig, Mode, Order, Ties};
use crate::cache::RecordCache;
pub use crate::cache::{cached_players_for, Lookups};
use crate::checkpoint::{leaf_key, LeafWriter};
use crate::error::ShardError;
use crate::key::{self, TreeId, TREE_PREFIX_LEN};
use crate::log::{self, LogFormat};
use crate::overlay::{self, Overlay};
pub use crate::record::Record;
use crate::tree::{self, CountTree, LeafEncoding, LeafId, Repacked, SlicePicker};
use crate::window;
use crate::FastHasher;

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
    /// fjall block cache, bytes.
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
    /// waits for flushes, and in profiles that ping-pong cost ~10% of the
    /// server's CPU; the shard's writer is single-threaded anyway.
    pub worker_threads: usize,
    /// Players with changed records that make the overlay be written as a
    /// run (see `overlay.rs`). Fewer means less memory and a shorter
    /// rebuild after a crash; more means fewer, larger runs for fjall to
    /// merge.
    pub run_every: usize,
    /// Count-tree leaves each sealed batch copies, at least, for a
    /// checkpoint being taken (see [`CountTree::begin_snapshot`]).
    pub checkpoint_slice_leaves: usize,
    /// How much sooner, as a share of the usual wait (0 to 1), the first
    /// checkpoint after opening comes. Shards that share a load evenly
    /// reach their checkpoints together: when a checkpoint still held a
    /// copy of nearly every leaf until it was written (~100 MB a shard at
    /// 10M players on 2 shards; now each slice is written as it is copied,
    /// see `checkpoint.rs`), both copies at once took the server from
    /// ~460 to ~710 MiB allocated, one at a time to ~585; apart, their
    /// writers also do not compete for the CPU. Shard `i` of `n` given
    /// `i / n` starts out that far ahead, and shards under an even load
    /// stay apart (an uneven one lets them drift together again). Only ever
    /// sooner: making a due shard wait while another's copy was held
    /// (tried) lengthens the log a restart after kill -9 replays, which at
    /// 10M players already reaches ~550k changes a shard (the wait, and
    /// what is logged while a checkpoint is written) and ~2.7-3.0 s.
    pub checkpoint_phase: f64,
    /// Runs first on each checkpoint's leaf-writing thread: an embedder's
    /// say in how it is scheduled (the server lowers its priority, as the
    /// writing of runs is lowered, so requests come first).
    pub leaf_writer_start: Option<fn()>,
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
        }
    }
}

/// One entry of a list read, with its position for merging across shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// Index bytes after the tree prefix; compares like the list order.
    pub position: Vec<u8>,
    /// Player name.
    pub player: String,
    /// Score.
    pub score: i64,
    /// Reach sequence (ordinal boards only, else 0).
    pub seq: u64,
}

/// A change to the set of scores held in a dense-ranked tree, reported by
/// [`Shard::commit`] so the engine-wide distinct-score index can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseChange {
    /// Which tree.
    pub tree: TreeId,
    /// Score key that lost a player.
    pub removed: Option<u64>,
    /// Score key that gained a player.
    pub added: Option<u64>,
}

/// Which way a list read walks from its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Worse scores, starting at the position (inclusive).
    Forward,
    /// Better scores, ending before the position (exclusive), nearest first.
    Backward,
}

/// What the open batch will write: its log record, and meta keys with one
/// final value each (fjall must never see two values for one key in one
/// atomic batch).
#[derive(Default)]
struct Staged {
    meta: HashMap<Vec<u8>, Option<Vec<u8>>>,
    dense: Vec<DenseChange>,
    /// This batch's score changes, logged as one record ([`crate::log`]).
    log: Vec<u8>,
    /// Score changes in `log`.
    changes: u64,
    seq_dirty: bool,
    /// Staged requests of any kind (so an empty batch is skipped).
    ops: usize,
    /// Staged score writes and removals.
    writes: usize,
}

/// What a successful [`Shard::commit`] did, for the caller's metrics and the
/// dense indexes.
#[derive(Debug, Default)]
pub struct Committed {
    /// Changes to dense trees' score sets.
    pub dense: Vec<DenseChange>,
    /// Score writes and removals committed.
    pub writes: usize,
    /// Time writing the batch to the journal and memtables.
    pub journal: Duration,
    /// Time making it durable (fsync, or handing it to the OS when buffered).
    pub sync: Duration,
}

/// A batch taken out of the shard by [`Shard::seal`], to be written by any
/// thread. Sealed batches must be written in the order they were sealed, and
/// none after one failed (the storage is poisoned then: reopen the shard).
pub struct SealedBatch {
    /// The fjall batch, `None` when the batch changed nothing stored.
    batch: Option<fjall::OwnedWriteBatch>,
    /// Changes to dense trees' score sets.
    pub dense: Vec<DenseChange>,
    /// Score writes and removals in the batch.
    pub writes: usize,
    memtables: Memtables,
    /// Runs to write once the batch is durable.
    runs: Option<Runs>,
}

/// The overlay a batch froze when sealed, to be written as runs once the
/// batch's log record is durable, and what follows them.
struct Runs {
    overlay: Arc<Overlay>,
    players: Keyspace,
    index: Keyspace,
    /// At a checkpoint, the writer of its leaves: finished once the runs
    /// are written.
    checkpoint: Option<LeafWriter>,
    /// Written last: the marker saying how far the runs reach and, at a
    /// checkpoint, the deletion of the log the leaves make redundant. Not
    /// synced itself: if a crash loses it, the log is still there, and the
    /// runs are written again (the leaves' own marker says which records
    /// they already hold).
    after: fjall::OwnedWriteBatch,
}

/// A checkpoint's leaves being copied, a slice each sealed batch, and
/// written as they come (see [`crate::checkpoint`]).
struct Checkpointing {
    /// The number of the first log record the leaves do not include.
    through: u64,
    /// The trees still to copy, in key order: the writer appends every
    /// leaf to sorted tables.
    trees: VecDeque<TreeId>,
    writer: LeafWriter,
}

impl SealedBatch {
    /// Whether the batch changes nothing stored.
    pub fn is_empty(&self) -> bool {
        self.batch.is_none() && self.runs.is_none()
    }

    /// Writes the batch to the journal and memtables, atomically, without
    /// making it durable (see [`DurabilityHandle::sync`]). Full memtables
    /// are left for [`WrittenBatch::write_runs`] to seal: sealing one makes
    /// fjall delete the files compactions have made obsolete, there and
    /// then, and on a disk mounted with `discard` an unlink of a large table
    /// took 100-250 ms, stalling every acknowledgment when it was done here.
    pub fn write(self) -> Result<WrittenBatch, ShardError> {
        let started = Instant::now();
        if let Some(batch) = self.batch {
            batch.commit()?;
        }
        Ok(WrittenBatch { took: started.elapsed(), runs: self.runs, memtables: self.memtables })
    }
}

/// A batch in the journal, perhaps not yet durable, with the runs it still
/// has to write.
pub struct WrittenBatch {
    /// How long writing the batch took.
    pub took: Duration,
    runs: Option<Runs>,
    memtables: Memtables,
}

impl WrittenBatch {
    /// Whether [`WrittenBatch::write_runs`] has anything to do: runs to
    /// write, or a full memtable to seal.
    pub fn has_work(&self) -> bool {
        self.runs.is_some() || self.memtables.any_to_seal()
    }

    /// Whether the batch ends a checkpoint: [`WrittenBatch::write_runs`]
    /// writes its leaves.
    pub fn carries_checkpoint(&self) -> bool {
        self.runs.as_ref().is_some_and(|runs| runs.checkpoint.is_some())
    }

    /// Writes the runs the batch carries, if any, and what follows them,
    /// then seals full memtables for flushing; returns how long that took.
    /// Call only once the batch is durable
    /// ([`DurabilityHandle::sync`] returned after [`SealedBatch::write`]),
    /// for batches in the order they were sealed: a run must never reach
    /// storage before the log that covers it. A failure poisons nothing that
    /// was acknowledged (the log holds it), but the shard must be reopened.
    pub fn write_runs(self) -> Result<Duration, ShardError> {
        let started = Instant::now();
        if let Some(runs) = self.runs {
            runs.overlay.write_runs(&runs.players, &runs.index)?;
            if let Some(leaves) = runs.checkpoint {
                leaves.finish()?;
            }
            runs.after.commit()?;
        }
        self.memtables.rotate_full()?;
        Ok(started.elapsed())
    }
}

/// A shard's keyspaces and the memtable size at which they are sealed for
/// flushing.
///
/// fjall 3.1 rotates a memtable itself by queueing a request to its worker
/// pool on *every* write batch once the memtable is over size, on a bounded
/// queue (1000) that only the workers read; a worker handling one of those
/// requests then blocks queueing the flush on that same queue. Under
/// sustained writes, while the one worker per shard was busy compacting, the
/// requests filled the queue and the worker deadlocked on itself (seen at
/// 10M players: every write and the shutdown hung). fjall-rs/fjall#323 is
/// the upstream fix, not yet released. So keyspaces are created with a
/// memtable limit fjall never reaches, and the committer rotates them here,
/// once per full memtable, which queues one flush and no flood.
#[derive(Clone)]
struct Memtables {
    keyspaces: Arc<[Keyspace]>,
    limit: u64,
}

impl Memtables {
    fn largest(&self) -> u64 {
        self.keyspaces.iter().map(|keyspace| keyspace.tree.active_memtable().size()).max().unwrap_or(0)
    }

    /// Whether `keyspace`'s memtable is to be sealed for flushing: once it
    /// is full, unless the keyspace already has [`MAX_SEALED_MEMTABLES`]
    /// waiting for fjall's worker and the memtable is still within
    /// [`MEMTABLE_OVERRUN`] times the limit.
    fn due(&self, keyspace: &Keyspace) -> bool {
        let size = keyspace.tree.active_memtable().size();
        size > self.limit
            && (keyspace.tree.sealed_memtable_count() < MAX_SEALED_MEMTABLES
                || size > self.limit.saturating_mul(MEMTABLE_OVERRUN))
    }

    fn any_to_seal(&self) -> bool {
        self.keyspaces.iter().any(|keyspace| self.due(keyspace))
    }

    fn rotate_full(&self) -> Result<(), ShardError> {
        for keyspace in self.keyspaces.iter().filter(|keyspace| self.due(keyspace)) {
            keyspace.rotate_memtable()?;
        }
        Ok(())
    }

    /// Sealed memtables, all keyspaces, waiting for fjall's worker to flush them.
    fn sealed(&self) -> usize {
        self.keyspaces.iter().map(|keyspace| keyspace.tree.sealed_memtable_count()).sum()
    }
}

/// How a shard's storage keeps up with its background work, for operators:
/// fjall's one worker per shard flushes memtables and compacts tables in
/// turn, and while it is behind, memtables take memory and (past
/// `MAX_SEALED_MEMTABLES`) grow beyond their size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Bytes held in memtables, taking writes or sealed.
    pub memtable_bytes: u64,
    /// Sealed memtables waiting for the worker to flush them.
    pub sealed_memtables: usize,
    /// Time the worker has spent compacting since the shard opened.
    pub compacting: Duration,
}

/// Sealed memtables of one keyspace waiting for fjall's worker beyond which
/// a full memtable is kept taking writes rather than sealed.
///
/// fjall halts every write to a keyspace with four sealed memtables (it
/// sleeps 100 ms at a time until its worker flushes one), and a shard's one
/// worker flushes and compacts in turn. Behind a long compaction (at 10M
/// players on 2 shards, one rewrites the ~130 MB of a shard's players or
/// index at the lowest priority on busy cores: 3-8 s) the log's memtables
/// piled up, and the committer, whose every batch writes the log, slept:
/// a scheduler trace of one stall showed it waking every 100 ms for 12 s
/// while every write waited for it. Two leaves room for the seals fjall
/// itself asks for to shorten the journal.
const MAX_SEALED_MEMTABLES: usize = 2;

/// How far past [`ShardOptions::memtable_bytes`] a memtable may grow while
/// its keyspace waits for flushes (see `MAX_SEALED_MEMTABLES`): the bound
/// on the memory a worker that falls behind for good can cost. Past it the
/// memtable is sealed anyway and fjall's halt holds writes back. At 10M
/// players the log's memtable grows ~2 MB a second a shard under
/// saturating writes, so 4 (32 MiB) outlasts the compactions seen.
pub const MEMTABLE_OVERRUN: u64 = 4;

/// Makes everything a shard has committed so far durable: the group-commit
/// half of a write after [`Shard::seal`] and [`SealedBatch::write`], on
/// whichever thread commits (the server's committer).
#[derive(Clone)]
pub struct DurabilityHandle {
    db: Database,
    mode: PersistMode,
}

impl DurabilityHandle {
    /// Flushes the journal to the OS and, under [`Durability::Sync`], fsyncs
    /// it; returns how long that took. One call covers every batch committed
    /// before it, which is what group commit shares. A failure poisons the
    /// storage (fjall refuses later writes): reopen the shard to go on.
    pub fn sync(&self) -> Result<Duration, ShardError> {
        let started = Instant::now();
        self.db.persist(self.mode)?;
        Ok(started.elapsed())
    }
}

/// Default [`ShardOptions::run_every`]. A changed player costs the overlay
/// ~150 bytes (its record, and the old and new index entry), so ~10 MB a
/// shard; a run of this size took ~0.12 s to write (1M players).
pub const RUN_EVERY: usize = 65_536;

/// Default least logged tree changes between leaf checkpoints (see
/// `Shard::checkpoint_due`).
pub const CHECKPOINT_EVERY: u64 = 100_000;

/// Count-tree leaves a sealed batch copies for a checkpoint being taken,
/// at least (see [`CountTree::begin_snapshot`] and
/// `Shard::copy_checkpoint_slice`). Each slice holds up that batch's
/// requests. With 2048, in one run at 10M players on 2 shards, an
/// unpipelined rank's p99 with writers flat out was 1713 us (1062-1291 us
/// before slices; one client waiting through one long copy is one slow
/// sample, through many shorter slices it is many); with 256 it was
/// 1158 us.
pub const CHECKPOINT_SLICE_LEAVES: usize = 256;

/// Slices a checkpoint's writer may fall behind before the shard stops
/// copying more (see `Shard::copy_checkpoint_slice`): the writer runs at
/// the lowest priority, and on a busy machine the copies would otherwise
/// pile up in memory as they did before they were written as they came.
/// At 10M players on 2 shards a slice is ~100 KB.
const MAX_QUEUED_SLICES: usize = 64;

/// A checkpoint waits for at most this many times
/// [`ShardOptions::checkpoint_every`] logged changes: bounds the log a
/// restart replays. At 10M players on 2 shards, a restart after kill -9
/// under writes replayed ~343k changes per shard in ~1 s on top of ~1 s of
/// journal recovery (2.0 s in all); with the journal near its 64 MiB cap,
/// ~300k changes took 1.5-1.8 s after 1.9-2.1 s of journal (3.9 s).
const CHECKPOINT_STRETCH: u64 = 4;

/// Journal bytes kept before fjall flushes the memtables that still need
/// the oldest journal file. A start after a crash replays every journal
/// file, and fjall's default (512 MiB) let them grow that far: keyspaces
/// written a little per batch (meta, the tree log) never fill a memtable, so
/// nothing released the old files. At 10M players after 3 minutes of writes
/// each shard held ~440 MiB of journal and a restart after kill -9 took
/// 9.8 s. fjall's minimum, 64 MiB (one journal file; fjall starts a new file
/// at 64 MB), keeps the replay to about one or two files.
const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// Level-0 tables that make fjall merge them into level 1, for the
/// keyspaces written one small random key per write (players, index).
/// fjall's default, 4, suits its 64 MiB memtables; after our 8 MiB ones
/// every few MiB flushed rewrote the whole of level 1 (~130 MB per shard at
/// 10M players): in a 10M-player profile under writes fjall's worker was
/// ~30% of the server's CPU, and 12 took it from 31.5 s to 17.4 s of CPU
/// over the same 97 s. Reads pay a bloom-filter probe per extra table.
/// Below 20, where fjall starts stalling writes.
const POINT_WRITE_L0_MERGE: u8 = 12;

/// Table size fjall's compactions aim for in the players' and the index's
/// keyspaces (fjall's default: 64 MiB). A compaction holds the hashes of
/// every key of the table it is writing (8 bytes each, for the table's
/// bloom filter) until the table is done, in a vector grown by doubling: at
/// 10M players on 2 shards, with 64 MiB tables, one grew to 32 MiB (a
/// 48 MiB moment while it was copied), and the server's resident memory,
/// sampled ten times a second under writes, peaked at 628 and 725 MiB
/// against 573 and 587 MiB with 16 MiB tables (largest hash vector 2 MiB).
/// Level 1 then starts at 16 MiB times [`POINT_WRITE_L0_MERGE`], 192 MiB,
/// above a 5M-player shard's keyspace. fjall stores it with the keyspace:
/// data dirs keep what they were made with.
const POINT_WRITE_TABLE_BYTES: u64 = 16 << 20;

/// Compaction for the keyspaces written one small random key per write.
/// fjall stores it with the keyspace: data dirs keep what they were made with.
fn point_write_compaction() -> Arc<fjall::compaction::Leveled> {
    Arc::new(
        fjall::compaction::Leveled::default()
            .with_l0_threshold(POINT_WRITE_L0_MERGE)
            .with_table_target_size(POINT_WRITE_TABLE_BYTES),
    )
}

/// Level-0 tables that make fjall merge the leaves' keyspace into level 1.
/// Each checkpoint is ingested as level-0 tables holding nearly every leaf
/// (60-100 MB a shard at 10M players), which supersede all before them; at
/// fjall's default, 4, up to four whole copies piled up in level 0 (304 MB
/// on disk for a 5M-player shard), and a start read every one of them
/// (loading the leaves took 0.5-1.2 s). Two merges after about every
/// checkpoint, and keeps level 1's base (this times the 64 MiB table size)
/// above one copy.
const CHECKPOINT_L0_MERGE: u8 = 2;

/// Compaction for the leaves' keyspace; see [`CHECKPOINT_L0_MERGE`]. fjall
/// stores it with the keyspace: data dirs keep what they were made with.
fn checkpoint_compaction() -> Arc<fjall::compaction::Leveled> {
    Arc::new(fjall::compaction::Leveled::default().with_l0_threshold(CHECKPOINT_L0_MERGE))
}

const META_BOARD: &[u8] = b"board/";
const META_EXPIRING: &[u8] = b"expiring/";
const META_MAX_SEQ: &[u8] = b"max_seq";
const META_MAX_BOARD: &[u8] = b"max_board_id";
const META_BRANCHING: &[u8] = b"branching";
/// The [`LeafEncoding`] code; absent in data dirs made before there was a choice.
const META_LEAF_ENCODING: &[u8] = b"leaf_encoding";
/// The [`LogFormat`] code; absent in data dirs made before runs.
const META_LOG_FORMAT: &[u8] = b"log_format";
/// The number of the first log record whose changes may be missing from the
/// players' and the index's runs: records before it are covered.
const META_RUNS_THROUGH: &[u8] = b"runs_through";
/// Key, in the leaves' own keyspace, of the number of the first log record
/// the stored leaves do not include (see [`Checkpoint::ingest`]); absent in
/// data dirs made before it. One zero byte: it sorts before every leaf key
/// (all longer, so a zero first byte still puts them after it), and as it
/// is shorter than a board id neither a board's nor a tree's prefix scan
/// meets it.
const LEAVES_THROUGH: &[u8] = b"\0";

/// One shard: see the module docs.
pub struct Shard {
    db: Database,
    players: Keyspace,
    index: Keyspace,
    leaves: Keyspace,
    meta: Keyspace,
    /// The tree change log, one record per committed batch.
    changes: Keyspace,
    options: ShardOptions,
    /// Where the shard lives, to reopen it after a storage failure.
    path: std::path::PathBuf,
    trees: HashMap<TreeId, CountTree, FastHasher>,
    boards: HashMap<u64, Board>,
    max_seq: u64,
    max_board_id: u64,
    /// Key of the next change-log record.
    next_log: u64,
    /// Key of the oldest change-log record not yet checkpointed.
    first_log: u64,
    /// Changes logged since the last checkpoint.
    logged: u64,
    staged: Staged,
    /// Player records and index entries not yet written as runs.
    overlay: Overlay,
    /// One entry per sealed batch not yet reported done, oldest first, with
    /// the overlay it froze for its runs: until those are written, a read
    /// that misses the current overlay must look there before storage.
    in_flight: VecDeque<Option<Arc<Overlay>>>,
    /// Exact cache of player records (reads take `&self`, hence the cell).
    cache: std::cell::RefCell<RecordCache>,
    /// The time writes are applied at (Unix seconds, UTC): decides which
    /// period of each window a write lands in.
    now: i64,
    /// Expired periods whose data is still being deleted, oldest first.
    expiring: VecDeque<TreeId>,
    /// Rotates full memtables after each sealed batch is written.
    memtables: Memtables,
    /// How this data dir stores tree leaves (fixed when it was made).
    leaf_encoding: LeafEncoding,
    /// The trees a leaf-repacking pass has yet to visit, each with where in
    /// it to go on (see [`Shard::repack_step`]); the current one last.
    repacking: Vec<(TreeId, u128)>,
    /// While a checkpoint's leaves are being copied, a slice each sealed
    /// batch (see [`CountTree::begin_snapshot`]).
    checkpointing: Option<Checkpointing>,
    /// Whether a checkpoint was begun since opening (the first comes sooner
    /// by [`ShardOptions::checkpoint_phase`]).
    checkpoint_begun: bool,
}

impl Shard {
    /// Opens (or creates) the shard stored at `path` and loads its count trees
    /// from their stored leaves (not from the players).
    pub fn open(path: &Path, options: ShardOptions) -> Result<Self, ShardError> {
        tree::branching_bits(options.branching)?;
        let started = Instant::now();
        let db = Database::builder(path)
            .cache_size(options.cache_bytes)
            .worker_threads(options.worker_threads.max(1))
            .max_journaling_size(MAX_JOURNAL_BYTES)
            // fjall LZ4s every journal value of 4 KiB or more, and a batch's
            // log record is one (~10 KB at ~185 writes): ~12% of the
            // committer thread's samples, on the path to every ack. Journal
            // bytes cost little next to the fsync, and each entry records its
            // own compression, so older journals still replay.
            .journal_compression(CompressionType::None)
            .open()?;
        // fjall never rotates a memtable by itself (see [`Memtables`]).
        let created = || KeyspaceCreateOptions::default().max_memtable_size(u64::MAX);
        let keyspace = |name: &str| db.keyspace(name, created);
        // Every write and rank that misses the record cache does a point read
        // here. fjall pins index and filter blocks of the first levels only;
        // deeper, a read loaded and checksummed a table's whole index block
        // (hundreds of KiB) unless the block cache held it: with a small
        // cache a 10M-player rank took ~0.4 ms, mostly xxh3 and memcpy. Pinned
        // they cost ~2 bytes per player.
        let players = db.keyspace("players", || {
            created()
                .compaction_strategy(point_write_compaction())
                .index_block_pinning_policy(PinningPolicy::all(true))
                .filter_block_pinning_policy(PinningPolicy::all(true))
        })?;
        // The index takes small random keys too. It is only ever scanned
        // (lists), never read by key, so its tables skip the bloom filters
        // (hashing every key as runs and compactions write them). The log
        // keeps fjall's default.
        let index = db.keyspace("index", || {
            created().compaction_strategy(point_write_compaction()).filter_policy(FilterPolicy::disabled())
        })?;
        let leaves = db.keyspace("tree", || created().compaction_strategy(checkpoint_compaction()))?;
        let meta = keyspace("meta")?;
        let changes = keyspace("changes")?;
        let cached_players = options.cached_players;
        let run_every = options.run_every;
        let leaf_encoding = check_format(&db, &meta, options.branching)?;
        let memtables = Memtables {
            keyspaces: [&players, &index, &leaves, &meta, &changes].map(Keyspace::clone).into(),
            limit: options.memtable_bytes,
        };
        let mut shard = Self {
            memtables,
            db,
            players,
            index,
            leaves,
            meta,
            changes,
            options,
            path: path.to_path_buf(),
            trees: HashMap::default(),
            boards: HashMap::new(),
            max_seq: 0,
            max_board_id: 0,
            next_log: 0,
            first_log: 0,
            logged: 0,
            staged: Staged::default(),
            overlay: Overlay::new(run_every),
            in_flight: VecDeque::new(),
            cache: std::cell::RefCell::new(RecordCache::new(cached_players)),
            now: 0,
            expiring: VecDeque::new(),
            repacking: Vec::new(),
            checkpointing: None,
            checkpoint_begun: false,
            leaf_encoding,
        };
        let opened = started.elapsed();
        shard.load()?;
        tracing::info!(
            path = %path.display(),
            players = shard.players(),
            replayed = shard.logged,
            storage_ms = opened.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "shard opened"
        );
        Ok(shard)
    }

    /// (Re)builds the in-memory state from what is on disk.
    fn load(&mut self) -> Result<(), ShardError> {
        self.cache.get_mut().clear();
        self.trees.clear();
        self.boards.clear();
        self.staged = Staged::default();
        self.overlay = self.empty_overlay();
        self.in_flight.clear();
        self.max_seq = read_u64(&self.meta, META_MAX_SEQ)?;
        self.max_board_id = read_u64(&self.meta, META_MAX_BOARD)?;
        for item in self.meta.prefix(META_BOARD) {
            let (key, value) = item.into_inner()?;
            let id_bytes: [u8; 8] =
                key.get(META_BOARD.len()..).and_then(|b| b.try_into().ok()).ok_or(ShardError::Corrupt("board key"))?;
            let id = u64::from_be_bytes(id_bytes);
            let (name, config) = BoardConfig::decode(&value).ok_or(ShardError::Corrupt("board config"))?;
            self.boards.insert(id, Board { id, name, config });
        }
        let leaves_through = read_u64(&self.leaves, LEAVES_THROUGH)?;
        for item in stored_leaves(&self.leaves) {
            let (key, value) = item.into_inner()?;
            let tree_id = TreeId::from_prefix(&key).ok_or(ShardError::Corrupt("leaf key"))?;
            let rest = &key[TREE_PREFIX_LEN..];
            let (prefix, depth) = rest.split_first_chunk::<16>().ok_or(ShardError::Corrupt("leaf key"))?;
            let &[depth] = depth else { return Err(ShardError::Corrupt("leaf key")) };
            let id = LeafId { prefix: u128::from_be_bytes(*prefix), depth };
            let tree = match self.trees.entry(tree_id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(CountTree::new(self.options.branching)?),
            };
            tree.install_leaf(id, &value, self.leaf_encoding)?;
        }
        let format = log_format(&self.meta)?;
        self.replay_log(format, read_u64(&self.meta, META_RUNS_THROUGH)?, leaves_through)?;
        // Periods whose deletion a restart interrupted: finish it, never serve them.
        self.expiring.clear();
        for item in self.meta.prefix(META_EXPIRING) {
            let key = item.key()?;
            let tree = TreeId::from_prefix(&key[META_EXPIRING.len()..]).ok_or(ShardError::Corrupt("expiring key"))?;
            self.trees.remove(&tree);
            self.overlay.forget(&tree.prefix());
            self.expiring.push_back(tree);
        }
        if format == LogFormat::TreeKeys {
            self.migrate_log()?;
        }
        Ok(())
    }

    /// Applies the change log on top of the checkpointed leaves (numbers from
    /// `leaves_through` on), and rebuilds the overlay from the records the
    /// runs do not cover (numbers from `runs_through` on). Records before
    /// `leaves_through` are left from a checkpoint whose log deletion a
    /// crash lost: the next checkpoint deletes them. Runs are durable before
    /// the leaves that follow them are written, so they cover those too.
    fn replay_log(&mut self, format: LogFormat, runs_through: u64, leaves_through: u64) -> Result<(), ShardError> {
        let runs_through = runs_through.max(leaves_through);
        self.logged = 0;
        self.first_log = 0;
        self.next_log = 0;
        let mut first = true;
        let branching = self.options.branching;
        let mut gathered = GatheredCounts::default();
        for item in self.changes.iter() {
            let (key, value) = item.into_inner()?;
            let number = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| ShardError::Corrupt("log key"))?);
            if first {
                self.first_log = number;
                first = false;
            }
            self.next_log = number + 1;
            if number < leaves_through {
                continue;
            }
            // A dropped board's log entries are dead: its id never returns.
            match format {
                LogFormat::TreeKeys => {
                    for change in log::tree_key_changes(&value)? {
                        if !self.boards.contains_key(&change.tree.board) {
                            continue;
                        }
                        let tree = count_tree(&mut self.trees, change.tree, branching);
                        if let Some(key) = change.removed {
                            tree.add(key, -1);
                        }
                        if let Some(key) = change.added {
                            tree.add(key, 1);
                        }
                        self.logged += 1;
                    }
                }
                LogFormat::Changes => {
                    let rebuild = number >= runs_through;
                    for change in log::changes(&value) {
                        let change = change?;
                        let Some(board) = self.boards.get(&change.tree.board) else { continue };
                        let overlay = rebuild.then(|| (&mut self.overlay, player_key(change.tree, change.player)));
                        apply_change(TreeCounts::Gather(&mut gathered), overlay, &board.config, &change);
                        self.logged += 1;
                    }
                    if gathered.is_full() {
                        gathered.apply(&mut self.trees, branching);
                    }
                }
            }
        }
        gathered.apply(&mut self.trees, branching);
        // Record numbers never go back: the marker may name a number past an
        // emptied log, and what it covers must stay covered.
        self.next_log = self.next_log.max(runs_through);
        if first {
            self.first_log = self.next_log;
        }
        Ok(())
    }

    /// Moves a data dir made before runs to the current log format. Its log
    /// holds count-tree keys only (its batches wrote the players and the
    /// index themselves, so nothing needs rebuilding there): the trees just
    /// replayed are checkpointed at once, in the batch that deletes the old
    /// records and records the new format.
    fn migrate_log(&mut self) -> Result<(), ShardError> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncAll));
        self.checkpoint_into(&mut batch);
        batch.insert(&self.meta, META_LOG_FORMAT, [LogFormat::Changes.code()]);
        batch.commit()?;
        tracing::info!(path = %self.path.display(), "change log moved to the current format");
        Ok(())
    }

    /// Closes the storage and opens it again: after a failed write fjall
    /// refuses further writes (it marks the database poisoned), so resuming
    /// after a disk fault clears means reopening. Recovery replays the
    /// journal, so the state is exactly what was durably committed.
    pub fn reopen(self) -> Result<Self, ShardError> {
        let (path, options, now) = (self.path.clone(), self.options.clone(), self.now);
        drop(self); // fjall locks the directory: release it first
        let mut shard = Self::open(&path, options)?;
        shard.now = now;
        Ok(shard)
    }

    /// Where the shard's storage lives, and how it was opened: enough to open
    /// it again (see [`Shard::reopen`]) even after the shard itself is gone.
    pub fn location(&self) -> (std::path::PathBuf, ShardOptions) {
        (self.path.clone(), self.options.clone())
    }

    /// Sets the time (Unix seconds, UTC) the next writes are applied at. The
    /// caller owns the clock, so tests can cross period boundaries at will.
    pub fn set_time(&mut self, unix_seconds: i64) {
        self.now = unix_seconds;
    }

    /// The count-tree branching factor.
    pub fn branching(&self) -> u32 {
        self.options.branching
    }

    /// Whether [`Shard::expire`] has anything to do at the current time.
    pub fn has_expired(&self) -> bool {
        !self.expiring.is_empty() || self.newly_expired().next().is_some()
    }

    /// Readable trees whose period fell out of their board's `keep`.
    fn newly_expired(&self) -> impl Iterator<Item = TreeId> + '_ {
        let (now, boards) = (self.now, &self.boards);
        self.trees
            .keys()
            .copied()
            .filter(move |tree| boards.get(&tree.board).is_some_and(|b| window::expired(b, *tree, now)))
    }

    /// Moves periods that fell out of their board's `keep` out of the readable
    /// trees and deletes up to `budget` of their stored keys, in one batch
    /// that is not fsynced (losing it in a crash only means deleting again).
    /// Called between rounds, so a rollover never stalls writes behind a big
    /// delete. Returns the trees that newly expired.
    pub fn expire(&mut self, budget: usize) -> Result<Vec<TreeId>, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let newly: Vec<TreeId> = self.newly_expired().collect();
        for tree in &newly {
            self.trees.remove(tree);
            self.expiring.push_back(*tree);
        }
        if !newly.is_empty() {
            // Drop the log that could replay them back and remember them.
            self.checkpoint_with(&newly)?;
        }
        let mut left = budget;
        while left > 0 {
            let Some(&tree) = self.expiring.front() else { break };
            let prefix = tree.prefix();
            let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
            for keyspace in [&self.players, &self.index, &self.leaves] {
                for item in keyspace.prefix(prefix).take(left) {
                    batch.remove(keyspace, item.key()?);
                    left -= 1;
                }
            }
            let done = left > 0;
            if done {
                batch.remove(&self.meta, expiring_key(tree));
            }
            batch.commit()?;
            if done {
                self.expiring.pop_front();
                // Cache keys are hashes: the tree's records cannot be picked out.
                self.cache.get_mut().clear();
            }
        }
        Ok(newly)
    }

    /// Boards whose config this shard holds (it saw a write or a create).
    pub fn boards(&self) -> impl Iterator<Item = &Board> {
        self.boards.values()
    }

    /// Highest reach sequence this shard has stored.
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Highest board id this shard has ever stored.
    pub fn max_board_id(&self) -> u64 {
        self.max_board_id
    }

    /// Whether the open batch holds writes not yet committed.
    pub fn has_staged(&self) -> bool {
        self.staged.ops > 0
    }

    /// Persists `board`'s config in this shard if it is not there yet.
    pub fn ensure_board(&mut self, board: &Board) {
        if self.boards.get(&board.id).is_some_and(|b| b == board) {
            return;
        }
        self.boards.insert(board.id, board.clone());
        self.staged.meta.insert(board_meta_key(board.id), Some(board.config.encode(&board.name)));
        if board.id > self.max_board_id {
            self.max_board_id = board.id;
            self.staged.meta.insert(META_MAX_BOARD.to_vec(), Some(board.id.to_be_bytes().to_vec()));
        }
        self.staged.ops += 1;
    }

    /// Stages a score write to every window of `board` and returns the score
    /// stored in its first window. `seq` is the write's global arrival
    /// sequence. An `incr` that would overflow changes nothing.
    pub fn write(&mut self, board: &Board, player: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ShardError> {
        let windows = window::current_trees(board, self.now);
        let mut plans = Vec::with_capacity(windows.len());
        for tree in windows {
            let key = PlayerKey::new(tree, player);
            let old = self.record(&key)?;
            let new = combined(mode, board.config.order, old, score)?;
            plans.push((tree, key, old, new));
        }
        self.ensure_board(board);
        let stored = plans.first().map_or(score, |p| p.3);
        for (tree, key, old, new) in plans {
            if old.is_some_and(|o| o.score == new) {
                continue; // unchanged: keeps when the player reached it
            }
            self.stage(board, tree, player, key, old, Some(Record { score: new, seq }));
        }
        if seq > self.max_seq {
            self.max_seq = seq;
            self.staged.seq_dirty = true;
        }
        self.staged.ops += 1;
        self.staged.writes += 1;
        Ok(stored)
    }

    /// Asks the CPU for the memory the given commands, about to be applied,
    /// will wait for: each player's cached record, then the count-tree
    /// leaves a write's old and new score or a rank's key fall in, and the
    /// leaves of counted keys. Changes nothing.
    ///
    /// A command waits for memory at each of these (the shard holds far
    /// more than the CPU caches), one wait after another; asked for a group
    /// of commands together, in passes whose loads do not depend on each
    /// other, the waits overlap. At 1M players under pipelined `set` this
    /// took the shard thread from 3.6-3.8 to 2.8 us a write; under
    /// pipelined `rank`, from 1.55 to 1.07-1.13 us a rank.
    pub fn prefetch<'a>(&self, upcoming: impl IntoIterator<Item = Upcoming<'a>>) {
        let mut records: Vec<(Upcoming<'a>, TreeId, u128)> = Vec::new();
        let mut paths: Vec<(TreeId, Vec<u128>)> = Vec::new();
        let mut stored_key = Vec::new();
        let mut cache_key = |tree, player: &str| {
            stored_key.clear();
            push_player_key(&mut stored_key, tree, player);
            RecordCache::key(&stored_key)
        };
        for command in upcoming {
            match command {
                Upcoming::Write(write) => {
                    for tree in window::current_trees(write.board, self.now) {
                        records.push((command, tree, cache_key(tree, write.player)));
                    }
                }
                Upcoming::Rank { tree, player, .. } => records.push((command, tree, cache_key(tree, player))),
                Upcoming::CountBefore { tree, keys } => tree_paths(&mut paths, tree).extend_from_slice(keys),
            }
        }
        let cache = self.cache.borrow();
        let olds: Vec<Option<Record>> = records.iter().map(|&(_, _, cached)| cache.peek(cached).flatten()).collect();
        drop(cache);
        for ((command, tree, _), old) in records.into_iter().zip(olds) {
            let keys = tree_paths(&mut paths, tree);
            match command {
                Upcoming::Write(write) => {
                    let (ties, order) = (write.board.config.ties, write.board.config.order);
                    keys.extend(old.map(|old| old.tree_key(write.player, ties, order)));
                    if let Ok(score) = combined(write.mode, order, old, write.score) {
                        keys.push(Record { score, seq: write.seq }.tree_key(write.player, ties, order));
                    }
                }
                Upcoming::Rank { ties, order, .. } => {
                    keys.extend(old.map(|old| old.rank_key(ties, order)));
                }
                Upcoming::CountBefore { .. } => {}
            }
        }
        for (tree, keys) in paths {
            if let Some(count_tree) = self.trees.get(&tree) {
                count_tree.prefetch_many(&keys);
            }
        }
    }

    /// Stages `(player, score, seq)` writes in order, all or none: if one
    /// `incr` would overflow, nothing is staged.
    pub fn write_many(
        &mut self,
        board: &Board,
        entries: &[(String, i64, u64)],
        mode: Mode,
    ) -> Result<Vec<i64>, ShardError> {
        if mode == Mode::Incr {
            for tree in window::current_trees(board, self.now) {
                let mut running: HashMap<&str, i64> = HashMap::new();
                for (player, score, _) in entries {
                    let current = match running.get(player.as_str()) {
                        Some(s) => Some(*s),
                        None => self.get(tree, player)?.map(|r| r.score),
                    };
                    let next = current.unwrap_or(0).checked_add(*score).ok_or(ShardError::Overflow)?;
                    running.insert(player, next);
                }
            }
        }
        entries.iter().map(|(player, score, seq)| self.write(board, player, *score, mode, *seq)).collect()
    }

    /// Stages removing `player` from the current period of every window;
    /// returns whether they were in the first window.
    pub fn remove(&mut self, board: &Board, player: &str) -> Result<bool, ShardError> {
        let mut first = None;
        for tree in window::current_trees(board, self.now) {
            let key = PlayerKey::new(tree, player);
            let old = self.record(&key)?;
            first.get_or_insert(old.is_some());
            if old.is_some() {
                self.stage(board, tree, player, key, old, None);
            }
        }
        self.staged.ops += 1;
        self.staged.writes += 1;
        Ok(first.unwrap_or(false))
    }

    /// Moves `player` from `old` to `new`: in the count tree, the overlay
    /// and the record cache at once, in storage through the batch's log.
    fn stage(
        &mut self,
        board: &Board,
        tree: TreeId,
        player: &str,
        key: PlayerKey,
        old: Option<Record>,
        new: Option<Record>,
    ) {
        let change = log::Change { tree, player, old, new };
        log::push(&mut self.staged.log, &change);
        self.staged.changes += 1;
        self.cache.get_mut().put(key.cached, new);
        let overlay = Some((&mut self.overlay, key.stored));
        let counts = TreeCounts::Apply(count_tree(&mut self.trees, change.tree, self.options.branching));
        let dense = apply_change(counts, overlay, &board.config, &change);
        if board.config.ties == Ties::Dense {
            self.staged.dense.push(dense);
        }
    }

    /// Stages deleting everything stored for the board with `board_id`.
    /// Needs a committed state (it scans storage); returns whether it existed.
    pub fn drop_board(&mut self, board_id: u64) -> Result<bool, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        // A checkpoint under way may have written the board's leaves
        // already: they would come back when it finished.
        self.abandon_checkpoint();
        let existed = self.boards.remove(&board_id).is_some();
        // Cache keys are hashes: the board's entries cannot be picked out.
        self.cache.get_mut().clear();
        let prefix = board_id.to_be_bytes();
        self.overlay.forget(&prefix);
        let mut batch = self.db.batch().durability(Some(self.persist_mode()));
        for keyspace in [&self.players, &self.index, &self.leaves] {
            for item in keyspace.prefix(prefix) {
                batch.remove(keyspace, item.key()?);
            }
        }
        batch.remove(&self.meta, board_meta_key(board_id));
        batch.commit()?;
        self.trees.retain(|tree, _| tree.board != board_id);
        Ok(existed)
    }

    /// Writes the open batch atomically and persists it, then writes the
    /// runs (and checkpoint) it carries: on one thread what a server splits
    /// between [`Shard::seal`] and its committer. On failure the in-memory
    /// state is rebuilt from disk, so it never runs ahead of what is stored,
    /// and the error is returned: none of the batch may be acknowledged.
    pub fn commit(&mut self) -> Result<Committed, ShardError> {
        if !self.has_staged() {
            return Ok(Committed::default());
        }
        let mut sealed = self.seal();
        let (dense, writes) = (std::mem::take(&mut sealed.dense), sealed.writes);
        let written = sealed.write().map_err(|err| self.rolled_back(err))?;
        let journal = written.took;
        let sync = self.durability_handle().sync().map_err(|err| self.rolled_back(err))?;
        written.write_runs().map_err(|err| self.rolled_back(err))?;
        self.landed(1);
        Ok(Committed { dense, writes, journal, sync })
    }

    /// After a failed write or sync: rebuilds the in-memory state from disk,
    /// so it never runs ahead of what is stored, and hands back the error.
    fn rolled_back(&mut self, err: ShardError) -> ShardError {
        // Best effort: if even reading fails, later requests fail too.
        if let Err(reload) = self.load() {
            tracing::error!(error = %reload, "reloading shard state after a failed commit failed");
        }
        err
    }

    /// Takes the open batch out of the shard as one atomic fjall batch — its
    /// log record, board configs and the sequence high-water mark — for any
    /// thread to write with [`SealedBatch::write`]. When the overlay is due
    /// to be written (or a checkpoint is), the batch also carries the frozen
    /// overlay and, for a checkpoint, the changed leaves, to be written once
    /// it is durable ([`WrittenBatch::write_runs`]). Pure memory work: the
    /// shard's thread never waits for storage here. The in-memory state
    /// already includes the batch, and stays readable from memory until
    /// [`Shard::landed`] reports the batch done.
    ///
    /// If writing a sealed batch fails, the in-memory state is ahead of
    /// storage: reopen the shard ([`Shard::reopen`]).
    pub fn seal(&mut self) -> SealedBatch {
        let staged = std::mem::take(&mut self.staged);
        let mut batch = self.db.batch().durability(None);
        for (key, value) in &staged.meta {
            match value {
                Some(v) => batch.insert(&self.meta, key.as_slice(), v.as_slice()),
                None => batch.remove(&self.meta, key.as_slice()),
            }
        }
        if staged.seq_dirty {
            batch.insert(&self.meta, META_MAX_SEQ, self.max_seq.to_be_bytes());
        }
        if staged.changes > 0 {
            batch.insert(&self.changes, self.next_log.to_be_bytes(), staged.log.as_slice());
            self.next_log += 1;
            self.logged += staged.changes;
        }
        if staged.changes > 0 && self.checkpointing.is_none() && self.checkpoint_due(self.logged) {
            self.begin_checkpoint();
        }
        // The checkpoint under way, once its last slice is copied.
        let checkpoint = if self.copy_checkpoint_slice(staged.writes) { self.checkpointing.take() } else { None };
        let runs =
            (checkpoint.is_some() || self.overlay.players() >= self.options.run_every).then(|| self.freeze(checkpoint));
        self.in_flight.push_back(runs.as_ref().map(|runs| runs.overlay.clone()));
        SealedBatch {
            batch: (!batch.is_empty()).then_some(batch),
            dense: staged.dense,
            writes: staged.writes,
            memtables: self.memtables.clone(),
            runs,
        }
    }

    /// Takes the overlay out for a sealed batch to write as runs once it is
    /// durable, with the marker that follows them and, when the copy of a
    /// `checkpoint` is done, the writer of its leaves and the deletion of
    /// the log they replace. Reads keep seeing the frozen overlay until the
    /// batch is reported done.
    fn freeze(&mut self, checkpoint: Option<Checkpointing>) -> Runs {
        let empty = self.empty_overlay();
        let mut overlay = std::mem::replace(&mut self.overlay, empty);
        overlay.freeze();
        let overlay = Arc::new(overlay);
        let mut after = self.db.batch().durability(None);
        let checkpoint = match checkpoint {
            Some(checkpoint) => Some(self.finish_checkpoint(&mut after, checkpoint)),
            None => {
                self.mark_runs(&mut after);
                None
            }
        };
        Runs { overlay, players: self.players.clone(), index: self.index.clone(), checkpoint, after }
    }

    /// An overlay for the changes from now on.
    fn empty_overlay(&self) -> Overlay {
        Overlay::new(self.options.run_every)
    }

    /// Adds to `batch` the marker that runs now cover every log record so far.
    fn mark_runs(&self, batch: &mut fjall::OwnedWriteBatch) {
        batch.insert(&self.meta, META_RUNS_THROUGH, self.next_log.to_be_bytes());
    }

    /// Whether a log of `logged` changes calls for a checkpoint. A checkpoint
    /// rewrites every leaf a change touched, and random changes touch nearly
    /// all leaves long before they number as many as the players, so a
    /// checkpoint costs about the whole tree and the longer the wait, the
    /// less each write pays for it: half the players' worth of changes (at
    /// 1M players, waiting 400k rather than 125k changes took `set` from
    /// ~97k to ~106k ops/s). The wait is between
    /// [`ShardOptions::checkpoint_every`] and [`CHECKPOINT_STRETCH`] times
    /// that, so a restart replays a bounded log. The first after opening
    /// comes sooner by [`ShardOptions::checkpoint_phase`].
    fn checkpoint_due(&self, logged: u64) -> bool {
        let least = self.options.checkpoint_every;
        let wanted = (self.players() / 2).clamp(least, least.saturating_mul(CHECKPOINT_STRETCH));
        let phase = if self.checkpoint_begun { 0.0 } else { self.options.checkpoint_phase.clamp(0.0, 1.0) };
        logged >= wanted - (wanted as f64 * phase) as u64
    }

    /// Count-tree changes logged since the last checkpoint began: a
    /// restart after a crash replays these into the trees, and those of the
    /// checkpoint before while it is still being written.
    pub fn logged_changes(&self) -> u64 {
        self.logged
    }

    /// Reports that the `count` oldest sealed batches not yet reported are
    /// written (or failed, and the shard will be reopened): storage now
    /// answers for their player records.
    pub fn landed(&mut self, count: usize) {
        let count = count.min(self.in_flight.len());
        self.in_flight.drain(..count);
    }

    /// Sealed batches carrying runs (frozen overlays) that have not landed:
    /// each holds its overlay in memory until its runs are written.
    pub fn unwritten_runs(&self) -> usize {
        self.in_flight.iter().filter(|overlay| overlay.is_some()).count()
    }

    /// Whether nothing is staged or sealed-but-unwritten: what reads that
    /// scan storage (lists, checks) and maintenance need.
    pub fn is_settled(&self) -> bool {
        !self.has_staged() && self.in_flight.is_empty()
    }

    /// What makes committed batches durable, detached from the shard so it
    /// can run on another thread. Holding one keeps the storage open: drop it
    /// before [`Shard::reopen`].
    pub fn durability_handle(&self) -> DurabilityHandle {
        DurabilityHandle { db: self.db.clone(), mode: self.persist_mode() }
    }

    /// Prepares for a fast next start: checkpoints the trees (so no log is
    /// replayed) and flushes every memtable (so no journal is replayed).
    ///
    /// The flush is waited for here, not with fjall's
    /// `rotate_memtable_and_wait`, which polls until the flush queue is empty
    /// however long that takes: when a flush failed (disk full, data dir
    /// removed) fjall's worker stopped, nothing ever emptied the queue, and a
    /// SIGTERM hung the server forever (seen at 10M players). A failed worker
    /// poisons the database, which ends the wait with an error; a flush still
    /// running after `wait` is left to the journal, which holds everything
    /// the memtables do: the next start replays it.
    pub fn prepare_shutdown(&mut self, wait: Duration) -> Result<(), ShardError> {
        self.checkpoint()?;
        self.db.persist(PersistMode::SyncAll)?;
        for keyspace in self.memtables.keyspaces.iter() {
            keyspace.rotate_memtable()?;
        }
        let deadline = Instant::now() + wait;
        while self.memtables.keyspaces.iter().any(|keyspace| keyspace.tree.sealed_memtable_count() > 0) {
            self.db.persist(PersistMode::Buffer)?; // fails once a worker has failed
            if Instant::now() >= deadline {
                tracing::warn!(path = %self.path.display(), "memtables not flushed in time; the next start replays the journal");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    /// Bytes in the fullest memtable still taking writes: stays near
    /// [`ShardOptions::memtable_bytes`] as full ones are sealed for
    /// flushing, and within [`MEMTABLE_OVERRUN`] times that while fjall's
    /// worker is behind.
    pub fn largest_memtable_bytes(&self) -> u64 {
        self.memtables.largest()
    }

    /// See [`StorageStats`].
    pub fn storage_stats(&self) -> StorageStats {
        StorageStats {
            memtable_bytes: self.db.write_buffer_size(),
            sealed_memtables: self.memtables.sealed(),
            compacting: self.db.time_compacting(),
        }
    }

    /// Players whose changed records are held in memory until the next run
    /// (see [`ShardOptions::run_every`]).
    pub fn unwritten_players(&self) -> usize {
        self.overlay.players()
    }

    /// Record-cache lookups since the last call (see [`Lookups`]).
    pub fn take_cache_lookups(&mut self) -> Lookups {
        self.cache.get_mut().take_lookups()
    }

    /// Players held in all trees of this shard.
    pub fn players(&self) -> u64 {
        self.trees.values().map(CountTree::total).sum()
    }

    /// Writes every leaf changed since the last checkpoint and deletes the
    /// log records that led to them, in one atomic batch.
    pub fn checkpoint(&mut self) -> Result<(), ShardError> {
        self.checkpoint_with(&[])
    }

    /// [`Shard::checkpoint`], also marking `expiring` trees as being deleted
    /// in the same batch: once the log that could rebuild them is gone, the
    /// mark is what lets a restart finish deleting them.
    fn checkpoint_with(&mut self, expiring: &[TreeId]) -> Result<(), ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        // Every batch is durable (settled): the overlay may be written.
        for tree in expiring {
            self.overlay.forget(&tree.prefix());
        }
        let empty = self.empty_overlay();
        let overlay = std::mem::replace(&mut self.overlay, empty);
        overlay.write_runs(&self.players, &self.index).map_err(|err| self.rolled_back(err))?;
        let mut batch = self.db.batch().durability(Some(self.persist_mode()));
        for tree in expiring {
            batch.insert(&self.meta, expiring_key(*tree), []);
        }
        self.checkpoint_into(&mut batch);
        batch.commit().map_err(|err| self.rolled_back(err.into()))
    }

    /// Takes the changed leaves out of the trees at once and adds them, the
    /// marker of the log they hold, the deletion of that log and the runs'
    /// marker to `batch`, and starts a new log. `batch` may be written only
    /// once runs hold every change of that log: the log is the only other
    /// place those changes are kept. A checkpoint being copied in slices is
    /// dropped: this one includes everything it would have.
    fn checkpoint_into(&mut self, batch: &mut fjall::OwnedWriteBatch) {
        self.abandon_checkpoint();
        for (id, tree) in &mut self.trees {
            let written = SlicePicker::default().pick(tree.take_dirty(), self.leaf_encoding, |leaf, bytes| {
                match bytes {
                    Some(bytes) => batch.insert(&self.leaves, leaf_key(*id, leaf), bytes),
                    None => batch.remove(&self.leaves, leaf_key(*id, leaf)),
                }
                Ok::<(), std::convert::Infallible>(())
            });
            let Ok(()) = written;
        }
        batch.insert(&self.leaves, LEAVES_THROUGH, self.next_log.to_be_bytes());
        self.logged = 0;
        self.close_log(batch, self.next_log);
    }

    /// Drops the checkpoint being copied, if any: the leaves it would have
    /// written count as changed again, and what its writer wrote is never
    /// read.
    fn abandon_checkpoint(&mut self) {
        let handed_out = self.checkpointing.take().map(|c| c.writer.abandon()).unwrap_or_default();
        self.trees.values_mut().for_each(CountTree::abandon_snapshot);
        for (id, leaves) in handed_out {
            if let Some(tree) = self.trees.get_mut(&id) {
                tree.mark_changed(leaves);
            }
        }
    }

    /// Starts a checkpoint of the trees as they are now, to be copied a slice
    /// each sealed batch ([`Shard::copy_checkpoint_slice`]) so no round waits
    /// for the whole copy, and written by a [`LeafWriter`] as it is copied.
    /// Changes from now on are logged for the next one. If the writer's
    /// thread cannot start, the checkpoint waits for the next batch.
    fn begin_checkpoint(&mut self) {
        let through = self.next_log;
        let start = LeafWriter::start(
            self.leaves.clone(),
            LEAVES_THROUGH,
            through,
            self.leaf_encoding,
            self.options.leaf_writer_start,
        );
        let writer = match start {
            Ok(writer) => writer,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not start a checkpoint's writer; trying again");
                return;
            }
        };
        self.trees.values_mut().for_each(CountTree::begin_snapshot);
        let mut trees: Vec<TreeId> = self.trees.keys().copied().collect();
        trees.sort_unstable_by_key(TreeId::prefix);
        self.checkpointing = Some(Checkpointing { through, trees: trees.into(), writer });
        self.checkpoint_begun = true;
        self.logged = 0;
    }

    /// Copies the next slice of the checkpoint's leaves, at least one leaf
    /// per write in the batch being sealed, and hands it to the writer; true
    /// once all are copied (false with no checkpoint under way). A tree has
    /// no more leaves than players, and the next checkpoint is due after
    /// half the players' worth of changes or 100k: at a leaf a write, a
    /// copy is done before the next is due (at 10M players on 2 shards:
    /// ~244k leaves a shard, a checkpoint every 400k changes). While the
    /// writer is [`MAX_QUEUED_SLICES`] behind, nothing more is copied: the
    /// copies would only wait in memory.
    fn copy_checkpoint_slice(&mut self, writes: usize) -> bool {
        let Some(checkpoint) = &mut self.checkpointing else { return false };
        if checkpoint.writer.backlog() > MAX_QUEUED_SLICES {
            return false;
        }
        let mut budget = self.options.checkpoint_slice_leaves.max(writes).max(1);
        while let Some(&id) = checkpoint.trees.front() {
            if let Some(tree) = self.trees.get_mut(&id) {
                budget = tree.continue_snapshot(budget);
                if let Some(slice) = tree.take_slice().filter(|slice| !slice.is_idle()) {
                    checkpoint.writer.send(id, slice);
                }
                if tree.is_copying_snapshot() {
                    break; // the budget is spent
                }
            }
            checkpoint.trees.pop_front();
        }
        checkpoint.trees.is_empty()
    }

    /// Ends `checkpoint`, all of whose leaves are copied: adds to `batch`
    /// the deletion of the log they make redundant and the marker of the
    /// runs (which now cover every log record: this batch freezes the
    /// overlay), and returns the writer to finish once the runs are
    /// written. Trees made since the checkpoint began have nothing in it:
    /// their leaves go to the next.
    fn finish_checkpoint(&mut self, batch: &mut fjall::OwnedWriteBatch, checkpoint: Checkpointing) -> LeafWriter {
        self.close_log(batch, checkpoint.through);
        checkpoint.writer
    }

    /// Adds to `batch` the deletion of the log records before `through`,
    /// which a checkpoint's leaves now hold, and the runs' marker.
    fn close_log(&mut self, batch: &mut fjall::OwnedWriteBatch, through: u64) {
        for number in self.first_log..through {
            batch.remove(&self.changes, number.to_be_bytes());
        }
        self.mark_runs(batch);
        self.first_log = through;
        // A checkpoint comes after a tree's worth of changes, and with them
        // a tree's worth of leaf reallocations: time for a repacking pass.
        self.repacking = self.trees.keys().map(|tree| (*tree, 0)).collect();
    }

    /// Whether a leaf-repacking pass is under way (one starts at every
    /// checkpoint; [`Shard::repack_step`] advances it).
    pub fn is_repacking(&self) -> bool {
        !self.repacking.is_empty()
    }

    /// Visits up to `budget` count-tree leaves and moves those `should_move`
    /// picks (by the address of their entries) to fresh allocations: a slice
    /// of the pass a checkpoint started, small enough to run between rounds.
    /// Changes nothing a reader sees.
    ///
    /// Steady writes reallocate leaves all the time, and the allocator's
    /// slabs fill with stragglers of the sizes leaves grew out of (see
    /// [`CountTree::repack`]); moving the leaves on sparse slabs lets the
    /// allocator pack them into fuller ones and return the rest. It works
    /// with an allocator that can say how full a pointer's slab is and
    /// fills its oldest slabs first, with its per-thread cache bypassed
    /// during the step (otherwise each new copy takes the slot the previous
    /// leaf just left): the server runs it on jemalloc that way.
    pub fn repack_step(&mut self, budget: usize, mut should_move: impl FnMut(*const u8) -> bool) -> Repacked {
        let mut done = Repacked::default();
        while let Some((tree, from)) = self.repacking.last_mut() {
            let Some(count_tree) = self.trees.get_mut(tree) else {
                self.repacking.pop(); // expired since the pass began
                continue;
            };
            let (step, next) = count_tree.repack(*from, budget - done.visited, &mut should_move);
            done.visited += step.visited;
            done.moved += step.moved;
            match next {
                Some(key) => {
                    *from = key;
                    break;
                }
                None => {
                    self.repacking.pop();
                }
            }
        }
        done
    }

    fn persist_mode(&self) -> PersistMode {
        match self.options.durability {
            Durability::Sync => PersistMode::SyncData,
            Durability::Buffered => PersistMode::Buffer,
        }
    }

    /// A player's record in `tree`, seeing the open batch.
    pub fn get(&self, tree: TreeId, player: &str) -> Result<Option<Record>, ShardError> {
        self.record(&PlayerKey::new(tree, player))
    }

    /// [`Shard::get`] by a key already made.
    fn record(&self, key: &PlayerKey) -> Result<Option<Record>, ShardError> {
        if let Some(cached) = self.cache.borrow().get(key.cached) {
            return Ok(cached);
        }
        let record = self.unwritten_or_stored(&key.stored)?;
        self.cache.borrow_mut().put(key.cached, record);
        Ok(record)
    }

    /// The record stored under `key` in the newest overlay that has one:
    /// the current overlay, then those frozen for runs not yet written.
    fn unwritten_record(&self, key: &[u8]) -> Option<Option<Record>> {
        let frozen = self.in_flight.iter().rev().flatten().map(|overlay| &**overlay);
        std::iter::once(&self.overlay).chain(frozen).find_map(|overlay| overlay.record(key))
    }

    /// The record stored under `key` (a player key) in the overlays or
    /// storage, never the cache: what a cache miss reads, and what
    /// [`Shard::check`] verifies.
    fn unwritten_or_stored(&self, key: &[u8]) -> Result<Option<Record>, ShardError> {
        match self.unwritten_record(key) {
            Some(unwritten) => Ok(unwritten),
            None => self.players.get(key)?.map(|v| Record::decode(&v)).transpose(),
        }
    }

    /// Players in `tree`.
    pub fn count(&self, tree: TreeId) -> u64 {
        self.trees.get(&tree).map_or(0, CountTree::total)
    }

    /// For each key, how many players of `tree` sort strictly before it.
    pub fn count_before(&self, tree: TreeId, keys: &[u128]) -> Vec<u64> {
        match self.trees.get(&tree) {
            Some(t) => keys.iter().map(|&k| t.count_before(k)).collect(),
            None => vec![0; keys.len()],
        }
    }

    /// How many players of `tree` sort strictly before `key`: one rank's
    /// count, without the vector [`Shard::count_before`] returns.
    pub fn count_before_key(&self, tree: TreeId, key: u128) -> u64 {
        self.trees.get(&tree).map_or(0, |t| t.count_before(key))
    }

    /// Distinct score keys of `tree` with their player counts (for dense
    /// ranks), read from the count tree, not from the players.
    pub fn score_counts(&self, tree: TreeId) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        if let Some(t) = self.trees.get(&tree) {
            for (key, count) in t.entries() {
                let sk = (key >> 64) as u64;
                match out.last_mut() {
                    Some((last, n)) if *last == sk => *n += count,
                    _ => out.push((sk, count)),
                }
            }
        }
        out
    }

    /// [`Shard::score_counts`] of every tree of a dense board: this shard's
    /// share of the engine-wide [`crate::DenseIndex`]es.
    pub fn dense_score_counts(&self) -> HashMap<TreeId, Vec<(u64, u64)>> {
        let dense = |tree: &TreeId| self.boards.get(&tree.board).is_some_and(|b| b.config.ties == Ties::Dense);
        self.trees.keys().filter(|t| dense(t)).map(|&t| (t, self.score_counts(t))).collect()
    }

    /// Trees this shard holds players for.
    pub fn tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.trees.keys().copied()
    }

    /// Up to `limit` entries of `tree` in list order from `position`, seeing
    /// every staged and sealed write (they are all in overlays), so it needs
    /// no commit first and waits for no run.
    pub fn list(
        &self,
        tree: TreeId,
        ties: Ties,
        order: Order,
        position: &[u8],
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<ListEntry>, ShardError> {
        let positions = match direction {
            Direction::Forward => self.index_positions(tree, position, &POSITIONS_END, direction),
            Direction::Backward => self.index_positions(tree, &[], position, direction),
        };
        let mut out = Vec::with_capacity(limit.min(1024));
        for position in positions.take(limit) {
            let position = position?;
            let (sk, seq, player) =
                key::parse_list_position(ties, &position).ok_or(ShardError::Corrupt("index key"))?;
            let (player, score) = (player.to_string(), key::score_from_key(sk, order));
            out.push(ListEntry { position, player, score, seq });
        }
        Ok(out)
    }

    /// List positions of `tree`'s score index from `from` (inclusive) to
    /// `to` (exclusive), in list order or, `Backward`, in reverse: storage,
    /// with the overlays frozen for runs not yet written on top (oldest
    /// first), and the current overlay over all. Runs hold final values, so
    /// the answer is the same whether a run being written has reached
    /// storage yet or not.
    fn index_positions<'a>(
        &'a self,
        tree: TreeId,
        from: &'a [u8],
        to: &'a [u8],
        direction: Direction,
    ) -> Box<dyn Iterator<Item = Result<Vec<u8>, ShardError>> + 'a> {
        let prefix = tree.prefix();
        let stored = self.index.range([&prefix[..], from].concat()..[&prefix[..], to].concat());
        let position = |item: fjall::Guard| -> Result<Vec<u8>, ShardError> {
            let key = item.key()?;
            key.get(TREE_PREFIX_LEN..).map(<[u8]>::to_vec).ok_or(ShardError::Corrupt("index key"))
        };
        let forward = direction == Direction::Forward;
        let mut merged: overlay::Layered<'a> = if forward {
            Box::new(stored.map(move |item| Ok((position(item)?, true))))
        } else {
            Box::new(stored.rev().map(move |item| Ok((position(item)?, true))))
        };
        let frozen = self.in_flight.iter().flatten().map(|overlay| &**overlay);
        for layer in frozen.chain(std::iter::once(&self.overlay)) {
            merged = Box::new(overlay::layer(merged, layer.index_range(tree, from, to, forward), forward));
        }
        Box::new(merged.filter_map(|entry| match entry {
            Ok((position, present)) => present.then_some(Ok(position)),
            Err(e) => Some(Err(e)),
        }))
    }

    /// Checks that each tree's counts equal its score index and players:
    /// the invariant a crash must never break.
    pub fn check(&self) -> Result<(), ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let inconsistent = |id: &TreeId, what: String| ShardError::Inconsistent(format!("{id:?}: {what}"));
        for (id, tree) in &self.trees {
            tree.check().map_err(|e| inconsistent(id, e))?;
            let Some(board) = self.boards.get(&id.board) else {
                return Err(inconsistent(id, "tree of a board this shard has no config for".into()));
            };
            let (order, ties) = (board.config.order, board.config.ties);
            // Every index entry matches its player's record, and the tree
            // holds exactly the keys the index implies.
            let mut keys = Vec::with_capacity(tree.total() as usize);
            for position in self.index_positions(*id, &[], &POSITIONS_END, Direction::Forward) {
                let position = position?;
                let (sk, seq, player) =
                    key::parse_list_position(ties, &position).ok_or(ShardError::Corrupt("index key"))?;
                let record = self
                    .unwritten_or_stored(&player_key(*id, player))?
                    .ok_or_else(|| inconsistent(id, format!("index lists {player:?} but no record exists")))?;
                if key::score_key(record.score, order) != sk || (ties == Ties::Ordinal && record.seq != seq) {
                    return Err(inconsistent(id, format!("index and record of {player:?} disagree")));
                }
                keys.push(record.tree_key(player, ties, order));
            }
            // Stored records the overlay does not replace, and the overlay's own.
            let mut players = 0;
            for item in self.players.prefix(id.prefix()) {
                players += usize::from(self.overlay.record(&item.key()?).is_none());
            }
            players += self.overlay.records_under(&id.prefix()).filter(|(_, record)| record.is_some()).count();
            if players != keys.len() {
                return Err(inconsistent(id, format!("{players} player records but {} index entries", keys.len())));
            }
            keys.sort_unstable();
            let mut expected: Vec<(u128, u64)> = Vec::new();
            for key in keys {
                match expected.last_mut() {
                    Some((last, n)) if *last == key => *n += 1,
                    _ => expected.push((key, 1)),
                }
            }
            if tree.entries() != expected {
                return Err(inconsistent(
                    id,
                    format!("count tree ({} players) disagrees with the score index", tree.total()),
                ));
            }
        }
        Ok(())
    }
}

/// The score a write of `score` in `mode` leaves a player with who had
/// `old`; an `incr` past the range fails.
fn combined(mode: Mode, order: Order, old: Option<Record>, score: i64) -> Result<i64, ShardError> {
    match (mode, old) {
        (Mode::Set, _) | (Mode::Best | Mode::Incr, None) => Ok(score),
        (Mode::Best, Some(old)) => Ok(better(order, old.score, score)),
        (Mode::Incr, Some(old)) => old.score.checked_add(score).ok_or(ShardError::Overflow),
    }
}

fn better(order: Order, a: i64, b: i64) -> i64 {
    match order {
        Order::Desc => a.max(b),
        Order::Asc => a.min(b),
    }
}

/// A command a round is about to apply, for [`Shard::prefetch`].
#[derive(Debug, Clone, Copy)]
pub enum Upcoming<'a> {
    /// A write about to be staged with [`Shard::write`].
    Write(UpcomingWrite<'a>),
    /// A player's rank: [`Shard::get`], then [`Shard::count_before_key`] at
    /// their [`Record::rank_key`].
    Rank {
        /// The tree ranked in.
        tree: TreeId,
        /// The player's name.
        player: &'a str,
        /// The tree's tie rule.
        ties: Ties,
        /// The tree's order.
        order: Order,
    },
    /// [`Shard::count_before`] these keys of `tree`.
    CountBefore {
        /// The tree counted in.
        tree: TreeId,
        /// The keys counted before.
        keys: &'a [u128],
    },
}

/// The keys of `tree` a look ahead walks to, in `paths` (one entry a tree:
/// a round's commands nearly all go to one or a few trees).
fn tree_paths(paths: &mut Vec<(TreeId, Vec<u128>)>, tree: TreeId) -> &mut Vec<u128> {
    let at = paths.iter().position(|(t, _)| *t == tree).unwrap_or_else(|| {
        paths.push((tree, Vec::new()));
        paths.len() - 1
    });
    &mut paths[at].1
}

/// A write about to be staged, for [`Shard::prefetch`]: the arguments
/// [`Shard::write`] will get.
#[derive(Debug, Clone, Copy)]
pub struct UpcomingWrite<'a> {
    /// The board written to.
    pub board: &'a Board,
    /// The player's name.
    pub player: &'a str,
    /// The score sent.
    pub score: i64,
    /// How it combines with the stored score.
    pub mode: Mode,
    /// The write's global arrival sequence.
    pub seq: u64,
}

/// A player's storage key and its record-cache hash, made once per write
/// and used by each step of it (the read of the old record, the cache
/// update, the overlay).
struct PlayerKey {
    stored: Vec<u8>,
    cached: u128,
}

impl PlayerKey {
    fn new(tree: TreeId, player: &str) -> Self {
        let stored = player_key(tree, player);
        Self { cached: RecordCache::key(&stored), stored }
    }
}

/// Built at its final size: every write and every rank makes one, and
/// growing it from the prefix was a reallocation each time (~2% of the
/// server's samples under `rank`).
fn player_key(tree: TreeId, player: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(TREE_PREFIX_LEN + player.len());
    push_player_key(&mut key, tree, player);
    key
}

/// Appends a player's storage key to `out`: how a look ahead builds every
/// key of a group in one buffer.
fn push_player_key(out: &mut Vec<u8>, tree: TreeId, player: &str) {
    out.extend_from_slice(&tree.prefix());
    out.extend_from_slice(player.as_bytes());
}

/// A list position past every real one: none starts with 17 bytes of 0xFF
/// (names are UTF-8, and sequences never reach `u64::MAX`).
const POSITIONS_END: [u8; 17] = [0xFF; 17];

/// The count tree of `tree`, made empty if it has none yet.
fn count_tree(trees: &mut HashMap<TreeId, CountTree, FastHasher>, tree: TreeId, branching: u32) -> &mut CountTree {
    trees.entry(tree).or_insert_with(|| CountTree::new(branching).expect("branching validated at open"))
}

/// Where [`apply_change`] puts a change's count-tree changes.
enum TreeCounts<'a> {
    /// Into the change's tree at once (live writes).
    Apply(&'a mut CountTree),
    /// Gathered, to go into the trees in key order (replay).
    Gather(&'a mut GatheredCounts),
}

/// Count-tree changes gathered during replay and applied in key order.
/// At 10M players a restart replays up to ~550k logged changes a shard, two
/// tree changes each, and applied in log order each one walked to a random
/// leaf: `add_at` was a quarter of a restart's profile, mostly cache
/// misses. Sorted, consecutive changes land in the same or the next leaf.
/// The counts are sums, so the order does not change them; equal keys are
/// summed first, so a removal never reaches a key before the addition that
/// the log had before it.
#[derive(Debug, Default)]
struct GatheredCounts {
    changes: Vec<(TreeId, u128, i64)>,
}

impl GatheredCounts {
    /// Changes held before they are applied: bounds the buffer (48 bytes a
    /// change, so ~50 MB) on a long log.
    const MAX_HELD: usize = 1 << 20;

    fn push(&mut self, tree: TreeId, key: u128, delta: i64) {
        self.changes.push((tree, key, delta));
    }

    fn is_full(&self) -> bool {
        self.changes.len() >= Self::MAX_HELD
    }

    /// Applies every gathered change to `trees`, in tree and key order. A
    /// tree the changes touch exists afterwards even where they cancel out,
    /// as it does when they are applied in log order.
    fn apply(&mut self, trees: &mut HashMap<TreeId, CountTree, FastHasher>, branching: u32) {
        self.changes.sort_unstable_by_key(|&(tree, key, _)| (tree, key));
        let mut changes = self.changes.drain(..).peekable();
        while let Some((tree, key, mut delta)) = changes.next() {
            while let Some((_, _, more)) = changes.next_if(|&(t, k, _)| (t, k) == (tree, key)) {
                delta += more;
            }
            let counts = count_tree(trees, tree, branching);
            if delta != 0 {
                counts.add(key, delta);
            }
        }
    }
}

/// Applies a score change to the in-memory state: the count tree always,
/// and the overlay's player record (under the player's storage key, given
/// with it) and index entries when given (a replayed change that runs
/// already hold leaves it out). Returns the score keys the tree lost and
/// gained, for dense ranks. Shared by live writes and replay, so a restart
/// rebuilds exactly what the writes built.
fn apply_change(
    mut counts: TreeCounts<'_>,
    mut overlay: Option<(&mut Overlay, Vec<u8>)>,
    config: &BoardConfig,
    change: &log::Change<'_>,
) -> DenseChange {
    let (order, ties) = (config.order, config.ties);
    let log::Change { tree, player, old, new } = *change;
    let mut dense = DenseChange { tree, removed: None, added: None };
    // Each record's score key and tree key, made once.
    let steps = [(old, -1i64), (new, 1)].map(|(record, delta)| {
        record.map(|record| (record, key::score_key(record.score, order), record.tree_key(player, ties, order), delta))
    });
    if let (TreeCounts::Apply(count_tree), [Some(_), Some((_, _, new_key, _))]) = (&counts, steps) {
        count_tree.prefetch(new_key);
    }
    for (record, sk, tree_key, delta) in steps.into_iter().flatten() {
        match &mut counts {
            TreeCounts::Apply(count_tree) => count_tree.add(tree_key, delta),
            TreeCounts::Gather(gathered) => gathered.push(tree, tree_key, delta),
        }
        if let Some((overlay, _)) = overlay.as_mut() {
            overlay.set_index(tree, sk, key::list_position_tail(ties, record.seq, player), delta > 0);
        }
        if delta > 0 {
            dense.added = Some(sk);
        } else {
            dense.removed = Some(sk);
        }
    }
    if let Some((overlay, key)) = overlay {
        overlay.set_record(key, new);
    }
    dense
}

fn expiring_key(tree: TreeId) -> Vec<u8> {
    let mut key = META_EXPIRING.to_vec();
    key.extend_from_slice(&tree.prefix());
    key
}

fn board_meta_key(id: u64) -> Vec<u8> {
    let mut key = META_BOARD.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// Checks the branching factor against the one the data dir was made with,
/// and returns how it stores leaves; a new data dir records both (with the
/// current leaf encoding).
fn check_format(db: &Database, meta: &Keyspace, branching: u32) -> Result<LeafEncoding, ShardError> {
    match meta.get(META_BRANCHING)? {
        Some(stored) => {
            let stored = u32::from_be_bytes(stored.as_ref().try_into().map_err(|_| ShardError::Corrupt("branching"))?);
            if stored != branching {
                return Err(ShardError::BranchingMismatch { stored, wanted: branching });
            }
            match meta.get(META_LEAF_ENCODING)? {
                None => Ok(LeafEncoding::Fixed),
                Some(code) => match *code {
                    [code] => LeafEncoding::from_code(code).ok_or(ShardError::Corrupt("leaf encoding")),
                    _ => Err(ShardError::Corrupt("leaf encoding")),
                },
            }
        }
        None => {
            let encoding = LeafEncoding::Delta;
            let mut batch = db.batch().durability(Some(PersistMode::SyncAll));
            batch.insert(meta, META_BRANCHING, branching.to_be_bytes());
            batch.insert(meta, META_LEAF_ENCODING, [encoding.code()]);
            batch.insert(meta, META_LOG_FORMAT, [LogFormat::Changes.code()]);
            batch.commit()?;
            Ok(encoding)
        }
    }
}

/// How the data dir's change log is laid out; data dirs made before there
/// was a choice record none.
fn log_format(meta: &Keyspace) -> Result<LogFormat, ShardError> {
    match meta.get(META_LOG_FORMAT)? {
        None => Ok(LogFormat::TreeKeys),
        Some(code) => match *code {
            [code] => LogFormat::from_code(code).ok_or(ShardError::Corrupt("log format")),
            _ => Err(ShardError::Corrupt("log format")),
        },
    }
}

/// Every stored leaf, in key order: the leaves' keyspace but its marker
/// ([`LEAVES_THROUGH`], which sorts first).
fn stored_leaves(leaves: &Keyspace) -> impl Iterator<Item = fjall::Guard> + 'static {
    leaves.range::<&[u8], _>((Bound::Excluded(LEAVES_THROUGH), Bound::Unbounded))
}

fn read_u64(keyspace: &Keyspace, key: &[u8]) -> Result<u64, ShardError> {
    match keyspace.get(key)? {
        Some(v) => Ok(u64::from_be_bytes(v.as_ref().try_into().map_err(|_| ShardError::Corrupt("stored counter"))?)),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::Window;

    /// Board 1 (descending, ordinal ties, all-time only) and its one tree.
    fn all_time_board() -> (Board, TreeId) {
        let config = BoardConfig { order: Order::Desc, ties: Ties::Ordinal, windows: vec![Window::All], keep: 1 };
        let board = Board { id: 1, name: "b".into(), config };
        (board, TreeId { board: 1, window: Window::All.code(), period: 0 })
    }

    /// While fjall's worker flushes nothing (here: there is none; in a
    /// server, it is in a long compaction), a keyspace gets at most
    /// [`MAX_SEALED_MEMTABLES`] sealed memtables and then keeps writing into
    /// its active one, up to [`MEMTABLE_OVERRUN`] times the limit, instead
    /// of reaching fjall's four and halting every write batch; past the
    /// overrun it is sealed anyway, so memory stays bounded.
    #[test]
    fn a_busy_worker_grows_the_memtable_instead_of_halting_writes() {
        const LIMIT: u64 = 64 << 10;
        let dir = tempfile::tempdir().unwrap();
        let db = Database::builder(dir.path()).worker_threads_unchecked(0).open().unwrap();
        let log = db.keyspace("log", || KeyspaceCreateOptions::default().max_memtable_size(u64::MAX)).unwrap();
        let memtables = Memtables { keyspaces: [log.clone()].into(), limit: LIMIT };
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut most_sealed, mut largest, mut next_key) = (0, 0, 0u64);
            // Writes as the committer does: a batch, then sealing what is due.
            let mut write_batch = || {
                let mut batch = db.batch();
                for key in next_key..next_key + 16 {
                    batch.insert(&log, key.to_be_bytes(), [7u8; 40]);
                }
                next_key += 16;
                batch.commit().unwrap(); // fjall would halt here at 4 sealed memtables
                memtables.rotate_full().unwrap();
                largest = largest.max(log.tree.active_memtable().size());
            };
            while log.tree.active_memtable().size() < LIMIT * MEMTABLE_OVERRUN - 1024 {
                write_batch();
                most_sealed = most_sealed.max(log.tree.sealed_memtable_count());
            }
            // Past the overrun, the memtable is sealed.
            let before_overrun = log.tree.sealed_memtable_count();
            while log.tree.sealed_memtable_count() == before_overrun {
                write_batch();
            }
            let _ = done.send((most_sealed, largest));
        });
        let (most_sealed, largest) = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("writes halted: fjall's limit of sealed memtables was reached");
        assert_eq!(most_sealed, MAX_SEALED_MEMTABLES, "memtables were sealed past the limit, or never");
        assert!(largest > 2 * LIMIT, "the active memtable did not grow past a full one: {largest} bytes");
        assert!(
            largest <= LIMIT * MEMTABLE_OVERRUN + 16 * 1024,
            "the active memtable grew past the overrun to {largest} bytes"
        );
    }

    /// Data dirs made before the delta encoding record none: they keep
    /// writing and reading fixed-size leaves, through checkpoints and
    /// restarts, while new data dirs use the delta encoding.
    #[test]
    fn data_dirs_without_a_recorded_encoding_keep_fixed_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        {
            let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
            assert_eq!(shard.leaf_encoding, LeafEncoding::Delta);
            shard.meta.remove(META_LEAF_ENCODING).unwrap(); // as an older rankd left it
            shard.db.persist(PersistMode::SyncAll).unwrap();
        }
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(shard.leaf_encoding, LeafEncoding::Fixed);
        for i in 0..500i64 {
            shard.write(&board, &format!("p{i}"), i * 37 % 101, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        shard.checkpoint().unwrap();
        let stored: Vec<usize> = stored_leaves(&shard.leaves).map(|item| item.into_inner().unwrap().1.len()).collect();
        assert!(!stored.is_empty() && stored.iter().all(|len| len % 24 == 0), "fixed leaves: {stored:?}");
        let keys: Vec<u128> = (0..101).map(|s| key::tree_key(key::score_key(s, Order::Desc), 0)).collect();
        let before = shard.count_before(tree, &keys);
        drop(shard);
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(shard.leaf_encoding, LeafEncoding::Fixed);
        assert_eq!(shard.count(tree), 500);
        assert_eq!(shard.count_before(tree, &keys), before);
        shard.check().unwrap();
    }

    /// Only sealed batches that carry runs count as unwritten runs, until
    /// they land.
    #[test]
    fn unwritten_runs_count_frozen_overlays_until_they_land() {
        let dir = tempfile::tempdir().unwrap();
        let (board, _) = all_time_board();
        let options = ShardOptions { run_every: 10, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options).unwrap();
        for batch in 0..4u64 {
            // Batches 0 and 2 change 10 players (a run is due), 1 and 3 one.
            let players = if batch % 2 == 0 { 10 } else { 1 };
            for i in 0..players {
                shard.write(&board, &format!("p{batch}-{i}"), i as i64, Mode::Set, batch * 100 + i + 1).unwrap();
            }
            assert_eq!(shard.seal().runs.is_some(), batch % 2 == 0, "batch {batch}");
        }
        assert_eq!(shard.unwritten_runs(), 2);
        shard.landed(1);
        assert_eq!(shard.unwritten_runs(), 1);
        shard.landed(3);
        assert_eq!(shard.unwritten_runs(), 0);
    }

    /// Shards given phases take their checkpoints in turn: the first after
    /// opening comes sooner by the phase's share of the wait, the ones after
    /// it at the usual wait.
    #[test]
    fn the_first_checkpoint_comes_sooner_by_the_phase() {
        let (board, _) = all_time_board();
        let open = |phase: f64| {
            let dir = tempfile::tempdir().unwrap();
            let options = ShardOptions { checkpoint_every: 100, checkpoint_phase: phase, ..ShardOptions::default() };
            let mut shard = Shard::open(dir.path(), options).unwrap();
            // 150 players: half of them is under the least wait, 100 changes.
            for i in 0..150i64 {
                shard.write(&board, &format!("p{i}"), i, Mode::Set, i as u64 + 1).unwrap();
            }
            (dir, shard)
        };
        let (_dir, first) = open(0.0);
        assert!(!first.checkpoint_due(99) && first.checkpoint_due(100));
        let (_dir, mut second) = open(0.5);
        assert!(!second.checkpoint_due(49) && second.checkpoint_due(50), "half the wait sooner");
        second.begin_checkpoint();
        assert!(!second.checkpoint_due(99) && second.checkpoint_due(100), "then the usual wait");
    }

    proptest::proptest! {
        /// Replay's gathered changes, applied in key order, make the trees
        /// that applying them in log order makes: equal keys are summed first,
        /// so a removal the log has after an addition of the same key never
        /// meets an absent key.
        #[test]
        fn gathered_counts_make_the_trees_the_log_order_makes(
            ops in proptest::collection::vec((0u64..2, 0u128..40, proptest::bool::ANY), 1..400),
        ) {
            let mut in_order: HashMap<TreeId, CountTree, FastHasher> = HashMap::default();
            let mut sorted: HashMap<TreeId, CountTree, FastHasher> = HashMap::default();
            let mut gathered = GatheredCounts::default();
            let mut held: HashMap<(TreeId, u128), u64> = HashMap::new();
            for (board, key, add) in ops {
                let tree = TreeId { board, window: 0, period: 0 };
                let count = held.entry((tree, key)).or_default();
                // The log only removes what it added before.
                let delta = if add || *count == 0 { 1 } else { -1 };
                *count = count.saturating_add_signed(delta);
                count_tree(&mut in_order, tree, 4).add(key, delta);
                gathered.push(tree, key, delta);
            }
            gathered.apply(&mut sorted, 4);
            for (tree, expected) in &in_order {
                proptest::prop_assert_eq!(sorted.get(tree).map(CountTree::entries), Some(expected.entries()));
            }
            proptest::prop_assert_eq!(sorted.len(), in_order.len());
        }
    }

    /// A crash after a checkpoint's leaves are written but before the log
    /// deletion that follows them (the runs thread writes them in that
    /// order) leaves log records the leaves already hold: the restart must
    /// not count them twice, and the next checkpoint deletes them.
    #[test]
    fn leaves_written_without_their_log_deletion_are_not_replayed_into() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        let keys: Vec<u128> = (0..200).map(|s| key::tree_key(key::score_key(s, Order::Desc), 0)).collect();
        // Checkpoints are due after a few logged changes.
        let options = ShardOptions { checkpoint_every: 1, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        for i in 0..500i64 {
            shard.write(&board, &format!("p{i}"), i * 37 % 101, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        for i in 0..300i64 {
            shard.write(&board, &format!("p{}", i * 7 % 600), 100 + i % 97, Mode::Set, 1000 + i as u64).unwrap();
        }
        let sealed = shard.seal();
        let Some(runs) = sealed.write().unwrap().runs else { panic!("the batch should carry a checkpoint") };
        shard.durability_handle().sync().unwrap();
        runs.overlay.write_runs(&runs.players, &runs.index).unwrap();
        runs.checkpoint.expect("a checkpoint").finish().unwrap();
        // The crash: `runs.after` (log deletion, runs marker) is never written.
        drop(runs.after);
        let (count, before) = (shard.count(tree), shard.count_before(tree, &keys));
        let record = shard.get(tree, "p7").unwrap();
        assert!(count > 500, "the second batch adds players");
        drop((shard, runs.overlay, runs.players, runs.index));

        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        assert!(shard.changes.iter().next().is_some(), "the test must leave log records behind");
        assert_eq!(shard.count(tree), count);
        assert_eq!(shard.count_before(tree, &keys), before);
        assert_eq!(shard.get(tree, "p7").unwrap(), record);
        shard.check().unwrap();

        shard.write(&board, "p1", 5, Mode::Set, 5000).unwrap();
        shard.commit().unwrap();
        shard.checkpoint().unwrap();
        assert!(shard.changes.iter().next().is_none(), "a checkpoint deletes the records left behind");
        let (count, before) = (shard.count(tree), shard.count_before(tree, &keys));
        drop(shard);
        let shard = Shard::open(dir.path(), options).unwrap();
        assert_eq!(shard.count(tree), count);
        assert_eq!(shard.count_before(tree, &keys), before);
        shard.check().unwrap();
    }
}
