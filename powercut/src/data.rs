//! Bytes and durability: read, write, truncate, fallocate, setattr, and the
//! two operations that make state durable, fsync and fsyncdir.
//!
//! The fsync delay is not slept here: the daemon sleeps it before taking the
//! lock, so a slow fsync does not stall every other operation (a cut during
//! the sleep makes the fsync fail, as its handle is gone by then).

use std::time::SystemTime;

use crate::dir::Ino;
use crate::errno::{Errno, Result};
use crate::fs::Fs;
use crate::inode::{Attr, Body};

/// The largest file the model holds (16 GiB): its page table stays small.
pub const MAX_FILE_SIZE: u64 = 1 << 34;

/// `fallocate` mode bits (linux/falloc.h).
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// What a setattr changes; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    /// New permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size: truncate or extend (volatile until fsync).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SystemTime>,
    /// New modification time.
    pub mtime: Option<SystemTime>,
}

fn check_extent(offset: u64, len: u64) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(end),
        _ => Err(Errno::EFBIG),
    }
}

impl Fs {
    /// Reads up to `size` bytes of the current content.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        match &self.inode(ino)?.body {
            Body::File(f) => Ok(f.current().read(offset, size as usize)),
            Body::Dir(_) => Err(Errno::EISDIR),
        }
    }

    /// Writes `data` at `offset` (volatile until fsync). Fails with the
    /// `write-fail` fault's error, changing nothing, while it is on.
    pub fn write(&mut self, ino: Ino, fh: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        if let Some(errno) = self.faults.write_fail {
            return Err(errno);
        }
        check_extent(offset, data.len() as u64)?;
        let inode = self.inode_mut(ino)?;
        inode.file_mut().ok_or(Errno::EISDIR)?.write(offset, data);
        let now = SystemTime::now();
        inode.meta.mtime = now;
        inode.meta.ctime = now;
        self.stats.writes += 1;
        self.stats.bytes_written += data.len() as u64;
        Ok(data.len())
    }

    /// chmod, chown, utimes and truncate. A truncate through a handle
    /// (`ftruncate`) checks the handle.
    pub fn setattr(&mut self, ino: Ino, fh: Option<u64>, change: SetAttr) -> Result<Attr> {
        self.alive()?;
        if let Some(fh) = fh {
            self.check_handle(ino, fh)?;
        }
        if let Some(size) = change.size {
            check_extent(size, 0)?;
        }
        let inode = self.inode_mut(ino)?;
        let now = SystemTime::now();
        if let Some(size) = change.size {
            inode.file_mut().ok_or(Errno::EISDIR)?.set_len(size);
            inode.meta.mtime = now;
        }
        if let Some(mode) = change.mode {
            inode.meta.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = change.uid {
            inode.meta.uid = uid;
        }
        if let Some(gid) = change.gid {
            inode.meta.gid = gid;
        }
        if let Some(atime) = change.atime {
            inode.meta.atime = atime;
        }
        if let Some(mtime) = change.mtime {
            inode.meta.mtime = mtime;
        }
        inode.meta.ctime = now;
        Ok(inode.attr(ino))
    }

    /// fallocate: mode 0 extends the size (volatile, like a truncate);
    /// `KEEP_SIZE` alone does nothing (space is not modelled); `PUNCH_HOLE`
    /// and `ZERO_RANGE` write zeros. Other modes: EOPNOTSUPP.
    pub fn fallocate(&mut self, ino: Ino, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        let end = check_extent(offset, len)?;
        let keep_size = mode & FALLOC_FL_KEEP_SIZE != 0;
        let zero = match mode & !FALLOC_FL_KEEP_SIZE {
            0 => false,
            FALLOC_FL_PUNCH_HOLE if keep_size => true,
            FALLOC_FL_ZERO_RANGE => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        if let Some(errno) = self.faults.write_fail {
            return Err(errno);
        }
        let file = self.inode_mut(ino)?.file_mut().ok_or(Errno::EISDIR)?;
        if zero {
            let mut pos = offset;
            let stop = end.min(file.current().size());
            let zeros = vec![0u8; 1 << 16];
            while pos < stop {
                let take = (stop - pos).min(zeros.len() as u64) as usize;
                file.write(pos, &zeros[..take]);
                pos += take as u64;
            }
        }
        if !keep_size && end > file.current().size() {
            file.set_len(end);
        }
        Ok(())
    }

    /// fsync/fdatasync: the file's durable content becomes its current
    /// content (both the same here: sizes are data). On a directory it is
    /// fsyncdir. Fails with EIO, persisting nothing, under `fsync-fail`.
    pub fn fsync(&mut self, ino: Ino, fh: u64) -> Result<()> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        if self.faults.fsync_fail {
            self.stats.failed_fsyncs += 1;
            return Err(Errno::EIO);
        }
        match &mut self.inode_mut(ino)?.body {
            Body::File(f) => {
                f.sync();
                self.stats.fsyncs += 1;
                Ok(())
            }
            Body::Dir(_) => self.sync_dir(ino),
        }
    }

    /// fsyncdir: the directory's durable entries become its current ones.
    /// Fails with EIO, persisting nothing, under `fsync-fail`.
    pub fn fsyncdir(&mut self, ino: Ino, fh: u64) -> Result<()> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        if self.faults.fsync_fail {
            self.stats.failed_fsyncs += 1;
            return Err(Errno::EIO);
        }
        self.sync_dir(ino)
    }

    fn sync_dir(&mut self, ino: Ino) -> Result<()> {
        let relinks = self.dir_mut(ino)?.sync();
        for relink in relinks {
            self.relink_durable(relink.old, relink.new);
        }
        self.stats.fsyncdirs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Meta, ROOT};
    use std::ffi::OsStr;

    fn open_file(fs: &mut Fs, name: &str) -> (Ino, u64) {
        let ino = fs.create_file(ROOT, OsStr::new(name), Meta::new(0o644, 0, 0)).unwrap().ino;
        (ino, fs.open(ino).unwrap())
    }

    #[test]
    fn faults_change_nothing() {
        let mut fs = Fs::new(1, Meta::new(0o755, 0, 0));
        let (ino, fh) = open_file(&mut fs, "f");
        fs.write(ino, fh, 0, b"abc").unwrap();
        fs.set_faults(crate::fs::Faults { write_fail: Some(Errno::ENOSPC), ..Default::default() });
        assert_eq!(fs.write(ino, fh, 3, b"d"), Err(Errno::ENOSPC));
        fs.set_faults(crate::fs::Faults { fsync_fail: true, ..Default::default() });
        assert_eq!(fs.fsync(ino, fh), Err(Errno::EIO));
        assert_eq!(fs.read(ino, fh, 0, 10).unwrap(), b"abc");
        assert_eq!(fs.stats().failed_fsyncs, 1);
        assert_eq!(fs.stats().fsyncs, 0);
    }

    #[test]
    fn fallocate_modes() {
        let mut fs = Fs::new(1, Meta::new(0o755, 0, 0));
        let (ino, fh) = open_file(&mut fs, "f");
        fs.write(ino, fh, 0, &[5u8; 100]).unwrap();
        fs.fallocate(ino, fh, 0, 8192, 0).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, 8192);
        fs.fallocate(ino, fh, 0, 1 << 20, FALLOC_FL_KEEP_SIZE).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, 8192);
        fs.fallocate(ino, fh, 10, 20, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).unwrap();
        let data = fs.read(ino, fh, 0, 100).unwrap();
        assert!(data[10..30].iter().all(|&b| b == 0) && data[30] == 5 && data[9] == 5);
        assert_eq!(fs.fallocate(ino, fh, 0, 1, FALLOC_FL_PUNCH_HOLE), Err(Errno::EOPNOTSUPP));
        assert_eq!(fs.write(ino, fh, MAX_FILE_SIZE, b"x"), Err(Errno::EFBIG));
    }
}
