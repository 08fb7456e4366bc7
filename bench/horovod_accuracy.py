#!/usr/bin/env python3
"""How well does dpro predict real Horovod + PyTorch training, and its knobs?  (docs/horovod.md)

For every configuration (model x link) on 2 emulated hosts (one Horovod rank per host,
``dpro_torch.hvd_launch`` = Horovod's gloo rendezvous without ssh, launched by
``dpro_kit.jobs.run_job`` with a CPU budget per host) and every round, alternating:

1. **measured**: ``examples/horovod/train.py`` without the profiler; the slowest rank's median
   iteration time over ``--iters`` iterations after warm-up;
2. **profiled**: the same job under ``dpro profile`` (one per host), then the Session's
   prediction (``dpro replay``'s number) -> accuracy row (error = predicted / measured - 1,
   both of the same round);
3. **what-ifs**: for each knob setting (``HOROVOD_FUSION_THRESHOLD`` / ``HOROVOD_CYCLE_TIME``)
   the job is measured with it, and predicted from step 2's trace (profiled with Horovod's
   defaults) with ``--fusion-threshold-mb`` / ``--cycle-time-ms``.

All statistics are medians over rounds.

    python bench/horovod_accuracy.py                      # default matrix (~25 min on 2 cores)
    python bench/horovod_accuracy.py --rounds 1 --models mlp --rates 1000
    python bench/horovod_accuracy.py --json rows.json --keep traces/
    python bench/horovod_accuracy.py --repredict rows.json --keep traces/   # same measurements, this code's predictions
    python bench/horovod_accuracy.py --repredict rows.json --keep traces/ --recorded-quota   # ... with the CFS quota model
    python bench/horovod_accuracy.py --pin 0,1            # host0 on CPU 0, host1 on CPU 1, no CFS quota

``--pin`` gives each host its cores (``dpro_kit.jobs.CpuBudget`` ``cpusets``, no quota) instead of
a 1-CPU CFS quota: the same CPU per host, without the kernel's stops of a throttled group for the
rest of a 100 ms period (docs/horovod.md, "pinned"); the profiled and the measured runs alike.
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
sys.path.insert(0, str(ROOT / "collectors" / "torch"))
from dpro_kit.jobs import job_iteration_ms, run_job  # noqa: E402

TRAIN = ROOT / "examples" / "horovod" / "train.py"
PY = sys.executable
#: knob settings measured and predicted: (label, HOROVOD_FUSION_THRESHOLD MiB or None, HOROVOD_CYCLE_TIME ms or None)
WHATIFS = [("fusion 0.25 MiB", 0.25, None), ("fusion 4 MiB", 4.0, None), ("cycle 3 ms", None, 3.0),
           ("cycle 10 ms", None, 10.0), ("fusion 0.25 MiB + cycle 5 ms", 0.25, 5.0)]
WHATIFS_BY_LABEL = {label: (fmb, cms) for label, fmb, cms in WHATIFS}


def run(args, work: Path, model: str, rate: float | None, *, profile: Path | None = None,
        knobs: dict[str, str] | None = None, tag: str = "") -> float | None:
    """One job; returns the measured iteration time (ms) of an unprofiled run, or None on failure."""
    times = work / f"times-{tag}.json"
    iters = args.iters if profile is None else args.prof_start + args.prof_steps + 3 - args.warmup
    argv = [PY, "-m", "dpro_torch.hvd_launch", "--", PY, str(TRAIN), "--model", model, "--quiet",
            "--threads", str(threads_per_host(args)),
            "--warmup", str(args.warmup), "--iters", str(iters), "--json-out", str(times)]
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'collectors' / 'torch'}", **(knobs or {})}
    with open(work / "jobs.log", "a") as log:
        r = run_job(argv, hosts=2, ranks_per_host=None, rate_mbit=rate, cluster=True, env=env,
                    cpus_per_host=None if args.pin else args.cpus_per_host, cpusets=args.pin,
                    cpu_period_us=int(args.cpu_period_ms * 1000), profile=profile,
                    steps=f"{args.prof_start}:{args.prof_start + args.prof_steps}", log=log,
                    timeout=args.job_timeout, prefix=args.prefix)
    if not times.exists():
        print(f"  job failed ({tag}): codes {r.codes}; see {work / 'jobs.log'}", flush=True)
        return None
    CPU_SHARE[tag] = cpu_share(times)
    return job_iteration_ms(times)


def threads_per_host(args) -> int:
    """torch threads of a rank: the host's CPUs (its pinned cores, or its quota), at least 1."""
    if args.pin:
        from dpro_kit.jobs import parse_cpu_list
        return max(1, min(len(parse_cpu_list(cs)) for cs in args.pin))
    return max(1, int(args.cpus_per_host))


#: tag -> the job's CPU time / wall time per iteration (median over iterations, busiest rank)
CPU_SHARE: dict[str, float | None] = {}


def cpu_share(times: Path) -> float | None:
    """CPU seconds (all the rank's threads) per wall second of an iteration: the median over the
    iterations, the busiest rank; near the host's CPU budget, the rank was CPU-bound (train.py's
    ``iteration_cpu_s``; Horovod's ``synchronize`` spins while it waits, so this is high even when
    the network is the bottleneck)."""
    doc = json.loads(times.read_text())
    cpu = doc.get("iteration_cpu_s") or {}
    shares = [statistics.median(c / w for c, w in zip(cpu[r], ts) if w > 0)
              for r, ts in doc["iteration_times_s"].items() if r in cpu]
    return round(max(shares), 3) if shares else None


#: predict with ``dpro replay --recorded-quota`` (the CFS model of each throttled rank's recorded quota)
RECORDED_QUOTA = False


def predict(trace: Path, fusion_mb: float | None = None, cycle_ms: float | None = None) -> float:
    from dpro_kit.session import Session
    from dpro_kit.whatif import WhatIf
    return Session(trace, whatif=WhatIf(fusion_threshold_mb=fusion_mb, cycle_time_ms=cycle_ms,
                                        recorded_quota=RECORDED_QUOTA)).iteration_time_ms(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rates", default="1000,200", help="emulated link rates in Mbit/s ('none' = unshaped)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--prof-start", type=int, default=12)
    ap.add_argument("--prof-steps", type=int, default=5)
    ap.add_argument("--cpus-per-host", type=float, default=1.0)
    ap.add_argument("--cpu-period-ms", type=float, default=100.0,
                    help="CFS period of the per-host CPU budget (dpro_kit.jobs.CpuBudget; the kernel's 100 ms by "
                         "default; 10 ms spreads a quota's stops over an iteration instead of one long stop)")
    ap.add_argument("--pin", default="", metavar="LAYOUT",
                    help="pin the 2 hosts to cores instead of a CPU quota: one kernel cpu list per host, "
                         "comma-separated (0,1: host0 on CPU 0, host1 on CPU 1); no CFS quota then "
                         "(--cpus-per-host and --cpu-period-ms are ignored)")
    ap.add_argument("--whatif-on", default="mlp-200",
                    help="MODEL-RATE configurations that also get the what-if rows ('' = none)")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--prefix", default="hvp", help="name prefix of the emulated hosts' namespaces and cgroups")
    ap.add_argument("--json", default="", help="write every measurement here")
    ap.add_argument("--keep", default="", help="keep the profiled traces under this folder")
    ap.add_argument("--repredict", default="", help="run no job: re-predict the rows of this --json file "
                                                       "from the traces kept under --keep")
    ap.add_argument("--recorded-quota", action="store_true",
                    help="predict with `dpro replay --recorded-quota` (docs/whatif.md, 'CPU quota')")
    args = ap.parse_args(argv)
    args.pin = [x.strip() for x in args.pin.split(",")] if args.pin else None
    if args.pin is not None and len(args.pin) != 2:
        ap.error(f"--pin: {len(args.pin)} cpu lists for 2 hosts (one per host, e.g. 0,1)")
    global RECORDED_QUOTA
    RECORDED_QUOTA = args.recorded_quota
    if args.repredict:
        rows = json.loads(Path(args.repredict).read_text())["rows"]
        for r in rows:
            model, rate_s = r["config"].split(" ")[0], r["config"].split(" ")[2].replace("mbit", "")
            what = WHATIFS_BY_LABEL.get(r["what"], (None, None))
            r["predicted_ms"] = predict(Path(args.keep) / f"T-{model}-{rate_s}-{r['round']}", *what)
            r["error"] = r["predicted_ms"] / r["measured_ms"] - 1
        table(rows)
        return 0
    work = Path(tempfile.mkdtemp(prefix="dpro-hvd-acc-"))
    rows = []
    try:
        for rnd in range(args.rounds):
            for model in args.models.split(","):
                for rate_s in args.rates.split(","):
                    rate = None if rate_s == "none" else float(rate_s)
                    cfg = f"{model} 2x1 {rate_s}mbit"
                    tag = f"{model}-{rate_s}-{rnd}"
                    meas = run(args, work, model, rate, tag=tag + "-m")
                    trace = work / f"T-{tag}"
                    run(args, work, model, rate, profile=trace, tag=tag + "-p")
                    if meas is None or not (trace / "manifest.json").exists():
                        continue
                    pred = predict(trace)
                    man = json.loads((trace / "manifest.json").read_text())
                    rows.append({"round": rnd, "config": cfg, "what": "profiled config", "measured_ms": meas,
                                 "predicted_ms": pred, "error": pred / meas - 1,
                                 "measured_cpu_share": CPU_SHARE.get(tag + "-m"),
                                 # the profiled run's own unprofiled iterations (timeline on, profiler off)
                                 "profiled_run_unprofiled_ms": man["extra"].get("measured_iteration_ms")})
                    print(f"round {rnd} {cfg}: measured {meas:.2f} ms (CPU share {CPU_SHARE.get(tag + '-m')}), "
                          f"predicted {pred:.2f} ms ({(pred / meas - 1) * 100:+.1f} %); the profiled run's "
                          f"unprofiled iterations {man['extra'].get('measured_iteration_ms')} ms", flush=True)
                    for label, fmb, cms in (WHATIFS if f"{model}-{rate_s}" in args.whatif_on.split(",") else []):
                        knobs = {}
                        if fmb is not None:
                            knobs["HOROVOD_FUSION_THRESHOLD"] = str(int(fmb * 2**20))
                        if cms is not None:
                            knobs["HOROVOD_CYCLE_TIME"] = str(cms)
                        m = run(args, work, model, rate, knobs=knobs, tag=f"{tag}-{label.replace(' ', '_')}")
                        if m is None:
                            continue
                        p = predict(trace, fmb, cms)
                        rows.append({"round": rnd, "config": cfg, "what": label, "measured_ms": m, "predicted_ms": p,
                                     "error": p / m - 1, "baseline_measured_ms": meas})
                        print(f"  what if {label}: measured {m:.2f} ms ({m / meas:.2f}x), predicted {p:.2f} ms "
                              f"({(p / m - 1) * 100:+.1f} %)", flush=True)
                    if args.keep:
                        dst = Path(args.keep) / f"T-{tag}"
                        shutil.rmtree(dst, ignore_errors=True)
                        shutil.copytree(trace, dst)
                    shutil.rmtree(trace, ignore_errors=True)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    table(rows)
    return 0


def table(rows: list[dict]) -> None:
    """Median per (configuration, what) over rounds, and the summary of the profiled configurations."""
    print("\nconfig                      what                            measured ms  predicted ms  error (median, rounds)")
    keys = sorted({(r["config"], r["what"]) for r in rows}, key=lambda k: (k[0], k[1] != "profiled config", k[1]))
    errs = []
    for cfg, what in keys:
        rs = [r for r in rows if r["config"] == cfg and r["what"] == what]
        e = statistics.median(r["error"] for r in rs)
        if what == "profiled config":
            errs.append(abs(e))
        print(f"{cfg:27s} {what:31s} {statistics.median(r['measured_ms'] for r in rs):11.2f} "
              f"{statistics.median(r['predicted_ms'] for r in rs):13.2f}  {e * 100:+6.1f} % "
              "(" + ", ".join(f"{r['error'] * 100:+.1f}" for r in rs) + ")")
    if errs:
        print(f"\nprofiled configurations: median |error| {statistics.median(errs) * 100:.1f} %, "
              f"max {max(errs) * 100:.1f} % over {len(errs)} configurations")


if __name__ == "__main__":
    sys.exit(main())
