#!/usr/bin/env python3
"""A plain NCCL all-reduce job for the profiler plugin's GPU check (bench/gpu_check.sh).

One process per rank, started by the caller with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` (torch's env:// rendezvous).  Several ranks can share one GPU when each sets its
own ``NCCL_HOSTID``: NCCL then sees one GPU per "node" and carries the traffic over its network
transport (sockets on loopback), which is the path whose proxy steps the plugin records.

    python bench/gpu_nccl_allreduce.py --sizes-mb 1,8,32 --iters 3
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", default="1,8,32", help="float32 all-reduce sizes in MiB, comma-separated")
    p.add_argument("--iters", type=int, default=3, help="all-reduces per size (after one warm-up)")
    p.add_argument("--json-out", default="", help="rank 0 writes the measured times here")
    args = p.parse_args()
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    rank, world = dist.get_rank(), dist.get_world_size()
    times: dict[str, list[float]] = {}
    for mb in (float(s) for s in args.sizes_mb.split(",")):
        x = torch.full((int(mb * (1 << 20)) // 4,), float(rank + 1), device="cuda")
        dist.all_reduce(x)  # warm-up
        torch.cuda.synchronize()
        ts = []
        for _ in range(args.iters):
            x.fill_(float(rank + 1))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        want = world * (world + 1) / 2
        if not torch.allclose(x, torch.full_like(x, want)):
            raise SystemExit(f"rank {rank}: wrong all-reduce result {x[0].item()} != {want}")
        times[str(mb)] = ts
    if rank == 0:
        print(json.dumps({"world": world, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                          "torch": torch.__version__, "times_s": times}), flush=True)
        if args.json_out:
            with open(args.json_out, "w") as fh:
                json.dump({"world": world, "times_s": times}, fh)
    dist.destroy_process_group()  # finalize: the plugin writes its files here


if __name__ == "__main__":
    main()
