//! Start-up: the data dir checked against the settings, every shard opened
//! in parallel (each loads its count trees from their stored leaves), what
//! the router needs rebuilt from them, and one shard actor started per
//! thread.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::{Actor, Arbiter};
use rankd_shards::{Board, DedupLimits, Durability, Shard, ShardOptions};

use super::layout;
use super::StartError;
use crate::clock::Clock;
use crate::operations::metrics::Metrics;
use crate::operations::priority;
use crate::request_path::dense_registry::DenseRegistry;
use crate::request_path::router::RouterState;
use crate::request_path::shard::link::Origin;
use crate::request_path::shard::{BatchLoop, LoopParts, ReplyRelay, ShardActor, ShardLink};
use crate::settings::{DurabilityArg, ServeSettings};

/// Opens the data dir and every shard, in parallel, and rebuilds the
/// router's registry of boards from the boards they read, while they go on
/// to load their count trees.
pub fn open_shards(config: &ServeSettings) -> Result<(Vec<Shard>, RouterState), StartError> {
    layout::check_or_create(&config.data_dir, config.shards, config.branching)?;
    let options = shard_options(config);
    std::thread::scope(|scope| {
        let (boards_tx, boards_rx) = std::sync::mpsc::channel();
        let handles: Vec<_> = (0..config.shards)
            .map(|i| {
                // Shards take their checkpoints in turn (see `checkpoint_phase`).
                let options = ShardOptions { checkpoint_phase: i as f64 / config.shards as f64, ..options.clone() };
                let dir = layout::shard_dir(&config.data_dir, i);
                let boards_tx = boards_tx.clone();
                let hand_on = move |boards| boards_tx.send((i, boards)).unwrap_or(());
                scope
                    .spawn(move || Shard::open_with_boards(&dir, options, hand_on).map_err(|e| StartError::Shard(i, e)))
            })
            .collect();
        drop(boards_tx);
        // Each shard's list, or none from a shard that failed first.
        let mut lists = vec![None; config.shards];
        for (i, boards) in boards_rx {
            lists[i] = Some(boards);
        }
        let held = lists.into_iter().collect::<Option<Vec<_>>>().map(held_boards);
        let state = held.map(RouterState::from_held);
        let shards = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(StartError::Io(std::io::Error::other("shard open panicked")))))
            .collect::<Result<Vec<_>, _>>()?;
        let max_board_id = shards.iter().map(Shard::max_board_id).max().unwrap_or(0);
        let max_seq = shards.iter().map(Shard::max_seq).max().unwrap_or(0);
        // Every shard opened, so every shard handed its boards on.
        let state = state.ok_or(StartError::Io(std::io::Error::other("a shard opened without its boards")))?;
        Ok((shards, state.with_stored_maxima(max_board_id, max_seq)))
    })
}

/// How every shard is opened, from the settings.
fn shard_options(config: &ServeSettings) -> ShardOptions {
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
        storage_opened: Some(priority::make_fjall_workers_background),
        dedup: DedupLimits {
            horizon_secs: i64::try_from(config.dedup_horizon_secs).unwrap_or(i64::MAX),
            max_bytes: usize::try_from(config.dedup_memory_mb.saturating_mul(1 << 20) / config.shards as u64)
                .unwrap_or(usize::MAX),
        },
        ..ShardOptions::default()
    };
    #[cfg(feature = "test-hooks")]
    let options = {
        let hooks = &config.hooks;
        ShardOptions {
            run_every: hooks.run_every.unwrap_or(options.run_every),
            checkpoint_every: hooks.checkpoint_every.unwrap_or(options.checkpoint_every),
            memtable_bytes: hooks.memtable_kib.map_or(options.memtable_bytes, |kib| kib << 10),
            checkpoint_slice_leaves: hooks.checkpoint_slice_leaves.unwrap_or(options.checkpoint_slice_leaves),
            ..options
        }
    };
    options
}

/// The dense indexes recovered from the shards, for the live boards of
/// `state`.
pub fn recover_dense(shards: &[Shard], state: &RouterState, branching: u32) -> DenseRegistry {
    // Each shard adds its share of every live dense board's indexes, the way
    // a recovering shard replaces its share (a half-finished drop's
    // leftovers are not indexed).
    let dense = DenseRegistry::new(branching);
    let mut live_dense: Option<HashSet<u64>> = None;
    for shard in shards {
        let mut share = shard.dense_score_counts();
        if share.is_empty() {
            continue;
        }
        let live = live_dense.get_or_insert_with(|| state.dense_board_ids());
        share.retain(|tree, _| live.contains(&tree.board));
        dense.replace_share(&HashMap::new(), &share);
    }
    dense
}

/// Every board some shard held when it opened, once, in id order: the
/// shards' lists (each in id order) merged (a board's name and config are
/// the same in every shard holding it; the first shard's copy is kept).
fn held_boards(lists: Vec<Vec<Board>>) -> Vec<Board> {
    let mut lists: Vec<_> = lists.into_iter().map(|list| list.into_iter().peekable()).collect();
    let mut held = Vec::with_capacity(lists.iter().map(|l| l.len()).max().unwrap_or(0));
    while let Some(next) = lists.iter_mut().filter_map(|l| l.peek().map(|b| b.id)).min() {
        let mut first = None;
        for list in &mut lists {
            if let Some(board) = list.next_if(|b| b.id == next) {
                first.get_or_insert(board);
            }
        }
        held.extend(first);
    }
    held
}

/// Starts one shard actor per shard, each on its own arbiter (thread),
/// its committed answers going back through `relays` (one per I/O
/// thread); returns their links and the arbiters, to stop at shutdown.
pub fn start_shards(
    shards: Vec<Shard>,
    config: &ServeSettings,
    dense: &DenseRegistry,
    metrics: &Arc<Metrics>,
    clock: Clock,
    relays: Vec<ReplyRelay>,
) -> (Vec<ShardLink>, Vec<Arbiter>) {
    let mut arbiters = Vec::new();
    let mut links = Vec::new();
    for (index, shard) in shards.into_iter().enumerate() {
        let parts = LoopParts {
            max_batch: config.max_batch,
            dense: dense.clone(),
            metrics: metrics.clone(),
            index,
            clock,
            relays: relays.clone(),
        };
        let core = BatchLoop::new(shard, parts);
        #[cfg(feature = "test-hooks")]
        let core = core.with_slow_disk(rankd_shards::commit::SlowDisk {
            commit: config.hooks.commit_delay(),
            runs: config.hooks.runs_delay(),
            ..Default::default()
        });
        let engine = core.engine();
        let arbiter = Arbiter::new();
        let addr = ShardActor::start_in_arbiter(&arbiter.handle(), move |_| ShardActor::new(core));
        let depth = metrics.shards[index].mailbox_depth.clone();
        links.push(ShardLink { addr, depth, max_queue: config.max_shard_queue, engine, origin: Origin::default() });
        arbiters.push(arbiter);
    }
    (links, arbiters)
}
