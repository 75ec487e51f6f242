//! The group-commit pipeline over a real shard: every batch submitted is
//! acknowledged once, in order, only once durable, and its runs are written
//! before it counts as finished; on its threads or inline alike.

use std::sync::{Arc, Mutex};

use rankd_shards::commit::{CommitError, CommitEvent, CommitHooks, Pipeline, PipelineThread};
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

/// Holds the runs thread inside its first run until released, and counts
/// acknowledgements.
#[derive(Default)]
struct Gate {
    acked: Mutex<u32>,
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl CommitHooks<u32> for Gate {
    fn acknowledge(&self, acks: Vec<u32>, failure: Option<&CommitError>) {
        assert!(failure.is_none(), "{failure:?}");
        *self.acked.lock().unwrap() += acks.len() as u32;
    }

    fn observe(&self, event: CommitEvent) {
        if let CommitEvent::RunsWritten { .. } = event {
            if let Some(release) = self.release.lock().unwrap().take() {
                let _ = release.recv();
            }
        }
    }
}

/// Writes `writes` players to `shard` and submits them as one batch.
fn submit_writes(shard: &mut Shard, pipeline: &mut Pipeline<u32>, first: u64, writes: u64, ack: u32) {
    let board = board();
    shard.ensure_board(&board);
    for seq in first..first + writes {
        // Names of 8 bytes and more: each has a record to write as runs (a
        // small board's short names have none).
        shard.write(&board, &format!("player:{seq}"), seq as i64, Mode::Set, seq).unwrap();
    }
    let sealed = shard.seal();
    pipeline.submit(sealed, shard.durability_handle(), ack);
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn groups_without_runs_finish_on_the_committer_without_waking_the_runs_thread() {
    let dir = tempfile::tempdir().unwrap();
    let options = ShardOptions { run_every: 1_000, checkpoint_every: 1_000_000, ..ShardOptions::default() };
    let mut shard = Shard::open(dir.path(), options).unwrap();
    let mut pipeline = Pipeline::new(Arc::new(Recorder::default()));
    let told = Arc::new(Mutex::new(Vec::new()));
    let log = told.clone();
    pipeline.spawn("test", Arc::new(move |thread| log.lock().unwrap().push(thread))).unwrap();
    for batch in 0..5 {
        submit_writes(&mut shard, &mut pipeline, u64::from(batch) * 2 + 1, 2, batch);
        let settled = pipeline.settle();
        assert!(settled.failure.is_none());
        shard.landed(settled.finished);
    }
    assert_eq!((pipeline.unfinished(), shard.unwritten_runs()), (0, 0));
    let told = told.lock().unwrap();
    assert!(!told.is_empty() && told.iter().all(|t| *t == PipelineThread::Committer), "{told:?}");
}

#[test]
fn a_group_without_runs_behind_one_with_runs_finishes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let options = ShardOptions { run_every: 3, checkpoint_every: 1_000_000, ..ShardOptions::default() };
    let mut shard = Shard::open(dir.path(), options).unwrap();
    let gate = Arc::new(Gate::default());
    let mut pipeline = Pipeline::new(gate.clone());
    let committed = Arc::new(Mutex::new(0));
    let count = committed.clone();
    let on_progress = move |thread| *count.lock().unwrap() += u32::from(thread == PipelineThread::Committer);
    pipeline.spawn("test", Arc::new(on_progress)).unwrap();
    // Declared after the pipeline: if the test fails, the gate opens (its
    // sender dropped) before the pipeline waits for its threads.
    let (release, held) = std::sync::mpsc::channel();
    *gate.release.lock().unwrap() = Some(held);
    // Three players: the batch freezes the overlay, its runs held at the gate.
    submit_writes(&mut shard, &mut pipeline, 1, 3, 0);
    assert_eq!(shard.unwritten_runs(), 1);
    wait_until("the first batch acknowledged", || *gate.acked.lock().unwrap() == 1);
    // One more player: no runs of its own.
    submit_writes(&mut shard, &mut pipeline, 4, 1, 1);
    assert_eq!(shard.unwritten_runs(), 1, "the second batch carries no runs");
    wait_until("the committer done with the second batch", || *committed.lock().unwrap() == 2);
    assert_eq!(*gate.acked.lock().unwrap(), 2);
    // Answered, but not finished: the first batch's runs are still unwritten.
    let absorbed = pipeline.absorb();
    assert_eq!(absorbed.finished, 0, "a batch finished before the runs ahead of it");
    release.send(()).unwrap();
    let settled = pipeline.settle();
    assert_eq!(settled.finished, 2);
    shard.landed(settled.finished);
    assert_eq!((shard.unwritten_runs(), shard.get(tree(), "player:4").unwrap().map(|r| r.score)), (0, Some(4)));
}
