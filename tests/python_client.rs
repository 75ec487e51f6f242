//! The protocol is language-neutral: the Python client in
//! `examples/python/` (only the `msgpack` package) runs its oracle-checked
//! smoke test against the real server.
//!
//! The interpreter is `$RANKD_TEST_PYTHON`, else `python3`. `scripts/test.sh`
//! finds or makes one that imports `msgpack` (Debian's `python3-msgpack`, a
//! pip install where pip may install, or a venv in the target dir) and sets it.

mod common;

use std::process::Command;

#[test]
fn python_client_passes_its_smoke_test() {
    let server = common::Server::start(3);
    let (host, port) = server.addr.rsplit_once(':').expect("host:port");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/smoke.py");
    let python = std::env::var("RANKD_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python).args([script, host, port]).output().unwrap_or_else(|e| {
        panic!("cannot run {python} ({e}): it needs the msgpack package; scripts/test.sh sets one up")
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python smoke test ({python}) failed:\n{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with("passed, 0 failed") && !summary.starts_with("0 passed"), "unexpected summary: {summary}");
}
