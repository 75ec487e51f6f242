//! The power cut itself.
//!
//! Under the filesystem lock, in one step: every file drops what was not
//! fsynced (or, in the prefix and torn modes, keeps a random prefix of its
//! changes), every directory drops entries that were not fsyncdir'ed,
//! inodes no durable entry reaches from the root are freed, every open
//! handle goes stale, and the filesystem goes dead (EIO) until `resume`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;

use crate::dir::Ino;
use crate::file::{FileState, Keep};
use crate::fs::Fs;
use crate::inode::{Body, Kind, Refs, ROOT};
use crate::rng::Rng;
use crate::stats::{CutMode, CutReport};

/// Sectors are written whole: a torn write breaks at a multiple of this.
const SECTOR: u64 = 512;

impl Fs {
    /// Cuts the power. `seed` picks the prefixes kept (`None`: the next
    /// number of the daemon's generator); the report says which seed was
    /// used, so passing it again to the same history replays the cut.
    /// Fails if the filesystem is already dead.
    pub fn cut(&mut self, mode: CutMode, seed: Option<u64>) -> Result<CutReport, String> {
        if self.dead {
            return Err("the power is already cut: resume first".into());
        }
        let seed = seed.unwrap_or_else(|| self.rng.next_u64());
        let mut rng = Rng::new(seed);
        let mut report = CutReport { mode, seed, ..CutReport::default() };
        // Inode order (a BTreeMap), so a seed picks the same prefixes again.
        for inode in self.inodes.values_mut() {
            match &mut inode.body {
                Body::File(file) if file.is_dirty() => {
                    let keep = choose_keep(file, mode, &mut rng);
                    report.bytes_dropped += file.revert(keep);
                    report.files_reverted += 1;
                }
                Body::File(_) => {}
                Body::Dir(dir) => report.entries_reverted += dir.revert() as u64,
            }
        }
        let before = self.inodes.len();
        self.keep_only_reachable();
        report.inodes_freed = (before - self.inodes.len()) as u64;
        self.handles.clear();
        self.dead = true;
        self.stats.dead = true;
        self.stats.cuts += 1;
        self.stats.last_cut = Some(report);
        Ok(report)
    }

    /// After the revert (current = durable everywhere): frees what the root
    /// does not reach, recounts references, and repairs a directory reached
    /// twice (possible when only one side of a cross-directory rename was
    /// fsynced) by dropping its later entries, so the tree stays a tree.
    fn keep_only_reachable(&mut self) {
        let mut reached: HashSet<Ino> = HashSet::from([ROOT]);
        let mut counts: HashMap<Ino, u32> = HashMap::new();
        let mut broken: Vec<(Ino, OsString)> = Vec::new();
        let mut queue = VecDeque::from([ROOT]);
        while let Some(dir_ino) = queue.pop_front() {
            let entries: Vec<(OsString, Ino)> = match self.inodes.get(&dir_ino).and_then(|inode| inode.dir()) {
                Some(dir) => dir.entries().map(|(name, ino)| (name.to_owned(), ino)).collect(),
                None => continue,
            };
            for (name, child) in entries {
                let first_visit = reached.insert(child);
                match self.inodes.get_mut(&child) {
                    Some(inode) if inode.kind() == Kind::File => *counts.entry(child).or_default() += 1,
                    Some(inode) if first_visit => {
                        if let Some(dir) = inode.dir_mut() {
                            dir.parent = dir_ino;
                        }
                        *counts.entry(child).or_default() += 1;
                        queue.push_back(child);
                    }
                    _ => broken.push((dir_ino, name)),
                }
            }
        }
        for (dir_ino, name) in broken {
            if let Some(dir) = self.inodes.get_mut(&dir_ino).and_then(|inode| inode.dir_mut()) {
                dir.forget(&name);
            }
        }
        self.inodes.retain(|ino, _| reached.contains(ino));
        for (ino, inode) in self.inodes.iter_mut() {
            let n = counts.get(ino).copied().unwrap_or(0);
            inode.refs = Refs { current: n, durable: n, open: 0 };
        }
    }
}

/// What the cut keeps of one dirty file.
fn choose_keep(file: &FileState, mode: CutMode, rng: &mut Rng) -> Keep {
    let changes = file.changes() as u64;
    match mode {
        CutMode::All => Keep::Nothing,
        CutMode::Prefix => Keep::Prefix { changes: rng.below(changes + 1) as usize, torn: None },
        CutMode::Torn => {
            let kept = 1 + rng.below(changes) as usize;
            let torn = file.write_extent(kept - 1).map(|(offset, len)| tear(offset, len, rng));
            Keep::Prefix { changes: kept, torn }
        }
    }
}

/// How many bytes of a write of `len` bytes at `offset` reach the disk when
/// it is torn: up to a random sector boundary strictly inside it, or none.
fn tear(offset: u64, len: usize, rng: &mut Rng) -> usize {
    let end = offset + len as u64;
    let first = (offset / SECTOR + 1) * SECTOR;
    let inside = if first < end { (end - 1 - first) / SECTOR + 1 } else { 0 };
    match rng.below(inside + 1) {
        0 => 0,
        pick => (first + (pick - 1) * SECTOR - offset) as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::Meta;
    use std::ffi::OsStr;

    fn meta() -> Meta {
        Meta::new(0o644, 0, 0)
    }

    #[test]
    fn tear_points_are_sector_aligned() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let kept = tear(1000, 1000, &mut rng);
            assert!(kept == 0 || kept == 24 || kept == 536, "{kept}");
            assert_eq!(tear(0, 100, &mut rng), 0);
            let kept = tear(0, 4096, &mut rng);
            assert!(kept % 512 == 0 && kept < 4096);
        }
    }

    #[test]
    fn cut_reverts_names_and_data_and_kills_handles() {
        let mut fs = Fs::new(5, Meta::new(0o755, 0, 0));
        let kept = fs.create_file(ROOT, OsStr::new("kept"), meta()).unwrap().ino;
        let fh = fs.open(kept).unwrap();
        fs.write(kept, fh, 0, b"durable").unwrap();
        fs.fsync(kept, fh).unwrap();
        let root_fh = fs.opendir(ROOT).unwrap();
        fs.fsyncdir(ROOT, root_fh).unwrap();
        fs.write(kept, fh, 7, b" and volatile").unwrap();
        let lost = fs.create_file(ROOT, OsStr::new("lost"), meta()).unwrap().ino;
        fs.unlink(ROOT, OsStr::new("kept")).unwrap();
        let report = fs.cut(CutMode::All, None).unwrap();
        assert_eq!(report.bytes_dropped, 13);
        assert_eq!(report.files_reverted, 1);
        assert_eq!(report.entries_reverted, 2);
        assert_eq!(report.inodes_freed, 1);
        assert!(fs.lookup(ROOT, OsStr::new("kept")).is_err());
        assert!(fs.cut(CutMode::All, None).is_err());
        fs.resume();
        assert_eq!(fs.lookup(ROOT, OsStr::new("kept")).unwrap().size, 7);
        assert!(fs.lookup(ROOT, OsStr::new("lost")).is_err());
        assert!(fs.getattr(lost).is_err());
        assert!(fs.read(kept, fh, 0, 10).is_err());
        let fh = fs.open(kept).unwrap();
        assert_eq!(fs.read(kept, fh, 0, 100).unwrap(), b"durable");
    }

    #[test]
    fn directory_reached_twice_is_repaired() {
        let mut fs = Fs::new(5, Meta::new(0o755, 0, 0));
        let a = fs.mkdir(ROOT, OsStr::new("a"), meta()).unwrap().ino;
        let b = fs.mkdir(ROOT, OsStr::new("b"), meta()).unwrap().ino;
        let d = fs.mkdir(a, OsStr::new("d"), meta()).unwrap().ino;
        for ino in [ROOT, a] {
            let fh = fs.opendir(ino).unwrap();
            fs.fsyncdir(ino, fh).unwrap();
        }
        fs.rename(a, OsStr::new("d"), b, OsStr::new("d"), crate::namespace::RenameMode::Replace).unwrap();
        let fh = fs.opendir(b).unwrap();
        fs.fsyncdir(b, fh).unwrap();
        fs.cut(CutMode::All, Some(1)).unwrap();
        fs.resume();
        let in_a = fs.lookup(a, OsStr::new("d")).is_ok();
        let in_b = fs.lookup(b, OsStr::new("d")).is_ok();
        assert!(in_a != in_b, "d must be in exactly one place");
        assert!(fs.getattr(d).is_ok());
    }

    #[test]
    fn same_seed_same_prefixes() {
        let run = |seed| {
            let mut fs = Fs::new(5, Meta::new(0o755, 0, 0));
            let f = fs.create_file(ROOT, OsStr::new("f"), meta()).unwrap().ino;
            let fh = fs.open(f).unwrap();
            let root_fh = fs.opendir(ROOT).unwrap();
            fs.fsyncdir(ROOT, root_fh).unwrap();
            for i in 0..50u8 {
                fs.write(f, fh, u64::from(i) * 100, &[i + 1; 100]).unwrap();
            }
            fs.cut(CutMode::Torn, Some(seed)).unwrap();
            fs.resume();
            let fh = fs.open(f).unwrap();
            fs.read(f, fh, 0, 10_000).unwrap()
        };
        assert_eq!(run(11), run(11));
        let sizes: HashSet<usize> = (0..20).map(|seed| run(seed).len()).collect();
        assert!(sizes.len() > 3, "prefix lengths should vary with the seed: {sizes:?}");
    }
}
