#!/usr/bin/env bash
# approx vs exact rank at PLAYERS players on 4 shards (release build).
#   scripts/approx-figures.sh [PLAYERS]      # default 10000000; needs `cargo build --release -p rankd -p rankd-bench --bins`
# Prefills PLAYERS players with rankd-bench, asks one approximate rank (which
# builds the summary), then 10 s each of exact and approximate ranks, pipelined
# (-c 8 -d 64) and one at a time (-c 1 -d 1), and prints the summary metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
players=${1:-10000000}
work=$(mktemp -d /tmp/approx-bench.XXXX)
port=7480; metrics=7481
target/release/rankd serve --shards 4 --data-dir "$work/data" --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:$metrics >"$work/log" 2>&1 &
pid=$!
trap 'kill $pid; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for i in $(seq 1 100); do grep -q listening "$work/log" && break; sleep 0.2; done
b() { target/release/rankd-bench --server 127.0.0.1:$port --players "$players" -q "$@"; }
t0=$(date +%s.%N)
b --prefill --ops 1 2>&1 | grep -i prefill || true
echo "prefill took $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.0f", a-b}') s"
# build the summary once (its first ask waits for it) and let it settle
target/release/rankd rank bench player:1 --approx --server 127.0.0.1:$port
for round in 1; do
  echo "== round $round: exact rank, -c 8 -d 64, 10 s"; b -w rank -c 8 -d 64 --duration 10
  echo "== round $round: approx rank, -c 8 -d 64, 10 s"; b -w rank -c 8 -d 64 --duration 10 --approx
  echo "== round $round: exact rank, -c 1 -d 1, 10 s"; b -w rank -c 1 -d 1 --duration 10
  echo "== round $round: approx rank, -c 1 -d 1, 10 s"; b -w rank -c 1 -d 1 --duration 10 --approx
done
curl -s 127.0.0.1:$metrics/metrics | grep -E '^rankd_approx_(refreshes_total|summaries |refresh_seconds_(sum|count)|summary_age_seconds_(sum|count))'
grep -E "^(VmRSS)" /proc/$pid/status
