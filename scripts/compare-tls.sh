#!/usr/bin/env bash
# What TLS costs: the same load on a plaintext rankd and a TLS one (a
# certificate made here with openssl), one run each, printing ops/s, p99,
# the server's cores and CPU per op, and the TLS/plaintext ratio.
#
#   scripts/compare-tls.sh [SHARDS] [PLAYERS] [WORKLOADS...]
#   CONNS=64 DEPTH=1 scripts/compare-tls.sh 1 1000000 set rank
#
# Env: WARM (seconds of unmeasured sets per server, default 10), DURATION
# (default 10), CONNS (8), DEPTH (64), KEEP=1 keeps the temp dir, RANKD and
# RANKD_BENCH as in scripts/lib.sh.
set -euo pipefail
cd "$(dirname "$0")/.."


command -v openssl >/dev/null || { echo "needs openssl (apt-get install -y openssl)" >&2; exit 2; }
source scripts/lib.sh
comparison_load 10 "$@"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do stop "$pid"; done
    if [ "${KEEP:-0}" = 1 ]; then echo "reports kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost" -addext "basicConstraints=critical,CA:FALSE" -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

names=(plain tls)
ports=(7370 7371)
tls_server=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
tls_client=(--tls-ca "$work/cert.pem")
for i in 0 1; do
    extra=()
    [ "$i" = 1 ] && extra=("${tls_server[@]}")
    "$rankd" serve --shards "$shards" --data-dir "$work/${names[$i]}" --listen "127.0.0.1:${ports[$i]}" \
        --metrics-listen 127.0.0.1:0 "${extra[@]}" >"$work/${names[$i]}.log" 2>&1 &
    pids+=($!)
    wait_listening "$work/${names[$i]}.log" "${pids[$i]}"
done

hz=$(getconf CLK_TCK)

for i in 0 1; do
    client=(--target "rankd://localhost:${ports[$i]}")
    [ "$i" = 1 ] && client+=("${tls_client[@]}")
    "$rankd_bench" "${client[@]}" --players "$players" --prefill --ops 1 -q >/dev/null
    [ "$warm" -gt 0 ] && "$rankd_bench" "${client[@]}" --players "$players" \
        --duration "$warm" -c "$conns" -d "$depth" -w set -q >/dev/null
done
# Workload by workload, plaintext then TLS, so both see the same machine.
for w in "${workloads[@]}"; do
    for i in 0 1; do
        client=(--target "rankd://localhost:${ports[$i]}")
        [ "$i" = 1 ] && client+=("${tls_client[@]}")
        before=$(cpu_ticks "${pids[$i]}")
        "$rankd_bench" "${client[@]}" --players "$players" --duration "$duration" \
            -c "$conns" -d "$depth" -w "$w" -q --json "$work/${names[$i]}-$w.json" >/dev/null
        after=$(cpu_ticks "${pids[$i]}")
        echo $((after - before)) >"$work/${names[$i]}-$w.ticks"
    done
done

# "ops/s p99_us cores cpu_us_per_op" of one run.
figures() {
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); ticks=int(open(sys.argv[2]).read()); hz=int(sys.argv[3])
cpu = ticks / hz
print(round(j["ops_per_sec"]), j["p99_us"], "%.2f" % (cpu / j["seconds"]), "%.1f" % (cpu / (j["ops_per_sec"] * j["seconds"]) * 1e6))' "$1" "$2" "$hz"
}

echo "$conns connections x depth $depth, $shards shard(s), $players players"
printf '%-8s %10s %8s %6s %7s %10s %8s %6s %7s %7s %8s\n' workload "plain op/s" "p99 us" cores "us/op" \
    "tls op/s" "p99 us" cores "us/op" ratio "cpu x"
for w in "${workloads[@]}"; do
    read -r p_ops p_p99 p_cores p_cpu < <(figures "$work/plain-$w.json" "$work/plain-$w.ticks")
    read -r t_ops t_p99 t_cores t_cpu < <(figures "$work/tls-$w.json" "$work/tls-$w.ticks")
    printf '%-8s %10s %8s %6s %7s %10s %8s %6s %7s %7s %8s\n' "$w" "$p_ops" "$p_p99" "$p_cores" "$p_cpu" \
        "$t_ops" "$t_p99" "$t_cores" "$t_cpu" "$(awk -v a="$t_ops" -v b="$p_ops" 'BEGIN {printf "%.2f", a / b}')" \
        "$(awk -v a="$t_cpu" -v b="$p_cpu" 'BEGIN {printf "%.2f", a / b}')"
done
