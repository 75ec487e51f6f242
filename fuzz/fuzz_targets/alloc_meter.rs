//! A counting global allocator: lets a target assert that decoding one input
//! allocates at most a linear function of the input's size (the in-process
//! equivalent of libFuzzer's `-malloc_limit_mb`, but proportional).
//!
//! `RANKD_FUZZ_AMP=1` prints every new maximum of peak-bytes / input-bytes,
//! which measures the decoder's memory amplification.
//!
//! The targets' bounds are here too, so `tests/fuzz_memory.rs`, which
//! replays `regressions/` under this allocator in CI, checks the same ones.

// Each includer uses part of it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// `parse_request`'s bound, fixed part: bytes one input may allocate at peak
/// whatever its size.
pub const PARSE_FIXED: usize = 64 << 10;
/// `parse_request`'s bound, per input byte (rmpv's `ValueRef` tree is ~100
/// bytes per input byte in the worst case; 512 flags anything super-linear).
pub const PARSE_PER_BYTE: usize = 512;

/// `frames`'s bound, fixed part for a stream read with `max_frame`: the
/// 16 KiB initial buffer, growth to one frame (x2 for `BytesMut` doubling),
/// and the events list.
pub fn frames_fixed(max_frame: usize) -> usize {
    (64 << 10) + 2 * (max_frame + 4)
}
/// `frames`'s bound, per input byte (each frame also goes through the
/// `parse_request` checks).
pub const FRAMES_PER_BYTE: usize = 1024;
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
