//! The listener, and graceful shutdown: stop accepting, let every
//! connection answer what it already read, then ask every shard to commit
//! (a `Shutdown` queued behind all earlier requests).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::operations::metrics::Metrics;
use crate::request_path::connection::{self, Limits};
use crate::request_path::shard::command::{answer, reply};
use crate::request_path::shard::{Command, ShardLink};
use crate::settings::Secret;

use super::io_threads::IoThreads;

/// How long shutdown waits for connections to answer what they read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts connections and deals them out to the I/O threads until SIGTERM
/// or Ctrl-C; then stops accepting and waits (bounded) for every connection
/// to answer what it read.
pub async fn accept_until_signal(
    listener: TcpListener,
    io: &IoThreads,
    limits: Limits,
    auth: Option<Arc<Secret>>,
    slots: Arc<tokio::sync::Semaphore>,
    metrics: Arc<Metrics>,
) {
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
                        // At the connection limit: say so, then close.
                        actix_rt::spawn(connection::refuse(stream, metrics.clone()));
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
                    let (metrics, auth) = (metrics.clone(), auth.clone());
                    // Built on the I/O thread: a connection's future is not Send.
                    io.spawn(move |router| {
                        actix_rt::spawn(async move {
                            match tokio::net::TcpStream::from_std(stream) {
                                Ok(stream) => connection::serve(stream, router, limits, auth, metrics, shutdown).await,
                                Err(e) => tracing::warn!(error = %e, "cannot take a connection over; closing it"),
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
            () = &mut signal => break,
        }
    }
    tracing::info!("shutting down: no new connections; answering what was read");
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
