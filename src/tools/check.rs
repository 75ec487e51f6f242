//! `rankd check --data-dir DIR`: verifies a (stopped) data dir — every
//! shard's count trees agree with its score index and player records, and
//! the shards agree on the boards. Run after a crash, or by tests after
//! every kill -9.

use std::path::Path;

use rankd_shards::{Shard, ShardOptions};

use crate::server::layout::{self, Layout, LayoutError, LAYOUT_FILE};

/// What a successful check saw.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Shards checked.
    pub shards: usize,
    /// Players held, over all boards, windows and periods.
    pub players: u64,
    /// Boards known.
    pub boards: usize,
}

/// Why a data dir failed the check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No usable layout file.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A shard did not open or is inconsistent.
    #[error("shard {0}: {1}")]
    Shard(usize, rankd_shards::ShardError),
    /// Shards disagree about a board.
    #[error("board {0:?} is configured differently in different shards")]
    Boards(String),
}

/// Checks the data dir at `dir`. It must not be in use (fjall locks it).
pub fn check(dir: &Path) -> Result<CheckReport, CheckError> {
    let text = std::fs::read_to_string(dir.join(LAYOUT_FILE)).map_err(|e| LayoutError::Io(dir.to_path_buf(), e))?;
    let stored: Layout = toml::from_str(&text)
        .map_err(|e| LayoutError::Invalid { path: dir.join(LAYOUT_FILE), reason: e.to_string() })?;
    let layout = layout::check_or_create(dir, stored.shards, stored.branching)?;
    let mut report = CheckReport { shards: layout.shards, ..CheckReport::default() };
    let mut boards = std::collections::HashMap::new();
    for index in 0..layout.shards {
        let options = ShardOptions { branching: layout.branching, ..ShardOptions::default() };
        let mut opened = Vec::new();
        let shard = Shard::open_with_boards(&layout::shard_dir(dir, index), options, |boards| opened = boards)
            .map_err(|e| CheckError::Shard(index, e))?;
        shard.check().map_err(|e| CheckError::Shard(index, e))?;
        report.players += shard.players();
        for board in opened {
            if let Some(other) = boards.insert(board.id, board.clone()) {
                if other != board {
                    return Err(CheckError::Boards(board.name.to_string()));
                }
            }
        }
    }
    report.boards = boards.len();
    Ok(report)
}
