"""Profiled run vs plain runs, before and after the collector's window, for gpu_check.sh job folders.

Each folder (``bench/gpu_check.sh`` ``ddp_job``: ``train_times.json`` / ``train_times_after.json``
= the job without the profiler before / after, as in bench/gpu-traces; straight out of
gpu_check.sh's tarballs: the folder's siblings ``<job>-measured.json`` / ``<job>-measured2.json``;
``host*/<rank>/meta.json`` = the profiled run with
every iteration's wall time) gives one row, rank 0::

    python bench/gpu_outside_window.py bench/gpu-traces/h100-2026-11-27 examples/traces

*before*: the profiled run's iterations 1..START-1 (they include train.py's warm-up, which the
plain runs do not time); *after*: STOP+1..end (the window START..STOP-1 and STOP, which holds the
trace export, left out); *plain*: the median of each plain run's timed iterations.  ``cupti_teardown`` is ``meta.json``'s (missing: recorded before the field).
"""
from __future__ import annotations

import argparse
import json
import statistics as st
import sys
from pathlib import Path


def row(job: Path) -> dict | None:
    metas = sorted(job.glob("host*/0/meta.json")) or sorted(job.glob("*/0/meta.json"))
    plain = [job / f for f in ("train_times.json", "train_times_after.json") if (job / f).exists()] or \
        [p for p in (job.parent / f"{job.name}-measured.json", job.parent / f"{job.name}-measured2.json") if p.exists()]
    if not metas or not plain:
        return None
    meta = json.loads(metas[0].read_text())
    a, b = meta["window"]["start_step"], meta["window"]["stop_step"]
    dur = {r["step"]: r["dur_us"] / 1e3 for r in meta["steps"]}
    before = [d for k, d in dur.items() if 1 <= k < a]
    after = [d for k, d in dur.items() if k >= b + 1]
    plains = [st.median(json.loads(p.read_text())["iteration_times_s"]["0"]) * 1e3 for p in plain]
    return {"job": job.name, "before_ms": st.median(before) if before else None,
            "after_ms": st.median(after) if after else None, "plain_ms": plains,
            "cupti_teardown": meta.get("cupti_teardown", "missing")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="job folders, or folders holding job folders")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for f in map(Path, args.folders):
        if not f.is_dir():
            print(f"bench/gpu_outside_window.py: {f}: not a folder; give gpu_check.sh job folders", file=sys.stderr)
            return 2
        for job in [f] + sorted(p for p in f.iterdir() if p.is_dir()):
            r = row(job)
            if r:
                rows.append(r)
    if not rows:
        print("bench/gpu_outside_window.py: no job folder (host*/0/meta.json + train_times*.json) found", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| job | profiled, before window | profiled, after window | plain (before / after run) | after vs plain | cupti_teardown |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        p = st.median(r["plain_ms"])
        fmt = lambda x: "—" if x is None else f"{x:.2f} ms"  # noqa: E731
        rel = "—" if r["after_ms"] is None else f"{100 * (r['after_ms'] / p - 1):+.0f} %"
        print(f"| {r['job']} | {fmt(r['before_ms'])} | {fmt(r['after_ms'])} | "
              f"{' / '.join(f'{x:.2f}' for x in r['plain_ms'])} ms | {rel} | {r['cupti_teardown']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
