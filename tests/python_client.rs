//! The protocol is language-neutral: the Python client in
//! `examples/python/` (only the `msgpack` package) runs its oracle-checked
//! smoke test against the real server. `.ci/run` installs `msgpack`.

mod common;

use std::process::Command;

#[test]
fn python_client_passes_its_smoke_test() {
    let server = common::Server::start(3);
    let (host, port) = server.addr.rsplit_once(':').expect("host:port");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/smoke.py");
    let out = Command::new("python3")
        .args([script, host, port])
        .output()
        .expect("python3 must be installed (with `pip install msgpack`); .ci/run does both");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python smoke test failed:\n{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with("passed, 0 failed") && !summary.starts_with("0 passed"), "unexpected summary: {summary}");
}
