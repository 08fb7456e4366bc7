#!/usr/bin/env python3
"""DeFT's delayed updates on a real job: stock DDP vs every bucket one iteration late (root, emulated cluster).

    sudo /work/main/.venv/bin/python bench/deft_ab.py                  # mlp, 2 hosts at 1000 Mbit/s, 3 rounds
    sudo /work/main/.venv/bin/python bench/deft_ab.py --rate 300 --rounds 5

The configuration of the committed trace ``examples/traces/ddp-2host-1000mbit`` (``examples/ddp/train.py
--model mlp --batch-size 64 --bucket-mb 25``, 2 hosts x 1 rank, gloo, CPU, one emulated link per host)
run alternately, one fresh job per variant and round (``dpro_kit.jobs.alternate``):

* ``default``: stock DDP;
* ``defer-all``: ``--deft-defer all`` (``dpro_torch.deft.DeferredBuckets``: every bucket all-reduced
  during the next iteration, its update one iteration late).

Per variant the median over rounds of the job's median iteration (slowest rank), the paired ratio, and
``dpro replay TRACE --deft``'s prediction for the same pair (``synchronous`` and ``delay_one``) from the
committed trace (recorded at 1000 Mbit/s; another ``--rate`` is predicted with ``--links RATE``).
This measures the fixed-delay hook only: DeFT's merged updates (fewer optimizer steps) are not
applied to real jobs yet (docs/deft.md §9).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from dpro_kit.jobs import alternate, paired_ratio, paired_table  # noqa: E402
from optimize_ab import Cluster  # noqa: E402

TRACE = ROOT / "examples" / "traces" / "ddp-2host-1000mbit"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="per-host link rate, Mbit/s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="write everything here")
    args = ap.parse_args()
    base = ["--model", "mlp", "--batch-size", "64", "--bucket-mb", "25", "--warmup", str(args.warmup),
            "--iters", str(args.iters)]
    variants = {"default": [], "defer-all": ["--deft-defer", "all"]}
    with tempfile.TemporaryDirectory(prefix="deft-ab-") as tmp:
        cl = Cluster(Path(tmp), prefix="deft")
        n = {v: 0 for v in variants}

        def measure(v: str) -> float:
            n[v] += 1
            return cl.run(args.rate, base + variants[v], f"{v}-r{n[v]}")["ms"]

        rounds = alternate({v: (lambda v=v: measure(v)) for v in variants}, args.rounds, shuffle_seed=args.seed,
                           on_round=lambda r, rs: print(f"round {r + 1}: " + ", ".join(
                               f"{v} {rs[v][-1]:.2f} ms" for v in variants), file=sys.stderr, flush=True))
    paired_table(rounds, "default", file=sys.stderr)
    meas = {v: statistics.median(xs) for v, xs in rounds.items()}
    cmd = [sys.executable, "-m", "dpro_kit.cli", "replay", str(TRACE), "--deft", "--json", "-q"]
    if args.rate != 1000.0:
        cmd += ["--links", f"{args.rate:g}"]
    pred = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout)["deft"]
    p_sync, p_late = pred["synchronous"]["iteration_ms"], pred["delay_one"]["iteration_ms"]
    out = {"rate_mbit": args.rate, "rounds": rounds, "median_ms": meas,
           "paired_ratio": paired_ratio(rounds, "default", "defer-all"),
           "predicted_ms": {"default": p_sync, "defer-all": p_late}, "command": " ".join(sys.argv)}
    print(f"measured (median of {args.rounds} rounds): default {meas['default']:.2f} ms, defer-all "
          f"{meas['defer-all']:.2f} ms, speed-up x{meas['default'] / meas['defer-all']:.2f}")
    print(f"predicted (dpro replay --deft): default {p_sync:.2f} ms, defer-all {p_late:.2f} ms, "
          f"speed-up x{p_sync / p_late:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
