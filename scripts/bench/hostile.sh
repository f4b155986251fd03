#!/usr/bin/env bash
# Hostile peers and bad input against a training cluster: 3 dilocod on loopback (CURVE), a job
# training, and for --seconds (default 600) fuzzed control requests on every daemon's local and
# peer sockets, snapshot floods, forged learner messages with another site's key, garbage at the
# uplink and snapshot sockets, plaintext clients at CURVE sockets and a downlink subscriber that
# never reads. Prints a table: each daemon's RSS at the start, the end and its peak, the requests
# of each kind, the job's steps; fails on a crash, a hang (ping > 2 s), a stalled job or an RSS
# growth of 64 MiB or more.
#
#   scripts/bench/hostile.sh                 # 10 minutes
#   scripts/bench/hostile.sh --seconds 60 --seed 3
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=600 seed=20261204
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hostile.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x build/bin/control_tests ]] || { echo "hostile.sh: build first (scripts/setup.sh)" >&2; exit 2; }
DILOCO_HOSTILE_SECONDS=$seconds DILOCO_FUZZ_SEED=$seed build/bin/control_tests "[.hostile]"
