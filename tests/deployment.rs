//! The deployment files start rankd as they are written. There is no
//! container engine, kubelet or systemd manager here, so each test reads a
//! file the way its platform would, takes the exact rankd command line and
//! environment it gives, and runs the real binary with them until `/readyz`
//! answers 200; then it checks the file's health checks and probes against
//! what that server serves, talks to it with the token the file provides,
//! and stops it with the file's stop signal within the file's grace period.
//!
//! - `Dockerfile`: `ENTRYPOINT` + `CMD`, refused without a token (as
//!   `docker run` without `-e` would be), started with one; `EXPOSE` and
//!   `VOLUME` match the flags; its `HEALTHCHECK` script (the file the
//!   image copies) passes against the ready server and fails against a
//!   closed port and a 503.
//! - `grafana/docker-compose.yml`: the `rankd` service's command (the
//!   image's) and environment, interpolated from `grafana/.env.example` as
//!   compose would: refused as shipped (empty token), run once a token is set.
//! - `deploy/k8s/`: the StatefulSet's container (`command`/`args` over the
//!   image's), its env, its Secret mounted where the manifest mounts it (from
//!   `secret.example.yaml`: refused with its empty placeholders, run with
//!   tokens filled in), the three probes on the ports they name, and the
//!   Services' target ports.
//! - `deploy/systemd/rankd.service`: `systemd-analyze verify` and `security`,
//!   then `ExecStart` with its specifiers and `${STATE_DIRECTORY}` expanded
//!   as systemd would, its `Environment=` and `LoadCredential=` file.
//!
//! What is swapped, and nothing else: the program (`rankd`,
//! `/usr/local/bin/rankd`) is this build's binary; every port in
//! `--listen`/`--metrics-listen` becomes 0 (the host part is kept, so
//! `0.0.0.0` still needs its token) and the file's ports are mapped to the
//! ones the server reports; every absolute path in the arguments and the
//! environment is taken under a temporary root, where the files the
//! platform would mount (a Secret, a credential) are written.
//!
//! YAML is read with Python's PyYAML (Debian's python3-yaml, which `.ci/run`
//! installs if it is missing); the systemd checks need `systemd-analyze`
//! (Debian's systemd package, likewise). Both fail the test when missing,
//! never skip it. `kubectl kustomize` also renders `deploy/k8s` when
//! `kubectl` is on the PATH (it is no Debian package; without it the test
//! says so and reads the kustomization's resources itself).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use rankd_client::{AuthGrant, Client, Mode};
use serde_json::Value as Json;

/// How long a deployment's rankd may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(120);

// ---- reading files -----------------------------------------------------

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_text(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A python3 that imports `yaml`: Debian's first (python3-yaml), then
/// whichever `python3` is on the PATH.
fn python_with_yaml() -> &'static str {
    static PYTHON: OnceLock<&'static str> = OnceLock::new();
    PYTHON.get_or_init(|| {
        for python in ["/usr/bin/python3", "python3"] {
            let imports = Command::new(python)
                .args(["-c", "import yaml"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if imports {
                return python;
            }
        }
        panic!(
            "tests/deployment.rs reads YAML with Python's PyYAML and found no python3 that imports it: \
             apt-get install python3-yaml (.ci/run does)"
        )
    })
}

/// Every document of a YAML file, as JSON values (PyYAML's safe loader:
/// YAML 1.1, as Kubernetes reads manifests).
fn yaml_file(path: &Path) -> Vec<Json> {
    const TO_JSON: &str = "import json, sys, yaml\n\
                           with open(sys.argv[1]) as f:\n    \
                               docs = [d for d in yaml.safe_load_all(f) if d is not None]\n\
                           json.dump(docs, sys.stdout)";
    let out = Command::new(python_with_yaml()).args(["-c", TO_JSON]).arg(path).output().expect("run python3");
    assert!(out.status.success(), "{} is not valid YAML:\n{}", path.display(), String::from_utf8_lossy(&out.stderr));
    match serde_json::from_slice(&out.stdout).expect("python printed JSON") {
        Json::Array(docs) => docs,
        other => panic!("not a list of documents: {other}"),
    }
}

/// The one document of a YAML file in the repository.
fn yaml_doc(relative: &str) -> Json {
    let mut docs = yaml_file(&repo().join(relative));
    assert_eq!(docs.len(), 1, "{relative} holds one document");
    docs.remove(0)
}

/// `value[key]` as a string, failing the test with `what` if it is not one.
fn text<'a>(value: &'a Json, key: &str, what: &str) -> &'a str {
    value[key].as_str().unwrap_or_else(|| panic!("{what}: no string `{key}` in {value}"))
}

fn strings(value: &Json, what: &str) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: not a list: {value}"))
        .iter()
        .map(|item| match item {
            Json::String(s) => s.clone(),
            Json::Number(n) => n.to_string(),
            other => panic!("{what}: not a string: {other}"),
        })
        .collect()
}

// ---- the Dockerfile ----------------------------------------------------

/// One build stage: its base image, its name and its instructions in order
/// (keyword upper-cased, continuation lines joined, comments dropped).
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions.iter().filter(|(k, _)| k == keyword).map(|(_, rest)| rest.as_str()).collect()
    }

    fn one(&self, keyword: &str) -> &str {
        match self.all(keyword)[..] {
            [rest] => rest,
            ref found => panic!("the Dockerfile's stage from {} has {} {keyword} instructions", self.from, found.len()),
        }
    }

    /// A JSON-array (exec form) instruction's words.
    fn exec_form(&self, keyword: &str) -> Vec<String> {
        let rest = self.one(keyword);
        serde_json::from_str(rest).unwrap_or_else(|e| panic!("{keyword} {rest} is not in exec form (JSON): {e}"))
    }

    /// `COPY` instructions: options, sources and destination.
    fn copies(&self) -> Vec<(Vec<&str>, Vec<&str>, &str)> {
        self.all("COPY")
            .into_iter()
            .map(|rest| {
                let (options, mut paths): (Vec<&str>, Vec<&str>) =
                    rest.split_whitespace().partition(|word| word.starts_with("--"));
                let dest = paths.pop().expect("COPY has a destination");
                (options, paths, dest)
            })
            .collect()
    }

    /// `ENV KEY=VALUE ...` (the simple form, no quotes).
    fn env(&self) -> Vec<(String, String)> {
        self.all("ENV")
            .into_iter()
            .flat_map(|rest| rest.split_whitespace())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or_else(|| panic!("ENV {pair}: use KEY=VALUE"));
                (key.to_string(), value.to_string())
            })
            .collect()
    }
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in logical {
        let instruction = instruction.trim();
        let (keyword, rest) = instruction.split_once(char::is_whitespace).unwrap_or((instruction, ""));
        let (keyword, rest) = (keyword.to_ascii_uppercase(), rest.trim().to_string());
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words[..] {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => panic!("FROM {rest}: expected IMAGE [AS NAME]"),
            };
            stages.push(Stage { from: words[0].to_string(), name, instructions: Vec::new() });
        } else {
            stages.last_mut().expect("an instruction before the first FROM").instructions.push((keyword, rest));
        }
    }
    stages
}

/// The runtime stage (the last) of the repository's Dockerfile, with checks
/// that hold for every use of the image.
fn runtime_stage() -> Stage {
    let mut stages = parse_dockerfile(&read_text("Dockerfile"));
    assert!(stages.len() >= 2, "the Dockerfile is multi-stage (a build stage and a small runtime)");
    let build = &stages[0];
    assert_eq!(build.from, "rust:1-slim-bookworm", "the build stage's image");
    let builds_rankd = build.all("RUN").iter().any(|run| run.contains("cargo build --release --locked -p rankd"));
    assert!(builds_rankd, "the build stage runs `cargo build --release --locked -p rankd`");
    let runtime = stages.pop().expect("a stage");
    let build_name = stages[0].name.as_deref().expect("the build stage is named (FROM ... AS NAME)");
    let copies_build = runtime.copies().iter().any(|(options, _, dest)| {
        options.contains(&format!("--from={build_name}").as_str()) && dest.starts_with("/usr/local/bin/")
    });
    assert!(copies_build, "the runtime stage copies the binary from the build stage onto the PATH");
    assert_eq!(runtime.from, "debian:bookworm-slim", "the runtime image (the glibc of the build stage's Debian)");
    runtime
}

/// The uid of the image's `USER` (numeric, so Kubernetes' runAsNonRoot can
/// check it without reading /etc/passwd).
fn image_uid(runtime: &Stage) -> u32 {
    let user = runtime.one("USER");
    let uid = user.split(':').next().unwrap_or_default();
    let uid: u32 = uid.parse().unwrap_or_else(|_| panic!("USER {user}: give a numeric uid"));
    assert_ne!(uid, 0, "the image runs as a non-root user");
    uid
}

/// The command a container of the image runs: `entrypoint` replaces the
/// image's ENTRYPOINT and then drops its CMD, `cmd` replaces CMD (Docker
/// compose's `entrypoint`/`command`, Kubernetes' `command`/`args`).
fn container_argv(runtime: &Stage, entrypoint: Option<Vec<String>>, cmd: Option<Vec<String>>) -> Vec<String> {
    let replaced = entrypoint.is_some();
    let mut argv = entrypoint.unwrap_or_else(|| runtime.exec_form("ENTRYPOINT"));
    match cmd {
        Some(cmd) => argv.extend(cmd),
        None if !replaced => argv.extend(runtime.exec_form("CMD")),
        None => {}
    }
    argv
}

// ---- running what a file gives -----------------------------------------

/// A rankd command line and environment as a deployment file gives them,
/// and the files its platform would put in place (absolute path, content).
struct Launch {
    what: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    files: Vec<(String, String)>,
}

impl Launch {
    /// The value of `flag` (`--flag V` or `--flag=V`) in the command line.
    fn flag(&self, flag: &str) -> Option<&str> {
        let mut words = self.argv.iter();
        while let Some(word) = words.next() {
            if word == flag {
                return words.next().map(String::as_str);
            }
            if let Some(value) = word.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
                return Some(value);
            }
        }
        None
    }

    fn addr(&self, flag: &str) -> SocketAddr {
        let value = self.flag(flag).unwrap_or_else(|| panic!("{}: the command line names no {flag}", self.what));
        value.parse().unwrap_or_else(|e| panic!("{}: {flag} {value}: {e}", self.what))
    }

    /// `--listen`: the client address.
    fn client_addr(&self) -> SocketAddr {
        self.addr("--listen")
    }

    /// `--metrics-listen`: /metrics, /healthz, /readyz.
    fn metrics_addr(&self) -> SocketAddr {
        self.addr("--metrics-listen")
    }

    fn data_dir(&self) -> &str {
        self.flag("--data-dir").unwrap_or_else(|| panic!("{}: the command line names no --data-dir", self.what))
    }

    /// This command line and environment, ready to run under `root`.
    fn command(&self, root: &Path, stderr: &Path) -> Command {
        let program = Path::new(&self.argv[0]);
        assert_eq!(program.file_name().and_then(|n| n.to_str()), Some("rankd"), "{}: runs {program:?}", self.what);
        assert_eq!(self.argv.get(1).map(String::as_str), Some("serve"), "{}: runs `rankd serve`", self.what);
        for (path, content) in &self.files {
            let local = under(root, path);
            std::fs::create_dir_all(local.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&local, content).expect("write a mounted file");
        }
        let mut args = Vec::new();
        let mut words = self.argv[1..].iter().flat_map(|word| match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => vec![flag.to_string(), value.to_string()],
            _ => vec![word.clone()],
        });
        while let Some(word) = words.next() {
            if word == "--listen" || word == "--metrics-listen" {
                let value = words.next().expect("an address");
                let addr: SocketAddr = value.parse().expect("an address");
                args.extend([word, SocketAddr::new(addr.ip(), 0).to_string()]);
            } else {
                args.push(local_value(root, &word));
            }
        }
        let env: Vec<(String, String)> = self.env.iter().map(|(k, v)| (k.clone(), local_value(root, v))).collect();
        let shown: Vec<String> =
            self.env
                .iter()
                .map(|(k, v)| {
                    if k.contains("TOKEN") && !k.ends_with("_FILE") {
                        format!("{k}=<set>")
                    } else {
                        format!("{k}={v}")
                    }
                })
                .collect();
        eprintln!(
            "{}:\n  as written: {} (env {shown:?})\n  run as:     {} {}",
            self.what,
            self.argv.join(" "),
            env!("CARGO_BIN_EXE_rankd"),
            args.join(" ")
        );
        let log = std::fs::File::create(stderr).expect("stderr file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_rankd"));
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(env)
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        command
    }

    /// Runs it and waits until `/readyz` answers 200.
    fn start(&self) -> Server {
        let root = tempfile::tempdir().expect("temp root");
        let stderr = root.path().join("rankd.stderr");
        let mut child = common::Running(self.command(root.path(), &stderr).spawn().expect("spawn rankd"));
        let stdout = child.0.stdout.take().expect("stdout");
        let (first_line, first) = mpsc::channel();
        std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            let _ = first_line.send(line);
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let line = first.recv_timeout(START_TIMEOUT).unwrap_or_default();
        let Some(addrs) = line.trim_end().strip_prefix("rankd listening on ") else {
            let _ = child.0.kill();
            let status = child.0.wait().expect("wait");
            let log = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("{}: rankd did not start ({status}); stdout {line:?}, stderr:\n{log}", self.what);
        };
        let (client, metrics) = addrs.split_once(" metrics ").expect("`ADDR metrics ADDR`");
        let (client, metrics): (SocketAddr, SocketAddr) = (client.parse().unwrap(), metrics.parse().unwrap());
        let ports = BTreeMap::from([
            (self.client_addr().port(), reachable(client)),
            (self.metrics_addr().port(), reachable(metrics)),
        ]);
        let server = Server { what: self.what.clone(), child, ports, stderr, _root: root };
        common::wait_for_blocking(Duration::from_secs(60), &format!("{}: /readyz to answer 200", self.what), || {
            match server.get(self.metrics_addr().port(), "/readyz") {
                Ok(200) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        server
    }

    /// Runs it expecting a refusal to start; returns what rankd printed on stderr.
    fn refused(&self) -> String {
        let root = tempfile::tempdir().expect("temp root");
        let stderr = root.path().join("rankd.stderr");
        // run_to_exit takes stderr itself (a pipe) and returns it.
        let (status, log) = common::run_to_exit(&mut self.command(root.path(), &stderr), &self.what);
        assert!(!status.success(), "{}: rankd should have refused to start ({status}):\n{log}", self.what);
        log
    }
}

/// `path` (absolute, as the deployment names it) under `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// A value of the command line or environment with an absolute path taken
/// under `root`.
fn local_value(root: &Path, value: &str) -> String {
    if value.starts_with('/') {
        under(root, value).to_str().expect("a UTF-8 temp path").to_string()
    } else {
        value.to_string()
    }
}

/// Where to connect to a listener bound to `addr` (an unspecified address
/// is reached on loopback).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

/// A rankd started from a deployment file.
struct Server {
    what: String,
    child: common::Running,
    /// The file's port → where that listener really is.
    ports: BTreeMap<u16, SocketAddr>,
    stderr: PathBuf,
    _root: tempfile::TempDir,
}

impl Server {
    /// Where the listener the file calls `port` is.
    fn at(&self, port: u16) -> SocketAddr {
        *self.ports.get(&port).unwrap_or_else(|| {
            panic!("{}: port {port} is none of rankd's (it listens on {:?})", self.what, self.ports.keys())
        })
    }

    /// GET `path` on the file's `port`: the HTTP status.
    fn get(&self, port: u16, path: &str) -> Result<u16, String> {
        http_status(self.at(port), path)
    }

    /// Sends `signal` and expects exit 0 within `grace`.
    fn stop(mut self, signal: libc::c_int, grace: Duration) {
        let pid = self.child.0.id() as libc::pid_t;
        // SAFETY: kill only reads its integer arguments; the pid is our child's, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "send the stop signal");
        let what = format!("{}: rankd to exit within the grace period ({grace:?})", self.what);
        let status = common::wait_for_blocking(grace, &what, || {
            self.child.0.try_wait().expect("wait").ok_or_else(|| "still running".to_string())
        });
        let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        assert!(status.success(), "{}: the stop signal should end rankd cleanly, got {status}:\n{log}", self.what);
        assert!(log.contains("shut down cleanly"), "{}: no clean shutdown in the log:\n{log}", self.what);
    }
}

/// A signal by the name a deployment file gives it.
fn signal_named(name: &str) -> libc::c_int {
    match name.trim_start_matches("SIG") {
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "HUP" => libc::SIGHUP,
        other => panic!("stop signal {other}: teach tests/deployment.rs its number"),
    }
}

/// GET `path` over HTTP/1.0: the status code.
fn http_status(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("{addr}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let status = response.split_whitespace().nth(1).and_then(|code| code.parse().ok());
    status.ok_or_else(|| format!("not an HTTP response: {response:?}"))
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(future)
}

/// A token as `openssl rand -hex 24` would make one.
fn new_token() -> String {
    (0..24).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// What a token is expected to grant.
enum Grant<'a> {
    /// `RANKD_AUTH_TOKEN`: everything, `auth` answers `true`.
    Plain(&'a str),
    /// A tokens file with a read and a write token.
    Roles { read: &'a str, write: &'a str },
}

/// Clients on the server's client port: nothing but `ping` before `auth`,
/// then what the tokens grant.
fn check_clients(addr: SocketAddr, grant: Grant) {
    let addr = addr.to_string();
    block_on(async move {
        let mut client = Client::connect(&addr).await.expect("connect to the client port");
        assert_eq!(client.ping().await.unwrap(), "pong");
        assert_eq!(client.count("deploy").await.unwrap_err().code(), Some("unauthorized"), "auth is required");
        let write = match grant {
            Grant::Plain(token) => {
                assert_eq!(client.auth(token).await.unwrap(), AuthGrant::Granted(true));
                client
            }
            Grant::Roles { read, write } => {
                assert_eq!(client.auth(read).await.unwrap(), AuthGrant::Role { role: "read".into() });
                assert_eq!(client.count("deploy").await.unwrap(), 0, "a read token reads");
                let refused = client.set("deploy", "alice", 1, Mode::Set).await.unwrap_err();
                assert_eq!(refused.code(), Some("unauthorized"), "a read token cannot write");
                let mut writer = Client::connect(&addr).await.expect("connect");
                assert_eq!(writer.auth(write).await.unwrap(), AuthGrant::Role { role: "write".into() });
                writer
            }
        };
        let mut write = write;
        assert_eq!(write.set("deploy", "alice", 42, Mode::Set).await.unwrap(), 42);
        assert_eq!(write.get("deploy", "alice").await.unwrap(), Some(42));
    });
}

/// A tokens file (`[[tokens]]` with role and token) with every empty token
/// replaced by a new one, as an operator fills in the example; returns it
/// and the read and write tokens.
fn fill_tokens(example: &str) -> (String, String, String) {
    let mut file: toml::Table = toml::from_str(example).expect("the tokens file is TOML");
    let entries = file.get_mut("tokens").and_then(|t| t.as_array_mut()).expect("[[tokens]] entries");
    let (mut read, mut write) = (None, None);
    for entry in entries {
        let entry = entry.as_table_mut().expect("a [[tokens]] table");
        let token = new_token();
        let role = entry["role"].as_str().expect("a role").to_string();
        assert_eq!(entry["token"].as_str(), Some(""), "the example's tokens are empty placeholders");
        entry.insert("token".into(), token.clone().into());
        match role.as_str() {
            "read" => read = Some(token),
            "write" => write = Some(token),
            other => panic!("role {other:?}"),
        }
    }
    let text = toml::to_string(&file).expect("TOML");
    (text, read.expect("a read token"), write.expect("a write token"))
}

/// The refusal rankd prints when asked to listen beyond loopback without a token.
const NO_TOKEN: &str = "without a token";

// ---- Dockerfile ----------------------------------------------------------

#[test]
fn the_image_runs_rankd_unprivileged_with_its_cmd_and_a_readyz_healthcheck() {
    let runtime = runtime_stage();
    image_uid(&runtime);
    let argv = container_argv(&runtime, None, None);
    let env = runtime.env();
    let bare = Launch { what: "the image's CMD (docker run)".into(), argv, env, files: Vec::new() };

    // What the image promises around the command line.
    let (client, metrics) = (bare.client_addr(), bare.metrics_addr());
    assert!(client.ip().is_unspecified() && metrics.ip().is_unspecified(), "the image listens beyond loopback");
    let exposed: BTreeSet<u16> =
        runtime.one("EXPOSE").split_whitespace().map(|p| p.trim_end_matches("/tcp").parse().unwrap()).collect();
    assert_eq!(exposed, BTreeSet::from([client.port(), metrics.port()]), "EXPOSE names the ports the CMD listens on");
    let volumes: Vec<String> = serde_json::from_str(runtime.one("VOLUME")).expect("VOLUME in JSON form");
    assert_eq!(volumes, [bare.data_dir()], "the data dir is the image's volume");
    assert_eq!(runtime.one("STOPSIGNAL"), "SIGTERM", "SIGTERM is rankd's clean stop");
    let program = &bare.argv[0];
    let copied = runtime.copies().iter().any(|(_, _, dest)| *dest == format!("/usr/local/bin/{program}"));
    assert!(copied, "ENTRYPOINT {program} is copied onto the PATH (/usr/local/bin)");

    // `docker run` without a token: refused, not served open.
    assert!(bare.refused().contains(NO_TOKEN));

    // With one (`docker run -e RANKD_AUTH_TOKEN=...`): up, and healthy.
    let token = new_token();
    let mut env = bare.env.clone();
    env.push(("RANKD_AUTH_TOKEN".into(), token.clone()));
    let launch = Launch { what: "the image's CMD with -e RANKD_AUTH_TOKEN".into(), env, ..bare };
    let server = launch.start();
    let healthcheck = healthcheck(&runtime);
    assert!(healthcheck.args.iter().any(|a| a == "/readyz"), "the HEALTHCHECK asks /readyz: {:?}", healthcheck.args);
    assert!(healthcheck.run(&server).success(), "the HEALTHCHECK passes once rankd is ready");
    check_clients(server.at(client.port()), Grant::Plain(&token));
    // `docker stop` without -t waits 10 s before SIGKILL.
    server.stop(signal_named(runtime.one("STOPSIGNAL")), Duration::from_secs(10));
}

/// The image's HEALTHCHECK: the script the image copies to the command's
/// name, and its arguments.
struct Healthcheck {
    script: PathBuf,
    args: Vec<String>,
}

fn healthcheck(runtime: &Stage) -> Healthcheck {
    let rest = runtime.one("HEALTHCHECK");
    let (options, command) = rest.split_once("CMD ").expect("HEALTHCHECK [OPTIONS] CMD [...]");
    assert!(options.contains("--start-period="), "a start period covers opening a large data dir: {options}");
    let command: Vec<String> = serde_json::from_str(command.trim()).expect("HEALTHCHECK CMD in exec form");
    let name = &command[0];
    let source = runtime
        .copies()
        .into_iter()
        .find(|(options, sources, dest)| {
            !options.iter().any(|o| o.starts_with("--from"))
                && sources.len() == 1
                && *dest == format!("/usr/local/bin/{name}")
        })
        .map(|(_, sources, _)| repo().join(sources[0]))
        .unwrap_or_else(|| panic!("the HEALTHCHECK runs {name}, which no COPY from the repository puts on the PATH"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&source).expect("the health check script").permissions().mode();
    assert!(mode & 0o111 != 0, "{} must be executable (git mode 100755)", source.display());
    Healthcheck { script: source, args: command[1..].to_vec() }
}

impl Healthcheck {
    /// Runs the check against `server`, its `HOST:PORT` argument mapped to
    /// where that port really is.
    fn run(&self, server: &Server) -> std::process::ExitStatus {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|arg| match arg.parse::<SocketAddr>() {
                Ok(addr) => server.at(addr.port()).to_string(),
                Err(_) => arg.clone(),
            })
            .collect();
        self.run_with(&args)
    }

    fn run_with(&self, args: &[String]) -> std::process::ExitStatus {
        let mut child = common::Running(Command::new(&self.script).args(args).spawn().expect("run the health check"));
        common::wait_for_blocking(Duration::from_secs(20), "the health check to finish", || {
            child.0.try_wait().expect("wait").ok_or_else(|| "still running".into())
        })
    }
}

#[test]
fn the_healthcheck_fails_on_a_closed_port_and_on_a_503() {
    let check = healthcheck(&runtime_stage());
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(!check.run_with(&[closed.to_string(), "/readyz".into()]).success(), "closed port");
    // A server answering 503 (as rankd's /readyz does before it is ready and once it is stopping).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(2) {
            let mut stream = stream.unwrap();
            // The whole request, so that closing does not reset the connection.
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(n @ 1..) => request.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
            let status = if request.starts_with(b"GET /readyz ") { "503 Service Unavailable" } else { "200 OK" };
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        }
    });
    assert!(!check.run_with(&[addr.to_string(), "/readyz".into()]).success(), "503");
    assert!(check.run_with(&[addr.to_string(), "/other".into()]).success(), "the same server's 200 passes");
}

#[test]
fn the_dockerignore_keeps_the_sources_and_drops_build_output_and_secrets() {
    let patterns: Vec<String> = read_text(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/').to_string())
        .collect();
    assert!(patterns.iter().all(|p| !p.starts_with('!')), "no exceptions: this matcher does not handle them");
    let ignored = |path: &str| patterns.iter().any(|p| dockerignore_match(p, path));
    for dropped in [
        ".git/HEAD",
        "target/release/rankd",
        "fuzz/target/x",
        "rankd-data/shard-0/x",
        "clients/node/node_modules/x/index.js",
        "grafana/.env",
        "tokens.toml",
        "deploy/k8s/tokens.toml",
        "key.pem",
    ] {
        assert!(ignored(dropped), ".dockerignore should drop {dropped}");
    }
    // What the build reads: the manifests, every member's sources, the
    // benches the root manifest declares, and what the runtime stage copies.
    let mut kept = vec!["Cargo.toml".to_string(), "Cargo.lock".to_string()];
    for dir in ["src", "shards", "client", "bench", "benches"] {
        walk(&repo().join(dir), &mut |path| kept.push(path.strip_prefix(repo()).unwrap().to_str().unwrap().into()));
    }
    for (options, sources, _) in runtime_stage().copies() {
        if !options.iter().any(|o| o.starts_with("--from")) {
            kept.extend(sources.iter().map(|s| s.to_string()));
        }
    }
    let lost: Vec<&String> = kept.iter().filter(|path| ignored(path)).collect();
    assert!(lost.is_empty(), ".dockerignore drops files the image build needs: {lost:?}");
}

/// Every file under `dir` but build output.
fn walk(dir: &Path, found: &mut dyn FnMut(&Path)) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                walk(&path, found);
            }
        } else {
            found(&path);
        }
    }
}

/// Whether a .dockerignore pattern (`*` within a path segment, `**` for any
/// number of segments, anchored at the context's root) drops `path` or a
/// directory above it.
fn dockerignore_match(pattern: &str, path: &str) -> bool {
    fn segments(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.first(), path.first()) {
            (None, _) => true, // the pattern named a directory above the path
            (Some(&"**"), _) => (0..=path.len()).any(|skip| segments(&pattern[1..], &path[skip..])),
            (Some(p), Some(s)) => glob(p, s) && segments(&pattern[1..], &path[1..]),
            (Some(_), None) => false,
        }
    }
    fn glob(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head) && (0..=name.len() - head.len()).any(|at| glob(tail, &name[head.len() + at..]))
            }
        }
    }
    let pattern: Vec<&str> = pattern.split('/').collect();
    let path: Vec<&str> = path.split('/').collect();
    segments(&pattern, &path)
}

// ---- docker compose ------------------------------------------------------

/// `KEY=VALUE` lines of a compose `.env` file.
fn dotenv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!(".env line {l:?}: KEY=VALUE"));
            (k.trim().to_string(), v.trim().trim_matches('"').to_string())
        })
        .collect()
}

/// Compose's interpolation of `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
/// `${VAR:?error}`, `${VAR?error}`, `$VAR` and `$$`; `Err` is compose's refusal.
fn interpolate(value: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(braced) = rest.strip_prefix('{') {
            let end = braced.find('}').ok_or("unclosed ${")?;
            let (expr, after) = (&braced[..end], &braced[end + 1..]);
            let name_end = expr.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(expr.len());
            let (name, op) = expr.split_at(name_end);
            let set = vars.get(name).map(String::as_str);
            let nonempty = set.filter(|v| !v.is_empty());
            out.push_str(&match op {
                "" => set.unwrap_or("").to_string(),
                _ if op.starts_with(":-") => nonempty.unwrap_or(&op[2..]).to_string(),
                _ if op.starts_with('-') => set.unwrap_or(&op[1..]).to_string(),
                _ if op.starts_with(":?") => nonempty.ok_or_else(|| format!("{name}: {}", &op[2..]))?.to_string(),
                _ if op.starts_with('?') => set.ok_or_else(|| format!("{name}: {}", &op[1..]))?.to_string(),
                _ => return Err(format!("unsupported interpolation ${{{expr}}}")),
            });
            rest = after;
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            out.push_str(vars.get(&rest[..end]).map_or("", String::as_str));
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A compose duration (`60s`, `1m30s`).
fn compose_duration(value: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut number = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = std::mem::take(&mut number).parse().unwrap_or_else(|_| panic!("duration {value}"));
        total += match c {
            'h' => Duration::from_secs(n * 3600),
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                Duration::from_millis(n)
            }
            'm' => Duration::from_secs(n * 60),
            's' => Duration::from_secs(n),
            _ => panic!("duration {value}"),
        };
    }
    assert!(number.is_empty(), "duration {value} needs a unit");
    total
}

#[test]
fn the_compose_service_starts_rankd_with_the_token_from_env() {
    let compose = yaml_doc("grafana/docker-compose.yml");
    let service = &compose["services"]["rankd"];
    assert!(service.is_object(), "a rankd service");
    let build = &service["build"];
    let context = repo().join("grafana").join(text(build, "context", "rankd's build"));
    let dockerfile = build["dockerfile"].as_str().unwrap_or("Dockerfile");
    assert_eq!(
        context.join(dockerfile).canonicalize().unwrap(),
        repo().join("Dockerfile"),
        "rankd is built from the repository's Dockerfile"
    );
    let runtime = runtime_stage();
    let words = |key: &str| match &service[key] {
        Json::Null => None,
        Json::String(s) => Some(s.split_whitespace().map(String::from).collect()),
        list => Some(strings(list, key)),
    };
    let argv = container_argv(&runtime, words("entrypoint"), words("command"));

    // The environment, interpolated from .env as compose does: the example
    // as shipped is refused; with a token set in it, it runs.
    let example = read_text("grafana/.env.example");
    let environment: Vec<(String, String)> = match &service["environment"] {
        Json::Object(map) => map.iter().map(|(k, v)| (k.clone(), v.as_str().expect("a string").to_string())).collect(),
        Json::Array(list) => strings(&Json::Array(list.clone()), "environment")
            .into_iter()
            .map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())).expect("KEY=VALUE"))
            .collect(),
        other => panic!("environment: {other}"),
    };
    let resolve = |vars: &BTreeMap<String, String>| -> Result<Vec<(String, String)>, String> {
        environment.iter().map(|(k, v)| Ok((k.clone(), interpolate(v, vars)?))).collect()
    };
    let shipped = dotenv(&example);
    assert_eq!(shipped.get("RANKD_AUTH_TOKEN").map(String::as_str), Some(""), ".env.example leaves the token to set");
    let refusal = resolve(&shipped).expect_err("compose refuses .env.example as shipped");
    assert!(refusal.contains("set RANKD_AUTH_TOKEN in grafana/.env"), "compose's refusal says what to do: {refusal}");
    let token = new_token();
    let mut dotenv_set = shipped.clone();
    dotenv_set.insert("RANKD_AUTH_TOKEN".into(), token.clone());
    let mut env = runtime.env();
    env.extend(resolve(&dotenv_set).expect("interpolated"));
    assert!(env.contains(&("RANKD_AUTH_TOKEN".into(), token.clone())), "the token reaches rankd");
    let launch = Launch { what: "grafana/docker-compose.yml's rankd".into(), argv, env, files: Vec::new() };

    // Ports, volume and Prometheus's target against the command line.
    let (client, metrics) = (launch.client_addr(), launch.metrics_addr());
    let published: BTreeSet<u16> = strings(&service["ports"], "ports")
        .iter()
        .map(|p| p.rsplit(':').next().unwrap().trim_end_matches("/tcp").parse().unwrap())
        .collect();
    assert_eq!(published, BTreeSet::from([client.port(), metrics.port()]), "published container ports");
    let volumes = strings(&service["volumes"], "volumes");
    let data = volumes.iter().find_map(|v| v.split(':').nth(1).filter(|target| *target == launch.data_dir()));
    assert!(data.is_some(), "a volume is mounted at the data dir {}: {volumes:?}", launch.data_dir());
    let prometheus = yaml_doc("grafana/prometheus.yml");
    let targets: Vec<String> = prometheus["scrape_configs"]
        .as_array()
        .expect("scrape_configs")
        .iter()
        .filter(|job| job["job_name"] == "rankd")
        .flat_map(|job| {
            job["static_configs"].as_array().unwrap().iter().flat_map(|c| strings(&c["targets"], "targets"))
        })
        .collect();
    assert_eq!(targets, [format!("rankd:{}", metrics.port())], "Prometheus scrapes the service's metrics port");
    let healthy = &compose["services"]["prometheus"]["depends_on"]["rankd"]["condition"];
    assert_eq!(healthy, "service_healthy", "Prometheus waits for rankd's HEALTHCHECK");
    let grace = compose_duration(text(service, "stop_grace_period", "rankd"));
    assert!(grace >= Duration::from_secs(30), "stop_grace_period {grace:?} leaves SIGTERM time to commit");
    let gitignore = read_text(".gitignore");
    assert!(gitignore.lines().any(|l| l.trim() == "/grafana/.env"), ".gitignore keeps grafana/.env out of git");
    let server = launch.start();
    assert_eq!(healthcheck(&runtime).run(&server).code(), Some(0), "the image's HEALTHCHECK passes");
    check_clients(server.at(client.port()), Grant::Plain(&token));
    server.stop(signal_named(runtime.one("STOPSIGNAL")), grace);
}

// ---- Kubernetes ------------------------------------------------------------

/// The documents `kubectl apply -k deploy/k8s` sends: rendered by
/// `kubectl kustomize` when kubectl is there, else the kustomization's
/// resources as written (and its `images:` checked by hand).
fn k8s_documents() -> Vec<Json> {
    let dir = repo().join("deploy/k8s");
    let kustomization = yaml_doc("deploy/k8s/kustomization.yaml");
    let mut docs = Vec::new();
    for resource in strings(&kustomization["resources"], "resources") {
        docs.extend(yaml_file(&dir.join(resource)));
    }
    let images = kustomization["images"].as_array().cloned().unwrap_or_default();
    let rendered = Command::new("kubectl").arg("kustomize").arg(&dir).output();
    match rendered {
        Ok(out) => {
            assert!(out.status.success(), "kubectl kustomize deploy/k8s:\n{}", String::from_utf8_lossy(&out.stderr));
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), &out.stdout).unwrap();
            let rendered = yaml_file(file.path());
            let names = |docs: &[Json]| -> BTreeSet<String> {
                docs.iter().map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"])).collect()
            };
            assert_eq!(names(&rendered), names(&docs), "kubectl kustomize renders the resources listed");
            for image in &images {
                let want = format!("{}:{}", text(image, "newName", "images"), text(image, "newTag", "images"));
                let found = rendered.iter().filter(|d| d["kind"] == "StatefulSet").all(|d| {
                    d["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().any(|c| c["image"] == want)
                });
                assert!(found, "kustomize sets the image to {want}");
            }
            rendered
        }
        Err(e) => {
            eprintln!("NOTE: no kubectl ({e}): deploy/k8s checked from its resource files, not rendered by kustomize");
            for image in &images {
                let name = text(image, "name", "images");
                let used = docs.iter().filter(|d| d["kind"] == "StatefulSet").all(|d| {
                    d["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().any(|c| c["image"] == name)
                });
                assert!(used, "kustomization.yaml's image {name} is the one the StatefulSet runs");
            }
            docs
        }
    }
}

fn find<'a>(docs: &'a [Json], kind: &str, name: &str) -> &'a Json {
    let mut found = docs.iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind} {name}"));
    assert!(found.next().is_none(), "two of {kind} {name}");
    doc
}

/// Whether every label of `selector` is on `labels`.
fn selects(selector: &Json, labels: &Json) -> bool {
    let selector = selector.as_object().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| &labels[k] == v)
}

/// A container port named or numbered `port` (a probe's or a Service's target).
fn container_port(container: &Json, port: &Json) -> u16 {
    let ports = container["ports"].as_array().expect("container ports");
    let found = match port {
        Json::Number(n) => ports.iter().find(|p| p["containerPort"].as_u64() == n.as_u64()),
        Json::String(name) => ports.iter().find(|p| p["name"] == name.as_str()),
        other => panic!("a port is a number or a name: {other}"),
    };
    let found = found.unwrap_or_else(|| panic!("port {port} is none of the container's: {ports:?}"));
    found["containerPort"].as_u64().expect("containerPort") as u16
}

#[test]
fn the_kubernetes_statefulset_starts_rankd_and_its_probes_answer() {
    let docs = k8s_documents();
    let statefulset = docs.iter().find(|d| d["kind"] == "StatefulSet").expect("a StatefulSet");
    assert!(
        docs.iter().all(|d| d["kind"] != "Secret"),
        "the kustomization ships no Secret: the tokens are the operator's, created from a file"
    );
    let spec = &statefulset["spec"];
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(spec["replicas"], 1, "one rankd (it is no cluster: more replicas would be separate servers)");
    assert!(selects(&spec["selector"]["matchLabels"], labels), "the StatefulSet selects its pods");
    let headless = find(&docs, "Service", text(spec, "serviceName", "StatefulSet"));
    assert_eq!(headless["spec"]["clusterIP"], "None", "serviceName is a headless Service");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    assert!(grace >= 60, "terminationGracePeriodSeconds {grace} leaves SIGTERM time to commit");

    let runtime = runtime_stage();
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["runAsUser"], image_uid(&runtime), "runAsUser is the image's user");
    assert!(security["fsGroup"].is_u64(), "fsGroup makes the volume the user's");
    let containers = pod["containers"].as_array().expect("containers");
    let container = containers.iter().find(|c| c["name"] == "rankd").expect("a container rankd");
    let hardened = &container["securityContext"];
    assert_eq!(hardened["readOnlyRootFilesystem"], true);
    assert_eq!(hardened["allowPrivilegeEscalation"], false);
    assert_eq!(hardened["capabilities"]["drop"], serde_json::json!(["ALL"]));

    let field = |key: &str| (!container[key].is_null()).then(|| strings(&container[key], key));
    let argv = container_argv(&runtime, field("command"), field("args"));

    // The environment, and the files its volumes put in place: the Secret
    // (from secret.example.yaml) where the manifest mounts it.
    let secrets = yaml_file(&repo().join("deploy/k8s/secret.example.yaml"));
    let mut env = runtime.env();
    for var in container["env"].as_array().cloned().unwrap_or_default() {
        let name = text(&var, "name", "env").to_string();
        let value = match (&var["value"], &var["valueFrom"]["secretKeyRef"]) {
            (Json::String(value), _) => value.clone(),
            (_, key) if key.is_object() => {
                let secret = find(&secrets, "Secret", text(key, "name", "secretKeyRef"));
                text(&secret["stringData"], text(key, "key", "secretKeyRef"), "the Secret").to_string()
            }
            _ => panic!("env {name}: a value or a secretKeyRef"),
        };
        env.push((name, value));
    }
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let claims = spec["volumeClaimTemplates"].as_array().expect("volumeClaimTemplates: a volume per pod");
    let mut files = Vec::new();
    let mut data_mount = None;
    for mount in container["volumeMounts"].as_array().expect("volumeMounts") {
        let (name, path) = (text(mount, "name", "volumeMount"), text(mount, "mountPath", "volumeMount"));
        if claims.iter().any(|claim| claim["metadata"]["name"] == name) {
            data_mount = Some(path.to_string());
            continue;
        }
        let volume = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
        let source = &volume["secret"];
        assert!(source.is_object(), "volume {name}: only Secret volumes are expected");
        assert_eq!(mount["readOnly"], true, "the Secret is mounted read-only");
        let secret = find(&secrets, "Secret", text(source, "secretName", "secret volume"));
        let data = secret["stringData"].as_object().expect("the example Secret has stringData");
        let items: Vec<(String, String)> = match source["items"].as_array() {
            Some(items) => {
                items.iter().map(|i| (text(i, "key", "items").into(), text(i, "path", "items").into())).collect()
            }
            None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
        };
        for (key, file) in items {
            let content = data.get(&key).and_then(Json::as_str).unwrap_or_else(|| panic!("the Secret has no {key}"));
            files.push((format!("{}/{file}", path.trim_end_matches('/')), content.to_string()));
        }
    }
    let launch = Launch { what: "deploy/k8s's StatefulSet".into(), argv, env, files };
    assert_eq!(data_mount.as_deref(), Some(launch.data_dir()), "the per-pod volume is mounted at --data-dir");
    let (client, metrics) = (launch.client_addr(), launch.metrics_addr());
    assert!(
        client.ip().is_unspecified() && metrics.ip().is_unspecified(),
        "rankd listens on the pod's IP (where Services and the kubelet's probes connect), not loopback"
    );
    let annotations = &spec["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], metrics.port().to_string(), "the scrape annotation");

    // As shipped, the example Secret's empty tokens are no tokens: refused.
    assert!(launch.refused().contains(NO_TOKEN), "secret.example.yaml's placeholders must not start an open server");
    let tokens_file = launch.env.iter().find(|(k, _)| k == "RANKD_TOKENS_FILE").map(|(_, v)| v.clone());
    let tokens_file = tokens_file.expect("RANKD_TOKENS_FILE names the mounted tokens file");
    let (filled, read, write) = {
        let (_, example) = launch.files.iter().find(|(path, _)| *path == tokens_file).expect("the file is mounted");
        fill_tokens(example)
    };
    let files =
        launch.files.iter().map(|(p, c)| (p.clone(), if *p == tokens_file { filled.clone() } else { c.clone() }));
    let launch = Launch { files: files.collect(), what: "deploy/k8s's StatefulSet, tokens filled in".into(), ..launch };
    let server = launch.start();

    // Every probe answers 200 on the port it names, which is the metrics port.
    for (probe, path) in [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} asks {path}");
        assert!(get["scheme"].is_null() || get["scheme"] == "HTTP", "{probe}: rankd's metrics are plain HTTP here");
        let port = container_port(container, &get["port"]);
        assert_eq!(port, metrics.port(), "{probe} asks the metrics port");
        assert_eq!(server.get(port, path), Ok(200), "{probe}: GET {path} on port {port}");
    }
    // The Services reach the container's ports; the client one, rankd's clients.
    for service in docs.iter().filter(|d| d["kind"] == "Service") {
        let name = text(&service["metadata"], "name", "Service");
        assert!(selects(&service["spec"]["selector"], labels), "Service {name} selects the pods");
        for port in service["spec"]["ports"].as_array().expect("ports") {
            let target = container_port(container, &port["targetPort"]);
            assert!(target == client.port() || target == metrics.port(), "Service {name} targets a port rankd serves");
        }
    }
    let clients = find(&docs, "Service", "rankd");
    let ports = clients["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "the client Service carries the client port only");
    assert_eq!(container_port(container, &ports[0]["targetPort"]), client.port());
    check_clients(server.at(client.port()), Grant::Roles { read: &read, write: &write });
    // The container runtime stops with the image's STOPSIGNAL.
    server.stop(signal_named(runtime.one("STOPSIGNAL")), Duration::from_secs(grace));
}

// ---- systemd -------------------------------------------------------------

/// A unit file's settings by section, in order (continuation lines joined).
fn parse_unit(text: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut section = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        let line = std::mem::take(&mut pending) + trimmed;
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else {
            let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("unit line {line:?}"));
            sections.entry(section.clone()).or_default().push((key.trim().into(), value.trim().into()));
        }
    }
    sections
}

/// Splits a command line or an `Environment=` value into words the way
/// systemd does (whitespace, double and single quotes).
fn unit_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in value.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "unclosed quote in {value:?}");
    words.extend(word);
    words
}

/// systemd's specifiers (those the unit may use) in `value`.
fn specifiers(value: &str, unit: &str, credentials: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('d') => out.push_str(credentials),
            Some('n') => out.push_str(unit),
            Some('N') => out.push_str(unit.trim_end_matches(".service")),
            Some('S') => out.push_str("/var/lib"),
            Some('t') => out.push_str("/run"),
            other => panic!("specifier %{other:?} in {value:?}: teach tests/deployment.rs what it means"),
        }
    }
    out
}

/// `${NAME}` and `$NAME` in an ExecStart word, from the service's environment.
fn expand_vars(word: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let (name, after) = match rest.strip_prefix('{') {
            Some(braced) => braced.split_once('}').expect("closed ${"),
            None => rest.split_at(rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len())),
        };
        out.push_str(env.get(name).unwrap_or_else(|| panic!("ExecStart uses ${name}, which the service does not set")));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// A systemd time span (`60`, `60s`, `1min 30s`, `2m`).
fn systemd_timespan(value: &str) -> Duration {
    if let Ok(seconds) = value.parse::<u64>() {
        return Duration::from_secs(seconds);
    }
    let mut total = Duration::ZERO;
    let mut rest = value.trim();
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().unwrap_or_else(|_| panic!("time span {value}"));
        let after = rest[digits..].trim_start();
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c.is_whitespace()).unwrap_or(after.len());
        total += match &after[..unit_len] {
            "ms" | "msec" => Duration::from_millis(n),
            "" | "s" | "sec" | "second" | "seconds" => Duration::from_secs(n),
            "m" | "min" | "minute" | "minutes" => Duration::from_secs(n * 60),
            "h" | "hr" | "hour" | "hours" => Duration::from_secs(n * 3600),
            unit => panic!("time span {value}: unit {unit}"),
        };
        rest = after[unit_len..].trim_start();
    }
    total
}

fn systemd_analyze() -> Command {
    let found = Command::new("systemd-analyze").arg("--version").output().is_ok_and(|out| out.status.success());
    assert!(
        found,
        "tests/deployment.rs checks the systemd unit with systemd-analyze: apt-get install systemd (.ci/run does)"
    );
    Command::new("systemd-analyze")
}

#[test]
fn the_systemd_unit_verifies_and_its_exec_start_starts_rankd() {
    const UNIT: &str = "rankd.service";
    let text = read_text("deploy/systemd/rankd.service");
    let unit = parse_unit(&text);
    let service = unit.get("Service").expect("[Service]");
    let values = |key: &str| service.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
    let one = |key: &str| match values(key)[..] {
        [value] => value.to_string(),
        ref found => panic!("{UNIT}: {key}= given {} times", found.len()),
    };

    // The hardening stays: each of these exactly as the unit sets it.
    for (key, want) in [
        ("DynamicUser", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("MemoryDenyWriteExecute", "yes"),
        ("LockPersonality", "yes"),
        ("RestrictNamespaces", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("SystemCallArchitectures", "native"),
        ("Restart", "on-failure"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(one(key), want, "{UNIT}: {key}=");
    }
    assert_eq!(values("SystemCallFilter").first(), Some(&"@system-service"), "{UNIT}: SystemCallFilter=");
    let stop_timeout = systemd_timespan(&one("TimeoutStopSec"));
    assert!(stop_timeout >= Duration::from_secs(60), "TimeoutStopSec leaves SIGTERM time to commit");
    let nofile: u64 = one("LimitNOFILE").parse().expect("LimitNOFILE a number");
    assert!(nofile >= 8192, "LimitNOFILE {nofile} holds --max-connections (4096) and the storage files");
    for file in values("EnvironmentFile") {
        assert!(file.starts_with('-'), "EnvironmentFile={file} is optional (`-`): the test does not provide it");
    }

    // systemd-analyze verify, on the unit as written with the binary where
    // its ExecStart expects it, under a root that has the system's units;
    // verify exits 0 on many mistakes, so anything it says about the unit fails.
    let root = tempfile::tempdir().unwrap();
    let exec_start = unit_words(&one("ExecStart"));
    let program = &exec_start[0];
    assert!(program.starts_with('/'), "ExecStart names rankd by absolute path: {program}");
    let binary = under(root.path(), program);
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    std::fs::hard_link(env!("CARGO_BIN_EXE_rankd"), &binary)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_rankd"), &binary).map(drop))
        .expect("put rankd where ExecStart looks");
    let units = under(root.path(), "/etc/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(units.join(UNIT), &text).unwrap();
    let system_units = Path::new("/usr/lib/systemd/system");
    std::fs::create_dir_all(under(root.path(), "/usr/lib/systemd")).unwrap();
    let copied = Command::new("cp").arg("-a").arg(system_units).arg(under(root.path(), "/usr/lib/systemd/")).status();
    assert!(
        copied.is_ok_and(|s| s.success()),
        "copy the system's units ({}) under the verify root",
        system_units.display()
    );
    let out =
        systemd_analyze().arg("verify").arg(format!("--root={}", root.path().display())).arg(UNIT).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let about_unit: Vec<&str> = said.lines().filter(|l| l.contains(UNIT)).collect();
    assert!(out.status.success() && about_unit.is_empty(), "systemd-analyze verify {UNIT}:\n{said}");
    // Without the binary, verify does complain: it did look at ExecStart.
    std::fs::remove_file(&binary).unwrap();
    let out =
        systemd_analyze().arg("verify").arg(format!("--root={}", root.path().display())).arg(UNIT).output().unwrap();
    assert!(!out.status.success(), "verify checks ExecStart's binary exists");

    let out = systemd_analyze()
        .args(["security", "--offline=yes"])
        .arg(repo().join("deploy/systemd").join(UNIT))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let exposure: f64 = report
        .lines()
        .find_map(|l| {
            l.split_once(&format!("Overall exposure level for {UNIT}: "))?.1.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| {
            panic!("systemd-analyze security printed no exposure:\n{report}{}", String::from_utf8_lossy(&out.stderr))
        });
    assert!(exposure <= 2.0, "systemd-analyze security rates {UNIT} {exposure} (want <= 2.0, 'OK'):\n{report}");

    // ExecStart with systemd's expansions: specifiers, then the service's
    // environment (Environment= and what systemd sets: STATE_DIRECTORY for
    // StateDirectory=, CREDENTIALS_DIRECTORY for LoadCredential=).
    let credentials = format!("/run/credentials/{UNIT}");
    let mut env = BTreeMap::new();
    let state = one("StateDirectory");
    env.insert("STATE_DIRECTORY".to_string(), format!("/var/lib/{state}"));
    let mut files = Vec::new();
    let tokens = [new_token(), new_token()];
    for credential in values("LoadCredential") {
        let (id, source) = credential.split_once(':').expect("LoadCredential=ID:PATH");
        env.insert("CREDENTIALS_DIRECTORY".to_string(), credentials.clone());
        // What the operator writes at the source path: the README's format.
        assert!(id.ends_with("tokens.toml"), "LoadCredential={credential}: the tokens file is the only credential");
        let content = format!(
            "[[tokens]]\nrole = \"read\"\ntoken = \"{}\"\n[[tokens]]\nrole = \"write\"\ntoken = \"{}\"\n",
            tokens[0], tokens[1]
        );
        eprintln!("{UNIT}: credential {id} from {source} (a read and a write token)");
        files.push((format!("{credentials}/{id}"), content));
    }
    for assignment in values("Environment") {
        for pair in unit_words(&specifiers(assignment, UNIT, &credentials)) {
            let (k, v) = pair.split_once('=').expect("Environment=KEY=VALUE");
            env.insert(k.to_string(), v.to_string());
        }
    }
    let argv: Vec<String> =
        exec_start.iter().map(|word| expand_vars(&specifiers(word, UNIT, &credentials), &env)).collect();
    let launch =
        Launch { what: format!("deploy/systemd/{UNIT}'s ExecStart"), argv, env: env.into_iter().collect(), files };
    assert_eq!(launch.data_dir(), format!("/var/lib/{state}"), "the data dir is the StateDirectory");
    let server = launch.start();
    for path in ["/healthz", "/readyz"] {
        assert_eq!(server.get(launch.metrics_addr().port(), path), Ok(200), "GET {path}");
    }
    check_clients(server.at(launch.client_addr().port()), Grant::Roles { read: &tokens[0], write: &tokens[1] });
    server.stop(signal_named(&one("KillSignal")), stop_timeout);
}
