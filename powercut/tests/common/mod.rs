//! Shared by the integration tests: a real mount in a tempdir that goes
//! away with the value, even when the test panics (the `Layer` drop
//! unmounts before the tempdir is removed).

#![allow(dead_code)]

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use powercut::{Layer, Options};

/// The daemon built for these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_rankd-powercut");

/// A mounted power-cut filesystem. Field order matters: the layer (and its
/// mount) goes before the directory holding the mountpoint.
pub struct Mount {
    pub layer: Layer,
    _dir: tempfile::TempDir,
}

impl Mount {
    /// The mountpoint.
    pub fn root(&self) -> &Path {
        self.layer.mountpoint()
    }

    /// A path inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }
}

/// Whether FUSE is available; prints why a test is skipped if not.
pub fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        true
    } else {
        eprintln!("skipping: /dev/fuse is absent, so no FUSE filesystem can be mounted here");
        false
    }
}

/// Mounts with default options; `None` (test skipped) without /dev/fuse.
pub fn mount() -> Option<Mount> {
    mount_with(Options::default())
}

/// Mounts with `options`; `None` (test skipped) without /dev/fuse.
pub fn mount_with(options: Options) -> Option<Mount> {
    if !fuse_available() {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).expect("mkdir mountpoint");
    let layer = Layer::mount_with(BINARY, &mountpoint, &options).expect("mount the power-cut filesystem");
    Some(Mount { layer, _dir: dir })
}

/// fsync on a directory, the way programs do it.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// The errno of an I/O error, for asserts.
pub fn errno(result: io::Result<impl std::fmt::Debug>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}
