//! Dense ranks across shards.
//!
//! A dense rank counts *distinct* better scores over the whole board, and one
//! score may be held by players in several shards, so summing per-shard
//! distinct counts would count it several times. This index holds, for one
//! tree, how many players (in all shards) hold each score, and a count tree
//! with one entry per distinct score; shards report their changes to it at
//! commit, before they acknowledge, so a dense rank read after a write's
//! acknowledgement sees it.

use std::collections::HashMap;

use crate::tree::{BadBranching, CountTree};

/// Distinct scores of one tree over all shards.
#[derive(Debug)]
pub struct DenseIndex {
    players_at: HashMap<u64, u64>,
    distinct: CountTree,
}

impl DenseIndex {
    /// An empty index.
    pub fn new(branching: u32) -> Result<Self, BadBranching> {
        Ok(Self { players_at: HashMap::new(), distinct: CountTree::new(branching)? })
    }

    /// One more player holds `score_key`.
    pub fn add(&mut self, score_key: u64, players: u64) {
        if players == 0 {
            return;
        }
        let n = self.players_at.entry(score_key).or_default();
        if *n == 0 {
            self.distinct.add(u128::from(score_key) << 64, 1);
        }
        *n += players;
    }

    /// One player less holds `score_key`.
    pub fn remove(&mut self, score_key: u64) {
        if let Some(n) = self.players_at.get_mut(&score_key) {
            *n -= 1;
            if *n == 0 {
                self.players_at.remove(&score_key);
                self.distinct.add(u128::from(score_key) << 64, -1);
            }
        }
    }

    /// Distinct scores strictly better than `score_key`.
    pub fn distinct_before(&self, score_key: u64) -> u64 {
        self.distinct.count_before(u128::from(score_key) << 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_score_once_however_many_hold_it() {
        let mut index = DenseIndex::new(16).unwrap();
        index.add(10, 1);
        index.add(10, 3); // the same score in other shards
        index.add(20, 1);
        assert_eq!(index.distinct_before(20), 1);
        assert_eq!(index.distinct_before(25), 2);
        for _ in 0..4 {
            index.remove(10);
        }
        assert_eq!(index.distinct_before(25), 1);
    }
}
