//! `rankd-bench`: a load generator that drives a running server with C
//! connections, each keeping D requests in flight, and reports throughput,
//! latency percentiles (HDR histogram) and the CPU each side spent.
//!
//! The same generator drives rankd (msgpack protocol, through
//! `rankd-client`) or Redis (`--target redis://host:port`, sorted-set
//! commands over a small pipelined RESP client, see `target.rs`), so the two
//! can be compared on equal terms. `rankd-bench sweep` (`sweep.rs`) runs one
//! load against fresh servers with several shard counts (and Redis as a
//! reference) and charts the result. `rankd-bench watch-latency`
//! (`watch_latency.rs`) times watch pushes (protocol 1.1) from the
//! acknowledgement of the write they show; `--wid` gives every write of a
//! run an idempotency id, to measure what that costs.
//!
//! Latency is measured per request from the moment its pipeline batch was
//! written to the moment the batch's last reply arrived, so it includes
//! queueing behind the batch — what a pipelining client actually sees.
//!
//! - [`args`]: the command line; [`load`]: running a load; [`report`]: what
//!   it measured; [`target`]: rankd or Redis; [`sweep`]: shard-count
//!   experiments; [`serve`]: starting `rankd serve` processes;
//!   [`watch_latency`]: push latency of watches;
//! - `cpu`, `server_latency`: the server's CPU and latency as its metrics
//!   and Redis's `INFO` say; `chart`: the sweep's PNG; [`resp`]: Redis's wire
//!   protocol.

pub mod args;
mod chart;
mod cpu;
mod error;
pub mod load;
pub mod report;
pub mod resp;
pub mod serve;
mod server_latency;
pub mod sweep;
pub mod target;
pub mod watch_latency;

use std::process::ExitCode;

pub use args::{BenchArgs, BenchCommand, BenchSub, KeyDistribution, LoadArgs, Workload};
pub use cpu::{process_cpu_seconds, quantile};
pub use error::BenchError;
pub use load::{run, run_on};
pub use report::Report;
pub use server_latency::OpLatency;
pub use target::Target;

/// `rankd-bench ...`: runs it and prints or writes what it measured.
pub fn main(command: BenchCommand) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(BenchError::from).and_then(
        |runtime| match command.sub {
            Some(BenchSub::Sweep(args)) => sweep::run(&runtime, &args),
            Some(BenchSub::WatchLatency(args)) => runtime.block_on(watch_latency::main(&args)),
            None => runtime.block_on(single(&command.run)),
        },
    );
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rankd-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn single(args: &BenchArgs) -> Result<(), BenchError> {
    let report = run(args).await?;
    report::print(&report);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Other(e.to_string()))?;
        std::fs::write(path, json + "\n")?;
    }
    if let Some(path) = &args.csv {
        report::append_csv(path, Report::CSV_HEADER, &report.csv_row())?;
    }
    Ok(())
}
