#!/usr/bin/env bash
# Runs one fuzz target for a while on the stable toolchain.
#
#   fuzz/run.sh parse_request 900      # target, seconds (default 600)
#   MAX_LEN=65536 fuzz/run.sh frames 900   # inputs up to 64 KiB (default: 4 KiB or the largest seed)
#
# RUSTC_BOOTSTRAP=1 lets stable rustc accept the -Z flags cargo-fuzz needs
# (-Zsanitizer=address and the sanitizer-coverage passes); no nightly needed.
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: run.sh <parse_request|frames> [seconds]}
secs=${2:-600}
export RUSTC_BOOTSTRAP=1
mkdir -p "corpus/$target" "artifacts/$target" logs
[ -n "$(ls -A "corpus/$target")" ] || cargo run --release --example gen_corpus
# -O -a: optimised, with debug assertions (overflow checks) on; ASan is the default sanitizer.
cargo fuzz build -O -a "$target"
cargo fuzz run -O -a "$target" "corpus/$target" -- \
    -dict=dict/rankd.dict ${MAX_LEN:+-max_len=$MAX_LEN} \
    -max_total_time="$secs" -timeout=5 \
    -rss_limit_mb=512 -malloc_limit_mb=64 \
    -print_final_stats=1 \
    2>&1 | tee "logs/$target-$(date +%Y%m%d-%H%M%S).log"
