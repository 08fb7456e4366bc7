"""What the straggler bench's kept profiles say, per rank: computation, CPU, stops (docs/stragglers.md).

No jobs: reads the traces (and the collector's ``extra.cpu_use``) of profiled jobs and prints, per
trace and worker, the traced computation per iteration (mean over the profiled iterations), in how
many iterations that rank computed the longest, the sum of its per-op medians, its CPU time per
step (``cpu_use.cpus`` x the node's measured step), the time its cgroup's quota stopped it per
step (``throttled_us``), its quota, and CPU per traced computation (below 1: the rank's ops took
longer than the CPU it got, e.g. waiting for a core shared with other ranks).

    python bench/straggler_traces.py /tmp/strag-h3/001-cnn-prof/trace /tmp/strag-h3/016-cnn-prof/trace
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def summarize(trace: str) -> list[dict[str, Any]]:
    from dpro_kit.job import JobFacts
    from dpro_kit.session import Session
    from dpro_kit.whatif import COMPUTE_KINDS
    s = Session(trace)
    ts = s.profiled
    ev = ts.events
    comp = ev[ev["kind"].astype(str).isin(COMPUTE_KINDS)]
    node = comp["node"].astype(str)
    per_it = comp.groupby([comp["iteration"], node], observed=True)["dur"].sum().unstack() / 1e3
    slowest = per_it.idxmax(axis=1).value_counts()
    op_med = comp.groupby([node, comp["op"]], observed=True)["dur"].median().groupby(level=0).sum() / 1e3
    facts = JobFacts.from_manifest(ts.manifest)
    rows = []
    for n, info in sorted(ts.manifest.nodes.items()):
        if info.role != "worker":
            continue
        u = facts.cpu_use.get(n) or {}
        step = facts.measured_iteration_ms_per_node.get(n)
        cpu_ms = u["cpus"] * step if u.get("cpus") is not None and step else None
        c = float(per_it[n].mean()) if n in per_it else 0.0
        rows.append({"trace": trace, "node": n, "compute_ms": round(c, 2),
                     "slowest_in": f"{int(slowest.get(n, 0))}/{len(per_it)}",
                     "op_median_sum_ms": round(float(op_med.get(n, 0.0)), 2),
                     "step_ms": round(step, 2) if step else None,
                     "cpu_ms_per_step": round(cpu_ms, 2) if cpu_ms is not None else None,
                     "throttled_ms": round(u["throttled_us"] / 1e3, 2) if u.get("throttled_us") is not None else None,
                     "limit_cpus": u.get("limit_cpus"),
                     "cpu_per_compute": round(cpu_ms / c, 3) if cpu_ms is not None and c > 0 else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [r for t in a.traces for r in summarize(t)]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = ["trace", "node", "compute_ms", "slowest_in", "op_median_sum_ms", "step_ms", "cpu_ms_per_step",
            "throttled_ms", "limit_cpus", "cpu_per_compute"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
