#!/usr/bin/env bash
# Syncer merge table: `dilococtl bench syncer` for params × learners × uplink codec, one fresh
# process per point (so peak RSS belongs to that point alone). Prints merge GB/s (fp32 deltas
# merged: decode, RDA, Nesterov, downlink codec, Θ update, CRC), memcpy GB/s with the same
# threads, their ratio, peak RSS and bytes per parameter above the process's own RSS. Rounds open
# at once: every fragment's (the worst case), then 2 (the staggered schedule).
#   scripts/bench/syncer.sh                                  # 25M/100M × M 2/8 × int4/fp32 × open all/2
#   PARAMS="25000000" LEARNERS="8" CODECS="int4" OPEN="0" THREADS=2 ROUNDS=3 scripts/bench/syncer.sh
#   SYNCERS="1 2" THREADS=1 PARAMS=25000000 LEARNERS=8 CODECS=int4 OPEN=0 scripts/bench/syncer.sh  # shards
#   BIN=/path/to/other/dilococtl scripts/bench/syncer.sh     # another build (e.g. a baseline)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-build/bin/dilococtl}
[[ -x $bin ]] || { echo "syncer.sh: $bin not found: build first" >&2; exit 2; }
params=${PARAMS:-"25000000 100000000"}
learners=${LEARNERS:-"2 8"}
codecs=${CODECS:-"int4 fp32"}
opens=${OPEN:-"0 2"}    # rounds open at once (0: every fragment's)
threads=${THREADS:-0}   # 0: sync.merge_threads' default
rounds=${ROUNDS:-3}
syncers=${SYNCERS:-1}   # shards merging their fragments at once (each THREADS threads)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for o in $opens; do
  for s in $syncers; do
    for p in $params; do
      for m in $learners; do
        for c in $codecs; do
          echo "syncer.sh: params $p, learners $m, codec $c, open rounds $o, syncers $s" >&2
          "$bin" bench syncer --params "$p" --learners "$m" --codec "$c" --threads "$threads" --rounds "$rounds" \
            --open-rounds "$o" --syncers "$s" --json >> "$out"
        done
      done
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("| params | M | codec | open rounds | S | threads | merge GB/s | copy GB/s | ratio | peak RSS MB | bytes/param |")
print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    opened = "all" if r["open_rounds"] == r["fragments"] else r["open_rounds"]
    print(f"| {r['params']/1e6:.0f}M | {r['learners']} | {r['codec']} | {opened} | {r.get('syncers', 1)} | {r['threads']} | "
          f"{r['merge_GBps']:.2f} | {r['copy_GBps']:.1f} | {r['ratio']:.3f} | {r['peak_rss_mb']:.0f} | "
          f"{r['bytes_per_param']:.1f} |")
PY
