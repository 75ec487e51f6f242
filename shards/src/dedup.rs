//! Idempotent writes: which `wid`s a shard has applied lately, and what
//! each answered, so a retried write is answered again instead of applied
//! twice (protocol 1.1, "Idempotent writes").
//!
//! The records a batch makes are stored together, as ONE meta key written
//! in that batch (`DedupTable::seal_group`): after a crash a write and its
//! record are both there or both gone, and a write with a `wid` costs the
//! storage a few dozen bytes of one value, not a key of its own. Group keys
//! start with the second the batch was sealed, so the oldest group is the
//! first key; expiry drops whole groups, oldest first, in bounded steps. In
//! memory a map per board finds a record by its `wid` without allocating.
//!
//! Memory is bounded by [`DedupLimits::max_bytes`]: past it the oldest
//! groups leave early, counted in [`DedupTable::early_expiries`], which the
//! server reports (the horizon then holds for fewer writes than promised).

use std::collections::{HashMap, VecDeque};

use crate::FastHasher;

/// A write's idempotency key, as the client chose it (1-64 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wid(Box<str>);

impl From<&str> for Wid {
    fn from(text: &str) -> Self {
        Self(text.into())
    }
}

impl Wid {
    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a guarded write answered: replayed, never recomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A `set`: the score stored.
    Score(i64),
    /// This shard's part of a `set_many`: the scores stored, in entry order.
    Scores(Vec<i64>),
    /// A `remove`: whether the player was there.
    Removed(bool),
}

impl Outcome {
    /// Which kind of write made it, for the message when a `wid` is reused
    /// by another kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Score(_) => "set",
            Self::Scores(_) => "set_many",
            Self::Removed(_) => "remove",
        }
    }

    /// Appends the outcome: a tag, then its payload (a count first for
    /// `Scores`).
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Score(score) => {
                out.push(b's');
                out.extend_from_slice(&score.to_be_bytes());
            }
            Self::Removed(removed) => out.extend_from_slice(&[b'r', u8::from(*removed)]),
            Self::Scores(scores) => {
                out.push(b'm');
                out.extend_from_slice(&u32::try_from(scores.len()).unwrap_or(u32::MAX).to_be_bytes());
                scores.iter().for_each(|s| out.extend_from_slice(&s.to_be_bytes()));
            }
        }
    }

    /// Reads an outcome off the front of `bytes`.
    fn decode(bytes: &mut &[u8]) -> Option<Self> {
        let (&tag, rest) = bytes.split_first()?;
        *bytes = rest;
        match tag {
            b's' => Some(Self::Score(i64::from_be_bytes(take(bytes)?))),
            b'r' => Some(Self::Removed(take::<1>(bytes)?[0] != 0)),
            b'm' => {
                let count = u32::from_be_bytes(take(bytes)?) as usize;
                (0..count).map(|_| take(bytes).map(i64::from_be_bytes)).collect::<Option<_>>().map(Self::Scores)
            }
            _ => None,
        }
    }

    /// Bytes the outcome holds in memory beyond its record.
    fn footprint(&self) -> usize {
        match self {
            Self::Scores(scores) => 8 * scores.len(),
            _ => 0,
        }
    }
}

/// Takes `N` bytes off the front of `bytes`.
fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

/// How long records are kept, and how much memory they may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupLimits {
    /// Seconds a record is kept after its write (the dedup horizon).
    pub horizon_secs: i64,
    /// Most bytes this shard's records may take in memory.
    pub max_bytes: usize,
}

impl Default for DedupLimits {
    fn default() -> Self {
        Self { horizon_secs: 600, max_bytes: 64 << 20 }
    }
}

/// Prefix of the record groups' meta keys.
pub(crate) const GROUP_PREFIX: &[u8] = b"wid/";

/// A group's meta key: the prefix, the second it was sealed and a sequence
/// number, so groups sort by age.
fn group_key(made: i64, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(GROUP_PREFIX.len() + 16);
    key.extend_from_slice(GROUP_PREFIX);
    key.extend_from_slice(&made.to_be_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The second and sequence number in a group key.
fn parse_group_key(key: &[u8]) -> Option<(i64, u64)> {
    let mut rest = key.strip_prefix(GROUP_PREFIX)?;
    let made = i64::from_be_bytes(take(&mut rest)?);
    let seq = u64::from_be_bytes(take(&mut rest)?);
    rest.is_empty().then_some((made, seq))
}

/// Appends one record to a group's value: board, wid (length first),
/// outcome.
fn encode_record(out: &mut Vec<u8>, board: u64, wid: &str, outcome: &Outcome) {
    out.extend_from_slice(&board.to_be_bytes());
    out.push(u8::try_from(wid.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(wid.as_bytes());
    outcome.encode(out);
}

/// Reads one record off the front of a group's value.
fn decode_record(bytes: &mut &[u8]) -> Option<(u64, Wid, Outcome)> {
    let board = u64::from_be_bytes(take(bytes)?);
    let [len] = take::<1>(bytes)?;
    let (wid, rest) = bytes.split_at_checked(usize::from(len))?;
    *bytes = rest;
    let wid = Wid::from(std::str::from_utf8(wid).ok()?);
    Some((board, wid, Outcome::decode(bytes)?))
}

/// Per-record memory beyond its wid and outcome: map entries and the
/// group's member list.
const RECORD_OVERHEAD: usize = 80;

/// The records one batch made, stored under one key.
#[derive(Debug, Default)]
struct Group {
    /// Its meta key.
    key: Vec<u8>,
    /// The second its batch was sealed.
    made: i64,
    /// Its records, to forget when it expires.
    members: Vec<(u64, Wid)>,
    /// Memory its records take.
    bytes: usize,
}

/// A shard's recent `wid`s. See the module docs.
#[derive(Debug, Default)]
pub struct DedupTable {
    limits: DedupLimits,
    /// Each board's records, by wid (hashed as the hot paths' maps are:
    /// fast, and seeded per process, so clients cannot aim wids at one
    /// bucket).
    records: HashMap<u64, HashMap<Box<str>, Outcome, FastHasher>, FastHasher>,
    /// Stored groups, oldest first.
    groups: VecDeque<Group>,
    /// Records of the open batch: its group once sealed.
    open: Group,
    /// The encoded records of the open batch: the group's value.
    open_value: Vec<u8>,
    /// The next group's sequence number.
    next_seq: u64,
    /// Memory the records take, roughly.
    bytes: usize,
    /// Records dropped before their horizon to stay under the memory bound.
    early_expiries: u64,
}

/// A change to stored groups: a key to write (with its value) or delete.
pub(crate) type KeyChange = (Vec<u8>, Option<Vec<u8>>);

impl DedupTable {
    /// An empty table under `limits`.
    pub fn new(limits: DedupLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// What the write with `wid` on `board` answered, if it is recorded.
    pub fn get(&self, board: u64, wid: &Wid) -> Option<&Outcome> {
        self.records.get(&board)?.get(wid.as_str())
    }

    /// Records a write's outcome in the open batch's group. A wid already
    /// recorded keeps its first outcome.
    pub(crate) fn insert(&mut self, board: u64, wid: Wid, outcome: Outcome) {
        let records = self.records.entry(board).or_default();
        if records.contains_key(wid.as_str()) {
            return;
        }
        encode_record(&mut self.open_value, board, wid.as_str(), &outcome);
        let bytes = RECORD_OVERHEAD + 2 * wid.0.len() + outcome.footprint();
        self.open.bytes += bytes;
        self.bytes += bytes;
        records.insert(wid.0.clone(), outcome);
        self.open.members.push((board, wid));
    }

    /// Seals the open batch's records into a group made at `now`: its key
    /// and value, to write in that batch. `None` when it has none.
    pub(crate) fn seal_group(&mut self, now: i64) -> Option<KeyChange> {
        if self.open.members.is_empty() {
            return None;
        }
        let key = group_key(now, self.next_seq);
        self.next_seq += 1;
        let mut group = std::mem::take(&mut self.open);
        (group.key, group.made) = (key.clone(), now);
        // The next batch's records, sized like this one's.
        self.open.members.reserve(group.members.len());
        let next = Vec::with_capacity(self.open_value.len());
        let value = std::mem::replace(&mut self.open_value, next);
        self.groups.push_back(group);
        Some((key, Some(value)))
    }

    /// Loads a stored group (opening the shard); a key or value that does
    /// not parse is `None`. Keys must come in order.
    pub(crate) fn load(&mut self, key: &[u8], value: &[u8]) -> Option<()> {
        let (made, seq) = parse_group_key(key)?;
        self.next_seq = self.next_seq.max(seq + 1);
        let mut rest = value;
        while !rest.is_empty() {
            let (board, wid, outcome) = decode_record(&mut rest)?;
            self.insert(board, wid, outcome);
        }
        let mut group = std::mem::take(&mut self.open);
        self.open_value.clear();
        (group.key, group.made) = (key.to_vec(), made);
        self.groups.push_back(group);
        Some(())
    }

    /// Forgets every record (before loading them again).
    pub(crate) fn clear(&mut self) {
        let (limits, early) = (self.limits, self.early_expiries);
        *self = Self::new(limits);
        self.early_expiries = early;
    }

    /// Drops stored groups past the horizon at `now`, or past the memory
    /// bound, oldest first, until about `budget` records are dropped;
    /// returns the keys to delete. Bounded, so expiry never stalls a round.
    pub(crate) fn expire(&mut self, now: i64, budget: usize) -> Vec<KeyChange> {
        let mut deleted = Vec::new();
        let mut dropped = 0;
        while dropped < budget {
            let Some(group) = self.groups.front() else { break };
            let expired = group.made <= now - self.limits.horizon_secs;
            if !expired && self.bytes <= self.limits.max_bytes {
                break;
            }
            let Some(group) = self.groups.pop_front() else { break };
            if !expired {
                self.early_expiries += group.members.len() as u64;
            }
            dropped += group.members.len();
            for (board, wid) in &group.members {
                if let Some(records) = self.records.get_mut(board) {
                    records.remove(wid.as_str());
                    if records.is_empty() {
                        self.records.remove(board);
                    }
                }
            }
            self.bytes = self.bytes.saturating_sub(group.bytes);
            deleted.push((group.key, None));
        }
        deleted
    }

    /// Whether `DedupTable::expire` has anything to do at `now`.
    pub fn has_expired(&self, now: i64) -> bool {
        let Some(oldest) = self.groups.front() else { return false };
        self.bytes > self.limits.max_bytes || oldest.made <= now - self.limits.horizon_secs
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.values().map(|records| records.len()).sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Memory the records take, roughly, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records dropped before their horizon so far, to bound memory.
    pub fn early_expiries(&self) -> u64 {
        self.early_expiries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(horizon_secs: i64, max_bytes: usize) -> DedupTable {
        DedupTable::new(DedupLimits { horizon_secs, max_bytes })
    }

    fn wid(text: &str) -> Wid {
        Wid::from(text)
    }

    #[test]
    fn records_and_keys_round_trip() {
        for outcome in [Outcome::Score(i64::MIN), Outcome::Removed(true), Outcome::Scores(vec![1, -2, i64::MAX])] {
            let mut out = Vec::new();
            encode_record(&mut out, 7, "ab:c", &outcome);
            let mut rest = &out[..];
            assert_eq!(decode_record(&mut rest), Some((7, wid("ab:c"), outcome)));
            assert!(rest.is_empty());
        }
        assert_eq!(decode_record(&mut &b"\0\0\0\0\0\0\0\x07\x05ab"[..]), None, "truncated");
        assert_eq!(parse_group_key(&group_key(1_700_000_000, 9)), Some((1_700_000_000, 9)));
        assert!(group_key(5, 9) < group_key(6, 1), "keys sort by age");
    }

    #[test]
    fn the_first_outcome_is_kept_per_board_and_wid() {
        let mut t = table(600, 1 << 20);
        t.insert(1, wid("w"), Outcome::Score(5));
        t.insert(1, wid("w"), Outcome::Score(9));
        assert_eq!(t.get(1, &wid("w")), Some(&Outcome::Score(5)));
        assert_eq!(t.get(2, &wid("w")), None, "another board's wid is another wid");
        let (_, value) = t.seal_group(100).unwrap();
        assert_eq!(value.map(|v| v.len()), Some(8 + 1 + 1 + 9), "one record stored");
        assert_eq!(t.seal_group(101), None, "an empty batch stores no group");
    }

    #[test]
    fn groups_expire_after_the_horizon_in_bounded_steps() {
        let mut t = table(10, 1 << 20);
        for i in 0..5 {
            t.insert(1, wid(&format!("w{i}")), Outcome::Removed(false));
            t.seal_group(100 + i);
        }
        assert!(!t.has_expired(109));
        assert!(t.has_expired(111));
        // At 112 the groups made at 100, 101 and 102 are past the horizon.
        let first = t.expire(112, 2);
        assert_eq!(first, vec![(group_key(100, 0), None), (group_key(101, 1), None)]);
        assert_eq!(t.expire(112, 10).len(), 1);
        assert_eq!((t.len(), t.early_expiries()), (2, 0));
        assert!(t.get(1, &wid("w3")).is_some() && t.get(1, &wid("w0")).is_none());
    }

    #[test]
    fn memory_is_bounded_by_expiring_the_oldest_early() {
        let one = RECORD_OVERHEAD + 6;
        let mut t = table(600, 10 * one);
        for i in 0..20 {
            t.insert(1, wid(&format!("w{i:02}")), Outcome::Score(i));
            t.seal_group(100);
        }
        assert!(t.has_expired(100));
        assert_eq!(t.expire(100, 100).len(), 10);
        assert_eq!((t.len(), t.early_expiries()), (10, 10));
        assert!(t.get(1, &wid("w00")).is_none() && t.get(1, &wid("w19")).is_some());
        assert!(t.bytes() <= 10 * one);
    }

    #[test]
    fn loading_rebuilds_what_was_stored() {
        let mut t = table(600, 1 << 20);
        t.insert(3, wid("x"), Outcome::Scores(vec![4, 5]));
        t.insert(4, wid("y"), Outcome::Removed(true));
        let (key, value) = t.seal_group(50).unwrap();
        let mut loaded = table(600, 1 << 20);
        assert_eq!(loaded.load(&key, &value.unwrap()), Some(()));
        assert_eq!(loaded.get(3, &wid("x")), Some(&Outcome::Scores(vec![4, 5])));
        assert_eq!(loaded.get(4, &wid("y")), Some(&Outcome::Removed(true)));
        assert_eq!(loaded.seal_group(60).map(|(key, _)| key), None);
        loaded.insert(3, wid("z"), Outcome::Score(1));
        assert_eq!(loaded.seal_group(60).map(|(key, _)| key), Some(group_key(60, 1)), "sequence numbers go on");
        assert_eq!(loaded.load(b"wid/short", b""), None);
    }
}
