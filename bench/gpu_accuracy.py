#!/usr/bin/env python3
"""Replay accuracy on real GPU jobs recorded by ``bench/gpu_check.sh`` (docs/accuracy.md, "On a GPU").

For every trace folder under the given directories that holds ``train_times.json`` and
``train_times_after.json`` (the same job without the profiler, run just before and just after the
profiled run; ``examples/ddp/train.py --json-out``), this runs ``dpro replay FOLDER --json`` with the
code of this checkout and prints one row: measured (slowest rank's median iteration, before /
after), the replay, its error against each and against their mean, and ``error_pct`` (the replay
against the profiled run's own unprofiled iterations, as ``dpro replay`` reports it).

No job runs here: the GPU jobs were run on a lent H100 (see each folder's README or
bench/gpu-traces/*/README.md); this judges the reader and replayer on those recordings.

    python bench/gpu_accuracy.py                                   # the recorded folders
    python bench/gpu_accuracy.py examples/traces bench/gpu-traces/h100-2026-11-27 --json rows.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [REPO / "examples" / "traces", REPO / "bench" / "gpu-traces" / "h100-2026-11-27"]


def measured_ms(path: Path) -> float:
    doc = json.loads(path.read_text())
    return 1e3 * float(doc.get("median_slowest_rank_iteration_s") or doc["median_iteration_s"])


def row(folder: Path) -> dict:
    before, after = measured_ms(folder / "train_times.json"), measured_ms(folder / "train_times_after.json")
    out = subprocess.run([sys.executable, "-m", "dpro_kit", "replay", str(folder), "--json"], capture_output=True,
                         text=True, cwd=REPO, timeout=900)
    if out.returncode != 0:
        return {"trace": folder.name, "before_ms": before, "after_ms": after,
                "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    res = json.loads(out.stdout)
    pred = float(res["iteration_time_ms"])
    mean = (before + after) / 2
    return {"trace": folder.name, "before_ms": before, "after_ms": after, "replay_ms": pred,
            "err_before_pct": 100 * (pred - before) / before, "err_after_pct": 100 * (pred - after) / after,
            "err_mean_pct": 100 * (pred - mean) / mean, "error_pct_in_run": res.get("error_pct"),
            "warnings": len(res.get("warnings", []))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="directories whose sub-folders are GPU traces (default: the "
                   "recorded ones)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    folders = [f for d in (args.dirs or DEFAULT) for f in sorted(Path(d).iterdir())
               if (f / "train_times.json").is_file() and (f / "train_times_after.json").is_file()]
    if not folders:
        print("no folder with train_times.json and train_times_after.json found", file=sys.stderr)
        return 2
    rows = []
    print(f"{'trace':32s} {'measured before/after ms':>26s} {'replay ms':>10s} {'err vs mean':>12s} "
          f"{'(before, after)':>17s} {'in-run':>8s}")
    for f in folders:
        r = row(f)
        rows.append(r)
        if "error" in r:
            print(f"{r['trace']:32s} {r['before_ms']:12.3f} / {r['after_ms']:<11.3f} replay failed: {r['error']}")
            continue
        inrun = f"{r['error_pct_in_run']:+.1f} %" if r["error_pct_in_run"] is not None else "-"
        print(f"{r['trace']:32s} {r['before_ms']:12.3f} / {r['after_ms']:<11.3f} {r['replay_ms']:10.3f} "
              f"{r['err_mean_pct']:+10.1f} % ({r['err_before_pct']:+.1f}, {r['err_after_pct']:+.1f}) {inrun:>8s}")
    ok = [abs(r["err_mean_pct"]) for r in rows if "err_mean_pct" in r]
    if ok:
        print(f"\n|error vs mean of before/after|: median {statistics.median(ok):.1f} %, max {max(ok):.1f} % "
              f"over {len(ok)} traces")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
