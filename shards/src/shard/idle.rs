//! What an idle shard does with the quiet. After a burst of writes, the
//! trees they changed stay live (boxed, not frozen), the overlay holds
//! their players' records, the memtables hold their log, and a restart
//! replays that log; a checkpoint would put all of it in storage, but
//! checkpoints are due after more writes, which an idle shard never gets.
//! So a shard that sealed no write for a whole look (the server looks once
//! a second) takes that checkpoint itself, copied in steps between
//! requests as any other, ends it with a batch of its own, and has the
//! batch's runs thread hand every memtable to fjall to flush.

use super::Shard;

/// An idle shard checkpoints once it has logged this share (1/8) of the
/// changes after which a checkpoint is due anyway (`Shard::checkpoint_due`:
/// 100k to 400k as the shard's players grow, so 12.5k to 50k). A
/// checkpoint rewrites every changed leaf and makes fjall merge the
/// leaves' keyspace again, all of it for a big board, whatever the number
/// of changes: a trickle of writes must not bring one each quiet second,
/// and bursts with pauses between bring at most eight times as many as
/// steady writes would.
const IDLE_CHECKPOINT_SHARE: u64 = 8;

/// What an idle shard remembers between looks.
#[derive(Debug, Default)]
pub(super) struct IdleWatch {
    /// The log's next record number at the last look: unchanged, no batch
    /// of writes was sealed since.
    seen_log: u64,
}

/// What [`Shard::settle_idle`] found to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStep {
    /// Writes were sealed since the last look, or are staged or in flight.
    Busy,
    /// Nothing waits to reach storage (or too little to checkpoint for).
    Settled,
    /// A checkpoint was begun: copy it with [`Shard::copy_checkpoint_step`].
    Began,
    /// The checkpoint's copy is not finished yet.
    Copying,
    /// The checkpoint's copy is done and its end is staged: seal a batch
    /// ([`Shard::seal`]); it carries the end, the overlay's runs and, for a
    /// checkpoint begun idle, the flush of every memtable.
    Seal,
}

impl Shard {
    /// One look at an idle shard (see the module docs): call it at a steady
    /// pace; it acts only when no batch of writes was sealed since the
    /// last call and nothing is staged or in flight.
    pub fn settle_idle(&mut self) -> IdleStep {
        let seen = std::mem::replace(&mut self.checkpoints.idle.seen_log, self.log.next);
        if seen != self.log.next || !self.is_settled() {
            return IdleStep::Busy;
        }
        if self.checkpoints.copying.is_some() {
            if self.checkpoint_copy_left() {
                return IdleStep::Copying;
            }
            // The batch's one staged op: a seal of nothing else ends it.
            self.staged.ops += 1;
            return IdleStep::Seal;
        }
        if self.log.logged.saturating_mul(IDLE_CHECKPOINT_SHARE) >= self.checkpoint_wait().max(1) {
            self.begin_checkpoint();
            // Not begun if its writer's thread could not start: next look.
            if self.checkpoints.copying.is_some() {
                self.flush_memtables_after_checkpoint();
                return IdleStep::Began;
            }
        }
        IdleStep::Settled
    }
}

#[cfg(test)]
mod tests {
    use super::super::{all_time_board, ShardOptions};
    use super::*;
    use crate::board::{Board, BoardConfig, Mode, Order, Ties, Window};
    use fjall::AbstractTree as _;

    fn small_boards(count: u64) -> Vec<Board> {
        let config = BoardConfig {
            order: Order::Desc,
            ties: Ties::Ordinal,
            windows: vec![Window::All],
            keep: 1,
            fields: Vec::new(),
        };
        (1..=count).map(|id| Board { id, name: format!("b{id}").into(), config: config.clone().into() }).collect()
    }

    /// A fresh shard checkpointing after `checkpoint_every` changes (at
    /// least), and a board to write to.
    fn one_board_shard(checkpoint_every: u64) -> (tempfile::TempDir, Shard, Board) {
        let dir = tempfile::tempdir().unwrap();
        let options = ShardOptions { checkpoint_every, ..ShardOptions::default() };
        let shard = Shard::open(dir.path(), options).unwrap();
        (dir, shard, all_time_board().0)
    }

    /// Waits (up to 20 s) for fjall's worker to flush every memtable;
    /// returns the bytes memtables still hold.
    fn wait_for_flushes(shard: &Shard) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let stats = shard.storage_stats();
            if stats.memtable_bytes == 0 || std::time::Instant::now() > deadline {
                return stats.memtable_bytes;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// After a burst of writes to small boards, looks at an idle shard
    /// checkpoint it (copied in steps), end the checkpoint with a batch of
    /// its own and flush the memtables: every tree freezes, the overlay
    /// and the log are empty, and a reopen holds every player and has no
    /// log to replay. A write makes the next look busy again.
    #[test]
    fn an_idle_shard_checkpoints_what_its_writes_left_and_flushes_its_memtables() {
        let dir = tempfile::tempdir().unwrap();
        let options = ShardOptions { checkpoint_every: 80, checkpoint_slice_leaves: 3, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options.clone()).unwrap();
        let boards = small_boards(30);
        for (i, board) in boards.iter().enumerate() {
            shard.write(board, "p", i as i64, Mode::Set, i as u64 + 1).unwrap();
            shard.commit().unwrap();
        }
        assert_eq!(shard.tree_forms().frozen, 0, "every board was just written");
        assert!(shard.unwritten_players() > 0 && shard.logged_changes() == 30);
        assert_eq!(shard.settle_idle(), IdleStep::Busy, "batches were sealed since the last look");
        assert_eq!(shard.settle_idle(), IdleStep::Began);
        assert_eq!(shard.settle_idle(), IdleStep::Copying);
        let mut steps = 0;
        while shard.copy_checkpoint_step() {
            steps += 1;
        }
        assert!(steps >= 30 / 3 - 1, "copied in slices of 3 trees: {steps} steps");
        assert_eq!(shard.settle_idle(), IdleStep::Seal);
        assert!(shard.has_staged(), "the end is staged for a seal");
        let sealed = shard.seal();
        assert!(!sealed.is_empty());
        let written = sealed.write().unwrap();
        assert!(written.carries_checkpoint());
        shard.durability_handle().sync().unwrap();
        written.write_runs().unwrap();
        shard.landed(1);
        assert_eq!(shard.tree_forms().frozen, 30, "every tree handed out froze");
        assert_eq!(shard.unwritten_players(), 0, "the overlay went out as runs");
        assert_eq!(wait_for_flushes(&shard), 0, "every memtable flushed");
        assert_eq!(shard.settle_idle(), IdleStep::Settled);
        assert_eq!(shard.settle_idle(), IdleStep::Settled, "nothing more to do");
        // At rest, a shutdown has nothing to write: no table for the next
        // start to merge.
        let before = shard.storage.leaves.tree.table_count();
        shard.prepare_shutdown(std::time::Duration::from_secs(20)).unwrap();
        assert_eq!(shard.storage.leaves.tree.table_count(), before, "a shard at rest writes no checkpoint at shutdown");

        shard.write(&boards[0], "q", 100, Mode::Set, 100).unwrap();
        shard.commit().unwrap();
        assert_eq!(shard.settle_idle(), IdleStep::Busy);
        assert_eq!(shard.settle_idle(), IdleStep::Settled, "one change is too few to checkpoint for");
        let before = shard.storage.leaves.tree.table_count();
        shard.prepare_shutdown(std::time::Duration::from_secs(20)).unwrap();
        assert!(shard.storage.leaves.tree.table_count() > before, "not at rest: the shutdown checkpoints");
        assert_eq!(shard.logged_changes(), 0);

        drop(shard);
        let shard = Shard::open(dir.path(), options).unwrap();
        assert_eq!(shard.logged_changes(), 0, "the shutdown checkpointed the one write after the idle one");
        for (i, board) in boards.iter().enumerate() {
            let record = shard.get(crate::TreeId::all_time(board.id), "p").unwrap().expect("every player kept");
            assert_eq!(record.score, i as i64);
        }
        assert_eq!(shard.get(crate::TreeId::all_time(boards[0].id), "q").unwrap().map(|r| r.score), Some(100));
        assert_eq!(shard.tree_forms().frozen, 30, "checkpointed trees load frozen");
    }

    /// The changes an idle checkpoint waits for grow with the shard's
    /// players, as a regular checkpoint's do: at 1000 players and a least
    /// wait of 100, a checkpoint is due after 400 changes, an idle one
    /// after 50 (not 100 / 8).
    #[test]
    fn a_bigger_shard_waits_for_more_changes_before_an_idle_checkpoint() {
        let (_dir, mut shard, board) = one_board_shard(100);
        let mut seq = 0;
        let mut write = |shard: &mut Shard, players: std::ops::Range<i64>, score: i64| {
            for i in players {
                seq += 1;
                shard.write(&board, &format!("p{i}"), score + i, Mode::Set, seq).unwrap();
            }
            shard.commit().unwrap();
        };
        write(&mut shard, 0..1000, 0);
        shard.checkpoint().unwrap();
        assert_eq!(shard.logged_changes(), 0);
        write(&mut shard, 0..49, 5_000);
        assert_eq!(shard.settle_idle(), IdleStep::Busy);
        assert_eq!(shard.settle_idle(), IdleStep::Settled, "49 changes: under an eighth of 400");
        write(&mut shard, 49..50, 5_000);
        assert_eq!(shard.settle_idle(), IdleStep::Busy);
        assert_eq!(shard.settle_idle(), IdleStep::Began, "50 changes: an eighth of 400");
    }

    /// A shard with staged writes, or batches not yet landed, is busy: an
    /// idle checkpoint never overtakes writes.
    #[test]
    fn staged_or_unlanded_writes_keep_a_shard_busy() {
        let (_dir, mut shard, board) = one_board_shard(40);
        for i in 0..4 {
            shard.write(&board, &format!("p{i}"), i, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        assert_eq!(shard.settle_idle(), IdleStep::Busy);
        shard.write(&board, "staged", 7, Mode::Set, 9).unwrap();
        assert_eq!(shard.settle_idle(), IdleStep::Busy, "a write is staged");
        let sealed = shard.seal();
        assert_eq!(shard.settle_idle(), IdleStep::Busy, "a sealed batch has not landed");
        let written = sealed.write().unwrap();
        shard.durability_handle().sync().unwrap();
        written.write_runs().unwrap();
        shard.landed(1);
        // Landed, and sealed before the last look: five changes, an eighth of 40.
        assert_eq!(shard.settle_idle(), IdleStep::Began);
    }
}
