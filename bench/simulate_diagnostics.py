#!/usr/bin/env python3
"""Diagnostics behind docs/simulate.md "Where the error comes from" (issue 16): no prediction, measurements only.

``stalls TRACE...``      per profiled iteration of a single-process profile: the sum of its op durations, the sum
                         of every op's median over the iterations, and the ops more than 2 ms above their median
                         (a CPU-budget throttle stall, or a preemption, lands on whichever op is running);
``opcost OP TRACE...``   per trace and rank, the median / mean duration of op OP (e.g. aten::linear) per call;
``waits TRACE...``       per rank, the host ops by kind and the top OTHER ops per iteration (gloo send/recv waits);
``profile-job STRATEGY`` the real strategy job (examples/strategies/train.py) under ``dpro profile`` on emulated
                         hosts (one rank per host, the bench's CPU budget and period), to compare its ops with the
                         single-process profiles.

    python bench/simulate_diagnostics.py profile-job gpipe-2 --model mlp --rate 1000 --cpus 0.5 --out /tmp/pp
    python bench/simulate_diagnostics.py opcost aten::linear /tmp/pp/trace bench2-mlp/003-mlp-single-prof-b16/trace
    python bench/simulate_diagnostics.py stalls bench2-mlp/001-mlp-single-prof-b64/trace
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _events(path: str):
    from dpro_kit.session import Session
    ev = Session(path, align=False).profiled.events
    st = ev["stream"].astype(str)
    return ev[(st != "comm") & ~st.str.startswith("gpu")]


def stalls(paths: list[str]) -> None:
    import numpy as np
    for path in paths:
        ev = _events(path)
        for node in sorted(ev["node"].unique()):
            e = ev[ev["node"] == node]
            seqs = []
            for it in sorted(e["iteration"].unique()):
                x = e[e["iteration"] == it].sort_values("start", kind="stable")
                seqs.append((x["name"].astype(str).to_list(), x["dur"].to_numpy(float)))
            n = min(len(q[0]) for q in seqs)
            same = [q for q in seqs if q[0][:n] == seqs[0][0][:n]]
            D = np.array([q[1][:n] for q in same])
            med = np.median(D, axis=0)
            excess = np.clip(D - med, 0, None)
            big = excess > 2000.0
            print(f"{path} {node}: {len(same)} iterations x {n} ops; op sum per iteration "
                  f"{', '.join(f'{v / 1e3:.1f}' for v in D.sum(axis=1))} ms; per-op medians {med.sum() / 1e3:.1f} ms; "
                  f"ops > 2 ms above their median per iteration: {', '.join(str(int(v)) for v in big.sum(axis=1))}, "
                  f"carrying {', '.join(f'{v / 1e3:.1f}' for v in (excess * big).sum(axis=1))} ms")


def opcost(op: str, paths: list[str]) -> None:
    for path in paths:
        ev = _events(path)
        for node in sorted(ev["node"].unique()):
            x = ev[(ev["node"] == node) & (ev["name"].astype(str) == op)]["dur"]
            if len(x):
                print(f"{path} {node}: {op} n={len(x)} median {x.median():.0f} us, mean {x.mean():.0f} us")


def waits(paths: list[str]) -> None:
    for path in paths:
        ev = _events(path)
        n_it = max(1, ev["iteration"].nunique())
        for node in sorted(ev["node"].unique()):
            e = ev[ev["node"] == node]
            by = (e.groupby(e["kind"].astype(str))["dur"].sum() / 1e3 / n_it).round(2).to_dict()
            o = e[e["kind"].astype(str) == "OTHER"]
            top = (o.groupby(o["name"].astype(str))["dur"].sum() / 1e3 / n_it).sort_values(ascending=False).head(5)
            print(f"{path} {node}: per iteration by kind (ms) {by}; top OTHER: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in top.items()))


def profile_job(a: argparse.Namespace) -> None:
    import os
    from dpro_kit.jobs import run_job
    train = ROOT / "examples" / "strategies" / "train.py"
    sfile = Path(a.strategy) if a.strategy.endswith((".yaml", ".yml", ".json")) else \
        ROOT / "examples" / "strategies" / f"{a.strategy}.yaml"
    import yaml
    ranks = int(yaml.safe_load(sfile.read_text())["ranks"])
    env = dict(DPRO_QUIET="1", PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "collectors" / "torch"), str(ROOT / "collectors" / "common"), str(ROOT)]))
    a.out.mkdir(parents=True, exist_ok=True)
    times = a.out / "times.json"
    argv = [sys.executable, str(train), "--model", a.model, "--strategy", str(sfile), "--warmup", "4", "--iters", "10",
            "--threads", "1", "--quiet", "--json-out", str(times)] + (["--batch-size", str(a.batch_size)] if a.batch_size else [])
    r = run_job(argv, hosts=ranks, ranks_per_host=1, rate_mbit=a.rate if a.rate > 0 else None, cpus_per_host=a.cpus,
                cpu_period_us=a.period_us, cpu_shares=8192, profile=a.out / "trace", steps="5:10",
                profile_flags=["--shapes"] if a.shapes else (), env=env, timeout=300, prefix=a.prefix)
    print(f"exit codes {r.codes}; iteration {json.loads(times.read_text())['iteration_ms']:.2f} ms (profiled); "
          f"trace {a.out / 'trace'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stalls")
    s.add_argument("traces", nargs="+")
    o = sub.add_parser("opcost")
    o.add_argument("op")
    o.add_argument("traces", nargs="+")
    w = sub.add_parser("waits")
    w.add_argument("traces", nargs="+")
    p = sub.add_parser("profile-job")
    p.add_argument("strategy")
    p.add_argument("--model", default="mlp")
    p.add_argument("--rate", type=float, default=1000, help="link rate (Mbit/s); 0: no emulated cluster (loopback)")
    p.add_argument("--batch-size", type=int, default=0, help="global batch (default: the model's)")
    p.add_argument("--shapes", action="store_true", help="dpro profile --shapes (as the simulator's profile)")
    p.add_argument("--cpus", type=float, default=0.5)
    p.add_argument("--period-us", type=int, default=10000)
    p.add_argument("--prefix", default="sd")
    p.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "stalls":
        stalls(a.traces)
    elif a.cmd == "opcost":
        opcost(a.op, a.traces)
    elif a.cmd == "waits":
        waits(a.traces)
    else:
        profile_job(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
