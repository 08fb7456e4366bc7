"""dpro replay vs real TensorFlow MultiWorkerMirroredStrategy jobs on emulated hosts (docs/tensorflow.md).

For each link rate: a 2-worker MWMS job of examples/tf/train.py on 2 emulated hosts (one network
namespace per worker, tbf at R Mbit/s both ways, a CPU quota per host), once without the profiler
(measured = worker 0's median step after warm-up, as train.py timed it) and once under one
``dpro profile --framework tensorflow`` per host; then ``dpro replay --json`` of the profiled run.
What-if rows: the trace profiled at the first rate, ``--bandwidth-mbps`` set to each other rate,
against that rate's measurement. Rounds alternate; medians.

    sudo python bench/tf_mwms_accuracy.py --rates 1000,200 --rounds 2 --cpus-per-host 0.5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
TRAIN = ROOT / "examples" / "tf" / "train.py"


def run(rate: float, *, out: Path | None, width: int, iters: int, cpus: float | None) -> float | None:
    """One 2-host MWMS job; returns worker 0's median step ms (unprofiled steps) or None when profiled."""
    from dpro_kit.cluster import EmulatedCluster
    from dpro_kit.jobs import CpuBudget
    budget = CpuBudget(2, cpus, prefix="tfmwb") if cpus else None
    try:
        with EmulatedCluster(2, rate_mbit=rate, prefix="tfmwb") as c:
            cluster = {"worker": [f"{c.host_ip(i)}:23456" for i in range(2)]}
            procs = []
            for i in range(2):
                env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
                job = [PY, str(TRAIN), "--strategy", "mwms", "--steps", str(iters), "--warmup", "5",
                       "--width", str(width)]
                cmd = job if out is None else [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow",
                                               "--out", str(out), "--host", f"host{i}", "--steps", "8:13", "--",
                                               *job]
                procs.append(c.run(i, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=budget.preexec(i) if budget else None))
            outs = []
            for p in procs:
                o, e = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise RuntimeError(e[-2000:])
                outs.append(o)
    finally:
        if budget:
            budget.close()
    if out is not None:
        return None
    steps = json.loads(outs[0].strip().splitlines()[-1])["step_ms"][5:]
    return statistics.median(steps)


def replay(trace: Path, *extra: str) -> dict:
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(trace), "--json", *extra], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,200")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cpus-per-host", type=float, default=0.5)
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    work = args.keep or Path(tempfile.mkdtemp(prefix="tf-mwms-"))
    meas: dict[float, list[float]] = {r: [] for r in rates}
    pred: dict[float, list[float]] = {r: [] for r in rates}
    same_run: dict[float, list[float]] = {r: [] for r in rates}
    whatif: dict[float, list[float]] = {r: [] for r in rates[1:]}
    for k in range(args.rounds):
        for rate in (rates if k % 2 == 0 else rates[::-1]):
            meas[rate].append(run(rate, out=None, width=args.width, iters=args.iters, cpus=args.cpus_per_host))
            t = work / f"r{k}-{rate:g}"
            run(rate, out=t, width=args.width, iters=args.iters, cpus=args.cpus_per_host)
            doc = replay(t)
            pred[rate].append(doc["iteration_time_ms"])
            same_run[rate].append(doc.get("measured_iteration_ms") or float("nan"))
            if rate == rates[0]:
                for other in rates[1:]:
                    whatif[other].append(replay(t, "--bandwidth-mbps", f"{other:g}")["iteration_time_ms"])
            print(f"round {k} {rate:g} Mbit/s: measured {meas[rate][-1]:.3f} ms, replay {pred[rate][-1]:.3f} ms "
                  f"(profiled run's own unprofiled steps {same_run[rate][-1]:.3f} ms)", flush=True)
    med = statistics.median
    print("\n| job | measured ms (median; all) | replay ms | error | error vs the profiled run's own steps |")
    print("|---|---|---|---|---|")
    for rate in rates:
        m, p, s = med(meas[rate]), med(pred[rate]), med(same_run[rate])
        print(f"| MWMS 2 hosts, width {args.width}, {rate:g} Mbit/s | {m:.3f} ({', '.join(f'{x:.2f}' for x in meas[rate])}) "
              f"| {p:.3f} | {100 * (p / m - 1):+.1f} % | {100 * (p / s - 1):+.1f} % |")
    for rate in rates[1:]:
        m, p = med(meas[rate]), med(whatif[rate])
        print(f"| what-if: profiled at {rates[0]:g}, `--bandwidth-mbps {rate:g}` | {m:.3f} | {p:.3f} | "
              f"{100 * (p / m - 1):+.1f} % | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
