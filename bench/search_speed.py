"""Search-time ablation of `dpro optimize` (like dPRO Table 5) on synthetic 16-rank global DFGs.

    nice -n 19 python bench/search_speed.py            # full: budget 300 s per cell
    nice -n 19 python bench/search_speed.py --quick    # small budget per cell, smaller graphs

Columns: strawman (Alg. 1 with full rebuild + replay for every sync-time estimate,
op-by-op fusion candidates, every rank checked), + coarsened view, + partial
replay, + symmetry (each adds to the previous).  A cell that hits the budget
is printed as "> budget".  Graphs: synthetic (bench/synthetic.py), 16 ranks,
8 per host, ring AllReduce, one tensor per layer (dPRO's search starts
unfused), links at 10 Gbit/s inter-host so the jobs are communication-bound;
BERT-base's gradient sizes repeat every 8 layers (transformer blocks).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import synthetic  # noqa: E402
from dpro_kit.costmodel import LinkModel  # noqa: E402
from dpro_kit.optimize import SearchOptions, Searcher, extract_base  # noqa: E402

MODELS = {
    # ~ResNet-50: 54 layers with parameters, 25.6 M params (~100 MB fp32)
    "ResNet-50": dict(layers=54, min_bytes=16 << 10, max_bytes=9 << 20, fw_median_us=120.0),
    # ~BERT-base: 12 blocks x 8 parameterised layers + embeddings/head ~ 100 layers, 110 M params (~440 MB)
    # gradient sizes repeat every 8 layers (transformer blocks; see graph_for)
    "BERT-base": dict(layers=100, min_bytes=3 << 10, max_bytes=9 << 20, fw_median_us=150.0, block=8),
}
MODES = [("strawman", dict(coarsened=False, partial_replay=False, symmetry=False)),
         ("+coarsened view", dict(coarsened=True, partial_replay=False, symmetry=False)),
         ("+partial replay", dict(coarsened=True, partial_replay=True, symmetry=False)),
         ("+symmetry", dict(coarsened=True, partial_replay=True, symmetry=True))]


def graph_for(name: str, ranks: int, scale: float = 1.0):
    kw = dict(MODELS[name])
    kw.pop("block", None)
    kw["layers"] = max(4, int(kw["layers"] * scale))
    g = synthetic.synthetic_dfg(spec=synthetic.SynthSpec(ranks=ranks, buckets=kw["layers"], ranks_per_host=8,
                                                         seed=0, **kw))
    base = extract_base(g)
    block = MODELS[name].get("block", 0)
    if block:   # repeated blocks: the gradient sizes of layer i equal those of layer i - block
        ts = list(base.tensors.values())
        for i, t in enumerate(ts):
            if i >= block:
                t.bytes = ts[i % block].bytes
    base.model.default = LinkModel(latency_us=base.model.default.latency_us, bandwidth_Bps=10e9 / 8)
    return g, base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="budget 30 s per cell, graphs at 1/2 the layers")
    ap.add_argument("--budget", type=float, default=None, help="seconds per cell (default 300, quick 30)")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--models", default="ResNet-50,BERT-base")
    ap.add_argument("--modes", default=",".join(m for m, _ in MODES))
    a = ap.parse_args(argv)
    known = [m for m, _ in MODES]
    bad = [m for m in a.modes.split(",") if m not in known] + [m for m in a.models.split(",") if m not in MODELS]
    if bad:
        ap.error(f"unknown mode/model {', '.join(map(repr, bad))}; modes: {', '.join(known)}; "
                 f"models: {', '.join(MODELS)}")
    budget = a.budget or (30.0 if a.quick else 300.0)
    scale = 0.5 if a.quick else 1.0
    gc.disable()
    rows = []
    for name in a.models.split(","):
        g, base = graph_for(name, a.ranks, scale)
        n_ops = g.number_of_nodes()
        del g
        cells = {}
        for mode, flags in MODES:
            if mode not in a.modes.split(","):
                continue
            t0 = time.perf_counter()
            r = Searcher(base, SearchOptions(budget_s=budget, **flags)).run()
            dt = time.perf_counter() - t0
            cells[mode] = (dt, r)
            print(f"{name:10s} {mode:16s} {dt:8.1f} s  {r.stopped:12s} steps {r.steps:3d} replays {r.replays:4d} "
                  f"sync evals {r.sync_evals:5d}  {r.before_us / 1e3:.2f} -> {r.after_us / 1e3:.2f} ms",
                  file=sys.stderr, flush=True)
            gc.collect()
        rows.append((name, n_ops, cells))
    print()
    head = "| model (16 ranks) | ops | " + " | ".join(m for m, _ in MODES if m in a.modes.split(",")) + " | found |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, n_ops, cells in rows:
        vals = []
        for mode, _ in MODES:
            if mode not in cells:
                continue
            dt, r = cells[mode]
            vals.append(f"> {budget:.0f} s" if r.stopped == "time budget" else f"{dt:.1f} s")
        last = cells[list(cells)[-1]][1]
        print(f"| {name} | {n_ops} | " + " | ".join(vals) +
              f" | {last.before_us / 1e3:.1f} -> {last.after_us / 1e3:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
