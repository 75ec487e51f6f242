//! A map from board ids to entries, in pages of consecutive ids.
//!
//! Board ids are handed out in sequence and boards made together tend to
//! live and go together, so a shard's boards fill runs of consecutive ids.
//! A page of 64 entries found through a small directory costs an entry's
//! own size, where a hash map of a million boards cost twice as many
//! buckets (and a key in each), and filling it in id order at start-up
//! writes memory in order instead of all over a table of tens of MB.
//! The price is a page a live entry at worst (1 KB for the shard's
//! `Holding`), when all but one board of each run of 64 are dropped.

use std::collections::HashMap;

use crate::FastHasher;

/// Ids a page covers.
const PAGE: usize = 64;

/// An entry that can be empty: an empty entry is as good as none.
pub(super) trait Slot: Default {
    fn is_vacant(&self) -> bool;
}

/// Entries by id; see the module docs.
#[derive(Debug)]
pub(super) struct IdTable<T> {
    pages: HashMap<u64, Box<[T; PAGE]>, FastHasher>,
}

impl<T> Default for IdTable<T> {
    fn default() -> Self {
        Self { pages: HashMap::default() }
    }
}

/// The page of `id` and its place in it.
fn split(id: u64) -> (u64, usize) {
    (id / PAGE as u64, (id % PAGE as u64) as usize)
}

impl<T: Slot> IdTable<T> {
    /// Room for `ids` consecutive ids without growing the directory.
    pub(super) fn with_capacity(ids: usize) -> Self {
        Self { pages: HashMap::with_capacity_and_hasher(ids.div_ceil(PAGE), FastHasher::default()) }
    }

    /// The entry of `id`, unless empty.
    pub(super) fn get(&self, id: u64) -> Option<&T> {
        let (page, at) = split(id);
        Some(&self.pages.get(&page)?[at]).filter(|slot| !slot.is_vacant())
    }

    /// The entry of `id`, unless empty, to change. Emptying it is the
    /// caller's to follow with [`IdTable::tidy`].
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let (page, at) = split(id);
        Some(&mut self.pages.get_mut(&page)?[at]).filter(|slot| !slot.is_vacant())
    }

    /// The entry of `id`, made (empty) if there is none, to fill.
    pub(super) fn get_or_default(&mut self, id: u64) -> &mut T {
        let (page, at) = split(id);
        &mut self.pages.entry(page).or_insert_with(|| Box::new(std::array::from_fn(|_| T::default())))[at]
    }

    /// Frees the page of `id` if all its entries are empty: called after
    /// emptying an entry.
    pub(super) fn tidy(&mut self, id: u64) {
        let (page, _) = split(id);
        if self.pages.get(&page).is_some_and(|slots| slots.iter().all(Slot::is_vacant)) {
            self.pages.remove(&page);
        }
    }

    /// Every entry that is not empty, with its id, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.pages.iter().flat_map(|(&page, slots)| {
            let first = page * PAGE as u64;
            (first..=first + (PAGE as u64 - 1)).zip(slots.iter()).filter(|(_, slot)| !slot.is_vacant())
        })
    }

    /// Every entry that is not empty, with its id, to change (not to empty),
    /// in no order.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut T)> {
        self.pages.iter_mut().flat_map(|(&page, slots)| {
            let first = page * PAGE as u64;
            (first..=first + (PAGE as u64 - 1)).zip(slots.iter_mut()).filter(|(_, slot)| !slot.is_vacant())
        })
    }

    /// Pages held, for tests.
    #[cfg(test)]
    pub(super) fn pages(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    impl Slot for Option<u32> {
        fn is_vacant(&self) -> bool {
            self.is_none()
        }
    }

    #[test]
    fn follows_a_map_and_frees_empty_pages() {
        let mut table: IdTable<Option<u32>> = IdTable::with_capacity(1000);
        let mut map = BTreeMap::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Ids in a few runs, as boards are made, and some far apart.
            let id = match state % 3 {
                0 => state >> 40 & 0x3ff,
                1 => 1 << 40 | state >> 50 & 0xff,
                _ => u64::MAX - (state >> 56),
            };
            if state & 0x100 == 0 {
                *table.get_or_default(id) = Some(step);
                map.insert(id, step);
            } else {
                let taken = table.get_mut(id).and_then(Option::take);
                table.tidy(id);
                assert_eq!(taken, map.remove(&id));
            }
            assert_eq!(table.get(id).copied(), map.get(&id).map(|&v| Some(v)));
        }
        let held: BTreeMap<u64, u32> = table.iter().map(|(id, slot)| (id, slot.unwrap_or(0))).collect();
        assert_eq!(held, map);
        let pages: std::collections::BTreeSet<u64> = map.keys().map(|id| id / PAGE as u64).collect();
        assert_eq!(table.pages(), pages.len(), "a page for each run with an entry, no more");
        for (_, slot) in table.iter_mut() {
            *slot = slot.map(|v| v + 1);
        }
        assert!(table.iter().all(|(id, slot)| *slot == Some(map[&id] + 1)));
    }

    #[test]
    fn empty_entries_are_none() {
        let mut table: IdTable<Option<u32>> = IdTable::default();
        table.get_or_default(7); // made, never filled
        assert_eq!(table.get(7), None);
        assert!(table.get_mut(7).is_none());
        assert_eq!(table.iter().count(), 0);
        table.tidy(7);
        assert_eq!(table.pages(), 0);
    }
}
