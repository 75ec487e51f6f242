//! `rankd bench`: a load generator that drives a running server over the
//! protocol with C connections, each keeping D requests in flight, and
//! reports throughput and latency percentiles (HDR histogram).
//!
//! Latency is measured per request from the moment its pipeline batch was
//! written to the moment its reply arrived, so it includes queueing behind
//! the batch — what a pipelining client actually sees.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rmpv::Value;
use serde::Serialize;

use crate::client::{set_call, Call, Client, ClientError};

/// What the load is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// `set` with random scores.
    Set,
    /// `rank` of random players.
    Rank,
    /// `top` 10.
    Top,
    /// `around` 5/5.
    Around,
    /// `--write-ratio` sets, the rest ranks.
    Mixed,
}

/// `rankd bench` flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server address.
    #[arg(long, short = 's', default_value = "127.0.0.1:7070")]
    pub server: String,
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
    /// The load.
    #[arg(long, short = 'w', value_enum, default_value = "set")]
    pub workload: Workload,
    /// Share of writes in `mixed`.
    #[arg(long, default_value_t = 0.5)]
    pub write_ratio: f64,
    /// Distinct players the load picks from.
    #[arg(long, default_value_t = 1_000_000)]
    pub players: u64,
    /// Board name.
    #[arg(long, default_value = "bench")]
    pub board: String,
    /// Before measuring, give every player a score (with `set_many`).
    #[arg(long)]
    pub prefill: bool,
    /// Scores are drawn from 0..score-range (ties grow as it shrinks).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub score_range: i64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The load.
    pub workload: Workload,
    /// Connections.
    pub connections: usize,
    /// Pipeline depth.
    pub pipeline: usize,
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
}

fn player(i: u64) -> String {
    format!("player:{i}")
}

/// Gives every player a score, 10 000 per `set_many`, over all connections.
pub async fn prefill(args: &BenchArgs) -> Result<(), ClientError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..args.connections.max(1) {
        let (args, next) = (args.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(args.server.as_str()).await?;
            let mut rng = StdRng::seed_from_u64(args.seed ^ (c as u64) << 32);
            loop {
                let start = next.fetch_add(10_000, Ordering::Relaxed);
                if start >= args.players {
                    return Ok::<(), ClientError>(());
                }
                let end = (start + 10_000).min(args.players);
                let entries: Vec<Value> = (start..end)
                    .map(|i| Value::Array(vec![player(i).into(), rng.gen_range(0..args.score_range).into()]))
                    .collect();
                client.call(Call::new("set_many").with("board", args.board.as_str()).with("entries", entries)).await?;
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| ClientError::Protocol(e.to_string()))??;
    }
    Ok(())
}

/// Runs the load and returns the report.
pub async fn run(args: &BenchArgs) -> Result<Report, ClientError> {
    if args.prefill {
        let started = Instant::now();
        prefill(args).await?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!("prefilled {} players in {secs:.1} s ({:.0} players/s)", args.players, args.players as f64 / secs);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(args.ops.unwrap_or(u64::MAX)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.connections.max(1) {
        let (args, stop, budget) = (args.clone(), stop.clone(), budget.clone());
        tasks.push(tokio::spawn(async move { connection_load(&args, c as u64, &stop, &budget).await }));
    }
    if args.ops.is_none() {
        tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
        stop.store(true, Ordering::Relaxed);
    }
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let (mut ops, mut errors) = (0, 0);
    for task in tasks {
        let (h, ok, err) = task.await.map_err(|e| ClientError::Protocol(e.to_string()))??;
        histogram.add(&h).map_err(|e| ClientError::Protocol(e.to_string()))?;
        ops += ok;
        errors += err;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Report {
        workload: args.workload,
        connections: args.connections,
        pipeline: args.pipeline,
        ops,
        errors,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
    })
}

async fn connection_load(
    args: &BenchArgs,
    id: u64,
    stop: &AtomicBool,
    budget: &AtomicU64,
) -> Result<(Histogram<u64>, u64, u64), ClientError> {
    let mut client = Client::connect(args.server.as_str()).await?;
    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_mul(31).wrapping_add(id));
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let (mut ok, mut err) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let want = args.pipeline as u64;
        let granted = budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| Some(left.saturating_sub(want)))
            .map_or(0, |left| left.min(want));
        if granted == 0 {
            break;
        }
        let calls: Vec<Call> = (0..granted).map(|_| next_call(args, &mut rng)).collect();
        let sent = Instant::now();
        let replies = client.pipeline(&calls).await?;
        let micros = sent.elapsed().as_micros() as u64;
        for reply in replies {
            if reply.is_ok() {
                ok += 1;
            } else {
                err += 1;
            }
            let _ = histogram.record(micros.max(1));
        }
    }
    Ok((histogram, ok, err))
}

fn next_call(args: &BenchArgs, rng: &mut StdRng) -> Call {
    let p = player(rng.gen_range(0..args.players));
    let board = args.board.as_str();
    let write = match args.workload {
        Workload::Set => true,
        Workload::Mixed => rng.gen_bool(args.write_ratio.clamp(0.0, 1.0)),
        _ => false,
    };
    if write {
        return set_call(board, &p, rng.gen_range(0..args.score_range), "set");
    }
    match args.workload {
        Workload::Top => Call::new("top").with("board", board).with("limit", 10),
        Workload::Around => Call::new("around").with("board", board).with("player", p),
        _ => Call::new("rank").with("board", board).with("player", p),
    }
}

/// Prints a report for people.
pub fn print(report: &Report) {
    println!(
        "{:?}: {} ops in {:.2} s = {:.0} ops/s ({} errors); latency p50 {} us, p99 {} us, p99.9 {} us, max {} us \
         [{} connections x {} in flight]",
        report.workload,
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
}
