#!/usr/bin/env python3
"""Injected-offset experiment: does `dpro align` recover known clock offsets of REAL traces?

    sudo /work/venv/bin/python bench/align_accuracy.py                       # default job matrix
    sudo /work/venv/bin/python bench/align_accuracy.py --jobs 2x1:none:25 --seeds 1 2 3
    sudo .venv/bin/python bench/align_accuracy.py --jobs 2x1:200:1 2x2:1000:1 --iters 30 --inject 0 5000 -5000
    /work/venv/bin/python bench/align_accuracy.py --trace DIR --seeds 1 2    # an existing trace dir

Per job: run ``examples/ddp/train.py --model mlp`` (gloo, CPU) under ``dpro profile`` in an
:class:`~dpro_kit.cluster.EmulatedCluster` (``HOSTSxRANKS:RATE_MBIT|none:BUCKET_MB``; every
rank gets its host's ``DPRO_HOST``).  All namespaces share one clock, so the true offsets are 0.
``:ring`` after a job spec profiles with ``dpro profile --ring`` (per-chunk SEND/RECV times
from the timed ring comm hook) instead of gloo's opaque collectives.
With ``--inject 0 5000 -5000`` (the recovery table of docs/alignment.md): per job and value v, the
raw files of every non-reference host k are rewritten as if its clock were off by ``v * (-1)**(k+1)``
us (:func:`shift_raw_trace`: the Kineto ``baseTimeNanoseconds`` and every wall-clock reading in
``meta.json``, which the reader checks Kineto against); the table gives the error of each offset
`dpro align` determines, and for the ones it reports UNDETERMINED, the estimate's error and the
interval it proves (and whether the truth lies in it).
Otherwise, per seed: every host gets a random offset (uniform +-5 ms, the same for all ranks of the
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

from dpro_kit.align import align, aligned_traceset, apply_offsets, shift_probe_readings, shift_trace_dir  # noqa: E402
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


def _shift_ns_fields(x, d_ns: int):
    """Every wall-clock reading (an int field whose name has ``_ns``, holding ns since the epoch) moved by d_ns."""
    if isinstance(x, dict):
        return {k: (v + d_ns if "_ns" in k and isinstance(v, int) and v > 10 ** 15 else _shift_ns_fields(v, d_ns))
                for k, v in x.items()}
    if isinstance(x, list):
        return [_shift_ns_fields(v, d_ns) for v in x]
    return x


def shift_raw_trace(src: Path, dst: Path, shifts_us: dict[str, float]) -> Path:
    """Copy a dpro_torch trace folder with the clock of each host in ``shifts_us`` (host -> us) off.

    Shifts everything such a host records: the Kineto trace's ``baseTimeNanoseconds`` and every
    wall-clock reading in its ``meta.json`` (``clock.sync`` brackets the reader checks Kineto
    against, step end times) and in a ``--ring`` file.  The copy is loaded by the ordinary
    reader, so the shift goes through the same clock mapping a wrong host clock would.
    """
    import gzip
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("aligned"))
    man = json.loads((dst / "manifest.json").read_text())
    for info in man["nodes"].values():
        d_ns = round(shifts_us.get(info["host"], 0.0) * 1000)
        if not d_ns:
            continue
        nd = dst / info["dir"]
        meta = json.loads((nd / "meta.json").read_text())
        for name in (meta.get("trace_file"), meta.get("ring_file")):
            if not name:
                continue
            f = nd / name
            op = gzip.open if f.suffix == ".gz" else open
            with op(f, "rt", encoding="utf-8") as fh:
                doc = json.load(fh)
            if isinstance(doc, dict) and "baseTimeNanoseconds" in doc:
                doc["baseTimeNanoseconds"] = int(doc["baseTimeNanoseconds"]) + d_ns
            else:
                doc = _shift_ns_fields(doc, d_ns)
            with op(f, "wt", encoding="utf-8") as fh:
                json.dump(doc, fh)
        meta = _shift_ns_fields(meta, d_ns)
        probe = meta.get("clock_probe")
        if isinstance(probe, dict):   # the clock probe's readings (lists of ns, no field names)
            meta["clock_probe"] = shift_probe_readings({"n": probe}, {"n": d_ns / 1000})["n"]
        (nd / "meta.json").write_text(json.dumps(meta))
    probes = man.get("extra", {}).get("clock_probe")
    if isinstance(probes, dict):      # the manifest's copy of every node's probe readings
        man["extra"]["clock_probe"] = shift_probe_readings(
            probes, {n: shifts_us.get(info["host"], 0.0) for n, info in man["nodes"].items()})
        (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def without_probe(ts):
    """``ts`` as if the collector had not probed the clocks (collective-level information only)."""
    from dataclasses import replace
    extra = {k: v for k, v in ts.manifest.extra.items() if k != "clock_probe"}
    return replace(ts, manifest=replace(ts.manifest, extra=extra))


def recovery(trace: Path, injections: list[float], work: Path) -> list[dict]:
    """Offsets recovered from ``trace`` with the clocks of its non-reference hosts moved by +-v us
    (host k gets ``v * (-1)**(k+1)``: +v, -v, +v, ...) for each v in ``injections`` (0: true offsets)."""
    ts = load_trace(trace)
    nodes = ts.nodes()
    ref = nodes[0]
    hosts = sorted({ts.manifest.nodes[n].host for n in nodes}, key=lambda h: min(
        ts.manifest.nodes[n].rank for n in nodes if ts.manifest.nodes[n].host == h))
    rows = []
    for v in injections:
        hs = {h: (0.0 if k == 0 else v * (-1) ** (k + 1)) for k, h in enumerate(hosts)}
        dst = shift_raw_trace(trace, work / "shifted" / f"{trace.name}-inj{int(v)}", hs) if v else trace
        t0 = time.perf_counter()
        loaded = load_trace(dst)
        res = align(loaded)
        wall = time.perf_counter() - t0
        truth = {n: hs[ts.manifest.nodes[n].host] - hs[ts.manifest.nodes[ref].host] for n in nodes}
        other = [n for n in nodes if ts.manifest.nodes[n].host != ts.manifest.nodes[ref].host]
        err = {n: res.estimate_us.get(n, res.offsets_us[n]) - truth[n] for n in other}
        nop = align(without_probe(loaded)) if res.probe_us else None
        rows.append({"trace": trace.name, "injected_us": v, "mode": res.mode, "align_s": round(wall, 3),
                     # the same trace aligned from its collectives only (as plain torch.profiler input would be)
                     "error_no_probe_us": ({n: nop.estimate_us.get(n, nop.offsets_us[n]) - truth[n] for n in other}
                                           if nop else None),
                     "probe_rtt_min_us": {n: res.probe_us[n].get("rtt_min_us") for n in other if n in res.probe_us},
                     "error_us": err, "undetermined": [n for n in res.undetermined if n in other],
                     "uncertainty_us": res.uncertainty_us,
                     "bounds_us": {n: res.bounds_us.get(n) for n in other},
                     "bounds_hold": all((b[0] is None or b[0] - 1 <= truth[n]) and (b[1] is None or truth[n] <= b[1] + 1)
                                        for n in other if (b := res.bounds_us.get(n))),
                     "violated": len(res.violated)})
    return rows


def print_recovery(rows: list[dict]) -> None:
    print(f"{'trace':<24}{'inject us':>10}{'mode':>8}{'determined |err| us (median/max)':>34}"
          f"{'undetermined: estimate err us (+- 95 % bound) in proven interval us':>72}{'bounds hold':>12}")
    for r in rows:
        det = [abs(e) for n, e in r["error_us"].items() if n not in r["undetermined"]]
        und = "; ".join(f"{n} {r['error_us'][n]:+.0f} (+-{r['uncertainty_us'].get(n, float('nan')):.0f}) in "
                        f"[{_b(r['bounds_us'][n], 0)}, {_b(r['bounds_us'][n], 1)}]" for n in r["undetermined"])
        print(f"{r['trace']:<24}{r['injected_us']:>+10.0f}{r['mode']:>8}"
              f"{(f'{np.median(det):.1f} / {np.max(det):.1f} (n={len(det)})' if det else '-'):>34}"
              f"{und or '-':>72}{str(r['bounds_hold']):>12}")
    det = [abs(e) for r in rows for n, e in r["error_us"].items() if n not in r["undetermined"]]
    n_und = sum(len(r["undetermined"]) for r in rows)
    n_all = sum(len(r["error_us"]) for r in rows)
    print(f"all: {n_all - n_und} determined offsets, median |err| {np.median(det) if det else float('nan'):.1f} us, "
          f"max {np.max(det) if det else float('nan'):.1f} us; {n_und} undetermined")
    nop = [abs(e) for r in rows if r.get("error_no_probe_us") for e in r["error_no_probe_us"].values()]
    if nop:
        print(f"the same traces from their collectives only (clock probe removed): median |err| {np.median(nop):.1f} us, "
              f"max {np.max(nop):.1f} us over {len(nop)} offsets")
    est = [abs(e) for r in rows for e in r["error_us"].values()]
    print(f"best estimates of all {n_all} offsets (undetermined ones included): median |err| {np.median(est):.1f} us, "
          f"max {np.max(est):.1f} us; proven intervals hold the truth in {sum(r['bounds_hold'] for r in rows)}"
          f"/{len(rows)} cases")


def _b(b, i):
    return "-inf" if b is None or b[i] is None and i == 0 else ("+inf" if b is None or b[i] is None else f"{b[i]:.0f}")


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
    measured = ts.manifest.facts.measured_iteration_ms
    base = align(ts)
    zero = {n: 0.0 for n in nodes}
    # the original trace on its true clocks (all namespaces share one clock: offsets 0), RECVs clipped
    out = {"trace": str(trace), "nodes": len(nodes), "hosts": len(hosts), "measured_ms": measured,
           "profiled_ms": ts.manifest.facts.profiled_iteration_ms,
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
    ap.add_argument("--inject", type=float, nargs="+", default=None, metavar="US",
                    help="recovery table instead: per job, the non-reference hosts' clocks moved by +-US "
                         "(0: true offsets) in the RAW files (Kineto base time and meta.json wall clock)")
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
    if args.inject is not None:
        rows = [r for t in traces for r in recovery(t, args.inject, work)]
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print_recovery(rows)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
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
