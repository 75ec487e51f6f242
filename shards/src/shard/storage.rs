//! A shard's fjall database: its keyspaces and how each is tuned, the
//! memtables the shard seals itself, the metadata keys, and what operators
//! see of it.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::config::{FilterPolicy, PinningPolicy};
use fjall::{AbstractTree as _, CompressionType, Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use super::options::{Durability, ShardOptions};
use super::Shard;
use crate::error::ShardError;
use crate::key::TreeId;

/// The fjall database and its keyspaces, opened together: everything the
/// shard stores goes through these handles.
pub(super) struct Storage {
    /// The database: write batches, persistence, and the journal.
    pub(super) db: Database,
    /// Player records, by tree prefix and name.
    pub(super) players: Keyspace,
    /// The score index that lists read.
    pub(super) index: Keyspace,
    /// Count-tree leaves, as of the last checkpoint, and their marker.
    pub(super) leaves: Keyspace,
    /// Board configs, counters, markers and the data dir's format.
    pub(super) meta: Keyspace,
    /// The tree change log, one record per committed batch.
    pub(super) changes: Keyspace,
    /// Rotates full memtables after each sealed batch is written.
    pub(super) memtables: Memtables,
}

impl Storage {
    /// The keyspace an image calls `name` (see `image::IMAGE_KEYSPACES`).
    pub(super) fn keyspace(&self, name: &str) -> Option<&Keyspace> {
        match name {
            "meta" => Some(&self.meta),
            "changes" => Some(&self.changes),
            "tree" => Some(&self.leaves),
            "players" => Some(&self.players),
            "index" => Some(&self.index),
            _ => None,
        }
    }

    /// Opens (or creates) the database at `path`, each keyspace tuned for
    /// how the shard writes and reads it.
    pub(super) fn open(path: &Path, options: &ShardOptions) -> Result<Self, ShardError> {
        wait_until_journal_closed(path, JOURNAL_CLOSE_WAIT)?;
        let db = Database::builder(path)
            .cache_size(options.cache_bytes)
            .worker_threads(options.worker_threads.max(1))
            .max_journaling_size(MAX_JOURNAL_BYTES)
            // fjall LZ4s every journal value of 4 KiB or more, and a batch's
            // log record is one, on the path to every ack. Each entry records
            // its own compression, so older journals still replay.
            .journal_compression(CompressionType::None)
            .open()?;
        // fjall never rotates a memtable by itself (see [`Memtables`]).
        let created = || KeyspaceCreateOptions::default().max_memtable_size(u64::MAX);
        let keyspace = |name: &str| db.keyspace(name, created);
        // Every write and rank that misses the record cache does a point read
        // here. fjall pins index and filter blocks of the first levels only;
        // deeper, a read loads a table's whole index block unless the block
        // cache holds it. Pinned they cost ~2 bytes a player.
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
        sync_keyspace_names(path)?;
        let memtables = Memtables {
            keyspaces: [&players, &index, &leaves, &meta, &changes].map(Keyspace::clone).into(),
            limit: options.memtable_bytes,
        };
        Ok(Self { db, players, index, leaves, meta, changes, memtables })
    }
}

/// Makes the names of the database's keyspace directories durable.
///
/// fjall 3.1 creates each keyspace's directory under `keyspaces/` and syncs
/// what it writes inside it, but never `keyspaces/` itself after adding
/// one (not even its own meta keyspace): after a power cut a new data
/// dir's keyspaces were gone and the journal's acknowledged writes with
/// them (found by the power-cut tests; `powercut/examples/fjall_keyspace_dir.rs`
/// is the reproducer for upstream). Every open syncs it, so any keyspace
/// created so far counts.
fn sync_keyspace_names(path: &Path) -> Result<(), ShardError> {
    let sync = |dir: &Path| std::fs::File::open(dir).and_then(|dir| dir.sync_all()).map_err(fjall::Error::from);
    sync(&path.join("keyspaces"))?;
    sync(path)?;
    Ok(())
}

/// A shard's keyspaces and the memtable size at which they are sealed for
/// flushing.
///
/// fjall 3.1 rotates an oversized memtable by queueing a request to its
/// worker pool on *every* write batch, on a bounded queue that only the
/// workers read, and a worker handling one then blocks queueing the flush on
/// that same queue: under sustained writes the one worker per shard
/// deadlocked on itself (fjall-rs/fjall#323 is the upstream fix, not yet
/// released). So keyspaces are created with a memtable limit fjall never
/// reaches, and the committer rotates them here, once per full memtable.
#[derive(Clone)]
pub(super) struct Memtables {
    /// Every keyspace of the shard, shared with sealed batches.
    pub(super) keyspaces: Arc<[Keyspace]>,
    /// Size past which a memtable is sealed ([`ShardOptions::memtable_bytes`]).
    pub(super) limit: u64,
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

    pub(super) fn any_to_seal(&self) -> bool {
        self.keyspaces.iter().any(|keyspace| self.due(keyspace))
    }

    pub(super) fn rotate_full(&self) -> Result<(), ShardError> {
        for keyspace in self.keyspaces.iter().filter(|keyspace| self.due(keyspace)) {
            keyspace.rotate_memtable()?;
        }
        Ok(())
    }

    /// Seals every memtable holding anything, for fjall's worker to flush:
    /// an idle shard's memory goes back, and a restart replays no journal
    /// for it (see `super::idle`). Not past [`MAX_SEALED_MEMTABLES`]: a
    /// worker behind in a long compaction must not be given a keyspace's
    /// fourth, which would halt its writes.
    pub(super) fn rotate_all(&self) -> Result<(), ShardError> {
        let flushable = |keyspace: &&Keyspace| {
            keyspace.tree.active_memtable().size() > 0 && keyspace.tree.sealed_memtable_count() < MAX_SEALED_MEMTABLES
        };
        for keyspace in self.keyspaces.iter().filter(flushable) {
            keyspace.rotate_memtable()?;
        }
        Ok(())
    }

    /// Sealed memtables, all keyspaces, waiting for fjall's worker to flush them.
    fn sealed(&self) -> usize {
        self.keyspaces.iter().map(|keyspace| keyspace.tree.sealed_memtable_count()).sum()
    }

    /// Whether no memtable, active or sealed, holds anything.
    fn is_empty(&self) -> bool {
        self.largest() == 0 && self.sealed() == 0
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
    /// Bytes the shard's tables and journal take on disk; `None` if fjall
    /// could not read a journal file's size.
    pub disk_bytes: Option<u64>,
}

/// Sealed memtables of one keyspace waiting for fjall's worker beyond which
/// a full memtable is kept taking writes rather than sealed.
///
/// fjall halts every write to a keyspace with four sealed memtables, and a
/// shard's one worker flushes only between compactions: behind a long one,
/// the log's memtables piled up and the committer, whose every batch writes
/// the log, slept while every write waited for it (see
/// docs/performance-history.md). Two leaves room for the seals fjall itself
/// asks for to shorten the journal.
const MAX_SEALED_MEMTABLES: usize = 2;

/// How far past [`ShardOptions::memtable_bytes`] a memtable may grow while
/// its keyspace waits for flushes (see `MAX_SEALED_MEMTABLES`): the bound
/// on the memory a worker that falls behind for good can cost. Past it the
/// memtable is sealed anyway and fjall's halt holds writes back. 4 outlasts
/// the compactions seen (see docs/performance-history.md).
pub const MEMTABLE_OVERRUN: u64 = 4;

/// Journal bytes kept before fjall flushes the memtables that still need
/// the oldest journal file. A start after a crash replays every journal
/// file, and keyspaces written a little per batch (meta, the tree log)
/// never fill a memtable, so with fjall's default (512 MiB) the journal grew
/// that far. fjall's minimum, one 64 MiB file, keeps the replay to one or
/// two files (see docs/performance-history.md).
const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// Level-0 tables that make fjall merge them into level 1, for the
/// keyspaces written one small random key per write (players, index).
/// fjall's default, 4, suits its 64 MiB memtables; after our smaller ones
/// it rewrote the whole of level 1 every few MiB flushed (see
/// docs/performance-history.md). Reads pay a bloom-filter probe per extra
/// table. Below 20, where fjall starts stalling writes.
const POINT_WRITE_L0_MERGE: u8 = 12;

/// Table size fjall's compactions aim for in the players' and the index's
/// keyspaces (fjall's default: 64 MiB). A compaction holds 8 bytes a key of
/// the table it is writing (for its bloom filter) until the table is done,
/// so smaller tables lower the server's peak memory (see
/// docs/performance-history.md). Level 1 then starts at 16 MiB times
/// [`POINT_WRITE_L0_MERGE`], 192 MiB, above a 5M-player shard's keyspace.
/// fjall stores it with the keyspace: data dirs keep what they were made with.
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
/// Each checkpoint is ingested as level-0 tables holding nearly every leaf,
/// which supersede all before them: at fjall's default, 4, whole copies
/// piled up and a start read every one (see docs/performance-history.md).
/// Two merges after about every checkpoint, and keeps level 1's base (this
/// times the 64 MiB table size) above one copy.
const CHECKPOINT_L0_MERGE: u8 = 2;

/// Compaction for the leaves' keyspace; see [`CHECKPOINT_L0_MERGE`]. fjall
/// stores it with the keyspace: data dirs keep what they were made with.
fn checkpoint_compaction() -> Arc<fjall::compaction::Leveled> {
    Arc::new(fjall::compaction::Leveled::default().with_l0_threshold(CHECKPOINT_L0_MERGE))
}

pub(super) const META_BOARD: &[u8] = b"board/";
pub(super) const META_EXPIRING: &[u8] = b"expiring/";
pub(super) const META_MAX_SEQ: &[u8] = b"max_seq";
pub(super) const META_MAX_BOARD: &[u8] = b"max_board_id";
pub(super) const META_BRANCHING: &[u8] = b"branching";
/// The [`LeafEncoding`](crate::tree::LeafEncoding) code; absent in data
/// dirs made before there was a choice.
pub(super) const META_LEAF_ENCODING: &[u8] = b"leaf_encoding";
/// The [`LogFormat`](crate::log::LogFormat) code; absent in data dirs made
/// before runs.
pub(super) const META_LOG_FORMAT: &[u8] = b"log_format";
/// Whether a name with a NUL byte was ever stored (see `short_names`);
/// absent in data dirs made before it was recorded.
pub(super) const META_NUL_NAMES: &[u8] = b"names_with_nul";
/// Whether small trees' short names are left out of the score index (see
/// `short_index`); absent in data dirs made before, which index them all.
pub(super) const META_SHORT_NAMES_INDEXED: &[u8] = b"short_names_indexed";
/// Whether small trees' short names are left out of the players' records
/// too (see `short_index`); absent in data dirs made before, which record
/// them all.
pub(super) const META_SHORT_NAMES_RECORDED: &[u8] = b"short_names_recorded";
/// The number of the first log record whose changes may be missing from the
/// players' and the index's runs: records before it are covered.
pub(super) const META_RUNS_THROUGH: &[u8] = b"runs_through";
/// Key, in the leaves' own keyspace, of the number of the first log record
/// the stored leaves do not include (see [`crate::checkpoint`]); absent in
/// data dirs made before it. One zero byte: it sorts before every leaf key
/// (all longer, so a zero first byte still puts them after it), and as it
/// is shorter than a board id neither a board's nor a tree's prefix scan
/// meets it.
pub(super) const LEAVES_THROUGH: &[u8] = b"\0";

pub(super) fn expiring_key(tree: TreeId) -> Vec<u8> {
    let mut key = META_EXPIRING.to_vec();
    key.extend_from_slice(&tree.prefix());
    key
}

pub(super) fn board_meta_key(id: u64) -> Vec<u8> {
    let mut key = META_BOARD.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// Every stored leaf, in key order: the leaves' keyspace but its marker
/// ([`LEAVES_THROUGH`], which sorts first).
pub(super) fn stored_leaves(leaves: &Keyspace) -> impl Iterator<Item = fjall::Guard> + 'static {
    leaves.range::<&[u8], _>((Bound::Excluded(LEAVES_THROUGH), Bound::Unbounded))
}

pub(super) fn read_u64(keyspace: &Keyspace, key: &[u8]) -> Result<u64, ShardError> {
    match keyspace.get(key)? {
        Some(v) => Ok(u64::from_be_bytes(v.as_ref().try_into().map_err(|_| ShardError::Corrupt("stored counter"))?)),
        None => Ok(0),
    }
}

impl Shard {
    /// How a commit persists under [`ShardOptions::durability`].
    pub(super) fn persist_mode(&self) -> PersistMode {
        match self.options.durability {
            Durability::Sync => PersistMode::SyncData,
            Durability::Buffered => PersistMode::Buffer,
        }
    }

    /// Prepares for a fast next start: checkpoints the trees (so no log is
    /// replayed) and flushes every memtable (so no journal is replayed).
    ///
    /// The flush is waited for here, not with fjall's
    /// `rotate_memtable_and_wait`, which polls until the flush queue is
    /// empty however long that takes: after a failed flush (disk full, data
    /// dir removed) fjall's worker stops and a SIGTERM hung the server
    /// forever. A failed worker poisons the database, which ends the wait
    /// with an error; a flush still running after `wait` is left to the
    /// journal, which holds everything the memtables do: the next start
    /// replays it.
    pub fn prepare_shutdown(&mut self, wait: Duration) -> Result<(), ShardError> {
        if self.is_at_rest() {
            // An idle shard that checkpointed and flushed (see `idle`): a
            // checkpoint now would only write its marker again, a table
            // that would make the next start merge the leaves' keyspace.
            return Ok(());
        }
        self.checkpoint()?;
        let storage = &self.storage;
        storage.db.persist(PersistMode::SyncAll)?;
        for keyspace in storage.memtables.keyspaces.iter() {
            keyspace.rotate_memtable()?;
        }
        let deadline = Instant::now() + wait;
        while storage.memtables.keyspaces.iter().any(|keyspace| keyspace.tree.sealed_memtable_count() > 0) {
            storage.db.persist(PersistMode::Buffer)?; // fails once a worker has failed
            if Instant::now() >= deadline {
                tracing::warn!(path = %self.path.display(), "memtables not flushed in time; the next start replays the journal");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        storage.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    /// Bytes in the fullest memtable still taking writes: stays near
    /// [`ShardOptions::memtable_bytes`] as full ones are sealed for
    /// flushing, and within [`MEMTABLE_OVERRUN`] times that while fjall's
    /// worker is behind.
    pub fn largest_memtable_bytes(&self) -> u64 {
        self.storage.memtables.largest()
    }

    /// Whether everything the shard holds is in its tables: no log record
    /// past its last checkpoint, nothing staged, in flight or in the
    /// overlay, no checkpoint under way, every memtable empty.
    fn is_at_rest(&self) -> bool {
        self.log.first == self.log.next
            && self.is_settled()
            && self.overlay.is_empty()
            && self.checkpoints.copying.is_none()
            && self.storage.memtables.is_empty()
    }

    /// See [`StorageStats`].
    pub fn storage_stats(&self) -> StorageStats {
        StorageStats {
            memtable_bytes: self.storage.db.write_buffer_size(),
            sealed_memtables: self.storage.memtables.sealed(),
            compacting: self.storage.db.time_compacting(),
            disk_bytes: self.storage.db.disk_space().ok(),
        }
    }
}

/// How long opening a shard's storage waits for an earlier opening's
/// journal to be closed before giving up (the caller retries).
const JOURNAL_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Waits until no file of this process is a journal in `path`: an earlier
/// opening's journal is closed, its buffered bytes written.
///
/// Why: fjall (3.1.13) lets a worker thread count itself gone before it
/// drops its handle on the journal, so a database dropped and opened again
/// at once (`Shard::reopen`, after a storage failure) can recover,
/// truncating a write that failed half-way on a full disk, before the old
/// journal's drop flushes that write's buffered rest past the new end; the
/// next recovery stops at the gap and loses every batch after it,
/// acknowledged ones too (`tests/disk_faults.rs`, a few runs in a hundred).
/// Without `/proc` nothing can be seen and nothing is waited for.
fn wait_until_journal_closed(path: &Path, within: Duration) -> Result<(), ShardError> {
    let deadline = Instant::now() + within;
    while journal_open(path) {
        if Instant::now() >= deadline {
            return Err(ShardError::StillClosing);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Whether a file descriptor of this process refers to a journal (`*.jnl`)
/// directly in `path`.
fn journal_open(path: &Path) -> bool {
    let (Ok(dir), Ok(descriptors)) = (std::fs::canonicalize(path), std::fs::read_dir("/proc/self/fd")) else {
        return false;
    };
    descriptors.flatten().filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|file| {
        file.parent() == Some(dir.as_path()) && file.extension().is_some_and(|extension| extension == "jnl")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// An idle shard's flush seals every memtable holding anything, but
    /// never gives a keyspace whose worker flushes nothing (none here) more
    /// than [`MAX_SEALED_MEMTABLES`].
    #[test]
    fn flushing_all_memtables_seals_the_nonempty_ones_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::builder(dir.path()).worker_threads_unchecked(0).open().unwrap();
        let created = || KeyspaceCreateOptions::default().max_memtable_size(u64::MAX);
        let (written, untouched) =
            (db.keyspace("written", created).unwrap(), db.keyspace("untouched", created).unwrap());
        let memtables = Memtables { keyspaces: [written.clone(), untouched.clone()].into(), limit: 1 << 20 };
        for round in 0..MAX_SEALED_MEMTABLES + 2 {
            written.insert(round.to_be_bytes(), b"value").unwrap();
            memtables.rotate_all().unwrap();
            let sealed = (round + 1).min(MAX_SEALED_MEMTABLES);
            assert_eq!(written.tree.sealed_memtable_count(), sealed, "round {round}");
            assert_eq!(untouched.tree.sealed_memtable_count(), 0, "an empty memtable is left alone");
        }
        assert!(written.tree.active_memtable().size() > 0, "past the bound, writes stay in the active memtable");
    }

    /// Only a journal is waited for, and not forever: past the deadline
    /// the opening fails, for its caller to retry (a journal closed in
    /// time: `open.rs`'s `opening_waits_for_a_journal_still_held_in_the_process`).
    #[test]
    fn a_journal_held_past_the_deadline_fails_the_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-0");
        std::fs::create_dir(&path).unwrap();
        let _lock = std::fs::File::create(path.join("lock")).unwrap();
        wait_until_journal_closed(&path, Duration::ZERO).expect("another file of the dir is no journal");
        let _journal = std::fs::File::create(path.join("0.jnl")).unwrap();
        let waited = wait_until_journal_closed(&path, Duration::from_millis(20));
        assert!(matches!(waited, Err(ShardError::StillClosing)), "{waited:?}");
    }
}
