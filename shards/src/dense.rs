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
    /// Players holding each score key, over all shards: a score leaves
    /// `distinct` only when its last player does.
    players_at: HashMap<u64, u64>,
    /// One entry per distinct score key, for counting those before a score.
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

    /// `players` fewer players hold `score_key`.
    pub fn remove(&mut self, score_key: u64, players: u64) {
        if let Some(n) = self.players_at.get_mut(&score_key) {
            *n = n.saturating_sub(players);
            if *n == 0 {
                self.players_at.remove(&score_key);
                self.distinct.add(u128::from(score_key) << 64, -1);
            }
        }
    }

    /// Replaces one shard's share of this index: `before` is what it had
    /// reported, `after` what it holds now (both as [`crate::Shard::score_counts`]
    /// gives them, sorted by score key). A shard whose storage is reopened
    /// after a failed commit loses the batches that never became durable,
    /// though their changes were already reported: this takes them back out.
    pub fn replace_share(&mut self, before: &[(u64, u64)], after: &[(u64, u64)]) {
        let mut delta: std::collections::BTreeMap<u64, i128> = std::collections::BTreeMap::new();
        for &(score_key, players) in before {
            *delta.entry(score_key).or_default() -= i128::from(players);
        }
        for &(score_key, players) in after {
            *delta.entry(score_key).or_default() += i128::from(players);
        }
        for (score_key, change) in delta {
            let players = change.unsigned_abs() as u64;
            match change.signum() {
                1 => self.add(score_key, players),
                -1 => self.remove(score_key, players),
                _ => {}
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
            index.remove(10, 1);
        }
        assert_eq!(index.distinct_before(25), 1);
    }

    #[test]
    fn replacing_a_share_keeps_the_other_shards() {
        let mut index = DenseIndex::new(2).unwrap();
        let shard_a = [(10, 2), (20, 1)];
        let shard_b = [(10, 1)];
        for (sk, n) in shard_a.iter().chain(&shard_b) {
            index.add(*sk, *n);
        }
        // Shard A lost score 10 (not durable) and gained 30.
        index.replace_share(&shard_a, &[(20, 1), (30, 1)]);
        assert_eq!(index.distinct_before(15), 1, "shard B still holds 10");
        assert_eq!(index.distinct_before(31), 3);
        index.replace_share(&shard_b, &[]);
        assert_eq!(index.distinct_before(25), 1, "only 20 left below 25");
        assert_eq!(index.distinct_before(31), 2);
    }
}
