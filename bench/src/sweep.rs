//! `rankd-bench sweep`: the same load against a fresh `rankd serve` for each
//! shard count (on loopback, with a fresh data dir, stopped
//! with SIGTERM afterwards), and optionally once against Redis as a
//! reference; writes `sweep.csv`, `sweep.json` and `sweep.png`.

use std::path::PathBuf;

use clap::Args;

use crate::args::{LoadArgs, Workload};
use crate::chart::{self, Point};
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
    /// Also run the load once against this Redis (`redis://host:port`) as a
    /// reference; its board is emptied with DEL first.
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

/// The CSV header of `sweep.csv`.
pub const SWEEP_CSV_HEADER: &str =
    "shards,workload,ops_per_sec,p50_us,p99_us,p999_us,target,server_cores,server_cpu_us_per_op,client_cores,\
     machine_idle_cores,scaling";

/// How close each run, given as its shard count and throughput, came to
/// linear scaling: its throughput over what the run with the fewest shards
/// would give if throughput grew in proportion to shards (1.0: linear; 0.5:
/// twice the shards, the same throughput). This is the figure a
/// shard-count experiment asks about, so the CSV and the chart carry it
/// rather than leaving every reader to divide.
fn scaling(runs: &[(usize, f64)]) -> Vec<f64> {
    let Some(&(base_shards, base_ops)) = runs.iter().min_by_key(|(shards, _)| *shards) else {
        return Vec::new();
    };
    runs.iter()
        .map(|&(shards, ops_per_sec)| {
            let linear = base_ops * shards as f64 / base_shards as f64;
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
        format!("{:?}", report.workload).to_lowercase(),
        format!("{:.1}", report.ops_per_sec),
        report.p50_us.to_string(),
        report.p99_us.to_string(),
        report.p999_us.to_string(),
        csv_field(&report.target),
        report.server_cores().map(|c| format!("{c:.2}")).unwrap_or_default(),
        report.server_cpu_us_per_op().map(|us| format!("{us:.2}")).unwrap_or_default(),
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
        eprintln!("sweep: rankd with {shards} shard(s)");
        let data_dir = fresh_data_dir(shards);
        let result = (|| {
            let server = ServeProcess::start(&exe, &data_dir, shards, &args.serve_args)?;
            let load = LoadArgs { server_metrics: Some(server.metrics_addr.clone()), ..args.load.clone() };
            let report =
                runtime.block_on(run_on(&Target::Rankd(server.addr.clone()), &load, false, &ConnectOptions::default()));
            let status = server.stop()?;
            let report = report?;
            if !status.success() {
                eprintln!("sweep: warning: rankd serve --shards {shards} exited with {status} after SIGTERM");
            }
            Ok::<_, BenchError>(report)
        })();
        let _ = std::fs::remove_dir_all(&data_dir);
        let report = result?;
        print(&report);
        warn_errors(&report);
        runs.push((shards, report));
    }
    let redis_report = match &redis {
        Some(target) => {
            eprintln!("sweep: reference run on {}", target.url());
            let report = runtime.block_on(run_on(target, &args.load, true, &ConnectOptions::default()))?;
            print(&report);
            warn_errors(&report);
            Some(report)
        }
        None => None,
    };

    let scaling = scaling(&runs.iter().map(|(shards, r)| (*shards, r.ops_per_sec)).collect::<Vec<_>>());
    let mut csv = String::from(SWEEP_CSV_HEADER);
    csv.push('\n');
    for ((shards, report), scaling) in runs.iter().zip(&scaling) {
        csv.push_str(&sweep_row(Some(*shards), report, Some(*scaling)));
        csv.push('\n');
    }
    if let Some(report) = &redis_report {
        csv.push_str(&sweep_row(None, report, None));
        csv.push('\n');
    }
    let csv_path = args.out_dir.join("sweep.csv");
    std::fs::write(&csv_path, &csv)?;

    let json = serde_json::json!({
        "rankd": runs
            .iter()
            .zip(&scaling)
            .map(|((shards, r), scaling)| serde_json::json!({"shards": shards, "scaling": scaling, "report": r}))
            .collect::<Vec<_>>(),
        "redis": redis_report,
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
        .map(|((shards, r), scaling)| Point { shards: *shards, run: figures(r), scaling: *scaling })
        .collect();
    let reference = redis_report.as_ref().map(figures);
    let load = &args.load;
    let mode = match load.workload {
        Workload::Set | Workload::Mixed => format!(" (mode {})", load.mode.name()),
        _ => String::new(),
    };
    let title = format!(
        "rankd-bench sweep: {}{mode}, {} players, {} x {} in flight",
        format!("{:?}", load.workload).to_lowercase(),
        load.players,
        load.connections,
        load.pipeline
    );
    let png_path = args.out_dir.join("sweep.png");
    chart::draw(&png_path, &title, &points, reference).map_err(|e| BenchError::Other(format!("sweep.png: {e}")))?;
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
        assert_eq!(scaling(&[(4, 300.0), (2, 200.0), (8, 200.0)]), vec![0.75, 1.0, 0.25]);
        assert_eq!(scaling(&[(1, 150.0), (2, 150.0)]), vec![1.0, 0.5]);
        assert_eq!(scaling(&[(1, 0.0), (2, 10.0)]), vec![0.0, 0.0]);
        assert!(scaling(&[]).is_empty());
    }
}
