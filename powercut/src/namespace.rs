//! Names: lookup, create, mkdir, unlink, rmdir, rename and listings.
//!
//! Every change here touches the current entries of the directories
//! involved and nothing durable: only `fsyncdir` (in `data.rs`) makes an
//! entry survive a cut. A rename across directories changes both, and each
//! directory must be fsynced for its half to survive.

use std::ffi::OsStr;
use std::time::SystemTime;

use crate::dir::{DirState, Ino};
use crate::errno::{Errno, Result};
use crate::file::FileState;
use crate::fs::{DirItem, Fs};
use crate::inode::{Attr, Body, Kind, Meta, ROOT};

/// The longest name, as on ext4.
const NAME_MAX: usize = 255;

/// How a rename treats an existing target (`renameat2` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Plain `rename`: replace the target (POSIX's rules on kinds).
    Replace,
    /// `RENAME_NOREPLACE`: EEXIST if the target exists.
    NoReplace,
    /// `RENAME_EXCHANGE`: swap the two names, both must exist.
    Exchange,
}

fn check_name(name: &OsStr) -> Result<()> {
    if name.len() > NAME_MAX {
        Err(Errno::ENAMETOOLONG)
    } else if name.is_empty() || name == "." || name == ".." {
        Err(Errno::EINVAL)
    } else {
        Ok(())
    }
}

impl Fs {
    /// The attributes of what `name` names in `parent`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.alive()?;
        let ino = self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        Ok(self.inode(ino)?.attr(ino))
    }

    /// Creates an empty regular file (volatile until `parent` is fsynced).
    pub fn create_file(&mut self, parent: Ino, name: &OsStr, meta: Meta) -> Result<Attr> {
        self.make(parent, name, Body::File(FileState::default()), meta)
    }

    /// Creates an empty directory (volatile until `parent` is fsynced).
    pub fn mkdir(&mut self, parent: Ino, name: &OsStr, meta: Meta) -> Result<Attr> {
        self.make(parent, name, Body::Dir(DirState::new(parent)), meta)
    }

    fn make(&mut self, parent: Ino, name: &OsStr, body: Body, meta: Meta) -> Result<Attr> {
        self.alive()?;
        check_name(name)?;
        if self.dir(parent)?.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = self.add_inode(body, meta);
        self.dir_mut(parent)?.insert(name, ino);
        self.link_current(ino);
        self.touch_dir(parent);
        Ok(self.inode(ino)?.attr(ino))
    }

    /// Removes a file's name. The file lives on while open, and while a
    /// durable entry still names it (a cut before the directory's fsync
    /// brings it back).
    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<()> {
        self.alive()?;
        let ino = self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        if self.inode(ino)?.kind() == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        self.dir_mut(parent)?.remove(name);
        self.touch_dir(parent);
        self.inode_mut(ino)?.meta.ctime = SystemTime::now();
        self.unlink_current(ino);
        Ok(())
    }

    /// Removes an empty directory.
    pub fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Result<()> {
        self.alive()?;
        let ino = self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        if !self.dir(ino)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.dir_mut(parent)?.remove(name);
        self.touch_dir(parent);
        self.unlink_current(ino);
        Ok(())
    }

    /// Renames `parent/name` to `new_parent/new_name`.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        mode: RenameMode,
    ) -> Result<()> {
        self.alive()?;
        check_name(new_name)?;
        let source = self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        let target = self.dir(new_parent)?.get(new_name);
        let source_kind = self.inode(source)?.kind();
        if source_kind == Kind::Dir && self.is_ancestor(source, new_parent) {
            return Err(Errno::EINVAL);
        }
        match (mode, target) {
            (RenameMode::NoReplace, Some(_)) => return Err(Errno::EEXIST),
            (RenameMode::Exchange, None) => return Err(Errno::ENOENT),
            (RenameMode::Exchange, Some(target)) => {
                if self.inode(target)?.kind() == Kind::Dir && self.is_ancestor(target, parent) {
                    return Err(Errno::EINVAL);
                }
                self.dir_mut(parent)?.insert(name, target);
                self.dir_mut(new_parent)?.insert(new_name, source);
                self.set_parent(source, new_parent);
                self.set_parent(target, parent);
                self.touch_dir(parent);
                self.touch_dir(new_parent);
                return Ok(());
            }
            (_, Some(target)) if target == source => return Ok(()),
            (_, Some(target)) => match (source_kind, self.inode(target)?.kind()) {
                (Kind::Dir, Kind::Dir) if !self.dir(target)?.is_empty() => return Err(Errno::ENOTEMPTY),
                (Kind::Dir, Kind::File) => return Err(Errno::ENOTDIR),
                (Kind::File, Kind::Dir) => return Err(Errno::EISDIR),
                _ => {}
            },
            (_, None) => {}
        }
        self.dir_mut(parent)?.remove(name);
        let replaced = self.dir_mut(new_parent)?.insert(new_name, source);
        self.set_parent(source, new_parent);
        self.touch_dir(parent);
        self.touch_dir(new_parent);
        self.inode_mut(source)?.meta.ctime = SystemTime::now();
        if let Some(replaced) = replaced {
            self.unlink_current(replaced);
        }
        Ok(())
    }

    /// Whether `ancestor` is `ino` or one of its current parents.
    fn is_ancestor(&self, ancestor: Ino, mut ino: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match self.inodes.get(&ino).and_then(|inode| inode.dir()) {
                Some(dir) if ino != ROOT => ino = dir.parent,
                _ => return false,
            }
        }
    }

    fn set_parent(&mut self, ino: Ino, parent: Ino) {
        if let Some(dir) = self.inodes.get_mut(&ino).and_then(|inode| inode.dir_mut()) {
            dir.parent = parent;
        }
    }

    fn touch_dir(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            let now = SystemTime::now();
            inode.meta.mtime = now;
            inode.meta.ctime = now;
        }
    }

    /// Opens a directory for listing.
    pub fn opendir(&mut self, ino: Ino) -> Result<u64> {
        self.alive()?;
        self.dir(ino)?;
        self.open(ino)
    }

    /// Lists a directory from `offset` (0 takes a fresh listing; later
    /// offsets page through that one). `fill` gets each entry with the
    /// offset of the next and returns true when the reply buffer is full.
    pub fn readdir(
        &mut self,
        ino: Ino,
        fh: u64,
        offset: u64,
        mut fill: impl FnMut(&DirItem, u64) -> bool,
    ) -> Result<()> {
        self.alive()?;
        self.check_handle(ino, fh)?;
        if offset == 0 || self.check_handle(ino, fh)?.listing.is_none() {
            let listing = self.listing(ino)?;
            if let Some(handle) = self.handles.get_mut(&fh) {
                handle.listing = Some(listing);
            }
        }
        let listing = self.check_handle(ino, fh)?.listing.as_deref().unwrap_or_default();
        for (index, item) in listing.iter().enumerate().skip(offset as usize) {
            if fill(item, index as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    fn listing(&self, ino: Ino) -> Result<Vec<DirItem>> {
        let dir = self.dir(ino)?;
        let mut items = Vec::with_capacity(dir.len() + 2);
        items.push(DirItem { ino, kind: Kind::Dir, name: ".".into() });
        items.push(DirItem { ino: dir.parent, kind: Kind::Dir, name: "..".into() });
        for (name, child) in dir.entries() {
            let kind = self.inode(child).map(|c| c.kind()).unwrap_or(Kind::File);
            items.push(DirItem { ino: child, kind, name: name.to_owned() });
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs() -> Fs {
        Fs::new(1, Meta::new(0o755, 0, 0))
    }

    fn meta() -> Meta {
        Meta::new(0o644, 0, 0)
    }

    #[test]
    fn rename_rules() {
        let mut fs = fs();
        let a = fs.mkdir(ROOT, OsStr::new("a"), meta()).unwrap().ino;
        fs.create_file(ROOT, OsStr::new("f"), meta()).unwrap();
        fs.create_file(a, OsStr::new("g"), meta()).unwrap();
        let r = |fs: &mut Fs, from: &str, to: &str| {
            fs.rename(ROOT, OsStr::new(from), ROOT, OsStr::new(to), RenameMode::Replace)
        };
        assert_eq!(r(&mut fs, "a", "f"), Err(Errno::ENOTDIR));
        assert_eq!(r(&mut fs, "f", "a"), Err(Errno::EISDIR));
        assert_eq!(fs.rename(ROOT, OsStr::new("a"), a, OsStr::new("x"), RenameMode::Replace), Err(Errno::EINVAL));
        fs.mkdir(ROOT, OsStr::new("b"), meta()).unwrap();
        assert_eq!(r(&mut fs, "b", "a"), Err(Errno::ENOTEMPTY));
        assert_eq!(r(&mut fs, "a", "b"), Ok(()));
        assert!(fs.lookup(ROOT, OsStr::new("a")).is_err());
        assert_eq!(fs.dir(a).unwrap().parent, ROOT);
        assert_eq!(fs.rename(ROOT, OsStr::new("f"), ROOT, OsStr::new("b"), RenameMode::NoReplace), Err(Errno::EEXIST));
        assert_eq!(fs.rename(ROOT, OsStr::new("f"), ROOT, OsStr::new("b"), RenameMode::Exchange), Ok(()));
        assert_eq!(fs.lookup(ROOT, OsStr::new("f")).unwrap().kind, Kind::Dir);
    }

    #[test]
    fn unlinked_open_file_lives_until_release() {
        let mut fs = fs();
        let f = fs.create_file(ROOT, OsStr::new("f"), meta()).unwrap().ino;
        let fh = fs.open(f).unwrap();
        fs.unlink(ROOT, OsStr::new("f")).unwrap();
        assert_eq!(fs.getattr(f).unwrap().nlink, 0);
        fs.release(fh);
        assert_eq!(fs.getattr(f).err(), Some(Errno::ENOENT));
    }

    #[test]
    fn readdir_pages_through_a_stable_listing() {
        let mut fs = fs();
        for name in ["a", "b", "c"] {
            fs.create_file(ROOT, OsStr::new(name), meta()).unwrap();
        }
        let fh = fs.opendir(ROOT).unwrap();
        let mut names = Vec::new();
        fs.readdir(ROOT, fh, 0, |item, _| {
            names.push(item.name.clone());
            names.len() == 3
        })
        .unwrap();
        fs.unlink(ROOT, OsStr::new("c")).unwrap();
        fs.readdir(ROOT, fh, 3, |item, _| {
            names.push(item.name.clone());
            false
        })
        .unwrap();
        assert_eq!(names, [".", "..", "a", "b", "c"]);
    }
}
