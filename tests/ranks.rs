//! `ranks` (protocol 1.1: a friends leaderboard in one call) against the
//! real server for 1, 4 and 7 shards, both orders and every tie rule: each
//! random list (absent players and repeats included) answers exactly the
//! named players present, each once, in `top`'s order with `top`'s ranks;
//! and for `competition` and `dense` each rank also equals a brute-force
//! count over the scores the test wrote.

mod common;

use std::collections::{BTreeSet, HashMap};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd_client::{Call, Client, Entry, Mode, OpKind, Order, Ties};

const PLAYERS: usize = 300;

/// The rank a brute force gives `score` among `scores` (competition:
/// one plus the players strictly better; dense: one plus the distinct
/// better scores).
fn brute_rank(scores: &HashMap<String, i64>, score: i64, order: Order, ties: Ties) -> u64 {
    let better = |other: i64| if order == Order::Desc { other > score } else { other < score };
    match ties {
        Ties::Dense => 1 + scores.values().filter(|s| better(**s)).collect::<BTreeSet<_>>().len() as u64,
        _ => 1 + scores.values().filter(|s| better(**s)).count() as u64,
    }
}

async fn check_board(client: &mut Client, board: &str, order: Order, ties: Ties, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    client.create_board(board, order, ties).await.expect("create_board");
    let names: Vec<String> = (0..PLAYERS).map(|i| format!("player-{i}")).collect();
    let mut scores: HashMap<String, i64> = HashMap::new();
    // Few distinct scores, so ties are everywhere; some players removed.
    for name in &names {
        let score = rng.gen_range(-20..20);
        client.set(board, name, score, Mode::Set).await.expect("set");
        scores.insert(name.clone(), score);
    }
    for name in names.choose_multiple(&mut rng, PLAYERS / 10) {
        assert!(client.remove(board, name).await.expect("remove"));
        scores.remove(name);
    }
    for name in names.choose_multiple(&mut rng, PLAYERS / 10) {
        let score = rng.gen_range(-20..20);
        client.set(board, name, score, Mode::Set).await.expect("set again");
        scores.insert(name.clone(), score);
    }
    let top: Vec<Entry> = client.top(board, 1000, 0).await.expect("top");
    assert_eq!(top.len(), scores.len());
    for round in 0..40 {
        let n = rng.gen_range(1..=60);
        let mut asked: Vec<String> = (0..n)
            .map(|_| match rng.gen_range(0..10) {
                0 => format!("stranger-{}", rng.gen_range(0..5)),
                _ => names.choose(&mut rng).cloned().expect("a name"),
            })
            .collect();
        if round % 4 == 0 {
            let again = asked[0].clone();
            asked.push(again); // a repeat
        }
        let refs: Vec<&str> = asked.iter().map(String::as_str).collect();
        let got = client.ranks(board, &refs).await.expect("ranks");
        let wanted: BTreeSet<&str> = refs.iter().copied().collect();
        let want: Vec<&Entry> = top.iter().filter(|e| wanted.contains(e.player.as_str())).collect();
        assert_eq!(got.len(), want.len(), "{board} round {round}: {asked:?}");
        for (got, want) in got.iter().zip(want) {
            assert_eq!(got, want, "{board} round {round}");
            if ties != Ties::Ordinal {
                let brute = brute_rank(&scores, got.score, order, ties);
                assert_eq!(got.rank, brute, "{board}: {}'s rank against the brute force", got.player);
            }
            assert_eq!(Some(&got.score), scores.get(&got.player), "{board}: {}'s score", got.player);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_match_top_and_a_brute_force_on_every_shard_count_order_and_tie_rule() {
    for shards in [1, 4, 7] {
        let server = common::Server::start(shards);
        let mut client = server.client().await;
        let mut seed = shards as u64 * 100;
        for order in [Order::Desc, Order::Asc] {
            for ties in [Ties::Competition, Ties::Dense, Ties::Ordinal] {
                seed += 1;
                let board = format!("b-{order:?}-{ties:?}").to_lowercase();
                check_board(&mut client, &board, order, ties, seed).await;
            }
        }
        // Windows: `ranks` reads the window and period asked for.
        let call = Call::new(OpKind::Ranks).with("board", "b-desc-competition").with("players", ["player-1"]);
        let in_all: Vec<Entry> = client.call(call.clone().with("window", "all")).await.expect("ranks in all");
        let plain: Vec<Entry> = client.call(call).await.expect("ranks");
        assert_eq!(in_all, plain);
        let err = client
            .call::<Vec<Entry>>(
                Call::new(OpKind::Ranks)
                    .with("board", "b-desc-competition")
                    .with("players", ["x"])
                    .with("window", "daily"),
            )
            .await
            .expect_err("a window the board lacks");
        assert_eq!(err.code(), Some("bad_request"));
    }
}
