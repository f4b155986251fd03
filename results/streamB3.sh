#!/usr/bin/env bash
cd /work/wt-tables
R=results/run.sh; O=results/B.jsonl
Q="--set train.steps=60 --set train.lr_decay_steps=60"
KEEP=1 $R $O "det 60 steps, run 1" 1 $Q
yes > /dev/null & h1=$!; yes > /dev/null & h2=$!
uptime > results/logs/hog-uptime.txt
KEEP=1 $R $O "det 60 steps, run 2 beside 2 yes hogs" 1 $Q
uptime >> results/logs/hog-uptime.txt
kill $h1 $h2
S="--set learners.3.slowdown=3 --set train.steps=120 --set train.lr_decay_steps=120 --set sync.quorum=1"
KEEP=1 $R $O "slow3 K=1 grace+forecast, 120 steps" 1 $S
KEEP=1 $R $O "slow3 K=1 grace cap 1 step, 120 steps" 1 $S --set sync.grace.cap_steps=1
$R $O "overhead wall, 60 steps" 1 $Q --set sync.clock=wall
