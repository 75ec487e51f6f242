//! How to reach a server: plain TCP or TLS (with a CA file or the system's
//! roots, and a client certificate for mutual TLS), and a token to `auth`
//! with right after connecting.

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::ClientError;
use crate::protocol::DEFAULT_MAX_FRAME;

/// How [`crate::Client::connect_with`] connects.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Speak TLS; `None` is plain TCP.
    pub tls: Option<TlsOptions>,
    /// `auth` with this token once connected; the connect fails if it is
    /// refused. Never printed by `Debug`.
    pub token: Option<Token>,
    /// The longest request frame (its body, in bytes) the client sends:
    /// the server's `--max-frame`, 1 MiB by default
    /// ([`DEFAULT_MAX_FRAME`]). A request over it is answered `too_large`
    /// by the client and not sent, and the connection stays usable: the
    /// server would close the connection on it, failing every request in
    /// flight there.
    pub max_frame: usize,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self { tls: None, token: None, max_frame: DEFAULT_MAX_FRAME }
    }
}

/// A token, kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl<T: Into<String>> From<T> for Token {
    fn from(token: T) -> Self {
        Token(token.into())
    }
}

/// TLS settings of a connection.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// CA certificates (PEM) the server's certificate must chain to; `None`
    /// trusts the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The name the server's certificate must carry; `None` takes the host
    /// of the address connected to.
    pub server_name: Option<String>,
    /// This client's certificate chain (PEM), for servers that require one.
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub client_key: Option<PathBuf>,
}

/// The two halves of a connection, whatever it runs over.
pub(crate) type Halves = (Box<dyn AsyncRead + Send + Unpin>, Box<dyn AsyncWrite + Send + Unpin>);

/// Connects to `addr` over plain TCP or TLS.
pub(crate) async fn open(addr: &str, tls: Option<&TlsOptions>) -> Result<Halves, ClientError> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    match tls {
        None => {
            let (read, write) = stream.into_split();
            Ok((Box::new(read), Box::new(write)))
        }
        Some(options) => tls::handshake(stream, addr, options).await,
    }
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::net::TcpStream;
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
    use tokio_rustls::TlsConnector;

    use super::{Halves, TlsOptions};
    use crate::error::ClientError;

    fn tls_error(what: impl std::fmt::Display) -> ClientError {
        ClientError::Tls(what.to_string())
    }

    /// The CAs to trust: the file's, or the system's.
    fn roots(options: &TlsOptions) -> Result<RootCertStore, ClientError> {
        let mut roots = RootCertStore::empty();
        match &options.ca_file {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| tls_error(format!("{}: {e}", path.display())))?;
                if certs.is_empty() {
                    return Err(tls_error(format!("{}: no certificate in the file", path.display())));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| tls_error(format!("{}: {e}", path.display())))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(tls_error("no system root certificates found; give a CA file"));
                }
            }
        }
        Ok(roots)
    }

    fn config(options: &TlsOptions) -> Result<ClientConfig, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?
            .with_root_certificates(roots(options)?);
        match (&options.client_cert, &options.client_key) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| tls_error(format!("{}: {e}", cert.display())))?;
                let key =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| tls_error(format!("{}: {e}", key.display())))?;
                builder.with_client_auth_cert(chain, key).map_err(tls_error)
            }
            _ => Err(tls_error("a client certificate needs its key, and a key its certificate")),
        }
    }

    pub(super) async fn handshake(stream: TcpStream, addr: &str, options: &TlsOptions) -> Result<Halves, ClientError> {
        let name = match &options.server_name {
            Some(name) => name.clone(),
            None => host_of(addr).to_string(),
        };
        let name = ServerName::try_from(name).map_err(|e| tls_error(format!("server name: {e}")))?;
        let connector = TlsConnector::from(Arc::new(config(options)?));
        let stream = connector.connect(name, stream).await?;
        let (read, write) = tokio::io::split(stream);
        Ok((Box::new(read), Box::new(write)))
    }

    /// `host` of `host:port`, `[v6]:port` or a bare host.
    fn host_of(addr: &str) -> &str {
        if let Some(rest) = addr.strip_prefix('[') {
            return rest.split(']').next().unwrap_or(rest);
        }
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
            _ => addr,
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_host_of_an_address() {
            assert_eq!(super::host_of("localhost:7070"), "localhost");
            assert_eq!(super::host_of("[::1]:7070"), "::1");
            assert_eq!(super::host_of("rankd.example"), "rankd.example");
            assert_eq!(super::host_of("127.0.0.1:1"), "127.0.0.1");
        }
    }
}

#[cfg(not(feature = "tls"))]
mod tls {
    use super::{Halves, TlsOptions};
    use crate::error::ClientError;

    pub(super) async fn handshake(_: tokio::net::TcpStream, _: &str, _: &TlsOptions) -> Result<Halves, ClientError> {
        Err(ClientError::Tls("this rankd-client was built without its `tls` feature".into()))
    }
}
