#!/usr/bin/env bash
# What a request costs the server, thread by thread: one workload at a time
# against a server of its own (no Redis beside it), with the server's CPU an
# operation split by thread, its fsyncs and its context switches. CPU an
# operation is what a change to the request path is judged by: unlike
# ops/s, it does not depend on how many cores the machine has.
#
#   scripts/server-cost.sh [CONNS] [DEPTH] [WORKLOADS...]    # defaults: 64 1 set
#   RANKD="old/rankd new/rankd" ROUNDS=3 scripts/server-cost.sh 64 1 set rank
#
# One line a run: the build, the workload, ops/s, p99, the server's cores,
# its µs of CPU an op, then µs an op on the I/O threads, the shards'
# threads, the committers, the runs threads, fjall's workers and the rest;
# fsyncs a second and writes an fsync; context switches an op, voluntary
# and preempted. Each build gets a fresh server (a new data dir, PLAYERS
# prefilled, WARM seconds of the workload unmeasured) for each round.
# Env: RANKD (a binary, or several separated by spaces: each round runs
# them in turn, so an A/B is alternated as the machine's speed drifts),
# ROUNDS (1), SHARDS (1), PLAYERS (1000000), IO_THREADS, RANKD_ARGS (more
# `rankd serve` arguments, e.g. "--durability buffered"), WARM (5),
# DURATION (8), PERF=1 also records `perf record -g` of each measured
# window (kept in a directory the script prints, one file a run:
# build<N>-round<R>-<workload>-<conns>x<depth>.data, N as listed in RANKD).
set -euo pipefail
cd "$(dirname "$0")/.."

conns=${1:-64}
depth=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(set)
# Several builds in RANKD: the first also stands for lib.sh's one, so it
# builds nothing.
read -r -a builds <<<"${RANKD:-}"
[ ${#builds[@]} -le 1 ] || export RANKD=${builds[0]}
source scripts/lib.sh
[ ${#builds[@]} -gt 0 ] || builds=("$rankd")
port=7300
metrics=7301
pid=
profiles=
cleanup() {
    stop "$pid"
    rm -rf "$work"
}
trap cleanup EXIT
if [ "${PERF:-0}" = 1 ]; then
    command -v perf >/dev/null || { echo "PERF=1 needs perf (apt-get install -y linux-perf)" >&2; exit 2; }
    profiles=$(mktemp -d -t rankd-profiles.XXXX)
    echo "profiles in $profiles"
fi

# The server's CPU ticks so far, then its context switches, voluntary and
# preempted, over its threads.
counts() {
    cpu_ticks "$pid"
    cat /proc/"$pid"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt/ {v += $2} /^nonvoluntary_ctxt/ {n += $2} END {print v, n}'
}

printf '%-22s %-6s %9s %7s %5s %6s | %5s %5s %5s %5s %5s %5s | %7s %6s | %5s %5s\n' \
    build workload ops/s p99_us cores us/op io shard commit runs fjall rest fsync/s w/sync vcsw pcsw
for round in $(seq "${ROUNDS:-1}"); do
    for b in "${!builds[@]}"; do
        build=${builds[$b]}
        rm -rf "$work/data"
        "$build" serve --shards "${SHARDS:-1}" --data-dir "$work/data" --listen "127.0.0.1:$port" \
            --metrics-listen "127.0.0.1:$metrics" ${IO_THREADS:+--io-threads "$IO_THREADS"} ${RANKD_ARGS:-} >"$work/log" 2>&1 &
        pid=$!
        wait_listening "$work/log" "$pid"
        target="rankd://127.0.0.1:$port"
        load=(--target "$target" --players "${PLAYERS:-1000000}" -c "$conns" -d "$depth" -q)
        "$rankd_bench" --target "$target" --players "${PLAYERS:-1000000}" --prefill --ops 1 -q >/dev/null 2>&1
        for w in "${workloads[@]}"; do
            [ "${WARM:-5}" -gt 0 ] && "$rankd_bench" "${load[@]}" -w "$w" --duration "${WARM:-5}" >/dev/null
            scrape_metrics "$metrics" >"$work/before"
            counts >"$work/before-counts"
            perf_pid=
            if [ -n "$profiles" ]; then
                perf record -q -F 999 -g -p "$pid" -o "$profiles/build$((b + 1))-round$round-$w-${conns}x$depth.data" \
                    -- sleep "${DURATION:-8}" >/dev/null 2>&1 &
                perf_pid=$!
            fi
            "$rankd_bench" "${load[@]}" -w "$w" --duration "${DURATION:-8}" \
                --server-metrics "127.0.0.1:$metrics" --json "$work/report.json" >/dev/null
            [ -z "$perf_pid" ] || wait "$perf_pid" || true
            scrape_metrics "$metrics" >"$work/after"
            counts >"$work/after-counts"
            python3 - "$work" "$build" "$w" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys

work, build, workload, hz = sys.argv[1:]

def samples(path):
    out = {}
    for line in open(path):
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out

before, after = samples(work + "/before"), samples(work + "/after")
def delta(prefix):
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))

def counts(path):
    ticks, voluntary, preempted = open(path).read().split()
    return int(ticks) / int(hz), int(voluntary), int(preempted)

# The load generator reads the server's CPU by thread over exactly its
# measured window (--server-metrics); the process's CPU, its fsyncs and
# context switches are counted around it, a little longer (the load's
# start and end, perf's), and "rest" is the process's CPU past the threads
# named here. The server's cores and fsyncs a second are its CPU and
# fsyncs an op times the ops a second.
report = json.load(open(work + "/report.json"))
ops = report["ops"]
(cpu0, vol0, pre0), (cpu1, vol1, pre1) = counts(work + "/before-counts"), counts(work + "/after-counts")
cpu = cpu1 - cpu0
groups = {"io": 0.0, "shard": 0.0, "commit": 0.0, "runs": 0.0, "fjall": 0.0}
for thread, value in report["server_cpu_by_thread"].items():
    group = re.split(r"[-:]", thread)[0]
    if group in groups:
        groups[group] += value
rest = cpu - sum(groups.values())
fsyncs = delta("rankd_shard_fsync_seconds_count")
writes = delta("rankd_shard_writes_applied_total")
us = lambda s: s / ops * 1e6
print(f"{build[-22:]:<22} {workload:<6} {report['ops_per_sec']:>9.0f} {report['p99_us']:>7} "
      f"{cpu / ops * report['ops_per_sec']:>5.2f} {us(cpu):>6.1f} | "
      + " ".join(f"{us(v):>5.1f}" for v in [*groups.values(), rest])
      + f" | {fsyncs / ops * report['ops_per_sec']:>7.0f} {writes / fsyncs if fsyncs else 0:>6.1f}"
      + f" | {(vol1 - vol0) / ops:>5.3f} {(pre1 - pre0) / ops:>5.3f}")
PY
        done
        stop "$pid"
        pid=
    done
done
