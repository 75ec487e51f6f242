//! Auth against the real server: nothing but `ping` and `auth` before a
//! successful `auth`, per connection, for every op of the protocol; the
//! token never shows in anything the server prints (stdout, stderr at the
//! most verbose log level) or in its metrics; a non-loopback listener
//! without a token is refused.

mod common;

use std::process::Command;

use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

const TOKEN: &str = "correct-horse-battery-staple";
/// A wrong token a client sends: someone's secret too, so never printed either.
const WRONG_TOKEN: &str = "incorrect-donkey-battery-staple";

/// One request of every op but `ping` and `auth` (every `OpKind`:
/// protocol.md's version-1 ops; the server has none of version 1.1's
/// `ranks`, `watch` and `unwatch` yet), each with valid fields,
/// and the exact result protocol.md gives for it once authenticated, sent
/// in this order on a fresh server: a board `b` (`asc`, `ordinal`, windows
/// `all` and `daily`, keep 2) filled with p=7, q=3, r=9 (rank order q, p, r).
fn every_other_op() -> Vec<(&'static str, Call, Value)> {
    let entry = |player: &str, score: i64, rank: u64| {
        Value::Map(vec![("player".into(), player.into()), ("score".into(), score.into()), ("rank".into(), rank.into())])
    };
    let windows = Value::Array(vec!["all".into(), "daily".into()]);
    vec![
        (
            "create_board",
            Call::new(OpKind::CreateBoard)
                .with("board", "b")
                .with("order", "asc")
                .with("ties", "ordinal")
                .with("windows", windows.clone())
                .with("keep", 2),
            Value::from(true),
        ),
        ("set", set_call("b", "p", 7, Mode::Set), Value::from(7)),
        (
            "set_many",
            Call::new(OpKind::SetMany).with("board", "b").with(
                "entries",
                Value::Array(vec![Value::Array(vec!["q".into(), 3.into()]), Value::Array(vec!["r".into(), 9.into()])]),
            ),
            Value::Array(vec![3.into(), 9.into()]),
        ),
        ("get", Call::new(OpKind::Get).with("board", "b").with("player", "p"), Value::from(7)),
        ("count", Call::new(OpKind::Count).with("board", "b"), Value::from(3)),
        (
            "rank",
            Call::new(OpKind::Rank).with("board", "b").with("player", "p"),
            Value::Map(vec![("rank".into(), 2.into()), ("score".into(), 7.into()), ("count".into(), 3.into())]),
        ),
        // asc: 3 and 7 are better than 8.
        ("rank_of_score", Call::new(OpKind::RankOfScore).with("board", "b").with("score", 8), Value::from(3)),
        (
            "top",
            Call::new(OpKind::Top).with("board", "b"),
            Value::Array(vec![entry("q", 3, 1), entry("p", 7, 2), entry("r", 9, 3)]),
        ),
        (
            "around",
            Call::new(OpKind::Around).with("board", "b").with("player", "p").with("before", 1).with("after", 0),
            Value::Array(vec![entry("q", 3, 1), entry("p", 7, 2)]),
        ),
        ("remove", Call::new(OpKind::Remove).with("board", "b").with("player", "r"), Value::from(true)),
        (
            "boards",
            Call::new(OpKind::Boards),
            Value::Array(vec![Value::Map(vec![
                ("board".into(), "b".into()),
                ("order".into(), "asc".into()),
                ("ties".into(), "ordinal".into()),
                ("windows".into(), windows),
                ("keep".into(), 2.into()),
                ("count".into(), 2.into()),
            ])]),
        ),
        ("drop_board", Call::new(OpKind::DropBoard).with("board", "b"), Value::from(true)),
    ]
}

/// `boards` maps compared whatever the order of their keys.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.iter().any(|(k2, v2)| k == k2 && same_value(v, v2)))
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b)),
        _ => a == b,
    }
}

#[tokio::test]
async fn every_op_but_ping_and_auth_waits_for_a_successful_auth() {
    let mut server = common::Server::start_capturing(2, &[], &[("RANKD_AUTH_TOKEN", TOKEN), ("RANKD_LOG", "trace")]);
    let ops = every_other_op();
    let mut covered: Vec<&str> = ops.iter().map(|(name, _, _)| *name).chain(["ping", "auth"]).collect();
    covered.sort_unstable();
    let mut all: Vec<&str> = OpKind::ALL.iter().map(|op| op.name()).collect();
    all.sort_unstable();
    assert_eq!(covered, all, "every op of the protocol is tried");

    let mut client = server.client().await;
    assert_eq!(client.ping().await.unwrap(), "pong", "ping needs no token");
    let calls: Vec<Call> = ops.iter().map(|(_, call, _)| call.clone()).collect();
    for ((name, _, _), reply) in ops.iter().zip(client.pipeline::<Value>(&calls).await.unwrap()) {
        let err = reply.expect_err("refused before auth");
        assert_eq!(err.code(), Some("unauthorized"), "{name} before auth: {err}");
    }
    let err = client.call::<Value>(Call::new(OpKind::Auth).with("token", WRONG_TOKEN)).await.expect_err("wrong token");
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"), "still locked");

    // Another connection's auth does not unlock this one.
    let mut other = server.client().await;
    assert_eq!(other.call::<Value>(Call::new(OpKind::Auth).with("token", TOKEN)).await.unwrap(), Value::from(true));
    assert_eq!(client.get("b", "p").await.unwrap_err().code(), Some("unauthorized"), "auth is per connection");

    // Auth and every op pipelined together: order decides, and each op
    // answers as on an open server (so none of the refused ones applied:
    // the board is new, p's first `get` finds 7 only from this `set`).
    let mut calls = vec![Call::new(OpKind::Auth).with("token", TOKEN)];
    calls.extend(ops.iter().map(|(_, call, _)| call.clone()));
    let replies = client.pipeline::<Value>(&calls).await.unwrap();
    assert_eq!(replies[0].as_ref().unwrap(), &Value::from(true), "auth");
    for ((name, _, want), reply) in ops.iter().zip(&replies[1..]) {
        let got = reply.as_ref().unwrap_or_else(|e| panic!("{name} after auth: {e}"));
        assert!(same_value(got, want), "{name} after auth: got {got}, want {want}");
    }

    // The token is in neither the metrics nor anything the server printed.
    let metrics = server.metrics_text();
    assert!(metrics.contains("rankd_requests_total"), "the metrics page was read");
    assert!(!metrics.contains(TOKEN) && !metrics.contains(WRONG_TOKEN), "a token is in the metrics");
    drop((client, other));
    assert!(server.terminate().success(), "SIGTERM exits 0");
    assert_never_printed(&server);
}

/// The captured stdout and stderr are the whole of the server's output
/// (from its first line to its last), and hold neither token.
fn assert_never_printed(server: &common::Server) {
    let (stdout, stderr) = (server.stdout_text(), server.stderr_text());
    assert!(stdout.starts_with("rankd listening on "), "stdout was captured: {stdout:?}");
    for line in ["listening", "shut down cleanly"] {
        assert!(stderr.contains(line), "the server's logs were captured (no {line:?} in them):\n{stderr}");
    }
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for token in [TOKEN, WRONG_TOKEN] {
            assert!(!text.contains(token), "the token {token:?} leaked into the server's {name}:\n{text}");
        }
    }
}

#[tokio::test]
async fn the_token_can_come_from_the_environment_and_is_never_logged() {
    let mut server = common::Server::start_capturing(1, &[], &[("RANKD_AUTH_TOKEN", TOKEN), ("RANKD_LOG", "trace")]);
    let mut client = Client::connect(server.addr.as_str()).await.unwrap();
    assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"));
    let err = client.call::<Value>(Call::new(OpKind::Auth).with("token", WRONG_TOKEN)).await.expect_err("wrong token");
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(client.call::<Value>(Call::new(OpKind::Auth).with("token", TOKEN)).await.unwrap(), Value::from(true));
    assert_eq!(client.count("b").await.unwrap(), 0);
    drop(client);
    assert!(server.terminate().success(), "SIGTERM exits 0");
    assert_never_printed(&server);
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["serve", "--listen", "0.0.0.0:0", "--shards", "1"])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("RANKD_AUTH_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without a token"));
}
