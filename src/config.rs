//! Command line (clap) and the optional TOML config file. Every server knob
//! can be set in both; a flag wins over the file, the file over the default.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::protocol::DEFAULT_MAX_FRAME;

/// Default `--cache-mb`. At 10M players 512 MiB bought 11–29% more sets
/// for ~600 MiB more RSS, which is the operator's call (`--cache-mb`), not
/// a default. 48 since the record cache fills its share (`cache.rs`): that
/// holds 996k records on one shard, more than 64 MiB held before (917k), so
/// 1M players are still nearly all cached, and 10M players take ~16 MiB less than
/// at 64 (60-61 B/player at 64, against the 60 B/player bar).
const DEFAULT_CACHE_MB: u64 = 48;

/// rankd: exact, durable, sharded leaderboards.
#[derive(Debug, Parser)]
#[command(name = "rankd", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands: the server, and redis-cli style clients.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Check a running server answers.
    Ping(ClientArgs),
    /// Write a score: `rankd set BOARD PLAYER SCORE [--mode best|incr]`.
    Set {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        player: String,
        #[arg(allow_hyphen_values = true)]
        score: i64,
        /// set, best or incr.
        #[arg(long, default_value = "set")]
        mode: String,
    },
    /// A player's score.
    Get {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        player: String,
    },
    /// A player's rank.
    Rank {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        player: String,
    },
    /// The best players.
    Top {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        #[arg(long, default_value_t = 10)]
        limit: u64,
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// A player and their neighbours.
    Around {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        player: String,
        #[arg(long, default_value_t = 5)]
        before: u64,
        #[arg(long, default_value_t = 5)]
        after: u64,
    },
    /// Players on a board.
    Count {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
    },
    /// All boards.
    Boards(ClientArgs),
    /// Verify a stopped server's data dir (trees, index and players agree).
    Check {
        /// The data dir to check.
        #[arg(long, default_value = "rankd-data")]
        data_dir: PathBuf,
    },
    /// Load `board,player,score` rows (CSV or msgpack) into a running server.
    Import(crate::transfer::ImportArgs),
    /// Write a board in rank order as CSV.
    Export(crate::transfer::ExportArgs),
    /// Load-generate against a running rankd (or Redis, `--target redis://...`)
    /// and report throughput and latency; `rankd bench sweep` compares shard counts.
    Bench(Box<crate::bench::BenchCommand>),
}

/// Where a client subcommand connects and how it prints.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long, short = 's', default_value = "127.0.0.1:7070", env = "RANKD_SERVER")]
    pub server: String,
    /// Print the raw result as JSON instead of a human table.
    #[arg(long)]
    pub json: bool,
}

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// fsync before acknowledging (survives power loss).
    #[default]
    Sync,
    /// Hand to the OS before acknowledging (survives kill -9, not power loss).
    Buffered,
}

/// `rankd serve` flags; unset ones fall back to the config file, then defaults.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Client address [default: 127.0.0.1:7070].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Prometheus metrics address [default: 127.0.0.1:7071].
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Where the shards store their data [default: ./rankd-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Number of tree shards, each on its own thread [default: number of cores].
    #[arg(long)]
    pub shards: Option<usize>,
    /// Count-tree branching factor: 2, 4, 8, 16, 32, 64, 128 or 256 [default: 16].
    #[arg(long)]
    pub branching: Option<u32>,
    /// Most requests one shard applies in one atomic batch [default: 4096].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Largest frame accepted, bytes [default: 1 MiB].
    #[arg(long)]
    pub max_frame: Option<usize>,
    /// Requests a connection may have in flight before the server stops
    /// reading from it [default: 4096].
    #[arg(long)]
    pub max_inflight: Option<usize>,
    /// When writes are acknowledged [default: sync].
    #[arg(long, value_enum)]
    pub durability: Option<DurabilityArg>,
    /// Token clients must present with `auth` before any op but `ping`.
    #[arg(long, env = "RANKD_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Allow listening on a non-loopback address without `--auth-token`.
    #[arg(long)]
    pub allow_unauthenticated_remote: bool,
    /// Client connections served at once; more are answered `overloaded`
    /// and closed [default: 4096].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Close a connection with nothing in flight that sent nothing for this
    /// many seconds (half-open or abandoned clients) [default: 300].
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Commands a shard may have queued before new work for it is answered
    /// `overloaded` instead of queued [default: 262144].
    #[arg(long)]
    pub max_shard_queue: Option<usize>,
    /// Memory for caches, MiB, shared by all shards: a quarter for storage
    /// blocks, the rest for player records (a record hit spares a storage
    /// read on every write and rank) [default: 48].
    #[arg(long)]
    pub cache_mb: Option<u64>,
    /// Testing only: every commit first sleeps this long (a slow disk).
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_commit_delay_ms: u64,
    /// Testing only: the runs thread sleeps this long before writing the
    /// runs of each group of answered batches (a slow disk, or a runs thread
    /// starved of CPU).
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_runs_delay_ms: u64,
    /// Testing only: write changed players as runs every this many instead
    /// of every 65,536, so tests reach many runs.
    #[arg(long, hide = true)]
    pub debug_run_every: Option<usize>,
    /// Testing only: checkpoint the count trees after this many logged
    /// changes instead of 100k, so tests reach checkpoints and the leaf
    /// repacking passes that follow them.
    #[arg(long, hide = true)]
    pub debug_checkpoint_every: Option<u64>,
    /// Testing only: copy at least this many count-tree leaves per sealed
    /// batch for a checkpoint instead of 256 (and one per write in it), so
    /// tests spread checkpoints over many batches.
    #[arg(long, hide = true)]
    pub debug_checkpoint_slice_leaves: Option<usize>,
    /// Testing only: queue every rank for the shards, never answering one
    /// in place, so tests cover the queued paths with lone ranks too (and
    /// benchmarks can compare the two).
    #[arg(long, hide = true)]
    pub debug_queue_ranks: bool,
    /// Benchmarking only: do not update per-request and per-batch metrics
    /// (to measure what they cost).
    #[arg(long, hide = true)]
    pub no_request_metrics: bool,
}

/// The config file: the same settings as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    shards: Option<usize>,
    branching: Option<u32>,
    max_batch: Option<usize>,
    max_frame: Option<usize>,
    max_inflight: Option<usize>,
    durability: Option<DurabilityArg>,
    auth_token: Option<String>,
    allow_unauthenticated_remote: Option<bool>,
    max_connections: Option<usize>,
    idle_timeout_secs: Option<u64>,
    max_shard_queue: Option<usize>,
    cache_mb: Option<u64>,
}

/// Resolved server settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Client address.
    pub listen: SocketAddr,
    /// Metrics address.
    pub metrics_listen: SocketAddr,
    /// Data dir.
    pub data_dir: PathBuf,
    /// Shards.
    pub shards: usize,
    /// Branching factor.
    pub branching: u32,
    /// Max requests per batch.
    pub max_batch: usize,
    /// Max frame bytes.
    pub max_frame: usize,
    /// Max in-flight requests per connection.
    pub max_inflight: usize,
    /// Durability.
    pub durability: DurabilityArg,
    /// Required token, if any.
    pub auth_token: Option<Secret>,
    /// Max concurrent connections.
    pub max_connections: usize,
    /// Idle connection timeout.
    pub idle_timeout: std::time::Duration,
    /// Max queued commands per shard.
    pub max_shard_queue: usize,
    /// Cache memory in bytes, all shards together.
    pub cache_bytes: u64,
    /// Testing only: sleep before each commit.
    pub debug_commit_delay: std::time::Duration,
    /// Testing only: sleep before writing each answered group's runs.
    pub debug_runs_delay: std::time::Duration,
    /// Testing only: players changed between runs.
    pub debug_run_every: Option<usize>,
    /// Testing only: logged tree changes between checkpoints.
    pub debug_checkpoint_every: Option<u64>,
    /// Testing only: leaves copied per sealed batch for a checkpoint.
    pub debug_checkpoint_slice_leaves: Option<usize>,
    /// Testing only: never answer a rank in place.
    pub debug_queue_ranks: bool,
    /// Benchmarking only: skip per-request and per-batch metrics.
    pub no_request_metrics: bool,
}

/// A secret setting: never printed, not even in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Compares with `candidate` in time that depends only on the lengths,
    /// never on where the first difference is.
    pub fn matches(&self, candidate: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), candidate.as_bytes());
        let mut diff = a.len() ^ b.len();
        for i in 0..a.len().max(b.len()) {
            diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }
}

/// A bad setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// The file is not valid.
    #[error("invalid config file {0}: {1}")]
    Parse(PathBuf, toml::de::Error),
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
}

impl ServeArgs {
    /// Merges flags over the file over the defaults, and validates.
    pub fn resolve(&self) -> Result<ServeConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.clone(), e))?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse(path.clone(), e))?
            }
            None => ServeFile::default(),
        };
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let config = ServeConfig {
            listen: self.listen.or(file.listen).unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070))),
            metrics_listen: self
                .metrics_listen
                .or(file.metrics_listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7071))),
            data_dir: self.data_dir.clone().or(file.data_dir).unwrap_or_else(|| PathBuf::from("rankd-data")),
            shards: self.shards.or(file.shards).unwrap_or(cores),
            branching: self.branching.or(file.branching).unwrap_or(rankd_shards::tree::DEFAULT_BRANCHING),
            max_batch: self.max_batch.or(file.max_batch).unwrap_or(4096),
            max_frame: self.max_frame.or(file.max_frame).unwrap_or(DEFAULT_MAX_FRAME),
            max_inflight: self.max_inflight.or(file.max_inflight).unwrap_or(4096),
            durability: self.durability.or(file.durability).unwrap_or_default(),
            auth_token: self.auth_token.clone().or(file.auth_token).filter(|t| !t.is_empty()).map(Secret),
            max_connections: self.max_connections.or(file.max_connections).unwrap_or(4096),
            idle_timeout: std::time::Duration::from_secs(
                self.idle_timeout_secs.or(file.idle_timeout_secs).unwrap_or(300),
            ),
            max_shard_queue: self.max_shard_queue.or(file.max_shard_queue).unwrap_or(1 << 18),
            cache_bytes: self.cache_mb.or(file.cache_mb).unwrap_or(DEFAULT_CACHE_MB).saturating_mul(1 << 20),
            debug_commit_delay: std::time::Duration::from_millis(self.debug_commit_delay_ms),
            debug_runs_delay: std::time::Duration::from_millis(self.debug_runs_delay_ms),
            debug_run_every: self.debug_run_every,
            debug_checkpoint_every: self.debug_checkpoint_every,
            debug_checkpoint_slice_leaves: self.debug_checkpoint_slice_leaves,
            debug_queue_ranks: self.debug_queue_ranks,
            no_request_metrics: self.no_request_metrics,
        };
        if !(1..=256).contains(&config.shards) {
            return Err(ConfigError::Invalid("--shards must be 1 to 256".into()));
        }
        rankd_shards::tree::branching_bits(config.branching).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if config.max_batch == 0 || config.max_inflight == 0 {
            return Err(ConfigError::Invalid("--max-batch and --max-inflight must be at least 1".into()));
        }
        let allow_remote = self.allow_unauthenticated_remote || file.allow_unauthenticated_remote.unwrap_or(false);
        if config.auth_token.is_none() && !config.listen.ip().is_loopback() && !allow_remote {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {} without --auth-token (set RANKD_AUTH_TOKEN, or pass \
                 --allow-unauthenticated-remote if the network is trusted)",
                config.listen
            )));
        }
        if config.max_connections == 0 || config.max_shard_queue == 0 || config.idle_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "--max-connections, --max-shard-queue and --idle-timeout-secs must be at least 1".into(),
            ));
        }
        if !(64..=64 << 20).contains(&config.max_frame) {
            return Err(ConfigError::Invalid("--max-frame must be 64 bytes to 64 MiB".into()));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rankd.toml");
        std::fs::write(&path, "shards = 3\nbranching = 64\nlisten = \"127.0.0.1:9000\"\n").unwrap();
        let args = ServeArgs { config: Some(path.clone()), shards: Some(5), ..ServeArgs::default() };
        let config = args.resolve().unwrap();
        assert_eq!((config.shards, config.branching, config.listen.port()), (5, 64, 9000));

        std::fs::write(&path, "shardz = 3\n").unwrap();
        assert!(matches!(
            ServeArgs { config: Some(path), ..ServeArgs::default() }.resolve(),
            Err(ConfigError::Parse(..))
        ));
        assert!(ServeArgs { branching: Some(3), ..ServeArgs::default() }.resolve().is_err());
    }

    #[test]
    fn remote_listening_needs_a_token_or_an_explicit_opt_in() {
        let remote: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let err = ServeArgs { listen: Some(remote), ..ServeArgs::default() }.resolve().unwrap_err();
        assert!(err.to_string().contains("--auth-token"), "{err}");
        let with_token = ServeArgs { listen: Some(remote), auth_token: Some("s3cret".into()), ..ServeArgs::default() };
        let config = with_token.resolve().unwrap();
        assert!(!format!("{config:?}").contains("s3cret"), "the token never shows in Debug output");
        let opted_in = ServeArgs { listen: Some(remote), allow_unauthenticated_remote: true, ..ServeArgs::default() };
        assert!(opted_in.resolve().is_ok());
    }

    #[test]
    fn tokens_compare_exactly() {
        let secret = Secret("abc".into());
        assert!(secret.matches("abc"));
        assert!(!secret.matches("abd") && !secret.matches("ab") && !secret.matches("abcd") && !secret.matches(""));
    }
}
