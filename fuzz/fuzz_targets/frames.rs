//! `FrameReader` on an arbitrary byte stream, arriving in arbitrary chunk
//! sizes, with a small `max_frame`: never panics, yields exactly what the
//! reference splitter says, never reads when a frame is already buffered,
//! every frame goes through the `parse_request` checks, and memory stays
//! bounded by max_frame plus a linear function of the input.
//!
//! Input layout: byte 0 picks `max_frame` (1..=1021 in steps of 4, or 255 ->
//! the 1 MiB default), byte 1 the read chunk size (0 -> unlimited), the rest
//! is the stream.
#![no_main]

mod alloc_meter;

use libfuzzer_sys::fuzz_target;
use rankd_client::protocol::DEFAULT_MAX_FRAME;

#[global_allocator]
static METER: alloc_meter::Meter = alloc_meter::Meter;

fuzz_target!(|data: &[u8]| {
    let [m, c, stream @ ..] = data else { return };
    let max_frame = if *m == 255 { DEFAULT_MAX_FRAME } else { 1 + *m as usize * 4 };
    let chunk = if *c == 0 { usize::MAX } else { *c as usize };
    let peak = alloc_meter::peak_during(|| {
        rankd_fuzz::check_frames(stream, max_frame, chunk);
    });
    alloc_meter::check(peak, stream.len(), alloc_meter::frames_fixed(max_frame), alloc_meter::FRAMES_PER_BYTE);
});
