//! Time windows of a whole [`Shard`](rankd_shards::Shard) against a
//! plain-map oracle, with the clock injected through
//! [`Shard::set_time`](rankd_shards::Shard::set_time).
//!
//! The oracle keeps, per (window, period), a map player -> (score, reach seq)
//! and applies each write's mode inside every window's *current* period
//! (today's best, this week's total: `incr` starts from 0 in a new period).
//! Random operations run at random, advancing times: a few seconds, across a
//! UTC midnight, a Monday 00:00 week start, a month end (Feb 29 2024,
//! Dec 31 -> Jan 1). After each commit every readable period of every window
//! (current and up to `keep` back) is compared: count, get, competition /
//! dense / ordinal ranks and the full list. Periods that fall out of `keep`
//! must be deleted by `expire(budget)` with small budgets, stay deleted
//! across a reopen, and leave the readable periods untouched.
//!
//! Dates are computed here by a calendar written independently of
//! `window.rs`.

mod calendar;
mod checks;
mod expiry;
mod ops;
mod oracle;
mod periods;
mod random_ops;
mod rollover;
mod run;

use proptest::test_runner::TestCaseError;
use rankd_shards::{
    Board, BoardConfig, Direction, Durability, Order, Record, Shard, ShardError, ShardOptions, Ties, TreeId, Window,
};

pub const DAY: i64 = 86_400;

pub const WINDOWS: [Window; 4] = [Window::All, Window::Daily, Window::Weekly, Window::Monthly];

pub fn ok<T>(r: Result<T, ShardError>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("unexpected shard error: {e:?}")))
}

/// A directory for a shard: in memory (tmpfs) where there is one, since
/// creating a fjall database costs many fsyncs (~0.4 s on a busy disk) and
/// fsync is not what these tests check.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("rankd-windows-").tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

// ---------------------------------------------------------------- fixed dates
// Helpers of the fixed-date cases (rollover.rs, expiry.rs).

pub fn open(dir: &std::path::Path, now: i64) -> Shard {
    let mut shard = Shard::open(dir, ShardOptions { durability: Durability::Buffered, ..ShardOptions::default() })
        .expect("open shard");
    shard.set_time(now);
    shard
}

pub fn board(id: u64, windows: Vec<Window>, keep: u32, ties: Ties) -> Board {
    Board {
        id,
        name: format!("b{id}").into(),
        config: BoardConfig { order: Order::Desc, ties, windows, keep, fields: Vec::new() }.into(),
    }
}

pub fn rec(score: i64, seq: u64) -> Option<Record> {
    Some(Record { score, seq })
}

/// (player, score) in list order.
pub fn listed(shard: &Shard, board: &Board, tree: TreeId) -> Vec<(String, i64)> {
    let cfg = &board.config;
    shard
        .list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 1000)
        .expect("list")
        .into_iter()
        .map(|e| (e.player, e.score))
        .collect()
}

pub fn l(entries: &[(&str, i64)]) -> Vec<(String, i64)> {
    entries.iter().map(|(p, s)| (p.to_string(), *s)).collect()
}
