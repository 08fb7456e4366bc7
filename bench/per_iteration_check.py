"""Mean-duration replay vs per-iteration-median replay on traces kept by bench/accuracy.py.

    python bench/accuracy.py --rounds 2 --json acc.json --keep acc-dir    # runs the real jobs
    python bench/per_iteration_check.py acc.json                           # re-replays their traces

For every replay row of ``acc.json`` it replays each kept trace twice — one
global DFG of mean op durations (dPRO's default, `dpro replay`) and one DFG per
profiled iteration with the median taken (`dpro replay --per-iteration`) — and
prints both errors against the row's measured (unprofiled) median.
"""
from __future__ import annotations

import argparse
import json
import statistics

from dpro_kit.costmodel import fit_from_trace
from dpro_kit.graph import build_global_dfg
from dpro_kit.replay import replay
from dpro_kit.trace import load_trace, select_iterations


def predictions(path: str) -> tuple[float, float]:
    ts = load_trace(path)
    model = fit_from_trace(ts)
    mean = replay(build_global_dfg(ts, comm_model=model)).iteration_time_us / 1e3
    per = [replay(build_global_dfg(select_iterations(ts, [it]), comm_model=model)).iteration_time_us / 1e3
           for it in sorted(ts.events["iteration"].unique())]
    return mean, statistics.median_low(per)


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
