//! Bounds on the metrics endpoint's connections: how many may be open at
//! once, and how long one may make no progress. It needs no token and often
//! listens beyond loopback (Prometheus scrapes it), while axum's server sets
//! no timeout of its own: without these, idle or trickling connections
//! could be opened until the process ran out of file descriptors, taking
//! the client port and the shards' files with it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections the endpoint serves at once; more wait in the kernel's
/// backlog. Scrapers and a few people's browsers need a handful.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may go without reading or writing a byte: longer
/// than a scrape interval, so Prometheus keeps its connection between
/// scrapes most of the time (and reconnects when not).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The endpoint's connection slots, and the idle timeout each connection
/// gets with its slot.
#[derive(Clone)]
pub struct Slots {
    free: Arc<Semaphore>,
    idle: Duration,
}

impl Slots {
    /// `count` slots, each connection closed after `idle` without progress.
    pub fn new(count: usize, idle: Duration) -> Self {
        Self { free: Arc::new(Semaphore::new(count)), idle }
    }

    /// Waits for a free slot: call before accepting, so a connection past
    /// the bound is not even accepted (a TLS handshake included).
    pub async fn claim(&self) -> Slot {
        match self.free.clone().acquire_owned().await {
            Ok(permit) => Slot { permit, idle: self.idle },
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }
}

/// A claimed slot, freed when the connection given it ends.
pub struct Slot {
    permit: OwnedSemaphorePermit,
    idle: Duration,
}

impl Slot {
    /// `io`, holding this slot, failing with `TimedOut` once it has made no
    /// progress for the idle timeout.
    pub fn hold<S>(self, io: S) -> Idle<S> {
        Idle { io, deadline: Box::pin(tokio::time::sleep(self.idle)), idle: self.idle, _slot: self.permit }
    }
}

/// A connection that ends once idle for too long, and frees its slot then.
pub struct Idle<S> {
    io: S,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    _slot: OwnedSemaphorePermit,
}

impl<S> Idle<S> {
    fn progressed(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// What a pending read or write becomes: an error once idle too long.
    fn pending_or_expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "metrics connection idle"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.pending_or_expired(cx),
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.progressed();
                Poll::Ready(Ok(()))
            }
            ready => ready,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Pending => this.pending_or_expired(cx),
            Poll::Ready(Ok(n)) if n > 0 => {
                this.progressed();
                Poll::Ready(Ok(n))
            }
            ready => ready,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.pending_or_expired(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Pending => this.pending_or_expired(cx),
            ready => ready,
        }
    }
}

/// A plain TCP listener whose connections each hold a slot.
pub struct Bounded {
    listener: TcpListener,
    slots: Slots,
}

impl Bounded {
    /// Serves `listener`'s connections within `slots`.
    pub fn new(listener: TcpListener, slots: Slots) -> Self {
        Self { listener, slots }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Idle<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let slot = self.slots.claim().await;
        // axum's own listener retries a failed accept the same way.
        let (stream, peer) = loop {
            match self.listener.accept().await {
                Ok(accepted) => break accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        (slot.hold(stream), peer)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An endpoint with `slots`, answering `/` with "ok".
    async fn serve(slots: Slots) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(Bounded::new(listener, slots), app).await });
        addr
    }

    /// Reads until the server closes the connection; `None` if it has not
    /// within `within`.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        tokio::time::timeout(within, stream.read_to_end(&mut got)).await.ok().map(|_| got)
    }

    #[tokio::test]
    async fn a_connection_that_sends_half_a_request_is_closed_once_idle() {
        let addr = serve(Slots::new(4, Duration::from_millis(200))).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert!(closed_within(&mut stream, Duration::from_secs(5)).await.is_some(), "still open");
    }

    #[tokio::test]
    async fn past_the_bound_a_connection_waits_for_a_slot_to_free() {
        let addr = serve(Slots::new(1, Duration::from_millis(500))).await;
        let mut holder = TcpStream::connect(addr).await.unwrap();
        let mut waiting = TcpStream::connect(addr).await.unwrap();
        waiting.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut reply = Vec::new();
        let early = tokio::time::timeout(Duration::from_millis(200), waiting.read_to_end(&mut reply)).await;
        assert!(early.is_err(), "served while the only slot was held: {reply:?}");
        // The holder says nothing: its slot frees once it is idle too long.
        let reply = closed_within(&mut waiting, Duration::from_secs(5)).await.expect("served once the slot freed");
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"), "{reply:?}");
        assert!(closed_within(&mut holder, Duration::from_secs(1)).await.is_some(), "the idle holder was closed");
    }
}
