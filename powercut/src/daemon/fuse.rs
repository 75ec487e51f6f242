//! The FUSE adapter: each kernel request becomes one model operation under
//! the filesystem lock.
//!
//! Nothing is cached by the kernel: entry and attribute TTLs are zero and
//! files are opened with `FOPEN_DIRECT_IO` (no page cache), so every read
//! and write reaches the model and, after a cut, the kernel sees the
//! reverted state on its next lookup. Flock and POSIX locks are not
//! implemented here, so the kernel handles them locally.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};

use crate::{Attr, Errno, Fs, Kind, Meta, RenameMode, SetAttr, PAGE_SIZE};

/// Zero: the kernel asks again every time, so a cut is seen at once.
const TTL: Duration = Duration::ZERO;

/// Blocks `statfs` reports free (64 GiB of 4 KiB): space is not modelled,
/// but programs that check for room must find some.
const FREE_BLOCKS: u64 = 1 << 24;

/// Inodes `statfs` reports free.
const FREE_INODES: u64 = 1 << 24;

/// The filesystem as fuser sees it: the model behind its one lock.
#[derive(Debug, Clone)]
pub struct PowerCutFs {
    fs: Arc<Mutex<Fs>>,
}

fn errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: attr.meta.atime,
        mtime: attr.meta.mtime,
        ctime: attr.meta.ctime,
        crtime: attr.meta.ctime,
        kind: match attr.kind {
            Kind::File => FileType::RegularFile,
            Kind::Dir => FileType::Directory,
        },
        perm: attr.meta.perm,
        nlink: attr.nlink,
        uid: attr.meta.uid,
        gid: attr.meta.gid,
        rdev: 0,
        blksize: PAGE_SIZE as u32,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

fn new_meta(req: &Request, mode: u32, umask: u32) -> Meta {
    Meta::new((mode & !umask & 0o7777) as u16, req.uid(), req.gid())
}

impl PowerCutFs {
    /// Serves `fs`, shared with the control loop.
    pub fn new(fs: Arc<Mutex<Fs>>) -> Self {
        PowerCutFs { fs }
    }

    /// Runs `op` under the lock. A panic elsewhere must not wedge the mount,
    /// so a poisoned lock is used as is (the model has no torn invariants
    /// across a panic that matter more than unmounting cleanly).
    fn with<T>(&self, op: impl FnOnce(&mut Fs) -> T) -> T {
        let mut fs = self.fs.lock().unwrap_or_else(PoisonError::into_inner);
        op(&mut fs)
    }

    /// The fsync delay, slept without the lock; EIO at once if dead.
    fn fsync_delay(&self) -> Result<(), Errno> {
        let delay = self.with(|fs| fs.alive().map(|()| fs.faults().fsync_delay))?;
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        Ok(())
    }

    fn entry(&self, reply: ReplyEntry, result: Result<Attr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, self.with(|fs| fs.lookup(parent.0, name)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let result = self.with(|fs| {
            if let Some(fh) = fh {
                fs.flush(ino.0, fh.0)?;
            }
            fs.getattr(ino.0)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr { mode, uid, gid, size, atime: atime.map(time), mtime: mtime.map(time) };
        match self.with(|fs| fs.setattr(ino.0, fh.map(|f| f.0), change)) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Only regular files and directories are modelled.
            reply.error(fuser::Errno::from_i32(libc::EPERM));
            return;
        }
        self.entry(reply, self.with(|fs| fs.create_file(parent.0, name, new_meta(req, mode, umask))));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.entry(reply, self.with(|fs| fs.mkdir(parent.0, name, new_meta(req, mode, umask))));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(reply, self.with(|fs| fs.unlink(parent.0, name)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(reply, self.with(|fs| fs.rmdir(parent.0, name)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.is_empty() {
            RenameMode::Replace
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else {
            reply.error(fuser::Errno::from_i32(libc::EINVAL));
            return;
        };
        Self::empty(reply, self.with(|fs| fs.rename(parent.0, name, newparent.0, newname, mode)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|fs| fs.open(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.with(|fs| fs.read(ino.0, fh.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|fs| fs.write(ino.0, fh.0, offset, data)) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        Self::empty(reply, self.with(|fs| fs.flush(ino.0, fh.0)));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.with(|fs| fs.release(fh.0));
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let result = self.fsync_delay().and_then(|()| self.with(|fs| fs.fsync(ino.0, fh.0)));
        Self::empty(reply, result);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|fs| fs.opendir(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let result = self.with(|fs| {
            fs.readdir(ino.0, fh.0, offset, |item, next| {
                let kind = match item.kind {
                    Kind::File => FileType::RegularFile,
                    Kind::Dir => FileType::Directory,
                };
                reply.add(INodeNo(item.ino), next, kind, &item.name)
            })
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.with(|fs| fs.release(fh.0));
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let result = self.fsync_delay().and_then(|()| self.with(|fs| fs.fsyncdir(ino.0, fh.0)));
        Self::empty(reply, result);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.with(|fs| fs.alive().map(|()| fs.size())) {
            Ok(size) => reply.statfs(
                size.used_blocks + FREE_BLOCKS,
                FREE_BLOCKS,
                FREE_BLOCKS,
                size.inodes + FREE_INODES,
                FREE_INODES,
                PAGE_SIZE as u32,
                255,
                PAGE_SIZE as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // No permission checks (the tests run as root): existence only.
        Self::empty(reply, self.with(|fs| fs.getattr(ino.0).map(drop)));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            reply.error(fuser::Errno::from_i32(libc::EPERM));
            return;
        }
        let result = self.with(|fs| {
            let attr = fs.create_file(parent.0, name, new_meta(req, mode, umask))?;
            Ok((attr, fs.open(attr.ino)?))
        });
        match result {
            Ok((attr, fh)) => {
                reply.created(&TTL, &file_attr(&attr), Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.with(|fs| fs.fallocate(ino.0, fh.0, offset, length, mode)));
    }
}
