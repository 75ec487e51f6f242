//! A regular file's two states: what programs see now, and what a power
//! cut would leave.
//!
//! Writes and size changes go to `current` only and are logged in order;
//! `sync` (fsync/fdatasync) makes `durable` equal to `current`. A cut
//! rebuilds `current` from `durable`, optionally replaying a prefix of the
//! log first (a disk that wrote some of the queued writes before the power
//! went). The log is kept only since the last fsync, so a journal that is
//! fsynced after every append keeps a log of one entry.

use std::collections::BTreeSet;

use crate::content::Content;

/// One change since the last fsync, in the order it was made.
#[derive(Debug, Clone)]
enum Change {
    /// `pwrite(data, offset)`.
    Write { offset: u64, data: Vec<u8> },
    /// `ftruncate(size)`, or an extending `fallocate`.
    SetLen(u64),
}

/// What a cut keeps of a file's unsynced changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Nothing: the file reverts to its durable state.
    Nothing,
    /// The first `changes` changes; if `torn` is set, the last of them is a
    /// write of which only the first `torn` bytes reached the disk.
    Prefix {
        /// How many changes survive.
        changes: usize,
        /// Bytes kept of the last surviving write, when it is torn.
        torn: Option<usize>,
    },
}

/// A regular file: current and durable content, the pages dirtied since the
/// last fsync, and the log of changes since then.
#[derive(Debug, Clone, Default)]
pub struct FileState {
    current: Content,
    durable: Content,
    /// Pages of `current` written (or tail-zeroed) since the last fsync.
    dirty: BTreeSet<usize>,
    /// The fewest page slots `current` had since the last fsync: slots at or
    /// past this index may hold pages the durable content must not keep.
    min_pages: usize,
    log: Vec<Change>,
}

impl FileState {
    /// What programs see.
    pub fn current(&self) -> &Content {
        &self.current
    }

    /// What a plain cut would leave.
    #[cfg(test)]
    pub fn durable(&self) -> &Content {
        &self.durable
    }

    /// Whether anything changed since the last fsync.
    pub fn is_dirty(&self) -> bool {
        !self.log.is_empty()
    }

    /// How many changes were made since the last fsync.
    pub fn changes(&self) -> usize {
        self.log.len()
    }

    /// The file offset and length of change `index` if it is a write.
    pub fn write_extent(&self, index: usize) -> Option<(u64, usize)> {
        match self.log.get(index) {
            Some(Change::Write { offset, data }) => Some((*offset, data.len())),
            _ => None,
        }
    }

    /// Writes `data` at `offset` (volatile until the next fsync).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let dirty = &mut self.dirty;
        self.current.write(offset, data, &mut |page| {
            dirty.insert(page);
        });
        self.log.push(Change::Write { offset, data: data.to_vec() });
    }

    /// Truncates or extends to `size` (volatile until the next fsync).
    pub fn set_len(&mut self, size: u64) {
        if size == self.current.size() {
            return;
        }
        let dirty = &mut self.dirty;
        self.current.set_len(size, &mut |page| {
            dirty.insert(page);
        });
        self.min_pages = self.min_pages.min(self.current.page_count());
        self.log.push(Change::SetLen(size));
    }

    /// fsync: the durable content becomes the current one. Costs the number
    /// of pages dirtied since the last fsync, not the file size.
    pub fn sync(&mut self) {
        if !self.is_dirty() {
            return;
        }
        self.durable.copy_changed(&self.current, self.min_pages, self.dirty.iter().copied());
        self.forget_changes();
    }

    /// The power cut: keeps what `keep` says of the unsynced changes and
    /// drops the rest. Returns the bytes of written data dropped.
    pub fn revert(&mut self, keep: Keep) -> u64 {
        let (kept, torn) = match keep {
            Keep::Nothing => (0, None),
            Keep::Prefix { changes, torn } => (changes.min(self.log.len()), torn),
        };
        let mut dropped = 0u64;
        let mut survivor = self.durable.clone();
        for (index, change) in self.log.iter().enumerate() {
            match change {
                Change::Write { offset, data } if index < kept => {
                    let len = match torn {
                        Some(torn) if index + 1 == kept => torn.min(data.len()),
                        _ => data.len(),
                    };
                    survivor.write(*offset, &data[..len], &mut |_| {});
                    dropped += (data.len() - len) as u64;
                }
                Change::SetLen(size) if index < kept => survivor.set_len(*size, &mut |_| {}),
                Change::Write { data, .. } => dropped += data.len() as u64,
                Change::SetLen(_) => {}
            }
        }
        self.durable = survivor;
        self.current = self.durable.clone();
        self.forget_changes();
        dropped
    }

    fn forget_changes(&mut self) {
        self.dirty.clear();
        self.log.clear();
        self.min_pages = self.current.page_count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::PAGE_SIZE;

    fn text(f: &Content) -> Vec<u8> {
        f.read(0, f.size() as usize)
    }

    #[test]
    fn sync_then_revert_keeps_the_synced_state() {
        let mut f = FileState::default();
        f.write(0, b"synced");
        f.sync();
        f.write(6, b" and not");
        f.set_len(3);
        assert_eq!(text(f.current()), b"syn");
        assert_eq!(f.revert(Keep::Nothing), 8);
        assert_eq!(text(f.current()), b"synced");
        assert!(!f.is_dirty());
    }

    #[test]
    fn sync_after_shrink_and_regrow_drops_stale_pages() {
        let mut f = FileState::default();
        f.write(0, &vec![9u8; 3 * PAGE_SIZE]);
        f.sync();
        f.set_len(0);
        f.set_len(3 * PAGE_SIZE as u64);
        f.write(PAGE_SIZE as u64, b"x");
        f.sync();
        assert!(f.durable().same_as(f.current()));
        let d = text(f.durable());
        assert_eq!(d[PAGE_SIZE], b'x');
        assert_eq!(d.iter().filter(|&&b| b != 0).count(), 1);
    }

    #[test]
    fn incremental_sync_matches_a_full_copy() {
        let mut f = FileState::default();
        let mut seed = 1u64;
        for round in 0..200u64 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let offset = (seed >> 20) % 40_000;
            let len = ((seed >> 40) % 9000) as usize;
            if round % 7 == 3 {
                f.set_len(offset);
            } else {
                f.write(offset, &vec![(round % 251) as u8 + 1; len]);
            }
            if round % 3 == 0 {
                f.sync();
                assert!(f.durable().same_as(f.current()), "round {round}");
            }
        }
    }

    #[test]
    fn prefix_and_torn_revert() {
        let mut f = FileState::default();
        f.write(0, &[1u8; 1000]);
        f.write(1000, &[2u8; 1000]);
        f.write(2000, &[3u8; 1000]);
        let mut g = f.clone();
        assert_eq!(f.revert(Keep::Prefix { changes: 2, torn: None }), 1000);
        assert_eq!(text(f.current()), [vec![1u8; 1000], vec![2u8; 1000]].concat());
        assert_eq!(g.write_extent(1), Some((1000, 1000)));
        assert_eq!(g.revert(Keep::Prefix { changes: 2, torn: Some(24) }), 976 + 1000);
        assert_eq!(text(g.current()), [vec![1u8; 1000], vec![2u8; 24]].concat());
    }
}
