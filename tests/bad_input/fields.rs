//! Request fields: a missing or mistyped `id` or `op`, and every other field
//! missing, of the wrong type or an invalid name, refused with the request's id.

use rankd_client::Mode;
use rmpv::Value;

use crate::common::raw::req;
use crate::common::Server;
use crate::helpers::{
    assert_err, assert_ok, assert_usable, b, case, encode, expect_errors, get, list, map, p, pair, rep, roundtrip,
};

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
