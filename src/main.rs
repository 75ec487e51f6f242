//! The `rankd` binary: `rankd serve` runs the server; the other subcommands
//! are clients of a running server.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use rankd::tools::cli::{Cli, Command};

/// jemalloc instead of glibc malloc: requests are allocated on the
/// I/O thread and freed on shard threads, which glibc's arenas
/// handle badly (see docs/performance-history.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings (the `_rjem_` prefix is how tikv-jemallocator names
/// its symbols): freed pages go back to the OS after a second, by a
/// background thread, so the RSS stays close to what is allocated.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RANKD_LOG")
                .unwrap_or_else(|_| "info,fjall=warn,lsm_tree=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Serve(settings) => {
            let Some(serve) = matches.subcommand_matches("serve") else { return fail(&"no serve arguments") };
            let settings = match settings.resolve(serve) {
                Ok(settings) => settings,
                Err(e) => return fail(&e),
            };
            match rankd::server::run(settings) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Check { data_dir } => match rankd::tools::check::check(&data_dir) {
            Ok(report) => {
                println!(
                    "ok: {} shards, {} boards, {} players; trees, index and players agree",
                    report.shards, report.boards, report.players
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Import(args) => block_on(async move {
            let report = rankd::tools::import::import(&args).await?;
            eprintln!(
                "imported {} rows in {:.1} s ({:.0} rows/s){}",
                report.rows,
                report.seconds,
                report.rows as f64 / report.seconds.max(1e-9),
                match report.resent {
                    0 => String::new(),
                    n => format!("; {n} requests sent again, each applied once"),
                }
            );
            Ok(())
        }),
        Command::Export(args) => block_on(async move {
            let rows = match &args.out {
                Some(path) => {
                    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
                    rankd::tools::transfer::export(&args, &mut file).await?
                }
                None => rankd::tools::transfer::export(&args, &mut std::io::stdout().lock()).await?,
            };
            eprintln!("exported {rows} rows");
            Ok(())
        }),
        Command::Backup(args) => match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => match runtime.block_on(rankd::tools::backup::backup(&args)) {
                Ok(report) => {
                    println!("{}", report.describe(&args.to));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            },
            Err(e) => fail(&e),
        },
        client => {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return fail(&e),
            };
            match runtime.block_on(rankd::tools::client_commands::run(client)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
    }
}

/// Runs a client task on a single-threaded runtime.
fn block_on(task: impl std::future::Future<Output = Result<(), rankd::tools::transfer::TransferError>>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => match runtime.block_on(task) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Err(e) => fail(&e),
    }
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("rankd: {error}");
    ExitCode::FAILURE
}
