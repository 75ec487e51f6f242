//! The CPU time a measurement cost: the server's and the load generator's.
//!
//! On a machine where the server and the load generator share the cores,
//! throughput alone cannot say whether the server ran out of CPU, waited on
//! the disk, or was starved by its client; CPU seconds per operation can,
//! and they compare rankd with Redis independently of how busy the machine
//! was. rankd's come from `rankd_thread_cpu_seconds_total` on its metrics
//! endpoint (by thread, so a run also says which thread was busiest),
//! Redis's from `INFO cpu`, the generator's from `/proc/self/stat`.
//!
//! The same scrape of rankd's metrics page also gives its request-latency
//! histograms ([`ServerSample`]; see `server_latency.rs`): one page
//! per moment, so CPU and latency cover the same interval.
//!
//! And the whole machine's, from `/proc/stat`: whether a run used every
//! core or left some idle says whether it was CPU-bound at all (a server
//! waiting on fsync latency leaves cores idle; one out of CPU does not),
//! and what neither server nor generator used went to the kernel's own
//! threads or to other tenants.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::BenchError;
use crate::server_latency::Histograms;

/// How long a scrape of the metrics endpoint may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest metrics page read (rankd's is a few tens of KiB).
const MAX_PAGE: u64 = 4 << 20;

/// What a server's own counters say at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ServerSample {
    /// CPU seconds so far.
    pub cpu: ServerCpu,
    /// Empty when the server does not say (Redis).
    pub latency: Histograms,
}

impl ServerSample {
    /// What was used and observed from `earlier` to `self`.
    pub fn since(&self, earlier: &ServerSample) -> ServerSample {
        ServerSample { cpu: self.cpu.since(&earlier.cpu), latency: self.latency.since(&earlier.latency) }
    }
}

/// CPU seconds a server has used so far, in all and by thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ServerCpu {
    /// All threads together: what CPU per operation is computed from.
    pub total: f64,
    /// Empty when the server does not say (Redis).
    pub by_thread: BTreeMap<String, f64>,
}

impl ServerCpu {
    /// What was used from `earlier` to `self`.
    pub fn since(&self, earlier: &ServerCpu) -> ServerCpu {
        let by_thread = self
            .by_thread
            .iter()
            .map(|(thread, seconds)| (thread.clone(), seconds - earlier.by_thread.get(thread).copied().unwrap_or(0.0)))
            .collect();
        ServerCpu { total: self.total - earlier.total, by_thread }
    }
}

/// What the rankd serving metrics at `addr` (`host:port`) says now: its
/// CPU seconds by thread, and its request-latency histograms.
pub(crate) async fn scrape_rankd(addr: &str) -> Result<ServerSample, BenchError> {
    let page = metrics_page(addr).await?;
    let cpu = cpu_seconds_in(&page)
        .ok_or_else(|| BenchError::Other(format!("metrics at {addr}: no rankd_thread_cpu_seconds_total")))?;
    Ok(ServerSample { cpu, latency: Histograms::in_page(&page) })
}

/// The Prometheus text page served at `addr` (`host:port`).
pub(crate) async fn metrics_page(addr: &str) -> Result<String, BenchError> {
    let failed = |why: String| BenchError::Other(format!("metrics at {addr}: {why}"));
    let page = tokio::time::timeout(SCRAPE_TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await?;
        // HTTP/1.0: the server closes the connection after the page.
        stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut page = Vec::new();
        stream.take(MAX_PAGE).read_to_end(&mut page).await?;
        Ok::<_, std::io::Error>(page)
    })
    .await
    .map_err(|_| failed(format!("no answer within {SCRAPE_TIMEOUT:?}")))?
    .map_err(|e| failed(e.to_string()))?;
    Ok(String::from_utf8_lossy(&page).into_owned())
}

/// The value of an unlabelled series `name` in a Prometheus text page.
pub(crate) fn series_in(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The whole process's CPU seconds in a rankd metrics page (the sum over
/// its threads).
pub(crate) fn total_cpu_seconds_in(page: &str) -> Option<f64> {
    cpu_seconds_in(page).map(|cpu| cpu.total)
}

/// The series of `rankd_thread_cpu_seconds_total` in a Prometheus text page.
fn cpu_seconds_in(page: &str) -> Option<ServerCpu> {
    let by_thread: BTreeMap<String, f64> = page
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("rankd_thread_cpu_seconds_total{thread=\"")?;
            let (thread, value) = rest.split_once("\"} ")?;
            Some((thread.to_string(), value.trim().parse().ok()?))
        })
        .collect();
    (!by_thread.is_empty()).then(|| ServerCpu { total: by_thread.values().sum(), by_thread })
}

/// `used_cpu_sys + used_cpu_user` of a Redis `INFO cpu` reply's text.
pub(crate) fn redis_cpu_seconds(info: &str) -> Option<f64> {
    let field = |name: &str| info.lines().find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok());
    Some(field("used_cpu_sys:")? + field("used_cpu_user:")?)
}

/// The machine's CPU seconds so far, over all its cores.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MachineCpu {
    /// Not idle: user, nice, system, interrupts and steal (time the
    /// hypervisor gave to other guests was not ours to use either).
    pub busy: f64,
    /// Idle, including waiting for I/O with nothing else to run.
    pub idle: f64,
}

impl MachineCpu {
    /// What was used from `earlier` to `self`.
    pub fn since(self, earlier: MachineCpu) -> MachineCpu {
        MachineCpu { busy: self.busy - earlier.busy, idle: self.idle - earlier.idle }
    }
}

/// The machine's CPU seconds so far, where `/proc` says.
pub(crate) fn machine_cpu_seconds() -> Option<MachineCpu> {
    machine_cpu_in(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The `cpu` line of a `/proc/stat` text: user nice system idle iowait irq
/// softirq steal (guest time is already in user).
fn machine_cpu_in(stat: &str) -> Option<MachineCpu> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, ..] = ticks[..] else { return None };
    let steal = ticks.get(7).copied().unwrap_or(0);
    let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND;
    Some(MachineCpu { busy: seconds(user + nice + system + irq + softirq + steal), idle: seconds(idle + iowait) })
}

/// `/proc/stat` counts in USER_HZ ticks, 100 a second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds process `pid` has used so far (user and system), from
/// `/proc/PID/stat`: how the examples charge a server its CPU per request.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised name: utime and stime are the
    // 12th and 13th of them.
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / TICKS_PER_SECOND)
}

/// The `q` quantile (0 to 1) of `sorted` durations, nearest rank.
pub fn quantile(sorted: &[std::time::Duration], q: f64) -> std::time::Duration {
    sorted.get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize).copied().unwrap_or_default()
}

/// CPU seconds this process has used (user and system).
pub(crate) fn own_cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given and touches nothing else.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_by_thread() {
        let page = "# TYPE rankd_thread_cpu_seconds_total counter\n\
                    rankd_thread_cpu_seconds_total{thread=\"shard-0\"} 2.5\n\
                    rankd_thread_cpu_seconds_total{thread=\"fjall:worker\"} 1.25\nprocess_cpu_seconds_total 3\n";
        let cpu = cpu_seconds_in(page).unwrap();
        assert_eq!(cpu.total, 3.75);
        assert_eq!(cpu.by_thread["fjall:worker"], 1.25);
        let earlier = ServerCpu { total: 1.0, by_thread: [("shard-0".to_string(), 1.0)].into() };
        let used = cpu.since(&earlier);
        assert_eq!((used.total, used.by_thread["shard-0"], used.by_thread["fjall:worker"]), (2.75, 1.5, 1.25));
        assert_eq!(cpu_seconds_in("rankd_ready 1\n"), None);
        assert_eq!(total_cpu_seconds_in(page), Some(3.75));
        assert_eq!(series_in(page, "process_cpu_seconds_total"), Some(3.0));
        assert_eq!(series_in(page, "process_cpu"), None, "a whole name only");
        assert_eq!(series_in(page, "rankd_thread_cpu_seconds_total"), None, "unlabelled series only");
    }

    #[test]
    fn reads_redis_cpu_fields() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n";
        assert_eq!(redis_cpu_seconds(info), Some(3.75));
        assert_eq!(redis_cpu_seconds("# CPU\r\nused_cpu_sys:1.5\r\n"), None);
    }

    #[test]
    fn reads_the_machine_line_of_proc_stat() {
        let stat = "cpu  100 5 20 300 40 1 4 30 7 0\ncpu0 50 2 10 150 20 0 2 15 0 0\nintr 1 2 3\n";
        let cpu = machine_cpu_in(stat).unwrap();
        assert_eq!(cpu, MachineCpu { busy: 1.6, idle: 3.4 });
        assert_eq!(machine_cpu_in("cpu  1 2 3 4 5 6 7\n"), Some(MachineCpu { busy: 0.19, idle: 0.09 }));
        assert_eq!(machine_cpu_in("cpu  1 2 3\n"), None);
        assert_eq!(machine_cpu_in("cpu0 1 2 3 4 5 6 7 8\n"), None);
        let later = MachineCpu { busy: 2.5, idle: 4.0 };
        let used = later.since(cpu);
        assert!((used.busy - 0.9).abs() < 1e-9 && (used.idle - 0.6).abs() < 1e-9, "{used:?}");
    }

    #[test]
    fn own_and_machine_cpu_grow_with_work() {
        let before = own_cpu_seconds().expect("/proc/self/stat");
        let machine_before = machine_cpu_seconds().expect("/proc/stat");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = own_cpu_seconds().expect("/proc/self/stat");
        assert!(after - before >= 0.1, "{before} -> {after} after 300 ms of spinning");
        let machine = machine_cpu_seconds().expect("/proc/stat").since(machine_before);
        assert!(machine.busy >= 0.1, "the machine was busy {machine:?} while this process spun 300 ms");
    }
}
