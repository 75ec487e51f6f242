//! Shows what an input is: its msgpack value (long lists clipped) and what
//! `parse` answers; for triaging findings.
//!
//!     cargo run --release --example dump -- artifacts/parse_request/crash-...

use rmpv::Value;

fn clip(v: &Value) -> String {
    match v {
        Value::Array(items) if items.len() > 8 => {
            let head: Vec<String> = items[..4].iter().map(clip).collect();
            format!("[{}, ... ({} items)]", head.join(", "), items.len())
        }
        Value::Array(items) => format!("[{}]", items.iter().map(clip).collect::<Vec<_>>().join(", ")),
        Value::Map(pairs) => {
            let items: Vec<String> = pairs.iter().map(|(k, v)| format!("{}: {}", clip(k), clip(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

fn main() {
    for path in std::env::args().skip(1) {
        let data = std::fs::read(&path).expect("read input");
        println!("== {path} ({} bytes)", data.len());
        let mut rest = &data[..];
        match rmpv::decode::read_value(&mut rest) {
            Ok(v) => println!("value: {} (+{} trailing bytes)", clip(&v), rest.len()),
            Err(e) => println!("not msgpack: {e}"),
        }
        println!(
            "parse: {:?}",
            rankd::protocol::request::parse(&data).map_err(|r| (r.id, r.op, r.error.code(), r.error.to_string()))
        );
    }
}
