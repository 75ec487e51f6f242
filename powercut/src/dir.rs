//! A directory's two sets of entries: the ones programs see and the ones a
//! power cut would leave.
//!
//! create, mkdir, unlink, rmdir and rename change `current` only and note
//! the names they touched; fsyncdir copies just those names to `durable`.
//! This is the rule that makes "fsync the file, then fsync its directory"
//! necessary for a new file to survive a cut.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};

/// An inode number.
pub type Ino = u64;

/// A directory: name → inode, now and as of the last fsyncdir.
#[derive(Debug, Clone, Default)]
pub struct DirState {
    current: BTreeMap<OsString, Ino>,
    durable: BTreeMap<OsString, Ino>,
    /// Names whose current entry may differ from the durable one.
    dirty: BTreeSet<OsString>,
    /// The directory holding this one now (itself for the root), for `..`.
    pub parent: Ino,
}

/// How an fsyncdir changed one durable entry: the inode it no longer names
/// and the one it names now, for the link counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relink {
    /// The inode the durable entry named before, if any.
    pub old: Option<Ino>,
    /// The inode it names now, if any.
    pub new: Option<Ino>,
}

impl DirState {
    /// An empty directory under `parent`.
    pub fn new(parent: Ino) -> Self {
        DirState { parent, ..DirState::default() }
    }

    /// The inode `name` names now.
    pub fn get(&self, name: &OsStr) -> Option<Ino> {
        self.current.get(name).copied()
    }

    /// The current entries in name order.
    pub fn entries(&self) -> impl Iterator<Item = (&OsStr, Ino)> {
        self.current.iter().map(|(name, &ino)| (name.as_os_str(), ino))
    }

    /// The durable entries in name order.
    pub fn durable_entries(&self) -> impl Iterator<Item = (&OsStr, Ino)> {
        self.durable.iter().map(|(name, &ino)| (name.as_os_str(), ino))
    }

    /// Whether there are no current entries (rmdir's condition).
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// How many current entries there are.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Points `name` at `ino` (volatile); returns what it named before.
    pub fn insert(&mut self, name: &OsStr, ino: Ino) -> Option<Ino> {
        self.dirty.insert(name.to_owned());
        self.current.insert(name.to_owned(), ino)
    }

    /// Removes `name` (volatile); returns what it named.
    pub fn remove(&mut self, name: &OsStr) -> Option<Ino> {
        let old = self.current.remove(name);
        if old.is_some() {
            self.dirty.insert(name.to_owned());
        }
        old
    }

    /// fsyncdir: the durable entries become the current ones. Returns the
    /// entries that changed. Costs the number of names touched since the
    /// last fsyncdir, not the size of the directory.
    pub fn sync(&mut self) -> Vec<Relink> {
        let mut relinks = Vec::new();
        for name in std::mem::take(&mut self.dirty) {
            let new = self.current.get(&name).copied();
            let old = match new {
                Some(ino) => self.durable.insert(name, ino),
                None => self.durable.remove(&name),
            };
            if old != new {
                relinks.push(Relink { old, new });
            }
        }
        relinks
    }

    /// The power cut: the current entries become the durable ones. Returns
    /// how many names changed.
    pub fn revert(&mut self) -> usize {
        let changed = self.dirty.iter().filter(|name| self.current.get(*name) != self.durable.get(*name)).count();
        if !self.dirty.is_empty() {
            self.current = self.durable.clone();
            self.dirty.clear();
        }
        changed
    }

    /// Drops `name` from both sets (a cut's repair of a directory reachable
    /// twice); the caller has already reverted.
    pub fn forget(&mut self, name: &OsStr) {
        self.current.remove(name);
        self.durable.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_only_after_sync() {
        let mut d = DirState::new(1);
        d.insert(OsStr::new("a"), 2);
        assert_eq!(d.sync(), vec![Relink { old: None, new: Some(2) }]);
        d.insert(OsStr::new("b"), 3);
        d.remove(OsStr::new("a"));
        assert_eq!(d.revert(), 2);
        assert_eq!(d.get(OsStr::new("a")), Some(2));
        assert_eq!(d.get(OsStr::new("b")), None);
    }

    #[test]
    fn sync_reports_only_real_changes() {
        let mut d = DirState::new(1);
        d.insert(OsStr::new("a"), 2);
        d.remove(OsStr::new("a"));
        assert!(d.sync().is_empty());
        d.insert(OsStr::new("a"), 2);
        d.sync();
        d.insert(OsStr::new("a"), 5);
        assert_eq!(d.sync(), vec![Relink { old: Some(2), new: Some(5) }]);
    }
}
