//! Idempotent writes: which `wid`s a shard has applied lately, and what
//! each answered, so a retried write is answered again instead of applied
//! twice (protocol 1.1, "Idempotent writes").
//!
//! A record is staged into the same atomic batch as the write it guards
//! (a meta key, see [`record_key`]), so after a crash the write and its
//! record are both there or both gone. Records are keyed by the second
//! they were made first, so expiry deletes the oldest with a prefix scan's
//! worth of keys per step; in memory a map finds them by (board, wid) and a
//! queue in age order expires them.
//!
//! Memory is bounded by [`DedupLimits::max_bytes`]: past it the oldest
//! records leave early, counted in [`DedupTable::early_expiries`], which the
//! server reports (the horizon then holds for fewer writes than promised).

use std::collections::{HashMap, VecDeque};

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

    fn encode(&self) -> Vec<u8> {
        match self {
            Self::Score(score) => [&[b's'][..], &score.to_be_bytes()].concat(),
            Self::Removed(removed) => vec![b'r', u8::from(*removed)],
            Self::Scores(scores) => {
                let mut out = Vec::with_capacity(1 + 8 * scores.len());
                out.push(b'm');
                scores.iter().for_each(|s| out.extend_from_slice(&s.to_be_bytes()));
                out
            }
        }
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let (&tag, rest) = bytes.split_first()?;
        let scores = || rest.chunks_exact(8).map(|c| i64::from_be_bytes(c.try_into().unwrap_or_default()));
        match tag {
            b's' if rest.len() == 8 => scores().next().map(Self::Score),
            b'r' if rest.len() == 1 => Some(Self::Removed(rest[0] != 0)),
            b'm' if rest.len() % 8 == 0 => Some(Self::Scores(scores().collect())),
            _ => None,
        }
    }

    /// Bytes the record holds in memory, roughly.
    fn footprint(&self) -> usize {
        match self {
            Self::Scores(scores) => 8 * scores.len(),
            _ => 0,
        }
    }
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

/// Prefix of the records' meta keys.
pub(crate) const RECORD_PREFIX: &[u8] = b"wid/";

/// A record's meta key: the prefix, the second it was made, the board and
/// the wid, so records sort by age.
pub(crate) fn record_key(made: i64, board: u64, wid: &Wid) -> Vec<u8> {
    let mut key = Vec::with_capacity(RECORD_PREFIX.len() + 16 + wid.0.len());
    key.extend_from_slice(RECORD_PREFIX);
    key.extend_from_slice(&made.to_be_bytes());
    key.extend_from_slice(&board.to_be_bytes());
    key.extend_from_slice(wid.0.as_bytes());
    key
}

fn parse_key(key: &[u8]) -> Option<(i64, u64, Wid)> {
    let rest = key.strip_prefix(RECORD_PREFIX)?;
    let (made, rest) = rest.split_first_chunk::<8>()?;
    let (board, wid) = rest.split_first_chunk::<8>()?;
    let wid = std::str::from_utf8(wid).ok()?;
    Some((i64::from_be_bytes(*made), u64::from_be_bytes(*board), Wid::from(wid)))
}

/// Per-record memory beyond its wid and outcome: map and queue entries.
const RECORD_OVERHEAD: usize = 96;

/// A shard's recent `wid`s. See the module docs.
#[derive(Debug, Default)]
pub struct DedupTable {
    limits: DedupLimits,
    /// Outcome and age of each record, by board and wid.
    records: HashMap<(u64, Wid), (i64, Outcome)>,
    /// The records oldest first, as (made, board, wid).
    by_age: VecDeque<(i64, u64, Wid)>,
    /// Memory the records take, roughly.
    bytes: usize,
    /// Records dropped before their horizon to stay under the memory bound.
    early_expiries: u64,
}

/// A change to stored records: a key to write (with its value) or delete.
pub(crate) type KeyChange = (Vec<u8>, Option<Vec<u8>>);

impl DedupTable {
    /// An empty table under `limits`.
    pub fn new(limits: DedupLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// What the write with `wid` on `board` answered, if it is recorded.
    pub fn get(&self, board: u64, wid: &Wid) -> Option<&Outcome> {
        self.records.get(&(board, wid.clone())).map(|(_, outcome)| outcome)
    }

    /// Records a write's outcome at `now`; returns the stored key to write.
    /// A wid already recorded keeps its first outcome.
    pub(crate) fn insert(&mut self, board: u64, wid: Wid, outcome: Outcome, now: i64) -> Option<KeyChange> {
        let key = (board, wid);
        if self.records.contains_key(&key) {
            return None;
        }
        let stored = (record_key(now, board, &key.1), Some(outcome.encode()));
        self.remember(now, key, outcome);
        Some(stored)
    }

    fn remember(&mut self, made: i64, (board, wid): (u64, Wid), outcome: Outcome) {
        self.bytes += RECORD_OVERHEAD + 2 * wid.0.len() + outcome.footprint();
        self.by_age.push_back((made, board, wid.clone()));
        self.records.insert((board, wid), (made, outcome));
    }

    /// Loads a stored record (opening the shard); a key or value that does
    /// not parse is `None`.
    pub(crate) fn load(&mut self, key: &[u8], value: &[u8]) -> Option<()> {
        let (made, board, wid) = parse_key(key)?;
        let outcome = Outcome::decode(value)?;
        // Keys come in age order, so the queue stays sorted.
        self.remember(made, (board, wid), outcome);
        Some(())
    }

    /// Forgets every record (before loading them again).
    pub(crate) fn clear(&mut self) {
        let (limits, early) = (self.limits, self.early_expiries);
        *self = Self::new(limits);
        self.early_expiries = early;
    }

    /// Drops up to `budget` records past the horizon at `now`, or past the
    /// memory bound; returns the stored keys to delete. Bounded, so expiry
    /// never stalls a round.
    pub(crate) fn expire(&mut self, now: i64, budget: usize) -> Vec<KeyChange> {
        let mut deleted = Vec::new();
        while deleted.len() < budget {
            let Some((made, _, _)) = self.by_age.front() else { break };
            let expired = *made <= now - self.limits.horizon_secs;
            if !expired && self.bytes <= self.limits.max_bytes {
                break;
            }
            let Some((made, board, wid)) = self.by_age.pop_front() else { break };
            if !expired {
                self.early_expiries += 1;
            }
            let outcome = self.records.remove(&(board, wid.clone())).map(|(_, outcome)| outcome);
            let footprint = outcome.map_or(0, |o| o.footprint());
            self.bytes = self.bytes.saturating_sub(RECORD_OVERHEAD + 2 * wid.0.len() + footprint);
            deleted.push((record_key(made, board, &wid), None));
        }
        deleted
    }

    /// Whether [`DedupTable::expire`] has anything to do at `now`.
    pub fn has_expired(&self, now: i64) -> bool {
        self.bytes > self.limits.max_bytes
            || self.by_age.front().is_some_and(|(made, _, _)| *made <= now - self.limits.horizon_secs)
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
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

    #[test]
    fn outcomes_and_keys_round_trip() {
        for outcome in [Outcome::Score(i64::MIN), Outcome::Removed(true), Outcome::Scores(vec![1, -2, i64::MAX])] {
            assert_eq!(Outcome::decode(&outcome.encode()), Some(outcome));
        }
        assert_eq!(Outcome::decode(b"s123"), None);
        let key = record_key(1_700_000_000, 7, &Wid::from("ab:c"));
        assert_eq!(parse_key(&key), Some((1_700_000_000, 7, Wid::from("ab:c"))));
        assert!(record_key(5, 9, &Wid::from("z")) < record_key(6, 1, &Wid::from("a")), "keys sort by age");
    }

    #[test]
    fn the_first_outcome_is_kept_per_board_and_wid() {
        let mut t = table(600, 1 << 20);
        assert!(t.insert(1, Wid::from("w"), Outcome::Score(5), 100).is_some());
        assert!(t.insert(1, Wid::from("w"), Outcome::Score(9), 101).is_none());
        assert_eq!(t.get(1, &Wid::from("w")), Some(&Outcome::Score(5)));
        assert_eq!(t.get(2, &Wid::from("w")), None, "another board's wid is another wid");
    }

    #[test]
    fn records_expire_after_the_horizon_in_bounded_steps() {
        let mut t = table(10, 1 << 20);
        for i in 0..5 {
            t.insert(1, Wid::from(format!("w{i}").as_str()), Outcome::Removed(false), 100 + i);
        }
        assert!(!t.has_expired(109));
        assert!(t.has_expired(111));
        // At 112 the records made at 100, 101 and 102 are past the horizon.
        let first = t.expire(112, 2);
        assert_eq!(
            first,
            vec![(record_key(100, 1, &Wid::from("w0")), None), (record_key(101, 1, &Wid::from("w1")), None)]
        );
        assert_eq!(t.expire(112, 10).len(), 1);
        assert_eq!((t.len(), t.early_expiries()), (2, 0));
        assert!(t.get(1, &Wid::from("w3")).is_some() && t.get(1, &Wid::from("w0")).is_none());
    }

    #[test]
    fn memory_is_bounded_by_expiring_the_oldest_early() {
        let mut t = table(600, 10 * (RECORD_OVERHEAD + 6));
        for i in 0..20 {
            t.insert(1, Wid::from(format!("w{i:02}").as_str()), Outcome::Score(i), 100);
        }
        assert!(t.has_expired(100));
        assert_eq!(t.expire(100, 100).len(), 10);
        assert_eq!((t.len(), t.early_expiries()), (10, 10));
        assert!(t.get(1, &Wid::from("w00")).is_none() && t.get(1, &Wid::from("w19")).is_some());
        assert!(t.bytes() <= 10 * (RECORD_OVERHEAD + 6));
    }

    #[test]
    fn loading_rebuilds_what_was_stored() {
        let mut t = table(600, 1 << 20);
        let (key, value) = t.insert(3, Wid::from("x"), Outcome::Scores(vec![4, 5]), 50).unwrap();
        let mut loaded = table(600, 1 << 20);
        assert_eq!(loaded.load(&key, &value.unwrap()), Some(()));
        assert_eq!(loaded.get(3, &Wid::from("x")), Some(&Outcome::Scores(vec![4, 5])));
        assert_eq!(loaded.load(b"wid/short", b"s"), None);
    }
}
