#!/usr/bin/env bash
# A development cluster of N dilocod on this machine (loopback, CURVE): site-s (syncers) and
# N-1 learner sites site-a, site-b, ... For N=3 the daemon configs are configs/cluster/*.yaml;
# for other N they are written to $DILOCOD_CLUSTER_DIR/configs/. Keys, state and logs live in
# $DILOCOD_CLUSTER_DIR/<site>/ (default /tmp/dilocod-cluster). The sites may read corpora under
# $DATA_ROOTS (their data_roots, default /usr/share/games) and forward jobs to each other.
#
#   scripts/local-cluster.sh start [N]     # keys on first use, then the daemons, in the background
#   scripts/local-cluster.sh status [N]    # which daemons run, and their jobs
#   scripts/local-cluster.sh stop [N]      # SIGTERM, wait (roles save their state)
#
#   build/bin/dilococtl submit configs/demo.yaml --daemon configs/cluster/site-a.yaml
#   build/bin/dilococtl status JOB --watch --daemon configs/cluster/site-a.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DILOCO_BIN:-build/bin}
DIR=${DILOCOD_CLUSTER_DIR:-/tmp/dilocod-cluster}
cmd=${1:-}
N=${2:-3}
[[ "$cmd" =~ ^(start|stop|status)$ && "$N" =~ ^[0-9]+$ && "$N" -ge 2 && "$N" -le 27 ]] || {
  echo "usage: $0 start|stop|status [N]   (N sites, 2..27; default 3)" >&2
  exit 2
}

letters=(a b c d e f g h i j k l m n o p q r t u v w x y z)
sites=(site-s)
for ((i = 0; i < N - 1; i++)); do sites+=("site-${letters[$i]}"); done
port_of() { # base port of site index i: 7100, 7110, ...
  echo $((7100 + 10 * $1))
}

config_of() {
  if [[ $N -eq 3 && "$DIR" == /tmp/dilocod-cluster ]]; then echo "configs/cluster/$1.yaml"; else echo "$DIR/configs/$1.yaml"; fi
}

write_configs() {
  [[ $N -eq 3 && "$DIR" == /tmp/dilocod-cluster ]] && return 0
  mkdir -p "$DIR/configs"
  for ((i = 0; i < ${#sites[@]}; i++)); do
    local site=${sites[$i]} port
    port=$(port_of "$i")
    {
      echo "# Written by scripts/local-cluster.sh for a $N-site cluster."
      echo "site: $site"
      echo "state_dir: $DIR/$site/state"
      echo "keys: $DIR/$site/keys"
      echo "threads: 1"
      echo "metrics_port: $((port + 90))"
      echo "listen: {control: tcp://127.0.0.1:$port, uplink: tcp://127.0.0.1:$((port + 1)), downlink: tcp://127.0.0.1:$((port + 2)), snapshot: tcp://127.0.0.1:$((port + 3))}"
      echo "data_roots: [${DATA_ROOTS:-/usr/share/games}]"
      local others=""
      for ((j = 0; j < ${#sites[@]}; j++)); do [[ $j -eq $i ]] || others+="${others:+, }${sites[$j]}"; done
      echo "submitters: [$others]"
      echo "peers:"
      for ((j = 0; j < ${#sites[@]}; j++)); do
        [[ $j -eq $i ]] && continue
        local p
        p=$(port_of "$j")
        echo "  - {site: ${sites[$j]}, control: tcp://127.0.0.1:$p, uplink: tcp://127.0.0.1:$((p + 1)), downlink: tcp://127.0.0.1:$((p + 2)), snapshot: tcp://127.0.0.1:$((p + 3)), public_key_file: $DIR/${sites[$j]}/keys/key.public}"
      done
    } > "$DIR/configs/$site.yaml"
  done
}

pid_of() { # the pid of a running daemon of site $1, or nothing
  local f="$DIR/$1/dilocod.pid"
  [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
  return 0
}

case "$cmd" in
  start)
    [[ -x "$BIN/dilocod" ]] || { echo "no $BIN/dilocod: build first (scripts/setup.sh)" >&2; exit 1; }
    for site in "${sites[@]}"; do
      mkdir -p "$DIR/$site"
      [[ -f "$DIR/$site/keys/key.secret" ]] || "$BIN/dilococtl" keygen --out "$DIR/$site/keys" > /dev/null 2>&1
    done
    write_configs
    for site in "${sites[@]}"; do
      if [[ -n "$(pid_of "$site")" ]]; then echo "$site: running already (pid $(pid_of "$site"))"; continue; fi
      nohup "$BIN/dilocod" --config "$(config_of "$site")" >> "$DIR/$site/dilocod.log" 2>&1 < /dev/null &
      echo $! > "$DIR/$site/dilocod.pid"
    done
    for site in "${sites[@]}"; do
      for _ in $(seq 100); do
        "$BIN/dilococtl" list --daemon "$(config_of "$site")" > /dev/null 2>&1 && break
        [[ -n "$(pid_of "$site")" ]] || { echo "$site: dilocod exited; see $DIR/$site/dilocod.log:" >&2; tail -5 "$DIR/$site/dilocod.log" >&2; exit 1; }
        sleep 0.1
      done
      echo "$site: pid $(pid_of "$site"), config $(config_of "$site"), log $DIR/$site/dilocod.log"
    done
    ;;
  stop)
    for site in "${sites[@]}"; do
      pid=$(pid_of "$site")
      [[ -n "$pid" ]] && kill -TERM "$pid"
    done
    for site in "${sites[@]}"; do
      for _ in $(seq 150); do [[ -z "$(pid_of "$site")" ]] && break; sleep 0.1; done
      if [[ -n "$(pid_of "$site")" ]]; then
        echo "$site: still running after 15 s; kill -9"
        kill -KILL "$(pid_of "$site")"
      else
        echo "$site: stopped"
      fi
      rm -f "$DIR/$site/dilocod.pid"
    done
    ;;
  status)
    for site in "${sites[@]}"; do
      pid=$(pid_of "$site")
      if [[ -z "$pid" ]]; then echo "$site: not running"; continue; fi
      echo "$site: pid $pid"
      "$BIN/dilococtl" list --daemon "$(config_of "$site")" | sed 's/^/  /'
    done
    ;;
esac
