//! Command-line flags for how to connect (feature `cli`), shared by the
//! `rankd` client subcommands and the load generator so both spell TLS and
//! tokens the same way. Tokens come from a file or `RANKD_TOKEN`, never a
//! flag: `ps` would show it.

use std::path::PathBuf;

use crate::connect::{ConnectOptions, TlsOptions, Token};
use crate::error::ClientError;

/// TLS and token flags.
#[derive(Debug, Clone, Default, clap::Args)]
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
        Ok(ConnectOptions { tls, token })
    }
}
