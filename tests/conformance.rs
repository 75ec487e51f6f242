//! The shared conformance cases (`clients/conformance/cases.json`, format
//! in `clients/conformance/README.md`), run with the Rust client against
//! the real server: every step's request through `Client::call` (a `Call`
//! built from the step's JSON map, the client choosing the id), its `ok`
//! compared by value (integers by value, maps whatever their key order) or
//! its `err` code checked. The Node and Python clients' tests run the same
//! file, so the three clients and the server agree answer for answer.
//!
//! The cases run on a fresh server without a token: one request at a time
//! on one connection, and again as ONE pipeline on another fresh server
//! (requests take effect in the order sent, so the answers are the same).
//! A test without a server checks that the file is well formed and covers
//! every op, tie rule, order and mode of protocol version 1.

mod common;

use common::ops::{assert_every_op_is_tried, same_value};
use rankd_client::{Call, ClientError, ErrorCode, Mode, OpKind, Order, Ties};
use rmpv::Value;
use serde_json::{Map, Value as Json};

/// The cases, shared by every client's tests.
const CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/conformance/cases.json");

/// What a step expects.
#[derive(Debug)]
enum Expect {
    /// `ok` with this result.
    Ok(Value),
    /// `err` with this code.
    Err(ErrorCode),
}

/// One step of the cases.
#[derive(Debug)]
struct Step {
    name: String,
    /// The request map, `op` included, `id` not.
    request: Map<String, Json>,
    expect: Expect,
}

impl Step {
    fn op(&self) -> &str {
        self.request["op"].as_str().expect("checked by load")
    }

    /// The request as the client sends it: `op`, then every other field in
    /// the file's order (the client adds `id`).
    fn call(&self) -> Call {
        self.request
            .iter()
            .filter(|(name, _)| *name != "op")
            .fold(Call::named(self.op()), |call, (name, value)| call.with(name, value))
    }

    /// Whether `got` is what the step expects; the mismatch otherwise.
    fn check(&self, got: Result<Value, ClientError>) -> Result<(), String> {
        match (&self.expect, got) {
            (Expect::Ok(want), Ok(value)) if same_value(&value, want) => Ok(()),
            (Expect::Err(code), Err(error)) if error.error_code() == Some(*code) => Ok(()),
            (Expect::Ok(want), got) => Err(format!("expected ok {want}, got {}", shown(&got))),
            (Expect::Err(code), got) => Err(format!("expected err {code}, got {}", shown(&got))),
        }
    }
}

fn shown(got: &Result<Value, ClientError>) -> String {
    match got {
        Ok(value) => format!("ok {value}"),
        Err(error) => format!("error {error}"),
    }
}

/// A JSON value as the msgpack value a server answers with: integers as
/// integers (unsigned when non-negative, as rmpv normalises them), other
/// numbers as floats.
fn to_msgpack(json: &Json) -> Value {
    match json {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Value::from(u),
            (None, Some(i), _) => Value::from(i),
            (None, None, Some(f)) => Value::from(f),
            _ => panic!("a JSON number that is none of u64, i64, f64: {n}"),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::Array(items.iter().map(to_msgpack).collect()),
        Json::Object(map) => Value::Map(map.iter().map(|(k, v)| (Value::from(k.as_str()), to_msgpack(v))).collect()),
    }
}

/// Reads the cases, checking the format strictly (so a case the other
/// clients' runners would read differently fails here first).
fn load() -> Vec<Step> {
    let text = std::fs::read_to_string(CASES).unwrap_or_else(|e| panic!("read {CASES}: {e}"));
    let file: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{CASES} is not JSON: {e}"));
    let file = file.as_object().expect("the cases file is a JSON object");
    let mut keys: Vec<&str> = file.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["steps", "version"], "the cases file has exactly `version` and `steps`");
    assert_eq!(file["version"], Json::from(1), "format version");
    let steps = file["steps"].as_array().expect("`steps` is a list");
    let mut names = std::collections::HashSet::new();
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let step = step.as_object().unwrap_or_else(|| panic!("step {i} is not an object"));
            let name = step.get("name").and_then(Json::as_str).unwrap_or_else(|| panic!("step {i} has no `name`"));
            assert!(names.insert(name.to_string()), "two steps are named {name:?}");
            let request = step
                .get("request")
                .and_then(Json::as_object)
                .unwrap_or_else(|| panic!("step {name:?}: `request` is not an object"));
            assert!(request.get("op").is_some_and(Json::is_string), "step {name:?}: the request's `op` is a string");
            assert!(!request.contains_key("id"), "step {name:?}: the runner chooses the id, the request has none");
            assert!(
                request.values().all(|v| !v.is_null()),
                "step {name:?}: no request field is null (clients leave those out)"
            );
            let expect = match (step.get("ok"), step.get("err")) {
                (Some(result), None) => Expect::Ok(to_msgpack(result)),
                (None, Some(Json::String(code))) => Expect::Err(
                    ErrorCode::from_name(code).unwrap_or_else(|| panic!("step {name:?}: unknown error code {code:?}")),
                ),
                _ => panic!("step {name:?}: exactly one of `ok` and `err` (a code string)"),
            };
            let extra: Vec<&String> =
                step.keys().filter(|k| !["name", "request", "ok", "err"].contains(&k.as_str())).collect();
            assert!(extra.is_empty(), "step {name:?}: unknown keys {extra:?}");
            Step { name: name.to_string(), request: request.clone(), expect }
        })
        .collect()
}

/// Panics listing every step whose answer was wrong.
fn assert_all_passed(steps: &[Step], failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} of {} conformance steps failed:\n{}",
        failures.len(),
        steps.len(),
        failures.join("\n")
    );
}

#[test]
fn the_cases_are_well_formed_and_cover_protocol_1() {
    let steps = load();
    // Every op (the `unknown_op` step's aside), and `backup`, an operator's
    // op beyond protocol.md whose answer is a stream (tests/backup.rs).
    assert_every_op_is_tried(steps.iter().map(Step::op).filter(|op| OpKind::from_name(op).is_some()).chain(["backup"]));
    let field_values = |op: &str, field: &str| -> Vec<String> {
        steps
            .iter()
            .filter(|s| s.op() == op && matches!(s.expect, Expect::Ok(_)))
            .filter_map(|s| s.request.get(field).and_then(Json::as_str).map(str::to_string))
            .collect()
    };
    for ties in Ties::ALL {
        assert!(field_values("create_board", "ties").contains(&ties.name().to_string()), "a `{ties}` board");
    }
    for order in Order::ALL {
        let named = field_values("create_board", "order").contains(&order.name().to_string());
        assert!(named || *order == Order::Desc, "an `{order}` board");
    }
    for mode in Mode::ALL {
        let mut modes = field_values("set", "mode");
        modes.extend(field_values("set_many", "mode"));
        assert!(modes.contains(&mode.name().to_string()), "a write with mode `{mode}`");
    }
    for code in [ErrorCode::BadRequest, ErrorCode::UnknownOp, ErrorCode::TooLarge, ErrorCode::Conflict] {
        assert!(steps.iter().any(|s| matches!(s.expect, Expect::Err(c) if c == code)), "a step answered `{code}`");
    }
    for extreme in [Value::from(i64::MAX), Value::from(i64::MIN)] {
        let found = steps.iter().any(|s| matches!(&s.expect, Expect::Ok(result) if holds(result, &extreme)));
        assert!(found, "a result holding the score {extreme}");
    }
}

/// Whether `value` is or holds `needle`.
fn holds(value: &Value, needle: &Value) -> bool {
    value == needle
        || match value {
            Value::Array(items) => items.iter().any(|item| holds(item, needle)),
            Value::Map(pairs) => pairs.iter().any(|(_, v)| holds(v, needle)),
            _ => false,
        }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_one_request_at_a_time() {
    let steps = load();
    let server = common::Server::start(2);
    let mut client = server.client().await;
    let mut failures = Vec::new();
    for step in &steps {
        let got = client.call::<Value>(step.call()).await;
        if let Err(ClientError::Io(_) | ClientError::Protocol(_)) = &got {
            panic!("step {:?}: the connection failed: {}", step.name, shown(&got));
        }
        if let Err(why) = step.check(got) {
            failures.push(format!("{}: {why}", step.name));
        }
    }
    assert_all_passed(&steps, failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_as_one_pipeline() {
    let steps = load();
    let server = common::Server::start(3);
    let mut client = server.client().await;
    let calls: Vec<Call> = steps.iter().map(Step::call).collect();
    let results = client.pipeline::<Value>(&calls).await.expect("the pipeline's connection holds");
    assert_eq!(results.len(), steps.len());
    let failures = steps
        .iter()
        .zip(results)
        .filter_map(|(step, got)| step.check(got).err().map(|why| format!("{}: {why}", step.name)))
        .collect();
    assert_all_passed(&steps, failures);
}
