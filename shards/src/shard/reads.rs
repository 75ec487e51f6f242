//! Reads: a player's record through the record cache, the overlays and
//! storage, in that order; counts from the count trees; lists from the
//! stored score index with the overlays laid over it.

use std::collections::HashMap;

use super::short_index;
use super::Shard;
use crate::board::{Order, Ties};
use crate::cache::RecordCache;
use crate::error::ShardError;
use crate::key::{self, TreeId, TREE_PREFIX_LEN};
use crate::overlay;
use crate::record::Record;
use crate::tree::BucketShape;

/// One entry of a list read, with its position for merging across shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// Index bytes after the tree prefix; compares like the list order.
    pub position: Vec<u8>,
    /// Who holds the position.
    pub player: String,
    /// Their score, decoded from the position's score key.
    pub score: i64,
    /// Reach sequence (ordinal boards only, else 0).
    pub seq: u64,
}

/// Which way a list read walks from its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Worse scores, starting at the position (inclusive).
    Forward,
    /// Better scores, ending before the position (exclusive), nearest first.
    Backward,
}

/// A player's storage key and its record-cache hash, made once per write
/// and used by each step of it (the read of the old record, the cache
/// update, the overlay).
pub(super) struct PlayerKey {
    /// The key in the players' keyspace and the overlays.
    pub(super) stored: Vec<u8>,
    /// The record cache's key: a hash of `stored`.
    pub(super) cached: u128,
}

impl PlayerKey {
    pub(super) fn new(tree: TreeId, player: &str) -> Self {
        let stored = player_key(tree, player);
        Self { cached: RecordCache::key(&stored), stored }
    }
}

/// Built at its final size: every write and every rank makes one, and
/// growing it from the prefix reallocated each time. The name is text or,
/// taken from a list position, its bytes.
pub(super) fn player_key(tree: TreeId, player: impl AsRef<[u8]>) -> Vec<u8> {
    let player = player.as_ref();
    let mut key = Vec::with_capacity(TREE_PREFIX_LEN + player.len());
    push_player_key(&mut key, tree, player);
    key
}

/// Appends a player's storage key to `out`: how a look ahead builds every
/// key of a group in one buffer.
pub(super) fn push_player_key(out: &mut Vec<u8>, tree: TreeId, player: impl AsRef<[u8]>) {
    out.extend_from_slice(&tree.prefix());
    out.extend_from_slice(player.as_ref());
}

/// A list position past every real one: none starts with 17 bytes of 0xFF
/// (names are UTF-8, and sequences never reach `u64::MAX`).
pub(super) const POSITIONS_END: [u8; 17] = [0xFF; 17];

impl Shard {
    /// A player's record in `tree`, seeing the open batch. A short name's
    /// in a small tree comes from the tree, with a `seq` of 0 (see
    /// `short_index`): `seq` orders ties on ordinal boards only.
    pub fn get(&self, tree: TreeId, player: &str) -> Result<Option<Record>, ShardError> {
        match self.short_record(tree, player)? {
            Some(record) => Ok(record),
            None => self.record(&PlayerKey::new(tree, player)),
        }
    }

    /// The record a rank of `player` in `tree` starts from: [`Shard::get`]'s,
    /// except that on a small board with competition or dense ties it may
    /// be read from the board's count tree with a `seq` of 0, which a rank
    /// key there does not hold (see `short_names`).
    pub fn rank_record(&self, tree: TreeId, player: &str) -> Result<Option<Record>, ShardError> {
        if let Some(record) = self.short_record(tree, player)? {
            return Ok(record);
        }
        // A rank of a long name, the common case, looks up no board config.
        let config = self.may_read_from_tree(player).then(|| self.held.config(tree.board)).flatten();
        match config.and_then(|config| self.record_in_tree(config, &tree, player)) {
            Some(record) => Ok(record),
            None => self.get(tree, player),
        }
    }

    /// [`Shard::get`] by a key already made.
    pub(super) fn record(&self, key: &PlayerKey) -> Result<Option<Record>, ShardError> {
        if let Some(cached) = self.cache.lock().get(key.cached) {
            return Ok(cached);
        }
        let record = self.unwritten_or_stored(&key.stored)?;
        self.cache.lock().put(key.cached, record);
        Ok(record)
    }

    /// The record stored under `key` in the newest overlay that has one:
    /// the current overlay, then those frozen for runs not yet written.
    fn unwritten_record(&self, key: &[u8]) -> Option<Option<Record>> {
        let frozen = self.in_flight.overlays().rev();
        std::iter::once(&self.overlay).chain(frozen).find_map(|overlay| overlay.record(key))
    }

    /// The record stored under `key` (a player key) in the overlays or
    /// storage, never the cache: what a cache miss reads, and what
    /// [`Shard::check`] verifies.
    pub(super) fn unwritten_or_stored(&self, key: &[u8]) -> Result<Option<Record>, ShardError> {
        match self.unwritten_record(key) {
            Some(unwritten) => Ok(unwritten),
            None if self.being_deleted(key) => Ok(None),
            None => self.storage.players.get(key)?.map(|v| Record::decode(&v)).transpose(),
        }
    }

    /// Whether `key` (a player or index key) is of a tree whose keys are
    /// still being deleted (a dropped board's, an expired period's): those
    /// answer nothing, whatever is left of them in storage.
    fn being_deleted(&self, key: &[u8]) -> bool {
        !self.expiring.is_empty() && TreeId::from_prefix(key).is_some_and(|tree| self.expiring.contains(&tree))
    }

    /// Players in `tree`.
    pub fn count(&self, tree: TreeId) -> u64 {
        self.held.tree(&tree).map_or(0, |t| t.total())
    }

    /// For each key, how many players of `tree` sort strictly before it.
    pub fn count_before(&self, tree: TreeId, keys: &[u128]) -> Vec<u64> {
        match self.held.tree(&tree) {
            Some(t) => keys.iter().map(|&k| t.count_before(k)).collect(),
            None => vec![0; keys.len()],
        }
    }

    /// How many players of `tree` sort strictly before `key`: one rank's
    /// count, without the vector [`Shard::count_before`] returns.
    pub fn count_before_key(&self, tree: TreeId, key: u128) -> u64 {
        self.held.tree(&tree).map_or(0, |t| t.count_before(key))
    }

    /// For each of `keys` (ascending), how many players of `tree` sort
    /// strictly before it, in one walk of the tree.
    pub fn count_before_sorted(&self, tree: TreeId, keys: &[u128]) -> Vec<u64> {
        match self.held.tree(&tree) {
            Some(t) => t.count_before_sorted(keys),
            None => vec![0; keys.len()],
        }
    }

    /// The bucket boundaries of `tree` for approximate ranks, shaped by
    /// `shape` (see [`TreeView::bucket_bounds`](crate::TreeView::bucket_bounds)); empty for an empty tree.
    pub fn bucket_bounds(&self, tree: TreeId, shape: BucketShape) -> Vec<u128> {
        self.held.tree(&tree).map_or_else(Vec::new, |t| t.bucket_bounds(shape))
    }

    /// Distinct score keys of `tree` with their player counts (for dense
    /// ranks), read from the count tree, not from the players.
    pub fn score_counts(&self, tree: TreeId) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        if let Some(t) = self.held.tree(&tree) {
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
        let dense: std::collections::HashSet<u64> =
            self.held.configs().filter(|(_, config)| config.ties == Ties::Dense).map(|(id, _)| id).collect();
        if dense.is_empty() {
            return HashMap::new(); // no look at a million trees of other boards
        }
        self.held.tree_ids().filter(|t| dense.contains(&t.board)).map(|t| (t, self.score_counts(t))).collect()
    }

    /// Trees this shard holds players for.
    pub fn tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.held.tree_ids()
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
    pub(super) fn index_positions<'a>(
        &'a self,
        tree: TreeId,
        from: &'a [u8],
        to: &'a [u8],
        direction: Direction,
    ) -> Box<dyn Iterator<Item = Result<Vec<u8>, ShardError>> + 'a> {
        let prefix = tree.prefix();
        if self.expiring.contains(&tree) {
            return Box::new(std::iter::empty());
        }
        match self.small_tree_positions(tree) {
            Some(Ok(positions)) => return Box::new(short_index::in_range(positions, from, to, direction).map(Ok)),
            Some(Err(error)) => return Box::new(std::iter::once(Err(error))),
            None => {}
        }
        let stored = self.storage.index.range([&prefix[..], from].concat()..[&prefix[..], to].concat());
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
        let frozen = self.in_flight.overlays();
        for layer in frozen.chain(std::iter::once(&self.overlay)) {
            merged = Box::new(overlay::layer(merged, layer.index_range(tree, from, to, forward), forward));
        }
        Box::new(merged.filter_map(|entry| match entry {
            Ok((position, present)) => present.then_some(Ok(position)),
            Err(e) => Some(Err(e)),
        }))
    }
}
