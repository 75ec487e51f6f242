//! `--seed DIR`: copies an existing directory tree in at mount time, as
//! fully durable state (as if it had been on the disk before the test).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::dir::Ino;
use crate::errno::Errno;
use crate::fs::Fs;
use crate::inode::{Meta, ROOT};

/// What a seeding copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeedReport {
    /// Regular files copied.
    pub files: u64,
    /// Directories copied (the root not counted).
    pub dirs: u64,
    /// Entries skipped: symlinks, devices, sockets and fifos (the model
    /// has only files and directories).
    pub skipped: u64,
}

fn meta_of(metadata: &fs::Metadata) -> Meta {
    let mut meta = Meta::new((metadata.mode() & 0o7777) as u16, metadata.uid(), metadata.gid());
    if let Ok(mtime) = metadata.modified() {
        meta.mtime = mtime;
    }
    meta
}

fn os_error(errno: Errno, path: &Path) -> io::Error {
    let error = io::Error::from_raw_os_error(errno.0);
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// Copies the tree under `source` into the root of `fs`, then makes
/// everything durable.
pub fn seed(fs: &mut Fs, source: &Path) -> io::Result<SeedReport> {
    let mut report = SeedReport::default();
    let mut pending: Vec<(PathBuf, Ino)> = vec![(source.to_owned(), ROOT)];
    while let Some((dir_path, dir_ino)) = pending.pop() {
        for entry in fs::read_dir(&dir_path)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            let metadata = fs::symlink_metadata(&path)?;
            if metadata.is_dir() {
                let ino = fs.mkdir(dir_ino, &name, meta_of(&metadata)).map_err(|e| os_error(e, &path))?.ino;
                pending.push((path, ino));
                report.dirs += 1;
            } else if metadata.is_file() {
                let data = fs::read(&path)?;
                let ino = fs.create_file(dir_ino, &name, meta_of(&metadata)).map_err(|e| os_error(e, &path))?.ino;
                let fh = fs.open(ino).map_err(|e| os_error(e, &path))?;
                let written = fs.write(ino, fh, 0, &data);
                fs.release(fh);
                written.map_err(|e| os_error(e, &path))?;
                report.files += 1;
            } else {
                report.skipped += 1;
            }
        }
    }
    fs.sync_everything();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::CutMode;
    use std::ffi::OsStr;

    #[test]
    fn seeded_tree_survives_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/data"), vec![3u8; 10_000]).unwrap();
        fs::write(dir.path().join("top"), b"top").unwrap();
        std::os::unix::fs::symlink("top", dir.path().join("link")).unwrap();
        let mut model = Fs::new(1, Meta::new(0o755, 0, 0));
        let report = seed(&mut model, dir.path()).unwrap();
        assert_eq!(report, SeedReport { files: 2, dirs: 1, skipped: 1 });
        model.cut(CutMode::All, None).unwrap();
        model.resume();
        let sub = model.lookup(ROOT, OsStr::new("sub")).unwrap().ino;
        assert_eq!(model.lookup(sub, OsStr::new("data")).unwrap().size, 10_000);
        assert_eq!(model.lookup(ROOT, OsStr::new("top")).unwrap().size, 3);
    }
}
