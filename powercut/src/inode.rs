//! Inodes: a file or a directory, its metadata, and the references that
//! keep it alive.
//!
//! Metadata (mode, owner, times) is not modelled as volatile: a cut keeps
//! it as it is. What a cut reverts is data, sizes and directory entries,
//! the things whose loss databases actually trip over.

use std::time::SystemTime;

use crate::content::PAGE_SIZE;
use crate::dir::{DirState, Ino};
use crate::file::FileState;

/// The root directory's inode number (FUSE's).
pub const ROOT: Ino = 1;

/// What an inode is.
#[derive(Debug, Clone)]
pub enum Body {
    /// A regular file.
    File(FileState),
    /// A directory.
    Dir(DirState),
}

/// The kind of an inode, for attributes and directory listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// Metadata kept as is across cuts.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    /// Permission bits (`0o7777`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last data change.
    pub mtime: SystemTime,
    /// Last inode change.
    pub ctime: SystemTime,
}

impl Meta {
    /// Metadata of a new inode, all times now.
    pub fn new(perm: u16, uid: u32, gid: u32) -> Self {
        let now = SystemTime::now();
        Meta { perm, uid, gid, atime: now, mtime: now, ctime: now }
    }
}

/// Why an inode is still needed. It is freed when all three reach zero:
/// no current entry names it, no durable entry does (a cut could bring it
/// back), and no handle has it open (unlinked but open files stay readable).
#[derive(Debug, Clone, Copy, Default)]
pub struct Refs {
    /// Current directory entries naming it.
    pub current: u32,
    /// Durable directory entries naming it.
    pub durable: u32,
    /// Open handles.
    pub open: u32,
}

impl Refs {
    /// Whether nothing needs the inode any more.
    pub fn unused(&self) -> bool {
        self.current == 0 && self.durable == 0 && self.open == 0
    }
}

/// An inode.
#[derive(Debug, Clone)]
pub struct Inode {
    /// File or directory state.
    pub body: Body,
    /// Mode, owner and times.
    pub meta: Meta,
    /// What keeps it alive.
    pub refs: Refs,
}

/// The attributes reported to the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// File or directory.
    pub kind: Kind,
    /// Size in bytes (the current size; entries count for directories).
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Hard links: current entries naming a file (0 once unlinked); 1 for a directory
    /// ("unknown", as btrfs reports, so `find` does not guess subdirectories).
    pub nlink: u32,
    /// Mode, owner and times.
    pub meta: Meta,
}

impl Inode {
    /// A new file or directory with fresh metadata and no references yet.
    pub fn new(body: Body, meta: Meta) -> Self {
        Inode { body, meta, refs: Refs::default() }
    }

    /// The kind of this inode.
    pub fn kind(&self) -> Kind {
        match self.body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
        }
    }

    /// Its attributes as the kernel should see them now.
    pub fn attr(&self, ino: Ino) -> Attr {
        let (size, blocks, nlink) = match &self.body {
            Body::File(f) => {
                let c = f.current();
                (c.size(), c.allocated_pages() * (PAGE_SIZE as u64 / 512), self.refs.current)
            }
            Body::Dir(d) => (d.len() as u64, 0, 1),
        };
        Attr { ino, kind: self.kind(), size, blocks, nlink, meta: self.meta }
    }

    /// The file state, if this is a file.
    pub fn file_mut(&mut self) -> Option<&mut FileState> {
        match &mut self.body {
            Body::File(f) => Some(f),
            Body::Dir(_) => None,
        }
    }

    /// The directory state, if this is a directory.
    pub fn dir(&self) -> Option<&DirState> {
        match &self.body {
            Body::Dir(d) => Some(d),
            Body::File(_) => None,
        }
    }

    /// The directory state, if this is a directory.
    pub fn dir_mut(&mut self) -> Option<&mut DirState> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            Body::File(_) => None,
        }
    }
}
