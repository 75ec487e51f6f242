//! Approximate ranks (`approx: true` on `rank` and `rank_of_score`) on the
//! real server over TCP: for uniform, Zipf and normal score distributions,
//! on 1, 4 and 7 shards, both orders, competition and ordinal ties, and in
//! a second window, once the board's summary covers the writes, the exact
//! rank (plain `rank` / `rank_of_score`) of many players and scores lies
//! within `rank ± error`. The server runs with few buckets per shard
//! (`--debug-approx-buckets`), so buckets hold many players and the bounds
//! are wide enough to be wrong if they were. Also: `approx` on a dense
//! board is a `bad_request`, and so is an `approx` that is not a boolean;
//! an absent player is nil.

mod common;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd_client::{ApproxRankInfo, ApproxRankOfScore, Call, Client, Mode, OpKind, Order, RankInfo, Ties};
use rmpv::Value;

const PLAYERS: usize = 3000;
/// Buckets per shard: ~100 players a bucket on one shard.
const BUCKETS: &str = "30";

#[derive(Debug, Clone, Copy)]
enum Spread {
    Uniform,
    /// Score k with weight 1/k^1.1, k in 1..=5000: a few scores hold most
    /// players, a long tail holds one each.
    Zipf,
    /// Mean 50 000, standard deviation 2 000.
    Normal,
}

struct Scores {
    spread: Spread,
    zipf_cdf: Vec<f64>,
}

impl Scores {
    fn new(spread: Spread) -> Self {
        let weights: Vec<f64> = (1..=5000).map(|k| 1.0 / f64::powf(k as f64, 1.1)).collect();
        let total: f64 = weights.iter().sum();
        let zipf_cdf = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        Self { spread, zipf_cdf }
    }

    fn draw(&self, rng: &mut StdRng) -> i64 {
        match self.spread {
            Spread::Uniform => rng.gen_range(-1_000_000..1_000_000),
            Spread::Zipf => {
                let u: f64 = rng.gen();
                self.zipf_cdf.partition_point(|&c| c < u) as i64 + 1
            }
            Spread::Normal => {
                let (u1, u2): (f64, f64) = (rng.gen::<f64>().max(1e-12), rng.gen());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                (50_000.0 + 2_000.0 * z).round() as i64
            }
        }
    }
}

fn rank_call(board: &str, player: &str, window: &str) -> Call {
    Call::new(OpKind::Rank).with("board", board).with("player", player).with("window", window)
}

fn score_call(board: &str, score: i64, window: &str) -> Call {
    Call::new(OpKind::RankOfScore).with("board", board).with("score", score).with("window", window)
}

/// Polls the approximate rank of `player` until its summary counts all
/// `players` (the board only grew, so every shard counted after all its
/// writes).
async fn wait_for_summary(client: &mut Client, board: &str, player: &str, window: &str, players: u64) {
    let call = rank_call(board, player, window).with("approx", true);
    common::wait_for(Duration::from_secs(30), "the summary to cover the writes", async || {
        match client.call::<Option<ApproxRankInfo>>(call.clone()).await {
            Ok(Some(info)) if info.count == players => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

async fn check_board(client: &mut Client, board: &str, order: Order, ties: Ties, spread: Spread, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let create = Call::new(OpKind::CreateBoard)
        .with("board", board)
        .with("order", order)
        .with("ties", ties)
        .with("windows", vec![Value::from("all"), Value::from("weekly")]);
    client.call::<bool>(create).await.expect("create_board");
    let scores = Scores::new(spread);
    let names: Vec<String> = (0..PLAYERS).map(|i| format!("p{i}")).collect();
    let drawn: Vec<i64> = names.iter().map(|_| scores.draw(&mut rng)).collect();
    let entries: Vec<(&str, i64)> = names.iter().map(String::as_str).zip(drawn.iter().copied()).collect();
    for chunk in entries.chunks(1000) {
        client.set_many(board, chunk, Mode::Set).await.expect("set_many");
    }
    let mut widest = 0;
    for window in ["all", "weekly"] {
        wait_for_summary(client, board, "p0", window, PLAYERS as u64).await;
        let asked: Vec<&String> = names.choose_multiple(&mut rng, 150).collect();
        for player in asked {
            let exact: RankInfo =
                client.call::<Option<RankInfo>>(rank_call(board, player, window)).await.unwrap().unwrap();
            let call = rank_call(board, player, window).with("approx", true);
            let approx: ApproxRankInfo = client.call::<Option<ApproxRankInfo>>(call).await.unwrap().unwrap();
            assert!(
                exact.rank.abs_diff(approx.rank) <= approx.error,
                "{board} {window}: {player}'s exact rank {} is not within {} ± {}",
                exact.rank,
                approx.rank,
                approx.error
            );
            assert_eq!((approx.score, approx.count), (exact.score, exact.count), "{board}: {player}");
            widest = widest.max(approx.error);
        }
        let mut probes: Vec<i64> = drawn.choose_multiple(&mut rng, 100).copied().collect();
        probes.extend((0..100).map(|_| scores.draw(&mut rng) + rng.gen_range(-3..=3)));
        probes.extend([i64::MIN, i64::MAX, 0, -1, 1]);
        for score in probes {
            let exact: u64 = client.call(score_call(board, score, window)).await.expect("rank_of_score");
            let call = score_call(board, score, window).with("approx", true);
            let approx: ApproxRankOfScore = client.call(call).await.expect("approx rank_of_score");
            assert!(
                exact.abs_diff(approx.rank) <= approx.error,
                "{board} {window}: rank_of_score({score}) = {exact}, not within {} ± {}",
                approx.rank,
                approx.error
            );
        }
    }
    // The bounds are not trivially wide (a bucket holds far less than the
    // board), nor all zero (the buckets really hold many players).
    assert!(widest < PLAYERS as u64 / 3, "{board}: an error of {widest} on {PLAYERS} players");
    if matches!(spread, Spread::Uniform) {
        assert!(widest > 0, "{board}: every rank exact; the buckets split nothing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_rank_lies_within_the_bound_on_every_spread_shard_count_order_and_tie_rule() {
    let mut seed = 0;
    for shards in [1, 4, 7] {
        let server = common::Server::start_with(shards, &["--debug-approx-buckets", BUCKETS]);
        let mut client = server.client().await;
        for spread in [Spread::Uniform, Spread::Zipf, Spread::Normal] {
            // Every order and tie rule on every shard count would be 12 boards
            // per server; each combination still meets each spread somewhere.
            for (order, ties) in [
                (Order::Desc, Ties::Competition),
                (Order::Asc, Ties::Ordinal),
                (Order::Asc, Ties::Competition),
                (Order::Desc, Ties::Ordinal),
            ]
            .into_iter()
            .skip(shards % 2)
            .step_by(2)
            {
                seed += 1;
                let board = format!("b-{spread:?}-{order:?}-{ties:?}").to_lowercase();
                check_board(&mut client, &board, order, ties, spread, seed).await;
            }
        }
        assert!(server.counter("rankd_approx_refreshes_total", &[]) > 0.0);
        assert!(server.metric("rankd_approx_summaries", &[]) > 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_boards_wrong_types_absent_players_and_missing_boards() {
    let server = common::Server::start(4);
    let mut client = server.client().await;
    client.create_board("dense", Order::Desc, Ties::Dense).await.expect("create dense");
    client.set("dense", "a", 5, Mode::Set).await.expect("set");
    for call in [rank_call("dense", "a", "all"), score_call("dense", 5, "all")] {
        let err = client.call::<Value>(call.with("approx", true)).await.expect_err("approx on dense");
        assert_eq!(err.code(), Some("bad_request"), "{err}");
    }
    client.set("board", "a", 5, Mode::Set).await.expect("set");
    for approx in [Value::from(1), Value::from("yes"), Value::Array(vec![])] {
        let err = client
            .call::<Value>(rank_call("board", "a", "all").with("approx", approx.clone()))
            .await
            .expect_err("a non-boolean approx");
        assert_eq!(err.code(), Some("bad_request"), "{approx}: {err}");
    }
    // `approx: false` is the exact rank.
    let exact: Option<RankInfo> = client.call(rank_call("board", "a", "all").with("approx", false)).await.unwrap();
    assert_eq!(exact.map(|r| r.rank), Some(1));
    assert_eq!(client.rank_approx("board", "nobody").await.expect("absent"), None);
    assert_eq!(client.rank_approx("no-such-board", "a").await.expect("no board"), None);
    let none = client.rank_of_score_approx("no-such-board", 3).await.expect("no board");
    assert_eq!(none, ApproxRankOfScore { rank: 1, error: 0 });
    let one = client.rank_approx("board", "a").await.expect("rank").expect("present");
    assert_eq!((one.rank, one.score, one.count, one.error), (1, 5, 1, 0));
    assert_eq!(client.rank_of_score_approx("board", 9).await.expect("better"), ApproxRankOfScore { rank: 1, error: 0 });
    assert_eq!(client.rank_of_score_approx("board", 1).await.expect("worse"), ApproxRankOfScore { rank: 2, error: 0 });
    // A window the board lacks is refused as for the exact rank.
    let err = client.call::<Value>(rank_call("board", "a", "daily").with("approx", true)).await.expect_err("window");
    assert_eq!(err.code(), Some("bad_request"));
}

/// The summary is refreshed at least once a second (protocol.md) even
/// while its shard's queue is full and sheds requests `overloaded`: the
/// refresh, one command a shard a second, is never shed, or a busy shard
/// would leave approximate ranks minutes stale without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_is_refreshed_while_its_shard_sheds_requests() {
    let server = common::Server::start_with(1, &["--max-shard-queue", "4", "--debug-queue-lone"]);
    let mut client = server.client().await;
    for i in 0..100 {
        client.set("big", &format!("p{i}"), i, Mode::Set).await.expect("set");
    }
    wait_for_summary(&mut client, "big", "p0", "all", 100).await;
    // More connections writing one at a time than the queue holds: every
    // round of the shard finds it full.
    let flood = common::load::lone_writers(&server, 8, "flood").await;
    let refreshes = server.counter("rankd_approx_refreshes_total", &[]);
    // Two seconds of asking (a summary nobody asks for is dropped), eight
    // refresh intervals, and on a loaded machine on until three refreshes
    // (within reason). (An ask may itself be shed: its record is read on
    // the full shard.)
    let call = rank_call("big", "p0", "all").with("approx", true);
    let asking = std::time::Instant::now();
    let mut asked = 0;
    while asked < 20
        || (server.counter("rankd_approx_refreshes_total", &[]) - refreshes < 3.0
            && asking.elapsed() < Duration::from_secs(30))
    {
        let _ = client.call::<Option<ApproxRankInfo>>(call.clone()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        asked += 1;
    }
    let shed = server.counter("rankd_requests_total", &[r#"outcome="overloaded""#]);
    let (refreshed, failed) = (
        server.counter("rankd_approx_refreshes_total", &[]) - refreshes,
        server.counter("rankd_approx_refresh_failures_total", &[]),
    );
    flood.stop().await;
    assert!(shed > 0.0, "the shard shed requests");
    assert_eq!(failed, 0.0, "no refresh was shed");
    assert!(refreshed >= 3.0, "refreshed meanwhile: {refreshed}");
}
