//! CPU time by server thread, for `rankd_thread_cpu_seconds_total`.
//!
//! A shard is one single-writer loop plus its committer and runs threads,
//! and fjall compacts beside them: which of these is at a full core is what
//! decides whether more shards (or more cores) would help. Process CPU
//! cannot say; per-thread CPU can, so threads with a role register it
//! ([`ThreadCpu::register`]) and every scrape reads `/proc/self/task`.
//! Threads that did not register (fjall's workers, the allocator's) are
//! labelled by their OS name.

use std::collections::HashMap;

use parking_lot::Mutex;
use prometheus::{CounterVec, Opts};

/// Clock ticks per second of `/proc/.../stat` (USER_HZ, which Linux fixes
/// at 100 for user space).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// See the module docs.
pub struct ThreadCpu {
    /// `rankd_thread_cpu_seconds_total{thread}`.
    pub counter: CounterVec,
    /// Roles and last readings, shared by registering threads and scrapes.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Role of each registered thread, by thread id.
    roles: HashMap<u32, String>,
    /// CPU ticks each thread had at the last scrape, by thread id.
    seen: HashMap<u32, u64>,
}

impl ThreadCpu {
    pub fn new() -> Result<Self, prometheus::Error> {
        let counter = CounterVec::new(
            Opts::new(
                "rankd_thread_cpu_seconds_total",
                "CPU time (user and system) of the server's threads, by role: io-N (client I/O, routing, ranks \
                 and writes in place), shard-N (the batch loop), commit-N, runs-N, and unregistered threads by OS \
                 name (fjall:worker: flushes and compaction; rankd-leaves: a checkpoint's leaf writer).",
            ),
            &["thread"],
        )?;
        Ok(Self { counter, state: Mutex::new(State::default()) })
    }

    /// Labels the calling thread `role` from now on. Its series exists from
    /// here on, at zero until the thread has used a clock tick.
    pub fn register(&self, role: &str) {
        if let Some(tid) = current_thread_id() {
            self.counter.with_label_values(&[role]);
            self.state.lock().roles.insert(tid, role.to_string());
        }
    }

    /// Adds each thread's CPU since the last call to its role's counter.
    /// Per thread, so a thread that ends takes nothing back from a counter.
    pub fn refresh(&self) {
        let Ok(threads) = thread_stats() else { return };
        let mut state = self.state.lock();
        let mut seen = HashMap::with_capacity(state.seen.len());
        for (tid, stat) in threads {
            let Some((name, ticks)) = parse_stat(&stat) else { continue };
            let before = state.seen.get(&tid).copied().unwrap_or(0);
            if ticks > before {
                let role = state.roles.get(&tid).map_or(name, String::as_str);
                self.counter.with_label_values(&[role]).inc_by((ticks - before) as f64 / TICKS_PER_SECOND);
            }
            seen.insert(tid, ticks.max(before));
        }
        state.roles.retain(|tid, _| seen.contains_key(tid));
        state.seen = seen;
    }
}

/// The thread id of the calling thread, from `/proc/thread-self`
/// (`<pid>/task/<tid>`).
pub fn current_thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// This process's threads, each with its id and `/proc` stat line (threads
/// that end meanwhile are skipped).
pub fn thread_stats() -> std::io::Result<impl Iterator<Item = (u32, String)>> {
    Ok(std::fs::read_dir("/proc/self/task")?.flatten().filter_map(|task| {
        let tid = task.file_name().to_str()?.parse().ok()?;
        Some((tid, std::fs::read_to_string(task.path().join("stat")).ok()?))
    }))
}

/// A `/proc/.../stat` line's name and the fields after it, from field 3
/// (the state) on.
pub fn stat_fields(stat: &str) -> Option<(&str, std::str::Split<'_, char>)> {
    // The name is in parentheses and may itself hold spaces or parentheses.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    Some((stat.get(open + 1..close)?, stat.get(close + 2..)?.split(' ')))
}

/// A process's or thread's name and CPU ticks (user + system) from its
/// `/proc/.../stat` line.
pub fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let (name, mut fields) = stat_fields(stat)?;
    // utime and stime are fields 14 and 15 of the line.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn parses_a_stat_line() {
        let stat = "4242 (fjall:wo (x)) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0 100 0 0\n";
        assert_eq!(parse_stat(stat), Some(("fjall:wo (x)", 281)));
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
    }

    /// The calling thread's CPU time so far.
    fn thread_cpu_time() -> Duration {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `now` is a valid timespec for the call to fill.
        let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        assert_eq!(read, 0, "CLOCK_THREAD_CPUTIME_ID");
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    /// A registered thread's work shows under its role, and the counter
    /// only grows.
    #[test]
    fn a_busy_registered_thread_is_counted_under_its_role() {
        let cpu = std::sync::Arc::new(ThreadCpu::new().unwrap());
        cpu.refresh();
        let worker = {
            let cpu = cpu.clone();
            std::thread::spawn(move || {
                cpu.register("spinner");
                // 300 ms of this thread's own CPU time, however long a
                // loaded machine takes to give it (within reason).
                let started = Instant::now();
                let mut x = 1u64;
                while thread_cpu_time() < Duration::from_millis(300) && started.elapsed() < Duration::from_secs(30) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                cpu.refresh();
            })
        };
        worker.join().unwrap();
        let spun = cpu.counter.with_label_values(&["spinner"]).get();
        assert!(spun >= 0.1, "{spun} s counted for 300 ms of spinning");
        // Its last ticks may land after its own refresh, while its task is
        // still listed: the counter may grow by them, never drop.
        cpu.refresh();
        let ended = cpu.counter.with_label_values(&["spinner"]).get();
        assert!(ended >= spun, "an ended thread keeps its count: {spun} s, then {ended} s");
        cpu.refresh();
        assert_eq!(cpu.counter.with_label_values(&["spinner"]).get(), ended, "and an ended thread adds nothing");
    }
}
