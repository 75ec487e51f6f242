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
//! (straight to table files: no journal, no memtable). In a profile-free
//! A/B at 1M players, dropping the per-write inserts took `set` from
//! 80-92k to 196-201k ops/s.
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
    /// reads merge it with storage's index in key order; by tree, so a
    /// comparison starts at the score rather than at 13 bytes every key of
    /// a tree shares (in a `set` profile, comparing whole keys was ~10% of
    /// the shard thread).
    index: BTreeMap<TreeId, BTreeMap<Vec<u8>, bool>>,
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

    /// Records that the index entry of `tree` at `position` now exists or not.
    pub(crate) fn set_index(&mut self, tree: TreeId, position: Vec<u8>, present: bool) {
        self.index.entry(tree).or_default().insert(position, present);
    }

    /// Index entries of `tree` with positions from `from` (inclusive) to
    /// `to` (exclusive), in position order.
    pub(crate) fn index_range<'a>(
        &'a self,
        tree: TreeId,
        from: &'a [u8],
        to: &'a [u8],
    ) -> impl DoubleEndedIterator<Item = (&'a [u8], bool)> + 'a {
        self.index.get(&tree).into_iter().flat_map(move |entries| {
            entries
                .range::<[u8], _>((Bound::Included(from), Bound::Excluded(to)))
                .map(|(position, present)| (position.as_slice(), *present))
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
                    let mut key = Vec::with_capacity(crate::key::TREE_PREFIX_LEN + position.len());
                    key.extend_from_slice(&tree.prefix());
                    key.extend_from_slice(position);
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
pub(crate) fn merge_index<'a, S, O>(
    stored: S,
    overlay: O,
    forward: bool,
) -> impl Iterator<Item = Result<Vec<u8>, ShardError>>
where
    S: Iterator<Item = Result<Vec<u8>, ShardError>>,
    O: Iterator<Item = (&'a [u8], bool)>,
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
            (Some(s), Some((o, _))) if forward => s.cmp(o),
            (Some(s), Some((o, _))) => o.cmp(&s),
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
                return Some(Ok(key.to_vec()));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// The merge equals applying the overlay to storage's key set, both ways.
        #[test]
        fn merge_applies_the_overlay(
            stored in proptest::collection::btree_set(proptest::collection::vec(0u8..4, 0..3), 0..12),
            changes in proptest::collection::btree_map(proptest::collection::vec(0u8..4, 0..3), any::<bool>(), 0..12),
        ) {
            let mut want: BTreeSet<Vec<u8>> = stored.clone();
            for (key, present) in &changes {
                if *present { want.insert(key.clone()); } else { want.remove(key); }
            }
            let mut overlay = Overlay::default();
            let tree = TreeId { board: 1, window: 0, period: 0 };
            for (key, present) in &changes {
                overlay.set_index(tree, key.clone(), *present);
                // Another tree's entries never show.
                overlay.set_index(TreeId { board: 2, ..tree }, key.clone(), true);
            }
            let (from, to) = (vec![], vec![0xFF]);
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
    }

    #[test]
    fn forget_drops_a_prefix() {
        let (gone, kept) = (TreeId { board: 1, window: 0, period: 0 }, TreeId { board: 2, window: 0, period: 0 });
        let key = |tree: TreeId, name: &str| [&tree.prefix()[..], name.as_bytes()].concat();
        let mut overlay = Overlay::default();
        overlay.set_record(key(gone, "a"), None);
        overlay.set_record(key(kept, "b"), Some(Record { score: 1, seq: 1 }));
        overlay.set_index(gone, b"a".to_vec(), true);
        overlay.set_index(kept, b"b".to_vec(), true);
        overlay.forget(&gone.board.to_be_bytes());
        assert_eq!(overlay.record(&key(gone, "a")), None);
        assert_eq!(overlay.record(&key(kept, "b")), Some(Some(Record { score: 1, seq: 1 })));
        assert!(overlay.index_range(gone, b"", b"\xff").next().is_none());
        assert_eq!(overlay.index_range(kept, b"", b"\xff").count(), 1);
        assert_eq!(overlay.players(), 1);
    }
}
