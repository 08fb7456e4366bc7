#!/usr/bin/env python3
"""The CFS quota model (``dpro_kit.whatif.cfs_schedule``) against a real thread in a real cgroup.

A single thread alternates W ms of CPU work (its own thread CPU time) and a G ms sleep, for 2 s,
in a cgroup v1 ``cpu`` group (``dpro_kit.jobs.CpuBudget``, 10 ms period) with 1.0 CPU and with
each cut quota, alternating (unlimited, cut, unlimited); measured: the mean cycle time at the cut /
at 1.0 CPU.  Model: ``cfs_schedule`` of 40 cycles at the nominal quota, averaged over 8 period
phases, and a plain compute factor (the work x 1/cpus, the sleep unchanged) for comparison.

    python bench/cfs_model.py --cycles 15:5,8:12,4:6 --cpus 0.8,0.667,0.5 --reps 2

Needs root (cgroups).  docs/stragglers.md ("Fourth run") has the numbers.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = """
import sys, time
W, G, secs = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, float(sys.argv[3])
end = time.perf_counter() + secs; n = 0; t0 = time.perf_counter()
while time.perf_counter() < end:
    c = time.thread_time()
    while time.thread_time() - c < W:
        pass
    time.sleep(G)
    n += 1
print((time.perf_counter() - t0) / n * 1e3)
"""


def cycle_ms(w: float, g: float, cpus: float, period_us: int, secs: float) -> float:
    from dpro_kit.jobs import CpuBudget
    with CpuBudget(1, [cpus], prefix="cfsm", period_us=period_us, shares=8192) as cb:
        p = subprocess.run([sys.executable, "-c", CHILD, str(w), str(g), str(secs)], capture_output=True, text=True,
                           preexec_fn=cb.preexec(0), timeout=60)
    return float(p.stdout)


def model_ms(w: float, g: float, cpus: float, period_us: int, cycles: int = 40, phases: int = 8) -> float:
    from dpro_kit.whatif import cfs_schedule
    ops = [(g * 1e3 if i else 0.0, w * 1e3) for i in range(cycles)]
    out = []
    for j in range(phases):
        _, e, _ = cfs_schedule(ops, cpus * period_us, period_us, phase_us=period_us * j / phases)
        out.append((e[-1] - e[9]) / (cycles - 10) / 1e3)
    return statistics.mean(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", default="15:5,8:12,4:6", help="W:G pairs (ms of work : ms of sleep)")
    ap.add_argument("--cpus", default="0.8,0.667,0.5", help="cut quotas (CPUs)")
    ap.add_argument("--period-us", type=int, default=10000)
    ap.add_argument("--secs", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    t0 = time.time()
    print("| W ms | G ms | quota CPUs | measured x (per rep) | CFS model x | error | compute factor x | error |")
    print("|---|---|---|---|---|---|---|---|")
    errs, ferrs = [], []
    for pair in a.cycles.split(","):
        w, g = (float(x) for x in pair.split(":"))
        for c in (float(x) for x in a.cpus.split(",")):
            xs = []
            for _ in range(a.reps):
                b1 = cycle_ms(w, g, 1.0, a.period_us, a.secs)
                m = cycle_ms(w, g, c, a.period_us, a.secs)
                b2 = cycle_ms(w, g, 1.0, a.period_us, a.secs)
                xs.append(m / (0.5 * (b1 + b2)))
            meas = statistics.median(xs)
            mod = model_ms(w, g, c, a.period_us) / (w + g)
            fac = (w / c + g) / (w + g)
            errs.append(abs(mod / meas - 1))
            ferrs.append(abs(fac / meas - 1))
            print(f"| {w:g} | {g:g} | {c:g} | {meas:.3f} ({', '.join(f'{x:.3f}' for x in xs)}) | {mod:.3f} | "
                  f"{100 * (mod / meas - 1):+.1f} % | {fac:.3f} | {100 * (fac / meas - 1):+.1f} % |", flush=True)
    print(f"\n|error| CFS model: median {100 * statistics.median(errs):.1f} %, max {100 * max(errs):.1f} %; "
          f"compute factor: median {100 * statistics.median(ferrs):.1f} %, max {100 * max(ferrs):.1f} % "
          f"({len(errs)} rows, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
