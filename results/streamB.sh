#!/usr/bin/env bash
cd /work/wt-tables
R=results/run.sh; O=results/B.jsonl; E="--set eval.batches=200"
KEEP=1 $R $O "shipped as is, run 1" 1337
yes > /dev/null & h1=$!; yes > /dev/null & h2=$!
uptime > results/logs/hog-uptime.txt
KEEP=1 $R $O "shipped as is, run 2 beside 2 yes hogs" 1337
uptime >> results/logs/hog-uptime.txt
kill $h1 $h2
S="--set learners.3.slowdown=3"
KEEP=1 $R $O "slow3 K=1 grace+forecast" 1 $E $S --set sync.quorum=1
KEEP=1 $R $O "slow3 K=1 grace cap 1 step" 1 $E $S --set sync.quorum=1 --set sync.grace.cap_steps=1
$R $O "slow3 K=4" 1 $E $S --set sync.quorum=4
$R $O "shipped as is, wall clock" 1337 --set sync.clock=wall
