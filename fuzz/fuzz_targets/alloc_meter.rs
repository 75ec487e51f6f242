//! A counting global allocator: lets a target assert that decoding one input
//! allocates at most a linear function of the input's size (the in-process
//! equivalent of libFuzzer's `-malloc_limit_mb`, but proportional).
//!
//! `RANKD_FUZZ_AMP=1` prints every new maximum of peak-bytes / input-bytes,
//! which measures the decoder's memory amplification.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Meter;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static WORST_RATIO: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            if new_size >= layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
                PEAK.fetch_max(now, Relaxed);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        q
    }
}

/// Runs `f` and returns the peak number of bytes it had allocated at once
/// (beyond what was live when it started).
pub fn peak_during(f: impl FnOnce()) -> usize {
    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    f();
    PEAK.load(Relaxed).saturating_sub(base)
}

/// Asserts `peak <= fixed + per_byte * input_len`; reports new worst ratios.
pub fn check(peak: usize, input_len: usize, fixed: usize, per_byte: usize) {
    let ratio = peak / input_len.max(1);
    if std::env::var_os("RANKD_FUZZ_AMP").is_some() && ratio > WORST_RATIO.fetch_max(ratio, Relaxed) {
        eprintln!("AMP new worst: {peak} bytes peak for {input_len} input bytes ({ratio}x)");
    }
    assert!(
        peak <= fixed + per_byte * input_len,
        "decoding {input_len} bytes allocated {peak} bytes at peak (bound {fixed} + {per_byte}x)"
    );
}
