//! The shard's answers against the oracle: one tree (gets, counts, ranks,
//! lists), every readable period of a board, and expired periods gone.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::key::{score_key, tiebreak, tree_key};
use rankd_shards::window;
use rankd_shards::{Board, BoardConfig, Direction, Record, Shard, Ties, TreeId};

use crate::calendar::readable;
use crate::ok;
use crate::oracle::{better, sorted, OBoard};

/// One tree against the oracle's players. `gets` are the names whose `get`
/// is checked; `lists` needs a committed shard.
pub fn check_tree(
    shard: &Shard,
    cfg: &BoardConfig,
    tree: TreeId,
    players: &BTreeMap<String, Record>,
    gets: &[&str],
    lists: bool,
) -> Result<(), TestCaseError> {
    // A record's `seq` orders ties on ordinal boards only; elsewhere a
    // small tree's short name is read from the tree, without one.
    let seen = |record: Option<Record>| record.map(|r| (r.score, if cfg.ties == Ties::Ordinal { r.seq } else { 0 }));
    for &name in gets {
        let got = seen(ok(shard.get(tree, name))?);
        prop_assert_eq!(got, seen(players.get(name).copied()), "get {:?} in {:?}", name, tree);
    }
    prop_assert_eq!(shard.count(tree), players.len() as u64, "count of {:?}", tree);

    let mut groups: BTreeMap<u64, u64> = BTreeMap::new();
    for r in players.values() {
        *groups.entry(score_key(r.score, cfg.order)).or_default() += 1;
    }
    let score_counts = shard.score_counts(tree);
    prop_assert_eq!(&score_counts, &groups.into_iter().collect::<Vec<_>>(), "score_counts of {:?}", tree);
    let distinct: BTreeSet<i64> = players.values().map(|r| r.score).collect();

    let list = sorted(cfg, players);
    let keys: Vec<u128> =
        list.iter().map(|(n, r)| tree_key(score_key(r.score, cfg.order), tiebreak(cfg.ties, n, r.seq))).collect();
    let own = shard.count_before(tree, &keys);
    for (i, (name, r)) in list.iter().enumerate() {
        let sk = score_key(r.score, cfg.order);
        let strictly = players.values().filter(|q| better(cfg.order, q.score, r.score)).count() as u64;
        let competition = 1 + shard.count_before(tree, &[tree_key(sk, 0)])[0];
        prop_assert_eq!(competition, 1 + strictly, "competition rank of {:?} in {:?}", name, tree);
        let dense = 1 + score_counts.iter().take_while(|(s, _)| *s < sk).count() as u64;
        let want_dense = 1 + distinct.iter().filter(|s| better(cfg.order, **s, r.score)).count() as u64;
        prop_assert_eq!(dense, want_dense, "dense rank of {:?} in {:?}", name, tree);
        let smaller = keys.iter().filter(|q| **q < keys[i]).count() as u64;
        prop_assert_eq!(own[i], smaller, "count_before own key of {:?} in {:?}", name, tree);
        if cfg.ties == Ties::Ordinal {
            // Ordinal rank is the list position.
            prop_assert_eq!(1 + own[i], 1 + i as u64, "ordinal rank of {:?} in {:?}", name, tree);
        }
    }

    if lists {
        let got = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
        let got: Vec<(String, i64, u64)> = got.into_iter().map(|e| (e.player, e.score, e.seq)).collect();
        let want: Vec<(String, i64, u64)> =
            list.iter().map(|(n, r)| (n.clone(), r.score, if cfg.ties == Ties::Ordinal { r.seq } else { 0 })).collect();
        prop_assert_eq!(got, want, "full list of {:?} ({:?})", tree, cfg);
    }
    Ok(())
}

/// Every readable period of every window of `ob` at `now`.
pub fn check_board(shard: &Shard, ob: &OBoard, now: i64, gets: &[&str], lists: bool) -> Result<(), TestCaseError> {
    let board = &ob.board;
    for &w in &board.config.windows {
        for (offset, tree) in readable(board, w, now) {
            prop_assert_eq!(window::tree_at(board, w, now, offset), Some(tree), "tree_at {:?} {}", w, offset);
            check_tree(shard, &board.config, tree, &ob.players(tree), gets, lists)?;
        }
    }
    Ok(())
}

/// An expired period is gone: no tree, no count, no player, no index entry.
pub fn check_gone(shard: &Shard, board: &Board, tree: TreeId, names: &[&str], what: &str) -> Result<(), TestCaseError> {
    prop_assert!(!shard.tree_ids().any(|t| t == tree), "{}: expired {:?} still in tree_ids", what, tree);
    prop_assert_eq!(shard.count(tree), 0, "{}: count of expired {:?}", what, tree);
    prop_assert!(shard.score_counts(tree).is_empty(), "{}: score_counts of expired {:?}", what, tree);
    for &name in names {
        prop_assert_eq!(ok(shard.get(tree, name))?, None, "{}: get {:?} in expired {:?}", what, name, tree);
    }
    let cfg = &board.config;
    let list = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
    prop_assert!(list.is_empty(), "{}: index of expired {:?} still holds {:?}", what, tree, list);
    Ok(())
}
