//! One run: a shard and the oracle side by side under a moving clock, each
//! operation applied to both (with expiry, drains, reopens and crashes) and
//! checked after.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::{
    Amount, Board, BoardConfig, Direction, Mode, Shard, ShardError, ShardOptions, TreeId, Upcoming, UpcomingWrite,
    Window,
};

use crate::calendar::{is_expired, period, tid};
use crate::checks::{check_board, check_gone, check_tree};
use crate::ops::{names, options, Advance, Knobs, Op, BULK, FIXED};
use crate::oracle::OBoard;
use crate::{ok, scratch_dir};

struct Run {
    dir: tempfile::TempDir,
    options: ShardOptions,
    names: Vec<String>,
    shard: Option<Shard>,
    live: Vec<OBoard>,
    committed: Vec<OBoard>,
    staged: bool,
    now: i64,
    seq: u64,
    /// Expired periods whose keys may still be stored, with the players they ever held.
    pending: BTreeMap<TreeId, usize>,
    /// Expired periods that a drain has deleted: they must never come back.
    drained: BTreeSet<TreeId>,
    /// A reopen brought pending periods back (partly deleted) and no `expire`
    /// has run since: `check` may legitimately see them half-deleted.
    half_deleted: bool,
}

impl Run {
    fn shard(&mut self) -> &mut Shard {
        self.shard.as_mut().expect("shard open")
    }

    fn board_of(&self, tree: TreeId) -> Board {
        self.live.iter().find(|ob| ob.board.id == tree.board).expect("board of tree").board.clone()
    }

    fn gets(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn take_expired(&mut self) {
        let now = self.now;
        for ob in &mut self.live {
            for (tree, ever) in ob.take_expired(now) {
                assert!(!self.drained.contains(&tree), "a drained period came back in the oracle: {tree:?}");
                let e = self.pending.entry(tree).or_insert(0);
                *e = (*e).max(ever);
            }
        }
    }

    fn write(&mut self, slot: usize, player: usize, score: i64, mode: Mode) -> Result<(), TestCaseError> {
        self.seq += 1;
        let seq = self.seq;
        let now = self.now;
        let name = self.names[player].clone();
        let board = self.live[slot].board.clone();
        let expected = self.live[slot].write(now, &name, score, mode, seq);
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
                prop_assert_eq!(stored, want, "stored score of {:?} {:?} {} at {}", name, mode, score, now);
                self.staged = true;
            }
            (Err(()), Err(ShardError::Overflow)) => {}
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "write {name:?} {mode:?} {score} seq {seq} at {now} on {board:?}: oracle {want:?}, shard {got:?}"
                )))
            }
        }
        Ok(())
    }

    /// In-memory reads of the current periods for a few players (valid with
    /// writes staged).
    fn check_current(&self, slot: usize, names: &[&str]) -> Result<(), TestCaseError> {
        let ob = &self.live[slot];
        let shard = self.shard.as_ref().unwrap();
        for &w in &ob.board.config.windows {
            let tree = tid(&ob.board, w, period(w, self.now));
            check_tree(shard, &ob.board.config, tree, &ob.players(tree), names, false)?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), TestCaseError> {
        let staged = self.staged;
        let shard = self.shard.as_mut().expect("shard open");
        prop_assert_eq!(shard.has_staged(), staged, "has_staged");
        if staged {
            prop_assert!(matches!(shard.expire(3), Err(ShardError::NeedsCommit)), "expire with staged writes");
        }
        ok(shard.commit())?;
        self.committed = self.live.clone();
        self.staged = false;
        Ok(())
    }

    /// Everything readable equals the oracle; expired periods are gone from
    /// memory; drained ones are gone from storage too. Needs a committed shard.
    fn check_all(&self, what: &str) -> Result<(), TestCaseError> {
        let shard = self.shard.as_ref().unwrap();
        let gets = self.gets();
        for ob in &self.live {
            check_board(shard, ob, self.now, &gets, true)?;
        }
        for &tree in &self.drained {
            check_gone(shard, &self.board_of(tree), tree, &gets, what)?;
        }
        for t in shard.tree_ids() {
            let ob = self.live.iter().find(|ob| ob.board.id == t.board);
            prop_assert!(ob.is_some(), "{}: tree {:?} of an unknown board", what, t);
            let w = Window::from_code(t.window);
            prop_assert!(
                w.is_some_and(|w| ob.unwrap().board.config.windows.contains(&w)),
                "{}: tree {:?} of a window the board lacks",
                what,
                t
            );
        }
        if !self.half_deleted {
            ok(shard.check())?;
        }
        Ok(())
    }

    fn expire(&mut self, budget: usize, calls: usize) -> Result<(), TestCaseError> {
        let now = self.now;
        for _ in 0..calls {
            let newly = ok(self.shard().expire(budget))?;
            for tree in newly {
                let board = self.board_of(tree);
                prop_assert!(is_expired(&board, tree, now), "expire returned {:?}, not expired at {}", tree, now);
            }
        }
        self.half_deleted = false;
        let shard = self.shard.as_ref().unwrap();
        for t in shard.tree_ids() {
            let board = self.board_of(t);
            prop_assert!(!is_expired(&board, t, now), "expired {:?} still in tree_ids after expire at {}", t, now);
        }
        for &tree in self.pending.keys() {
            prop_assert_eq!(shard.count(tree), 0, "count of expired {:?} after expire", tree);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<(), TestCaseError> {
        const BUDGET: usize = 3;
        // Each pending period stores at most one player key and one index
        // key per player it ever held, and fewer leaves than that.
        let calls: usize = self.pending.values().map(|ever| (3 * ever + 1).div_ceil(BUDGET) + 2).sum::<usize>() + 2;
        self.expire(BUDGET, calls)?;
        let pending = std::mem::take(&mut self.pending);
        let gets = self.gets();
        let shard = self.shard.as_ref().unwrap();
        for &tree in pending.keys() {
            check_gone(shard, &self.board_of(tree), tree, &gets, "after drain")?;
        }
        self.drained.extend(pending.into_keys());
        Ok(())
    }

    fn reopen(&mut self) -> Result<(), TestCaseError> {
        drop(self.shard.take());
        let mut shard = ok(Shard::open(self.dir.path(), self.options.clone()))?;
        prop_assert!(!shard.has_staged());
        shard.set_time(self.now);
        // Drained periods left nothing in storage: no player, no index entry.
        let gets = self.gets();
        for &tree in &self.drained {
            let cfg = &self.board_of(tree).config;
            for &name in &gets {
                prop_assert_eq!(ok(shard.get(tree, name))?, None, "after reopen: get {:?} in drained {:?}", name, tree);
            }
            let list = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
            prop_assert!(list.is_empty(), "after reopen: index of drained {:?} holds {:?}", tree, list);
        }
        self.half_deleted = !self.pending.is_empty();
        self.shard = Some(shard);
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write { slot, player, score, mode } => {
                self.write(slot, player, score, mode)?;
                let name = self.names[player].clone();
                self.check_current(slot, &[&name])?;
            }
            Op::Remove { slot, player } => {
                let name = self.names[player].clone();
                let board = self.live[slot].board.clone();
                let now = self.now;
                let expected = self.live[slot].remove(now, &name);
                let got = ok(self.shard().remove(&board, &name))?;
                prop_assert_eq!(got, expected, "remove {:?} at {}", name, now);
                self.staged = true;
                self.check_current(slot, &[&name])?;
            }
            Op::WriteMany { slot, entries, mode } => {
                let board = self.live[slot].board.clone();
                let now = self.now;
                let mut batch = Vec::new();
                for &(player, score) in &entries {
                    self.seq += 1;
                    batch.push((self.names[player].clone(), Amount::Score(score), self.seq));
                }
                let mut after = self.live[slot].clone();
                let expected: Result<Vec<i64>, ()> = entries
                    .iter()
                    .zip(&batch)
                    .map(|(&(_, s), (n, _, seq))| after.write(now, n, s, mode, *seq))
                    .collect();
                let got = self.shard().write_many(&board, &batch, mode);
                match (expected, got) {
                    (Ok(want), Ok(stored)) => {
                        prop_assert_eq!(stored, want, "write_many {:?} {:?}", mode, batch);
                        self.live[slot] = after;
                        self.staged |= !batch.is_empty();
                    }
                    (Err(()), Err(ShardError::Overflow)) => {}
                    (want, got) => {
                        return Err(TestCaseError::fail(format!(
                            "write_many {mode:?} {batch:?} at {now}: oracle {want:?}, shard {got:?}"
                        )))
                    }
                }
                let names: Vec<String> = batch.iter().map(|e| e.0.clone()).collect();
                self.check_current(slot, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
            }
            Op::Bulk { slot, start, len, mode } => {
                for i in 0..len {
                    self.write(slot, FIXED.len() + (start + i) % BULK, (i % 5) as i64 - 2, mode)?;
                }
                let gets = self.gets();
                self.check_current(slot, &gets)?;
            }
            Op::Advance(adv) => {
                let now = adv.apply(self.now);
                prop_assert!(now >= self.now);
                self.now = now;
                self.shard().set_time(now);
                self.take_expired();
            }
            Op::Commit => {
                self.commit()?;
                self.check_all("after commit")?;
            }
            Op::Checkpoint => {
                self.commit()?;
                ok(self.shard().checkpoint())?;
                self.check_all("after checkpoint")?;
            }
            Op::Expire { budget, calls } => {
                self.commit()?;
                self.expire(budget, calls)?;
                self.check_all("after expire")?;
            }
            Op::Drain => {
                self.commit()?;
                self.drain()?;
                self.check_all("after drain")?;
            }
            Op::Reopen { drain_first } => {
                self.commit()?;
                if drain_first {
                    self.drain()?;
                }
                self.reopen()?;
                self.check_all("after reopen")?;
            }
            Op::Crash => {
                self.reopen()?;
                self.live = self.committed.clone();
                self.staged = false;
                self.take_expired();
                self.check_all("after crash")?;
            }
        }
        Ok(())
    }
}

pub fn run(configs: Vec<BoardConfig>, start: i64, knobs: Knobs, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let options = options(knobs);
    let dir = scratch_dir();
    let mut shard = ok(Shard::open(dir.path(), options.clone()))?;
    shard.set_time(start);
    let boards: Vec<OBoard> = configs
        .into_iter()
        .enumerate()
        .map(|(i, config)| OBoard {
            board: Board { id: i as u64 + 1, name: format!("b{i}").into(), config: config.into() },
            periods: BTreeMap::new(),
        })
        .collect();
    let mut run = Run {
        dir,
        options,
        names: names(),
        shard: Some(shard),
        committed: boards.clone(),
        live: boards,
        staged: false,
        now: start,
        seq: 0,
        pending: BTreeMap::new(),
        drained: BTreeSet::new(),
        half_deleted: false,
    };
    for op in ops {
        run.apply(op)?;
    }
    // Finally: far enough ahead that every periodic window has expired
    // periods, drained, and read back after a reopen.
    run.apply(Op::Commit)?;
    run.apply(Op::Advance(Advance::NextMonth(1)))?;
    run.apply(Op::Advance(Advance::Days(100)))?;
    run.apply(Op::Reopen { drain_first: true })?;
    Ok(())
}
