//! Hostile input against the real server: malformed frames, wrong field
//! types, out-of-range values, oversized frames and lists. Every case checks
//! the exact protocol error code and id, and that the harm stays contained
//! (the connection stays usable when the protocol says so, other clients are
//! unaffected, acknowledged writes survive).

mod common;

use std::time::Duration;

use common::raw::{frame, req};
use common::{field, Server};
use rand::{Rng, SeedableRng};
use rankd_client::{Call, Client, Mode, OpKind};
use rmpv::Value;

/// Bound on every single read, so a hang fails the test instead of stalling it.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The protocol's default `max_frame`.
const MAX_FRAME: usize = 1 << 20;

// ---------------------------------------------------------------- helpers --

/// msgpack encoding of one value.
fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encoding into a Vec cannot fail");
    out
}

/// A msgpack map with string keys.
fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(pairs.iter().map(|(k, v)| (Value::from(*k), v.clone())).collect())
}

/// `n` copies of `c`.
fn rep(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

fn list(items: Vec<Value>) -> Value {
    Value::Array(items)
}

fn pair(player: &str, score: impl Into<Value>) -> Value {
    list(vec![Value::from(player), score.into()])
}

/// Reads one reply; panics (with `ctx`) on timeout, close or undecodable reply.
async fn read_reply(client: &mut Client, ctx: &str) -> Value {
    match tokio::time::timeout(READ_TIMEOUT, client.read_raw::<Value>()).await {
        Err(_) => panic!("{ctx}: no reply within {READ_TIMEOUT:?}"),
        Ok(Err(e)) => panic!("{ctx}: reading the reply failed: {e}"),
        Ok(Ok(None)) => panic!("{ctx}: server closed the connection instead of replying"),
        Ok(Ok(Some(v))) => v,
    }
}

/// Sends one frame holding `body` and returns the one reply.
async fn roundtrip(client: &mut Client, body: &[u8], ctx: &str) -> Value {
    client.send_raw(&frame(body)).await.unwrap_or_else(|e| panic!("{ctx}: send failed: {e}"));
    read_reply(client, ctx).await
}

/// Asserts `reply` is `{"id": id, "err": {"code": code, "msg": <string>}}`.
fn assert_err(reply: &Value, id: u64, code: &str, ctx: &str) {
    let got_id = field(reply, "id").and_then(Value::as_u64);
    assert_eq!(got_id, Some(id), "{ctx}: reply id (reply: {reply})");
    assert!(field(reply, "ok").is_none(), "{ctx}: expected an error, got a success reply: {reply}");
    let err = field(reply, "err").unwrap_or_else(|| panic!("{ctx}: reply has no `err`: {reply}"));
    assert_eq!(field(err, "code").and_then(Value::as_str), Some(code), "{ctx}: error code (reply: {reply})");
    assert!(field(err, "msg").is_some_and(Value::is_str), "{ctx}: error must carry a string `msg`: {reply}");
}

/// Asserts `reply` is a success for `id` and returns its result.
fn assert_ok(reply: &Value, id: u64, ctx: &str) -> Value {
    assert_eq!(field(reply, "id").and_then(Value::as_u64), Some(id), "{ctx}: reply id (reply: {reply})");
    assert!(field(reply, "err").is_none(), "{ctx}: expected success, got an error: {reply}");
    field(reply, "ok").unwrap_or_else(|| panic!("{ctx}: reply has no `ok`: {reply}")).clone()
}

/// The connection still answers a well-formed request.
async fn assert_usable(client: &mut Client, ctx: &str) {
    let reply = roundtrip(client, &req(424_242, "ping", &[]), ctx).await;
    let ok = assert_ok(&reply, 424_242, &format!("{ctx}: ping after the bad input"));
    assert_eq!(ok.as_str(), Some("pong"), "{ctx}: ping after the bad input must answer pong");
}

/// After an oversized frame the server must close: the next read sees EOF
/// (or a reset), never another reply.
async fn assert_closed(client: &mut Client, ctx: &str) {
    match tokio::time::timeout(READ_TIMEOUT, client.read_raw::<Value>()).await {
        Err(_) => panic!("{ctx}: server did not close the connection within {READ_TIMEOUT:?}"),
        Ok(Ok(Some(v))) => panic!("{ctx}: expected the connection to close, got another reply: {v}"),
        Ok(Ok(None)) | Ok(Err(_)) => {}
    }
}

/// Table-driven: each `(ctx, body, id, code)` is sent on one connection in
/// turn, each must get exactly that error, and the connection must stay usable.
async fn expect_errors(client: &mut Client, cases: Vec<(String, Vec<u8>, u64, &str)>) {
    for (ctx, body, id, code) in cases {
        let reply = roundtrip(client, &body, &ctx).await;
        assert_err(&reply, id, code, &ctx);
        assert_usable(client, &ctx).await;
    }
}

/// `{name}` failure for request `id` with the fields given.
fn case(
    ctx: &str,
    id: u64,
    op: &str,
    fields: &[(&str, Value)],
    code: &'static str,
) -> (String, Vec<u8>, u64, &'static str) {
    (format!("{ctx} ({op})"), req(id, op, fields), id, code)
}

fn b(name: &str) -> (&'static str, Value) {
    ("board", Value::from(name))
}

fn p(name: &str) -> (&'static str, Value) {
    ("player", Value::from(name))
}

/// Current score of `player` on `board`, through the regular client.
async fn get(client: &mut Client, board: &str, player: &str) -> Option<i64> {
    client.get(board, player).await.unwrap_or_else(|e| panic!("get {board}/{player} failed: {e}"))
}

// ------------------------------------------------------- framing failures --

#[tokio::test]
async fn garbage_bytes_in_a_valid_frame_are_bad_frame_with_id_0() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("reserved byte 0xc1", vec![0xc1]),
        ("0xc1 then junk", vec![0xc1, 0x00, 0xff, 0x13, 0x37]),
        ("truncated map: header announces 2 pairs, half a key follows", vec![0x82, 0xa2, b'i', b'd']),
        ("truncated str8", vec![0xd9, 0x20, b'a']),
        ("map whose value is cut off", {
            let mut v = encode(&map(&[("id", Value::from(1)), ("op", Value::from("ping"))]));
            v.truncate(v.len() - 2);
            v
        }),
        ("ASCII text", b"{\"id\":1,\"op\":\"ping\"}".to_vec()),
    ];
    for (ctx, body) in garbage {
        let reply = roundtrip(&mut c, &body, ctx).await;
        assert_err(&reply, 0, "bad_frame", ctx);
        assert_usable(&mut c, ctx).await;
    }
}

#[tokio::test]
async fn random_garbage_frames_never_break_the_connection() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_bad1);
    // All frames in one write, then all replies: also exercises pipelining.
    let mut bytes = Vec::new();
    let n = 300;
    for _ in 0..n {
        let len = rng.gen_range(1..=64);
        let body: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        bytes.extend(frame(&body));
    }
    c.send_raw(&bytes).await.expect("send random frames");
    for i in 0..n {
        let ctx = format!("random frame {i}");
        let reply = read_reply(&mut c, &ctx).await;
        let code = field(&reply, "err").and_then(|e| field(e, "code")).and_then(Value::as_str);
        assert!(
            matches!(code, Some("bad_frame" | "bad_request" | "unknown_op")),
            "{ctx}: random bytes must be refused with bad_frame/bad_request/unknown_op, got {reply}"
        );
    }
    assert_usable(&mut c, "after random garbage").await;
}

#[tokio::test]
async fn non_map_frames_are_bad_frame_and_the_connection_stays_usable() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let values: Vec<(&str, Value)> = vec![
        ("array", list(vec![Value::from(1), Value::from("ping")])),
        (
            "array shaped like a request",
            list(vec![Value::from("id"), Value::from(1), Value::from("op"), Value::from("ping")]),
        ),
        ("positive integer", Value::from(42)),
        ("negative integer", Value::from(-7)),
        ("string", Value::from("ping")),
        ("nil", Value::Nil),
        ("bool", Value::from(true)),
        ("float", Value::from(1.5f64)),
        ("binary", Value::Binary(b"id op".to_vec())),
        ("ext", Value::Ext(5, vec![1, 2, 3])),
    ];
    for (ctx, value) in values {
        let reply = roundtrip(&mut c, &encode(&value), ctx).await;
        assert_err(&reply, 0, "bad_frame", ctx);
        assert_usable(&mut c, ctx).await;
    }
}

#[tokio::test]
async fn two_msgpack_values_in_one_frame_are_bad_frame() {
    let server = Server::start(1);
    let mut c = server.client().await;
    // Two complete requests in one frame.
    let mut body = req(7, "ping", &[]);
    body.extend(req(8, "ping", &[]));
    let reply = roundtrip(&mut c, &body, "two maps in one frame").await;
    // The protocol allows echoing an id read from the frame; the server sends 0.
    let id = field(&reply, "id").and_then(Value::as_u64).unwrap_or(u64::MAX);
    assert!(id == 0 || id == 7, "two maps in one frame: reply id must be 0 (or 7), got {reply}");
    assert_err(&reply, id, "bad_frame", "two maps in one frame");
    assert_usable(&mut c, "two maps in one frame").await;

    // A request followed by one trailing byte.
    let mut body = req(9, "ping", &[]);
    body.push(0xc0);
    let reply = roundtrip(&mut c, &body, "request + trailing nil").await;
    let id = field(&reply, "id").and_then(Value::as_u64).unwrap_or(u64::MAX);
    assert!(id == 0 || id == 9, "request + trailing nil: reply id must be 0 (or 9), got {reply}");
    assert_err(&reply, id, "bad_frame", "request + trailing nil");
    assert_usable(&mut c, "request + trailing nil").await;

    // A write followed by a second value must not apply.
    let mut body = req(10, "set", &[b("two"), p("x"), ("score", Value::from(5))]);
    body.extend(encode(&Value::from(1)));
    let reply = roundtrip(&mut c, &body, "set + trailing int").await;
    let id = field(&reply, "id").and_then(Value::as_u64).unwrap_or(u64::MAX);
    assert_err(&reply, id, "bad_frame", "set + trailing int");
    assert_eq!(get(&mut c, "two", "x").await, None, "a set inside a bad frame must not be applied");
}

#[tokio::test]
async fn zero_length_frame_is_bad_frame_and_the_connection_stays_usable() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let reply = roundtrip(&mut c, &[], "zero-length frame").await;
    assert_err(&reply, 0, "bad_frame", "zero-length frame");
    assert_usable(&mut c, "zero-length frame").await;

    // Several empty frames back to back, then a request, in one write.
    let mut bytes = vec![0u8; 12];
    bytes.extend(frame(&req(5, "ping", &[])));
    c.send_raw(&bytes).await.expect("send");
    for i in 0..3 {
        let reply = read_reply(&mut c, &format!("empty frame {i} of 3")).await;
        assert_err(&reply, 0, "bad_frame", &format!("empty frame {i} of 3"));
    }
    let reply = read_reply(&mut c, "ping after 3 empty frames").await;
    assert_eq!(
        assert_ok(&reply, 5, "ping after 3 empty frames").as_str(),
        Some("pong"),
        "ping after 3 empty frames must answer pong"
    );
}

#[tokio::test]
async fn maps_with_non_string_keys_are_bad_frame() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let kv = |k: Value, v: Value| (k, v);
    let maps: Vec<(&str, Value)> = vec![
        (
            "all integer keys",
            Value::Map(vec![kv(Value::from(1), Value::from(1)), kv(Value::from(2), Value::from("ping"))]),
        ),
        (
            "valid request plus one integer key",
            Value::Map(vec![
                kv(Value::from("id"), Value::from(3)),
                kv(Value::from("op"), Value::from("ping")),
                kv(Value::from(5), Value::from("x")),
            ]),
        ),
        ("nil key", Value::Map(vec![kv(Value::Nil, Value::from(1)), kv(Value::from("op"), Value::from("ping"))])),
        (
            "binary keys spelling id/op",
            Value::Map(vec![
                kv(Value::Binary(b"id".to_vec()), Value::from(4)),
                kv(Value::Binary(b"op".to_vec()), Value::from("ping")),
            ]),
        ),
        (
            "array key",
            Value::Map(vec![
                kv(list(vec![Value::from("id")]), Value::from(4)),
                kv(Value::from("op"), Value::from("ping")),
            ]),
        ),
    ];
    for (ctx, value) in maps {
        let reply = roundtrip(&mut c, &encode(&value), ctx).await;
        assert_err(&reply, 0, "bad_frame", ctx);
        assert_usable(&mut c, ctx).await;
    }
    // A key that is a msgpack str but not UTF-8.
    let mut body = vec![0x82, 0xa2, 0xff, 0xfe, 0x01];
    body.extend(encode(&Value::from("op")));
    body.extend(encode(&Value::from("ping")));
    let reply = roundtrip(&mut c, &body, "non-UTF-8 key").await;
    assert_err(&reply, 0, "bad_frame", "non-UTF-8 key");
    assert_usable(&mut c, "non-UTF-8 key").await;
}

// ------------------------------------------------------------- id and op --

#[tokio::test]
async fn missing_or_mistyped_id_is_bad_request_with_id_0() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let bodies: Vec<(&str, Value)> = vec![
        ("missing id", map(&[("op", Value::from("ping"))])),
        ("empty map", map(&[])),
        ("id nil", map(&[("id", Value::Nil), ("op", Value::from("ping"))])),
        ("id string", map(&[("id", Value::from("5")), ("op", Value::from("ping"))])),
        ("id negative", map(&[("id", Value::from(-1)), ("op", Value::from("ping"))])),
        ("id float", map(&[("id", Value::from(1.0f64)), ("op", Value::from("ping"))])),
        ("id bool", map(&[("id", Value::from(true)), ("op", Value::from("ping"))])),
        ("id array", map(&[("id", list(vec![Value::from(1)])), ("op", Value::from("ping"))])),
    ];
    for (ctx, value) in bodies {
        let reply = roundtrip(&mut c, &encode(&value), ctx).await;
        assert_err(&reply, 0, "bad_request", ctx);
        assert_usable(&mut c, ctx).await;
    }
    // The edges of the id range are valid and echoed exactly.
    for id in [0, u64::MAX] {
        let reply = roundtrip(&mut c, &req(id, "ping", &[]), "edge id").await;
        let ok = assert_ok(&reply, id, &format!("ping with id {id}"));
        assert_eq!(ok.as_str(), Some("pong"), "ping with id {id} must answer pong");
    }
}

#[tokio::test]
async fn missing_unknown_or_mistyped_op() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let with_op = |id: u64, op: Value| encode(&map(&[("id", Value::from(id)), ("op", op)]));
    let cases: Vec<(String, Vec<u8>, u64, &str)> = vec![
        ("missing op".into(), encode(&map(&[("id", Value::from(11))])), 11, "bad_request"),
        ("op nil".into(), with_op(12, Value::Nil), 12, "bad_request"),
        ("op integer".into(), with_op(13, Value::from(3)), 13, "bad_request"),
        ("op binary".into(), with_op(14, Value::Binary(b"ping".to_vec())), 14, "bad_request"),
        ("op array".into(), with_op(15, list(vec![Value::from("ping")])), 15, "bad_request"),
        ("unknown op".into(), with_op(16, Value::from("fly")), 16, "unknown_op"),
        ("op in wrong case".into(), with_op(17, Value::from("PING")), 17, "unknown_op"),
        ("empty op".into(), with_op(18, Value::from("")), 18, "unknown_op"),
        ("op with trailing space".into(), with_op(19, Value::from("ping ")), 19, "unknown_op"),
        ("very long unknown op".into(), with_op(20, Value::from(rep('z', 100_000))), 20, "unknown_op"),
        ("unknown op with big id".into(), with_op(u64::MAX, Value::from("nope")), u64::MAX, "unknown_op"),
    ];
    expect_errors(&mut c, cases).await;
}

// --------------------------------------------------------- field types --

#[tokio::test]
async fn wrong_field_types_are_bad_request_echoing_the_id() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let s = |v: &str| Value::from(v);
    let i = |v: i64| Value::from(v);
    let cases = vec![
        // score
        case("score string", 101, "set", &[b("t"), p("x"), ("score", s("10"))], "bad_request"),
        case("score float", 102, "set", &[b("t"), p("x"), ("score", Value::from(10.0f64))], "bad_request"),
        case("score f32", 103, "set", &[b("t"), p("x"), ("score", Value::F32(1.5))], "bad_request"),
        case("score bool", 104, "set", &[b("t"), p("x"), ("score", Value::from(true))], "bad_request"),
        case("score array", 105, "set", &[b("t"), p("x"), ("score", list(vec![i(1)]))], "bad_request"),
        case("score string", 106, "rank_of_score", &[b("t"), ("score", s("1"))], "bad_request"),
        case("score float", 107, "rank_of_score", &[b("t"), ("score", Value::from(0.5f64))], "bad_request"),
        // board / player
        case("board int", 110, "set", &[("board", i(5)), p("x"), ("score", i(1))], "bad_request"),
        case("board binary", 111, "get", &[("board", Value::Binary(b"t".to_vec())), p("x")], "bad_request"),
        case("board int", 112, "top", &[("board", i(5))], "bad_request"),
        case("board int", 113, "create_board", &[("board", i(5))], "bad_request"),
        case("board bool", 114, "drop_board", &[("board", Value::from(false))], "bad_request"),
        case("player int", 120, "set", &[b("t"), ("player", i(7)), ("score", i(1))], "bad_request"),
        case("player int", 121, "rank", &[b("t"), ("player", i(7))], "bad_request"),
        case("player array", 122, "get", &[b("t"), ("player", list(vec![s("x")]))], "bad_request"),
        case("player int", 123, "remove", &[b("t"), ("player", i(7))], "bad_request"),
        case("player int", 124, "around", &[b("t"), ("player", i(7))], "bad_request"),
        // limit / offset
        case("limit negative", 130, "top", &[b("t"), ("limit", i(-1))], "bad_request"),
        case("limit string", 131, "top", &[b("t"), ("limit", s("10"))], "bad_request"),
        case("limit float", 132, "top", &[b("t"), ("limit", Value::from(10.0f64))], "bad_request"),
        case("offset negative", 133, "top", &[b("t"), ("offset", i(-1))], "bad_request"),
        case("offset string", 134, "top", &[b("t"), ("offset", s("0"))], "bad_request"),
        // before / after
        case("before negative", 140, "around", &[b("t"), p("x"), ("before", i(-1))], "bad_request"),
        case("before string", 141, "around", &[b("t"), p("x"), ("before", s("5"))], "bad_request"),
        case("after negative", 142, "around", &[b("t"), p("x"), ("after", i(-5))], "bad_request"),
        case("after bool", 143, "around", &[b("t"), p("x"), ("after", Value::from(true))], "bad_request"),
        // mode
        case("unknown mode", 150, "set", &[b("t"), p("x"), ("score", i(1)), ("mode", s("double"))], "bad_request"),
        case("mode int", 151, "set", &[b("t"), p("x"), ("score", i(1)), ("mode", i(1))], "bad_request"),
        case("mode in wrong case", 152, "set", &[b("t"), p("x"), ("score", i(1)), ("mode", s("INCR"))], "bad_request"),
        case(
            "unknown mode",
            153,
            "set_many",
            &[b("t"), ("entries", list(vec![pair("x", 1)])), ("mode", s("max"))],
            "bad_request",
        ),
        // order / ties / windows / keep
        case("unknown order", 160, "create_board", &[b("t"), ("order", s("sideways"))], "bad_request"),
        case("order int", 161, "create_board", &[b("t"), ("order", i(1))], "bad_request"),
        case("unknown ties", 162, "create_board", &[b("t"), ("ties", s("random"))], "bad_request"),
        case("ties int", 163, "create_board", &[b("t"), ("ties", i(0))], "bad_request"),
        case("windows not a list", 164, "create_board", &[b("t"), ("windows", s("all"))], "bad_request"),
        case("windows empty", 165, "create_board", &[b("t"), ("windows", list(vec![]))], "bad_request"),
        case("windows unknown", 166, "create_board", &[b("t"), ("windows", list(vec![s("hourly")]))], "bad_request"),
        case("windows item int", 167, "create_board", &[b("t"), ("windows", list(vec![i(0)]))], "bad_request"),
        case(
            "windows listed twice",
            168,
            "create_board",
            &[b("t"), ("windows", list(vec![s("all"), s("all")]))],
            "bad_request",
        ),
        case("keep 0", 171, "create_board", &[b("t"), ("keep", i(0))], "bad_request"),
        case("keep 1001", 172, "create_board", &[b("t"), ("keep", i(1001))], "bad_request"),
        case("keep negative", 173, "create_board", &[b("t"), ("keep", i(-1))], "bad_request"),
        case("keep string", 174, "create_board", &[b("t"), ("keep", s("1"))], "bad_request"),
        // window / period on reads
        case("period positive", 180, "get", &[b("t"), p("x"), ("period", i(1))], "bad_request"),
        case("period positive", 181, "count", &[b("t"), ("period", i(3))], "bad_request"),
        case("period string", 182, "top", &[b("t"), ("period", s("0"))], "bad_request"),
        case("period float", 183, "rank", &[b("t"), p("x"), ("period", Value::from(-1.0f64))], "bad_request"),
        case("period huge u64", 184, "count", &[b("t"), ("period", Value::from(u64::MAX))], "bad_request"),
        case("window unknown", 187, "count", &[b("t"), ("window", s("yearly"))], "bad_request"),
        case("window int", 188, "get", &[b("t"), p("x"), ("window", i(0))], "bad_request"),
        // entries
        case("entries not a list", 200, "set_many", &[b("t"), ("entries", s("x"))], "bad_request"),
        case("entries a map", 201, "set_many", &[b("t"), ("entries", map(&[("x", i(1))]))], "bad_request"),
        case("entry not a pair", 202, "set_many", &[b("t"), ("entries", list(vec![s("x")]))], "bad_request"),
        case("entry of 1", 203, "set_many", &[b("t"), ("entries", list(vec![list(vec![s("x")])]))], "bad_request"),
        case(
            "entry of 3",
            204,
            "set_many",
            &[b("t"), ("entries", list(vec![list(vec![s("x"), i(1), i(2)])]))],
            "bad_request",
        ),
        case("entry score string", 205, "set_many", &[b("t"), ("entries", list(vec![pair("x", "1")]))], "bad_request"),
        case(
            "entry score float",
            206,
            "set_many",
            &[b("t"), ("entries", list(vec![pair("x", Value::from(1.0f64))]))],
            "bad_request",
        ),
        case(
            "entry player int",
            207,
            "set_many",
            &[b("t"), ("entries", list(vec![list(vec![i(1), i(1)])]))],
            "bad_request",
        ),
        case(
            "one bad entry among good ones",
            208,
            "set_many",
            &[b("t"), ("entries", list(vec![pair("a", 1), pair("b", 2), pair("", 3)]))],
            "bad_request",
        ),
        // auth
        case("token int", 210, "auth", &[("token", i(1))], "bad_request"),
    ];
    expect_errors(&mut c, cases).await;
    // None of those requests may have created or written anything.
    let boards = c.boards().await.expect("boards");
    assert!(boards.is_empty(), "failed requests must not create boards, found {:?}", boards);
}

#[tokio::test]
async fn missing_required_fields_are_bad_request() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let i = |v: i64| Value::from(v);
    let cases = vec![
        case("set without score", 301, "set", &[b("m"), p("x")], "bad_request"),
        case("set without player", 302, "set", &[b("m"), ("score", i(1))], "bad_request"),
        case("set without board", 303, "set", &[p("x"), ("score", i(1))], "bad_request"),
        case("set with nil score", 304, "set", &[b("m"), p("x"), ("score", Value::Nil)], "bad_request"),
        case("set_many without entries", 305, "set_many", &[b("m")], "bad_request"),
        case("set_many without board", 306, "set_many", &[("entries", list(vec![pair("x", 1)]))], "bad_request"),
        case("get without player", 307, "get", &[b("m")], "bad_request"),
        case("get without board", 308, "get", &[p("x")], "bad_request"),
        case("rank without player", 309, "rank", &[b("m")], "bad_request"),
        case("rank without board", 310, "rank", &[p("x")], "bad_request"),
        case("rank_of_score without score", 311, "rank_of_score", &[b("m")], "bad_request"),
        case("rank_of_score without board", 312, "rank_of_score", &[("score", i(1))], "bad_request"),
        case("remove without player", 313, "remove", &[b("m")], "bad_request"),
        case("remove without board", 314, "remove", &[p("x")], "bad_request"),
        case("count without board", 315, "count", &[], "bad_request"),
        case("top without board", 316, "top", &[("limit", i(5))], "bad_request"),
        case("around without player", 317, "around", &[b("m")], "bad_request"),
        case("around without board", 318, "around", &[p("x")], "bad_request"),
        case("create_board without board", 319, "create_board", &[("order", Value::from("asc"))], "bad_request"),
        case("drop_board without board", 320, "drop_board", &[], "bad_request"),
        case("auth without token", 321, "auth", &[], "bad_request"),
    ];
    expect_errors(&mut c, cases).await;
    let boards = c.boards().await.expect("boards");
    assert!(boards.is_empty(), "failed requests must not create boards, found {:?}", boards);
}

#[tokio::test]
async fn invalid_board_and_player_names_are_bad_request() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let one = Value::from(1);
    let long_board = rep('b', 129);
    let long_player = rep('p', 257);
    let long_player_multibyte = rep('é', 129); // 258 bytes, 129 chars
    let mut cases = Vec::new();
    for (what, board) in [
        ("empty board", ""),
        ("129-byte board", long_board.as_str()),
        ("board with space", "has space"),
        ("board with slash", "a/b"),
        ("board with ..", "../etc"),
        ("board with non-ASCII", "bé"),
        ("board with NUL", "a\0b"),
        ("board with newline", "a\nb"),
    ] {
        cases.push(case(
            what,
            400 + cases.len() as u64,
            "set",
            &[b(board), p("x"), ("score", one.clone())],
            "bad_request",
        ));
        cases.push(case(what, 400 + cases.len() as u64, "create_board", &[b(board)], "bad_request"));
        cases.push(case(what, 400 + cases.len() as u64, "top", &[b(board)], "bad_request"));
    }
    for (what, player) in [
        ("empty player", ""),
        ("257-byte player", long_player.as_str()),
        ("258-byte multibyte player", long_player_multibyte.as_str()),
    ] {
        cases.push(case(
            what,
            400 + cases.len() as u64,
            "set",
            &[b("ok"), p(player), ("score", one.clone())],
            "bad_request",
        ));
        cases.push(case(what, 400 + cases.len() as u64, "get", &[b("ok"), p(player)], "bad_request"));
        cases.push(case(
            what,
            400 + cases.len() as u64,
            "set_many",
            &[b("ok"), ("entries", list(vec![pair("fine", 1), pair(player, 2)]))],
            "bad_request",
        ));
    }
    expect_errors(&mut c, cases).await;

    // A player that is a msgpack str but not valid UTF-8: bytes ff fe.
    let mut body =
        encode(&map(&[("id", Value::from(499)), ("op", Value::from("set")), b("ok"), ("score", one.clone())]));
    assert_eq!(body[0], 0x84, "test setup: expected a fixmap of 4");
    body[0] = 0x85;
    body.extend(encode(&Value::from("player")));
    body.extend([0xa2, 0xff, 0xfe]);
    let reply = roundtrip(&mut c, &body, "non-UTF-8 player").await;
    assert_err(&reply, 499, "bad_request", "non-UTF-8 player");
    assert_usable(&mut c, "non-UTF-8 player").await;

    let boards = c.boards().await.expect("boards");
    assert!(boards.is_empty(), "refused writes must not create boards, found {:?}", boards);

    // The limits themselves are accepted.
    let max_board = rep('B', 128);
    let max_player = rep('P', 256);
    let odd_board = "Az09_.:-";
    assert_eq!(c.set(&max_board, &max_player, 9, Mode::Set).await.expect("128-byte board, 256-byte player"), 9);
    assert_eq!(get(&mut c, &max_board, &max_player).await, Some(9), "longest names must store the score");
    assert_eq!(c.set(odd_board, "é 😀 / x", -3, Mode::Set).await.expect("every allowed board char, UTF-8 player"), -3);
    assert_eq!(get(&mut c, odd_board, "é 😀 / x").await, Some(-3), "UTF-8 player name must round-trip");
}

// ---------------------------------------------------------- score range --

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

// ---------------------------------------------------------- list limits --

#[tokio::test]
async fn over_long_lists_are_refused() {
    let server = Server::start(2);
    let mut c = server.client().await;

    let entries: Vec<Value> = (0..10_001).map(|i| pair(&format!("p{i}"), i as i64)).collect();
    let reply =
        roundtrip(&mut c, &req(601, "set_many", &[b("big"), ("entries", list(entries))]), "set_many 10001").await;
    assert_err(&reply, 601, "too_large", "set_many with 10001 entries");
    assert_usable(&mut c, "set_many with 10001 entries").await;
    assert_eq!(c.count("big").await.expect("count"), 0, "a refused set_many must write nothing");

    let cases = vec![
        case("top limit 1001", 602, "top", &[b("big"), ("limit", Value::from(1001))], "bad_request"),
        case("top limit u64::MAX", 603, "top", &[b("big"), ("limit", Value::from(u64::MAX))], "bad_request"),
        case("around before 501", 604, "around", &[b("big"), p("x"), ("before", Value::from(501))], "bad_request"),
        case("around after 501", 605, "around", &[b("big"), p("x"), ("after", Value::from(501))], "bad_request"),
        case(
            "around both huge",
            606,
            "around",
            &[b("big"), p("x"), ("before", Value::from(u64::MAX)), ("after", Value::from(u64::MAX))],
            "bad_request",
        ),
    ];
    expect_errors(&mut c, cases).await;

    // The limits themselves are accepted.
    let reply = roundtrip(&mut c, &req(607, "top", &[b("big"), ("limit", Value::from(1000))]), "top 1000").await;
    assert_eq!(assert_ok(&reply, 607, "top limit 1000"), list(vec![]), "top 1000 of an empty board");
    let reply = roundtrip(
        &mut c,
        &req(608, "around", &[b("big"), p("x"), ("before", Value::from(500)), ("after", Value::from(500))]),
        "around 500/500",
    )
    .await;
    assert_eq!(assert_ok(&reply, 608, "around 500/500"), list(vec![]), "around on an empty board");
    let reply =
        roundtrip(&mut c, &req(609, "top", &[b("big"), ("offset", Value::from(u64::MAX))]), "huge offset").await;
    assert_eq!(assert_ok(&reply, 609, "top offset u64::MAX"), list(vec![]), "a huge offset is valid and empty");

    // Huge offsets on a board that exists must not overflow anything.
    c.set("big", "x", 1, Mode::Set).await.expect("set on big");
    for (id, offset, limit) in
        [(610, u64::MAX, 1000u64), (611, u64::MAX - 5, 1000), (612, i64::MAX as u64, 10), (613, 1, 1000)]
    {
        let ctx = format!("top offset {offset} limit {limit} on a 1-player board");
        let reply = roundtrip(
            &mut c,
            &req(id, "top", &[b("big"), ("offset", Value::from(offset)), ("limit", Value::from(limit))]),
            &ctx,
        )
        .await;
        assert_eq!(assert_ok(&reply, id, &ctx), list(vec![]), "{ctx}: must be empty");
    }
    assert_usable(&mut c, "after huge offsets").await;
}

// ------------------------------------------------------ oversized frames --

/// Seeds acknowledged writes, sends an oversized length prefix, and checks
/// the one `too_large` reply, the close, and that nothing else is harmed.
async fn oversized_frame(header: u32) {
    let server = Server::start(2);
    let mut seeder = server.client().await;
    for i in 0..20 {
        seeder.set("keep", &format!("p{i}"), i * 10, Mode::Set).await.expect("seed write");
    }
    let mut bystander = server.client().await;
    assert_eq!(bystander.ping().await.expect("bystander ping"), "pong", "bystander ping before");

    let mut bad = server.client().await;
    bad.set("keep", "own", 77, Mode::Set).await.expect("the bad client's own acknowledged write");
    let mut bytes = header.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0x81, 0xa2, b'i', b'd', 0x01]); // a little of the "body"
    bad.send_raw(&bytes).await.expect("send oversized header");
    let ctx = format!("length prefix {header:#x}");
    let reply = read_reply(&mut bad, &ctx).await;
    assert_err(&reply, 0, "too_large", &ctx);
    assert_closed(&mut bad, &ctx).await;

    // The server keeps serving, the bystander is unaffected, writes intact.
    assert_eq!(bystander.ping().await.expect("bystander ping after"), "pong", "{ctx}: bystander still served");
    let mut fresh = server.client().await;
    assert_eq!(fresh.ping().await.expect("fresh ping"), "pong", "{ctx}: new connections still accepted");
    for i in 0..20 {
        assert_eq!(
            get(&mut fresh, "keep", &format!("p{i}")).await,
            Some(i * 10),
            "{ctx}: acknowledged write p{i} intact"
        );
    }
    assert_eq!(get(&mut fresh, "keep", "own").await, Some(77), "{ctx}: the closed client's acknowledged write intact");
    assert_eq!(bystander.count("keep").await.expect("count"), 21, "{ctx}: player count intact");
}

#[tokio::test]
async fn length_prefix_0xffffffff_gets_too_large_then_close() {
    oversized_frame(u32::MAX).await;
}

#[tokio::test]
async fn length_prefix_max_frame_plus_1_gets_too_large_then_close() {
    oversized_frame(MAX_FRAME as u32 + 1).await;
}

#[tokio::test]
async fn requests_pipelined_before_an_oversized_frame_are_answered_first() {
    let server = Server::start(2);
    let mut c = server.client().await;
    let mut bytes = frame(&req(1, "set", &[b("pre"), p("x"), ("score", Value::from(5))]));
    bytes.extend(frame(&req(2, "ping", &[])));
    bytes.extend(&u32::MAX.to_be_bytes());
    c.send_raw(&bytes).await.expect("send");
    let r1 = read_reply(&mut c, "set before oversized frame").await;
    assert_eq!(assert_ok(&r1, 1, "set before oversized frame").as_i64(), Some(5), "set before oversized frame");
    let r2 = read_reply(&mut c, "ping before oversized frame").await;
    assert_eq!(assert_ok(&r2, 2, "ping before oversized frame").as_str(), Some("pong"), "ping before oversized frame");
    let r3 = read_reply(&mut c, "oversized frame").await;
    assert_err(&r3, 0, "too_large", "oversized frame after pipelined requests");
    assert_closed(&mut c, "oversized frame after pipelined requests").await;
    let mut other = server.client().await;
    assert_eq!(get(&mut other, "pre", "x").await, Some(5), "the acknowledged set before the oversized frame is intact");
}

#[tokio::test]
async fn a_frame_of_exactly_max_frame_is_accepted() {
    let server = Server::start(1);
    let mut c = server.client().await;
    // A ping padded with an unknown field (ignored by the protocol) to exactly 1 MiB.
    let body_with = |pad: usize| req(3, "ping", &[("pad", Value::from(rep('x', pad)))]);
    let guess = MAX_FRAME - 100;
    let pad = guess + (MAX_FRAME - body_with(guess).len());
    let body = body_with(pad);
    assert_eq!(body.len(), MAX_FRAME, "test setup: body must be exactly max_frame");
    let reply = roundtrip(&mut c, &body, "1 MiB frame").await;
    assert_eq!(assert_ok(&reply, 3, "1 MiB frame").as_str(), Some("pong"), "a frame of exactly max_frame is valid");
    assert_usable(&mut c, "after a 1 MiB frame").await;
}

// -------------------------------------------------- decoder resource abuse --

#[tokio::test]
async fn deeply_nested_msgpack_is_bad_frame_without_crashing() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let mut nested_arrays = vec![0x91u8; 10_000];
    nested_arrays.push(0xc0);
    let million = vec![0x91u8; 1_000_000];
    let mut nested_maps = Vec::new();
    for _ in 0..50_000 {
        nested_maps.extend([0x81, 0xa0]); // {"": ...
    }
    nested_maps.push(0xc0);
    for (ctx, body) in [
        ("10_000 nested arrays", nested_arrays),
        ("1_000_000 nested arrays", million),
        ("50_000 nested maps", nested_maps),
    ] {
        let reply = roundtrip(&mut c, &body, ctx).await;
        assert_err(&reply, 0, "bad_frame", ctx);
        assert_usable(&mut c, ctx).await;
    }
    let mut other = server.client().await;
    assert_eq!(other.ping().await.expect("ping from another client"), "pong", "server survives deep nesting");
}

#[tokio::test]
async fn huge_collection_headers_in_tiny_frames_are_bad_frame() {
    let server = Server::start(1);
    let mut c = server.client().await;
    let mut in_request = encode(&map(&[("id", Value::from(1)), ("op", Value::from("ping"))]));
    in_request[0] = 0x83;
    in_request.extend(encode(&Value::from("x")));
    in_request.extend([0xdf, 0xff, 0xff, 0xff, 0xff]);
    let headers: Vec<(&str, Vec<u8>)> = vec![
        ("map32 of 2^32-1 entries", vec![0xdf, 0xff, 0xff, 0xff, 0xff]),
        ("array32 of 2^32-1 items", vec![0xdd, 0xff, 0xff, 0xff, 0xff]),
        ("str32 of 2^32-1 bytes", vec![0xdb, 0xff, 0xff, 0xff, 0xff, b'a']),
        ("bin32 of 2^32-1 bytes", vec![0xc6, 0xff, 0xff, 0xff, 0xff, 0x00]),
        ("ext32 of 2^32-1 bytes", vec![0xc9, 0xff, 0xff, 0xff, 0xff, 0x01]),
        ("map32 nested inside a request", in_request),
        ("map16 of 65535 entries", vec![0xde, 0xff, 0xff]),
    ];
    for (ctx, body) in &headers {
        let reply = roundtrip(&mut c, body, ctx).await;
        assert_err(&reply, 0, "bad_frame", ctx);
        assert_usable(&mut c, ctx).await;
    }
    // Many at once: if each one allocated for its announced size, the server
    // would run out of memory long before answering them all.
    let mut bytes = Vec::new();
    for _ in 0..200 {
        for (_, body) in &headers {
            bytes.extend(frame(body));
        }
    }
    c.send_raw(&bytes).await.expect("send");
    for i in 0..200 * headers.len() {
        let reply = read_reply(&mut c, &format!("huge header #{i}")).await;
        assert_err(&reply, 0, "bad_frame", &format!("huge header #{i} ({})", headers[i % headers.len()].0));
    }
    assert_usable(&mut c, "after 1400 huge headers").await;
    let mut other = server.client().await;
    assert_eq!(other.ping().await.expect("ping from another client"), "pong", "server still answers others");
}

// ---------------------------------------------------------- containment --

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
