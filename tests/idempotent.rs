//! Idempotent writes (protocol 1.1, `wid`) over TCP against the real
//! server: a repeat within the horizon changes nothing and answers the
//! first result with `dup`; a `set_many` spanning every shard replays
//! whole; the record survives kill -9 because it commits with its write;
//! records expire after `--dedup-horizon-secs`; and a client retrying every
//! write through kill -9 cycles counts each `incr` exactly once.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Server;
use rankd_client::{
    set_call, Call, Client, ConnectOptions, ErrorCode, Mode, OpKind, RetryPolicy, RetryingClient, Written,
};

async fn written<T: serde::de::DeserializeOwned>(client: &mut Client, call: Call) -> Written<T> {
    client.call_written(call).await.expect("the write is answered")
}

fn incr(board: &str, player: &str, by: i64, wid: &str) -> Call {
    set_call(board, player, by, Mode::Incr).with("wid", wid)
}

#[tokio::test]
async fn a_repeated_wid_answers_the_first_result_and_changes_nothing() {
    let server = Server::start(4);
    let mut c = server.client().await;
    let first: Written<i64> = written(&mut c, incr("b", "alice", 5, "w-1")).await;
    let again: Written<i64> = written(&mut c, incr("b", "alice", 5, "w-1")).await;
    assert_eq!((first.value, first.dup), (5, false));
    assert_eq!((again.value, again.dup), (5, true));
    // A different request under the same wid: still the first answer.
    let other: Written<i64> = written(&mut c, set_call("b", "alice", 99, Mode::Set).with("wid", "w-1")).await;
    assert_eq!((other.value, other.dup), (5, true));
    assert_eq!(c.get("b", "alice").await.unwrap(), Some(5));
    // The same wid on another board is another write.
    let elsewhere: Written<i64> = written(&mut c, incr("b2", "alice", 5, "w-1")).await;
    assert_eq!((elsewhere.value, elsewhere.dup), (5, false));
    // Without a wid, writes are as in version 1.
    let plain: Written<i64> = written(&mut c, set_call("b", "alice", 1, Mode::Incr)).await;
    assert_eq!((plain.value, plain.dup), (6, false));

    // remove: the first removal's `true`, and a later write stays.
    let removed: Written<bool> =
        written(&mut c, Call::new(OpKind::Remove).with("board", "b").with("player", "alice").with("wid", "r-1")).await;
    c.set("b", "alice", 7, Mode::Set).await.unwrap();
    let again: Written<bool> =
        written(&mut c, Call::new(OpKind::Remove).with("board", "b").with("player", "alice").with("wid", "r-1")).await;
    assert_eq!((removed.value, removed.dup, again.value, again.dup), (true, false, true, true));
    assert_eq!(c.get("b", "alice").await.unwrap(), Some(7));

    // A wid reused by another kind of write is refused, changing nothing.
    let err = c.call::<i64>(incr("b", "alice", 1, "r-1")).await.unwrap_err();
    assert_eq!(err.error_code(), Some(ErrorCode::BadRequest), "{err:?}");
    assert_eq!(c.get("b", "alice").await.unwrap(), Some(7));
    // A wid out of bounds is a bad request.
    for wid in ["", &"x".repeat(65)] {
        let err = c.call::<i64>(incr("b", "alice", 1, wid)).await.unwrap_err();
        assert_eq!(err.error_code(), Some(ErrorCode::BadRequest), "{wid:?}: {err:?}");
    }
    assert_eq!(server.counter("rankd_dedup_hits_total", &[]), 3.0);
}

fn set_many_incr(players: &[String], wid: &str) -> Call {
    let entries: Vec<(&str, i64)> = players.iter().map(|p| (p.as_str(), 1)).collect();
    Call::new(OpKind::SetMany).with("board", "many").with("entries", entries).with("mode", Mode::Incr).with("wid", wid)
}

#[tokio::test]
async fn a_set_many_spanning_every_shard_replays_whole_and_its_record_survives_kill_9() {
    let mut server = Server::start(4);
    let players: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let mut c = server.client().await;
    let first: Written<Vec<i64>> = written(&mut c, set_many_incr(&players, "batch-1")).await;
    assert_eq!((first.value, first.dup), (vec![1; 40], false));
    let single: Written<i64> = written(&mut c, incr("many", "p0", 10, "single-1")).await;
    assert_eq!(single.value, 11);
    drop(c);

    server.kill9();
    server.restart();
    let mut c = server.client().await;
    // The first answer, from before the crash: p0 now has 11, the replay says 1.
    let again: Written<Vec<i64>> = written(&mut c, set_many_incr(&players, "batch-1")).await;
    assert_eq!((again.value, again.dup), (vec![1; 40], true));
    let single: Written<i64> = written(&mut c, incr("many", "p0", 10, "single-1")).await;
    assert_eq!((single.value, single.dup), (11, true));
    for (i, player) in players.iter().enumerate() {
        assert_eq!(c.get("many", player).await.unwrap(), Some(if i == 0 { 11 } else { 1 }), "{player}");
    }
}

#[tokio::test]
async fn records_expire_after_the_horizon_and_then_the_wid_applies_again() {
    let server = Server::start_with(2, &["--dedup-horizon-secs", "3"]);
    let mut c = server.client().await;
    for i in 0..20 {
        let _: Written<i64> = written(&mut c, incr("h", &format!("p{i}"), 1, &format!("w{i}"))).await;
    }
    let again: Written<i64> = written(&mut c, incr("h", "p1", 1, "w1")).await;
    assert_eq!((again.value, again.dup), (1, true), "within the horizon");
    let held = || (0..2).map(|s| server.metric("rankd_dedup_records", &[&format!("shard=\"{s}\"")])).sum::<f64>();
    common::wait_until(Duration::from_secs(10), "the records to be counted", async || held() == 20.0).await;
    common::wait_until(Duration::from_secs(10), "the records to expire", async || held() == 0.0).await;
    let again: Written<i64> = written(&mut c, incr("h", "p0", 1, "w0")).await;
    assert_eq!((again.value, again.dup), (2, false), "past the horizon a wid is new again");
}

/// Writers retry every write with its wid while the server is killed and
/// restarted at random moments; at the end each counter holds exactly the
/// number of increments its writer made, and each set_many's players too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_writes_count_exactly_once_through_kill_9_cycles() {
    const CYCLES: usize = 20;
    const SHARDS: usize = 4;
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = Server::start_with(SHARDS, &["--listen", &listen]);
    let stop = Arc::new(AtomicBool::new(false));
    let policy = RetryPolicy {
        timeout: Duration::from_secs(2),
        retries: 1000,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        ..RetryPolicy::default()
    };
    let acked = Arc::new(AtomicU64::new(0));
    // Three writers of single incrs, one of set_many incrs over 16 players
    // (spread over every shard).
    let mut writers = Vec::new();
    for id in 0..4 {
        let (stop, acked, listen, policy) = (stop.clone(), acked.clone(), listen.clone(), policy.clone());
        writers.push(tokio::spawn(async move {
            let mut client = RetryingClient::new(listen, ConnectOptions::default(), policy).expect("a valid policy");
            let group: Vec<String> = (0..16).map(|i| format!("g{i}")).collect();
            let entries: Vec<(&str, i64)> = group.iter().map(|p| (p.as_str(), 1)).collect();
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ok = if id < 3 {
                    client.set("exact", &format!("counter-{id}"), 1, Mode::Incr).await.map(drop)
                } else {
                    client.set_many("exact", &entries, Mode::Incr).await.map(drop)
                };
                ok.expect("a retried write is answered in the end");
                done += 1;
                acked.fetch_add(1, Ordering::Relaxed);
            }
            (done, client.retried())
        }));
    }
    for cycle in 0..CYCLES {
        let before = acked.load(Ordering::Relaxed);
        common::wait_until(Duration::from_secs(30), "writes acknowledged in this cycle", async || {
            acked.load(Ordering::Relaxed) >= before + 5
        })
        .await;
        tokio::time::sleep(Duration::from_millis(20 + (cycle as u64 * 37) % 150)).await;
        server.kill9();
        server.restart();
    }
    stop.store(true, Ordering::Relaxed);
    let mut counts = Vec::new();
    let mut retried = 0;
    for writer in writers {
        let (done, retries) = writer.await.expect("a writer");
        counts.push(done);
        retried += retries;
    }
    assert!(retried > 0, "the kills made writers retry");
    let mut c = server.client().await;
    for (id, done) in counts.iter().take(3).enumerate() {
        assert_eq!(c.get("exact", &format!("counter-{id}")).await.unwrap(), Some(*done as i64), "counter-{id}");
    }
    for i in 0..16 {
        assert_eq!(c.get("exact", &format!("g{i}")).await.unwrap(), Some(counts[3] as i64), "g{i}");
    }
    eprintln!("exactly once through {CYCLES} kill -9 cycles: {counts:?} writes acknowledged, {retried} retries");
}
