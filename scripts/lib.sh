# Sourced by the performance scripts, from the repository root: the rankd
# binary they run, the temp dir they work in, and how they stop a server.
#
# Sets `rankd` (RANKD=path runs another binary, e.g. an older build for an
# A/B; otherwise a release build of this checkout) and `work` (a fresh temp
# dir, for the caller's EXIT trap to remove).

if [ -z "${RANKD:-}" ]; then cargo build --release --quiet; fi
rankd=${RANKD:-target/release/rankd}
work=$(mktemp -d)

# wait_listening LOG PID: returns once the rankd started as PID says in LOG
# that it listens; if it exits first, prints LOG and ends the script.
wait_listening() {
    until grep -q listening "$1" 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || { cat "$1" >&2; exit 1; }
        sleep 0.01
    done
}

# stop PID: kills a server the script started, if any, and waits for it.
stop() {
    if [ -n "$1" ] && kill "$1" 2>/dev/null; then
        wait "$1" 2>/dev/null || true
    fi
}
