//! What survives a power cut, through a real FUSE mount: the model's rules
//! as a program sees them.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{errno, fsync_dir, mount};
use powercut::CutMode;

/// Case 1: Writes after the last fsync are gone after a cut; content and size
/// are what was fsynced. Handles from before the cut stay dead.
#[test]
fn unsynced_writes_are_dropped() {
    let Some(m) = mount() else { return };
    let path = m.path("f");
    let mut f = OpenOptions::new().create(true).truncate(true).write(true).open(&path).unwrap();
    f.write_all(b"hello ").unwrap();
    f.sync_all().unwrap();
    fsync_dir(m.root()).unwrap();
    f.write_all(b"world, and more that never reached the disk").unwrap();
    f.set_len(3).unwrap();
    f.write_all_at(b"!", 10).unwrap();

    let report = m.layer.cut().unwrap();
    assert_eq!(report.mode, CutMode::All);
    assert_eq!(report.files_reverted, 1);
    assert_eq!(report.bytes_dropped, 44, "{report:?}");
    assert_eq!(errno(fs::metadata(&path)), Some(libc::EIO), "dead until resume");
    m.layer.resume().unwrap();

    assert_eq!(fs::read(&path).unwrap(), b"hello ");
    assert_eq!(fs::metadata(&path).unwrap().len(), 6);
    assert_eq!(errno(f.write_all(b"x")), Some(libc::EIO), "a handle from before the cut is stale");
    drop(f);
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"again").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"hello again");
}

/// Case 2: A new file survives only if its directory was fsynced, whatever was
/// done to the file itself.
#[test]
fn new_file_needs_its_directory_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("d")).unwrap();
    fsync_dir(m.root()).unwrap();
    let lost = m.path("d/lost");
    let kept = m.path("d/kept");
    let mut f = File::create(&lost).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert!(!lost.exists(), "the file was fsynced but its directory was not");

    let mut f = File::create(&kept).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    fsync_dir(&m.path("d")).unwrap();
    let report = m.layer.cut().unwrap();
    assert_eq!(report.files_reverted, 0);
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&kept).unwrap(), b"data");
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 1);
}

/// Case 3: The zero-length-file trap: write tmp, rename over final, fsync the
/// directory but not the file: final exists and is empty after a cut.
#[test]
fn rename_over_without_file_fsync_leaves_an_empty_file() {
    let Some(m) = mount() else { return };
    let (tmp, target) = (m.path("config.tmp"), m.path("config"));
    let mut f = File::create(&target).unwrap();
    f.write_all(b"old content").unwrap();
    f.sync_all().unwrap();
    fsync_dir(m.root()).unwrap();

    fs::write(&tmp, b"new content").unwrap();
    fs::rename(&tmp, &target).unwrap();
    fsync_dir(m.root()).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert!(target.exists());
    assert_eq!(fs::read(&target).unwrap(), b"", "the new inode's data was never fsynced");
    assert!(!tmp.exists());

    // Done right: fsync the file before the rename, the directory after.
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"new content").unwrap();
    f.sync_all().unwrap();
    fs::rename(&tmp, &target).unwrap();
    fsync_dir(m.root()).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"new content");
    assert!(!tmp.exists());

    // Rename without the directory fsync: the old name and content return.
    fs::write(m.path("other"), b"x").unwrap();
    File::open(m.path("other")).unwrap().sync_all().unwrap();
    fs::rename(m.path("other"), &target).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"new content");
    assert!(!m.path("other").exists());
}

/// Case 4: An unlink is volatile until the directory is fsynced.
#[test]
fn unlink_without_directory_fsync_comes_back() {
    let Some(m) = mount() else { return };
    let path = m.path("victim");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"still here").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fsync_dir(m.root()).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    let report = m.layer.cut().unwrap();
    assert_eq!(report.entries_reverted, 1);
    m.layer.resume().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"still here");

    fs::remove_file(&path).unwrap();
    fsync_dir(m.root()).unwrap();
    let report = m.layer.cut().unwrap();
    assert_eq!(report.inodes_freed, 0, "freed when the directory fsync dropped its last name");
    m.layer.resume().unwrap();
    assert!(!path.exists());
    assert_eq!(m.layer.stats().unwrap().inodes, 1, "only the root is left");
}

const CHUNK: usize = 700;
const CHUNKS: usize = 20;

fn chunk(i: usize) -> Vec<u8> {
    vec![b'a' + i as u8; CHUNK]
}

/// Creates `name` (durably empty), appends the chunks unsynced, cuts with
/// `mode` and `seed`, and returns what survived.
fn cut_after_appends(m: &common::Mount, name: &str, mode: CutMode, seed: u64) -> Vec<u8> {
    let path = m.path(name);
    let mut f = File::create(&path).unwrap();
    f.sync_all().unwrap();
    fsync_dir(m.root()).unwrap();
    for i in 0..CHUNKS {
        f.write_all(&chunk(i)).unwrap();
    }
    let report = m.layer.cut_seeded(mode, seed).unwrap();
    assert_eq!(report.seed, seed);
    m.layer.resume().unwrap();
    fs::read(&path).unwrap()
}

/// Case 5: `cut prefix` keeps a prefix of the writes, `cut torn` a prefix whose
/// last write is cut at a sector boundary, both the same for the same seed.
#[test]
fn prefix_and_torn_cuts_keep_a_prefix_deterministically() {
    let Some(m) = mount() else { return };
    let all: Vec<u8> = (0..CHUNKS).flat_map(chunk).collect();
    let mut prefix_lengths = std::collections::BTreeSet::new();
    for seed in 0..12 {
        let got = cut_after_appends(&m, &format!("prefix{seed}"), CutMode::Prefix, seed);
        assert_eq!(got.len() % CHUNK, 0, "whole writes only");
        assert_eq!(got[..], all[..got.len()], "a prefix, in order");
        assert_eq!(got, cut_after_appends(&m, &format!("again{seed}"), CutMode::Prefix, seed), "replayable");
        prefix_lengths.insert(got.len());

        let torn = cut_after_appends(&m, &format!("torn{seed}"), CutMode::Torn, seed);
        assert_eq!(torn[..], all[..torn.len()], "a prefix, in order");
        let partial = torn.len() % CHUNK;
        assert!(partial == 0 || torn.len() % 512 == 0, "torn at a sector boundary: {}", torn.len());
        assert!(torn.len() < all.len(), "the last kept write is torn");
        assert_eq!(torn, cut_after_appends(&m, &format!("torn-again{seed}"), CutMode::Torn, seed));
    }
    assert!(prefix_lengths.len() > 3, "the seed should vary the prefix: {prefix_lengths:?}");
}

/// Case 7: A little database: records appended and fdatasync'ed one by one while
/// the power is cut at a random moment. Every record whose fsync returned is
/// there after the cut, in order, and nothing else but (with a torn cut) a
/// part of the one record after them.
#[test]
fn acknowledged_appends_survive_random_cuts() {
    let Some(m) = mount() else { return };
    let path = m.path("journal");
    File::create(&path).unwrap().sync_all().unwrap();
    fsync_dir(m.root()).unwrap();
    let mut next = 0u64;
    let mut lcg = 0x2545_f491_4f6c_dd1du64;
    for (round, mode) in [CutMode::All, CutMode::Torn, CutMode::Prefix].into_iter().enumerate() {
        lcg = lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let cut_at = next + 200 + (lcg >> 33) % 1600;
        let acked = Arc::new(AtomicU64::new(next));
        let writer = {
            let (acked, path) = (acked.clone(), path.clone());
            let first = next;
            thread::spawn(move || {
                let mut f = OpenOptions::new().append(true).custom_flags(0).open(&path).unwrap();
                let started = Instant::now();
                for seq in first..first + 2000 {
                    if f.write_all(&record(seq)).is_err() || f.sync_data().is_err() {
                        break;
                    }
                    acked.store(seq + 1, Ordering::SeqCst);
                }
                let done = acked.load(Ordering::SeqCst) - first;
                eprintln!("round: {done} appends+fdatasync at {:.0}/s", done as f64 / started.elapsed().as_secs_f64());
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.load(Ordering::SeqCst) < cut_at && !writer.is_finished() && Instant::now() < deadline {
            thread::yield_now();
        }
        m.layer.cut_with(mode).unwrap();
        writer.join().unwrap();
        let acked = acked.load(Ordering::SeqCst);
        m.layer.resume().unwrap();

        let data = fs::read(&path).unwrap();
        let whole = data.len() / RECORD;
        for (seq, bytes) in data.chunks(RECORD).enumerate() {
            let expected = record(seq as u64);
            assert_eq!(bytes, &expected[..bytes.len()], "round {round}: record {seq}");
        }
        assert!(whole as u64 >= acked, "round {round} ({mode:?}): {whole} records kept, {acked} acknowledged");
        assert!(data.len() <= (acked as usize + 1) * RECORD, "round {round}: more than was written");
        if mode == CutMode::All {
            assert_eq!(data.len() % RECORD, 0);
        }
        // Carry on from the last whole record, as a recovering program would.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len((whole * RECORD) as u64).unwrap();
        f.sync_all().unwrap();
        next = whole as u64;
    }
    assert!(m.layer.stats().unwrap().fsyncs >= 600);
}

const RECORD: usize = 16;

fn record(seq: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[8..].copy_from_slice(&seq.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    r
}

/// A journal of tens of MB fsynced after every small change: each fsync
/// costs what changed, not the file size (no timing asserted beyond a very
/// generous bound; the rate is printed).
#[test]
fn small_fsyncs_of_a_large_file_are_cheap() {
    let Some(m) = mount() else { return };
    let path = m.path("big");
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    let block = vec![7u8; 1 << 20];
    for i in 0..32u64 {
        f.write_all_at(&block, i << 20).unwrap();
    }
    f.sync_all().unwrap();
    fsync_dir(m.root()).unwrap();
    let started = Instant::now();
    for i in 0..1000u64 {
        f.write_all_at(&i.to_le_bytes(), (i * 4099) % (32 << 20)).unwrap();
        f.sync_data().unwrap();
    }
    let elapsed = started.elapsed();
    eprintln!("1000 small writes+fsyncs of a 32 MiB file: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(60));
    f.write_all_at(b"lost", 0).unwrap();
    m.layer.cut().unwrap();
    m.layer.resume().unwrap();
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 32 << 20);
    assert_eq!(&data[..8], &0u64.to_le_bytes());
    assert_eq!(&data[4099..4107], &1u64.to_le_bytes());
}
