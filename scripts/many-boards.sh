#!/usr/bin/env bash
# Many small boards on one server, rankd beside Redis in one run: the
# memory, restart and write-spread figures of issue 38, with one command.
#
#   scripts/many-boards.sh [BOARDS] [PLAYERS]
#   scripts/many-boards.sh 50000        # a quick run
#   scripts/many-boards.sh              # 1,000,000 boards x 5 players
#
# Starts a release `rankd serve --shards SHARDS` and a `redis-server`
# (default settings, no persistence: `--save '' --appendonly no`) on temp
# dirs, and loads BOARDS boards (`lvl:0000000` on) of PLAYERS players (`p0`
# on, random scores) into each: one `set_many` per board on rankd, one
# `ZADD key s1 m1 ... sN mN` per board on Redis, CONNS connections x DEPTH
# in flight. Then prints:
#
# - memory before and after loading: rankd's resident set (VmRSS) and its
#   allocator's figures (`rankd_allocator_*_bytes`), Redis's `used_memory`
#   and `used_memory_rss`, bytes per board, and rankd's data dir;
# - restarts: SIGTERM, then kill -9, each followed by a start timed until a
#   `rank` on a board is answered, with the shards' own open times from the
#   log and the resident set after each;
# - the write spread: `set` at CONNS x DEPTH for DURATION seconds (after
#   WARM unmeasured ones), each on a random board and a random one of its
#   players, against `set` on one board of ONE_BOARD players on a fresh
#   server (what scripts/compare-redis.sh measures). ONE_BOARD=5000000
#   compares against one board of the spread's own 5M players instead: what
#   the boards cost, apart from how many players the record cache holds.
#
# Env: SHARDS (2), ONE_BOARD (1000000), WARM (10), DURATION (10), CONNS (8),
# DEPTH (64), SETTLE (5: seconds to wait before each memory reading),
# KEEP=1 keeps the temp dir (logs, JSON reports), RANKD=path runs another
# rankd binary.
set -euo pipefail
cd "$(dirname "$0")/.."

rankd_port=7280
metrics_port=7281
redis_port=6489

command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install -y redis-server)" >&2; exit 2; }
command -v curl >/dev/null || { echo "needs curl" >&2; exit 2; }
source scripts/lib.sh
boards=${1:-1000000}
players=${2:-5}
shards=${SHARDS:-2}
one_board=${ONE_BOARD:-1000000}
warm=${WARM:-10}
duration=${DURATION:-10}
conns=${CONNS:-8}
depth=${DEPTH:-64}
settle=${SETTLE:-5}

rankd_pid=
redis_pid=
cleanup() {
    stop "$rankd_pid"
    stop "$redis_pid"
    if [ "${KEEP:-0}" = 1 ]; then echo "logs and reports kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

rankd_target="rankd://127.0.0.1:$rankd_port"
redis_target="redis://127.0.0.1:$redis_port"
# The load's boards and players, the same on both servers.
spread=(--board lvl --boards "$boards" --players "$players" --player-prefix p -c "$conns" -d "$depth" -q)
probe=(rank -s "127.0.0.1:$rankd_port" lvl:0000000 p0)

# start_rankd DIR: starts rankd on DIR, logging to DIR.log (appended to).
start_rankd() {
    "$rankd" serve --shards "$shards" --data-dir "$1" --listen "127.0.0.1:$rankd_port" \
        --metrics-listen "127.0.0.1:$metrics_port" >>"$1.log" 2>&1 &
    rankd_pid=$!
}

now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
rss_bytes() { awk '/^VmRSS/ {printf "%.0f\n", $2 * 1024}' "/proc/$1/status"; }
# allocator WHICH: rankd_allocator_WHICH_bytes (allocated, active, resident).
allocator() {
    curl -s "http://127.0.0.1:$metrics_port/metrics" |
        awk -v m="rankd_allocator_$1_bytes" '$1 == m {printf "%.0f\n", $2}'
}
# metric_sum NAME: a per-shard rankd metric summed over the shards.
metric_sum() {
    curl -s "http://127.0.0.1:$metrics_port/metrics" | awk -v m="$1" 'index($1, m "{") == 1 {s += $2} END {printf "%.0f\n", s}'
}
redis_info() { redis-cli -p "$redis_port" info memory | tr -d '\r' | awk -F: -v k="$1" '$1 == k {print $2}'; }

# rankd_memory: "rss allocated active resident" now.
rankd_memory() { echo "$(rss_bytes "$rankd_pid") $(allocator allocated) $(allocator active) $(allocator resident)"; }

mkdir -p "$work/redis"
start_rankd "$work/rankd"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save '' --appendonly no \
    >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_listening "$work/rankd.log" "$rankd_pid"
wait_redis "$redis_port"
echo "$("$rankd" --version), $shards shards; $(redis-server --version | cut -d' ' -f1-3)"
echo "$boards boards x $players players, loaded over $conns connections x $depth in flight"
echo

sleep 1
read -r rss0 alloc0 active0 resident0 < <(rankd_memory)
redis_used0=$(redis_info used_memory)
redis_rss0=$(redis_info used_memory_rss)

for target in "$rankd_target" "$redis_target"; do
    started=$(now)
    "$rankd_bench" --target "$target" "${spread[@]}" --prefill --ops 1 2>"$work/load.err" >/dev/null ||
        { cat "$work/load.err" >&2; exit 1; }
    echo "loaded $target in $(seconds_since "$started") s: $(grep prefilled "$work/load.err")"
done
sleep "$settle"
read -r rss1 alloc1 active1 resident1 < <(rankd_memory)
redis_used1=$(redis_info used_memory)
redis_rss1=$(redis_info used_memory_rss)
unwritten=$(metric_sum rankd_shard_unwritten_players)
memtables=$(metric_sum rankd_shard_memtable_bytes)
stop "$redis_pid"
redis_pid=

per_board() { awk -v a="$1" -v b="$2" -v n="$boards" 'BEGIN {printf "%.0f", (b - a) / n}'; }
echo
echo "memory (MiB)                 before     after     added  B/board"
row() { printf '%-24s %10s %9s %9s %8s\n' "$1" "$(mib "$2")" "$(mib "$3")" "$(mib $(($3 - $2)))" "$(per_board "$2" "$3")"; }
row "rankd VmRSS" "$rss0" "$rss1"
row "rankd jemalloc allocated" "$alloc0" "$alloc1"
row "rankd jemalloc active" "$active0" "$active1"
row "rankd jemalloc resident" "$resident0" "$resident1"
row "redis used_memory" "$redis_used0" "$redis_used1"
row "redis used_memory_rss" "$redis_rss0" "$redis_rss1"
awk -v r="$rss1" -v u="$redis_used1" -v dr=$((rss1 - rss0)) -v du=$((redis_used1 - redis_used0)) \
    'BEGIN {printf "rankd VmRSS / redis used_memory: %.1fx (added: %.1fx)\n", r / u, dr / du}'
echo "rankd after loading: $unwritten players not yet written as runs, $(mib "$memtables") MiB in memtables"
echo "rankd data dir: $(mib "$(du -sb "$work/rankd" | cut -f1)") MiB"

# log_field NAME: the values of NAME=... in rankd's log (colours removed).
log_field() { sed 's/\x1b\[[0-9;]*m//g' "$work/rankd.log" | grep -o "$1=[0-9]*" | cut -d= -f2 || true; }

# restart SIGNAL: stops rankd with SIGNAL, starts it again and prints how
# long until a rank is answered, and the resident set once settled.
restart() {
    local started stopped
    started=$(now)
    kill "-$1" "$rankd_pid"
    wait "$rankd_pid" 2>/dev/null || true
    stopped=$(seconds_since "$started")
    : >"$work/rankd.log"
    started=$(now)
    start_rankd "$work/rankd"
    wait_listening "$work/rankd.log" "$rankd_pid"
    until "$rankd" "${probe[@]}" >/dev/null 2>&1; do
        kill -0 "$rankd_pid" || { cat "$work/rankd.log" >&2; exit 1; }
        sleep 0.01
    done
    local answered shard_ms ready_ms
    answered=$(seconds_since "$started")
    shard_ms=$(log_field total_ms | paste -sd/)
    ready_ms=$(log_field ready_ms)
    sleep "$settle"
    printf '%-8s stopped in %5s s; rank answered %5s s after the start (shards opened in %s ms, listening at %s ms); VmRSS %s MiB, jemalloc allocated %s MiB\n' \
        "$1" "$stopped" "$answered" "$shard_ms" "$ready_ms" "$(mib "$(rss_bytes "$rankd_pid")")" "$(mib "$(allocator allocated)")"
}
echo
restart TERM
restart KILL

# The write spread, then one board on a fresh server.
echo
measure() {
    local name=$1
    shift
    [ "$warm" -gt 0 ] && "$rankd_bench" --target "$rankd_target" "$@" --duration "$warm" -w set >/dev/null
    "$rankd_bench" --target "$rankd_target" "$@" --duration "$duration" -w set \
        --server-metrics "127.0.0.1:$metrics_port" --json "$work/$name.json" >/dev/null
}
measure spread "${spread[@]}"
stop "$rankd_pid"
start_rankd "$work/one-board"
wait_listening "$work/one-board.log" "$rankd_pid"
"$rankd_bench" --target "$rankd_target" --players "$one_board" --prefill --ops 1 -q >/dev/null 2>&1
measure one-board --players "$one_board" -c "$conns" -d "$depth" -q

# "ops/s p99_us server_cores idle_cores" of one JSON report.
figures() {
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); s=j["seconds"]
cpu = j.get("server_cpu_seconds"); idle = j.get("machine_idle_seconds")
print(round(j["ops_per_sec"]), j["p99_us"], "-" if cpu is None else "%.2f" % (cpu / s), "-" if idle is None else "%.2f" % (idle / s))' "$1"
}
read -r s_ops s_p99 s_cpu s_idle < <(figures "$work/spread.json")
read -r o_ops o_p99 o_cpu o_idle < <(figures "$work/one-board.json")
printf '%-34s %10s %8s %6s %5s\n' "set, $conns x $depth" ops/s "p99 us" cores idle
printf '%-34s %10s %8s %6s %5s\n' "spread over $boards boards" "$s_ops" "$s_p99" "$s_cpu" "$s_idle"
printf '%-34s %10s %8s %6s %5s\n' "one board of $one_board players" "$o_ops" "$o_p99" "$o_cpu" "$o_idle"
awk -v a="$s_ops" -v b="$o_ops" 'BEGIN {printf "spread / one board: %.2f\n", a / b}'
