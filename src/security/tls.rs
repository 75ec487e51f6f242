//! TLS on the client port: the certificate, key and (for mutual TLS) client
//! CA files loaded into a rustls acceptor. The acceptor is swapped whole on
//! SIGHUP: connections already open keep the session they have, new ones
//! get the new certificate, and a reload that fails keeps the old one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::TcpStream;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file is missing, unreadable or holds nothing usable.
    #[error("{0}: {1}")]
    Pem(PathBuf, String),
    /// rustls refused the certificate, key or CA.
    #[error("TLS setup: {0}")]
    Rustls(String),
}

/// Where the PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CAs a client certificate must chain to: mutual TLS when given.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads the files into a server config speaking TLS 1.2 and 1.3.
    pub fn load(&self) -> Result<ServerConfig, TlsError> {
        let chain = certificates(&self.cert)?;
        let key =
            PrivateKeyDer::from_pem_file(&self.key).map_err(|e| TlsError::Pem(self.key.clone(), e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for ca in certificates(path)? {
                    roots.add(ca).map_err(|e| TlsError::Pem(path.clone(), e.to_string()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Rustls(e.to_string()))?;
        config.alpn_protocols.clear();
        Ok(config)
    }
}

/// Every certificate in a PEM file; none is an error.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Pem(path.to_path_buf(), e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Pem(path.to_path_buf(), "no certificate in the file".into()));
    }
    Ok(certs)
}

/// Longest a client may take over its TLS handshake, on the client port
/// and the metrics endpoint.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's side of a handshake, within [`HANDSHAKE_TIMEOUT`]; `None`
/// (the caller counts it and drops the connection) for plaintext, an
/// untrusted client certificate or a stall. A client whose first byte does
/// not open a TLS handshake record (0x16) is refused unanswered, not even
/// with a TLS alert: a plaintext rankd frame starts with its length's high
/// byte, 0 for any frame under 16 MiB.
pub async fn handshake(acceptor: TlsAcceptor, stream: TcpStream) -> Option<TlsStream<TcpStream>> {
    const HANDSHAKE_RECORD: u8 = 0x16;
    let attempt = async {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(1) if first[0] == HANDSHAKE_RECORD => acceptor.accept(stream).await.ok(),
            _ => None,
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, attempt).await.ok().flatten()
}

/// The acceptor new connections use, replaced whole by [`TlsReloader::reload`].
pub struct TlsReloader {
    files: TlsFiles,
    current: RwLock<TlsAcceptor>,
}

impl TlsReloader {
    /// Loads the files once; start-up fails if they are unusable.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let acceptor = TlsAcceptor::from(Arc::new(files.load()?));
        Ok(Self { files, current: RwLock::new(acceptor) })
    }

    /// The acceptor for a connection accepted now.
    pub fn acceptor(&self) -> TlsAcceptor {
        // A poisoned lock still holds a whole acceptor: writers only swap it.
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Reads the files again; on failure the acceptor in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let acceptor = TlsAcceptor::from(Arc::new(self.files.load()?));
        *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = acceptor;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> TlsFiles {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
        TlsFiles { cert, key, client_ca: None }
    }

    #[test]
    fn good_files_load_and_bad_ones_say_which() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_pair(dir.path(), "a");
        files.load().unwrap();
        let with_ca = TlsFiles { client_ca: Some(files.cert.clone()), ..files.clone() };
        with_ca.load().unwrap();

        let missing = TlsFiles { key: dir.path().join("absent.key"), ..files.clone() };
        assert!(missing.load().unwrap_err().to_string().contains("absent.key"));
        std::fs::write(dir.path().join("empty.crt"), "").unwrap();
        let empty = TlsFiles { cert: dir.path().join("empty.crt"), ..files.clone() };
        assert!(empty.load().unwrap_err().to_string().contains("no certificate"));
        let other = write_pair(dir.path(), "b");
        let mismatched = TlsFiles { key: other.key, ..files };
        assert!(mismatched.load().is_err(), "a key that is not the certificate's is refused");
    }

    #[test]
    fn a_failed_reload_keeps_the_acceptor() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_pair(dir.path(), "a");
        let reloader = TlsReloader::new(files.clone()).unwrap();
        reloader.reload().unwrap();
        std::fs::write(&files.key, "garbage").unwrap();
        assert!(reloader.reload().is_err());
        let _still_usable = reloader.acceptor();
    }
}
