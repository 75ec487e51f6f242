//! Frame-level failures: bytes that are no single msgpack map with string
//! keys get `bad_frame` with id 0, and the connection stays usable.

use rand::{Rng, SeedableRng};
use rmpv::Value;

use crate::common::raw::{frame, req};
use crate::common::{field, Server};
use crate::helpers::{assert_err, assert_ok, assert_usable, b, encode, get, list, map, p, read_reply, roundtrip};

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
