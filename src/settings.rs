//! Every `rankd serve` setting, in one struct that clap and the TOML file
//! (`--config`) both read, with one [`Default`]. A flag wins over the file,
//! the file over the default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, ValueEnum};
use rankd_client::protocol::{DEFAULT_MAX_FRAME, MAX_FRAME_RANGE};
use serde::{Deserialize, Serialize};

use crate::security::Secret;
use crate::security::{TlsFiles, TokenEntry, Tokens};

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// fsync before acknowledging (survives power loss).
    #[default]
    Sync,
    /// Hand to the OS before acknowledging (survives kill -9, not power loss).
    Buffered,
}

/// `rankd serve`'s settings. Each field is a flag (`--max-batch`) and a key
/// of the config file (`max_batch = 4096`); defaults are [`Default`]'s.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeSettings {
    /// TOML file with any of the settings below (flags win).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Client address.
    #[arg(long, default_value_t = ServeSettings::default().listen)]
    pub listen: SocketAddr,
    /// Prometheus metrics address (also /healthz and /readyz).
    #[arg(long, default_value_t = ServeSettings::default().metrics_listen)]
    pub metrics_listen: SocketAddr,
    /// Where the shards store their data.
    #[arg(long, default_value_os_t = ServeSettings::default().data_dir)]
    pub data_dir: PathBuf,
    /// Number of tree shards, each on its own thread [default: number of cores].
    #[arg(long, default_value_t = ServeSettings::default().shards, hide_default_value = true)]
    pub shards: usize,
    /// Threads that serve client connections, each reading, routing and
    /// answering its own [default: number of cores].
    #[arg(long, default_value_t = ServeSettings::default().io_threads, hide_default_value = true)]
    pub io_threads: usize,
    /// Count-tree branching factor: 2, 4, 8, 16, 32, 64, 128 or 256.
    #[arg(long, default_value_t = ServeSettings::default().branching)]
    pub branching: u32,
    /// Most requests one shard applies in one atomic batch.
    #[arg(long, default_value_t = ServeSettings::default().max_batch)]
    pub max_batch: usize,
    /// Largest frame accepted, bytes.
    #[arg(long, default_value_t = ServeSettings::default().max_frame)]
    pub max_frame: usize,
    /// Requests a connection may have in flight before the server stops
    /// reading from it.
    #[arg(long, default_value_t = ServeSettings::default().max_inflight)]
    pub max_inflight: usize,
    /// When writes are acknowledged.
    #[arg(long, value_enum, default_value_t = ServeSettings::default().durability)]
    pub durability: DurabilityArg,
    /// The one plain token clients must present with `auth` before any op
    /// but `ping`: from `RANKD_AUTH_TOKEN` or the config file only, never a
    /// flag (`ps` would show it).
    #[arg(skip)]
    pub auth_token: Option<Secret>,
    /// Tokens with roles (`[[tokens]]` with `role` and `token`), from the
    /// config file; `--tokens-file` adds more.
    #[arg(skip)]
    pub tokens: Vec<TokenEntry>,
    /// TOML file of tokens with roles: `[[tokens]]` entries, each with
    /// `role = "read"` or `"write"` and `token = "..."`. (One plain token,
    /// full access: the environment variable RANKD_AUTH_TOKEN.)
    #[arg(long, env = "RANKD_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Allow listening on a non-loopback address without a token.
    #[arg(long)]
    pub allow_unauthenticated_remote: bool,
    /// The server's certificate chain (PEM): the client port speaks TLS.
    /// Reloaded on SIGHUP.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) a client's certificate must chain to: mutual
    /// TLS, clients without one are refused.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve the metrics endpoint over HTTPS with the same certificate.
    #[arg(long, requires = "tls_cert")]
    pub metrics_tls: bool,
    /// Client connections served at once; more are answered `overloaded`
    /// and closed.
    #[arg(long, default_value_t = ServeSettings::default().max_connections)]
    pub max_connections: usize,
    /// Close a connection with nothing in flight that sent nothing for this
    /// many seconds (half-open or abandoned clients).
    #[arg(long, default_value_t = ServeSettings::default().idle_timeout_secs)]
    pub idle_timeout_secs: u64,
    /// Commands a shard may have queued before new work for it is answered
    /// `overloaded` instead of queued.
    #[arg(long, default_value_t = ServeSettings::default().max_shard_queue)]
    pub max_shard_queue: usize,
    /// Memory for caches, MiB, shared by all shards: a quarter for storage
    /// blocks, the rest for player records (a record hit spares a storage
    /// read on every write and rank).
    #[arg(long, default_value_t = ServeSettings::default().cache_mb)]
    pub cache_mb: u64,
    /// Seconds an idempotent write's `wid` is remembered: a retry within it
    /// is answered with the first result and changes nothing.
    #[arg(long, default_value_t = ServeSettings::default().dedup_horizon_secs)]
    pub dedup_horizon_secs: u64,
    /// Memory for remembered `wid`s, MiB, shared by all shards; past it the
    /// oldest are forgotten before the horizon (counted in
    /// `rankd_dedup_early_expiries_total`).
    #[arg(long, default_value_t = ServeSettings::default().dedup_memory_mb)]
    pub dedup_memory_mb: u64,
    /// Test and debug hooks: only in builds with the `test-hooks` feature.
    #[cfg(feature = "test-hooks")]
    #[command(flatten)]
    #[serde(skip)]
    pub hooks: crate::hooks::TestHooks,
}

/// Most connections `--max-connections` may allow: far past any file
/// descriptor limit, and below what the connection semaphore can count.
const MAX_CONNECTIONS: usize = 1 << 24;

/// Longest `--idle-timeout-secs`: a year (a deadline that far ahead still
/// fits the clock's arithmetic).
const MAX_IDLE_TIMEOUT_SECS: u64 = 365 * 86_400;

/// The machine's cores, within what `--shards` and `--io-threads` allow
/// (their defaults).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from).min(256)
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            config: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            data_dir: PathBuf::from("rankd-data"),
            shards: cores(),
            io_threads: cores(),
            branching: rankd_shards::tree::DEFAULT_BRANCHING,
            max_batch: 4096,
            max_frame: DEFAULT_MAX_FRAME,
            max_inflight: 4096,
            durability: DurabilityArg::Sync,
            auth_token: None,
            tokens: Vec::new(),
            tokens_file: None,
            allow_unauthenticated_remote: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            metrics_tls: false,
            max_connections: 4096,
            idle_timeout_secs: 300,
            max_shard_queue: 1 << 18,
            // Enough to cache ~1M players' records; 10M players then stay
            // under 60 B/player (see docs/performance-history.md).
            cache_mb: 48,
            dedup_horizon_secs: 600,
            // ~1M `set`s' records (~150 B each with their wid): ten minutes
            // of 2,000 idempotent writes a second.
            dedup_memory_mb: 256,
            #[cfg(feature = "test-hooks")]
            hooks: crate::hooks::TestHooks::default(),
        }
    }
}

impl ServeSettings {
    /// Reads the file named by `--config` under the flags `matches` holds
    /// (the `serve` subcommand's), then validates. Without a file, the
    /// flags and defaults as parsed.
    pub fn resolve(self, matches: &ArgMatches) -> Result<Self, ConfigError> {
        let settings = match self.config.clone() {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Read(path.clone(), e))?;
                let file: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::parse(&path, &text, &e))?;
                self.under_flags(file, matches).map_err(|e| ConfigError::parse(&path, &text, &e))?
            }
            None => self,
        };
        let settings = settings.with_secrets_from_outside()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Adds the secrets that never come from flags: `RANKD_AUTH_TOKEN`
    /// (over the file's `auth_token`) and the tokens file's entries.
    fn with_secrets_from_outside(mut self) -> Result<Self, ConfigError> {
        if let Ok(token) = std::env::var("RANKD_AUTH_TOKEN") {
            self.auth_token = Some(Secret(token));
        }
        if let Some(path) = &self.tokens_file {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct TokensFile {
                tokens: Vec<TokenEntry>,
            }
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.clone(), e))?;
            let file: TokensFile = toml::from_str(&text).map_err(|e| ConfigError::parse(path, &text, &e))?;
            self.tokens.extend(file.tokens);
        }
        Ok(self)
    }

    /// The file's settings, with every flag given on the command line (or
    /// through its environment variable) put over them.
    fn under_flags(self, file: toml::Table, matches: &ArgMatches) -> Result<Self, toml::de::Error> {
        let given = |key: &str| {
            matches!(
                matches.try_get_raw(key).ok().flatten().and_then(|_| matches.value_source(key)),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        // Serializing plain settings cannot fail; a failure would only
        // drop the flags, so fall back to none of them.
        let mut merged = toml::Table::try_from(&self).unwrap_or_default();
        merged.retain(|key, _| given(key) || !file.contains_key(key));
        merged.extend(file.into_iter().filter(|(key, _)| !given(key)));
        let mut settings: Self = merged.try_into()?;
        settings.config = self.config;
        #[cfg(feature = "test-hooks")]
        {
            settings.hooks = self.hooks;
        }
        Ok(settings)
    }

    /// Refuses settings out of range, and listening beyond loopback without
    /// a token unless explicitly allowed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if !(1..=256).contains(&self.shards) {
            return invalid("--shards must be 1 to 256".into());
        }
        if !(1..=256).contains(&self.io_threads) {
            return invalid("--io-threads must be 1 to 256".into());
        }
        if let Err(e) = rankd_shards::tree::branching_bits(self.branching) {
            return invalid(e.to_string());
        }
        if self.max_batch == 0 || self.max_inflight == 0 {
            return invalid("--max-batch and --max-inflight must be at least 1".into());
        }
        // An empty `[[tokens]]` entry would be dropped, and a file of only
        // such entries would leave a server its operator meant to lock open.
        if let Some(at) = self.tokens.iter().position(|entry| entry.token.0.is_empty()) {
            return invalid(format!("[[tokens]] entry {} has an empty token", at + 1));
        }
        if !self.tokens().required() && !self.listen.ip().is_loopback() && !self.allow_unauthenticated_remote {
            return invalid(format!(
                "refusing to listen on {} without a token (set RANKD_AUTH_TOKEN, or give --tokens-file, or \
                 pass --allow-unauthenticated-remote if the network is trusted)",
                self.listen
            ));
        }
        if self.dedup_horizon_secs == 0 {
            return invalid("--dedup-horizon-secs must be at least 1".into());
        }
        if self.max_connections == 0 || self.max_shard_queue == 0 || self.idle_timeout_secs == 0 {
            return invalid("--max-connections, --max-shard-queue and --idle-timeout-secs must be at least 1".into());
        }
        if self.max_connections > MAX_CONNECTIONS || self.idle_timeout_secs > MAX_IDLE_TIMEOUT_SECS {
            return invalid(format!(
                "--max-connections must be at most {MAX_CONNECTIONS} and --idle-timeout-secs at most \
                 {MAX_IDLE_TIMEOUT_SECS} (a year)"
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return invalid("--tls-cert and --tls-key go together".into());
        }
        if (self.tls_client_ca.is_some() || self.metrics_tls) && self.tls_cert.is_none() {
            return invalid("--tls-client-ca and --metrics-tls need --tls-cert and --tls-key".into());
        }
        if !MAX_FRAME_RANGE.contains(&self.max_frame) {
            return invalid("--max-frame must be 64 bytes to 64 MiB".into());
        }
        Ok(())
    }

    /// Every token clients may present (empty ones are none, so
    /// `RANKD_AUTH_TOKEN=` turns the plain token off).
    pub fn tokens(&self) -> Tokens {
        Tokens::new(self.auth_token.clone(), self.tokens.clone())
    }

    /// The TLS files, when the client port speaks TLS.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                Some(TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: self.tls_client_ca.clone() })
            }
            _ => None,
        }
    }

    /// How long an idle connection is kept.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }

    /// Cache memory in bytes, all shards together.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_mb.saturating_mul(1 << 20)
    }
}

/// A bad setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// The file is not valid: where, and why, without the offending line
    /// (it may hold a token).
    #[error("invalid config file {0}: {1}")]
    Parse(PathBuf, String),
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    /// A parse error naming the file, line and column but not quoting the
    /// line, which toml's own message does and which may hold a secret.
    fn parse(path: &std::path::Path, text: &str, error: &toml::de::Error) -> Self {
        let place = error.span().map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {column}")
        });
        Self::Parse(path.to_path_buf(), format!("{}{}", error.message(), place.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        settings: ServeSettings,
    }

    fn resolve(args: &[&str]) -> Result<ServeSettings, ConfigError> {
        let matches = Serve::command().try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()));
        let matches = matches.map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let serve = Serve::from_arg_matches(&matches).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        serve.settings.resolve(&matches)
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rankd.toml");
        let config = path.to_str().unwrap();
        std::fs::write(&path, "shards = 3\nbranching = 64\nlisten = \"127.0.0.1:9000\"\n").unwrap();
        let settings = resolve(&["--config", config, "--shards", "5"]).unwrap();
        assert_eq!((settings.shards, settings.branching, settings.listen.port()), (5, 64, 9000));
        // A flag equal to its default still wins over the file.
        let settings = resolve(&["--config", config, "--branching", "16"]).unwrap();
        assert_eq!((settings.shards, settings.branching), (3, 16));
        assert_eq!(settings.max_batch, ServeSettings::default().max_batch);

        std::fs::write(&path, "shardz = 3\n").unwrap();
        assert!(matches!(resolve(&["--config", config]), Err(ConfigError::Parse(..))));
        std::fs::write(&path, "shards = \"three\"\n").unwrap();
        assert!(matches!(resolve(&["--config", config]), Err(ConfigError::Parse(..))));
        assert!(resolve(&["--branching", "3"]).is_err());
    }

    #[test]
    fn defaults_are_written_once() {
        let parsed = resolve(&[]).unwrap();
        let defaults = ServeSettings::default();
        assert_eq!(toml::Table::try_from(&parsed).unwrap(), toml::Table::try_from(&defaults).unwrap());
        let help = Serve::command().render_long_help().to_string();
        assert!(help.contains("[default: 48]"), "--cache-mb shows its one default:\n{help}");
    }

    #[test]
    fn remote_listening_needs_a_token_or_an_explicit_opt_in() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve(&["--listen", "0.0.0.0:7070"]).unwrap_err();
        assert!(err.to_string().contains("without a token"), "{err}");
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, "[[tokens]]\nrole = \"read\"\ntoken = \"r-s3cret\"\n").unwrap();
        let settings = resolve(&["--listen", "0.0.0.0:7070", "--tokens-file", tokens.to_str().unwrap()]).unwrap();
        assert!(settings.tokens().has_roles());
        assert!(!format!("{settings:?}").contains("s3cret"), "a token never shows in Debug output");
        assert!(resolve(&["--listen", "0.0.0.0:7070", "--allow-unauthenticated-remote"]).is_ok());
    }

    #[test]
    fn an_empty_token_in_a_tokens_file_is_refused_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        let file = "[[tokens]]\nrole = \"write\"\ntoken = \"w\"\n[[tokens]]\nrole = \"read\"\ntoken = \"\"\n";
        std::fs::write(&tokens, file).unwrap();
        let err = resolve(&["--tokens-file", tokens.to_str().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("entry 2 has an empty token"), "{err}");
    }

    #[test]
    fn tokens_come_from_files_never_flags() {
        let dir = tempfile::tempdir().unwrap();
        assert!(resolve(&["--auth-token", "s3cret"]).is_err(), "no flag takes a token");
        let config = dir.path().join("rankd.toml");
        std::fs::write(&config, "auth_token = \"p\"\n[[tokens]]\nrole = \"write\"\ntoken = \"w\"\n").unwrap();
        let tokens_file = dir.path().join("tokens.toml");
        std::fs::write(&tokens_file, "[[tokens]]\nrole = \"read\"\ntoken = \"r\"\n").unwrap();
        let args = ["--config", config.to_str().unwrap(), "--tokens-file", tokens_file.to_str().unwrap()];
        let tokens = resolve(&args).unwrap().tokens();
        use crate::security::Role;
        assert_eq!(
            (tokens.role_of("p"), tokens.role_of("w"), tokens.role_of("r")),
            (Some(Role::Write), Some(Role::Write), Some(Role::Read))
        );
        std::fs::write(&tokens_file, "[[tokens]]\nrole = \"admin\"\ntoken = \"r\"\n").unwrap();
        assert!(matches!(resolve(&args), Err(ConfigError::Parse(..))), "an unknown role is refused");
        std::fs::write(&tokens_file, "[[tokens]]\nrole = \"read\"\ntoken = s3cret-unquoted\n").unwrap();
        let err = resolve(&args).unwrap_err().to_string();
        assert!(err.contains("line 3") && !err.contains("s3cret"), "where, never the token: {err}");
    }

    #[test]
    fn limits_too_large_to_take_are_refused_before_anything_opens() {
        // Once let through, each panicked later: the connection semaphore
        // cannot count that far; a deadline that far ahead overflows.
        assert!(resolve(&["--max-connections", &usize::MAX.to_string()]).is_err());
        assert!(resolve(&["--idle-timeout-secs", &u64::MAX.to_string()]).is_err());
        assert!(resolve(&["--max-connections", "100000", "--idle-timeout-secs", "86400"]).is_ok());
        let defaults = ServeSettings::default();
        assert!((1..=256).contains(&defaults.shards) && defaults.io_threads == defaults.shards, "one per core, capped");
    }

    #[test]
    fn tls_files_go_together() {
        assert!(resolve(&["--tls-cert", "c.pem"]).is_err());
        assert!(resolve(&["--tls-client-ca", "ca.pem"]).is_err());
        assert!(resolve(&["--metrics-tls"]).is_err());
        let settings = resolve(&["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"]).unwrap();
        let files = settings.tls_files().unwrap();
        assert_eq!(files.client_ca.as_deref(), Some(std::path::Path::new("ca.pem")));
    }
}
