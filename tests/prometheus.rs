//! The operator kit in `grafana/` works against the real thing: a real
//! Prometheus scrapes a real rankd under load, every query of the Grafana
//! dashboard returns data, the alert rules evaluate without error, and
//! promtool accepts the rules, their unit tests and the scrape config.
//!
//! Needs Prometheus 2.x at /usr/bin/prometheus and /usr/bin/promtool
//! (`apt-get install prometheus`; CI installs it). Without them these tests
//! fail: they never pass silently. `PROMETHEUS` / `PROMTOOL` override the paths.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rankd_client::{set_call, Call, Client, ConnectOptions, Mode, OpKind, Order, Ties, WatchSpec, Watcher};
use rmpv::Value as Msg;
use serde_json::Value;

use common::prometheus::{grafana_dir, tool, Prometheus};

/// The load never runs longer than this, whatever happens to the test.
const MAX_LOAD: Duration = Duration::from_secs(40);

/// How often the load backs the server up: several times while Prometheus
/// scrapes, so the backup panels' counters rise within their ranges.
const BACKUP_EVERY: Duration = Duration::from_secs(2);

fn read_dashboard() -> Value {
    let path = grafana_dir().join("dashboards/rankd.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every `expr` string anywhere in the dashboard (panel targets, panels
/// nested in collapsed rows, and anything added later).
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// Every panel that shows data (not a row), nested ones included.
fn data_panels<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
    for panel in panels.as_array().into_iter().flatten() {
        if panel["type"] != "row" {
            out.push(panel);
        }
        data_panels(&panel["panels"], out);
    }
}

/// One round of traffic that moves every series the dashboard shows: every
/// op, writes to both shards, multi-step reads, client errors, and a new
/// connection.
async fn load_round(addr: &str, client: &mut Client, round: u64) -> Result<(), rankd_client::ClientError> {
    let player = |i: u64| format!("player-{}", i % 3000);
    let mut calls: Vec<Call> = (0..64)
        .map(|j| {
            set_call("season", &player(round * 64 + j), ((round * 7919 + j * 104_729) % 100_000) as i64, Mode::Set)
        })
        .collect();
    let entries: Vec<Msg> = (0..16)
        .map(|j| Msg::Array(vec![Msg::from(player(round * 31 + j * 97)), Msg::from((round * 13 + j) as i64)]))
        .collect();
    calls.push(Call::new(OpKind::SetMany).with("board", "season").with("entries", Msg::Array(entries)));
    let someone = player(round * 17);
    calls.extend([
        Call::new(OpKind::Ping),
        Call::new(OpKind::Auth).with("token", "t"),
        Call::new(OpKind::Get).with("board", "season").with("player", someone.as_str()),
        Call::new(OpKind::Count).with("board", "season"),
        Call::new(OpKind::Rank).with("board", "season").with("player", someone.as_str()),
        Call::new(OpKind::RankOfScore).with("board", "season").with("score", 50_000),
        // approximate ranks: a summary held, refreshed and answered from
        Call::new(OpKind::Rank).with("board", "season").with("player", someone.as_str()).with("approx", true),
        Call::new(OpKind::RankOfScore).with("board", "season").with("score", 50_000).with("approx", true),
        Call::new(OpKind::Top).with("board", "season").with("limit", 10),
        // a deep offset: a multi-step read of ~22 fan-out rounds
        Call::new(OpKind::Top).with("board", "season").with("limit", 5).with("offset", 700 + round % 500),
        Call::new(OpKind::Around)
            .with("board", "season")
            .with("player", someone.as_str())
            .with("before", 3)
            .with("after", 3),
        Call::new(OpKind::Boards),
        Call::new(OpKind::Remove).with("board", "season").with("player", player(round * 17 + 1).as_str()),
        // an idempotent write, repeated every other round (a replay)
        set_call("season", &player(round * 19), 1, Mode::Incr).with("wid", format!("w{}", round / 2)),
        // client errors: unknown op, a limit over the maximum, a board config conflict
        Call::named("no_such_op"),
        Call::new(OpKind::Top).with("board", "season").with("limit", 5000),
        Call::new(OpKind::CreateBoard).with("board", "season").with("order", "asc"),
    ]);
    for result in client.pipeline::<rmpv::Value>(&calls).await? {
        match result {
            // a server error code is expected; a broken connection is not
            Err(e) if e.code().is_none() => return Err(e),
            _ => {}
        }
    }
    let scratch = format!("scratch-{round}");
    client.create_board(&scratch, Order::Desc, Ties::Competition).await?;
    client.drop_board(&scratch).await?;
    // A rank sent alone, which is answered in place.
    client.rank("season", &someone).await?;
    // A short-lived connection, so the accept rate moves.
    Client::connect(addr).await?.ping().await?;
    Ok(())
}

/// A backup on a connection of its own, read to its end.
async fn backup(addr: &str) -> Result<(), rankd_client::ClientError> {
    let mut client = Client::connect(addr).await?;
    let mut stream = client.backup().await?;
    while stream.next().await?.is_some() {}
    Ok(())
}

/// The Prometheus side of the test, blocking: scrape, then check every
/// dashboard query and every alert rule.
fn check_dashboard_against_prometheus(metrics_addr: &str) {
    let mut prometheus = Prometheus::scraping(metrics_addr);

    prometheus.wait_until("rankd's target is up", Duration::from_secs(15), |p| {
        p.query(r#"up{job="rankd"}"#).is_ok_and(|v| v == ["1"])
    });
    // Enough scrapes that every rate(...[1m]) has several samples to work with.
    prometheus.wait_until("6 scrapes of rankd", Duration::from_secs(20), |p| {
        p.query(r#"count_over_time(up{job="rankd"}[1m])"#)
            .is_ok_and(|v| v.first().and_then(|n| n.parse::<f64>().ok()).is_some_and(|n| n >= 6.0))
    });

    let mut all = Vec::new();
    exprs(&read_dashboard(), &mut all);
    assert!(all.len() >= 20, "the dashboard should hold the service's queries; found {}", all.len());
    let mut failures = Vec::new();
    let mut only_nan = Vec::new();
    for expr in &all {
        match prometheus.query(expr) {
            Err(e) => failures.push(format!("  {expr}\n    -> {e}")),
            Ok(values) if values.is_empty() => failures.push(format!("  {expr}\n    -> no data")),
            Ok(values) if values.iter().all(|v| v == "NaN") => only_nan.push(format!("  {expr}")),
            Ok(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries fail or return nothing against a live rankd:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    assert!(
        only_nan.is_empty(),
        "these dashboard queries return only NaN (no traffic in their series): make the test's load move them \
         or fix the query:\n{}",
        only_nan.join("\n")
    );
    println!("{} dashboard queries return data", all.len());

    // Every alert rule evaluates cleanly against the real series.
    prometheus.wait_until("every alert rule evaluated", Duration::from_secs(10), |p| {
        p.api("/api/v1/rules").is_ok_and(|data| {
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            !rules.is_empty() && rules.iter().all(|r| r["health"] != "unknown")
        })
    });
    let data = prometheus.api("/api/v1/rules").expect("rules API");
    let rules: Vec<&Value> = data["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    let broken: Vec<String> = rules
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| format!("  {}: {} {}", r["name"], r["health"], r["lastError"]))
        .collect();
    assert!(broken.is_empty(), "alert rules failing to evaluate:\n{}", broken.join("\n"));
    let down = prometheus.query(r#"ALERTS{alertname="RankdDown"}"#).expect("ALERTS");
    assert!(down.is_empty(), "RankdDown is pending or firing while rankd is up");
    println!("{} alert rules evaluate cleanly", rules.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_live_rankd() {
    let started = Instant::now();
    tool("prometheus", "PROMETHEUS"); // fail fast, before starting anything
    let server = common::Server::start(2);
    let mut client = server.client().await;
    client.create_board("season", Order::Desc, Ties::Competition).await.expect("create board");
    // A watcher of the top 10 that reads every push, and one that never
    // reads (its pushes coalesce).
    let mut watcher = Watcher::connect_with(&server.addr, &ConnectOptions::default()).await.expect("watcher");
    watcher.watch(&WatchSpec::top("season", 10).interval(Duration::from_millis(50))).await.expect("watch");
    let reading = tokio::spawn(async move { while let Some(Ok(_)) = watcher.next().await {} });
    let mut idle = Client::connect(&server.addr).await.expect("an idle watcher");
    let _: Msg =
        idle.call(WatchSpec::top("season", 100).interval(Duration::from_millis(10)).call()).await.expect("watch");

    // Load in the background for as long as Prometheus scrapes.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, addr) = (stop.clone(), server.addr.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + MAX_LOAD;
            let mut round = 0;
            let mut backed_up: Option<Instant> = None;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                load_round(&addr, &mut client, round).await.expect("load round");
                if backed_up.is_none_or(|at| at.elapsed() >= BACKUP_EVERY) {
                    backup(&addr).await.expect("backup");
                    backed_up = Some(Instant::now());
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            round
        })
    };

    let metrics_addr = server.metrics_addr.clone();
    let checked = tokio::task::spawn_blocking(move || check_dashboard_against_prometheus(&metrics_addr)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = load.await.expect("load task");
    reading.abort();
    drop(idle);
    if let Err(e) = checked {
        std::panic::resume_unwind(e.into_panic());
    }
    assert!(rounds > 10, "the load ran only {rounds} rounds");
    println!("{rounds} load rounds; took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn promtool_accepts_the_rules_their_tests_and_the_scrape_config() {
    let promtool = tool("promtool", "PROMTOOL");
    let run = |args: &[&str], dir: &Path| {
        let out = Command::new(&promtool).args(args).current_dir(dir).output().expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let grafana = grafana_dir();
    run(&["check", "rules", "alerts.yml"], &grafana);
    // Each alert fires on series that should page and stays quiet otherwise.
    run(&["test", "rules", "alerts.test.yml"], &grafana);
    // `check config` also loads rule_files relative to the config: check copies
    // side by side, so nothing is written in the repo.
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["prometheus.yml", "alerts.yml"] {
        std::fs::copy(grafana.join(name), dir.path().join(name)).unwrap_or_else(|e| panic!("copy {name}: {e}"));
    }
    run(&["check", "config", "prometheus.yml"], dir.path());
}

#[test]
fn dashboard_panels_have_titles_units_and_the_provisioned_datasource() {
    let dashboard = read_dashboard();
    assert_eq!(dashboard["uid"], "rankd");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion");
    let datasource = std::fs::read_to_string(grafana_dir().join("provisioning/datasources/prometheus.yml"))
        .expect("datasource provisioning");
    assert!(datasource.contains("uid: prometheus"), "the provisioned datasource must keep uid `prometheus`");

    let mut panels = Vec::new();
    data_panels(&dashboard["panels"], &mut panels);
    assert!(panels.len() >= 20, "only {} panels", panels.len());
    let mut problems = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or_default();
        let mut complain = |what: &str| problems.push(format!("  panel {:?} ({}): {what}", title, panel["id"]));
        if title.is_empty() {
            complain("no title");
        }
        if !ids.insert(panel["id"].to_string()) {
            complain("duplicate id");
        }
        if panel["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or_default().is_empty() {
            complain("no unit");
        }
        if panel["datasource"]["uid"] != "prometheus" {
            complain("datasource is not uid `prometheus`");
        }
        if panel["gridPos"]["w"].as_u64().is_none() {
            complain("no gridPos");
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            complain("no targets");
        }
        for target in &targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            if expr.is_empty() {
                complain("a target without expr");
            }
            // The live test runs each expr as-is: no Grafana variables.
            if expr.contains('$') {
                complain(&format!("expr uses a template variable: {expr}"));
            }
        }
    }
    assert!(problems.is_empty(), "dashboard problems:\n{}", problems.join("\n"));
}
