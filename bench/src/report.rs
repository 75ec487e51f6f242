//! What a run measured: the report, its CSV row and JSON form, and how it
//! prints for people.

use std::io::Write;
use std::path::Path;

use rankd_client::Mode;
use serde::{Deserialize, Serialize};

use crate::args::{KeyDistribution, Workload};
use crate::server_latency::OpLatency;

/// The outcome of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// What was measured: `rankd://host:port` or `redis://host:port`.
    pub target: String,
    /// The server's version, when it says (Redis `INFO server`).
    pub server_version: Option<String>,
    /// The workload run (`--workload`).
    pub workload: Workload,
    /// How writes combined with the stored scores (`--mode`).
    pub mode: Mode,
    /// Every write carried a unique `wid` (`--wid`).
    #[serde(default)]
    pub wid: bool,
    /// How players were picked.
    pub distribution: KeyDistribution,
    /// Zipf exponent, for `zipf`.
    pub zipf_exponent: Option<f64>,
    /// Distinct players the load picked from (`--players`).
    pub players: u64,
    /// Connections the load used (`--connections`).
    pub connections: usize,
    /// Requests each connection kept in flight (`--pipeline`).
    pub pipeline: usize,
    /// The `--rate` offered, ops/s (none: as fast as answered).
    #[serde(default)]
    pub offered_rate: Option<f64>,
    /// The random seed the operations were drawn with (`--seed` repeats
    /// them); absent in reports older than the field.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Operations answered successfully.
    pub ops: u64,
    /// Operations answered with an error.
    pub errors: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Successful operations per second.
    pub ops_per_sec: f64,
    /// Latency percentiles, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest request's latency, microseconds.
    pub max_us: u64,
    /// How the load maps onto the target, where it matters.
    pub notes: Vec<String>,
    /// CPU seconds the server used during the measurement: Redis always,
    /// rankd given `--server-metrics`.
    #[serde(default)]
    pub server_cpu_seconds: Option<f64>,
    /// The same by server thread (rankd only): which one was busiest.
    #[serde(default)]
    pub server_cpu_by_thread: std::collections::BTreeMap<String, f64>,
    /// Latency by op as the server measured it, without the way there and
    /// back (rankd given `--server-metrics`; see `server_latency.rs`).
    #[serde(default)]
    pub server_latency: std::collections::BTreeMap<String, OpLatency>,
    /// CPU seconds this load generator used during the measurement.
    #[serde(default)]
    pub client_cpu_seconds: Option<f64>,
    /// CPU seconds the whole machine was busy during the measurement (all
    /// processes and the kernel, over all cores).
    #[serde(default)]
    pub machine_busy_seconds: Option<f64>,
    /// CPU seconds the machine's cores stood idle: near zero when the run
    /// was CPU-bound.
    #[serde(default)]
    pub machine_idle_seconds: Option<f64>,
}

impl Report {
    /// The CSV header matching [`Report::csv_row`].
    pub const CSV_HEADER: &'static str = "target,server_version,workload,mode,distribution,zipf_exponent,players,\
                                          connections,pipeline,ops,errors,seconds,ops_per_sec,p50_us,p99_us,\
                                          p999_us,max_us,offered_rate,server_cpu_seconds,client_cpu_seconds,\
                                          machine_busy_seconds,machine_idle_seconds,wid";

    /// One CSV row.
    pub fn csv_row(&self) -> String {
        [
            csv_field(&self.target),
            csv_field(self.server_version.as_deref().unwrap_or("")),
            format!("{:?}", self.workload).to_lowercase(),
            self.mode.name().to_string(),
            format!("{:?}", self.distribution).to_lowercase(),
            self.zipf_exponent.map(|s| s.to_string()).unwrap_or_default(),
            self.players.to_string(),
            self.connections.to_string(),
            self.pipeline.to_string(),
            self.ops.to_string(),
            self.errors.to_string(),
            format!("{:.3}", self.seconds),
            format!("{:.1}", self.ops_per_sec),
            self.p50_us.to_string(),
            self.p99_us.to_string(),
            self.p999_us.to_string(),
            self.max_us.to_string(),
            self.offered_rate.map(|r| r.to_string()).unwrap_or_default(),
            self.server_cpu_seconds.map(|s| format!("{s:.2}")).unwrap_or_default(),
            self.client_cpu_seconds.map(|s| format!("{s:.2}")).unwrap_or_default(),
            self.machine_busy_seconds.map(|s| format!("{s:.2}")).unwrap_or_default(),
            self.machine_idle_seconds.map(|s| format!("{s:.2}")).unwrap_or_default(),
            self.wid.to_string(),
        ]
        .join(",")
    }

    /// Cores the server kept busy on average, if its CPU time is known.
    pub fn server_cores(&self) -> Option<f64> {
        Some(self.server_cpu_seconds? / self.seconds)
    }

    /// Server CPU microseconds per successful operation, if known.
    pub fn server_cpu_us_per_op(&self) -> Option<f64> {
        Some(self.server_cpu_seconds? * 1e6 / self.ops.max(1) as f64)
    }

    /// Operations a second each core the server kept busy gave, if known:
    /// what one more core would add while the server's CPU is the limit
    /// and its CPU per operation stays flat.
    pub fn ops_per_server_core(&self) -> Option<f64> {
        let cores = self.server_cores()?;
        (cores > 0.0).then(|| self.ops_per_sec / cores)
    }

    /// Cores the load generator kept busy on average, if known.
    pub fn client_cores(&self) -> Option<f64> {
        Some(self.client_cpu_seconds? / self.seconds)
    }

    /// Cores the whole machine kept busy on average, if known.
    pub fn machine_busy_cores(&self) -> Option<f64> {
        Some(self.machine_busy_seconds? / self.seconds)
    }

    /// Cores that stood idle on average, if known.
    pub fn machine_idle_cores(&self) -> Option<f64> {
        Some(self.machine_idle_seconds? / self.seconds)
    }
}

/// Quotes a CSV field when it needs it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Appends `row` to the CSV file at `path`, writing `header` first when the
/// file is new or empty.
pub fn append_csv(path: &Path, header: &str, row: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let mut text = String::new();
    if file.metadata()?.len() == 0 {
        text.push_str(header);
        text.push('\n');
    }
    text.push_str(row);
    text.push('\n');
    file.write_all(text.as_bytes())
}

/// Prints a report for people.
pub fn print(report: &Report) {
    let skew = match report.zipf_exponent {
        Some(s) => format!("zipf s={s}"),
        None => "uniform".into(),
    };
    let version = report.server_version.as_ref().map(|v| format!(" (v{v})")).unwrap_or_default();
    let offered = report.offered_rate.map(|r| format!(", offered {r:.0} ops/s")).unwrap_or_default();
    let seed = report.seed.map(|s| format!(", seed {s}")).unwrap_or_default();
    let mode = match report.workload {
        Workload::Set | Workload::Mixed if report.wid => format!("mode {} with wids, ", report.mode.name()),
        Workload::Set | Workload::Mixed => format!("mode {}, ", report.mode.name()),
        _ => String::new(),
    };
    println!(
        "{}{version} {:?} ({mode}{} players, {skew}): {} ops in {:.2} s = {:.0} ops/s ({} errors); \
         latency p50 {} us, p99 {} us, p99.9 {} us, max {} us [{} connections x {} in flight{offered}{seed}]",
        report.target,
        report.workload,
        report.players,
        report.ops,
        report.seconds,
        report.ops_per_sec,
        report.errors,
        report.p50_us,
        report.p99_us,
        report.p999_us,
        report.max_us,
        report.connections,
        report.pipeline
    );
    if let (Some(cores), Some(per_op)) = (report.server_cores(), report.server_cpu_us_per_op()) {
        let threads: Vec<String> = report
            .server_cpu_by_thread
            .iter()
            .filter(|(_, seconds)| **seconds >= 0.01 * report.seconds)
            .map(|(thread, seconds)| format!("{thread} {:.2}", seconds / report.seconds))
            .collect();
        let threads = if threads.is_empty() { String::new() } else { format!(" (by thread: {})", threads.join(", ")) };
        println!("  server CPU: {cores:.2} cores, {per_op:.2} us per operation{threads}");
    }
    for (op, latency) in &report.server_latency {
        println!(
            "  server latency ({op}): {} requests, p50 ~{:.0} us, p99 ~{:.0} us, {:.2}% over 1 ms",
            latency.requests,
            latency.p50_us,
            latency.p99_us,
            latency.over_1ms * 100.0
        );
    }
    if let Some(cores) = report.client_cores() {
        println!("  load generator CPU: {cores:.2} cores");
    }
    if let (Some(busy), Some(idle)) = (report.machine_busy_cores(), report.machine_idle_cores()) {
        // What server and generator did not use went to the kernel's threads or other tenants.
        println!("  machine CPU: {busy:.2} cores busy, {idle:.2} idle");
    }
    for note in &report.notes {
        println!("  note: {note}");
    }
}
