//! Harm containment: a hostile client's stream and rude disconnects leave other
//! clients and acknowledged writes alone; mixed pipelines answer in order.

use std::time::Duration;

use rankd_client::{Client, Mode};
use rmpv::Value;

use crate::common::raw::{frame, req};
use crate::common::Server;
use crate::helpers::{assert_err, assert_ok, assert_usable, b, encode, get, list, map, p, pair, read_reply, MAX_FRAME};

/// Mixed malformed frames and the code (and id) each must get.
fn bad_stream(round: u64) -> Vec<(Vec<u8>, u64, &'static str)> {
    let id = 1_000 + round * 10;
    vec![
        (vec![0xc1, 0x01], 0, "bad_frame"),
        (Vec::new(), 0, "bad_frame"),
        (encode(&list(vec![Value::from(1)])), 0, "bad_frame"),
        (vec![0xdf, 0xff, 0xff, 0xff, 0xff], 0, "bad_frame"),
        (vec![0x91; 2_000], 0, "bad_frame"),
        (encode(&map(&[("op", Value::from("ping"))])), 0, "bad_request"),
        (req(id, "fly", &[]), id, "unknown_op"),
        (req(id + 1, "set", &[b("good"), p("g0"), ("score", Value::from("x"))]), id + 1, "bad_request"),
        (req(id + 2, "set", &[b("good"), p("g1"), ("score", Value::from(u64::MAX))]), id + 2, "bad_request"),
        (req(id + 3, "set", &[b("good"), p("")]), id + 3, "bad_request"),
        (
            req(id + 4, "set", &[b("good"), p("g2"), ("score", Value::from(1)), ("mode", Value::from("??"))]),
            id + 4,
            "bad_request",
        ),
        (req(id + 5, "drop_board", &[b("bad board")]), id + 5, "bad_request"),
        (req(id + 6, "top", &[b("good"), ("limit", Value::from(5000))]), id + 6, "bad_request"),
        (
            req(id + 7, "set_many", &[b("good"), ("entries", list(vec![pair("g3", 1), pair("g4", "no")]))]),
            id + 7,
            "bad_request",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_clients_are_unaffected_by_a_hostile_client() {
    let server = Server::start(4);
    let mut good = server.client().await;
    let mut bad = server.client().await;
    let addr = server.addr.clone();
    const PLAYERS: i64 = 300;

    let good_task = async move {
        for i in 0..PLAYERS {
            let player = format!("g{i}");
            let score = i * 7 - 500;
            assert_eq!(
                good.set("good", &player, score, Mode::Set).await.expect("good set"),
                score,
                "good set of {player}"
            );
            if i % 10 == 9 {
                assert_eq!(get(&mut good, "good", &player).await, Some(score), "good read-back of {player}");
                assert_eq!(good.count("good").await.expect("count"), (i + 1) as u64, "good count after {player}");
                let top = good.top("good", 1, 0).await.expect("top");
                assert_eq!(top[0].score, i * 7 - 500, "good top-1 after {player}");
            }
            tokio::task::yield_now().await;
        }
        good
    };

    let bad_task = async move {
        for round in 0..60 {
            let stream = bad_stream(round);
            let mut bytes = Vec::new();
            for (body, _, _) in &stream {
                bytes.extend(frame(body));
            }
            bad.send_raw(&bytes).await.expect("bad send");
            for (k, (_, id, code)) in stream.iter().enumerate() {
                let ctx = format!("hostile round {round} frame {k}");
                let reply = read_reply(&mut bad, &ctx).await;
                assert_err(&reply, *id, code, &ctx);
            }
        }
        bad
    };

    // Connections that die in nasty ways while the good client works.
    let rude_task = async move {
        for i in 0..20u32 {
            let mut rude = Client::connect(addr.as_str()).await.expect("rude connect");
            match i % 3 {
                // Half a frame, then hang up.
                0 => rude.send_raw(&[0, 0, 1, 0, 0x82, 0xa2]).await.expect("send half a frame"),
                // Half a length prefix, then hang up.
                1 => rude.send_raw(&[0, 0]).await.expect("send half a prefix"),
                // Oversized frame: the server answers and closes.
                _ => {
                    rude.send_raw(&(MAX_FRAME as u32 + 1).to_be_bytes()).await.expect("send oversized");
                    let reply = read_reply(&mut rude, "rude oversized").await;
                    assert_err(&reply, 0, "too_large", "rude oversized");
                }
            }
            drop(rude);
            // Pacing, not a synchronisation: spreads the rude connections
            // over the good client's run instead of all at its start.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };

    let (mut good, mut bad, ()) = tokio::join!(good_task, bad_task, rude_task);
    assert_usable(&mut bad, "hostile client after its stream").await;

    let mut check = server.client().await;
    assert_eq!(check.count("good").await.expect("count"), PLAYERS as u64, "every acknowledged good write is present");
    let top = check.top("good", 1000, 0).await.expect("top");
    assert_eq!(top.len(), PLAYERS as usize, "top lists every good player");
    for (k, entry) in top.iter().enumerate() {
        let i = PLAYERS - 1 - k as i64;
        assert_eq!(
            (entry.player.as_str(), entry.score, entry.rank),
            (format!("g{i}").as_str(), i * 7 - 500, k as u64 + 1),
            "top entry {k}"
        );
    }
    // The hostile frames named players g0..g4 on `good`; none changed.
    for i in 0..5 {
        assert_eq!(
            get(&mut good, "good", &format!("g{i}")).await,
            Some(i * 7 - 500),
            "g{i} untouched by hostile frames"
        );
    }
    let boards = check.boards().await.expect("boards");
    assert_eq!(boards.len(), 1, "only the good board exists: {boards:?}");
}

#[tokio::test]
async fn pipelined_good_and_bad_requests_are_answered_in_order() {
    let server = Server::start(3);
    let mut c = server.client().await;
    c.set("pipe", "seed", 100, Mode::Set).await.expect("seed");

    // (body, expected id, Ok(result) or Err(code))
    type Expect = (Vec<u8>, u64, Result<Value, &'static str>);
    let s = |v: &str| Value::from(v);
    let i = |v: i64| Value::from(v);
    let mut script: Vec<Expect> = Vec::new();
    for round in 0..20u64 {
        let base = 10_000 + round * 100;
        let player = format!("p{round}");
        let pl = || p(&player);
        script.extend([
            (req(base + 1, "ping", &[]), base + 1, Ok(s("pong"))),
            (req(base + 2, "set", &[b("pipe"), pl(), ("score", s("1"))]), base + 2, Err("bad_request")),
            (vec![0xc1], 0, Err("bad_frame")),
            (req(base + 4, "set", &[b("pipe"), pl(), ("score", i(round as i64))]), base + 4, Ok(i(round as i64))),
            (req(base + 5, "warp", &[]), base + 5, Err("unknown_op")),
            (req(base + 6, "get", &[b("pipe"), pl()]), base + 6, Ok(i(round as i64))),
            (Vec::new(), 0, Err("bad_frame")),
            (
                req(base + 8, "top", &[b("pipe"), ("limit", i(1))]),
                base + 8,
                Ok(list(vec![map(&[("player", s("seed")), ("score", i(100)), ("rank", i(1))])])),
            ),
            // A write right after a multi-step read, then a bad one.
            (
                req(base + 9, "set", &[b("pipe"), pl(), ("score", i(1)), ("mode", s("incr"))]),
                base + 9,
                Ok(i(round as i64 + 1)),
            ),
            (
                req(base + 10, "set", &[b("pipe"), pl(), ("score", i(i64::MAX)), ("mode", s("incr"))]),
                base + 10,
                Err("bad_request"),
            ),
            (encode(&map(&[("id", s("x")), ("op", s("ping"))])), 0, Err("bad_request")),
            (
                req(base + 12, "rank", &[b("pipe"), p("seed")]),
                base + 12,
                Ok(map(&[("rank", i(1)), ("score", i(100)), ("count", i(round as i64 + 2))])),
            ),
            (req(base + 13, "top", &[b("pipe"), ("limit", i(1001))]), base + 13, Err("bad_request")),
            (vec![0xdd, 0xff, 0xff, 0xff, 0xff], 0, Err("bad_frame")),
            (req(base + 15, "get", &[b("pipe"), pl()]), base + 15, Ok(i(round as i64 + 1))),
        ]);
    }
    let mut bytes = Vec::new();
    for (body, _, _) in &script {
        bytes.extend(frame(body));
    }
    c.send_raw(&bytes).await.expect("send pipeline");
    for (k, (_, id, expect)) in script.iter().enumerate() {
        let ctx = format!("pipelined request #{k} (id {id})");
        let reply = read_reply(&mut c, &ctx).await;
        match expect {
            Ok(value) => {
                let ok = assert_ok(&reply, *id, &ctx);
                assert_eq!(&normalize(&ok), &normalize(value), "{ctx}: result");
            }
            Err(code) => assert_err(&reply, *id, code, &ctx),
        }
    }
    assert_usable(&mut c, "after the mixed pipeline").await;
}

/// Compares maps regardless of key order and integers regardless of encoding.
fn normalize(v: &Value) -> String {
    match v {
        Value::Map(pairs) => {
            let mut items: Vec<String> =
                pairs.iter().map(|(k, v)| format!("{}={}", normalize(k), normalize(v))).collect();
            items.sort();
            format!("{{{}}}", items.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(normalize).collect::<Vec<_>>().join(",")),
        Value::Integer(n) => n.to_string(),
        other => other.to_string(),
    }
}
