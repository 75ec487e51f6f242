//! The metrics endpoint over TLS: a listener that hands axum only
//! connections whose handshake finished, each handshake running apart so
//! one slow client cannot stall the scrapes, and each connection, handshake
//! included, holding one of the endpoint's slots.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use super::tls::{handshake, TlsReloader};
use crate::operations::metrics::bounded::{Idle, Slots};

/// Connections whose TLS handshake succeeded, for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Idle<TlsStream<TcpStream>>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `listener` in a task of its own, a connection once a slot
    /// is free; handshakes that fail or time out are counted in `failures`.
    pub fn start(
        listener: TcpListener,
        tls: Arc<TlsReloader>,
        failures: IntCounter,
        slots: Slots,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(16);
        actix_rt::spawn(async move {
            loop {
                let slot = slots.claim().await;
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, sender, failures) = (tls.acceptor(), sender.clone(), failures.clone());
                actix_rt::spawn(async move {
                    match handshake(acceptor, stream).await {
                        Some(stream) => {
                            let _ = sender.send((slot.hold(stream), peer)).await;
                        }
                        None => failures.inc(),
                    }
                });
            }
        });
        Ok(Self { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Idle<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (the runtime is stopping): accept
            // nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
