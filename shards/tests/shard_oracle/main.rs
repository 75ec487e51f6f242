//! A whole [`Shard`](rankd_shards::Shard) against a plain-map oracle, over
//! random operations: writes in every mode (single and `write_many`),
//! removes, commits, checkpoints, reads (point, count, rank, lists), board
//! drops, clean reopens (persistence, and count trees rebuilt from
//! checkpointed leaves plus the replayed change log) and "crashes" (dropping
//! the shard with writes still staged, which must lose exactly the
//! uncommitted batch). Batches may also be sealed and written later, as the
//! server's committer thread does: reads in between must see them, and a
//! crash before they are written loses them. Storage knobs vary per case:
//! branching factor, durability, checkpoint interval, memtable size, record
//! cache.

mod cases;
mod checks;
mod ops;
mod oracle;
mod random_ops;
mod run;

use proptest::test_runner::TestCaseError;
use rankd_shards::{ShardError, TreeId, Window};

/// Named players: updates keep hitting the same few, and the names probe the
/// tiebreak (shared 8-byte prefixes, a trailing NUL, multi-byte UTF-8).
pub const FIXED: [&str; 12] =
    ["a", "a\u{0}", "b", "abcdefgh", "abcdefgh1", "abcdefgh2", "abcdefgi", "é", "日本語の名前", "🎮", "\u{7f}", "Z"];
/// Extra players for bulk writes: enough to burst count-tree leaves.
pub const BULK: usize = 100;
pub const SLOTS: usize = 3;

pub fn names() -> Vec<String> {
    FIXED
        .iter()
        .map(|s| s.to_string())
        .chain((0..BULK).map(|i| if i % 3 == 0 { format!("abcdefgh{i}") } else { format!("bulk{i:03}") }))
        .collect()
}

pub fn tid(board: u64) -> TreeId {
    TreeId { board, window: Window::All.code(), period: 0 }
}

pub fn ok<T>(r: Result<T, ShardError>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("unexpected shard error: {e:?}")))
}
