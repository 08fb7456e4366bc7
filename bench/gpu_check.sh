#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (docs/nccl.md, "On a real GPU").
#
#   OUT=/tmp/gpu bash bench/gpu_check.sh        # python3 there must have torch with CUDA
#
# 1. builds collectors/nccl and runs real NCCL all-reduces (torch.distributed, NCCL backend) with
#    the plugin loaded: 4 ranks on one GPU, each with its own NCCL_HOSTID, so NCCL sees 4 "nodes"
#    and uses its network transport (sockets over loopback), whose proxy steps the plugin records;
#    Ring/Simple, Ring/LL and Tree/Simple;
# 2. 2-rank DDP jobs (examples/ddp/train.py, NCCL on CUDA; DDP_CONFIGS="model:batch ...") measured without the profiler, then
#    profiled with `dpro profile` (one launcher per "host") and the NCCL plugin at once;
# 3. (PARTS=overhead) the plugin's cost on a DDP job's iteration time, with / without, alternating.
# PARTS="nccl ddp overhead" picks the steps (default "nccl ddp").
# Everything lands in $OUT as tarballs; `dpro replay` runs on them on the dpro machine.
set -u
OUT=${OUT:-/tmp/gpu-check}
PY=${PY:-python3}
W=${WORK:-/tmp/gpu-work}
rm -rf "$W"; mkdir -p "$OUT" "$W"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t_start=$SECONDS
nvidia-smi -L
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
make -C collectors/nccl BUILD="$W/nccl" || { echo "plugin build failed"; exit 1; }
PLUG=$W/nccl/libnccl-profiler-dpro.so

# ranks NAME N CMD...: N processes, rank r on "host" r (NCCL_HOSTID, DPRO_HOST); logs in $W/NAME.r.log
ranks() {
    local name=$1 n=$2; shift 2
    local port=$((20000 + RANDOM % 20000)) pids=() rc=0
    for r in $(seq 0 $((n - 1))); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        NCCL_HOSTID=dpro-host$r DPRO_HOST=host$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
            timeout ${RANK_TIMEOUT:-90} "$@" > "$W/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    echo "== $name: exit $rc ($((SECONDS - t_start)) s since start)"
    grep -h -i -E "profiler|plugin|error|warn|Traceback|median_iteration|\"world\"" "$W/$name".*.log | sort | uniq -c | head -30
    return $rc
}

PARTS=${PARTS:-nccl ddp}                  # any of: nccl ddp overhead
DDP_CONFIGS=${DDP_CONFIGS:-cnn:64 mlp:64}  # model:batch per rank (examples/ddp/train.py)

if [[ " $PARTS " == *" nccl "* ]]; then
    for cfg in Ring:Simple:ring-simple Ring:LL:ring-ll Tree:Simple:tree-simple; do
        IFS=: read -r algo proto name <<< "$cfg"
        NCCL_ALGO=$algo NCCL_PROTO=$proto NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,TUNING \
        NCCL_PROFILER_PLUGIN=$PLUG DPRO_NCCL_TRACE=$W/$name \
            ranks "$name" 4 $PY bench/gpu_nccl_allreduce.py --sizes-mb 1,8,32 --iters 3
        ls -la "$W/$name" 2>/dev/null | head
    done
    # the same job without the plugin (its overhead: compare the printed times)
    NCCL_ALGO=Ring NCCL_PROTO=Simple ranks ring-simple-noplugin 4 $PY bench/gpu_nccl_allreduce.py --sizes-mb 1,8,32 --iters 3
    tar -C "$W" -czf "$OUT/nccl.tgz" ring-simple ring-ll tree-simple 2>/dev/null
fi

if [[ " $PARTS " == *" ddp "* ]]; then
    # per configuration: measured without the profiler, profiled (collector + NCCL plugin), measured again
    for cfg in $DDP_CONFIGS; do
        IFS=: read -r model batch <<< "$cfg"
        name=ddp-$model-b$batch
        args=(examples/ddp/train.py --backend nccl --model "$model" --batch-size "$batch" --warmup 10 --iters 40 --quiet)
        ranks "$name-measured" 2 $PY "${args[@]}" --json-out "$W/$name-measured.json"
        NCCL_PROFILER_PLUGIN=$PLUG DPRO_NCCL_TRACE=$W/$name-nccl \
            ranks "$name-profiled" 2 $PY -m dpro_kit profile --steps 10:15 --out "$W/$name" -- "$PY" "${args[@]}"
        ranks "$name-measured2" 2 $PY "${args[@]}" --json-out "$W/$name-measured2.json"
        gzip -q "$W/$name"/host*/*/kineto_trace.json 2>/dev/null
    done
    (cd "$W" && tar -czf "$OUT/ddp.tgz" ddp-*) 2>/dev/null
fi

if [[ " $PARTS " == *" overhead "* ]]; then
    # the plugin's cost on a real job's iteration time: DDP cnn with and without it, alternating
    for k in 1 2 3; do
        for with in 0 1; do
            env $([ $with = 1 ] && echo NCCL_PROFILER_PLUGIN=$PLUG DPRO_NCCL_TRACE=$W/ovh-nccl-$k) \
                ranks "overhead-$k-plugin$with" 2 $PY examples/ddp/train.py --backend nccl --model cnn --batch-size 64 \
                --warmup 10 --iters 60 --quiet --json-out "$W/overhead-$k-plugin$with.json"
        done
    done
    (cd "$W" && tar -czf "$OUT/overhead.tgz" overhead-*.json) 2>/dev/null
fi
mkdir -p "$W/logs"; mv "$W"/*.log "$W/logs/" 2>/dev/null
tar -C "$W" -czf "$OUT/logs.tgz" logs
ls -la "$OUT"
echo "done in $((SECONDS - t_start)) s"
