//! A small board's players read from its count tree, not from the record
//! cache or storage.
//!
//! On a board ranked with competition or dense ties a tree key's low half
//! is the player's name: its first 8 bytes, zero-padded (`key::tiebreak`).
//! A name of up to 7 bytes and no NUL byte is that tiebreak whole, and no
//! other name without a NUL has it; so in a compact tree (one sorted leaf,
//! every small board's) the one entry with it is that player's, and its
//! score key is the player's score. A write finds the score it replaces
//! there, and a read the player's score, whatever the record cache holds:
//! writes and ranks spread over a million small boards (five million
//! players, far more than the cache) otherwise read storage for nearly
//! every one.
//!
//! A name with a NUL byte would share its tiebreak with a shorter one, so
//! the first such name a shard stores turns this off for that shard, for
//! good: the batch storing the name also records it in the shard's
//! metadata. A data dir made before the mark existed has none and is
//! treated as holding such a name.

use super::reads::PlayerKey;
use super::storage::META_NUL_NAMES;
use super::Shard;
use crate::board::{BoardConfig, Ties};
use crate::error::ShardError;
use crate::key::{self, TreeId};
use crate::record::Record;
use crate::tree::TiebreakHeld;

/// Whether `player` is its own tiebreak on a board with competition or
/// dense ties, and no other name without a NUL byte shares it.
pub(super) fn is_own_tiebreak(player: &str) -> bool {
    is_own_tiebreak_bytes(player.as_bytes())
}

/// [`is_own_tiebreak`] of a name's bytes.
pub(super) fn is_own_tiebreak_bytes(name: &[u8]) -> bool {
    name.len() < 8 && !name.contains(&0)
}

/// The value [`META_NUL_NAMES`] holds when a shard has stored such a name.
const HOLDS_NUL_NAMES: [u8; 1] = [1];
/// The value [`META_NUL_NAMES`] holds when it has not.
pub(super) const NO_NUL_NAMES: [u8; 1] = [0];

/// Whether a shard whose metadata holds `stored` under [`META_NUL_NAMES`]
/// may hold a name with a NUL byte (see the module docs).
pub(super) fn may_hold_nul_names(stored: Option<&[u8]>) -> Result<bool, ShardError> {
    match stored {
        None => Ok(true),
        Some(value) if value == NO_NUL_NAMES => Ok(false),
        Some(value) if value == HOLDS_NUL_NAMES => Ok(true),
        Some(_) => Err(ShardError::Corrupt("names mark")),
    }
}

impl Shard {
    /// Whether `player`'s record may be read from a tree on this shard at
    /// all: the checks that need no memory beyond the name.
    pub(super) fn may_read_from_tree(&self, player: &str) -> bool {
        !self.nul_names && is_own_tiebreak(player)
    }

    /// `player`'s record in `tree` as the tree itself tells it (see the
    /// module docs): `Some(None)` if absent, `None` where the tree cannot
    /// tell. Its `seq` is 0: on these boards a record's sequence keys
    /// nothing (`key::tiebreak`), and a write only removes the old key.
    pub(super) fn record_in_tree(&self, config: &BoardConfig, tree: &TreeId, player: &str) -> Option<Option<Record>> {
        if !self.may_read_from_tree(player) || config.ties == Ties::Ordinal {
            return None;
        }
        let held = self.held.tree(tree)?.find_tiebreak(key::tiebreak(config.ties, player, 0))?;
        let record = match held {
            TiebreakHeld::Nowhere => None,
            TiebreakHeld::Once(key) => {
                Some(Record { score: key::score_from_key((key >> 64) as u64, config.order), seq: 0 })
            }
            TiebreakHeld::More => return None,
        };
        self.cache.lock().count_tree_read();
        Some(record)
    }

    /// The record a write or removal of `player` (whose key is `key`) in
    /// `tree` replaces: read from the tree where it tells, else as
    /// [`Shard::get`] reads it.
    pub(super) fn replaced_record(
        &self,
        config: &BoardConfig,
        tree: TreeId,
        player: &str,
        key: &PlayerKey,
    ) -> Result<Option<Record>, ShardError> {
        if let Some(record) = self.short_record(tree, player)? {
            return Ok(record);
        }
        match self.record_in_tree(config, &tree, player) {
            Some(record) => Ok(record),
            None => self.record(key),
        }
    }

    /// Notes that `player` is about to be stored: the first name with a
    /// NUL byte turns reading records from trees off, in the batch that
    /// stores it.
    pub(super) fn note_stored_name(&mut self, player: &str) {
        if !self.nul_names && player.as_bytes().contains(&0) {
            self.nul_names = true;
            self.staged.meta.insert(META_NUL_NAMES.to_vec(), Some(HOLDS_NUL_NAMES.to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{all_time_board_with, Shard, ShardOptions};
    use super::*;
    use crate::board::{Board, Mode, Order};

    /// Short names, names of 8 bytes and more sharing their first bytes
    /// (never read from a tree), and multi-byte UTF-8.
    const NAMES: [&str; 8] = ["a", "b", "ab", "abcdefg", "abcdefgh", "abcdefgh1", "é", "日本"];

    /// The record `player` has in `tree` as storage holds it, cache aside.
    fn stored(shard: &Shard, tree: TreeId, player: &str) -> Option<i64> {
        let key = PlayerKey::new(tree, player);
        shard.unwritten_or_stored(&key.stored).expect("read").map(|r| r.score)
    }

    /// Checks every name's record in `tree` against storage: read from the
    /// tree for a short name while it is compact, and the same score, also
    /// as a rank reads it.
    fn check_all(shard: &Shard, board: &Board, tree: TreeId) -> Result<(), TestCaseError> {
        let searchable = shard.held.tree(&tree).is_some_and(|t| t.is_compact());
        for player in NAMES {
            let from_tree = shard.record_in_tree(&board.config, &tree, player);
            let expected = stored(shard, tree, player);
            let ranked = shard.rank_record(tree, player).expect("read");
            prop_assert_eq!(ranked.map(|r| r.score), expected, "a rank's record of {}", player);
            match from_tree {
                Some(record) => prop_assert_eq!(record.map(|r| r.score), expected, "{}", player),
                None => {
                    prop_assert!(!searchable || !is_own_tiebreak(player), "{} should be read from its tree", player)
                }
            }
        }
        Ok(())
    }

    fn board(ties: Ties, order: Order) -> (Board, TreeId) {
        let (mut board, tree) = all_time_board_with(ties);
        let mut config = (*board.config).clone();
        config.order = order;
        board.config = config.into();
        (board, tree)
    }

    /// A shard on a data dir that indexes and records every name, as one
    /// made before small trees' short names were left out (`short_index`):
    /// where a record read from a tree can be held to the stored one.
    fn open_recording_all(dir: &std::path::Path) -> Shard {
        let shard = Shard::open(dir, ShardOptions::default()).unwrap();
        shard.storage.meta.remove(super::super::storage::META_SHORT_NAMES_INDEXED).unwrap();
        shard.storage.meta.remove(super::super::storage::META_SHORT_NAMES_RECORDED).unwrap();
        drop(shard);
        Shard::open(dir, ShardOptions::default()).unwrap()
    }

    proptest! {
        /// A short name's record read from a compact tree is the one
        /// storage holds (in a data dir that records every name), through
        /// writes in every mode, removals, commits and a reopen; a long
        /// name's is never read there.
        #[test]
        fn a_record_read_from_its_tree_is_the_stored_one(
            dense in any::<bool>(),
            asc in any::<bool>(),
            ops in proptest::collection::vec((0..NAMES.len(), -3i64..4, 0u8..5), 1..40),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let ties = if dense { Ties::Dense } else { Ties::Competition };
            let (board, tree) = board(ties, if asc { Order::Asc } else { Order::Desc });
            let mut shard = open_recording_all(dir.path());
            for (i, (player, score, op)) in ops.into_iter().enumerate() {
                let player = NAMES[player];
                let seq = i as u64 + 1;
                let done = match op {
                    0 => shard.remove(&board, player).map(drop),
                    1 => shard.write(&board, player, score, Mode::Incr, seq).map(drop),
                    2 => shard.write(&board, player, score, Mode::Best, seq).map(drop),
                    3 => shard.commit().map(drop),
                    _ => shard.write(&board, player, score, Mode::Set, seq).map(drop),
                };
                prop_assert!(done.is_ok() || matches!(done, Err(ShardError::Overflow)));
                check_all(&shard, &board, tree)?;
            }
            shard.commit().unwrap();
            drop(shard);
            let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
            check_all(&shard, &board, tree)?;
        }
    }

    /// Ordinal ties key by arrival, not by name: never read from a tree.
    #[test]
    fn ordinal_boards_read_records_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board_with(Ties::Ordinal);
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "a", 1, Mode::Set, 1).unwrap();
        assert_eq!(shard.record_in_tree(&board.config, &tree, "a"), None);
        assert_eq!(shard.rank_record(tree, "a").unwrap(), Some(Record { score: 1, seq: 1 }));
    }

    /// A tree burst past one leaf is not searched by name.
    #[test]
    fn a_burst_tree_is_not_searched() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board_with(Ties::Competition);
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "p0", 7, Mode::Set, 1).unwrap();
        assert_eq!(shard.record_in_tree(&board.config, &tree, "p0").map(|r| r.map(|r| r.score)), Some(Some(7)));
        for i in 1..500 {
            shard.write(&board, &format!("p{i}"), i, Mode::Set, i as u64 + 1).unwrap();
        }
        assert!(!shard.held.tree(&tree).expect("held").is_compact());
        assert_eq!(shard.record_in_tree(&board.config, &tree, "p0"), None);
        assert_eq!(shard.write(&board, "p0", 1, Mode::Incr, 600).unwrap(), 8);
    }

    /// The first name with a NUL byte turns reading from trees off for good:
    /// `a` and `a\0` share a tiebreak. A data dir without the mark (made
    /// before it) is taken as holding such a name.
    #[test]
    fn a_name_with_a_nul_turns_it_off_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board_with(Ties::Competition);
        let score_of = |shard: &Shard| shard.record_in_tree(&board.config, &tree, "a").map(|r| r.map(|r| r.score));
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "a", 5, Mode::Set, 1).unwrap();
        shard.commit().unwrap();
        drop(shard);
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(score_of(&shard), Some(Some(5)), "no NUL name yet, across a restart");
        shard.remove(&board, "a").unwrap();
        shard.write(&board, "a\0", 9, Mode::Set, 2).unwrap();
        assert_eq!(score_of(&shard), None, "`a` must not be taken for `a\\0`");
        assert_eq!(shard.write(&board, "a", 1, Mode::Incr, 3).unwrap(), 1, "a new player");
        shard.commit().unwrap();
        drop(shard);
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(score_of(&shard), None, "the mark survives a restart");
        assert_eq!(shard.get(tree, "a\0").unwrap().map(|r| r.score), Some(9));
        drop(shard);

        let older = tempfile::tempdir().unwrap();
        let shard = Shard::open(older.path(), ShardOptions::default()).unwrap();
        shard.storage.meta.remove(META_NUL_NAMES).unwrap(); // as a data dir made before the mark
        drop(shard);
        let mut shard = Shard::open(older.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "a", 5, Mode::Set, 1).unwrap();
        assert_eq!(score_of(&shard), None);
    }
}
