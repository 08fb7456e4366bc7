#!/usr/bin/env python3
"""Injected-offset experiment: does `dpro align` recover known clock offsets of REAL traces?

    sudo /work/venv/bin/python bench/align_accuracy.py                       # default job matrix
    sudo /work/venv/bin/python bench/align_accuracy.py --jobs 2x1:none:25 --seeds 1 2 3
    /work/venv/bin/python bench/align_accuracy.py --trace DIR --seeds 1 2    # an existing trace dir

Per job: run ``examples/ddp/train.py --model mlp`` (gloo, CPU) under ``dpro profile`` in an
:class:`~dpro_kit.cluster.EmulatedCluster` (``HOSTSxRANKS:RATE_MBIT|none:BUCKET_MB``; every
rank gets its host's ``DPRO_HOST``).  All namespaces share one clock, so the true offsets are 0.
``:ring`` after a job spec profiles with ``dpro profile --ring`` (per-chunk SEND/RECV times
from the timed ring comm hook) instead of gloo's opaque collectives.
Per seed: every host gets a random offset (uniform +-5 ms, the same for all ranks of the
host), every event start of its nodes is shifted by it through the trace model
(``load_trace`` -> shift -> ``save_trace`` into a new native-format directory), and the
offsets are estimated on the copy.  Error = estimate - injected (relative to the reference
node), over the non-reference nodes.  Also the replayed iteration time of the original,
the shifted copy without alignment (timestamps taken as they are) and the shifted copy with
alignment, next to the measured (unprofiled) iteration time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpro_kit.align import align, aligned_traceset, apply_offsets, shift_trace_dir  # noqa: E402
from dpro_kit.trace import load_trace  # noqa: E402


def run_job(out: Path, hosts: int, per_host: int, rate: float | None, bucket_mb: float, iters: int = 30,
            timeout: float = 240.0, ring: bool = False, after: int = 20) -> float:
    """Profile a real gloo DDP job in the emulated cluster; return its wall time (s)."""
    from dpro_kit.cluster import EmulatedCluster
    py = sys.executable
    world = hosts * per_host
    run_id = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    with EmulatedCluster(hosts=hosts, rate_mbit=rate, prefix="dpalb") as c:
        procs = []
        for h in range(hosts):
            for local in range(per_host):
                r = h * per_host + local
                env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
                       "LOCAL_WORLD_SIZE": str(per_host), "MASTER_PORT": "29517", "DPRO_RUN_ID": run_id,
                       "OMP_NUM_THREADS": "1"}
                argv = [py, "-m", "dpro_kit.cli", "profile", "-o", str(out), "--steps", f"4:{4 + iters}",
                        "--host", f"host{h}", *(["--ring"] if ring else []), "--",
                        py, str(ROOT / "examples/ddp/train.py"), "--model", "mlp",
                        "--iters", str(iters + 3 + after), "--warmup", "2", "--quiet", "--threads", "1",
                        "--bucket-mb", str(bucket_mb)]
                procs.append(c.run(h, argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        codes = [p.wait(timeout=timeout) for p in procs]
    if any(codes) or not (out / "manifest.json").exists():
        raise RuntimeError(f"profiled job failed: exit codes {codes}")
    return time.perf_counter() - t0


def replay_ms(ts) -> float:
    from dpro_kit.graph import build_global_dfg
    from dpro_kit.replay import replay
    g = build_global_dfg(ts)
    return replay(g, iterations=1).iteration_time_us / 1e3


def evaluate(trace: Path, seeds: list[int], work: Path, max_offset_us: float = 5000.0) -> dict:
    ts = load_trace(trace)
    nodes = ts.nodes()
    ref = nodes[0]
    hosts = sorted({ts.manifest.nodes[n].host for n in nodes})
    measured = ts.manifest.extra.get("measured_iteration_ms")
    base = align(ts)
    zero = {n: 0.0 for n in nodes}
    # the original trace on its true clocks (all namespaces share one clock: offsets 0), RECVs clipped
    out = {"trace": str(trace), "nodes": len(nodes), "hosts": len(hosts), "measured_ms": measured,
           "profiled_ms": ts.manifest.extra.get("profiled_iteration_ms"),
           "replay_original_ms": replay_ms(apply_offsets(ts, zero)),
           "unshifted_offsets_us": base.offsets_us, "seeds": []}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        hs = {h: float(rng.uniform(-max_offset_us, max_offset_us)) for h in hosts}
        shifts = {n: hs[ts.manifest.nodes[n].host] for n in nodes}
        truth = {n: shifts[n] - shifts[ref] for n in nodes}
        dst = work / f"{trace.name}-shift{seed}"
        if dst.exists():
            shutil.rmtree(dst)
        shift_trace_dir(trace, dst, shifts)
        t0 = time.perf_counter()
        res = align(load_trace(dst))
        wall = time.perf_counter() - t0
        err = {n: res.offsets_us[n] - truth[n] for n in nodes if n != ref}
        shifted = load_trace(dst)
        out["seeds"].append({
            "seed": seed, "injected_us": {n: round(v, 1) for n, v in truth.items()},
            "estimated_us": res.offsets_us, "error_us": {n: round(v, 1) for n, v in err.items()},
            "median_abs_error_us": float(np.median(np.abs(list(err.values())))),
            "align_s": round(wall, 3), "mode": res.mode, "violated": len(res.violated),
            # no alignment: the shifted timestamps taken as they are (RECVs clipped on the wrong clocks)
            "replay_shifted_no_align_ms": replay_ms(apply_offsets(shifted, zero)),
            "replay_shifted_aligned_ms": replay_ms(aligned_traceset(shifted, dst)),
        })
    errs = [abs(e) for s in out["seeds"] for e in s["error_us"].values()]
    out["median_abs_error_us"] = float(np.median(errs)) if errs else None
    out["max_abs_error_us"] = float(np.max(errs)) if errs else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="+", default=["2x1:none:25", "2x2:none:25", "3x1:none:25", "2x2:1000:25"],
                    help="HOSTSxRANKS:RATE_MBIT|none:BUCKET_MB")
    ap.add_argument("--trace", type=Path, nargs="*", default=[], help="evaluate existing trace dirs instead")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--keep", type=Path, default=None, help="keep traces under this folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="dpro-align-acc-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    traces = list(args.trace)
    if not traces:
        if os.geteuid() != 0:
            print("needs root for the emulated cluster (or pass --trace DIR)", file=sys.stderr)
            return 2
        for spec in args.jobs:
            hp, rate, bucket, *flags = spec.split(":")
            h, r = (int(x) for x in hp.split("x"))
            d = work / (f"job-{h}x{r}-{rate}-{bucket}" + ("-ring" if "ring" in flags else ""))
            if d.exists():
                shutil.rmtree(d)
            wall = run_job(d, h, r, None if rate == "none" else float(rate), float(bucket), args.iters,
                           ring="ring" in flags)
            print(f"profiled {spec} in {wall:.1f} s -> {d}", file=sys.stderr)
            traces.append(d)
    for t in traces:
        results.append(evaluate(t, args.seeds, work))
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"{'trace':<34}{'nodes':>6}{'hosts':>6}{'median |err| us':>17}{'max |err| us':>14}"
              f"{'measured ms':>13}{'replay orig':>13}{'shift no-align':>16}{'shift aligned':>15}")
        for r in results:
            s0 = r["seeds"][0]
            print(f"{Path(r['trace']).name:<34}{r['nodes']:>6}{r['hosts']:>6}{r['median_abs_error_us']:>17.1f}"
                  f"{r['max_abs_error_us']:>14.1f}{(r['measured_ms'] or float('nan')):>13.3f}"
                  f"{r['replay_original_ms']:>13.3f}{s0['replay_shifted_no_align_ms']:>16.3f}"
                  f"{s0['replay_shifted_aligned_ms']:>15.3f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
