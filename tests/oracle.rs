//! Every read of the real server, over TCP, equals a brute-force oracle
//! after random pipelined writes — for 1, 4 and 7 shards, every tie rule and
//! both orders, including deep `top` offsets and extreme scores.

mod common;

use std::collections::HashMap;

use common::field;
use common::oracle_board::OracleBoard;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Entry, Mode, OpKind, Order, RankInfo, Ties};
use rmpv::Value;

const TIES: [&str; 3] = ["competition", "dense", "ordinal"];
const ORDERS: [&str; 2] = ["desc", "asc"];

fn player_names() -> Vec<String> {
    let mut names: Vec<String> = (0..30).map(|i| format!("p{i:02}")).collect();
    // Names that share their first 8 bytes, a zero byte and non-ASCII: the
    // name-prefix tiebreak and byte ordering must still list them exactly.
    names.extend(
        ["abcdefgh", "abcdefgh1", "abcdefgh2", "abcdefghz", "a", "a\u{0}", "Zed", "zed", "é-accent", "日本"]
            .map(String::from),
    );
    names
}

fn random_score(rng: &mut StdRng) -> i64 {
    match rng.gen_range(0..20) {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => i64::MAX - 1,
        3 => rng.gen(),
        _ => rng.gen_range(-6..=6),
    }
}

fn value_entries(v: &Value) -> Vec<Entry> {
    rmpv::ext::from_value(v.clone()).expect("entry list")
}

async fn check_board(client: &mut Client, name: &str, board: &OracleBoard, rng: &mut StdRng, context: &str) {
    let sorted = board.sorted();
    let names = player_names();
    let mut calls = vec![Call::new(OpKind::Count).with("board", name)];
    for p in &names {
        calls.push(Call::new(OpKind::Get).with("board", name).with("player", p.as_str()));
        calls.push(Call::new(OpKind::Rank).with("board", name).with("player", p.as_str()));
    }
    let probe_scores: Vec<i64> = (0..8)
        .map(|_| random_score(rng))
        .chain([i64::MIN, i64::MAX, 0])
        .chain(sorted.iter().map(|e| e.1).take(5))
        .collect();
    for &s in &probe_scores {
        calls.push(Call::new(OpKind::RankOfScore).with("board", name).with("score", s));
    }
    let n = sorted.len() as u64;
    let mut windows: Vec<(u64, u64)> =
        vec![(10, 0), (1000, 0), (3, 1), (5, n / 2), (2, n.saturating_sub(1)), (4, n), (4, n + 7)];
    windows.extend((0..4).map(|_| (rng.gen_range(0..6), rng.gen_range(0..n + 2))));
    for &(limit, offset) in &windows {
        calls.push(Call::new(OpKind::Top).with("board", name).with("limit", limit).with("offset", offset));
    }
    let around: Vec<(String, u64, u64)> = (0..6)
        .map(|_| (names[rng.gen_range(0..names.len())].clone(), rng.gen_range(0..5), rng.gen_range(0..5)))
        .collect();
    for (p, before, after) in &around {
        calls.push(
            Call::new(OpKind::Around)
                .with("board", name)
                .with("player", p.as_str())
                .with("before", *before)
                .with("after", *after),
        );
    }
    let replies = client.pipeline::<Value>(&calls).await.expect("pipeline");
    let mut replies = replies.into_iter().map(|r| r.expect("read succeeds"));
    let mut next = || replies.next().expect("a reply per call");

    assert_eq!(next().as_u64(), Some(n), "{context}: count");
    for p in &names {
        let expected = board.players.get(p).map(|e| e.0);
        let got = next();
        assert_eq!(if got.is_nil() { None } else { got.as_i64() }, expected, "{context}: get {p:?}");
        let got: Option<RankInfo> = rmpv::ext::from_value(next()).expect("rank shape");
        let expected = sorted.iter().position(|e| &e.0 == p).map(|i| RankInfo {
            rank: board.rank_at(&sorted, i),
            score: sorted[i].1,
            count: n,
        });
        assert_eq!(got, expected, "{context}: rank {p:?}");
    }
    for &s in &probe_scores {
        assert_eq!(next().as_u64(), Some(board.rank_of_score(s)), "{context}: rank_of_score {s}");
    }
    for &(limit, offset) in &windows {
        let start = (offset as usize).min(sorted.len());
        let end = (start + limit as usize).min(sorted.len());
        assert_eq!(
            value_entries(&next()),
            board.entries(&sorted, start..end),
            "{context}: top limit {limit} offset {offset}"
        );
    }
    for (p, before, after) in &around {
        let expected = match sorted.iter().position(|e| &e.0 == p) {
            None => Vec::new(),
            Some(i) => {
                board.entries(&sorted, i.saturating_sub(*before as usize)..(i + 1 + *after as usize).min(sorted.len()))
            }
        };
        assert_eq!(value_entries(&next()), expected, "{context}: around {p:?} -{before} +{after}");
    }
    // Ranks sent one at a time: answered in place from the shards' engines
    // or, with `--debug-queue-lone` (or a shard busy), queued to the owner
    // shard, which asks the others itself (the pipelined ones above follow
    // a count that went to every shard, so the router asks them).
    for _ in 0..4 {
        let p = &names[rng.gen_range(0..names.len())];
        let expected = sorted.iter().position(|e| &e.0 == p).map(|i| RankInfo {
            rank: board.rank_at(&sorted, i),
            score: sorted[i].1,
            count: n,
        });
        assert_eq!(client.rank(name, p).await.expect("rank"), expected, "{context}: lone rank {p:?}");
    }
}

async fn run_against_oracle(shards: usize, seed: u64, flags: &[&str]) {
    let server = common::Server::start_with(shards, flags);
    let mut client = server.client().await;
    let mut rng = StdRng::seed_from_u64(seed);
    let names = player_names();
    let mut boards = Vec::new();
    for ties in TIES {
        for order in ORDERS {
            let name = format!("b_{ties}_{order}");
            assert!(
                client
                    .create_board(&name, Order::from_name(order).unwrap(), Ties::from_name(ties).unwrap())
                    .await
                    .expect("create"),
                "{name} is new"
            );
            boards.push((name, OracleBoard { desc: order == "desc", ties, players: HashMap::new() }));
        }
    }
    let mut seq = 0u64;
    for round in 0..6 {
        for (name, board) in &mut boards {
            let mut calls = Vec::new();
            let mut expected: Vec<Option<Value>> = Vec::new();
            for _ in 0..rng.gen_range(20..80) {
                let player = names[rng.gen_range(0..names.len())].as_str();
                match rng.gen_range(0..10) {
                    0 => {
                        let present = board.players.remove(player).is_some();
                        calls.push(Call::new(OpKind::Remove).with("board", name.as_str()).with("player", player));
                        expected.push(Some(Value::from(present)));
                    }
                    1 => {
                        let mut mode = ["set", "best", "incr"][rng.gen_range(0..3)];
                        let entries: Vec<(String, i64)> = (0..rng.gen_range(0..6))
                            .map(|_| (names[rng.gen_range(0..names.len())].clone(), rng.gen_range(-4..=4)))
                            .collect();
                        // Overflowing set_many is covered by tests/bad_input/scores.rs;
                        // here an incr that could overflow becomes a set.
                        let mut dry =
                            OracleBoard { desc: board.desc, ties: board.ties, players: board.players.clone() };
                        if entries.iter().any(|(p, s)| dry.write(p, *s, mode, 0).is_none()) {
                            mode = "set";
                        }
                        let stored: Vec<Value> = entries
                            .iter()
                            .map(|(p, s)| {
                                seq += 1;
                                Value::from(board.write(p, *s, mode, seq).expect("small incr never overflows"))
                            })
                            .collect();
                        let list = entries
                            .iter()
                            .map(|(p, s)| Value::Array(vec![p.as_str().into(), (*s).into()]))
                            .collect::<Vec<_>>();
                        calls.push(
                            Call::new(OpKind::SetMany)
                                .with("board", name.as_str())
                                .with("entries", list)
                                .with("mode", mode),
                        );
                        expected.push(Some(Value::Array(stored)));
                    }
                    _ => {
                        let mode = ["set", "set", "best", "incr"][rng.gen_range(0..4)];
                        let score = if mode == "incr" && rng.gen_bool(0.8) {
                            rng.gen_range(-3..=3)
                        } else {
                            random_score(&mut rng)
                        };
                        let before = board.players.clone();
                        seq += 1;
                        let stored = board.write(player, score, mode, seq);
                        if stored.is_none() {
                            board.players = before; // overflow changes nothing
                        }
                        calls.push(set_call(name, player, score, Mode::from_name(mode).unwrap()));
                        expected.push(stored.map(Value::from));
                    }
                }
            }
            let replies = client.pipeline::<Value>(&calls).await.expect("pipeline");
            for (i, (reply, want)) in replies.into_iter().zip(expected).enumerate() {
                match (reply, want) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "{name} round {round} write {i}"),
                    (Err(e), None) => assert_eq!(e.code(), Some("bad_request"), "{name}: overflow is bad_request"),
                    (got, want) => panic!("{name} round {round} write {i}: got {got:?}, want {want:?}"),
                }
            }
            let context = format!("{shards} shards, {name}, round {round}");
            check_board(&mut client, name, board, &mut rng, &context).await;
        }
    }
    // Every board is listed with its config and count.
    let listed = client.boards().await.expect("boards");
    for (name, board) in &boards {
        let info = listed.iter().find(|b| &b.board == name).expect("board listed");
        assert_eq!((info.ties.as_str(), info.count), (board.ties, board.players.len() as u64));
    }
}

#[tokio::test]
async fn one_shard_matches_oracle() {
    run_against_oracle(1, 1, &[]).await;
}

#[tokio::test]
async fn four_shards_match_oracle() {
    // Checkpoints every few dozen changes: each one rewrites the changed
    // leaves and starts a pass that moves every leaf in memory, all while
    // the requests run.
    // Each checkpoint's leaves are copied two a batch, so reads and writes
    // meet trees with a copy under way.
    run_against_oracle(4, 4, &["--debug-checkpoint-every", "25", "--debug-checkpoint-slice-leaves", "2"]).await;
}

#[tokio::test]
async fn seven_shards_match_oracle() {
    run_against_oracle(7, 7, &[]).await;
}

/// With nothing handled in place, lone ranks and writes take the queued
/// paths: a rank's owner shard forwarding to the others, or the router
/// asking them.
#[tokio::test]
async fn queued_ranks_match_oracle() {
    run_against_oracle(3, 3, &["--debug-queue-lone"]).await;
}

/// The dense trap: one score held in several shards must count once.
#[tokio::test]
async fn dense_ranks_count_a_score_once_across_shards() {
    let server = common::Server::start(4);
    let mut client = server.client().await;
    client.create_board("d", Order::Desc, Ties::Dense).await.unwrap();
    for i in 0..40 {
        client.set("d", &format!("top{i}"), 100, Mode::Set).await.unwrap();
    }
    client.set("d", "second", 50, Mode::Set).await.unwrap();
    let rank = client.rank("d", "second").await.unwrap().unwrap();
    assert_eq!(rank.rank, 2, "forty players at 100 are one distinct better score");
    assert_eq!(client.rank_of_score("d", 10).await.unwrap(), 3);
    // Dense ranks survive a restart (the index is rebuilt from the trees).
    drop(client);
    let mut server = server;
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    assert_eq!(client.rank("d", "second").await.unwrap().unwrap().rank, 2);
    client.remove("d", "second").await.unwrap();
    client.set("d", "third", 10, Mode::Set).await.unwrap();
    assert_eq!(client.rank("d", "third").await.unwrap().unwrap().rank, 2);
}

/// The deep-offset trap: `top` far down a large board reads only around the
/// offset (found by counting), and still returns exactly the right slice.
#[tokio::test]
async fn deep_offsets_are_exact_on_a_large_board() {
    let server = common::Server::start(3);
    let mut client = server.client().await;
    client.create_board("big", Order::Desc, Ties::Competition).await.unwrap();
    let mut oracle = OracleBoard { desc: true, ties: "competition", players: HashMap::new() };
    let mut rng = StdRng::seed_from_u64(99);
    for chunk in 0..10 {
        let entries: Vec<(String, i64)> = (0..2000).map(|i| (format!("u{chunk}-{i}"), rng.gen_range(0..500))).collect();
        for (i, (p, s)) in entries.iter().enumerate() {
            oracle.write(p, *s, "set", (chunk * 2000 + i) as u64);
        }
        let list: Vec<Value> =
            entries.iter().map(|(p, s)| Value::Array(vec![p.as_str().into(), (*s).into()])).collect();
        client.call::<Value>(Call::new(OpKind::SetMany).with("board", "big").with("entries", list)).await.unwrap();
    }
    let sorted = oracle.sorted();
    for offset in [0u64, 1, 999, 10_000, 17_777, 19_990, 19_999] {
        let got = client.top("big", 25, offset).await.unwrap();
        let start = offset as usize;
        let end = (start + 25).min(sorted.len());
        assert_eq!(got, oracle.entries(&sorted, start..end), "offset {offset}");
    }
}

/// A rank sees every write sent before it on its connection, whichever
/// shard holds the write: pipelined in one batch (the router asks the other
/// shards after the owner) and sent right behind it (the owner may ask them
/// itself, its batch holding nothing else).
#[tokio::test]
async fn a_rank_sees_the_writes_sent_before_it() {
    let shards = 4;
    let server = common::Server::start(shards);
    let mut client = server.client().await;
    let ranked = "ranked";
    let owner = rankd::request_path::router::shard_of(ranked, shards);
    let others: Vec<String> = (0..)
        .map(|i| format!("rival-{i}"))
        .filter(|p| rankd::request_path::router::shard_of(p, shards) != owner)
        .take(40)
        .collect();
    client.set("b", ranked, 1_000_000, Mode::Set).await.unwrap();
    for (i, rival) in others.iter().enumerate() {
        let beaten = i as u64 + 1; // rivals so far, each set above `ranked`
        let calls = [
            rankd_client::set_call("b", rival, 2_000_000, Mode::Set),
            Call::new(OpKind::Rank).with("board", "b").with("player", ranked),
        ];
        let replies = client.pipeline::<Value>(&calls).await.unwrap();
        let rank: RankInfo = rmpv::ext::from_value(replies[1].as_ref().unwrap().clone()).unwrap();
        assert_eq!(
            rank.rank,
            beaten + 1,
            "pipelined behind a write to shard {}",
            rankd::request_path::router::shard_of(rival, shards)
        );
        let lone = client.rank("b", ranked).await.unwrap().unwrap();
        assert_eq!((lone.rank, lone.count), (beaten + 1, beaten + 1), "sent alone after the write's answer");
    }
}

/// Sends a `set` of `written` on board `b` (request id `id`), then ~20 µs
/// later, in a frame of its own, a `rank` of `ranked` (id `id + 1`): less
/// than a sleeping shard thread takes to wake for the write. Returns the
/// set's reply and the rank.
async fn write_then_rank(client: &mut Client, id: u64, written: &str, score: i64, ranked: &str) -> (Value, RankInfo) {
    let (mut write, mut read) = (Vec::new(), Vec::new());
    rankd_client::set_call("b", written, score, Mode::Set).encode(id, &mut write);
    Call::new(OpKind::Rank).with("board", "b").with("player", ranked).encode(id + 1, &mut read);
    client.send_raw(&write).await.unwrap();
    let sent = std::time::Instant::now();
    while sent.elapsed() < std::time::Duration::from_micros(20) {
        std::hint::spin_loop();
    }
    client.send_raw(&read).await.unwrap();
    let set = client.read_raw::<Value>().await.unwrap().expect("the set's reply");
    let ranked = client.read_raw::<Value>().await.unwrap().expect("the rank's reply");
    (set, rmpv::ext::from_value(field(&ranked, "ok").expect("ok").clone()).unwrap())
}

/// A rank sent in a batch of its own while a write before it on its
/// connection is unanswered sees that write: it queues behind it rather
/// than being answered in place from the shards' engines, where the write
/// may not have landed yet. The rank's frame follows the write's by ~20 µs,
/// less than a sleeping shard thread takes to wake for the write, so a rank
/// answered in place would often miss it (with the connection's check
/// removed, this test failed in its third round).
#[tokio::test]
async fn a_rank_behind_an_unanswered_write_sees_it() {
    let server = common::Server::start(2);
    let mut client = server.client().await;
    for round in 0..300u64 {
        let score = round as i64 * 7 + 1;
        let (written, rank) = write_then_rank(&mut client, 2 * round + 1, "p", score, "p").await;
        assert_eq!(field(&written, "ok"), Some(&Value::from(score)), "round {round}: {written}");
        assert_eq!((rank.score, rank.rank, rank.count), (score, 1, 1), "round {round}");
    }
}

/// The same for a rank whose owner asks the other shard itself (a batch of
/// its own, queued: `--debug-queue-lone`) while the write before it, on
/// that other shard, still waits in its mailbox: the owner must not read
/// that shard's count in place ahead of the write. With the owner's
/// in-place read unguarded, this test failed in its first rounds.
#[tokio::test]
async fn a_forwarded_rank_behind_an_unanswered_write_on_another_shard_sees_it() {
    let shards = 2;
    let server = common::Server::start_with(shards, &["--debug-queue-lone"]);
    let mut client = server.client().await;
    let ranked = "ranked";
    let owner = rankd::request_path::router::shard_of(ranked, shards);
    let rivals =
        (0..).map(|i| format!("rival-{i}")).filter(|p| rankd::request_path::router::shard_of(p, shards) != owner);
    client.set("b", ranked, 1_000_000, Mode::Set).await.unwrap();
    // Another connection keeps the rivals' shard busy on another board, so
    // a write there waits in its mailbox while the owner is free.
    let mut busy = server.client().await;
    let noise: Vec<String> = (0..)
        .map(|i| format!("n-{i}"))
        .filter(|p| rankd::request_path::router::shard_of(p, shards) != owner)
        .take(64)
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        tokio::spawn(async move {
            for score in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let calls: Vec<Call> =
                    noise.iter().map(|p| rankd_client::set_call("noise", p, score, Mode::Set)).collect();
                busy.pipeline::<Value>(&calls).await.unwrap();
            }
        })
    };
    for (round, rival) in (0..200u64).zip(rivals) {
        let (written, rank) = write_then_rank(&mut client, 2 * round + 1, &rival, 2_000_000, ranked).await;
        assert_eq!(field(&written, "ok"), Some(&Value::from(2_000_000)), "round {round}: {written}");
        let beaten = round + 1; // rivals so far, each above `ranked`
        assert_eq!((rank.rank, rank.count), (beaten + 1, beaten + 1), "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.await.unwrap();
}

/// Opening a data dir with another shard count is refused, not corrupted.
#[tokio::test]
async fn other_shard_count_is_refused() {
    let mut server = common::Server::start(4);
    let mut client = server.client().await;
    client.set("b", "p", 1, Mode::Set).await.unwrap();
    drop(client);
    assert!(server.terminate().success(), "SIGTERM exits 0");
    let err = common::serve_fails(server.data_dir(), 2);
    assert!(err.contains("holds 4 shards") && err.contains("--shards 4"), "clear message, got: {err}");
    server.restart();
    assert_eq!(server.client().await.get("b", "p").await.unwrap(), Some(1), "data intact after the refusal");
}
