//! `rankd-bench sweep`: the same load against a fresh `rankd serve` for each
//! shard count (on loopback, with a fresh data dir, stopped with SIGTERM
//! afterwards), at each of several connection counts, and optionally
//! against Redis at the same connection counts as a reference; writes
//! `sweep.csv`, `sweep.json` and `sweep.png`.
//!
//! Throughput on a small machine says little about a big one: the server's
//! CPU per operation does. Flat CPU per op as shards are added means
//! throughput grows with cores; the `ops_per_server_core` column says how
//! much each core the server is given would add.

use std::path::PathBuf;

use clap::Args;

use crate::args::{LoadArgs, Workload};
use crate::chart::{self, Point, RedisPoint};
use crate::error::BenchError;
use crate::load::run_on;
use crate::report::{csv_field, print, Report};
use crate::serve::{self, ServeProcess};
use crate::target::Target;
use rankd_client::ConnectOptions;

/// `rankd-bench sweep` flags.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Shard counts to try, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub shards: Vec<usize>,
    /// Connection counts to try on each server, comma-separated, each with
    /// `--pipeline` requests in flight (e.g. `1,64,512` at `--pipeline 1`)
    /// [default: --connections].
    #[arg(long, value_delimiter = ',')]
    pub connection_counts: Vec<usize>,
    /// Also run the load against this Redis (`redis://host:port`) at each
    /// connection count, as a reference; its board is emptied with DEL first.
    #[arg(long)]
    pub redis: Option<String>,
    /// Where sweep.csv, sweep.json and sweep.png are written.
    #[arg(long, default_value = "bench-results")]
    pub out_dir: PathBuf,
    /// The `rankd` executable to run [default: the one next to this one].
    #[arg(long)]
    pub rankd: Option<PathBuf>,
    /// An extra flag for every `rankd serve`, e.g. `--serve-arg=--durability=buffered` (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// The load.
    #[command(flatten)]
    pub load: LoadArgs,
}

impl SweepArgs {
    /// The connection counts to run, in the order given.
    fn connection_counts(&self) -> Vec<usize> {
        if self.connection_counts.is_empty() {
            vec![self.load.connections]
        } else {
            self.connection_counts.clone()
        }
    }

    /// The load at one connection count, the `index`th run on its server:
    /// only the first prefills, the others find the board filled. A given
    /// `--seed` moves on by one a run, so no run replays the keys of the one
    /// before it on the same server (and finds them all cached).
    fn load_at(&self, connections: usize, index: usize, server_metrics: Option<String>) -> LoadArgs {
        let seed = self.load.seed.map(|seed| seed.wrapping_add(index as u64));
        LoadArgs { connections, prefill: self.load.prefill && index == 0, server_metrics, seed, ..self.load.clone() }
    }
}

/// The CSV header of `sweep.csv`.
pub const SWEEP_CSV_HEADER: &str =
    "shards,connections,pipeline,workload,ops_per_sec,p50_us,p99_us,p999_us,target,server_cores,\
     server_cpu_us_per_op,ops_per_server_core,client_cores,machine_idle_cores,scaling";

/// How close each run, given as its shard count, connection count and
/// throughput, came to linear scaling: its throughput over what the run
/// with the fewest shards at the same connection count would give if
/// throughput grew in proportion to shards (1.0: linear; 0.5: twice the
/// shards, the same throughput). This is the figure a shard-count
/// experiment asks about, so the CSV and the chart carry it rather than
/// leaving every reader to divide.
fn scaling(runs: &[(usize, usize, f64)]) -> Vec<f64> {
    runs.iter()
        .map(|&(shards, connections, ops_per_sec)| {
            let base = runs.iter().filter(|run| run.1 == connections).min_by_key(|run| run.0);
            let linear = base.map_or(0.0, |&(base_shards, _, base_ops)| base_ops * shards as f64 / base_shards as f64);
            if linear > 0.0 {
                ops_per_sec / linear
            } else {
                0.0
            }
        })
        .collect()
}

fn sweep_row(shards: Option<usize>, report: &Report, scaling: Option<f64>) -> String {
    [
        shards.map(|s| s.to_string()).unwrap_or_default(),
        report.connections.to_string(),
        report.pipeline.to_string(),
        format!("{:?}", report.workload).to_lowercase(),
        format!("{:.1}", report.ops_per_sec),
        report.p50_us.to_string(),
        report.p99_us.to_string(),
        report.p999_us.to_string(),
        csv_field(&report.target),
        report.server_cores().map(|c| format!("{c:.2}")).unwrap_or_default(),
        report.server_cpu_us_per_op().map(|us| format!("{us:.2}")).unwrap_or_default(),
        report.ops_per_server_core().map(|ops| format!("{ops:.0}")).unwrap_or_default(),
        report.client_cores().map(|c| format!("{c:.2}")).unwrap_or_default(),
        report.machine_idle_cores().map(|c| format!("{c:.2}")).unwrap_or_default(),
        scaling.map(|x| format!("{x:.2}")).unwrap_or_default(),
    ]
    .join(",")
}

/// Runs the sweep.
pub fn run(runtime: &tokio::runtime::Runtime, args: &SweepArgs) -> Result<(), BenchError> {
    args.load.validate()?;
    if args.shards.is_empty() || args.shards.iter().any(|s| !(1..=256).contains(s)) {
        return Err(BenchError::Invalid("--shards takes shard counts from 1 to 256, e.g. 1,2,4,8".into()));
    }
    let connection_counts = args.connection_counts();
    if connection_counts.contains(&0) {
        return Err(BenchError::Invalid("--connection-counts takes counts of at least 1, e.g. 1,64,512".into()));
    }
    let redis = match &args.redis {
        Some(url) => match Target::parse(url)? {
            t @ Target::Redis { .. } => Some(t),
            Target::Rankd(_) => return Err(BenchError::Invalid("--redis takes a redis://host:port URL".into())),
        },
        None => None,
    };
    if args.load.wid && redis.is_some() {
        return Err(BenchError::Invalid("--wid needs rankd: Redis has no idempotent writes (drop --redis)".into()));
    }
    let exe = match &args.rankd {
        Some(path) => path.clone(),
        None => serve::locate_rankd()?,
    };
    std::fs::create_dir_all(&args.out_dir)?;

    let mut runs: Vec<(usize, Report)> = Vec::new();
    for &shards in &args.shards {
        let data_dir = fresh_data_dir(shards);
        let result = (|| {
            let server = ServeProcess::start(&exe, &data_dir, shards, &args.serve_args)?;
            let mut reports = Vec::new();
            for (index, &connections) in connection_counts.iter().enumerate() {
                eprintln!("sweep: rankd with {shards} shard(s), {connections} connection(s)");
                let load = args.load_at(connections, index, Some(server.metrics_addr.clone()));
                let target = Target::Rankd(server.addr.clone());
                match runtime.block_on(run_on(&target, &load, false, &ConnectOptions::default())) {
                    Ok(report) => reports.push(report),
                    Err(e) => {
                        let _ = server.stop();
                        return Err(e);
                    }
                }
            }
            let status = server.stop()?;
            if !status.success() {
                eprintln!("sweep: warning: rankd serve --shards {shards} exited with {status} after SIGTERM");
            }
            Ok::<_, BenchError>(reports)
        })();
        let _ = std::fs::remove_dir_all(&data_dir);
        for report in result? {
            print(&report);
            warn_errors(&report);
            runs.push((shards, report));
        }
    }
    let mut redis_reports = Vec::new();
    if let Some(target) = &redis {
        for (index, &connections) in connection_counts.iter().enumerate() {
            eprintln!("sweep: reference run on {}, {connections} connection(s)", target.url());
            let load = args.load_at(connections, index, None);
            let report = runtime.block_on(run_on(target, &load, index == 0, &ConnectOptions::default()))?;
            print(&report);
            warn_errors(&report);
            redis_reports.push(report);
        }
    }

    let scaling = scaling(&runs.iter().map(|(shards, r)| (*shards, r.connections, r.ops_per_sec)).collect::<Vec<_>>());
    let mut csv = String::from(SWEEP_CSV_HEADER);
    csv.push('\n');
    for ((shards, report), scaling) in runs.iter().zip(&scaling) {
        csv.push_str(&sweep_row(Some(*shards), report, Some(*scaling)));
        csv.push('\n');
    }
    for report in &redis_reports {
        csv.push_str(&sweep_row(None, report, None));
        csv.push('\n');
    }
    let csv_path = args.out_dir.join("sweep.csv");
    std::fs::write(&csv_path, &csv)?;

    let json = serde_json::json!({
        "rankd": runs
            .iter()
            .zip(&scaling)
            .map(|((shards, r), scaling)| serde_json::json!({
                "shards": shards,
                "connections": r.connections,
                "scaling": scaling,
                "report": r,
            }))
            .collect::<Vec<_>>(),
        "redis": redis_reports,
    });
    let json = serde_json::to_string_pretty(&json).map_err(|e| BenchError::Other(e.to_string()))?;
    std::fs::write(args.out_dir.join("sweep.json"), json + "\n")?;

    let figures = |r: &Report| chart::Figures {
        ops_per_sec: r.ops_per_sec,
        p99_us: r.p99_us,
        server_cpu_us: r.server_cpu_us_per_op(),
    };
    let points: Vec<Point> = runs
        .iter()
        .zip(&scaling)
        .map(|((shards, r), scaling)| Point {
            shards: *shards,
            connections: r.connections,
            run: figures(r),
            scaling: *scaling,
        })
        .collect();
    let reference: Vec<RedisPoint> =
        redis_reports.iter().map(|r| RedisPoint { connections: r.connections, run: figures(r) }).collect();
    let load = &args.load;
    let mode = match load.workload {
        Workload::Set | Workload::Mixed => format!(" (mode {})", load.mode.name()),
        _ => String::new(),
    };
    let connections = connection_counts.iter().map(usize::to_string).collect::<Vec<_>>().join("/");
    let title = format!(
        "rankd-bench sweep: {}{mode}, {} players, {connections} connections x {} in flight",
        format!("{:?}", load.workload).to_lowercase(),
        load.players,
        load.pipeline
    );
    let png_path = args.out_dir.join("sweep.png");
    chart::draw(&png_path, &title, &points, &reference).map_err(|e| BenchError::Other(format!("sweep.png: {e}")))?;
    println!("{}", csv.trim_end());
    eprintln!("sweep: wrote {}, sweep.json and {}", csv_path.display(), png_path.display());
    Ok(())
}

fn warn_errors(report: &Report) {
    if report.errors > 0 {
        eprintln!("sweep: warning: {} operations answered with an error on {}", report.errors, report.target);
    }
}

fn fresh_data_dir(shards: usize) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("rankd-sweep-{}-{shards}-{nanos}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_is_throughput_over_linear_from_the_fewest_shards() {
        // In any order; the base is the run with the fewest shards.
        assert_eq!(scaling(&[(4, 8, 300.0), (2, 8, 200.0), (8, 8, 200.0)]), vec![0.75, 1.0, 0.25]);
        assert_eq!(scaling(&[(1, 8, 150.0), (2, 8, 150.0)]), vec![1.0, 0.5]);
        assert_eq!(scaling(&[(1, 8, 0.0), (2, 8, 10.0)]), vec![0.0, 0.0]);
        assert!(scaling(&[]).is_empty());
    }

    #[test]
    fn scaling_compares_runs_at_the_same_connection_count() {
        let runs = [(1, 1, 100.0), (1, 64, 1000.0), (2, 1, 150.0), (2, 64, 2000.0)];
        assert_eq!(scaling(&runs), vec![1.0, 1.0, 0.75, 1.0]);
    }

    #[test]
    fn only_the_first_run_on_a_server_prefills() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let args = Cli::parse_from(["x", "--prefill", "-c", "8", "--connection-counts", "1,64"]).sweep;
        assert_eq!(args.connection_counts(), vec![1, 64]);
        let first = args.load_at(1, 0, Some("m".into()));
        let second = args.load_at(64, 1, None);
        assert_eq!((first.connections, first.prefill, first.server_metrics.as_deref()), (1, true, Some("m")));
        assert_eq!((second.connections, second.prefill), (64, false));
        let args = Cli::parse_from(["x", "-c", "8"]).sweep;
        assert_eq!(args.connection_counts(), vec![8], "--connections when no counts are given");
    }

    #[test]
    fn no_run_replays_the_keys_of_the_run_before_it() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let given = Cli::parse_from(["x", "--seed", "5", "--connection-counts", "1,64"]).sweep;
        let seeds: Vec<_> = (0..3).map(|index| given.load_at(8, index, None).seed).collect();
        assert_eq!(seeds, vec![Some(5), Some(6), Some(7)]);
        // Without one, each run draws its own (`load::run_on`).
        let drawn = Cli::parse_from(["x"]).sweep;
        assert_eq!((drawn.load_at(8, 0, None).seed, drawn.load_at(8, 1, None).seed), (None, None));
    }
}
