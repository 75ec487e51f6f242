//! Property tests for frame and request decoding, the CI-sized companion of
//! the coverage-guided fuzz targets in `fuzz/` (see `fuzz/README.md`).
//!
//! - every input in `fuzz/regressions/` (fuzzer findings, minimized) replays
//!   through `parse` and `FrameReader`;
//! - random bytes: `parse` never panics, a rejection is well-formed, and
//!   `FrameReader` agrees with a reference splitter at any chunking;
//! - random structured requests (random ops, fields of random msgpack types,
//!   huge ints, nested lists, unknown and missing fields): never a panic; an
//!   accepted request holds exactly the fields that were sent (or their
//!   defaults); id/op errors get the protocol's codes;
//! - random *valid* requests round-trip: encode with rmpv (in any key order,
//!   with unknown fields, nils for absent optionals, canonical or widest
//!   msgpack encodings), parse, compare;
//! - a live server takes a few hundred random frames on one connection,
//!   interleaved with pings, and answers each one, in order, as the decoder
//!   predicts, then still serves a fresh connection.
//!
//! The invariant checks are shared with the fuzz targets: this file includes
//! `fuzz/src/lib.rs` as a module.

mod common;

#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod fuzz_checks;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::field;
use fuzz_checks::{
    check_frames, check_parse, check_rejection, encode_value, frame, request_value, ALL_CODES, OP_NAMES,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, TestRng, TestRunner};
use rankd::protocol::request::{parse, Op, Request, View, WatchSpec, WatchTarget};
use rankd::protocol::ScoreInput;
use rankd_client::frame::FrameReader;
use rankd_client::protocol::DEFAULT_MAX_FRAME;
use rankd_shards::fields::Field;
use rankd_shards::{BoardConfig, Mode, Order, Ties, Wid, Window};
use rmpv::Value;
use tokio::io::AsyncWriteExt;

/// Failures are kept next to the fuzzers' findings (and replayed from there).
fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("fuzz/regressions/proptest-fuzz_props.txt"))),
        ..Config::default()
    }
}

// ---------------------------------------------------- regression corpus --

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every file under `fuzz/regressions/` (whatever its target) goes through
/// both checks, read as a request body and as a `frames` target input.
#[test]
fn fuzz_regressions_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut files = Vec::new();
    files_under(&root, &mut files);
    files.sort();
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let ctx = path.display();
        std::panic::catch_unwind(|| {
            check_parse(&data);
            check_frames(&data, DEFAULT_MAX_FRAME, usize::MAX);
            check_frames(&data, 64, 3);
            if let [m, c, stream @ ..] = &data[..] {
                let max_frame = if *m == 255 { DEFAULT_MAX_FRAME } else { 1 + *m as usize * 4 };
                check_frames(stream, max_frame, if *c == 0 { usize::MAX } else { *c as usize });
            }
        })
        .unwrap_or_else(|_| panic!("regression input {ctx} fails its checks again"));
    }
    // The seeds the corpora start from are valid and round-trip.
    for req in fuzz_checks::seed_requests() {
        assert_eq!(check_parse(&encode_value(&request_value(&req))).as_ref(), Some(&req));
    }
}

// ----------------------------------------------------------- strategies --

/// Words the decoder looks for, so random strings hit real branches.
const WORDS: [&str; 32] = [
    "id",
    "op",
    "board",
    "player",
    "players",
    "score",
    "mode",
    "entries",
    "window",
    "period",
    "limit",
    "offset",
    "before",
    "after",
    "token",
    "order",
    "ties",
    "windows",
    "keep",
    "desc",
    "asc",
    "competition",
    "dense",
    "ordinal",
    "all",
    "daily",
    "weekly",
    "monthly",
    "set",
    "best",
    "incr",
    "",
];

/// Field names of the protocol (for the structured generator).
const FIELDS: [&str; 19] = [
    "board", "player", "score", "mode", "entries", "window", "period", "limit", "offset", "before", "after", "token",
    "order", "ties", "windows", "keep", "id", "op", "players",
];

/// A msgpack string holding invalid UTF-8.
fn invalid_utf8(bytes: Vec<u8>) -> Value {
    let mut raw = vec![0xd9, bytes.len() as u8 + 1, 0xff];
    raw.extend(bytes);
    rmpv::decode::read_value(&mut &raw[..]).expect("str8 decodes")
}

fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        select(vec![i64::MIN, -1, 0, 1, i64::MAX]).prop_map(Value::from),
        select(vec![u64::MAX, 1 << 63, 10_000, 10_001, 1000, 1001, 500, 501]).prop_map(Value::from),
        any::<f32>().prop_map(Value::F32),
        any::<f64>().prop_map(Value::F64),
        ".{0,12}".prop_map(Value::from),
        select(&WORDS[..]).prop_map(Value::from),
        select(&OP_NAMES[..]).prop_map(Value::from),
        vec(any::<u8>(), 0..12).prop_map(Value::Binary),
        (any::<i8>(), vec(any::<u8>(), 0..8)).prop_map(|(t, d)| Value::Ext(t, d)),
        vec(any::<u8>(), 0..6).prop_map(invalid_utf8),
    ]
}

/// Any msgpack value, nested up to 4 levels.
fn arb_value() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((prop_oneof![select(&WORDS[..]).prop_map(Value::from), inner.clone()], inner), 0..5)
                .prop_map(Value::Map),
        ]
    })
}

fn board_name() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[A-Za-z0-9_.:-]{1,12}", 1 => "[A-Za-z0-9_.:-]{120,128}"]
}

fn player_name() -> impl Strategy<Value = String> {
    // 1..=64 chars of at most 4 bytes: always 1..=256 bytes.
    prop_oneof![4 => "[a-z0-9]{1,10}", 2 => ".{1,64}", 1 => "[a-z]{256}"]
}

/// A value for `field` that has the right type but may be out of range.
fn near_valid(field: &'static str) -> BoxedStrategy<Value> {
    let s = |words: &'static [&'static str]| select(words).prop_map(Value::from).boxed();
    match field {
        "board" => prop_oneof![8 => board_name().prop_map(Value::from), 1 => "[ -~]{0,3}".prop_map(Value::from)].boxed(),
        "player" | "token" => prop_oneof![
            8 => player_name().prop_map(Value::from),
            1 => Just(Value::from("")),
            1 => "a{257}".prop_map(Value::from)
        ]
        .boxed(),
        "score" => prop_oneof![any::<i64>().prop_map(Value::from), any::<u64>().prop_map(Value::from)].boxed(),
        "mode" => s(&["set", "best", "incr", "set", "best", "incr", "Set", "max"]),
        "window" => s(&["all", "daily", "weekly", "monthly", "all", "daily", "weekly", "monthly", "yearly"]),
        "order" => s(&["desc", "asc", "desc", "asc", "up"]),
        "ties" => s(&["competition", "dense", "ordinal", "competition", "dense", "ordinal", "1224"]),
        "period" => prop_oneof![
            4 => (i64::MIN..=0).prop_map(Value::from),
            4 => (-3i64..=0).prop_map(Value::from),
            1 => (1i64..=3).prop_map(Value::from)
        ]
        .boxed(),
        "limit" | "offset" | "before" | "after" | "keep" => prop_oneof![
            8 => (0u64..1100).prop_map(Value::from),
            1 => any::<u64>().prop_map(Value::from),
            1 => (-5i64..0).prop_map(Value::from)
        ]
        .boxed(),
        "windows" => prop_oneof![
            6 => Just(vec!["all", "daily", "weekly", "monthly"])
                .prop_shuffle()
                .prop_flat_map(|w| (0..=4usize).prop_map(move |n| Value::Array(w[..n].iter().map(|&x| x.into()).collect()))),
            1 => vec(prop_oneof![s(&["all", "daily", "weekly", "monthly", "hourly"]), arb_leaf()], 0..6)
                .prop_map(Value::Array),
        ]
        .boxed(),
        "players" => prop_oneof![
            20 => vec(prop_oneof![30 => player_name().prop_map(Value::from), 1 => arb_leaf()], 0..12)
                .prop_map(Value::Array),
            1 => (1000usize..=1001).prop_map(|n| Value::Array(vec![Value::from("p"); n])),
            1 => arb_leaf(),
        ]
        .boxed(),
        "entries" => {
            let entry = prop_oneof![
                30 => (player_name(), any::<i64>()).prop_map(|(p, s)| Value::Array(vec![p.into(), s.into()])),
                1 => vec(arb_leaf(), 0..4).prop_map(Value::Array),
                1 => arb_leaf(),
            ];
            prop_oneof![
                20 => vec(entry, 0..12).prop_map(Value::Array),
                1 => (10_000usize..=10_001)
                    .prop_map(|n| Value::Array(vec![Value::Array(vec!["p".into(), 1.into()]); n])),
            ]
            .boxed()
        }
        "id" => prop_oneof![8 => any::<u64>().prop_map(Value::from), 1 => (i64::MIN..0).prop_map(Value::from)].boxed(),
        "op" => prop_oneof![4 => s(&OP_NAMES), 1 => ".{0,80}".prop_map(Value::from)].boxed(),
        _ => arb_value().boxed(),
    }
}

/// The fields each op reads.
fn fields_of(op: &str) -> &'static [&'static str] {
    match op {
        "auth" => &["token"],
        "create_board" => &["board", "order", "ties", "windows", "keep"],
        "drop_board" => &["board"],
        "set" => &["board", "player", "score", "mode"],
        "set_many" => &["board", "entries", "mode"],
        "get" | "rank" => &["board", "player", "window", "period"],
        "remove" => &["board", "player"],
        "count" => &["board", "window", "period"],
        "rank_of_score" => &["board", "score", "window", "period"],
        "top" => &["board", "limit", "offset", "window", "period"],
        "around" => &["board", "player", "before", "after", "window", "period"],
        "ranks" => &["board", "players", "window", "period"],
        _ => &[],
    }
}

/// `(key, value)` pairs of a random request map: `id` and `op` usually
/// present and well-typed; the op's own fields usually present and of the
/// right type (sometimes out of range, of a random type, or missing); other
/// protocol fields now and then; a few unknown fields. No duplicate keys;
/// shuffled.
fn structured_request() -> impl Strategy<Value = Vec<(String, Value)>> {
    let op = prop_oneof![10 => select(&OP_NAMES[..]).prop_map(Value::from), 1 => near_valid("op"), 1 => arb_value()];
    op.prop_flat_map(|op| {
        let own = fields_of(op.as_str().unwrap_or_default());
        let known: Vec<_> = FIELDS
            .iter()
            .filter(|&&name| name != "op")
            .map(|&name| {
                let (typed, random, missing) = match name {
                    "id" => (12, 1, 1),
                    _ if own.contains(&name) => (12, 1, 1),
                    _ => (1, 1, 6),
                };
                prop_oneof![
                    typed => near_valid(name).prop_map(Some),
                    random => arb_value().prop_map(Some),
                    missing => Just(None),
                ]
                .prop_map(move |v| v.map(|v| (name.to_string(), v)))
            })
            .collect();
        let unknown = vec(("x-[a-z]{0,6}", arb_value()), 0..3);
        (Just(op), known, unknown)
    })
    .prop_map(|(op, known, unknown)| {
        // A nil `op` stands for a missing one (the decoder treats them alike).
        known.into_iter().flatten().chain([("op".to_string(), op)]).chain(unknown).collect::<Vec<_>>()
    })
    .prop_shuffle()
}

fn map_of(pairs: &[(String, Value)]) -> Value {
    Value::Map(pairs.iter().map(|(k, v)| (Value::from(k.as_str()), v.clone())).collect())
}

fn arb_view() -> impl Strategy<Value = View> {
    let window = prop_oneof![
        Just(None),
        select(vec![Window::All, Window::Daily, Window::Weekly, Window::Monthly]).prop_map(Some)
    ];
    (window, prop_oneof![Just(0i64), -5i64..=0, i64::MIN..=0]).prop_map(|(window, period)| View { window, period })
}

fn arb_mode() -> impl Strategy<Value = Mode> {
    select(vec![Mode::Set, Mode::Best, Mode::Incr])
}

fn arb_config() -> impl Strategy<Value = BoardConfig> {
    let all = vec![Window::All, Window::Daily, Window::Weekly, Window::Monthly];
    (
        select(vec![Order::Desc, Order::Asc]),
        select(vec![Ties::Competition, Ties::Dense, Ties::Ordinal]),
        Just(all).prop_shuffle(),
        1usize..=4,
        1u32..=1000,
        proptest::option::of(arb_fields()),
    )
        .prop_map(|(order, ties, windows, n, keep, fields)| BoardConfig {
            // A board with fields ranks its packed scores high-first.
            order: if fields.is_some() { Order::Desc } else { order },
            ties,
            windows: windows[..n].to_vec(),
            keep,
            fields: fields.unwrap_or_default(),
        })
}

/// 2–4 valid fields whose ranges multiply to at most 2^63.
fn arb_fields() -> impl Strategy<Value = Vec<Field>> {
    let one = (select(vec![Order::Desc, Order::Asc]), any::<i32>(), 0u32..1 << 15);
    vec(one, 2..=4).prop_map(|specs| {
        (specs.into_iter().enumerate())
            .map(|(i, (order, min, span))| Field {
                name: format!("f_{i}"),
                order,
                min: i64::from(min),
                max: i64::from(min) + i64::from(span),
            })
            .collect()
    })
}

/// A score as a request carries it: an integer or 1–4 named field values.
fn arb_score() -> impl Strategy<Value = ScoreInput> {
    prop_oneof![
        3 => any::<i64>().prop_map(ScoreInput::Int),
        1 => proptest::collection::btree_map("[a-z0-9_]{1,32}", any::<i64>(), 1..=4)
            .prop_map(|values| ScoreInput::Map(values.into_iter().collect())),
    ]
}

/// An idempotent write's key, or none.
fn arb_wid() -> impl Strategy<Value = Option<Wid>> {
    proptest::option::of("[ -~]{1,64}".prop_map(|wid| Wid::from(wid.as_str())))
}

/// A random valid request of any op.
fn valid_request() -> impl Strategy<Value = Request> {
    let b = board_name;
    let p = player_name;
    let op = prop_oneof![
        Just(Op::Ping),
        ("[a-z:]{0,8}", proptest::option::of("[a-z0-9:]{1,12}"), 1usize..=10_000)
            .prop_map(|(prefix, after, limit)| Op::Boards { prefix, after, limit }),
        ".{0,40}".prop_map(|token| Op::Auth { token: rankd::security::Secret(token) }),
        (b(), arb_config()).prop_map(|(board, config)| Op::CreateBoard { board, config }),
        b().prop_map(|board| Op::DropBoard { board }),
        (b(), p(), arb_score(), arb_mode(), arb_wid()).prop_map(|(board, player, score, mode, wid)| Op::Set {
            board,
            player,
            score,
            mode,
            wid
        }),
        (b(), vec((p(), arb_score()), 0..16), arb_mode(), arb_wid())
            .prop_map(|(board, entries, mode, wid)| { Op::SetMany { board, entries, mode, wid } }),
        (b(), p(), arb_view()).prop_map(|(board, player, view)| Op::Get { board, player, view }),
        (b(), p(), arb_wid()).prop_map(|(board, player, wid)| Op::Remove { board, player, wid }),
        (
            b(),
            prop_oneof![(1usize..=100).prop_map(WatchTarget::Top), p().prop_map(WatchTarget::Player)],
            arb_view(),
            10u64..=60_000
        )
            .prop_map(|(board, target, view, ms)| Op::Watch(WatchSpec {
                board,
                target,
                view,
                interval: Duration::from_millis(ms)
            })),
        any::<u64>().prop_map(|watch| Op::Unwatch { watch }),
        (b(), arb_view()).prop_map(|(board, view)| Op::Count { board, view }),
        (b(), p(), arb_view()).prop_map(|(board, player, view)| Op::Rank { board, player, view }),
        (b(), arb_score(), arb_view()).prop_map(|(board, score, view)| Op::RankOfScore { board, score, view }),
        (b(), p(), arb_view()).prop_map(|(board, player, view)| Op::ApproxRank { board, player, view }),
        (b(), arb_score(), arb_view()).prop_map(|(board, score, view)| Op::ApproxRankOfScore { board, score, view }),
        (b(), 0usize..=1000, any::<u64>(), arb_view()).prop_map(|(board, limit, offset, view)| Op::Top {
            board,
            limit,
            offset,
            view
        }),
        (b(), p(), 0usize..=500, 0usize..=500, arb_view())
            .prop_map(|(board, player, before, after, view)| { Op::Around { board, player, before, after, view } }),
    ];
    (any::<u64>(), op).prop_map(|(id, op)| Request { id, op })
}

/// The value an optional field of `op` takes when it is absent (None: no
/// default, the canonical encoding omits it).
fn default_of(op: &Op, key: &str) -> Option<Value> {
    Some(match key {
        "mode" => "set".into(),
        "period" | "offset" => 0.into(),
        "limit" if matches!(op, Op::Boards { .. }) => 1000.into(),
        "limit" => 10.into(),
        "interval_ms" => 100.into(),
        "before" | "after" => 5.into(),
        "order" => "desc".into(),
        "ties" => "competition".into(),
        "windows" => Value::Array(vec!["all".into()]),
        "keep" => 1.into(),
        _ => return None,
    })
}

/// Equal as msgpack data: integers by value whatever their encoding.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Integer(x), Value::Integer(y)) => {
            x.as_i64().map(i128::from).or(x.as_u64().map(i128::from))
                == y.as_i64().map(i128::from).or(y.as_u64().map(i128::from))
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        _ => a == b,
    }
}

/// msgpack with the widest encoding of everything (int64/uint64, str32,
/// array32, map32): still the same value, must decode the same.
fn encode_wide(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Integer(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => {
                out.push(0xcf);
                out.extend(u.to_be_bytes());
            }
            (None, Some(i)) => {
                out.push(0xd3);
                out.extend(i.to_be_bytes());
            }
            (None, None) => unreachable!("an rmpv integer is an i64 or a u64"),
        },
        Value::String(s) => {
            out.push(0xdb);
            out.extend((s.as_bytes().len() as u32).to_be_bytes());
            out.extend(s.as_bytes());
        }
        Value::Array(items) => {
            out.push(0xdd);
            out.extend((items.len() as u32).to_be_bytes());
            items.iter().for_each(|v| encode_wide(v, out));
        }
        Value::Map(pairs) => {
            out.push(0xdf);
            out.extend((pairs.len() as u32).to_be_bytes());
            for (k, v) in pairs {
                encode_wide(k, out);
                encode_wide(v, out);
            }
        }
        other => out.extend(encode_value(other)),
    }
}

/// A frame body for the frame-reader and live tests: a valid request, a
/// structured (often invalid) one, or plain garbage.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => valid_request().prop_map(|r| encode_value(&request_value(&r))),
        3 => structured_request().prop_map(|pairs| encode_value(&map_of(&pairs))),
        2 => vec(any::<u8>(), 1..64),
        1 => arb_value().prop_map(|v| encode_value(&v)),
    ]
}

// ------------------------------------------------------------- limits --

fn set_many_body(id: u64, entries: usize, extra: &[(&str, Value)]) -> Vec<u8> {
    let mut pairs = vec![
        ("id".to_string(), Value::from(id)),
        ("op".to_string(), Value::from("set_many")),
        ("board".to_string(), Value::from("b")),
        ("mode".to_string(), Value::from("best")),
        ("entries".to_string(), Value::Array(vec![Value::Array(vec!["p".into(), i64::MIN.into()]); entries])),
    ];
    pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    encode_value(&map_of(&pairs))
}

/// The limits are exact: a full `set_many` (with every optional field and
/// some unknown ones) is accepted whatever else bounds the decoder; one
/// entry more is `too_large` for that request, id and op echoed.
#[test]
fn set_many_limit_is_exact() {
    let unknown = [("x", Value::Array(vec![Value::from(1); 100])), ("y", Value::from("z".repeat(1000)))];
    let full = set_many_body(5, 10_000, &unknown);
    let req = check_parse(&full).expect("a full set_many is a valid request");
    assert!(matches!(&req.op, Op::SetMany { entries, .. } if entries.len() == 10_000));
    let over = parse(&set_many_body(6, 10_001, &[])).expect_err("10001 entries");
    check_rejection(&over);
    assert_eq!((over.id, over.op.map(|op| op.name()), over.error.code().name()), (6, Some("set_many"), "too_large"));
}

// ------------------------------------------------------------ properties --

proptest! {
    #![proptest_config(config(20_000))]

    /// Random bytes: never a panic; Ok/Err both well-formed.
    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        check_parse(&bytes);
    }

    /// Random bytes behind a map header, so the decoder gets past the first byte.
    #[test]
    fn random_bytes_in_a_map_never_panic(header in select(vec![0x81u8, 0x82, 0x83, 0x85, 0xde]), rest in vec(any::<u8>(), 0..128)) {
        let mut bytes = vec![header];
        if header == 0xde {
            bytes.extend([0, 4]);
        }
        bytes.extend(rest);
        check_parse(&bytes);
    }
}

proptest! {
    #![proptest_config(config(8_000))]

    /// Random structured requests: never a panic; an accepted request holds
    /// exactly the fields sent (or the defaults); id and op errors get the
    /// protocol's answer.
    #[test]
    fn structured_requests_decode_to_what_was_sent(pairs in structured_request()) {
        let body = encode_value(&map_of(&pairs));
        let sent = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v).filter(|v| !v.is_nil());
        let id = sent("id").and_then(Value::as_u64);
        match check_parse(&body) {
            Some(req) => {
                prop_assert_eq!(Some(req.id), id);
                prop_assert_eq!(sent("op").and_then(Value::as_str), Some(req.op.kind().name()));
                let Value::Map(canonical) = request_value(&req) else { unreachable!() };
                for (k, v) in &canonical {
                    let k = k.as_str().unwrap();
                    match sent(k) {
                        Some(got) => prop_assert!(same(got, v), "field {}: sent {}, decoded {}", k, got, v),
                        None => prop_assert!(
                            default_of(&req.op, k).is_some_and(|d| same(&d, v)),
                            "field {} absent but decoded as {}", k, v
                        ),
                    }
                }
                let reads_a_view = matches!(
                    req.op,
                    Op::Get { .. } | Op::Count { .. } | Op::Rank { .. } | Op::RankOfScore { .. } | Op::Top { .. } | Op::Around { .. }
                        | Op::ApproxRank { .. } | Op::ApproxRankOfScore { .. }
                );
                if reads_a_view && !canonical.iter().any(|(k, _)| k.as_str() == Some("window")) {
                    prop_assert!(sent("window").is_none(), "window sent but decoded as the default");
                }
            }
            None => {
                let rejected = parse(&body).unwrap_err();
                check_rejection(&rejected);
                let code = rejected.error.code().name();
                if code == "too_large" && rejected.op.is_none() {
                    // Over the decoder's value budget (check_parse checked it
                    // is more than a full set_many needs): refused unread.
                    return Ok(());
                }
                match id {
                    None => prop_assert_eq!((rejected.id, code), (0, "bad_request"), "missing/bad id"),
                    Some(id) => {
                        prop_assert_eq!(rejected.id, id);
                        match sent("op") {
                            None => prop_assert_eq!(code, "bad_request"),
                            Some(op) => match op.as_str() {
                                Some(name) if OP_NAMES.contains(&name) => {
                                    prop_assert!(matches!(code, "bad_request" | "too_large"), "{}", code);
                                    prop_assert_eq!(rejected.op.map(|op| op.name()), Some(name));
                                }
                                Some(_) => prop_assert_eq!(code, "unknown_op"),
                                None => prop_assert_eq!(code, "bad_request"),
                            },
                        }
                    }
                }
            }
        }
    }

    /// Random valid requests round-trip: any key order, unknown fields,
    /// absent or nil optionals, canonical or widest encodings.
    #[test]
    fn valid_requests_round_trip(
        req in valid_request(),
        drop_defaults in any::<bool>(),
        nil_defaults in any::<bool>(),
        unknown in vec(("[a-z_]{1,8}", arb_value()), 0..3),
        wide in any::<bool>(),
        shuffle in any::<u64>(),
    ) {
        let Value::Map(canonical) = request_value(&req) else { unreachable!() };
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        for (k, v) in canonical {
            let is_default = default_of(&req.op, k.as_str().unwrap()).is_some_and(|d| same(&d, &v));
            match (is_default, drop_defaults, nil_defaults) {
                (true, true, true) => pairs.push((k, Value::Nil)),
                (true, true, false) => {}
                _ => pairs.push((k, v)),
            }
        }
        for (k, v) in unknown {
            if !FIELDS.contains(&k.as_str()) && !pairs.iter().any(|(p, _)| p.as_str() == Some(&k)) {
                pairs.push((Value::from(k), v));
            }
        }
        // Deterministic shuffle from the drawn seed.
        let mut state = shuffle | 1;
        for i in (1..pairs.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pairs.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let map = Value::Map(pairs);
        let body = if wide {
            let mut out = Vec::new();
            encode_wide(&map, &mut out);
            out
        } else {
            encode_value(&map)
        };
        prop_assert_eq!(check_parse(&body), Some(req));
    }
}

proptest! {
    #![proptest_config(config(4_000))]

    /// FrameReader over a stream of random frames (and garbage), any
    /// max_frame, any read chunking: agrees with the reference splitter.
    #[test]
    fn frame_reader_matches_the_reference(
        bodies in vec(prop_oneof![4 => body(), 1 => Just(Vec::new())], 0..12),
        tail in vec(any::<u8>(), 0..8),
        max_frame in prop_oneof![1usize..64, 64usize..2048, Just(DEFAULT_MAX_FRAME)],
        chunk in prop_oneof![1usize..8, 8usize..512, Just(usize::MAX)],
    ) {
        let mut stream: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
        stream.extend(tail);
        check_frames(&stream, max_frame, chunk);
    }

    /// Fully random streams, including random length prefixes.
    #[test]
    fn frame_reader_on_random_bytes(
        stream in vec(any::<u8>(), 0..512),
        max_frame in 1usize..300,
        chunk in 1usize..40,
    ) {
        check_frames(&stream, max_frame, chunk);
    }
}

// ------------------------------------------------------------ live server --

/// Frames sent to the live server, generated reproducibly.
fn live_frames(n: usize) -> Vec<Vec<u8>> {
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let big = (1usize..=DEFAULT_MAX_FRAME).prop_flat_map(|len| vec(any::<u8>(), len..=len));
    let one = prop_oneof![
        60 => body(),
        8 => vec(any::<u8>(), 64..4096),
        2 => vec(any::<u8>(), 4096..65_536),
        1 => big,
        2 => Just(Vec::new()),
    ];
    vec(one, n..=n).new_tree(&mut runner).expect("strategy").current()
}

/// What the reply to one frame must be.
enum Expect {
    Pong(u64),
    /// Decoded fine: this id, and a result or an execution error (which can
    /// be `bad_request`: a window the board lacks, an `incr` overflow).
    Accepted(u64),
    /// Refused by the decoder: this id and code.
    Refused(u64, &'static str),
}

#[tokio::test]
async fn live_server_answers_random_frames_in_order() {
    const FRAMES: usize = 300;
    let server = common::Server::start(1);
    let bodies = live_frames(FRAMES);
    let mut bytes = Vec::new();
    let mut expect = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        if i % 10 == 0 {
            let id = 9_000_000 + i as u64;
            let ping = Request { id, op: Op::Ping };
            bytes.extend(frame(&encode_value(&request_value(&ping))));
            expect.push(Expect::Pong(id));
        }
        bytes.extend(frame(body));
        expect.push(match parse(body) {
            _ if body.is_empty() => Expect::Refused(0, "bad_frame"),
            Ok(req) => Expect::Accepted(req.id),
            Err(rejected) => Expect::Refused(rejected.id, rejected.error.code().name()),
        });
    }
    let final_ping = 9_999_999;
    bytes.extend(frame(&encode_value(&request_value(&Request { id: final_ping, op: Op::Ping }))));
    expect.push(Expect::Pong(final_ping));

    let stream = tokio::net::TcpStream::connect(&server.addr).await.expect("connect");
    let (read, mut write) = stream.into_split();
    // Write and read at once: the replies must not wait for the whole send.
    let writer = tokio::spawn(async move {
        write.write_all(&bytes).await.expect("send frames");
        write
    });
    let mut replies = FrameReader::new(read, 64 << 20);
    for (k, want) in expect.iter().enumerate() {
        // Random `watch` requests open watches: their pushes (no `id`) may
        // come between replies, and are set aside.
        let reply = loop {
            let body = tokio::time::timeout(Duration::from_secs(10), replies.next_frame())
                .await
                .unwrap_or_else(|_| panic!("reply #{k}: none within 10 s"))
                .unwrap_or_else(|e| panic!("reply #{k}: {e}"))
                .unwrap_or_else(|| panic!("reply #{k}: the server closed the connection"));
            let frame =
                rmpv::decode::read_value(&mut &body[..]).unwrap_or_else(|e| panic!("reply #{k}: not msgpack: {e}"));
            match (field(&frame, "id"), field(&frame, "watch"), field(&frame, "event")) {
                (None, Some(watch), Some(_)) if watch.as_u64().is_some() => continue,
                _ => break frame,
            }
        };
        let id = field(&reply, "id").and_then(Value::as_u64).unwrap_or_else(|| panic!("reply #{k} has no id: {reply}"));
        let (ok, err) = (field(&reply, "ok"), field(&reply, "err"));
        assert!(ok.is_some() != err.is_some(), "reply #{k} needs exactly one of ok/err: {reply}");
        let code = err.map(|e| {
            assert!(field(e, "msg").is_some_and(Value::is_str), "reply #{k}: err without msg: {reply}");
            let code = field(e, "code").and_then(Value::as_str).unwrap_or_else(|| panic!("reply #{k}: no code"));
            assert!(ALL_CODES.contains(&code), "reply #{k}: code {code} is not a protocol code");
            code
        });
        match want {
            Expect::Pong(want) => {
                assert_eq!(id, *want, "reply #{k} (ping) out of order: {reply}");
                assert_eq!(ok.and_then(Value::as_str), Some("pong"), "reply #{k}: {reply}");
            }
            Expect::Accepted(want) => {
                assert_eq!(id, *want, "reply #{k} out of order: {reply}");
                assert!(
                    !matches!(code, Some("bad_frame" | "unknown_op" | "too_large")),
                    "reply #{k}: a request the decoder accepts was refused: {reply}"
                );
            }
            Expect::Refused(want, want_code) => {
                assert_eq!((id, code), (*want, Some(*want_code)), "reply #{k}: {reply}");
            }
        }
    }
    drop(writer.await.expect("writer task"));
    let mut fresh = server.client().await;
    assert_eq!(fresh.ping().await.expect("fresh connection ping"), "pong");
}
