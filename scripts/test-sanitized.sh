#!/usr/bin/env bash
# Runs the test suite once more under AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/, CPU only). CI runs it after scripts/test.sh.
#   scripts/test-sanitized.sh             # everything
#   scripts/test-sanitized.sh -R net      # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 -g1, as the sanitizers' docs advise: a third of -O2 -g's compile time (measured on
# tests/control/test_daemon_hardening.cpp: 18.7 s against 44.4 s) with line numbers in reports.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DDILOCO_SANITIZE=ON -DDILOCO_CUDA=OFF > /dev/null
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# DST's 500 seeds run in the plain suite; under the sanitizers 100 of them (3-4x slower here).
# The network-namespace clusters and the simulator's validation against a real run (labels
# cluster, sim-validation: 2-3 minutes each under the sanitizers) run in the plain suite only;
# the same daemon, learner and syncer code runs sanitized in the control, local-run and virt tests.
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE "dst|cluster|sim-validation" "$@"
build-asan/bin/dilococtl dst --seeds 100
