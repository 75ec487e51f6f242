#!/usr/bin/env bash
# rankd against Redis in one run: the comparison behind the README's
# Performance table, so its figures can be reproduced with one command.
#
#   scripts/compare-redis.sh [SHARDS] [PLAYERS] [WORKLOADS...]
#   scripts/compare-redis.sh 1 1000000 set rank
#
# Starts a release `rankd serve` and a `redis-server` (AOF on, appendfsync
# always; it rewrites the AOF in a forked child, whose CPU the figures
# leave out) on temp data dirs, prefills both with PLAYERS players, runs WARM
# seconds of unmeasured sets on each (so each system's compaction or AOF
# rewrite falls in its own runs, not the other's), then each workload for DURATION seconds
# per system, and prints ops/s, p99, the server's CPU (cores), the machine's
# idle cores during each run and the ratio.
# Env: CACHE_MB (rankd --cache-mb), IO_THREADS (rankd --io-threads),
# WARM (default 30), DURATION (default 10),
# CONNS (8), DEPTH (64), KEEP=1 keeps the temp dir with the JSON reports,
# RANKD=path runs another rankd binary (an A/B against an older build),
# RANKD_ARGS (more `rankd serve` arguments), REDIS_APPENDFSYNC (always).
# What a write costs each system apart from its fsyncs:
#   RANKD_ARGS="--durability buffered" REDIS_APPENDFSYNC=no scripts/compare-redis.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."

rankd_port=7270
redis_port=6479

command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install -y redis-server)" >&2; exit 2; }
source scripts/lib.sh
comparison_load 30 "$@"
rankd_pid=
redis_pid=
cleanup() {
    stop "$rankd_pid"
    stop "$redis_pid"
    if [ "${KEEP:-0}" = 1 ]; then echo "reports kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The settings this run chose for rankd, also printed with the results.
read -r -a rankd_settings <<<"${CACHE_MB:+--cache-mb $CACHE_MB} ${IO_THREADS:+--io-threads $IO_THREADS} ${RANKD_ARGS:-}"
"$rankd" serve --shards "$shards" --data-dir "$work/rankd" --listen "127.0.0.1:$rankd_port" \
    --metrics-listen 127.0.0.1:0 ${rankd_settings[@]+"${rankd_settings[@]}"} >"$work/rankd.log" 2>&1 &
rankd_pid=$!
mkdir -p "$work/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save '' \
    --appendonly yes --appendfsync "${REDIS_APPENDFSYNC:-always}" >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_listening "$work/rankd.log" "$rankd_pid"
wait_redis "$redis_port"

targets=("rankd://127.0.0.1:$rankd_port" "redis://127.0.0.1:$redis_port")
pids=("$rankd_pid" "$redis_pid")
names=(rankd redis)

hz=$(getconf CLK_TCK)

for i in 0 1; do
    "$rankd_bench" --target "${targets[$i]}" --players "$players" --prefill --ops 1 -q >/dev/null
    [ "$warm" -gt 0 ] && "$rankd_bench" --target "${targets[$i]}" --players "$players" \
        --duration "$warm" -c "$conns" -d "$depth" -w set -q >/dev/null
    for w in "${workloads[@]}"; do
        before=$(cpu_ticks "${pids[$i]}")
        "$rankd_bench" --target "${targets[$i]}" --players "$players" --duration "$duration" \
            -c "$conns" -d "$depth" -w "$w" -q --json "$work/${names[$i]}-$w.json" >/dev/null
        after=$(cpu_ticks "${pids[$i]}")
        awk -v t="$((after - before))" -v hz="$hz" -v d="$duration" 'BEGIN {printf "%.2f\n", t / hz / d}' \
            >"$work/${names[$i]}-$w.cpu"
    done
done

# "ops/s p99_us idle_cores" of one JSON report (idle: the machine's cores
# left idle during the run; near zero means it was CPU-bound).
ops_p99_idle() {
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
idle = j.get("machine_idle_seconds")
print(round(j["ops_per_sec"]), j["p99_us"], "-" if idle is None else "%.2f" % (idle / j["seconds"]))' "$1"
}

echo "rankd: serve ${rankd_settings[*]:-(defaults)}; redis: appendfsync ${REDIS_APPENDFSYNC:-always}"
printf '%-8s %12s %8s %6s %5s %12s %8s %6s %5s %7s\n' workload "rankd ops/s" "p99 us" cores idle \
    "redis ops/s" "p99 us" cores idle ratio
for w in "${workloads[@]}"; do
    read -r r_ops r_p99 r_idle < <(ops_p99_idle "$work/rankd-$w.json")
    read -r s_ops s_p99 s_idle < <(ops_p99_idle "$work/redis-$w.json")
    printf '%-8s %12s %8s %6s %5s %12s %8s %6s %5s %7s\n' "$w" "$r_ops" "$r_p99" "$(cat "$work/rankd-$w.cpu")" "$r_idle" \
        "$s_ops" "$s_p99" "$(cat "$work/redis-$w.cpu")" "$s_idle" "$(awk -v a="$r_ops" -v b="$s_ops" 'BEGIN {printf "%.2f", a / b}')"
done
