#!/bin/bash
# Kept as run for docs/deft.md ("As a user would"): needs root (dpro cluster); run through the bench lock.
# User trial: DeFT plan applied with --plan-mode deft on 2 emulated hosts with two 500 Mbit/s links each.
set -e
cd /tmp/utrial && rm -rf T plan.json *.out
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=/work/main:/work/main/collectors/common:/work/main/collectors/torch OMP_NUM_THREADS=1
TR="python /work/main/examples/ddp/train.py --backend gloo --model mlp --batch-size 64 --bucket-mb 1 --threads 1"
date -u +%T
dpro cluster --hosts 2 --rate-mbit 500 --second-rate-mbit 500 --cpus-per-host 0.9 --prefix ut --profile T --steps 10:15 -- $TR --warmup 5 --iters 25 > prof.out 2>&1
dpro replay T | head -5
dpro optimize T --deft --links 500,500 -o plan.json --budget 10 | tail -4
for r in 1 2 3; do
  for v in default deft; do
    X=""; [ $v = deft ] && X="--plan /tmp/utrial/plan.json --plan-mode deft"
    dpro cluster --hosts 2 --rate-mbit 500 --second-rate-mbit 500 --cpus-per-host 0.9 --prefix ut -- $TR --warmup 10 --iters 40 $X > $v-$r.out 2>&1
    echo "$v round $r: $(grep -h 'median_iteration_ms' $v-$r.out | head -1)"
    grep -h "^plan" $v-$r.out | head -2 || true
  done
done
date -u +%T
