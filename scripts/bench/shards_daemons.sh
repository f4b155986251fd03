#!/usr/bin/env bash
# One syncer against two shards on real daemons: scripts/netns-cluster.sh with 5 sites (CURVE over
# shaped veth links), learners on site2..4, the syncer on site0 (S = 1) or on site0 and site1
# (S = 2), alternating ROUNDS times; one JSON line per job (final val loss, merges, each shard's,
# goodput, wall s). Needs root, iproute2, jq and Debian's fortunes (scripts/setup.sh).
#   sudo scripts/bench/shards_daemons.sh                     # 3 rounds of 30,000 steps per learner
#   ROUNDS=5 STEPS=60000 sudo scripts/bench/shards_daemons.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export DILOCO_BIN=${DILOCO_BIN:-$PWD/build/bin} DLC_NETNS_PREFIX=shb$$- DLC_DATA_ROOTS=/usr/share/games
rounds=${ROUNDS:-3}
steps=${STEPS:-30000}
cluster=scripts/netns-cluster.sh
dir=$(mktemp -d /tmp/shards_daemons.XXXXXX)
"$cluster" --dir "$dir" up 5 --rate 200mbit > /dev/null
trap '"$cluster" --dir "$dir" down > /dev/null 2>&1 || true; rm -rf "$dir"' EXIT
cat > "$dir/job.yaml" << EOF2
model: {n_layer: 2, n_embd: 32, n_head: 4, block_size: 32}
data: {corpus: /usr/share/games/fortunes}
train: {batch_size: 4, steps: $steps, lr: 1.0e-3, warmup_steps: 5, seed: 1337, log_every: 500}
eval: {batches: 50}
sync: {mode: decoupled, learners: 3, fragments: 4, inner_steps: 50, quorum: 1, checkpoint_every: 1000}
EOF2
for ((round = 1; round <= rounds; round++)); do
  for s in 1 2; do
    if [[ $s == 1 ]]; then place='placement.syncer=site0'; else place='placement.syncer=[site0, site1]'; fi
    job=$("$cluster" --dir "$dir" submit "$dir/job.yaml" --set "$place" --set 'placement.learners=[site2, site3, site4]' \
      --set sync.learners=3 --set "sync.syncers=$s" 2> /dev/null)
    "$cluster" --dir "$dir" wait "$job" --timeout 600 > /dev/null
    "$DILOCO_BIN/dilococtl" status "$job" --json --socket "$dir/site0/state/control.sock" |
      jq -c "{syncers: $s, final_val_loss: .summary.final_val_loss, merges: .summary.outer_steps,
              shard_merges: .summary.shard_merges, goodput: .summary.goodput, wall_s: .summary.wall_s}"
  done
done
