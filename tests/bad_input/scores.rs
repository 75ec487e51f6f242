//! Score range: scores beyond i64 refused, i64's extremes stored exactly, and
//! `incr` overflows (also in `set_many` across shards) refused with no change.

use std::time::Duration;

use rankd_client::{Call, Mode, OpKind};
use rmpv::Value;

use crate::common::raw::req;
use crate::common::Server;
use crate::helpers::{assert_ok, b, case, expect_errors, get, list, p, pair, roundtrip};

#[tokio::test]
async fn u64_scores_beyond_i64_max_are_bad_request() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let big = |v: u64| Value::from(v);
    let cases = vec![
        case("score i64::MAX+1", 501, "set", &[b("r"), p("x"), ("score", big(i64::MAX as u64 + 1))], "bad_request"),
        case("score u64::MAX", 502, "set", &[b("r"), p("x"), ("score", big(u64::MAX))], "bad_request"),
        case(
            "score u64::MAX in incr",
            503,
            "set",
            &[b("r"), p("x"), ("score", big(u64::MAX)), ("mode", Value::from("incr"))],
            "bad_request",
        ),
        case(
            "entry score i64::MAX+1",
            504,
            "set_many",
            &[b("r"), ("entries", list(vec![pair("a", 1), pair("x", big(i64::MAX as u64 + 1))]))],
            "bad_request",
        ),
        case("score u64::MAX", 505, "rank_of_score", &[b("r"), ("score", big(u64::MAX))], "bad_request"),
    ];
    expect_errors(&mut c, cases).await;
    assert_eq!(get(&mut c, "r", "x").await, None, "refused scores must not be stored");
    assert_eq!(get(&mut c, "r", "a").await, None, "a set_many refused for one entry must store none");
}

#[tokio::test]
async fn i64_min_and_max_are_accepted_and_stored_exactly() {
    let server = Server::start(2);
    let mut c = server.client().await;
    assert_eq!(c.set("edge", "max", i64::MAX, Mode::Set).await.expect("set i64::MAX"), i64::MAX, "set i64::MAX reply");
    assert_eq!(c.set("edge", "min", i64::MIN, Mode::Set).await.expect("set i64::MIN"), i64::MIN, "set i64::MIN reply");
    assert_eq!(c.set("edge", "zero", 0, Mode::Set).await.expect("set 0"), 0, "set 0 reply");
    // Also encoded as a positive-int msgpack (uint64) that fits i64.
    let reply = roundtrip(
        &mut c,
        &req(9, "set", &[b("edge"), p("umax"), ("score", Value::from(i64::MAX as u64))]),
        "set i64::MAX as uint64",
    )
    .await;
    assert_eq!(assert_ok(&reply, 9, "set i64::MAX as uint64").as_i64(), Some(i64::MAX), "i64::MAX as uint64");
    assert_eq!(get(&mut c, "edge", "max").await, Some(i64::MAX), "i64::MAX must read back exactly");
    assert_eq!(get(&mut c, "edge", "min").await, Some(i64::MIN), "i64::MIN must read back exactly");
    assert_eq!(get(&mut c, "edge", "umax").await, Some(i64::MAX), "uint64-encoded i64::MAX must read back exactly");
    let top = c.top("edge", 10, 0).await.expect("top");
    let got: Vec<(String, i64)> = top.iter().map(|e| (e.player.clone(), e.score)).collect();
    assert_eq!(
        got,
        vec![("max".into(), i64::MAX), ("umax".into(), i64::MAX), ("zero".into(), 0), ("min".into(), i64::MIN)],
        "top must order the extremes correctly"
    );
    let set_many = c
        .call::<Value>(
            Call::new(OpKind::SetMany)
                .with("board", "edge2")
                .with("entries", list(vec![pair("lo", i64::MIN), pair("hi", i64::MAX)])),
        )
        .await
        .expect("set_many with extremes");
    assert_eq!(set_many, list(vec![Value::from(i64::MIN), Value::from(i64::MAX)]), "set_many stores extremes exactly");
    assert_eq!(c.rank_of_score("edge", i64::MIN).await.expect("rank_of_score MIN"), 4, "rank_of_score(i64::MIN)");
    assert_eq!(c.rank_of_score("edge", i64::MAX).await.expect("rank_of_score MAX"), 1, "rank_of_score(i64::MAX)");
}

#[tokio::test]
async fn incr_overflow_is_bad_request_and_changes_nothing() {
    let server = Server::start(2);
    let mut c = server.client().await;
    c.set("ov", "hi", i64::MAX, Mode::Set).await.expect("set i64::MAX");
    c.set("ov", "lo", i64::MIN, Mode::Set).await.expect("set i64::MIN");

    let err = c.set("ov", "hi", 1, Mode::Incr).await.expect_err("i64::MAX + 1 must be refused");
    assert_eq!(err.code(), Some("bad_request"), "positive incr overflow: {err}");
    assert_eq!(get(&mut c, "ov", "hi").await, Some(i64::MAX), "positive overflow must leave the score unchanged");

    let err = c.set("ov", "lo", -1, Mode::Incr).await.expect_err("i64::MIN - 1 must be refused");
    assert_eq!(err.code(), Some("bad_request"), "negative incr overflow: {err}");
    assert_eq!(get(&mut c, "ov", "lo").await, Some(i64::MIN), "negative overflow must leave the score unchanged");

    let err = c.set("ov", "lo", i64::MIN, Mode::Incr).await.expect_err("i64::MIN + i64::MIN must be refused");
    assert_eq!(err.code(), Some("bad_request"), "i64::MIN + i64::MIN: {err}");
    assert_eq!(get(&mut c, "ov", "lo").await, Some(i64::MIN), "i64::MIN + i64::MIN must leave the score unchanged");

    // Right up to the edge is fine.
    assert_eq!(c.set("ov", "hi", 0, Mode::Incr).await.expect("incr by 0"), i64::MAX, "incr by 0 at i64::MAX");
    assert_eq!(c.set("ov", "hi", -1, Mode::Incr).await.expect("incr by -1"), i64::MAX - 1, "incr down from i64::MAX");
    assert_eq!(
        c.set("ov", "hi", 1, Mode::Incr).await.expect("incr back to MAX"),
        i64::MAX,
        "incr up to exactly i64::MAX"
    );
    assert_eq!(c.set("ov", "lo", i64::MAX, Mode::Incr).await.expect("MIN + MAX"), -1, "i64::MIN + i64::MAX = -1");

    // The board is still consistent.
    assert_eq!(c.count("ov").await.expect("count"), 2, "overflowing writes must not add players");
    let rank = c.rank("ov", "hi").await.expect("rank").expect("hi is ranked");
    assert_eq!((rank.rank, rank.score, rank.count), (1, i64::MAX, 2), "rank of hi after refused overflow");
}

#[tokio::test]
async fn set_many_incr_with_one_overflow_changes_nothing() {
    // On one shard, and on four, where the entries are split among shards
    // and the one that overflows must keep the others from writing theirs.
    for shards in [1, 4] {
        set_many_incr_overflow_on(shards).await;
    }
}

async fn set_many_incr_overflow_on(shards: usize) {
    let server = Server::start(shards);
    let mut c = server.client().await;
    let before = [("a", 10i64), ("b", i64::MAX - 5), ("c", -7), ("d", i64::MIN + 1)];
    for (player, score) in before {
        c.set("many", player, score, Mode::Set).await.expect("seed");
    }
    let attempts: Vec<(&str, Vec<Value>)> = vec![
        ("one entry overflows upward", vec![pair("a", 1), pair("b", 6), pair("c", 1), pair("new", 3)]),
        ("last entry overflows downward", vec![pair("a", 1), pair("new", 3), pair("c", 1), pair("d", -2)]),
        ("first entry overflows", vec![pair("b", i64::MAX), pair("a", 1)]),
        ("a player repeated overflows cumulatively", vec![pair("a", 1), pair("b", 3), pair("c", 1), pair("b", 3)]),
        ("a new player overflows within the request", vec![pair("new", i64::MAX), pair("a", 2), pair("new", 1)]),
    ];
    for (ctx, entries) in attempts {
        let err = c
            .call::<Value>(
                Call::new(OpKind::SetMany).with("board", "many").with("entries", list(entries)).with("mode", "incr"),
            )
            .await
            .expect_err(ctx);
        let ctx = format!("{shards} shards, {ctx}");
        assert_eq!(err.code(), Some("bad_request"), "{ctx}: {err}");
        for (player, score) in before {
            assert_eq!(get(&mut c, "many", player).await, Some(score), "{ctx}: {player} must be unchanged");
        }
        assert_eq!(get(&mut c, "many", "new").await, None, "{ctx}: a new player must not be added");
        assert_eq!(c.count("many").await.expect("count"), 4, "{ctx}: player count must be unchanged");
    }
    // The same request without the overflow applies in full.
    let ok = c
        .call::<Value>(
            Call::new(OpKind::SetMany)
                .with("board", "many")
                .with("entries", list(vec![pair("a", 1), pair("b", 5), pair("c", 1), pair("new", 3)]))
                .with("mode", "incr"),
        )
        .await
        .expect("non-overflowing set_many incr");
    assert_eq!(
        ok,
        list(vec![Value::from(11), Value::from(i64::MAX), Value::from(-6), Value::from(3)]),
        "non-overflowing set_many incr result"
    );
}

#[tokio::test]
async fn a_set_many_incr_spanning_shards_sees_the_writes_pipelined_before_it() {
    // 4 shards, 20 players: every shard holds some. p0 is put one below the
    // top by a `set` in the same pipeline, so the first `set_many` fits
    // exactly and the second overflows on p0's shard only: it must change
    // nothing anywhere, and the `get`s after it see each +1 once.
    let server = Server::start(4);
    let mut c = server.client().await;
    let players: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let bump = || {
        let entries = players.iter().map(|p| pair(p, 1)).collect();
        Call::new(OpKind::SetMany).with("board", "span").with("entries", list(entries)).with("mode", "incr")
    };
    let mut calls = vec![
        Call::new(OpKind::SetMany)
            .with("board", "span")
            .with("entries", list(players.iter().map(|p| pair(p, 100)).collect())),
        Call::new(OpKind::Set).with("board", "span").with("player", "p0").with("score", i64::MAX - 1),
        bump(),
        bump(),
    ];
    calls.extend(players.iter().map(|p| Call::new(OpKind::Get).with("board", "span").with("player", p.as_str())));
    let replies = c.pipeline::<Value>(&calls).await.expect("pipeline");
    assert!(replies[2].is_ok(), "the first bump fits: {:?}", replies[2]);
    let err = replies[3].as_ref().expect_err("the second bump overflows p0");
    assert_eq!(err.code(), Some("bad_request"), "{err}");
    let got: Vec<Value> = replies[4..].iter().map(|r| r.as_ref().expect("get").clone()).collect();
    let want: Vec<Value> = std::iter::once(Value::from(i64::MAX)).chain((1..20).map(|_| Value::from(101))).collect();
    assert_eq!(got, want, "each player bumped exactly once");
}

#[tokio::test]
async fn many_set_many_incrs_spanning_shards_in_one_pipeline_are_all_answered() {
    // Each one makes the router wait for every shard's check; 200 of them
    // in one read are far past tokio's per-poll budget of the router's task.
    let server = Server::start(4);
    let mut c = server.client().await;
    let players: Vec<String> = (0..8).map(|i| format!("q{i}")).collect();
    let bump = Call::new(OpKind::SetMany)
        .with("board", "many-span")
        .with("entries", list(players.iter().map(|p| pair(p, 1)).collect()))
        .with("mode", "incr");
    let calls = vec![bump; 200];
    let replies = tokio::time::timeout(Duration::from_secs(60), c.pipeline::<Value>(&calls))
        .await
        .expect("every set_many is answered (the router must not stall)")
        .expect("pipeline");
    assert!(replies.iter().all(Result::is_ok), "{:?}", replies.iter().find(|r| r.is_err()));
    for player in &players {
        assert_eq!(get(&mut c, "many-span", player).await, Some(200), "{player} bumped once per request");
    }
}
