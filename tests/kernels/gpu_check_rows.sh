#!/usr/bin/env bash
# The row rules of scripts/gpu-check.sh, on CPU (issue 44): a Catch2 row fails unless it ran a
# test case and an assertion, test names are escaped, a missing figure fails, and without a GPU
# the script stops at once with no PASS.   gpu_check_rows.sh SOURCE_DIR CATCH2_BINARY
set -u
check=$1/scripts/gpu-check.sh
bin=$2
name="thread ring: all-reduce, broadcast, host values, barrier"  # a comma: "or" to Catch2
fail() { echo "gpu_check_rows: $*" >&2; exit 1; }

"$check" --catch-row "$bin" "$name" && fail "a filter that matches nothing passed its row"
"$check" --catch-name "$bin" "$name" || fail "the escaped name did not run its test case"
"$check" --catch-row "$bin" "[no-such-tag]" && fail "an empty tag passed its row"
"$check" --figure "" && fail "a missing figure passed"
"$check" --figure "n/a" && fail "a figure that is not a number passed"
"$check" --figure 2.59 || fail "a number failed"

# No GPU: a stub nvidia-smi that fails stands for a machine without one.
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
printf '#!/bin/sh\nexit 9\n' >"$stub/nvidia-smi"
chmod +x "$stub/nvidia-smi"
out=$(PATH=$stub:$PATH LOG_DIR=$stub/logs "$check" 2>&1) && fail "exited 0 without a GPU"
grep -q PASS <<<"$out" && fail "printed PASS without a GPU: $out"
grep -q "no GPU" <<<"$out" || fail "did not say there is no GPU: $out"
echo "gpu_check_rows: ok"
