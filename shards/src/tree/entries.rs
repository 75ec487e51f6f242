//! A leaf's sorted entries: a vector whose length and capacity are `u32`s.
//!
//! A `Vec` is 24 bytes; this is 16. With it a leaf is 24 bytes and a count
//! tree 48 (jemalloc's 48-byte class instead of its 64), and a server of a
//! million small boards holds a tree a board a shard. A leaf holds at most
//! [`LEAF_CAPACITY`](super::LEAF_CAPACITY) + 1 entries before it bursts, so
//! `u32` is never short. Spare capacity is kept as a `Vec` keeps it: a
//! boxed slice of exactly the length was tried, and the reallocation on
//! every insert and removal cost 45% more a score change on small trees
//! (docs/performance-history.md).

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::node::Entry;

/// See the module docs. Owns its buffer as a `Vec<Entry>` would: every
/// change goes through [`Entries::edit`], which lends the buffer out as
/// that `Vec` and takes it back, even if the edit panics.
pub(super) struct Entries {
    ptr: NonNull<Entry>,
    len: u32,
    cap: u32,
}

// SAFETY: `Entries` owns its buffer of plain `Copy` data, as a `Vec<Entry>`
// does, which is `Send` and `Sync`.
unsafe impl Send for Entries {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Entries {}

impl Entries {
    /// Changes the entries as a `Vec`.
    pub(super) fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<Entry>) -> R) -> R {
        /// Puts the vector back into `owner` when dropped, on unwind too, so
        /// the buffer is never freed twice.
        struct Lent<'a> {
            owner: &'a mut Entries,
            vec: ManuallyDrop<Vec<Entry>>,
        }
        impl Drop for Lent<'_> {
            fn drop(&mut self) {
                let vec = std::mem::take(&mut *self.vec);
                *self.owner = Entries::from(vec);
            }
        }
        // `self` holds nothing while its buffer is lent out.
        let vec = std::mem::take(self).into_vec();
        let mut lent = Lent { owner: self, vec: ManuallyDrop::new(vec) };
        f(&mut lent.vec)
    }

    /// The entries as a `Vec`, without copying.
    pub(super) fn into_vec(self) -> Vec<Entry> {
        let this = ManuallyDrop::new(self);
        // SAFETY: `ptr`, `len` and `cap` came from a `Vec<Entry>` (see
        // `From<Vec<Entry>>`) whose buffer `this` owned; `this` is never
        // dropped, so the buffer has one owner, the returned vector.
        unsafe { Vec::from_raw_parts(this.ptr.as_ptr(), this.len as usize, this.cap as usize) }
    }

    /// Entries the buffer has room for.
    pub(super) fn capacity(&self) -> usize {
        self.cap as usize
    }
}

impl From<Vec<Entry>> for Entries {
    fn from(mut vec: Vec<Entry>) -> Self {
        if u32::try_from(vec.capacity()).is_err() {
            vec.shrink_to_fit();
        }
        let (Ok(len), Ok(cap)) = (u32::try_from(vec.len()), u32::try_from(vec.capacity())) else {
            // A leaf bursts long before; a decoder's leaf is bounded by
            // the value it came from (see `encoding`), far below this.
            panic!("a leaf of {} entries", vec.len());
        };
        let mut vec = ManuallyDrop::new(vec);
        // `Vec::as_mut_ptr` is never null (dangling when nothing is allocated).
        let ptr = NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Self { ptr, len, cap }
    }
}

impl Drop for Entries {
    fn drop(&mut self) {
        drop(std::mem::take(self).into_vec());
    }
}

impl Deref for Entries {
    type Target = [Entry];

    fn deref(&self) -> &[Entry] {
        // SAFETY: the first `len` entries of the buffer are initialized (it
        // is a `Vec`'s), and `ptr` is non-null and aligned even when empty.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl DerefMut for Entries {
    fn deref_mut(&mut self) -> &mut [Entry] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len as usize) }
    }
}

/// Empty, owning nothing (what `edit` leaves behind while the buffer is
/// lent out).
impl Default for Entries {
    fn default() -> Self {
        Self { ptr: NonNull::dangling(), len: 0, cap: 0 }
    }
}

impl FromIterator<Entry> for Entries {
    fn from_iter<I: IntoIterator<Item = Entry>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Clone for Entries {
    fn clone(&self) -> Self {
        Self::from(self.to_vec())
    }
}

impl PartialEq for Entries {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Entries {}

impl fmt::Debug for Entries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const _: () = assert!(std::mem::size_of::<Entries>() == 16);

    proptest! {
        /// Inserts and removals through `edit` leave what a `Vec` would,
        /// clones and moves into and out of `Vec`s included; leaks and
        /// double frees are for the allocator (or valgrind) to catch.
        #[test]
        fn edits_match_a_vec(ops in proptest::collection::vec((any::<bool>(), 0usize..80, 0u64..1000), 0..300)) {
            let mut entries = Entries::default();
            let mut oracle: Vec<Entry> = Vec::new();
            for (insert, at, key) in ops {
                if insert || oracle.is_empty() {
                    let at = at % (oracle.len() + 1);
                    let entry = Entry::new(u128::from(key), key + 1);
                    entries.edit(|v| v.insert(at, entry));
                    oracle.insert(at, entry);
                } else {
                    let at = at % oracle.len();
                    prop_assert_eq!(entries.edit(|v| v.remove(at)), oracle.remove(at));
                }
                prop_assert_eq!(&*entries, oracle.as_slice());
                prop_assert!(entries.capacity() >= entries.len());
            }
            let cloned = entries.clone();
            prop_assert_eq!(&cloned, &entries);
            prop_assert_eq!(cloned.into_vec(), oracle.clone());
            prop_assert_eq!(&*Entries::from(oracle.clone()), oracle.as_slice());
        }
    }

    #[test]
    fn a_panicking_edit_gives_the_buffer_back() {
        let mut entries = Entries::from(vec![Entry::new(1, 1), Entry::new(2, 2)]);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            entries.edit(|v| {
                v.push(Entry::new(3, 3));
                panic!("mid-edit");
            })
        }));
        assert!(caught.is_err());
        assert_eq!(&*entries, &[Entry::new(1, 1), Entry::new(2, 2), Entry::new(3, 3)]);
    }
}
