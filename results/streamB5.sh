#!/usr/bin/env bash
cd /work/wt-tables
while kill -0 32063 2>/dev/null; do sleep 10; done
R=results/run.sh; O=results/B.jsonl; E="--set eval.batches=200"
$R $O "ddp" 1 $E --set sync.mode=ddp
