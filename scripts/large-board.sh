#!/usr/bin/env bash
# The 10M-player figures of the README (issue 4's latency, memory and
# restart bars) as one command:
#
#   scripts/large-board.sh [PLAYERS] [SHARDS]      # defaults: 10000000 2
#
# 1. prefill PLAYERS players;  2. 20 s of saturating sets;
# 3. unpipelined ranks (-c 1 -d 1) for 15 s while 4x8 writers run, sampling
#    the server's resident memory (10 Hz) and its allocator's live bytes (1 Hz),
#    with the server's own latency beside the client's;
#    then 15 s more while the writers offer a fixed RATE sets/s instead of
#    all they can (default 4000, `rankd-bench --rate`; a list such as
#    RATE="4000 8000 16000" measures each in turn: where the tail bends);
# 4. SIGTERM, restart, time to "listening", resident memory right after;
# 5. kill -9 after KILL_AFTER (default 120) seconds of saturating writes,
#    restart, time to "listening" (long enough for the journal to grow as it
#    does in service: a restart after a crash replays all of it).
# Env: CACHE_MB (rankd --cache-mb), RATE, KILL_AFTER, KEEP=1 keeps the temp dir, RANKD=path
# runs another rankd binary (an A/B against an older build).
set -euo pipefail
cd "$(dirname "$0")/.."

players=${1:-10000000}
shards=${2:-2}
port=7280
metrics=7281
source scripts/lib.sh
pid=
cleanup() {
    stop "$pid"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

start() {
    : >"$work/log"
    local t0=$(date +%s.%N)
    "$rankd" serve --shards "$shards" --data-dir "$work/data" --listen "127.0.0.1:$port" \
        --metrics-listen "127.0.0.1:$metrics" ${CACHE_MB:+--cache-mb "$CACHE_MB"} >>"$work/log" 2>&1 &
    pid=$!
    wait_listening "$work/log" "$pid"
    awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "ready in %.2f s\n", a - b}'
}
rss_mib() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status"; }
live_mib() {
    curl -s "127.0.0.1:$metrics/metrics" | awk '/^rankd_allocator_allocated_bytes/ {print int($2 / 1048576)}'
}
bench() { "$rankd_bench" --server "127.0.0.1:$port" --players "$players" -q "$@"; }

echo "== start on an empty data dir"; start
echo "== prefill"; bench --prefill --ops 1 2>&1 >/dev/null | grep prefilled
echo "== saturating set (-c 8 -d 64, 20 s)"; bench -w set -c 8 -d 64 --duration 20
# Unpipelined ranks for 15 s while 4x8 writers run (`bench -w set` with the
# extra flags given), sampling resident memory and allocator live bytes.
rank_under_writes() {
    bench -w set -c 4 -d 8 --duration 22 --json "$work/writers.json" "$@" >/dev/null &
    local writers=$!
    sleep 3
    bench -w rank -c 1 -d 1 --duration 15 --server-metrics "127.0.0.1:$metrics" &
    local ranks=$!
    # Resident ten times a second (peaks last a fraction of a second: sampled
    # once a second, they were missed), allocator live bytes once a second
    # (a scrape costs the server more than reading /proc).
    : >"$work/rss"
    : >"$work/live"
    local tick=0
    while kill -0 "$ranks" 2>/dev/null; do
        rss_mib >>"$work/rss"
        if (( tick++ % 10 == 0 )); then live_mib >>"$work/live"; fi
        sleep 0.1
    done
    wait "$ranks"
    wait "$writers"
    python3 -c 'import json,sys; print("writers: %.0f sets/s" % json.load(open(sys.argv[1]))["ops_per_sec"])' "$work/writers.json"
    local live
    live=$(sort -n "$work/live" | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%d-%d", lo, hi}')
    sort -n "$work/rss" | awk -v p="$players" -v live="$live" '{v[NR] = $1}
        END {p99 = int(NR * 0.99); if (p99 < 1) p99 = 1
             printf "resident while serving (10 Hz): %d-%d MiB, median %d, p99 %d (%.0f-%.0f B/player); allocator live %s MiB\n",
             v[1], v[NR], v[int((NR + 1) / 2)], v[p99], v[1] * 1048576 / p, v[NR] * 1048576 / p, live}'
}
echo "== rank (-c 1 -d 1, 15 s) while 4x8 writers run"
rank_under_writes
for rate in ${RATE:-4000}; do
    echo "== rank (-c 1 -d 1, 15 s) while 4x8 writers offer $rate sets/s"
    rank_under_writes --rate "$rate"
done
echo "== restart after SIGTERM"
kill "$pid"; wait "$pid" || true
start
sleep 1
echo "resident after restart: $(rss_mib) MiB ($(( $(rss_mib) * 1048576 / players )) B/player)"
kill_after=${KILL_AFTER:-120}
echo "== restart after kill -9 after ${kill_after} s of writes"
bench -w set -c 8 -d 64 --duration $((kill_after + 20)) >/dev/null 2>&1 &
writers=$!
sleep "$kill_after"
echo "journal of shard 0 when killed: $(du -cm "$work"/data/shard-0/*.jnl | tail -1 | cut -f1) MiB"
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
wait "$writers" 2>/dev/null || true
start
sed 's/\x1b\[[0-9;]*m//g' "$work/log" | grep -o 'replayed=[0-9]*\|storage_ms=[0-9]*' | paste -sd' '
