//! Deep `top` pages inside one large tie: `--players` players on one score,
//! named `user:%08d` (so names share their first bytes), and `top` at each
//! of `--offsets`, the offsets taken in turn so the machine's drift falls on
//! all alike. Prints each offset's time per page (median and p99 over
//! `--rounds` pages) and, given the server's `--pid`, its CPU per page.
//!
//! `cargo run --release -p rankd-bench --example tie_pages -- --addr 127.0.0.1:7070 --pid $(pgrep -n rankd)`

use std::time::{Duration, Instant};

use clap::Parser;
use rankd_bench::process_cpu_seconds;
use rankd_client::{Client, Mode, Order, Ties};

#[derive(Parser)]
struct Args {
    /// The server.
    #[arg(long, default_value = "127.0.0.1:7070")]
    addr: String,
    /// The server's process id, for its CPU time (from /proc).
    #[arg(long)]
    pid: Option<u32>,
    /// Players on the board, all on one score.
    #[arg(long, default_value_t = 1_000_000)]
    players: u64,
    /// Offsets to read pages at.
    #[arg(long, value_delimiter = ',', default_value = "0,250000,500000,999990")]
    offsets: Vec<u64>,
    /// Players per page.
    #[arg(long, default_value_t = 10)]
    limit: u64,
    /// Pages per offset.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut client = Client::connect(&args.addr).await?;
    let board = "tie-bench";
    client.create_board(board, Order::Desc, Ties::Competition).await?;
    if client.count(board).await? < args.players {
        let started = Instant::now();
        let names: Vec<String> = (0..args.players).map(|i| format!("user:{i:08}")).collect();
        for chunk in names.chunks(10_000) {
            let entries: Vec<(&str, i64)> = chunk.iter().map(|n| (n.as_str(), 1000)).collect();
            client.set_many(board, &entries, Mode::Set).await?;
        }
        println!("loaded {} players in {:.1} s", args.players, started.elapsed().as_secs_f64());
    }
    let offsets: Vec<u64> = args.offsets.iter().copied().filter(|&o| o < args.players).collect();
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.rounds); offsets.len()];
    let mut cpu: Vec<f64> = vec![0.0; offsets.len()];
    for _ in 0..args.rounds {
        for (i, &offset) in offsets.iter().enumerate() {
            let cpu_before = args.pid.and_then(process_cpu_seconds);
            let started = Instant::now();
            let page = client.top(board, args.limit, offset).await?;
            times[i].push(started.elapsed());
            if let (Some(before), Some(after)) = (cpu_before, args.pid.and_then(process_cpu_seconds)) {
                cpu[i] += after - before;
            }
            let first = page.first().ok_or("an empty page")?;
            assert_eq!(first.player, format!("user:{offset:08}"), "the page at {offset} starts with its player");
        }
    }
    println!("{} players tied, pages of {}, {} pages per offset", args.players, args.limit, args.rounds);
    println!("{:>10} {:>12} {:>12} {:>16}", "offset", "median", "p99", "server CPU/page");
    for (i, offset) in offsets.iter().enumerate() {
        times[i].sort_unstable();
        let cpu_per_page =
            if args.pid.is_some() { format!("{:.3} ms", cpu[i] * 1e3 / args.rounds as f64) } else { "-".into() };
        println!(
            "{offset:>10} {:>9.3} ms {:>9.3} ms {cpu_per_page:>16}",
            rankd_bench::quantile(&times[i], 0.5).as_secs_f64() * 1e3,
            rankd_bench::quantile(&times[i], 0.99).as_secs_f64() * 1e3
        );
    }
    Ok(())
}
