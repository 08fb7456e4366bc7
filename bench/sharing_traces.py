#!/usr/bin/env python3
"""Proteus' executor on recorded traces: fifo vs shared links, and the overlap factor fitted from each trace.

No job runs: every trace here is a real recorded run (examples/traces, ../shared/traces/hta) with its
own measured iteration time; this replays each with

* ``fifo``   — links are queues (the default replay);
* ``shared`` — concurrent transfers share the sender's egress and receiver's ingress (max-min fair);
* ``shared + gamma`` — plus the overlap factor fitted from the same trace (``--overlap-factor fit``);

and prints a markdown table (docs/replayer.md "Bandwidth sharing and overlap (Proteus)").

    python bench/sharing_traces.py                       # the table (~1 min)
    python bench/sharing_traces.py --json rows.json
    taskset -c 1 python bench/sharing_traces.py --speed  # kernel speed, fifo vs shared, 10^5 and 10^6 ops (~3 min)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpro_kit.session import Session  # noqa: E402

EXAMPLES = ["ddp-2host-1000mbit", "ddp-2rank-gloo", "mxnet-ps-2w1s-loopback", "pslite-2w1s-200mbit"]
HTA = ["nccl_2rank_rank0", "sampled_128rank_rank0", "allgather_reducescatter_16rank_rank0"]


def traces(tmp: Path) -> list[tuple[str, Path]]:
    out = [(t, ROOT / "examples" / "traces" / t) for t in EXAMPLES]
    hta = ROOT.parent / "shared" / "traces" / "hta"
    for name in HTA:   # each file is one job: a folder of its own (the plain-kineto reader reads folders)
        f = hta / f"{name}.json.gz"
        if f.exists():
            d = tmp / name
            d.mkdir()
            (d / f.name).symlink_to(f)
            out.append((f"hta/{name}", d))
    return out


def row(label: str, path: Path) -> dict:
    s = Session(path)
    measured = s.info.get("measured_iteration_ms")
    fit = s.overlap_fit()
    gamma = fit.gamma or 0.0
    r = {"trace": label, "measured_ms": measured, "gamma": fit.gamma, "gamma_mean": fit.gamma_mean,
         "ops_used": fit.ops_used, "fit_note": fit.reason}
    for key, kw in (("fifo", {}), ("shared", {"device_model": "shared"}),
                    ("shared_gamma", {"device_model": "shared", "overlap_factor": gamma}),
                    ("shared_gamma_mean", {"device_model": "shared", "overlap_factor": fit.gamma_mean or 0.0})):
        ms = s.replay(1, **kw).iteration_time_us / 1e3
        r[f"{key}_ms"] = ms
        r[f"{key}_err"] = 100.0 * (ms - measured) / measured if measured else None
    return r


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def speed() -> int:
    """Process time of replay(cg, ...) per device model on synthetic ring DFGs (median of 3)."""
    import time
    sys.path.insert(0, str(ROOT / "bench"))
    from synthetic import dfg_with_about

    from dpro_kit.replay import compile_graph, replay
    print("| ops | devices | model | options | s | M ops/s | iteration us |")
    print("|---:|---:|---|---|---:|---:|---:|")
    for n in (100_000, 1_000_000):
        cg = compile_graph(dfg_with_about(n))
        for m, o in (("fifo", None), ("shared", {"share": False}), ("shared", None),
                     ("shared", {"overlap_factor": 0.1})):
            replay(cg, device_model=m, model_options=o)
            ts = []
            for _ in range(3):
                t = time.process_time()
                r = replay(cg, device_model=m, model_options=o)
                ts.append(time.process_time() - t)
            dt = sorted(ts)[1]
            print(f"| {cg.n:,} | {len(cg.devices)} | {m} | {o or ''} | {dt:.3f} | {cg.n / dt / 1e6:.2f} | "
                  f"{r.iteration_time_us:.1f} |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", dest="json_out", default="")
    ap.add_argument("--speed", action="store_true", help="the kernel speed table instead")
    args = ap.parse_args()
    if args.speed:
        return speed()
    with tempfile.TemporaryDirectory(prefix="sx_traces") as tmp:
        rows = [row(label, p) for label, p in traces(Path(tmp))]
    print("| trace | measured ms | fifo ms (err %) | shared ms (err %) | fitted gamma (ops) | shared + gamma ms (err %) "
          "| gamma mean | shared + gamma mean ms (err %) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        def cell(k):
            return f"{r[k + '_ms']:.3f} ({fmt(r[k + '_err'], '+.1f')})"
        g = "n/a (" + r["fit_note"].split(":")[0] + ")" if r["gamma"] is None else f"{r['gamma']:.3f} ({r['ops_used']})"
        print(f"| {r['trace']} | {fmt(r['measured_ms'], '.3f')} | {cell('fifo')} | {cell('shared')} | {g} | "
              f"{cell('shared_gamma')} | {fmt(r['gamma_mean'], '.3f')} | {cell('shared_gamma_mean')} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
