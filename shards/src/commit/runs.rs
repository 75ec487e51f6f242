//! The runs thread: writes the runs of answered batches in the order they
//! were sealed, at a low priority, and tells the owner as they finish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use super::committer::Answered;
use super::{CommitError, CommitEvent, CommitHooks, PipelineThread, Progress, SlowDisk};

/// The runs thread's loop. `pending` counts the groups handed to it and not
/// finished yet: it is lowered once a group's jobs are counted finished.
pub(super) fn run<A: 'static>(
    queue: mpsc::Receiver<Answered>,
    hooks: Arc<dyn CommitHooks<A>>,
    progress: Arc<Progress>,
    on_progress: super::OnProgress,
    pending: Arc<AtomicU64>,
    slow_disk: SlowDisk,
) {
    hooks.thread_started(PipelineThread::Runs);
    let _notice = DeathNotice(&progress);
    let mut failed_generation = None;
    for answered in queue {
        slow_disk.before_runs();
        write_runs(answered, &*hooks, &progress, &mut failed_generation);
        pending.fetch_sub(1, Ordering::AcqRel);
        on_progress(PipelineThread::Runs);
    }
}

/// Dropped by a panic of the runs thread: tells the owner, whose jobs in
/// the thread's queue would otherwise never be counted finished.
struct DeathNotice<'a>(&'a Progress);

impl Drop for DeathNotice<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.runs_thread_died();
        }
    }
}

/// Writes the runs of one answered group and counts its jobs finished.
/// Once a run of a storage opening failed, no later run of that opening is
/// written: its marker would claim the failed run's records were covered,
/// and a restart would not rebuild them from the log (the owner reopens
/// the storage, which rebuilds every unwritten change).
pub(super) fn write_runs<A: 'static>(
    answered: Answered,
    hooks: &dyn CommitHooks<A>,
    progress: &Progress,
    failed_generation: &mut Option<u64>,
) {
    let Answered { jobs, generation, runs } = answered;
    let on_panic = progress.settled_on_panic(jobs, false);
    let mut failure = None;
    if *failed_generation != Some(generation) {
        for batch in runs {
            let checkpoint = batch.carries_checkpoint();
            match batch.write_runs() {
                Ok(took) => hooks.observe(CommitEvent::RunsWritten { took, checkpoint }),
                Err(e) => {
                    hooks.observe(CommitEvent::Failed);
                    failure = Some(CommitError::Runs(Arc::new(e)));
                    *failed_generation = Some(generation);
                    break;
                }
            }
        }
    } else {
        drop(runs);
    }
    // The batches (and their storage handles) are gone before the owner may
    // hear the jobs are over: a reopen needs them gone.
    on_panic.done();
    progress.finished(jobs, failure);
}
