//! Targeted cases: a fixed operation sequence over the edge cases, and the
//! leaf-repacking pass a checkpoint starts.

use rankd_shards::key::{score_key, tree_key};
use rankd_shards::{Mode, Order, Shard, ShardOptions, Ties};

use crate::ops::{Knobs, Op};
use crate::oracle::{new_board, OBoard};
use crate::run::run;
use crate::tid;

/// A fixed sequence over the edge cases, easy to read when it fails.
#[test]
fn known_sequence() {
    use Op::*;
    let ops = vec![
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set },
        Write { slot: 0, player: 0, score: 1, mode: Mode::Incr }, // overflow: nothing changes
        Write { slot: 0, player: 1, score: i64::MAX, mode: Mode::Best },
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set }, // unchanged: keeps its seq
        CommitAndList,
        Remove { slot: 0, player: 0 },
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set }, // back: new seq
        Write { slot: 1, player: 3, score: i64::MIN, mode: Mode::Set },
        Write { slot: 1, player: 4, score: i64::MIN, mode: Mode::Set },
        Write { slot: 1, player: 5, score: -1, mode: Mode::Incr },
        Write { slot: 1, player: 5, score: i64::MIN, mode: Mode::Incr },
        Write { slot: 1, player: 5, score: -1, mode: Mode::Incr }, // overflow
        Write { slot: 2, player: 0, score: i64::MAX, mode: Mode::Set }, // dense board
        Seal,                                                      // reports its dense change, never written:
        Write { slot: 2, player: 1, score: 3, mode: Mode::Set },
        Crash, // the dense index must forget it
        Write { slot: 0, player: 2, score: 9, mode: Mode::Set },
        Seal,
        Write { slot: 0, player: 2, score: 8, mode: Mode::Set },
        CrashAfterSync, // both batches durable, their runs never written
        Write { slot: 2, player: 7, score: 0, mode: Mode::Set },
        Write { slot: 2, player: 8, score: 0, mode: Mode::Set },
        Bulk { slot: 2, start: 0, scores: (0..90).map(|i| i % 7).collect(), mode: Mode::Set },
        Reopen { wrong_branching: true },
        BulkRemove { slot: 2, start: 10, len: 70 },
        WriteMany { slot: 2, entries: vec![(7, 1), (7, 2), (8, -5)], mode: Mode::Incr },
        WriteMany { slot: 2, entries: vec![(7, 1), (7, i64::MAX), (8, 1)], mode: Mode::Incr }, // overflow: none
        Commit,
        Checkpoint,
        Repack { budget: 1 },
        Write { slot: 2, player: 9, score: 4, mode: Mode::Set },
        Repack { budget: 5 },
        DropBoard { slot: 1, order: Order::Asc, ties: Ties::Dense },
        Write { slot: 1, player: 9, score: 5, mode: Mode::Best },
        Write { slot: 1, player: 9, score: 7, mode: Mode::Best },
        Reopen { wrong_branching: false },
    ];
    for (order_, ties_) in [(Order::Desc, Ties::Ordinal), (Order::Asc, Ties::Competition), (Order::Desc, Ties::Dense)] {
        for (branching, checkpoint_every, checkpoint_slice_leaves) in
            [(2, Some(1), None), (16, None, None), (256, Some(5), None), (4, Some(2), Some(1))]
        {
            let configs = vec![(order_, ties_), (Order::Asc, ties_), (order_, Ties::Dense)];
            let knobs = Knobs {
                branching,
                sync: false,
                checkpoint_every,
                small_memtable: false,
                cached_players: Some(3),
                run_every: Some(2),
                checkpoint_slice_leaves,
            };
            if let Err(e) = run(configs, knobs, ops.clone()) {
                panic!("{order_:?} {ties_:?} {knobs:?}: {e}");
            }
        }
    }
}

/// A checkpoint starts a repacking pass over every tree; steps finish it,
/// each leaf moved once, and ranks stay what they were.
#[test]
fn checkpoint_starts_a_repacking_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
    assert!(!shard.is_repacking());
    let boards: Vec<OBoard> = (1..=2).map(|id| new_board(id, Order::Desc, Ties::Ordinal)).collect();
    for (i, score) in (0..3000i64).map(|i| (i, i * 7919 % 1000)) {
        let board = &boards[i as usize % 2].board;
        shard.write(board, &format!("p{i}"), score, Mode::Set, i as u64 + 1).unwrap();
    }
    shard.commit().unwrap();
    let ranks = |shard: &Shard| -> Vec<u64> {
        let keys: Vec<u128> = (0..1000).map(|s| tree_key(score_key(s, Order::Desc), 0)).collect();
        boards.iter().flat_map(|b| shard.count_before(tid(b.board.id), &keys)).collect()
    };
    let before = ranks(&shard);
    assert_eq!(shard.repack_step(100, |_| true).visited, 0, "no pass before a checkpoint");

    shard.checkpoint().unwrap();
    assert!(shard.is_repacking());
    let mut moved = 0;
    let mut steps = 0;
    while shard.is_repacking() {
        let done = shard.repack_step(7, |_| true);
        assert!(done.visited <= 7 && done.moved == done.visited);
        moved += done.moved;
        steps += 1;
        assert!(steps < 10_000, "the pass never ends");
    }
    // 1500 players a tree, at most 64 keys a leaf: dozens of leaves each.
    assert!(moved > 2 * 1500 / 64, "moved only {moved} leaves");
    assert!(steps <= moved / 7 + 3, "{steps} steps for {moved} leaves");
    assert_eq!(ranks(&shard), before);
    shard.check().unwrap();
}
