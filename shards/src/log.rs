//! The change log: one record per committed batch, one entry per score
//! change in it, enough to redo the change after a crash.
//!
//! A batch's only per-write storage is its log record (see [`crate::shard`]
//! for why): the count trees get their changes back from it until the next
//! leaf checkpoint, and the player records and score-index entries until the
//! next run of them is written ([`crate::overlay`]). So an entry carries the
//! whole change: which tree, which player, the record before and after.
//!
//! Entry layout (big-endian): tree prefix (13 bytes), flags (bit 0: an old
//! record follows, bit 1: a new one), old `score ‖ seq` (16, if any), new
//! `score ‖ seq` (16, if any), name length (2), name. ~45 bytes plus the
//! name.
//!
//! Data dirs made before this format ([`LogFormat::TreeKeys`]) logged only
//! the count-tree keys, because every batch also wrote the players and the
//! index; a shard opening one replays it into its trees and checkpoints it
//! away at once (see `Shard::load`).

use crate::error::ShardError;
use crate::key::{TreeId, TREE_PREFIX_LEN};
use crate::record::Record;

/// How a data dir's log entries are laid out (recorded in its meta keyspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Count-tree keys only: the tree prefix, flags, the key leaving and the
    /// key arriving (16 bytes each, zero when absent). Player records and
    /// index entries went to storage with every batch.
    TreeKeys,
    /// Whole changes (see the module docs).
    Changes,
}

impl LogFormat {
    /// The byte recorded for it; data dirs without one are [`LogFormat::TreeKeys`].
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::TreeKeys => 1,
            Self::Changes => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::TreeKeys),
            2 => Some(Self::Changes),
            _ => None,
        }
    }
}

/// One logged score change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change<'a> {
    /// The tree the player's score changed in.
    pub tree: TreeId,
    /// Whose score: with `tree`, the player's storage key.
    pub player: &'a str,
    /// The record before (`None`: a new player), whose tree key and index
    /// entry replay removes. Its `seq` is 0 where a write read it from a
    /// small board's tree (`shard::short_names`): on boards with competition
    /// or dense ties neither key holds the sequence.
    pub old: Option<Record>,
    /// The record after (`None`: removed), whose tree key and index entry
    /// replay adds.
    pub new: Option<Record>,
}

const HAS_OLD: u8 = 1;
const HAS_NEW: u8 = 2;

/// Appends `change` to a log record being built.
pub(crate) fn push(out: &mut Vec<u8>, &Change { tree, player, old, new }: &Change<'_>) {
    out.extend_from_slice(&tree.prefix());
    out.push((u8::from(old.is_some()) * HAS_OLD) | (u8::from(new.is_some()) * HAS_NEW));
    for record in [old, new].into_iter().flatten() {
        out.extend_from_slice(&record.score.to_be_bytes());
        out.extend_from_slice(&record.seq.to_be_bytes());
    }
    // Player names are at most 256 bytes (protocol.md), checked at the door.
    let len = u16::try_from(player.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&player.as_bytes()[..usize::from(len)]);
}

/// The changes of one log record, in the order they were made.
pub(crate) fn changes(mut record: &[u8]) -> impl Iterator<Item = Result<Change<'_>, ShardError>> {
    std::iter::from_fn(move || {
        if record.is_empty() {
            return None;
        }
        let parsed = next_change(record);
        match parsed {
            Ok((change, rest)) => {
                record = rest;
                Some(Ok(change))
            }
            Err(e) => {
                record = &[];
                Some(Err(e))
            }
        }
    })
}

fn next_change(bytes: &[u8]) -> Result<(Change<'_>, &[u8]), ShardError> {
    const CORRUPT: ShardError = ShardError::Corrupt("log entry");
    let tree = TreeId::from_prefix(bytes).ok_or(CORRUPT)?;
    let (&flags, mut rest) = bytes[TREE_PREFIX_LEN..].split_first().ok_or(CORRUPT)?;
    if flags & !(HAS_OLD | HAS_NEW) != 0 {
        return Err(CORRUPT);
    }
    let mut record = |present: bool| -> Result<Option<Record>, ShardError> {
        if !present {
            return Ok(None);
        }
        let (score, after) = rest.split_first_chunk::<8>().ok_or(CORRUPT)?;
        let (seq, after) = after.split_first_chunk::<8>().ok_or(CORRUPT)?;
        rest = after;
        Ok(Some(Record { score: i64::from_be_bytes(*score), seq: u64::from_be_bytes(*seq) }))
    };
    let old = record(flags & HAS_OLD != 0)?;
    let new = record(flags & HAS_NEW != 0)?;
    let (len, after) = rest.split_first_chunk::<2>().ok_or(CORRUPT)?;
    let len = usize::from(u16::from_be_bytes(*len));
    let name = after.get(..len).ok_or(CORRUPT)?;
    let player = std::str::from_utf8(name).map_err(|_| CORRUPT)?;
    Ok((Change { tree, player, old, new }, &after[len..]))
}

/// One entry of a [`LogFormat::TreeKeys`] record: a tree key leaves and/or
/// one arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TreeKeyChange {
    /// The tree whose count tree changed.
    pub tree: TreeId,
    /// The tree key that lost a player, if any.
    pub removed: Option<u128>,
    /// The tree key that gained a player, if any.
    pub added: Option<u128>,
}

/// Length of a [`LogFormat::TreeKeys`] entry.
const TREE_KEYS_ENTRY_LEN: usize = TREE_PREFIX_LEN + 1 + 16 + 16;

/// The entries of a [`LogFormat::TreeKeys`] record.
pub(crate) fn tree_key_changes(record: &[u8]) -> Result<Vec<TreeKeyChange>, ShardError> {
    const CORRUPT: ShardError = ShardError::Corrupt("log entry");
    if record.len() % TREE_KEYS_ENTRY_LEN != 0 {
        return Err(ShardError::Corrupt("log record"));
    }
    record
        .chunks_exact(TREE_KEYS_ENTRY_LEN)
        .map(|entry| {
            let tree = TreeId::from_prefix(entry).ok_or(CORRUPT)?;
            let flags = entry[TREE_PREFIX_LEN];
            let key = |at: usize| -> Result<u128, ShardError> {
                let bytes: [u8; 16] = entry.get(at..at + 16).and_then(|b| b.try_into().ok()).ok_or(CORRUPT)?;
                Ok(u128::from_be_bytes(bytes))
            };
            Ok(TreeKeyChange {
                tree,
                removed: (flags & HAS_OLD != 0).then(|| key(TREE_PREFIX_LEN + 1)).transpose()?,
                added: (flags & HAS_NEW != 0).then(|| key(TREE_PREFIX_LEN + 17)).transpose()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Option<Record>> {
        proptest::option::of((any::<i64>(), any::<u64>()).prop_map(|(score, seq)| Record { score, seq }))
    }

    proptest! {
        /// Whatever a batch logs comes back, in order.
        #[test]
        fn changes_round_trip(
            entries in proptest::collection::vec(
                (any::<u64>(), any::<u8>(), any::<u32>(), "\\PC{1,40}", record(), record()),
                0..20,
            ),
        ) {
            let mut out = Vec::new();
            for (board, window, period, player, old, new) in &entries {
                let tree = TreeId { board: *board, window: *window, period: *period };
                push(&mut out, &Change { tree, player, old: *old, new: *new });
            }
            let back: Vec<Change<'_>> = changes(&out).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(back.len(), entries.len());
            for (got, (board, window, period, player, old, new)) in back.iter().zip(&entries) {
                prop_assert_eq!(got.tree, TreeId { board: *board, window: *window, period: *period });
                prop_assert_eq!(got.player, player.as_str());
                prop_assert_eq!((got.old, got.new), (*old, *new));
            }
        }

        /// Damaged records are refused, never misread past their end.
        #[test]
        fn truncated_records_are_corrupt(player in "\\PC{1,40}", cut in 1usize..60) {
            let mut out = Vec::new();
            let some = Some(Record { score: -5, seq: 9 });
            push(&mut out, &Change { tree: TreeId { board: 1, window: 0, period: 0 }, player: &player, old: some, new: some });
            let cut = cut.min(out.len());
            let truncated = &out[..out.len() - cut];
            if !truncated.is_empty() {
                prop_assert!(changes(truncated).any(|c| c.is_err()));
            }
        }
    }

    #[test]
    fn unknown_flags_are_corrupt() {
        let mut out = Vec::new();
        push(&mut out, &Change { tree: TreeId { board: 1, window: 0, period: 0 }, player: "p", old: None, new: None });
        out[TREE_PREFIX_LEN] = 4;
        assert!(matches!(changes(&out).next(), Some(Err(ShardError::Corrupt(_)))));
        assert!(tree_key_changes(&[0; 3]).is_err());
    }
}
