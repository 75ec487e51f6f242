//! Start-up, the TCP listener, and graceful shutdown.
//!
//! Start-up opens every shard in parallel (each loads its count trees from
//! their stored leaves), rebuilds what the router needs from them (boards,
//! the arrival sequence, the dense distinct-score indexes), starts one shard
//! actor per thread and the router, then listens.
//!
//! Shutdown (SIGTERM or Ctrl-C): stop accepting, let every connection answer
//! what it already read, then ask every shard to commit (a `Sync` queued
//! behind all earlier requests) before the process exits 0.

pub mod layout;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Arbiter};
use rankd_shards::{Board, Durability, Shard, ShardOptions};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::clock::Clock;
use crate::operations::metrics::{self, Metrics};
use crate::operations::priority;
use crate::request_path::connection::{self, Limits};
use crate::request_path::router::{Router, RouterState};
use crate::request_path::shard::{replace_dense_share, Command, DenseRegistry, ReplyRelay, ShardActor, ShardLink};
use crate::settings::{DurabilityArg, Secret, ServeSettings};

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
    /// Metrics could not be set up.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
}

/// How long shutdown waits for connections to answer what they read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens the data dir and every shard, in parallel.
pub fn open_shards(config: &ServeSettings) -> Result<Vec<Shard>, StartError> {
    layout::check_or_create(&config.data_dir, config.shards, config.branching)?;
    let options = ShardOptions {
        branching: config.branching,
        durability: match config.durability {
            DurabilityArg::Sync => Durability::Sync,
            DurabilityArg::Buffered => Durability::Buffered,
        },
        // A quarter of the cache budget for fjall's block cache, the rest
        // for player records, split evenly between the shards.
        cache_bytes: (config.cache_bytes() / 4 / config.shards as u64).max(1 << 20),
        cached_players: rankd_shards::cached_players_for(config.cache_bytes() / 4 * 3 / config.shards as u64),
        leaf_writer_start: Some(|| priority::make_background("leaves")),
        ..ShardOptions::default()
    };
    #[cfg(feature = "test-hooks")]
    let options = {
        let hooks = &config.hooks;
        ShardOptions {
            run_every: hooks.run_every.unwrap_or(options.run_every),
            checkpoint_every: hooks.checkpoint_every.unwrap_or(options.checkpoint_every),
            checkpoint_slice_leaves: hooks.checkpoint_slice_leaves.unwrap_or(options.checkpoint_slice_leaves),
            ..options
        }
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.shards)
            .map(|i| {
                // Shards take their checkpoints in turn (see `checkpoint_phase`).
                let options = ShardOptions { checkpoint_phase: i as f64 / config.shards as f64, ..options.clone() };
                let dir = layout::shard_dir(&config.data_dir, i);
                scope.spawn(move || Shard::open(&dir, options).map_err(|e| StartError::Shard(i, e)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(StartError::Io(std::io::Error::other("shard open panicked")))))
            .collect()
    })
}

/// Boards, sequence and dense indexes recovered from the shards.
pub fn recover(shards: &[Shard], branching: u32) -> (RouterState, DenseRegistry) {
    let mut boards: HashMap<String, Board> = HashMap::new();
    for board in shards.iter().flat_map(|s| s.boards()) {
        // A half-finished drop can leave an older board of the same name in
        // some shard; the newest id is the live one.
        if boards.get(&board.name).is_none_or(|b| b.id < board.id) {
            boards.insert(board.name.clone(), board.clone());
        }
    }
    // Each shard adds its share of every live dense board's indexes, the way
    // a recovering shard replaces its share (a half-finished drop's
    // leftovers are not indexed).
    let dense: DenseRegistry = Arc::default();
    let live: std::collections::HashSet<u64> = boards.values().map(|b| b.id).collect();
    for shard in shards {
        let mut share = shard.dense_score_counts();
        share.retain(|tree, _| live.contains(&tree.board));
        replace_dense_share(&dense, branching, &HashMap::new(), &share);
    }
    let state = RouterState {
        boards: boards.into_values().collect(),
        max_board_id: shards.iter().map(Shard::max_board_id).max().unwrap_or(0),
        max_seq: shards.iter().map(Shard::max_seq).max().unwrap_or(0),
    };
    (state, dense)
}

/// Runs the server until SIGTERM/Ctrl-C. Blocks the calling thread.
pub fn run(config: ServeSettings) -> Result<(), StartError> {
    let started = Instant::now();
    let shards = open_shards(&config)?;
    priority::make_fjall_workers_background();
    let players: u64 = shards.iter().map(|s| s.tree_ids().map(|t| s.count(t)).sum::<u64>()).sum();
    let (state, dense) = recover(&shards, config.branching);
    tracing::info!(shards = shards.len(), players, elapsed_ms = started.elapsed().as_millis() as u64, "shards opened");
    #[cfg(feature = "test-hooks")]
    let (metrics, clock) = (
        Metrics::with_hot_path(shards.len(), !config.hooks.no_request_metrics)?,
        Clock::with_offset(config.hooks.clock_offset_secs),
    );
    #[cfg(not(feature = "test-hooks"))]
    let (metrics, clock) = (Metrics::new(shards.len())?, Clock::default());
    let system = actix::System::new();
    // Client connections, the router and the metrics endpoint run here.
    metrics.threads.register("connections");
    system.block_on(async move {
        let mut arbiters = Vec::new();
        let mut links = Vec::new();
        let (relay, deliver) = ReplyRelay::new();
        actix_rt::spawn(deliver);
        for (index, shard) in shards.into_iter().enumerate() {
            let arbiter = Arbiter::new();
            let actor = ShardActor::new(shard, config.max_batch, dense.clone(), metrics.clone(), index, clock)
                .with_reply_relay(relay.clone());
            #[cfg(feature = "test-hooks")]
            let actor = actor.with_slow_disk(crate::request_path::shard::SlowDisk {
                commit: config.hooks.commit_delay(),
                runs: config.hooks.runs_delay(),
            });
            let engine = actor.engine();
            let addr = ShardActor::start_in_arbiter(&arbiter.handle(), move |_| actor);
            let depth = metrics.shards[index].mailbox_depth.clone();
            links.push(ShardLink { addr, depth, max_queue: config.max_shard_queue, engine });
            arbiters.push(arbiter);
        }
        let router = Router::new(links.clone(), state, dense, clock, metrics.clone());
        #[cfg(feature = "test-hooks")]
        let router = if config.hooks.queue_ranks { router.queue_all_ranks() } else { router };
        let router = router.start();
        let metrics_addr = metrics::serve(config.metrics_listen, metrics.clone())
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
        let auth = config.auth_token().cloned().map(Arc::new);
        let slots = Arc::new(tokio::sync::Semaphore::new(config.max_connections));
        accept_until_signal(listener, router, limits, auth, slots, metrics.clone()).await;
        metrics.set_ready(false);
        sync_shards(&links).await;
        for arbiter in &arbiters {
            arbiter.stop();
        }
        tracing::info!("shut down cleanly");
        Ok::<(), StartError>(())
    })?;
    Ok(())
}

async fn accept_until_signal(
    listener: TcpListener,
    router: Addr<Router>,
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
                    let (router, shutdown, alive) = (router.clone(), shutdown_rx.clone(), alive_tx.clone());
                    let (metrics, auth) = (metrics.clone(), auth.clone());
                    actix_rt::spawn(async move {
                        connection::serve(stream, router, limits, auth, metrics, shutdown).await;
                        drop((alive, slot));
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
async fn sync_shards(shards: &[ShardLink]) {
    let pending: Vec<_> = shards
        .iter()
        .map(|s| {
            let (reply, answer) = tokio::sync::oneshot::channel();
            s.send_unbounded(vec![(Command::Shutdown, reply)]);
            answer
        })
        .collect();
    for (index, answer) in pending.into_iter().enumerate() {
        match answer.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(shard = index, error = %e, "shutdown preparation failed; the next start replays more")
            }
            Err(_) => tracing::warn!(shard = index, "shard stopped before shutdown"),
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
