#!/usr/bin/env bash
# Engine throughput table: dilocod's CPU engine against the PyTorch peer on
# the same GPT shapes (tiny, small, gpt2ish) at 1 and 2 threads.
#   scripts/bench/engine.sh                 # needs build/bin/dilococtl
#   TORCH_PEER=path/to/torch_gpt_bench.py scripts/bench/engine.sh
# PyTorch (Debian's python3-torch, run by /usr/bin/python3) is optional; it
# runs twice, with and without OMP_WAIT_POLICY=PASSIVE, and its best figure
# is the one compared. Medians of the timed steps throughout.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/bin/dilococtl
[[ -x $bin ]] || { echo "engine.sh: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
peer=${TORCH_PEER:-../shared/peers/torch_gpt_bench.py}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for threads in 1 2; do
  $bin bench gemm --threads "$threads" --json >> "$out/gemm.jsonl"
done
for config in tiny small gpt2ish; do
  for threads in 1 2; do
    echo "engine.sh: dilocod $config, $threads thread(s)" >&2
    # A fresh process per point, so peak RSS belongs to that model alone.
    $bin bench engine --config "$config" --threads "$threads" --json >> "$out/ours.jsonl"
  done
done
if [[ -f $peer ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "engine.sh: PyTorch peer (default and --passive)" >&2
  /usr/bin/python3 "$peer" --json "$out/torch.json" > /dev/null
  /usr/bin/python3 "$peer" --passive --json "$out/torch_passive.json" > /dev/null
else
  echo "engine.sh: no PyTorch peer ($peer, python3-torch): ours only" >&2
fi

/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def lines(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
gemm = {g["threads"]: g["gflops"] for g in lines("gemm.jsonl")}
torch = {}
for name in ("torch.json", "torch_passive.json"):
    p = os.path.join(out, name)
    if os.path.exists(p):
        for r in json.load(open(p)):
            key = (r["config"], r["threads"])
            torch[key] = max(torch.get(key, 0.0), r["tok_per_s_median"])
print("sgemm ceiling (1024x1536x384): " + ", ".join(f"{t} thr {g:.1f} GFLOP/s" for t, g in sorted(gemm.items())))
hdr = f"{'config':8} {'thr':>3} {'tok/s':>9} {'GFLOP/s':>8} {'%sgemm':>7} {'torch tok/s':>11} {'ratio':>6} {'RSS MB':>7} {'state+act MB':>12} {'RSS/(s+a)':>9}"
print(hdr)
print("-" * len(hdr))
for r in lines("ours.jsonl"):
    t = torch.get((r["config"], r["threads"]))
    need = r["state_mb"] + r["activations_mb"]
    ours = r["tok_per_s_median"]
    torch_s = "%.0f" % t if t else "-"
    ratio_s = "%.2fx" % (ours / t) if t else "-"
    print(f"{r['config']:8} {r['threads']:>3} {ours:>9.0f} {r['gflops_median']:>8.1f} "
          f"{100 * r['gflops_median'] / gemm[r['threads']]:>6.0f}% {torch_s:>11} {ratio_s:>6} "
          f"{r['peak_rss_mb']:>7.1f} {need:>12.1f} {r['peak_rss_mb'] / need:>9.2f}")
PY
