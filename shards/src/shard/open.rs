//! Opening a shard: the data dir's format, the count trees loaded from
//! their checkpointed leaves, the change log replayed past them into the
//! trees and the overlay, a data dir of an older log format moved to the
//! current one, and reopening after a storage failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fjall::{Database, Keyspace, PersistMode};
use parking_lot::Mutex;

use super::apply::{apply_change, GatheredCounts, TreeCounts};
use super::checkpointing::Checkpoints;
use super::holdings::Holdings;
use super::options::ShardOptions;
use super::reads::player_key;
use super::short_index::{self, LeftOut, ReplayedTrees};
use super::short_names::{may_hold_nul_names, NO_NUL_NAMES};
use super::staging::Staged;
use super::storage::{
    read_u64, stored_leaves, Storage, LEAVES_THROUGH, META_BOARD, META_BRANCHING, META_EXPIRING, META_LEAF_ENCODING,
    META_LOG_FORMAT, META_MAX_BOARD, META_MAX_SEQ, META_NUL_NAMES, META_RUNS_THROUGH, META_SHORT_NAMES_INDEXED,
    META_SHORT_NAMES_RECORDED,
};
use super::{LogPositions, Shard};
use crate::board::{Board, BoardConfig, ConfigInterner};
use crate::cache::RecordCache;
use crate::dedup::{DedupTable, GROUP_PREFIX};
use crate::error::ShardError;
use crate::key::{TreeId, TREE_PREFIX_LEN};
use crate::log::{self, LogFormat};
use crate::overlay::Overlay;
use crate::ties::TieGroups;
use crate::tree::{self, LeafEncoding, LeafId};

impl Shard {
    /// Opens (or creates) the shard stored at `path` and loads its count trees
    /// from their stored leaves (not from the players).
    pub fn open(path: &Path, options: ShardOptions) -> Result<Self, ShardError> {
        Self::open_with_boards(path, options, drop)
    }

    /// Opens the shard as [`Shard::open`] does, handing `boards_read` the
    /// boards whose config it holds, names and all, in id order, as soon as
    /// they are read: before its count trees load, so that what the router
    /// rebuilds from them is built meanwhile. The shard keeps only configs.
    pub fn open_with_boards(
        path: &Path,
        options: ShardOptions,
        boards_read: impl FnOnce(Vec<Board>),
    ) -> Result<Self, ShardError> {
        tree::branching_bits(options.branching)?;
        let started = Instant::now();
        let storage = Storage::open(path, &options)?;
        if let Some(storage_opened) = options.storage_opened {
            storage_opened();
        }
        let cached_players = options.cached_players;
        let run_every = options.run_every;
        let dedup_limits = options.dedup;
        let leaf_encoding = check_format(&storage.db, &storage.meta, options.branching)?;
        let held = Holdings::new(options.branching);
        let mut shard = Self {
            storage,
            options,
            path: path.to_path_buf(),
            held,
            ties: TieGroups::default(),
            players: 0,
            burst_trees: 0,
            max_seq: 0,
            max_board_id: 0,
            log: LogPositions::default(),
            staged: Staged::default(),
            overlay: Overlay::new(run_every),
            in_flight: Default::default(),
            cache: Mutex::new(RecordCache::new(cached_players)),
            now: 0,
            expiring: BTreeSet::new(),
            expiry_cursor: None,
            nul_names: true,
            short_names_left_out: short_index::LeftOut::default(),
            leaf_encoding,
            repacking: Vec::new(),
            checkpoints: Checkpoints::default(),
            dedup: DedupTable::new(dedup_limits),
            images: std::sync::Arc::default(),
        };
        let opened = started.elapsed();
        let phases = shard.load(boards_read)?;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        tracing::info!(
            path = %path.display(),
            players = shard.players(),
            trees = shard.held.tree_count(),
            boards = shard.held.configs().len(),
            replayed = shard.log.logged,
            storage_ms = ms(opened),
            boards_ms = ms(phases.boards),
            leaves_ms = ms(phases.leaves),
            replay_ms = ms(phases.replay),
            ties_ms = ms(phases.ties),
            total_ms = ms(started.elapsed()),
            "shard opened"
        );
        Ok(shard)
    }

    /// (Re)builds the in-memory state from what is on disk, and says how
    /// long each part took. The boards read (names and all, in id order) go
    /// to `boards_read` before the trees load: only an opening shard hands
    /// them on.
    pub(super) fn load(&mut self, boards_read: impl FnOnce(Vec<Board>)) -> Result<LoadPhases, ShardError> {
        let mut phases = LoadPhases::default();
        let mut phase_start = Instant::now();
        let mut lap = || std::mem::replace(&mut phase_start, Instant::now()).elapsed();
        // A checkpoint under way was copying the trees about to be replaced:
        // dropped with them (nothing it wrote is read), the next one covers
        // its changes, which the replay below marks again. Carried on, it
        // would end with leaves never written and delete the log that holds
        // their changes.
        self.abandon_checkpoint();
        self.cache.get_mut().clear();
        self.held = Holdings::new(self.options.branching);
        self.staged = Staged::default();
        self.overlay = self.empty_overlay();
        self.in_flight.clear();
        let (meta, leaves) = (&self.storage.meta, &self.storage.leaves);
        self.max_seq = read_u64(meta, META_MAX_SEQ)?;
        self.max_board_id = read_u64(meta, META_MAX_BOARD)?;
        self.nul_names = may_hold_nul_names(meta.get(META_NUL_NAMES)?.as_deref())?;
        self.short_names_left_out = short_index::LeftOut {
            index: short_index::left_out(meta.get(META_SHORT_NAMES_INDEXED)?.as_deref())?,
            records: short_index::left_out(meta.get(META_SHORT_NAMES_RECORDED)?.as_deref())?,
        };
        let mut configs = ConfigInterner::default();
        let mut boards: Vec<Board> = Vec::new();
        for item in meta.prefix(META_BOARD) {
            let (key, value) = item.into_inner()?;
            let id_bytes: [u8; 8] =
                key.get(META_BOARD.len()..).and_then(|b| b.try_into().ok()).ok_or(ShardError::Corrupt("board key"))?;
            let id = u64::from_be_bytes(id_bytes);
            let (name, config) = BoardConfig::decode(&value).ok_or(ShardError::Corrupt("board config"))?;
            boards.push(Board { id, name: name.into(), config: configs.intern(config) });
        }
        self.held = Holdings::with_capacity(boards.len(), self.options.branching);
        for board in &boards {
            self.held.insert_config(board.id, board.config.clone());
        }
        boards_read(boards);
        phases.boards = lap();
        // Leaves come in tree order, a tree's together. Most boards have
        // players here, one tree each (all-time boards).
        let leaves_through = read_u64(leaves, LEAVES_THROUGH)?;
        for item in stored_leaves(leaves) {
            let (key, value) = item.into_inner()?;
            let tree_id = TreeId::from_prefix(&key).ok_or(ShardError::Corrupt("leaf key"))?;
            let rest = &key[TREE_PREFIX_LEN..];
            let (prefix, depth) = rest.split_first_chunk::<16>().ok_or(ShardError::Corrupt("leaf key"))?;
            let &[depth] = depth else { return Err(ShardError::Corrupt("leaf key")) };
            let id = LeafId { prefix: u128::from_be_bytes(*prefix), depth };
            self.held.install_leaf(tree_id, id, &value, self.leaf_encoding)?;
        }
        phases.leaves = lap();
        let format = log_format(meta)?;
        let runs_through = read_u64(meta, META_RUNS_THROUGH)?;
        self.replay_log(format, runs_through, leaves_through)?;
        // Periods whose deletion a restart interrupted: finish it, never serve them.
        self.expiring.clear();
        self.expiry_cursor = None;
        for item in self.storage.meta.prefix(META_EXPIRING) {
            let key = item.key()?;
            let tree = TreeId::from_prefix(&key[META_EXPIRING.len()..]).ok_or(ShardError::Corrupt("expiring key"))?;
            self.held.remove_tree(&tree);
            self.overlay.forget(&tree.prefix());
            self.expiring.insert(tree);
        }
        if format == LogFormat::TreeKeys {
            self.migrate_log()?;
        }
        (self.players, self.burst_trees) =
            self.held.trees().map(|(_, tree)| tree).fold((0, 0), |(players, burst), tree| {
                (players + tree.total(), burst + usize::from(!tree.is_compact()))
            });
        phases.replay = lap();
        self.rebuild_ties()?;
        phases.ties = lap();
        self.dedup.clear();
        for item in self.storage.meta.prefix(GROUP_PREFIX) {
            let (key, value) = item.into_inner()?;
            self.dedup.load(&key, &value).ok_or(ShardError::Corrupt("wid records"))?;
        }
        Ok(phases)
    }

    /// Applies the change log on top of the checkpointed leaves (numbers from
    /// `leaves_through` on), and rebuilds the overlay from the records the
    /// runs do not cover (numbers from `runs_through` on). Records before
    /// `leaves_through` are left from a checkpoint whose log deletion a
    /// crash lost: the next checkpoint deletes them. Runs are durable before
    /// the leaves that follow them are written, so they cover those too.
    fn replay_log(&mut self, format: LogFormat, runs_through: u64, leaves_through: u64) -> Result<(), ShardError> {
        let runs_through = runs_through.max(leaves_through);
        self.log = LogPositions::default();
        let mut first = true;
        let mut gathered = GatheredCounts::default();
        // The trees the rebuilt stretch changes, counted from where it
        // begins: the gathered changes before it applied first.
        let mut replayed: Option<ReplayedTrees> = None;
        for item in self.storage.changes.iter() {
            let (key, value) = item.into_inner()?;
            let number = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| ShardError::Corrupt("log key"))?);
            if first {
                self.log.first = number;
                first = false;
            }
            self.log.next = number + 1;
            if number < leaves_through {
                continue;
            }
            // A dropped board's log entries are dead: its id never returns.
            match format {
                LogFormat::TreeKeys => {
                    for change in log::tree_key_changes(&value)? {
                        if self.held.config(change.tree.board).is_none() {
                            continue;
                        }
                        let tree = self.held.tree_or_new(change.tree);
                        if let Some(key) = change.removed {
                            tree.add(key, -1);
                        }
                        if let Some(key) = change.added {
                            tree.add(key, 1);
                        }
                        self.log.logged += 1;
                    }
                }
                LogFormat::Changes => {
                    let rebuild = number >= runs_through;
                    if rebuild && replayed.is_none() {
                        gathered.apply(&mut self.held);
                        replayed = Some(ReplayedTrees::default());
                    }
                    for change in log::changes(&value) {
                        let change = change?;
                        let Some(config) = self.held.config(change.tree.board) else { continue };
                        if let Some(replayed) = replayed.as_mut() {
                            let delta = i64::from(change.new.is_some()) - i64::from(change.old.is_some());
                            let held = &self.held;
                            replayed.note(change.tree, delta, || held.tree(&change.tree).map_or(0, |t| t.total()));
                        }
                        let overlay = rebuild.then(|| (&mut self.overlay, player_key(change.tree, change.player)));
                        apply_change(TreeCounts::Gather(&mut gathered), overlay, config, &change, LeftOut::default());
                        self.log.logged += 1;
                    }
                    if gathered.is_full() {
                        gathered.apply(&mut self.held);
                    }
                }
            }
        }
        gathered.apply(&mut self.held);
        if let Some(replayed) = replayed {
            self.settle_replayed(replayed)?;
        }
        // Record numbers never go back: the marker may name a number past an
        // emptied log, and what it covers must stay covered.
        self.log.next = self.log.next.max(runs_through);
        if first {
            self.log.first = self.log.next;
        }
        Ok(())
    }

    /// Moves a data dir made before runs to the current log format. Its log
    /// holds count-tree keys only (its batches wrote the players and the
    /// index themselves, so nothing needs rebuilding there): the trees just
    /// replayed are checkpointed at once, in the batch that deletes the old
    /// records and records the new format.
    fn migrate_log(&mut self) -> Result<(), ShardError> {
        let mut batch = self.storage.db.batch().durability(Some(PersistMode::SyncAll));
        self.checkpoint_into(&mut batch);
        batch.insert(&self.storage.meta, META_LOG_FORMAT, [LogFormat::Changes.code()]);
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
        // fjall locks the directory: release it first (opening then waits
        // for the old journal to be closed too).
        drop(self);
        let mut shard = Self::open(&path, options)?;
        shard.now = now;
        Ok(shard)
    }

    /// Where the shard's storage lives, and how it was opened: enough to open
    /// it again (see [`Shard::reopen`]) even after the shard itself is gone.
    pub fn location(&self) -> (PathBuf, ShardOptions) {
        (self.path.clone(), self.options.clone())
    }
}

/// How long each part of loading a shard took, for the log: what a slow
/// start-up is spent on.
#[derive(Debug, Default)]
pub(super) struct LoadPhases {
    /// Reading the boards' configs.
    boards: std::time::Duration,
    /// Reading the checkpointed leaves into the trees.
    leaves: std::time::Duration,
    /// Replaying the change log, and the totals.
    replay: std::time::Duration,
    /// Rebuilding the tie groups.
    ties: std::time::Duration,
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
            batch.insert(meta, META_NUL_NAMES, NO_NUL_NAMES);
            batch.insert(meta, META_SHORT_NAMES_INDEXED, short_index::LEFT_OUT);
            batch.insert(meta, META_SHORT_NAMES_RECORDED, short_index::LEFT_OUT);
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

#[cfg(test)]
mod tests {
    use super::super::all_time_board;
    use super::*;
    use crate::board::{Mode, Order};
    use crate::key;

    /// The embedder's hook runs at every open, a reopen's too (a shard
    /// reopened after a failed write starts new fjall workers), after
    /// fjall's workers start and before the state loads.
    #[test]
    fn the_storage_hook_runs_at_every_open_before_the_load() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        static WORKERS_SEEN: AtomicUsize = AtomicUsize::new(0);
        fn hook() {
            CALLS.fetch_add(1, Ordering::SeqCst);
            let workers = std::fs::read_dir("/proc/self/task")
                .into_iter()
                .flatten()
                .flatten()
                .filter(|task| std::fs::read_to_string(task.path().join("comm")).is_ok_and(|n| n.starts_with("fjall:")))
                .count();
            WORKERS_SEEN.fetch_max(workers, Ordering::SeqCst);
        }
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        let options = ShardOptions { storage_opened: Some(hook), ..ShardOptions::default() };
        let mut shard = Shard::open_with_boards(dir.path(), options, |_| {
            assert_eq!(CALLS.load(Ordering::SeqCst), 1, "called before the boards are read");
        })
        .unwrap();
        shard.write(&board, "p", 3, Mode::Set, 1).unwrap();
        shard.commit().unwrap();
        let shard = shard.reopen().unwrap();
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
        assert!(WORKERS_SEEN.load(Ordering::SeqCst) > 0, "fjall's workers run when the hook is called");
        assert_eq!(shard.count(tree), 1);
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
            shard.storage.meta.remove(META_LEAF_ENCODING).unwrap(); // as an older rankd left it
            shard.storage.db.persist(PersistMode::SyncAll).unwrap();
        }
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(shard.leaf_encoding, LeafEncoding::Fixed);
        for i in 0..500i64 {
            shard.write(&board, &format!("p{i}"), i * 37 % 101, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        shard.checkpoint().unwrap();
        let stored: Vec<usize> =
            stored_leaves(&shard.storage.leaves).map(|item| item.into_inner().unwrap().1.len()).collect();
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

    /// Opening a shard whose journal a file of this process still holds
    /// (as fjall's worker of an earlier opening can, for a moment after the
    /// lock is released) waits until that file is closed.
    #[test]
    fn opening_waits_for_a_journal_still_held_in_the_process() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "p", 3, Mode::Set, 1).unwrap();
        shard.commit().unwrap();
        drop(shard);
        let journal = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|extension| extension == "jnl"))
            .expect("a journal");
        let held = std::fs::OpenOptions::new().append(true).open(journal).unwrap();
        let closed = std::sync::Arc::new(AtomicBool::new(false));
        let closer = {
            let closed = closed.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                closed.store(true, Ordering::SeqCst);
                drop(held);
            })
        };
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert!(closed.load(Ordering::SeqCst), "opened while the old journal was held");
        assert_eq!(shard.count(tree), 1);
        closer.join().unwrap();
    }
}
