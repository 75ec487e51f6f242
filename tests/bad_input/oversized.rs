//! Oversized input: lists past their limits, length prefixes past `max_frame`
//! (answered, then closed), and msgpack nested or sized to exhaust a decoder.

use rankd_client::Mode;
use rmpv::Value;

use crate::common::raw::{frame, req};
use crate::common::Server;
use crate::helpers::{
    assert_closed, assert_err, assert_ok, assert_usable, b, case, encode, expect_errors, get, list, map, p, pair,
    read_reply, rep, roundtrip, MAX_FRAME,
};

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
