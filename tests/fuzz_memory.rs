//! The fuzz targets' memory checks, in CI: `tests/fuzz_props.rs` replays
//! `fuzz/regressions/` through the targets' invariant checks, and this file
//! replays them under the targets' counting allocator
//! (`fuzz/fuzz_targets/alloc_meter.rs`, this binary's global allocator),
//! measuring each input's peak allocation against the targets' bounds.
//!
//! Those linear bounds (512 bytes an input byte) cannot catch the finding
//! the meter was built for (F1 in `fuzz/README.md`: `parse` allocated ~108x
//! the frame, ~110 MB for a 1 MiB frame): that is linear too, and bounded
//! only by the frame limit. What the fix promises is a cap whatever the
//! frame's shape, so full-size frames of F1's shape, grown from its
//! regression input, are measured against a cap of a few MB.
//!
//! The allocator counts every thread's allocations: this binary holds a
//! single test, so nothing runs beside a measurement.

#[path = "../fuzz/fuzz_targets/alloc_meter.rs"]
mod alloc_meter;
#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod fuzz_checks;

use std::hint::black_box;
use std::path::{Path, PathBuf};

use rankd::protocol::request::{parse, Op, Request};
use rankd::protocol::ScoreInput;
use rankd_client::protocol::{DEFAULT_MAX_FRAME, MAX_SET_MANY};
use rankd_shards::Mode;

#[global_allocator]
static METER: alloc_meter::Meter = alloc_meter::Meter;

/// Most bytes decoding one frame may allocate at peak, whatever its shape
/// and size up to `max_frame`: the decoder's value budget caps the tree it
/// builds (the worst shape within the budget measured 3.4 MB in
/// `fuzz/README.md`). Before the fix, F1's shape cost ~110 MB a 1 MiB frame.
const FRAME_PEAK_CAP: usize = 8 << 20;

fn regression_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions"), &mut files);
    files.sort();
    files
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// F1's regression input is `dd <n>` then `n` copies of one 5-byte unit
/// (`{nil: {nil: nil}}`); returns the unit.
fn f1_unit(f1: &[u8]) -> &[u8] {
    let (head, body) = f1.split_at(5);
    assert_eq!(head[0], 0xdd, "F1's input starts with an array32 marker");
    let n = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let unit = &body[..5];
    assert_eq!(body, unit.repeat(n).as_slice(), "F1's input is {n} copies of one unit");
    unit
}

/// `prefix`, then an array32 of `n` copies of `unit`.
fn array_of(prefix: &[u8], unit: &[u8], n: usize) -> Vec<u8> {
    let mut out = prefix.to_vec();
    out.push(0xdd);
    out.extend_from_slice(&(n as u32).to_be_bytes());
    out.extend_from_slice(&unit.repeat(n));
    out
}

/// The peak `parse` allocates for `body` and whether it accepted it.
fn parse_peak(body: &[u8]) -> (usize, Result<(), &'static str>) {
    let mut outcome = Ok(());
    let peak = alloc_meter::peak_during(|| {
        outcome = black_box(parse(black_box(body))).map(drop).map_err(|r| r.error.code().name());
    });
    (peak, outcome)
}

#[test]
fn regressions_stay_within_the_fuzzers_memory_bounds() {
    // Each file as both targets would take it, under their own bounds.
    let files = regression_files();
    assert!(files.len() >= 4, "the regression inputs are there: {files:?}");
    for path in &files {
        let data = read(path);
        let name = path.display();
        let peak = alloc_meter::peak_during(|| {
            fuzz_checks::check_parse(&data);
        });
        eprintln!("{name}: parse_request {} bytes, peak {peak} bytes", data.len());
        alloc_meter::check(peak, data.len(), alloc_meter::PARSE_FIXED, alloc_meter::PARSE_PER_BYTE);
        if let [m, c, stream @ ..] = &data[..] {
            let max_frame = if *m == 255 { DEFAULT_MAX_FRAME } else { 1 + *m as usize * 4 };
            let chunk = if *c == 0 { usize::MAX } else { *c as usize };
            let peak = alloc_meter::peak_during(|| {
                fuzz_checks::check_frames(stream, max_frame, chunk);
            });
            eprintln!("{name}: frames (max_frame {max_frame}) {} bytes, peak {peak} bytes", stream.len());
            alloc_meter::check(peak, stream.len(), alloc_meter::frames_fixed(max_frame), alloc_meter::FRAMES_PER_BYTE);
        }
    }

    // F1. The meter sees the amplification where a value tree is built
    // (what `parse` did before the fix), so the bounds below can fail.
    let f1 = read(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/regressions/parse_request/amplification-108x-nested-one-pair-maps"),
    );
    let tree = alloc_meter::peak_during(|| {
        black_box(rmpv::decode::read_value_ref(&mut black_box(&f1[..])).expect("F1's input is msgpack"));
    });
    eprintln!("F1: an rmpv tree of its {} bytes peaks at {tree} bytes ({}x)", f1.len(), tree / f1.len());
    assert!(tree >= 50 * f1.len(), "the meter should see F1's tree cost ~100x its input, saw {tree} bytes");

    // F1's shape grown to the largest frame, bare and as a request's unknown
    // field (refused by the value budget: `too_large`), and as large as the
    // budget lets it be (a `ping` with a 6000-map field: accepted, its tree
    // built); and the largest valid request, a full `set_many`.
    let unit = f1_unit(&f1);
    let ping = b"\x83\xa2id\x01\xa2op\xa4ping\xa1x";
    let fill = |prefix: &[u8]| (DEFAULT_MAX_FRAME - prefix.len() - 5) / unit.len();
    let set_many = fuzz_checks::encode_request(&Request {
        id: 1,
        op: Op::SetMany {
            board: "b".into(),
            entries: (0..MAX_SET_MANY).map(|i| ((i % 10).to_string(), 0.into())).collect(),
            mode: Mode::Set,
            wid: None,
        },
    });
    // The largest composite one: every score a map of 4 fields.
    let four = |i: usize| (0..4).map(|f| (format!("f{f}"), i as i64)).collect();
    let composite = fuzz_checks::encode_request(&Request {
        id: 1,
        op: Op::SetMany {
            board: "b".into(),
            entries: (0..MAX_SET_MANY).map(|i| ((i % 10).to_string(), ScoreInput::Map(four(i)))).collect(),
            mode: Mode::Set,
            wid: None,
        },
    });
    let cases: [(&str, Vec<u8>, Result<(), &str>); 5] = [
        ("F1 grown to max_frame", array_of(&[], unit, fill(&[])), Err("too_large")),
        ("F1 as an unknown field, max_frame", array_of(ping, unit, fill(ping)), Err("too_large")),
        ("F1 as an unknown field, at the value budget", array_of(ping, unit, 6000), Ok(())),
        ("a set_many of 10 000 entries", set_many, Ok(())),
        ("a set_many of 10 000 four-field scores", composite, Ok(())),
    ];
    for (what, body, want) in cases {
        assert!(body.len() <= DEFAULT_MAX_FRAME, "{what}: a frame the server would read");
        let (peak, outcome) = parse_peak(&body);
        eprintln!("{what}: {} bytes, {outcome:?}, peak {peak} bytes ({}x)", body.len(), peak / body.len());
        assert_eq!(outcome, want, "{what}");
        assert!(peak <= FRAME_PEAK_CAP, "{what}: decoding {} bytes allocated {peak} bytes at peak", body.len());
    }
}
