#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need
# (the Python msgpack package for the second-language client; Debian's
# prometheus package, whose server and promtool check the dashboard and
# alert rules), then every unit, property and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "installing Debian's prometheus package for tests/prometheus.rs"
  apt_install prometheus
fi

if ! command -v redis-server >/dev/null; then
  echo "installing Debian's redis-server package for tests/bench_smoke.rs (the Redis comparison)"
  apt_install redis-server
fi

if ! python3 -c 'import msgpack' 2>/dev/null; then
  echo "installing the Python msgpack package for tests/python_client.rs"
  python3 -m pip install --quiet --disable-pip-version-check msgpack
fi

cargo test --workspace "$@"
