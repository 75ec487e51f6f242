//! Overload: a thousand connections pipelining writes without reading a
//! reply keep the server's memory bounded, get `overloaded` instead of
//! unbounded queueing, and do not stop other clients from being served;
//! one connection pipelining long lists without reading holds bounded
//! memory too; plus the connection limit and the idle timeout.

mod common;

use std::time::{Duration, Instant};

use common::raw::{frame, req};
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `n` framed `set` requests for distinct players.
fn set_frames(conn: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let fields = [
            ("board", Value::from("flood")),
            ("player", Value::from(format!("c{conn}-p{i}"))),
            ("score", Value::from(i as i64)),
        ];
        out.extend_from_slice(&frame(&req(i as u64 + 1, "set", &fields)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_greedy_connections_stay_bounded_and_others_are_served() {
    const FLOODERS: usize = 1000;
    const PER_CONNECTION: usize = 2000;
    // A slow disk (200 ms a commit) and a small shard queue make the flood
    // outrun the shards whatever the machine: with group commit a fast
    // server once took all 256k requests in stride and shed none.
    let server = common::Server::start_with(
        2,
        &[
            "--max-inflight",
            "256",
            "--max-shard-queue",
            "2000",
            "--max-connections",
            "2000",
            "--debug-commit-delay-ms",
            "200",
        ],
    );
    let baseline = server.rss_bytes();
    // The peak RSS seen while the flood comes in: what must stay bounded.
    let mut flooded = baseline;
    let mut offered = 0usize;
    let mut flooders = Vec::with_capacity(FLOODERS);
    for c in 0..FLOODERS {
        let mut stream = TcpStream::connect(&server.addr).await.expect("connect");
        let frames = set_frames(c, PER_CONNECTION);
        // Write what the socket takes without blocking on the rest (the
        // server stops reading once this connection has 256 requests in
        // flight), counting what went: `write` writes nothing if cancelled.
        let mut written = 0;
        let _ = tokio::time::timeout(Duration::from_millis(20), async {
            while let Ok(n @ 1..) = stream.write(&frames[written..]).await {
                written += n;
            }
        })
        .await;
        offered += written;
        flooders.push(stream);
        if c % 25 == 0 {
            flooded = flooded.max(server.rss_bytes());
        }
    }
    // Wait until the server has read every byte the flooders wrote (and so
    // queued, answered or shed every request they sent), sampling RSS.
    common::wait_for(Duration::from_secs(60), "the server to read the whole flood", async || {
        flooded = flooded.max(server.rss_bytes());
        let open = server.metric("rankd_connections_open", &[]);
        let received = server.metric("rankd_received_bytes_total", &[]);
        if open == FLOODERS as f64 && received >= offered as f64 {
            Ok(())
        } else {
            Err(format!("{open} connections open, {received} of the {offered} bytes written received"))
        }
    })
    .await;

    // A well-behaved client is still served while the flood sits there.
    let mut client = server.client().await;
    let started = Instant::now();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), client.ping()).await.expect("ping answered").unwrap(),
        "pong"
    );
    let ping_time = started.elapsed();
    match client.set("calm", "p", 1, Mode::Set).await {
        Ok(score) => assert_eq!(score, 1),
        Err(e) => assert_eq!(e.code(), Some("overloaded"), "only shedding may refuse it: {e}"),
    }

    // The flooders' replies: acknowledged or shed, nothing else.
    let (mut ok, mut shed) = (0usize, 0usize);
    for stream in flooders.iter_mut().take(50) {
        let mut buf = vec![0u8; 1 << 16];
        let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await else { continue };
        let mut rest = &buf[..n];
        while rest.len() >= 4 {
            let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            if rest.len() < 4 + len {
                break;
            }
            let reply = rmpv::decode::read_value(&mut &rest[4..4 + len]).unwrap();
            match reply["err"]["code"].as_str() {
                None => ok += 1,
                Some("overloaded") => shed += 1,
                Some(other) => panic!("unexpected error code {other}"),
            }
            rest = &rest[4 + len..];
        }
    }
    eprintln!(
        "RSS baseline {} MiB, under {FLOODERS} flooding connections {} MiB at peak ({} MiB of requests \
         written); ping in {ping_time:?}; sampled replies: {ok} acknowledged, {shed} overloaded",
        baseline >> 20,
        flooded >> 20,
        offered >> 20
    );
    assert!(ok + shed > 0, "the flooders got replies");
    assert!(shed > 0, "with 256k requests offered to 2k-command shard queues on a slow disk, some were shed");
    assert!(flooded < 1 << 30, "RSS {} MiB under the flood: not bounded", flooded >> 20);
    drop(flooders);
    // Once the flood is gone (the queued commands take a few slow commits),
    // everything is normal again: until then a write may only be shed.
    common::wait_for(Duration::from_secs(60), "a write to be accepted once the flood is gone", async || {
        match client.set("calm", "q", 2, Mode::Set).await {
            Ok(score) => {
                assert_eq!(score, 2);
                Ok(())
            }
            Err(e) if e.code() == Some("overloaded") => Err(e.to_string()),
            Err(e) => panic!("after the flood, a write failed with {e}"),
        }
    })
    .await;
    assert_eq!(client.get("calm", "q").await.unwrap(), Some(2));
}

#[tokio::test]
async fn connections_over_the_limit_are_told_and_closed() {
    let server = common::Server::start_with(1, &["--max-connections", "3"]);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = server.client().await;
        c.ping().await.unwrap();
        held.push(c);
    }
    let mut extra = Client::connect(server.addr.as_str()).await.unwrap();
    let reply = extra.read_raw::<Value>().await.unwrap().expect("one reply before closing");
    assert_eq!(reply["err"]["code"].as_str(), Some("overloaded"));
    assert!(extra.read_raw::<Value>().await.unwrap().is_none(), "then closed");
    drop(held.pop());
    common::wait_for(Duration::from_secs(10), "the server to see a held connection close", async || {
        let open = server.metric("rankd_connections_open", &[]);
        if open == 2.0 {
            Ok(())
        } else {
            Err(format!("{open} connections open"))
        }
    })
    .await;
    let mut again = server.client().await;
    assert_eq!(again.ping().await.unwrap(), "pong", "a freed slot is usable");
}

#[tokio::test]
async fn idle_and_half_open_connections_are_closed() {
    let server = common::Server::start_with(1, &["--idle-timeout-secs", "1"]);
    let mut idle = TcpStream::connect(&server.addr).await.unwrap();
    // Half a frame, then silence.
    idle.write_all(&[0, 0, 0, 50, 0x81]).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await.expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "the server closed the idle connection");
    // An active client is not affected by the timeout: requests 400 ms
    // apart (under the 1 s timeout) for longer than the timeout. The pauses
    // are the thing under test, not a synchronisation.
    let mut client = server.client().await;
    for _ in 0..3 {
        client.call::<Value>(Call::new(OpKind::Ping)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    client.call::<Value>(set_call("b", "p", 1, Mode::Set)).await.unwrap();
    // Once it falls silent it is closed in turn: the timer its requests
    // kept moving on still fires.
    let closed = tokio::time::timeout(Duration::from_secs(5), client.read_raw::<Value>()).await;
    let closed = closed.expect("closed within 5 s of falling silent");
    assert!(matches!(closed, Ok(None) | Err(_)), "the server closed the silent connection: {closed:?}");
}

/// A connection's requests in flight are bounded by the rows their replies
/// may hold, not only by their number: 4096 pipelined `top`s of 1000 rows,
/// never read, would otherwise pin every answer (a thousand rows from each
/// shard for each of them: the server's RSS grew by over 1 GB for this one
/// connection before the rows were counted). The server
/// reads on only while the rows in flight stay under 16 a request of
/// `--max-inflight` on average; TCP pushes back on the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_pipelining_long_lists_without_reading_stays_bounded() {
    let server = common::Server::start(2);
    let mut client = server.client().await;
    let names: Vec<String> =
        (0..1000).map(|i| format!("a-rather-long-player-name-to-weigh-on-memory-{i:04}")).collect();
    let calls: Vec<Call> = names.iter().zip(0..).map(|(p, s)| set_call("big", p, s, Mode::Set)).collect();
    client.pipeline::<Value>(&calls).await.expect("fill");
    let baseline = server.rss_bytes();
    let mut greedy = TcpStream::connect(&server.addr).await.expect("connect");
    let mut frames = Vec::new();
    for id in 1..=4096u64 {
        let fields = [("board", Value::from("big")), ("limit", Value::from(1000))];
        frames.extend_from_slice(&frame(&req(id, "top", &fields)));
    }
    let mut written = 0;
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        while let Ok(n @ 1..) = greedy.write(&frames[written..]).await {
            written += n;
        }
    })
    .await;
    // The server reads what its bound lets it, the shards answer all of
    // that, and the answers wait for the greedy reader: then nothing moves.
    let mut peak = baseline;
    let mut last = (-1.0, -1.0);
    common::wait_for(Duration::from_secs(30), "the greedy connection's requests to settle", async || {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(server.rss_bytes());
        let now = (server.metric("rankd_received_bytes_total", &[]), server.metric("rankd_shard_mailbox_depth", &[]));
        let settled = now == last && now.1 == 0.0;
        last = now;
        if settled {
            Ok(())
        } else {
            Err(format!("received bytes and queued requests: {now:?}"))
        }
    })
    .await;
    eprintln!("RSS {} MiB before, {} MiB at peak; {written} bytes written", baseline >> 20, peak >> 20);
    assert!(peak < baseline + (256 << 20), "RSS grew from {} to {} MiB for one connection", baseline >> 20, peak >> 20);
    // Everyone else is served meanwhile.
    assert_eq!(client.top("big", 1, 0).await.expect("top").len(), 1);
}
