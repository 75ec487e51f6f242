//! How far the pipeline's threads got, shared with the owner so it can wait
//! for them without a message round trip.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::CommitError;

/// The counts the threads raise and the owner reads.
#[derive(Default)]
pub(super) struct Progress {
    /// The counts, raised by the threads and read by the owner.
    state: Mutex<Counts>,
    /// Signalled on every report, for an owner waiting for jobs to finish.
    changed: Condvar,
    /// Jobs submitted, ever, by the owner or a [`super::Submitter`]. With
    /// `answered`, read without the lock: every seal asks what is in flight.
    sent: AtomicU64,
    /// Jobs answered (durable and acknowledged, or failed), ever.
    answered: AtomicU64,
    /// The runs thread died (a panic): the groups it held are lost.
    runs_died: AtomicBool,
}

#[derive(Default)]
struct Counts {
    /// Jobs over, ever: answered, and their runs written (or failed), in
    /// the order they were sealed. Only then may the shard stop reading
    /// their runs from memory.
    finished: u64,
    /// The first failure since the owner last took one.
    failure: Option<CommitError>,
}

impl Progress {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // The counts stay consistent whatever panicked while holding them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a job submitted.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::AcqRel);
    }

    /// Jobs submitted so far, and how many of them are not answered yet.
    pub fn in_flight(&self) -> (u64, u64) {
        let sent = self.sent.load(Ordering::Acquire);
        (sent, sent.saturating_sub(self.answered.load(Ordering::Acquire)))
    }

    /// Counts `jobs` answered, keeping `failure` for the owner.
    pub fn answered(&self, jobs: u64, failure: Option<CommitError>) {
        self.answered.fetch_add(jobs, Ordering::AcqRel);
        self.report(|_| {}, failure);
    }

    /// Counts `jobs` finished, keeping `failure` for the owner.
    pub fn finished(&self, jobs: u64, failure: Option<CommitError>) {
        self.report(|counts| counts.finished += jobs, failure);
    }

    /// A guard that, dropped by a panic before [`Settled::done`], counts
    /// `jobs` answered (if `answering`) and finished, as failed: so a
    /// panicking thread cannot leave the owner waiting for them forever.
    pub fn settled_on_panic(&self, jobs: u64, answering: bool) -> Settled<'_> {
        Settled { progress: self, jobs, answering, done: false }
    }

    fn report(&self, count: impl FnOnce(&mut Counts), failure: Option<CommitError>) {
        let mut counts = self.lock();
        count(&mut counts);
        if counts.failure.is_none() {
            counts.failure = failure;
        }
        self.changed.notify_all();
    }

    /// Counts every job sent and not yet answered or finished as failed
    /// (`Panicked`): for when no thread is left to count them. The caller
    /// must keep new jobs from being sent meanwhile.
    pub fn abandon(&self) {
        self.runs_died.store(false, Ordering::Release);
        let sent = self.sent.load(Ordering::Acquire);
        self.answered.fetch_max(sent, Ordering::AcqRel);
        self.report(|counts| counts.finished = counts.finished.max(sent), Some(CommitError::Panicked));
    }

    /// Records that the runs thread died, and wakes an owner waiting.
    pub fn runs_thread_died(&self) {
        self.runs_died.store(true, Ordering::Release);
        self.report(|_| {}, Some(CommitError::Panicked));
    }

    /// Whether the runs thread died since the last [`Progress::abandon`].
    pub fn runs_died(&self) -> bool {
        self.runs_died.load(Ordering::Acquire)
    }

    /// Whether a failure waits for the owner to take it.
    pub fn has_failure(&self) -> bool {
        self.lock().failure.is_some()
    }

    /// Jobs answered and finished so far, and the failure, taken.
    pub fn take(&self) -> (u64, u64, Option<CommitError>) {
        let mut counts = self.lock();
        (self.answered.load(Ordering::Acquire), counts.finished, counts.failure.take())
    }

    /// Waits until `jobs` are finished; checks `gone` every `poll` so a
    /// dead thread cannot hang the owner. Returns whether they finished.
    pub fn wait_finished(&self, jobs: u64, poll: Duration, gone: impl Fn() -> bool) -> bool {
        let mut counts = self.lock();
        while counts.finished < jobs {
            let (next, wait) = self.changed.wait_timeout(counts, poll).unwrap_or_else(PoisonError::into_inner);
            counts = next;
            if wait.timed_out() && counts.finished < jobs && gone() {
                return false;
            }
        }
        true
    }
}

/// See [`Progress::settled_on_panic`].
pub(super) struct Settled<'a> {
    progress: &'a Progress,
    jobs: u64,
    /// Whether the jobs were not answered yet either.
    answering: bool,
    /// Counted the normal way: nothing to do on drop.
    done: bool,
}

impl Settled<'_> {
    /// The jobs were counted the normal way.
    pub fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Settled<'_> {
    fn drop(&mut self) {
        if !self.done && std::thread::panicking() {
            if self.answering {
                self.progress.answered(self.jobs, Some(CommitError::Panicked));
            }
            self.progress.finished(self.jobs, Some(CommitError::Panicked));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_the_first_failure_until_taken_and_wakes_waiters() {
        let progress = Arc::new(Progress::default());
        let failure = |what: &'static str| Some(CommitError::Write(Arc::new(crate::ShardError::Corrupt(what))));
        progress.answered(2, failure("first"));
        progress.answered(1, failure("second"));
        let (answered, finished, taken) = progress.take();
        assert_eq!((answered, finished), (3, 0));
        assert!(taken.is_some_and(|e| e.to_string().contains("first")));
        assert!(progress.take().2.is_none(), "taken once");

        let waiter = {
            let progress = progress.clone();
            std::thread::spawn(move || progress.wait_finished(3, Duration::from_millis(10), || false))
        };
        progress.finished(3, None);
        assert!(waiter.join().unwrap());
        assert!(!progress.wait_finished(4, Duration::from_millis(1), || true), "a gone thread ends the wait");
    }

    #[test]
    fn abandoning_counts_every_job_left_as_failed() {
        let progress = Progress::default();
        (0..3).for_each(|_| progress.sent());
        progress.answered(1, None);
        progress.finished(1, None);
        progress.abandon();
        assert_eq!(progress.in_flight(), (3, 0));
        let (answered, finished, failure) = progress.take();
        assert_eq!((answered, finished), (3, 3));
        assert!(matches!(failure, Some(CommitError::Panicked)), "{failure:?}");
    }

    #[test]
    fn a_panic_before_the_jobs_are_counted_counts_them_failed() {
        let progress = Arc::new(Progress::default());
        let panicking = progress.clone();
        let _ = std::thread::spawn(move || {
            let _guard = panicking.settled_on_panic(2, true);
            panic!("a commit thread dies");
        })
        .join();
        let (answered, finished, failure) = progress.take();
        assert_eq!((answered, finished), (2, 2));
        assert!(matches!(failure, Some(CommitError::Panicked)));
        progress.settled_on_panic(5, true).done();
        assert_eq!(progress.take().0, 2, "counted the normal way: not again");
    }
}
