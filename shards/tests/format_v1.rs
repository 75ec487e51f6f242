//! A data dir written by rankd before runs (format v1: every batch wrote its
//! player records and index entries, and the change log held count-tree keys
//! only) opens with the current code, answers exactly what it held, and is
//! moved to the current log format on the way.
//!
//! The fixture in `fixtures/format-v1` was made by the v1 engine (commit
//! 4e86349) running [`fixture_ops`] with a checkpoint after step 449 and a
//! commit every 50 steps, then left as kill -9 leaves a process: nothing
//! flushed, half the steps in the change log and the journal. The journal's
//! preallocated zero tail was cut off to keep the fixture small (fjall reads
//! a journal up to its end).

use std::collections::BTreeMap;
use std::path::Path;

use rankd_shards::key::score_key;
use rankd_shards::{Board, BoardConfig, Direction, Mode, Order, Record, Shard, ShardOptions, Ties, TreeId, Window};

fn boards() -> Vec<Board> {
    [(Order::Desc, Ties::Competition), (Order::Asc, Ties::Ordinal), (Order::Desc, Ties::Dense)]
        .iter()
        .enumerate()
        .map(|(i, &(order, ties))| Board {
            id: i as u64 + 1,
            name: format!("b{}", i + 1).into(),
            config: BoardConfig { order, ties, windows: vec![Window::All], keep: 1, fields: Vec::new() }.into(),
        })
        .collect()
}

/// What the fixture's writer did, step by step: `(board index, player,
/// op)`, with the write's sequence being the step + 1.
enum FixtureOp {
    Remove,
    Write(i64, Mode),
}

fn fixture_ops() -> impl Iterator<Item = (usize, String, FixtureOp)> {
    (0..900u64).map(|step| {
        let player = format!("player:{}", (step * 37) % 211);
        let op = match step % 10 {
            7 => FixtureOp::Remove,
            8 => FixtureOp::Write((step % 13) as i64 - 6, Mode::Incr),
            9 => FixtureOp::Write((step % 29) as i64, Mode::Best),
            _ => FixtureOp::Write(((step * 7919) % 101) as i64 - 50, Mode::Set),
        };
        ((step % 3) as usize, player, op)
    })
}

/// The players of each board after [`fixture_ops`], by a plain map.
fn expected(boards: &[Board]) -> Vec<BTreeMap<String, Record>> {
    let mut out = vec![BTreeMap::new(); boards.len()];
    for (seq, (board, player, op)) in fixture_ops().enumerate() {
        let players: &mut BTreeMap<String, Record> = &mut out[board];
        let seq = seq as u64 + 1;
        match op {
            FixtureOp::Remove => {
                players.remove(&player);
            }
            FixtureOp::Write(score, mode) => {
                let old = players.get(&player).copied();
                let new = match (mode, old) {
                    (Mode::Set, _) | (_, None) => score,
                    (Mode::Incr, Some(o)) => o.score + score,
                    (Mode::Best, Some(o)) => match boards[board].config.order {
                        Order::Desc => o.score.max(score),
                        Order::Asc => o.score.min(score),
                    },
                };
                if old.map(|o| o.score) != Some(new) {
                    players.insert(player, Record { score: new, seq });
                }
            }
        }
    }
    out
}

fn tree(board: &Board) -> TreeId {
    TreeId { board: board.id, window: Window::All.code(), period: 0 }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every player's record, the count, and the whole list order of every board.
fn assert_holds(shard: &Shard, boards: &[Board], want: &[BTreeMap<String, Record>]) {
    for (board, players) in boards.iter().zip(want) {
        let tree = tree(board);
        assert_eq!(shard.count(tree), players.len() as u64, "count of {}", board.name);
        for p in 0..211 {
            let name = format!("player:{p}");
            assert_eq!(shard.get(tree, &name).unwrap(), players.get(&name).copied(), "{name} on {}", board.name);
        }
        let (order, ties) = (board.config.order, board.config.ties);
        let listed = shard.list(tree, ties, order, &[], Direction::Forward, 10_000).unwrap();
        let mut sorted: Vec<(&String, &Record)> = players.iter().collect();
        sorted.sort_by_key(|(name, r)| {
            let seq = if ties == Ties::Ordinal { r.seq } else { 0 };
            (score_key(r.score, order), seq, name.as_bytes().to_vec())
        });
        let got: Vec<(String, i64)> = listed.into_iter().map(|e| (e.player, e.score)).collect();
        let want: Vec<(String, i64)> = sorted.into_iter().map(|(n, r)| (n.clone(), r.score)).collect();
        assert_eq!(got, want, "list of {}", board.name);
    }
    shard.check().unwrap();
}

#[test]
fn a_v1_data_dir_opens_migrates_and_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v1"), dir.path());
    let boards = boards();
    let mut want = expected(&boards);
    assert!(want.iter().all(|players| players.len() > 150), "the sequence leaves many players");

    let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
    assert_holds(&shard, &boards, &want);

    // New writes go through the current format: logged, then written as
    // runs, and all of it survives a reopen (and one without a checkpoint).
    let options = ShardOptions { run_every: 16, ..ShardOptions::default() };
    drop(shard);
    shard = Shard::open(dir.path(), options.clone()).unwrap();
    let mut seq = 10_000;
    for (i, board) in boards.iter().enumerate() {
        for p in 0..40 {
            seq += 1;
            let name = format!("player:{}", p * 5);
            shard.write(board, &name, p * 3 - 40, Mode::Set, seq).unwrap();
            if want[i].get(&name).map(|r| r.score) != Some(p * 3 - 40) {
                want[i].insert(name, Record { score: p * 3 - 40, seq });
            }
        }
        shard.commit().unwrap();
    }
    assert_holds(&shard, &boards, &want);
    drop(shard);
    let shard = Shard::open(dir.path(), options).unwrap();
    assert_holds(&shard, &boards, &want);
}
