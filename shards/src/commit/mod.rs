//! Group commit off the shard's thread.
//!
//! A *committer* thread writes sealed batches to the journal — all that
//! queued up while it worked — makes them durable with one fsync and hands
//! their acknowledgements back; a *runs* thread then writes the runs (and
//! checkpoint leaves) those batches carry, in the order they were sealed.
//! The shard's own thread only seals and submits, so it never waits for
//! storage, and the busier the shard the more writes share one fsync.
//!
//! Why two threads: writing a run takes far longer than an fsync (tens of
//! thousands of records into sorted tables), and on the committer it held
//! up the next group's fsync. A run only has to follow the fsync of its own
//! batch and come before the next run, which the runs thread's order keeps.
//! Most groups carry no run; the committer counts such a group finished
//! itself when the runs thread has nothing of earlier groups left, so the
//! runs thread is woken only for work.
//!
//! The [`Pipeline`] counts the jobs it submits; the threads count the jobs
//! *answered* (acknowledged, or failed) and *finished* (their runs written
//! too), in `progress.rs`, and keep the failure they met until the owner
//! takes it. A failure poisons the storage: the owner must stop sealing,
//! reopen the shard and call [`Pipeline::reopened`]. Within a group, the
//! batches after a failed write are not written; after a failed run, no
//! later run of that opening (its *generation*) is, since its marker would
//! claim the failed run's records.

mod committer;
mod hooks;
mod progress;
mod runs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use hooks::{CommitEvent, CommitHooks, PipelineThread, SlowDisk};

use crate::error::ShardError;
use crate::shard::{DurabilityHandle, SealedBatch};
use committer::commit_group;
use progress::Progress;
use runs::write_runs;

/// Why a batch could not be made durable, or its runs written: the storage
/// must be reopened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitError {
    /// Writing the batch to the journal failed.
    #[error("commit failed: {0}")]
    Write(Arc<ShardError>),
    /// Making it durable failed.
    #[error("fsync failed: {0}")]
    Sync(Arc<ShardError>),
    /// Writing the runs of an acknowledged batch failed (the change log
    /// still holds everything acknowledged; reopening rebuilds the runs).
    #[error("writing runs failed: {0}")]
    Runs(Arc<ShardError>),
    /// A pipeline thread panicked; its jobs count as failed, so the owner
    /// reopens the storage instead of waiting for them forever.
    #[error("a commit pipeline thread panicked")]
    Panicked,
}

/// A sealed batch on its way to the committer, with what to acknowledge
/// once it is durable.
struct Job<A> {
    /// What the committer writes to the journal.
    batch: SealedBatch,
    /// What makes it durable: the last job's handle syncs the whole group.
    handle: DurabilityHandle,
    /// Which opening of the storage the batch belongs to: one fsync covers
    /// every queued job of one opening, and none of another.
    generation: u64,
    /// Handed to [`CommitHooks::acknowledge`] once the batch is durable.
    acks: A,
}

/// The owner's side of a shard's group-commit pipeline. Jobs are submitted
/// in the order their batches were sealed; their acknowledgements go to
/// [`CommitHooks::acknowledge`] once durable (or failed).
pub struct Pipeline<A> {
    /// Where acknowledgements and events go, shared with the threads.
    hooks: Arc<dyn CommitHooks<A>>,
    /// How far the threads got, shared with them.
    progress: Arc<Progress>,
    /// The committer's queue, once its thread runs; without it jobs are
    /// committed on the owner's thread (slower, still correct).
    jobs: Option<Submitter<A>>,
    /// The committer thread (which owns the runs thread), joined on stop.
    committer: Option<JoinHandle<()>>,
    /// The storage opening new jobs belong to; see [`Pipeline::reopened`].
    generation: Arc<AtomicU64>,
    /// Of the jobs submitted, how many the owner knows are finished.
    finished: u64,
    /// Committing inline: the opening whose run failed, whose later runs
    /// must not be written (the threads keep their own).
    inline_failed_generation: Option<u64>,
    /// Test sleeps for the threads; nothing without `test-hooks`.
    slow_disk: SlowDisk,
    /// What [`Pipeline::spawn`] was given, to start the threads again.
    spawned_with: Option<(String, OnProgress)>,
}

/// Called on the pipeline's threads, with the thread's name, whenever jobs
/// are answered or finished.
pub type OnProgress = Arc<dyn Fn(PipelineThread) + Send + Sync>;

/// Submits jobs to a running committer from any thread, alongside the
/// owner: whoever holds the storage's staged writes (and a lock that orders
/// seals) may seal and submit them. Jobs keep the order they were sent in.
pub struct Submitter<A> {
    jobs: mpsc::Sender<Job<A>>,
    progress: Arc<Progress>,
    generation: Arc<AtomicU64>,
    hooks: Arc<dyn CommitHooks<A>>,
}

impl<A> Clone for Submitter<A> {
    fn clone(&self) -> Self {
        let (progress, generation, hooks) = (self.progress.clone(), self.generation.clone(), self.hooks.clone());
        Self { jobs: self.jobs.clone(), progress, generation, hooks }
    }
}

impl<A: Send + 'static> Submitter<A> {
    /// Hands a sealed batch to the committer; `acks` go to the hooks once it
    /// is durable. If the committer is gone, they are answered failed.
    pub fn submit(&self, batch: SealedBatch, handle: DurabilityHandle, acks: A) {
        if let Some(job) = self.send(batch, handle, acks) {
            let failure = CommitError::Panicked;
            self.hooks.acknowledge(vec![job.acks], Some(&failure));
            self.progress.answered(1, Some(failure.clone()));
            self.progress.finished(1, Some(failure));
        }
    }

    /// Counts and sends a job; gives it back if the committer is gone.
    fn send(&self, batch: SealedBatch, handle: DurabilityHandle, acks: A) -> Option<Job<A>> {
        let job = counted_job(&self.progress, &self.generation, batch, handle, acks);
        self.jobs.send(job).err().map(|mpsc::SendError(job)| job)
    }

    /// Batches handed over and not yet answered: while one is, a seal may
    /// wait, so that everything staged meanwhile joins the next group.
    pub fn syncs_in_flight(&self) -> u64 {
        self.progress.in_flight().1
    }

    /// Whether the threads met a failure the owner has not taken yet.
    pub fn has_failure(&self) -> bool {
        self.progress.has_failure()
    }
}

/// A job of the storage opening `generation` holds, counted as sent.
fn counted_job<A>(
    progress: &Progress,
    generation: &AtomicU64,
    batch: SealedBatch,
    handle: DurabilityHandle,
    acks: A,
) -> Job<A> {
    progress.sent();
    Job { batch, handle, generation: generation.load(Ordering::Acquire), acks }
}

/// What the threads did since the owner last looked.
#[derive(Debug, Default)]
pub struct Absorbed {
    /// Jobs that finished since: storage now answers for their batches
    /// (see [`crate::Shard::landed`]).
    pub finished: usize,
    /// The failure the threads met, if any (once).
    pub failure: Option<CommitError>,
}

impl<A: Send + 'static> Pipeline<A> {
    /// A pipeline that commits on the caller's thread until
    /// [`Pipeline::spawn`] starts its threads.
    pub fn new(hooks: Arc<dyn CommitHooks<A>>) -> Self {
        Self {
            hooks,
            progress: Arc::default(),
            jobs: None,
            committer: None,
            generation: Arc::default(),
            finished: 0,
            inline_failed_generation: None,
            slow_disk: SlowDisk::default(),
            spawned_with: None,
        }
    }

    /// Makes the threads sleep first, as a slow disk would.
    #[cfg(feature = "test-hooks")]
    pub fn with_slow_disk(mut self, slow_disk: SlowDisk) -> Self {
        self.set_slow_disk(slow_disk);
        self
    }

    /// Makes the threads (started after) sleep first, as a slow disk would.
    #[cfg(feature = "test-hooks")]
    pub fn set_slow_disk(&mut self, slow_disk: SlowDisk) {
        self.slow_disk = slow_disk;
    }

    /// Starts the committer and runs threads (`name` goes in their names);
    /// `on_progress` is called on them, with the thread's name, whenever
    /// jobs are answered or finished. If a thread cannot start, its work is
    /// done inline.
    pub fn spawn(&mut self, name: &str, on_progress: OnProgress) -> std::io::Result<()> {
        self.spawned_with = Some((name.to_string(), on_progress.clone()));
        let (jobs, queue) = mpsc::channel();
        let (hooks, progress, slow_disk) = (self.hooks.clone(), self.progress.clone(), self.slow_disk);
        let runs_name = format!("rankd-runs-{name}");
        let committer = std::thread::Builder::new().name(format!("rankd-commit-{name}")).spawn(move || {
            committer::run(queue, hooks, progress, on_progress, runs_name, slow_disk);
        })?;
        let (progress, generation, hooks) = (self.progress.clone(), self.generation.clone(), self.hooks.clone());
        self.jobs = Some(Submitter { jobs, progress, generation, hooks });
        self.committer = Some(committer);
        Ok(())
    }

    /// A handle that submits to the committer from other threads, once its
    /// thread runs. Every handle must be dropped before [`Pipeline::stop`]
    /// returns: the committer runs until its queue has no sender left.
    pub fn submitter(&self) -> Option<Submitter<A>> {
        self.jobs.clone()
    }

    /// Hands a sealed batch to the committer; `acks` go to the hooks once it
    /// is durable. Without a committer, commits it here and returns `true`:
    /// the owner should then [`absorb`](Self::absorb) before sealing more.
    pub fn submit(&mut self, batch: SealedBatch, handle: DurabilityHandle, acks: A) -> bool {
        let unsent = match &self.jobs {
            Some(jobs) => jobs.send(batch, handle, acks),
            None => Some(counted_job(&self.progress, &self.generation, batch, handle, acks)),
        };
        let Some(job) = unsent else { return false };
        let answered = commit_group(vec![job], &*self.hooks, &self.progress, self.slow_disk);
        write_runs(answered, &*self.hooks, &self.progress, &mut self.inline_failed_generation);
        true
    }

    /// Batches handed over (by the owner or a [`Submitter`]) and not yet
    /// answered: while one is, the next seal waits, so that everything
    /// staged meanwhile joins the next group.
    pub fn syncs_in_flight(&self) -> u64 {
        self.progress.in_flight().1
    }

    /// Batches handed over and not yet finished (runs written): while any
    /// is, the threads hold the storage open.
    pub fn unfinished(&self) -> u64 {
        self.progress.in_flight().0.saturating_sub(self.finished)
    }

    /// Catches up with the threads: how many jobs finished since the last
    /// call, and the failure they met, if any.
    pub fn absorb(&mut self) -> Absorbed {
        let (_, finished, failure) = self.progress.take();
        let newly = finished.saturating_sub(self.finished);
        self.finished = finished.max(self.finished);
        Absorbed { finished: usize::try_from(newly).unwrap_or(usize::MAX), failure }
    }

    /// Waits until every job submitted so far is finished (or a pipeline
    /// thread is gone), then absorbs.
    pub fn settle(&mut self) -> Absorbed {
        let gone = || self.committer_gone() || self.progress.runs_died();
        let (sent, _) = self.progress.in_flight();
        if !self.progress.wait_finished(sent, Duration::from_secs(1), gone) {
            tracing::error!("a commit pipeline thread is gone; not waiting for it");
        }
        self.absorb()
    }

    /// Whether a pipeline thread died while the pipeline runs: a panic (a
    /// bug). The jobs it held will never be counted, and, if it was the
    /// committer, jobs sent to it fail; see [`Pipeline::respawn`].
    pub fn thread_died(&self) -> bool {
        self.jobs.is_some() && (self.committer_gone() || self.progress.runs_died())
    }

    fn committer_gone(&self) -> bool {
        self.committer.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// After a thread died: stops the committer (once it has done the jobs
    /// queued to it), counts every job left as failed, so the owner stops
    /// waiting for them, and starts new threads as [`Pipeline::spawn`] was
    /// asked to. The caller must first drop every [`Submitter`] it handed
    /// out (the committer runs until its queue has no sender left) and hand
    /// out new ones after.
    pub fn respawn(&mut self) -> std::io::Result<()> {
        self.jobs = None;
        if let Some(committer) = self.committer.take() {
            let _ = committer.join(); // a panic was logged by the panic hook
        }
        self.progress.abandon();
        match self.spawned_with.clone() {
            Some((name, on_progress)) => self.spawn(&name, on_progress),
            None => Ok(()),
        }
    }

    /// Storage was reopened after a failure: later jobs belong to the new
    /// opening, and are committed even though earlier ones failed.
    pub fn reopened(&mut self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

impl<A> Pipeline<A> {
    /// Lets the threads finish every job submitted, then stops them.
    pub fn stop(&mut self) {
        self.jobs = None;
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
    }
}

impl<A> Drop for Pipeline<A> {
    fn drop(&mut self) {
        self.stop();
    }
}
