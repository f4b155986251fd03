#!/usr/bin/env bash
# Deterministic simulation testing at scale: `dilococtl dst` over many seeds, split into chunks
# that run side by side (one per core), with one line per chunk and the total. A failing seed
# prints the one command that replays it (dilococtl dst --seed S).
#
#   scripts/dst.sh                       # 100,000 seeds from 1
#   scripts/dst.sh --seeds 5000 --first 200001 --jobs 2
#   scripts/dst.sh --config configs/tiny.yaml   # draw over another model and corpus
#
# Options: --seeds N (default 100000), --first S (default 1), --jobs J (default: the cores),
# --chunk N (seeds per chunk, default 1000), --config FILE, --bin DIR (default build/bin).
set -euo pipefail
seeds=100000 first=1 jobs=$(nproc) chunk=1000 config="" bin=build/bin
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --first) first=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "dst.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$bin/dilococtl" ]] || { echo "dst.sh: no $bin/dilococtl; run scripts/setup.sh first" >&2; exit 2; }
out=$(mktemp -d /tmp/dst-XXXXXX)
start=$(date +%s)
echo "dst.sh: $seeds seeds from $first, $jobs at a time, chunks of $chunk; logs in $out"
run_chunk() {  # first count
  local extra=()
  [[ -n "$config" ]] && extra=(--config "$config")
  if "$bin/dilococtl" dst --first "$1" --seeds "$2" --json "${extra[@]}" > "$out/$1.out" 2> "$out/$1.err"; then
    echo "  seeds $1..$(($1 + $2 - 1)): ok ($(tail -1 "$out/$1.out" | sed 's/.*"seeds_per_s":\([0-9.]*\).*/\1/') seeds/s)"
  else
    echo "  seeds $1..$(($1 + $2 - 1)): FAILED"; grep -E "FAILED|replay|  [a-z-]+ at" "$out/$1.err" | head -20 | sed 's/^/    /'
  fi
}
export -f run_chunk
export bin out config
s=$first end=$((first + seeds))
while (( s < end )); do
  n=$(( end - s < chunk ? end - s : chunk ))
  echo "$s $n"
  s=$((s + n))
done | xargs -P "$jobs" -n 2 bash -c 'run_chunk "$0" "$1"'
failed=$(cat "$out"/*.out | grep -h '^{' | python3 -c 'import json,sys; print(sum(json.loads(l)["failed"] for l in sys.stdin))')
echo "dst.sh: $seeds seeds, $failed failed, $(( $(date +%s) - start )) s"
[[ "$failed" == 0 ]]
