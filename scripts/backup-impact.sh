#!/usr/bin/env bash
# What an online backup costs the writes around it: the same `set` load
# (CONNS x DEPTH) on one server of PLAYERS players, alternately alone and
# while `rankd backup` copies the server over and over, ROUNDS times each.
# Prints each run's throughput and p99, and what the backups took. The
# `rankd backup` client runs on the same machine at nice 19, as an operator
# would run it beside a server (or from another host).
#
#   scripts/backup-impact.sh [SHARDS] [PLAYERS]
#
# Env: ROUNDS (3), DURATION (10 s a run), CONNS (8), DEPTH (64), and those
# of scripts/lib.sh (RANKD, RANKD_BENCH).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
shards=${1:-2}
players=${2:-1000000}
rounds=${ROUNDS:-3}
duration=${DURATION:-10}
conns=${CONNS:-8}
depth=${DEPTH:-64}
pid=
cleanup() { stop "$pid"; rm -rf "$work"; }
trap cleanup EXIT

"$rankd" serve --shards "$shards" --data-dir "$work/data" --listen 127.0.0.1:7372 \
    --metrics-listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
pid=$!
wait_listening "$work/server.log" "$pid"
"$rankd_bench" --server 127.0.0.1:7372 --players "$players" --prefill --ops 1 -q >/dev/null

# run: "ops/s p99_us" of one measured run.
run() {
    "$rankd_bench" --server 127.0.0.1:7372 --players "$players" --duration "$duration" -c "$conns" \
        -d "$depth" -w set -q --json "$work/run.json" >/dev/null
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%d %d" % (j["ops_per_sec"], j["p99_us"]))' \
        "$work/run.json"
}

# backups_until FILE: backs up again and again until FILE exists; one line
# "seconds bytes" per backup in $work/backups.
backups_until() {
    while [ ! -e "$1" ]; do
        rm -rf "$work/copy"
        local start end
        start=$(date +%s%N)
        nice -n 19 "$rankd" backup -q --server 127.0.0.1:7372 --to "$work/copy" >"$work/backup.out"
        end=$(date +%s%N)
        echo "$(( (end - start) / 1000000 )) $(du -sb "$work/copy" | cut -f1)" >>"$work/backups"
    done
}

echo "set at ${conns} x ${depth}, ${shards} shards, ${players} players, ${duration} s runs"
printf '%-8s %-16s %12s %10s\n' round "while" "ops/s" "p99 (us)"
for round in $(seq "$rounds"); do
    read -r ops p99 < <(run)
    printf '%-8s %-16s %12s %10s\n' "$round" "alone" "$ops" "$p99"
    rm -f "$work/stop"
    backups_until "$work/stop" &
    looper=$!
    read -r ops p99 < <(run)
    touch "$work/stop"
    wait "$looper"
    printf '%-8s %-16s %12s %10s\n' "$round" "backing up" "$ops" "$p99"
done
python3 - "$work/backups" <<'PY'
import sys
rows = [tuple(map(float, line.split())) for line in open(sys.argv[1])]
secs = sorted(r[0] / 1000 for r in rows)
print("%d backups: %.2f s median, %.2f s max, %.0f MB each (median)" % (
    len(rows), secs[len(secs) // 2], secs[-1], sorted(r[1] for r in rows)[len(rows) // 2] / 1e6))
PY
