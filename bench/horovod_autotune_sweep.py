#!/usr/bin/env python3
"""Horovod's autotuner as a measured knob sweep: every setting it sampled vs ``dpro replay``'s what-if.  (docs/horovod.md)

``HOROVOD_AUTOTUNE=1`` tries ~80 settings of cycle time x fusion threshold (and the response
cache, hierarchical allgather) in one run, a sample of ~50 iterations each, and writes one line
per sample to ``HOROVOD_AUTOTUNE_LOG``.  ``bench/horovod_ab.py --keep DIR`` keeps that log, every
run's per-iteration times (``train.py`` records the log's size every iteration, so each
iteration is known to belong to a sample) and the default-knob profile.  This script, on such a
folder, prints per sample: the setting, the measured iteration time (the slowest rank's median
over the sample's iterations), its ratio to the same round's default run, and the ratio
:func:`dpro_kit.optimize.horovod.evaluate` predicts from the profile (the knob grid's objective:
the mean over the profiled iterations); then the error of the predicted ratio against the
measured one, median and max.  Nothing is run: it re-reads what the A/B kept.

    python bench/horovod_ab.py --configs cnn-100 --rounds 2 --pin 0,1 --keep ab/   # under the bench lock
    python bench/horovod_autotune_sweep.py ab/ --config cnn-100                     # every autotune run kept
    python bench/horovod_autotune_sweep.py ab/ --config cnn-100 --json sweep.json

A sample's first iterations may still run the previous setting (the autotuner broadcasts a new
one with the next cycle's responses) and samples of fewer than ``--min-iters`` iterations are
left out.  The response cache and hierarchical allgather (2 hosts x 1 rank: no hierarchy) are
not what-if knobs: samples that differ only in them get the same prediction.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def samples(times: Path, log: Path, min_iters: int) -> list[dict]:
    """Per autotune sample (log line): its setting, score and the measured iterations that ran it."""
    doc = json.loads(times.read_text())
    sizes = doc["autotune_log_bytes"]
    lines = log.read_text().splitlines(keepends=True)
    ends, pos = [], 0
    for ln in lines:
        pos += len(ln.encode())
        ends.append(pos)
    per_rank = list(doc["iteration_times_s"].values())
    out, prev = [], None
    for k in range(1, len(lines)):
        done = next((i for i, s in enumerate(sizes) if s >= ends[k]), None)
        if done is None:
            break
        if prev is not None and done - prev >= min_iters:
            f = [x.strip() for x in lines[k].split(",")]
            ms = max(statistics.median(ts[prev + 1:done + 1]) for ts in per_rank) * 1e3
            out.append({"line": k, "first_iteration": prev + 1, "iterations": done - prev,
                        "cache": int(f[3]), "cycle_ms": float(f[4]), "threshold_mb": float(f[5]),
                        "score": float(f[6]), "measured_ms": ms})
        prev = done
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keep", help="a folder of bench/horovod_ab.py --keep")
    ap.add_argument("--config", required=True, help="MODEL-RATE, e.g. cnn-100")
    ap.add_argument("--min-iters", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from dpro_kit.jobs import job_iteration_ms
    from dpro_kit.optimize.horovod import evaluate
    from dpro_kit.session import Session
    from dpro_kit.trace import split_iterations
    keep, cfg = Path(args.keep), args.config
    s = Session(keep / f"T-{cfg}")
    its = list(split_iterations(s.trace).values())     # the grid's objective: every profiled iteration (optimize.horovod)
    total = sum(b for c in s.trace.collectives if not c.tensor.endswith("-negotiate") for b in c.param_bytes)
    cache: dict[tuple[int, float], float] = {}

    def predicted(threshold_mb: float, cycle_ms: float) -> float:
        # the autotuner's MB are 1e6 bytes (parameter_manager.cc); thresholds above every gradient fuse alike
        key = (min(int(threshold_mb * 1e6), total), round(cycle_ms, 3))
        if key not in cache:
            cache[key] = sum(evaluate(t, s.comm_model, key[0], key[1]) for t in its) / len(its)
        return cache[key]
    hv = s.trace.manifest.extra["horovod"]
    base = predicted(int(hv.get("fusion_threshold_bytes", 128 << 20)) / 1e6, float(hv.get("cycle_time_ms", 1.0)))
    rows, errs = [], []
    n = 0
    while (keep / f"times-{cfg}-autotune-{n}.json").exists():
        times, log = keep / f"times-{cfg}-autotune-{n}.json", keep / f"autotune-{cfg}-{n}.csv"
        default = keep / f"times-{cfg}-default-{n}.json"
        if not log.exists() or not default.exists():
            print(f"run {n}: no {log.name} or {default.name}; skipped")
            n += 1
            continue
        d_ms = job_iteration_ms(default)
        print(f"\n## {cfg}, autotune run {n}; default run of the same round {d_ms:.2f} ms; "
              f"predicted at the profiled knobs {base:.2f} ms")
        print("| sample | cycle ms | threshold MB | cache | iterations | measured ms | predicted ms | error "
              "| measured / default | predicted / default | error |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in samples(times, log, args.min_iters):
            p = predicted(r["threshold_mb"], r["cycle_ms"])
            r.update(run=n, default_ms=d_ms, predicted_ms=p, measured_ratio=r["measured_ms"] / d_ms,
                     predicted_ratio=p / base)
            r["error"] = r["predicted_ratio"] / r["measured_ratio"] - 1
            r["error_ms"] = p / r["measured_ms"] - 1
            errs.append(abs(r["error"]))
            rows.append(r)
            print(f"| {r['line']} | {r['cycle_ms']:.2f} | {r['threshold_mb']:.2f} | {r['cache']} | {r['iterations']} "
                  f"| {r['measured_ms']:.2f} | {p:.2f} | {100 * r['error_ms']:+.1f} % | {r['measured_ratio']:.3f} "
                  f"| {r['predicted_ratio']:.3f} | {100 * r['error']:+.1f} % |")
        n += 1
    if errs:
        for what, key in (("predicted ms vs measured ms", "error_ms"),
                          ("predicted vs measured ratio to the round's default run", "error")):
            a = [abs(r[key]) for r in rows]
            short = [abs(r[key]) for r in rows if r["cycle_ms"] <= 20]
            print(f"\n{len(a)} samples, |error| of {what}: median {100 * statistics.median(a):.1f} %, "
                  f"max {100 * max(a):.1f} %" + (f"; cycle <= 20 ms ({len(short)}): median "
                                                 f"{100 * statistics.median(short):.1f} %, max {100 * max(short):.1f} %"
                                                 if short else ""))
        best = min(rows, key=lambda r: r["measured_ratio"])
        print(f"fastest sample measured: cycle {best['cycle_ms']:.2f} ms, threshold {best['threshold_mb']:.2f} MB, "
              f"{best['measured_ratio']:.3f} of the default (predicted {best['predicted_ratio']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": cfg, "predicted_default_ms": base, "samples": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
