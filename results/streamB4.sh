#!/usr/bin/env bash
cd /work/wt-tables
while kill -0 31707 2>/dev/null; do sleep 10; done
R=results/run.sh; O=results/B.jsonl
S="--set train.steps=60 --set train.lr_decay_steps=60 --set sync.quorum=1"
KEEP=1 $R $O "equal speeds K=1 grace+forecast, 60 steps" 1 $S
KEEP=1 $R $O "equal speeds K=1 grace, forecast off, 60 steps" 1 $S --set sync.grace.forecast=false
