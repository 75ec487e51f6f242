//! One run: a shard and the oracle side by side, each operation applied to
//! both (with seals, landings, reopens and crashes) and checked after.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::{
    Amount, Board, DenseChange, DenseIndex, Durability, Mode, Order, SealedBatch, Shard, ShardError, ShardOptions,
    Ties, Upcoming, UpcomingWrite,
};

use crate::checks::{check_all, check_dense, check_lists, check_memory};
use crate::ops::{Knobs, Op};
use crate::oracle::{new_board, oracle_write, OBoard, State};
use crate::{names, ok, tid, BULK, FIXED, SLOTS};

struct Run {
    dir: tempfile::TempDir,
    options: ShardOptions,
    names: Vec<String>,
    shard: Option<Shard>,
    live: State,
    committed: State,
    staged: bool,
    /// Score writes and removals staged (what `commit` reports).
    staged_writes: usize,
    /// Sealed batches not written yet, oldest first.
    sealed: Vec<SealedBatch>,
    /// The state once every sealed batch is written.
    sealed_state: Option<State>,
    /// Engine-wide dense index per slot, fed by commits.
    dense: Vec<DenseIndex>,
    seq: u64,
    next_board_id: u64,
}

impl Run {
    fn shard(&mut self) -> &mut Shard {
        self.shard.as_mut().expect("shard open")
    }

    fn write(&mut self, slot: usize, player: usize, score: i64, mode: Mode) -> Result<(), TestCaseError> {
        self.seq += 1;
        let seq = self.seq;
        let name = self.names[player].clone();
        let board = self.live.slots[slot].board.clone();
        let expected = oracle_write(&mut self.live.slots[slot], &name, score, mode, seq);
        // As the server does: a look ahead that must change nothing.
        self.shard().prefetch([Upcoming::Write(UpcomingWrite {
            board: &board,
            player: &name,
            amount: Amount::Score(score),
            mode,
            seq,
        })]);
        let got = self.shard().write(&board, &name, score, mode, seq);
        match (expected, got) {
            (Ok(want), Ok(stored)) => {
                prop_assert_eq!(stored, want, "stored score of {:?} {:?} {} seq {}", name, mode, score, seq);
                self.live.known.insert(board.id, board.clone());
                self.live.max_seq = self.live.max_seq.max(seq);
                self.live.max_board_id = self.live.max_board_id.max(board.id);
                self.staged = true;
                self.staged_writes += 1;
            }
            (Err(()), Err(ShardError::Overflow)) => {}
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "write {name:?} {mode:?} {score} seq {seq} on {board:?}: oracle {want:?}, shard {got:?}"
                )))
            }
        }
        Ok(())
    }

    fn write_many(&mut self, slot: usize, entries: &[(usize, i64)], mode: Mode) -> Result<(), TestCaseError> {
        let board = self.live.slots[slot].board.clone();
        let mut batch = Vec::new();
        for &(player, score) in entries {
            self.seq += 1;
            batch.push((self.names[player].clone(), Amount::Score(score), self.seq));
        }
        let mut after = self.live.slots[slot].clone();
        let expected: Result<Vec<i64>, ()> = entries
            .iter()
            .zip(&batch)
            .map(|(&(_, score), (name, _, seq))| oracle_write(&mut after, name, score, mode, *seq))
            .collect();
        let got = self.shard().write_many(&board, &batch, mode);
        match (expected, got) {
            (Ok(want), Ok(stored)) => {
                prop_assert_eq!(stored, want, "write_many {:?} {:?}", mode, batch);
                self.live.slots[slot] = after;
                if let Some(max) = batch.iter().map(|e| e.2).max() {
                    self.live.known.insert(board.id, board.clone());
                    self.live.max_seq = self.live.max_seq.max(max);
                    self.live.max_board_id = self.live.max_board_id.max(board.id);
                    self.staged = true;
                }
                self.staged_writes += batch.len();
            }
            (Err(()), Err(ShardError::Overflow)) => {}
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "write_many {mode:?} {batch:?} on {board:?}: oracle {want:?}, shard {got:?}"
                )))
            }
        }
        Ok(())
    }

    fn remove(&mut self, slot: usize, player: usize) -> Result<(), TestCaseError> {
        let name = self.names[player].clone();
        let board = self.live.slots[slot].board.clone();
        let expected = self.live.slots[slot].players.remove(&name).is_some();
        let got = ok(self.shard().remove(&board, &name))?;
        prop_assert_eq!(got, expected, "remove {:?} from board {}", name, board.id);
        self.staged = true;
        self.staged_writes += 1;
        Ok(())
    }

    /// Over an open or unwritten batch, lists already see every write, while
    /// storage scans and maintenance refuse to run.
    fn check_unsettled(&mut self) -> Result<(), TestCaseError> {
        for ob in &self.live.slots {
            check_lists(self.shard.as_ref().expect("shard open"), ob)?;
        }
        let tree = tid(self.live.slots[0].board.id);
        let shard = self.shard.as_mut().expect("shard open");
        prop_assert!(!shard.is_settled());
        let check = shard.check();
        prop_assert!(matches!(check, Err(ShardError::NeedsCommit)), "check with staged writes: {:?}", check);
        let drop = shard.drop_board(tree.board);
        prop_assert!(matches!(drop, Err(ShardError::NeedsCommit)), "drop_board with staged writes: {:?}", drop);
        let checkpoint = shard.checkpoint();
        prop_assert!(
            matches!(checkpoint, Err(ShardError::NeedsCommit)),
            "checkpoint with staged writes: {:?}",
            checkpoint
        );
        Ok(())
    }

    /// Feeds dense-tree changes of a commit or seal to the engine-wide indexes.
    fn absorb_dense(&mut self, changes: Vec<DenseChange>) -> Result<(), TestCaseError> {
        for change in changes {
            let slot = self.live.slots.iter().position(|ob| ob.board.id == change.tree.board);
            let Some(slot) = slot else {
                return Err(TestCaseError::fail(format!("dense change for a board not live: {change:?}")));
            };
            prop_assert_eq!(self.live.slots[slot].board.config.ties, Ties::Dense, "dense change for a non-dense board");
            prop_assert_eq!(change.tree, tid(change.tree.board));
            if let Some(r) = change.removed {
                self.dense[slot].remove(r, 1);
            }
            if let Some(a) = change.added {
                self.dense[slot].add(a, 1);
            }
        }
        Ok(())
    }

    fn check_dense_all(&self) -> Result<(), TestCaseError> {
        for (index, ob) in self.dense.iter().zip(&self.live.slots) {
            if ob.board.config.ties == Ties::Dense {
                check_dense(index, ob)?;
            }
        }
        Ok(())
    }

    fn seal(&mut self) -> Result<(), TestCaseError> {
        if self.staged {
            self.check_unsettled()?;
        }
        let mut batch = self.shard().seal();
        prop_assert!(!self.shard().has_staged());
        prop_assert_eq!(batch.writes, self.staged_writes, "writes reported by seal");
        self.absorb_dense(std::mem::take(&mut batch.dense))?;
        self.sealed.push(batch);
        self.sealed_state = Some(self.live.clone());
        self.staged = false;
        self.staged_writes = 0;
        self.check_dense_all()
    }

    /// Writes and syncs the sealed batches, as the committer thread does.
    fn land(&mut self) -> Result<(), TestCaseError> {
        if self.sealed.is_empty() {
            return Ok(());
        }
        if !self.staged {
            self.check_unsettled()?;
        }
        let count = self.sealed.len();
        let mut written = Vec::with_capacity(count);
        for batch in std::mem::take(&mut self.sealed) {
            written.push(ok(batch.write())?);
        }
        let shard = self.shard.as_mut().expect("shard open");
        ok(shard.durability_handle().sync())?;
        for batch in written {
            ok(batch.write_runs())?;
        }
        shard.landed(count);
        self.committed = self.sealed_state.take().expect("sealed state");
        Ok(())
    }

    fn commit(&mut self) -> Result<(), TestCaseError> {
        self.land()?;
        let staged = self.staged;
        prop_assert_eq!(self.shard().has_staged(), staged, "has_staged");
        if staged {
            self.check_unsettled()?;
        }
        let shard = self.shard.as_mut().expect("shard open");
        let committed = ok(shard.commit())?;
        prop_assert!(shard.is_settled());
        prop_assert_eq!(committed.writes, self.staged_writes, "writes reported by commit");
        if !staged {
            prop_assert!(committed.dense.is_empty());
        }
        self.absorb_dense(committed.dense)?;
        self.committed = self.live.clone();
        self.staged = false;
        self.staged_writes = 0;
        self.check_dense_all()
    }

    fn reopen(&mut self) -> Result<(), TestCaseError> {
        drop(self.shard.take());
        // The boards it read, names and all, in id order: what the router is
        // rebuilt from.
        let mut opened = Vec::new();
        let shard = ok(Shard::open_with_boards(self.dir.path(), self.options.clone(), |boards| opened = boards))?;
        prop_assert!(opened.windows(2).all(|pair| pair[0].id < pair[1].id), "opened boards in id order");
        let opened: BTreeMap<u64, Board> = opened.into_iter().map(|b| (b.id, b)).collect();
        prop_assert_eq!(&opened, &self.committed.known, "boards read at open");
        self.shard = Some(shard);
        // The count trees came from stored leaves: rebuild a dense index from
        // them as a restarted engine would, and compare.
        let shard = self.shard.as_ref().unwrap();
        for ob in &self.committed.slots {
            if ob.board.config.ties == Ties::Dense {
                let mut index = DenseIndex::new(self.options.branching).unwrap();
                for (sk, n) in shard.score_counts(tid(ob.board.id)) {
                    index.add(sk, n);
                }
                check_dense(&index, ob)?;
            }
        }
        Ok(())
    }

    /// Reopens the shard as after a crash: what was durable is what the
    /// oracle calls committed. The dense changes of sealed batches that died
    /// were reported at seal, so this shard's share of the dense indexes is
    /// replaced with what it holds after reopening, as the server does.
    fn crash_and_reopen(&mut self) -> Result<(), TestCaseError> {
        let before = self.shard().dense_score_counts();
        self.reopen()?;
        let after = self.shard().dense_score_counts();
        for (index, ob) in self.dense.iter_mut().zip(&self.live.slots) {
            let tree = tid(ob.board.id);
            let (old, new) = (before.get(&tree), after.get(&tree));
            index.replace_share(old.map_or(&[][..], Vec::as_slice), new.map_or(&[][..], Vec::as_slice));
        }
        self.live = self.committed.clone();
        self.staged = false;
        self.staged_writes = 0;
        prop_assert!(!self.shard().has_staged());
        check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, true)?;
        self.check_dense_all()
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write { slot, player, score, mode } => {
                self.write(slot, player, score, mode)?;
                let name = self.names[player].clone();
                check_memory(self.shard.as_ref().unwrap(), &self.live.slots[slot], [name.as_str()])?;
            }
            Op::Remove { slot, player } => {
                self.remove(slot, player)?;
                let name = self.names[player].clone();
                check_memory(self.shard.as_ref().unwrap(), &self.live.slots[slot], [name.as_str()])?;
            }
            Op::Bulk { slot, start, scores, mode } => {
                for (i, score) in scores.into_iter().enumerate() {
                    self.write(slot, FIXED.len() + (start + i) % BULK, score, mode)?;
                }
                check_memory(
                    self.shard.as_ref().unwrap(),
                    &self.live.slots[slot],
                    self.names.iter().map(String::as_str),
                )?;
            }
            Op::BulkRemove { slot, start, len } => {
                for i in 0..len {
                    self.remove(slot, FIXED.len() + (start + i) % BULK)?;
                }
                check_memory(
                    self.shard.as_ref().unwrap(),
                    &self.live.slots[slot],
                    self.names.iter().map(String::as_str),
                )?;
            }
            Op::WriteMany { slot, entries, mode } => {
                self.write_many(slot, &entries, mode)?;
                let gets: Vec<String> = entries.iter().map(|(p, _)| self.names[*p].clone()).collect();
                check_memory(self.shard.as_ref().unwrap(), &self.live.slots[slot], gets.iter().map(String::as_str))?;
            }
            Op::Checkpoint => {
                self.commit()?;
                ok(self.shard().checkpoint())?;
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, true)?;
            }
            Op::Repack { budget } => {
                // Move every other leaf shown: which ones is the allocator's call.
                let mut pick = false;
                let done = self.shard().repack_step(budget, |_| {
                    pick = !pick;
                    pick
                });
                prop_assert!(done.moved <= done.visited && done.visited <= budget);
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, false)?;
            }
            Op::Commit => {
                self.commit()?;
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, false)?;
            }
            Op::Seal => {
                self.seal()?;
                // Point reads, counts, ranks and lists see sealed, unwritten
                // batches (and the overlays they froze for runs).
                let shard = self.shard.as_ref().unwrap();
                for ob in &self.live.slots {
                    check_memory(shard, ob, self.names.iter().map(String::as_str))?;
                    check_lists(shard, ob)?;
                }
            }
            Op::Land => {
                self.land()?;
                let shard = self.shard.as_ref().unwrap();
                for ob in &self.live.slots {
                    check_memory(shard, ob, self.names.iter().map(String::as_str))?;
                }
            }
            Op::CommitAndList => {
                self.commit()?;
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, true)?;
            }
            Op::Reopen { wrong_branching } => {
                self.commit()?;
                if wrong_branching {
                    drop(self.shard.take());
                    let wanted = if self.options.branching == 16 { 2 } else { 16 };
                    let options = ShardOptions { branching: wanted, ..self.options.clone() };
                    match Shard::open(self.dir.path(), options) {
                        Err(ShardError::BranchingMismatch { stored, wanted: w }) => {
                            prop_assert_eq!((stored, w), (self.options.branching, wanted));
                        }
                        Err(other) => return Err(TestCaseError::fail(format!("wrong branching: {other:?}"))),
                        Ok(_) => return Err(TestCaseError::fail("opened with a wrong branching factor")),
                    }
                }
                self.reopen()?;
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, true)?;
            }
            Op::Crash => {
                // Sealed batches never written die with the process, though
                // their dense changes were reported at seal: take this
                // shard's share of the dense indexes back to what it holds
                // after reopening, as the server does when it recovers.
                if self.staged {
                    self.seal()?; // the server seals everything before it recovers
                }
                self.sealed.clear();
                self.sealed_state = None;
                self.crash_and_reopen()?;
            }
            Op::CrashAfterSync => {
                if self.staged {
                    self.seal()?;
                }
                if !self.sealed.is_empty() {
                    let mut written = Vec::new();
                    for batch in std::mem::take(&mut self.sealed) {
                        written.push(ok(batch.write())?);
                    }
                    ok(self.shard().durability_handle().sync())?;
                    drop(written); // the process dies before any run is written
                    self.committed = self.sealed_state.take().expect("sealed state");
                }
                self.crash_and_reopen()?;
                // Runs rebuilt from the log are written as usual afterwards.
                self.commit()?;
                ok(self.shard().checkpoint())?;
                check_all(self.shard.as_ref().unwrap(), &self.live, &self.names, true)?;
            }
            Op::DropBoard { slot, order, ties } => {
                self.commit()?;
                let old = self.live.slots[slot].clone();
                let existed = ok(self.shard().drop_board(old.board.id))?;
                prop_assert_eq!(existed, self.live.known.remove(&old.board.id).is_some(), "drop_board result");
                let id = self.next_board_id;
                self.next_board_id += 1;
                self.live.slots[slot] = new_board(id, order, ties);
                self.dense[slot] = DenseIndex::new(self.options.branching).unwrap();
                self.committed = self.live.clone();
                // Nothing of the old board answers any more.
                let gone = OBoard { board: old.board, players: BTreeMap::new() };
                let shard = self.shard.as_ref().unwrap();
                check_memory(shard, &gone, self.names.iter().map(String::as_str))?;
                check_lists(shard, &gone)?;
                check_all(shard, &self.live, &self.names, true)?;
            }
        }
        Ok(())
    }
}

pub fn run(configs: Vec<(Order, Ties)>, knobs: Knobs, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let branching = knobs.branching;
    let defaults = ShardOptions::default();
    // `..defaults` keeps this compiling when options grow.
    #[allow(clippy::needless_update)]
    let options = ShardOptions {
        branching,
        durability: if knobs.sync { Durability::Sync } else { Durability::Buffered },
        cache_bytes: 1 << 20,
        checkpoint_every: knobs.checkpoint_every.unwrap_or(defaults.checkpoint_every),
        memtable_bytes: if knobs.small_memtable { 32 << 10 } else { defaults.memtable_bytes },
        cached_players: knobs.cached_players.unwrap_or(defaults.cached_players),
        run_every: knobs.run_every.unwrap_or(defaults.run_every),
        checkpoint_slice_leaves: knobs.checkpoint_slice_leaves.unwrap_or(defaults.checkpoint_slice_leaves),
        ..defaults
    };
    let shard = ok(Shard::open(dir.path(), options.clone()))?;
    let slots: Vec<OBoard> =
        configs.iter().enumerate().map(|(i, &(order, ties))| new_board(i as u64 + 1, order, ties)).collect();
    let state = State { slots, known: BTreeMap::new(), max_seq: 0, max_board_id: 0 };
    let mut run = Run {
        dir,
        names: names(),
        shard: Some(shard),
        committed: state.clone(),
        live: state,
        staged: false,
        staged_writes: 0,
        sealed: Vec::new(),
        sealed_state: None,
        dense: (0..SLOTS).map(|_| DenseIndex::new(branching).unwrap()).collect(),
        seq: 0,
        next_board_id: SLOTS as u64 + 1,
        options,
    };
    check_all(run.shard.as_ref().unwrap(), &run.live, &run.names, true)?;
    for op in ops {
        run.apply(op)?;
    }
    // Finally: everything committed, read back, and again after a reopen.
    run.apply(Op::CommitAndList)?;
    run.apply(Op::Reopen { wrong_branching: false })?;
    Ok(())
}
