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
# 3. (PARTS=overhead) the plugin's cost on a DDP job's iteration time, with / without, alternating;
# 4. (PARTS=mps) the 2-rank DDP jobs of MPS_CONFIGS with the CUDA MPS daemon running, so the two
#    processes' kernels share the GPU's SMs at once instead of time-slicing it (without MPS each NCCL
#    all-reduce of the ddp part cost ~2 time slices, ~4.5 ms whatever its size: docs/accuracy.md, "On a
#    GPU"); skipped with a line in the log when nvidia-cuda-mps-control is missing or does not start;
# 5. (PARTS=single) one rank alone (no peer, nothing time-slices the GPU): SINGLE_CONFIGS.
# 6. (PARTS=big) real 50-500 MB rank files (docs/scale.md, "Real rank files from an H100"): the 2-rank
#    DDP job of BIG_CONFIGS with a long profiled window (--steps BIG_STEPS, BIG_ITERS measured
#    iterations after 10 of warm-up), measured without the profiler before and after like `ddp`;
#    each rank's gzipped kineto_trace.json lands in $OUT on its own (split into 15 MB parts
#    `*.gz.part-aa ...` if one is over 15.5 MiB: `cat` them back), the rest of the folder in big.tgz.
# PARTS="nccl ddp overhead mps single big" picks the steps (default "nccl ddp"); the second run:
#   PARTS="mps single" OUT=/tmp/gpu bash bench/gpu_check.sh
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

PARTS=${PARTS:-nccl ddp}                  # any of: nccl ddp overhead mps single
DDP_CONFIGS=${DDP_CONFIGS:-cnn:64 mlp:64}  # model:batch per rank (examples/ddp/train.py)
MPS_CONFIGS=${MPS_CONFIGS:-cnn:64 mlp:64 transformer:64}
SINGLE_CONFIGS=${SINGLE_CONFIGS:-cnn:64 transformer:64}
BIG_CONFIGS=${BIG_CONFIGS:-transformer:64}
BIG_STEPS=${BIG_STEPS:-10:130}          # ~0.7 MB of Kineto JSON per transformer:64 step and rank on the H100: 10:130 gave 86 MB, 10:450 307 MB (docs/scale.md)
BIG_ITERS=${BIG_ITERS:-130}
BACKEND=${BACKEND:-nccl}                # gloo: try the script's logic on a machine without a GPU

# ddp_job PREFIX NPROC MODEL:BATCH: measured without the profiler, profiled (collector + NCCL plugin),
# measured again; the trace in $W/PREFIX-MODEL-bBATCH. Fails (and runs nothing more) when the first
# run fails, so a broken setup (MPS) costs one run, not three per configuration.
ddp_job() {
    local prefix=$1 n=$2 model batch name
    IFS=: read -r model batch <<< "$3"
    name=$prefix-$model-b$batch
    local args=(examples/ddp/train.py --backend "$BACKEND" --model "$model" --batch-size "$batch" --warmup 10
                --iters "${JOB_ITERS:-40}" --quiet)
    ranks "$name-measured" "$n" $PY "${args[@]}" --json-out "$W/$name-measured.json" || return 1
    NCCL_PROFILER_PLUGIN=$PLUG DPRO_NCCL_TRACE=$W/$name-nccl \
        ranks "$name-profiled" "$n" $PY -m dpro_kit profile --steps "${JOB_STEPS:-10:15}" --out "$W/$name" -- "$PY" "${args[@]}"
    ranks "$name-measured2" "$n" $PY "${args[@]}" --json-out "$W/$name-measured2.json"
    ls -la "$W/$name"/host*/*/kineto_trace.json 2>/dev/null
    gzip -q "$W/$name"/host*/*/kineto_trace.json 2>/dev/null
}

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
    for cfg in $DDP_CONFIGS; do ddp_job ddp 2 "$cfg"; done
    (cd "$W" && tar -czf "$OUT/ddp.tgz" ddp-*) 2>/dev/null
fi

if [[ " $PARTS " == *" single "* ]]; then
    for cfg in $SINGLE_CONFIGS; do ddp_job single 1 "$cfg" || break; done
    (cd "$W" && tar -czf "$OUT/single.tgz" single-*) 2>/dev/null
fi

if [[ " $PARTS " == *" mps "* ]]; then
    export CUDA_MPS_PIPE_DIRECTORY=$W/mps-pipe CUDA_MPS_LOG_DIRECTORY=$W/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
        trap 'echo quit | nvidia-cuda-mps-control' EXIT
        sleep 1
        if timeout 60 $PY -c 'import torch; torch.zeros(1, device="cuda"); print("MPS client ok")'; then
            echo "MPS servers: $(echo get_server_list | nvidia-cuda-mps-control)"
            for cfg in $MPS_CONFIGS; do ddp_job mps 2 "$cfg" || { echo "MPS: $cfg failed, part mps stopped"; break; }; done
        else
            echo "MPS client failed: part mps skipped"
        fi
        tail -5 "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null
        echo quit | nvidia-cuda-mps-control; trap - EXIT
        (cd "$W" && tar -czf "$OUT/mps.tgz" mps-*-b*) 2>/dev/null
    else
        echo "MPS not available here (nvidia-cuda-mps-control missing or did not start): part mps skipped"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

if [[ " $PARTS " == *" overhead "* ]]; then
    # the plugin's cost on a real job's iteration time: DDP cnn with and without it, alternating
    for k in 1 2 3; do
        for with in 0 1; do
            if [ $with = 1 ]; then export NCCL_PROFILER_PLUGIN=$PLUG DPRO_NCCL_TRACE=$W/ovh-nccl-$k; fi
            ranks "overhead-$k-plugin$with" 2 $PY examples/ddp/train.py --backend nccl --model cnn --batch-size 64 \
                --warmup 10 --iters 60 --quiet --json-out "$W/overhead-$k-plugin$with.json"
            unset NCCL_PROFILER_PLUGIN DPRO_NCCL_TRACE
        done
    done
    (cd "$W" && tar -czf "$OUT/overhead.tgz" overhead-*.json) 2>/dev/null
fi
if [[ " $PARTS " == *" big "* ]]; then
    for cfg in $BIG_CONFIGS; do
        JOB_STEPS=$BIG_STEPS JOB_ITERS=$BIG_ITERS RANK_TIMEOUT=${BIG_TIMEOUT:-240} ddp_job big 2 "$cfg"
    done
    for f in "$W"/big-*/host*/*/kineto_trace.json.gz; do
        [ -f "$f" ] || continue
        r=${f%/kineto_trace.json.gz}; job=${r%/host*}; dst=${job##*/}.${r#$job/}; dst=$OUT/${dst//\//-}.kineto_trace.json.gz
        if [ "$(stat -c %s "$f")" -gt 16252928 ]; then split -b 15000000 "$f" "$dst.part-"; else cp "$f" "$dst"; fi
    done
    (cd "$W" && tar -czf "$OUT/big.tgz" --exclude=kineto_trace.json.gz big-*) 2>/dev/null
fi
mkdir -p "$W/logs"; mv "$W"/*.log "$W/logs/" 2>/dev/null
tar -C "$W" -czf "$OUT/logs.tgz" logs
ls -la "$OUT"
echo "done in $((SECONDS - t_start)) s"
