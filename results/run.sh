#!/usr/bin/env bash
# run.sh OUTFILE NAME SEED [--set K=V | --recipe R]... : one training run of configs/shakespeare-m4.yaml,
# its summary appended to OUTFILE in parity.sh's results.jsonl format. Times kept via /usr/bin/time -v.
set -uo pipefail
cd /work/wt-tables
outf=$1 name=$2 seed=$3; shift 3
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --recipe) while IFS= read -r l; do [[ -z $l || $l == \#* ]] || args+=(--set "$l"); done < "configs/baselines/$2.sets"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
tag=$(echo "$name-s$seed" | tr ' =/,+' '_-___')
dir=results/runs/$tag; log=results/logs/$tag
mkdir -p results/logs results/runs; rm -rf "$dir"
cmd=(build-dev/bin/dilococtl train configs/shakespeare-m4.yaml --set "train.seed=$seed" "${args[@]}" --out "$dir" --json)
printf '%q ' "${cmd[@]}" > "$log.cmd"; echo >> "$log.cmd"
start=$(date +%s.%N)
/usr/bin/time -v -o "$log.time" "${cmd[@]}" > "$log.out" 2> "$log.err"; rc=$?
end=$(date +%s.%N)
last=$(tail -n1 "$log.out")
if [[ $rc -eq 0 ]] && jq -e . >/dev/null 2>&1 <<< "$last"; then
  jq -c --arg row "$name" --argjson seed "$seed" --arg cmd "$(cat "$log.cmd")" '{row: $row, seed: $seed, ok: true, cmd: $cmd, summary: .}' <<< "$last" >> "$outf"
else
  jq -nc --arg row "$name" --argjson seed "$seed" '{row: $row, seed: $seed, ok: false}' >> "$outf"
fi
echo "$(date -u +%T) done $name s$seed rc=$rc real=$(python3 -c "print(round($end-$start,1))")s $(grep -E 'User time|System time' "$log.time" | awk -F': ' '{printf "%s ", $2}')" >&2
[[ -n ${KEEP:-} ]] || rm -rf "$dir"
