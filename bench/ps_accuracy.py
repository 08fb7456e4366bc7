#!/usr/bin/env python3
"""How well does dpro predict real MXNet parameter-server training?  (docs/ps.md)

For every configuration (servers x workers x link rate) the REAL job of
``examples/mxnet/train.py`` (MXNet 1.9.1, Gluon MLP or CNN, ``dist_sync`` or ``--kvstore dist_async``) runs with one role per
emulated host (network namespaces + tbf at R Mbit/s per host link, a CPU budget per host),
launched by ``dpro_kit.jobs.run_job``; alternating, per round:

1. **measured**: without the profiler; the slowest worker's median gap between Trainer steps
   after warm-up (``train.py --json-out``);
2. **profiled**: the same job under ``dpro profile --framework mxnet`` (one per host), then
   the Session's prediction (``dpro replay``'s number).

Error = predicted / measured - 1 (medians over rounds). What-if rows predict configuration B
from the trace of configuration A (``--world-size``, ``--servers``, ``--bandwidth-mbps``) and
compare with B's measured time.

    python bench/ps_accuracy.py                         # default matrix
    python bench/ps_accuracy.py --rounds 1 --rates 500 --json rows.json --keep traces/
    python bench/ps_accuracy.py --repredict rows.json --whatifs   # same measurements and traces, this code
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpro_kit.jobs import run_job  # noqa: E402

TRAIN = ROOT / "examples" / "mxnet" / "train.py"


def mxnet_python() -> str:
    import os
    for c in (os.environ.get("DPRO_MXNET_PYTHON", ""), str(Path.home() / ".cache/dpro-kit/mxnet-venv/bin/python")):
        if c and Path(c).exists():
            return c
    sys.exit("no MXNet 1.9.1 Python: run `make mxnet` or set DPRO_MXNET_PYTHON")


def run(args, work: Path, servers: int, workers: int, rate: float, *, profile: Path | None, tag: str) -> float | None:
    """One job; the measured iteration time (ms) of its json-out, or None when it failed."""
    out = work / f"times-{tag}-w{{w}}.json"
    steps = args.steps if profile is None else args.prof_start + args.prof_steps + 8
    argv = [mxnet_python(), str(TRAIN), "--kvstore", args.kvstore, "--servers", str(servers), "--workers", str(workers),
            "--model", args.model,
            "--batch", str(args.batch), "--steps", str(steps), "--warmup", str(args.warmup), "--json-out", str(out)]
    with open(work / "jobs.log", "a") as log:
        log.write(f"=== {tag}\n")
        log.flush()
        r = run_job(argv, hosts=servers + workers, ranks_per_host=None, rate_mbit=rate,
                    cpus_per_host=(args.cpus_per_host if args.server_cpus is None else
                                   [args.server_cpus] * servers + [args.cpus_per_host] * workers),
                    cpu_period_us=int(args.cpu_period_ms * 1000),
                    profile=profile, log=log,
                    steps=f"{args.prof_start}:{args.prof_start + args.prof_steps}",
                    profile_flags=["--framework", "mxnet"], timeout=args.job_timeout, prefix=args.prefix)
    if not r.ok:
        print(f"  {tag}: job failed {r.codes} (see {work / 'jobs.log'})", file=sys.stderr)
        return None
    meds = []
    for w in range(workers):
        p = Path(str(out).replace("{w}", str(w)))
        if p.exists():
            meds.append(statistics.median(json.loads(p.read_text())["iteration_ms"]))
    return max(meds) if len(meds) == workers else None


def _own_steps_ms(trace: str) -> float | None:
    """The profiled job's median unprofiled step (``manifest.extra.measured_iteration_ms``), or None."""
    try:
        return float(json.loads((Path(trace) / "manifest.json").read_text())["extra"]["measured_iteration_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def predict(trace: Path, **whatif) -> float:
    from dpro_kit.session import Session
    from dpro_kit.whatif import WhatIf
    return Session(str(trace), whatif=WhatIf(**whatif)).iteration_time_ms()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--workers", default="2,3")
    ap.add_argument("--rates", default="200,500", help="Mbit/s per host link")
    ap.add_argument("--model", default="mlp", help="examples/mxnet/train.py --model (mlp, cnn)")
    ap.add_argument("--kvstore", default="dist_sync", choices=["dist_sync", "dist_async"],
                    help="dist_async: every worker at its own pace; measured = the slowest worker's median step gap")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--prof-start", type=int, default=8)
    ap.add_argument("--prof-steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cpus-per-host", type=float, default=0.4)
    ap.add_argument("--server-cpus", type=float, default=None,
                    help="CPU budget of the server hosts (host 0 also runs the scheduler; default: --cpus-per-host)")
    ap.add_argument("--cpu-period-ms", type=float, default=100.0,
                    help="CFS period of the per-host CPU budget (dpro_kit.jobs.CpuBudget; the kernel's 100 ms by default)")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--prefix", default="mxnetbench", help="name prefix of the emulated hosts' namespaces and cgroups")
    ap.add_argument("--whatifs", action="store_true", help="also predict every other configuration from each trace")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="folder to keep the traces in")
    ap.add_argument("--repredict", default="", help="a previous --json: its measurements and kept traces, "
                                                    "predicted again with this checkout's code (runs no job)")
    args = ap.parse_args()
    if args.repredict:
        doc = json.loads(Path(args.repredict).read_text())
        rows = {}
        for t in doc["raw"]:
            preds = []
            for tr in t["trace"]:
                try:
                    preds.append(predict(Path(tr)) if (Path(tr) / "manifest.json").exists() else None)
                except Exception as exc:
                    print(f"  {tr}: prediction failed: {exc}", file=sys.stderr)
                    preds.append(None)
            rows[(t["servers"], t["workers"], t["rate_mbit"])] = {"measured": t["measured"], "predicted": preds,
                                                                  "trace": t["trace"]}
        configs = list(rows)
        return report(args, rows, configs)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ps-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    configs = [(s, w, float(r)) for r in args.rates.split(",") for s in map(int, args.servers.split(","))
               for w in map(int, args.workers.split(","))]
    rows = {c: {"measured": [], "predicted": [], "trace": []} for c in configs}
    for rnd in range(args.rounds):
        for (s, w, r) in configs:
            tag = f"s{s}-w{w}-{r:g}mbit-r{rnd}"
            m = run(args, work, s, w, r, profile=None, tag=tag + "-m")
            trace = work / f"trace-{tag}"
            shutil.rmtree(trace, ignore_errors=True)
            run(args, work, s, w, r, profile=trace, tag=tag + "-p")
            p = None
            if (trace / "manifest.json").exists():
                try:
                    p = predict(trace)
                except Exception as exc:  # a row that cannot be predicted is reported, not hidden
                    print(f"  {tag}: prediction failed: {exc}", file=sys.stderr)
            rows[(s, w, r)]["measured"].append(m)
            rows[(s, w, r)]["predicted"].append(p)
            rows[(s, w, r)]["trace"].append(str(trace))
            print(f"{tag}: measured {m} ms, predicted {p} ms", flush=True)
        if rnd + 1 < args.rounds:   # the tables (and --json) so far: a run stopped later keeps its finished rounds
            report(args, rows, configs)
    return report(args, rows, configs)


def report(args, rows: dict, configs: list) -> int:
    """Print (and with --json write) the accuracy table and the what-if rows."""
    table, errs = [], []
    for (s, w, r), d in rows.items():
        ms = [x for x in d["measured"] if x]
        ps = [x for x in d["predicted"] if x]
        m, p = (statistics.median(ms) if ms else None), (statistics.median(ps) if ps else None)
        e = (p / m - 1) * 100 if m and p else None
        if e is not None:
            errs.append(abs(e))
        # the profiled job's own unprofiled steps: the replay's error against the job it traced, apart from
        # how far that job ran from the separate measured one (a loaded machine, a starved host)
        own = [x for x in map(_own_steps_ms, d["trace"]) if x]
        o = statistics.median(own) if own else None
        table.append({"servers": s, "workers": w, "rate_mbit": r, "measured_ms": m, "predicted_ms": p, "error_pct": e,
                      "profiled_job_ms": o, "error_vs_profiled_job_pct": (p / o - 1) * 100 if o and p else None})
    whatif_rows = []
    if args.whatifs:
        meas = {c: (statistics.median([x for x in d["measured"] if x]) if any(d["measured"]) else None)
                for c, d in rows.items()}
        for (s, w, r), d in rows.items():
            trace = Path(d["trace"][-1])
            if not (trace / "manifest.json").exists():
                continue
            for (s2, w2, r2) in configs:
                if (s2, w2, r2) == (s, w, r) or sum([s2 != s, w2 != w, r2 != r]) != 1 or not meas[(s2, w2, r2)]:
                    continue
                kw = {}
                if w2 != w:
                    kw["world_size"] = w2
                if r2 != r:
                    kw["bandwidth_mbps"] = r2
                if s2 != s:
                    kw["servers"] = s2
                try:
                    p = predict(trace, **kw)
                except Exception as exc:
                    print(f"  what-if {kw} from {trace.name}: {exc}", file=sys.stderr)
                    continue
                m = meas[(s2, w2, r2)]
                whatif_rows.append({"from": [s, w, r], "to": [s2, w2, r2], "whatif": kw, "measured_ms": m,
                                    "predicted_ms": p, "error_pct": (p / m - 1) * 100})
    print("\n| servers | workers | Mbit/s | measured ms | predicted ms | error | profiled job's own unprofiled steps, ms "
          "| error vs them |\n|---|---|---|---|---|---|---|---|")
    for t in table:
        f = (lambda x: f"{x:.1f}" if x is not None else "-")
        print(f"| {t['servers']} | {t['workers']} | {t['rate_mbit']:g} | {f(t['measured_ms'])} | "
              f"{f(t['predicted_ms'])} | {f(t['error_pct'])} % | {f(t['profiled_job_ms'])} | "
              f"{f(t['error_vs_profiled_job_pct'])} % |")
    if errs:
        print(f"\nmedian |error| {statistics.median(errs):.1f} %, max {max(errs):.1f} % over {len(errs)} rows")
    if whatif_rows:
        print("\n| from (S,W,Mbit/s) | what-if | measured ms | predicted ms | error |\n|---|---|---|---|---|")
        for t in whatif_rows:
            print(f"| {tuple(t['from'])} | {t['whatif']} | {t['measured_ms']:.1f} | {t['predicted_ms']:.1f} | "
                  f"{t['error_pct']:+.1f} % |")
    if args.json:
        raw = [{"servers": c[0], "workers": c[1], "rate_mbit": c[2], **d} for c, d in rows.items()]
        Path(args.json).write_text(json.dumps({"rows": table, "whatifs": whatif_rows, "raw": raw,
                                               "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
