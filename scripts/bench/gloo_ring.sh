#!/usr/bin/env bash
# Local ring throughput: a 2-process Gloo ring (one rank per process, loopback
# TCP) against a 2-thread ring in one process, on the same model (vocab 256,
# block 64, 4 layers, n_embd 128, 4 heads), batch (8 sequences per rank) and
# steps (3 warmup, 30 timed). OMP_NUM_THREADS=1 per rank. Prints a markdown table.
#   scripts/bench/gloo_ring.sh            # needs build/bin/gloo_ring_bench (libgloo-dev)
#   STEPS=60 RUNS=3 scripts/bench/gloo_ring.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/bin/gloo_ring_bench
[[ -x $bin ]] || { echo "gloo_ring.sh: $bin not found: install libgloo-dev and build the gloo_ring_bench target" >&2; exit 2; }
steps=${STEPS:-30}
runs=${RUNS:-1}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1

for ((i = 0; i < runs; i++)); do
  echo "gloo_ring.sh: run $((i + 1))/$runs: 2 threads" >&2
  $bin --mode threads --world 2 --steps "$steps" --warmup 3 >> "$out/threads.jsonl"
  echo "gloo_ring.sh: run $((i + 1))/$runs: 2 Gloo processes" >&2
  store="$out/store$i"
  $bin --mode gloo --world 2 --rank 1 --store "$store" --steps "$steps" --warmup 3 &
  peer=$!
  $bin --mode gloo --world 2 --rank 0 --store "$store" --steps "$steps" --warmup 3 >> "$out/gloo.jsonl"
  wait "$peer"
done

/usr/bin/python3 - "$out" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
rows = {}
for mode in ("threads", "gloo"):
    rows[mode] = [json.loads(l) for l in open(os.path.join(out, mode + ".jsonl"))]
print("| ring | ranks | tokens/s (median of %d) | ms/step | final loss | params FNV |" % len(rows["threads"]))
print("|---|---|---|---|---|---|")
label = {"threads": "threads (ThreadCommGroup)", "gloo": "processes (GlooCommGroup, loopback TCP)"}
for mode, rs in rows.items():
    tps = statistics.median(r["tokens_per_s"] for r in rs)
    ms = statistics.median(r["ms_per_step"] for r in rs)
    print("| %s | %d | %.0f | %.1f | %.6f | %s |" % (label[mode], rs[0]["world"], tps, ms, rs[0]["loss"], rs[0]["params_fnv"]))
same = rows["threads"][0]["params_fnv"] == rows["gloo"][0]["params_fnv"]
print()
print("Final parameters %s." % ("bitwise equal" if same else "DIFFER"))
PY
