//! The boards by name, for the lookup every request makes, and the look
//! ahead that lets a batch's lookups wait for memory together.
//!
//! A board costs a pointer in the table: its name is read behind it. On a
//! server of a million boards each lookup waits for memory three times in
//! turn (the table's control bytes, the slot, the board), and one request
//! after another the waits added up: 7–8% of the server's CPU for writes
//! spread over a million boards. [`NameIndex::prefetch`] walks a batch's
//! names first, asking for each board without waiting for it, so the last
//! wait of each lookup overlaps the others (see
//! docs/performance-history.md).

use std::hash::{BuildHasher, RandomState};

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rankd_shards::tree::prefetch_entries;
use rankd_shards::SharedBoard;

/// See the module docs. Hashing is SipHash with a random key per process:
/// board names come from clients.
pub(super) struct NameIndex {
    table: HashTable<SharedBoard>,
    hasher: RandomState,
}

impl NameIndex {
    /// An index with room for `capacity` boards.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self { table: HashTable::with_capacity(capacity), hasher: RandomState::new() }
    }

    fn hash(&self, name: &str) -> u64 {
        name_hash(&self.hasher, name)
    }

    /// Boards held.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// The board called `name`, if any.
    pub(super) fn get(&self, name: &str) -> Option<&SharedBoard> {
        self.table.find(self.hash(name), |board| *board.name == *name)
    }

    /// Holds `board`, returning the board of its name it replaces.
    pub(super) fn replace(&mut self, board: SharedBoard) -> Option<SharedBoard> {
        let hash = self.hash(&board.name);
        let hasher = &self.hasher;
        match self.table.entry(hash, |held| held.name == board.name, |held| name_hash(hasher, &held.name)) {
            Entry::Occupied(mut held) => Some(std::mem::replace(held.get_mut(), board)),
            Entry::Vacant(vacant) => {
                vacant.insert(board);
                None
            }
        }
    }

    /// Forgets the board called `name`, returning it.
    pub(super) fn take(&mut self, name: &str) -> Option<SharedBoard> {
        let hash = self.hash(name);
        self.table.find_entry(hash, |board| *board.name == *name).ok().map(|held| held.remove().0)
    }

    /// Every board, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &SharedBoard> {
        self.table.iter()
    }

    /// Asks the CPU for the boards called `names` without waiting for them:
    /// the lookups that follow find them in its caches. Changes nothing.
    pub(super) fn prefetch<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut last = None;
        for name in names {
            // A pipelined batch names one board over and over: it is asked
            // for once.
            if last.replace(name) == Some(name) {
                continue;
            }
            // A probe that never matches visits each slot whose control
            // byte matches the name's hash (nearly always just the board's)
            // and stops at the first group with an empty slot.
            let _ = self.table.find(self.hash(name), |board| {
                prefetch_entries(std::slice::from_ref(&**board));
                false
            });
        }
    }
}

/// A name's hash: the one function for lookups and for moving boards when
/// the table grows, which must agree.
fn name_hash(hasher: &RandomState, name: &str) -> u64 {
    hasher.hash_one(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::{Board, BoardConfig};

    fn board(id: u64, name: &str) -> SharedBoard {
        SharedBoard::new(Board { id, name: name.into(), config: BoardConfig::default().into() })
    }

    #[test]
    fn finds_replaces_and_forgets_by_name() {
        let mut index = NameIndex::with_capacity(0);
        for i in 0..1000 {
            assert!(index.replace(board(i, &format!("b{i}"))).is_none());
        }
        assert_eq!(index.len(), 1000);
        index.prefetch(["b1", "missing", "b999"]);
        assert_eq!(index.get("b17").map(|b| b.id), Some(17));
        assert!(index.get("b1000").is_none());
        assert_eq!(index.replace(board(5000, "b17")).map(|b| b.id), Some(17));
        assert_eq!(index.get("b17").map(|b| b.id), Some(5000));
        assert_eq!(index.take("b17").map(|b| b.id), Some(5000));
        assert!(index.take("b17").is_none());
        assert!(index.get("b17").is_none());
        assert_eq!(index.len(), 999);
        let mut ids: Vec<u64> = index.iter().map(|b| b.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..1000).filter(|&i| i != 17).collect::<Vec<_>>());
    }
}
