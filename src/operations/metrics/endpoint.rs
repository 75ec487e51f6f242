//! The HTTP endpoint operators and orchestrators scrape: `/metrics` (the
//! text exposition), `/healthz` (the process answers) and `/readyz` (every
//! shard is open and clients are accepted).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Metrics;

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let render = metrics.clone();
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
    actix_rt::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(local)
}
