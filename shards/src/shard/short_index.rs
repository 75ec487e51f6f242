//! A small tree's short names kept out of the score index and the
//! players' records.
//!
//! On a board with competition or dense ties a short name (up to 7 bytes,
//! no NUL: see `short_names`) is its tree key's tiebreak, and the key's
//! high half is the player's score: a tree of at most [`SMALL_TREE`]
//! players can list those names and give their scores from itself, and a
//! write to it stages no index change and no record for them. Spread over
//! a million small boards, those (the overlay's, then a run's and its
//! compactions' in keyspaces of millions of keys) were half of a write's
//! CPU (see docs/performance-history.md). A record read from a tree has
//! `seq` 0: on these boards the sequence keys nothing.
//!
//! The rule follows the tree's player count, which replay knows exactly
//! (not its shape: replay applies the log in key order). The index and the
//! records hold a tree's short names exactly while it has more than
//! [`SMALL_TREE`] players, and none while it has fewer:
//!
//! - a write that takes a tree past the bound enters every short name it
//!   holds (reading the stored entries of its names with a NUL byte first,
//!   before anything is staged: see [`Shard::plan_growth`]);
//! - a removal that brings it back to the bound removes them;
//! - replay stages every index change, as before, and then puts right each
//!   tree whose count crossed the bound in the stretch it rebuilt
//!   ([`Shard::settle_replayed`]).
//!
//! A name with a NUL byte is always indexed: a short one shares its tree
//! key with a shorter name (`a\0` and `a`), so a small tree's list takes
//! such names' keys off the tree's counts before it reads short names
//! from them, and so does a record's read on a shard that has stored such
//! a name. A data dir made before this indexed and recorded every name and
//! has no marks: it goes on doing so (one made in between, with the
//! index's mark only, records them all).

use std::collections::HashMap;

use super::reads::{player_key, Direction};
use super::short_names::is_own_tiebreak_bytes;
use super::Shard;
use crate::board::Ties;
use crate::error::ShardError;
use crate::key::{self, TreeId, TREE_PREFIX_LEN};
use crate::overlay;
use crate::record::Record;
use crate::tree::{TreeView, LEAF_CAPACITY};

/// Players a tree may hold and still list its short names from itself: a
/// compact tree's one leaf, which bounds what a small tree's list walks.
pub(super) const SMALL_TREE: u64 = LEAF_CAPACITY as u64;

/// The value `META_SHORT_NAMES_INDEXED` (or `META_SHORT_NAMES_RECORDED`)
/// holds in a data dir that leaves small trees' short names out of the
/// index (or the records): every one made since.
pub(super) const LEFT_OUT: [u8; 1] = [0];

/// Whether a data dir whose metadata holds `stored` under one of those
/// marks leaves them out: one made before the mark has none and keeps
/// every name.
pub(super) fn left_out(stored: Option<&[u8]>) -> Result<bool, ShardError> {
    match stored {
        None => Ok(false),
        Some(value) if value == LEFT_OUT => Ok(true),
        Some(_) => Err(ShardError::Corrupt("short names mark")),
    }
}

/// What a shard leaves out for a small tree's short names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LeftOut {
    /// Their score-index entries: lists read them from the tree.
    pub(super) index: bool,
    /// Their player records: reads take the score from the tree.
    pub(super) records: bool,
}

impl LeftOut {
    pub(super) fn any(self) -> bool {
        self.index || self.records
    }
}

/// Which way a change moved a tree's player count across [`SMALL_TREE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Crossing {
    /// From the bound to one past it: the tree's short names enter the
    /// index and the records.
    Up,
    /// From one past the bound to it: they leave.
    Down,
}

impl Crossing {
    /// The crossing of a change from `before` to `after` players, if any.
    pub(super) fn of(before: u64, after: u64) -> Option<Self> {
        match (before <= SMALL_TREE, after <= SMALL_TREE) {
            (true, false) => Some(Self::Up),
            (false, true) => Some(Self::Down),
            _ => None,
        }
    }
}

/// The list position of the short name whose tree key is `key`, if the key
/// can be one: its tiebreak ends in a zero byte (a NUL-free name of 8 bytes
/// or more has none there). Zero-padding keeps the names' byte order, so
/// positions come out in key order.
fn short_name_position(key: u128) -> Option<Vec<u8>> {
    let tiebreak = (key as u64).to_be_bytes();
    if tiebreak[7] != 0 {
        return None;
    }
    let len = tiebreak.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
    Some([&((key >> 64) as u64).to_be_bytes()[..], &tiebreak[..len]].concat())
}

/// The tree key of an indexed name that looks like a short name's in the
/// tree (its tiebreak ends in a zero byte) without being one: a name with
/// a NUL byte.
fn key_shared_with_a_short_name(position: &[u8]) -> Option<u128> {
    let (score_key, name) = position.split_first_chunk::<8>()?;
    let tiebreak = key::name_tiebreak(name);
    (!is_own_tiebreak_bytes(name) && tiebreak as u8 == 0)
        .then(|| key::tree_key(u64::from_be_bytes(*score_key), tiebreak))
}

/// The list positions of the short names `tree` holds, ascending, given
/// the indexed positions of its other names (to tell a NUL name's key).
fn short_names_held(tree: TreeView<'_>, indexed: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let shared: Vec<u128> = indexed.iter().filter_map(|position| key_shared_with_a_short_name(position)).collect();
    let mut held = Vec::new();
    for (key, count) in tree.entries() {
        let others = shared.iter().filter(|&&k| k == key).count() as u64;
        if count > others {
            held.extend(short_name_position(key));
        }
    }
    held
}

/// Splits `score key ‖ tail` for the overlay.
fn split(position: &[u8]) -> (u64, Vec<u8>) {
    let (score_key, tail) =
        position.split_first_chunk::<8>().map_or((0, &[][..]), |(s, t)| (u64::from_be_bytes(*s), t));
    (score_key, tail.to_vec())
}

/// What [`Shard::settle_replayed`] needs of a tree replay rebuilt: its
/// player count now, and its lowest since the rebuilt stretch began.
#[derive(Debug, Clone, Copy)]
pub(super) struct Replayed {
    now: u64,
    lowest: u64,
}

/// The trees a replay's rebuilt stretch changed (see [`Replayed`]).
#[derive(Debug, Default)]
pub(super) struct ReplayedTrees(HashMap<TreeId, Replayed>);

impl ReplayedTrees {
    /// Notes a change of `tree` by `delta` players; `count` tells its count
    /// where the stretch began, asked only the first time.
    pub(super) fn note(&mut self, tree: TreeId, delta: i64, count: impl FnOnce() -> u64) {
        let entry = self.0.entry(tree).or_insert_with(|| {
            let at_start = count();
            Replayed { now: at_start, lowest: at_start }
        });
        entry.now = entry.now.saturating_add_signed(delta);
        entry.lowest = entry.lowest.min(entry.now);
    }
}

impl Shard {
    /// What writes to a board with `ties` leave out for short names while
    /// its trees are small.
    pub(super) fn leaves_short_names_out(&self, ties: Ties) -> LeftOut {
        if ties == Ties::Ordinal {
            return LeftOut::default();
        }
        self.short_names_left_out
    }

    /// For a write that adds a player to `tree` (of a board with `ties`):
    /// if it takes the tree past the bound, the stored index entries of the
    /// tree, read now, before anything is staged, for
    /// [`Shard::short_names_crossed`] to enter its short names with.
    pub(super) fn plan_growth(&self, ties: Ties, tree: TreeId) -> Result<Option<Vec<Vec<u8>>>, ShardError> {
        let count = self.held.tree(&tree).map_or(0, |t| t.total());
        if !self.leaves_short_names_out(ties).any() || Crossing::of(count, count + 1) != Some(Crossing::Up) {
            return Ok(None);
        }
        self.stored_nul_names(tree).map(Some)
    }

    /// Puts the index right after a change took `tree` across the bound:
    /// `Up`, every short name it holds entered (`stored`: its stored
    /// entries, from [`Shard::plan_growth`]); `Down`, every one removed.
    pub(super) fn short_names_crossed(&mut self, tree: TreeId, crossing: Crossing, stored: Vec<Vec<u8>>) {
        let Some(config) = self.held.config(tree.board) else { return };
        let (order, left_out) = (config.order, self.leaves_short_names_out(config.ties));
        let Some(view) = self.held.tree(&tree) else { return };
        let (positions, present) = match crossing {
            Crossing::Up => (short_names_held(view, &self.laid_over(tree, stored)), true),
            // Keys a NUL name holds too are removed as well: removing an
            // entry no one has changes nothing.
            Crossing::Down => {
                (view.entries().into_iter().filter_map(|(key, _)| short_name_position(key)).collect(), false)
            }
        };
        for position in positions {
            let (score_key, name) = split(&position);
            if left_out.records {
                let record = present.then(|| Record { score: key::score_from_key(score_key, order), seq: 0 });
                self.overlay.set_record(player_key(tree, &name), record);
            }
            if left_out.index {
                self.overlay.set_index(tree, score_key, name, present);
            }
        }
    }

    /// After replay: the rebuilt stretch staged every change, as if no tree
    /// were small, so every short name that left a tree ends with a
    /// removal. A tree small now has the short names it holds removed too:
    /// storage may hold them whether the tree was large where the stretch
    /// began or a run of the stretch reached storage before the crash
    /// without its marker (runs hold final values; dropping the staged
    /// changes instead left such a run's entries behind, found by
    /// `tests/small_boards.rs`). One large now that was small somewhere
    /// has its short names entered.
    pub(super) fn settle_replayed(&mut self, replayed: ReplayedTrees) -> Result<(), ShardError> {
        for (tree, Replayed { now, lowest }) in replayed.0 {
            let Some(ties) = self.held.config(tree.board).map(|config| config.ties) else { continue };
            if !self.leaves_short_names_out(ties).any() {
                continue;
            }
            if now <= SMALL_TREE {
                self.short_names_crossed(tree, Crossing::Down, Vec::new());
            } else if lowest <= SMALL_TREE {
                let stored = self.stored_nul_names(tree)?;
                self.short_names_crossed(tree, Crossing::Up, stored);
            }
        }
        Ok(())
    }

    /// A small tree's list positions, ascending: its indexed names' and
    /// its short names, read from the tree; `None` where the index lists
    /// the tree whole.
    pub(super) fn small_tree_positions(&self, tree: TreeId) -> Option<Result<Vec<Vec<u8>>, ShardError>> {
        let ties = self.held.config(tree.board)?.ties;
        let view = self.held.tree(&tree)?;
        if !self.leaves_short_names_out(ties).index || view.total() > SMALL_TREE {
            return None;
        }
        Some(self.stored_positions(tree).map(|stored| {
            let mut positions = self.laid_over(tree, stored);
            positions.extend(short_names_held(view, &positions));
            positions.sort_unstable();
            positions.dedup();
            positions
        }))
    }

    /// A short name's record in a small tree whose records leave them out,
    /// read from the tree (`seq` 0: on these boards it keys nothing);
    /// `None` where the records are to be read (another name, a large
    /// tree, a data dir that records them all). A name with a NUL byte that
    /// pads to the same key is told apart by its index entry.
    pub(super) fn short_record(&self, tree: TreeId, player: &str) -> Result<Option<Option<Record>>, ShardError> {
        if !is_own_tiebreak_bytes(player.as_bytes()) {
            return Ok(None);
        }
        let Some(config) = self.held.config(tree.board) else { return Ok(None) };
        if !self.leaves_short_names_out(config.ties).records {
            return Ok(None);
        }
        let Some(view) = self.held.tree(&tree) else { return Ok(Some(None)) };
        if view.total() > SMALL_TREE {
            return Ok(None);
        }
        // The common case, in place, nothing unpacked: a compact tree on a
        // shard where no NUL name can share the tiebreak.
        if let Some(record) = self.record_in_tree(config, &tree, player) {
            return Ok(Some(record));
        }
        self.cache.lock().count_tree_read();
        let tiebreak = key::tiebreak(config.ties, player, 0);
        let score = |key: u128| Record { score: key::score_from_key((key >> 64) as u64, config.order), seq: 0 };
        let mut keys: Vec<(u128, u64)> =
            view.entries().into_iter().filter(|(key, _)| *key as u64 == tiebreak).collect();
        if !keys.is_empty() && self.nul_names {
            let indexed = self.laid_over(tree, self.stored_positions(tree)?);
            for shared in indexed.iter().filter_map(|position| key_shared_with_a_short_name(position)) {
                if let Some((_, count)) = keys.iter_mut().find(|(key, _)| *key == shared) {
                    *count = count.saturating_sub(1);
                }
            }
        }
        let held = keys.into_iter().find(|(_, count)| *count > 0);
        Ok(Some(held.map(|(key, _)| score(key))))
    }

    /// What entering a tree's short names needs of its stored index
    /// entries: those of names with a NUL byte, which only a shard that has
    /// stored one can hold; elsewhere nothing is read.
    fn stored_nul_names(&self, tree: TreeId) -> Result<Vec<Vec<u8>>, ShardError> {
        if self.nul_names {
            self.stored_positions(tree)
        } else {
            Ok(Vec::new())
        }
    }

    /// Every stored index entry of `tree`, in position order.
    fn stored_positions(&self, tree: TreeId) -> Result<Vec<Vec<u8>>, ShardError> {
        let prefix = tree.prefix();
        let position = |item: fjall::Guard| -> Result<Vec<u8>, ShardError> {
            let key = item.key()?;
            key.get(TREE_PREFIX_LEN..).map(<[u8]>::to_vec).ok_or(ShardError::Corrupt("index key"))
        };
        self.storage.index.prefix(prefix).map(position).collect()
    }

    /// `tree`'s index entries as the overlays leave `stored`: what exists.
    fn laid_over(&self, tree: TreeId, stored: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        let mut merged: overlay::Layered<'_> = Box::new(stored.into_iter().map(|position| Ok((position, true))));
        let everything = (&[][..], &super::reads::POSITIONS_END[..]);
        for layer in self.in_flight.overlays().chain(std::iter::once(&self.overlay)) {
            let changes = layer.index_range(tree, everything.0, everything.1, true);
            merged = Box::new(overlay::layer(merged, changes, true));
        }
        // Nothing below the overlays is read here: no entry is an error.
        merged.filter_map(Result::ok).filter_map(|(position, present)| present.then_some(position)).collect()
    }
}

/// `positions` (ascending) from `from` (inclusive) to `to` (exclusive), in
/// `direction`'s order: a small tree's list read as the index's would be.
pub(super) fn in_range(
    mut positions: Vec<Vec<u8>>,
    from: &[u8],
    to: &[u8],
    direction: Direction,
) -> impl Iterator<Item = Vec<u8>> {
    positions.retain(|position| from <= position.as_slice() && position.as_slice() < to);
    if direction == Direction::Backward {
        positions.reverse();
    }
    positions.into_iter()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::storage::{META_SHORT_NAMES_INDEXED, META_SHORT_NAMES_RECORDED};
    use super::super::{all_time_board_with, ShardOptions};
    use super::*;
    use crate::board::{Mode, Order};

    /// Whether a list position (score key, then the name: competition and
    /// dense ties) is a short name's.
    fn is_short_name_position(position: &[u8]) -> bool {
        position.get(8..).is_some_and(is_own_tiebreak_bytes)
    }

    #[test]
    fn a_crossing_is_the_count_passing_the_bound() {
        assert_eq!(Crossing::of(SMALL_TREE, SMALL_TREE + 1), Some(Crossing::Up));
        assert_eq!(Crossing::of(SMALL_TREE + 1, SMALL_TREE), Some(Crossing::Down));
        assert_eq!(Crossing::of(SMALL_TREE, SMALL_TREE), None);
        assert_eq!(Crossing::of(SMALL_TREE + 1, SMALL_TREE + 2), None);
        assert_eq!(Crossing::of(0, 1), None);
    }

    proptest! {
        /// A short name's tree key gives back its list position, and the
        /// keys of two short names order as their positions do; a long
        /// name's gives none, and a position says which it is.
        #[test]
        fn a_short_names_tree_key_gives_its_list_position(
            names in proptest::collection::vec("[^\u{0}]{1,9}", 2),
            scores in proptest::collection::vec(-3i64..3, 2),
            dense in any::<bool>(),
            asc in any::<bool>(),
        ) {
            let ties = if dense { Ties::Dense } else { Ties::Competition };
            let order = if asc { Order::Asc } else { Order::Desc };
            let mut keyed = Vec::new();
            for (name, score) in names.iter().zip(&scores) {
                let score_key = key::score_key(*score, order);
                let position = key::list_position(ties, score_key, 0, name);
                let tree_key = key::tree_key(score_key, key::tiebreak(ties, name, 0));
                prop_assert_eq!(is_short_name_position(&position), name.len() < 8);
                prop_assert_eq!(key_shared_with_a_short_name(&position), None);
                let expected = (name.len() < 8).then(|| position.clone());
                prop_assert_eq!(short_name_position(tree_key), expected, "{:?}", name);
                keyed.push((tree_key, position));
            }
            if names.iter().all(|name| name.len() < 8) {
                prop_assert_eq!(keyed[0].0.cmp(&keyed[1].0), keyed[0].1.cmp(&keyed[1].1));
            }
        }
    }

    /// A name with a NUL byte whose tiebreak ends in a zero byte holds a
    /// key a short name could: the one it pads to.
    #[test]
    fn a_nul_name_shares_the_key_of_the_name_it_pads_to() {
        let position = |name: &str| key::list_position(Ties::Competition, 5, 0, name);
        let key_of = |name: &str| key::tree_key(5, key::tiebreak(Ties::Competition, name, 0));
        assert_eq!(key_shared_with_a_short_name(&position("a\0")), Some(key_of("a")));
        assert_eq!(key_shared_with_a_short_name(&position("abcdefg\0xyz")), Some(key_of("abcdefg")));
        assert_eq!(key_shared_with_a_short_name(&position("a\0b")), Some(key_of("a\0b")));
        assert_eq!(key_shared_with_a_short_name(&position("abcdefgh")), None, "its 8th byte is not zero");
        assert_eq!(key_shared_with_a_short_name(&position("abcdefgh\0")), None);
        assert_eq!(key_shared_with_a_short_name(&position("a")), None, "a short name itself");
    }

    /// `tree`'s index entries as a run would leave them (storage with the
    /// overlays over it), short names only.
    fn indexed_short_names(shard: &Shard, tree: TreeId) -> Vec<String> {
        let entries = shard.laid_over(tree, shard.stored_positions(tree).unwrap());
        let short = entries.into_iter().filter(|position| is_short_name_position(position));
        short.map(|position| String::from_utf8(position[8..].to_vec()).unwrap()).collect()
    }

    /// The index and the records hold a tree's short names exactly while
    /// the tree has more than [`SMALL_TREE`] players, through a crossing
    /// each way, a commit and a restart, and lists and gets never change
    /// for it; long names and names with a NUL are indexed throughout. A
    /// data dir made before the marks indexes and records every name.
    #[test]
    fn short_names_are_indexed_exactly_while_a_tree_is_large() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board_with(Ties::Competition);
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        let names: Vec<String> = (0..SMALL_TREE - 2).map(|i| format!("p{i}")).collect();
        let mut seq = 0;
        let mut write = |shard: &mut Shard, name: &str, score: i64| {
            seq += 1;
            shard.write(&board, name, score, Mode::Set, seq).unwrap();
        };
        for (i, name) in names.iter().enumerate() {
            write(&mut shard, name, i as i64 % 7);
        }
        write(&mut shard, "longer-name", 3);
        write(&mut shard, "p1\0", 1); // shares `p1`'s key
        assert_eq!(shard.count(tree), SMALL_TREE);
        let listed = |shard: &Shard| -> Vec<String> {
            let all = shard.list(tree, Ties::Competition, Order::Desc, &[], Direction::Forward, 1000).unwrap();
            all.into_iter().map(|entry| entry.player).collect()
        };
        assert!(indexed_short_names(&shard, tree).is_empty(), "a small tree");
        let recorded = |shard: &Shard, name: &str| shard.unwritten_or_stored(&player_key(tree, name)).unwrap();
        assert_eq!(recorded(&shard, "p3"), None);
        assert_eq!(shard.get(tree, "p3").unwrap().map(|r| r.score), Some(3));
        assert_eq!(shard.get(tree, "p1").unwrap().map(|r| r.score), Some(1), "beside `p1\\0`");
        assert!(recorded(&shard, "longer-name").is_some() && recorded(&shard, "p1\0").is_some());
        let small = listed(&shard);
        assert_eq!(small.len() as u64, SMALL_TREE);

        write(&mut shard, "q", 9);
        let mut expected: Vec<String> = names.clone();
        expected.push("q".into());
        expected.sort();
        let mut indexed = indexed_short_names(&shard, tree);
        indexed.sort();
        assert_eq!(indexed, expected, "past the bound, every short name");
        assert_eq!(recorded(&shard, "p3").map(|r| r.score), Some(3));
        assert_eq!(shard.get(tree, "p3").unwrap().map(|r| r.score), Some(3));
        assert_eq!(listed(&shard)[0], "q");
        write(&mut shard, "p0", 100);
        assert_eq!(listed(&shard)[0], "p0", "a large tree's moves go to the index");

        shard.remove(&board, "q").unwrap();
        assert!(indexed_short_names(&shard, tree).is_empty(), "back to the bound");
        assert_eq!(recorded(&shard, "p3"), None);
        assert_eq!(shard.get(tree, "q").unwrap(), None);
        write(&mut shard, "p2", -5);
        shard.commit().unwrap();
        let after = listed(&shard);
        assert_eq!(after.last().map(String::as_str), Some("p2"));
        assert_eq!(after.len() as u64, SMALL_TREE);
        assert!(after.contains(&"p1\0".to_string()) && after.contains(&"p1".to_string()));
        drop(shard);
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(listed(&shard), after, "across a restart");
        assert!(indexed_short_names(&shard, tree).is_empty());
        shard.check().unwrap();
        drop(shard);

        let older = tempfile::tempdir().unwrap();
        let shard = Shard::open(older.path(), ShardOptions::default()).unwrap();
        shard.storage.meta.remove(META_SHORT_NAMES_INDEXED).unwrap(); // as a data dir made before the marks
        shard.storage.meta.remove(META_SHORT_NAMES_RECORDED).unwrap();
        drop(shard);
        let mut shard = Shard::open(older.path(), ShardOptions::default()).unwrap();
        shard.write(&board, "a", 5, Mode::Set, 1).unwrap();
        assert_eq!(indexed_short_names(&shard, tree), ["a"]);
        assert_eq!(shard.unwritten_or_stored(&player_key(tree, "a")).unwrap().map(|r| r.score), Some(5));
        assert_eq!(shard.small_tree_positions(tree).map(drop), None);
    }
}
