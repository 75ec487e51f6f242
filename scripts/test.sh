#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need
# (the Python msgpack package for the second-language client), then every
# unit, property and integration test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import msgpack' 2>/dev/null; then
  echo "installing the Python msgpack package for tests/python_client.rs"
  python3 -m pip install --quiet --disable-pip-version-check msgpack
fi

cargo test --workspace "$@"
