//! Idempotent writes on the shard: a write's `wid` is recorded in the open
//! batch beside the write, so both commit atomically; expired records are
//! deleted through later batches, a bounded number per step.

use super::Shard;
use crate::dedup::{Outcome, Wid};

impl Shard {
    /// What the write with `wid` on board `board` answered, if this shard
    /// applied it within the dedup horizon (committed, or staged in a batch
    /// still to be acknowledged: its replay is acknowledged after it).
    pub fn applied(&self, board: u64, wid: &Wid) -> Option<&Outcome> {
        self.dedup.get(board, wid)
    }

    /// Records that the write with `wid` on `board` answered `outcome`, in
    /// the open batch (call right after staging the write): sealing the
    /// batch stores its records as one value.
    pub fn record_applied(&mut self, board: u64, wid: Wid, outcome: Outcome) {
        self.dedup.insert(board, wid, outcome);
        self.staged.ops += 1;
    }

    /// Whether records are due to expire (past the horizon, or over the
    /// memory bound).
    pub fn has_expired_wids(&self) -> bool {
        self.dedup.has_expired(self.now)
    }

    /// Stages deleting up to `budget` expired records; returns how many.
    pub fn expire_wids(&mut self, budget: usize) -> usize {
        let deleted = self.dedup.expire(self.now, budget);
        let count = deleted.len();
        self.staged.ops += usize::from(count > 0);
        self.staged.meta.extend(deleted);
        count
    }

    /// Records held, their memory in bytes, and how many left before their
    /// horizon to stay under the memory bound.
    pub fn dedup_stats(&self) -> (usize, usize, u64) {
        (self.dedup.len(), self.dedup.bytes(), self.dedup.early_expiries())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{all_time_board, ShardOptions};
    use super::*;
    use crate::board::Mode;
    use crate::dedup::DedupLimits;

    #[test]
    fn a_record_commits_with_its_write_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let (board, tree) = all_time_board();
        let options =
            ShardOptions { dedup: DedupLimits { horizon_secs: 60, max_bytes: 1 << 20 }, ..Default::default() };
        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        shard.set_time(1000);
        let score = shard.write(&board, "p", 5, Mode::Incr, 1).unwrap();
        shard.record_applied(board.id, Wid::from("w1"), Outcome::Score(score));
        shard.commit().unwrap();
        // Staged but never committed: gone after a crash, with its write.
        shard.write(&board, "p", 5, Mode::Incr, 2).unwrap();
        shard.record_applied(board.id, Wid::from("w2"), Outcome::Score(10));
        drop(shard);

        let mut shard = Shard::open(dir.path(), options).unwrap();
        shard.set_time(1030);
        assert_eq!(shard.applied(board.id, &Wid::from("w1")), Some(&Outcome::Score(5)));
        assert_eq!(shard.applied(board.id, &Wid::from("w2")), None);
        assert_eq!(shard.get(tree, "p").unwrap().map(|r| r.score), Some(5));
        assert!(!shard.has_expired_wids());

        // Past the horizon the record is deleted by the next batch.
        shard.set_time(1061);
        assert!(shard.has_expired_wids());
        assert_eq!(shard.expire_wids(100), 1);
        shard.commit().unwrap();
        assert_eq!(shard.applied(board.id, &Wid::from("w1")), None);
        drop(shard);
        let shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        assert_eq!(shard.dedup_stats().0, 0, "the deletion was stored");
    }
}
