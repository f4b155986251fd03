#!/usr/bin/env bash
# The syncer as two shards on a real cluster (scripts/netns-cluster.sh, CURVE over veth links):
# syncer-0 on site0, syncer-1 on site1, learners on site2..4. While the job trains, site1's daemon
# is killed with -9 and started again 20 s later. The job must complete with both shards'
# merges in its summary; syncer-0's fragments keep merging while syncer-1 is down; syncer-1 comes
# back from its own update log and issues no version twice; the home (site0) evaluates the joined
# model, taking syncer-1's final fragments from it.
#
#   tests/cluster/netns_shards_test.sh          # ctest -L cluster; exit 77 (skipped) without root/netns
#
# Environment: DILOCO_BIN (the binaries; ctest sets it), NETNS_SHARDS_STEPS (train.steps per
# learner; default 40000), NETNS_CHAOS_KEEP=1 keeps the cluster's directory after a pass too.
set -euo pipefail

test_name=netns_shards
ns_tag=dlcs
daemon_dirs=(site0 site1 site2 site3 site4)
# shellcheck source=tests/cluster/netns_testing.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_testing.sh"
steps=${NETNS_SHARDS_STEPS:-40000}
outage_s=20

log "5 sites in namespaces ${DLC_NETNS_PREFIX}site0..4, $dir"
"$cluster" up 5 --rate 200mbit

cat > "$dir/job.yaml" << EOF2
# The e2e daemon tests' tiny model, the syncer as two shards (placement set at submit).
model: {n_layer: 2, n_embd: 32, n_head: 4, block_size: 32}
data: {corpus: $corpus}
train: {batch_size: 4, steps: $steps, lr: 1.0e-3, warmup_steps: 5, seed: 1337, log_every: 500}
eval: {batches: 2}
sync: {mode: decoupled, learners: 3, fragments: 4, syncers: 2, inner_steps: 50, quorum: 1, checkpoint_every: 1000}
EOF2
job=$("$cluster" submit "$dir/job.yaml" --set 'placement.syncer=[site0, site1]' \
  --set 'placement.learners=[site2, site3, site4]' --set sync.learners=3)
log "submitted job $job ($steps steps per learner)"

shard_events() { echo "$dir/site$1/state/jobs/$job/run/events.log"; }
merges_of() { [[ -f $(shard_events "$1") ]] && jq -s '[.[] | select(.event == "merge")] | length' "$(shard_events "$1")" || echo 0; }

# Both shards merge before anything breaks.
warm=$((steps / 10))
wait_for "the learners past step $warm" 90 "[.learners[] | (.progress.step // 0) >= $warm] | all"
check "both shards merged before the kill (syncer-0 $(merges_of 0), syncer-1 $(merges_of 1))" \
  "$([[ $(merges_of 0) -gt 0 && $(merges_of 1) -gt 0 ]] && echo true || echo false)"

"$cluster" kill 1 --restart-after $outage_s
deadline=$(($(date +%s) + outage_s + 30))
until grep -q "start site1" "$dir/events.log"; do
  [[ $(date +%s) -lt $deadline ]] || { log "FAILED: site1 did not start again"; exit 1; }
  sleep 0.5
done
kill_ms=$(awk '/kill site1/ {print $1; exit}' "$dir/events.log")
start_ms=$(awk '/start site1/ {print $1; exit}' "$dir/events.log")
log "site1 down from $kill_ms to $start_ms ($(((start_ms - kill_ms) / 1000)) s)"
last_status='{}'
wait_for "status with the learners after the outage" 30 '[.learners[] | has("progress")] | all' || true
check "the learners were still training when syncer-1 came back (steps < $steps)" \
  "$(jq '[.learners[] | (.progress.step // 0) < '"$steps"'] | all' <<< "$last_status")"

wait_job_end 240 3 "$steps"
check "the summary counts two shards and each one's merges ($(jq -c '.summary.shard_merges' <<< "$final"))" \
  "$(jq '.summary.syncers == 2 and (.summary.shard_merges | length) == 2 and (.summary.shard_merges | all(. > 0))' <<< "$final")"
check "the summary's goodput joins both shards' ($(jq '.summary.goodput' <<< "$final"))" \
  "$(jq '(.summary.goodput | type) == "number" and .summary.goodput > 0' <<< "$final")"
check "the joined model learned (val loss $(jq '.summary.initial_val_loss' <<< "$final") -> $(jq '.summary.final_val_loss' <<< "$final"))" \
  "$(jq '.summary.final_val_loss < .summary.initial_val_loss' <<< "$final")"

# RESILIENCE: syncer-0 merged throughout syncer-1's outage: its longest silence inside the
# outage (the outage's edges count) against its longest silence before the kill.
gaps=$(jq -s --argjson a "$kill_ms" --argjson b "$start_ms" '
  [.[] | select(.event == "merge") | .time_ms] | sort as $t
  | ([$a] + [$t[] | select(. > $a and . < $b)] + [$b]) as $in
  | {during: ([range(1; $in | length) as $i | $in[$i] - $in[$i - 1]] | max),
     before: ([$t[] | select(. < $a)] as $pre | [range(1; $pre | length) as $i | $pre[$i] - $pre[$i - 1]] | max // 0),
     merges: (($in | length) - 2)}' "$(shard_events 0)")
log "syncer-0 during the outage: $(jq -c . <<< "$gaps") (ms)"
check "RESILIENCE: syncer-0 kept merging while syncer-1 was down ($(jq .merges <<< "$gaps") merges, longest silence $(jq .during <<< "$gaps") ms)" \
  "$(jq '.merges > 0 and .during <= 2000' <<< "$gaps")"
# RESILIENCE: syncer-1 resumed from its own update log: no (fragment, version) twice, and merges
# after it came back.
dup=$(jq -s '[.[] | select(.event == "merge") | "\(.fragment)/\(.version)"] | (length - (unique | length))' "$(shard_events 1)")
after=$(jq -s --argjson b "$start_ms" '[.[] | select(.event == "merge" and .time_ms > $b)] | length' "$(shard_events 1)")
check "RESILIENCE: syncer-1 issued no version twice across its restart ($dup repeated)" "$([[ $dup == 0 ]] && echo true || echo false)"
check "RESILIENCE: syncer-1 merged again after its restart ($after merges)" "$([[ $after -gt 0 ]] && echo true || echo false)"
check "site1's job.log says it resumed syncer-1" \
  "$(grep -q 'resumed roles: syncer-1' "$dir/site1/state/jobs/$job/job.log" 2> /dev/null && echo true || echo false)"

if [[ $failures -eq 0 ]]; then
  log "PASS: job $job completed with two syncer shards through a ${outage_s} s kill -9 of syncer-1's site"
else
  log "$failures check(s) failed"
fi
