//! Sustained writes with small memtables never hang the storage.
//!
//! fjall 3.1 rotated a full memtable by queueing a request to its worker on
//! every write batch, on a bounded queue the worker itself must send to when
//! it handles one: a flood of batches while the worker was busy deadlocked
//! it, and every later write with it. The shard now rotates memtables itself
//! (see `Memtables` in `shard.rs`). This drives such a flood; the deadlock
//! also needs a long compaction at the wrong moment, so it is not reproduced
//! on demand, but the test fails if the writes stall, if a memtable is not
//! rotated once full, or if anything written is missing after a reopen.
//!
//! Shutting down flushes the memtables; a flush that fails (here: the data
//! dir is removed under the shard) must end the shutdown, not hang it.

use std::sync::mpsc;
use std::time::Duration;

use rankd_shards::{
    Board, BoardConfig, Durability, Mode, Order, Shard, ShardOptions, Ties, TreeId, Window, MEMTABLE_OVERRUN,
};

const PLAYERS: u64 = 300_000;
const MEMTABLE: u64 = 256 << 10;

fn board() -> Board {
    let config = BoardConfig {
        order: Order::Desc,
        ties: Ties::Competition,
        windows: vec![Window::All],
        keep: 1,
        fields: Vec::new(),
    };
    Board { id: 1, name: "flood".into(), config: config.into() }
}

fn tree() -> TreeId {
    TreeId { board: 1, window: Window::All.code(), period: 0 }
}

#[test]
fn a_flood_of_small_batches_does_not_hang_storage() {
    let dir = tempfile::tempdir().unwrap();
    let options =
        ShardOptions { memtable_bytes: MEMTABLE, durability: Durability::Buffered, ..ShardOptions::default() };
    let (done, finished) = mpsc::channel();
    let path = dir.path().to_path_buf();
    let worker_options = options.clone();
    // The writes run on their own thread: a hang shows as a timeout here,
    // not as a test binary that never ends.
    std::thread::spawn(move || {
        let result = (|| -> Result<(), rankd_shards::ShardError> {
            let mut shard = Shard::open(&path, worker_options)?;
            let board = board();
            for i in 0..PLAYERS {
                shard.write(&board, &format!("player-{i}"), i as i64, Mode::Set, i + 1)?;
                if i % 2 == 1 {
                    // One small batch: the flood.
                    shard.commit()?;
                    // A memtable may outgrow its size while fjall's worker is
                    // behind, within the overrun.
                    let largest = shard.largest_memtable_bytes();
                    assert!(
                        largest < (MEMTABLE_OVERRUN + 1) * MEMTABLE,
                        "a memtable grew to {largest} bytes: not rotated"
                    );
                }
            }
            shard.commit()?;
            Ok(())
        })();
        let _ = done.send(result);
    });
    match finished.recv_timeout(Duration::from_secs(120)) {
        Ok(result) => result.expect("writes succeed"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("storage hung: {PLAYERS} writes in small batches did not finish in 120 s")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the writing thread panicked (see above)"),
    }

    let shard = Shard::open(dir.path(), options).unwrap();
    assert_eq!(shard.count(tree()), PLAYERS);
    for i in (0..PLAYERS).step_by(997) {
        let record = shard.get(tree(), &format!("player-{i}")).unwrap().expect("record stored");
        assert_eq!(record.score, i as i64);
    }
}

#[test]
fn shutdown_returns_when_the_flush_cannot_happen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard");
    let mut shard = Shard::open(&path, ShardOptions::default()).unwrap();
    let board = board();
    for i in 0..1000u64 {
        shard.write(&board, &format!("player-{i}"), i as i64, Mode::Set, i + 1).unwrap();
    }
    shard.commit().unwrap();
    // The data dir is gone: fjall's flush cannot create its table and its worker stops.
    std::fs::remove_dir_all(&path).unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let result = shard.prepare_shutdown(Duration::from_secs(600));
        let _ = done.send(result.is_ok());
    });
    // Either outcome is fine (an error is logged, and the journal would be
    // replayed); waiting out the 600 s flush deadline, or forever, is not.
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(_) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("shutdown hung on a flush that cannot happen"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("shutdown panicked (see above)"),
    }
}
