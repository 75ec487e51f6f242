//! The whole filesystem: the inode table, open handles, the fault switches
//! and the counters, plus the bookkeeping that frees inodes nothing needs.
//!
//! Operations live beside it, one concept a file: names in
//! `namespace.rs`, bytes and fsync in `data.rs`, the power cut in `cut.rs`.
//! Every one of them starts with [`Fs::alive`], so after a cut everything
//! fails with EIO until [`Fs::resume`]; the daemon holds the whole `Fs`
//! under one mutex, which is what makes a cut atomic with respect to every
//! operation.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::time::Duration;

use crate::dir::{DirState, Ino};
use crate::errno::{Errno, Result};
use crate::inode::{Attr, Body, Inode, Kind, Meta, ROOT};
use crate::rng::Rng;
use crate::stats::Stats;

/// The fault switches of the control commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// `fsync-delay MS`: each fsync and fsyncdir sleeps this long first.
    pub fsync_delay: Duration,
    /// `fsync-fail on`: fsync and fsyncdir fail with EIO and persist nothing.
    pub fsync_fail: bool,
    /// `write-fail on` (EIO) or `write-fail enospc` (ENOSPC): writes and
    /// fallocate fail with this error and change nothing.
    pub write_fail: Option<Errno>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirItem {
    /// Its inode.
    pub ino: Ino,
    /// File or directory.
    pub kind: Kind,
    /// Its name (`.` and `..` included).
    pub name: OsString,
}

/// An open file or directory. A directory handle keeps the listing taken
/// when it was read from offset 0, so `readdir` offsets stay stable while
/// the directory changes.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    pub(crate) ino: Ino,
    pub(crate) listing: Option<Vec<DirItem>>,
}

/// Filesystem-wide numbers for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSize {
    /// 4 KiB blocks in use.
    pub used_blocks: u64,
    /// Live inodes.
    pub inodes: u64,
}

/// The in-memory filesystem with its volatile and durable states.
#[derive(Debug)]
pub struct Fs {
    pub(crate) inodes: BTreeMap<Ino, Inode>,
    next_ino: Ino,
    pub(crate) handles: HashMap<u64, Handle>,
    next_fh: u64,
    pub(crate) dead: bool,
    pub(crate) faults: Faults,
    pub(crate) stats: Stats,
    pub(crate) rng: Rng,
}

impl Fs {
    /// An empty filesystem whose root has `root` as its metadata. `rng_seed`
    /// seeds the generator that picks the seeds of cuts given none.
    pub fn new(rng_seed: u64, root: Meta) -> Self {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::new(Body::Dir(DirState::new(ROOT)), root));
        Fs {
            inodes,
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            dead: false,
            faults: Faults::default(),
            stats: Stats { rng_seed, ..Stats::default() },
            rng: Rng::new(rng_seed),
        }
    }

    /// EIO once the power is cut, until `resume`.
    pub fn alive(&self) -> Result<()> {
        if self.dead {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    /// Whether the filesystem is dead (cut and not resumed).
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Brings the filesystem back after a cut, with its durable state.
    pub fn resume(&mut self) {
        self.dead = false;
        self.stats.dead = false;
    }

    /// The fault switches.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// Sets the fault switches.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// The counters, with the live inode count filled in.
    pub fn stats(&self) -> Stats {
        Stats { inodes: self.inodes.len() as u64, ..self.stats }
    }

    /// Space and inodes in use.
    pub fn size(&self) -> FsSize {
        let used_blocks = self
            .inodes
            .values()
            .map(|inode| match &inode.body {
                Body::File(f) => f.current().allocated_pages(),
                Body::Dir(_) => 1,
            })
            .sum();
        FsSize { used_blocks, inodes: self.inodes.len() as u64 }
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.alive()?;
        Ok(self.inode(ino)?.attr(ino))
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    pub(crate) fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    pub(crate) fn dir(&self, ino: Ino) -> Result<&DirState> {
        self.inode(ino)?.dir().ok_or(Errno::ENOTDIR)
    }

    pub(crate) fn dir_mut(&mut self, ino: Ino) -> Result<&mut DirState> {
        self.inode_mut(ino)?.dir_mut().ok_or(Errno::ENOTDIR)
    }

    /// Adds a new inode with no references yet (the caller links it).
    pub(crate) fn add_inode(&mut self, body: Body, meta: Meta) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Inode::new(body, meta));
        ino
    }

    /// Opens `ino`: a new handle, which keeps the inode alive until
    /// released. Handle numbers are never reused, so a handle from before a
    /// cut (when all handles are dropped) stays stale forever.
    pub fn open(&mut self, ino: Ino) -> Result<u64> {
        self.alive()?;
        self.inode_mut(ino)?.refs.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { ino, listing: None });
        Ok(fh)
    }

    /// Releases a handle; a stale one is ignored (release cannot fail).
    pub fn release(&mut self, fh: u64) {
        if let Some(handle) = self.handles.remove(&fh) {
            if let Some(inode) = self.inodes.get_mut(&handle.ino) {
                inode.refs.open = inode.refs.open.saturating_sub(1);
            }
            self.free_if_unused(handle.ino);
        }
    }

    /// Checks that `fh` is a live handle on `ino`: EIO if it is stale (from
    /// before a cut) or belongs to another inode.
    pub(crate) fn check_handle(&self, ino: Ino, fh: u64) -> Result<&Handle> {
        match self.handles.get(&fh) {
            Some(handle) if handle.ino == ino => Ok(handle),
            _ => Err(Errno::EIO),
        }
    }

    /// `flush` (each close): nothing to do but report a dead filesystem or a
    /// stale handle.
    pub fn flush(&self, ino: Ino, fh: u64) -> Result<()> {
        self.alive()?;
        self.check_handle(ino, fh).map(|_| ())
    }

    /// One more current entry names `ino`.
    pub(crate) fn link_current(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.refs.current += 1;
        }
    }

    /// One current entry naming `ino` is gone.
    pub(crate) fn unlink_current(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.refs.current = inode.refs.current.saturating_sub(1);
        }
        self.free_if_unused(ino);
    }

    /// A durable entry now names `new` instead of `old` (an fsyncdir).
    pub(crate) fn relink_durable(&mut self, old: Option<Ino>, new: Option<Ino>) {
        if let Some(inode) = new.and_then(|ino| self.inodes.get_mut(&ino)) {
            inode.refs.durable += 1;
        }
        if let Some(old) = old {
            if let Some(inode) = self.inodes.get_mut(&old) {
                inode.refs.durable = inode.refs.durable.saturating_sub(1);
            }
            self.free_if_unused(old);
        }
    }

    /// Frees `ino` if nothing needs it, and then whatever only it needed
    /// (the entries of a freed directory). Iterative: trees can be deep.
    pub(crate) fn free_if_unused(&mut self, ino: Ino) {
        let mut candidates = vec![ino];
        while let Some(ino) = candidates.pop() {
            let unused = ino != ROOT && self.inodes.get(&ino).is_some_and(|inode| inode.refs.unused());
            if !unused {
                continue;
            }
            let Some(inode) = self.inodes.remove(&ino) else { continue };
            if let Body::Dir(dir) = inode.body {
                for (_, child) in dir.entries() {
                    if let Some(c) = self.inodes.get_mut(&child) {
                        c.refs.current = c.refs.current.saturating_sub(1);
                    }
                    candidates.push(child);
                }
                for (_, child) in dir.durable_entries() {
                    if let Some(c) = self.inodes.get_mut(&child) {
                        c.refs.durable = c.refs.durable.saturating_sub(1);
                    }
                    candidates.push(child);
                }
            }
        }
    }

    /// Makes everything durable at once: after seeding, whose tree counts as
    /// already on disk, and for the `sync` command (a test's baseline).
    pub fn sync_everything(&mut self) {
        let inos: Vec<Ino> = self.inodes.keys().copied().collect();
        for ino in inos {
            let relinks = match self.inodes.get_mut(&ino).map(|inode| &mut inode.body) {
                Some(Body::File(f)) => {
                    f.sync();
                    Vec::new()
                }
                Some(Body::Dir(d)) => d.sync(),
                None => Vec::new(),
            };
            for relink in relinks {
                self.relink_durable(relink.old, relink.new);
            }
        }
    }
}
