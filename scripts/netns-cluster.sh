#!/usr/bin/env bash
# A real multi-site cluster on one machine: N dilocod daemons, each in its own network namespace,
# joined by a bridge in a hub namespace over veth links shaped with tc tbf, CURVE on every link.
# Faults are real ones: a link taken down, a daemon killed with -9, a link slowed. Needs root.
#
#   scripts/netns-cluster.sh check                         # exit 0 if namespaces work here, 77 if not
#   scripts/netns-cluster.sh up 3 [--rate 200mbit] [--hosts 2] [--dir DIR]
#   scripts/netns-cluster.sh submit configs/demo.yaml --set train.steps=300   # prints the job id
#   scripts/netns-cluster.sh status JOB [--json]
#   scripts/netns-cluster.sh partition 1 5 [--wait]      # site 1's link down for 5 s
#   scripts/netns-cluster.sh kill 2 [--restart-after 3]   # kill -9 site 2's daemon (and restart it)
#   scripts/netns-cluster.sh start 2                      # start a stopped site's daemon again
#   scripts/netns-cluster.sh slow 1 10mbit                # re-shape site 1's link
#   scripts/netns-cluster.sh wait JOB [--timeout 300]     # 0 completed, 1 failed, 3 stopped, 124 timed out
#   scripts/netns-cluster.sh down [--purge]               # stop daemons, delete namespaces (idempotent)
#
# Layout. Site i is namespace <prefix>site<i> (default dlc-site0, dlc-site1, ...), interface eth0 at
# 10.77.0.(10+i)/24, daemon site name "site<i>", listening on ports 7100-7103 of that address. The
# hub namespace <prefix>hub holds bridge br0 and the bridge side of each link, veth s<i>. tbf
# shapes egress on both ends of each link (eth0 in the site, s<i> in the hub), so each direction
# gets the rate. Everything lives under DIR (default /tmp/dilocod-netns):
#   cluster.env             N, prefix, rate, binaries (what the other commands read)
#   events.log              one line per fault: unix_ms, action, site
#   site<i>/dilocod.yaml    the daemon config (peers: the other sites' addresses and public keys)
#   site<i>/keys/           its CURVE key pair (`dilococtl keygen`), kept across up/down
#   site<i>/state/          its state_dir (jobs, control.sock); kept across up/down: a daemon
#                           started again resumes its running jobs
#   site<i>/dilocod.log     the daemon's stderr (appended across restarts), dilocod.pid
#   site<i>/chaos.log       output of delayed actions (link back up, restart)
# Submit puts the syncer on site 0 and one learner on each other site. dilococtl reaches each
# daemon over its control socket (a file, so it works from the root namespace).
# Sites of several hosts (up --hosts H): every learner site (1 .. N-1) is H hosts, each its own
# dilocod with the same site name in its own namespace: host 0 is namespace <prefix>site<i> as
# above (peers reach the site there), host h >= 1 is <prefix>site<i>h<h> at 10.77.0.(100+8i+h),
# directory DIR/site<i>h<h>, named "I.H" where a command takes a SITE (kill 1.1 kills site 1's
# host 1). Every host's config lists the site's hosts (site_hosts; ring_address: its eth0
# address, the same bridge here: on real hosts, a private network), and submit sets
# train.hosts=H, so each learner's ring spans its site's H hosts (Gloo).
#
# Environment: DILOCO_BIN (dilocod and dilococtl; default build/bin), DILOCOD_NETNS_DIR (DIR),
# DLC_DATA_ROOTS (the sites' data_roots, default /usr/share/games),
# DLC_NETNS_PREFIX (namespace prefix, default dlc-; lets two clusters coexist), DLC_NETNS_READY_S
# (how long up/start wait for a daemon to answer, default 30).
set -euo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
BIN=${DILOCO_BIN:-$ROOT/build/bin}
DIR=${DILOCOD_NETNS_DIR:-/tmp/dilocod-netns}
PREFIX=${DLC_NETNS_PREFIX:-dlc-}
READY_S=${DLC_NETNS_READY_S:-30}
SUBNET=10.77.0
N=0
RATE=200mbit
HOSTS=1

usage() {
  cat <<EOF
usage: $(basename "$0") [--dir DIR] COMMAND [ARGS]
  check                              exit 0 if network namespaces can be made here, else 77 and why
  up N [--rate R] [--hosts H] [--dir DIR]
                                     N sites (2..64) in namespaces ${PREFIX}site0.., links shaped to R
                                     (default 200mbit; tc units: kbit, mbit, gbit), daemons started;
                                     --hosts H (1..8, N <= 19): every learner site is H hosts
  submit CONFIG [--set k=v ...]      submit to site 0: syncer on site0, a learner on each other site
  status [JOB] [--json]              dilococtl status through site 0 (no JOB: the job list)
  wait JOB [--timeout S]             until the job ends: exit 0 completed, 1 failed, 3 stopped,
                                     124 timed out (default 600 s)
  partition SITE SECONDS [--wait]    take SITE's link down; back up after SECONDS (in the
                                     background, or blocking with --wait)
  kill SITE [--restart-after S] [--wait]
                                     kill -9 SITE's daemon; start it again after S seconds (in the
                                     background, or blocking with --wait)
  start SITE                         start SITE's daemon (same config) and wait until it answers
  slow SITE RATE                     re-shape SITE's link to RATE, both directions
  down [--purge]                     stop the daemons, delete namespaces and links (idempotent);
                                     --purge also deletes DIR
SITE is an index, 0..N-1, or I.H for host H >= 1 of site I (up --hosts). DIR defaults to \$DILOCOD_NETNS_DIR or /tmp/dilocod-netns.
EOF
}

die() {
  echo "netns-cluster: $*" >&2
  exit 1
}
usage_error() {
  echo "netns-cluster: $*" >&2
  usage >&2
  exit 2
}
now_ms() { date +%s%3N; }
note() { echo "$(now_ms) $*" >> "$DIR/events.log"; }

# A daemon is "I" (site I, its host 0) or "I.H" (host H >= 1 of site I).
site_of() { echo "${1%%.*}"; }
host_of() { [[ "$1" == *.* ]] && echo "${1#*.}" || echo 0; }
dname() { [[ "$1" == *.* ]] && echo "site${1%%.*}h${1#*.}" || echo "site$1"; }
ns_site() { echo "${PREFIX}$(dname "$1")"; }
ns_hub() { echo "${PREFIX}hub"; }
addr_of() { [[ "$1" == *.* ]] && echo "$SUBNET.$((100 + 8 * ${1%%.*} + ${1#*.}))" || echo "$SUBNET.$((10 + $1))"; }
site_dir() { echo "$DIR/$(dname "$1")"; }
socket_of() { echo "$(site_dir "$1")/state/control.sock"; }
link_of() { [[ "$1" == *.* ]] && echo "s${1%%.*}h${1#*.}" || echo "s$1"; }
hosts_of() { [[ "$1" -gt 0 ]] && echo "$HOSTS" || echo 1; }  # hosts_of SITE
all_daemons() { # every daemon of the cluster: 0 1 1.1 2 2.1 ...
  local i h
  for ((i = 0; i < N; i++)); do
    echo "$i"
    for ((h = 1; h < $(hosts_of "$i"); h++)); do echo "$i.$h"; done
  done
}
ctl() { "$BIN/dilococtl" "$@"; }

require_root() { [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, veth, tc); try sudo"; }
require_bins() {
  local b
  for b in dilocod dilococtl; do
    [[ -x "$BIN/$b" ]] || die "no $BIN/$b: build it first (cmake --build build --target dilocod dilococtl) or set DILOCO_BIN"
  done
}

# Reads DIR/cluster.env, written by up.
load_env() {
  [[ -f "$DIR/cluster.env" ]] || die "no cluster in $DIR (no cluster.env): run '$(basename "$0") up N' first, or pass --dir"
  # shellcheck disable=SC1091
  source "$DIR/cluster.env"
}

check_site() { # check_site INDEX: a valid site index (or I.H, a host of a site) of the cluster
  if [[ "$1" =~ ^([0-9]+)[.]([0-9]+)$ ]]; then
    [[ ${BASH_REMATCH[1]} -lt "$N" && ${BASH_REMATCH[2]} -ge 1 && ${BASH_REMATCH[2]} -lt $(hosts_of "${BASH_REMATCH[1]}") ]] ||
      die "'$1' is not a host of this cluster: site $((BASH_REMATCH[1])) has $(hosts_of "${BASH_REMATCH[1]}") host(s) (I.H, H >= 1)"
    return 0
  fi
  [[ "$1" =~ ^[0-9]+$ && "$1" -lt "$N" ]] || die "site '$1' is not a site of this cluster: give an index 0..$((N - 1)) (or I.H for a host)"
}

check_seconds() { # check_seconds NAME VALUE
  [[ "$2" =~ ^[0-9]+([.][0-9]+)?$ ]] || usage_error "$1: '$2' is not a number of seconds"
}

# tbf parameters for a rate: "rate R burst B latency L". The burst holds 10 ms of traffic at the
# rate (at least 16 KiB, more than an MTU, which tbf needs), the queue 100 ms.
tbf_args() {
  local rate=$1 num unit mult
  [[ "$rate" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "rate '$rate': expected a number and a tc unit: bit, kbit, mbit or gbit (e.g. 200mbit)"
  num=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;; esac
  local bytes_per_s=$((num * mult / 8))
  [[ $bytes_per_s -gt 0 ]] || die "rate '$rate' is zero"
  local burst=$((bytes_per_s / 100))
  [[ $burst -lt 16384 ]] && burst=16384
  echo "rate $rate burst $burst latency 100ms"
}

shape_link() { # shape_link INDEX RATE: egress of both ends
  local i=$1 args
  read -ra args <<< "$(tbf_args "$2")"
  tc -n "$(ns_site "$i")" qdisc replace dev eth0 root tbf "${args[@]}"
  tc -n "$(ns_hub)" qdisc replace dev "$(link_of "$i")" root tbf "${args[@]}"
}

alive() { # alive PID: a running process (a zombie is dead)
  local pid=$1 state
  [[ -n "$pid" && -r /proc/$pid/stat ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z ]]
}

pid_of() { # pid_of INDEX: the running daemon's pid, or nothing (exit 1)
  local f
  f="$(site_dir "$1")/dilocod.pid"
  [[ -f "$f" ]] || return 1
  local pid
  pid=$(cat "$f")
  alive "$pid" || return 1
  # The pid file may be stale and the pid reused: it must be a dilocod.
  [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dilocod ]] || return 1
  echo "$pid"
}

site_hosts_yaml() { # site_hosts_yaml SITE: its site_hosts list, relative to a host's directory
  local i=$1 h m
  echo "site_hosts:  # this site's hosts; host 0 first"
  for ((h = 0; h < $(hosts_of "$i"); h++)); do
    m=$i
    [[ $h -gt 0 ]] && m="$i.$h"
    echo "  - {control: tcp://$(addr_of "$m"):7100, ring_address: $(addr_of "$m"), public_key_file: ../$(dname "$m")/keys/key.public}"
  done
  echo "ring_timeout_ms: ${DLC_RING_TIMEOUT_MS:-10000}"
}

write_config() { # write_config INDEX (or I.H)
  local i=$1 j d a
  d=$(site_dir "$i")
  a=$(addr_of "$i")
  if [[ "$i" == *.* ]]; then
    {
      echo "# Written by scripts/netns-cluster.sh: host $(host_of "$i") of site $(site_of "$i"), in namespace $(ns_site "$i") at $a."
      echo "site: site$(site_of "$i")"
      echo "host: $(host_of "$i")"
      echo "state_dir: state"
      echo "keys: keys"
      echo "threads: 1"
      echo "listen: {control: tcp://$a:7100}"
      echo "data_roots: [${DLC_DATA_ROOTS:-/usr/share/games}]"
      site_hosts_yaml "$(site_of "$i")"
    } > "$d/dilocod.yaml"
    return 0
  fi
  {
    echo "# Written by scripts/netns-cluster.sh: site $i of $N, in namespace $(ns_site "$i") at $a."
    echo "site: site$i"
    echo "state_dir: state"
    echo "keys: keys"
    echo "threads: 1          # $N daemons share this machine"
    echo "metrics_port: 7190  # the namespace's own loopback: ip netns exec $(ns_site "$i") curl 127.0.0.1:7190/metrics"
    echo "listen: {control: tcp://$a:7100, uplink: tcp://$a:7101, downlink: tcp://$a:7102, snapshot: tcp://$a:7103}"
    echo "data_roots: [${DLC_DATA_ROOTS:-/usr/share/games}]  # where corpora may be read from"
    local others=""
    for ((j = 0; j < N; j++)); do [[ $j -eq $i ]] || others+="${others:+, }site$j"; done
    echo "submitters: [$others]  # the other sites may forward jobs here"
    echo "peers:"
    for ((j = 0; j < N; j++)); do
      [[ $j -eq $i ]] && continue
      local b
      b=$(addr_of "$j")
      echo "  - {site: site$j, control: tcp://$b:7100, uplink: tcp://$b:7101, downlink: tcp://$b:7102,"
      echo "     snapshot: tcp://$b:7103, public_key_file: ../site$j/keys/key.public}"
    done
    [[ $(hosts_of "$i") -gt 1 ]] && site_hosts_yaml "$i"
    true
  } > "$d/dilocod.yaml"
}

# Starts site i's daemon in its namespace, in its own session, stderr into its log.
launch_daemon() {
  local i=$1 d
  d=$(site_dir "$i")
  if pid_of "$i" > /dev/null; then die "site $i: dilocod is running already (pid $(pid_of "$i"))"; fi
  echo "=== $(date '+%F %T') netns-cluster: starting dilocod of site$i in $(ns_site "$i")" >> "$d/dilocod.log"
  # Not a process group leader here (no job control), so setsid execs in place: $! is dilocod's pid
  # (ip netns exec execs too).
  setsid ip netns exec "$(ns_site "$i")" "$BIN/dilocod" --config "$d/dilocod.yaml" >> "$d/dilocod.log" 2>&1 < /dev/null &
  echo $! > "$d/dilocod.pid"
}

wait_ready() { # wait_ready INDEX: until the daemon answers dilococtl status, or die with its log
  local i=$1 d deadline pid
  d=$(site_dir "$i")
  pid=$(cat "$d/dilocod.pid")
  deadline=$(($(date +%s) + READY_S))
  while :; do
    if ! alive "$pid"; then
      echo "netns-cluster: site $i: dilocod exited during startup; the end of $d/dilocod.log:" >&2
      tail -n 15 "$d/dilocod.log" >&2
      return 1
    fi
    [[ -S "$(socket_of "$i")" ]] && ctl status --socket "$(socket_of "$i")" > /dev/null 2>&1 && return 0
    if [[ $(date +%s) -ge $deadline ]]; then
      echo "netns-cluster: site $i: dilocod (pid $pid) did not answer 'dilococtl status' within ${READY_S} s (killed); the end of $d/dilocod.log:" >&2
      kill -KILL "$pid" 2> /dev/null || true
      tail -n 15 "$d/dilocod.log" >&2
      return 1
    fi
    sleep 0.1
  done
}

cluster_namespaces() { # every namespace of this prefix that exists
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX//./\\.}(site[0-9]+(h[0-9]+)?|hub)\$" || true
}

# ---------------------------------------------------------------------------------------------
cmd_check() {
  [[ $# -eq 0 ]] || usage_error "check takes no arguments"
  local why=""
  if [[ $(id -u) -ne 0 ]]; then
    why="not root (network namespaces, veth links and tc need root; run as root or with sudo)"
  elif ! command -v ip > /dev/null 2>&1; then
    why="no 'ip' command (iproute2 is not installed: apt-get install iproute2)"
  elif ! command -v tc > /dev/null 2>&1; then
    why="no 'tc' command (iproute2 is not installed: apt-get install iproute2)"
  elif ! command -v setsid > /dev/null 2>&1; then
    why="no 'setsid' command (util-linux is not installed)"
  else
    local a="${PREFIX}chk$$a" b="${PREFIX}chk$$b" err
    if ! err=$(ip netns add "$a" 2>&1); then
      why="cannot create a network namespace ($err): no netns support (kernel without CONFIG_NET_NS, or a container without CAP_SYS_ADMIN)"
    elif ! err=$(ip netns add "$b" 2>&1); then
      why="cannot create a second network namespace ($err)"
    elif ! err=$(ip -n "$a" link add br0 type bridge 2>&1); then
      why="cannot create a bridge in a namespace ($err): no bridge support in this kernel"
    elif ! err=$(ip -n "$a" link add v0 type veth peer name v1 netns "$b" 2>&1); then
      why="cannot create a veth pair between namespaces ($err): no veth support in this kernel"
    elif ! err=$(read -ra tbf <<< "$(tbf_args 200mbit)" && tc -n "$a" qdisc replace dev v0 root tbf "${tbf[@]}" 2>&1); then
      why="cannot attach a tbf qdisc ($err): no sch_tbf in this kernel"
    elif ! err=$(ip netns exec "$b" true 2>&1); then
      why="cannot run a command in a namespace with 'ip netns exec' ($err)"
    fi
    ip netns del "$a" 2> /dev/null || true
    ip netns del "$b" 2> /dev/null || true
  fi
  if [[ -n "$why" ]]; then
    echo "netns-cluster check: cannot run a netns cluster here: $why" >&2
    exit 77
  fi
  echo "netns-cluster check: ok (root, $(ip -V 2>&1 | grep -o "iproute2-[0-9.]*" || echo iproute2), network namespaces, bridge, veth, tbf)"
}

cmd_up() {
  local n=""
  while [[ $# -gt 0 ]]; do
    case $1 in
      --rate) [[ $# -ge 2 ]] || usage_error "--rate needs a value"; RATE=$2; shift 2 ;;
      --hosts) [[ $# -ge 2 ]] || usage_error "--hosts needs a number"; HOSTS=$2; shift 2 ;;
      -*) usage_error "up: unknown option '$1'" ;;
      *) [[ -z "$n" ]] || usage_error "up: one N only"; n=$1; shift ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 2 && "$n" -le 64 ]] || usage_error "up: N must be a number of sites, 2..64 (got '${n}')"
  N=$n
  [[ "$HOSTS" =~ ^[0-9]+$ && "$HOSTS" -ge 1 && "$HOSTS" -le 8 ]] || usage_error "up: --hosts must be 1..8 (got '$HOSTS')"
  [[ "$HOSTS" -eq 1 || "$N" -le 19 ]] || usage_error "up: --hosts $HOSTS takes at most 19 sites"
  tbf_args "$RATE" > /dev/null
  require_root
  require_bins
  if [[ -n "$(cluster_namespaces)" ]]; then
    die "namespaces with prefix '$PREFIX' exist already ($(cluster_namespaces | tr '\n' ' ')): a cluster is up; run '$(basename "$0") down' first (or set DLC_NETNS_PREFIX)"
  fi
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  {
    echo "# Written by scripts/netns-cluster.sh up at $(date '+%F %T')"
    echo "N=$N"
    echo "PREFIX=$PREFIX"
    echo "RATE=$RATE"
    echo "BIN=$BIN"
    echo "HOSTS=$HOSTS"
  } > "$DIR/cluster.env"
  : >> "$DIR/events.log"
  # From here on a failure tears down what was made.
  trap 'echo "netns-cluster: up failed; tearing down" >&2; cmd_down > /dev/null 2>&1 || true' EXIT

  local hub i
  hub=$(ns_hub)
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for i in $(all_daemons); do
    local ns
    ns=$(ns_site "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$hub" link add "$(link_of "$i")" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "$(link_of "$i")" master br0
    ip -n "$hub" link set "$(link_of "$i")" up
    ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape_link "$i" "$RATE"
  done
  for i in $(all_daemons); do
    local d
    d=$(site_dir "$i")
    mkdir -p "$d/state"
    if [[ ! -f "$d/keys/key.secret" ]]; then
      ctl keygen --out "$d/keys" > /dev/null 2> "$d/keygen.err" || { cat "$d/keygen.err" >&2; die "site $i: dilococtl keygen failed"; }
    fi
  done
  for i in $(all_daemons); do write_config "$i"; done
  for i in $(all_daemons); do launch_daemon "$i"; done
  for i in $(all_daemons); do wait_ready "$i"; done
  trap - EXIT
  note "up $N $RATE hosts $HOSTS"
  for i in $(all_daemons); do
    echo "$(dname "$i"): $(ns_site "$i") $(addr_of "$i"), pid $(pid_of "$i"), config $(site_dir "$i")/dilocod.yaml, log $(site_dir "$i")/dilocod.log"
  done
  echo "up: $N sites, links at $RATE; submit with: $(basename "$0") --dir $DIR submit CONFIG"
}

cmd_submit() {
  [[ $# -ge 1 ]] || usage_error "submit: give a run config"
  local config=$1
  shift
  [[ -f "$config" ]] || die "submit: no run config at '$config'"
  load_env
  local learners="" i
  for ((i = 1; i < N; i++)); do learners+="${learners:+,}site$i"; done
  # The placement and learner count come from the cluster; --set after them may override.
  local job
  job=$(ctl submit "$config" --socket "$(socket_of 0)" --set placement.syncer=site0 \
    --set "placement.learners=[$learners]" --set "sync.learners=$((N - 1))" --set "train.hosts=$HOSTS" "$@") ||
    die "submit: dilococtl submit failed (see above)"
  note "submit $job"
  echo "$job"
}

cmd_status() {
  load_env
  exec "$BIN/dilococtl" status "$@" --socket "$(socket_of 0)"
}

cmd_wait() {
  local job="" timeout=600
  while [[ $# -gt 0 ]]; do
    case $1 in
      --timeout) [[ $# -ge 2 ]] || usage_error "--timeout needs seconds"; timeout=$2; shift 2 ;;
      -*) usage_error "wait: unknown option '$1'" ;;
      *) [[ -z "$job" ]] || usage_error "wait: one JOB only"; job=$1; shift ;;
    esac
  done
  [[ -n "$job" ]] || usage_error "wait: give a job id"
  check_seconds --timeout "$timeout"
  load_env
  local deadline state out rc
  deadline=$(($(date +%s) + ${timeout%.*}))
  while :; do
    rc=0
    out=$(ctl status "$job" --socket "$(socket_of 0)" 2>&1) || rc=$?
    # A usage error (unknown job) will not go away; anything else (site 0 restarting) may.
    [[ $rc -eq 2 ]] && { echo "$out" >&2; exit 2; }
    if [[ $rc -eq 0 ]]; then
      state=$(echo "$out" | awk 'NR == 1 {print $3}')
      case $state in
        completed) echo "$out"; return 0 ;;
        failed) echo "$out"; exit 1 ;;
        stopped) echo "$out"; exit 3 ;;
      esac
    fi
    if [[ $(date +%s) -ge $deadline ]]; then
      echo "netns-cluster wait: job $job did not end within $timeout s; last status:" >&2
      echo "$out" >&2
      exit 124
    fi
    sleep 1
  done
}

cmd_partition() {
  local site="" seconds="" wait=0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --wait) wait=1; shift ;;
      -*) usage_error "partition: unknown option '$1'" ;;
      *) if [[ -z "$site" ]]; then site=$1; elif [[ -z "$seconds" ]]; then seconds=$1; else usage_error "partition: too many arguments"; fi; shift ;;
    esac
  done
  [[ -n "$site" && -n "$seconds" ]] || usage_error "partition: give SITE and SECONDS"
  check_seconds SECONDS "$seconds"
  load_env
  check_site "$site"
  require_root
  local hub old
  hub=$(ns_hub)
  # A pending "back up" of an earlier partition of this site would cut this one short.
  if [[ -f "$(site_dir "$site")/heal.pid" ]]; then
    old=$(cat "$(site_dir "$site")/heal.pid")
    if alive "$old"; then kill -KILL "$old" 2> /dev/null || true; fi
  fi
  ip -n "$hub" link set "$(link_of "$site")" down
  note "partition-start site$site ${seconds}s"
  if [[ $wait -eq 1 ]]; then
    echo "site$site: link down for $seconds s"
    sleep "$seconds"
    ip -n "$hub" link set "$(link_of "$site")" up
    note "partition-end site$site"
    echo "site$site: link up"
  else
    local d
    d=$(site_dir "$site")
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid bash -c 'sleep "$1"; ip -n "$2" link set "$3" up && echo "$(date +%s%3N) partition-end site$4" >> "$5/events.log"' \
      _ "$seconds" "$hub" "$(link_of "$site")" "$site" "$DIR" >> "$d/chaos.log" 2>&1 < /dev/null &
    echo $! > "$d/heal.pid"
    echo "site$site: link down; back up in $seconds s"
  fi
}

cmd_kill() {
  local site="" after="" wait=0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --restart-after) [[ $# -ge 2 ]] || usage_error "--restart-after needs seconds"; after=$2; shift 2 ;;
      --wait) wait=1; shift ;;
      -*) usage_error "kill: unknown option '$1'" ;;
      *) [[ -z "$site" ]] || usage_error "kill: one SITE only"; site=$1; shift ;;
    esac
  done
  [[ -n "$site" ]] || usage_error "kill: give a SITE"
  [[ -z "$after" ]] || check_seconds --restart-after "$after"
  load_env
  check_site "$site"
  local pid i
  pid=$(pid_of "$site") || die "site $site: dilocod is not running"
  kill -KILL "$pid"
  for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.05; done
  alive "$pid" && die "site $site: dilocod (pid $pid) still there after kill -9"
  note "kill site$site pid $pid"
  echo "site$site: killed dilocod (pid $pid) with -9"
  [[ -n "$after" ]] || return 0
  if [[ $wait -eq 1 ]]; then
    sleep "$after"
    cmd_start "$site"
  else
    local d
    d=$(site_dir "$site")
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid bash -c 'sleep "$1"; exec "$2" --dir "$3" start "$4"' _ "$after" "$SELF" "$DIR" "$site" >> "$d/chaos.log" 2>&1 < /dev/null &
    echo $! > "$d/restart.pid"
    echo "site$site: restarting in $after s (output in $d/chaos.log)"
  fi
}

cmd_start() {
  [[ $# -eq 1 ]] || usage_error "start: give a SITE"
  local site=$1
  load_env
  check_site "$site"
  require_root
  [[ -n "$(cluster_namespaces)" ]] || die "the cluster's namespaces are gone (down?): run up"
  launch_daemon "$site"
  wait_ready "$site" || exit 1
  note "start site$site pid $(pid_of "$site")"
  echo "site$site: dilocod running (pid $(pid_of "$site"))"
}

cmd_slow() {
  [[ $# -eq 2 ]] || usage_error "slow: give SITE and RATE"
  load_env
  check_site "$1"
  require_root
  shape_link "$1" "$2"
  note "slow site$1 $2"
  echo "site$1: link shaped to $2 both ways"
}

cmd_down() {
  local purge=0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --purge) purge=1; shift ;;
      *) usage_error "down: unknown argument '$1'" ;;
    esac
  done
  if [[ -f "$DIR/cluster.env" ]]; then
    # shellcheck disable=SC1091
    source "$DIR/cluster.env"
  fi
  local i pid f pids=()
  # Delayed actions first, so nothing comes back up behind us.
  for f in "$DIR"/site*/heal.pid "$DIR"/site*/restart.pid; do  # hosts' directories too (site<i>h<h>)
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    if alive "$pid"; then kill -KILL "$pid" 2> /dev/null || true; fi
    rm -f "$f"
  done
  # SIGTERM every daemon (roles save their state), then wait, then -9 what is left.
  for i in $(all_daemons); do
    if pid=$(pid_of "$i"); then
      kill -TERM "$pid" 2> /dev/null || true
      pids+=("$pid")
    fi
  done
  local ns
  for ns in $(cluster_namespaces); do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do
      kill -TERM "$pid" 2> /dev/null || true
      pids+=("$pid")
    done
  done
  local deadline=$(($(date +%s) + 15)) left
  while :; do
    left=0
    for pid in "${pids[@]}"; do alive "$pid" && left=1; done
    [[ $left -eq 0 || $(date +%s) -ge $deadline ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if alive "$pid"; then
      echo "netns-cluster down: pid $pid still running 15 s after SIGTERM: kill -9" >&2
      kill -KILL "$pid" 2> /dev/null || true
    fi
  done
  # Deleting a namespace deletes its links (veth pairs, the bridge).
  for ns in $(cluster_namespaces); do
    ip netns del "$ns" 2> /dev/null || echo "netns-cluster down: could not delete namespace $ns" >&2
  done
  for i in $(all_daemons); do rm -f "$(site_dir "$i")/dilocod.pid"; done
  [[ -d "$DIR" && -f "$DIR/events.log" ]] && note "down"
  if [[ $purge -eq 1 && -f "$DIR/cluster.env" ]]; then
    rm -rf "$DIR"
    echo "down: removed $DIR"
  fi
  echo "down: no daemons, no namespaces with prefix '$PREFIX'"
}

# ---------------------------------------------------------------------------------------------
# --dir DIR may come before or after the command.
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) [[ $# -ge 2 ]] || usage_error "--dir needs a directory"; DIR=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
[[ $# -ge 1 ]] || { usage >&2; exit 2; }
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
cmd=$1
shift
case $cmd in
  check) cmd_check "$@" ;;
  up) cmd_up "$@" ;;
  submit) cmd_submit "$@" ;;
  status) cmd_status "$@" ;;
  wait) cmd_wait "$@" ;;
  partition) cmd_partition "$@" ;;
  kill) cmd_kill "$@" ;;
  start) cmd_start "$@" ;;
  slow) cmd_slow "$@" ;;
  down) cmd_down "$@" ;;
  *) usage_error "unknown command '$cmd'" ;;
esac
