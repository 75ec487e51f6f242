//! `deploy/systemd/rankd.service`: `systemd-analyze verify` and `security`,
//! then its `ExecStart` expanded as systemd would, run with its credential.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::files::{read_text, repo};
use crate::launch::{check_clients, new_token, signal_named, under, Grant, Launch};
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
            other => panic!("specifier %{other:?} in {value:?}: teach tests/deployment/systemd.rs what it means"),
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
        "tests/deployment/systemd.rs checks the systemd unit with systemd-analyze: \
         apt-get install systemd (.ci/run does)"
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
