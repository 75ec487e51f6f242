//! `rankd-powercut MOUNTPOINT [--seed DIR] [--seed-rng N] [--threads N]`:
//! mounts the power-cut filesystem and obeys control commands on stdin.
//! The model and the commands are described in the library's docs
//! (`powercut`, src/lib.rs).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = powercut::daemon::Args::parse();
    match powercut::daemon::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rankd-powercut: {message}");
            ExitCode::FAILURE
        }
    }
}
