"""Asynchronous-PS throughput for W workers predicted from a 1-worker MXNet trace (issue 13, docs/async.md).

Takes the measurements and kept traces of a ``bench/ps_accuracy.py --kvstore dist_async --workers 1,2,...``
run (real MXNet 1.9.1 jobs, one role per emulated host): for every link rate and round, the 1-worker
job's profile goes through ``dpro async-predict`` (calibrated on that run's own unprofiled steps,
``manifest.extra.measured_iteration_ms``), and each W's prediction is compared with the measured run
of the same round: steps/s of all workers together = sum over workers of 1 / (mean gap between its
Trainer steps after warm-up).

    python bench/ps_accuracy.py --kvstore dist_async --model mlp --servers 1 --workers 1,2,3,4 \\
        --rates 200,500 --rounds 2 --cpus-per-host 0.3 --cpu-period-ms 10 --json mlp.json --keep mlp
    python bench/async_mxnet.py --json mlp.json --keep mlp
    python bench/async_mxnet.py --json mlp.json --keep mlp --lockstep    # and the lockstep bound (docs/async.md)
    python bench/async_mxnet.py --json mlp.json --keep mlp --reverse-path window   # and with the equal-window rule
        # (dpro async-predict's default; the first predicted column is the paper's model, --reverse-path none)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def measured_steps_per_s(keep: Path, workers: int, rate: str, rnd: int, servers: int = 1) -> float | None:
    files = sorted(keep.glob(f"times-s{servers}-w{workers}-{rate}mbit-r{rnd}-m-w*.json"))
    if len(files) != workers:
        return None
    total = 0.0
    for f in files:
        gaps = json.loads(f.read_text())["iteration_ms"]
        total += 1e3 * len(gaps) / sum(gaps)
    return total


def predicted(trace: Path, rate: str, ws: list[int], seeds: int, reverse_path: str = "none",
              servers: int = 1) -> dict[int, float] | None:
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(trace), "--bandwidth", rate,
                        "--workers", ",".join(map(str, ws)), "--seeds", str(seeds), "--json",
                        "--reverse-path", reverse_path, "--ps", str(servers)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        print(f"  {trace}: {r.stderr.strip()}", flush=True)
        return None
    return {p["workers"]: p["steps_per_s"] for p in json.loads(r.stdout)["predicted"]}


def lockstep(trace: Path, rate: str, ws: list[int], servers: int = 1) -> dict[int, float]:
    """Steps/s if the W workers stayed in lockstep: every worker runs the mean profiled step, all start at 0
    (with equal sharing such a start stays in lockstep, docs/async.md), calibrated as async-predict is;
    ``servers``: the run's server count (each key on the server its trace shows, as ``--ps N``)."""
    import statistics as st
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpro_kit.async_ps import StepTemplate, calibrate, simulate, template_from_trace
    from dpro_kit.trace import load_trace
    tpl = template_from_trace(trace, num_ps=servers)
    mean = StepTemplate(ops=tpl.ops, samples=[[st.mean(s[i] for s in tpl.samples) for i in range(len(tpl.ops))]],
                        variables=tpl.variables)
    measured = 1e3 / float(load_trace(trace).manifest.extra["measured_iteration_ms"])
    cal = calibrate(tpl, measured, bandwidth_mbit=float(rate), num_ps=servers)
    return {w: simulate(mean, w, bandwidth_mbit=cal["bandwidth_mbit"], step_overhead_us=cal["step_overhead_us"],
                        num_ps=servers, steps=60, warmup=10, start_offsets_us=[0.0] * w).steps_per_s
            for w in ws}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="bench/ps_accuracy.py --json of a dist_async run with --workers 1,...")
    ap.add_argument("--keep", required=True, help="its --keep folder")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--servers", type=int, default=1, help="the run's server count (its files are s<N>-...; "
                    "dpro async-predict --ps N, each key on the server the trace shows)")
    ap.add_argument("--lockstep", action="store_true",
                    help="also the lockstep bound: the same model with every worker running the mean step from a "
                         "common start (equal sharing keeps them in lockstep; the real W=2 job stays near it)")
    ap.add_argument("--reverse-path", choices=["none", "window"], default="none",
                    help="also predict with `dpro async-predict --reverse-path window` (the equal-window rule)")
    args = ap.parse_args()
    doc = json.loads(Path(args.json).read_text())
    a = doc["args"]
    ws = sorted(int(w) for w in str(a["workers"]).split(","))
    rates = [str(r).replace(".0", "") for r in str(a["rates"]).split(",")]
    keep = Path(args.keep)
    rows = []
    for rate in rates:
        meas = {w: [] for w in ws}
        pred = {w: [] for w in ws}
        lock = {w: [] for w in ws}
        win = {w: [] for w in ws}
        for rnd in range(int(a["rounds"])):
            tr = keep / f"trace-s{args.servers}-w1-{rate}mbit-r{rnd}"
            p = predicted(tr, rate, ws, args.seeds, servers=args.servers)
            if args.lockstep and p is not None:
                for w, x in lockstep(tr, rate, ws, args.servers).items():
                    lock[w].append(x)
            pw = (predicted(tr, rate, ws, args.seeds, reverse_path="window", servers=args.servers)
                  if args.reverse_path == "window" else None)
            for w in ws:
                if pw is not None:
                    win[w].append(pw[w])
                m = measured_steps_per_s(keep, w, rate, rnd, args.servers)
                if m is not None:
                    meas[w].append(m)
                if p is not None:
                    pred[w].append(p[w])
        for w in ws:
            if meas[w] and pred[w]:
                m, p = statistics.median(meas[w]), statistics.median(pred[w])
                lk = statistics.median(lock[w]) if lock[w] else None
                wn = statistics.median(win[w]) if win[w] else None
                rows.append((rate, w, m, meas[w], p, pred[w], 100 * (p / m - 1), lk, wn))
    print("\n| Mbit/s | W | measured steps/s (rounds) | predicted, --reverse-path none (rounds) | error |"
          + (" lockstep bound | its error |" if args.lockstep else "")
          + (" with --reverse-path window | its error |" if args.reverse_path == "window" else ""))
    print("|---|---|---|---|---|" + ("---|---|" if args.lockstep else "")
          + ("---|---|" if args.reverse_path == "window" else ""))
    for rate, w, m, ms, p, ps, e, lk, wn in rows:
        print(f"| {rate} | {w} | {m:.2f} ({', '.join(f'{x:.2f}' for x in ms)}) | "
              f"{p:.2f} ({', '.join(f'{x:.2f}' for x in ps)}) | {e:+.1f} % |"
              + (f" {lk:.2f} | {100 * (lk / m - 1):+.1f} % |" if lk is not None else "")
              + (f" {wn:.2f} | {100 * (wn / m - 1):+.1f} % |" if wn is not None else ""))
    for name, col in (("--reverse-path none (the paper's model)", 4), ("with --reverse-path window", 8)):
        errs = [abs(100 * (r[col] / r[2] - 1)) for r in rows if r[1] > 1 and r[col] is not None]
        if errs:
            print(f"\nW > 1, {name}: median |error| {statistics.median(errs):.1f} %, max {max(errs):.1f} %, "
                  f"{sum(e <= 10 for e in errs)} of {len(errs)} rows within 10 %")


if __name__ == "__main__":
    main()
