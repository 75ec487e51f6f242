//! Player records in memory, so a write or a rank does not search the
//! LSM-tree for the player's current score.
//!
//! Keys are the 128-bit xxHash3 of the player's storage key (tree prefix and
//! name): 16 bytes instead of the name, and a collision is as unlikely as in
//! content-addressed storage. Absence is cached too (a new player's first
//! write), as a record with the [`ABSENT`] sequence: 32 bytes a record.
//! The shard is the only writer, so the cache is updated with every staged
//! write and is always exact; it is cleared whenever the in-memory state is
//! rebuilt. When a table is full, an arbitrary tenth of it is evicted: misses
//! only cost a storage read.
//!
//! A miss is dear, though: bloom probes through a dozen level-0 tables and
//! a block read and checksummed, on the shard's thread (see
//! docs/performance-history.md). So the cache uses all of its budget:
//! hashbrown sizes a table in powers of two, and one table fills a budget
//! only down to the power of two below it. The cache is therefore a few
//! tables of falling powers of two, each taking the share of keys its size
//! calls for.

use std::cell::Cell;
use std::collections::HashMap;

use crate::record::Record;
use crate::FastHasher;

/// The sequence marking a cached absence (real sequences never reach it).
const ABSENT: u64 = u64::MAX;

/// Bytes per hash-table slot: key, record, control byte.
const SLOT_BYTES: u64 = 16 + 16 + 1;

/// At most this many tables: four powers of two fill a budget to within
/// 1/16 of it.
const MAX_TABLES: usize = 4;

/// hashbrown fills a table to 7/8 of its slots before doubling it.
const fn records_in(slots: u64) -> u64 {
    slots / 8 * 7
}

/// How many records a cache of `bytes` holds without any table outgrowing
/// its share: the slots that fit, as a sum of at most `MAX_TABLES` powers
/// of two (each at least 8 slots, hashbrown's smallest), filled to 7/8.
pub fn cached_players_for(bytes: u64) -> usize {
    let mut slots_left = bytes / SLOT_BYTES;
    let mut records = 0;
    for _ in 0..MAX_TABLES {
        if slots_left < 8 {
            break;
        }
        let slots = 1u64 << slots_left.ilog2();
        records += records_in(slots);
        slots_left -= slots;
    }
    usize::try_from(records).unwrap_or(usize::MAX)
}

/// The table capacities a cache of `players` records is split into: the
/// inverse of [`cached_players_for`], so each table's slot count is a power
/// of two filled to exactly 7/8. Fewer than 7 records left make one last
/// small table (tests use tiny caches to force evictions); what is left
/// beyond [`MAX_TABLES`] is not cached.
fn table_capacities(players: usize) -> Vec<usize> {
    let mut left = players as u64;
    let mut capacities = Vec::new();
    while capacities.len() < MAX_TABLES && left > 0 {
        // The largest power of two whose 7/8 fits in what is left.
        let records = if left >= records_in(8) { records_in(1 << (left / 7 * 8).ilog2()) } else { left };
        capacities.push(usize::try_from(records).unwrap_or(usize::MAX));
        left -= records;
    }
    capacities
}

/// One hash table of the cache, never holding more than `capacity`.
#[derive(Debug)]
struct Table {
    /// Keys are xxh3 of names clients choose; the seeded hasher keeps names
    /// made to collide in xxh3 from colliding in buckets.
    records: HashMap<u128, Record, FastHasher>,
    /// Records it may hold: its share of the budget, sized so hashbrown
    /// never grows the table past it.
    capacity: usize,
}

impl Table {
    fn put(&mut self, key: u128, record: Record) {
        if self.records.len() >= self.capacity && !self.records.contains_key(&key) {
            let mut evict = self.capacity / 10 + 1;
            self.records.retain(|_, _| {
                let keep = evict == 0;
                evict = evict.saturating_sub(1);
                keep
            });
        }
        self.records.insert(key, record);
    }
}

/// The exact record cache: see the module docs.
#[derive(Debug)]
pub(crate) struct RecordCache {
    /// Tables of falling powers of two (see the module docs), largest first.
    tables: Vec<Table>,
    /// `tables` capacities summed, the range keys are spread over.
    capacity: u64,
    /// Lookups since [`RecordCache::take_lookups`] last took them (cells:
    /// lookups take `&self`).
    lookups: Cell<Lookups>,
}

/// How many lookups the cache answered and how many went to storage: what
/// an operator sizes `--cache-mb` by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lookups {
    /// Answered from memory.
    pub hits: u64,
    /// Not cached: read from the overlays or storage.
    pub misses: u64,
}

impl RecordCache {
    /// A cache holding up to `players` records (see [`cached_players_for`]);
    /// 0 disables it.
    pub(crate) fn new(players: usize) -> Self {
        let tables: Vec<Table> = table_capacities(players)
            .into_iter()
            .map(|capacity| Table { records: HashMap::default(), capacity })
            .collect();
        let capacity = tables.iter().map(|table| table.capacity as u64).sum();
        Self { tables, capacity, lookups: Cell::default() }
    }

    /// The cache key of a player's storage key.
    pub(crate) fn key(storage_key: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_128(storage_key)
    }

    /// Which table `key` belongs to: the key's high half, uniform, scaled
    /// onto the summed capacity, so each table gets keys in proportion to
    /// its size. The tables' hasher reads the whole key, so sharing bits
    /// with the choice costs them nothing.
    fn table_of(&self, key: u128) -> Option<usize> {
        let high = (key >> 64) as u64;
        let mut point = ((u128::from(high) * u128::from(self.capacity)) >> 64) as u64;
        for (i, table) in self.tables.iter().enumerate() {
            let capacity = table.capacity as u64;
            if point < capacity {
                return Some(i);
            }
            point -= capacity;
        }
        None
    }

    /// `Some(record)` if cached (`Some(None)`: known absent), counted as a
    /// hit or a miss.
    pub(crate) fn get(&self, key: u128) -> Option<Option<Record>> {
        let found = self.peek(key);
        let mut lookups = self.lookups.get();
        match found {
            Some(_) => lookups.hits += 1,
            None => lookups.misses += 1,
        }
        self.lookups.set(lookups);
        found
    }

    /// Like [`RecordCache::get`], uncounted: a look ahead, not a lookup.
    pub(crate) fn peek(&self, key: u128) -> Option<Option<Record>> {
        let found = self.table_of(key).and_then(|i| self.tables[i].records.get(&key));
        found.map(|r| (r.seq != ABSENT).then_some(*r))
    }

    /// The lookups counted since the last call, and starts counting anew.
    pub(crate) fn take_lookups(&mut self) -> Lookups {
        self.lookups.take()
    }

    /// Caches `record` (`None`: absent) as the player's current state.
    pub(crate) fn put(&mut self, key: u128, record: Option<Record>) {
        if let Some(i) = self.table_of(key) {
            self.tables[i].put(key, record.unwrap_or(Record { score: 0, seq: ABSENT }));
        }
    }

    /// Forgets everything, keeping the capacity.
    pub(crate) fn clear(&mut self) {
        for table in &mut self.tables {
            table.records = HashMap::default();
        }
    }

    /// Records held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.tables.iter().map(|table| table.records.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> Record {
        Record { score: i as i64, seq: i }
    }

    #[test]
    fn budget_is_used_by_tables_of_falling_powers_of_two() {
        // 48 MiB: one table would take 2^20 slots (917,504 records).
        let players = cached_players_for(48 << 20);
        assert_eq!(players, records_in((1 << 20) + (1 << 18) + (1 << 17) + (1 << 16)) as usize);
        let capacities = table_capacities(players);
        assert_eq!(capacities, [917_504, 229_376, 114_688, 57_344]);
        let slots: u64 = capacities.iter().map(|c| *c as u64 / 7 * 8).sum();
        assert!(slots * SLOT_BYTES <= 48 << 20);
        assert_eq!(cached_players_for(7 * SLOT_BYTES), 0);
        assert_eq!(cached_players_for(8 * SLOT_BYTES), 7);
        assert!(table_capacities(0).is_empty());
        assert_eq!(table_capacities(3), [3]);
        assert_eq!(table_capacities(7 + 3), [7, 3]);
    }

    #[test]
    fn capacities_round_trip_for_any_budget() {
        for bytes in [0u64, 300, 1 << 10, 100_000, 3 << 20, 48 << 20, 1 << 32] {
            let players = cached_players_for(bytes);
            let capacities = table_capacities(players);
            assert_eq!(capacities.iter().sum::<usize>(), players, "{bytes} bytes");
            for capacity in capacities {
                assert!((capacity as u64 / 7 * 8).is_power_of_two(), "{capacity}");
            }
        }
    }

    #[test]
    fn holds_its_capacity_without_evicting_and_answers_exactly() {
        let players = cached_players_for(1 << 20);
        let mut cache = RecordCache::new(players);
        assert!(cache.tables.len() > 1);
        // Keys as a shard makes them, so the tables share them by size (by
        // hash, so not exactly: fill to 90%).
        let keys: Vec<u128> = (0..players as u64 / 10 * 9).map(|i| RecordCache::key(&i.to_be_bytes())).collect();
        for (i, key) in keys.iter().enumerate() {
            cache.put(*key, Some(record(i as u64)));
        }
        assert_eq!(cache.len(), keys.len(), "evicted below capacity");
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(cache.get(*key), Some(Some(record(i as u64))));
        }
        for table in &cache.tables {
            assert!(table.records.len() <= table.capacity);
            assert!(table.records.capacity() <= table.capacity, "a table grew past its share");
        }
        assert_eq!(cache.take_lookups(), Lookups { hits: keys.len() as u64, misses: 0 });
        let absent = RecordCache::key(b"nobody");
        assert_eq!(cache.get(absent), None);
        assert_eq!(cache.take_lookups(), Lookups { hits: 0, misses: 1 });
        cache.put(absent, None);
        assert_eq!(cache.get(absent), Some(None));
        cache.clear();
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.get(keys[0]), None);
    }

    #[test]
    fn a_full_table_evicts_instead_of_growing() {
        for capacity in [3, 7, 10] {
            let mut cache = RecordCache::new(capacity);
            for i in 0..100u64 {
                let key = RecordCache::key(&i.to_be_bytes());
                cache.put(key, Some(record(i)));
                assert_eq!(cache.get(key), Some(Some(record(i))));
                assert!(cache.len() <= capacity);
            }
        }
        let mut disabled = RecordCache::new(0);
        disabled.put(1, Some(record(1)));
        assert_eq!(disabled.get(1), None);
    }
}
