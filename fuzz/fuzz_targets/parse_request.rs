//! `rankd::protocol::request::parse` on arbitrary bytes: never panics, an Ok
//! request obeys every protocol limit and round-trips through a re-encode, a
//! rejection carries a consistent code/id/op, and memory stays linear in the
//! input (see `rankd_fuzz::check_parse` and `alloc_meter`).
#![no_main]

mod alloc_meter;

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static METER: alloc_meter::Meter = alloc_meter::Meter;

fuzz_target!(|data: &[u8]| {
    let peak = alloc_meter::peak_during(|| {
        rankd_fuzz::check_parse(data);
    });
    alloc_meter::check(peak, data.len(), alloc_meter::PARSE_FIXED, alloc_meter::PARSE_PER_BYTE);
});
