//! A real Prometheus for tests: [`Prometheus`] runs `/usr/bin/prometheus`
//! (Debian's package; `PROMETHEUS` overrides the path) on a free port,
//! waits until it is ready, queries its HTTP API, and kills it on drop.
//! [`Prometheus::scraping`] points it at a rankd metrics endpoint, scraped
//! every second with `grafana/alerts.yml` evaluated every second, and
//! [`Prometheus::alerts`] tells which of those alerts are pending or firing.
//!
//! Needs Prometheus 2.x installed (`apt-get install prometheus`; CI installs
//! it): without it the tests that use this fail, they never pass silently.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The operator kit: dashboards, alert rules and their tests.
pub fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana")
}

/// The path of a Prometheus tool, failing the test if it is not installed.
pub fn tool(name: &str, env: &str) -> PathBuf {
    let path = std::env::var_os(env).map_or_else(|| PathBuf::from("/usr/bin").join(name), PathBuf::from);
    assert!(
        path.is_file(),
        "{} not found: the Grafana/Prometheus tests need Prometheus 2.x installed \
         (`apt-get install prometheus`; CI installs it), or {env} set to the binary",
        path.display()
    );
    path
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A plain HTTP/1.0 GET. Returns (status code, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_string()))
}

/// One alert Prometheus holds: pending (its expression holds, its `for` has
/// not run out yet) or firing.
#[derive(Debug, Clone)]
pub struct Alert {
    /// `alertname`.
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// All its labels (`alertname`, `instance`, `shard`, `severity`...).
    pub labels: Value,
}

/// A Prometheus process, killed on drop.
pub struct Prometheus {
    child: Child,
    /// `host:port` of its web server and API.
    pub addr: String,
    log: PathBuf,
    /// Its config and storage, when [`Prometheus::scraping`] made them.
    _dir: Option<tempfile::TempDir>,
}

impl Prometheus {
    /// Starts Prometheus with the config file `config`, its storage and
    /// logs in `dir`, and waits until it is ready.
    pub fn start(config: &Path, dir: &Path) -> Self {
        let binary = tool("prometheus", "PROMETHEUS");
        let addr = format!("127.0.0.1:{}", super::free_port());
        let log = dir.join("prometheus.log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(std::fs::File::create(dir.join("prometheus.err")).expect("log file"))
            .spawn()
            .expect("start prometheus");
        let mut prometheus = Self { child, addr, log, _dir: None };
        prometheus.wait_until("Prometheus is ready", Duration::from_secs(20), |p| {
            matches!(http_get(&p.addr, "/-/ready"), Ok((200, _)))
        });
        prometheus
    }

    /// Starts Prometheus scraping the rankd metrics endpoint `metrics_addr`
    /// (job `rankd`) every second, with `grafana/alerts.yml` loaded and
    /// evaluated every second, in a temporary dir of its own; waits until
    /// it is ready (not for the first scrape: see [`Prometheus::wait_until`]).
    pub fn scraping(metrics_addr: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(grafana_dir().join("alerts.yml"), dir.path().join("alerts.yml")).expect("copy alerts.yml");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - alerts.yml\n\
                 scrape_configs:\n  - job_name: rankd\n    static_configs:\n      - targets: [\"{metrics_addr}\"]\n"
            ),
        )
        .expect("write prometheus.yml");
        let mut prometheus = Self::start(&config, dir.path());
        prometheus._dir = Some(dir);
        prometheus
    }

    /// The last lines Prometheus logged, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["prometheus.log", "prometheus.err"] {
            text += &std::fs::read_to_string(self.log.with_file_name(name)).unwrap_or_default();
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Polls `ready` until it holds; fails if Prometheus exits or `timeout` passes.
    pub fn wait_until(&mut self, what: &str, timeout: Duration, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(self) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}) waiting for: {what}\n{}", self.log_tail());
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {what}\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// GETs an API path and returns its `data`, or why it failed.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(&self.addr, path).map_err(|e| format!("HTTP: {e}"))?;
        let json: Value = serde_json::from_str(&body).map_err(|e| format!("HTTP {code}, not JSON ({e}): {body}"))?;
        if json["status"] != "success" {
            return Err(format!("HTTP {code}, {}: {}", json["errorType"], json["error"]));
        }
        Ok(json["data"].clone())
    }

    /// Runs an instant query; returns its samples' values (as Prometheus
    /// writes them: "1", "0.25", "NaN"), or why it failed.
    pub fn query(&self, promql: &str) -> Result<Vec<String>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        let value = |v: &Value| v[1].as_str().unwrap_or_default().to_string();
        match data["resultType"].as_str() {
            Some("vector") => Ok(data["result"].as_array().into_iter().flatten().map(|s| value(&s["value"])).collect()),
            Some("scalar") | Some("string") => Ok(vec![value(&data["result"])]),
            other => Err(format!("unexpected result type {other:?}")),
        }
    }

    /// The alerts pending or firing right now (`/api/v1/alerts`), one per
    /// label set: an alert of two shards is there twice.
    pub fn alerts(&self) -> Result<Vec<Alert>, String> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|alert| Alert {
                name: alert["labels"]["alertname"].as_str().unwrap_or_default().to_string(),
                state: alert["state"].as_str().unwrap_or_default().to_string(),
                labels: alert["labels"].clone(),
            })
            .collect())
    }

    /// The state of the alert `name`: `Some("firing")` if any of its label
    /// sets fires, else `Some("pending")` if any is pending, else `None`
    /// (inactive, or the API failed).
    pub fn alert_state(&self, name: &str) -> Option<String> {
        let alerts = self.alerts().ok()?;
        let states: Vec<&str> = alerts.iter().filter(|a| a.name == name).map(|a| a.state.as_str()).collect();
        ["firing", "pending"].into_iter().find(|state| states.contains(state)).map(str::to_string)
    }

    /// Every alert pending or firing, as `name: state {labels}` lines, for
    /// failure messages and reports.
    pub fn alerts_text(&self) -> String {
        match self.alerts() {
            Ok(alerts) if alerts.is_empty() => "no alert pending or firing".to_string(),
            Ok(alerts) => {
                alerts.iter().map(|a| format!("{}: {} {}", a.name, a.state, a.labels)).collect::<Vec<_>>().join("\n")
            }
            Err(e) => format!("alerts API failed: {e}"),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
