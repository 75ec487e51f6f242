//! `docs/PROTOCOL.md` against the code: every op the server knows
//! (`OpKind::ALL`) has its section and every error code (`ErrorCode::ALL`)
//! its row, the limits it gives are the ones in `client/src/protocol.rs`,
//! and its worked example decodes (frame length, then msgpack) to the maps
//! the page says — bytes the Rust client and the server still produce
//! exactly.

use rankd::error::Error;
use rankd::protocol::{encode_error, encode_reply, request, Reply};
use rankd_client::protocol::{DEFAULT_MAX_FRAME, MAX_AROUND, MAX_SET_MANY, MAX_TOP_LIMIT};
use rankd_client::{set_call, ErrorCode, Mode, OpKind};
use serde_json::Value as Json;

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("read {DOC_PATH}: {e}"))
}

/// `n` as the page writes numbers: thousands grouped by spaces from five
/// digits on (1000, 10 000).
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    if digits.len() <= 4 {
        return digits;
    }
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}

/// The fenced code blocks of `text`: (info string, body, the text after the
/// closing fence).
fn code_blocks(text: &str) -> Vec<(&str, String, &str)> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("\n```") {
        let after_fence = &rest[start + 4..];
        let (info, body_and_rest) = after_fence.split_once('\n').expect("a fence line ends");
        let end = body_and_rest.find("\n```").expect("every code block is closed");
        let body = body_and_rest[..end].to_string();
        let after = body_and_rest[end + 4..].split_once('\n').map_or("", |(_, after)| after);
        blocks.push((info.trim(), body, after));
        rest = after;
    }
    blocks
}

/// The bytes of a `hex` block: each line's hex pairs, up to its `#` comment.
fn hex_bytes(body: &str) -> Vec<u8> {
    body.lines()
        .flat_map(|line| line.split('#').next().unwrap_or("").split_whitespace())
        .map(|pair| {
            assert_eq!(pair.len(), 2, "`{pair}` is not one byte in hex");
            u8::from_str_radix(pair, 16).unwrap_or_else(|e| panic!("`{pair}` is not hex: {e}"))
        })
        .collect()
}

/// The body of one frame, checking that its length prefix covers exactly
/// the rest.
fn frame_body(frame: &[u8]) -> &[u8] {
    assert!(frame.len() >= 4, "a frame starts with 4 bytes of length");
    let len = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
    assert_eq!(len, frame.len() - 4, "the length prefix counts the bytes that follow it");
    &frame[4..]
}

/// One frame's msgpack value, as JSON; the body must hold exactly one value.
fn decode(frame: &[u8]) -> Json {
    let mut body = frame_body(frame);
    let value = rmpv::decode::read_value(&mut body).expect("the body is msgpack");
    assert!(body.is_empty(), "the body holds exactly one msgpack value");
    serde_json::to_value(&value).expect("a msgpack map with string keys is JSON")
}

/// The first code span of `text` (across line breaks), parsed as JSON.
fn first_span_as_json(text: &str) -> Json {
    let start = text.find('`').expect("a code span follows the example") + 1;
    let end = start + text[start..].find('`').expect("the code span is closed");
    let span = text[start..end].replace('\n', " ");
    serde_json::from_str(&span).unwrap_or_else(|e| panic!("`{span}` is not JSON: {e}"))
}

#[test]
fn every_op_has_its_section() {
    let doc = doc();
    for op in OpKind::ALL {
        let name = op.name();
        assert!(doc.contains(&format!("`{name}`")), "PROTOCOL.md names the op `{name}` in a code span");
        assert!(doc.contains(&format!("\n### `{name}`\n")), "PROTOCOL.md has a section `### `{name}``");
        assert!(doc.contains(&format!("\n| `{name}` | ")), "PROTOCOL.md lists `{name}` in the table of ops");
    }
    // ...and no section for an op the server does not know.
    let operations = doc.split("\n## Operations\n").nth(1).expect("an Operations chapter");
    let operations = operations.split("\n## ").next().unwrap_or(operations);
    for heading in operations.lines().filter_map(|line| line.strip_prefix("### `")) {
        let name = heading.trim_end_matches('`');
        assert!(OpKind::from_name(name).is_some(), "PROTOCOL.md has a section for `{name}`, which is no op");
    }
}

#[test]
fn every_error_code_has_its_row() {
    let doc = doc();
    for code in ErrorCode::ALL {
        let name = code.name();
        assert!(doc.contains(&format!("`{name}`")), "PROTOCOL.md names the error code `{name}` in a code span");
        assert!(doc.contains(&format!("\n| `{name}` | ")), "PROTOCOL.md's table of error codes has `{name}`");
    }
}

#[test]
fn the_limits_are_the_codes() {
    let doc = doc();
    let rows = [
        format!("| `set_many` `entries` | {} |", grouped(MAX_SET_MANY as u64)),
        format!("| `top` `limit` | {} |", grouped(MAX_TOP_LIMIT)),
        format!("| `around` `before`, `after` | {} each |", grouped(MAX_AROUND)),
    ];
    for row in rows {
        assert!(doc.contains(&row), "PROTOCOL.md's limits table has the row `{row}`");
    }
    assert!(doc.contains(&format!("1 MiB ({})", grouped(DEFAULT_MAX_FRAME as u64))), "the default max_frame");
    // The value budget of a request (src/protocol/request/shape.rs): 3 per entry
    // of a full set_many, plus 256.
    let budget = 3 * MAX_SET_MANY as u64 + 256;
    assert!(doc.contains(&format!("| {} |", grouped(budget))), "the msgpack value budget, {budget}");
}

#[test]
fn the_worked_example_decodes_to_what_the_page_says() {
    let doc = doc();
    let blocks = code_blocks(&doc);
    let hex: Vec<_> = blocks.iter().filter(|(info, ..)| *info == "hex").collect();
    assert_eq!(hex.len(), 2, "the worked example is two ```hex blocks, a request frame and its response");

    // The request: the map the sentence after it gives, and what the Rust
    // client sends for that call.
    let (_, body, after) = hex[0];
    let request = hex_bytes(body);
    let decoded = decode(&request);
    let said = first_span_as_json(after);
    assert_eq!(decoded, said, "the request frame decodes to the map the page gives");
    let want = serde_json::json!({"id": 1, "op": "set", "board": "arena", "player": "alice", "score": 1200});
    assert_eq!(decoded, want);
    let mut sent = Vec::new();
    set_call("arena", "alice", 1200, Mode::Set).encode(1, &mut sent);
    assert_eq!(request, sent, "the Rust client encodes that call to exactly these bytes");
    assert!(matches!(
        request::parse(frame_body(&request)),
        Ok(request::Request { id: 1, op: request::Op::Set { score: rankd::protocol::ScoreInput::Int(1200), .. } })
    ));

    // The response: what the page says, and what the server encodes.
    let (_, body, after) = hex[1];
    let response = hex_bytes(body);
    let decoded = decode(&response);
    assert_eq!(decoded, first_span_as_json(after), "the response frame decodes to the map the page gives");
    assert_eq!(decoded, serde_json::json!({"id": 1, "ok": 1200}));
    let mut answered = Vec::new();
    encode_reply(&mut answered, 1, &Reply::Score(1200));
    assert_eq!(response, answered, "the server encodes that reply to exactly these bytes");

    // The error reply shown after them is the server's.
    assert!(doc.contains(r#"For `{"id": 2, "op": "fly"}` the server answers"#), "the request the error answers");
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, &rmpv::Value::Map(vec![("id".into(), 2.into()), ("op".into(), "fly".into())]))
        .expect("encode");
    let rejected = request::parse(&body).expect_err("`fly` is no op");
    assert_eq!((rejected.id, rejected.error.code()), (2, ErrorCode::UnknownOp));
    let mut answered = Vec::new();
    encode_error(&mut answered, rejected.id, &rejected.error);
    let shown = blocks
        .iter()
        .find(|(info, body, _)| info.is_empty() && body.contains("unknown_op"))
        .map(|(_, body, _)| serde_json::from_str::<Json>(body).expect("the error reply shown is JSON"))
        .expect("PROTOCOL.md shows the error reply to `fly`");
    assert_eq!(decode(&answered), shown, "the error reply shown is the server's");
    assert_eq!(rejected.error, Error::UnknownOp("fly".into()));
}
