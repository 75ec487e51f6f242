//! The `rankd` command line: `serve` and the client subcommands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use rankd_client::{BoardSpec, FieldSpec, Order, Ties, Window};

use crate::settings::ServeSettings;

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
    Serve(Box<ServeSettings>),
    /// Check a running server answers.
    Ping(ClientArgs),
    /// Create a board: `rankd create-board BOARD [--ties dense] [--window
    /// daily]...`; with `--field trophies:desc:0:1000000 --field
    /// retries:asc:1000` (name:order:min:max, min 0 if left out), a board
    /// ranking by composite scores.
    CreateBoard {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        #[command(flatten)]
        config: BoardArgs,
    },
    /// Write a score: `rankd set BOARD PLAYER SCORE [--mode best|incr]`;
    /// on a board with fields, SCORE is `trophies=5,retries=2`.
    Set {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        player: String,
        #[arg(allow_hyphen_values = true)]
        score: rankd_client::Score,
        /// set, best or incr.
        #[arg(long, default_value = "set")]
        mode: String,
        /// Apply at most once: a repeat with the same wid (within the
        /// server's dedup horizon) answers the first result and changes
        /// nothing.
        #[arg(long)]
        wid: Option<String>,
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
        /// Estimate it from the board's bucket summary (no fan-out), with
        /// a bound: the exact rank lies within rank ± error.
        #[arg(long)]
        approx: bool,
    },
    /// The rank a new player with this score would get.
    RankOfScore {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        #[arg(allow_hyphen_values = true)]
        score: i64,
        /// Estimate it from the board's bucket summary, with a bound.
        #[arg(long)]
        approx: bool,
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
    /// Where some players stand, best first, with their board-wide ranks
    /// (a friends leaderboard): `rankd ranks BOARD alice bob carol`.
    Ranks {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
        /// Up to 1000 player names.
        #[arg(required = true)]
        players: Vec<String>,
    },
    /// Players on a board.
    Count {
        #[command(flatten)]
        client: ClientArgs,
        board: String,
    },
    /// Boards in byte order of their names, a page at a time:
    /// `rankd boards --prefix lvl --limit 50`, then `--after` the last name.
    Boards {
        #[command(flatten)]
        client: ClientArgs,
        /// Only boards whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Start after this board name (the last one of the page before).
        #[arg(long)]
        after: Option<String>,
        /// At most this many boards (1-10000).
        #[arg(long, default_value_t = 1000)]
        limit: u64,
    },
    /// Print a board's top or a player's rank each time it changes, until
    /// interrupted: `rankd watch BOARD --top 10` or `--player NAME`.
    Watch {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        watch: rankd_client::cli::WatchArgs,
    },
    /// Verify a stopped server's data dir (trees, index and players agree).
    Check {
        /// The data dir to check.
        #[arg(long, default_value = "rankd-data")]
        data_dir: PathBuf,
    },
    /// Load `board,player,score` rows (CSV or msgpack) into a running server.
    Import(crate::tools::import::ImportArgs),
    /// Write a board in rank order as CSV.
    Export(crate::tools::transfer::ExportArgs),
    /// Copy a running server's data, consistent at one moment, into a new
    /// data dir: `rankd backup --to DIR`, then `rankd serve --data-dir DIR`
    /// with the shard count and branching it prints.
    Backup(crate::tools::backup::BackupArgs),
}

/// A board's config, for `rankd create-board`: whatever is left out is the
/// server's default.
#[derive(Debug, Clone, Args)]
pub struct BoardArgs {
    /// desc (higher is better) or asc; ignored with --field.
    #[arg(long, value_parser = |text: &str| Order::from_name(text).ok_or("desc or asc"))]
    pub order: Option<Order>,
    /// competition, dense or ordinal.
    #[arg(long, value_parser = |text: &str| Ties::from_name(text).ok_or("competition, dense or ordinal"))]
    pub ties: Option<Ties>,
    /// A window to keep (all, daily, weekly, monthly); repeat for several.
    #[arg(long = "window", value_parser = |text: &str| Window::from_name(text).ok_or("all, daily, weekly or monthly"))]
    pub windows: Vec<Window>,
    /// Past periods kept of each periodic window (1-1000).
    #[arg(long)]
    pub keep: Option<u32>,
    /// A field of composite scores, name:order:min:max (or name:order:max,
    /// min 0); 2 to 4 of them, ranked in the order given.
    #[arg(long = "field", allow_hyphen_values = true)]
    pub fields: Vec<FieldSpec>,
}

impl BoardArgs {
    /// The config these flags describe.
    pub fn spec(&self) -> BoardSpec {
        BoardSpec {
            order: self.order,
            ties: self.ties,
            windows: self.windows.clone(),
            keep: self.keep,
            fields: self.fields.clone(),
        }
    }
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
    /// TLS and the token.
    #[command(flatten)]
    pub connect: rankd_client::cli::ConnectArgs,
}

impl ClientArgs {
    /// Connects as the flags say (TLS, then `auth` with the token).
    pub async fn connect(&self) -> Result<rankd_client::Client, rankd_client::ClientError> {
        rankd_client::Client::connect_with(&self.server, &self.connect.options()?).await
    }
}
