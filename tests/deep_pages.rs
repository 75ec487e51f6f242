//! Deep `top` pages inside large ties, against a brute force over TCP.
//!
//! Names that share their first bytes (`user:00250000`) share a count-tree
//! key, so a deep page inside their tie is found through the shards' tie
//! groups (`rankd_shards::ties`) rather than by reading the tie. Each board
//! here crowds thousands of players on one score under names of several
//! shapes (8-byte prefixes, prefixes longer than 24 bytes, short names), on
//! 1, 2 and 5 shards, for both orders and the competition and dense tie
//! rules; every page read at random and boundary offsets must equal the
//! brute-force slice, before and after removals and moves, and after a
//! kill -9.

mod common;

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rankd_client::{Client, Entry, Mode, Order, Ties};

/// The board a brute force keeps: each player's score.
type Scores = BTreeMap<String, i64>;

/// A name of one of the shapes that crowd a tree key.
fn name(i: u64) -> String {
    match i % 4 {
        0 | 1 => format!("user:{:08}", i * 7 % 9000),
        2 => format!("tournament-2026-season-1:player:{:06}", i % 1700),
        _ => format!("p{}", i % 300),
    }
}

/// The whole list in `top` order, with each entry's rank by the tie rule.
fn brute_list(scores: &Scores, order: Order, ties: Ties) -> Vec<Entry> {
    let mut list: Vec<(&String, i64)> = scores.iter().map(|(p, s)| (p, *s)).collect();
    let better = |s: i64| if order == Order::Desc { -s } else { s };
    list.sort_by(|a, b| better(a.1).cmp(&better(b.1)).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
    let mut out = Vec::with_capacity(list.len());
    let (mut rank, mut distinct) = (0u64, 0u64);
    for (i, (player, score)) in list.iter().enumerate() {
        if i == 0 || list[i - 1].1 != *score {
            rank = i as u64 + 1;
            distinct += 1;
        }
        let rank = if ties == Ties::Dense { distinct } else { rank };
        out.push(Entry { player: (*player).clone(), score: *score, rank });
    }
    out
}

/// Reads pages at offsets spread over the list (and at its tie's edges) and
/// compares each with the brute force.
async fn check_pages(client: &mut Client, board: &str, scores: &Scores, order: Order, ties: Ties, rng: &mut impl Rng) {
    let list = brute_list(scores, order, ties);
    let n = list.len() as u64;
    let mut offsets: Vec<u64> = (0..24).map(|_| rng.gen_range(0..n + 5)).collect();
    offsets.extend([0, 1, n.saturating_sub(1), n, n / 2]);
    // The edges of the first names' prefix groups inside the big tie.
    for w in list.windows(2) {
        if w[0].player.get(..8) != w[1].player.get(..8) && rng.gen_ratio(1, 3) {
            let at = list.iter().position(|e| e.player == w[1].player).expect("in the list") as u64;
            offsets.extend([at.saturating_sub(1), at, at + 150]);
        }
    }
    for offset in offsets {
        let limit = rng.gen_range(1..=40u64);
        let got = client.top(board, limit, offset).await.expect("top");
        let from = (offset as usize).min(list.len());
        let to = (from + limit as usize).min(list.len());
        assert_eq!(got, list[from..to], "{board}: top {limit} at offset {offset} of {n}");
    }
}

async fn crowd(client: &mut Client, board: &str, scores: &mut Scores, rng: &mut impl Rng, players: u64) {
    let mut batch: Vec<(String, i64)> = Vec::new();
    for i in 0..players {
        let player = name(i * 31 + rng.gen_range(0..5));
        // Most on one score: the tie; a few around it.
        let score = if rng.gen_ratio(9, 10) { 50 } else { rng.gen_range(48..53) };
        scores.insert(player.clone(), score);
        batch.push((player, score));
        if batch.len() == 1000 {
            let entries: Vec<(&str, i64)> = batch.iter().map(|(p, s)| (p.as_str(), *s)).collect();
            client.set_many(board, &entries, Mode::Set).await.expect("set_many");
            batch.clear();
        }
    }
    let entries: Vec<(&str, i64)> = batch.iter().map(|(p, s)| (p.as_str(), *s)).collect();
    client.set_many(board, &entries, Mode::Set).await.expect("set_many");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_pages_inside_large_ties_match_a_brute_force() {
    for (shards, seed) in [(1usize, 1u64), (2, 2), (5, 3)] {
        let mut server = common::Server::start(shards);
        let mut client = server.client().await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let boards = [("desc-competition", Order::Desc, Ties::Competition), ("asc-dense", Order::Asc, Ties::Dense)];
        let mut all: Vec<Scores> = Vec::new();
        for (board, order, ties) in boards {
            client.create_board(board, order, ties).await.expect("create_board");
            let mut scores = Scores::new();
            crowd(&mut client, board, &mut scores, &mut rng, 6000).await;
            check_pages(&mut client, board, &scores, order, ties, &mut rng).await;
            // Removals and moves out of the tie and back.
            let names: Vec<String> = scores.keys().cloned().collect();
            for player in names.iter().filter(|_| rng.gen_ratio(1, 4)) {
                assert!(client.remove(board, player).await.expect("remove"));
                scores.remove(player);
            }
            for (i, player) in names.iter().enumerate().filter(|(i, _)| i % 8 == 3) {
                let score = 49 + (i % 3) as i64;
                client.set(board, player, score, Mode::Set).await.expect("set");
                scores.insert(player.clone(), score);
            }
            check_pages(&mut client, board, &scores, order, ties, &mut rng).await;
            all.push(scores);
        }
        server.kill9();
        server.restart();
        let mut client = server.client().await;
        for ((board, order, ties), scores) in boards.iter().zip(&all) {
            check_pages(&mut client, board, scores, *order, *ties, &mut rng).await;
        }
    }
}
