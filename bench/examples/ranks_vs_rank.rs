//! A friends leaderboard two ways: one `ranks` of N players against N
//! `rank` requests (sent one at a time, and pipelined), on one board of
//! `--players` players. Prints each way's time per list (median and p99 over
//! `--rounds` lists) and, given the server's `--pid`, its CPU per list.
//!
//! `cargo run --release -p rankd-bench --example ranks_vs_rank -- --addr 127.0.0.1:7070 --pid $(pgrep -n rankd)`

use std::time::Instant;

use clap::Parser;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd_bench::process_cpu_seconds;
use rankd_client::{Call, Client, Mode, OpKind};

#[derive(Parser)]
struct Args {
    /// The server.
    #[arg(long, default_value = "127.0.0.1:7070")]
    addr: String,
    /// The server's process id, for its CPU time (from /proc).
    #[arg(long)]
    pid: Option<u32>,
    /// Players on the board.
    #[arg(long, default_value_t = 1_000_000)]
    players: u64,
    /// Names per list.
    #[arg(long, default_value_t = 200)]
    friends: usize,
    /// Lists per way.
    #[arg(long, default_value_t = 300)]
    rounds: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut client = Client::connect(&args.addr).await?;
    let board = "friends-bench";
    if client.count(board).await? < args.players {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for chunk in (0..args.players).collect::<Vec<_>>().chunks(10_000) {
            let entries: Vec<(String, i64)> =
                chunk.iter().map(|i| (format!("player:{i}"), rng.gen_range(0..1_000_000))).collect();
            client
                .call::<Vec<i64>>(
                    Call::new(OpKind::SetMany).with("board", board).with("entries", entries).with("mode", Mode::Set),
                )
                .await?;
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let names: Vec<String> = (0..args.players).map(|i| format!("player:{i}")).collect();
    let lists: Vec<Vec<&str>> =
        (0..args.rounds).map(|_| names.choose_multiple(&mut rng, args.friends).map(String::as_str).collect()).collect();
    println!("board of {} players, lists of {} names, {} lists per way", args.players, args.friends, args.rounds);
    for way in ["ranks", "rank x N, one at a time", "rank x N, pipelined"] {
        let mut times = Vec::with_capacity(lists.len());
        let cpu_before = args.pid.and_then(process_cpu_seconds);
        for list in &lists {
            let started = Instant::now();
            match way {
                "ranks" => {
                    let got = client.ranks(board, list).await?;
                    assert_eq!(got.len(), list.len());
                }
                "rank x N, one at a time" => {
                    for player in list {
                        client.rank(board, player).await?.ok_or("a listed player is absent")?;
                    }
                }
                _ => {
                    let calls: Vec<Call> =
                        list.iter().map(|p| Call::new(OpKind::Rank).with("board", board).with("player", *p)).collect();
                    let (ok, failed) = client.pipeline_outcomes(&calls).await?;
                    assert_eq!((ok, failed), (list.len() as u64, 0));
                }
            }
            times.push(started.elapsed());
        }
        let cpu = cpu_before.zip(args.pid.and_then(process_cpu_seconds)).map(|(a, b)| (b - a) / lists.len() as f64);
        times.sort();
        println!(
            "{way:>26}: median {:>8.2?}  p99 {:>8.2?}  server CPU per list {}",
            rankd_bench::quantile(&times, 0.5),
            rankd_bench::quantile(&times, 0.99),
            cpu.map_or("-".into(), |c| format!("{:.1} µs", c * 1e6))
        );
    }
    Ok(())
}
