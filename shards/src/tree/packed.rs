//! A frozen leaf's entries as bytes: what a small board's idle tree is in
//! memory.
//!
//! An [`Entry`] is 20 bytes, and a board of five players on two shards
//! holds two or three of them a shard: a 48- or 64-byte allocation each.
//! Most of those bytes are zero. A score is small next to 2^63, the scores
//! of a leaf are near one another, a tiebreak is a short name's first
//! bytes (zero-padded) or an arrival sequence (a small number), and a count
//! is nearly always 1. Trimmed of their zero bytes, a leaf of five players
//! takes about 32 bytes, and a leaf of two fits in the board's own entry
//! (see `frozen`).
//!
//! Every entry of a leaf takes the same bytes, so a rank is a binary search
//! of the packed bytes, unpacked nowhere. The layout: a byte of widths
//! `offset × 9 + tiebreak`, a byte `base × 5 + count`; the base (the first
//! entry's score key as the zigzag of its distance from the middle of the
//! key space, where a score of 0 is); the first entry's tiebreak and count;
//! then each further entry's offset (its score key less the base), tiebreak
//! and count. All big-endian and cut to their widths: the fewest bytes
//! that hold the leaf's largest. A tiebreak drops its trailing zero bytes
//! (a name) or its leading ones (a number): the leaf's [`Trim`], whichever
//! is shorter for it. A count width of 0 means every count is 1.

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

/// The most bytes a leaf packs into: two bytes of widths, the base, and per
/// entry an offset, a tiebreak and a count below 2^32.
const MAX_PACKED: usize = 2 + 8 + LEAF_CAPACITY * (8 + 8 + 4);

/// A leaf packed, on the stack: a frozen tree copies out what it keeps.
/// Each field is written as eight bytes and the length moves on by its
/// width (a slack of eight past the most a leaf takes): one store a field,
/// where appending byte by byte made a 64-entry freeze three times slower.
pub(super) struct Packed {
    buf: [u8; MAX_PACKED + 8],
    len: usize,
}

impl Packed {
    pub(super) fn new() -> Self {
        Self { buf: [0; MAX_PACKED + 8], len: 0 }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Appends the last `len` (at most eight) bytes of `value`, big-endian.
    #[inline]
    fn put(&mut self, value: u64, len: usize) {
        let first = value.checked_shl(64 - 8 * len as u32).unwrap_or(0);
        self.buf[self.len..self.len + 8].copy_from_slice(&first.to_be_bytes());
        self.len += len;
    }
}

/// The middle of the key space: the score key of a score of 0.
const MIDDLE: u64 = 1 << 63;

/// Packs `entries` (sorted, at most [`LEAF_CAPACITY`]) into `out` (empty;
/// it stays so if `entries` is); returns the trim they were packed with.
pub(super) fn pack(entries: &[Entry], out: &mut Packed) -> Trim {
    let Some(first) = entries.first() else { return Trim::Trailing };
    // The widest of each field: the width of all of them or-ed together.
    let (mut offsets, mut lows, mut counts) = (0u64, 0u64, 0u64);
    for e in entries {
        offsets |= e.key_high - first.key_high;
        lows |= e.key_low;
        counts |= e.count();
    }
    let (offset, leading, trailing) =
        (significant_len(offsets), tiebreak_len(lows, Trim::Leading), tiebreak_len(lows, Trim::Trailing));
    // Counts take no bytes while every one is 1 (none is 0).
    let count = if counts == 1 { 0 } else { significant_len(counts) };
    let (trim, tiebreak) = if leading < trailing { (Trim::Leading, leading) } else { (Trim::Trailing, trailing) };
    let base = zigzag(first.key_high ^ MIDDLE);
    let base_len = significant_len(base);
    out.put(((offset * 9 + tiebreak) << 8 | (base_len * 5 + count)) as u64, 2);
    out.put(base, base_len);
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.put(entry.key_high - first.key_high, offset);
        }
        let low = match trim {
            Trim::Trailing if tiebreak > 0 => entry.key_low >> (8 * (8 - tiebreak)),
            _ => entry.key_low,
        };
        out.put(low, tiebreak);
        out.put(entry.count(), count);
    }
    trim
}

/// A packed leaf, read in place.
#[derive(Debug, Clone, Copy)]
pub(super) struct PackedLeaf<'a> {
    bytes: &'a [u8],
    trim: Trim,
    /// Widths of an offset, a tiebreak and a count.
    widths: [usize; 3],
    /// The first entry's score key.
    first_high: u64,
    /// Where the first entry's tiebreak starts.
    start: usize,
    len: usize,
}

impl<'a> PackedLeaf<'a> {
    /// The leaf `bytes` (from [`pack`] with `trim`) hold.
    #[inline]
    pub(super) fn new(bytes: &'a [u8], trim: Trim) -> Self {
        let [sizes, bases, ..] = *bytes else {
            // No entries (a tree whose players all left).
            return Self { bytes, trim, widths: [0; 3], first_high: 0, start: 0, len: 0 };
        };
        let (sizes, bases) = (usize::from(sizes), usize::from(bases));
        let widths = [sizes / 9, sizes % 9, bases % 5];
        let base_len = bases / 5;
        let first_high = unzigzag(be_u64(bytes, 2, base_len)) ^ MIDDLE;
        let start = 2 + base_len;
        let stride = widths.iter().sum::<usize>();
        let rest = bytes.len() - start - widths[1] - widths[2];
        let len = 1 + rest.checked_div(stride).unwrap_or(0);
        Self { bytes, trim, widths, first_high, start, len }
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Where entry `i`'s tiebreak starts: its offset (if it has one) is
    /// right before, its count right after.
    #[inline]
    fn tiebreak_at(&self, i: usize) -> usize {
        let [offset, tiebreak, count] = self.widths;
        match i {
            0 => self.start,
            i => self.start + tiebreak + count + (i - 1) * (offset + tiebreak + count) + offset,
        }
    }

    /// Entry `i`'s key.
    #[inline]
    pub(super) fn key(&self, i: usize) -> u128 {
        let [offset, tiebreak, _] = self.widths;
        let at = self.tiebreak_at(i);
        let high = match i {
            0 => self.first_high,
            _ => self.first_high + be_u64(self.bytes, at - offset, offset),
        };
        let low = self.tiebreak(be_u64(self.bytes, at, tiebreak));
        (u128::from(high) << 64) | u128::from(low)
    }

    /// A tiebreak as stored, back in its place in the key's low half.
    #[inline]
    fn tiebreak(&self, stored: u64) -> u64 {
        match self.trim {
            Trim::Trailing if self.widths[1] > 0 => stored << (8 * (8 - self.widths[1])),
            _ => stored,
        }
    }

    /// Entry `i`'s count.
    #[inline]
    pub(super) fn count(&self, i: usize) -> u64 {
        let [_, tiebreak, count] = self.widths;
        match count {
            0 => 1,
            _ => be_u64(self.bytes, self.tiebreak_at(i) + tiebreak, count),
        }
    }

    /// Players on all entries.
    pub(super) fn total(&self) -> u64 {
        match self.widths[2] {
            0 => self.len as u64,
            _ => (0..self.len).map(|i| self.count(i)).sum(),
        }
    }

    /// Players on entries with a key below `key`: a binary search of the
    /// keys, and the counts before it summed unless they are all 1.
    pub(super) fn count_before(&self, key: u128) -> u64 {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let middle = (low + high) / 2;
            if self.key(middle) < key {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        match self.widths[2] {
            0 => low as u64,
            _ => (0..low).map(|i| self.count(i)).sum(),
        }
    }

    /// Unpacks the entries into `entries` (empty): the stack for a read, a
    /// leaf's vector to thaw. It walks the bytes in order rather than place
    /// each entry as [`PackedLeaf::key`] and [`PackedLeaf::count`] do: a
    /// thaw of 16 or 64 entries took a fifth longer that way.
    pub(super) fn unpack_into(&self, entries: &mut impl Extend<Entry>) {
        let [offset, tiebreak, count] = self.widths;
        let mut at = self.start;
        for i in 0..self.len {
            let mut high = self.first_high;
            if i > 0 {
                high += be_u64(self.bytes, at, offset);
                at += offset;
            }
            let low = self.tiebreak(be_u64(self.bytes, at, tiebreak));
            let players = if count == 0 { 1 } else { be_u64(self.bytes, at + tiebreak, count) };
            at += tiebreak + count;
            entries.extend([Entry::new((u128::from(high) << 64) | u128::from(low), players)]);
        }
    }
}

/// Bytes of `value` from its first non-zero one.
#[inline]
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

/// The `len` (at most eight) big-endian bytes at `at` as a number: one
/// load of the eight bytes there where the slice has them (a copy into a
/// buffer and a load of that made unpacking 2.5 times slower).
#[inline]
fn be_u64(bytes: &[u8], at: usize, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    match bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        Some(window) => u64::from_be_bytes(*window) >> (64 - 8 * len),
        None => bytes[at..at + len].iter().fold(0, |value, &b| (value << 8) | u64::from(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Order, Ties};
    use crate::key::{score_key, tiebreak, tree_key};
    use proptest::prelude::*;

    fn packed(entries: &[Entry]) -> (Trim, Packed) {
        let mut bytes = Packed::new();
        (pack(entries, &mut bytes), bytes)
    }

    impl std::ops::Deref for Packed {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            self.as_slice()
        }
    }

    fn unpacked(bytes: &[u8], trim: Trim) -> Unpacked {
        let mut entries = Unpacked::new();
        PackedLeaf::new(bytes, trim).unpack_into(&mut entries);
        entries
    }

    fn entries_of(mut keys: Vec<(u128, u64)>) -> Vec<Entry> {
        keys.sort_unstable();
        keys.dedup_by_key(|(key, _)| *key);
        keys.into_iter().map(|(key, count)| Entry::new(key, count)).collect()
    }

    proptest! {
        /// Any sorted leaf packs and unpacks to itself, whatever its keys
        /// and counts, and read in place counts as its entries do.
        #[test]
        fn a_packed_leaf_unpacks_to_itself_and_counts_in_place(
            keys in proptest::collection::vec((any::<u128>(), 1u64..=u64::from(u32::MAX)), 0..=LEAF_CAPACITY),
            near in any::<bool>(),
            ones in any::<bool>(),
            probes in proptest::collection::vec(any::<u128>(), 1..10),
        ) {
            // Keys near one another (as scores are) in half the cases, every
            // count 1 (as without ties) in half.
            let keys = keys
                .into_iter()
                .map(|(k, c)| (if near { k >> 70 << 64 | k & 0xffff } else { k }, if ones { 1 } else { c }))
                .collect();
            let entries = entries_of(keys);
            let (trim, bytes) = packed(&entries);
            let back = unpacked(&bytes, trim);
            prop_assert_eq!(back.as_slice(), entries.as_slice());
            let leaf = PackedLeaf::new(&bytes, trim);
            prop_assert_eq!(leaf.total(), entries.iter().map(|e| e.count()).sum::<u64>());
            let existing = entries.iter().map(|e| e.key()).chain(entries.iter().map(|e| e.key().wrapping_add(1)));
            for probe in probes.into_iter().chain(existing) {
                let before = entries.iter().filter(|e| e.key() < probe).map(|e| e.count()).sum::<u64>();
                prop_assert_eq!(leaf.count_before(probe), before, "probe {:#x}", probe);
            }
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
            let (trim, bytes) = packed(&two);
            assert_eq!(trim, Trim::Trailing);
            assert!(bytes.len() <= 14, "{order:?}: {} bytes", bytes.len());
            assert_eq!(unpacked(&bytes, trim).as_slice(), two.as_slice());
        }
        let negative = named(&[("alice", -3), ("bob", -3), ("carol", i64::MIN), ("dave", i64::MAX)], Order::Desc);
        let (trim, bytes) = packed(&negative);
        assert_eq!(unpacked(&bytes, trim).as_slice(), negative.as_slice());

        let ordinal: Vec<Entry> =
            entries_of((0..5u64).map(|i| (tree_key(score_key(100, Order::Desc), 4_000_000 + i), 1)).collect());
        let (trim, bytes) = packed(&ordinal);
        // Widths, the base, five 3-byte tiebreaks: equal scores take no
        // offset bytes.
        assert_eq!((trim, bytes.len()), (Trim::Leading, 2 + 1 + 5 * 3));
        assert_eq!(unpacked(&bytes, trim).as_slice(), ordinal.as_slice());
    }
}
