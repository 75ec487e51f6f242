//! Background threads yield the CPU to the threads a request waits for.
//!
//! A write's acknowledgment waits for its connection thread, its shard's
//! batch loop and committer; the shard's runs thread (writing the overlay
//! as sorted runs) and fjall's worker (flushes and compaction) only have to
//! keep up on average, and the shard bounds how far they may fall behind
//! (`MAX_UNWRITTEN_RUNS` in [`crate::shard`]). At the same priority they
//! took their turns on the cores while the batch loop waited in the run
//! queue. At nice 19 (1M players, 1 shard, 8 × 64 pipelined `set`, the
//! background threads reniced on one running server, alternating every
//! 12 s): 171.9k / 170.2k / 179.8k sets/s against 164.8k / 159.7k / 161.4k
//! at nice 0, p99 10.9–11.3 ms against 12.0–12.9 ms.
//!
//! Linux keeps a nice value per thread, so `setpriority` on a thread id
//! lowers that thread alone; raising one's own nice needs no privilege.

use std::io;

use crate::thread_cpu::{current_thread_id, stat_fields, thread_stats};

/// The nice value background threads run at: the lowest priority, so they
/// take what the request path leaves.
pub const BACKGROUND_NICE: i32 = 19;

/// The OS name prefix of fjall's flush and compaction threads.
const FJALL_WORKERS: &str = "fjall:";

/// Lowers the calling thread, a background thread with `role`, to
/// [`BACKGROUND_NICE`]. Failing only costs speed, so it is logged.
pub fn make_background(role: &str) {
    if let Err(e) = lower_current_thread(BACKGROUND_NICE) {
        tracing::warn!(thread = role, error = %e, "could not lower a background thread's priority");
    }
}

/// Lowers fjall's flush and compaction threads (all of them: lowering one
/// twice is harmless) to [`BACKGROUND_NICE`]; after opening storage, whose
/// workers inherit the opening thread's priority.
pub fn make_fjall_workers_background() {
    if let Err(e) = lower_threads_named(FJALL_WORKERS, BACKGROUND_NICE) {
        tracing::warn!(error = %e, "could not lower the priority of fjall's workers");
    }
}

/// Lowers the calling thread's priority to `nice`.
pub fn lower_current_thread(nice: i32) -> io::Result<()> {
    let tid = current_thread_id().ok_or_else(|| io::Error::other("no /proc/thread-self"))?;
    set_thread_nice(tid, nice)
}

/// Lowers the priority of this process's threads whose OS name starts with
/// `prefix` (threads another crate started, such as fjall's workers);
/// returns how many it lowered.
pub fn lower_threads_named(prefix: &str, nice: i32) -> io::Result<usize> {
    let mut lowered = 0;
    for (tid, stat) in thread_stats()? {
        if stat_fields(&stat).is_some_and(|(name, _)| name.starts_with(prefix)) {
            set_thread_nice(tid, nice)?;
            lowered += 1;
        }
    }
    Ok(lowered)
}

fn set_thread_nice(tid: u32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority only reads its integer arguments.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The nice value of thread `tid`, field 19 of its `/proc` stat line.
#[cfg(test)]
fn thread_nice(tid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    stat_fields(&stat)?.1.nth(16)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A thread that lowers itself, and threads found by name, end up at the
    /// nice asked for; other threads keep theirs.
    #[test]
    fn lowers_only_the_threads_asked_for() {
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
        let before = thread_nice(this_tid).unwrap();

        assert_eq!(lower_threads_named("bgprio-te", 10).unwrap(), 1);
        assert_eq!(thread_nice(named_tid), Some(10));
        assert_eq!(thread_nice(this_tid), Some(before), "a thread of another name was changed");

        let own = std::thread::spawn(|| {
            lower_current_thread(BACKGROUND_NICE).unwrap();
            thread_nice(current_thread_id().unwrap())
        });
        assert_eq!(own.join().unwrap(), Some(BACKGROUND_NICE));
        assert_eq!(thread_nice(this_tid), Some(before));
        stop.send(()).unwrap();
        named.join().unwrap();
    }
}
