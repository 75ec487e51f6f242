#!/usr/bin/env bash
# Where the slow requests come from: one `set` run against a fresh server,
# with its tail latency next to the server's own slow steps, counted from
# the deltas of its latency histograms over the run.
#
#   scripts/stalls.sh [SHARDS] [PLAYERS]       # defaults: 1 1000000
#
# Prints ops/s, p99, p99.9 and max, then how many shard rounds took over
# 25 and 100 ms to apply (`rankd_shard_batch_apply_seconds`), to seal on
# the shard's thread (`rankd_shard_seal_seconds`: slices of a checkpoint's leaf
# copy), to write to the journal (`rankd_shard_commit_seconds`) and to
# fsync (`rankd_shard_fsync_seconds`). Env: WARM (unmeasured seconds of sets
# after the prefill, default 10), DURATION (default 10), CONNS (8),
# DEPTH (64), RANKD=path runs another rankd binary (an A/B against an
# older build: interleave the runs, the machine's speed drifts).
set -euo pipefail
cd "$(dirname "$0")/.."

shards=${1:-1}
players=${2:-1000000}
warm=${WARM:-10}
duration=${DURATION:-10}
port=7290
metrics=7291
source scripts/lib.sh
pid=
cleanup() {
    stop "$pid"
    rm -rf "$work"
}
trap cleanup EXIT

"$rankd" serve --shards "$shards" --data-dir "$work/data" --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$metrics" >"$work/log" 2>&1 &
pid=$!
wait_listening "$work/log" "$pid"
target="rankd://127.0.0.1:$port"
"$rankd_bench" --target "$target" --players "$players" --prefill --ops 1 -q >/dev/null 2>&1
[ "$warm" -gt 0 ] && "$rankd_bench" --target "$target" --players "$players" --duration "$warm" -w set -q >/dev/null
scrape_metrics "$metrics" >"$work/before"
"$rankd_bench" --target "$target" --players "$players" --duration "$duration" \
    -c "${CONNS:-8}" -d "${DEPTH:-64}" -w set -q --json "$work/report.json" >/dev/null
scrape_metrics "$metrics" >"$work/after"

python3 - "$work" <<'PY'
import json, sys

work = sys.argv[1]

def samples(path):
    out = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out

before, after = samples(work + "/before"), samples(work + "/after")

def over(histogram, bound):
    """Observations over `bound` seconds during the run, summed over shards."""
    def delta(pred):
        return sum(v - before.get(k, 0) for k, v in after.items() if pred(k))
    total = delta(lambda k: k.startswith(histogram + "_count"))
    under = delta(lambda k: k.startswith(histogram + "_bucket") and f'le="{bound}"' in k)
    return int(total - under)

report = json.load(open(work + "/report.json"))
print(f"set {report['ops_per_sec']:.0f} ops/s, p99 {report['p99_us']} us, "
      f"p99.9 {report['p999_us']} us, max {report['max_us']} us")
for step, histogram in [("apply", "rankd_shard_batch_apply_seconds"),
                        ("seal", "rankd_shard_seal_seconds"),
                        ("journal write", "rankd_shard_commit_seconds"),
                        ("fsync", "rankd_shard_fsync_seconds")]:
    print(f"  {step:<14} over 25 ms: {over(histogram, '0.025'):>3}   over 100 ms: {over(histogram, '0.1'):>3}")
PY
