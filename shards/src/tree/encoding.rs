//! How a leaf is stored: its encodings, and decoding that rejects any leaf
//! the tree could not have written.

use super::node::{Entry, Leaf};

/// How leaves are stored. A data dir keeps the encoding it was made with
/// (the shard records it), like its branching factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafEncoding {
    /// 24 bytes an entry: the key and the count, big-endian. Data dirs made
    /// before the delta encoding.
    Fixed,
    /// Varints, an entry at a time: the key's high half (the score) as the
    /// difference from the previous entry's, the low half (the tiebreak),
    /// the count. Neighbouring keys' scores are close, so a checkpoint writes
    /// (and holds in memtables until flushed) and a start reads less than
    /// half of what `Fixed` takes.
    Delta,
}

impl LeafEncoding {
    /// The byte a shard records for it.
    pub fn code(self) -> u8 {
        match self {
            Self::Fixed => 1,
            Self::Delta => 2,
        }
    }

    /// The encoding a recorded byte names.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Fixed),
            2 => Some(Self::Delta),
            _ => None,
        }
    }
}

/// A stored leaf that cannot be decoded: the data dir is damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt count-tree leaf: {0}")]
pub struct CorruptLeaf(pub &'static str);

pub(super) fn encode_entries(entries: &[Entry], encoding: LeafEncoding) -> Vec<u8> {
    match encoding {
        LeafEncoding::Fixed => {
            let mut out = Vec::with_capacity(entries.len() * 24);
            for entry in entries {
                out.extend_from_slice(&entry.key().to_be_bytes());
                out.extend_from_slice(&entry.count().to_be_bytes());
            }
            out
        }
        LeafEncoding::Delta => {
            let mut out = Vec::with_capacity(entries.len() * 12);
            let mut previous_high = 0u64;
            for entry in entries {
                let (high, low) = (entry.key_high, entry.key_low);
                // Sorted keys: the high halves never decrease.
                put_varint(&mut out, high - previous_high);
                put_varint(&mut out, low);
                put_varint(&mut out, entry.count());
                previous_high = high;
            }
            out
        }
    }
}

/// LEB128: seven bits a byte, low bits first.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a varint at `*at`, moving past it; `None` if it is cut short or
/// does not fit in 64 bits.
fn take_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

pub(super) fn decode_leaf(bytes: &[u8], encoding: LeafEncoding) -> Result<Leaf, CorruptLeaf> {
    match encoding {
        LeafEncoding::Fixed => decode_fixed_leaf(bytes),
        LeafEncoding::Delta => decode_delta_leaf(bytes),
    }
}

fn decode_delta_leaf(bytes: &[u8]) -> Result<Leaf, CorruptLeaf> {
    // Every varint ends in a byte below 0x80 and an entry is three of them:
    // the leaf is allocated at its final size, like a fixed one.
    let mut entries: Vec<Entry> = Vec::with_capacity(bytes.iter().filter(|b| **b < 0x80).count() / 3);
    let (mut at, mut previous_high) = (0, 0u64);
    while at < bytes.len() {
        let mut next = || take_varint(bytes, &mut at).ok_or(CorruptLeaf("varint cut short or too long"));
        let (delta, low, count) = (next()?, next()?, next()?);
        let high = previous_high.checked_add(delta).ok_or(CorruptLeaf("key past the key space"))?;
        push_decoded(&mut entries, (u128::from(high) << 64) | u128::from(low), count)?;
        previous_high = high;
    }
    Ok(Leaf { entries: entries.into(), ..Leaf::default() })
}

fn decode_fixed_leaf(bytes: &[u8]) -> Result<Leaf, CorruptLeaf> {
    if bytes.len() % 24 != 0 {
        return Err(CorruptLeaf("length not a multiple of 24"));
    }
    let mut entries = Vec::with_capacity(bytes.len() / 24);
    for chunk in bytes.chunks_exact(24) {
        let (key, count) = chunk.split_at(16);
        let key = u128::from_be_bytes(key.try_into().map_err(|_| CorruptLeaf("key"))?);
        let count = u64::from_be_bytes(count.try_into().map_err(|_| CorruptLeaf("count"))?);
        push_decoded(&mut entries, key, count)?;
    }
    Ok(Leaf { entries: entries.into(), ..Leaf::default() })
}

/// Appends a decoded entry, in either encoding, if the leaf stays one the
/// tree could have written: keys ascending, counts from 1 to `u32::MAX`.
fn push_decoded(entries: &mut Vec<Entry>, key: u128, count: u64) -> Result<(), CorruptLeaf> {
    if count == 0 || count > u64::from(u32::MAX) || entries.last().is_some_and(|e| e.key() >= key) {
        return Err(CorruptLeaf("entries unsorted, empty or over-full"));
    }
    entries.push(Entry::new(key, count));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Varints round-trip every u64, and the delta encoding takes less
        /// than half the fixed one's bytes for keys spread like scores.
        #[test]
        fn varints_round_trip(values in proptest::collection::vec(any::<u64>(), 0..50)) {
            let mut out = Vec::new();
            values.iter().for_each(|v| put_varint(&mut out, *v));
            let mut at = 0;
            for v in &values {
                prop_assert_eq!(take_varint(&out, &mut at), Some(*v));
            }
            prop_assert_eq!(at, out.len());
        }
    }

    #[test]
    fn delta_leaves_are_less_than_half_as_big() {
        // 40 players in one leaf of a 10M-player tree: scores within 2^44 of
        // each other, arrival sequences up to 10M.
        let mut keys: Vec<u128> =
            (0..40u128).map(|i| (0x1234_5000_0000_0000 + i * 0x1_0000_0000) << 64 | (i * 250_000)).collect();
        keys.sort_unstable();
        let leaf = Leaf { entries: keys.iter().map(|k| Entry::new(*k, 1)).collect(), ..Leaf::default() };
        let (fixed, delta) =
            (encode_entries(&leaf.entries, LeafEncoding::Fixed), encode_entries(&leaf.entries, LeafEncoding::Delta));
        assert_eq!(fixed.len(), 40 * 24);
        assert!(delta.len() * 2 < fixed.len(), "{} bytes", delta.len());
        assert_eq!(decode_leaf(&delta, LeafEncoding::Delta).unwrap(), leaf);
    }
}
