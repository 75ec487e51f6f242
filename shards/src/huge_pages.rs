//! A big array the hot path reads at random places, in memory of its own
//! that the kernel is asked to back with 2 MiB pages.
//!
//! A read at a random place of a big array misses the TLB as well as the
//! data cache: in 4 KiB pages the default record cache (36 MiB over the
//! shards) spans 9,216 pages, far more than the TLB maps, so nearly every
//! lookup also walks the page tables (in a VM, both the guest's and the
//! host's). In 2 MiB pages it spans 18. Only such arrays ask for huge
//! pages: asking for the whole heap (jemalloc's `thp:always`) made a server
//! holding a million small boards 50 MiB bigger, as sparsely used pages
//! grew whole.

use std::marker::PhantomData;

use bytemuck::Pod;
use memmap2::{MmapMut, MmapOptions};

/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// `len` zeroed values of `T`, huge-page backed where the kernel allows
/// (a hint: without transparent huge pages it is plain memory). Empty
/// holds no mapping.
pub(crate) struct HugePageArray<T> {
    /// The mapping, a huge page longer than the array so the array can
    /// start on a huge page boundary (the kernel maps only whole, aligned
    /// huge pages); the slack before and after is never touched, so it
    /// costs no memory.
    map: Option<MmapMut>,
    /// Where the array starts in `map`, bytes.
    offset: usize,
    /// Values in the array.
    len: usize,
    _values: PhantomData<T>,
}

impl<T: Pod> HugePageArray<T> {
    /// An array of no values, holding no memory.
    pub(crate) fn empty() -> Self {
        Self { map: None, offset: 0, len: 0, _values: PhantomData }
    }

    /// `len` zeroed values. The kernel hands the memory out as it is first
    /// touched, as with a zeroed allocation; an error is the kernel's
    /// refusal to map it.
    pub(crate) fn zeroed(len: usize) -> std::io::Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(std::io::ErrorKind::OutOfMemory)?;
        if bytes == 0 {
            return Ok(Self::empty());
        }
        let slack = if bytes >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        let map = MmapOptions::new().len(bytes + slack).map_anon()?;
        let address = map.as_ptr() as usize;
        let offset = if slack == 0 { 0 } else { address.next_multiple_of(HUGE_PAGE) - address };
        #[cfg(target_os = "linux")]
        if slack != 0 {
            // A hint: kernels without transparent huge pages refuse it, and
            // the array works the same in small pages.
            if let Err(e) = map.advise_range(memmap2::Advice::HugePage, offset, bytes) {
                tracing::debug!(error = %e, bytes, "huge pages not available for an array");
            }
        }
        Ok(Self { map: Some(map), offset, len, _values: PhantomData })
    }

    fn byte_range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len * size_of::<T>()
    }
}

impl<T: Pod> std::ops::Deref for HugePageArray<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.map {
            Some(map) => bytemuck::cast_slice(&map[self.byte_range()]),
            None => &[],
        }
    }
}

impl<T: Pod> std::ops::DerefMut for HugePageArray<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let range = self.byte_range();
        match &mut self.map {
            Some(map) => bytemuck::cast_slice_mut(&mut map[range]),
            None => &mut [],
        }
    }
}

impl<T> std::fmt::Debug for HugePageArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugePageArray").field("len", &self.len).field("offset", &self.offset).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_zeroed_values_that_keep_what_is_written() {
        for len in [1usize, 1000, HUGE_PAGE / 24 + 7] {
            let mut array = HugePageArray::<[u64; 3]>::zeroed(len).expect("mapped");
            assert_eq!(array.len(), len);
            assert!(array.iter().all(|value| *value == [0; 3]));
            for (i, value) in array.iter_mut().enumerate() {
                *value = [i as u64, 1, 2];
            }
            assert!(array.iter().enumerate().all(|(i, value)| *value == [i as u64, 1, 2]));
        }
    }

    #[test]
    fn a_big_array_starts_on_a_huge_page() {
        let array = HugePageArray::<u64>::zeroed(HUGE_PAGE).expect("mapped");
        assert_eq!(array.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(array.len(), HUGE_PAGE);
    }

    #[test]
    fn nothing_is_mapped_for_no_values() {
        let array = HugePageArray::<u64>::zeroed(0).expect("nothing to map");
        assert!(array.is_empty());
        assert!(array.map.is_none());
        assert!(HugePageArray::<u64>::empty().is_empty());
    }
}
