//! The Dockerfile: its stages read as Docker would (the compose and Kubernetes
//! tests run its image too), its CMD, HEALTHCHECK and .dockerignore.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::files::{read_text, repo};
use crate::launch::{check_clients, new_token, signal_named, Grant, Launch, Server, NO_TOKEN};
/// One build stage: its base image, its name and its instructions in order
/// (keyword upper-cased, continuation lines joined, comments dropped).
pub struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions.iter().filter(|(k, _)| k == keyword).map(|(_, rest)| rest.as_str()).collect()
    }

    pub fn one(&self, keyword: &str) -> &str {
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
    pub fn env(&self) -> Vec<(String, String)> {
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
pub fn runtime_stage() -> Stage {
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
pub fn image_uid(runtime: &Stage) -> u32 {
    let user = runtime.one("USER");
    let uid = user.split(':').next().unwrap_or_default();
    let uid: u32 = uid.parse().unwrap_or_else(|_| panic!("USER {user}: give a numeric uid"));
    assert_ne!(uid, 0, "the image runs as a non-root user");
    uid
}

/// The command a container of the image runs: `entrypoint` replaces the
/// image's ENTRYPOINT and then drops its CMD, `cmd` replaces CMD (Docker
/// compose's `entrypoint`/`command`, Kubernetes' `command`/`args`).
pub fn container_argv(runtime: &Stage, entrypoint: Option<Vec<String>>, cmd: Option<Vec<String>>) -> Vec<String> {
    let replaced = entrypoint.is_some();
    let mut argv = entrypoint.unwrap_or_else(|| runtime.exec_form("ENTRYPOINT"));
    match cmd {
        Some(cmd) => argv.extend(cmd),
        None if !replaced => argv.extend(runtime.exec_form("CMD")),
        None => {}
    }
    argv
}

// ---- the image, its health check and .dockerignore ----------------------

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
pub struct Healthcheck {
    script: PathBuf,
    args: Vec<String>,
}

pub fn healthcheck(runtime: &Stage) -> Healthcheck {
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
    pub fn run(&self, server: &Server) -> std::process::ExitStatus {
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
