//! A frozen leaf's entries as bytes: what a small board's idle tree is in
//! memory.
//!
//! An [`Entry`] is 20 bytes, and a board of five players on two shards
//! holds two or three of them a shard: a 48- or 64-byte allocation each.
//! Most of those bytes are zero. A score is small next to 2^63, the next
//! score of a leaf is near it, and a tiebreak is a short name's first bytes
//! (zero-padded) or an arrival sequence (a small number). Trimmed of their
//! zero bytes, the entries of a leaf of five players take about 35 bytes,
//! and a leaf of two fits in the board's own entry (see `frozen`).
//!
//! Per entry: a head byte, then the score bytes, the tiebreak bytes and, if
//! the head says so, the count as a varint. The head is
//! `score bytes × 18 + tiebreak bytes × 2 + (count ≠ 1)`. The score is the
//! key's high half as the difference from the entry before (keys are
//! sorted), the first as the zigzag of its distance from the middle of the
//! key space (where the score key of 0 is), big-endian, leading zero bytes
//! dropped. The tiebreak is the low half without its trailing zero bytes (a
//! name) or its leading ones (a number): the leaf's [`Trim`], whichever is
//! shorter for it.

use arrayvec::ArrayVec;

use super::node::Entry;
use super::LEAF_CAPACITY;

/// Which zero bytes of the tiebreaks a packed leaf drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trim {
    /// Trailing ones: tiebreaks are names' first bytes.
    Trailing,
    /// Leading ones: tiebreaks are numbers (arrival sequences).
    Leading,
}

/// The entries of a frozen leaf, decoded: a read's copy, on the stack.
pub(super) type Unpacked = ArrayVec<Entry, LEAF_CAPACITY>;

/// The middle of the key space: the score key of a score of 0.
const MIDDLE: u64 = 1 << 63;

/// `entries` (sorted, at most [`LEAF_CAPACITY`]) packed, and the trim
/// they were packed with.
pub(super) fn pack(entries: &[Entry]) -> (Trim, Vec<u8>) {
    let tiebreak_bytes = |trim| entries.iter().map(|e| tiebreak_len(e.key_low, trim)).sum::<usize>();
    let trim =
        if tiebreak_bytes(Trim::Leading) < tiebreak_bytes(Trim::Trailing) { Trim::Leading } else { Trim::Trailing };
    let mut out = Vec::with_capacity(entries.len() * 8);
    let mut previous = None;
    for entry in entries {
        let (high, low, count) = (entry.key_high, entry.key_low, entry.count());
        let score = match previous {
            None => zigzag(high ^ MIDDLE),
            Some(previous) => high - previous,
        };
        previous = Some(high);
        let (score_len, low_len) = (significant_len(score), tiebreak_len(low, trim));
        out.push((score_len * 18 + low_len * 2 + usize::from(count != 1)) as u8);
        out.extend_from_slice(&score.to_be_bytes()[8 - score_len..]);
        match trim {
            Trim::Trailing => out.extend_from_slice(&low.to_be_bytes()[..low_len]),
            Trim::Leading => out.extend_from_slice(&low.to_be_bytes()[8 - low_len..]),
        }
        if count != 1 {
            put_varint(&mut out, count);
        }
    }
    (trim, out)
}

/// The entries `bytes` (from [`pack`] with `trim`) hold.
pub(super) fn unpack(bytes: &[u8], trim: Trim) -> Unpacked {
    let mut entries = Unpacked::new();
    let (mut at, mut previous) = (0, None);
    while at < bytes.len() {
        let head = usize::from(bytes[at]);
        let (score_len, low_len, counted) = (head / 18, head % 18 / 2, head % 2 == 1);
        at += 1;
        let score = be_u64(&bytes[at..at + score_len]);
        at += score_len;
        let low = be_u64(&bytes[at..at + low_len]);
        at += low_len;
        let low = match trim {
            Trim::Trailing if low_len > 0 => low << (8 * (8 - low_len)),
            _ => low,
        };
        let count = if counted { take_varint(bytes, &mut at) } else { 1 };
        let high = match previous {
            None => unzigzag(score) ^ MIDDLE,
            Some(previous) => previous + score,
        };
        previous = Some(high);
        entries.push(Entry::new((u128::from(high) << 64) | u128::from(low), count));
    }
    entries
}

/// Bytes of `value` from its first non-zero one.
fn significant_len(value: u64) -> usize {
    8 - value.leading_zeros() as usize / 8
}

/// Bytes of a tiebreak kept under `trim`.
fn tiebreak_len(low: u64, trim: Trim) -> usize {
    match trim {
        Trim::Leading => significant_len(low),
        Trim::Trailing => 8 - low.trailing_zeros() as usize / 8,
    }
}

/// Maps a distance either side of the middle to a small number either way.
fn zigzag(offset: u64) -> u64 {
    let signed = offset as i64;
    ((signed << 1) ^ (signed >> 63)) as u64
}

fn unzigzag(value: u64) -> u64 {
    ((value >> 1) as i64 ^ -((value & 1) as i64)) as u64
}

/// Up to eight big-endian bytes as a number.
fn be_u64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |value, &b| (value << 8) | u64::from(b))
}

/// LEB128: seven bits a byte, low bits first.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Order, Ties};
    use crate::key::{score_key, tiebreak, tree_key};
    use proptest::prelude::*;

    fn entries_of(mut keys: Vec<(u128, u64)>) -> Vec<Entry> {
        keys.sort_unstable();
        keys.dedup_by_key(|(key, _)| *key);
        keys.into_iter().map(|(key, count)| Entry::new(key, count)).collect()
    }

    proptest! {
        /// Any sorted leaf packs and unpacks to itself, whatever its keys
        /// and counts.
        #[test]
        fn a_packed_leaf_unpacks_to_itself(
            keys in proptest::collection::vec((any::<u128>(), 1u64..=u64::from(u32::MAX)), 0..=LEAF_CAPACITY),
            near in any::<bool>(),
        ) {
            // Half the cases draw keys near one another, as scores are.
            let keys = keys.into_iter().map(|(k, c)| (if near { k >> 70 << 64 | k & 0xffff } else { k }, c)).collect();
            let entries = entries_of(keys);
            let (trim, bytes) = pack(&entries);
            let unpacked = unpack(&bytes, trim);
            prop_assert_eq!(unpacked.as_slice(), entries.as_slice());
        }
    }

    /// The keys boards have take a few bytes: a five-player board's leaf of
    /// two names (scores below 10^9) fits in 14 bytes, and arrival
    /// sequences are trimmed from the front.
    #[test]
    fn scores_and_short_names_pack_small() {
        let named = |players: &[(&str, i64)], order| {
            entries_of(
                players
                    .iter()
                    .map(|(p, s)| (tree_key(score_key(*s, order), tiebreak(Ties::Competition, p, 0)), 1))
                    .collect(),
            )
        };
        for order in [Order::Desc, Order::Asc] {
            let two = named(&[("p3", 999_999_999), ("p0", 5)], order);
            let (trim, bytes) = pack(&two);
            assert_eq!(trim, Trim::Trailing);
            assert!(bytes.len() <= 14, "{order:?}: {} bytes", bytes.len());
            assert_eq!(unpack(&bytes, trim).as_slice(), two.as_slice());
        }
        let negative = named(&[("alice", -3), ("bob", -3), ("carol", i64::MIN), ("dave", i64::MAX)], Order::Desc);
        let (trim, bytes) = pack(&negative);
        assert_eq!(unpack(&bytes, trim).as_slice(), negative.as_slice());

        let ordinal: Vec<Entry> =
            entries_of((0..5u64).map(|i| (tree_key(score_key(100, Order::Desc), 4_000_000 + i), 1)).collect());
        let (trim, bytes) = pack(&ordinal);
        // Equal scores take no score bytes after the first.
        assert_eq!((trim, bytes.len()), (Trim::Leading, 5 + 4 * 4));
        assert_eq!(unpack(&bytes, trim).as_slice(), ordinal.as_slice());
    }
}
