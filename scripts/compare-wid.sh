#!/usr/bin/env bash
# What a `wid` costs a write: the same `set` load with and without a unique
# wid on every write, alternated ROUNDS times on one server, at two shapes
# (8 connections x 64 in flight, 64 x 1), with the server's CPU per op.
# OLD_RANKD=path adds a third column: a server of another build (one without
# idempotent writes, say) under the same load without wids, alternated with
# the others, so the cost of the change to writes that carry no wid shows.
#
#   scripts/compare-wid.sh [SHARDS] [PLAYERS]
#
# Env: ROUNDS (3), DURATION (10 s a run), WARM (20 s of unmeasured sets
# first), and those of scripts/lib.sh (RANKD, RANKD_BENCH).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
shards=${1:-2}
players=${2:-1000000}
rounds=${ROUNDS:-3}
duration=${DURATION:-10}
warm=${WARM:-20}
hz=$(getconf CLK_TCK)
pids=()
cleanup() { for pid in "${pids[@]}"; do stop "$pid"; done; rm -rf "$work"; }
trap cleanup EXIT

# start NAME BINARY PORT: a server on a fresh data dir; sets `started`.
start() {
    "$2" serve --shards "$shards" --data-dir "$work/$1" --listen "127.0.0.1:$3" \
        --metrics-listen 127.0.0.1:0 >"$work/$1.log" 2>&1 &
    started=$!
    pids+=("$started")
    wait_listening "$work/$1.log" "$started"
    "$rankd_bench" --server "127.0.0.1:$3" --players "$players" --prefill --ops 1 -q >/dev/null
    [ "$warm" -gt 0 ] && "$rankd_bench" --server "127.0.0.1:$3" --players "$players" --duration "$warm" \
        -c 8 -d 64 -w set -q >/dev/null
    return 0
}

# run PID PORT CONNS DEPTH [--wid]: "ops/s cpu_us_per_op" of one run.
run() {
    local pid=$1 port=$2 conns=$3 depth=$4
    shift 4
    local before after
    before=$(cpu_ticks "$pid")
    "$rankd_bench" --server "127.0.0.1:$port" --players "$players" --duration "$duration" -c "$conns" \
        -d "$depth" -w set "$@" -q --json "$work/run.json" >/dev/null
    after=$(cpu_ticks "$pid")
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); t,hz=int(sys.argv[2]),int(sys.argv[3])
print("%d %.1f" % (j["ops_per_sec"], t / hz / j["seconds"] / j["ops_per_sec"] * 1e6))' \
        "$work/run.json" "$((after - before))" "$hz"
}

start new "$rankd" 7370
new_pid=$started
old_pid=
if [ -n "${OLD_RANKD:-}" ]; then
    start old "$OLD_RANKD" 7371
    old_pid=$started
fi

printf '%-7s %5s %22s %22s %22s\n' shape round "no wid: ops/s cpu/op" "wid: ops/s cpu/op" "old build: ops/s cpu/op"
for shape in "8 64" "64 1"; do
    read -r conns depth <<<"$shape"
    for round in $(seq "$rounds"); do
        plain=$(run "$new_pid" 7370 "$conns" "$depth")
        with=$(run "$new_pid" 7370 "$conns" "$depth" --wid)
        old="-"
        [ -n "$old_pid" ] && old=$(run "$old_pid" 7371 "$conns" "$depth")
        printf '%-7s %5s %22s %22s %22s\n' "${conns}x$depth" "$round" "$plain us" "$with us" "$old${old_pid:+ us}"
    done
done
