//! The load generator's command line: a single run's flags, the load they
//! describe (shared with a sweep), and the sweep subcommand.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use rankd_client::Mode;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::sweep::SweepArgs;
use crate::watch_latency::WatchLatencyArgs;

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

/// How the load picks players.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every player equally likely.
    Uniform,
    /// Zipf over the player key space: `player:0` is the hottest.
    Zipf,
}

/// `rankd-bench`: a run, or the `sweep` or `watch-latency` subcommand.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCommand {
    /// A shard-count sweep or a watch-latency run instead of a single run.
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
    /// A single run's flags.
    #[command(flatten)]
    pub run: BenchArgs,
}

/// `rankd-bench` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchSub {
    /// Start a fresh `rankd serve` for each shard count, run the same load on
    /// each (and once on Redis as a reference), write sweep.csv and sweep.png.
    Sweep(SweepArgs),
    /// Open many watches (protocol 1.1) on one board while writers raise a
    /// player's score at a steady rate, and time each push from the
    /// acknowledgement of the write it first shows.
    WatchLatency(WatchLatencyArgs),
}

/// `rankd-bench` flags for a single run.
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
    /// TLS and the token, for rankd.
    #[command(flatten)]
    pub connect: rankd_client::cli::ConnectArgs,
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
    /// How writes combine with the stored score: set, best or incr.
    #[arg(long, default_value = "set", value_parser = parse_mode)]
    pub mode: Mode,
    /// Give every write a unique `wid` (an idempotent write, protocol 1.1;
    /// 32 hex digits, as rankd-client's RetryingClient sends): what the
    /// server's dedup costs a write. rankd only.
    #[arg(long)]
    pub wid: bool,
    /// Send every `rank` with `approx: true` (protocol 1.1): answered from
    /// the board's bucket summary, without a fan-out. rankd only.
    #[arg(long)]
    pub approx: bool,
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
    /// Spread the load over this many boards, named `BOARD:0000000` on
    /// (`--board` and a 7-digit number), each operation on a board drawn
    /// uniformly; every board has the same `--players`. 1: the one board
    /// named `--board`.
    #[arg(long, default_value_t = 1)]
    pub boards: u64,
    /// Player `i` is named this prefix and `i`.
    #[arg(long, default_value = "player:")]
    pub player_prefix: String,
    /// Before measuring, give every player a score (rankd set_many of 10 000,
    /// Redis ZADD of 1000). With `--boards`, one request per board (while
    /// its players fit in one), `--pipeline` of them in flight per
    /// connection.
    #[arg(long)]
    pub prefill: bool,
    /// Scores are drawn from 0..score-range (ties grow as it shrinks).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub score_range: i64,
    /// Random seed of the operations (and the prefill's scores); drawn at
    /// random when not given, and reported, so a run can be repeated. A
    /// fixed default would make a measurement replay the warm-up run before
    /// it, key for key, and find every key it touched already cached.
    #[arg(long)]
    pub seed: Option<u64>,
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
    /// The run's seed: `--seed`, or the one `run_on` drew before prefilling.
    pub(crate) fn seed(&self) -> u64 {
        self.seed.unwrap_or_default()
    }

    pub(crate) fn validate(&self) -> Result<(), BenchError> {
        let bad = |msg: &str| Err(BenchError::Invalid(msg.into()));
        if self.connections == 0 || self.pipeline == 0 {
            return bad("--connections and --pipeline must be at least 1");
        }
        if self.players == 0 || self.boards == 0 || self.score_range <= 0 {
            return bad("--players, --boards and --score-range must be at least 1");
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

    pub(crate) fn progress_visible(&self) -> bool {
        !self.quiet && std::io::stderr().is_terminal()
    }
}

/// Parses a write mode by its protocol name.
fn parse_mode(text: &str) -> Result<Mode, String> {
    Mode::from_name(text).ok_or_else(|| format!("unknown mode `{text}`: set, best or incr"))
}
