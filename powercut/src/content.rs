//! A file's bytes as 4 KiB copy-on-write pages.
//!
//! A file has two of these, its current and its durable content, and they
//! share every page that has not changed since the last fsync (`Arc`
//! clones). A write to a shared page copies that one page
//! (`Arc::make_mut`), so an fsync only has to re-share the pages written
//! since the last one, and a revert at a cut is a clone of page pointers.

use std::sync::Arc;

/// The page size: the unit of copy-on-write and of dirty tracking.
pub const PAGE_SIZE: usize = 4096;

/// One page of file data.
pub type Page = [u8; PAGE_SIZE];

/// A file's content: its size and its pages. A missing page (`None`) is a
/// hole and reads as zeros. Invariant: the bytes past `size` in the last
/// page are zero, so growing the file never uncovers old data.
#[derive(Debug, Clone, Default)]
pub struct Content {
    pages: Vec<Option<Arc<Page>>>,
    size: u64,
}

/// The number of pages that hold `size` bytes.
pub fn pages_for(size: u64) -> usize {
    size.div_ceil(PAGE_SIZE as u64) as usize
}

impl Content {
    /// The file size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many page slots there are (holes included).
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// The bytes allocated: pages that are not holes.
    pub fn allocated_pages(&self) -> u64 {
        self.pages.iter().filter(|p| p.is_some()).count() as u64
    }

    /// Up to `len` bytes from `offset`, short at the end of the file.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        if offset >= self.size {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut pos = offset;
        while pos < end {
            let index = (pos / PAGE_SIZE as u64) as usize;
            let start = (pos % PAGE_SIZE as u64) as usize;
            let take = (PAGE_SIZE - start).min((end - pos) as usize);
            match self.pages.get(index).and_then(Option::as_ref) {
                Some(page) => out.extend_from_slice(&page[start..start + take]),
                None => out.resize(out.len() + take, 0),
            }
            pos += take as u64;
        }
        out
    }

    /// Writes `data` at `offset`, growing the file if it ends past the end.
    /// `touched` is told the index of every page changed.
    pub fn write(&mut self, offset: u64, data: &[u8], touched: &mut dyn FnMut(usize)) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        if pages_for(end) > self.pages.len() {
            self.pages.resize(pages_for(end), None);
        }
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let index = (pos / PAGE_SIZE as u64) as usize;
            let start = (pos % PAGE_SIZE as u64) as usize;
            let take = (PAGE_SIZE - start).min(rest.len());
            let page = self.pages[index].get_or_insert_with(|| Arc::new([0; PAGE_SIZE]));
            Arc::make_mut(page)[start..start + take].copy_from_slice(&rest[..take]);
            touched(index);
            pos += take as u64;
            rest = &rest[take..];
        }
        self.size = self.size.max(end);
    }

    /// Truncates or extends (with zeros) to `size` bytes. `touched` is told
    /// the index of a page whose tail was zeroed; dropped pages and new holes
    /// are not reported (the caller tracks the page count itself).
    pub fn set_len(&mut self, size: u64, touched: &mut dyn FnMut(usize)) {
        if size < self.size {
            self.pages.truncate(pages_for(size));
            let tail = (size % PAGE_SIZE as u64) as usize;
            if tail != 0 {
                let index = self.pages.len() - 1;
                if let Some(page) = self.pages[index].as_mut() {
                    if page[tail..].iter().any(|&b| b != 0) {
                        Arc::make_mut(page)[tail..].fill(0);
                        touched(index);
                    }
                }
            }
        } else {
            self.pages.resize(pages_for(size), None);
        }
        self.size = size;
    }

    /// Makes this content equal to `other` where the two may differ: only
    /// the pages listed in `changed` and the slots from `keep_pages` on
    /// (pages that were dropped since `self` was last equal to `other`).
    /// Cheap when little changed, which is the whole point of an fsync here.
    pub fn copy_changed(&mut self, other: &Content, keep_pages: usize, changed: impl Iterator<Item = usize>) {
        self.pages.truncate(keep_pages.min(other.pages.len()));
        self.pages.resize(other.pages.len(), None);
        for index in changed {
            if let Some(page) = other.pages.get(index) {
                self.pages[index] = page.clone();
            }
        }
        self.size = other.size;
    }

    /// Whether the two share every page (or both are holes) and have the
    /// same size: used by tests to check the dirty tracking.
    #[cfg(test)]
    pub fn same_as(&self, other: &Content) -> bool {
        self.size == other.size && self.read(0, self.size as usize) == other.read(0, other.size as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: usize) {}

    #[test]
    fn write_read_across_pages_and_holes() {
        let mut c = Content::default();
        c.write(5000, b"hello", &mut noop);
        assert_eq!(c.size(), 5005);
        assert_eq!(c.page_count(), 2);
        assert_eq!(c.allocated_pages(), 1);
        let all = c.read(0, 10_000);
        assert_eq!(all.len(), 5005);
        assert!(all[..5000].iter().all(|&b| b == 0));
        assert_eq!(&all[5000..], b"hello");
        let big = vec![7u8; 9000];
        c.write(4000, &big, &mut noop);
        assert_eq!(c.read(4000, 9000), big);
        assert_eq!(c.read(20_000, 10), Vec::<u8>::new());
    }

    #[test]
    fn shrink_then_grow_reads_zeros() {
        let mut c = Content::default();
        c.write(0, &[1u8; 6000], &mut noop);
        let mut touched = Vec::new();
        c.set_len(100, &mut |i| touched.push(i));
        assert_eq!(touched, vec![0]);
        c.set_len(6000, &mut noop);
        let all = c.read(0, 6000);
        assert!(all[..100].iter().all(|&b| b == 1));
        assert!(all[100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn copy_on_write_leaves_the_clone_alone() {
        let mut a = Content::default();
        a.write(0, b"old", &mut noop);
        let b = a.clone();
        a.write(0, b"new", &mut noop);
        assert_eq!(b.read(0, 3), b"old");
        assert_eq!(a.read(0, 3), b"new");
    }
}
