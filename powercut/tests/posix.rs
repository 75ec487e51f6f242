//! The file operations databases use, through the mount: pread/pwrite,
//! O_APPEND, O_TRUNC, O_CREAT|O_EXCL, rename over, readdir, statfs, flock,
//! ftruncate, fallocate, fdatasync, directory fsync, and seeding.

mod common;

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use common::{errno, fsync_dir, mount, mount_with};
use powercut::Options;

#[test]
fn pread_pwrite_and_holes() {
    let Some(m) = mount() else { return };
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(m.path("f")).unwrap();
    f.write_all_at(b"tail", 10_000).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10_004);
    let mut buf = [1u8; 8];
    f.read_exact_at(&mut buf, 5000).unwrap();
    assert_eq!(buf, [0; 8], "a hole reads as zeros");
    f.read_exact_at(&mut buf[..4], 10_000).unwrap();
    assert_eq!(&buf[..4], b"tail");
    assert_eq!(f.read_at(&mut buf, 10_002).unwrap(), 2, "short read at the end");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    f.write_all_at(&big, 3).unwrap();
    let mut back = vec![0u8; big.len()];
    f.read_exact_at(&mut back, 3).unwrap();
    assert_eq!(back, big);
}

#[test]
fn append_truncate_and_exclusive_create() {
    let Some(m) = mount() else { return };
    let path = m.path("log");
    let mut a = OpenOptions::new().create(true).append(true).open(&path).unwrap();
    let mut b = OpenOptions::new().append(true).open(&path).unwrap();
    for i in 0..10 {
        a.write_all(format!("a{i};").as_bytes()).unwrap();
        b.write_all(format!("b{i};").as_bytes()).unwrap();
    }
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("a0;b0;a1;b1;") && text.ends_with("a9;b9;"), "{text}");

    let mut t = OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 0, "O_TRUNC");
    t.write_all(b"fresh").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"fresh");

    let excl = OpenOptions::new().write(true).create_new(true).open(m.path("lock"));
    assert!(excl.is_ok());
    let again = OpenOptions::new().write(true).create_new(true).open(m.path("lock"));
    assert_eq!(again.unwrap_err().kind(), ErrorKind::AlreadyExists);
}

#[test]
fn rename_over_readdir_and_directories() {
    let Some(m) = mount() else { return };
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    fs::rename(m.path("a"), m.path("b")).unwrap();
    assert_eq!(fs::read(m.path("b")).unwrap(), b"A");
    assert!(!m.path("a").exists());

    fs::create_dir_all(m.path("x/y/z")).unwrap();
    let names: BTreeSet<String> = (0..150).map(|i| format!("file-{i:03}")).collect();
    for name in &names {
        fs::write(m.path("x/y").join(name), name).unwrap();
    }
    let listed: BTreeSet<String> = fs::read_dir(m.path("x/y"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "z")
        .collect();
    assert_eq!(listed, names);
    assert_eq!(errno(fs::remove_dir(m.path("x/y"))), Some(libc::ENOTEMPTY));
    fs::rename(m.path("x/y"), m.path("moved")).unwrap();
    assert!(m.path("moved/z").is_dir());
    assert_eq!(fs::read(m.path("moved/file-007")).unwrap(), b"file-007");
    fs::remove_dir_all(m.path("moved")).unwrap();
    fs::remove_dir(m.path("x")).unwrap();
    let left: Vec<_> = fs::read_dir(m.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["b"]);

    // An unlinked file stays readable through an open handle.
    let mut f = File::open(m.path("b")).unwrap();
    fs::remove_file(m.path("b")).unwrap();
    let mut text = String::new();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "A");
}

#[test]
fn statfs_flock_ftruncate_fallocate_and_syncs() {
    let Some(m) = mount() else { return };
    let root = std::ffi::CString::new(m.root().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string and a zeroed statvfs to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(root.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_bsize, 4096);
    assert!(st.f_bavail > 0 && st.f_ffree > 0);

    let path = m.path("data");
    let mut f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    let other = File::open(&path).unwrap();
    // SAFETY: flock on open descriptors.
    unsafe {
        assert_eq!(libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
        assert_eq!(libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), -1);
        assert_eq!(libc::flock(f.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(libc::flock(other.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), 0);
    }

    f.write_all(&[9u8; 10_000]).unwrap();
    f.set_len(100).unwrap();
    f.set_len(5000).unwrap();
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 5000);
    assert!(data[..100].iter().all(|&b| b == 9) && data[100..].iter().all(|&b| b == 0));

    // SAFETY: fallocate on an open descriptor.
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 65_536) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 65_536);
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 65_536);
    assert_eq!(f.metadata().unwrap().blocks() % 8, 0);

    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"end").unwrap();
    f.sync_data().unwrap();
    fsync_dir(m.root()).unwrap();
    let before = m.layer.stats().unwrap();
    assert!(before.fsyncs >= 1 && before.fsyncdirs >= 1, "{before:?}");
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 65_539, "fallocate's size was fsynced with the data");
    assert!(data.ends_with(b"end"));
}

#[test]
fn seeded_tree_is_durable() {
    let seed = tempfile::tempdir().unwrap();
    fs::create_dir_all(seed.path().join("db/wal")).unwrap();
    fs::write(seed.path().join("db/wal/000001.log"), vec![1u8; 70_000]).unwrap();
    fs::write(seed.path().join("db/CURRENT"), b"MANIFEST-1\n").unwrap();
    let Some(m) =
        mount_with(Options { seed_dir: Some(seed.path().to_owned()), rng_seed: Some(7), ..Options::default() })
    else {
        return;
    };
    assert_eq!(fs::read(m.path("db/CURRENT")).unwrap(), b"MANIFEST-1\n");
    fs::write(m.path("db/CURRENT"), b"MANIFEST-2\n").unwrap();
    fs::remove_file(m.path("db/wal/000001.log")).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(m.path("db/CURRENT")).unwrap(), b"MANIFEST-1\n");
    assert_eq!(fs::read(m.path("db/wal/000001.log")).unwrap(), vec![1u8; 70_000]);
    assert_eq!(m.layer.stats().unwrap().rng_seed, 7);
}
