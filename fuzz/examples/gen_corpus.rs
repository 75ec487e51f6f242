//! Writes the seed corpora: every op as a valid request (built with rmpv),
//! plus a few near-misses, for `parse_request`; the same as framed streams
//! (single frames and pipelines, assorted max_frame/chunk bytes) for `frames`.
//!
//!     cargo run --release --example gen_corpus   # from fuzz/

use std::fs;
use std::path::Path;

use rankd_fuzz::{encode_request, encode_value, frame, request_value, seed_requests};
use rmpv::Value;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let (pr, fr) = (root.join("parse_request"), root.join("frames"));
    fs::create_dir_all(&pr).unwrap();
    fs::create_dir_all(&fr).unwrap();

    let mut bodies: Vec<Vec<u8>> = seed_requests().iter().map(encode_request).collect();
    // Near-misses: each valid request with one field broken, an unknown op,
    // unknown extra fields, nils, a non-map.
    for req in seed_requests() {
        let Value::Map(pairs) = request_value(&req) else { unreachable!() };
        for i in 0..pairs.len() {
            let mut broken = pairs.clone();
            broken[i].1 = Value::from(vec![Value::Nil, Value::from(-1), Value::from(1.5)]);
            bodies.push(encode_value(&Value::Map(broken)));
        }
        let mut extra = pairs.clone();
        extra.push((Value::from("extra"), Value::Map(vec![(Value::from(1), Value::Binary(vec![0; 3]))])));
        bodies.push(encode_value(&Value::Map(extra)));
    }
    let map = |pairs: Vec<(&str, Value)>| Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
    bodies.push(encode_value(&map(vec![("id", 1.into()), ("op", "fly".into())])));
    bodies.push(encode_value(&map(vec![("op", "ping".into())])));
    bodies.push(encode_value(&Value::Array(vec![1.into(), "ping".into()])));
    bodies.push(vec![0xdf, 0xff, 0xff, 0xff, 0xff]);
    for (i, body) in bodies.iter().enumerate() {
        fs::write(pr.join(format!("seed-{i:03}")), body).unwrap();
    }
    // set_many at and just over its 10000-entry limit (~40 KB each: these
    // also raise libFuzzer's default -max_len for this corpus to fit them).
    for n in [10_000, 10_001] {
        let entries = Value::Array(vec![Value::Array(vec!["p".into(), 1.into()]); n]);
        let req = map(vec![("id", 1.into()), ("op", "set_many".into()), ("board", "b".into()), ("entries", entries)]);
        fs::write(pr.join(format!("seed-set_many-{n}")), encode_value(&req)).unwrap();
    }

    // frames: [max_frame byte, chunk byte, stream...]
    let mut n = 0;
    let mut put = |m: u8, c: u8, stream: &[u8]| {
        let mut data = vec![m, c];
        data.extend_from_slice(stream);
        fs::write(fr.join(format!("seed-{n:03}")), data).unwrap();
        n += 1;
    };
    let all: Vec<u8> = bodies[..seed_requests().len()].iter().flat_map(|b| frame(b)).collect();
    put(255, 0, &all);
    put(255, 7, &all);
    put(64, 3, &all);
    for (i, body) in bodies.iter().enumerate().step_by(3) {
        put(255, (i % 5) as u8, &frame(body));
        put(((body.len() / 4) as u8).min(254), 1, &frame(body));
    }
    let mut odd = frame(&bodies[0]);
    odd.extend_from_slice(&[0, 0, 0, 0]);
    odd.extend(frame(&bodies[1]));
    odd.extend_from_slice(&[0, 0, 4, 1, 0x80]);
    put(200, 2, &odd);
    put(2, 0, &[0, 0, 0, 9, 1]);
}
