#!/usr/bin/env bash
cd /work/wt-tables
while kill -0 22532 2>/dev/null; do sleep 10; done
R=results/run.sh; O=results/A.jsonl; E="--set eval.batches=200"
$R $O "ddp" 1 $E --set sync.mode=ddp
$R $O "ddp" 2 $E --set sync.mode=ddp
KEEP=1 $R $O "decoupled" 2 $E
$R $O "diloco int4" 1 $E --recipe diloco-int4
$R $O "streaming" 1 $E --recipe streaming
$R $O "diloco" 1 $E --recipe diloco
