#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need
# (msgpack and pytest for the Python client's tests, which
# tests/python_client.rs runs with $RANKD_TEST_PYTHON; the Node client's npm
# dependencies, and Node itself if there is none; Debian's prometheus
# package, whose server and promtool check the dashboard and alert rules;
# fuse3, for the power-cut filesystem of tests/power_cut.rs; redis-server,
# for the load generator's Redis comparison; python3-yaml and systemd, for
# tests/deployment/), then every unit, property and integration test (with
# cargo-nextest when the machine has it).
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

if ! command -v fusermount3 >/dev/null; then
  echo "installing Debian's fuse3 package for tests/power_cut.rs (the power-cut filesystem mounts with fusermount3)"
  apt_install fuse3
fi

# tests/deployment/ reads the compose file and the Kubernetes manifests
# with PyYAML and checks the systemd unit with systemd-analyze.
deployment_needs=()
command -v systemd-analyze >/dev/null || deployment_needs+=(systemd)
/usr/bin/python3 -c 'import yaml' 2>/dev/null || deployment_needs+=(python3-yaml)
if [ ${#deployment_needs[@]} -gt 0 ]; then
  echo "installing Debian's ${deployment_needs[*]} for tests/deployment/"
  apt_install "${deployment_needs[@]}"
fi

if ! command -v redis-server >/dev/null; then
  echo "installing Debian's redis-server package for bench/tests/smoke.rs (the Redis comparison)"
  apt_install redis-server
fi

# Whether a python (not a venv) has the PEP 668 marker: Debian's python3
# does, and its pip then refuses to install anything ("externally-managed-
# environment").
externally_managed() {
  "$1" -c 'import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(marker) else 1)'
}

# Prints a python that imports msgpack and pytest (tests/python_client.rs
# runs the Python package's pytest suite with it; the package itself comes
# from clients/python/src), installing them if need be: as Debian's
# python3-msgpack and python3-pytest packages when python3 is Debian's, with
# pip when the python lets pip install, else in a venv in the target dir.
python_for_tests() {
  local python=${RANKD_TEST_PYTHON:-python3}
  local venv="${CARGO_TARGET_DIR:-target}/python-venv"
  local needs='import msgpack, pytest'
  case $venv in /*) ;; *) venv="$PWD/$venv" ;; esac
  command -v "$python" >/dev/null || { echo "no $python: tests/python_client.rs needs Python 3" >&2; return 1; }
  for candidate in "$python" "$venv/bin/python"; do
    if [ -x "$(command -v "$candidate")" ] && "$candidate" -c "$needs" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  if externally_managed "$python"; then
    if [ "$(readlink -f "$(command -v "$python")")" = "$(readlink -f /usr/bin/python3)" ] && command -v apt-get >/dev/null; then
      echo "installing Debian's python3-msgpack and python3-pytest packages for tests/python_client.rs" >&2
      if apt_install python3-msgpack python3-pytest >&2 && "$python" -c "$needs" 2>/dev/null; then
        echo "$python"
        return
      fi
    fi
  else
    echo "installing the Python msgpack and pytest packages for tests/python_client.rs (pip)" >&2
    if "$python" -m pip install --quiet --disable-pip-version-check msgpack pytest >&2 \
      && "$python" -c "$needs" 2>/dev/null; then
      echo "$python"
      return
    fi
  fi
  echo "installing the Python msgpack and pytest packages in a venv ($venv) for tests/python_client.rs" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2 || {
    echo "cannot create a venv: install python3-venv (Debian), or msgpack and pytest for $python" >&2
    return 1
  }
  # (errexit does not reach into $(...): each step is checked.)
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check msgpack pytest >&2 \
    && "$venv/bin/python" -c "$needs" || {
    echo "cannot install msgpack and pytest in $venv" >&2
    return 1
  }
  echo "$venv/bin/python"
}

RANKD_TEST_PYTHON=$(python_for_tests)
export RANKD_TEST_PYTHON
echo "tests/python_client.rs runs $RANKD_TEST_PYTHON"

# The Node client's dependency (@msgpack/msgpack, as clients/node/package-lock.json
# pins it) in clients/node/node_modules, where tests/node_client.rs needs it;
# Debian's nodejs and npm packages first if there is no node.
if ! command -v node >/dev/null; then
  echo "installing Debian's nodejs and npm packages for tests/node_client.rs"
  apt_install nodejs npm
elif ! command -v npm >/dev/null; then
  echo "installing Debian's npm package for tests/node_client.rs"
  apt_install npm
fi
echo "installing the Node client's dependencies (npm ci) for tests/node_client.rs"
npm ci --prefix clients/node --no-audit --no-fund --loglevel=error >/dev/null

# Every unit, property and integration test; arguments go to the runner.
# cargo-nextest, where the machine has it, runs the tests of every binary
# side by side, where `cargo test` waits for each binary's slowest test
# before it starts the next; it runs no doc tests, so `cargo test --doc`
# follows it.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
  cargo test --workspace --doc
else
  cargo test --workspace "$@"
fi
