//! What a pipeline tells its owner, on the pipeline's threads.

use std::time::Duration;

use super::CommitError;

/// The owner's side of the pipeline's threads: where acknowledgements go,
/// and what it may want to measure.
pub trait CommitHooks<A>: Send + Sync + 'static {
    /// A pipeline thread starts: name it for CPU accounting, lower the
    /// runs thread's priority, and so on.
    fn thread_started(&self, _thread: PipelineThread) {}

    /// The acknowledgements of a group of jobs synced together, once
    /// durable (`failure` is `None`) or failed: none of a failed group may
    /// be reported as applied. One call per group, so the owner can hand
    /// them on in one go.
    fn acknowledge(&self, acks: Vec<A>, failure: Option<&CommitError>);

    /// A group is durable and its acknowledgements are about to go out:
    /// the owner may first stage what came for the next group, before the
    /// answers wake the threads that would preempt this one. Never called
    /// under a lock the owner's seals take.
    fn before_acknowledge(&self) {}

    /// A figure the owner may want to measure.
    fn observe(&self, _event: CommitEvent) {}
}

/// The pipeline's two threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineThread {
    /// Writes batches to the journal and fsyncs.
    Committer,
    /// Writes runs and checkpoints after their batches are durable.
    Runs,
}

/// What the pipeline did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CommitEvent {
    /// A batch went to the journal in this long.
    BatchWritten(Duration),
    /// A group was made durable in this long, holding `writes` score
    /// writes and removals.
    Synced {
        /// How long the fsync took.
        took: Duration,
        /// Score writes and removals made durable.
        writes: usize,
    },
    /// A write, sync or run failed; the storage must be reopened.
    Failed,
    /// A batch's runs (and checkpoint, if it carried one) were written.
    RunsWritten {
        /// How long writing them took.
        took: Duration,
        /// Whether they finished a checkpoint.
        checkpoint: bool,
    },
}

/// Sleeps that stand in for a slow disk or a starved thread, so tests can
/// reach what those set off (backpressure, overload) on a fast machine, and
/// panics that stand in for a bug in a pipeline thread. Without the
/// `test-hooks` feature it holds nothing and never sleeps or panics.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlowDisk {
    /// Before each batch is written.
    #[cfg(feature = "test-hooks")]
    pub commit: Duration,
    /// Before the runs of each answered group are written.
    #[cfg(feature = "test-hooks")]
    pub runs: Duration,
    /// The committer panics before writing a batch, as a bug would.
    #[cfg(feature = "test-hooks")]
    pub committer_panics: bool,
    /// The runs thread panics before writing a group's runs.
    #[cfg(feature = "test-hooks")]
    pub runs_panics: bool,
}

impl SlowDisk {
    /// Sleeps before a batch is written; returns how long.
    pub(super) fn before_commit(self) -> Duration {
        #[cfg(feature = "test-hooks")]
        if self.committer_panics {
            die("test hook: the committer panics");
        }
        #[cfg(feature = "test-hooks")]
        if !self.commit.is_zero() {
            std::thread::sleep(self.commit);
            return self.commit;
        }
        Duration::ZERO
    }

    /// Sleeps before a group's runs are written.
    pub(super) fn before_runs(self) {
        #[cfg(feature = "test-hooks")]
        if self.runs_panics {
            die("test hook: the runs thread panics");
        }
        #[cfg(feature = "test-hooks")]
        if !self.runs.is_zero() {
            std::thread::sleep(self.runs);
        }
    }
}

/// Unwinds the thread as a panic would, without the panic hook: the hook's
/// backtrace, symbolized on the runs thread's background priority, took
/// minutes on a machine whose cores were busy, and the tests of a thread's
/// death wait for the thread to end.
#[cfg(feature = "test-hooks")]
fn die(why: &'static str) -> ! {
    std::panic::resume_unwind(Box::new(why))
}
