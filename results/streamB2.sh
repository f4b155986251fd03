#!/usr/bin/env bash
cd /work/wt-tables
R=results/run.sh; O=results/B.jsonl; E="--set eval.batches=200"
yes > /dev/null & h1=$!; yes > /dev/null & h2=$!
uptime > results/logs/hog-uptime.txt
KEEP=1 $R $O "decoupled, beside 2 yes hogs" 1 $E
uptime >> results/logs/hog-uptime.txt
kill $h1 $h2
S="--set learners.3.slowdown=3 --set train.steps=120 --set train.lr_decay_steps=120 --set sync.quorum=1"
KEEP=1 $R $O "slow3 K=1 grace+forecast, 120 steps" 1 $S
KEEP=1 $R $O "slow3 K=1 grace cap 1 step, 120 steps" 1 $S --set sync.grace.cap_steps=1
Q="--set train.steps=60 --set train.lr_decay_steps=60"
$R $O "overhead virtual, 60 steps" 1 $Q
$R $O "overhead wall, 60 steps" 1 $Q --set sync.clock=wall
