#!/usr/bin/env bash
# Checks the systemd unit with `systemd-analyze verify`: exit 0 only when it
# reports nothing at all (systemd only warns, with status 0, about unknown
# keys and bad values, so any output counts as a failure).
#   scripts/check-unit.sh [UNIT_FILE]     # default: scripts/dilocod@.service
# dilocod need not be installed: the unit is checked from a temporary copy
# whose ExecStart points at a stub executable. Without systemd-analyze the
# check is skipped (exit 0) with a message saying so.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}
[[ $here == "${BASH_SOURCE[0]}" ]] && here=.
unit=${1:-"$here/dilocod@.service"}

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "check-unit: SKIP: systemd-analyze not found (Debian: apt-get install systemd); $unit not checked"
  exit 0
fi
if [[ ! -f $unit ]]; then
  echo "check-unit: $unit: no such file" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stub="$tmp/dilocod"
printf '#!/bin/sh\nexit 0\n' >"$stub"
chmod +x "$stub"
copy="$tmp/$(basename "$unit")"
# Only the binary path changes; its arguments stay as written.
sed -E "s|^(ExecStart(Pre\|Post)?=[-@:+!]*)/[^ ]*/dilocod( \|$)|\1$stub\3|" "$unit" >"$copy"
if ! grep -q "^ExecStart=$stub" "$copy"; then
  echo "check-unit: $unit has no 'ExecStart=/.../dilocod ...' line to check" >&2
  exit 1
fi

status=0
out=$(systemd-analyze verify --man=no "$copy" 2>&1) || status=$?
if [[ $status -ne 0 || -n $out ]]; then
  # Name the real file, not the temporary copy.
  printf '%s\n' "${out//$copy/$unit}" >&2
  echo "check-unit: FAILED: $unit (systemd-analyze verify exit $status)" >&2
  exit 1
fi
echo "check-unit: OK: $unit ($(systemd-analyze --version | head -n1))"
