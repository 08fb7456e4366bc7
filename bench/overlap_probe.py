#!/usr/bin/env python3
"""Proteus' overlap factor, measured: how much slower a rank's computation runs while a gloo all-reduce of its
own is in flight, on the bench's pinned emulated hosts (docs/simulate.md "sim12"; issue 16 item 3).

Two ranks, one per emulated host (``dpro_kit.jobs.run_job``, each host pinned to its own core, ``--rate`` Mbit/s),
``torch.set_num_threads(1)``.  Per repetition, between barriers: (A) ``all_reduce`` of ``--nbytes`` alone (wall,
process CPU); (B) a fixed compute loop alone (``--k`` x two matmuls 32x256x1024x256, ~20 ms); (C) the same loop
while an ``all_reduce(async_op=True)`` of ``--nbytes`` runs (wall of the loop; the all-reduce's wall).  Per rank,
medians over ``--reps``: gamma = C / B - 1, Proteus' "increase of the computation's time when it overlaps
communication" (seed 001 §VI-C), measured on two runs of the same work as Proteus does, not on a training job.
The all-reduce must outlast the loop (at 1000 Mbit/s 4 MiB takes ~35 ms).

    python bench/overlap_probe.py --rate 1000 --out /tmp/ov
    python bench/overlap_probe.py --rate 200 --out /tmp/ov
Prints one JSON line per rank (gamma, the medians, the all-reduce's process CPU); gamma = the median over ranks
and runs is what ``bench/simulate_accuracy.py --overlap-factor RATE=G`` takes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rank_main() -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    nb, reps, k = int(os.environ["NBYTES"]), int(os.environ["REPS"]), int(os.environ["K"])
    x = torch.ones(nb // 4)
    a, w1, w2 = torch.randn(32, 256), torch.randn(256, 1024), torch.randn(1024, 256)

    def compute() -> None:
        for _ in range(k):
            torch.mm(torch.mm(a, w1), w2)
    now, pcpu = time.perf_counter, time.process_time
    for _ in range(3):
        dist.all_reduce(x)
        compute()
    runs: dict[str, list[tuple[float, ...]]] = {"A": [], "B": [], "C": []}
    for _ in range(reps):
        dist.barrier()
        t, p = now(), pcpu()
        dist.all_reduce(x)
        runs["A"].append((now() - t, pcpu() - p))
        dist.barrier()
        t = now()
        compute()
        runs["B"].append((now() - t,))
        dist.barrier()
        t0 = now()
        work = dist.all_reduce(x, async_op=True)
        t = now()
        compute()
        c = now() - t
        work.wait()
        runs["C"].append((c, now() - t0))

    def med(key: str, i: int = 0) -> float:
        return statistics.median(v[i] for v in runs[key]) * 1e3
    res = {"rank": dist.get_rank(), "nbytes": nb, "allreduce_ms": med("A"), "allreduce_process_cpu_ms": med("A", 1),
           "compute_alone_ms": med("B"), "compute_overlapped_ms": med("C"), "overlapped_allreduce_ms": med("C", 1)}
    res["gamma"] = res["compute_overlapped_ms"] / res["compute_alone_ms"] - 1
    Path(f"{os.environ['PROBE_OUT']}-r{res['rank']}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        rank_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rate", type=float, default=1000.0, help="link rate of the emulated hosts (Mbit/s)")
    ap.add_argument("--nbytes", type=int, default=4 << 20, help="all-reduce size (bytes)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--k", type=int, default=60, help="matmul pairs of the compute loop")
    ap.add_argument("--pin", default="0,1", help="one cpu list per host")
    ap.add_argument("--prefix", default="ovp", help="name prefix of the emulated hosts' cgroups and namespaces")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from dpro_kit.jobs import run_job
    a.out.mkdir(parents=True, exist_ok=True)
    tag = f"allreduce-{a.nbytes}-{a.rate:g}"
    env = dict(PROBE_OUT=str(a.out / tag), NBYTES=str(a.nbytes), REPS=str(a.reps), K=str(a.k), PYTHONWARNINGS="ignore")
    with open(a.out / f"{tag}.log", "w") as log:
        res = run_job([sys.executable, str(Path(__file__).resolve()), "rank"], hosts=2, ranks_per_host=1,
                      rate_mbit=a.rate, cpus_per_host=None, cpusets=a.pin.split(","), cpu_shares=8192, env=env, log=log,
                      timeout=300, prefix=a.prefix)
    rc = 0
    for r in (0, 1):
        p = a.out / f"{tag}-r{r}.json"
        if not p.exists():
            print(f"{tag} rank {r}: FAILED (exit codes {res.codes}; {a.out / (tag + '.log')})", file=sys.stderr)
            rc = 1
            continue
        d = json.loads(p.read_text())
        print(json.dumps({"rate": a.rate, **{k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
