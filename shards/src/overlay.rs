//! Player records and score-index entries changed since they were last
//! written to storage, held in memory and written in sorted *runs*.
//!
//! Writing every change to the `players` and `index` keyspaces as it
//! happened cost three LSM-tree inserts per score change (the record, the
//! old index entry's tombstone, the new entry), and fjall's memtable
//! skiplist made those the largest part of a write's CPU: searching it for
//! each key is a dozen cache misses and `memcmp`s. Here a change costs a
//! hash-map insert and two ordered-map inserts in memory; durability comes
//! from the change log ([`crate::log`]), and every so often the changes are
//! written as one sorted run per keyspace with fjall's bulk ingestion
//! (straight to table files: no journal, no memtable). A build without the
//! per-write inserts set the ceiling this design aims at; runs and their
//! compaction take some of it back (see docs/performance-history.md).
//!
//! An overlay holds one final value per key: the newest record of a player
//! (`None`: removed) and whether an index entry exists. Writing a run is
//! therefore idempotent, which is what makes recovery simple: a run that
//! may or may not have reached storage before a crash is rebuilt from the
//! log and written again.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use fjall::Keyspace;

use crate::error::ShardError;
use crate::key::TreeId;
use crate::record::Record;
use crate::FastHasher;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Overlay {
    /// Player records by storage key (tree prefix and name).
    players: HashMap<Vec<u8>, Option<Record>, FastHasher>,
    /// Score-index entries per tree. Ordered, because list reads merge them
    /// with storage's index in key order.
    index: BTreeMap<TreeId, IndexChanges>,
    /// Recent index changes a tree holds before they are merged into its
    /// settled ones (see [`IndexChanges`]).
    merge_every: usize,
}

/// How many recent index changes a tree's overlay gathers before merging
/// them into its settled ones, for overlays written every `run_every`
/// players. A run holds up to two index changes a player (the old entry's
/// removal, the new one), so merging every `run_every / 4` would move a
/// change ~4 times on average. Capped so that the recent map stays small
/// enough to be cheap to insert into: in the server, where the count trees
/// and the record cache share the CPU caches with it, 4096 beat larger caps
/// (see docs/performance-history.md).
fn index_merge_every(run_every: usize) -> usize {
    (run_every / 4).clamp(2, 4_096)
}

/// Changes a tree's overlay takes straight into its sorted vector before
/// it starts a map of recent ones (see [`IndexChanges`]).
const DIRECT_CHANGES: usize = 16;

/// The score-index changes of one tree, by list position (the key after the
/// tree prefix): `true` present, `false` removed.
///
/// Two layers: a sorted vector of settled changes and a small ordered map
/// of recent ones over it, merged when the map fills. In one ordered map
/// grown to a whole run's changes, each insert walked megabytes of nodes, a
/// cache miss a level (see docs/performance-history.md); the small map
/// stays in cache, and a merge is one sequential pass. A tree's first
/// few changes go straight into the vector: most trees of a server of
/// many small boards see only those, and a map's first node is ~300 bytes.
#[derive(Debug, Default)]
struct IndexChanges {
    /// Sorted by position, one change per position.
    settled: Vec<(Position, bool)>,
    /// Newer than `settled`; where both hold a position, this one counts.
    recent: BTreeMap<Position, bool>,
    /// Empty; what the next merge writes into.
    spare: Vec<(Position, bool)>,
}

impl IndexChanges {
    fn set(&mut self, position: Position, present: bool, merge_every: usize) {
        if self.recent.is_empty() && self.settled.len() < DIRECT_CHANGES {
            match self.settled.binary_search_by(|(settled, _)| settled.cmp(&position)) {
                Ok(at) => self.settled[at].1 = present,
                Err(at) => self.settled.insert(at, (position, present)),
            }
            return;
        }
        self.recent.insert(position, present);
        if self.recent.len() >= merge_every {
            // Into the spare vector, whose memory is reused: a fresh one each
            // merge page-faulted its way through megabytes.
            let mut recent = std::mem::take(&mut self.recent).into_iter().peekable();
            let merged = &mut self.spare;
            merged.clear();
            merged.reserve(self.settled.len() + recent.len());
            for (position, present) in self.settled.drain(..) {
                let mut newer = false;
                while let Some((next, _)) = recent.peek() {
                    match next.cmp(&position) {
                        Ordering::Greater => break,
                        order => {
                            newer = order == Ordering::Equal;
                            merged.extend(recent.next());
                        }
                    }
                }
                if !newer {
                    merged.push((position, present));
                }
            }
            merged.extend(recent);
            std::mem::swap(&mut self.settled, &mut self.spare);
        }
    }

    /// Changes at positions from `from` (inclusive) to `to` (exclusive), in
    /// position order or, not `forward`, in reverse.
    fn range<'a>(
        &'a self,
        from: Position,
        to: Position,
        forward: bool,
    ) -> Box<dyn Iterator<Item = (&'a Position, bool)> + 'a> {
        if from >= to {
            return Box::new(std::iter::empty());
        }
        let start = self.settled.partition_point(|(position, _)| *position < from);
        let end = start + self.settled[start..].partition_point(|(position, _)| *position < to);
        let settled = self.settled[start..end].iter().map(|(position, present)| (position, *present));
        let recent = self
            .recent
            .range((Bound::Included(from), Bound::Excluded(to)))
            .map(|(position, present)| (position, *present));
        if forward {
            Box::new(newest_wins(settled, recent, true))
        } else {
            Box::new(newest_wins(settled.rev(), recent.rev(), false))
        }
    }

    /// Every change, in position order.
    fn iter(&self) -> impl Iterator<Item = (&Position, bool)> {
        let settled = self.settled.iter().map(|(position, present)| (position, *present));
        newest_wins(settled, self.recent.iter().map(|(position, present)| (position, *present)), true)
    }
}

/// Merges two sequences of `(key, value)`, each sorted the way the walk
/// goes (ascending when `forward`, else descending) with unique keys, into
/// one; on equal keys the `newer` entry is kept.
fn newest_wins<K: Ord, V>(
    older: impl Iterator<Item = (K, V)>,
    newer: impl Iterator<Item = (K, V)>,
    forward: bool,
) -> impl Iterator<Item = (K, V)> {
    merge_newest(older, newer, move |(o, _), (n, _)| if forward { o.cmp(n) } else { n.cmp(o) })
}

/// Merges two sequences sorted by `order` into one, in that order; where
/// `order` finds an item of each equal, only the `newer` one is kept.
fn merge_newest<T>(
    older: impl Iterator<Item = T>,
    newer: impl Iterator<Item = T>,
    order: impl Fn(&T, &T) -> Ordering,
) -> impl Iterator<Item = T> {
    let mut older = older.peekable();
    let mut newer = newer.peekable();
    std::iter::from_fn(move || {
        let next = match (older.peek(), newer.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(o), Some(n)) => order(o, n),
        };
        match next {
            Ordering::Less => older.next(),
            Ordering::Equal => {
                older.next();
                newer.next()
            }
            Ordering::Greater => newer.next(),
        }
    })
}

/// A list position as the overlay orders it: the score key inline, then the
/// rest of the position's bytes. Orders exactly as the bytes do (the score
/// key is their big-endian first 8 bytes), but a comparison is nearly
/// always one integer compare inside the map's node, where whole byte
/// positions cost a pointer chase and a `memcmp` over the tree prefix every
/// key shares (see docs/performance-history.md).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    /// The position's first 8 bytes: settles nearly every comparison.
    score_key: u64,
    /// The bytes after the score key (sequence, name), compared on a tie.
    rest: Box<[u8]>,
}

impl Position {
    /// From a position's bytes. Real positions have at least the 8 bytes of
    /// a score key; a shorter bound is padded with zeros, and a real
    /// position is below the padded bound exactly when it is below the
    /// bound's bytes, which is all a range bound asks.
    fn from_bytes(bytes: &[u8]) -> Self {
        let mut score = [0u8; 8];
        let head = bytes.len().min(8);
        score[..head].copy_from_slice(&bytes[..head]);
        Self { score_key: u64::from_be_bytes(score), rest: bytes[head..].into() }
    }

    fn to_bytes(&self) -> Vec<u8> {
        [&self.score_key.to_be_bytes()[..], &self.rest].concat()
    }
}

impl Overlay {
    /// An empty overlay, for one to be written as runs every `run_every`
    /// players (which sets how often its trees merge their recent index
    /// changes: see [`index_merge_every`]).
    pub(crate) fn new(run_every: usize) -> Self {
        Self { players: HashMap::default(), index: BTreeMap::new(), merge_every: index_merge_every(run_every) }
    }

    /// Frees what only later changes would use (each tree's spare merge
    /// vector, as large as its settled changes): for an overlay frozen to
    /// be written as runs, which takes no more changes.
    pub(crate) fn freeze(&mut self) {
        for changes in self.index.values_mut() {
            changes.spare = Vec::new();
        }
    }

    /// Whether nothing waits to be written.
    pub(crate) fn is_empty(&self) -> bool {
        self.players.is_empty() && self.index.is_empty()
    }

    /// Players with a record waiting to be written.
    pub(crate) fn players(&self) -> usize {
        self.players.len()
    }

    /// The record of the player stored under `key`, if this overlay has one
    /// (`Some(None)`: removed).
    pub(crate) fn record(&self, key: &[u8]) -> Option<Option<Record>> {
        self.players.get(key).copied()
    }

    /// Records a player's new record.
    pub(crate) fn set_record(&mut self, key: Vec<u8>, record: Option<Record>) {
        self.players.insert(key, record);
    }

    /// Records that the index entry of `tree` at the position made of
    /// `score_key` and `tail` ([`crate::key::list_position_tail`]) now
    /// exists or not.
    pub(crate) fn set_index(&mut self, tree: TreeId, score_key: u64, tail: Vec<u8>, present: bool) {
        let position = Position { score_key, rest: tail.into_boxed_slice() };
        self.index.entry(tree).or_default().set(position, present, self.merge_every);
    }

    /// Index entries of `tree` with positions from `from` (inclusive) to
    /// `to` (exclusive), as position bytes, in position order or, not
    /// `forward`, in reverse.
    pub(crate) fn index_range<'a>(
        &'a self,
        tree: TreeId,
        from: &[u8],
        to: &[u8],
        forward: bool,
    ) -> impl Iterator<Item = (Vec<u8>, bool)> + 'a {
        let (from, to) = (Position::from_bytes(from), Position::from_bytes(to));
        self.index.get(&tree).into_iter().flat_map(move |changes| {
            changes.range(from.clone(), to.clone(), forward).map(|(position, present)| (position.to_bytes(), present))
        })
    }

    /// Player records whose key starts with `prefix`, in no order.
    pub(crate) fn records_under<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], Option<Record>)> + 'a {
        self.players.iter().filter(move |(key, _)| key.starts_with(prefix)).map(|(key, r)| (key.as_slice(), *r))
    }

    /// Forgets everything under `prefix` (a dropped board, an expired
    /// period): storage deletes those keys itself, and a later run must not
    /// write them back.
    pub(crate) fn forget(&mut self, prefix: &[u8]) {
        self.players.retain(|key, _| !key.starts_with(prefix));
        self.index.retain(|tree, _| !tree.prefix().starts_with(prefix));
    }

    /// Writes the overlay to storage as one sorted run per keyspace and
    /// returns once both are durable (fjall fsyncs ingested tables and the
    /// version that lists them). Call only once the log records of every
    /// change in it are durable: a run must never get ahead of the log that
    /// the count trees are rebuilt from.
    pub(crate) fn write_runs(&self, players: &Keyspace, index: &Keyspace) -> Result<(), ShardError> {
        if !self.players.is_empty() {
            let mut sorted: Vec<(KeyHead, &[u8], Option<Record>)> =
                self.players.iter().map(|(key, record)| (KeyHead::of(key), key.as_slice(), *record)).collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            ingest_sorted(players, sorted.into_iter().map(|(_, key, record)| (key, record.map(Record::encode))))?;
        }
        if !self.index.is_empty() {
            // Trees in order, and positions in order within each: tree
            // prefixes are fixed-length, so the keys ascend.
            let entries = self.index.iter().flat_map(|(tree, changes)| {
                changes.iter().map(move |(position, present)| {
                    let key = [&tree.prefix()[..], &position.score_key.to_be_bytes(), &position.rest].concat();
                    (key, present.then_some([]))
                })
            });
            ingest_sorted(index, entries)?;
        }
        Ok(())
    }
}

/// A key's first 32 bytes as two big-endian integers, zero-padded: a sort
/// key that orders a run's player keys without a libc `memcmp` per
/// comparison (see docs/performance-history.md). The common tree prefix and
/// a name fit in 32 bytes, so heads settle nearly every comparison. Padding
/// can only make different keys compare equal, never reverse them, so
/// equal heads fall back to comparing the whole keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct KeyHead(u128, u128);

impl KeyHead {
    fn of(key: &[u8]) -> Self {
        let (mut high, mut low) = ([0u8; 16], [0u8; 16]);
        let (first, rest) = key.split_at(key.len().min(16));
        high[..first.len()].copy_from_slice(first);
        let second = &rest[..rest.len().min(16)];
        low[..second.len()].copy_from_slice(second);
        Self(u128::from_be_bytes(high), u128::from_be_bytes(low))
    }
}

/// Writes `entries` (a value, or `None` for a deletion), in ascending key
/// order, straight into new tables of `keyspace` (fjall's ingestion): all
/// or nothing, and durable when this returns.
pub(crate) fn ingest_sorted<K, V>(
    keyspace: &Keyspace,
    entries: impl IntoIterator<Item = (K, Option<V>)>,
) -> Result<(), ShardError>
where
    K: Into<fjall::UserKey>,
    V: Into<fjall::UserValue>,
{
    let mut tables = keyspace.start_ingestion()?;
    for (key, value) in entries {
        match value {
            Some(value) => tables.write(key, value)?,
            None => tables.write_tombstone(key)?,
        }
    }
    tables.finish()?;
    Ok(())
}

/// Index entries `(position, present)` of stacked layers, in walk order.
pub(crate) type Layered<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, bool), ShardError>> + 'a>;

/// Lays `newer` index entries over `older` ones of the same range, walked in
/// the same direction: both yield `(position, present)`, sorted the way the
/// walk goes (ascending when `forward`, else descending), and on equal
/// positions the newer entry wins. Removed entries are kept, so layers
/// stack (storage, then frozen overlays oldest first, then the current
/// one); the reader drops them at the end.
pub(crate) fn layer<S, O>(
    older: S,
    newer: O,
    forward: bool,
) -> impl Iterator<Item = Result<(Vec<u8>, bool), ShardError>>
where
    S: Iterator<Item = Result<(Vec<u8>, bool), ShardError>>,
    O: Iterator<Item = (Vec<u8>, bool)>,
{
    // An error from below goes out first; nothing newer can be an error.
    merge_newest(older, newer.map(Ok), move |o, n| match (o, n) {
        (Ok((o, _)), Ok((n, _))) if forward => o.cmp(n),
        (Ok((o, _)), Ok((n, _))) => n.cmp(o),
        (Err(_), _) => Ordering::Less,
        (_, Err(_)) => Ordering::Greater,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A list position: a small score key (so positions collide) and a tail.
    fn position() -> impl Strategy<Value = (u64, Vec<u8>)> {
        (0u64..4, proptest::collection::vec(0u8..3, 0..3))
    }

    /// A range bound: any short byte string, in or between positions.
    fn bound() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0xFF)], 0..11)
    }

    fn bytes((score_key, tail): &(u64, Vec<u8>)) -> Vec<u8> {
        [&score_key.to_be_bytes()[..], tail].concat()
    }

    proptest! {
        /// Layering overlays on storage equals applying their changes in
        /// order to storage's key set, over any range, both ways, however
        /// often each overlay merges its recent index changes.
        #[test]
        fn layers_apply_overlays_in_order(
            stored in proptest::collection::btree_set(position(), 0..12),
            // Past DIRECT_CHANGES, so both the direct path and the map's are
            // taken.
            older in proptest::collection::vec((position(), any::<bool>()), 0..40),
            newer in proptest::collection::vec((position(), any::<bool>()), 0..40),
            merge_every in 1usize..5,
            from in bound(),
            to in prop_oneof![bound(), Just(vec![0xFF; 9])],
        ) {
            let stored: BTreeSet<Vec<u8>> = stored.iter().map(bytes).collect();
            let mut want = stored.clone();
            for (position, present) in older.iter().chain(&newer) {
                if *present { want.insert(bytes(position)); } else { want.remove(&bytes(position)); }
            }
            want.retain(|key| from <= *key && *key < to);
            let tree = TreeId { board: 1, window: 0, period: 0 };
            let overlays: Vec<Overlay> = [&older, &newer].iter().map(|changes| {
                let mut overlay = Overlay { merge_every, ..Overlay::new(0) };
                for ((score_key, tail), present) in changes.iter() {
                    overlay.set_index(tree, *score_key, tail.clone(), *present);
                    // Another tree's entries never show.
                    overlay.set_index(TreeId { board: 2, ..tree }, *score_key, tail.clone(), true);
                }
                overlay
            }).collect();
            for forward in [true, false] {
                let in_range = stored.iter().filter(|key| from <= **key && **key < to).map(|k| Ok((k.clone(), true)));
                let mut merged: Layered<'_> =
                    if forward { Box::new(in_range) } else { Box::new(in_range.rev()) };
                for overlay in &overlays {
                    merged = Box::new(layer(merged, overlay.index_range(tree, &from, &to, forward), forward));
                }
                let got: Vec<Vec<u8>> =
                    merged.map(Result::unwrap).filter(|(_, present)| *present).map(|(k, _)| k).collect();
                let expected: Vec<Vec<u8>> =
                    if forward { want.iter().cloned().collect() } else { want.iter().rev().cloned().collect() };
                prop_assert_eq!(got, expected, "forward: {}", forward);
            }
            // A run writes each tree's final changes in position order.
            for changes in overlays.iter().filter_map(|overlay| overlay.index.get(&tree)) {
                let changes: Vec<(Vec<u8>, bool)> =
                    changes.iter().map(|(position, present)| (position.to_bytes(), present)).collect();
                let mut sorted = changes.clone();
                sorted.sort();
                sorted.dedup_by(|a, b| a.0 == b.0);
                prop_assert_eq!(changes, sorted);
            }
        }

        /// Ordering keys by their heads, then by their bytes, is ordering
        /// them by their bytes: for short keys that pad with zeros, keys
        /// that share 32 bytes and differ after, and everything between.
        #[test]
        fn key_heads_order_like_their_keys(
            keys in proptest::collection::vec(
                proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xFF)], 0..40), 0..24),
        ) {
            let mut by_head = keys.clone();
            by_head.sort_by(|a, b| KeyHead::of(a).cmp(&KeyHead::of(b)).then_with(|| a.cmp(b)));
            let mut by_bytes = keys;
            by_bytes.sort();
            prop_assert_eq!(by_head, by_bytes);
        }

        /// A position falls below any bound, however short, exactly when its
        /// bytes do: what a range's start (inclusive) and end (exclusive) ask.
        #[test]
        fn positions_order_like_their_bytes(
            position in position(),
            bound in bound(),
        ) {
            let position = bytes(&position);
            prop_assert_eq!(Position::from_bytes(&position) < Position::from_bytes(&bound), position < bound);
            prop_assert_eq!(Position::from_bytes(&position).to_bytes(), position);
        }
    }

    #[test]
    fn forget_drops_a_prefix() {
        let (gone, kept) = (TreeId { board: 1, window: 0, period: 0 }, TreeId { board: 2, window: 0, period: 0 });
        let key = |tree: TreeId, name: &str| [&tree.prefix()[..], name.as_bytes()].concat();
        let mut overlay = Overlay::new(2);
        overlay.set_record(key(gone, "a"), None);
        overlay.set_record(key(kept, "b"), Some(Record { score: 1, seq: 1 }));
        overlay.set_index(gone, 7, b"a".to_vec(), true);
        overlay.set_index(kept, 7, b"b".to_vec(), true);
        overlay.forget(&gone.board.to_be_bytes());
        assert_eq!(overlay.record(&key(gone, "a")), None);
        assert_eq!(overlay.record(&key(kept, "b")), Some(Some(Record { score: 1, seq: 1 })));
        assert!(overlay.index_range(gone, b"", b"\xff", true).next().is_none());
        assert_eq!(overlay.index_range(kept, b"", b"\xff", true).count(), 1);
        assert_eq!(overlay.players(), 1);
    }
}
