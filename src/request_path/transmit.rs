//! Writing to a client: every write the server makes to a connection goes
//! through [`send`], which flushes as well as writes. Over TLS the flush is
//! not optional: a write that finds the socket full leaves its last records
//! in the TLS layer's buffer and still reports every byte taken, and nothing
//! sends them until the next write, which a client waiting for its reply
//! never causes.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Writes all of `bytes` and flushes them to the socket within `timeout`;
/// `false` if the connection failed or the client did not take them in
/// time (it stopped reading): the caller then drops the connection.
pub async fn send<W: AsyncWrite + Unpin>(out: &mut W, bytes: &[u8], timeout: Duration) -> bool {
    let write = async {
        out.write_all(bytes).await?;
        out.flush().await
    };
    matches!(tokio::time::timeout(timeout, write).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;

    /// A server and a client TLS stream over an in-memory pipe that holds
    /// only `pipe` bytes.
    async fn tls_pair(
        pipe: usize,
    ) -> (
        tokio_rustls::server::TlsStream<tokio::io::DuplexStream>,
        tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
    ) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("a certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .expect("a server config");
        let mut roots = RootCertStore::empty();
        roots.add(certified.cert.der().clone()).expect("a root");
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (server_io, client_io) = tokio::io::duplex(pipe);
        let name = ServerName::try_from("localhost").expect("a name");
        let (server, client) = tokio::join!(
            TlsAcceptor::from(Arc::new(server)).accept(server_io),
            TlsConnector::from(Arc::new(client)).connect(name, client_io),
        );
        (server.expect("server handshake"), client.expect("client handshake"))
    }

    #[tokio::test]
    async fn everything_sent_reaches_a_slow_tls_reader_with_no_later_write() {
        // Far more than the pipe holds: the last records meet a full pipe.
        let message: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (mut server, mut client) = tls_pair(4096).await;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            while got.len() < 300_000 {
                match tokio::time::timeout(Duration::from_secs(5), client.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
            got
        });
        assert!(send(&mut server, &message, Duration::from_secs(10)).await, "sent");
        // The server writes nothing more, and keeps the connection open.
        let got = reader.await.expect("the reader");
        assert_eq!(got.len(), message.len(), "every byte arrived");
        assert!(got == message, "in order");
        drop(server);
    }
}
