//! What the server asks of its allocator (jemalloc, set in `main.rs`)
//! beyond malloc and free: its statistics, and what it takes to pack
//! long-lived objects (which are worth moving, and moving them past the
//! thread cache).

/// jemalloc's view of the process's memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Held by live allocations.
    pub allocated: u64,
    /// In pages handed out to allocations: `allocated` plus the free slots
    /// of partly used slabs (fragmentation).
    pub active: u64,
    /// Resident: `active` plus jemalloc's metadata and freed pages not yet
    /// returned to the OS.
    pub resident: u64,
}

/// Reads fresh statistics; `None` if jemalloc does not answer. Meaningful
/// when jemalloc is the global allocator (the `rankd` binary); in the
/// library's tests it reports an allocator nobody uses.
pub fn stats() -> Option<Stats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    Some(Stats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
    })
}

/// Whether the allocation at `ptr` is worth moving to pack the allocator's
/// slabs: it sits on a slab that is used less than its size class is on
/// average, and that is not the slab new allocations are carved from. The
/// rule jemalloc's documentation of `experimental.utilization.query`
/// suggests, and what Redis's active defragmentation does. `false` when
/// jemalloc does not know the pointer (it is not the global allocator, as in
/// the library's tests) or cannot answer.
fn worth_moving(ptr: *const u8) -> bool {
    /// `experimental.utilization.query`'s answer, laid out as jemalloc writes it.
    #[repr(C)]
    #[derive(Default)]
    struct SlabUse {
        /// The size class's current slab; null when every slab is full.
        current_slab: usize,
        /// Free regions of the allocation's slab: with `regions`, how full it is.
        free: usize,
        /// Regions of the allocation's slab.
        regions: usize,
        /// Bytes of the slab (of the allocation, if it is not on a slab).
        slab_bytes: usize,
        /// Free regions of every slab of the size class: the average to beat.
        class_free: usize,
        /// Regions of every slab of the size class.
        class_regions: usize,
    }
    static QUERY: std::sync::OnceLock<Option<([usize; 4], usize)>> = std::sync::OnceLock::new();
    let Some((mib, mib_len)) = *QUERY.get_or_init(|| {
        let mut mib = [0usize; 4];
        let mut len = mib.len();
        // SAFETY: a NUL-terminated name, and `mib`/`len` describe a valid buffer.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctlnametomib(c"experimental.utilization.query".as_ptr(), mib.as_mut_ptr(), &mut len)
        };
        (rc == 0).then_some((mib, len))
    }) else {
        return false;
    };
    let mut out = SlabUse::default();
    let mut out_len = std::mem::size_of::<SlabUse>();
    let mut input = ptr.cast::<std::ffi::c_void>();
    // SAFETY: the control takes one pointer in and writes exactly a
    // `SlabUse` (checked by jemalloc against `out_len`); a pointer jemalloc
    // does not know is answered with zeros, never dereferenced.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctlbymib(
            mib.as_ptr(),
            mib_len,
            (&mut out as *mut SlabUse).cast(),
            &mut out_len,
            (&mut input as *mut *const std::ffi::c_void).cast(),
            std::mem::size_of::<*const std::ffi::c_void>(),
        )
    };
    if rc != 0 || out.regions <= 1 || out.free == 0 || out.current_slab == 0 || out.class_regions == 0 {
        return false; // unknown, not on a slab, or its slab is full
    }
    if (ptr as usize).wrapping_sub(out.current_slab) < out.slab_bytes {
        return false; // where a moved copy would land anyway
    }
    let used = out.regions - out.free;
    let class_used = out.class_regions - out.class_free;
    // used / regions < class_used / class_regions, in integers.
    (used as u128) * (out.class_regions as u128) < (class_used as u128) * (out.regions as u128)
}

/// Picks the allocations worth moving (`worth_moving`) for a caller that
/// moves each one it is told to, at once: from the first pick until the
/// packer is dropped, the calling thread's allocation cache is off, so the
/// copies come from the allocator's shared slabs (the fuller ones first) and
/// the freed originals go straight back to theirs. With the cache on, each
/// new copy would take the slot the previous one just left, and nothing
/// would be packed. Turning the cache off flushes it; it refills on the
/// thread's next allocations, so a step that moves nothing leaves it alone.
#[derive(Debug, Default)]
pub struct Packer {
    /// Whether this packer turned the thread cache off, so dropping it
    /// turns it back on (and a step that moved nothing never touched it).
    cache_off: bool,
}

impl Packer {
    /// Whether to move the allocation at `ptr` (which the caller then does).
    pub fn pick(&mut self, ptr: *const u8) -> bool {
        let worth = worth_moving(ptr);
        if worth && !self.cache_off {
            set_thread_cache(false);
            self.cache_off = true;
        }
        worth
    }
}

impl Drop for Packer {
    fn drop(&mut self) {
        if self.cache_off {
            set_thread_cache(true);
        }
    }
}

fn set_thread_cache(enabled: bool) {
    // SAFETY: `thread.tcache.enabled` is a documented jemalloc control that
    // takes a `bool`, and the name is NUL-terminated.
    if let Err(e) = unsafe { tikv_jemalloc_ctl::raw::write(b"thread.tcache.enabled\0", enabled) } {
        tracing::debug!(error = %e, enabled, "setting jemalloc's thread cache failed");
    }
}
