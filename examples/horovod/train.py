#!/usr/bin/env python3
"""A plain Horovod + PyTorch training job (gloo, CPU) used to record real traces for dpro.

The models and synthetic data are those of ``examples/ddp/train.py``; the gradients are
averaged by ``hvd.DistributedOptimizer`` (tensor fusion, cycle time and negotiation as
Horovod does them; set ``HOROVOD_FUSION_THRESHOLD`` / ``HOROVOD_CYCLE_TIME`` /
``HOROVOD_AUTOTUNE`` in the environment).  Launch it with ``horovodrun``::

    horovodrun -np 2 -H localhost:2 --gloo python examples/horovod/train.py --model mlp

or one process per (emulated) host with Horovod's gloo rendezvous variables
(``dpro_torch.hvd_launch``).  Each iteration is timed with a wall clock on every rank;
rank 0 prints a final ``median_iteration_ms=`` line, and ``--json-out FILE`` writes every
rank's times.  The loop is ordinary: ``dpro profile`` profiles it unchanged.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import horovod.torch as hvd

_DDP = Path(__file__).resolve().parent.parent / "ddp" / "train.py"


def _ddp_example():
    """examples/ddp/train.py as a module (its models and batch generators)."""
    spec = importlib.util.spec_from_file_location("dpro_example_ddp_train", _DDP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("cnn", "mlp", "transformer"), default="mlp")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=20, help="measured iterations (after warm-up)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads per rank (0 = cores // local ranks, at least 1)")
    p.add_argument("--json-out", default="", help="write per-iteration times of every rank here (rank 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    else:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // max(1, hvd.local_size())))
    ex = _ddp_example()
    torch.manual_seed(args.seed)
    net, batch_fn, loss_fn = ex.build(args.model, args.batch_size, torch.device("cpu"))
    torch.manual_seed(args.seed + 1 + rank)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    n_params = sum(p.numel() for p in net.parameters())
    if rank == 0:
        print(f"model={args.model} params={n_params} ({n_params * 4 / 2**20:.2f} MiB fp32) world={world} "
              f"backend=horovod-gloo fusion_threshold={os.environ.get('HOROVOD_FUSION_THRESHOLD', 'default')} "
              f"cycle_time_ms={os.environ.get('HOROVOD_CYCLE_TIME', 'default')} "
              f"autotune={os.environ.get('HOROVOD_AUTOTUNE', '0')} batch={args.batch_size} "
              f"threads={torch.get_num_threads()}", flush=True)
    times, cpu, tune_log = [], [], []
    tune_path = os.environ.get("HOROVOD_AUTOTUNE_LOG", "") if os.environ.get("HOROVOD_AUTOTUNE") == "1" else ""
    for it in range(args.warmup + args.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = batch_fn()
        opt.zero_grad()   # Horovod 0.28 wraps zero_grad without set_to_none
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        cpu.append(time.process_time() - c0)   # CPU time of all the process's threads (Horovod's too)
        if tune_path and rank == 0:   # the autotuner's log grows by one line per sample and stops when it converged
            tune_log.append(os.path.getsize(tune_path) if os.path.exists(tune_path) else 0)
        if rank == 0 and not args.quiet:
            print(f"{'warmup' if it < args.warmup else 'iter'} {it:4d} time_ms={dt * 1e3:.3f}", flush=True)
    measured = times[args.warmup:]
    all_times = hvd.allgather_object(measured)
    all_cpu = hvd.allgather_object(cpu[args.warmup:])
    if rank == 0:
        per_iter_max = [max(ts[i] for ts in all_times) for i in range(len(measured))]
        med = statistics.median(measured)
        print(f"median_iteration_ms={med * 1e3:.3f} (rank 0, {len(measured)} iterations after "
              f"{args.warmup} warm-up; slowest-rank median {statistics.median(per_iter_max) * 1e3:.3f})",
              flush=True)
        if args.json_out:
            doc = {"model": args.model, "world_size": world, "backend": "horovod-gloo",
                   "batch_size": args.batch_size, "warmup": args.warmup, "iters": args.iters,
                   "params": n_params, "torch": torch.__version__, "horovod": __import__("horovod").__version__,
                   "threads_per_rank": torch.get_num_threads(), "host": socket.gethostname(),
                   "horovod_env": {k: v for k, v in os.environ.items()
                                   if k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")},
                   "first_measured_iteration": args.warmup,
                   "iteration_times_s": {str(r): ts for r, ts in enumerate(all_times)},
                   "iteration_cpu_s": {str(r): ts for r, ts in enumerate(all_cpu)},
                   **({"autotune_log_bytes": tune_log[args.warmup:]} if tune_path else {}),
                   "median_iteration_s": med,
                   "median_slowest_rank_iteration_s": statistics.median(per_iter_max)}
            tmp = args.json_out + f".tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                json.dump(doc, fh, indent=1)
            os.replace(tmp, args.json_out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
