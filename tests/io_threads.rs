//! Connections spread over several I/O threads keep every guarantee of
//! protocol.md: requests of one connection take effect in the order sent
//! (so on an `ordinal` board its send order is the reach order), a write
//! acknowledged on one connection is seen by the next request of any other,
//! writes that arrive one after another rank in that order, replies
//! come back in the order sent, however each is answered, and ranks read
//! in place on several threads at once are exact.
//!
//! Connections are dealt to the I/O threads in turn, so consecutive
//! connections of a test sit on different threads.

mod common;

use common::raw::{frame, req};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Entry, Mode, OpKind, Order, RankInfo, Ties};
use rmpv::Value;

const IO_THREADS: usize = 2;

async fn clients(server: &common::Server, count: usize) -> Vec<Client> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(server.client().await);
    }
    out
}

async fn top(client: &mut Client, board: &str) -> Vec<Entry> {
    let call = Call::new(OpKind::Top).with("board", board).with("limit", 1000);
    client.call(call).await.expect("top")
}

#[tokio::test]
async fn send_order_is_reach_order_on_every_io_thread() {
    let server = common::Server::start_with(3, &["--io-threads", &IO_THREADS.to_string()]);
    let mut conns = clients(&server, 4).await;
    assert!(conns[0].create_board("o", Order::Desc, Ties::Ordinal).await.expect("create"));

    // Four connections pipeline ties at once: each keeps its own send order.
    let per_conn = 60;
    let pipelines = conns.iter_mut().enumerate().map(|(k, client)| async move {
        let calls: Vec<Call> = (0..per_conn).map(|i| set_call("o", &format!("c{k}-{i:03}"), 100, Mode::Set)).collect();
        for reply in client.pipeline::<Value>(&calls).await.expect("pipeline") {
            assert_eq!(reply.expect("set"), Value::from(100));
        }
    });
    futures::future::join_all(pipelines).await;
    let listed = top(&mut conns[1], "o").await;
    assert_eq!(listed.len(), 4 * per_conn);
    for k in 0..4 {
        let mine: Vec<&str> =
            (listed.iter().map(|e| e.player.as_str())).filter(|p| p.starts_with(&format!("c{k}-"))).collect();
        let sent: Vec<String> = (0..per_conn).map(|i| format!("c{k}-{i:03}")).collect();
        assert_eq!(mine, sent, "connection {k}'s ties rank in the order it sent them");
    }
    // Ordinal ranks are 1..n: every tie has its own.
    assert!(listed.iter().enumerate().all(|(i, e)| e.rank == i as u64 + 1));

    // One after another, each acknowledged before the next is sent, from
    // connections on alternating threads: they rank in that order.
    let order = [3, 0, 2, 1, 1, 3, 0, 2];
    for (n, &k) in order.iter().enumerate() {
        assert_eq!(conns[k].set("o", &format!("late-{n}"), 100, Mode::Set).await.expect("set"), 100);
    }
    let listed = top(&mut conns[2], "o").await;
    let late: Vec<&str> = (listed.iter().map(|e| e.player.as_str())).filter(|p| p.starts_with("late-")).collect();
    let expected: Vec<String> = (0..order.len()).map(|n| format!("late-{n}")).collect();
    assert_eq!(late, expected, "arrival order across connections and threads");
    // Both I/O threads run (each exports its CPU series; `metric` fails
    // the test if one does not).
    for thread in ["io-0", "io-1"] {
        server.metric("rankd_thread_cpu_seconds_total", &[&format!("thread=\"{thread}\"")]);
    }
}

#[tokio::test]
async fn a_write_acknowledged_on_one_connection_is_seen_by_the_next_read_of_another() {
    let server = common::Server::start_with(2, &["--io-threads", &IO_THREADS.to_string()]);
    let mut conns = clients(&server, 2).await;
    let (writer, reader) = conns.split_at_mut(1);
    let (writer, reader) = (&mut writer[0], &mut reader[0]);
    let mut rng = StdRng::seed_from_u64(33);
    for round in 0..300 {
        let player = format!("p{}", round % 37);
        let score = rng.gen_range(-1_000_000..1_000_000i64);
        assert_eq!(writer.set("b", &player, score, Mode::Set).await.expect("set"), score);
        // A lone rank (answered in place) and a pipelined one (queued for
        // the shards) on the other connection both see the write.
        let lone: Option<RankInfo> = reader.rank("b", &player).await.expect("rank");
        assert_eq!(lone.map(|r| r.score), Some(score), "round {round}: lone rank");
        let calls = [
            Call::new(OpKind::Rank).with("board", "b").with("player", player.as_str()),
            Call::new(OpKind::Get).with("board", "b").with("player", player.as_str()),
        ];
        let replies = reader.pipeline::<Value>(&calls).await.expect("pipeline");
        let rank = replies[0].as_ref().expect("rank");
        assert_eq!(rank["score"], Value::from(score), "round {round}: pipelined rank");
        assert_eq!(replies[1].as_ref().expect("get"), &Value::from(score), "round {round}: get");
    }
}

/// Lone writes (staged in place on their connection's I/O thread when the
/// shard has nothing unapplied, queued otherwise) and pipelined ones
/// (always queued) reach one `ordinal` board at once: each connection's
/// writes rank in the order it sent them, and every tie has its own rank.
#[tokio::test]
async fn lone_writes_in_place_and_queued_pipelines_keep_each_connections_order() {
    let server = common::Server::start_with(2, &["--io-threads", &IO_THREADS.to_string()]);
    let mut conns = clients(&server, 4).await;
    assert!(conns[0].create_board("o", Order::Desc, Ties::Ordinal).await.expect("create"));
    let per_conn = 120;
    let writers = conns.iter_mut().enumerate().map(|(k, client)| async move {
        if k % 2 == 0 {
            for chunk in (0..per_conn).collect::<Vec<_>>().chunks(20) {
                let calls: Vec<Call> =
                    chunk.iter().map(|i| set_call("o", &format!("c{k}-{i:03}"), 7, Mode::Set)).collect();
                for reply in client.pipeline::<Value>(&calls).await.expect("pipeline") {
                    assert_eq!(reply.expect("set"), Value::from(7));
                }
            }
        } else {
            for i in 0..per_conn {
                assert_eq!(client.set("o", &format!("c{k}-{i:03}"), 7, Mode::Set).await.expect("set"), 7);
            }
        }
    });
    futures::future::join_all(writers).await;
    let listed = top(&mut conns[1], "o").await;
    assert_eq!(listed.len(), 4 * per_conn);
    assert!(listed.iter().enumerate().all(|(i, e)| e.rank == i as u64 + 1), "every tie has its own rank");
    for k in 0..4 {
        let mine: Vec<&str> =
            (listed.iter().map(|e| e.player.as_str())).filter(|p| p.starts_with(&format!("c{k}-"))).collect();
        let sent: Vec<String> = (0..per_conn).map(|i| format!("c{k}-{i:03}")).collect();
        assert_eq!(mine, sent, "connection {k}'s ties rank in the order it sent them");
    }
    let in_place = server.metric("rankd_writes_in_place_total", &[]);
    assert!(in_place > 0.0, "some lone writes were staged in place ({in_place})");
    // A pipeline's first read may hold a short batch alone: at most 4 of
    // each of the 12 pipelines may go in place with it.
    assert!(in_place <= (2 * per_conn + 48) as f64, "pipelined writes are queued ({in_place})");
}

/// Replies come back in the order their requests were sent, however each
/// is answered: a write waits for its (slowed) commit while the requests
/// after it, each read on its own, are ones the router answers at once (a
/// `ping`, a rank on no board, a request refused while decoding) or a rank
/// of the board the write is still committing to. None may be written
/// before the write's own reply.
#[tokio::test]
async fn replies_answered_at_once_never_overtake_a_write_still_committing() {
    let server = common::Server::start_with(1, &["--debug-commit-delay-ms", "300"]);
    let mut client = server.client().await;
    assert_eq!(client.set("b", "p", 5, Mode::Set).await.expect("set"), 5);
    let b = |name: &str| ("board", Value::from(name));
    let requests = [
        frame(&req(1, "set", &[b("b"), ("player", Value::from("q")), ("score", Value::from(6))])),
        frame(&req(2, "ping", &[])),
        frame(&req(3, "rank", &[b("none"), ("player", Value::from("p"))])),
        frame(&req(4, "rank", &[b("b")])),
        frame(&req(5, "rank", &[b("b"), ("player", Value::from("p"))])),
    ];
    for request in &requests {
        client.send_raw(request).await.expect("send");
        // Each in a read of its own: routed while the write is in flight.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut replies = Vec::new();
    for _ in &requests {
        let reply = tokio::time::timeout(std::time::Duration::from_secs(10), client.read_raw::<Value>()).await;
        replies.push(reply.expect("a reply in time").expect("read").expect("a reply, not a close"));
    }
    let field = |reply: &Value, name: &str| common::field(reply, name).cloned();
    let ids: Vec<Option<u64>> = replies.iter().map(|reply| field(reply, "id").and_then(|id| id.as_u64())).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5].map(Some), "replies in the order sent: {replies:?}");
    assert_eq!(field(&replies[0], "ok"), Some(Value::from(6)), "the write");
    assert_eq!(field(&replies[1], "ok"), Some(Value::from("pong")));
    assert_eq!(field(&replies[2], "ok"), Some(Value::Nil), "no board: no rank");
    let refused = field(&replies[3], "err").expect("a rank without a player is refused");
    assert_eq!(common::field(&refused, "code").and_then(Value::as_str), Some("bad_request"));
    let rank = field(&replies[4], "ok").expect("the rank");
    // Sent after the write: it sees it (q at 6 ranks before p at 5 on a
    // descending board).
    assert_eq!(common::field(&rank, "rank").and_then(Value::as_u64), Some(2), "{rank}");
}

/// A write that comes while its shard's batch syncs waits for that
/// shard's committer. A rank pipelined behind it on its connection still
/// counts it, though the rank's owner is the other shard and asks this one
/// for its count itself. Another connection keeps a batch syncing on both
/// shards (every commit sleeps), and each round's new player, above the
/// ranked one, lands on either shard.
#[tokio::test]
async fn a_rank_pipelined_behind_a_write_waiting_for_its_shards_committer_counts_it() {
    let server = common::Server::start_with(2, &["--debug-commit-delay-ms", "50"]);
    let mut conns = clients(&server, 2).await;
    let mut ranker = conns.pop().expect("two connections");
    let mut busy = conns.pop().expect("two connections");
    assert_eq!(ranker.set("b", "p", 0, Mode::Set).await.expect("set"), 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let keep_syncing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            // Players below p, so they never change its rank.
            let calls: Vec<Call> = (0..16).map(|i| set_call("b", &format!("low{i}"), -1 - i, Mode::Set)).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                busy.pipeline::<Value>(&calls).await.expect("low writes");
            }
        })
    };
    for round in 0..40u64 {
        let calls = [
            set_call("b", &format!("high{round}"), 1_000 + round as i64, Mode::Set),
            Call::new(OpKind::Rank).with("board", "b").with("player", "p"),
        ];
        let replies = ranker.pipeline::<Value>(&calls).await.expect("pipeline");
        assert_eq!(replies[0].as_ref().expect("set"), &Value::from(1_000 + round as i64));
        let rank = replies[1].as_ref().expect("rank");
        // Every player written before, this round's too, is above p.
        assert_eq!(common::field(rank, "rank").and_then(Value::as_u64), Some(round + 2), "round {round}: {rank}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    keep_syncing.await.expect("the busy connection");
}

/// Lone ranks are answered in place, and readers on different I/O threads
/// share a shard's engine, each filling the record cache on a miss. After
/// a restart (the cache empty) many connections rank every player of one
/// shard at once, each in its own order: every rank is exact, and a miss
/// filled by one reader serves the others.
#[tokio::test]
async fn ranks_in_place_on_every_io_thread_at_once_are_exact_while_the_record_cache_fills() {
    let mut server = common::Server::start_with(1, &["--io-threads", "4"]);
    let players = 400u64;
    let mut rng = StdRng::seed_from_u64(57);
    let mut scores: Vec<i64> = (0..players as i64).map(|i| i * 3 - 500).collect();
    scores.shuffle(&mut rng);
    let mut writer = server.client().await;
    let calls: Vec<Call> =
        scores.iter().enumerate().map(|(p, &score)| set_call("b", &format!("p{p}"), score, Mode::Set)).collect();
    for reply in writer.pipeline::<Value>(&calls).await.expect("pipeline") {
        reply.expect("set");
    }
    drop(writer);
    server.terminate();
    server.restart();

    // Distinct scores on a descending board: a player's rank is one more
    // than the players scoring above them.
    let expected: Vec<u64> =
        scores.iter().map(|&mine| 1 + scores.iter().filter(|&&other| other > mine).count() as u64).collect();
    let (expected, scores) = (&expected, &scores);
    let readers = clients(&server, 8).await;
    let ranked = readers.into_iter().enumerate().map(|(k, mut client)| {
        let mut order: Vec<usize> = (0..players as usize).collect();
        order.shuffle(&mut StdRng::seed_from_u64(k as u64));
        async move {
            for p in order {
                let info = client.rank("b", &format!("p{p}")).await.expect("rank").expect("ranked");
                assert_eq!((info.rank, info.score, info.count), (expected[p], scores[p], players), "p{p}");
            }
        }
    });
    futures::future::join_all(ranked).await;
    let in_place = server.counter("rankd_ranks_in_place_total", &[]);
    assert!(in_place >= (8 * players / 2) as f64, "most lone ranks answered in place: {in_place}");
    let misses = server.counter("rankd_shard_record_cache_misses_total", &[]);
    let hits = server.counter("rankd_shard_record_cache_hits_total", &[]);
    assert!(misses >= players as f64 && hits > 0.0, "the cache filled from the readers: {misses} misses, {hits} hits");
}
