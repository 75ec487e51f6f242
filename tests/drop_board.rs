//! Dropping a big board against the real server: the drop answers after
//! one commit and a checkpoint, not after deleting the board's keys, which
//! go in bounded steps in the background (`rankd_shard_trees_being_deleted`
//! counts what is left); the name is reused at once and never shows the old
//! players, also after a kill -9 in the middle of the deletion, which the
//! restarted server finishes; writes to other boards go on meanwhile and
//! every acknowledged one is kept.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rankd_client::{Client, Mode};

/// Players on the big board: its keys take several deletion steps.
const BIG: usize = 150_000;

/// Writes one new player to board `other` at a time until told to stop;
/// records every acknowledged one.
async fn writer(addr: String, acked: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let player = format!("o{i}");
        match client.set("other", &player, i, Mode::Set).await {
            Ok(_) => acked.lock().push(player),
            Err(_) => return, // the server was killed
        }
    }
}

fn deleting(server: &common::Server) -> f64 {
    common::sample(&server.metrics_text(), "rankd_shard_trees_being_deleted", &[]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_board_drops_at_once_and_its_keys_go_in_the_background_across_a_restart() {
    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let names: Vec<String> = (0..BIG).map(|i| format!("user:{i:08}")).collect();
    for chunk in names.chunks(10_000) {
        let entries: Vec<(&str, i64)> = chunk.iter().enumerate().map(|(i, name)| (name.as_str(), i as i64)).collect();
        client.set_many("big", &entries, Mode::Set).await.expect("fill the big board");
    }
    assert_eq!(client.count("big").await.expect("count"), BIG as u64);

    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writing = tokio::spawn(writer(server.addr.clone(), acked.clone(), stop.clone()));
    common::wait_until(Duration::from_secs(30), "writes to the other board", async || acked.lock().len() > 20).await;

    let started = Instant::now();
    assert!(client.drop_board("big").await.expect("drop_board"), "the board existed");
    let dropped_in = started.elapsed();
    // The name is free at once, and answers nothing of the old board.
    assert_eq!(client.count("big").await.expect("count"), 0);
    assert_eq!(client.set("big", "newcomer", 7, Mode::Set).await.expect("set"), 7);
    assert_eq!(client.count("big").await.expect("count"), 1);
    assert_eq!(client.get("big", "user:00000001").await.expect("get"), None);
    let top = client.top("big", 10, 0).await.expect("top");
    assert_eq!(top.iter().map(|e| e.player.as_str()).collect::<Vec<_>>(), ["newcomer"]);
    // The gauge is published once a second.
    common::wait_until(Duration::from_secs(30), "the big board's keys being deleted in the background", async || {
        deleting(&server) > 0.0
    })
    .await;

    // kill -9 in the middle of the deletion.
    common::wait_until(Duration::from_secs(10), "more writes to the other board", async || acked.lock().len() > 40)
        .await;
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("writer");
    server.restart();
    let mut client = server.client().await;
    assert_eq!(client.count("big").await.expect("count"), 1, "the old players never come back");
    assert_eq!(client.get("big", "newcomer").await.expect("get"), Some(7));
    assert_eq!(client.get("big", "user:00000001").await.expect("get"), None);
    let acked_players = acked.lock().clone();
    for player in &acked_players {
        assert!(client.get("other", player).await.expect("get").is_some(), "acknowledged {player} lost");
    }
    // The restarted server finishes the deletion.
    common::wait_until(Duration::from_secs(120), "the big board's keys deleted", async || deleting(&server) == 0.0)
        .await;
    drop(client);
    assert!(server.terminate().success());
    common::rankd_check(server.data_dir(), "after the deletion");
    eprintln!("dropping {BIG} players took {dropped_in:?}; {} writes to the other board kept", acked_players.len());
}
