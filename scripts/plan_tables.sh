#!/usr/bin/env bash
# Two markdown tables from `dilococtl plan` (daemon/train/memory_plan.h), on cuda with the sync
# settings of configs/gpt-12b.yaml (8 learners, 8 fragments, int4):
#   1. bytes per parameter per rank (activations excluded) for train.shard none / optimizer /
#      gradients at N = 1, 8, 16, 64 ranks, for the 12.6B shape;
#   2. the largest GPT of a ladder of GPT-3-like shapes that fits one H200 (141 GiB) per rank,
#      for a learner of 1, 8, 16, 64 H200s, T = 2048 and 4096, recompute off and on, batch 1 per
#      rank (train.shard gradients when N > 1).
#   OUTER_STATE=host puts every plan's outer-sync state in pinned host memory (train.outer_state).
# Usage: [OUTER_STATE=host] scripts/plan_tables.sh [path/to/dilococtl]   (needs jq)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ctl="${1:-$here/build/bin/dilococtl}"
config="$here/configs/gpt-12b.yaml"
command -v jq >/dev/null || { echo "plan_tables.sh: needs jq (apt-get install jq)" >&2; exit 2; }
[ -x "$ctl" ] || { echo "plan_tables.sh: no dilococtl at $ctl: build it or pass its path" >&2; exit 2; }

# ring N -> --set train.hosts/ranks (8 GPUs per host)
ring() {
  local n=$1
  if [ "$n" -le 8 ]; then echo "--set train.hosts=1 --set train.ranks=$n"; else
    echo "--set train.hosts=$((n / 8)) --set train.ranks=8"; fi
}

outer_state="${OUTER_STATE:-device}"
plan() {  # args: --set ... ; prints the JSON (exit 1 = does not fit is fine here)
  "$ctl" plan "$config" --json --device-memory 141 --set train.outer_state="$outer_state" "$@" 2>/dev/null ||
    [ $? -eq 1 ]
}

echo "Bytes per parameter per rank, cuda, 12.9B shape (configs/gpt-12b.yaml), activations excluded, outer state on $outer_state"
echo
echo "| ranks N | none | optimizer | gradients | none, no outer sync | optimizer, no outer sync | gradients, no outer sync |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in 1 8 16 64; do
  row="| $n |"
  for learners in 8 1; do
    for shard in none optimizer gradients; do
      if [ "$n" -eq 1 ] && [ "$shard" != none ]; then row="$row — |"; continue; fi
      # shellcheck disable=SC2046
      v=$(plan $(ring "$n") --set train.shard=$shard --set train.batch_size=1 --set sync.learners=$learners |
        jq -r '.bytes_per_param_without_activations')
      row="$row $(printf '%.2f' "$v") |"
    done
  done
  echo "$row"
done

# name n_layer n_embd n_head (head size 128 except 2.7B's 80)
shapes=(
  "1.3B 24 2048 16"
  "2.7B 32 2560 32"
  "4.2B 36 3072 24"
  "6.7B 32 4096 32"
  "9.3B 40 4352 34"
  "12.9B 40 5120 40"
  "20B 44 6144 48"
  "30B 48 7168 56"
  "40B 56 7680 60"
  "52B 64 8192 64"
  "65B 80 8192 64"
  "175B 96 12288 96"
)
echo
echo "Largest GPT that fits per H200 (141 GiB), batch 1 per rank, shard gradients when N > 1, outer sync on (GiB per rank), outer state on $outer_state"
echo
echo "| H200s in the learner | T=2048 | T=2048 + recompute | T=4096 | T=4096 + recompute |"
echo "| ---: | --- | --- | --- | --- |"
for n in 1 8 16 64; do
  shard=gradients
  [ "$n" -eq 1 ] && shard=none
  row="| $n |"
  for t in 2048 4096; do
    for rc in false true; do
      best="none"
      for s in "${shapes[@]}"; do
        read -r name l c h <<<"$s"
        # shellcheck disable=SC2046
        j=$(plan $(ring "$n") --set train.shard=$shard --set train.recompute=$rc --set train.batch_size=1 \
          --set model.n_layer="$l" --set model.n_embd="$c" --set model.n_head="$h" --set model.block_size="$t")
        if [ "$(jq -r .fits <<<"$j")" = true ]; then
          best="$name ($(jq -r '.total_bytes / 1073741824 | . * 10 | round / 10' <<<"$j"))"
        fi
      done
      row="$row $best |"
    done
  done
  echo "$row"
done
