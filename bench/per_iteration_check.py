"""Mean-duration replay vs per-iteration-median replay on traces kept by bench/accuracy.py.

    python bench/accuracy.py --rounds 2 --json acc.json --keep acc-dir    # runs the real jobs
    python bench/per_iteration_check.py acc.json                           # re-replays their traces

For every replay row of ``acc.json`` it replays each kept trace twice through
:class:`dpro_kit.session.Session` (aligned, as `dpro replay`) — one global DFG of
mean op durations (dPRO §4.1, `dpro replay --mean-durations`) and one DFG per
profiled iteration with the median taken (`dpro replay`, the default) — and
prints both errors against the row's measured (unprofiled) median.
"""
from __future__ import annotations

import argparse
import json
import statistics

from dpro_kit.session import Session


def predictions(path: str) -> tuple[float, float]:
    """(mean-duration, per-iteration-median) predicted iteration times (ms) of one trace, one iteration replayed."""
    mean = Session(path, per_iteration=False).iteration_time_ms()
    per = Session(path, per_iteration=True).iteration_time_ms()
    return mean, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="the --json file of bench/accuracy.py (run with --keep)")
    a = ap.parse_args()
    rows = [r for r in json.load(open(a.results))["rows"] if r.get("kind") == "replay"]
    print("| config | measured ms | mean-duration ms | error % | per-iteration median ms | error % |")
    print("|---|---:|---:|---:|---:|---:|")
    e_mean, e_per = [], []
    for r in rows:
        preds = [predictions(t) for t in r["traces"]]
        m = r["measured_ms"]
        pm = statistics.median(p[0] for p in preds)
        pp = statistics.median(p[1] for p in preds)
        e_mean.append(100 * (pm - m) / m)
        e_per.append(100 * (pp - m) / m)
        print(f"| {r['config']} | {m:.2f} | {pm:.2f} | {e_mean[-1]:+.1f} | {pp:.2f} | {e_per[-1]:+.1f} |", flush=True)
    for label, e in (("mean durations", e_mean), ("per-iteration median", e_per)):
        ab = [abs(x) for x in e]
        print(f"{label}: median |error| {statistics.median(ab):.1f} %, max {max(ab):.1f} % ({len(ab)} configurations)")


if __name__ == "__main__":
    main()
