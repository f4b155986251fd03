#!/usr/bin/env bash
# The scale sweep of `dilococtl simulate`: chips 150k ... 2.4M x (ddp, elastic ddp, decoupled
# with M = 1, 2, 4, 8, 16 learners and S = 1, 2, 4 syncer shards) for each scenario, a table with the published figures beside ours
# (Decoupled DiLoCo paper: goodput at 1.2M and 2.4M chips), an SVG plot of goodput against chips
# per scenario, and every row as JSON lines.
#
#   scripts/bench/simulate.sh                         # both shipped scenarios, 24 simulated hours
#   scripts/bench/simulate.sh --hours 6 --out DIR     # shorter; results in DIR
#   scripts/bench/simulate.sh --syncers "1 2"         # syncer shard counts (default "1 2 4")
#   scripts/bench/simulate.sh --scenarios "configs/simulate/paper-1.2m.yaml"
#   scripts/bench/simulate.sh --bench-syncer          # merge rate: this machine's `bench syncer --json`
#   scripts/bench/simulate.sh --merge-bench FILE.json # merge rate: a saved `bench syncer --json` output
#   scripts/bench/simulate.sh --wan                   # peak WAN: balanced against whole-tensor fragments
#   scripts/bench/simulate.sh --jobs 8                # rows at once (default: every core, nproc)
#
# --wan (about 25 s): GPT-2 124M and 12B (configs/simulate/{gpt2-124m,model-12b}-wan.yaml) at
# P = 8, 24, 48 (and 96 for 12B), each partition rule, as a markdown table: the mean rate of a
# link ("optimal": a perfectly even schedule sends it all the time), the peak over one fragment
# interval and over the busiest minute, each against the mean.
# Scenarios (configs/simulate/): paper-1.2m.yaml takes its per-chip failure rate from a
# published source (Llama 3); paper-1.2m-dp-matched.yaml sets that one rate so that ddp matches
# the paper at 1.2M chips, and the other rows are predictions. The "sim s" column is the
# simulation's own time (the speed target: 1M chips x 24 h in <= 60 s).
# Environment: DILOCOCTL (default build/bin/dilococtl).
set -euo pipefail
caller=$PWD
abspath() { [[ $1 = /* ]] && echo "$1" || echo "$caller/$1"; }
cd "$(dirname "$0")/../.."
bin=${DILOCOCTL:+$(abspath "$DILOCOCTL")}
bin=${bin:-build/bin/dilococtl}
scenarios="configs/simulate/paper-1.2m.yaml configs/simulate/paper-1.2m-dp-matched.yaml"
chips="150000 300000 600000 1200000 2400000"
learners="1 2 4 8 16"
syncers="1 2 4"
hours=""
out=""
wan=0
merge_bench=""
bench_syncer=0
jobs=$(nproc 2>/dev/null || echo 1)
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --scenarios) scenarios=$2; shift 2 ;;
    --chips) chips=$2; shift 2 ;;
    --learners) learners=$2; shift 2 ;;
    --syncers) syncers=$2; shift 2 ;;
    --hours) hours=$2; shift 2 ;;
    --out) out=$(abspath "$2"); shift 2 ;;
    --wan) wan=1; shift ;;
    --merge-bench) merge_bench=$(abspath "$2"); shift 2 ;;
    --bench-syncer) bench_syncer=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "simulate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "simulate.sh: $bin not found: build dilococtl, or set DILOCOCTL" >&2; exit 2; }
if [[ -z $out ]]; then out=$(mktemp -d /tmp/simulate-XXXXXX); fi
mkdir -p "$out"

if [[ $wan = 1 ]]; then
  for model in gpt2-124m model-12b; do
    ps="8 24 48"
    [[ $model = model-12b ]] && ps="8 24 48 96"
    for p in $ps; do
      for balanced in true false; do
        for window in 0 60; do
          "$bin" simulate "configs/simulate/$model-wan.yaml" --set "sync.fragments=$p" \
            --set "balanced_fragments=$balanced" --set "wan_window_s=$window" --json |
            sed "s/^{/{\"model\":\"$model\",/"
        done
      done
    done
  done > "$out/wan.jsonl"
  /usr/bin/env python3 - "$out/wan.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# (model, P, balanced) -> {window: row}; window 60 is the busiest minute, the other one interval.
by = {}
for r in rows:
    by.setdefault((r["model"], r["fragments"], r["balanced_fragments"]), {})[60 if r["wan_window_s"] == 60 else 0] = r
print("| model | P | fragments | largest / mean fragment | mean Gb/s (optimal) | peak Gb/s, one interval | peak / optimal | peak Gb/s, busiest minute | peak / optimal |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for (model, p, balanced), w in by.items():
    a, m = w[0], w[60]
    print(f"| {model} | {p} | {'balanced' if balanced else 'whole tensors'} | {a['fragment_imbalance']:.3f} | "
          f"{a['mean_wan_gbps']:.3f} | {a['peak_wan_gbps']:.3f} ({a['wan_window_s']:g} s) | "
          f"{a['peak_wan_gbps'] / a['mean_wan_gbps']:.2f} | {m['peak_wan_gbps']:.3f} | "
          f"{m['peak_wan_gbps'] / m['mean_wan_gbps']:.2f} |")
PY
  echo "simulate.sh: rows in $out/wan.jsonl" >&2
  exit 0
fi

if [[ $bench_syncer = 1 ]]; then
  merge_bench=$out/bench-syncer.json
  echo "simulate.sh: dilococtl bench syncer (20M params, 4 learners, int4)" >&2
  "$bin" bench syncer --params 20000000 --learners 4 --codec int4 --json > "$merge_bench"
fi
args=(--jobs "$jobs")
[[ -z $merge_bench ]] || args+=(--merge-bench "$merge_bench")
for c in $chips; do args+=(--chips "$c"); done
for m in $learners; do args+=(--learners "$m"); done
for s in $syncers; do args+=(--syncers "$s"); done
[[ -z $hours ]] || args+=(--hours "$hours")
for scenario in $scenarios; do
  name=$(basename "$scenario" .yaml)
  echo "simulate.sh: $name" >&2
  "$bin" simulate "$scenario" --mode ddp --mode elastic-ddp --mode decoupled "${args[@]}" --json \
    --plot "$out/$name.svg" > "$out/$name.jsonl"
done
/usr/bin/env python3 - "$out" $scenarios <<'PY'
import json, os, sys
out, scenarios = sys.argv[1], sys.argv[2:]
# The paper's goodput figures: (mode, learners, chips) -> goodput.
paper = {("ddp", 1, 1200000): 0.27, ("elastic-ddp", 64, 1200000): 0.58, ("decoupled", 2, 1200000): 0.70,
         ("decoupled", 4, 1200000): 0.82, ("decoupled", 8, 1200000): 0.88, ("decoupled", 16, 1200000): 0.93,
         ("ddp", 1, 2400000): 0.18, ("elastic-ddp", 64, 2400000): 0.40, ("decoupled", 8, 2400000): 0.80,
         ("decoupled", 16, 2400000): 0.86}
for scenario in scenarios:
    name = os.path.basename(scenario)[:-5]
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    print(f"\n{name} ({rows[0]['hours']:g} simulated hours; merge {rows[0]['merge_gbps']:.2f} GB/s from "
          f"{rows[0]['merge_gbps_source']})")
    hdr = f"{'mode':12} {'M':>3} {'S':>2} {'chips':>9} {'goodput':>8} {'paper':>6} {'diff':>6} {'uptime':>7} {'merges/h':>9} {'contr':>6} {'failures':>8} {'peak Gb/s':>9} {'syncer Gb/s':>11} {'sim s':>6}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        p = paper.get((r["mode"], r["learners"], int(r["chips"])))
        ref = f"{p:.2f}" if p is not None else "-"
        diff = f"{100 * (r['goodput'] - p):+.0f}" if p is not None else "-"
        print(f"{r['mode']:12} {r['learners']:>3} {r['syncers']:>2} {r['chips']:>9.0f} {r['goodput']:>8.3f} {ref:>6} "
              f"{diff:>6} {r['uptime']:>7.3f} {r['merges_per_hour']:>9.1f} {r['contributors_mean']:>6.2f} "
              f"{r['failures']:>8} {r['peak_wan_gbps']:>9.2f} {r['peak_syncer_gbps']:>11.2f} {r['runtime_s']:>6.2f}")
    print(f"plot: {out}/{name}.svg")
PY
echo "simulate.sh: rows in $out/*.jsonl" >&2
