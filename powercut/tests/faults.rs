//! Slow and failing disks, the dead state, the control protocol and the
//! daemon's clean exits (quit, EOF, SIGTERM, and SIGKILL with auto_unmount).

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{errno, fsync_dir, fuse_available, mount, BINARY};
use powercut::{is_mounted, Command as Control, WriteFail};

/// Case 6: Under fsync-fail, fsync and fsyncdir fail and persist nothing; the
/// dirty data stays dirty and a later good fsync persists it.
#[test]
fn fsync_fail_persists_nothing() {
    let Some(m) = mount() else { return };
    let path = m.path("f");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_all().unwrap();
    fsync_dir(m.root()).unwrap();

    m.layer.set_fsync_fail(true).unwrap();
    f.write_all(b" unsynced").unwrap();
    assert_eq!(errno(f.sync_all()), Some(libc::EIO));
    assert_eq!(errno(f.sync_data()), Some(libc::EIO));
    fs::write(m.path("new"), b"n").unwrap();
    assert_eq!(errno(fsync_dir(m.root())), Some(libc::EIO));
    let stats = m.layer.stats().unwrap();
    assert_eq!(stats.failed_fsyncs, 3);
    m.layer.cut().unwrap();
    m.layer.set_fsync_fail(false).unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"synced");
    assert!(!m.path("new").exists());

    // After the fault: the dirty data is still dirty, and a good fsync
    // persists it.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b" later").unwrap();
    m.layer.set_fsync_fail(true).unwrap();
    assert!(f.sync_all().is_err());
    m.layer.set_fsync_fail(false).unwrap();
    f.sync_all().unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"synced later");
}

/// Case 6: fsync-delay makes fsync slow but successful; other operations are
/// not held up by it.
#[test]
fn fsync_delay_delays() {
    let Some(m) = mount() else { return };
    let path = m.path("slow");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"x").unwrap();
    m.layer.set_fsync_delay(Duration::from_millis(300)).unwrap();
    let other = m.path("other");
    let (started, took) = std::thread::scope(|s| {
        let started = Instant::now();
        let syncing = s.spawn(|| f.sync_all());
        std::thread::sleep(Duration::from_millis(50));
        let before_other = Instant::now();
        fs::write(&other, b"meanwhile").unwrap();
        let took = before_other.elapsed();
        syncing.join().unwrap().unwrap();
        (started, took)
    });
    assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
    eprintln!("a write during a slow fsync took {took:?}");
    let started = Instant::now();
    fsync_dir(m.root()).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    m.layer.set_fsync_delay(Duration::ZERO).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"x");
}

/// write-fail: EIO (on) or ENOSPC (enospc), changing nothing.
#[test]
fn write_fail_fails_writes() {
    let Some(m) = mount() else { return };
    let path = m.path("w");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"ok").unwrap();
    m.layer.set_write_fail(WriteFail::Eio).unwrap();
    assert_eq!(errno(f.write_all(b"no")), Some(libc::EIO));
    m.layer.set_write_fail(WriteFail::Enospc).unwrap();
    assert_eq!(errno(f.write_all(b"no")), Some(libc::ENOSPC));
    m.layer.set_write_fail(WriteFail::Off).unwrap();
    f.write_all(b"!").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"ok!");
}

/// While dead everything fails with EIO; resume brings the durable state.
/// Bad commands get `error` and change nothing.
#[test]
fn dead_until_resume_and_command_errors() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("d")).unwrap();
    fsync_dir(m.root()).unwrap();
    m.layer.cut().unwrap();
    assert_eq!(errno(fs::metadata(m.path("d"))), Some(libc::EIO));
    assert_eq!(errno(File::create(m.path("x"))), Some(libc::EIO));
    assert_eq!(errno(fs::read_dir(m.root())), Some(libc::EIO));
    assert!(m.layer.cut().is_err(), "already cut");
    let stats = m.layer.stats().unwrap();
    assert!(stats.dead);
    assert_eq!(stats.cuts, 1);
    assert_eq!(stats.last_cut.unwrap().entries_reverted, 0);
    m.layer.resume().unwrap();
    assert!(m.path("d").is_dir());
    assert!(!m.layer.stats().unwrap().dead);
    assert!(m.layer.command(Control::Cut { mode: powercut::CutMode::Torn, seed: Some(1) }).is_ok());
    m.layer.resume().unwrap();
}

/// `sync` makes everything durable at once, and is refused while dead.
#[test]
fn sync_makes_everything_durable() {
    let Some(m) = mount() else { return };
    fs::create_dir_all(m.path("a/b")).unwrap();
    fs::write(m.path("a/b/f"), b"never fsynced").unwrap();
    let mut open = OpenOptions::new().append(true).open(m.path("a/b/f")).unwrap();
    m.layer.sync_all().unwrap();
    open.write_all(b", and lost").unwrap();
    m.layer.cut().unwrap();
    assert!(m.layer.sync_all().is_err(), "no sync while the power is cut");
    m.layer.resume().unwrap();
    assert_eq!(fs::read(m.path("a/b/f")).unwrap(), b"never fsynced");
}

/// Runs the daemon by hand and waits for `ready`.
fn spawn_daemon(mountpoint: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(BINARY).arg(mountpoint).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, stdout)
}

fn wait_unmounted(mountpoint: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !is_mounted(mountpoint).unwrap() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Unmounts whatever a failed assertion left, then fails.
fn assert_unmounted(mountpoint: &Path, how: &str) {
    if !wait_unmounted(mountpoint) {
        powercut::force_unmount(mountpoint).unwrap();
        panic!("{how} left the mount behind");
    }
}

/// EOF on stdin, SIGTERM and SIGKILL all leave no mount behind (SIGKILL
/// thanks to fusermount3's auto_unmount), and a mount in use is detached.
#[test]
fn daemon_exits_cleanly() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();

    let (mut child, _out) = spawn_daemon(&mnt);
    assert!(is_mounted(&mnt).unwrap());
    let busy = File::create(mnt.join("open-during-unmount")).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "EOF is a clean quit");
    assert_unmounted(&mnt, "EOF");
    drop(busy);

    let (mut child, _out) = spawn_daemon(&mnt);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success(), "SIGTERM is a clean quit");
    assert_unmounted(&mnt, "SIGTERM");

    if Command::new("fusermount3").arg("-V").output().is_ok() {
        let (mut child, _out) = spawn_daemon(&mnt);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_unmounted(&mnt, "SIGKILL (auto_unmount)");
    } else {
        eprintln!("no fusermount3 (Debian's fuse3): no auto_unmount, so the SIGKILL case is skipped");
    }

    let (mut child, mut out) = spawn_daemon(&mnt);
    writeln!(child.stdin.as_mut().unwrap(), "bogus\nquit").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("error "), "{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ok\n");
    assert!(!is_mounted(&mnt).unwrap(), "quit answers once unmounted");
    assert!(child.wait().unwrap().success());
}
