//! Test harness: runs the real `rankd serve` binary on a free loopback port
//! and a temporary data dir, and can kill -9 and restart it; plus polling
//! helpers ([`wait_for`], [`wait_until`]) so tests wait on the condition they
//! need, with a deadline and a message, instead of sleeping and hoping.
//! [`prometheus`] runs a real Prometheus against a server, alerts loaded.

#![allow(dead_code)]

pub mod certs;
pub mod load;
pub mod ops;
pub mod oracle_board;
pub mod power;
pub mod prometheus;
pub mod raw;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rankd_client::Client;

/// The test hook that shifts the server's clock by a number of seconds.
pub const CLOCK_OFFSET: &str = "--debug-clock-offset-secs";

/// The [`CLOCK_OFFSET`] that makes a server started now read `at` (Unix
/// seconds).
pub fn offset_to(at: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    (at - now as i64).to_string()
}

/// A running server process.
pub struct Server {
    child: Child,
    /// `host:port` it listens on.
    pub addr: String,
    /// `host:port` of its metrics endpoint.
    pub metrics_addr: String,
    data_dir: PathBuf,
    shards: usize,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// Everything the server printed on stdout, over all its runs: the pipe
    /// is drained all the time (a full pipe would block the server), so it
    /// might as well be kept for tests that search it.
    stdout: Arc<Mutex<Vec<u8>>>,
    /// The thread draining the running process's stdout; joined once the
    /// process has exited, so `stdout` then holds all it printed.
    drain: Option<JoinHandle<()>>,
    /// The file its stderr goes to (appended to by every run), when the test
    /// asked for it; otherwise stderr is inherited, so a failing test shows
    /// the server's logs.
    stderr_log: Option<PathBuf>,
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server with `shards` shards on a fresh data dir.
    pub fn start(shards: usize) -> Self {
        Self::start_with(shards, &[])
    }

    /// Same, with extra `serve` flags.
    pub fn start_with(shards: usize, extra: &[&str]) -> Self {
        Self::start_with_env(shards, extra, &[])
    }

    /// Same, with extra flags and environment variables (kept for restarts).
    pub fn start_with_env(shards: usize, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_fresh(shards, extra, env, false)
    }

    /// Same, with the server's stderr written to a file instead of inherited,
    /// so the test can read everything the server printed
    /// ([`Server::stderr_text`], [`Server::stdout_text`]).
    pub fn start_capturing(shards: usize, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_fresh(shards, extra, env, true)
    }

    fn start_fresh(shards: usize, extra: &[&str], env: &[(&str, &str)], capture_stderr: bool) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let data_dir = tmp.path().join("data");
        let stderr_log = capture_stderr.then(|| tmp.path().join("stderr.log"));
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let stdout = Arc::default();
        let (child, addr, metrics_addr, drain) =
            launch(&data_dir, shards, &extra, &env, &stdout, stderr_log.as_deref()).expect("server starts");
        let drain = Some(drain);
        Self { child, addr, metrics_addr, data_dir, shards, extra, env, stdout, drain, stderr_log, _tmp: Some(tmp) }
    }

    /// Starts a server on a data dir the caller owns (e.g. on a special
    /// filesystem); it must outlive the server.
    pub fn start_in(data_dir: &Path, shards: usize, extra: &[&str]) -> Self {
        Self::try_start_in(data_dir, shards, extra).expect("server starts")
    }

    /// [`Server::start_in`], or why the server did not start (its exit
    /// status and first line; its stderr is inherited).
    pub fn try_start_in(data_dir: &Path, shards: usize, extra: &[&str]) -> Result<Self, String> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let stdout = Arc::default();
        let (child, addr, metrics_addr, drain) = launch(data_dir, shards, &extra, &[], &stdout, None)?;
        Ok(Self {
            child,
            addr,
            metrics_addr,
            data_dir: data_dir.to_path_buf(),
            shards,
            extra,
            env: Vec::new(),
            stdout,
            drain: Some(drain),
            stderr_log: None,
            _tmp: None,
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the server process, bytes (Linux). Panics if
    /// `/proc/<pid>/status` cannot be read or has no parsable `VmRSS` line:
    /// a memory bound checked against a made-up 0 would pass unchecked.
    pub fn rss_bytes(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read the server's RSS from {path}: {e}"));
        parse_vm_rss(&status).unwrap_or_else(|| panic!("no parsable `VmRSS: <n> kB` line in {path}:\n{status}"))
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A connected client.
    pub async fn client(&self) -> Client {
        Client::connect_retry(&self.addr, Duration::from_secs(10)).await.expect("connect")
    }

    /// kill -9: no chance to flush anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
        self.join_drain();
    }

    /// Once the process has exited: waits for the rest of its stdout.
    fn join_drain(&mut self) {
        if let Some(drain) = self.drain.take() {
            drain.join().expect("the stdout drain thread");
        }
    }

    /// SIGTERM, then waits for the exit status (bounded).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.wait_for_exit()
    }

    /// Waits for the process to exit by itself (bounded: 30 s), e.g. after
    /// a SIGTERM the test sent (a second one would cut the shutdown short).
    pub fn wait_for_exit(&mut self) -> std::process::ExitStatus {
        let status = wait_for_blocking(Duration::from_secs(30), "the server to exit", || {
            self.child.try_wait().expect("wait").ok_or_else(|| "still running".to_string())
        });
        self.join_drain();
        status
    }

    /// Starts the server again on the same data dir (after kill9/terminate).
    pub fn restart(&mut self) {
        let (child, addr, metrics_addr, drain) =
            launch(&self.data_dir, self.shards, &self.extra, &self.env, &self.stdout, self.stderr_log.as_deref())
                .expect("server restarts");
        self.drain = Some(drain);
        self.child = child;
        self.addr = addr;
        self.metrics_addr = metrics_addr;
    }

    /// Restarts with `flag` set to `value` from now on (e.g.
    /// [`CLOCK_OFFSET`]: a clock moved forward while the server was down).
    pub fn restart_with_flag(&mut self, flag: &str, value: &str) {
        if let Some(at) = self.extra.iter().position(|arg| arg == flag) {
            self.extra.drain(at..(at + 2).min(self.extra.len()));
        }
        self.extra.extend([flag.to_string(), value.to_string()]);
        self.restart();
    }

    /// Everything the server printed on stdout so far, over all its runs.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().expect("stdout buffer")).into_owned()
    }

    /// Everything the server printed on stderr so far, over all its runs.
    /// Only for a server started with [`Server::start_capturing`].
    pub fn stderr_text(&self) -> String {
        let path = self.stderr_log.as_ref().expect("stderr is captured only by Server::start_capturing");
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read the server's stderr {}: {e}", path.display()));
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The server's `/metrics` page (Prometheus text format).
    pub fn metrics_text(&self) -> String {
        let mut stream = std::net::TcpStream::connect(&self.metrics_addr)
            .unwrap_or_else(|e| panic!("connect to the metrics endpoint {}: {e}", self.metrics_addr));
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.metrics_addr).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read /metrics");
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "GET /metrics: {head}");
        body.to_string()
    }

    /// A metric's current value: the sum of the samples of `name` whose
    /// labels contain all of `labels` (e.g. `r#"outcome="overloaded""#`).
    /// Panics if the server exports no such series.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let text = self.metrics_text();
        sample(&text, name, labels).unwrap_or_else(|| panic!("no sample of {name} with labels {labels:?} in /metrics"))
    }

    /// A counter's value like [`Server::metric`], but 0 while the server
    /// has not exported it yet.
    pub fn counter(&self, name: &str, labels: &[&str]) -> f64 {
        sample(&self.metrics_text(), name, labels).unwrap_or(0.0)
    }

    /// Asserts, for a server started with [`Server::start_capturing`] and
    /// stopped, that its captured stdout and stderr are the whole of its
    /// output (from its first line to its last) and that none of `secrets`
    /// is in them.
    pub fn assert_never_printed(&self, secrets: &[&str]) {
        let (stdout, stderr) = (self.stdout_text(), self.stderr_text());
        assert!(stdout.starts_with("rankd listening on "), "stdout was captured: {stdout:?}");
        for line in ["listening", "shut down cleanly"] {
            assert!(stderr.contains(line), "the server's logs were captured (no {line:?} in them):\n{stderr}");
        }
        for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
            for secret in secrets {
                assert!(!text.contains(secret), "the token {secret:?} leaked into the server's {name}:\n{text}");
            }
        }
    }
}

/// The sum of every sample of `name` whose labels contain all of `labels`
/// in a Prometheus text page; `None` if there is none.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| {
            l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("bad sample line: {l}"))
        })
        .reduce(|a, b| a + b)
}

/// The `VmRSS` of a `/proc/<pid>/status` text, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim();
    kb.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// How often the wait helpers look again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Ok` and returns that value. `check`
/// answers `Err` with what it saw; once `timeout` has passed the test fails
/// naming `what` it waited for and the last thing seen.
pub async fn wait_for<T>(timeout: Duration, what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(Instant::now() < deadline, "waited {timeout:?} for {what} in vain; last seen: {seen}"),
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`wait_for`] a condition that is simply true or false.
pub async fn wait_until(timeout: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    wait_for(timeout, what, async || if condition().await { Ok(()) } else { Err("not yet".to_string()) }).await
}

/// [`wait_for`] outside an async runtime: polls with a thread sleep.
pub fn wait_for_blocking<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(seen) => assert!(Instant::now() < deadline, "waited {timeout:?} for {what} in vain; last seen: {seen}"),
        }
        std::thread::sleep(POLL_EVERY);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `rankd serve` and waits for its "listening on" line; returns the
/// process, its client address, its metrics address and the thread that
/// appends its stdout to `stdout` (drained all the time). Its stderr goes to
/// the file `stderr_log` (appended) if given, else is inherited.
fn launch(
    data_dir: &Path,
    shards: usize,
    extra: &[String],
    env: &[(String, String)],
    stdout: &Arc<Mutex<Vec<u8>>>,
    stderr_log: Option<&Path>,
) -> Result<(Child, String, String, JoinHandle<()>), String> {
    let stderr = match stderr_log {
        None => Stdio::inherit(),
        Some(path) => Stdio::from(
            File::options().create(true).append(true).open(path).map_err(|e| format!("{}: {e}", path.display()))?,
        ),
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .arg("serve")
        // A test that must find the server at one address across restarts
        // gives its own `--listen`.
        .args(if extra.iter().any(|arg| arg == "--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--shards", &shards.to_string()])
        .args(extra)
        .env("RANKD_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut pipe = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut first = Vec::new();
    let read = pipe.read_until(b'\n', &mut first);
    stdout.lock().expect("stdout buffer").extend_from_slice(&first);
    let line = String::from_utf8_lossy(&first);
    match read {
        Ok(_) if line.starts_with("rankd listening on ") => {
            let mut words = line.trim_end().trim_start_matches("rankd listening on ").split(' ');
            let addr = words.next().unwrap_or_default().to_string();
            let metrics_addr = words.nth(1).unwrap_or_default().to_string();
            // Keep draining stdout so the server never blocks on it.
            let stdout = stdout.clone();
            let drain = std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    stdout.lock().expect("stdout buffer").extend_from_slice(&chunk[..n]);
                }
            });
            Ok((child, addr, metrics_addr, drain))
        }
        other => {
            let _ = child.kill();
            let status = child.wait().map_err(|e| e.to_string())?;
            Err(format!("server did not start ({status}): {other:?}, first line {line:?}"))
        }
    }
}

/// A loopback port nothing listens on right now (for a server that must
/// come back on the same address after a restart).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// Runs `rankd serve` expecting it to fail; returns its stderr.
pub fn serve_fails(data_dir: &Path, shards: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--shards", &shards.to_string()])
        .output()
        .expect("run rankd");
    assert!(!out.status.success(), "server should have refused to start");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A path as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// A child process killed (and reaped) when dropped, so a failing test
/// leaves none behind.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command` (e.g. a `rankd serve` that should refuse to start) with
/// its stdout discarded, waits up to 10 s for it to exit (the test fails,
/// naming `what`, if it does not), and returns its exit status and stderr.
pub fn run_to_exit(command: &mut Command, what: &str) -> (ExitStatus, String) {
    let mut child = Running(command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn rankd"));
    let status = wait_for_blocking(Duration::from_secs(10), what, || {
        child.0.try_wait().expect("wait").ok_or_else(|| "still running".to_string())
    });
    let mut stderr = String::new();
    child.0.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    (status, stderr)
}

/// A field of a reply map (`None` if the reply is no map or lacks it).
pub fn field<'a>(reply: &'a rmpv::Value, name: &str) -> Option<&'a rmpv::Value> {
    reply.as_map()?.iter().find(|(key, _)| key.as_str() == Some(name)).map(|(_, value)| value)
}

/// Runs `rankd check` on a stopped server's data dir and fails the test,
/// saying `after` what, unless the trees, index and players agree.
pub fn rankd_check(dir: &Path, after: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["check", "--data-dir"])
        .arg(dir)
        .env("RANKD_LOG", "warn")
        .output()
        .expect("run rankd check");
    assert!(out.status.success(), "rankd check failed {after}: {}", String::from_utf8_lossy(&out.stderr));
}
