//! `rankd::protocol::request::parse` on arbitrary bytes: never panics, an Ok
//! request obeys every protocol limit and round-trips through a re-encode, a
//! rejection carries a consistent code/id/op, and memory stays linear in the
//! input (see `rankd_fuzz::check_parse` and `alloc_meter`).
#![no_main]

mod alloc_meter;

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static METER: alloc_meter::Meter = alloc_meter::Meter;

/// Fixed allowance, and allowance per input byte (rmpv's `ValueRef` tree is
/// ~100 bytes per input byte in the worst case; 512 flags anything super-linear).
const FIXED: usize = 64 << 10;
const PER_BYTE: usize = 512;

fuzz_target!(|data: &[u8]| {
    let peak = alloc_meter::peak_during(|| {
        rankd_fuzz::check_parse(data);
    });
    alloc_meter::check(peak, data.len(), FIXED, PER_BYTE);
});
