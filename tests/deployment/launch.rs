//! Running what a deployment file gives: its command line and environment on
//! this build's binary under a temporary root, then health, clients and stop.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rankd_client::{AuthGrant, Client, Mode};

use crate::common;
/// How long a deployment's rankd may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A rankd command line and environment as a deployment file gives them,
/// and the files its platform would put in place (absolute path, content).
pub struct Launch {
    pub what: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub files: Vec<(String, String)>,
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
    pub fn client_addr(&self) -> SocketAddr {
        self.addr("--listen")
    }

    /// `--metrics-listen`: /metrics, /healthz, /readyz.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.addr("--metrics-listen")
    }

    pub fn data_dir(&self) -> &str {
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
    pub fn start(&self) -> Server {
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
    pub fn refused(&self) -> String {
        let root = tempfile::tempdir().expect("temp root");
        let stderr = root.path().join("rankd.stderr");
        // run_to_exit takes stderr itself (a pipe) and returns it.
        let (status, log) = common::run_to_exit(&mut self.command(root.path(), &stderr), &self.what);
        assert!(!status.success(), "{}: rankd should have refused to start ({status}):\n{log}", self.what);
        log
    }
}

/// `path` (absolute, as the deployment names it) under `root`.
pub fn under(root: &Path, path: &str) -> PathBuf {
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
pub struct Server {
    what: String,
    child: common::Running,
    /// The file's port → where that listener really is.
    ports: BTreeMap<u16, SocketAddr>,
    stderr: PathBuf,
    _root: tempfile::TempDir,
}

impl Server {
    /// Where the listener the file calls `port` is.
    pub fn at(&self, port: u16) -> SocketAddr {
        *self.ports.get(&port).unwrap_or_else(|| {
            panic!("{}: port {port} is none of rankd's (it listens on {:?})", self.what, self.ports.keys())
        })
    }

    /// GET `path` on the file's `port`: the HTTP status.
    pub fn get(&self, port: u16, path: &str) -> Result<u16, String> {
        http_status(self.at(port), path)
    }

    /// Sends `signal` and expects exit 0 within `grace`.
    pub fn stop(mut self, signal: libc::c_int, grace: Duration) {
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
pub fn signal_named(name: &str) -> libc::c_int {
    match name.trim_start_matches("SIG") {
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "HUP" => libc::SIGHUP,
        other => panic!("stop signal {other}: teach tests/deployment/launch.rs its number"),
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
pub fn new_token() -> String {
    (0..24).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// What a token is expected to grant.
pub enum Grant<'a> {
    /// `RANKD_AUTH_TOKEN`: everything, `auth` answers `true`.
    Plain(&'a str),
    /// A tokens file with a read and a write token.
    Roles { read: &'a str, write: &'a str },
}

/// Clients on the server's client port: nothing but `ping` before `auth`,
/// then what the tokens grant.
pub fn check_clients(addr: SocketAddr, grant: Grant) {
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
pub fn fill_tokens(example: &str) -> (String, String, String) {
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
pub const NO_TOKEN: &str = "without a token";
