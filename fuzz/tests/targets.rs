//! The fuzz targets themselves, as libFuzzer builds them (without coverage),
//! run once over their own regression inputs: they still build and link
//! against today's `src/`, and a finding kept in `regressions/<target>/`
//! still passes the target's checks and memory bounds in the target's own
//! process. `tests/fuzz_props.rs` and `tests/fuzz_memory.rs` at the root
//! replay the same inputs through the shared checks.

use std::path::{Path, PathBuf};
use std::process::Command;

fn regressions(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions").join(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no regression input", dir.display());
    inputs
}

/// Runs `binary` (a libFuzzer target) over `inputs`: given files, libFuzzer
/// runs each once and exits non-zero if any crashes or breaks a bound.
fn replay(target: &str, binary: &str) {
    let inputs = regressions(target);
    let output = Command::new(binary).args(&inputs).output().expect("the target binary starts");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{target} failed on its regression inputs ({}):\n{log}", output.status);
    // libFuzzer names each input it runs; all of them, not an early exit.
    for input in &inputs {
        assert!(log.contains(&format!("Running: {}", input.display())), "{target} skipped {}:\n{log}", input.display());
    }
}

#[test]
fn parse_request_passes_its_regressions() {
    replay("parse_request", env!("CARGO_BIN_EXE_parse_request"));
}

#[test]
fn frames_passes_its_regressions() {
    replay("frames", env!("CARGO_BIN_EXE_frames"));
}
