#!/usr/bin/env bash
# Parity table: configs/shakespeare-m4.yaml (M=4 learners, equal tokens) in ddp, diloco,
# streaming and decoupled mode, one row each: final val loss and its ratio to ddp, tokens, wire
# bytes (bytes_up + bytes_down) and how many times fewer than ddp, wall time, outer steps.
# diloco and streaming run their papers' recipes (configs/baselines/*.sets: plain mean,
# overwrite or mixing, their codecs), with a "diloco int4" row beside diloco; --tuned adds them
# again with only sync.mode changed (the decoupled config's RDA, token weights, replay, int4).
# The first seed's runs are overlaid in OUT/report.html (dilococtl report).
# Rows are means over the seeds. ddp's wire bytes are what a ring all-reduce of fp32 gradients
# would send (see daemon/train/ddp_run.h); the others count every learner<->syncer message.
#
#   scripts/bench/parity.sh                          # the four modes, seed 1337 (the config's)
#   scripts/bench/parity.sh --seeds "1 2"            # means over seeds 1 and 2
#   scripts/bench/parity.sh --sweep                  # + decoupled over H and uplink codecs
#   scripts/bench/parity.sh --modes "ddp decoupled" --set learners.3.slowdown=3
#   scripts/bench/parity.sh --straggler              # + learner 3 three times slower, equal wall time
#   scripts/bench/parity.sh --tuned                  # + diloco/streaming with the decoupled settings
#   scripts/bench/parity.sh --hetero                 # + two learners 1.3x slower: K=M, K=1, K=1 + grace
#   scripts/bench/parity.sh --frontier               # + the points of configs/baselines/frontier.points
#   scripts/bench/parity.sh --set train.steps=20     # a smoke run of the script itself
#   scripts/bench/parity.sh --table DIR              # print the table of an earlier run again
#
# Clocks: configs/shakespeare-m4.yaml runs on virtual time (sync.clock: virtual, its timing:
# section), so the diloco, streaming and decoupled rows are the same bits on any machine and
# their "wall s" is virtual seconds of the config's deployment; ddp has no virtual clock and runs
# on the wall clock (dilococtl says so on stderr; lock step, so its bits do not depend on time).
# --straggler: after the modes, ddp, diloco and decoupled again with learners.3.slowdown=3 and
# train.time_limit_s = the train time of that seed's decoupled run without a straggler (the wall
# time the job takes when nobody is slow): who gets furthest in the same wall time. These rows
# (and a "decoupled, wall clock" row for the budget) run with sync.clock=wall.
# --hetero: the paper's heterogeneous test: learners 2 and 3 at slowdown 1.3, every learner's step
# stretched by exponential noise of mean 10% (learners[i].jitter); decoupled with K=M, K=1 without
# a grace window, K=1 with the window capped at one inner step (the paper's), and K=1 with the
# config's window (heartbeat forecast, cap_ms); then K=4 and the three K=1 rows again with
# sync.partial: share. Goodput and uptime columns: sync/goodput.h (uptime is the share of wall
# time the global model kept advancing).
# --frontier [FILE]: decoupled once per point of FILE (default configs/baselines/frontier.points:
# "NAME | KEY=VALUE ..." a line), each against a ddp run with the same train.* overrides; prints
# loss ratio against bytes ratio and writes OUT/frontier.jsonl (one point a line, plot-ready).
# Options: --seeds LIST, --modes LIST, --sweep, --straggler, --tuned, --hetero, --frontier [FILE], --hs LIST (sweep H, default "10 50
# 100"), --codecs LIST (sweep uplink codecs, default "fp32 int8"), --downs LIST (sweep downlink
# codecs, default "int8"); the decoupled row itself is the config's (H = 25, int4 both ways in
# configs/shakespeare-m4.yaml), so the sweeps leave those out. --set K=V (repeatable, passed to
# every run before the row's own overrides, which win), --out DIR (results.jsonl and logs; default a new /tmp/parity-*), --keep (keep the
# run directories), --table DIR.
# Environment: DILOCOCTL (default build/bin/dilococtl), CONFIG (default
# configs/shakespeare-m4.yaml), NICE (niceness of the runs, default 10).
# A full run is long on a small CPU (each of the four modes trains 4 x 500 steps, about a minute on
# 2 cores); the sweep adds six more runs per seed, --straggler three, --hetero eight, --frontier
# one per point (26 in the shipped file, about 30 minutes a seed).
set -euo pipefail
caller=$PWD
abspath() { [[ $1 = /* ]] && echo "$1" || echo "$caller/$1"; }  # paths given are the caller's
cd "$(dirname "$0")/../.."
bin=${DILOCOCTL:+$(abspath "$DILOCOCTL")}
bin=${bin:-build/bin/dilococtl}
config=${CONFIG:+$(abspath "$CONFIG")}
config=${config:-configs/shakespeare-m4.yaml}
niceness=${NICE:-10}
seeds=""
modes="ddp diloco streaming decoupled"
sweep=0
straggler=0
tuned=0
hetero=0
frontier=""
hs="10 50 100"
codecs="fp32 int8"
downs="int8"
sets=()
out=""
keep=0
table_only=""
usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) seeds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --sweep) sweep=1; shift ;;
    --straggler) straggler=1; shift ;;
    --tuned) tuned=1; shift ;;
    --hetero) hetero=1; shift ;;
    --frontier)
      if [[ $# -gt 1 && $2 != --* ]]; then frontier=$(abspath "$2"); shift 2; else frontier=configs/baselines/frontier.points; shift; fi ;;
    --hs) hs=$2; shift 2 ;;
    --codecs) codecs=$2; shift 2 ;;
    --downs) downs=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    --out) out=$(abspath "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --table) table_only=$(abspath "$2"); shift 2 ;;
    -h|--help) usage ;;
    *) echo "parity.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

print_table() {
  /usr/bin/env python3 - "$1/results.jsonl" <<'PY'
import json, sys
from collections import OrderedDict
rows = OrderedDict()
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault(r["row"], []).append(r)
def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")
stats = OrderedDict()
for name, rs in rows.items():
    ok = [r for r in rs if r.get("ok")]
    s = {"name": name, "runs": len(rs), "failed": len(rs) - len(ok), "seeds": " ".join(str(r["seed"]) for r in ok)}
    if ok:
        s["val"] = mean([r["summary"]["final_val_loss"] for r in ok])
        s["tokens"] = mean([r["summary"]["tokens"] for r in ok])
        s["bytes"] = mean([r["summary"]["bytes_up"] + r["summary"]["bytes_down"] for r in ok])
        s["wall"] = mean([r["summary"]["wall_s"] for r in ok])
        s["outer"] = mean([r["summary"].get("outer_steps", 0) for r in ok])
        s["dropped"] = mean([r["summary"].get("dropped_deltas", 0) for r in ok])
        gs = [r["summary"]["goodput"] for r in ok if isinstance(r["summary"].get("goodput"), (int, float))]
        us = [r["summary"]["uptime"] for r in ok if isinstance(r["summary"].get("uptime"), (int, float))]
        s["goodput"] = f"{mean(gs):.3f}" if gs else "-"
        s["uptime"] = f"{mean(us):.3f}" if us else "-"
    stats[name] = s
ddp = stats.get("ddp")
def fmt_bytes(b):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1000 or unit == "TB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
hdr = (f"{'run':40} {'seeds':>9} {'val loss':>8} {'/ddp':>6} {'tokens':>9} {'wire bytes':>10} "
       f"{'ddp/x':>7} {'wall s':>7} {'outer':>6} {'dropped':>7} {'goodput':>7} {'uptime':>6}")
print(hdr)
print("-" * len(hdr))
for s in stats.values():
    if "val" not in s:
        print(f"{s['name']:40} failed ({s['failed']} of {s['runs']} runs; see the logs)")
        continue
    have_ddp = ddp is not None and "val" in ddp
    ratio = f"{s['val'] / ddp['val']:.3f}" if have_ddp else "-"
    fewer = f"{ddp['bytes'] / s['bytes']:.0f}x" if have_ddp and s["bytes"] > 0 else "-"
    note = f"  ({s['failed']} failed)" if s["failed"] else ""
    print(f"{s['name']:40} {s['seeds']:>9} {s['val']:>8.4f} {ratio:>6} {s['tokens']:>9.0f} {fmt_bytes(s['bytes']):>10} "
          f"{fewer:>7} {s['wall']:>7.1f} {s['outer']:>6.0f} {s['dropped']:>7.0f} {s['goodput']:>7} {s['uptime']:>6}{note}")
PY
}

# The frontier points of results.jsonl (rows with a "point"): means over seeds of val loss and
# wire bytes, each against its ddp reference row; a table, and OUT/frontier.jsonl.
print_frontier() {
  /usr/bin/env python3 - "$1/results.jsonl" "$1/frontier.jsonl" <<'PY'
import json, sys
from collections import OrderedDict
runs = [json.loads(line) for line in open(sys.argv[1])]
def mean(xs):
    return sum(xs) / len(xs) if xs else None
def stat(row):
    ok = [r for r in runs if r["row"] == row and r.get("ok")]
    return (mean([r["summary"]["final_val_loss"] for r in ok]),
            mean([r["summary"]["bytes_up"] + r["summary"]["bytes_down"] for r in ok]), len(ok))
points = OrderedDict()
for r in runs:
    if "point" in r:
        points.setdefault(r["row"], r)
if not points:
    sys.exit(0)
print()
width = max(len("frontier point"), *(len(r["point"]) for r in points.values()))
hdr = f"{'frontier point':{width}} {'val loss':>8} {'ddp ref':>8} {'/ddp':>6} {'wire bytes':>10} {'ddp/x':>7} {'runs':>4}  overrides"
print(hdr)
print("-" * len(hdr))
with open(sys.argv[2], "w") as out:
    for row, r in points.items():
        val, nbytes, n = stat(row)
        ref_val, ref_bytes, _ = stat(r["ref"])
        if val is None or ref_val is None or not nbytes:
            print(f"{r['point']:{width}} failed or no ddp reference ({r['ref']}); see the logs")
            continue
        loss_ratio, bytes_ratio = val / ref_val, ref_bytes / nbytes
        print(f"{r['point']:{width}} {val:>8.4f} {ref_val:>8.4f} {loss_ratio:>6.3f} {nbytes / 1e6:>7.1f} MB {bytes_ratio:>6.0f}x {n:>4}  {r['sets']}")
        out.write(json.dumps({"point": r["point"], "overrides": r["sets"], "val_loss": val, "ddp_val_loss": ref_val,
                              "loss_ratio": loss_ratio, "wire_bytes": nbytes, "ddp_wire_bytes": ref_bytes,
                              "bytes_ratio": bytes_ratio, "seeds": n}) + "\n")
print(f"(points: {sys.argv[2]})")
PY
}

if [[ -n $table_only ]]; then
  [[ -f $table_only/results.jsonl ]] || { echo "parity.sh: no results.jsonl in '$table_only'" >&2; exit 2; }
  print_table "$table_only"
  print_frontier "$table_only"
  exit 0
fi
[[ -x $bin ]] || { echo "parity.sh: $bin not found or not executable: build dilococtl, or set DILOCOCTL" >&2; exit 2; }
[[ -f $config ]] || { echo "parity.sh: config '$config' not found: set CONFIG" >&2; exit 2; }
[[ -z $frontier || -f $frontier ]] || { echo "parity.sh: frontier points file '$frontier' not found" >&2; exit 2; }
if [[ -z $seeds ]]; then
  seeds=$(sed -n 's/^ *seed: *\([0-9]*\).*/\1/p' "$config" | head -n1)
  seeds=${seeds:-1337}
fi
if [[ -z $out ]]; then out=$(mktemp -d /tmp/parity-XXXXXX); fi
mkdir -p "$out"
: > "$out/results.jsonl"
meta='{}'  # extra fields of the next results line (the frontier's point and reference)

# run NAME SEED [--set K=V ...]: one training run, its summary appended to results.jsonl.
run() {
  local name=$1 seed=$2
  shift 2
  local tag
  tag=$(echo "$name-s$seed" | tr ' =/' '_-_')
  local dir="$out/runs/$tag" log="$out/logs/$tag.log"
  mkdir -p "$out/logs"
  rm -rf "$dir"
  echo "parity.sh: $name, seed $seed" >&2
  local last rc=0
  # The --set overrides first, then the row's own (a frontier point's, a recipe's), which win.
  nice -n "$niceness" "$bin" train "$config" --set "train.seed=$seed" ${sets[@]+"${sets[@]}"} "$@" \
    --out "$dir" --json > "$log.out" 2> "$log" || rc=$?
  last=$(tail -n1 "$log.out" 2>/dev/null || true)
  if [[ $rc -eq 0 ]] && jq -e . > /dev/null 2>&1 <<< "$last"; then
    jq -c --arg row "$name" --argjson seed "$seed" --argjson meta "$meta" \
      '{row: $row, seed: $seed, ok: true, summary: .} + $meta' <<< "$last" \
      >> "$out/results.jsonl"
  else
    echo "parity.sh: $name, seed $seed failed (exit $rc): $(tail -n2 "$log" | tr '\n' ' ')" >&2
    jq -nc --arg row "$name" --argjson seed "$seed" --arg log "$log" --argjson meta "$meta" \
      '{row: $row, seed: $seed, ok: false, log: $log} + $meta' \
      >> "$out/results.jsonl"
  fi
  if [[ $seed == "$report_seed" ]]; then
    report_runs+=("$dir") report_labels+=(--label "$name")  # removed after the report
  elif [[ $keep -eq 0 ]]; then
    rm -rf "$dir"
  fi
}

# The first seed's runs overlaid in one page (dilococtl report), beside the table.
write_report() {
  [[ ${#report_runs[@]} -gt 0 ]] || return 0
  if "$bin" report "${report_runs[@]}" "${report_labels[@]}" -o "$out/report.html" > /dev/null 2> "$out/logs/report.log"; then
    echo "parity.sh: report of seed $report_seed's runs: $out/report.html" >&2
  else
    echo "parity.sh: no report: $(tail -n1 "$out/logs/report.log")" >&2
  fi
  [[ $keep -eq 1 ]] || rm -rf "${report_runs[@]}"
}

# recipe NAME: the --set overrides of configs/baselines/NAME.sets (one KEY=VALUE a line), NUL-separated.
recipe() {
  local line
  while IFS= read -r line; do
    [[ -z $line || $line == \#* ]] || printf '%s\0%s\0' --set "$line"
  done < "configs/baselines/$1.sets"
}
# mode_args MODE: a mode's run arguments: its paper's recipe for diloco and streaming, else the
# config with sync.mode set.
mode_args() {
  case $1 in
    diloco | streaming | diloco-int4) recipe "$1" ;;
    *) printf '%s\0%s\0' --set "sync.mode=$1" ;;
  esac
}

read -r report_seed _ <<< "$seeds"
report_runs=()
report_labels=()
for seed in $seeds; do
  for mode in $modes; do
    mapfile -d '' -t args < <(mode_args "$mode")
    run "$mode" "$seed" "${args[@]}"
    if [[ $mode == diloco ]]; then
      mapfile -d '' -t args < <(mode_args diloco-int4)
      run "diloco int4" "$seed" "${args[@]}"
    fi
    if [[ $tuned -eq 1 && ( $mode == diloco || $mode == streaming ) ]]; then
      run "$mode, decoupled's settings" "$seed" --set "sync.mode=$mode"
    fi
  done
  if [[ $straggler -eq 1 ]]; then
    # Equal wall time is a wall-clock comparison (ddp has no virtual clock): every straggler row,
    # and the healthy decoupled run its budget comes from, run with sync.clock=wall.
    budget=$(jq -r --argjson seed "$seed" 'select(.row == "decoupled, wall clock" and .seed == $seed and .ok) | .summary.train_s' \
      "$out/results.jsonl" | tail -n1)
    if [[ -z $budget ]]; then
      run "decoupled, wall clock" "$seed" --set sync.mode=decoupled --set sync.clock=wall
      budget=$(jq -r --argjson seed "$seed" 'select(.row == "decoupled, wall clock" and .seed == $seed and .ok) | .summary.train_s' \
        "$out/results.jsonl" | tail -n1)
    fi
    if [[ -z $budget ]]; then
      echo "parity.sh: no decoupled run for seed $seed to take the straggler rows' wall-time budget from" >&2
    else
      echo "parity.sh: straggler rows, seed $seed: wall-time budget ${budget} s" >&2
      for mode in ddp diloco decoupled; do
        mapfile -d '' -t args < <(mode_args "$mode")
        run "$mode, 1 learner 3x slow, equal wall" "$seed" "${args[@]}" --set learners.3.slowdown=3 \
          --set "train.time_limit_s=$budget" --set sync.clock=wall
      done
    fi
  fi
  if [[ $hetero -eq 1 ]]; then
    slow=(--set learners.2.slowdown=1.3 --set learners.3.slowdown=1.3)
    for i in 0 1 2 3; do slow+=(--set "learners.$i.jitter=0.1"); done
    run "hetero K=4" "$seed" --set sync.mode=decoupled --set sync.quorum=4 "${slow[@]}"
    run "hetero K=1, no grace" "$seed" --set sync.mode=decoupled --set sync.quorum=1 --set sync.grace.cap_ms=0 \
      --set sync.grace.forecast=false "${slow[@]}"
    run "hetero K=1, grace capped at 1 step" "$seed" --set sync.mode=decoupled --set sync.quorum=1 \
      --set sync.grace.cap_steps=1 --set sync.grace.forecast=false "${slow[@]}"
    run "hetero K=1, grace + forecast" "$seed" --set sync.mode=decoupled --set sync.quorum=1 "${slow[@]}"
    # The same with sync.partial: share (a round of k deltas moves Θ by k/M of its merge).
    run "hetero K=4, partial share" "$seed" --set sync.mode=decoupled --set sync.quorum=4 --set sync.partial=share \
      "${slow[@]}"
    run "hetero K=1, no grace, partial share" "$seed" --set sync.mode=decoupled --set sync.quorum=1 \
      --set sync.grace.cap_ms=0 --set sync.grace.forecast=false --set sync.partial=share "${slow[@]}"
    run "hetero K=1, grace capped at 1 step, partial share" "$seed" --set sync.mode=decoupled --set sync.quorum=1 \
      --set sync.grace.cap_steps=1 --set sync.grace.forecast=false --set sync.partial=share "${slow[@]}"
    run "hetero K=1, grace + forecast, partial share" "$seed" --set sync.mode=decoupled --set sync.quorum=1 \
      --set sync.partial=share "${slow[@]}"
  fi
  if [[ -n $frontier ]]; then
    while IFS= read -r line; do
      [[ -z ${line// /} || $line == \#* ]] && continue
      point=$(sed 's/ *|.*//' <<< "$line")
      read -r -a kvs <<< "$(sed -n 's/^[^|]*| *//p' <<< "$line")"
      args=() train_args=() train_sets=""
      for kv in ${kvs[@]+"${kvs[@]}"}; do
        args+=(--set "$kv")
        if [[ $kv == train.* ]]; then train_args+=(--set "$kv"); train_sets+=" $kv"; fi
      done
      ref="ddp${train_sets:+,$train_sets}"
      if ! jq -se --arg row "$ref" --argjson seed "$seed" 'any(.[]; .row == $row and .seed == $seed)' \
        "$out/results.jsonl" > /dev/null; then
        meta='{}'
        run "$ref" "$seed" --set sync.mode=ddp ${train_args[@]+"${train_args[@]}"}
      fi
      meta=$(jq -nc --arg point "$point" --arg sets "${kvs[*]-}" --arg ref "$ref" '{point: $point, sets: $sets, ref: $ref}')
      run "frontier: $point" "$seed" --set sync.mode=decoupled ${args[@]+"${args[@]}"}
      meta='{}'
    done < "$frontier"
  fi
  if [[ $sweep -eq 1 ]]; then
    for h in $hs; do
      run "decoupled H=$h" "$seed" --set sync.mode=decoupled --set "sync.inner_steps=$h"
    done
    for codec in $codecs; do
      run "decoupled up=$codec" "$seed" --set sync.mode=decoupled --set "sync.codec.up=$codec"
    done
    for codec in $downs; do
      run "decoupled down=$codec" "$seed" --set sync.mode=decoupled --set "sync.codec.down=$codec"
    done
  fi
done
write_report
echo "parity.sh: results in $out/results.jsonl (print again: scripts/bench/parity.sh --table $out)" >&2
print_table "$out"
print_frontier "$out"
