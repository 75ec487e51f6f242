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
//! (straight to table files: no journal, no memtable). At 1M players a
//! build that merely skipped the per-write inserts ran `set` at 196-201k
//! ops/s against 80-92k: the ceiling this design aims at (runs and their
//! compaction take some of it back).
//!
//! An overlay holds one final value per key: the newest record of a player
//! (`None`: removed) and whether an index entry exists. Writing a run is
//! therefore idempotent, which is what makes recovery simple: a run that
//! may or may not have reached storage before a crash is rebuilt from the
//! log and written again.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use fjall::Keyspace;

use crate::error::ShardError;
use crate::key::TreeId;
use crate::shard::Record;
use crate::FastHasher;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    /// Player records by storage key (tree prefix and name).
    players: HashMap<Vec<u8>, Option<Record>, FastHasher>,
    /// Score-index entries per tree, by list position (the key after the
    /// tree prefix): `true` present, `false` removed. Ordered, because list
    /// reads merge it with storage's index in key order.
    index: BTreeMap<TreeId, BTreeMap<Position, bool>>,
}

/// A list position as the overlay orders it: the score key inline, then the
/// rest of the position's bytes. Orders exactly as the bytes do (the score
/// key is their big-endian first 8 bytes), but a comparison is nearly
/// always one integer compare inside the map's node. Keyed by whole byte
/// positions, inserting into the map was ~23% of the shard thread under
/// `set` (a pointer chase and a `memcmp` per key compared, over 13 bytes
/// of tree prefix every key shared).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    score_key: u64,
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
        self.index.entry(tree).or_default().insert(position, present);
    }

    /// Index entries of `tree` with positions from `from` (inclusive) to
    /// `to` (exclusive), in position order, as position bytes.
    pub(crate) fn index_range<'a>(
        &'a self,
        tree: TreeId,
        from: &[u8],
        to: &[u8],
    ) -> impl DoubleEndedIterator<Item = (Vec<u8>, bool)> + 'a {
        let bounds = (Bound::Included(Position::from_bytes(from)), Bound::Excluded(Position::from_bytes(to)));
        self.index.get(&tree).into_iter().flat_map(move |entries| {
            entries.range(bounds.clone()).map(|(position, present)| (position.to_bytes(), *present))
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
            let mut sorted: Vec<(&Vec<u8>, &Option<Record>)> = self.players.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let mut run = players.start_ingestion()?;
            for (key, record) in sorted {
                match record {
                    Some(r) => run.write(key.as_slice(), r.encode())?,
                    None => run.write_tombstone(key.as_slice())?,
                }
            }
            run.finish()?;
        }
        if !self.index.is_empty() {
            // Trees in order, and positions in order within each: tree
            // prefixes are fixed-length, so the keys ascend.
            let mut run = index.start_ingestion()?;
            for (tree, entries) in &self.index {
                for (position, present) in entries {
                    let key = [&tree.prefix()[..], &position.score_key.to_be_bytes(), &position.rest].concat();
                    if *present {
                        run.write(key, [])?;
                    } else {
                        run.write_tombstone(key)?;
                    }
                }
            }
            run.finish()?;
        }
        Ok(())
    }
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
    let mut older = older.peekable();
    let mut newer = newer.peekable();
    std::iter::from_fn(move || {
        let order = match (older.peek(), newer.peek()) {
            (None, None) => return None,
            (Some(Err(_)), _) => return older.next(),
            (Some(Ok(_)), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(Ok((o, _))), Some((n, _))) if forward => o.cmp(n),
            (Some(Ok((o, _))), Some((n, _))) => n.cmp(o),
        };
        match order {
            std::cmp::Ordering::Less => older.next(),
            std::cmp::Ordering::Equal => {
                older.next();
                newer.next().map(Ok)
            }
            std::cmp::Ordering::Greater => newer.next().map(Ok),
        }
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

    fn bytes((score_key, tail): &(u64, Vec<u8>)) -> Vec<u8> {
        [&score_key.to_be_bytes()[..], tail].concat()
    }

    proptest! {
        /// Layering overlays on storage equals applying them in order to
        /// storage's key set, both ways.
        #[test]
        fn layers_apply_overlays_in_order(
            stored in proptest::collection::btree_set(position(), 0..12),
            older in proptest::collection::btree_map(position(), any::<bool>(), 0..12),
            newer in proptest::collection::btree_map(position(), any::<bool>(), 0..12),
        ) {
            let stored: BTreeSet<Vec<u8>> = stored.iter().map(bytes).collect();
            let mut want = stored.clone();
            for (position, present) in older.iter().chain(&newer) {
                if *present { want.insert(bytes(position)); } else { want.remove(&bytes(position)); }
            }
            let tree = TreeId { board: 1, window: 0, period: 0 };
            let overlays: Vec<Overlay> = [&older, &newer].iter().map(|changes| {
                let mut overlay = Overlay::default();
                for ((score_key, tail), present) in changes.iter() {
                    overlay.set_index(tree, *score_key, tail.clone(), *present);
                    // Another tree's entries never show.
                    overlay.set_index(TreeId { board: 2, ..tree }, *score_key, tail.clone(), true);
                }
                overlay
            }).collect();
            let (from, to) = (vec![], vec![0xFF; 9]);
            for forward in [true, false] {
                let mut merged: Layered<'_> = if forward {
                    Box::new(stored.iter().map(|k| Ok((k.clone(), true))))
                } else {
                    Box::new(stored.iter().rev().map(|k| Ok((k.clone(), true))))
                };
                for overlay in &overlays {
                    let entries = overlay.index_range(tree, &from, &to);
                    merged = if forward {
                        Box::new(layer(merged, entries, true))
                    } else {
                        Box::new(layer(merged, entries.rev(), false))
                    };
                }
                let got: Vec<Vec<u8>> =
                    merged.map(Result::unwrap).filter(|(_, present)| *present).map(|(k, _)| k).collect();
                let expected: Vec<Vec<u8>> =
                    if forward { want.iter().cloned().collect() } else { want.iter().rev().cloned().collect() };
                prop_assert_eq!(got, expected, "forward: {}", forward);
            }
        }

        /// A position falls below any bound, however short, exactly when its
        /// bytes do: what a range's start (inclusive) and end (exclusive) ask.
        #[test]
        fn positions_order_like_their_bytes(
            position in position(),
            bound in proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(0xFF)], 0..11),
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
        let mut overlay = Overlay::default();
        overlay.set_record(key(gone, "a"), None);
        overlay.set_record(key(kept, "b"), Some(Record { score: 1, seq: 1 }));
        overlay.set_index(gone, 7, b"a".to_vec(), true);
        overlay.set_index(kept, 7, b"b".to_vec(), true);
        overlay.forget(&gone.board.to_be_bytes());
        assert_eq!(overlay.record(&key(gone, "a")), None);
        assert_eq!(overlay.record(&key(kept, "b")), Some(Some(Record { score: 1, seq: 1 })));
        assert!(overlay.index_range(gone, b"", b"\xff").next().is_none());
        assert_eq!(overlay.index_range(kept, b"", b"\xff").count(), 1);
        assert_eq!(overlay.players(), 1);
    }
}
