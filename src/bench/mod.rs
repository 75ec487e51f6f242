//! `rankd bench`: a load generator that drives a running server with C
//! connections, each keeping D requests in flight, and reports throughput and
//! latency percentiles (HDR histogram).
//!
//! The same generator drives rankd (msgpack protocol) or Redis
//! (`--target redis://host:port`, sorted-set commands over a small pipelined
//! RESP client, see `target.rs`), so the two can be compared on equal terms.
//! `rankd bench sweep` (`sweep.rs`) runs one load against fresh servers with
//! several shard counts (and Redis as a reference) and charts the result.
//!
//! Latency is measured per request from the moment its pipeline batch was
//! written to the moment the batch's last reply arrived, so it includes
//! queueing behind the batch — what a pipelining client actually sees.

mod chart;
mod cpu;
pub mod resp;
mod server_latency;
mod sweep;
mod target;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution as _, Zipf};
use serde::{Deserialize, Serialize};

use crate::client::ClientError;

pub use server_latency::OpLatency;
pub use sweep::SweepArgs;
pub use target::Target;

/// What the load is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// `set` with random scores (Redis: ZADD / ZADD GT / ZINCRBY by `--mode`).
    Set,
    /// `rank` of random players (Redis: ZREVRANK \[WITHSCORE\]).
    Rank,
    /// `top` 10 (Redis: ZREVRANGE 0 9 WITHSCORES).
    Top,
    /// `around` 5/5 (Redis: ZREVRANK, then ZREVRANGE around it).
    Around,
    /// `count` (Redis: ZCARD).
    Count,
    /// `--write-ratio` sets, the rest ranks.
    Mixed,
}

/// How writes combine with the stored score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Replace (Redis: ZADD).
    Set,
    /// Keep the better (Redis: ZADD GT).
    Best,
    /// Add (Redis: ZINCRBY).
    Incr,
}

impl WriteMode {
    /// The protocol's name for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::Set => "set",
            WriteMode::Best => "best",
            WriteMode::Incr => "incr",
        }
    }
}

/// How the load picks players.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every player equally likely.
    Uniform,
    /// Zipf over the player key space: `player:0` is the hottest.
    Zipf,
}

/// `rankd bench`: a run, or the `sweep` subcommand.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCommand {
    /// A shard-count sweep instead of a single run.
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
    /// A single run's flags.
    #[command(flatten)]
    pub run: BenchArgs,
}

/// `rankd bench` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchSub {
    /// Start a fresh `rankd serve` for each shard count, run the same load on
    /// each (and once on Redis as a reference), write sweep.csv and sweep.png.
    Sweep(SweepArgs),
}

/// `rankd bench` flags for a single run.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// rankd server address (when no --target is given).
    #[arg(long, short = 's', default_value = "127.0.0.1:7070")]
    pub server: String,
    /// What to measure: `rankd://host:port` or `redis://host:port[/db]`
    /// [default: rankd at --server].
    #[arg(long)]
    pub target: Option<String>,
    /// Before anything else, empty the board (rankd drop_board, Redis DEL).
    #[arg(long)]
    pub reset: bool,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also append the report as one CSV row here (header when the file is new).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// The load.
    #[command(flatten)]
    pub load: LoadArgs,
}

/// The load: shared by a run and a sweep.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Concurrent connections.
    #[arg(long, short = 'c', default_value_t = 8)]
    pub connections: usize,
    /// Requests in flight per connection.
    #[arg(long, short = 'd', default_value_t = 64)]
    pub pipeline: usize,
    /// Run for this many seconds...
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// ...or stop after this many operations.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Offer at most this many operations per second in all (spread evenly
    /// over the connections) instead of as many as the target answers.
    /// Latency then counts from when each batch was due, not when it was
    /// sent, so a stalled target shows in the figures instead of slowing
    /// the load down (no coordinated omission).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The load.
    #[arg(long, short = 'w', value_enum, default_value = "set")]
    pub workload: Workload,
    /// Share of writes in `mixed`.
    #[arg(long, default_value_t = 0.5)]
    pub write_ratio: f64,
    /// How writes combine with the stored score.
    #[arg(long, value_enum, default_value = "set")]
    pub mode: WriteMode,
    /// Distinct players the load picks from.
    #[arg(long, default_value_t = 1_000_000)]
    pub players: u64,
    /// How the load picks players.
    #[arg(long, value_enum, default_value = "uniform")]
    pub distribution: KeyDistribution,
    /// Exponent of the Zipf distribution (0 is uniform; larger is more skewed).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Board name (the sorted set's key on Redis).
    #[arg(long, default_value = "bench")]
    pub board: String,
    /// Before measuring, give every player a score (rankd set_many of 10 000,
    /// Redis ZADD of 1000).
    #[arg(long)]
    pub prefill: bool,
    /// Scores are drawn from 0..score-range (ties grow as it shrinks).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub score_range: i64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// rankd's metrics address (its `--metrics-listen`, host:port): the
    /// report then gives the server's CPU time over the measurement. Redis
    /// reports its own (`INFO cpu`); `bench sweep` passes its servers'.
    #[arg(long)]
    pub server_metrics: Option<String>,
}

impl LoadArgs {
    fn validate(&self) -> Result<(), BenchError> {
        let bad = |msg: &str| Err(BenchError::Invalid(msg.into()));
        if self.connections == 0 || self.pipeline == 0 {
            return bad("--connections and --pipeline must be at least 1");
        }
        if self.players == 0 || self.score_range <= 0 {
            return bad("--players and --score-range must be at least 1");
        }
        if self.ops.is_none() && !(self.duration.is_finite() && self.duration > 0.0) {
            return bad("--duration must be a positive number of seconds");
        }
        if self.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
            return bad("--rate must be a positive number of operations per second");
        }
        if !(0.0..=1.0).contains(&self.write_ratio) {
            return bad("--write-ratio must be between 0 and 1");
        }
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent >= 0.0) {
            return bad("--zipf-exponent must be 0 or more");
        }
        Ok(())
    }

    fn progress_visible(&self) -> bool {
        !self.quiet && std::io::stderr().is_terminal()
    }
}

/// A failed benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Talking to rankd failed.
    #[error("rankd: {0}")]
    Client(#[from] ClientError),
    /// Talking to Redis failed.
    #[error("redis: {0}")]
    Resp(#[from] resp::RespError),
    /// Redis answered a set-up command with an error.
    #[error("redis: {0}")]
    Redis(String),
    /// Files, processes.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A bad flag.
    #[error("{0}")]
    Invalid(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// What was measured: `rankd://host:port` or `redis://host:port`.
    pub target: String,
    /// The server's version, when it says (Redis `INFO server`).
    pub server_version: Option<String>,
    /// The load.
    pub workload: Workload,
    /// Write mode.
    pub mode: WriteMode,
    /// How players were picked.
    pub distribution: KeyDistribution,
    /// Zipf exponent, for `zipf`.
    pub zipf_exponent: Option<f64>,
    /// Distinct players.
    pub players: u64,
    /// Connections.
    pub connections: usize,
    /// Pipeline depth.
    pub pipeline: usize,
    /// The `--rate` offered, ops/s (none: as fast as answered).
    #[serde(default)]
    pub offered_rate: Option<f64>,
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
    /// Maximum.
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
    /// back (rankd given `--server-metrics`; see `bench/server_latency.rs`).
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
                                          machine_busy_seconds,machine_idle_seconds";

    /// One CSV row.
    pub fn csv_row(&self) -> String {
        [
            csv_field(&self.target),
            csv_field(self.server_version.as_deref().unwrap_or("")),
            format!("{:?}", self.workload).to_lowercase(),
            self.mode.as_str().to_string(),
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
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Appends `row` to the CSV file at `path`, writing `header` first when the
/// file is new or empty.
pub(crate) fn append_csv(path: &Path, header: &str, row: &str) -> std::io::Result<()> {
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

/// `rankd bench ...`: runs it and prints or writes what it measured.
pub fn main(command: BenchCommand) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(BenchError::from).and_then(
        |runtime| match command.sub {
            Some(BenchSub::Sweep(args)) => sweep::run(&runtime, &args),
            None => runtime.block_on(single(&command.run)),
        },
    );
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rankd bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn single(args: &BenchArgs) -> Result<(), BenchError> {
    let target = match &args.target {
        Some(url) => Target::parse(url)?,
        None => Target::Rankd(args.server.clone()),
    };
    let report = run_on(&target, &args.load, args.reset).await?;
    print(&report);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Other(e.to_string()))?;
        std::fs::write(path, json + "\n")?;
    }
    if let Some(path) = &args.csv {
        append_csv(path, Report::CSV_HEADER, &report.csv_row())?;
    }
    Ok(())
}

/// Runs the load against rankd at `args.server` (or `args.target`) and
/// returns the report.
pub async fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    let target = match &args.target {
        Some(url) => Target::parse(url)?,
        None => Target::Rankd(args.server.clone()),
    };
    run_on(&target, &args.load, args.reset).await
}

/// Runs `load` against `target`: optionally empties the board and prefills
/// it, then measures.
pub async fn run_on(target: &Target, load: &LoadArgs, reset: bool) -> Result<Report, BenchError> {
    load.validate()?;
    let setup = target::Setup::probe(target, &load.board).await?;
    if reset {
        setup.reset(&load.board).await?;
    }
    if load.prefill {
        let started = Instant::now();
        prefill(&setup, load).await?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "prefilled {} players on {} in {secs:.1} s ({:.0} players/s)",
            load.players,
            setup.url(),
            load.players as f64 / secs
        );
    }
    measure(&setup, load).await
}

fn progress_bar(load: &LoadArgs, len: u64, template: &str) -> ProgressBar {
    let target = if load.progress_visible() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Gives every player a score, over all connections.
async fn prefill(setup: &target::Setup, load: &LoadArgs) -> Result<(), BenchError> {
    let bar = progress_bar(load, load.players, "prefill [{elapsed_precise}] [{bar:30}] {pos}/{len} players");
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..load.connections {
        let (setup, load, next, bar) = (setup.clone(), load.clone(), next.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = setup.connect().await?;
            let chunk = conn.prefill_chunk();
            let mut rng = StdRng::seed_from_u64(load.seed ^ ((c as u64) << 32));
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= load.players {
                    return Ok::<(), BenchError>(());
                }
                let end = (start + chunk).min(load.players);
                let entries: Vec<(u64, i64)> = (start..end).map(|i| (i, rng.gen_range(0..load.score_range))).collect();
                conn.prefill(&load.board, &entries).await?;
                bar.inc(end - start);
            }
        }));
    }
    let result = join_all(tasks).await;
    bar.finish_and_clear();
    result.map(|_| ())
}

async fn join_all<T>(tasks: Vec<tokio::task::JoinHandle<Result<T, BenchError>>>) -> Result<Vec<T>, BenchError> {
    let mut out = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(BenchError::Other(e.to_string()));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn new_histogram() -> Result<Histogram<u64>, BenchError> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| BenchError::Other(e.to_string()))
}

/// The timed part of a run.
async fn measure(setup: &target::Setup, load: &LoadArgs) -> Result<Report, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(load.ops.unwrap_or(u64::MAX)));
    let done = Arc::new(AtomicU64::new(0));
    let bar_len = load.ops.unwrap_or((load.duration * 1000.0) as u64);
    let bar = progress_bar(load, bar_len, "{prefix} [{elapsed_precise}] [{bar:30}] {msg}");
    bar.set_prefix(format!("{:?}", load.workload).to_lowercase());
    // A metrics address that does not answer fails the run before it starts.
    let server_before = setup.server_sample(load.server_metrics.as_deref()).await?;
    let client_cpu_before = cpu::own_cpu_seconds();
    let machine_cpu_before = cpu::machine_cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..load.connections {
        let (setup, load, stop, budget, done) =
            (setup.clone(), load.clone(), stop.clone(), budget.clone(), done.clone());
        tasks.push(tokio::spawn(async move { connection_load(&setup, &load, c as u64, &stop, &budget, &done).await }));
    }
    let ticker = {
        let (bar, done, stop, by_ops) = (bar.clone(), done.clone(), stop.clone(), load.ops.is_some());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let (n, secs) = (done.load(Ordering::Relaxed), started.elapsed().as_secs_f64());
                bar.set_position(if by_ops { n } else { (secs * 1000.0) as u64 });
                bar.set_message(format!("{n} ops, {:.0} ops/s", n as f64 / secs.max(1e-9)));
            }
        })
    };
    if load.ops.is_none() {
        // Stop at the deadline, or earlier if every connection has failed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(load.duration);
        while tokio::time::Instant::now() < deadline && !tasks.iter().all(|t| t.is_finished()) {
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + Duration::from_millis(50))).await;
        }
    }
    // With --ops the connections stop by themselves when the budget is spent.
    stop.store(load.ops.is_none(), Ordering::Relaxed);
    let results = join_all(tasks).await;
    let seconds = started.elapsed().as_secs_f64();
    let client_cpu_seconds = cpu::own_cpu_seconds().zip(client_cpu_before).map(|(after, before)| after - before);
    let machine_cpu = cpu::machine_cpu_seconds().zip(machine_cpu_before).map(|(after, before)| after.since(before));
    let server = match server_before {
        Some(before) => setup.server_sample(load.server_metrics.as_deref()).await?.map(|after| after.since(&before)),
        None => None,
    };
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    bar.finish_and_clear();
    let mut histogram = new_histogram()?;
    let (mut ops, mut errors) = (0, 0);
    for (h, ok, err) in results? {
        histogram.add(&h).map_err(|e| BenchError::Other(e.to_string()))?;
        ops += ok;
        errors += err;
    }
    Ok(Report {
        target: setup.url(),
        server_version: setup.version(),
        workload: load.workload,
        mode: load.mode,
        distribution: load.distribution,
        zipf_exponent: (load.distribution == KeyDistribution::Zipf).then_some(load.zipf_exponent),
        players: load.players,
        connections: load.connections,
        pipeline: load.pipeline,
        offered_rate: load.rate,
        ops,
        errors,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
        notes: setup.notes(load.workload),
        server_cpu_seconds: server.as_ref().map(|s| s.cpu.total),
        server_latency: server.as_ref().map(|s| s.latency.summary()).unwrap_or_default(),
        server_cpu_by_thread: server.map(|s| s.cpu.by_thread).unwrap_or_default(),
        client_cpu_seconds,
        machine_busy_seconds: machine_cpu.map(|cpu| cpu.busy),
        machine_idle_seconds: machine_cpu.map(|cpu| cpu.idle),
    })
}

async fn connection_load(
    setup: &target::Setup,
    load: &LoadArgs,
    id: u64,
    stop: &AtomicBool,
    budget: &AtomicU64,
    done: &AtomicU64,
) -> Result<(Histogram<u64>, u64, u64), BenchError> {
    let mut conn = setup.connect().await?;
    let mut generator = Generator::new(load, load.seed.wrapping_mul(31).wrapping_add(id))?;
    let mut histogram = new_histogram()?;
    let (mut ok, mut err) = (0u64, 0u64);
    let mut ops = Vec::with_capacity(load.pipeline);
    // With --rate, batch k of this connection is due at `k * every`.
    let every = load.rate.map(|rate| Duration::from_secs_f64(load.pipeline as f64 * load.connections as f64 / rate));
    let (start, mut batches) = (Instant::now(), 0u32);
    while !stop.load(Ordering::Relaxed) {
        let want = load.pipeline as u64;
        let granted = budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| Some(left.saturating_sub(want)))
            .map_or(0, |left| left.min(want));
        if granted == 0 {
            break;
        }
        ops.clear();
        ops.extend((0..granted).map(|_| generator.next_op()));
        let sent = match every {
            Some(every) => {
                let due = start + every * batches;
                batches += 1;
                tokio::time::sleep_until(due.into()).await;
                due
            }
            None => Instant::now(),
        };
        let (good, bad) = conn.execute(&load.board, load.mode, &ops).await?;
        let micros = sent.elapsed().as_micros() as u64;
        histogram.saturating_record_n(micros.max(1), granted);
        ok += good;
        err += bad;
        done.fetch_add(granted, Ordering::Relaxed);
    }
    Ok((histogram, ok, err))
}

/// One operation of the load, independent of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Write `score` for player `player` (with the run's mode).
    Write {
        /// Player index.
        player: u64,
        /// Score.
        score: i64,
    },
    /// A player's rank.
    Rank(u64),
    /// The best 10.
    Top,
    /// A player and 5 neighbours each side.
    Around(u64),
    /// Players on the board.
    Count,
}

/// The name of player `i`, the same on every target.
pub fn player(i: u64) -> String {
    format!("player:{i}")
}

enum Keys {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

/// Draws the load's operations.
struct Generator {
    rng: StdRng,
    keys: Keys,
    workload: Workload,
    write_ratio: f64,
    score_range: i64,
}

impl Generator {
    fn new(load: &LoadArgs, seed: u64) -> Result<Self, BenchError> {
        let keys = match load.distribution {
            KeyDistribution::Uniform => Keys::Uniform(load.players),
            KeyDistribution::Zipf => {
                Keys::Zipf(Zipf::new(load.players, load.zipf_exponent).map_err(|e| BenchError::Invalid(e.to_string()))?)
            }
        };
        Ok(Self {
            rng: StdRng::seed_from_u64(seed),
            keys,
            workload: load.workload,
            write_ratio: load.write_ratio,
            score_range: load.score_range,
        })
    }

    fn player(&mut self) -> u64 {
        match &self.keys {
            Keys::Uniform(n) => self.rng.gen_range(0..*n),
            // Zipf draws 1..=n, most often 1.
            Keys::Zipf(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
        }
    }

    fn next_op(&mut self) -> Op {
        let write = match self.workload {
            Workload::Set => true,
            Workload::Mixed => self.rng.gen_bool(self.write_ratio),
            _ => false,
        };
        if write {
            let player = self.player();
            return Op::Write { player, score: self.rng.gen_range(0..self.score_range) };
        }
        match self.workload {
            Workload::Top => Op::Top,
            Workload::Count => Op::Count,
            Workload::Around => Op::Around(self.player()),
            _ => Op::Rank(self.player()),
        }
    }
}

/// Prints a report for people.
pub fn print(report: &Report) {
    let skew = match report.zipf_exponent {
        Some(s) => format!("zipf s={s}"),
        None => "uniform".into(),
    };
    let version = report.server_version.as_ref().map(|v| format!(" (v{v})")).unwrap_or_default();
    let offered = report.offered_rate.map(|r| format!(", offered {r:.0} ops/s")).unwrap_or_default();
    let mode = match report.workload {
        Workload::Set | Workload::Mixed => format!("mode {}, ", report.mode.as_str()),
        _ => String::new(),
    };
    println!(
        "{}{version} {:?} ({mode}{} players, {skew}): {} ops in {:.2} s = {:.0} ops/s ({} errors); \
         latency p50 {} us, p99 {} us, p99.9 {} us, max {} us [{} connections x {} in flight{offered}]",
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchCommand,
    }

    fn load(distribution: KeyDistribution, workload: Workload) -> LoadArgs {
        let cli = Cli::try_parse_from(["bench"]).unwrap();
        LoadArgs { distribution, workload, players: 1000, ..cli.bench.run.load }
    }

    #[test]
    fn zipf_keys_are_skewed_and_in_range() {
        let mut generator = Generator::new(&load(KeyDistribution::Zipf, Workload::Rank), 7).unwrap();
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            match generator.next_op() {
                Op::Rank(p) => hits[p as usize] += 1,
                other => panic!("{other:?}"),
            }
        }
        // s = 1 over 1000 keys: the hottest key draws ~13%, the top 10 ~39%.
        assert!(hits[0] > 10_000, "{}", hits[0]);
        assert!(hits[0] > hits[10] && hits[10] > hits[500]);
        let mut uniform = Generator::new(&load(KeyDistribution::Uniform, Workload::Rank), 7).unwrap();
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            if let Op::Rank(p) = uniform.next_op() {
                hits[p as usize] += 1;
            }
        }
        assert!(hits.iter().all(|&h| h < 200), "uniform keys are not skewed");
    }

    #[test]
    fn mixed_mixes_writes_and_ranks() {
        let mut generator = Generator::new(&load(KeyDistribution::Uniform, Workload::Mixed), 1).unwrap();
        let writes = (0..10_000).filter(|_| matches!(generator.next_op(), Op::Write { .. })).count();
        assert!((4000..6000).contains(&writes), "{writes}");
    }

    #[test]
    fn bench_flags_and_sweep_parse() {
        let cli = Cli::try_parse_from(["bench", "--workload", "rank", "--distribution", "zipf", "-c", "2"]).unwrap();
        assert!(cli.bench.sub.is_none());
        assert_eq!(cli.bench.run.load.workload, Workload::Rank);
        assert_eq!(cli.bench.run.load.connections, 2);
        let cli =
            Cli::try_parse_from(["bench", "sweep", "--shards", "1,2,4", "--duration", "3", "--redis", "redis://x:1"])
                .unwrap();
        match cli.bench.sub {
            Some(BenchSub::Sweep(args)) => {
                assert_eq!(args.shards, vec![1, 2, 4]);
                assert_eq!(args.load.duration, 3.0);
                assert_eq!(args.redis.as_deref(), Some("redis://x:1"));
            }
            None => panic!("no sweep"),
        }
        assert!(Cli::try_parse_from(["bench", "--workload", "set", "sweep"]).is_err());
    }

    #[test]
    fn csv_rows_match_the_header() {
        let report = Report {
            target: "redis://127.0.0.1:6379".into(),
            server_version: Some("7.0.15".into()),
            workload: Workload::Set,
            mode: WriteMode::Best,
            distribution: KeyDistribution::Zipf,
            zipf_exponent: Some(1.0),
            players: 10,
            connections: 1,
            pipeline: 1,
            offered_rate: Some(100.0),
            ops: 5,
            errors: 0,
            seconds: 1.0,
            ops_per_sec: 5.0,
            p50_us: 1,
            p99_us: 2,
            p999_us: 3,
            max_us: 4,
            notes: vec![],
            server_cpu_seconds: Some(0.5),
            server_cpu_by_thread: Default::default(),
            server_latency: Default::default(),
            client_cpu_seconds: None,
            machine_busy_seconds: Some(1.5),
            machine_idle_seconds: Some(0.25),
        };
        assert_eq!(report.csv_row().split(',').count(), Report::CSV_HEADER.split(',').count());
        assert!(report.csv_row().ends_with(",0.50,,1.50,0.25"), "{}", report.csv_row());
        assert_eq!((report.machine_busy_cores(), report.machine_idle_cores()), (Some(1.5), Some(0.25)));
        assert_eq!(report.server_cpu_us_per_op(), Some(100_000.0));
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        append_csv(&path, Report::CSV_HEADER, &report.csv_row()).unwrap();
        append_csv(&path, Report::CSV_HEADER, &report.csv_row()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with("target,"));
    }
}
