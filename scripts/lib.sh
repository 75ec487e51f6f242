# Sourced by the performance scripts, from the repository root: the rankd
# server and load generator they run, the temp dir they work in, and how
# they stop a server.
#
# Sets `rankd` (RANKD=path runs another server binary, e.g. an older build
# for an A/B; otherwise a release build of this checkout), `rankd_bench`
# (the load generator, RANKD_BENCH=path or this checkout's) and `work` (a
# fresh temp dir, for the caller's EXIT trap to remove).
# Defines comparison_load (the comparison scripts' arguments), cpu_ticks and
# scrape_metrics.

[ -n "${RANKD:-}" ] || cargo build --release --quiet -p rankd
[ -n "${RANKD_BENCH:-}" ] || cargo build --release --quiet -p rankd-bench
rankd=${RANKD:-target/release/rankd}
rankd_bench=${RANKD_BENCH:-target/release/rankd-bench}
work=$(mktemp -d)

# wait_listening LOG PID: returns once the rankd started as PID says in LOG
# that it listens; if it exits first, prints LOG and ends the script.
wait_listening() {
    until grep -q listening "$1" 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || { cat "$1" >&2; exit 1; }
        sleep 0.01
    done
}

# wait_redis PORT: returns once a redis-server answers PING on PORT (or
# after 10 s; the caller's first command then fails loudly).
wait_redis() {
    for _ in $(seq 100); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return
        sleep 0.1
    done
}

# stop PID: kills a server the script started, if any, and waits for it.
stop() {
    if [ -n "$1" ] && kill "$1" 2>/dev/null; then
        wait "$1" 2>/dev/null || true
    fi
}

# comparison_load DEFAULT_WARM [SHARDS] [PLAYERS] [WORKLOADS...]: the
# comparison scripts' arguments and knobs (env WARM, DURATION, CONNS,
# DEPTH); sets shards, players, workloads, warm, duration, conns and depth.
comparison_load() {
    local default_warm=$1
    shift
    shards=${1:-1}
    players=${2:-1000000}
    shift $(( $# > 2 ? 2 : $# ))
    workloads=("$@")
    [ ${#workloads[@]} -gt 0 ] || workloads=(set rank)
    warm=${WARM:-$default_warm}
    duration=${DURATION:-10}
    conns=${CONNS:-8}
    depth=${DEPTH:-64}
}

# cpu_ticks PID: the CPU the process has used so far (utime+stime), in
# clock ticks (getconf CLK_TCK a second).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# scrape_metrics PORT: prints the Prometheus page of the rankd whose
# metrics listen on 127.0.0.1:PORT.
scrape_metrics() {
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
        "http://127.0.0.1:$1/metrics"
}
