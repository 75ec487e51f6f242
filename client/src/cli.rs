//! Command-line flags for how to connect (feature `cli`), shared by the
//! `rankd` client subcommands and the load generator so both spell TLS and
//! tokens the same way. Tokens come from a file or `RANKD_TOKEN`, never a
//! flag: `ps` would show it.
//!
//! Also what a `rankd watch` command needs: its flags ([`WatchArgs`]) and
//! how a push prints for people ([`show_push`]; for `--json`, a
//! [`crate::Push`] serializes as its wire frame).

use std::fmt;
use std::path::PathBuf;

use crate::connect::{ConnectOptions, TlsOptions, Token};
use crate::error::ClientError;
use crate::protocol::Window;
use crate::reply::{Entry, RankInfo};
use crate::watch::{Push, WatchEvent, WatchSpec, WatchTarget};

/// TLS, token and frame-size flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Speak TLS, trusting the system's root certificates (or --tls-ca).
    #[arg(long)]
    pub tls: bool,
    /// CA certificates (PEM) the server's certificate must chain to;
    /// implies --tls.
    #[arg(long, env = "RANKD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry [default: the host
    /// connected to].
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// This client's certificate (PEM), for servers that require one;
    /// implies --tls.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A file holding the token to `auth` with (or set RANKD_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The longest request frame sent, in bytes: the server's --max-frame
    /// (a larger request fails with too_large, unsent).
    #[arg(long, default_value_t = crate::protocol::DEFAULT_MAX_FRAME, value_parser = max_frame)]
    pub max_frame: usize,
}

/// Parses `--max-frame`: a size a server may be set to.
fn max_frame(text: &str) -> Result<usize, String> {
    let bytes: usize = text.parse().map_err(|e| format!("{e}"))?;
    match crate::protocol::MAX_FRAME_RANGE.contains(&bytes) {
        true => Ok(bytes),
        false => Err("a server's max frame is 64 bytes to 64 MiB (67108864)".into()),
    }
}

impl Default for ConnectArgs {
    /// No flags given: plain TCP, no token file, the default max frame.
    fn default() -> Self {
        Self {
            tls: false,
            tls_ca: None,
            tls_server_name: None,
            tls_cert: None,
            tls_key: None,
            token_file: None,
            max_frame: crate::protocol::DEFAULT_MAX_FRAME,
        }
    }
}

impl ConnectArgs {
    /// The options these flags (and `RANKD_TOKEN`) describe.
    pub fn options(&self) -> Result<ConnectOptions, ClientError> {
        let tls = (self.tls || self.tls_ca.is_some() || self.tls_cert.is_some()).then(|| TlsOptions {
            ca_file: self.tls_ca.clone(),
            server_name: self.tls_server_name.clone(),
            client_cert: self.tls_cert.clone(),
            client_key: self.tls_key.clone(),
        });
        let token = match &self.token_file {
            Some(path) => Some(Token(std::fs::read_to_string(path)?.trim().to_string())),
            None => std::env::var("RANKD_TOKEN").ok().filter(|token| !token.is_empty()).map(Token),
        };
        Ok(ConnectOptions { tls, token, max_frame: self.max_frame })
    }
}

/// What to watch: `BOARD (--top N | --player P) [--window W] [--period P]
/// [--interval-ms MS]`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("watched").required(true).args(["top", "player"])))]
pub struct WatchArgs {
    /// The board watched.
    pub board: String,
    /// Watch its best N players (1-100)...
    #[arg(long)]
    pub top: Option<u64>,
    /// ...or one player's rank.
    #[arg(long)]
    pub player: Option<String>,
    /// The window: all, daily, weekly or monthly [default: the board's
    /// first].
    #[arg(long, value_parser = parse_window)]
    pub window: Option<Window>,
    /// A past period: -1 the previous, down to the board's -keep [default:
    /// 0, the current].
    #[arg(long, allow_hyphen_values = true)]
    pub period: Option<i64>,
    /// At most one push per this many milliseconds (10-60000) [default:
    /// the server's, 100].
    #[arg(long)]
    pub interval_ms: Option<u64>,
}

impl WatchArgs {
    /// The watch these flags describe.
    pub fn spec(&self) -> WatchSpec {
        let target = match (&self.player, self.top) {
            (Some(player), _) => WatchTarget::Player(player.clone()),
            (None, top) => WatchTarget::Top(top.unwrap_or(10)),
        };
        WatchSpec {
            board: self.board.clone(),
            target,
            window: self.window,
            period: self.period,
            interval_ms: self.interval_ms,
        }
    }
}

/// Parses a window by its protocol name.
fn parse_window(text: &str) -> Result<Window, String> {
    Window::from_name(text).ok_or_else(|| format!("unknown window `{text}`: all, daily, weekly or monthly"))
}

/// A push for people: a line naming the watch, then the event as
/// [`show_event`] prints it.
pub fn show_push<S: fmt::Display>(push: &Push<S>) -> String {
    format!("watch {}:\n{}", push.watch, show_event(&push.event))
}

/// A watch's event for people: a `top` as the `rankd top` table, a
/// player's rank as `rankd rank` prints it.
pub fn show_event<S: fmt::Display>(event: &WatchEvent<S>) -> String {
    match event {
        WatchEvent::Top(entries) => show_entries(entries),
        WatchEvent::Player(Some(RankInfo { rank, score, count })) => format!("rank {rank} of {count} (score {score})"),
        WatchEvent::Player(None) => "(nil)".to_string(),
        WatchEvent::Ended => "(ended: the board was dropped)".to_string(),
    }
}

/// Rows of `top` or `around` as a table: rank, score, player (a composite
/// score as `trophies=5,retries=2`).
pub fn show_entries<S: fmt::Display>(entries: &[Entry<S>]) -> String {
    if entries.is_empty() {
        return "(empty)".to_string();
    }
    // Composite scores are wider than 20 columns: the widest sets the width.
    let scores: Vec<String> = entries.iter().map(|entry| entry.score.to_string()).collect();
    let width = scores.iter().map(String::len).max().unwrap_or(0).max(20);
    let mut out = format!("{:>8}  {:>width$}  player", "rank", "score");
    for (Entry { player, rank, .. }, score) in entries.iter().zip(&scores) {
        out.push_str(&format!("\n{rank:>8}  {score:>width$}  {player}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        watch: WatchArgs,
    }

    #[test]
    fn watch_flags_make_a_spec() {
        let cli = Cli::try_parse_from(["watch", "arena", "--top", "5", "--window", "daily", "--period", "-1"]).unwrap();
        let spec = WatchSpec::top("arena", 5).window(Window::Daily).period(-1);
        assert_eq!(cli.watch.spec(), spec);
        let cli = Cli::try_parse_from(["watch", "arena", "--player", "alice", "--interval-ms", "250"]).unwrap();
        assert_eq!(
            cli.watch.spec(),
            WatchSpec::player("arena", "alice").interval(std::time::Duration::from_millis(250))
        );
        assert!(Cli::try_parse_from(["watch", "arena"]).is_err(), "one of --top and --player");
        assert!(Cli::try_parse_from(["watch", "arena", "--top", "1", "--player", "a"]).is_err());
        assert!(Cli::try_parse_from(["watch", "arena", "--top", "1", "--window", "hourly"]).is_err());
    }

    #[test]
    fn max_frame_is_one_a_server_may_have() {
        #[derive(Parser)]
        struct Connect {
            #[command(flatten)]
            connect: ConnectArgs,
        }
        let parse = |args: &[&str]| Connect::try_parse_from([&["rankd"], args].concat()).map(|c| c.connect.max_frame);
        assert_eq!(parse(&[]).unwrap(), crate::protocol::DEFAULT_MAX_FRAME);
        assert_eq!(parse(&["--max-frame", "64"]).unwrap(), 64);
        assert_eq!(parse(&["--max-frame", "67108864"]).unwrap(), 64 << 20);
        for refused in ["0", "63", "67108865", "lots"] {
            assert!(parse(&["--max-frame", refused]).is_err(), "{refused}");
        }
        assert_eq!(ConnectArgs::default().max_frame, crate::protocol::DEFAULT_MAX_FRAME);
    }

    #[test]
    fn pushes_print_for_people_and_serialize_as_on_the_wire() {
        let top = WatchEvent::Top(vec![Entry { player: "alice".into(), score: 1200, rank: 1 }]);
        let push = Push { watch: crate::WatchId(3), event: top, received: std::time::Instant::now() };
        assert_eq!(
            show_push(&push),
            format!("watch 3:\n{:>8}  {:>20}  player\n{:>8}  {:>20}  alice", "rank", "score", 1, 1200)
        );
        let player = WatchEvent::Player(Some(RankInfo { rank: 2, score: 9, count: 40 }));
        assert_eq!(show_event(&player), "rank 2 of 40 (score 9)");
        assert_eq!(show_event(&WatchEvent::<i64>::Top(vec![])), "(empty)");
        assert_eq!(show_event(&WatchEvent::<i64>::Ended), "(ended: the board was dropped)");
        // The wire form: {"watch": 3, "event": [...]}, and nil for an end.
        fn on_wire(value: &impl serde::Serialize) -> rmpv::Value {
            rmpv::decode::read_value(&mut &rmp_serde::to_vec_named(value).unwrap()[..]).unwrap()
        }
        let wire = on_wire(&push);
        assert_eq!(wire["watch"].as_u64(), Some(3));
        assert_eq!(wire["event"][0]["player"].as_str(), Some("alice"));
        assert!(on_wire(&WatchEvent::<i64>::Ended).is_nil());
        assert!(on_wire(&WatchEvent::<i64>::Player(None)).is_nil());
        assert_eq!(on_wire(&player)["rank"].as_u64(), Some(2));
    }
}
