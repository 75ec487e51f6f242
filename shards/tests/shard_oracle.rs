//! A whole [`Shard`] against a plain-map oracle, over random operations:
//! writes in every mode (single and `write_many`), removes, commits,
//! checkpoints, reads (point, count, rank, lists), board drops, clean reopens
//! (persistence, and count trees rebuilt from checkpointed leaves plus the
//! replayed change log) and "crashes" (dropping the shard with writes still
//! staged, which must lose exactly the uncommitted batch). Batches may also
//! be sealed and written later, as the server's committer thread does: reads
//! in between must see them, and a crash before they are written loses them.
//! Storage knobs vary per case: branching factor, durability, checkpoint
//! interval, memtable size, record cache.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::key::{list_position, list_position_of_tree_key, score_key, tiebreak, tree_key};
use rankd_shards::tree::BRANCHINGS;
use rankd_shards::{
    Amount, Board, BoardConfig, DenseChange, DenseIndex, Direction, Durability, Mode, Order, Record, SealedBatch,
    Shard, ShardError, ShardOptions, Ties, TreeId, Upcoming, UpcomingWrite, Window,
};

/// Named players: updates keep hitting the same few, and the names probe the
/// tiebreak (shared 8-byte prefixes, a trailing NUL, multi-byte UTF-8).
const FIXED: [&str; 12] =
    ["a", "a\u{0}", "b", "abcdefgh", "abcdefgh1", "abcdefgh2", "abcdefgi", "é", "日本語の名前", "🎮", "\u{7f}", "Z"];
/// Extra players for bulk writes: enough to burst count-tree leaves.
const BULK: usize = 100;
const SLOTS: usize = 3;

fn names() -> Vec<String> {
    FIXED
        .iter()
        .map(|s| s.to_string())
        .chain((0..BULK).map(|i| if i % 3 == 0 { format!("abcdefgh{i}") } else { format!("bulk{i:03}") }))
        .collect()
}

fn tid(board: u64) -> TreeId {
    TreeId { board, window: Window::All.code(), period: 0 }
}

fn ok<T>(r: Result<T, ShardError>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("unexpected shard error: {e:?}")))
}

// ---------------------------------------------------------------- oracle

#[derive(Debug, Clone)]
struct OBoard {
    board: Board,
    players: BTreeMap<String, Record>,
}

#[derive(Debug, Clone)]
struct State {
    slots: Vec<OBoard>,
    /// Boards whose config the shard holds (it saw a successful write).
    known: BTreeMap<u64, Board>,
    max_seq: u64,
    max_board_id: u64,
}

/// Is `a` strictly better than `b`?
fn better(order: Order, a: i64, b: i64) -> bool {
    match order {
        Order::Desc => a > b,
        Order::Asc => a < b,
    }
}

/// List order, written independently of the key layouts.
fn list_cmp(cfg: &BoardConfig, a: (&str, &Record), b: (&str, &Record)) -> Ordering {
    let by_score = match cfg.order {
        Order::Desc => b.1.score.cmp(&a.1.score),
        Order::Asc => a.1.score.cmp(&b.1.score),
    };
    by_score.then_with(|| match cfg.ties {
        Ties::Ordinal => a.1.seq.cmp(&b.1.seq).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())),
        Ties::Competition | Ties::Dense => a.0.as_bytes().cmp(b.0.as_bytes()),
    })
}

fn sorted(ob: &OBoard) -> Vec<(String, Record)> {
    let mut v: Vec<(String, Record)> = ob.players.iter().map(|(n, r)| (n.clone(), *r)).collect();
    v.sort_by(|a, b| list_cmp(&ob.board.config, (&a.0, &a.1), (&b.0, &b.1)));
    v
}

fn player_tree_key(cfg: &BoardConfig, name: &str, r: &Record) -> u128 {
    tree_key(score_key(r.score, cfg.order), tiebreak(cfg.ties, name, r.seq))
}

/// What a write does to the oracle: `Ok(stored)` or `Err(())` on overflow
/// (and then nothing changes).
fn oracle_write(ob: &mut OBoard, name: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ()> {
    let order = ob.board.config.order;
    let old = ob.players.get(name).copied();
    let new = match (mode, old) {
        (Mode::Set, _) | (Mode::Best | Mode::Incr, None) => score,
        (Mode::Best, Some(o)) => {
            if better(order, score, o.score) {
                score
            } else {
                o.score
            }
        }
        (Mode::Incr, Some(o)) => o.score.checked_add(score).ok_or(())?,
    };
    if old.map(|o| o.score) != Some(new) {
        ob.players.insert(name.to_string(), Record { score: new, seq });
    }
    Ok(new)
}

// ---------------------------------------------------------------- checks

const PROBES: [i64; 11] = [i64::MIN, i64::MIN + 1, -3, -1, 0, 1, 2, 3, 50, i64::MAX - 1, i64::MAX];

/// Everything answered from memory (count trees, staged players): valid with
/// or without an open batch. `gets` are the names whose `get` is checked.
fn check_memory<'a>(shard: &Shard, ob: &OBoard, gets: impl IntoIterator<Item = &'a str>) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let tree = tid(ob.board.id);
    let gets: Vec<&str> = gets.into_iter().collect();
    // As the server does before ranks and counts: a look ahead that must
    // change nothing, for players present or not.
    let probe_keys: Vec<u128> = PROBES.iter().map(|&score| tree_key(score_key(score, cfg.order), 0)).collect();
    shard.prefetch(
        gets.iter()
            .map(|&player| Upcoming::Rank { tree, player, ties: cfg.ties, order: cfg.order })
            .chain([Upcoming::CountBefore { tree, keys: &probe_keys }]),
    );
    for name in gets {
        prop_assert_eq!(
            ok(shard.get(tree, name))?,
            ob.players.get(name).copied(),
            "get {:?} on board {}",
            name,
            ob.board.id
        );
    }
    prop_assert_eq!(shard.count(tree), ob.players.len() as u64, "count on board {}", ob.board.id);

    // Distinct scores with their player counts.
    let mut groups: BTreeMap<u64, u64> = BTreeMap::new();
    for r in ob.players.values() {
        *groups.entry(score_key(r.score, cfg.order)).or_default() += 1;
    }
    let score_counts = shard.score_counts(tree);
    prop_assert_eq!(&score_counts, &groups.iter().map(|(k, n)| (*k, *n)).collect::<Vec<_>>(), "score_counts");
    let distinct: BTreeSet<i64> = ob.players.values().map(|r| r.score).collect();

    // Every player's own tree key and its rank under the board's tie rule.
    let list = sorted(ob);
    let keys: Vec<u128> = list.iter().map(|(n, r)| player_tree_key(cfg, n, r)).collect();
    let before = shard.count_before(tree, &keys);
    prop_assert_eq!(before.len(), keys.len());
    for (i, ((name, r), k)) in list.iter().zip(&keys).enumerate() {
        let expected = keys.iter().filter(|q| *q < k).count() as u64;
        prop_assert_eq!(before[i], expected, "count_before own key of {:?}", name);
        let sk = score_key(r.score, cfg.order);
        let rank = match cfg.ties {
            Ties::Competition => 1 + shard.count_before(tree, &[tree_key(sk, 0)])[0],
            Ties::Ordinal => 1 + before[i],
            Ties::Dense => 1 + score_counts.iter().take_while(|(s, _)| *s < sk).count() as u64,
        };
        let expected_rank = match cfg.ties {
            Ties::Competition => 1 + ob.players.values().filter(|q| better(cfg.order, q.score, r.score)).count(),
            Ties::Ordinal => 1 + i,
            Ties::Dense => 1 + distinct.iter().filter(|s| better(cfg.order, **s, r.score)).count(),
        } as u64;
        prop_assert_eq!(rank, expected_rank, "{:?} rank of {:?} ({:?})", cfg.ties, name, r);
    }

    // Score probes: strictly better, and better-or-equal (ordinal rank_of_score).
    for s in PROBES.iter().copied().chain(distinct.iter().copied()) {
        let sk = score_key(s, cfg.order);
        let got = shard.count_before(tree, &[tree_key(sk, 0), tree_key(sk, u64::MAX)]);
        let strictly = ob.players.values().filter(|q| better(cfg.order, q.score, s)).count() as u64;
        let or_equal = ob.players.values().filter(|q| !better(cfg.order, s, q.score)).count() as u64;
        prop_assert_eq!(got, vec![strictly, or_equal], "count_before probes for score {}", s);
    }
    Ok(())
}

/// List reads and `check`: need a committed shard.
fn check_lists(shard: &Shard, ob: &OBoard) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let (order, ties) = (cfg.order, cfg.ties);
    let tree = tid(ob.board.id);
    let expected = sorted(ob);
    let entry_pos = |(n, r): &(String, Record)| list_position(ties, score_key(r.score, order), r.seq, n);
    let view = |entries: &[rankd_shards::ListEntry]| -> Vec<(String, i64, u64, Vec<u8>)> {
        entries.iter().map(|e| (e.player.clone(), e.score, e.seq, e.position.clone())).collect()
    };
    let want = |slice: &[(String, Record)]| -> Vec<(String, i64, u64, Vec<u8>)> {
        slice
            .iter()
            .map(|e| (e.0.clone(), e.1.score, if ties == Ties::Ordinal { e.1.seq } else { 0 }, entry_pos(e)))
            .collect()
    };

    let full = ok(shard.list(tree, ties, order, &[], Direction::Forward, 100_000))?;
    prop_assert_eq!(view(&full), want(&expected), "full forward list of board {} ({:?})", ob.board.id, cfg);
    for pair in full.windows(2) {
        prop_assert!(pair[0].position < pair[1].position, "positions not increasing");
    }
    let top3 = ok(shard.list(tree, ties, order, &[], Direction::Forward, 3))?;
    prop_assert_eq!(view(&top3), want(&expected[..expected.len().min(3)]));
    prop_assert!(ok(shard.list(tree, ties, order, &[], Direction::Backward, 10))?.is_empty());

    let keys: Vec<u128> = expected.iter().map(|(n, r)| player_tree_key(cfg, n, r)).collect();
    for (i, e) in expected.iter().enumerate() {
        let pos = entry_pos(e);
        // Better players, nearest first.
        let back = ok(shard.list(tree, ties, order, &pos, Direction::Backward, 1_000))?;
        let mut better_ones = expected[..i].to_vec();
        better_ones.reverse();
        prop_assert_eq!(view(&back), want(&better_ones), "backward from {:?}", e.0);
        let back2 = ok(shard.list(tree, ties, order, &pos, Direction::Backward, 2))?;
        prop_assert_eq!(view(&back2), want(&better_ones[..better_ones.len().min(2)]));
        // The player and worse ones.
        let fwd = ok(shard.list(tree, ties, order, &pos, Direction::Forward, 4))?;
        prop_assert_eq!(view(&fwd), want(&expected[i..(i + 4).min(expected.len())]), "forward from {:?}", e.0);
        // Seeking by tree key (how `top` finds a deep offset): lands on the
        // first entry whose tree key is not smaller, at index count_before.
        let k = keys[i];
        let first = keys.iter().position(|q| *q >= k).unwrap();
        prop_assert_eq!(shard.count_before(tree, &[k])[0], first as u64);
        let seek = ok(shard.list(tree, ties, order, &list_position_of_tree_key(ties, k), Direction::Forward, 2))?;
        prop_assert_eq!(
            view(&seek),
            want(&expected[first..(first + 2).min(expected.len())]),
            "seek to key of {:?}",
            e.0
        );
    }
    for s in PROBES {
        let k = tree_key(score_key(s, order), 0);
        let first = keys.iter().position(|q| *q >= k).unwrap_or(keys.len());
        prop_assert_eq!(shard.count_before(tree, &[k])[0], first as u64);
        let seek = ok(shard.list(tree, ties, order, &list_position_of_tree_key(ties, k), Direction::Forward, 2))?;
        prop_assert_eq!(view(&seek), want(&expected[first..(first + 2).min(expected.len())]), "seek to score {}", s);
    }
    Ok(())
}

/// The whole shard against the oracle (no staged writes for the list part
/// unless `lists` is false).
fn check_all(shard: &Shard, st: &State, names: &[String], lists: bool) -> Result<(), TestCaseError> {
    for ob in &st.slots {
        check_memory(shard, ob, names.iter().map(String::as_str))?;
        if lists {
            check_lists(shard, ob)?;
        }
    }
    let configs: BTreeMap<u64, &BoardConfig> = shard.board_configs().collect();
    let known: BTreeMap<u64, &BoardConfig> = st.known.iter().map(|(&id, b)| (id, &*b.config)).collect();
    prop_assert_eq!(configs, known, "board_configs()");
    prop_assert_eq!(shard.max_seq(), st.max_seq, "max_seq");
    prop_assert_eq!(shard.max_board_id(), st.max_board_id, "max_board_id");
    for t in shard.tree_ids() {
        prop_assert!(st.known.contains_key(&t.board), "tree {:?} of a board the shard should not hold", t);
        prop_assert_eq!((t.window, t.period), (Window::All.code(), 0));
    }
    for ob in &st.slots {
        if !ob.players.is_empty() {
            prop_assert!(shard.tree_ids().any(|t| t == tid(ob.board.id)), "tree of board {} missing", ob.board.id);
        }
    }
    if lists {
        ok(shard.check())?;
    }
    Ok(())
}

/// The engine-wide dense index (fed by commits) against the oracle.
fn check_dense(index: &DenseIndex, ob: &OBoard) -> Result<(), TestCaseError> {
    let cfg = &ob.board.config;
    let distinct: BTreeSet<i64> = ob.players.values().map(|r| r.score).collect();
    for s in PROBES.iter().copied().chain(distinct.iter().copied()) {
        let expected = distinct.iter().filter(|d| better(cfg.order, **d, s)).count() as u64;
        prop_assert_eq!(index.distinct_before(score_key(s, cfg.order)), expected, "dense index before score {}", s);
    }
    Ok(())
}

// ---------------------------------------------------------------- ops

#[derive(Debug, Clone)]
enum Op {
    Write {
        slot: usize,
        player: usize,
        score: i64,
        mode: Mode,
    },
    Remove {
        slot: usize,
        player: usize,
    },
    /// Many players at once (enough to burst tree leaves).
    Bulk {
        slot: usize,
        start: usize,
        scores: Vec<i64>,
        mode: Mode,
    },
    BulkRemove {
        slot: usize,
        start: usize,
        len: usize,
    },
    /// `write_many`: all or none (an `incr` overflow anywhere stages nothing).
    WriteMany {
        slot: usize,
        entries: Vec<(usize, i64)>,
        mode: Mode,
    },
    Commit,
    /// Take the open batch out as a sealed batch, not written yet.
    Seal,
    /// Write the sealed batches, in order, and sync them.
    Land,
    /// Commit, then write the count-tree checkpoint (leaves) and trim the log.
    Checkpoint,
    /// A step of the leaf-repacking pass the last checkpoint started (moves
    /// tree leaves in memory; nothing a reader sees may change).
    Repack {
        budget: usize,
    },
    CommitAndList,
    /// Commit, drop the shard, reopen it (first with a wrong branching factor
    /// if asked, which must be refused).
    Reopen {
        wrong_branching: bool,
    },
    /// Drop the shard with the batch still open, reopen: the batch is lost.
    Crash,
    /// Seal the open batch, write and fsync every sealed batch, then drop
    /// the shard before any of their runs (or checkpoint leaves) is written:
    /// every batch survives, from the log alone.
    CrashAfterSync,
    /// Commit, drop the slot's board; the slot gets a fresh board id.
    DropBoard {
        slot: usize,
        order: Order,
        ties: Ties,
    },
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![Just(Order::Desc), Just(Order::Asc)]
}

fn ties() -> impl Strategy<Value = Ties> {
    prop_oneof![Just(Ties::Competition), Just(Ties::Dense), Just(Ties::Ordinal)]
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Set), Just(Mode::Best), Just(Mode::Incr)]
}

fn score() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => -3i64..=3,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(0i64),
        1 => Just(-1i64),
        1 => i64::MIN..i64::MIN + 3,
        1 => i64::MAX - 2..=i64::MAX,
        1 => any::<i64>(),
    ]
}

fn player() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..FIXED.len(), 1 => FIXED.len()..FIXED.len() + BULK]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..SLOTS, player(), score(), mode()).prop_map(|(slot, player, score, mode)| Op::Write { slot, player, score, mode }),
        8 => (0..SLOTS, player()).prop_map(|(slot, player)| Op::Remove { slot, player }),
        2 => (0..SLOTS, 0..BULK, proptest::collection::vec(prop_oneof![3 => -40i64..40, 1 => score()], 20..100), mode())
            .prop_map(|(slot, start, scores, mode)| Op::Bulk { slot, start, scores, mode }),
        1 => (0..SLOTS, 0..BULK, 1..BULK).prop_map(|(slot, start, len)| Op::BulkRemove { slot, start, len }),
        3 => (0..SLOTS, proptest::collection::vec((player(), score()), 0..6), mode())
            .prop_map(|(slot, entries, mode)| Op::WriteMany { slot, entries, mode }),
        8 => Just(Op::Commit),
        4 => Just(Op::Seal),
        2 => Just(Op::Land),
        1 => Just(Op::Checkpoint),
        2 => (0usize..6).prop_map(|budget| Op::Repack { budget }),
        3 => Just(Op::CommitAndList),
        2 => any::<bool>().prop_map(|w| Op::Reopen { wrong_branching: w }),
        1 => Just(Op::Crash),
        1 => Just(Op::CrashAfterSync),
        1 => (0..SLOTS, order(), ties()).prop_map(|(slot, order, ties)| Op::DropBoard { slot, order, ties }),
    ]
}

// ---------------------------------------------------------------- the run

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

fn new_board(id: u64, order: Order, ties: Ties) -> OBoard {
    OBoard {
        board: Board {
            id,
            name: format!("board:{id}").into(),
            config: BoardConfig { order, ties, windows: vec![Window::All], keep: 1, fields: Vec::new() }.into(),
        },
        players: BTreeMap::new(),
    }
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

/// Storage knobs of one run.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    branching: u32,
    sync: bool,
    /// Logged tree changes between checkpoints: small values checkpoint often,
    /// the default leaves everything to log replay on reopen.
    checkpoint_every: Option<u64>,
    /// A tiny memtable makes fjall flush to disk segments mid-run.
    small_memtable: bool,
    /// Player records cached in memory: none, a few in one table or in two
    /// (14 + 3: keys split between tables, both evicting), or the default.
    cached_players: Option<usize>,
    /// Changed players that make the overlay be written as runs: small
    /// values write runs all the time, the default almost never here.
    run_every: Option<usize>,
    /// Leaves copied per sealed batch for a checkpoint: small values spread
    /// a checkpoint over many batches, with writes, crashes and reopens
    /// between its slices.
    checkpoint_slice_leaves: Option<usize>,
}

prop_compose! {
    fn knobs()(
        branching in proptest::sample::select(BRANCHINGS.to_vec()),
        sync in proptest::bool::weighted(0.25),
        checkpoint_every in prop_oneof![Just(None), Just(Some(1)), Just(Some(3)), Just(Some(17)), Just(Some(60))],
        small_memtable in proptest::bool::weighted(0.25),
        cached_players in prop_oneof![Just(None), Just(Some(0)), Just(Some(5)), Just(Some(17))],
        run_every in prop_oneof![Just(None), Just(Some(1)), Just(Some(4)), Just(Some(30))],
        checkpoint_slice_leaves in prop_oneof![Just(None), Just(Some(1)), Just(Some(2)), Just(Some(5))],
    ) -> Knobs {
        Knobs { branching, sync, checkpoint_every, small_memtable, cached_players, run_every, checkpoint_slice_leaves }
    }
}

fn run(configs: Vec<(Order, Ties)>, knobs: Knobs, ops: Vec<Op>) -> Result<(), TestCaseError> {
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

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        // Only this file may be created: no regression files next to it.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn shard_matches_oracle(
        configs in proptest::collection::vec((order(), ties()), SLOTS),
        knobs in knobs(),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        run(configs, knobs, ops)?;
    }
}

/// A fixed sequence over the edge cases, easy to read when it fails.
#[test]
fn known_sequence() {
    use Op::*;
    let ops = vec![
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set },
        Write { slot: 0, player: 0, score: 1, mode: Mode::Incr }, // overflow: nothing changes
        Write { slot: 0, player: 1, score: i64::MAX, mode: Mode::Best },
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set }, // unchanged: keeps its seq
        CommitAndList,
        Remove { slot: 0, player: 0 },
        Write { slot: 0, player: 0, score: i64::MAX, mode: Mode::Set }, // back: new seq
        Write { slot: 1, player: 3, score: i64::MIN, mode: Mode::Set },
        Write { slot: 1, player: 4, score: i64::MIN, mode: Mode::Set },
        Write { slot: 1, player: 5, score: -1, mode: Mode::Incr },
        Write { slot: 1, player: 5, score: i64::MIN, mode: Mode::Incr },
        Write { slot: 1, player: 5, score: -1, mode: Mode::Incr }, // overflow
        Write { slot: 2, player: 0, score: i64::MAX, mode: Mode::Set }, // dense board
        Seal,                                                      // reports its dense change, never written:
        Write { slot: 2, player: 1, score: 3, mode: Mode::Set },
        Crash, // the dense index must forget it
        Write { slot: 0, player: 2, score: 9, mode: Mode::Set },
        Seal,
        Write { slot: 0, player: 2, score: 8, mode: Mode::Set },
        CrashAfterSync, // both batches durable, their runs never written
        Write { slot: 2, player: 7, score: 0, mode: Mode::Set },
        Write { slot: 2, player: 8, score: 0, mode: Mode::Set },
        Bulk { slot: 2, start: 0, scores: (0..90).map(|i| i % 7).collect(), mode: Mode::Set },
        Reopen { wrong_branching: true },
        BulkRemove { slot: 2, start: 10, len: 70 },
        WriteMany { slot: 2, entries: vec![(7, 1), (7, 2), (8, -5)], mode: Mode::Incr },
        WriteMany { slot: 2, entries: vec![(7, 1), (7, i64::MAX), (8, 1)], mode: Mode::Incr }, // overflow: none
        Commit,
        Checkpoint,
        Repack { budget: 1 },
        Write { slot: 2, player: 9, score: 4, mode: Mode::Set },
        Repack { budget: 5 },
        DropBoard { slot: 1, order: Order::Asc, ties: Ties::Dense },
        Write { slot: 1, player: 9, score: 5, mode: Mode::Best },
        Write { slot: 1, player: 9, score: 7, mode: Mode::Best },
        Reopen { wrong_branching: false },
    ];
    for (order_, ties_) in [(Order::Desc, Ties::Ordinal), (Order::Asc, Ties::Competition), (Order::Desc, Ties::Dense)] {
        for (branching, checkpoint_every, checkpoint_slice_leaves) in
            [(2, Some(1), None), (16, None, None), (256, Some(5), None), (4, Some(2), Some(1))]
        {
            let configs = vec![(order_, ties_), (Order::Asc, ties_), (order_, Ties::Dense)];
            let knobs = Knobs {
                branching,
                sync: false,
                checkpoint_every,
                small_memtable: false,
                cached_players: Some(3),
                run_every: Some(2),
                checkpoint_slice_leaves,
            };
            if let Err(e) = run(configs, knobs, ops.clone()) {
                panic!("{order_:?} {ties_:?} {knobs:?}: {e}");
            }
        }
    }
}

/// A checkpoint starts a repacking pass over every tree; steps finish it,
/// each leaf moved once, and ranks stay what they were.
#[test]
fn checkpoint_starts_a_repacking_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
    assert!(!shard.is_repacking());
    let boards: Vec<OBoard> = (1..=2).map(|id| new_board(id, Order::Desc, Ties::Ordinal)).collect();
    for (i, score) in (0..3000i64).map(|i| (i, i * 7919 % 1000)) {
        let board = &boards[i as usize % 2].board;
        shard.write(board, &format!("p{i}"), score, Mode::Set, i as u64 + 1).unwrap();
    }
    shard.commit().unwrap();
    let ranks = |shard: &Shard| -> Vec<u64> {
        let keys: Vec<u128> = (0..1000).map(|s| tree_key(score_key(s, Order::Desc), 0)).collect();
        boards.iter().flat_map(|b| shard.count_before(tid(b.board.id), &keys)).collect()
    };
    let before = ranks(&shard);
    assert_eq!(shard.repack_step(100, |_| true).visited, 0, "no pass before a checkpoint");

    shard.checkpoint().unwrap();
    assert!(shard.is_repacking());
    let mut moved = 0;
    let mut steps = 0;
    while shard.is_repacking() {
        let done = shard.repack_step(7, |_| true);
        assert!(done.visited <= 7 && done.moved == done.visited);
        moved += done.moved;
        steps += 1;
        assert!(steps < 10_000, "the pass never ends");
    }
    // 1500 players a tree, at most 64 keys a leaf: dozens of leaves each.
    assert!(moved > 2 * 1500 / 64, "moved only {moved} leaves");
    assert!(steps <= moved / 7 + 3, "{steps} steps for {moved} leaves");
    assert_eq!(ranks(&shard), before);
    shard.check().unwrap();
}
