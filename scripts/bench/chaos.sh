#!/usr/bin/env bash
# Chaos table: configs/shakespeare-m4.yaml (M=4 learners) lengthened to --steps per learner, in
# ddp, diloco and decoupled mode, each without faults and under two fault sets, for each seed:
# goodput, uptime, waste (down, blocked, dropped, discarded), final val loss and its ratio to the
# same mode's fault-free run, tokens and wall time; means over the seeds and a row per seed.
#
#   scripts/bench/chaos.sh                                   # the full bench: 16 runs, about an hour on 2 cores
#   scripts/bench/chaos.sh --quick                           # a smoke check of the script, a few minutes
#   scripts/bench/chaos.sh --modes decoupled --faults "none syncer" --seeds 3
#   scripts/bench/chaos.sh --json > runs.jsonl               # one JSON object per run, no table
#   scripts/bench/chaos.sh --table DIR                       # print the table of an earlier run again
#
# Fault sets (--faults, default "none learners syncer"):
#   none      no faults.
#   learners  every learner killed once and restarted 10 s later, one learner 3x slow for 20 s,
#             one partitioned from the syncer for 10 s; times drawn by Python's random with the
#             seed, in [5%, 60%] of the wall time (wall_s) of the fault-free run of the same mode
#             and seed (or of --horizon S), counted from the start of training. The schedule is
#             printed and kept in the run's directory.
#   syncer    the syncer killed at 40% of that time and restarted 5 s later. ddp has no syncer:
#             its syncer row is skipped, and the table says so.
# Options: --steps N (per learner, default 1000; train.lr_decay_steps follows), --eval-batches N
# (default 200), --seeds LIST (default "1 2"; train.seed, chaos.seed and the fault times),
# --modes LIST (default "ddp diloco decoupled"), --faults LIST, --horizon S (fault times from S
# seconds instead of the fault-free run; needed when --faults leaves out none), --timeout S (per
# run; default 3 x the fault-free wall time + the injected fault time + 120 s, and for a
# fault-free run 3 x an earlier one of the mode + 120 s, else max(600, 2 s x steps)), --corpus
# PATH (data.corpus; default the config's), --set K=V (repeatable, passed to every run), --out
# DIR (default a new /tmp/chaos-*), --json, --table DIR.
# --quick: 120 steps, eval 20 batches, seed 1, decoupled, none + learners with kills restarted
# after 3 s, 5 s slow, 3 s partition (other options given explicitly still count).
# Every run gets sync.clock=wall (the faults and goodput are the machine's real time, whatever
# the config's clock) and train.checkpoint_every=50: a killed ddp rank resumes from the checkpoint, a
# killed DiLoCo learner takes its AdamW moments back from its own learner-<i>.ckpt.
# Each run has DIR/<mode>-<faults>-s<seed>/: run/ (dilococtl's run directory, metrics.jsonl),
# stdout.log, stderr.log, command.txt, schedule.txt, meta.json. The first seed's runs are
# overlaid in DIR/report.html (dilococtl report). The table goes to DIR/chaos.md,
# every run as a JSON object to DIR/chaos.jsonl (with or without --json).
# The runs use a copy of dilococtl taken at the start (DIR/dilococtl): rebuilding meanwhile is safe.
# Environment: DILOCOCTL (default build/bin/dilococtl), CONFIG (default
# configs/shakespeare-m4.yaml), NICE (niceness of the runs, default 10).
set -euo pipefail
caller=$PWD
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."
root=$PWD
bin=${DILOCOCTL:-build/bin/dilococtl}
config=${CONFIG:-configs/shakespeare-m4.yaml}
niceness=${NICE:-10}
helper=scripts/bench/chaos_table.py
steps="" eval_batches="" seeds="" modes="" faults="" horizon="" timeout_s="" corpus="" out=""
sets=()
quick=0
json=0
table_only=""
usage() { sed -n '2,40p' "$self" | sed 's/^# \{0,1\}//' >&2; exit 2; }
abspath() { [[ $1 = /* ]] && echo "$1" || echo "$caller/$1"; }
need_value() { [[ $# -ge 2 ]] || { echo "chaos.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --eval-batches) need_value "$@"; eval_batches=$2; shift 2 ;;
    --seeds) need_value "$@"; seeds=$2; shift 2 ;;
    --modes) need_value "$@"; modes=$2; shift 2 ;;
    --faults) need_value "$@"; faults=$2; shift 2 ;;
    --horizon) need_value "$@"; horizon=$2; shift 2 ;;
    --timeout) need_value "$@"; timeout_s=$2; shift 2 ;;
    --corpus) need_value "$@"; corpus=$(abspath "$2"); shift 2 ;;
    --set) need_value "$@"; sets+=(--set "$2"); shift 2 ;;
    --out) need_value "$@"; out=$(abspath "$2"); shift 2 ;;
    --quick) quick=1; shift ;;
    --json) json=1; shift ;;
    --table) need_value "$@"; table_only=$(abspath "$2"); shift 2 ;;
    -h|--help) usage ;;
    *) echo "chaos.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
table_args=()
[[ $json -eq 1 ]] && table_args+=(--json)
if [[ -n $table_only ]]; then
  compgen -G "$table_only/*/meta.json" > /dev/null || { echo "chaos.sh: no runs (*/meta.json) in '$table_only'" >&2; exit 2; }
  exec python3 "$helper" table "$table_only" ${table_args[@]+"${table_args[@]}"}
fi

# Defaults: the full bench, or --quick's smoke check; options given explicitly win.
if [[ $quick -eq 1 ]]; then
  steps=${steps:-120} eval_batches=${eval_batches:-20} seeds=${seeds:-1} modes=${modes:-decoupled}
  faults=${faults:-none learners}
  kill_restart_s=3 slow_s=5 partition_s=3 syncer_restart_s=3
else
  steps=${steps:-1000} eval_batches=${eval_batches:-200} seeds=${seeds:-1 2}
  modes=${modes:-ddp diloco decoupled} faults=${faults:-none learners syncer}
  kill_restart_s=10 slow_s=20 partition_s=10 syncer_restart_s=5
fi
slow_factor=3
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
is_positive() { [[ $1 =~ ^[0-9]+$ && $1 -gt 0 ]]; }
is_positive "$steps" || { echo "chaos.sh: --steps must be a positive integer, got '$steps'" >&2; exit 2; }
is_positive "$eval_batches" || { echo "chaos.sh: --eval-batches must be a positive integer, got '$eval_batches'" >&2; exit 2; }
for s in $seeds; do is_uint "$s" || { echo "chaos.sh: --seeds takes integers, got '$s'" >&2; exit 2; }; done
for m in $modes; do
  case $m in ddp|diloco|decoupled) ;; *) echo "chaos.sh: unknown mode '$m' (ddp, diloco, decoupled)" >&2; exit 2 ;; esac
done
for f in $faults; do
  case $f in none|learners|syncer) ;; *) echo "chaos.sh: unknown fault set '$f' (none, learners, syncer)" >&2; exit 2 ;; esac
done
[[ -z $horizon ]] || is_num "$horizon" || { echo "chaos.sh: --horizon takes seconds, got '$horizon'" >&2; exit 2; }
[[ -z $timeout_s ]] || is_num "$timeout_s" || { echo "chaos.sh: --timeout takes seconds, got '$timeout_s'" >&2; exit 2; }
[[ -n $seeds && -n $modes && -n $faults ]] || { echo "chaos.sh: --seeds, --modes and --faults need at least one item" >&2; exit 2; }
# Fault-free runs first, whatever the order given: the others take their times from them.
ordered=""
for f in none learners syncer; do [[ " $faults " == *" $f "* ]] && ordered+="$f "; done
faults=${ordered% }
if [[ " $faults " != *" none "* && -z $horizon ]]; then
  echo "chaos.sh: --faults '$faults' leaves out none, so nothing times the faults: add none or pass --horizon S" >&2
  exit 2
fi

[[ -x $bin ]] || { echo "chaos.sh: $bin not found or not executable: build dilococtl (scripts/setup.sh), or set DILOCOCTL" >&2; exit 2; }
[[ -f $config ]] || { echo "chaos.sh: config '$config' not found: set CONFIG" >&2; exit 2; }
command -v python3 > /dev/null || { echo "chaos.sh: python3 not found (the table and the fault times need it)" >&2; exit 2; }
command -v jq > /dev/null || { echo "chaos.sh: jq not found: apt-get install jq" >&2; exit 2; }
# The corpus: --corpus, else the config's data.corpus (relative to the config's directory).
if [[ -n $corpus ]]; then
  [[ -f $corpus ]] || { echo "chaos.sh: corpus '$corpus' (--corpus) not found" >&2; exit 2; }
  sets=(--set "data.corpus=$corpus" ${sets[@]+"${sets[@]}"})
else
  cfg_corpus=$(sed -n 's/^ *corpus: *\([^ #]*\).*/\1/p' "$config" | head -n1)
  [[ -z $cfg_corpus || $cfg_corpus = /* ]] || cfg_corpus="$(dirname "$root/$config")/$cfg_corpus"
  if [[ -z $cfg_corpus || ! -f $cfg_corpus ]]; then
    echo "chaos.sh: the config's corpus '${cfg_corpus:-?}' is not there: pass --corpus PATH (tinyshakespeare.txt)" >&2
    exit 2
  fi
fi
learners=$(sed -n 's/^ *learners: *\([0-9][0-9]*\).*/\1/p' "$config" | head -n1)
learners=${learners:-4}
for kv in ${sets[@]+"${sets[@]}"}; do
  [[ $kv == sync.learners=* ]] && learners=${kv#sync.learners=}
done

if [[ -z $out ]]; then out=$(mktemp -d /tmp/chaos-XXXXXX); fi
mkdir -p "$out"
if compgen -G "$out/*/meta.json" > /dev/null; then
  echo "chaos.sh: '$out' already holds runs: pick a new --out (or --table $out to print them)" >&2
  exit 2
fi
timed_by="the wall time (wall_s) of the fault-free run of the same mode and seed"
[[ -z $horizon ]] || timed_by="the given horizon, $horizon s"
{
  echo "- config $config, $learners learners, $steps steps per learner (train.lr_decay_steps too), eval $eval_batches batches"
  echo "- seeds: $seeds; modes: $modes; faults: $faults"
  echo "- learners: each learner killed once, restarted after ${kill_restart_s} s; one ${slow_factor}x slow for ${slow_s} s; one partitioned for ${partition_s} s; times in [5%, 60%] of $timed_by"
  echo "- syncer: killed at 40% of that time, restarted after ${syncer_restart_s} s; ddp has no syncer, so its syncer row is skipped"
  echo "- every run on the wall clock (sync.clock=wall)"
  echo "- every run checkpoints every 50 steps (train.checkpoint_every=50: ddp resumes from it, learners take their moments back)"
  [[ ${#sets[@]} -eq 0 ]] || echo "- extra: ${sets[*]}"
  echo "- dilococtl: $bin ($(date -r "$bin" '+%F %T' 2>/dev/null || echo '?')), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- daemon apps 2>/dev/null || echo ' + local changes')"
} > "$out/settings.txt"
sed 's/^/chaos.sh: /' "$out/settings.txt" >&2
# Every run uses this copy, so a rebuild during the bench does not mix two builds in one table.
cp "$bin" "$out/dilococtl"
bin="$out/dilococtl"
echo "chaos.sh: results in $out" >&2

index=0
# record DIR MODE FAULTS SEED STATUS RC TIMEOUT EXPECTED NOTE: DIR/meta.json for the table.
record() {
  jq -n --argjson index "$index" --arg mode "$2" --arg faults "$3" --argjson seed "$4" \
    --arg status "$5" --argjson rc "$6" --argjson timeout_s "$7" --argjson expected "$8" --arg note "$9" \
    '{index: $index, mode: $mode, faults: $faults, seed: $seed, status: $status, rc: $rc,
      timeout_s: $timeout_s, expected_actions: $expected, note: $note}' > "$1/meta.json"
  index=$((index + 1))
}
summary_of() { # the summary line of a run directory's metrics.jsonl, or nothing
  [[ -f $1/run/metrics.jsonl ]] || return 0
  jq -c 'select(.event == "summary")' "$1/run/metrics.jsonl" 2>/dev/null | tail -n1
}

# run MODE FAULTS SEED HORIZON REF_WALL: one training run in $out/MODE-FAULTS-sSEED.
run() {
  local mode=$1 flt=$2 seed=$3 hz=$4 ref_wall=$5
  local dir="$out/$mode-$flt-s$seed"
  rm -rf "$dir"
  mkdir -p "$dir"
  local args=(--set "sync.mode=$mode" --set "train.seed=$seed" --set "train.steps=$steps"
              --set "train.lr_decay_steps=$steps" --set "eval.batches=$eval_batches")
  args+=(--set train.checkpoint_every=50)
  # Faults strike at wall-clock times and the table measures real goodput: the wall clock, even
  # where the config runs on virtual time (configs/shakespeare-m4.yaml).
  args+=(--set sync.clock=wall)
  local expected=0 injected=0
  if [[ $flt != none ]]; then
    local sched
    sched=$(python3 "$helper" schedule --faults "$flt" --seed "$seed" --horizon "$hz" --learners "$learners" \
      --kill-restart-s "$kill_restart_s" --slow-factor "$slow_factor" --slow-s "$slow_s" \
      --partition-s "$partition_s" --syncer-restart-s "$syncer_restart_s")
    jq -r '.lines[]' <<< "$sched" > "$dir/schedule.txt"
    expected=$(jq -r .expected_actions <<< "$sched")
    injected=$(jq -r .injected_s <<< "$sched")
    args+=(--set "chaos.seed=$seed" --set "chaos.events=$(jq -r .events <<< "$sched")")
  fi
  local limit
  if [[ -n $timeout_s ]]; then
    limit=$timeout_s
  elif [[ -n $ref_wall ]]; then
    limit=$(python3 -c "import sys; print(int(3 * float(sys.argv[1]) + float(sys.argv[2]) + 120))" "$ref_wall" "$injected")
  else
    limit=$((steps * 2 > 600 ? steps * 2 : 600))
  fi
  local cmd=("$bin" train "$config" ${args[@]+"${args[@]}"} ${sets[@]+"${sets[@]}"} --out "$dir/run" --json)
  printf '%q ' "${cmd[@]}" > "$dir/command.txt"
  echo >> "$dir/command.txt"
  echo "chaos.sh: $mode, faults $flt, seed $seed (timeout ${limit} s)" >&2
  [[ $flt == none ]] || sed 's/^/chaos.sh:   /' "$dir/schedule.txt" >&2
  local rc=0 status note=""
  # --foreground: an interrupt of the script reaches the run too.
  timeout --foreground --kill-after=30 "$limit" nice -n "$niceness" "${cmd[@]}" \
    > "$dir/stdout.log" 2> "$dir/stderr.log" || rc=$?
  local summary
  summary=$(summary_of "$dir")
  if [[ $rc -eq 0 && -n $summary ]]; then
    status=ok
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status=timeout
    note="timed out after ${limit} s; see $dir/stderr.log"
  else
    status=failed
    note="exit $rc: $(grep -v '^chaos: ' "$dir/stderr.log" | tail -n2 | tr '\n' ' ' | cut -c1-200)"
    [[ $rc -ne 0 ]] || note="exit 0 but no summary in metrics.jsonl"
  fi
  record "$dir" "$mode" "$flt" "$seed" "$status" "$rc" "$limit" "$expected" "$note"
  if [[ $status == ok ]]; then
    jq -r --arg h "chaos.sh:   ok:" '"\($h) val loss \(.final_val_loss | . * 10000 | round / 10000), goodput \(if .goodput then (.goodput * 1000 | round / 1000) else "-" end), wall \(.wall_s | . * 10 | round / 10) s"' <<< "$summary" >&2
  else
    echo "chaos.sh:   $status: $note" >&2
  fi
}

declare -A none_wall=()  # mode -> wall_s of its latest fault-free run (for the timeouts)
for seed in $seeds; do
  for mode in $modes; do
    hz=$horizon ref=""
    for flt in $faults; do
      if [[ $flt == syncer && $mode == ddp ]]; then
        dir="$out/$mode-$flt-s$seed"
        mkdir -p "$dir"
        echo "chaos.sh: $mode, faults $flt, seed $seed: skipped (ddp has no syncer: nothing to kill)" >&2
        record "$dir" "$mode" "$flt" "$seed" skipped 0 0 0 "ddp has no syncer: nothing to kill"
        continue
      fi
      if [[ $flt == none ]]; then
        run "$mode" none "$seed" "" "${none_wall[$mode]:-}"
        s=$(summary_of "$out/$mode-none-s$seed")
        if [[ -n $s ]]; then
          ref=$(jq -r .wall_s <<< "$s")
          none_wall[$mode]=$ref
          [[ -n $horizon ]] || hz=$ref
        fi
        continue
      fi
      if [[ -z $hz ]]; then
        dir="$out/$mode-$flt-s$seed"
        mkdir -p "$dir"
        echo "chaos.sh: $mode, faults $flt, seed $seed: skipped (the fault-free run failed, so nothing times the faults; pass --horizon S)" >&2
        record "$dir" "$mode" "$flt" "$seed" skipped 0 0 0 "the fault-free run failed, so nothing timed the faults (--horizon S)"
        continue
      fi
      run "$mode" "$flt" "$seed" "$hz" "${ref:-${none_wall[$mode]:-}}"
    done
  done
done
# The first seed's runs overlaid in one page (dilococtl report), beside the table.
read -r first_seed _ <<< "$seeds"
report_args=()
for dir in "$out"/*-s"$first_seed"; do
  [[ -d $dir/run ]] && report_args+=("$dir/run" --label "$(basename "$dir" "-s$first_seed")")
done
if [[ ${#report_args[@]} -gt 0 ]]; then
  if "$bin" report "${report_args[@]}" -o "$out/report.html" > /dev/null 2> "$out/report.log"; then
    echo "chaos.sh: report of seed $first_seed's runs: $out/report.html" >&2
  else
    echo "chaos.sh: no report: $(tail -n1 "$out/report.log")" >&2
  fi
fi
echo "chaos.sh: done; table in $out/chaos.md, runs in $out/chaos.jsonl (print again: scripts/bench/chaos.sh --table $out)" >&2
python3 "$helper" table "$out" ${table_args[@]+"${table_args[@]}"}
