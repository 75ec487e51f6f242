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

/// Merges positions read from storage's index with the overlay's entries
/// over the same range and in the same direction: the overlay wins on equal
/// positions, and those it marks removed are left out. Both inputs must be
/// sorted the way the merge walks (ascending when `forward`, else descending).
pub(crate) fn merge_index<S, O>(
    stored: S,
    overlay: O,
    forward: bool,
) -> impl Iterator<Item = Result<Vec<u8>, ShardError>>
where
    S: Iterator<Item = Result<Vec<u8>, ShardError>>,
    O: Iterator<Item = (Vec<u8>, bool)>,
{
    let mut stored = stored.peekable();
    let mut overlay = overlay.peekable();
    std::iter::from_fn(move || loop {
        let from_storage = match stored.peek() {
            None => None,
            Some(Err(_)) => return stored.next(),
            Some(Ok(key)) => Some(key.as_slice()),
        };
        let order = match (from_storage, overlay.peek()) {
            (None, None) => return None,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(s), Some((o, _))) if forward => s.cmp(o.as_slice()),
            (Some(s), Some((o, _))) => o.as_slice().cmp(s),
        };
        match order {
            std::cmp::Ordering::Less => return stored.next(),
            std::cmp::Ordering::Equal => {
                stored.next();
            }
            std::cmp::Ordering::Greater => {}
        }
        if let Some((key, present)) = overlay.next() {
            if present {
                return Some(Ok(key));
            }
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
        /// The merge equals applying the overlay to storage's key set, both ways.
        #[test]
        fn merge_applies_the_overlay(
            stored in proptest::collection::btree_set(position(), 0..12),
            changes in proptest::collection::btree_map(position(), any::<bool>(), 0..12),
        ) {
            let stored: BTreeSet<Vec<u8>> = stored.iter().map(bytes).collect();
            let mut want = stored.clone();
            for (position, present) in &changes {
                if *present { want.insert(bytes(position)); } else { want.remove(&bytes(position)); }
            }
            let mut overlay = Overlay::default();
            let tree = TreeId { board: 1, window: 0, period: 0 };
            for ((score_key, tail), present) in &changes {
                overlay.set_index(tree, *score_key, tail.clone(), *present);
                // Another tree's entries never show.
                overlay.set_index(TreeId { board: 2, ..tree }, *score_key, tail.clone(), true);
            }
            let (from, to) = (vec![], vec![0xFF; 9]);
            let stored_keys = || stored.iter().map(|k| Ok(k.clone()));
            let forward: Vec<Vec<u8>> = merge_index(stored_keys(), overlay.index_range(tree, &from, &to), true)
                .collect::<Result<_, _>>()
                .unwrap();
            prop_assert_eq!(&forward, &want.iter().cloned().collect::<Vec<_>>());
            let backward: Vec<Vec<u8>> =
                merge_index(stored_keys().rev(), overlay.index_range(tree, &from, &to).rev(), false)
                    .collect::<Result<_, _>>()
                    .unwrap();
            prop_assert_eq!(backward, want.iter().rev().cloned().collect::<Vec<_>>());
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
