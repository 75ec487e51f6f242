//! The random inputs of a run: operations on the shard, storage knobs, and
//! their strategies.

use proptest::prelude::*;
use rankd_shards::tree::BRANCHINGS;
use rankd_shards::{Mode, Order, Ties};

use crate::{BULK, FIXED, SLOTS};

#[derive(Debug, Clone)]
pub enum Op {
    Write {
        slot: usize,
        player: usize,
        score: i64,
        mode: Mode,
    },
    Remove {
        slot: usize,
        player: usize,
    },
    /// Many players at once (enough to burst tree leaves).
    Bulk {
        slot: usize,
        start: usize,
        scores: Vec<i64>,
        mode: Mode,
    },
    BulkRemove {
        slot: usize,
        start: usize,
        len: usize,
    },
    /// `write_many`: all or none (an `incr` overflow anywhere stages nothing).
    WriteMany {
        slot: usize,
        entries: Vec<(usize, i64)>,
        mode: Mode,
    },
    Commit,
    /// Take the open batch out as a sealed batch, not written yet.
    Seal,
    /// Write the sealed batches, in order, and sync them.
    Land,
    /// Commit, then write the count-tree checkpoint (leaves) and trim the log.
    Checkpoint,
    /// A step of the leaf-repacking pass the last checkpoint started (moves
    /// tree leaves in memory; nothing a reader sees may change).
    Repack {
        budget: usize,
    },
    CommitAndList,
    /// Commit, drop the shard, reopen it (first with a wrong branching factor
    /// if asked, which must be refused).
    Reopen {
        wrong_branching: bool,
    },
    /// Drop the shard with the batch still open, reopen: the batch is lost.
    Crash,
    /// Seal the open batch, write and fsync every sealed batch, then drop
    /// the shard before any of their runs (or checkpoint leaves) is written:
    /// every batch survives, from the log alone.
    CrashAfterSync,
    /// Commit, drop the slot's board; the slot gets a fresh board id.
    DropBoard {
        slot: usize,
        order: Order,
        ties: Ties,
    },
}

pub fn order() -> impl Strategy<Value = Order> {
    prop_oneof![Just(Order::Desc), Just(Order::Asc)]
}

pub fn ties() -> impl Strategy<Value = Ties> {
    prop_oneof![Just(Ties::Competition), Just(Ties::Dense), Just(Ties::Ordinal)]
}

pub fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Set), Just(Mode::Best), Just(Mode::Incr)]
}

pub fn score() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => -3i64..=3,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(0i64),
        1 => Just(-1i64),
        1 => i64::MIN..i64::MIN + 3,
        1 => i64::MAX - 2..=i64::MAX,
        1 => any::<i64>(),
    ]
}

pub fn player() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..FIXED.len(), 1 => FIXED.len()..FIXED.len() + BULK]
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..SLOTS, player(), score(), mode()).prop_map(|(slot, player, score, mode)| Op::Write { slot, player, score, mode }),
        8 => (0..SLOTS, player()).prop_map(|(slot, player)| Op::Remove { slot, player }),
        2 => (0..SLOTS, 0..BULK, proptest::collection::vec(prop_oneof![3 => -40i64..40, 1 => score()], 20..100), mode())
            .prop_map(|(slot, start, scores, mode)| Op::Bulk { slot, start, scores, mode }),
        1 => (0..SLOTS, 0..BULK, 1..BULK).prop_map(|(slot, start, len)| Op::BulkRemove { slot, start, len }),
        3 => (0..SLOTS, proptest::collection::vec((player(), score()), 0..6), mode())
            .prop_map(|(slot, entries, mode)| Op::WriteMany { slot, entries, mode }),
        8 => Just(Op::Commit),
        4 => Just(Op::Seal),
        2 => Just(Op::Land),
        1 => Just(Op::Checkpoint),
        2 => (0usize..6).prop_map(|budget| Op::Repack { budget }),
        3 => Just(Op::CommitAndList),
        2 => any::<bool>().prop_map(|w| Op::Reopen { wrong_branching: w }),
        1 => Just(Op::Crash),
        1 => Just(Op::CrashAfterSync),
        1 => (0..SLOTS, order(), ties()).prop_map(|(slot, order, ties)| Op::DropBoard { slot, order, ties }),
    ]
}

/// Storage knobs of one run.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    pub branching: u32,
    pub sync: bool,
    /// Logged tree changes between checkpoints: small values checkpoint often,
    /// the default leaves everything to log replay on reopen.
    pub checkpoint_every: Option<u64>,
    /// A tiny memtable makes fjall flush to disk segments mid-run.
    pub small_memtable: bool,
    /// Player records cached in memory: none, a few in one table or in two
    /// (14 + 3: keys split between tables, both evicting), or the default.
    pub cached_players: Option<usize>,
    /// Changed players that make the overlay be written as runs: small
    /// values write runs all the time, the default almost never here.
    pub run_every: Option<usize>,
    /// Leaves copied per sealed batch for a checkpoint: small values spread
    /// a checkpoint over many batches, with writes, crashes and reopens
    /// between its slices.
    pub checkpoint_slice_leaves: Option<usize>,
}

prop_compose! {
    pub fn knobs()(
        branching in proptest::sample::select(BRANCHINGS.to_vec()),
        sync in proptest::bool::weighted(0.25),
        checkpoint_every in prop_oneof![Just(None), Just(Some(1)), Just(Some(3)), Just(Some(17)), Just(Some(60))],
        small_memtable in proptest::bool::weighted(0.25),
        cached_players in prop_oneof![Just(None), Just(Some(0)), Just(Some(5)), Just(Some(17))],
        run_every in prop_oneof![Just(None), Just(Some(1)), Just(Some(4)), Just(Some(30))],
        checkpoint_slice_leaves in prop_oneof![Just(None), Just(Some(1)), Just(Some(2)), Just(Some(5))],
    ) -> Knobs {
        Knobs { branching, sync, checkpoint_every, small_memtable, cached_players, run_every, checkpoint_slice_leaves }
    }
}
