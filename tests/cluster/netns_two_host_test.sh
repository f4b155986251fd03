#!/usr/bin/env bash
# A learner as large as a site, on a real cluster (scripts/netns-cluster.sh up 3 --hosts 2): the
# syncer on site0; site1 and site2 are two hosts each (five dilocod in five network namespaces),
# and the job's train.hosts: 2 makes each learner's ring span its site's two hosts (Gloo over the
# hosts' addresses, bootstrapped through host 0's daemon over CURVE). train.hosts is per job, so
# both learner sites have two hosts. While the job trains, site1's host 1 is killed with -9: the
# Gloo ring fails on host 0 at once, so learner-0's incarnation ends (its status shows a restart
# and the error); host 1 is started again 3 s later, a new incarnation (a new ring name) forms
# and rejoins from the syncer's snapshot, and the job completes.
#
#   tests/cluster/netns_two_host_test.sh       # ctest -L cluster; exit 77 (skipped) without root/netns
#
# Environment: DILOCO_BIN (the binaries; ctest sets it), NETNS_TWO_HOST_STEPS (train.steps per
# learner; default 4000), NETNS_CHAOS_KEEP=1 keeps the cluster's directory after a pass too.
set -euo pipefail

test_name=netns_two_host
ns_tag=dlch
daemon_dirs=(site0 site1 site1h1 site2 site2h1)
# shellcheck source=tests/cluster/netns_testing.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_testing.sh"
steps=${NETNS_TWO_HOST_STEPS:-4000}

log "3 sites, learner sites of 2 hosts each, in namespaces ${DLC_NETNS_PREFIX}site*, $dir"
export DLC_RING_TIMEOUT_MS=8000
"$cluster" up 3 --rate 200mbit --hosts 2
pin=$(grep -m1 -o "NCCL_SOCKET_IFNAME=[^ ]* (the interface of ring_address [^)]*)" "$dir/site1h1/dilocod.log" || true)
check "site1's host 1 pinned NCCL to its ring interface (${pin:-no such line in its log})" \
  "$([[ $pin == NCCL_SOCKET_IFNAME==* ]] && echo true || echo false)"

cat > "$dir/job.yaml" << EOF
# The e2e daemon tests' tiny model; placement and train.hosts come from netns-cluster.sh submit.
model: {n_layer: 2, n_embd: 32, n_head: 4, block_size: 32}
data: {corpus: $corpus}
train: {batch_size: 4, steps: $steps, lr: 1.0e-3, warmup_steps: 5, seed: 1337, log_every: 500}
eval: {batches: 2}
sync: {mode: decoupled, learners: 2, fragments: 4, inner_steps: 50, quorum: 1, checkpoint_every: 1}
EOF
job=$("$cluster" submit "$dir/job.yaml")
log "submitted job $job ($steps steps per learner, train.hosts 2)"

warm=$((steps / 10))
wait_for "both learners past step $warm and a merge" 90 \
  "[.learners[] | (.progress.step // 0) >= $warm] == [true, true] and ((.syncer.progress.versions // [0]) | add) > 0"
inc0=$(jq -r '.learners[0].progress.ring.incarnation // ""' <<< "$last_status")
log "training: steps $(jq -c '[.learners[].progress.step]' <<< "$last_status"), learner-0's ring $inc0"
check "learner-0's ring spans 2 hosts ($(jq -c '.learners[0].progress.ring // null' <<< "$last_status"))" \
  "$(jq '.learners[0].progress.ring.hosts == 2 and .learners[0].progress.ranks == 2' <<< "$last_status")"
member=$("$DILOCO_BIN/dilococtl" status "$job" --json --socket "$dir/site1h1/state/control.sock" 2> /dev/null || echo '{}')
check "site1's host 1 follows the same ring ($(jq -c '.sites.site1.roles["learner-0"].progress // null' <<< "$member"))" \
  "$(jq --arg inc "$inc0" '.sites.site1.roles["learner-0"].progress | .role == "ring-member" and .incarnation == $inc' <<< "$member")"

"$cluster" kill 1.1 --restart-after 3
wait_for "learner-0's incarnation $inc0 to end (its ring failed)" 30 \
  "(.learners[0].progress.ring.restarts // 0) >= 1" || true
check "RESILIENCE: killing site1's host 1 ended learner-0's incarnation (restarts $(jq '.learners[0].progress.ring.restarts // null' <<< "$last_status"): $(jq -r '.learners[0].progress.ring.last_error // "" | .[0:160]' <<< "$last_status"))" \
  "$(jq '(.learners[0].progress.ring.restarts // 0) >= 1' <<< "$last_status")"
wait_for "a new incarnation of learner-0 training again" 60 \
  "(.learners[0].progress.ring.incarnation // \"$inc0\") != \"$inc0\" and .learners[0].progress.state == \"training\" and (.learners[0].progress.snapshots_installed // 0) >= 1" || true
inc1=$(jq -r '.learners[0].progress.ring.incarnation // ""' <<< "$last_status")
check "RESILIENCE: learner-0 came back as a new incarnation ($inc1) that rejoined from the syncer's snapshot" \
  "$(jq --arg a "$inc0" '.learners[0].progress.ring.incarnation != $a and (.learners[0].progress.snapshots_installed // 0) >= 1 and .learners[0].progress.state == "training"' <<< "$last_status")"
check "the syncer still sees two learners" "$(jq '(.syncer.progress.learners | length) == 2' <<< "$last_status")"
check "site1's job.log says the incarnation ended" \
  "$(grep -q "ring incarnation $inc0 ended" "$dir/site1/state/jobs/$job/job.log" 2> /dev/null && echo true || echo false)"

# A slow CI machine (AVX2, other tests beside it) took 175 s for 6000 steps with the kill.
wait_job_end 300 2 "$steps"
for m in site1h1 site2h1; do
  st=$(timeout 20 bash -c "until '$DILOCO_BIN/dilococtl' list --json --socket '$dir/$m/state/control.sock' 2>/dev/null | jq -e '[.[] | select(.id == \"$job\")][0].state | . == \"completed\"' >/dev/null; do sleep 0.5; done; '$DILOCO_BIN/dilococtl' list --json --socket '$dir/$m/state/control.sock'" 2> /dev/null || echo '[]')
  check "$m's ring member ended with its learner ($(jq -c "[.[] | select(.id == \"$job\")][0] | {state, roles}" <<< "$st" 2> /dev/null | head -c 240))" \
    "$(jq "[.[] | select(.id == \"$job\")][0].state == \"completed\"" <<< "$st")"
done

if [[ $failures -eq 0 ]]; then
  log "PASS: job $job completed through kill -9 + restart of a host of a two-host learner site"
else
  log "$failures check(s) failed"
fi
