//! Criterion micro-benchmarks of the wire protocol (see `benches/README.md`).
//!
//! - `decode/<op>`: `rankd::protocol::request::parse` of one frame body (the
//!   msgpack map after the 4-byte length) for typical `set`, `rank` and `top`
//!   requests and a `set_many` of 1000 entries; throughput in bytes.
//! - `decode_entries/set_many_1000`: the same `set_many`, throughput in entries.
//! - `encode/<reply>`: `encode_reply` of a `Score`, a `Rank` and a 100-entry
//!   `Entries` list into a reused buffer, framed; throughput in bytes.
//! - `encode_entries/entries_100`: the same list, throughput in entries.
//!
//! Request bodies are built with `rmpv` the way `rankd_client::Call` encodes
//! them (`id`, `op`, then the fields). No env var: every input is small.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rankd::protocol::request::{parse, Op};
use rankd::protocol::{encode_reply, Reply};
use rankd_client::{Entry, RankInfo};
use rmpv::Value;

const BOARD: &str = "season-2025.eu";

/// A request body as `Call::encode` writes it, without the frame length.
fn body(id: u64, op: &str, fields: Vec<(&str, Value)>) -> Vec<u8> {
    let mut map = vec![(Value::from("id"), Value::from(id)), (Value::from("op"), Value::from(op))];
    map.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Map(map)).expect("encoding into a Vec cannot fail");
    out
}

fn player(i: u64) -> String {
    format!("player-{i:08}")
}

fn requests() -> Vec<(&'static str, Vec<u8>, u64)> {
    let set = body(
        1_000_001,
        "set",
        vec![("board", BOARD.into()), ("player", player(123_456).into()), ("score", 1_234_567.into())],
    );
    let rank = body(1_000_002, "rank", vec![("board", BOARD.into()), ("player", player(123_456).into())]);
    let top = body(1_000_003, "top", vec![("board", BOARD.into()), ("limit", 10.into()), ("offset", 0.into())]);
    let entries: Vec<Value> = (0..1000u64)
        .map(|i| Value::Array(vec![player(i * 7919).into(), Value::from(((i * 2_654_435_761) % 10_000_000) as i64)]))
        .collect();
    let set_many = body(1_000_004, "set_many", vec![("board", BOARD.into()), ("entries", Value::Array(entries))]);
    vec![("set", set, 1), ("rank", rank, 1), ("top", top, 1), ("set_many_1000", set_many, 1000)]
}

fn decode(c: &mut Criterion) {
    let requests = requests();
    for (name, body, _) in &requests {
        // Fail fast (also under `--test`) if a body is not a valid request.
        let request = parse(body).unwrap_or_else(|e| panic!("{name} does not parse: {e:?}"));
        if let Op::SetMany { entries, .. } = &request.op {
            assert_eq!(entries.len(), 1000);
        }
    }
    let mut group = c.benchmark_group("decode");
    for (name, body, _) in &requests {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), body, |b, body| b.iter(|| parse(black_box(body))));
    }
    group.finish();

    let mut group = c.benchmark_group("decode_entries");
    for (name, body, elements) in requests.iter().filter(|r| r.2 > 1) {
        group.throughput(Throughput::Elements(*elements));
        group.bench_with_input(BenchmarkId::from_parameter(name), body, |b, body| b.iter(|| parse(black_box(body))));
    }
    group.finish();
}

fn replies() -> Vec<(&'static str, Reply, u64)> {
    let entries = (0..100u64)
        .map(|i| Entry { player: player(i * 7919), score: 9_000_000 - (i as i64) * 37, rank: 1_001 + i })
        .collect();
    vec![
        ("score", Reply::Score(1_234_567), 1),
        ("rank", Reply::Rank(Some(RankInfo { rank: 123_456, score: 1_234_567, count: 10_000_000 })), 1),
        ("entries_100", Reply::Entries(entries), 100),
    ]
}

fn encoded_len(reply: &Reply) -> u64 {
    let mut out = Vec::new();
    encode_reply(&mut out, 1_000_001, reply);
    assert!(out.len() > 4, "reply encoded to nothing");
    out.len() as u64
}

fn encode(c: &mut Criterion) {
    let replies = replies();
    let mut out = Vec::with_capacity(64 << 10);
    let mut group = c.benchmark_group("encode");
    for (name, reply, _) in &replies {
        group.throughput(Throughput::Bytes(encoded_len(reply)));
        group.bench_with_input(BenchmarkId::from_parameter(name), reply, |b, reply| {
            b.iter(|| {
                out.clear();
                encode_reply(&mut out, black_box(1_000_001), black_box(reply));
                black_box(out.len())
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("encode_entries");
    for (name, reply, elements) in replies.iter().filter(|r| r.2 > 1) {
        group.throughput(Throughput::Elements(*elements));
        group.bench_with_input(BenchmarkId::from_parameter(name), reply, |b, reply| {
            b.iter(|| {
                out.clear();
                encode_reply(&mut out, black_box(1_000_001), black_box(reply));
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decode, encode);
criterion_main!(benches);
