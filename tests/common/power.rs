//! A disk whose power can be cut: the `rankd-powercut` FUSE layer mounted
//! on a temporary directory, for the power-cut tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use powercut::{CutMode, CutReport, Layer};

/// `serve` flags that make the background work a cut should land in
/// (runs, checkpoints, memtable flushes) come often.
pub const BUSY_BACKGROUND: [&str; 6] =
    ["--debug-run-every", "300", "--debug-checkpoint-every", "100", "--debug-memtable-kib", "128"];

/// The layer, mounted; unmounted when dropped, before its directory goes
/// (declare it before a server on it, so the server is killed first).
pub struct PowerDisk {
    /// The layer: cut, resume, fault injection.
    pub layer: Layer,
    /// Declared after `layer`, so the mount goes first.
    root: tempfile::TempDir,
}

impl PowerDisk {
    /// Mounts a fresh layer. Needs root, /dev/fuse, fuse3's fusermount3
    /// and the `rankd-powercut` binary (`cargo build -p rankd-powercut`).
    pub fn mount() -> Self {
        let binary = powercut::find_binary().expect("the rankd-powercut binary (cargo build -p rankd-powercut)");
        let root = tempfile::tempdir().expect("temp dir");
        let mountpoint = root.path().join("disk");
        std::fs::create_dir(&mountpoint).expect("mountpoint");
        let layer =
            Layer::mount(&binary, &mountpoint).expect("mount the power-cut layer (root, /dev/fuse, fusermount3)");
        Self { layer, root }
    }

    /// `name` on the layer.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join("disk").join(name)
    }

    /// Starts `rankd serve` on `data_dir` without waiting for it, cuts the
    /// power `after` its start (while it recovers, if `after` is shorter
    /// than its start-up), kills it and turns the power back on.
    pub fn cut_while_starting(
        &self,
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
        after: Duration,
        mode: CutMode,
    ) -> CutReport {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rankd"))
            .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(["--shards", &shards.to_string()])
            .args(extra)
            .env("RANKD_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run rankd serve");
        std::thread::sleep(after);
        let cut = self.layer.cut_with(mode).expect("cut the power");
        let _ = child.kill();
        let _ = child.wait();
        self.layer.resume().expect("power on");
        cut
    }
}
