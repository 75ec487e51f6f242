//! [`Layer`]: a mounted power-cut filesystem, driven from a test.
//!
//! It runs the `rankd-powercut` binary as a child process and speaks the
//! line protocol of `control.rs` over its stdin and stdout. Std only, so a
//! test crate can use it without the daemon's dependencies (depend on this
//! package with `default-features = false`).
//!
//! ```no_run
//! use powercut::{CutMode, Layer};
//! # fn main() -> std::io::Result<()> {
//! let dir = std::env::temp_dir().join("powercut-doc");
//! std::fs::create_dir_all(&dir)?;
//! let layer = Layer::mount(powercut::find_binary()?, &dir)?;
//! // ... run the program under test on `dir` ...
//! layer.cut_with(CutMode::Prefix)?;
//! // ... kill the program under test ...
//! layer.resume()?;
//! // ... restart it on `dir` and check what it recovered ...
//! layer.quit()?;
//! # Ok(())
//! # }
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command as Process, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::control::{Command, Reply, WriteFail};
use crate::mounts::{force_unmount, is_mounted};
use crate::stats::{CutMode, CutReport, Stats};

/// The binary's name, as cargo builds it.
pub const BINARY_NAME: &str = "rankd-powercut";

/// How to start the daemon, beyond the mountpoint.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--seed DIR`: a tree copied in at mount, fully durable.
    pub seed_dir: Option<PathBuf>,
    /// `--seed-rng N`: the generator's seed, for replayable cuts.
    pub rng_seed: Option<u64>,
    /// `--threads N`: FUSE worker threads (the daemon's default if `None`).
    pub threads: Option<usize>,
    /// How long to wait for `ready` and for each reply.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { seed_dir: None, rng_seed: None, threads: None, timeout: Duration::from_secs(60) }
    }
}

/// Where the `rankd-powercut` binary is: `$RANKD_POWERCUT_BIN` if set, else
/// beside the running executable or in one of its parent directories (a
/// test binary runs from `target/<profile>/deps`, the binary sits in
/// `target/<profile>` once `cargo build -p rankd-powercut` has run, as it
/// has in any `cargo test --workspace`).
pub fn find_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("RANKD_POWERCUT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(BINARY_NAME);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no {BINARY_NAME} binary near {}: build it with `cargo build -p rankd-powercut` or set RANKD_POWERCUT_BIN",
            exe.display()
        ),
    ))
}

/// The pipes to the daemon, behind one lock so that each command gets its
/// own reply even when several threads share the layer.
#[derive(Debug)]
struct Pipes {
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// A mounted power-cut filesystem. Dropping it quits the daemon (unmounting)
/// and makes sure no mount is left behind, even if the daemon hung or died.
#[derive(Debug)]
pub struct Layer {
    child: Mutex<Child>,
    pipes: Mutex<Pipes>,
    mountpoint: PathBuf,
    timeout: Duration,
}

fn other(message: String) -> io::Error {
    io::Error::other(message)
}

impl Layer {
    /// Mounts a power-cut filesystem on `mountpoint` (an existing, empty
    /// directory) by running `binary`, and waits until it serves.
    pub fn mount(binary: impl AsRef<Path>, mountpoint: impl AsRef<Path>) -> io::Result<Layer> {
        Layer::mount_with(binary, mountpoint, &Options::default())
    }

    /// [`Layer::mount`] with options.
    pub fn mount_with(binary: impl AsRef<Path>, mountpoint: impl AsRef<Path>, options: &Options) -> io::Result<Layer> {
        let mountpoint = mountpoint.as_ref().canonicalize()?;
        let mut process = Process::new(binary.as_ref());
        process.arg(&mountpoint).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if let Some(seed_dir) = &options.seed_dir {
            process.arg("--seed").arg(seed_dir);
        }
        if let Some(seed) = options.rng_seed {
            process.arg("--seed-rng").arg(seed.to_string());
        }
        if let Some(threads) = options.threads {
            process.arg("--threads").arg(threads.to_string());
        }
        let mut child = process
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {}: {e}", binary.as_ref().display())))?;
        let stdout = child.stdout.take().ok_or_else(|| other("no stdout pipe".into()))?;
        let (sender, lines) = mpsc::channel();
        thread::Builder::new().name("powercut-replies".into()).spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        })?;
        let layer = Layer {
            pipes: Mutex::new(Pipes { stdin: child.stdin.take(), lines }),
            child: Mutex::new(child),
            mountpoint,
            timeout: options.timeout,
        };
        match layer.next_line() {
            Ok(line) if line == "ready" => Ok(layer),
            Ok(line) => Err(other(format!("expected ready from the daemon, got {line:?}"))),
            Err(e) => Err(other(format!("the daemon did not get ready: {e}"))),
        }
    }

    /// Where the filesystem is mounted (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power, dropping everything not fsynced. The filesystem is
    /// dead (EIO) until [`Layer::resume`].
    pub fn cut(&self) -> io::Result<CutReport> {
        self.cut_with(CutMode::All)
    }

    /// Cuts the power in the given mode, with a seed from the daemon's
    /// generator (the report says which).
    pub fn cut_with(&self, mode: CutMode) -> io::Result<CutReport> {
        self.cut_command(Command::Cut { mode, seed: None })
    }

    /// Cuts the power in the given mode with the given seed: the same seed
    /// after the same history keeps the same prefixes.
    pub fn cut_seeded(&self, mode: CutMode, seed: u64) -> io::Result<CutReport> {
        self.cut_command(Command::Cut { mode, seed: Some(seed) })
    }

    fn cut_command(&self, command: Command) -> io::Result<CutReport> {
        let json = self.command(command)?.ok_or_else(|| other("cut: no report".into()))?;
        CutReport::from_json(&json).map_err(other)
    }

    /// Turns the power back on: the durable state, handles from before the
    /// cut still stale.
    pub fn resume(&self) -> io::Result<()> {
        self.command(Command::Resume).map(drop)
    }

    /// Makes everything durable now, every file and every directory, as if
    /// the disk had caught up: a baseline after a test's setup, e.g. after
    /// the program under test created its directories (fjall 3.1 does not
    /// fsync `keyspaces/` after creating a keyspace's directory in it).
    pub fn sync_all(&self) -> io::Result<()> {
        self.command(Command::Sync).map(drop)
    }

    /// Makes every fsync and fsyncdir sleep `delay` first (zero: off).
    pub fn set_fsync_delay(&self, delay: Duration) -> io::Result<()> {
        self.command(Command::FsyncDelay(delay)).map(drop)
    }

    /// While on, fsync and fsyncdir fail with EIO and persist nothing.
    pub fn set_fsync_fail(&self, fail: bool) -> io::Result<()> {
        self.command(Command::FsyncFail(fail)).map(drop)
    }

    /// While on, writes (and fallocate) fail with EIO (`WriteFail::Eio`) or
    /// ENOSPC (`WriteFail::Enospc`) and change nothing.
    pub fn set_write_fail(&self, fail: WriteFail) -> io::Result<()> {
        self.command(Command::WriteFail(fail)).map(drop)
    }

    /// The daemon's counters.
    pub fn stats(&self) -> io::Result<Stats> {
        let json = self.command(Command::Stats)?.ok_or_else(|| other("stats: no report".into()))?;
        Stats::from_json(&json).map_err(other)
    }

    /// Sends one command; returns the JSON of an `ok {json}` reply.
    pub fn command(&self, command: Command) -> io::Result<Option<String>> {
        let line = {
            let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
            let stdin = pipes.stdin.as_mut().ok_or_else(|| other("the daemon has quit".into()))?;
            writeln!(stdin, "{}", command.to_line())?;
            stdin.flush()?;
            Layer::receive(&pipes.lines, self.timeout)?
        };
        match Reply::parse(&line).map_err(other)? {
            Reply::Ok(json) => Ok(json),
            Reply::Error(message) => Err(other(format!("{}: {message}", command.to_line()))),
        }
    }

    fn next_line(&self) -> io::Result<String> {
        let pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        Layer::receive(&pipes.lines, self.timeout)
    }

    fn receive(lines: &Receiver<String>, timeout: Duration) -> io::Result<String> {
        match lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                Err(io::Error::new(io::ErrorKind::TimedOut, format!("no reply from the daemon in {timeout:?}")))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the daemon exited".to_string()))
            }
        }
    }

    /// Unmounts and stops the daemon, reporting how it went (drop does the
    /// same but can only log).
    pub fn quit(self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> io::Result<()> {
        let mut result = Ok(());
        let stdin = self.pipes.lock().unwrap_or_else(|e| e.into_inner()).stdin.take();
        if let Some(mut stdin) = stdin {
            if writeln!(stdin, "quit").and_then(|_| stdin.flush()).is_ok() {
                let lines = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(line) = Layer::receive(&lines.lines, self.timeout) {
                    if let Ok(Reply::Error(message)) = Reply::parse(&line) {
                        result = Err(other(format!("quit: {message}")));
                    }
                }
            }
            // Closing stdin is a quit too, should the command have failed.
            drop(stdin);
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(10));
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && result.is_ok() {
                        result = Err(other(format!("the daemon exited with {status}")));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if result.is_ok() {
                        result = Err(other("the daemon did not exit; killed it".into()));
                    }
                    break;
                }
            }
        }
        if is_mounted(&self.mountpoint).unwrap_or(false) {
            force_unmount(&self.mountpoint)?;
            if result.is_ok() {
                result = Err(other("the daemon left its mount behind; unmounted it".into()));
            }
        }
        result
    }
}

impl Drop for Layer {
    fn drop(&mut self) {
        let running = self.child.get_mut().map(|c| matches!(c.try_wait(), Ok(None))).unwrap_or(false);
        if running || is_mounted(&self.mountpoint).unwrap_or(false) {
            if let Err(e) = self.shutdown() {
                eprintln!("powercut: while unmounting {}: {e}", self.mountpoint.display());
            }
        }
    }
}
