//! The server process: start-up, the TCP listener, and graceful shutdown.
//!
//! Start-up ([`startup`]) opens every shard in parallel, rebuilds what the
//! router needs from them (boards, the arrival sequence, the dense
//! distinct-score indexes), starts one shard actor per thread and the
//! router, then listens ([`listener`]). Shutdown (SIGTERM or Ctrl-C): stop
//! accepting, let every connection answer what it already read, then ask
//! every shard to commit and prepare a fast restart before the process
//! exits 0. [`layout`]: what a data dir holds.

pub mod io_threads;
pub mod layout;
pub mod listener;
pub mod startup;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::operations::metrics::{self, Metrics};
use crate::request_path::approx::{self, Summaries};
use crate::request_path::connection::Limits;
use crate::request_path::router::{Boards, Router, RouterParts};
use crate::security::TlsReloader;
use crate::settings::ServeSettings;
use crate::watches::{evaluator, WatchHub};
use io_threads::IoThreads;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir does not fit the flags.
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
    /// A shard could not open.
    #[error("shard {0}: {1}")]
    Shard(usize, rankd_shards::ShardError),
    /// The address cannot be bound.
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    /// Other I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The certificate files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::security::TlsError),
    /// Metrics could not be set up.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
}

/// Runs the server until SIGTERM/Ctrl-C. Blocks the calling thread.
pub fn run(config: ServeSettings) -> Result<(), StartError> {
    let started = Instant::now();
    // SIGHUP reloads the certificate once the listener runs; until then it
    // must not end the process (its default action), as a renewal hook
    // firing during a long start would.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to "ignore" touches no memory.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    // Unusable certificate files stop the start before any shard opens.
    let tls = config.tls_files().map(TlsReloader::new).transpose()?.map(Arc::new);
    let tokens = Arc::new(config.tokens());
    if tls.is_none() && tokens.required() && !config.listen.ip().is_loopback() {
        tracing::warn!(listen = %config.listen, "tokens and scores cross the network in clear text: give --tls-cert and --tls-key");
    }
    let (shards, state) = startup::open_shards(&config)?;
    let players: u64 = shards.iter().map(rankd_shards::Shard::players).sum();
    let dense = startup::recover_dense(&shards, &state, config.branching);
    tracing::info!(shards = shards.len(), players, elapsed_ms = started.elapsed().as_millis() as u64, "shards opened");
    #[cfg(feature = "test-hooks")]
    let (metrics, clock) = (
        Metrics::with_hot_path(shards.len(), !config.hooks.no_request_metrics)?,
        Clock::with_offset(config.hooks.clock_offset_secs),
    );
    #[cfg(not(feature = "test-hooks"))]
    let (metrics, clock) = (Metrics::new(shards.len())?, Clock::default());
    let system = actix::System::new();
    // The listener and the metrics endpoint run here; connections on the
    // I/O threads.
    metrics.threads.register("main");
    system.block_on(async move {
        let (mut io, relays) = IoThreads::start(config.io_threads, &metrics);
        let (links, arbiters) = startup::start_shards(shards, &config, &dense, &metrics, clock, relays);
        let boards = Arc::new(parking_lot::Mutex::new(Boards::new(state).publish_count(metrics.boards.clone())));
        #[cfg(feature = "test-hooks")]
        let configure = |router: Router| if config.hooks.queue_lone { router.queue_lone_requests() } else { router };
        #[cfg(not(feature = "test-hooks"))]
        let configure = |router: Router| router;
        let watches = WatchHub::with_clock(metrics.clone(), clock);
        #[cfg_attr(not(feature = "test-hooks"), allow(unused_mut))]
        let mut limits = approx::Limits::default();
        #[cfg(feature = "test-hooks")]
        if let Some(buckets) = config.hooks.approx_buckets {
            limits.buckets = buckets.max(1);
        }
        let approx = Arc::new(Summaries::new(limits, metrics.approx.clone()));
        let parts = RouterParts {
            boards,
            dense: dense.clone(),
            clock,
            metrics: metrics.clone(),
            watches: watches.clone(),
            approx,
        };
        io.start_routers(&links, &parts, configure);
        // Watches are looked at on a thread of their own, never a shard's
        // or a connection's.
        let watch_thread = actix::Arbiter::new();
        if let Some(router) = io.any_router() {
            let (watches, metrics) = (watches.clone(), metrics.clone());
            watch_thread.spawn_fn(move || {
                metrics.threads.register("watches");
                actix_rt::spawn(evaluator::run(watches, router));
            });
        }
        let metrics_tls = if config.metrics_tls { tls.clone() } else { None };
        let metrics_addr = metrics::serve(config.metrics_listen, metrics.clone(), metrics_tls)
            .await
            .map_err(|e| StartError::Bind(config.metrics_listen, e))?;
        let listener = TcpListener::bind(config.listen).await.map_err(|e| StartError::Bind(config.listen, e))?;
        let local = listener.local_addr()?;
        metrics.set_ready(true);
        tracing::info!(%local, %metrics_addr, ready_ms = started.elapsed().as_millis() as u64, "listening");
        // Tests and scripts read the bound address (useful with port 0).
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "rankd listening on {local} metrics {metrics_addr}");
        let _ = stdout.flush();

        let limits = Limits {
            max_frame: config.max_frame,
            max_inflight: config.max_inflight,
            idle_timeout: config.idle_timeout(),
        };
        let serving = listener::Serving {
            limits,
            tokens,
            tls,
            slots: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
            watches,
        };
        listener::accept_until_signal(listener, &io, serving, metrics.clone()).await;
        listener::sync_shards(&links).await;
        io.stop();
        watch_thread.stop();
        for arbiter in &arbiters {
            arbiter.stop();
        }
        tracing::info!("shut down cleanly");
        Ok::<(), StartError>(())
    })?;
    Ok(())
}
