//! Thousands of small boards against an oracle, over TCP, across kill -9.
//!
//! Boards of every tie rule and order, some with a daily window beside the
//! all-time one, take random writes in every mode; some of them grow past
//! one leaf's 64 players and shrink back, again and again, so a small
//! tree's short names move in and out of the score index and the players'
//! records (`shards/src/shard/short_index.rs`), with runs and checkpoints
//! written often. After every round, and after every kill -9 and restart,
//! each board's count, full list, gets and ranks equal the oracle's, and
//! `rankd check` passes on the data dir.

mod common;

use std::collections::HashMap;

use common::oracle_board::OracleBoard;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Entry, Mode, OpKind, RankInfo};
use rmpv::Value;

/// Boards in all.
const BOARDS: usize = 2000;
/// Every this many boards, one is driven across the 64-player bound.
const CROSSING_EVERY: usize = 40;
/// Shards: a board's players are hashed over them, so each shard's tree
/// of a crossing board holds about half of it.
const SHARDS: usize = 2;
/// Players a crossing board swings between: each shard's share (half, give
/// or take a few) well above and well below one leaf's 64.
const HIGH: usize = 64 * SHARDS + 40;
const LOW: usize = 64 * SHARDS - 40;
const TIES: [&str; 3] = ["competition", "dense", "ordinal"];
const ORDERS: [&str; 2] = ["desc", "asc"];
const MODES: [&str; 3] = ["set", "best", "incr"];

/// A board's players: mostly short names (kept out of the index and the
/// records while the board is small), some of 8 bytes and more, and two
/// that share a tree key (`a`, `a\0`).
fn name(i: usize) -> String {
    match i {
        0 => "a".into(),
        1 => "a\u{0}".into(),
        i if i % 9 == 0 => format!("long-name-{i}"),
        i => format!("p{i}"),
    }
}

/// Names a board draws from: enough for a crossing board to pass the bound.
const NAMES: usize = 200;
/// The names every check reads one by one.
const READ: [usize; 10] = [0, 1, 2, 3, 9, 10, 64, 99, 150, 199];

struct Board {
    name: String,
    oracle: OracleBoard,
    crossing: bool,
    /// Rounds that took it past the bound, and back.
    ups: usize,
    downs: usize,
}

async fn create_boards(client: &mut Client) -> Vec<Board> {
    let mut boards = Vec::with_capacity(BOARDS);
    let mut calls = Vec::with_capacity(BOARDS);
    for i in 0..BOARDS {
        let (ties, order) = (TIES[i % 3], ORDERS[(i / 3) % 2]);
        let name = format!("lvl:{i:05}");
        let windows: Vec<Value> = if i % 5 == 0 { vec!["all".into(), "daily".into()] } else { vec!["all".into()] };
        calls.push(
            Call::new(OpKind::CreateBoard)
                .with("board", name.as_str())
                .with("order", order)
                .with("ties", ties)
                .with("windows", windows)
                .with("keep", 2u64),
        );
        let oracle = OracleBoard { desc: order == "desc", ties, players: HashMap::new() };
        boards.push(Board { name, oracle, crossing: i % CROSSING_EVERY == 0, ups: 0, downs: 0 });
    }
    for chunk in calls.chunks(500) {
        for reply in client.pipeline::<Value>(chunk).await.expect("create pipeline") {
            reply.expect("create_board");
        }
    }
    boards
}

/// One round of writes on every board, pipelined, each reply checked: a
/// crossing board climbs past the bound or falls back below it; the others
/// take a few writes and removes.
async fn write_round(client: &mut Client, boards: &mut [Board], rng: &mut StdRng, seq: &mut u64, round: usize) {
    let mut calls = Vec::new();
    let mut expected: Vec<(usize, Value)> = Vec::new();
    for (index, board) in boards.iter_mut().enumerate() {
        // In name order, so a seed replays the same run.
        let mut present: Vec<String> = board.oracle.players.keys().cloned().collect();
        present.sort();
        let large = present.len() > 64 * SHARDS;
        let (adds, removes) = match (board.crossing, large) {
            (true, false) => (HIGH - present.len(), rng.gen_range(0..3)),
            (true, true) => (rng.gen_range(0..3), present.len() - LOW),
            (false, _) => (rng.gen_range(0..4), rng.gen_range(0..2)),
        };
        // A board climbing takes names it does not hold yet.
        let mut absent: Vec<String> = (0..NAMES).map(name).filter(|n| !board.oracle.players.contains_key(n)).collect();
        for player in present.iter().take(removes) {
            let was = board.oracle.players.remove(player).is_some();
            calls.push(Call::new(OpKind::Remove).with("board", board.name.as_str()).with("player", player.as_str()));
            expected.push((index, Value::from(was)));
        }
        for _ in 0..adds {
            let player = match board.crossing && !large && !absent.is_empty() {
                true => absent.swap_remove(rng.gen_range(0..absent.len())),
                false => name(rng.gen_range(0..NAMES)),
            };
            let mode = MODES[rng.gen_range(0..MODES.len())];
            let score = rng.gen_range(-20..=20);
            *seq += 1;
            let stored = board.oracle.write(&player, score, mode, *seq).expect("small scores never overflow");
            calls.push(set_call(&board.name, &player, score, Mode::from_name(mode).expect("mode")));
            expected.push((index, Value::from(stored)));
        }
        match (large, board.oracle.players.len() > 64 * SHARDS) {
            (false, true) => board.ups += 1,
            (true, false) => board.downs += 1,
            _ => {}
        }
    }
    // One connection, so arrival order is this order: what ordinal ties rank by.
    let replies = client.pipeline::<Value>(&calls).await.expect("write pipeline");
    for (reply, (index, want)) in replies.into_iter().zip(expected) {
        let got = reply.unwrap_or_else(|e| panic!("round {round}, {}: {e:?}", boards[index].name));
        assert_eq!(got, want, "round {round}, {}", boards[index].name);
    }
}

/// Every board's count, full list, gets and ranks against the oracle.
async fn check_all(client: &mut Client, boards: &[Board], context: &str) {
    for chunk in boards.chunks(100) {
        let mut calls = Vec::new();
        for board in chunk {
            calls.push(Call::new(OpKind::Count).with("board", board.name.as_str()));
            calls.push(Call::new(OpKind::Top).with("board", board.name.as_str()).with("limit", 1000u64));
            for i in READ {
                let player = name(i);
                calls.push(Call::new(OpKind::Get).with("board", board.name.as_str()).with("player", player.as_str()));
                calls.push(Call::new(OpKind::Rank).with("board", board.name.as_str()).with("player", player.as_str()));
            }
        }
        let replies = client.pipeline::<Value>(&calls).await.expect("read pipeline");
        let mut replies = replies.into_iter().map(|reply| reply.expect("a read succeeds"));
        for board in chunk {
            let what = format!("{context}, {} ({} {})", board.name, board.oracle.ties, board.oracle.players.len());
            let sorted = board.oracle.sorted();
            let n = sorted.len() as u64;
            assert_eq!(replies.next().and_then(|v| v.as_u64()), Some(n), "{what}: count");
            let listed: Vec<Entry> = rmpv::ext::from_value(replies.next().expect("top")).expect("entries");
            assert_eq!(listed, board.oracle.entries(&sorted, 0..sorted.len()), "{what}: top");
            for i in READ {
                let player = name(i);
                let got = replies.next().expect("get");
                let want = board.oracle.players.get(&player).map(|p| p.0);
                assert_eq!(if got.is_nil() { None } else { got.as_i64() }, want, "{what}: get {player:?}");
                let got: Option<RankInfo> = rmpv::ext::from_value(replies.next().expect("rank")).expect("rank");
                let want = sorted.iter().position(|e| e.0 == player).map(|at| RankInfo {
                    rank: board.oracle.rank_at(&sorted, at),
                    score: sorted[at].1,
                    count: n,
                });
                assert_eq!(got, want, "{what}: rank {player:?}");
            }
        }
    }
}

#[tokio::test]
async fn thousands_of_small_boards_cross_the_bound_and_survive_kill_9() {
    // Runs and checkpoints every few hundred changes: a kill meets storage
    // that holds some of a board's history and a log that holds the rest.
    let mut server =
        common::Server::start_with(SHARDS, &["--debug-run-every", "300", "--debug-checkpoint-every", "2000"]);
    let mut client = server.client().await;
    let mut rng = StdRng::seed_from_u64(38);
    let mut boards = create_boards(&mut client).await;
    let mut seq = 0;
    for round in 0..6 {
        write_round(&mut client, &mut boards, &mut rng, &mut seq, round).await;
        check_all(&mut client, &boards, &format!("round {round}")).await;
        // Crossing boards end even rounds large and odd ones small: a kill
        // after each meets both.
        {
            server.kill9();
            common::rankd_check(server.data_dir(), &format!("kill -9 after round {round}"));
            server.restart();
            client = server.client().await;
            check_all(&mut client, &boards, &format!("restart after round {round}")).await;
        }
    }
    // The crossing boards did cross, both ways, more than once.
    for board in boards.iter().filter(|b| b.crossing) {
        assert!(
            board.ups >= 2 && board.downs >= 2,
            "{} crossed up {} and down {} times",
            board.name,
            board.ups,
            board.downs
        );
    }
}
