//! Checks shared by the fuzz targets (`fuzz_targets/*.rs`) and the CI
//! property tests (`tests/fuzz_props.rs` includes this file with `#[path]`),
//! so a fuzzer finding and its regression test check exactly the same thing.
//!
//! - [`check_parse`]: `request::parse` on arbitrary bytes never panics; an
//!   `Ok` request satisfies every limit of `shared/protocol.md` (checked here
//!   independently of the server's own validators) and survives a re-encode
//!   round trip; an `Err` carries a protocol code consistent with its id/op.
//! - [`check_frames`]: `FrameReader` on arbitrary bytes, delivered in
//!   arbitrary chunk sizes, yields exactly the events of a 20-line reference
//!   splitter, never reads past a buffered frame, and every frame it yields
//!   goes through [`check_parse`].
//! - [`encode_request`] / [`seed_requests`]: valid requests of every op,
//!   built with rmpv, for seed corpora and round trips.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rankd::protocol::request::{parse, Op, Rejected, Request, View, WatchSpec, WatchTarget};
use rankd::protocol::ScoreInput;
use rankd_client::frame::{FrameError, FrameReader};
use rankd_client::protocol::{MAX_AROUND, MAX_SET_MANY, MAX_TOP_LIMIT};
use rankd_shards::{BoardConfig, Mode, Order, Ties, Wid, Window};
use rmpv::Value;
use tokio::io::{AsyncRead, ReadBuf};

/// Error codes a request decoder may answer with (protocol.md's code table,
/// minus the ones only execution can produce).
pub const DECODE_CODES: [&str; 4] = ["bad_frame", "bad_request", "unknown_op", "too_large"];

/// Every op of protocol.md, written out here so the checks do not take the
/// server's word for them.
pub const OP_NAMES: [&str; 17] = [
    "ping",
    "auth",
    "create_board",
    "drop_board",
    "boards",
    "set",
    "set_many",
    "get",
    "remove",
    "count",
    "rank",
    "rank_of_score",
    "top",
    "around",
    "ranks",
    "watch",
    "unwatch",
];

/// Every code of protocol.md.
pub const ALL_CODES: [&str; 8] =
    ["bad_frame", "bad_request", "unknown_op", "too_large", "conflict", "unauthorized", "overloaded", "internal"];

/// Longest error message a rejected frame may carry: messages echo at most
/// 64 characters of client text (≤ 256 bytes of UTF-8) plus fixed prose.
const MAX_ERROR_MSG: usize = 512;

// ------------------------------------------------------------------ parse --

/// A board name per protocol.md: 1-128 bytes of `[A-Za-z0-9_.:-]`.
pub fn protocol_board_ok(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// A player name per protocol.md: 1-256 bytes of UTF-8.
pub fn protocol_player_ok(name: &str) -> bool {
    (1..=256).contains(&name.len())
}

fn check_view(view: &View) {
    assert!(view.period <= 0, "period must be 0 or negative, got {}", view.period);
}

/// Asserts every protocol limit on a decoded request.
pub fn check_request_invariants(req: &Request) {
    let name = req.op.kind().name();
    assert!(OP_NAMES.contains(&name), "op {name} is not a protocol op");
    let board_ok = |b: &str| assert!(protocol_board_ok(b), "invalid board name accepted: {b:?}");
    let player_ok = |p: &str| assert!(protocol_player_ok(p), "invalid player name accepted: {p:?}");
    match &req.op {
        Op::Ping | Op::Auth { .. } | Op::Backup => {}
        Op::Boards { prefix, after, limit } => {
            assert!(prefix.len() <= 128 && after.as_ref().is_none_or(|a| a.len() <= 128), "long prefix or after");
            assert!((1..=10_000).contains(limit), "boards limit {limit} accepted");
        }
        Op::CreateBoard { board, config } => {
            board_ok(board);
            assert!((1..=4).contains(&config.windows.len()), "windows: {:?}", config.windows);
            for (i, w) in config.windows.iter().enumerate() {
                assert!(!config.windows[..i].contains(w), "duplicate window accepted: {:?}", config.windows);
            }
            assert!((1..=1000).contains(&config.keep), "keep out of range: {}", config.keep);
            if config.has_fields() {
                assert_eq!(rankd_shards::fields::check(&config.fields), Ok(()), "bad fields accepted");
                assert_eq!(config.order, Order::Desc, "a board with fields ranks its packed scores high-first");
            }
        }
        Op::DropBoard { board }
        | Op::Count { board, .. }
        | Op::RankOfScore { board, .. }
        | Op::ApproxRankOfScore { board, .. } => board_ok(board),
        Op::Set { board, player, .. }
        | Op::Get { board, player, .. }
        | Op::Remove { board, player, .. }
        | Op::Rank { board, player, .. }
        | Op::ApproxRank { board, player, .. } => {
            board_ok(board);
            player_ok(player);
        }
        Op::Watch(spec) => {
            board_ok(&spec.board);
            match &spec.target {
                WatchTarget::Top(n) => assert!((1..=100).contains(n), "watch top {n} accepted"),
                WatchTarget::Player(player) => player_ok(player),
            }
            let interval = spec.interval.as_millis();
            assert!((10..=60_000).contains(&interval), "watch interval {interval} ms accepted");
        }
        Op::Unwatch { .. } => {}
        Op::SetMany { board, entries, .. } => {
            board_ok(board);
            assert!(entries.len() <= MAX_SET_MANY, "set_many with {} entries accepted", entries.len());
            for (player, _) in entries {
                player_ok(player);
            }
        }
        Op::Top { board, limit, .. } => {
            board_ok(board);
            assert!(*limit as u64 <= MAX_TOP_LIMIT, "top limit {limit} accepted");
        }
        Op::Ranks { board, players, .. } => {
            board_ok(board);
            assert!((1..=1000).contains(&players.len()), "ranks of {} players accepted", players.len());
            players.iter().for_each(|p| player_ok(p));
        }
        Op::Around { board, player, before, after, .. } => {
            board_ok(board);
            player_ok(player);
            assert!(*before as u64 <= MAX_AROUND && *after as u64 <= MAX_AROUND, "around {before}/{after} accepted");
        }
    }
    let scores: Vec<&ScoreInput> = match &req.op {
        Op::Set { score, .. } | Op::RankOfScore { score, .. } => vec![score],
        Op::SetMany { entries, .. } => entries.iter().map(|(_, score)| score).collect(),
        _ => Vec::new(),
    };
    for score in scores {
        if let ScoreInput::Map(values) = score {
            assert!(values.len() <= 4, "a score of {} fields accepted", values.len());
            for (i, (name, _)) in values.iter().enumerate() {
                assert!(values[..i].iter().all(|(seen, _)| seen != name), "field {name} given twice accepted");
            }
        }
    }
    match &req.op {
        Op::Set { wid, .. } | Op::SetMany { wid, .. } | Op::Remove { wid, .. } => {
            if let Some(wid) = wid {
                assert!((1..=64).contains(&wid.as_str().len()), "wid of {} bytes accepted", wid.as_str().len());
            }
        }
        _ => {}
    }
    match &req.op {
        Op::Watch(spec) => check_view(&spec.view),
        Op::Get { view, .. }
        | Op::Count { view, .. }
        | Op::Rank { view, .. }
        | Op::RankOfScore { view, .. }
        | Op::ApproxRank { view, .. }
        | Op::ApproxRankOfScore { view, .. }
        | Op::Top { view, .. }
        | Op::Around { view, .. }
        | Op::Ranks { view, .. } => check_view(view),
        _ => {}
    }
}

/// Asserts a rejection is well-formed.
pub fn check_rejection(rejected: &Rejected) {
    let code = rejected.error.code().name();
    assert!(DECODE_CODES.contains(&code), "decoder answered code {code}");
    let op = rejected.op.map(|op| op.name());
    if let Some(op) = op {
        assert!(OP_NAMES.contains(&op), "rejection names op {op:?}");
    }
    let msg = rejected.error.to_string();
    assert!(msg.len() <= MAX_ERROR_MSG, "error message of {} bytes echoes too much client text", msg.len());
    match code {
        "bad_frame" => assert_eq!((rejected.id, op), (0, None), "bad_frame must carry id 0, no op"),
        "unknown_op" => assert_eq!(op, None, "unknown_op names a known op"),
        // Either `entries` or `players` over its limit (the id and op were
        // read), or the whole frame over the decoder's value budget (refused
        // before anything was read).
        "too_large" => assert!(
            matches!(op, Some("set_many" | "ranks")) || (rejected.id, op) == (0, None),
            "too_large for op {:?} with id {}",
            rejected.op,
            rejected.id
        ),
        _ => {}
    }
}

/// How many msgpack values (at any depth) `buf` holds, if it is well-formed
/// enough to walk; no allocation. `Err(n)`: malformed after `n` values.
pub fn count_values(buf: &[u8]) -> Result<u64, u64> {
    let mut seen = 0;
    count_values_inner(buf, &mut seen).ok_or(seen)
}

fn count_values_inner(mut buf: &[u8], count: &mut u64) -> Option<u64> {
    let mut pending: u64 = 1;
    let take = |n: usize, buf: &mut &[u8]| -> Option<u64> {
        let (head, rest) = buf.split_at_checked(n)?;
        *buf = rest;
        Some(head.iter().fold(0, |acc, b| acc << 8 | u64::from(*b)))
    };
    while pending > 0 {
        pending -= 1;
        *count += 1;
        let marker = take(1, &mut buf)? as u8;
        let (skip, children): (u64, u64) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
            0xc1 => return None,
            0xc4 | 0xd9 => (take(1, &mut buf)?, 0),
            0xc5 | 0xda => (take(2, &mut buf)?, 0),
            0xc6 | 0xdb => (take(4, &mut buf)?, 0),
            0xc7 => (take(1, &mut buf)? + 1, 0),
            0xc8 => (take(2, &mut buf)? + 1, 0),
            0xc9 => (take(4, &mut buf)? + 1, 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, take(2, &mut buf)?),
            0xdd => (0, take(4, &mut buf)?),
            0xde => (0, 2 * take(2, &mut buf)?),
            0xdf => (0, 2 * take(4, &mut buf)?),
        };
        buf = buf.get(usize::try_from(skip).ok()?..)?;
        // (No early "more values announced than bytes left" check: the walk
        // counts how far a truncated frame gets, one byte per value at least.)
        pending += children;
    }
    Some(*count)
}

/// Runs `parse` on `body` and checks its result; returns the request if Ok.
pub fn check_parse(body: &[u8]) -> Option<Request> {
    let result = parse(body);
    match &result {
        Ok(req) => {
            check_request_invariants(req);
            // Only a map can be a request.
            assert!(matches!(body.first(), Some(0x80..=0x8f | 0xde | 0xdf)), "a non-map frame was accepted");
            // Round trip: the canonical encoding of what was decoded decodes
            // to the same request.
            let again = parse(&encode_request(req));
            assert_eq!(again.as_ref(), Ok(req), "re-encoded request does not parse back the same");
        }
        Err(rejected) => {
            check_rejection(rejected);
            // The decoder's value budget never refuses what a full set_many
            // (3 values per entry) needs.
            if rejected.error.code().name() == "too_large" && rejected.op.is_none() {
                // (A malformed frame may be refused either way once it has
                // shown more values than the budget.)
                let values = count_values(body).unwrap_or_else(|seen| seen);
                assert!(values > 3 * MAX_SET_MANY as u64 + 16, "a frame of {values} values refused as too_large");
            }
        }
    }
    result.ok()
}

// ----------------------------------------------------------------- encode --

fn view_fields(view: &View, out: &mut Vec<(&'static str, Value)>) {
    if let Some(window) = view.window {
        out.push(("window", Value::from(window.as_str())));
    }
    out.push(("period", Value::from(view.period)));
}

/// The canonical msgpack encoding of a request (every field explicit).
pub fn request_value(req: &Request) -> Value {
    let mut f: Vec<(&'static str, Value)> = Vec::new();
    let s = |v: &str| Value::from(v);
    match &req.op {
        Op::Ping | Op::Backup => {}
        Op::Boards { prefix, after, limit } => {
            if !prefix.is_empty() {
                f.push(("prefix", s(prefix)));
            }
            f.extend(after.iter().map(|after| ("after", s(after))));
            f.push(("limit", Value::from(*limit as u64)));
        }
        Op::Auth { token } => f.push(("token", s(&token.0))),
        Op::CreateBoard { board, config } => {
            f.push(("board", s(board)));
            f.push(("order", s(config.order.as_str())));
            f.push(("ties", s(config.ties.as_str())));
            f.push(("windows", Value::Array(config.windows.iter().map(|w| s(w.as_str())).collect())));
            f.push(("keep", Value::from(config.keep)));
            if config.has_fields() {
                let field = |fd: &rankd_shards::fields::Field| {
                    let pairs = [
                        ("name", s(&fd.name)),
                        ("order", s(fd.order.as_str())),
                        ("min", Value::from(fd.min)),
                        ("max", Value::from(fd.max)),
                    ];
                    Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
                };
                f.push(("fields", Value::Array(config.fields.iter().map(field).collect())));
            }
        }
        Op::DropBoard { board } => f.push(("board", s(board))),
        Op::Set { board, player, score, mode, wid } => {
            f.extend([("board", s(board)), ("player", s(player)), ("score", score_value(score))]);
            f.push(("mode", s(mode.as_str())));
            f.extend(wid.iter().map(|wid| ("wid", s(wid.as_str()))));
        }
        Op::SetMany { board, entries, mode, wid } => {
            f.push(("board", s(board)));
            let list = entries.iter().map(|(p, sc)| Value::Array(vec![s(p), score_value(sc)])).collect();
            f.push(("entries", Value::Array(list)));
            f.push(("mode", s(mode.as_str())));
            f.extend(wid.iter().map(|wid| ("wid", s(wid.as_str()))));
        }
        Op::Get { board, player, view } | Op::Rank { board, player, view } => {
            f.extend([("board", s(board)), ("player", s(player))]);
            view_fields(view, &mut f);
        }
        Op::Remove { board, player, wid } => {
            f.extend([("board", s(board)), ("player", s(player))]);
            f.extend(wid.iter().map(|wid| ("wid", s(wid.as_str()))));
        }
        Op::Watch(WatchSpec { board, target, view, interval }) => {
            f.push(("board", s(board)));
            match target {
                WatchTarget::Top(n) => f.push(("top", Value::from(*n as u64))),
                WatchTarget::Player(player) => f.push(("player", s(player))),
            }
            f.push(("interval_ms", Value::from(interval.as_millis() as u64)));
            view_fields(view, &mut f);
        }
        Op::Unwatch { watch } => f.push(("watch", Value::from(*watch))),
        Op::Ranks { board, players, view } => {
            f.push(("board", s(board)));
            f.push(("players", Value::Array(players.iter().map(|p| s(p)).collect())));
            view_fields(view, &mut f);
        }
        Op::Count { board, view } => {
            f.push(("board", s(board)));
            view_fields(view, &mut f);
        }
        Op::RankOfScore { board, score, view } => {
            f.extend([("board", s(board)), ("score", score_value(score))]);
            view_fields(view, &mut f);
        }
        Op::ApproxRank { board, player, view } => {
            f.extend([("board", s(board)), ("player", s(player)), ("approx", Value::from(true))]);
            view_fields(view, &mut f);
        }
        Op::ApproxRankOfScore { board, score, view } => {
            f.extend([("board", s(board)), ("score", score_value(score)), ("approx", Value::from(true))]);
            view_fields(view, &mut f);
        }
        Op::Top { board, limit, offset, view } => {
            f.extend([("board", s(board)), ("limit", Value::from(*limit as u64)), ("offset", Value::from(*offset))]);
            view_fields(view, &mut f);
        }
        Op::Around { board, player, before, after, view } => {
            f.extend([("board", s(board)), ("player", s(player))]);
            f.extend([("before", Value::from(*before as u64)), ("after", Value::from(*after as u64))]);
            view_fields(view, &mut f);
        }
    }
    let mut pairs = vec![(s("id"), Value::from(req.id)), (s("op"), s(req.op.kind().name()))];
    pairs.extend(f.into_iter().map(|(k, v)| (s(k), v)));
    Value::Map(pairs)
}

/// A score as a request carries it: an integer, or a map of field values.
pub fn score_value(score: &ScoreInput) -> Value {
    match score {
        ScoreInput::Int(score) => Value::from(*score),
        ScoreInput::Map(values) => {
            Value::Map(values.iter().map(|(name, v)| (Value::from(name.as_str()), Value::from(*v))).collect())
        }
    }
}

/// msgpack bytes of one value.
pub fn encode_value(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encoding into a Vec cannot fail");
    out
}

/// [`request_value`], encoded.
pub fn encode_request(req: &Request) -> Vec<u8> {
    encode_value(&request_value(req))
}

/// A frame: 4-byte big-endian length, then `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Valid requests of every op (with optional fields both present and absent),
/// for seed corpora and tests.
pub fn seed_requests() -> Vec<Request> {
    let b = || "board-1".to_string();
    let p = || "player_1".to_string();
    let view = View { window: Some(Window::Daily), period: -1 };
    let config = BoardConfig {
        order: Order::Asc,
        ties: Ties::Ordinal,
        windows: vec![Window::All, Window::Daily, Window::Weekly, Window::Monthly],
        keep: 7,
        fields: Vec::new(),
    };
    let composite = BoardConfig {
        fields: vec![
            rankd_shards::fields::Field { name: "trophies".into(), order: Order::Desc, min: 0, max: 1 << 30 },
            rankd_shards::fields::Field { name: "time_ms".into(), order: Order::Asc, min: -1, max: 1 << 32 },
        ],
        ..BoardConfig::default()
    };
    let ops = vec![
        Op::Ping,
        Op::Auth { token: rankd::security::Secret("s3cret".into()) },
        Op::CreateBoard { board: b(), config: BoardConfig::default() },
        Op::CreateBoard { board: "a.b:c_d-E9".into(), config },
        Op::CreateBoard { board: "lvl:1".into(), config: composite },
        Op::Set {
            board: "lvl:1".into(),
            player: p(),
            score: ScoreInput::Map(vec![("time_ms".into(), 61_000), ("trophies".into(), 3)]),
            mode: Mode::Incr,
            wid: None,
        },
        Op::CreateBoard {
            board: b(),
            config: BoardConfig { ties: Ties::Dense, windows: vec![Window::Weekly], keep: 1000, ..Default::default() },
        },
        Op::DropBoard { board: b() },
        Op::Boards { prefix: String::new(), after: None, limit: 1000 },
        Op::Boards { prefix: "lvl".into(), after: Some("lvl10".into()), limit: 10_000 },
        Op::Set { board: b(), player: p(), score: 42.into(), mode: Mode::Set, wid: None },
        Op::Set { board: b(), player: "ünï☃".into(), score: i64::MIN.into(), mode: Mode::Best, wid: None },
        Op::Set {
            board: b(),
            player: p(),
            score: i64::MAX.into(),
            mode: Mode::Incr,
            wid: Some(Wid::from("retry-7f3a")),
        },
        Op::SetMany { board: b(), entries: vec![], mode: Mode::Set, wid: None },
        Op::SetMany {
            board: b(),
            entries: vec![("a".into(), 1.into()), ("b".into(), (-2).into()), ("c".into(), (1 << 40).into())],
            mode: Mode::Best,
            wid: Some(Wid::from(&*"w".repeat(64))),
        },
        Op::Get { board: b(), player: p(), view: View::default() },
        Op::Get { board: b(), player: p(), view },
        Op::Remove { board: b(), player: p(), wid: None },
        Op::Remove { board: b(), player: p(), wid: Some(Wid::from("r")) },
        Op::Watch(WatchSpec { board: b(), target: WatchTarget::Top(100), view, interval: Duration::from_millis(10) }),
        Op::Watch(WatchSpec {
            board: b(),
            target: WatchTarget::Player(p()),
            view: View::default(),
            interval: Duration::from_millis(60_000),
        }),
        Op::Unwatch { watch: u64::MAX },
        Op::Ranks { board: b(), players: vec![p(), "q".into(), p()], view },
        Op::Count { board: b(), view: View::default() },
        Op::Count { board: b(), view: View { window: Some(Window::Monthly), period: -12 } },
        Op::Rank { board: b(), player: p(), view },
        Op::RankOfScore { board: b(), score: (-7).into(), view: View::default() },
        Op::ApproxRank { board: b(), player: p(), view },
        Op::ApproxRankOfScore { board: b(), score: i64::MIN.into(), view: View::default() },
        Op::ApproxRankOfScore {
            board: b(),
            score: ScoreInput::Map(vec![("trophies".into(), 1), ("time_ms".into(), 2)]),
            view: View::default(),
        },
        Op::Top { board: b(), limit: 10, offset: 0, view: View::default() },
        Op::Top { board: b(), limit: 1000, offset: u64::MAX, view },
        Op::Around { board: b(), player: p(), before: 5, after: 500, view: View::default() },
    ];
    ops.into_iter().enumerate().map(|(i, op)| Request { id: [0, 1, 255, 65_536, u64::MAX][i % 5], op }).collect()
}

// ----------------------------------------------------------------- frames --

/// A reader that is always ready and hands out `data` in chunks of at most
/// `chunk` bytes, counting its reads.
struct Chunked<'a> {
    data: &'a [u8],
    chunk: usize,
    reads: &'a Cell<usize>,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let n = self.data.len().min(self.chunk).min(buf.remaining());
        let (now, rest) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = rest;
        self.reads.set(self.reads.get() + 1);
        Poll::Ready(Ok(()))
    }
}

/// One outcome of reading a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameEvent {
    /// A frame body.
    Frame(Vec<u8>),
    /// A zero length prefix (the stream continues).
    Empty,
    /// A length over the limit (the server answers and closes).
    TooLarge(usize),
    /// The stream ended mid-frame (the server drops the connection).
    Truncated,
    /// A clean end of stream.
    End,
}

/// The reference splitter: what protocol.md says a stream of bytes means.
pub fn reference_frames(mut data: &[u8], max_frame: usize) -> Vec<FrameEvent> {
    let mut out = Vec::new();
    loop {
        let Some((header, rest)) = data.split_first_chunk::<4>() else {
            out.push(if data.is_empty() { FrameEvent::End } else { FrameEvent::Truncated });
            return out;
        };
        let len = u32::from_be_bytes(*header) as usize;
        if len > max_frame {
            out.push(FrameEvent::TooLarge(len));
            return out;
        }
        if len == 0 {
            out.push(FrameEvent::Empty);
        } else if rest.len() < len {
            out.push(FrameEvent::Truncated);
            return out;
        } else {
            out.push(FrameEvent::Frame(rest[..len].to_vec()));
        }
        data = &rest[len..];
    }
}

/// Reads `data` through a [`FrameReader`] with `max_frame`, the stream
/// arriving in reads of at most `chunk` bytes; checks the events against
/// [`reference_frames`] and runs every frame through [`check_parse`].
/// Returns the events.
pub fn check_frames(data: &[u8], max_frame: usize, chunk: usize) -> Vec<FrameEvent> {
    assert!(max_frame > 0 && chunk > 0);
    let reads = Cell::new(0);
    let mut reader = FrameReader::new(Chunked { data, chunk, reads: &reads }, max_frame);
    let mut cx = Context::from_waker(Waker::noop());
    let mut events = Vec::new();
    // Each call consumes at least one read or one header, so this bounds the loop.
    for _ in 0..=data.len() + 2 {
        let buffered = reader.has_buffered_frame();
        let reads_before = reads.get();
        let result = {
            let mut next = std::pin::pin!(reader.next_frame());
            match next.as_mut().poll(&mut cx) {
                Poll::Ready(result) => result,
                Poll::Pending => panic!("FrameReader returned Pending on an always-ready reader"),
            }
        };
        if buffered {
            assert_eq!(reads.get(), reads_before, "has_buffered_frame() was true but next_frame read");
        }
        let (event, stop) = match result {
            Ok(Some(body)) => {
                assert!(!body.is_empty() && body.len() <= max_frame, "frame of {} bytes, max {max_frame}", body.len());
                check_parse(&body);
                (FrameEvent::Frame(body.to_vec()), false)
            }
            Ok(None) => (FrameEvent::End, true),
            Err(FrameError::Empty) => (FrameEvent::Empty, false),
            Err(FrameError::TooLarge { len, max }) => {
                assert!(len > max && max == max_frame, "TooLarge {{ len: {len}, max: {max} }}");
                (FrameEvent::TooLarge(len), true)
            }
            Err(FrameError::Truncated) => (FrameEvent::Truncated, true),
            Err(FrameError::Io(e)) => panic!("I/O error from an in-memory reader: {e}"),
        };
        if buffered {
            assert!(matches!(event, FrameEvent::Frame(_) | FrameEvent::Empty | FrameEvent::TooLarge(_)));
        }
        events.push(event);
        if stop {
            let expected = reference_frames(data, max_frame);
            assert_eq!(events, expected, "FrameReader disagrees with the reference splitter");
            return events;
        }
    }
    panic!("FrameReader produced more events than the input can hold");
}
