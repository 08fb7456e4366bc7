#!/usr/bin/env python3
"""Profiled vs unprofiled computation of a DeFT arm: where the replay of the two-link arms loses its time (root).

    sudo /work/main/.venv/bin/python bench/deft_phases.py --rate 500 --rate1 500 --link1 1,2

The replay of ``sync-2links`` / ``partial-2links`` (docs/deft.md §9) is the only one sensitive to the
computation before the link-1 buckets are ready.  On the emulated two-link cluster of
``bench/deft_ab.py`` it profiles the stock job (``dpro profile``, as deft_ab does; ``train.py --phase-log``:
a light timer, forward / backward / step ends), then ``--rounds`` times alternates the stock job and the arm
(``--deft-link1 K,.. [--deft-defer ..]``) unprofiled with ``--phase-log`` (the arm's hook also stamps each
bucket's ready moment), and prints per rank the median over iterations of the timer's phases (ms since the
iteration's start) in the three, next to the same
points in the profiled trace: per profiled iteration, a one-iteration replay of that iteration's graph
(``Session.iteration_graphs``; ``In bucket<k>``'s start minus the worker's first op), and the graph the
replay uses by default (``Session.graph``: the iteration whose stock replay is the median).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from optimize_ab import Cluster  # noqa: E402


def timer_medians(path: Path) -> dict[str, dict[str, float]]:
    doc = json.loads(path.read_text())
    out = {}
    for r, its in doc["phases_ms"].items():
        row = {k: statistics.median(p[k] for p in its) for k in ("forward", "backward_end", "step_end")}
        for what in ("ready", "done"):
            for b in sorted({b for p in its for b in p.get(what, {})}):
                row[f"{what}{b}"] = statistics.median(p[what][b] for p in its if b in p.get(what, {}))
        out[r] = row
    return out


def trace_points(trace: Path, rate: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per profiled iteration (and 'graph': the default graph), per worker: forward end and In bucket<k> (ms)."""
    from dpro_kit.replay import replay
    from dpro_kit.session import Session
    from dpro_kit.trace import OpKind
    from dpro_kit.whatif import WhatIf
    s = Session(trace, whatif=WhatIf(bandwidth_mbps=rate))
    graphs = {str(k): g for k, g in s.iteration_graphs.items()}
    graphs["graph"] = s.graph
    graphs["op-median"] = s.op_median_graph
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, g in graphs.items():
        res = replay(g)
        rows: dict[str, dict[str, float]] = {}
        first: dict[str, float] = {}
        bw: dict[str, float] = {}
        for i, k in enumerate(res.graph.keys):
            d = g.nodes[k]
            w = d.get("node")
            if not w or not d.get("device", "").endswith(":compute"):
                continue
            first[w] = min(first.get(w, float("inf")), float(res.start[i]))
            if d.get("kind") == OpKind.BW.value:
                bw[w] = min(bw.get(w, float("inf")), float(res.start[i]))
        for i, k in enumerate(res.graph.keys):
            d = g.nodes[k]
            if d.get("kind") == OpKind.VIRTUAL.value and str(k).split("|", 1)[-1].startswith("In "):
                w = d["node"]
                b = d["tensor"].removeprefix("bucket")
                rows.setdefault(w, {})[f"ready{b}"] = (float(res.start[i]) - first[w]) / 1e3
        for w in rows:
            rows[w]["forward"] = (bw[w] - first[w]) / 1e3
        out[name] = {w: rows[w] for w in sorted(rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--rate1", type=float, default=500.0)
    ap.add_argument("--link1", default="1,2", help="train.py --deft-link1 (the buckets on eth1)")
    ap.add_argument("--defer", default="", help="also the arm partial-2links: train.py --deft-defer this")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prof-steps", type=int, default=5)
    ap.add_argument("--prefix", default="dft", help="cgroup / netns name prefix of the emulated cluster")
    ap.add_argument("--keep", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="deft-phases-"))
    work.mkdir(parents=True, exist_ok=True)
    cl = Cluster(work, prefix=args.prefix)
    arms = {"stock": [], "sync-2links": ["--deft-link1", args.link1]}
    if args.defer:
        arms["partial-2links"] = ["--deft-link1", args.link1, "--deft-defer", args.defer]
    base = ["--model", "mlp", "--batch-size", "64", "--bucket-mb", "1", "--warmup", str(args.warmup)]
    trace = work / "trace"
    steps = f"{args.warmup + 2}:{args.warmup + 2 + args.prof_steps}"
    t0 = time.time()
    prof = cl.run(args.rate, base + ["--iters", str(args.prof_steps + 12), "--phase-log", str(work / "phases-prof.json")],
                  "profile", profile=trace, steps=steps, second_rate=args.rate1)
    ms: dict[str, list[float]] = {a: [] for a in arms}
    timers: dict[str, list[dict]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for a, extra in arms.items():
            f = work / f"phases-{a}-{r}.json"
            ms[a].append(cl.run(args.rate, base + extra + ["--iters", str(args.iters), "--phase-log", str(f)],
                                f"{a}-r{r + 1}", second_rate=args.rate1)["ms"])
            timers[a].append(timer_medians(f))
    tp = timer_medians(work / "phases-prof.json")
    tr = trace_points(trace, args.rate)
    print(f"\n{args.rate:g} + {args.rate1:g} Mbit/s, link 1: buckets {args.link1}; iteration ms: profiled stock job "
          f"{prof['ms']:.2f}; unprofiled " + "; ".join(f"{a} " + ", ".join(f"{x:.2f}" for x in xs) for a, xs in ms.items()))
    workers = sorted(tr["graph"])
    cols = [n for n in tr if n not in ("graph", "op-median")]
    for r, w in enumerate(workers):
        print(f"\nrank {r} ({w}), ms since the iteration's start (median over iterations, and over rounds)")
        print(f"{'point':<14} {'stock prof.':>12} " + " ".join(f"{a:>15}" for a in arms) + " "
              + " ".join(f"{'it ' + n:>7}" for n in cols) + f" {'graph':>7} {'op-median':>9}")
        keys = ["forward"] + sorted({k for t in timers[a] for a in arms for k in t[str(r)]
                                     if k.startswith(("ready", "done"))}) + ["backward_end", "step_end"]
        for k in keys:
            un = " ".join(f"{statistics.median(t[str(r)].get(k, float('nan')) for t in timers[a]):>15.2f}" for a in arms)
            cells = " ".join(f"{tr[n][w].get(k, float('nan')):>7.2f}" for n in cols)
            print(f"{k:<14} {tp[str(r)].get(k, float('nan')):>12.2f} {un} {cells} {tr['graph'][w].get(k, float('nan')):>7.2f}"
                  f" {tr['op-median'][w].get(k, float('nan')):>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "timer_profiled_stock": tp,
                                               "timers": timers, "iteration_ms": ms, "trace": tr,
                                               "profiled_ms": prof["ms"], "wall_s": round(time.time() - t0, 1)},
                                              indent=1))


if __name__ == "__main__":
    main()
