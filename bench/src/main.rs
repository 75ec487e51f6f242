//! The `rankd-bench` binary: see the library's docs.

use std::process::ExitCode;

use clap::Parser;
use rankd_bench::BenchCommand;

/// Load-generate against a running rankd (or Redis, `--target redis://...`)
/// and report throughput, latency and CPU; `rankd-bench sweep` compares
/// shard counts; `rankd-bench watch-latency` times watch pushes.
#[derive(Debug, Parser)]
#[command(name = "rankd-bench", version, about)]
struct Cli {
    #[command(flatten)]
    bench: BenchCommand,
}

fn main() -> ExitCode {
    rankd_bench::main(Cli::parse().bench)
}
