#!/usr/bin/env bash
# Deep `top` pages inside one large tie, the figure behind issue 38's "no
# cliff on ties": PLAYERS players on one score named `user:%08d` (names
# sharing their first bytes) on SHARDS shards, `top` at OFFSETS taken in
# turn (bench/examples/tie_pages.rs), then the restart: ready after SIGTERM
# and after kill -9 (a restart rebuilds the shards' tie groups).
#
#   scripts/tie-pages.sh [PLAYERS] [SHARDS]
#   scripts/tie-pages.sh 1000000 2
#
# Env: OFFSETS (default 0,250000,500000,999990), ROUNDS (pages per offset,
# default 200), RANKD=path runs another rankd binary (an A/B against an
# older build).
set -euo pipefail
cd "$(dirname "$0")/.."

players=${1:-1000000}
shards=${2:-2}
offsets=${OFFSETS:-0,250000,500000,999990}
rounds=${ROUNDS:-200}
port=7272

source scripts/lib.sh
cargo build --release --quiet -p rankd-bench --example tie_pages
pid=
cleanup() {
    stop "$pid"
    rm -rf "$work"
}
trap cleanup EXIT

serve() {
    : >"$work/rankd.log"
    "$rankd" serve --shards "$shards" --data-dir "$work/data" --listen "127.0.0.1:$port" \
        --metrics-listen 127.0.0.1:0 >"$work/rankd.log" 2>&1 &
    pid=$!
    wait_listening "$work/rankd.log" "$pid"
}

pages() {
    target/release/examples/tie_pages --addr "127.0.0.1:$port" --pid "$pid" --players "$players" \
        --offsets "$offsets" --rounds "$1"
}

# restart SIGNAL: stops the server with SIGNAL, starts it again and prints
# how long until it listened.
restart() {
    kill "-$1" "$pid"
    wait "$pid" 2>/dev/null || true
    local started
    started=$(date +%s.%N)
    serve
    awk -v a="$started" -v b="$(date +%s.%N)" -v s="$1" 'BEGIN {printf "ready after %s: %.2f s\n", s, b - a}'
}

serve
pages "$rounds"
echo "resident: $(awk '/VmRSS/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status")"
restart TERM
pages 20 | tail -n +2
restart KILL
