# What the network-namespace cluster tests share (sourced, not run): the skips, the cluster's
# directory and namespace prefix, the teardown that shows each daemon's log on failure, and the
# status helpers. The sourcing script sets, before it sources this file:
#   test_name     its name, for messages and temp dirs (netns_chaos, ...)
#   ns_tag        4 letters: its namespaces are <ns_tag><pid>-*, so a stale cluster of an earlier
#                 run of the same test (killed before its trap ran) can be told and removed
#   daemon_dirs   the daemons' directories under the cluster's (site0 site1 ...) whose logs a
#                 failure shows
# and may read afterwards: root, cluster, dir, job, failures, last_status, final, corpus, and the
# functions log, check, status_json, wait_for, wait_job_end. NETNS_CHAOS_KEEP=1 keeps the cluster's directory
# after a pass too.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=$root/scripts/netns-cluster.sh
export DILOCO_BIN=${DILOCO_BIN:-$root/build/bin}
t_start=$(date +%s)

log() { echo "[$(date +%T)] $test_name: $*"; }

# Skips (77) name what is missing.
rc=0
why=$("$cluster" check 2>&1) || rc=$?
if [[ $rc -ne 0 ]]; then
  if [[ $rc -eq 77 ]]; then
    echo "SKIP: $why"
    exit 77
  fi
  echo "$why" >&2
  exit 1
fi
if ! command -v jq > /dev/null 2>&1; then
  echo "SKIP: $test_name reads dilococtl's JSON with jq, which is not installed (apt-get install jq)"
  exit 77
fi
for b in dilocod dilococtl; do
  [[ -x "$DILOCO_BIN/$b" ]] || { echo "$test_name: no $DILOCO_BIN/$b: build the dilocod and dilococtl targets" >&2; exit 1; }
done
corpus=/usr/share/games/fortunes  # what the e2e tests train on (scripts/setup.sh installs it)
[[ -d $corpus ]] || corpus=$root/../shared/data/tinyshakespeare.txt
[[ -e $corpus ]] || { echo "$test_name: no corpus: install Debian's fortunes (scripts/setup.sh)" >&2; exit 1; }
export DLC_DATA_ROOTS=$(dirname "$corpus")  # the sites may read the corpus, and only that

# Clusters left behind by earlier runs that were killed before their trap ran (a ctest timeout):
# their prefix carries the pid of the test that made them.
for ns in $(ip netns list | awk '{print $1}' | grep -E "^${ns_tag}[0-9]+-hub\$" || true); do
  pid=${ns#"$ns_tag"}
  pid=${pid%-hub}
  if ! kill -0 "$pid" 2> /dev/null; then
    log "removing the cluster of an earlier run (prefix $ns_tag$pid-)"
    DLC_NETNS_PREFIX=$ns_tag$pid- "$cluster" --dir "/tmp/$test_name-stale-$pid" down > /dev/null 2>&1 || true
  fi
done

export DLC_NETNS_PREFIX=$ns_tag$$-
export DILOCOD_NETNS_DIR
DILOCOD_NETNS_DIR=$(mktemp -d "/tmp/$test_name.XXXXXX")
dir=$DILOCOD_NETNS_DIR
failures=0
job=""
last_status='{}'

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 || $failures -ne 0 ]]; then
    echo "---- the end of each daemon's log ($dir) ----"
    for s in "${daemon_dirs[@]}"; do
      echo "== $s/dilocod.log"
      tail -n 25 "$dir/$s/dilocod.log" 2> /dev/null || true
    done
    echo "== events.log"
    cat "$dir/events.log" 2> /dev/null || true
    if [[ -n $job ]]; then
      echo "== dilococtl logs $job"
      "$DILOCO_BIN/dilococtl" logs "$job" --tail 15 --socket "$dir/site0/state/control.sock" 2>&1 || true
    fi
  fi
  "$cluster" down > /dev/null 2>&1 || "$cluster" down || true
  if [[ $rc -eq 0 && $failures -eq 0 && -z ${NETNS_CHAOS_KEEP:-} ]]; then
    rm -rf "$dir"
  else
    echo "$test_name: kept $dir (configs, state, logs)"
  fi
  log "took $(($(date +%s) - t_start)) s"
  [[ $rc -ne 0 ]] && exit $rc
  [[ $failures -eq 0 ]] || exit 1
  exit 0
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# CHECK name condition-result: records a failure and goes on, so one run reports every broken
# property. RESILIENCE marks properties of the daemons' fault handling (the thing under test).
check() {
  local what=$1 ok=$2
  if [[ $ok == true ]]; then
    log "ok: $what"
  else
    log "FAILED: $what"
    failures=$((failures + 1))
  fi
}

# The job's status through site0 as JSON ("" while site0 does not answer).
status_json() { "$DILOCO_BIN/dilococtl" status "$1" --json --socket "$dir/site0/state/control.sock" 2> /dev/null || true; }

# wait_for DESCRIPTION TIMEOUT_S JQ_FILTER: polls the job's status until the filter is true.
wait_for() {
  local what=$1 timeout=$2 filter=$3 deadline s
  deadline=$(($(date +%s) + timeout))
  while :; do
    s=$(status_json "$job")
    if [[ -n $s ]] && jq -e "$filter" <<< "$s" > /dev/null 2>&1; then
      last_status=$s
      return 0
    fi
    if [[ $(date +%s) -ge $deadline ]]; then
      log "timed out after $timeout s waiting for $what; last status:"
      "$cluster" status "$job" 2>&1 || true
      return 1
    fi
    sleep 0.5
  done
}

# wait_job_end TIMEOUT_S LEARNERS STEPS: waits for the job to end (netns-cluster.sh wait), sets
# final to its last status (JSON, '{}' without one), and checks that it completed with a summary
# and that learners 0 .. LEARNERS-1 each reached STEPS.
wait_job_end() {
  local timeout=$1 learners=$2 steps=$3 wait_rc=0 i
  log "waiting for the job to end"
  "$cluster" wait "$job" --timeout "$timeout" > "$dir/wait.out" 2>&1 || wait_rc=$?
  cat "$dir/wait.out"
  final=$(status_json "$job")
  [[ -n $final ]] || final='{}'
  check "the job completed (netns-cluster.sh wait exit $wait_rc, state $(jq -r '.state // "?"' <<< "$final"))" \
    "$([[ $wait_rc -eq 0 ]] && jq '.state == "completed" and has("summary")' <<< "$final" || echo false)"
  for ((i = 0; i < learners; i++)); do
    check "learner-$i reached train.steps ($(jq -c ".learners[$i].result.steps // .learners[$i].progress.step // null" <<< "$final") of $steps)" \
      "$(jq ".learners[$i].state == \"completed\" and .learners[$i].result.steps == $steps" <<< "$final")"
  done
}

