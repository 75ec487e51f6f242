#!/usr/bin/env bash
# Runs N power-cut cycles (default 100) of each power-cut test: rankd on
# the power-cut filesystem (powercut/), writers running, the power cut at
# random moments, then every acknowledged write checked (tests/power_cut.rs),
# every wid'd increment applied exactly once (tests/power_cut_exactly_once.rs)
# and expired periods gone for good (tests/power_cut_expiry.rs). Needs root
# and /dev/fuse.
# Prints each cycle and the summary; the whole output, the servers' logs
# included, goes to target/power-cuts.log.
# Usage: scripts/power-cuts.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-100}
log=${CARGO_TARGET_DIR:-target}/power-cuts.log
command -v fusermount3 >/dev/null || { echo "install fuse3 (apt-get install fuse3)" >&2; exit 1; }
cargo build -q -p rankd-powercut
status=0
RANKD_POWER_CUTS=$cycles cargo test -q --test power_cut --test power_cut_exactly_once --test power_cut_expiry \
    -- --nocapture --test-threads 1 --skip backup >"$log" 2>&1 || status=$?
grep -E "^cycle|power cuts|background|test result|panicked|lost" "$log" || true
[ "$status" = 0 ] || echo "failed: the whole output is in $log" >&2
exit "$status"
