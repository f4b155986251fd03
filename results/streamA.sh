#!/usr/bin/env bash
cd /work/wt-tables
R=results/run.sh; O=results/A.jsonl; E="--set eval.batches=200"
KEEP=1 $R $O "decoupled" 1 $E
$R $O "ddp" 1 $E --set sync.mode=ddp
KEEP=1 $R $O "decoupled" 2 $E
$R $O "ddp" 2 $E --set sync.mode=ddp
$R $O "diloco" 1 $E --recipe diloco
$R $O "diloco int4" 1 $E --recipe diloco-int4
$R $O "streaming" 1 $E --recipe streaming
