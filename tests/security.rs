//! Auth against the real server: nothing but `ping` and `auth` before a
//! successful `auth`, per connection, for every op of the protocol; the
//! token never shows in anything the server prints (stdout, stderr at the
//! most verbose log level) or in its metrics; a non-loopback listener
//! without a token is refused.

mod common;

use std::process::Command;

use common::ops::{self, same_value};
use rankd_client::{Call, Client, OpKind};
use rmpv::Value;

const TOKEN: &str = "correct-horse-battery-staple";
/// A wrong token a client sends: someone's secret too, so never printed either.
const WRONG_TOKEN: &str = "incorrect-donkey-battery-staple";

#[tokio::test]
async fn every_op_but_ping_and_auth_waits_for_a_successful_auth() {
    let mut server = common::Server::start_capturing(2, &[], &[("RANKD_AUTH_TOKEN", TOKEN), ("RANKD_LOG", "trace")]);
    let ops = ops::every_other_op();
    ops::assert_every_op_is_tried(ops.iter().map(|(name, _, _)| *name).chain(["ping", "auth", "backup"]));

    let mut client = server.client().await;
    assert_eq!(client.ping().await.unwrap(), "pong", "ping needs no token");
    let err = client.call::<Value>(Call::new(OpKind::Backup)).await.expect_err("backup before auth");
    assert_eq!(err.code(), Some("unauthorized"), "backup before auth: {err}");
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

    // A backup streams once authenticated (on a connection of its own: it
    // ends the connection).
    let mut backup = server.client().await;
    backup.auth(TOKEN).await.expect("auth");
    let (header, _) = ops::backup_to_the_end(&mut backup).await;
    assert_eq!(header.shards, 2);

    // The token is in neither the metrics nor anything the server printed.
    let metrics = server.metrics_text();
    assert!(metrics.contains("rankd_requests_total"), "the metrics page was read");
    assert!(!metrics.contains(TOKEN) && !metrics.contains(WRONG_TOKEN), "a token is in the metrics");
    drop((client, other));
    assert!(server.terminate().success(), "SIGTERM exits 0");
    server.assert_never_printed(&[TOKEN, WRONG_TOKEN]);
}

/// Before `auth`, a request the server cannot read is refused like any
/// other, not explained, so a client without a token learns nothing of the
/// ops and their fields; only a malformed `auth` is explained. After `auth`
/// the same frames get their own codes.
#[tokio::test]
async fn before_auth_an_unreadable_request_is_unauthorized_too() {
    let server = common::Server::start_with_env(1, &[], &[("RANKD_AUTH_TOKEN", TOKEN)]);
    let mut client = server.client().await;
    let too_many: Vec<Value> = (0..10_001).map(|i| Value::Array(vec![format!("p{i}").into(), 1.into()])).collect();
    let unreadable = [
        ("a set without player or score", common::raw::req(1, "set", &[("board", "b".into())])),
        ("an unknown op", common::raw::req(2, "nope", &[])),
        (
            "a set_many past the limit",
            common::raw::req(3, "set_many", &[("board", "b".into()), ("entries", Value::Array(too_many))]),
        ),
        ("a count with a board of the wrong type", common::raw::req(4, "count", &[("board", 7.into())])),
    ];
    let codes = async |client: &mut Client, frames: &[(&str, Vec<u8>)]| {
        let mut codes = Vec::new();
        for (_, body) in frames {
            client.send_raw(&common::raw::frame(body)).await.expect("send");
            let reply: Value = client.read_raw().await.expect("a reply").expect("the connection stays open");
            let code = common::field(&reply, "err").and_then(|err| common::field(err, "code")).and_then(Value::as_str);
            codes.push(code.unwrap_or("none").to_string());
        }
        codes
    };
    assert_eq!(codes(&mut client, &unreadable).await, ["unauthorized"; 4], "before auth");
    let bad_auth = [("an auth without a token", common::raw::req(5, "auth", &[]))];
    assert_eq!(codes(&mut client, &bad_auth).await, ["bad_request"], "a malformed auth");
    client.auth(TOKEN).await.expect("auth");
    let explained = ["bad_request", "unknown_op", "too_large", "bad_request"];
    assert_eq!(codes(&mut client, &unreadable).await, explained, "after auth");
}

/// Pings do not keep a connection without a token open: it is closed once
/// idle, pings or not, while an authenticated one pinging is kept.
#[tokio::test]
async fn pings_before_auth_do_not_hold_a_connection_open() {
    let server = common::Server::start_with_env(1, &["--idle-timeout-secs", "1"], &[("RANKD_AUTH_TOKEN", TOKEN)]);
    let (mut stranger, mut member) = (server.client().await, server.client().await);
    member.auth(TOKEN).await.expect("auth");
    let mut stranger_closed = false;
    // Both ping every 200 ms for 3 s, three idle timeouts.
    for _ in 0..15 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        stranger_closed |= stranger.ping().await.is_err();
        assert_eq!(member.ping().await.expect("an authenticated connection that pings stays open"), "pong");
    }
    assert!(stranger_closed, "a connection that never authenticated was kept open by its pings");
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
    server.assert_never_printed(&[TOKEN, WRONG_TOKEN]);
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
