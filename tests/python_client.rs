//! The protocol is language-neutral: the Python client in
//! `examples/python/` (only the `msgpack` package) runs its oracle-checked
//! smoke test against the real server, in plaintext and over TLS with a
//! write token; with a read token it reads and is refused writes.
//!
//! The interpreter is `$RANKD_TEST_PYTHON`, else `python3`. `scripts/test.sh`
//! finds or makes one that imports `msgpack` (Debian's `python3-msgpack`, a
//! pip install where pip may install, or a venv in the target dir) and sets it.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::arg;
use common::certs::TlsFiles;

/// The Python client (`rankd_client.py`) and its smoke test (`smoke.py`).
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python");
const READ_TOKEN: &str = "py-read-5e1c9a7b3d";
const WRITE_TOKEN: &str = "py-write-8f2a6c4e0b";

/// Runs the test interpreter with `args` and `env` (the only TLS and token
/// settings it sees), [`EXAMPLES`] first on its `PYTHONPATH`; asserts that
/// it exits 0, naming `what` ran, and returns its stdout.
fn run_python(what: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let python = std::env::var("RANKD_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut path = vec![PathBuf::from(EXAMPLES)];
    path.extend(std::env::var_os("PYTHONPATH").iter().flat_map(std::env::split_paths));
    let out = Command::new(&python)
        .args(args)
        .env("PYTHONPATH", std::env::join_paths(path).expect("a PYTHONPATH"))
        .env_remove("RANKD_TLS_CA")
        .env_remove("RANKD_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} ({e}): it needs the msgpack package; scripts/test.sh sets one up")
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} ({python}) failed:\n{stdout}\n{stderr}");
    stdout
}

/// `smoke.py` against `server`, with `env` (`RANKD_TLS_CA`, `RANKD_TOKEN`),
/// passes every check.
fn assert_smoke_test_passes(server: &common::Server, env: &[(&str, &str)]) {
    let (host, port) = server.addr.rsplit_once(':').expect("host:port");
    let script = format!("{EXAMPLES}/smoke.py");
    let stdout = run_python("python smoke test", &[&script, host, port], env);
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with("passed, 0 failed") && !summary.starts_with("0 passed"), "unexpected summary: {summary}");
}

/// A server on the certificate of `tls` (for localhost and 127.0.0.1) with
/// [`READ_TOKEN`] (read) and [`WRITE_TOKEN`] (write) in a `--tokens-file`.
fn tls_server_with_tokens(tls: &TlsFiles) -> common::Server {
    let tokens = tls.pem.write(
        "tokens.toml",
        &format!(
            "[[tokens]]\nrole = \"read\"\ntoken = \"{READ_TOKEN}\"\n\n[[tokens]]\nrole = \"write\"\ntoken = \"{WRITE_TOKEN}\"\n"
        ),
    );
    common::Server::start_with(3, &[tls.server_args().as_slice(), &["--tokens-file", arg(&tokens)]].concat())
}

#[test]
fn python_client_passes_its_smoke_test() {
    let server = common::Server::start(3);
    assert_smoke_test_passes(&server, &[]);
}

#[test]
fn python_client_passes_its_smoke_test_over_tls_with_a_write_token() {
    let tls = TlsFiles::new();
    let server = tls_server_with_tokens(&tls);
    assert_smoke_test_passes(&server, &[("RANKD_TLS_CA", arg(&tls.ca_file)), ("RANKD_TOKEN", WRITE_TOKEN)]);
}

/// Connects over TLS with the token (from the environment, never argv),
/// then checks what `auth` answers and that a write is refused.
const READ_ONLY_CHECK: &str = r#"
import os, sys
from rankd_client import RankdClient, RankdError

host, port = sys.argv[1], int(sys.argv[2])
token = os.environ["RANKD_TOKEN"]
with RankdClient(host, port, ca_file=os.environ["RANKD_TLS_CA"], server_hostname="localhost", token=token) as db:
    role = db.auth(token)
    assert role == {"role": "read"}, f"auth answered {role!r}"
    try:
        stored = db.set("b", "p", 1)
    except RankdError as exc:
        assert exc.code == "unauthorized", f"set under a read token: {exc.code}: {exc.msg}"
    else:
        raise AssertionError(f"set under a read token stored {stored!r}")
    assert db.ping() == "pong", "the connection is still served"
print("read token: auth", role, "and set refused")
"#;

#[test]
fn python_client_with_a_read_token_reads_and_cannot_write() {
    let tls = TlsFiles::new();
    let server = tls_server_with_tokens(&tls);
    let (host, port) = server.addr.rsplit_once(':').expect("host:port");
    let env = [("RANKD_TLS_CA", arg(&tls.ca_file)), ("RANKD_TOKEN", READ_TOKEN)];
    let stdout = run_python("the python read-token check", &["-c", READ_ONLY_CHECK, host, port], &env);
    assert!(stdout.contains("set refused"), "the check did not run to its end:\n{stdout}");
}
