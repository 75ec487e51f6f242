//! Starting and stopping `rankd serve` processes, for sweeps and tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// The `rankd` executable: `$RANKD_BIN`, else `rankd` beside this executable
/// (or one directory up, where cargo puts test executables).
pub fn locate_rankd() -> Result<PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("RANKD_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let near = exe.ancestors().skip(1).take(2).map(|dir| dir.join("rankd")).find(|path| path.is_file());
    near.ok_or_else(|| {
        BenchError::Invalid(format!(
            "no `rankd` next to {}: build it (`cargo build --release -p rankd`), or pass --rankd / set RANKD_BIN",
            exe.display()
        ))
    })
}

/// A `rankd serve` child process.
pub struct ServeProcess {
    /// The process, sent SIGTERM by [`ServeProcess::stop`] and killed if
    /// dropped still running.
    child: Child,
    /// Its client address, `host:port`.
    pub addr: String,
    /// Its metrics address, `host:port`.
    pub metrics_addr: String,
}

impl ServeProcess {
    /// Starts `exe serve` on loopback ports chosen by the OS and waits for
    /// its `rankd listening on ADDR metrics METRICS_ADDR` line.
    pub fn start(exe: &Path, data_dir: &Path, shards: usize, extra: &[String]) -> Result<Self, BenchError> {
        let mut child = Command::new(exe)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--shards", &shards.to_string()])
            .args(extra)
            .env("RANKD_LOG", std::env::var("RANKD_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| BenchError::Other("no stdout from rankd serve".into()))?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        let addrs = line
            .trim()
            .strip_prefix("rankd listening on ")
            .and_then(|rest| rest.split_once(" metrics "))
            .filter(|(addr, metrics)| !addr.is_empty() && !metrics.is_empty())
            .map(|(addr, metrics)| (addr.to_string(), metrics.to_string()));
        match (read, addrs) {
            (Ok(_), Some((addr, metrics_addr))) => {
                // Keep draining stdout so the server never blocks on it.
                std::thread::spawn(move || for _ in reader.lines() {});
                Ok(Self { child, addr, metrics_addr })
            }
            (read, _) => {
                let _ = child.kill();
                let status = child.wait()?;
                read?;
                Err(BenchError::Other(format!(
                    "rankd serve --shards {shards} did not start ({status}); first line: {:?}",
                    line.trim()
                )))
            }
        }
    }

    /// SIGTERM, then waits (60 s at most, then SIGKILL).
    pub fn stop(mut self) -> Result<ExitStatus, BenchError> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).stdout(Stdio::null()).status()?;
        if !sent.success() {
            return Err(BenchError::Other(format!("kill -TERM {pid} failed ({sent})")));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(BenchError::Other(format!("rankd serve (pid {pid}) ignored SIGTERM for 60 s; killed")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
