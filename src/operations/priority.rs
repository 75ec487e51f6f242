//! Background threads yield the CPU to the threads a request waits for.
//!
//! A write's acknowledgment waits for its connection thread, its shard's
//! batch loop and committer; the shard's runs thread (writing the overlay
//! as sorted runs), its checkpoint leaf writer and fjall's worker (flushes
//! and compaction) only have to keep up on average, and the shard bounds
//! how far they may fall behind (`MAX_UNWRITTEN_RUNS` in [`crate::request_path::shard`]).
//!
//! At the same priority they took their turns on the cores while the batch
//! loop waited in the run queue, so they run at nice 19. That alone still
//! lets a background thread finish its time slice before a woken request
//! thread gets the core: the scheduler (EEVDF) protects a running thread
//! until it reaches its deadline, whatever its weight. So they also run
//! under `SCHED_IDLE`, whose threads are preempted as soon as any other
//! thread wakes on their core (the kernel's wake-up check says so outright)
//! and still take every idle cycle. Each step bought writes per second (see
//! docs/performance-history.md).
//!
//! Linux keeps a nice value and a policy per thread, so `setpriority` and
//! `sched_setscheduler` on a thread id change that thread alone; lowering
//! one's own priority needs no privilege.

use std::io;

use crate::operations::thread_cpu::{current_thread_id, stat_fields, thread_stats};

/// The nice value background threads run at: the lowest, so that where
/// `SCHED_IDLE` is refused (a seccomp filter, another OS policy) they still
/// take only what the request path leaves.
pub const BACKGROUND_NICE: i32 = 19;

/// The OS name prefix of fjall's flush and compaction threads.
const FJALL_WORKERS: &str = "fjall:";

/// Makes the calling thread, a background thread with `role`, a
/// background thread (see the module docs). Failing only costs speed, so
/// it is logged.
pub fn make_background(role: &str) {
    let lowered =
        current_thread_id().ok_or_else(|| io::Error::other("no /proc/thread-self")).and_then(make_thread_background);
    if let Err(e) = lowered {
        tracing::warn!(thread = role, error = %e, "could not lower a background thread's priority");
    }
}

/// Makes fjall's flush and compaction threads background threads (all of
/// them: doing it twice is harmless); after opening storage, whose workers
/// inherit the opening thread's priority.
pub fn make_fjall_workers_background() {
    if let Err(e) = lower_threads_named(FJALL_WORKERS) {
        tracing::warn!(error = %e, "could not lower the priority of fjall's workers");
    }
}

/// Makes this process's threads whose OS name starts with `prefix`
/// (threads another crate started, such as fjall's workers) background
/// threads; returns how many it lowered.
pub fn lower_threads_named(prefix: &str) -> io::Result<usize> {
    let mut lowered = 0;
    for (tid, stat) in thread_stats()? {
        if stat_fields(&stat).is_some_and(|(name, _)| name.starts_with(prefix)) {
            make_thread_background(tid)?;
            lowered += 1;
        }
    }
    Ok(lowered)
}

/// Nice [`BACKGROUND_NICE`], then the `SCHED_IDLE` policy.
fn make_thread_background(tid: u32) -> io::Result<()> {
    set_thread_nice(tid, BACKGROUND_NICE)?;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` outlives the call, which only reads it.
    if unsafe { libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_IDLE, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_thread_nice(tid: u32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority only reads its integer arguments.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The nice value and scheduling policy of thread `tid`: fields 19 and 41
/// of its `/proc` stat line.
#[cfg(test)]
fn thread_priority(tid: u32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let mut after_name = stat_fields(&stat)?.1;
    let nice = after_name.nth(16)?.parse().ok()?;
    let policy = after_name.nth(21)?.parse().ok()?;
    Some((nice, policy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A thread that lowers itself, and threads found by name, end up at
    /// nice 19 under `SCHED_IDLE`; other threads keep their priority.
    #[test]
    fn lowers_only_the_threads_asked_for() {
        let background = Some((BACKGROUND_NICE, libc::SCHED_IDLE));
        let (ready, started) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let named = std::thread::Builder::new()
            .name("bgprio-test".into())
            .spawn(move || {
                ready.send(current_thread_id().unwrap()).unwrap();
                stopped.recv().ok();
            })
            .unwrap();
        let named_tid = started.recv().unwrap();
        let this_tid = current_thread_id().unwrap();
        let before = thread_priority(this_tid).unwrap();
        assert_ne!(Some(before), background, "the test thread starts in the background");

        assert_eq!(lower_threads_named("bgprio-te").unwrap(), 1);
        assert_eq!(thread_priority(named_tid), background);
        assert_eq!(thread_priority(this_tid), Some(before), "a thread of another name was changed");

        let own = std::thread::spawn(|| {
            make_background("test");
            thread_priority(current_thread_id().unwrap())
        });
        assert_eq!(own.join().unwrap(), background);
        assert_eq!(thread_priority(this_tid), Some(before));
        stop.send(()).unwrap();
        named.join().unwrap();
    }
}
