#!/usr/bin/env bash
# Runs N power-cut cycles (default 100): rankd on the power-cut filesystem
# (powercut/), writers running, the power cut at random moments, then every
# acknowledged write checked (tests/power_cut.rs). Needs root and /dev/fuse.
# Usage: scripts/power-cuts.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-100}
command -v fusermount3 >/dev/null || { echo "install fuse3 (apt-get install fuse3)" >&2; exit 1; }
cargo build -q -p rankd-powercut
RANKD_POWER_CUTS=$cycles cargo test -q --test power_cut -- --nocapture 2>&1 | grep -E "^cycle|power cuts|background|test result|panicked|lost"
