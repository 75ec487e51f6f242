//! The group-commit pipeline over a real shard: every batch submitted is
//! acknowledged once, in order, only once durable, and its runs are written
//! before it counts as finished; on its threads or inline alike.

use std::sync::{Arc, Mutex};

use rankd_shards::commit::{CommitError, CommitEvent, CommitHooks, Pipeline};
use rankd_shards::{Board, BoardConfig, Mode, Order, Shard, ShardOptions, Ties, TreeId, Window};

/// Records what the pipeline reports.
#[derive(Default)]
struct Recorder {
    /// Each group's acknowledgements, and its failure.
    groups: Mutex<Vec<(Vec<u32>, Option<String>)>>,
    /// Runs written, and checkpoints among them.
    runs: Mutex<(usize, usize)>,
}

impl CommitHooks<u32> for Recorder {
    fn acknowledge(&self, acks: Vec<u32>, failure: Option<&CommitError>) {
        self.groups.lock().unwrap().push((acks, failure.map(ToString::to_string)));
    }

    fn observe(&self, event: CommitEvent) {
        if let CommitEvent::RunsWritten { checkpoint, .. } = event {
            let mut runs = self.runs.lock().unwrap();
            runs.0 += 1;
            runs.1 += usize::from(checkpoint);
        }
    }
}

fn board() -> Board {
    let config = BoardConfig {
        order: Order::Desc,
        ties: Ties::Competition,
        windows: vec![Window::All],
        keep: 1,
        fields: Vec::new(),
    };
    Board { id: 1, name: "b".into(), config: config.into() }
}

fn tree() -> TreeId {
    TreeId { board: 1, window: Window::All.code(), period: 0 }
}

/// Small runs and checkpoints, so the batches below carry both.
fn options() -> ShardOptions {
    ShardOptions { run_every: 8, checkpoint_every: 20, ..ShardOptions::default() }
}

/// Stages and submits `batches` batches of 3 writes each; returns the
/// recorder once the pipeline has finished them all.
fn run(threads: bool, batches: u32) -> (Arc<Recorder>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut shard = Shard::open(dir.path(), options()).unwrap();
    let recorder = Arc::new(Recorder::default());
    let mut pipeline = Pipeline::new(recorder.clone());
    if threads {
        pipeline.spawn("test", Arc::new(|_| {})).unwrap();
    }
    let board = board();
    shard.ensure_board(&board);
    for batch in 0..batches {
        for i in 0..3u64 {
            let seq = u64::from(batch) * 3 + i + 1;
            shard.write(&board, &format!("p{seq}"), seq as i64, Mode::Set, seq).unwrap();
        }
        let sealed = shard.seal();
        pipeline.submit(sealed, shard.durability_handle(), batch);
    }
    let settled = pipeline.settle();
    assert!(settled.failure.is_none(), "{:?}", settled.failure);
    shard.landed(settled.finished);
    assert_eq!((pipeline.unfinished(), pipeline.syncs_in_flight()), (0, 0));
    assert_eq!(shard.unwritten_runs(), 0, "every run written before its batch finished");
    drop(pipeline);
    drop(shard);
    (recorder, dir)
}

fn check(recorder: &Recorder, dir: &tempfile::TempDir, batches: u32) {
    let groups = recorder.groups.lock().unwrap();
    let acks: Vec<u32> = groups.iter().flat_map(|(acks, _)| acks.iter().copied()).collect();
    assert_eq!(acks, (0..batches).collect::<Vec<_>>(), "each batch acknowledged once, in order");
    assert!(groups.iter().all(|(_, failure)| failure.is_none()));
    let (runs, checkpoints) = *recorder.runs.lock().unwrap();
    assert!(runs > 0 && checkpoints > 0, "{runs} runs, {checkpoints} checkpoints");
    // Acknowledged means durable: a fresh open holds every write.
    let shard = Shard::open(dir.path(), options()).unwrap();
    let players = u64::from(batches) * 3;
    assert_eq!(shard.count(tree()), players);
    for seq in 1..=players {
        assert_eq!(shard.get(tree(), &format!("p{seq}")).unwrap().map(|r| r.score), Some(seq as i64));
    }
    shard.check().unwrap();
}

#[test]
fn batches_are_acknowledged_once_durable_and_finished_once_their_runs_are_written() {
    let (recorder, dir) = run(true, 30);
    check(&recorder, &dir, 30);
}

#[test]
fn without_its_threads_the_pipeline_commits_inline_alike() {
    let (recorder, dir) = run(false, 12);
    check(&recorder, &dir, 12);
    assert_eq!(recorder.groups.lock().unwrap().len(), 12, "inline, each batch is its own group");
}
