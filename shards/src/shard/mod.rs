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
//!   as one sorted run per keyspace (`crate::overlay`), after the log
//!   records it covers are durable, and a marker records how far the runs
//!   reach;
//! - count trees change in memory; once the log is long enough (see
//!   `Shard::checkpoint_due`) a snapshot of the changed leaves is taken,
//!   copied a slice per sealed batch with copy-on-write for leaves about to
//!   change (`CountTree::begin_snapshot`), each slice written straight
//!   into tables as it is copied (`crate::checkpoint`), with a marker of
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
//!
//! The files of this module, one concept each (`impl Shard` is spread over
//! them):
//!
//! - `options`: [`ShardOptions`] and its defaults;
//! - `holdings`: the boards' configs and count trees held in memory, a
//!   board's config and all-time tree in one entry;
//! - `id_table`: the pages of consecutive board ids those entries live in;
//! - `storage`: the fjall database, its keyspaces and their tuning, the
//!   memtables the shard seals itself, the metadata keys;
//! - `open`: opening, loading the leaves, replaying the log, moving an older
//!   log format to the current one, reopening;
//! - `apply`: a change applied to the trees and the overlay, shared by
//!   staging and replay;
//! - `staging`: writes and removals into the open batch;
//! - `prefetch`: the look ahead before a round's commands;
//! - `seal`: sealing, writing and committing batches;
//! - `in_flight`: the batches sealed and not yet done, and the overlays
//!   they froze;
//! - `checkpointing`: when and how the trees' leaves are checkpointed (the
//!   leaves' writer thread is `crate::checkpoint`);
//! - `idle`: an idle shard checkpointing what its writes left in memory;
//! - `repack`: moving leaves off sparse allocator slabs after a checkpoint;
//! - `dedup`: the records of idempotent writes, staged with the writes
//!   they guard and expired in bounded steps;
//! - `expiry`: deleting expired periods and dropped boards;
//! - `image`: point-in-time images of the storage, for online backups;
//! - `reads`: records, counts and lists;
//! - `short_names`: a small board's records read from its count tree;
//! - `short_index`: a small tree's short names kept out of the score index;
//! - `ties`: the tie groups, followed, built and counted;
//! - `check`: the consistency check.

mod apply;
mod check;
mod checkpointing;
mod dedup;
mod expiry;
mod holdings;
mod id_table;
mod idle;
mod image;
mod in_flight;
mod open;
mod options;
mod prefetch;
mod reads;
mod repack;
mod seal;
mod short_index;
mod short_names;
mod staging;
mod storage;
mod ties;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

pub use self::apply::DenseChange;
use self::checkpointing::Checkpoints;
use self::holdings::Holdings;
pub use self::holdings::TreeForms;
pub use self::idle::IdleStep;
pub use self::image::{ImageWriter, ShardImage, IMAGE_KEYSPACES};
pub use self::options::{Durability, ShardOptions, CHECKPOINT_EVERY, CHECKPOINT_SLICE_LEAVES, RUN_EVERY};
pub use self::prefetch::{Upcoming, UpcomingWrite};
pub use self::reads::{Direction, ListEntry};
pub use self::seal::{Committed, DurabilityHandle, SealedBatch, WrittenBatch};
pub use self::staging::incrs_stay_in_range;
use self::staging::Staged;
use self::storage::Storage;
pub use self::storage::{StorageStats, MEMTABLE_OVERRUN};
use crate::board::BoardConfig;
use crate::cache::RecordCache;
pub use crate::cache::{cached_players_for, Lookups};
use crate::dedup::DedupTable;
use crate::key::TreeId;
use crate::overlay::Overlay;
pub use crate::record::Record;
use crate::ties::TieGroups;
use crate::tree::LeafEncoding;

/// One shard: see the module docs.
pub struct Shard {
    /// The fjall database and its keyspaces.
    storage: Storage,
    /// How it was opened: kept to reopen it the same way.
    options: ShardOptions,
    /// Where the shard lives, to reopen it after a storage failure.
    path: PathBuf,
    /// The configs of the boards this shard holds, by id (their order and
    /// tie rule key every change, live or replayed), and each tree's
    /// counts, in memory: what ranks are answered from. Names are the
    /// router's business: a shard reads them only when it opens
    /// ([`Shard::open_with_boards`]).
    held: Holdings,
    /// Order statistics inside the trees' crowded keys (large ties).
    ties: TieGroups,
    /// Players held in all trees: kept as they change, not summed over the
    /// trees (a shard may hold a million) each time it is asked.
    players: u64,
    /// Trees burst past one leaf, counted when a checkpoint walks them all
    /// (a gauge's worth of accuracy without a walk per write).
    burst_trees: usize,
    /// Highest reach sequence stored, so a restarted server's sequences
    /// keep rising.
    max_seq: u64,
    /// Highest board id stored, so a restarted server never reuses one.
    max_board_id: u64,
    /// Where the change log starts and ends.
    log: LogPositions,
    /// What the open batch will write when sealed.
    staged: Staged,
    /// Player records and index entries not yet written as runs.
    overlay: Overlay,
    /// Sealed batches not yet reported done, with the overlays they froze
    /// for their runs: until those are written, a read that misses the
    /// current overlay must look there before storage.
    in_flight: in_flight::InFlight,
    /// Exact cache of player records. Behind its own lock because reads
    /// take `&self` and may run on several threads at once (the server's
    /// ranks in place); every write to the cache but a miss's fill happens
    /// under `&mut self`, so no reader sees a record change under it.
    cache: Mutex<RecordCache>,
    /// The time writes are applied at (Unix seconds, UTC): decides which
    /// period of each window a write lands in.
    now: i64,
    /// Expired periods and dropped boards' trees whose data is still being
    /// deleted.
    /// (In id order; a set, as reads ask whether their tree is in it.)
    expiring: BTreeSet<TreeId>,
    /// Where the deletion of one of them goes on.
    expiry_cursor: Option<self::expiry::ExpiryCursor>,
    /// Whether a name with a NUL byte may be stored here, which stops
    /// records being read from trees (see `short_names`).
    nul_names: bool,
    /// What small trees' short names are left out of (see `short_index`):
    /// the score index and the records, in every data dir made since.
    short_names_left_out: short_index::LeftOut,
    /// How this data dir stores tree leaves (fixed when it was made).
    leaf_encoding: LeafEncoding,
    /// The trees a leaf-repacking pass has yet to visit, each with where in
    /// it to go on (see [`Shard::repack_step`]); the current one last.
    repacking: Vec<(TreeId, u128)>,
    /// The checkpoint being copied, if any, and whether one was begun.
    checkpoints: Checkpoints,
    /// The `wid`s of idempotent writes applied within the dedup horizon.
    dedup: DedupTable,
    /// Cloned into each [`ShardImage`]: how many are alive.
    images: Arc<()>,
}

/// The change log's extent, kept in memory so sealing a batch and
/// checkpointing never read it back: where the next record goes, the oldest
/// one still needed, and how much a restart would replay.
#[derive(Debug, Default)]
struct LogPositions {
    /// Key of the next change-log record.
    next: u64,
    /// Key of the oldest change-log record not yet checkpointed.
    first: u64,
    /// Changes logged since the last checkpoint.
    logged: u64,
}

impl Shard {
    /// Sets the time (Unix seconds, UTC) the next writes are applied at. The
    /// caller owns the clock, so tests can cross period boundaries at will.
    pub fn set_time(&mut self, unix_seconds: i64) {
        self.now = unix_seconds;
    }

    /// The count-tree branching factor.
    pub fn branching(&self) -> u32 {
        self.options.branching
    }

    /// The configs of the boards this shard holds, by id.
    pub fn board_configs(&self) -> impl ExactSizeIterator<Item = (u64, &BoardConfig)> {
        self.held.configs().map(|(id, config)| (id, &**config))
    }

    /// Highest reach sequence this shard has stored.
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Highest board id this shard has ever stored.
    pub fn max_board_id(&self) -> u64 {
        self.max_board_id
    }

    /// The trees this shard holds (a board's window period each) by form.
    pub fn tree_forms(&self) -> TreeForms {
        let (trees, frozen) = (self.held.tree_count(), self.held.frozen_count());
        let burst = self.burst_trees.min(trees - frozen);
        TreeForms { frozen, compact: trees - frozen - burst, burst }
    }

    /// Players held in all trees of this shard.
    pub fn players(&self) -> u64 {
        self.players
    }

    /// Removes `tree` from the readable trees (dropped or expired).
    fn forget_tree(&mut self, tree: &TreeId) {
        if let Some(players) = self.held.remove_tree(tree) {
            self.players -= players;
        }
        self.ties.forget(*tree);
    }

    /// Count-tree changes logged since the last checkpoint began: a
    /// restart after a crash replays these into the trees, and those of the
    /// checkpoint before while it is still being written.
    pub fn logged_changes(&self) -> u64 {
        self.log.logged
    }

    /// Players whose changed records are held in memory until the next run
    /// (see [`ShardOptions::run_every`]).
    pub fn unwritten_players(&self) -> usize {
        self.overlay.players()
    }

    /// Record-cache lookups since the last call (see [`Lookups`]).
    pub fn take_cache_lookups(&self) -> Lookups {
        self.cache.lock().take_lookups()
    }
}

/// Board 1 (descending, ordinal ties, all-time only) and its one tree: what
/// the tests of this module write to.
#[cfg(test)]
fn all_time_board() -> (crate::board::Board, TreeId) {
    all_time_board_with(crate::board::Ties::Ordinal)
}

/// [`all_time_board`] with another tie rule.
#[cfg(test)]
fn all_time_board_with(ties: crate::board::Ties) -> (crate::board::Board, TreeId) {
    use crate::board::{Board, BoardConfig, Order, Window};
    let config = BoardConfig { order: Order::Desc, ties, windows: vec![Window::All], keep: 1, fields: Vec::new() };
    let board = Board { id: 1, name: "b".into(), config: config.into() };
    (board, TreeId::all_time(1))
}

/// The server reads a shard from several threads at once (see `Shard`'s
/// `cache`): a field that is not `Sync` must not slip in unnoticed.
const _: () = {
    const fn sync<T: Sync + Send>() {}
    sync::<Shard>()
};
