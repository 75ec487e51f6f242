//! A player's stored state in one tree, and its byte layout: what the
//! players' keyspace, the change log, the overlay and the record cache all
//! hold, so it sits below each of them.

use crate::board::{Order, Ties};
use crate::error::ShardError;
use crate::key;

/// A player's stored state in one tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Current score.
    pub score: i64,
    /// Global arrival sequence of the write that reached this score.
    pub seq: u64,
}

impl Record {
    pub(crate) fn encode(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.score.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    /// The key whose count before it is the player's rank on this shard:
    /// what a `rank` counts, and what the look ahead before it walks to.
    pub fn rank_key(self, ties: Ties, order: Order) -> u128 {
        key::rank_key(ties, key::score_key(self.score, order), self.seq)
    }

    /// The key `player`, holding this record, has in the count tree: what
    /// a write adds and removes, and what the look ahead before it walks to.
    pub(crate) fn tree_key(self, player: &str, ties: Ties, order: Order) -> u128 {
        key::tree_key(key::score_key(self.score, order), key::tiebreak(ties, player, self.seq))
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, ShardError> {
        let (score, seq) = bytes.split_first_chunk::<8>().ok_or(ShardError::Corrupt("player record"))?;
        let seq: [u8; 8] = seq.try_into().map_err(|_| ShardError::Corrupt("player record"))?;
        Ok(Self { score: i64::from_be_bytes(*score), seq: u64::from_be_bytes(seq) })
    }
}
