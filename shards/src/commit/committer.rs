//! The committer thread: writes sealed batches, makes each group durable
//! with one fsync, acknowledges it, and passes its runs on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use super::runs::{self, write_runs};
use super::{CommitError, CommitEvent, CommitHooks, Job, PipelineThread, Progress, SlowDisk};
use crate::shard::WrittenBatch;

/// The jobs of one group once answered, on their way to the runs thread.
pub(super) struct Answered {
    /// How many jobs the group held.
    pub jobs: u64,
    /// The storage opening the group wrote to: after a failed run, no later
    /// run of that opening is written.
    pub generation: u64,
    /// Batches carrying runs or leaving a memtable full; empty if the group
    /// failed (nothing of it is known durable, so no run of it may be
    /// written).
    pub runs: Vec<WrittenBatch>,
}

/// The committer's loop: takes every job queued, commits them in groups of
/// one generation, hands each group's runs to the runs thread, and tells
/// the owner.
pub(super) fn run<A: Send + 'static>(
    jobs: mpsc::Receiver<Job<A>>,
    hooks: Arc<dyn CommitHooks<A>>,
    progress: Arc<Progress>,
    on_progress: super::OnProgress,
    runs_name: String,
    slow_disk: SlowDisk,
) {
    hooks.thread_started(PipelineThread::Committer);
    let (to_runs, runs_queue) = mpsc::channel::<Answered>();
    // Groups handed to the runs thread and not finished yet.
    let runs_pending = Arc::new(AtomicU64::new(0));
    let runs_thread = {
        let (hooks, progress, on_progress) = (hooks.clone(), progress.clone(), on_progress.clone());
        let pending = runs_pending.clone();
        std::thread::Builder::new()
            .name(runs_name)
            .spawn(move || runs::run(runs_queue, hooks, progress, on_progress, pending, slow_disk))
            .map_err(|e| tracing::error!(error = %e, "starting the runs thread failed; writing runs inline"))
            .ok()
    };
    let runs = RunsThread { to_runs: Some(to_runs), thread: runs_thread };
    // Only for runs written here, when the runs thread is missing.
    let mut failed_generation = None;
    while let Ok(first) = jobs.recv() {
        let mut queued = std::iter::once(first).chain(jobs.try_iter()).peekable();
        while let Some(head) = queued.next() {
            let generation = head.generation;
            let mut group = vec![head];
            while let Some(next) = queued.next_if(|job| job.generation == generation) {
                group.push(next);
            }
            let answered = commit_group(group, &*hooks, &progress, slow_disk);
            // A group with no runs is over once answered, unless groups with
            // runs are still ahead of it (jobs finish in the order sealed):
            // most groups, which need no wake-up of the runs thread then.
            // Only this thread raises the pending count, so a zero stays one.
            if answered.runs.is_empty() && runs_pending.load(Ordering::Acquire) == 0 {
                progress.finished(answered.jobs, None);
                continue;
            }
            let unsent = match (&runs.thread, &runs.to_runs) {
                (Some(_), Some(to_runs)) => {
                    runs_pending.fetch_add(1, Ordering::AcqRel);
                    to_runs.send(answered).err().map(|mpsc::SendError(answered)| {
                        runs_pending.fetch_sub(1, Ordering::AcqRel);
                        answered
                    })
                }
                _ => Some(answered),
            };
            if let Some(answered) = unsent {
                write_runs(answered, &*hooks, &progress, &mut failed_generation);
            }
        }
        on_progress(PipelineThread::Committer);
    }
}

/// The runs thread, as the committer holds it: dropped, on the way out or
/// by a panic, it lets the runs thread finish what it was handed and waits
/// for it. So once the committer thread is over, no pipeline thread still
/// counts jobs (what [`super::Pipeline::respawn`] relies on).
struct RunsThread {
    to_runs: Option<mpsc::Sender<Answered>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunsThread {
    fn drop(&mut self) {
        self.to_runs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes `jobs` (sealed batches of one storage opening, oldest first) in
/// order, makes them durable with one sync — syncing the journal covers
/// every batch written before it — and acknowledges them; returns the runs
/// they carry, which may be written now that they are durable. After a
/// failed write nothing more is written: the batches after it fail too.
pub(super) fn commit_group<A: 'static>(
    jobs: Vec<Job<A>>,
    hooks: &dyn CommitHooks<A>,
    progress: &Progress,
    slow_disk: SlowDisk,
) -> Answered {
    let count = jobs.len() as u64;
    let on_panic = progress.settled_on_panic(count, true);
    let generation = jobs.first().map_or(0, |job| job.generation);
    let writes_something = jobs.iter().any(|job| !job.batch.is_empty());
    let (mut failure, mut handle, mut writes) = (None, None, 0);
    let mut acks = Vec::with_capacity(jobs.len());
    let mut written = Vec::with_capacity(jobs.len());
    for job in jobs {
        if failure.is_none() {
            let slept = slow_disk.before_commit();
            writes += job.batch.writes;
            match job.batch.write() {
                Ok(batch) => {
                    hooks.observe(CommitEvent::BatchWritten(batch.took + slept));
                    written.push(batch);
                }
                Err(e) => failure = Some(CommitError::Write(Arc::new(e))),
            }
        }
        handle = Some(job.handle);
        acks.push(job.acks);
    }
    if let (None, Some(handle)) = (&failure, &handle) {
        match handle.sync() {
            Ok(took) => hooks.observe(CommitEvent::Synced { took, writes }),
            Err(e) => failure = Some(CommitError::Sync(Arc::new(e))),
        }
    }
    if failure.is_some() && writes_something {
        hooks.observe(CommitEvent::Failed);
    }
    if failure.is_none() {
        hooks.before_acknowledge();
    }
    hooks.acknowledge(acks, failure.as_ref());
    let runs = match failure {
        None => written.into_iter().filter(WrittenBatch::has_work).collect(),
        Some(_) => Vec::new(),
    };
    // Answered, not over: the batches with runs keep their storage handles
    // until `write_runs` drops them, and only then are the jobs over (what
    // a reopen waits for).
    on_panic.done();
    progress.answered(count, failure);
    Answered { jobs: count, generation, runs }
}
