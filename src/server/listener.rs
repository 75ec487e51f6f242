//! The listener, and graceful shutdown: stop accepting, let every
//! connection answer what it already read, then ask every shard to commit
//! (a `Shutdown` queued behind all earlier requests). With TLS, each
//! connection's handshake runs on its I/O thread, and SIGHUP reloads the
//! certificate for connections accepted after it.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::operations::metrics::Metrics;
use crate::request_path::connection::{self, Limits, Shared};
use crate::request_path::shard::command::{answer, reply};
use crate::request_path::shard::{Command, ShardLink};
use crate::security::tls::handshake;
use crate::security::{TlsReloader, Tokens};
use crate::watches::WatchHub;

use super::io_threads::IoThreads;

/// How long shutdown waits for connections to answer what they read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What every accepted connection is served with.
pub struct Serving {
    /// Per-connection limits.
    pub limits: Limits,
    /// The tokens clients may present.
    pub tokens: Arc<Tokens>,
    /// The certificate, when the port speaks TLS.
    pub tls: Option<Arc<TlsReloader>>,
    /// Connections that may be open at once.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Where connections open their watches.
    pub watches: Arc<WatchHub>,
}

/// Accepts connections and deals them out to the I/O threads until SIGTERM
/// or Ctrl-C; then stops accepting and waits (bounded) for every connection
/// to answer what it read.
pub async fn accept_until_signal(listener: TcpListener, io: &IoThreads, serving: Serving, metrics: Arc<Metrics>) {
    let Serving { limits, tokens, tls, slots, watches } = serving;
    let mut hangups = hangup_signals();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Every connection task holds a clone; when all are dropped, all are done.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        // At the connection limit: say so, then close. On a TLS
                        // port, close at once: a handshake per refused client
                        // would spend what the limit is there to protect.
                        if tls.is_some() {
                            metrics.connections_refused.inc();
                            drop(stream);
                        } else {
                            actix_rt::spawn(connection::refuse(stream, metrics.clone()));
                        }
                        continue;
                    };
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot hand a connection over; closing it");
                            continue;
                        }
                    };
                    let (shutdown, alive) = (shutdown_rx.clone(), alive_tx.clone());
                    let shared = Shared { tokens: tokens.clone(), metrics: metrics.clone(), watches: watches.clone() };
                    let metrics = metrics.clone();
                    let acceptor = tls.as_ref().map(|tls| tls.acceptor());
                    // Built on the I/O thread: a connection's future is not Send.
                    io.spawn(move |router| {
                        actix_rt::spawn(async move {
                            let stream = match tokio::net::TcpStream::from_std(stream) {
                                Ok(stream) => stream,
                                Err(e) => {
                                    tracing::warn!(error = %e, "cannot take a connection over; closing it");
                                    return;
                                }
                            };
                            let _ = stream.set_nodelay(true);
                            match acceptor {
                                None => {
                                    connection::serve(stream.into_split(), router, limits, shared, shutdown).await
                                }
                                Some(acceptor) => match handshake(acceptor, stream).await {
                                    Some(stream) => {
                                        let halves = tokio::io::split(stream);
                                        connection::serve(halves, router, limits, shared, shutdown).await
                                    }
                                    // Plaintext on a TLS port, an untrusted client certificate, a stall.
                                    None => metrics.security.client_handshake_failures.inc(),
                                },
                            }
                            drop((alive, slot));
                        });
                    });
                }
                Err(e) => {
                    // Out of fds and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(()) = hangups.recv() => reload_certificate(tls.as_deref(), &metrics),
            () = &mut signal => break,
        }
    }
    tracing::info!("shutting down: no new connections; answering what was read (a second signal exits at once)");
    // Load balancers stop sending clients now, not after the drain.
    metrics.set_ready(false);
    // The drain and the shards' last sync wait on clients and on the disk;
    // an operator's second signal ends the wait. Nothing acknowledged is
    // lost by it: every acknowledged write is durable already.
    actix_rt::spawn(async {
        shutdown_signal().await;
        tracing::warn!("a second signal: exiting without waiting for the drain");
        std::process::exit(SECOND_SIGNAL_EXIT);
    });
    drop(listener);
    let _ = shutdown_tx.send(true);
    drop(alive_tx);
    if tokio::time::timeout(DRAIN_TIMEOUT, alive_rx.recv()).await.is_err() {
        tracing::warn!("connections still busy after {DRAIN_TIMEOUT:?}; closing them");
    }
}

/// Waits until every shard has committed everything queued before now and
/// prepared a fast restart.
pub async fn sync_shards(shards: &[ShardLink]) {
    let pending: Vec<_> = shards
        .iter()
        .map(|s| {
            let (sender, pending) = reply();
            s.send_unbounded(vec![Command::Shutdown { reply: sender }]);
            pending
        })
        .collect();
    for (index, pending) in pending.into_iter().enumerate() {
        if let Err(e) = answer(pending).await {
            tracing::warn!(shard = index, error = %e, "shutdown preparation failed; the next start replays more");
        }
    }
}

/// SIGHUPs, or none where they cannot be received.
fn hangup_signals() -> mpsc::UnboundedReceiver<()> {
    let (sender, receiver) = mpsc::unbounded_channel();
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hangup) => {
            actix_rt::spawn(async move {
                while hangup.recv().await.is_some() {
                    if sender.send(()).is_err() {
                        break;
                    }
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP; certificates will not reload"),
    }
    #[cfg(not(unix))]
    drop(sender);
    receiver
}

/// SIGHUP: reads the certificate files again for the connections accepted
/// from now on; a failure keeps the certificate in use.
fn reload_certificate(tls: Option<&TlsReloader>, metrics: &Metrics) {
    let Some(tls) = tls else {
        tracing::info!("SIGHUP: no certificate to reload (TLS is off)");
        return;
    };
    match tls.reload() {
        Ok(()) => {
            metrics.security.reloads_ok.inc();
            tracing::info!("SIGHUP: certificate reloaded; new connections use it");
        }
        Err(e) => {
            metrics.security.reloads_failed.inc();
            tracing::error!(error = %e, "SIGHUP: certificate reload failed; keeping the one in use");
        }
    }
}

/// The exit status after a second SIGTERM or Ctrl-C cut the shutdown short.
const SECOND_SIGNAL_EXIT: i32 = 2;

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
