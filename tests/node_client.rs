//! The Node.js client in `clients/node/` runs its own test suite
//! (`node --test`, every op against an oracle, 1000 pipelined sets, error
//! codes, framing) against the real server: in plaintext, over TLS with read
//! and write tokens (roles, certificate checks, a plaintext client refused),
//! and over mutual TLS. The plaintext test also runs the shared conformance
//! cases (`test/conformance.test.js` over `clients/conformance/cases.json`)
//! against a fresh server of their own.
//!
//! Node is `$RANKD_TEST_NODE`, else `node`. The client's one dependency
//! (`@msgpack/msgpack`) must be installed in `clients/node/node_modules`:
//! `npm ci --prefix clients/node`, which `scripts/test.sh` runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::arg;
use common::certs::TlsFiles;

/// The Node package.
const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/node");
const READ_TOKEN: &str = "node-read-3b7e91c2d4";
const WRITE_TOKEN: &str = "node-write-a06f5d18e9";

/// The test file of the shared conformance cases, which needs a fresh server
/// of its own (the other files' boards would show in its `boards` steps).
const CONFORMANCE: &str = "conformance.test.js";

/// What one run of the suite reported.
struct Summary {
    pass: u64,
    fail: u64,
    skipped: u64,
}

/// The package's test files (`test/*.test.js`), the conformance cases'
/// aside, in name order: the client's own suite. (They are passed by name,
/// not as the directory: Node 21+ takes glob patterns there.)
fn suite_files() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(Path::new(PACKAGE).join("test"))
        .expect("clients/node/test")
        .map(|entry| entry.expect("a test dir entry").path())
        .filter(|path| path.to_str().is_some_and(|p| p.ends_with(".test.js") && !p.ends_with(CONFORMANCE)))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no test files in {PACKAGE}/test");
    files
}

/// Runs `files` with `node --test` against `server`, with `env` as the only
/// TLS and token settings they see; asserts that it exits 0 and returns its
/// TAP summary.
fn run_node_tests(server: &common::Server, files: &[PathBuf], env: &[(&str, &str)]) -> Summary {
    let package = Path::new(PACKAGE);
    assert!(
        package.join("node_modules/@msgpack/msgpack/package.json").exists(),
        "the Node client's dependencies are not installed in {PACKAGE}/node_modules: \
         run `npm ci --prefix clients/node` (scripts/test.sh does)"
    );
    let node = std::env::var("RANKD_TEST_NODE").unwrap_or_else(|_| "node".to_string());
    let out = Command::new(&node)
        .args(["--test", "--test-reporter=tap"])
        .args(files)
        .current_dir(package)
        .env("RANKD_ADDR", &server.addr)
        .env_remove("RANKD_TLS_CA")
        .env_remove("RANKD_WRITE_TOKEN")
        .env_remove("RANKD_READ_TOKEN")
        .env_remove("RANKD_TLS_CLIENT_CERT")
        .env_remove("RANKD_TLS_CLIENT_KEY")
        .env_remove("RANKD_CONFORMANCE_ADDR")
        .env_remove("NODE_OPTIONS")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {node} ({e}): tests/node_client.rs needs Node.js 18 or newer"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node --test ({node}) failed:\n{stdout}\n{stderr}");
    let count = |name: &str| {
        let prefix = format!("# {name} ");
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no `# {name} <n>` line in the TAP output:\n{stdout}\n{stderr}"))
    };
    Summary { pass: count("pass"), fail: count("fail"), skipped: count("skipped") }
}

/// A server on the certificate of `tls` (for localhost and 127.0.0.1) with
/// [`READ_TOKEN`] (read) and [`WRITE_TOKEN`] (write) in a `--tokens-file`,
/// and `extra` flags.
fn tls_server_with_tokens(tls: &TlsFiles, extra: &[&str]) -> common::Server {
    let tokens = tls.pem.write(
        "tokens.toml",
        &format!(
            "[[tokens]]\nrole = \"read\"\ntoken = \"{READ_TOKEN}\"\n\n[[tokens]]\nrole = \"write\"\ntoken = \"{WRITE_TOKEN}\"\n"
        ),
    );
    let args = [tls.server_args().as_slice(), &["--tokens-file", arg(&tokens)], extra].concat();
    common::Server::start_capturing(3, &args, &[("RANKD_LOG", "trace")])
}

/// How many steps `clients/conformance/cases.json` holds.
fn conformance_steps() -> u64 {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/conformance/cases.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    cases["steps"].as_array().map(|steps| steps.len() as u64).expect("the cases hold a list of steps")
}

#[test]
fn node_client_passes_its_tests_in_plaintext() {
    let server = common::Server::start(3);
    let summary = run_node_tests(&server, &suite_files(), &[]);
    assert_eq!(summary.fail, 0);
    // Every op, 64-bit scores, pipelining, errors, close; and the framing
    // tests. (The TLS suite is skipped, so it does not count as a test.)
    assert!(summary.pass >= 15, "too few tests ran: {} passed", summary.pass);

    // The shared conformance cases, on a fresh server: one test per step.
    let fresh = common::Server::start(2);
    let file = Path::new(PACKAGE).join("test").join(CONFORMANCE);
    let summary = run_node_tests(&fresh, &[file], &[("RANKD_CONFORMANCE_ADDR", &fresh.addr)]);
    let steps = conformance_steps();
    assert_eq!((summary.pass, summary.fail, summary.skipped), (steps, 0, 0), "every conformance step ran and passed");
}

#[test]
fn node_client_passes_its_tests_over_tls_with_read_and_write_tokens() {
    let tls = TlsFiles::new();
    let mut server = tls_server_with_tokens(&tls, &[]);
    let env =
        [("RANKD_TLS_CA", arg(&tls.ca_file)), ("RANKD_WRITE_TOKEN", WRITE_TOKEN), ("RANKD_READ_TOKEN", READ_TOKEN)];
    let summary = run_node_tests(&server, &suite_files(), &env);
    assert_eq!(summary.fail, 0);
    // Everything but the mutual TLS test, which needs a client certificate.
    assert_eq!(summary.skipped, 1, "only the mutual TLS test is skipped");
    assert!(summary.pass >= 20, "too few tests ran: {} passed", summary.pass);
    assert!(server.terminate().success(), "the server shut down cleanly");
    server.assert_never_printed(&[READ_TOKEN, WRITE_TOKEN]);
}

#[test]
fn node_client_speaks_mutual_tls() {
    let tls = TlsFiles::new();
    let (cert, key) = tls.pem.pair("client", &tls.ca.client_cert());
    let server = tls_server_with_tokens(&tls, &["--tls-client-ca", arg(&tls.ca_file)]);
    let env = [
        ("RANKD_TLS_CA", arg(&tls.ca_file)),
        ("RANKD_WRITE_TOKEN", WRITE_TOKEN),
        ("RANKD_READ_TOKEN", READ_TOKEN),
        ("RANKD_TLS_CLIENT_CERT", arg(&cert)),
        ("RANKD_TLS_CLIENT_KEY", arg(&key)),
    ];
    let summary = run_node_tests(&server, &suite_files(), &env);
    assert_eq!((summary.fail, summary.skipped), (0, 0), "every test ran and passed");
}
