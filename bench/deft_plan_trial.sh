#!/bin/bash
# DeFT plan applied as a user would (docs/deft.md, "As a user would"); root (dpro cluster); run it
# through the bench lock.  2 emulated hosts, two 500 Mbit/s links each, 0.9 CPU per host:
# profile the stock job, `dpro optimize --deft --links`, then 3 alternating rounds of the stock job and
# of `train.py --plan plan.json --plan-mode deft`.   usage: bench/deft_plan_trial.sh [WORKDIR]
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/deft-trial}
mkdir -p "$W" && cd "$W" && rm -rf T plan.json ./*.out
export PATH=$ROOT/.venv/bin:$PATH PYTHONPATH=$ROOT:$ROOT/collectors/common:$ROOT/collectors/torch OMP_NUM_THREADS=1
TR="python $ROOT/examples/ddp/train.py --backend gloo --model mlp --batch-size 64 --bucket-mb 1 --threads 1"
NET="--hosts 2 --rate-mbit 500 --second-rate-mbit 500 --cpus-per-host 0.9 --prefix ut"
date -u +%T
dpro cluster $NET --profile T --steps 10:15 -- $TR --warmup 5 --iters 25 > prof.out 2>&1
dpro replay T | head -5
dpro optimize T --deft --links 500,500 -o plan.json --budget 10 | tail -4
for r in 1 2 3; do
  for v in default deft; do
    X=""; [ $v = deft ] && X="--plan $W/plan.json --plan-mode deft"
    dpro cluster $NET -- $TR --warmup 10 --iters 40 $X > $v-$r.out 2>&1
    echo "$v round $r: $(grep -h 'median_iteration_ms' $v-$r.out | head -1)"
    grep -h "^plan" $v-$r.out | head -2 || true
  done
done
date -u +%T
