//! `grafana/docker-compose.yml`: the `rankd` service's command and
//! environment, interpolated from `grafana/.env.example` as compose would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value as Json;

use crate::dockerfile::{container_argv, healthcheck, runtime_stage};
use crate::files::{read_text, repo, strings, text, yaml_doc};
use crate::launch::{check_clients, new_token, signal_named, Grant, Launch};
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
