//! The shard's answers against the oracle: memory reads (gets, counts,
//! ranks, score probes), lists, board metadata and the dense index.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::key::{list_position, list_position_of_tree_key, score_key, tree_key};
use rankd_shards::{BoardConfig, DenseIndex, Direction, Record, Shard, Ties, Upcoming, Window};

use crate::oracle::{better, player_tree_key, sorted, OBoard, State};
use crate::{ok, tid};

pub const PROBES: [i64; 11] = [i64::MIN, i64::MIN + 1, -3, -1, 0, 1, 2, 3, 50, i64::MAX - 1, i64::MAX];

/// Everything answered from memory (count trees, staged players): valid with
/// or without an open batch. `gets` are the names whose `get` is checked.
pub fn check_memory<'a>(
    shard: &Shard,
    ob: &OBoard,
    gets: impl IntoIterator<Item = &'a str>,
) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let tree = tid(ob.board.id);
    let gets: Vec<&str> = gets.into_iter().collect();
    // As the server does before ranks and counts: a look ahead that must
    // change nothing, for players present or not.
    let probe_keys: Vec<u128> = PROBES.iter().map(|&score| tree_key(score_key(score, cfg.order), 0)).collect();
    shard.prefetch(
        gets.iter()
            .map(|&player| Upcoming::Rank { tree, player, ties: cfg.ties, order: cfg.order })
            .chain([Upcoming::CountBefore { tree, keys: &probe_keys }]),
    );
    // A record's `seq` orders ties on ordinal boards only; elsewhere a
    // small tree's short name is read from the tree, without one.
    let seen = |record: Option<Record>| record.map(|r| (r.score, if cfg.ties == Ties::Ordinal { r.seq } else { 0 }));
    for name in gets {
        prop_assert_eq!(
            seen(ok(shard.get(tree, name))?),
            seen(ob.players.get(name).copied()),
            "get {:?} on board {}",
            name,
            ob.board.id
        );
    }
    prop_assert_eq!(shard.count(tree), ob.players.len() as u64, "count on board {}", ob.board.id);

    // Distinct scores with their player counts.
    let mut groups: BTreeMap<u64, u64> = BTreeMap::new();
    for r in ob.players.values() {
        *groups.entry(score_key(r.score, cfg.order)).or_default() += 1;
    }
    let score_counts = shard.score_counts(tree);
    prop_assert_eq!(&score_counts, &groups.iter().map(|(k, n)| (*k, *n)).collect::<Vec<_>>(), "score_counts");
    let distinct: BTreeSet<i64> = ob.players.values().map(|r| r.score).collect();

    // Every player's own tree key and its rank under the board's tie rule.
    let list = sorted(ob);
    let keys: Vec<u128> = list.iter().map(|(n, r)| player_tree_key(cfg, n, r)).collect();
    let before = shard.count_before(tree, &keys);
    prop_assert_eq!(before.len(), keys.len());
    for (i, ((name, r), k)) in list.iter().zip(&keys).enumerate() {
        let expected = keys.iter().filter(|q| *q < k).count() as u64;
        prop_assert_eq!(before[i], expected, "count_before own key of {:?}", name);
        let sk = score_key(r.score, cfg.order);
        let rank = match cfg.ties {
            Ties::Competition => 1 + shard.count_before(tree, &[tree_key(sk, 0)])[0],
            Ties::Ordinal => 1 + before[i],
            Ties::Dense => 1 + score_counts.iter().take_while(|(s, _)| *s < sk).count() as u64,
        };
        let expected_rank = match cfg.ties {
            Ties::Competition => 1 + ob.players.values().filter(|q| better(cfg.order, q.score, r.score)).count(),
            Ties::Ordinal => 1 + i,
            Ties::Dense => 1 + distinct.iter().filter(|s| better(cfg.order, **s, r.score)).count(),
        } as u64;
        prop_assert_eq!(rank, expected_rank, "{:?} rank of {:?} ({:?})", cfg.ties, name, r);
    }

    // Score probes: strictly better, and better-or-equal (ordinal rank_of_score).
    for s in PROBES.iter().copied().chain(distinct.iter().copied()) {
        let sk = score_key(s, cfg.order);
        let got = shard.count_before(tree, &[tree_key(sk, 0), tree_key(sk, u64::MAX)]);
        let strictly = ob.players.values().filter(|q| better(cfg.order, q.score, s)).count() as u64;
        let or_equal = ob.players.values().filter(|q| !better(cfg.order, s, q.score)).count() as u64;
        prop_assert_eq!(got, vec![strictly, or_equal], "count_before probes for score {}", s);
    }
    Ok(())
}

/// List reads and `check`: need a committed shard.
pub fn check_lists(shard: &Shard, ob: &OBoard) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let (order, ties) = (cfg.order, cfg.ties);
    let tree = tid(ob.board.id);
    let expected = sorted(ob);
    let entry_pos = |(n, r): &(String, Record)| list_position(ties, score_key(r.score, order), r.seq, n);
    let view = |entries: &[rankd_shards::ListEntry]| -> Vec<(String, i64, u64, Vec<u8>)> {
        entries.iter().map(|e| (e.player.clone(), e.score, e.seq, e.position.clone())).collect()
    };
    let want = |slice: &[(String, Record)]| -> Vec<(String, i64, u64, Vec<u8>)> {
        slice
            .iter()
            .map(|e| (e.0.clone(), e.1.score, if ties == Ties::Ordinal { e.1.seq } else { 0 }, entry_pos(e)))
            .collect()
    };

    let full = ok(shard.list(tree, ties, order, &[], Direction::Forward, 100_000))?;
    prop_assert_eq!(view(&full), want(&expected), "full forward list of board {} ({:?})", ob.board.id, cfg);
    for pair in full.windows(2) {
        prop_assert!(pair[0].position < pair[1].position, "positions not increasing");
    }
    let top3 = ok(shard.list(tree, ties, order, &[], Direction::Forward, 3))?;
    prop_assert_eq!(view(&top3), want(&expected[..expected.len().min(3)]));
    prop_assert!(ok(shard.list(tree, ties, order, &[], Direction::Backward, 10))?.is_empty());

    let keys: Vec<u128> = expected.iter().map(|(n, r)| player_tree_key(cfg, n, r)).collect();
    for (i, e) in expected.iter().enumerate() {
        let pos = entry_pos(e);
        // Better players, nearest first.
        let back = ok(shard.list(tree, ties, order, &pos, Direction::Backward, 1_000))?;
        let mut better_ones = expected[..i].to_vec();
        better_ones.reverse();
        prop_assert_eq!(view(&back), want(&better_ones), "backward from {:?}", e.0);
        let back2 = ok(shard.list(tree, ties, order, &pos, Direction::Backward, 2))?;
        prop_assert_eq!(view(&back2), want(&better_ones[..better_ones.len().min(2)]));
        // The player and worse ones.
        let fwd = ok(shard.list(tree, ties, order, &pos, Direction::Forward, 4))?;
        prop_assert_eq!(view(&fwd), want(&expected[i..(i + 4).min(expected.len())]), "forward from {:?}", e.0);
        // Seeking by tree key (how `top` finds a deep offset): lands on the
        // first entry whose tree key is not smaller, at index count_before.
        let k = keys[i];
        let first = keys.iter().position(|q| *q >= k).unwrap();
        prop_assert_eq!(shard.count_before(tree, &[k])[0], first as u64);
        let seek = ok(shard.list(tree, ties, order, &list_position_of_tree_key(ties, k), Direction::Forward, 2))?;
        prop_assert_eq!(
            view(&seek),
            want(&expected[first..(first + 2).min(expected.len())]),
            "seek to key of {:?}",
            e.0
        );
    }
    for s in PROBES {
        let k = tree_key(score_key(s, order), 0);
        let first = keys.iter().position(|q| *q >= k).unwrap_or(keys.len());
        prop_assert_eq!(shard.count_before(tree, &[k])[0], first as u64);
        let seek = ok(shard.list(tree, ties, order, &list_position_of_tree_key(ties, k), Direction::Forward, 2))?;
        prop_assert_eq!(view(&seek), want(&expected[first..(first + 2).min(expected.len())]), "seek to score {}", s);
    }
    Ok(())
}

/// The whole shard against the oracle (no staged writes for the list part
/// unless `lists` is false).
pub fn check_all(shard: &Shard, st: &State, names: &[String], lists: bool) -> Result<(), TestCaseError> {
    for ob in &st.slots {
        check_memory(shard, ob, names.iter().map(String::as_str))?;
        if lists {
            check_lists(shard, ob)?;
        }
    }
    let configs: BTreeMap<u64, &BoardConfig> = shard.board_configs().collect();
    let known: BTreeMap<u64, &BoardConfig> = st.known.iter().map(|(&id, b)| (id, &*b.config)).collect();
    prop_assert_eq!(configs, known, "board_configs()");
    prop_assert_eq!(shard.max_seq(), st.max_seq, "max_seq");
    prop_assert_eq!(shard.max_board_id(), st.max_board_id, "max_board_id");
    for t in shard.tree_ids() {
        prop_assert!(st.known.contains_key(&t.board), "tree {:?} of a board the shard should not hold", t);
        prop_assert_eq!((t.window, t.period), (Window::All.code(), 0));
    }
    for ob in &st.slots {
        if !ob.players.is_empty() {
            prop_assert!(shard.tree_ids().any(|t| t == tid(ob.board.id)), "tree of board {} missing", ob.board.id);
        }
    }
    if lists {
        ok(shard.check())?;
    }
    Ok(())
}

/// The engine-wide dense index (fed by commits) against the oracle.
pub fn check_dense(index: &DenseIndex, ob: &OBoard) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let distinct: BTreeSet<i64> = ob.players.values().map(|r| r.score).collect();
    for s in PROBES.iter().copied().chain(distinct.iter().copied()) {
        let expected = distinct.iter().filter(|d| better(cfg.order, **d, s)).count() as u64;
        prop_assert_eq!(index.distinct_before(score_key(s, cfg.order)), expected, "dense index before score {}", s);
    }
    Ok(())
}
