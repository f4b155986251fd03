#!/usr/bin/env bash
# Runs the test suite (ctest) after bringing the build up to date.
#   scripts/test.sh              # everything but the hidden slow tests
#   scripts/test.sh -R model     # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d build ]] || { echo "test: no build/ yet: run scripts/setup.sh first" >&2; exit 2; }
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
