//! Mounting and unmounting.
//!
//! The mount asks fusermount3 for `auto_unmount`: fusermount3 then stays
//! behind, and when the daemon's end of its socket closes while the mount
//! is still there and dead (the daemon crashed or got SIGKILL), it unmounts,
//! so a killed daemon leaves no "Transport endpoint is not connected" mount
//! behind. A clean exit unmounts by itself first. Without fusermount3 (or where it refuses `allow_other`),
//! the mount falls back to a plain one, done directly when running as root.

use std::io;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

use super::fuse::PowerCutFs;
use crate::{force_unmount, is_mounted};

/// A mounted, serving filesystem.
#[derive(Debug)]
pub struct Mounted {
    unmounter: SessionUnmounter,
    serving: JoinHandle<io::Result<()>>,
    mountpoint: PathBuf,
}

fn config(threads: usize, auto_unmount: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("powercut".into()), MountOption::Subtype("powercut".into())];
    if auto_unmount {
        config.mount_options.push(MountOption::AutoUnmount);
        // fusermount3 only unmounts automatically with allow_other or
        // allow_root; fuser still serves only root and this user.
        config.acl = SessionACL::RootAndOwner;
    }
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    config
}

/// Mounts `fs` on `mountpoint` and serves it on `threads` threads. Returns
/// once the kernel has initialised the connection.
pub fn mount(fs: PowerCutFs, mountpoint: &Path, threads: usize) -> io::Result<Mounted> {
    let mountpoint = mountpoint.canonicalize()?;
    let mut session = match Session::new(fs.clone(), &mountpoint, &config(threads, true)) {
        Ok(session) => session,
        Err(e) => {
            eprintln!(
                "rankd-powercut: mounting with auto_unmount failed ({e}); mounting without it \
                 (should this process be killed, clean up with `fusermount3 -u -z {}`)",
                mountpoint.display()
            );
            Session::new(fs, &mountpoint, &config(threads, false))?
        }
    };
    let unmounter = session.unmount_callable();
    let serving = thread::Builder::new().name("powercut-fuse".into()).spawn(move || session.run())?;
    Ok(Mounted { unmounter, serving, mountpoint })
}

impl Mounted {
    /// Whether the session ended by itself (someone unmounted it).
    pub fn ended(&self) -> bool {
        self.serving.is_finished()
    }

    /// Unmounts: detaches the mount lazily (open files elsewhere do not
    /// keep it busy), then closes fusermount3's socket, which lets it exit
    /// (it unmounts by itself only if this process died first). The serving
    /// threads are not joined: they end when the connection does, at the
    /// latest when this process exits.
    pub fn unmount(mut self) -> io::Result<()> {
        let detached = if is_mounted(&self.mountpoint)? { force_unmount(&self.mountpoint) } else { Ok(()) };
        // Closes the auto_unmount socket; any error is moot once detached.
        let _ = self.unmounter.unmount();
        detached?;
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.serving.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}
