//! The random inputs of a run: players, clock advances, operations, board
//! configs, start times, storage knobs, and their strategies.

use proptest::prelude::*;
use rankd_shards::tree::BRANCHINGS;
use rankd_shards::{BoardConfig, Durability, Mode, Order, ShardOptions, Ties};

use crate::calendar::{at, next_midnight, next_monday, next_month};
use crate::{DAY, WINDOWS};

/// Named players: short names, two sharing an 8-byte prefix (tiebreak),
/// multi-byte UTF-8.
pub const FIXED: [&str; 9] = ["a", "b", "bob", "abcdefgh1", "abcdefgh2", "é", "🎮", "Z", "zed"];
/// Extra players for bulk writes: enough to burst a count-tree leaf (64 keys).
pub const BULK: usize = 70;

pub fn names() -> Vec<String> {
    FIXED.iter().map(|s| s.to_string()).chain((0..BULK).map(|i| format!("p{i:02}"))).collect()
}

#[derive(Debug, Clone, Copy)]
pub enum Advance {
    Secs(i64),
    /// To the next UTC midnight, plus seconds.
    NextDay(i64),
    /// To the next Monday 00:00, plus seconds.
    NextMonday(i64),
    /// To the next 1st of a month 00:00, plus seconds.
    NextMonth(i64),
    /// To one second before the next midnight / Monday / month.
    BeforeNextDay,
    BeforeNextMonday,
    BeforeNextMonth,
    Days(i64),
}

impl Advance {
    pub fn apply(self, t: i64) -> i64 {
        match self {
            Advance::Secs(s) => t + s,
            Advance::NextDay(s) => next_midnight(t) + s,
            Advance::NextMonday(s) => next_monday(t) + s,
            Advance::NextMonth(s) => next_month(t) + s,
            Advance::BeforeNextDay => next_midnight(t) - 1,
            Advance::BeforeNextMonday => next_monday(t) - 1,
            Advance::BeforeNextMonth => next_month(t) - 1,
            Advance::Days(d) => t + d * DAY,
        }
    }
}

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
    WriteMany {
        slot: usize,
        entries: Vec<(usize, i64)>,
        mode: Mode,
    },
    /// Many players at once (bursts count-tree leaves, gives expiry more to delete).
    Bulk {
        slot: usize,
        start: usize,
        len: usize,
        mode: Mode,
    },
    Advance(Advance),
    Commit,
    /// Commit, then checkpoint the count trees (trims the change log).
    Checkpoint,
    /// Commit, then `calls` calls of `expire(budget)`.
    Expire {
        budget: usize,
        calls: usize,
    },
    /// Commit, then `expire(3)` until every expired period must be deleted.
    Drain,
    /// Commit (and drain, if asked), drop the shard, reopen it, set the time again.
    Reopen {
        drain_first: bool,
    },
    /// Drop the shard with the batch still open: the batch is lost.
    Crash,
}

pub const SLOTS: usize = 2;

pub fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Set), Just(Mode::Best), Just(Mode::Incr)]
}

pub fn score() -> impl Strategy<Value = i64> {
    prop_oneof![
        10 => -3i64..=3,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => i64::MAX - 2..=i64::MAX,
        1 => any::<i64>(),
    ]
}

pub fn player() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..FIXED.len(), 1 => FIXED.len()..FIXED.len() + BULK]
}

pub fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        4 => (0i64..=3).prop_map(Advance::Secs),
        2 => (1i64..=20_000).prop_map(Advance::Secs),
        3 => (0i64..=2).prop_map(Advance::NextDay),
        2 => (0i64..=2).prop_map(Advance::NextMonday),
        2 => (0i64..=2).prop_map(Advance::NextMonth),
        2 => Just(Advance::BeforeNextDay),
        1 => Just(Advance::BeforeNextMonday),
        2 => Just(Advance::BeforeNextMonth),
        1 => (2i64..=40).prop_map(Advance::Days),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..SLOTS, player(), score(), mode()).prop_map(|(slot, player, score, mode)| Op::Write { slot, player, score, mode }),
        6 => (0..SLOTS, player()).prop_map(|(slot, player)| Op::Remove { slot, player }),
        3 => (0..SLOTS, proptest::collection::vec((player(), score()), 0..5), mode())
            .prop_map(|(slot, entries, mode)| Op::WriteMany { slot, entries, mode }),
        1 => (0..SLOTS, 0..BULK, 10..BULK, mode()).prop_map(|(slot, start, len, mode)| Op::Bulk { slot, start, len, mode }),
        20 => advance().prop_map(Op::Advance),
        10 => Just(Op::Commit),
        2 => Just(Op::Checkpoint),
        5 => (prop_oneof![Just(1usize), Just(3), Just(7), Just(1000)], 1usize..=3)
            .prop_map(|(budget, calls)| Op::Expire { budget, calls }),
        3 => Just(Op::Drain),
        3 => any::<bool>().prop_map(|drain_first| Op::Reopen { drain_first }),
        2 => Just(Op::Crash),
    ]
}

pub fn board_config() -> impl Strategy<Value = BoardConfig> {
    (
        proptest::sample::subsequence(WINDOWS.to_vec(), 1..=4).prop_shuffle(),
        1u32..=3,
        prop_oneof![Just(Order::Desc), Just(Order::Asc)],
        prop_oneof![Just(Ties::Competition), Just(Ties::Dense), Just(Ties::Ordinal)],
    )
        .prop_map(|(windows, keep, order, ties)| BoardConfig { order, ties, windows, keep, fields: Vec::new() })
}

/// Starting moments just before interesting boundaries.
pub fn start() -> impl Strategy<Value = i64> {
    proptest::sample::select(vec![
        at(2024, 2, 28, 23, 59, 50),  // leap day ahead
        at(2024, 2, 29, 23, 59, 58),  // leap day -> March
        at(2023, 12, 31, 23, 59, 58), // Sunday: day, week, month and year roll at once
        at(2025, 12, 31, 23, 59, 55), // new year on a Thursday: week does not roll
        at(2026, 5, 31, 23, 59, 58),  // Sunday: day, week, month roll at once
        at(2026, 11, 22, 12, 0, 0),
    ])
}

#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    branching: u32,
    sync: bool,
    checkpoint_every: Option<u64>,
    cached_players: Option<usize>,
}

pub fn knobs() -> impl Strategy<Value = Knobs> {
    (
        proptest::sample::select(BRANCHINGS.to_vec()),
        // fsync costs wall time and is not what these tests check.
        Just(false),
        prop_oneof![Just(None), Just(Some(1)), Just(Some(7))],
        prop_oneof![Just(None), Just(Some(0)), Just(Some(5))],
    )
        .prop_map(|(branching, sync, checkpoint_every, cached_players)| Knobs {
            branching,
            sync,
            checkpoint_every,
            cached_players,
        })
}

pub fn options(knobs: Knobs) -> ShardOptions {
    let defaults = ShardOptions::default();
    #[allow(clippy::needless_update)]
    ShardOptions {
        branching: knobs.branching,
        durability: if knobs.sync { Durability::Sync } else { Durability::Buffered },
        cache_bytes: 1 << 20,
        checkpoint_every: knobs.checkpoint_every.unwrap_or(defaults.checkpoint_every),
        cached_players: knobs.cached_players.unwrap_or(defaults.cached_players),
        ..defaults
    }
}
