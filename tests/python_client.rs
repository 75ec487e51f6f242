//! The Python package in `clients/python/` (import name `rankd`: a blocking
//! and an asyncio client) runs its pytest suite against real servers: every
//! op against an oracle with both clients, the shared conformance steps
//! (`clients/conformance/cases.json`) on fresh servers, error codes,
//! reconnection after the server closes a connection, timeouts on a server
//! whose commits are slowed down; in plaintext, and over mutual TLS with
//! read and write tokens (where nothing may skip), and over TLS without a
//! client certificate. The README's first program prints what the README
//! says it prints, and the example in `examples/python/` runs.
//!
//! The interpreter is `$RANKD_TEST_PYTHON`, else `python3`; it needs the
//! `msgpack` and `pytest` packages (the package itself comes from
//! `clients/python/src` on `PYTHONPATH`, uninstalled). `scripts/test.sh`
//! finds or makes one (Debian's `python3-msgpack` and `python3-pytest`, a
//! pip install where pip may install, or a venv in the target dir) and sets it.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::arg;
use common::certs::TlsFiles;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// The package's source (`src/rankd`), tests and README.
const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python");
const READ_TOKEN: &str = "py-read-5e1c9a7b3d";
const WRITE_TOKEN: &str = "py-write-8f2a6c4e0b";
/// Every variable the suite reads: a test sets the ones it means.
const SUITE_ENV: [&str; 9] = [
    "RANKD_ADDR",
    "RANKD_TLS_CA",
    "RANKD_WRITE_TOKEN",
    "RANKD_READ_TOKEN",
    "RANKD_TLS_CLIENT_CERT",
    "RANKD_TLS_CLIENT_KEY",
    "RANKD_CONFORMANCE_ADDR",
    "RANKD_CONFORMANCE_CASES",
    "RANKD_SLOW_ADDR",
];
/// Flags of the server for the suite's idle-close and timeout tests.
const SLOW: [&str; 4] = ["--idle-timeout-secs", "1", "--debug-commit-delay-ms", "1000"];

/// Runs the test interpreter with `args` in the repository, the package's
/// source first on `PYTHONPATH` and `env` the only suite settings it sees.
fn python(args: &[&str], env: &[(&str, &str)]) -> Output {
    let python = std::env::var("RANKD_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut path = vec![PathBuf::from(PACKAGE).join("src")];
    path.extend(std::env::var_os("PYTHONPATH").iter().flat_map(std::env::split_paths));
    let mut command = Command::new(&python);
    command
        .args(args)
        .current_dir(REPO)
        .env("PYTHONPATH", std::env::join_paths(path).expect("a PYTHONPATH"))
        // No __pycache__ in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("RANKD_SERVER")
        .env_remove("RANKD_TOKEN");
    for name in SUITE_ENV {
        command.env_remove(name);
    }
    command.envs(env.iter().copied()).output().unwrap_or_else(|e| panic!("cannot run {python}: {e}"))
}

/// What a pytest run reported in its last line.
#[derive(Debug, Default)]
struct Summary {
    passed: u64,
    failed: u64,
    skipped: u64,
    errors: u64,
    /// The reasons of `-rs` (`SKIPPED [n] file:line: reason`).
    skip_reasons: Vec<String>,
}

/// `python -m pytest clients/python/tests -q` (or the given test files)
/// with `env`; asserts that it exits 0 and returns its summary.
fn run_pytest(files: &[&str], env: &[(&str, &str)]) -> Summary {
    let check = python(&["-c", "import msgpack, pytest"], &[]);
    assert!(
        check.status.success(),
        "the test interpreter ($RANKD_TEST_PYTHON, else python3) needs msgpack and pytest; \
         scripts/test.sh sets one up:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let tests = format!("{PACKAGE}/tests");
    let paths: Vec<String> =
        if files.is_empty() { vec![tests] } else { files.iter().map(|f| format!("{tests}/{f}")).collect() };
    let mut args = vec!["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"];
    args.extend(paths.iter().map(String::as_str));
    let out = python(&args, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    let last = stdout.lines().rev().map(|l| l.trim_matches(|c| c == '=' || c == ' ')).find(|l| !l.is_empty());
    println!("pytest {}: {}", paths.join(" "), last.unwrap_or_default());
    let counts = last.and_then(|l| l.rsplit_once(" in ")).map(|(counts, _)| counts).unwrap_or_default();
    let mut summary = Summary::default();
    for item in counts.split(", ") {
        let (n, what) = item.split_once(' ').unwrap_or_else(|| panic!("no pytest summary line in:\n{stdout}"));
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("no pytest summary line in:\n{stdout}"));
        match what {
            "passed" => summary.passed = n,
            "failed" => summary.failed = n,
            "skipped" => summary.skipped = n,
            "error" | "errors" => summary.errors = n,
            other => panic!("pytest reported {n} {other}:\n{stdout}"),
        }
    }
    summary.skip_reasons = stdout
        .lines()
        .filter(|l| l.starts_with("SKIPPED"))
        .map(|l| l.rsplit(": ").next().unwrap_or(l).to_string())
        .collect();
    assert!(summary.passed > 0, "pytest ran no test:\n{stdout}");
    summary
}

/// The tokens file for [`READ_TOKEN`] (read) and [`WRITE_TOKEN`] (write).
fn tokens_file(tls: &TlsFiles) -> PathBuf {
    tls.pem.write(
        "tokens.toml",
        &format!(
            "[[tokens]]\nrole = \"read\"\ntoken = \"{READ_TOKEN}\"\n\n[[tokens]]\nrole = \"write\"\ntoken = \"{WRITE_TOKEN}\"\n"
        ),
    )
}

#[test]
fn python_client_passes_its_tests_in_plaintext() {
    let server = common::Server::start(3);
    // The conformance steps need fresh servers without a token: one for
    // each client.
    let fresh = [common::Server::start(2), common::Server::start(2)];
    let slow = common::Server::start_with(1, &SLOW);
    let conformance = format!("{},{}", fresh[0].addr, fresh[1].addr);
    let env = [
        ("RANKD_ADDR", server.addr.as_str()),
        ("RANKD_CONFORMANCE_ADDR", &conformance),
        ("RANKD_SLOW_ADDR", &slow.addr),
    ];
    let summary = run_pytest(&[], &env);
    assert_eq!((summary.failed, summary.errors), (0, 0));
    // Only the tests of TLS and tokens skip here.
    assert!(
        summary.skip_reasons.iter().all(|reason| reason.contains("RANKD_TLS_CA")),
        "unexpected skips: {:?}",
        summary.skip_reasons
    );
    assert!(summary.passed >= 70, "too few tests ran: {summary:?}");
}

#[test]
fn python_client_passes_its_tests_over_mutual_tls_with_read_and_write_tokens() {
    let tls = TlsFiles::new();
    let (cert, key) = tls.pem.pair("client", &tls.ca.client_cert());
    let tokens = tokens_file(&tls);
    let mutual = [tls.server_args().as_slice(), &["--tls-client-ca", arg(&tls.ca_file)]].concat();
    let mut server = common::Server::start_capturing(
        3,
        &[mutual.as_slice(), &["--tokens-file", arg(&tokens)]].concat(),
        &[("RANKD_LOG", "trace")],
    );
    let fresh = [common::Server::start_with(2, &mutual), common::Server::start_with(2, &mutual)];
    let slow = common::Server::start_with(1, &[mutual.as_slice(), &SLOW].concat());
    let conformance = format!("{},{}", fresh[0].addr, fresh[1].addr);
    let env = [
        ("RANKD_ADDR", server.addr.as_str()),
        ("RANKD_TLS_CA", arg(&tls.ca_file)),
        ("RANKD_WRITE_TOKEN", WRITE_TOKEN),
        ("RANKD_READ_TOKEN", READ_TOKEN),
        ("RANKD_TLS_CLIENT_CERT", arg(&cert)),
        ("RANKD_TLS_CLIENT_KEY", arg(&key)),
        ("RANKD_CONFORMANCE_ADDR", &conformance),
        ("RANKD_SLOW_ADDR", &slow.addr),
    ];
    let summary = run_pytest(&[], &env);
    assert_eq!((summary.failed, summary.errors, summary.skipped), (0, 0, 0), "every test ran and passed: {summary:?}");
    assert!(summary.passed >= 90, "too few tests ran: {summary:?}");
    assert!(server.terminate().success(), "the server shut down cleanly");
    server.assert_never_printed(&[READ_TOKEN, WRITE_TOKEN]);
}

#[test]
fn python_client_speaks_tls_without_a_client_certificate() {
    let tls = TlsFiles::new();
    let tokens = tokens_file(&tls);
    let server =
        common::Server::start_with(3, &[tls.server_args().as_slice(), &["--tokens-file", arg(&tokens)]].concat());
    let env = [
        ("RANKD_ADDR", server.addr.as_str()),
        ("RANKD_TLS_CA", arg(&tls.ca_file)),
        ("RANKD_WRITE_TOKEN", WRITE_TOKEN),
        ("RANKD_READ_TOKEN", READ_TOKEN),
    ];
    let summary = run_pytest(&["test_tls.py", "test_smoke.py"], &env);
    assert_eq!((summary.failed, summary.errors), (0, 0));
    assert!(
        summary.skip_reasons.iter().all(|reason| reason.contains("RANKD_TLS_CLIENT_CERT")),
        "only the mutual TLS test skips: {:?}",
        summary.skip_reasons
    );
    assert!(summary.passed >= 15, "too few tests ran: {summary:?}");
}

/// The text of the first fenced block of `lang` after the line `heading`.
fn block_after<'a>(text: &'a str, heading: &str, lang: &str) -> &'a str {
    let (_, after) = text.split_once(heading).unwrap_or_else(|| panic!("no {heading:?} in the README"));
    let fence = format!("```{lang}\n");
    let (_, block) = after.split_once(&fence).unwrap_or_else(|| panic!("no ```{lang} block after {heading:?}"));
    block.split_once("```").map(|(body, _)| body).unwrap_or_else(|| panic!("an unclosed ```{lang} block"))
}

#[test]
fn python_readme_program_prints_what_the_readme_says() {
    let readme = std::fs::read_to_string(format!("{PACKAGE}/README.md")).expect("clients/python/README.md");
    let heading = "## A first program";
    let program = block_after(&readme, heading, "python");
    let expected = block_after(&readme, heading, "text");
    assert!(program.lines().count() <= 10, "the first program is ten lines at most:\n{program}");
    let server = common::Server::start(2);
    let (_, port) = server.addr.rsplit_once(':').expect("host:port");
    assert!(program.contains("\"127.0.0.1\", 7070"), "the program connects to the default address:\n{program}");
    let program = program.replace("\"127.0.0.1\", 7070", &format!("\"127.0.0.1\", {port}"));
    let out = python(&["-c", &program], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the README's program failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, expected, "the README's program printed something else");
}

#[test]
fn python_example_runs() {
    let server = common::Server::start(2);
    let example = format!("{REPO}/examples/python/leaderboard.py");
    let out = python(&[&example], &[("RANKD_SERVER", &server.addr)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the example failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("player07: #") && first.ends_with(" points"), "unexpected output:\n{stdout}");
    assert_eq!(stdout.lines().count(), 6, "the player and four neighbours:\n{stdout}");
}
