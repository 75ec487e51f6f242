//! An idle server puts what a burst of writes left in memory into storage
//! by itself (`rankd_shards::Shard::settle_idle`): over TCP, against the
//! real server, read from its gauges, then across a kill -9.

mod common;

use std::time::Duration;

use rankd_client::{set_call, Call, Mode};

/// 400 one-player boards written in one burst, below a regular
/// checkpoint's due (800 changes a shard at these settings) but past an
/// eighth of it: with no further request, every tree freezes, the overlay
/// goes out as runs, the log is checkpointed and the memtables flushed. A
/// kill -9 then restarts with no log to replay and every player in place.
#[tokio::test]
async fn an_idle_server_checkpoints_its_burst_and_restarts_with_nothing_to_replay() {
    let mut server = common::Server::start_with(2, &["--debug-checkpoint-every", "800"]);
    let mut client = server.client().await;
    let calls: Vec<Call> = (0..400).map(|i| set_call(&format!("small{i}"), &format!("p{i}"), i, Mode::Set)).collect();
    for reply in client.pipeline::<i64>(&calls).await.unwrap() {
        reply.unwrap();
    }
    let gauge = |text: &str, name: &str, labels: &[&str]| common::sample(text, name, labels).unwrap_or(-1.0);
    let text = server.metrics_text();
    assert!(gauge(&text, "rankd_shard_checkpoints_total", &[]) <= 0.0, "no checkpoint was due:\n{text}");
    common::wait_until(Duration::from_secs(30), "the idle shards to settle", async || {
        let text = server.metrics_text();
        let settled = gauge(&text, "rankd_shard_trees", &["form=\"frozen\""]) == 400.0
            && gauge(&text, "rankd_shard_trees", &["form=\"compact\""]) == 0.0
            && gauge(&text, "rankd_shard_unwritten_players", &[]) == 0.0
            && gauge(&text, "rankd_shard_logged_changes", &[]) == 0.0
            && gauge(&text, "rankd_shard_memtable_bytes", &[]) == 0.0;
        if !settled {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        settled
    })
    .await;
    // Counted by each shard's runs thread once it has handed the memtables
    // to fjall, so possibly after they were flushed.
    common::wait_until(Duration::from_secs(30), "one checkpoint a shard", async || {
        server.counter("rankd_shard_checkpoints_total", &[]) >= 2.0
    })
    .await;

    drop(client);
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    // Published as the shards open: what they replayed and refilled.
    let text = server.metrics_text();
    assert_eq!(gauge(&text, "rankd_shard_logged_changes", &[]), 0.0, "nothing replayed:\n{text}");
    assert_eq!(gauge(&text, "rankd_shard_unwritten_players", &[]), 0.0, "no overlay to refill:\n{text}");
    for i in (0..400).step_by(7) {
        let rank = client.rank(&format!("small{i}"), &format!("p{i}")).await.unwrap();
        assert_eq!(rank.map(|r| (r.rank, r.score)), Some((1, i)), "small{i}");
    }
}

/// kill -9 at any moment of the idle shards' settling (before the first
/// look, while the checkpoint is copied, once its end is sealed, while the
/// memtables flush) loses no acknowledged write: five bursts over the same
/// 300 boards (~300 changes a shard, past the idle checkpoint's 100 at
/// these settings), each killed at another delay after its last answer,
/// each restart checked against what was acknowledged.
#[tokio::test]
async fn a_kill_at_any_moment_of_idle_settling_loses_no_acknowledged_write() {
    let mut server = common::Server::start_with(2, &["--debug-checkpoint-every", "800"]);
    // Board -> player -> score, as acknowledged.
    let mut oracle: Vec<Vec<(String, i64)>> = vec![Vec::new(); 300];
    for (round, delay_ms) in [0u64, 700, 1_400, 2_200, 3_100].into_iter().enumerate() {
        let mut client = server.client().await;
        let mut calls = Vec::new();
        for (board, players) in oracle.iter_mut().enumerate() {
            // A new player each round, and the first one's score moves.
            players.push((format!("r{round}p{board}"), (round * 1_000 + board) as i64));
            players[0].1 = -((round * 7 + board) as i64);
            for (player, score) in [&players[0], &players[players.len() - 1]] {
                calls.push(set_call(&format!("b{board}"), player, *score, Mode::Set));
            }
        }
        for reply in client.pipeline::<i64>(&calls).await.unwrap() {
            reply.unwrap();
        }
        drop(client);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        server.kill9();
        server.restart();
        let mut client = server.client().await;
        for (board, players) in oracle.iter().enumerate() {
            let mut want = players.clone();
            want.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let top = client.top(&format!("b{board}"), 10, 0).await.unwrap();
            let got: Vec<(String, i64)> = top.into_iter().map(|e| (e.player, e.score)).collect();
            assert_eq!(got, want, "board b{board} after a kill {delay_ms} ms into round {round}'s quiet");
        }
    }
}
