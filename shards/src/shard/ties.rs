//! The shard's tie groups (`crate::ties`): followed as writes are staged,
//! built from the score index when a key crowds, rebuilt when the shard
//! opens, and counted for a deep `top`.

use super::apply::KeyChange;
use super::reads::POSITIONS_END;
use super::{Direction, Shard};
use crate::board::Ties;
use crate::error::ShardError;
use crate::key::TreeId;
use crate::ties::{chunk, first_name_from, group_prefix, Crowded, GROUP_AT};

/// The index range `[from, to)` of a group's players: list positions are the
/// score key and the name, so the range runs from the first name of the
/// group's prefix to the next prefix.
fn group_range(key: u128, path: &[u128]) -> (Vec<u8>, Vec<u8>) {
    let score_key = ((key >> 64) as u64).to_be_bytes();
    let prefix = group_prefix(key, path);
    let from = [&score_key[..], first_name_from(&prefix)].concat();
    let mut to = [&score_key[..], &prefix[..]].concat();
    // The next prefix: add one to the bytes as a big-endian number.
    match to.iter().rposition(|&b| b != 0xFF) {
        Some(i) => {
            to[i] += 1;
            to.truncate(i + 1);
        }
        None => to = POSITIONS_END.to_vec(),
    }
    (from, to)
}

impl Shard {
    /// Follows a staged change of `player` in `tree` (its tree keys' counts
    /// after it in `keys`) into the tie groups, building a group the change
    /// crowded. A failed build is only logged: counting a group without its
    /// own counts reads the index, exact but slower.
    pub(super) fn follow_ties(&mut self, tree: TreeId, ties: Ties, player: &str, keys: [Option<KeyChange>; 2]) {
        if ties == Ties::Ordinal {
            return; // reach sequences never tie
        }
        for KeyChange { key, delta, count } in keys.into_iter().flatten() {
            if let Some(crowded) = self.ties.add(tree, key, count, player.as_bytes(), delta) {
                if let Err(error) = self.build_tie_group(&crowded) {
                    tracing::warn!(%error, "could not build a tie group; deep pages in it read the index");
                }
            }
        }
    }

    /// Reads the names of a crowded group from the index and builds it.
    fn build_tie_group(&mut self, crowded: &Crowded) -> Result<(), ShardError> {
        let names = self.group_names(crowded.tree, crowded.key, &crowded.path)?;
        let mut names: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        self.ties.install(crowded, &mut names);
        Ok(())
    }

    /// The names of one group of `tree`, in list order.
    fn group_names(&self, tree: TreeId, key: u128, path: &[u128]) -> Result<Vec<Vec<u8>>, ShardError> {
        let (from, to) = group_range(key, path);
        let name = |position: Vec<u8>| position.get(8..).map(<[u8]>::to_vec).ok_or(ShardError::Corrupt("index key"));
        self.index_positions(tree, &from, &to, Direction::Forward).map(|position| name(position?)).collect()
    }

    /// Builds the groups of every crowded key of the trees of competition
    /// and dense boards: what a shard does once it has loaded its trees.
    pub(super) fn rebuild_ties(&mut self) -> Result<(), ShardError> {
        self.ties.clear();
        let mut crowded = Vec::new();
        // Most trees are far too small to crowd a key: passed over without
        // a look at their board.
        for (tree, counts) in self.held.trees().filter(|(_, counts)| counts.total() >= GROUP_AT) {
            let ties = self.held.config(tree.board).map(|config| config.ties);
            if ties.is_some_and(|t| t != Ties::Ordinal) {
                crowded.extend(counts.crowded_keys(GROUP_AT).into_iter().map(|key| Crowded {
                    tree,
                    key,
                    path: Vec::new(),
                }));
            }
        }
        for group in &crowded {
            self.build_tie_group(group)?;
        }
        Ok(())
    }

    /// For each of `pivots`, how many players of the group (`key` of
    /// `tree`, then the chunks of `path`) have a next chunk below it
    /// (`crate::ties::chunk` at depth `path.len() + 1`). From the group's
    /// counts when it has them, else from its (fewer than
    /// [`GROUP_AT`]) entries in the index.
    pub fn tie_counts(&self, tree: TreeId, key: u128, path: &[u128], pivots: &[u128]) -> Result<Vec<u64>, ShardError> {
        if let Some(counts) = self.ties.count_before(tree, key, path, pivots) {
            return Ok(counts);
        }
        let depth = path.len() + 1;
        let mut chunks: Vec<u128> = self.group_names(tree, key, path)?.iter().map(|n| chunk(n, depth)).collect();
        chunks.sort_unstable();
        Ok(pivots.iter().map(|p| chunks.partition_point(|c| c < p) as u64).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Mode, Order};
    use crate::key::{score_key, tiebreak, tree_key};
    use crate::shard::ShardOptions;
    use std::collections::BTreeSet;

    /// Every name of `names` in the group (`key`, `path`), counted below
    /// each pivot: what `tie_counts` must answer.
    fn brute(names: &BTreeSet<String>, key: u128, path: &[u128], pivots: &[u128]) -> Vec<u64> {
        let held: Vec<u128> = names
            .iter()
            .map(|n| n.as_bytes())
            .filter(|n| tiebreak(Ties::Competition, std::str::from_utf8(n).unwrap(), 0) == key as u64)
            .filter(|n| path.iter().enumerate().all(|(i, &c)| chunk(n, i + 1) == c))
            .map(|n| chunk(n, path.len() + 1))
            .collect();
        pivots.iter().map(|p| held.iter().filter(|c| *c < p).count() as u64).collect()
    }

    /// Players tied at one score under shared prefixes, written, removed and
    /// moved away, committed and reopened: the shard's counts inside the tie
    /// always equal the names', with and without the groups' own counts.
    #[test]
    fn tie_counts_follow_writes_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = crate::shard::all_time_board_with(Ties::Competition);
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        let mut names = BTreeSet::new();
        let name = |i: u64| match i % 3 {
            0 => format!("user:{:08}", i % 1500),
            1 => format!("user:0000{}:long-shared-suffix-of-many-bytes:{}", i % 7, i % 900),
            _ => format!("u{}", i % 50),
        };
        let key_of = |n: &str| tree_key(score_key(5, Order::Desc), tiebreak(Ties::Competition, n, 0));
        let check = |shard: &Shard, names: &BTreeSet<String>| {
            let keys: BTreeSet<u128> = names.iter().map(|n| key_of(n)).collect();
            for &key in &keys {
                let pivots: Vec<u128> = names.iter().map(|n| chunk(n.as_bytes(), 1)).chain([0, 1, u128::MAX]).collect();
                assert_eq!(shard.tie_counts(tree, key, &[], &pivots).unwrap(), brute(names, key, &[], &pivots));
                // One level down, under each first chunk of the key.
                let firsts: BTreeSet<u128> =
                    names.iter().filter(|n| key_of(n) == key).map(|n| chunk(n.as_bytes(), 1)).collect();
                for first in firsts {
                    let pivots: Vec<u128> =
                        names.iter().map(|n| chunk(n.as_bytes(), 2)).chain([0, u128::MAX]).collect();
                    let path = [first];
                    assert_eq!(shard.tie_counts(tree, key, &path, &pivots).unwrap(), brute(names, key, &path, &pivots));
                }
            }
        };
        let mut seq = 0;
        for round in 0..6u64 {
            for i in 0..1200u64 {
                let n = name(round * 7919 + i * 13);
                seq += 1;
                if (i + round) % 5 == 0 {
                    shard.remove(&board, &n).unwrap();
                    names.remove(&n);
                } else if (i + round) % 11 == 0 {
                    shard.write(&board, &n, 6, Mode::Set, seq).unwrap(); // leaves the tie
                    names.remove(&n);
                } else {
                    shard.write(&board, &n, 5, Mode::Set, seq).unwrap();
                    names.insert(n);
                }
            }
            check(&shard, &names);
            shard.commit().unwrap();
        }
        assert!(!shard.ties.is_empty(), "the test must crowd some keys");
        drop(shard);
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert!(!shard.ties.is_empty(), "rebuilt when opened");
        check(&shard, &names);
    }

    #[test]
    fn a_group_range_holds_its_names_and_no_other() {
        let key = crate::key::tree_key(9, crate::key::tiebreak(Ties::Competition, "user:002", 0));
        let path = [chunk(b"user:00250000", 1)];
        let (from, to) = group_range(key, &path);
        let at = |name: &str| [&9u64.to_be_bytes()[..], name.as_bytes()].concat();
        for inside in ["user:00250000", "user:00250000\0\0\0\0\0\0\0\0\0\0\0more"] {
            assert!(from <= at(inside) && at(inside) < to, "{inside}");
        }
        for outside in ["user:00250001", "user:0024", "user:002", "user:003"] {
            assert!(!(from <= at(outside) && at(outside) < to), "{outside}");
        }
        let (_, to) = group_range(u128::MAX, &[u128::MAX]);
        assert_eq!(to, POSITIONS_END.to_vec());
    }
}
