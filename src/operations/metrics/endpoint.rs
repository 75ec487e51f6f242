//! The HTTP endpoint operators and orchestrators scrape: `/metrics` (the
//! text exposition), `/healthz` (the process answers) and `/readyz` (every
//! shard is open and clients are accepted), over plain HTTP or, given the
//! client port's certificate (`--metrics-tls`), HTTPS; within bounds on its
//! connections ([`bounded`](super::bounded)).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::bounded::{Bounded, Slots, IDLE_TIMEOUT, MAX_CONNECTIONS};
use super::Metrics;
use crate::security::https::TlsListener;
use crate::security::TlsReloader;

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process
/// ends, over TLS when `tls` is given.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    tls: Option<Arc<TlsReloader>>,
) -> std::io::Result<SocketAddr> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let render = metrics.clone();
    let handshake_failures = metrics.security.metrics_handshake_failures.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = render.clone();
                async move {
                    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics.render())
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = metrics.ready.load(Ordering::Relaxed);
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        );
    let slots = Slots::new(MAX_CONNECTIONS, IDLE_TIMEOUT);
    match tls {
        None => spawn_serving(Bounded::new(listener, slots), app),
        Some(tls) => spawn_serving(TlsListener::start(listener, tls, handshake_failures, slots)?, app),
    }
    Ok(local)
}

/// Serves `app` on `listener` (plain or TLS) until the process ends.
fn spawn_serving<L>(listener: L, app: axum::Router)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    actix_rt::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
}
