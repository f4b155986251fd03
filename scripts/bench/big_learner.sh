#!/usr/bin/env bash
# What sharding (train.shard) and activation recompute (train.recompute) cost the CPU engine: one
# learner of 2 thread ranks training the same batches every way, tokens/s and peak RSS side by
# side. The ways alternate within each round so a busy machine slows them alike; medians of ROUNDS.
#   scripts/bench/big_learner.sh                       # the shakespeare model, then a wider one
#   ROUNDS=5 STEPS=60 scripts/bench/big_learner.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/bin/dilococtl
[[ -x $bin ]] || { echo "big_learner.sh: $bin not found: run scripts/setup.sh first" >&2; exit 2; }
rounds=${ROUNDS:-3}
steps=${STEPS:-40}
corpus=${CORPUS:-../shared/data/tinyshakespeare.txt}
[[ -f $corpus ]] || corpus=/usr/share/games/fortunes
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ways=("none false" "optimizer false" "gradients false" "none true" "gradients true")
models=("4 128 4 64 12" "6 384 6 256 4")  # n_layer n_embd n_head block_size batch
$bin bench gemm --threads 2 --json > "$out/gemm.json"
for m in "${models[@]}"; do
  read -r L C H T B <<< "$m"
  for ((r = 0; r < rounds; r++)); do
    for w in "${ways[@]}"; do
      read -r shard recompute <<< "$w"
      echo "big_learner.sh: L$L C$C T$T B$B shard $shard recompute $recompute, round $((r + 1))/$rounds" >&2
      $bin train configs/shakespeare-char.yaml --json --out "$out/run" \
        --set data.corpus="$corpus" --set train.steps="$steps" --set eval.batches=1 --set train.warmup_steps=5 \
        --set train.threads=2 --set train.ranks=2 --set train.shard="$shard" --set train.recompute="$recompute" \
        --set model.n_layer="$L" --set model.n_embd="$C" --set model.n_head="$H" --set model.block_size="$T" \
        --set train.batch_size="$B" 2> /dev/null | tail -1 |
        jq -c --arg model "L$L C$C T$T B$B x2 ranks" --arg shard "$shard" --arg recompute "$recompute" \
          '{model: $model, shard: $shard, recompute: $recompute, tps: .tokens_per_s, rss: .peak_rss_mb, loss: .final_val_loss}' \
          >> "$out/runs.jsonl"
      rm -rf "$out/run"
    done
  done
done

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
gemm = json.load(open(f"{out}/gemm.json"))
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
print(f"machine: sgemm {gemm.get('gflops', gemm.get('gflop_s', '?'))} GFLOP/s at 2 threads (dilococtl bench gemm)\n")
print("| model | train.shard | recompute | tokens/s (median) | vs none | peak RSS MiB | final val loss |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
for model in dict.fromkeys(r["model"] for r in runs):
    rows = [r for r in runs if r["model"] == model]
    def med(shard, rec):
        return statistics.median(r["tps"] for r in rows if r["shard"] == shard and r["recompute"] == rec)
    base = med("none", "false")
    for shard, rec in dict.fromkeys((r["shard"], r["recompute"]) for r in rows):
        pick = [r for r in rows if r["shard"] == shard and r["recompute"] == rec]
        tps = med(shard, rec)
        print(f"| {model} | {shard} | {rec} | {tps:,.0f} | {tps / base:.3f} | {max(r['rss'] for r in pick):.0f} "
              f"| {pick[0]['loss']:.4f} |")
PY
