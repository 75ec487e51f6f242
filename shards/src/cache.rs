//! Player records in memory, so a write or a rank does not search the
//! LSM-tree for the player's current score.
//!
//! Keys are a 128-bit SipHash-1-3 of the player's storage key (tree prefix
//! and name), keyed at random once per process, of which a slot stores 80
//! bits (see [`Slot`]): two names share them only by a chance no client
//! can improve on. An unkeyed hash would not do: the 128-bit xxHash3 this
//! cache used gives the same hash to names a client can craft in
//! milliseconds (see the tests), and two players sharing a key corrupt
//! their board. Absence is cached too (a new player's first write), as a
//! record with the [`ABSENT`] sequence: 24 bytes a record.
//! The shard is the only writer, so the cache is updated with every staged
//! write and is always exact; it is cleared whenever the in-memory state is
//! rebuilt.
//!
//! A miss is dear (bloom probes through a dozen level-0 tables and a block
//! read, on the shard's thread; see docs/performance-history.md), so the
//! cache uses all of its budget and never more: it is one array of
//! [`WAYS`]-way sets, as a CPU cache is. A key has two sets (one from each
//! half of it) and may sit in any way of either: a new key goes to the
//! emptier one, so sets overflow only once the whole cache is nearly full
//! (with one set a key, a cache 85% full lost one key in eight to a full
//! set). A put into two full sets evicts one of their ways in turn. A hash
//! table evicting a tenth at a time could not do this: its tombstones made
//! hashbrown double the table, and the cache took 2.5 times its budget.
//! Keys crafted to share sets only evict each other.

use std::hash::BuildHasher;
use std::sync::OnceLock;

use siphasher::sip128::SipHasher13;

use crate::huge_pages::HugePageArray;
use crate::record::Record;

/// Bits of a record's sequence a slot holds. A sequence counts writes, so
/// 2^48 is about nine years at a million writes a second; a record whose
/// sequence does not fit is simply not cached.
const SEQ_BITS: u32 = 48;

/// The bits of a slot's third word that hold the sequence; the rest hold
/// key bits.
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The stored sequence marking a cached absence (the largest that fits;
/// real records there are not cached).
const ABSENT: u64 = SEQ_MASK;

/// Bytes per slot: 80 bits of the key, the score and 48 bits of sequence.
const SLOT_BYTES: u64 = 24;

/// Slots per set: four 24-byte slots are one and a half cache lines.
const WAYS: usize = 4;

/// One slot: the key's high half (0: empty; a real key with a high half of
/// 0 is simply never cached), the score, and the key's next 16 bits above
/// the 48-bit sequence. Plain words, so a new cache is a zeroed allocation
/// the OS hands out lazily.
///
/// 80 bits of a keyed PRF and the sets a key may sit in tell keys apart:
/// a lookup takes another player's record by a chance of 2^-77 (see
/// [`RecordCache::sets_of`]), once in billions of years at a million
/// lookups a second, which no client can improve on. Storing them rather
/// than all 128 bits holds a third more records in the same budget.
type Slot = [u64; 3];

/// The part of a key a slot stores, as its first word and the top 16 bits
/// of its third.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Tag {
    high: u64,
    next: u64,
}

impl Tag {
    fn of_key(key: u128) -> Self {
        Self { high: (key >> 64) as u64, next: (key as u64) >> SEQ_BITS }
    }

    fn of_slot(slot: &Slot) -> Self {
        Self { high: slot[0], next: slot[2] >> SEQ_BITS }
    }

    fn is_empty(self) -> bool {
        self.high == 0
    }
}

/// How many records a cache of `bytes` holds.
pub fn cached_players_for(bytes: u64) -> usize {
    usize::try_from(bytes / SLOT_BYTES / WAYS as u64 * WAYS as u64).unwrap_or(usize::MAX)
}

/// The exact record cache: see the module docs.
#[derive(Debug)]
pub(crate) struct RecordCache {
    /// `sets × ways` slots, set by set. Mapped at the first put, in huge
    /// pages: every lookup lands at a random place of it.
    slots: HugePageArray<Slot>,
    /// Number of sets.
    sets: usize,
    /// Slots per set: [`WAYS`], fewer only for caches smaller than one set.
    ways: usize,
    /// Which way of a full set the next put evicts.
    next_victim: usize,
    /// Lookups since [`RecordCache::take_lookups`] last took them.
    lookups: Lookups,
}

/// How many lookups the cache answered and how many went to storage: what
/// an operator sizes `--cache-mb` by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lookups {
    /// Answered from memory.
    pub hits: u64,
    /// Not cached: read from the overlays or storage.
    pub misses: u64,
    /// Not asked: a small board's record read from its count tree (see
    /// `shard::short_names`).
    pub from_trees: u64,
}

impl RecordCache {
    /// A cache holding up to `players` records (see [`cached_players_for`]);
    /// 0 disables it.
    pub(crate) fn new(players: usize) -> Self {
        let ways = WAYS.min(players).max(1);
        Self { slots: HugePageArray::empty(), sets: players / ways, ways, next_victim: 0, lookups: Lookups::default() }
    }

    /// The cache key of a player's storage key (see the module docs).
    pub(crate) fn key(storage_key: &[u8]) -> u128 {
        static HASHER: OnceLock<SipHasher13> = OnceLock::new();
        let hasher = HASHER.get_or_init(|| {
            // std's hash maps key SipHash at random per process the same way.
            let random = std::collections::hash_map::RandomState::new();
            SipHasher13::new_with_keys(random.hash_one(0u8), random.hash_one(1u8))
        });
        hasher.hash(storage_key).into()
    }

    /// A key's two sets, in the manner of a cuckoo filter: the first from
    /// bits of the key no slot stores, the second such that the two add up
    /// to a number the stored high half picks (mod the number of sets). So
    /// a slot's other set follows from its tag and where it sits (see
    /// [`RecordCache::other_set`]), and two keys meet only if their tags
    /// match *and* they share a set: 2^-80 × 2 / sets for each key held,
    /// 2^-77 a lookup with four held a set. Both parts of the key are
    /// uniform, so both sets are.
    fn sets_of(&self, key: u128) -> [usize; 2] {
        let unstored = (key as u64) & SEQ_MASK;
        let first = ((u128::from(unstored) * self.sets as u128) >> SEQ_BITS) as usize;
        [first, self.other_set(Tag::of_key(key), first)]
    }

    /// The set a key of `tag` pairs with `set`.
    fn other_set(&self, tag: Tag, set: usize) -> usize {
        let sum = ((u128::from(tag.high) * self.sets as u128) >> 64) as usize;
        // `sum - set` mod the sets, without a division: both are below it.
        let other = sum + self.sets - set;
        if other >= self.sets {
            other - self.sets
        } else {
            other
        }
    }

    /// The slots of set `set` (empty before the first put).
    fn slots_of(&self, set: usize) -> std::ops::Range<usize> {
        let start = (set * self.ways).min(self.slots.len());
        start..(start + self.ways).min(self.slots.len())
    }

    /// The slots of `key`'s two sets.
    fn set_slots(&self, key: u128) -> [std::ops::Range<usize>; 2] {
        self.sets_of(key).map(|set| self.slots_of(set))
    }

    /// Where `tag` is held in `sets` (its key's, from [`Self::set_slots`]).
    fn find(&self, sets: &[std::ops::Range<usize>; 2], tag: Tag) -> Option<usize> {
        sets.iter().find_map(|set| {
            let way = self.slots[set.clone()].iter().position(|slot| Tag::of_slot(slot) == tag)?;
            Some(set.start + way)
        })
    }

    /// `Some(record)` if cached (`Some(None)`: known absent), counted as a
    /// hit or a miss.
    pub(crate) fn get(&mut self, key: u128) -> Option<Option<Record>> {
        let found = self.peek(key);
        match found {
            Some(_) => self.lookups.hits += 1,
            None => self.lookups.misses += 1,
        }
        found
    }

    /// Like [`RecordCache::get`], uncounted: a look ahead, not a lookup.
    pub(crate) fn peek(&self, key: u128) -> Option<Option<Record>> {
        let tag = Tag::of_key(key);
        if tag.is_empty() || self.slots.is_empty() {
            return None;
        }
        let slot = &self.slots[self.find(&self.set_slots(key), tag)?];
        let record = Record { score: slot[1] as i64, seq: slot[2] & SEQ_MASK };
        Some((record.seq != ABSENT).then_some(record))
    }

    /// Counts a record read from its count tree instead (see
    /// `shard::short_names`): the cache was not asked.
    pub(crate) fn count_tree_read(&mut self) {
        self.lookups.from_trees += 1;
    }

    /// The lookups counted since the last call, and starts counting anew.
    pub(crate) fn take_lookups(&mut self) -> Lookups {
        std::mem::take(&mut self.lookups)
    }

    /// Caches `record` (`None`: absent) as the player's current state.
    pub(crate) fn put(&mut self, key: u128, record: Option<Record>) {
        let tag = Tag::of_key(key);
        if tag.is_empty() || self.sets == 0 {
            return;
        }
        if self.slots.is_empty() {
            match HugePageArray::zeroed(self.sets * self.ways) {
                Ok(slots) => self.slots = slots,
                Err(e) => {
                    // Uncached is slower, never wrong: every lookup reads
                    // storage, as with `--cache-mb 0`.
                    tracing::warn!(error = %e, sets = self.sets, "cannot map the record cache; running without it");
                    self.sets = 0;
                    return;
                }
            }
        }
        // The two sets, found once for the lookup and the placing.
        let sets = self.set_slots(key);
        let held = self.find(&sets, tag);
        let seq = match record {
            None => ABSENT,
            Some(record) if record.seq < ABSENT => record.seq,
            Some(_) => {
                // Too late a sequence to store: the key must not keep an
                // older record.
                if let Some(index) = held {
                    self.remove(index);
                }
                return;
            }
        };
        let slot = [tag.high, record.map_or(0, |record| record.score as u64), (tag.next << SEQ_BITS) | seq];
        // Held already: replaced where it is.
        if let Some(index) = held {
            self.slots[index] = slot;
            return;
        }
        let [first, second] = sets;
        let (held_first, held_second) = (self.held(&first), self.held(&second));
        let index = if held_first.min(held_second) < self.ways {
            if held_first <= held_second {
                first.start + held_first
            } else {
                second.start + held_second
            }
        } else if let Some(index) = self.make_room(&first, &second) {
            index
        } else {
            self.next_victim = (self.next_victim + 1) % (2 * self.ways);
            let set = if self.next_victim < self.ways { first } else { second };
            set.start + self.next_victim % self.ways
        };
        self.slots[index] = slot;
    }

    /// How many keys `set` holds: a set fills from its start, and a removal
    /// moves its last key into the gap, so its keys precede its empty slots.
    fn held(&self, set: &std::ops::Range<usize>) -> usize {
        self.slots[set.clone()].iter().take_while(|slot| !Tag::of_slot(slot).is_empty()).count()
    }

    /// Empties the slot at `index`, keeping its set's keys first.
    fn remove(&mut self, index: usize) {
        let set = self.slots_of(index / self.ways);
        let last = set.start + self.held(&set) - 1;
        self.slots[index] = self.slots[last];
        self.slots[last] = [0; 3];
    }

    /// With both of a new key's sets full: moves a key of one of them to
    /// its other set, if that has room, and returns the slot it freed. One
    /// step of cuckoo hashing: at 85% full it keeps all but ~1 key in 1000,
    /// where choosing between two sets alone lost 1 in 40.
    fn make_room(&mut self, first: &std::ops::Range<usize>, second: &std::ops::Range<usize>) -> Option<usize> {
        for index in first.clone().chain(second.clone()) {
            let held = Tag::of_slot(&self.slots[index]);
            let other = self.slots_of(self.other_set(held, index / self.ways));
            let free = self.slots[other.clone()].iter().position(|slot| Tag::of_slot(slot).is_empty());
            if let Some(way) = free {
                self.slots[other.start + way] = self.slots[index];
                return Some(index);
            }
        }
        None
    }

    /// Forgets everything (the memory goes back until the next put).
    pub(crate) fn clear(&mut self) {
        self.slots = HugePageArray::empty();
    }

    /// Records held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.iter().filter(|slot| !Tag::of_slot(slot).is_empty()).count()
    }
}

/// Two player names whose storage keys collide under the unkeyed 128-bit
/// xxHash3 in any tree (see the test
/// `names_crafted_to_collide_under_an_unkeyed_hash_are_two_keys`).
#[cfg(any(test, feature = "test-hooks"))]
pub const CRAFTED_PAIR: (&str, &str) = (
    "player:player:player:player:pla\u{525}\u{8198}O8Jx1%\u{2ec}l\u{20e}",
    "player:player:player:player:pla\u{525}\u{c198}O8Jx1!\u{2ec}l\u{20e}",
);

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> Record {
        Record { score: i as i64 - 50, seq: i }
    }

    #[test]
    fn a_budget_buys_whole_sets_and_never_more() {
        for bytes in [0u64, 100, 128, 300, 1 << 20, 48 << 20, 1 << 32] {
            let players = cached_players_for(bytes);
            assert!(players as u64 * SLOT_BYTES <= bytes, "{bytes} bytes");
            assert!(bytes - players as u64 * SLOT_BYTES < WAYS as u64 * SLOT_BYTES, "{bytes} bytes: a set unused");
            let mut cache = RecordCache::new(players);
            cache.put(RecordCache::key(b"p"), Some(record(1)));
            assert_eq!(cache.slots.len(), players, "{bytes} bytes");
        }
    }

    #[test]
    fn holds_what_fits_and_answers_exactly() {
        let players = cached_players_for(1 << 20);
        let mut cache = RecordCache::new(players);
        // Keys as a shard makes them, spread over the sets by hash: with two
        // sets a key, 85% of the capacity fits with (almost) no set full.
        let keys: Vec<u128> = (0..players as u64 / 100 * 85).map(|i| RecordCache::key(&i.to_be_bytes())).collect();
        for (i, key) in keys.iter().enumerate() {
            cache.put(*key, Some(record(i as u64)));
        }
        let held = keys.iter().filter(|key| cache.peek(**key).is_some()).count();
        assert!(held * 1000 >= keys.len() * 999, "{held} of {} held", keys.len());
        for (i, key) in keys.iter().enumerate() {
            let got = cache.get(*key);
            assert!(got.is_none() || got == Some(Some(record(i as u64))), "a wrong record");
        }
        let lookups = cache.take_lookups();
        assert_eq!((lookups.hits, lookups.hits + lookups.misses), (held as u64, keys.len() as u64));
        // Overwritten in place; absence cached too.
        cache.put(keys[0], Some(record(7)));
        assert_eq!(cache.get(keys[0]), Some(Some(record(7))));
        let absent = RecordCache::key(b"nobody");
        assert_eq!(cache.get(absent), None);
        cache.put(absent, None);
        assert_eq!(cache.get(absent), Some(None));
        cache.clear();
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.get(keys[0]), None);
    }

    #[test]
    fn a_full_set_evicts_and_the_cache_never_grows() {
        for capacity in [1, 3, 7, 10, 64] {
            let mut cache = RecordCache::new(capacity);
            for i in 0..1000u64 {
                let key = RecordCache::key(&i.to_be_bytes());
                cache.put(key, Some(record(i)));
                assert_eq!(cache.get(key), Some(Some(record(i))), "the last put is held");
                assert!(cache.len() <= capacity);
                assert!(cache.slots.len() <= capacity);
            }
        }
        let mut disabled = RecordCache::new(0);
        disabled.put(1, Some(record(1)));
        assert_eq!(disabled.get(1), None);
    }

    /// A record whose sequence a slot cannot hold is not cached, and the
    /// key's older record goes: its set keeps its keys first.
    #[test]
    fn a_sequence_past_48_bits_is_not_cached_and_drops_the_older_record() {
        let mut cache = RecordCache::new(WAYS);
        let keys: Vec<u128> = (0..64u64).map(|i| RecordCache::key(&i.to_be_bytes())).collect();
        for (i, key) in keys.iter().enumerate() {
            cache.put(*key, Some(record(i as u64)));
        }
        let held: Vec<usize> = (0..keys.len()).filter(|i| cache.peek(keys[*i]).is_some()).collect();
        assert_eq!(held.len(), WAYS, "one set, full");
        let late = Record { score: 3, seq: ABSENT };
        cache.put(keys[held[0]], Some(late));
        assert_eq!(cache.get(keys[held[0]]), None, "not the older record");
        assert_eq!(cache.len(), WAYS - 1);
        for i in &held[1..] {
            assert_eq!(cache.get(keys[*i]), Some(Some(record(*i as u64))), "the others stay");
        }
        // The freed way takes the next key; the largest storable sequence
        // and a cached absence are told apart.
        let edge = Record { score: -1, seq: ABSENT - 1 };
        cache.put(keys[held[0]], Some(edge));
        assert_eq!(cache.get(keys[held[0]]), Some(Some(edge)));
        cache.put(keys[held[1]], None);
        assert_eq!(cache.get(keys[held[1]]), Some(None));
        assert_eq!(cache.len(), WAYS);
    }

    /// Two names whose storage keys (any tree's prefix, then the name) have
    /// one unkeyed 128-bit xxHash3, found by a search of under a second:
    /// their last 16 bytes differ in a way xxHash3's mixing of 16-byte
    /// pairs cancels. Under the keyed hash they are two keys.
    #[test]
    fn names_crafted_to_collide_under_an_unkeyed_hash_are_two_keys() {
        let (a, b) = CRAFTED_PAIR;
        let prefix = crate::key::TreeId::all_time(7).prefix();
        let [a, b] = [a, b].map(|name| [&prefix[..], name.as_bytes()].concat());
        assert_ne!(a, b);
        assert_eq!(xxhash_rust::xxh3::xxh3_128(&a), xxhash_rust::xxh3::xxh3_128(&b), "the pair collides unkeyed");
        assert_ne!(RecordCache::key(&a), RecordCache::key(&b));
        let mut cache = RecordCache::new(64);
        cache.put(RecordCache::key(&a), Some(record(1)));
        assert_eq!(cache.get(RecordCache::key(&b)), None, "b is not a's record");
    }

    /// Against a map of everything put: whatever the cache answers is the
    /// last record put for the key, through evictions and clears.
    #[test]
    fn answers_only_the_last_record_put() {
        use std::collections::HashMap;
        let mut cache = RecordCache::new(24);
        let mut truth: HashMap<u128, Option<Record>> = HashMap::new();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..20_000u64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = RecordCache::key(&(state % 100).to_be_bytes());
            match state % 7 {
                0 => {
                    cache.put(key, None);
                    truth.insert(key, None);
                }
                1 if step % 1000 == 0 => {
                    cache.clear();
                }
                2 if step % 5 == 0 => {
                    // Too late to store: the cache must forget the key.
                    let late = Record { score: step as i64, seq: ABSENT + step };
                    cache.put(key, Some(late));
                    truth.insert(key, Some(late));
                }
                _ => {
                    cache.put(key, Some(record(step)));
                    truth.insert(key, Some(record(step)));
                }
            }
            for (key, want) in &truth {
                if let Some(got) = cache.peek(*key) {
                    assert_eq!(got, *want, "step {step}");
                }
            }
        }
    }
}
