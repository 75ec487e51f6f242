//! What every case of this binary uses: msgpack building blocks, one raw
//! request/reply round trip, and the assertions on error and success replies.

use std::time::Duration;

use crate::common::field;
use crate::common::raw::{frame, req};
use rankd_client::Client;
use rmpv::Value;

/// Bound on every single read, so a hang fails the test instead of stalling it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The protocol's default `max_frame`.
pub const MAX_FRAME: usize = 1 << 20;

/// msgpack encoding of one value.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encoding into a Vec cannot fail");
    out
}

/// A msgpack map with string keys.
pub fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(pairs.iter().map(|(k, v)| (Value::from(*k), v.clone())).collect())
}

/// `n` copies of `c`.
pub fn rep(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

pub fn list(items: Vec<Value>) -> Value {
    Value::Array(items)
}

pub fn pair(player: &str, score: impl Into<Value>) -> Value {
    list(vec![Value::from(player), score.into()])
}

/// Reads one reply; panics (with `ctx`) on timeout, close or undecodable reply.
pub async fn read_reply(client: &mut Client, ctx: &str) -> Value {
    match tokio::time::timeout(READ_TIMEOUT, client.read_raw::<Value>()).await {
        Err(_) => panic!("{ctx}: no reply within {READ_TIMEOUT:?}"),
        Ok(Err(e)) => panic!("{ctx}: reading the reply failed: {e}"),
        Ok(Ok(None)) => panic!("{ctx}: server closed the connection instead of replying"),
        Ok(Ok(Some(v))) => v,
    }
}

/// Sends one frame holding `body` and returns the one reply.
pub async fn roundtrip(client: &mut Client, body: &[u8], ctx: &str) -> Value {
    client.send_raw(&frame(body)).await.unwrap_or_else(|e| panic!("{ctx}: send failed: {e}"));
    read_reply(client, ctx).await
}

/// Asserts `reply` is `{"id": id, "err": {"code": code, "msg": <string>}}`.
pub fn assert_err(reply: &Value, id: u64, code: &str, ctx: &str) {
    let got_id = field(reply, "id").and_then(Value::as_u64);
    assert_eq!(got_id, Some(id), "{ctx}: reply id (reply: {reply})");
    assert!(field(reply, "ok").is_none(), "{ctx}: expected an error, got a success reply: {reply}");
    let err = field(reply, "err").unwrap_or_else(|| panic!("{ctx}: reply has no `err`: {reply}"));
    assert_eq!(field(err, "code").and_then(Value::as_str), Some(code), "{ctx}: error code (reply: {reply})");
    assert!(field(err, "msg").is_some_and(Value::is_str), "{ctx}: error must carry a string `msg`: {reply}");
}

/// Asserts `reply` is a success for `id` and returns its result.
pub fn assert_ok(reply: &Value, id: u64, ctx: &str) -> Value {
    assert_eq!(field(reply, "id").and_then(Value::as_u64), Some(id), "{ctx}: reply id (reply: {reply})");
    assert!(field(reply, "err").is_none(), "{ctx}: expected success, got an error: {reply}");
    field(reply, "ok").unwrap_or_else(|| panic!("{ctx}: reply has no `ok`: {reply}")).clone()
}

/// The connection still answers a well-formed request.
pub async fn assert_usable(client: &mut Client, ctx: &str) {
    let reply = roundtrip(client, &req(424_242, "ping", &[]), ctx).await;
    let ok = assert_ok(&reply, 424_242, &format!("{ctx}: ping after the bad input"));
    assert_eq!(ok.as_str(), Some("pong"), "{ctx}: ping after the bad input must answer pong");
}

/// After an oversized frame the server must close: the next read sees EOF
/// (or a reset), never another reply.
pub async fn assert_closed(client: &mut Client, ctx: &str) {
    match tokio::time::timeout(READ_TIMEOUT, client.read_raw::<Value>()).await {
        Err(_) => panic!("{ctx}: server did not close the connection within {READ_TIMEOUT:?}"),
        Ok(Ok(Some(v))) => panic!("{ctx}: expected the connection to close, got another reply: {v}"),
        Ok(Ok(None)) | Ok(Err(_)) => {}
    }
}

/// Table-driven: each `(ctx, body, id, code)` is sent on one connection in
/// turn, each must get exactly that error, and the connection must stay usable.
pub async fn expect_errors(client: &mut Client, cases: Vec<(String, Vec<u8>, u64, &str)>) {
    for (ctx, body, id, code) in cases {
        let reply = roundtrip(client, &body, &ctx).await;
        assert_err(&reply, id, code, &ctx);
        assert_usable(client, &ctx).await;
    }
}

/// `{name}` failure for request `id` with the fields given.
pub fn case(
    ctx: &str,
    id: u64,
    op: &str,
    fields: &[(&str, Value)],
    code: &'static str,
) -> (String, Vec<u8>, u64, &'static str) {
    (format!("{ctx} ({op})"), req(id, op, fields), id, code)
}

pub fn b(name: &str) -> (&'static str, Value) {
    ("board", Value::from(name))
}

pub fn p(name: &str) -> (&'static str, Value) {
    ("player", Value::from(name))
}

/// Current score of `player` on `board`, through the regular client.
pub async fn get(client: &mut Client, board: &str, player: &str) -> Option<i64> {
    client.get(board, player).await.unwrap_or_else(|e| panic!("get {board}/{player} failed: {e}"))
}
