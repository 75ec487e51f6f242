//! The daemon: mounts the filesystem, prints `ready`, then obeys one
//! control command a line from stdin until `quit`, EOF or a stop signal,
//! and unmounts.
//!
//! Commands are applied under the same lock as every filesystem operation,
//! so a `cut` falls between two operations, never inside one.

mod fuse;
mod mount;
mod signals;

use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use clap::Parser;

use crate::control::{Command, Reply, WriteFail};
use crate::rng::Rng;
use crate::{seed, Errno, Fs, Meta};

pub use fuse::PowerCutFs;

/// `rankd-powercut MOUNTPOINT [--seed DIR] [--seed-rng N] [--threads N]`.
#[derive(Debug, Parser)]
#[command(
    name = "rankd-powercut",
    about = "A FUSE filesystem that simulates power cuts: changes since the last fsync are dropped on `cut`.",
    after_help = "Prints `ready` once mounted, then reads commands on stdin, one a line, answering each with \
                  `ok`, `ok {json}` or `error MESSAGE`: cut [prefix|torn] [SEED], resume, sync, fsync-delay MS, \
                  fsync-fail on|off, write-fail on|enospc|off, stats, quit. EOF, quit and SIGTERM unmount."
)]
pub struct Args {
    /// An existing, empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Copy this directory's tree in at mount, as fully durable state.
    #[arg(long, value_name = "DIR")]
    pub seed: Option<PathBuf>,
    /// Seed of the generator that picks what `cut prefix`/`cut torn` keep
    /// (default: from the clock; `stats` reports it).
    #[arg(long = "seed-rng", value_name = "N")]
    pub seed_rng: Option<u64>,
    /// FUSE worker threads (a sleeping fsync holds one).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub threads: usize,
    /// Log each command and its reply on stderr.
    #[arg(long)]
    pub verbose: bool,
}

/// What the control loop waits for.
enum Event {
    Line(String),
    Eof,
    Signal(i32),
}

/// Runs the daemon until it is told to stop. Errors are for stderr.
pub fn run(args: Args) -> Result<(), String> {
    let (sender, events) = mpsc::channel();
    // First: the signal mask must be set before any other thread exists.
    signals::forward_stop_signals(sender.clone(), Event::Signal).map_err(|e| format!("signals: {e}"))?;

    let root =
        std::fs::metadata(&args.mountpoint).map_err(|e| format!("mountpoint {}: {e}", args.mountpoint.display()))?;
    let root = {
        use std::os::unix::fs::MetadataExt;
        Meta::new((root.mode() & 0o7777) as u16, root.uid(), root.gid())
    };
    let rng_seed = args.seed_rng.unwrap_or_else(Rng::seed_from_clock);
    let mut model = Fs::new(rng_seed, root);
    if let Some(dir) = &args.seed {
        let report = seed(&mut model, dir).map_err(|e| format!("seeding from {}: {e}", dir.display()))?;
        if report.skipped > 0 {
            eprintln!(
                "rankd-powercut: seeding skipped {} entries that are neither files nor directories",
                report.skipped
            );
        }
    }
    let fs = Arc::new(Mutex::new(model));
    let mounted = mount::mount(PowerCutFs::new(fs.clone()), &args.mountpoint, args.threads)
        .map_err(|e| format!("mounting on {}: {e}", args.mountpoint.display()))?;

    thread::Builder::new()
        .name("powercut-stdin".into())
        .spawn(move || {
            for line in io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if sender.send(Event::Line(line)).is_err() {
                    break;
                }
            }
            let _ = sender.send(Event::Eof);
        })
        .map_err(|e| format!("stdin thread: {e}"))?;

    let mut stdout = io::stdout().lock();
    let ready = writeln!(stdout, "ready").and_then(|()| stdout.flush());
    let mut outcome = ready.map_err(|e| format!("stdout: {e}"));
    while outcome.is_ok() {
        let line = match events.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Line(line)) => line,
            Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Event::Signal(signal)) => {
                eprintln!("rankd-powercut: signal {signal}: unmounting");
                break;
            }
            Err(RecvTimeoutError::Timeout) if mounted.ended() => {
                outcome = Err("the filesystem was unmounted from outside".into());
                break;
            }
            Err(RecvTimeoutError::Timeout) => continue,
        };
        if line.trim().is_empty() {
            continue;
        }
        let command = Command::parse(&line);
        if command == Ok(Command::Quit) {
            let reply = match mounted.unmount() {
                Ok(()) => Reply::Ok(None),
                Err(e) => Reply::Error(format!("unmount: {e}")),
            };
            let _ = writeln!(stdout, "{}", reply.to_line()).and_then(|()| stdout.flush());
            return match reply {
                Reply::Error(message) => Err(message),
                Reply::Ok(_) => Ok(()),
            };
        }
        let reply = match command {
            Ok(command) => apply(&fs, command),
            Err(message) => Reply::Error(message),
        };
        if args.verbose {
            eprintln!("rankd-powercut: {} -> {}", line.trim(), reply.to_line());
        }
        outcome =
            writeln!(stdout, "{}", reply.to_line()).and_then(|()| stdout.flush()).map_err(|e| format!("stdout: {e}"));
    }
    let unmounted = mounted.unmount().map_err(|e| format!("unmount: {e}"));
    outcome.and(unmounted)
}

/// Applies one command (not `quit`) to the model, under its lock.
fn apply(fs: &Mutex<Fs>, command: Command) -> Reply {
    let mut fs = fs.lock().unwrap_or_else(PoisonError::into_inner);
    let mut faults = fs.faults();
    match command {
        Command::Cut { mode, seed } => {
            return match fs.cut(mode, seed) {
                Ok(report) => Reply::Ok(Some(report.to_json())),
                Err(message) => Reply::Error(message),
            }
        }
        Command::Resume => fs.resume(),
        Command::Sync => {
            if fs.is_dead() {
                return Reply::Error("the power is cut: resume first".into());
            }
            fs.sync_everything();
        }
        Command::FsyncDelay(delay) => faults.fsync_delay = delay,
        Command::FsyncFail(fail) => faults.fsync_fail = fail,
        Command::WriteFail(fail) => {
            faults.write_fail = match fail {
                WriteFail::Off => None,
                WriteFail::Eio => Some(Errno::EIO),
                WriteFail::Enospc => Some(Errno::ENOSPC),
            }
        }
        Command::Stats => return Reply::Ok(Some(fs.stats().to_json())),
        Command::Quit => return Reply::Error("quit is handled by the control loop".into()),
    }
    fs.set_faults(faults);
    Reply::Ok(None)
}
