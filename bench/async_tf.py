"""Asynchronous SGD throughput: predicted (dpro async-predict) vs measured (TF ParameterServerStrategy).

Issue 13 item 4 (seed 004, Li et al. ICPE'20). For each bandwidth and W = 1..N workers, a real
ParameterServerStrategy job of examples/tf/train.py runs on emulated hosts (dpro_kit.cluster:
one network namespace per task, every host link shaped to the bandwidth in both directions;
dpro_kit.jobs.CpuBudget: a fixed CPU quota per host, so a host's speed does not depend on how
many hosts run): host 0 = the PS, host 1 = the coordinator, hosts 2.. = the workers. Measured
steps/s = the coordinator's steps after warm-up / wall time. Configurations run in alternating
order, ``--rounds`` times; the median is compared.

The prediction takes a dpro_tf trace of the training step (``--trace``, or one recorded here
with ``dpro profile --framework tensorflow`` on the same model) and the measured 1-worker
steps/s at each bandwidth (the 1-worker + 1-PS profile run: it calibrates the fixed per-step
dispatch overhead, docs/async.md), then simulates W = 1..N.

    sudo python bench/async_tf.py --bandwidths 100,300 --workers 1-4 --rounds 2 --out bench-async
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAIN = ROOT / "examples" / "tf" / "train.py"
PY = sys.executable
PLACEMENT: dict[str, int] = {}   # variable -> PS index, as the real job placed them (train.py prints it)


def run_pss(workers: int, rate_mbit: float, *, steps: int, warmup: int, width: int, depth: int, batch: int,
            cpus: float | None, ps_cpus: float | None = None, num_ps: int = 1, prefix: str = "tfas",
            timeout: float = 400.0) -> float:
    """One real ParameterServerStrategy run; returns the coordinator's steps/s.

    ``cpus``: CPU quota of every host; ``ps_cpus``: the PS host's (default ``cpus``)."""
    from dpro_kit.cluster import EmulatedCluster
    from dpro_kit.jobs import CpuBudget
    hosts = workers + 1 + num_ps
    port = 23456
    ps_hosts = [0] + [2 + workers + j for j in range(num_ps - 1)]   # host 0 and, for 2 PS, the last host
    with EmulatedCluster(hosts, rate_mbit=rate_mbit, prefix=prefix) as c:
        cluster = {"ps": [f"{c.host_ip(h)}:{port}" for h in ps_hosts], "chief": [f"{c.host_ip(1)}:{port}"],
                   "worker": [f"{c.host_ip(2 + i)}:{port}" for i in range(workers)]}
        budget = CpuBudget(hosts, cpus, prefix=prefix) if cpus else None
        if budget and ps_cpus:   # the PS hosts get their own quota
            for h in ps_hosts:
                (budget.groups[h] / "cpu.cfs_quota_us").write_text(str(int(round(ps_cpus * budget.PERIOD_US))))
        try:
            def start(host: int, task: str, index: int, args: list[str], **kw):
                env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": index}}),
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
                pre = budget.preexec(host) if budget else None
                return c.run(host, [PY, str(TRAIN), *args], env=env, preexec_fn=pre, **kw)
            common = ["--width", str(width), "--depth", str(depth), "--batch", str(batch)]
            servers = [start(h, "ps", j, ["--serve", *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for j, h in enumerate(ps_hosts)]
            servers += [start(2 + i, "worker", i, ["--serve", *common], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i in range(workers)]
            chief = start(1, "chief", 0, ["--strategy", "ps", "--steps", str(steps), "--warmup", str(warmup), *common],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = chief.communicate(timeout=timeout)
            for s in servers:
                s.kill()
            if chief.returncode != 0:
                raise RuntimeError(f"coordinator failed ({chief.returncode}): {err[-1500:]}")
            doc = json.loads(out.strip().splitlines()[-1])
            PLACEMENT.update(doc.get("placement") or {})
            return float(doc["steps_per_s"])
        finally:
            if budget:
                budget.close()


def profile_step(out: Path, *, width: int, depth: int, batch: int) -> Path:
    """The dpro_tf trace of the step (custom loop, one process, one thread)."""
    if (out / "manifest.json").exists():
        return out
    cmd = [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--steps", "10:20", "--out", str(out),
           "--", PY, str(TRAIN), "--steps", "30", "--width", str(width), "--depth", str(depth), "--batch", str(batch)]
    subprocess.run(cmd, check=True, capture_output=True, text=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default="100,300", help="Mbit/s, comma-separated")
    ap.add_argument("--workers", default="1-4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cpus-per-host", type=float, default=0.3)
    ap.add_argument("--ps-cpus", type=float, default=None, help="the PS host's CPU quota (default: --cpus-per-host)")
    ap.add_argument("--ps", type=int, default=1, choices=[1, 2], help="parameter servers (real job and prediction)")
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("bench-async"))
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--calibrate", choices=["bandwidth", "overhead"], default="bandwidth",
                    help="what the measured W=1 fits (dpro async-predict --calibrate)")
    args = ap.parse_args(argv)
    lo, _, hi = args.workers.partition("-")
    ws = list(range(int(lo), int(hi or lo) + 1))
    bws = [float(b) for b in args.bandwidths.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    meas_path = args.out / "measured.json"
    measured: dict[str, list[float]] = json.loads(meas_path.read_text()) if meas_path.exists() else {}
    configs = [(b, w) for b in bws for w in ws]
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))   # alternate the order every round
        for b, w in order:
            key = f"{b:g}:{w}"
            if len(measured.get(key, [])) > r:
                continue
            t = time.time()
            sps = run_pss(w, b, steps=args.steps, warmup=args.warmup, width=args.width, depth=args.depth,
                          batch=args.batch, cpus=args.cpus_per_host, ps_cpus=args.ps_cpus, num_ps=args.ps)
            measured.setdefault(key, []).append(sps)
            meas_path.write_text(json.dumps(measured, indent=1))
            print(f"round {r} {b:g} Mbit/s W={w}: {sps:.3f} steps/s ({time.time() - t:.0f} s)", flush=True)
    if args.measure_only:
        return 0
    from dpro_kit.async_ps import calibrate, predict, template_from_trace
    trace = args.trace or profile_step(args.out / "step-trace", width=args.width, depth=args.depth, batch=args.batch)
    place_path = args.out / "placement.json"
    if PLACEMENT:
        place_path.write_text(json.dumps(PLACEMENT, indent=1))
    placement = json.loads(place_path.read_text()) if place_path.exists() else None
    tpl = template_from_trace(trace, num_ps=args.ps, placement=placement if args.ps > 1 else None)
    if args.ps > 1:
        per_ps = [sum(b for v, b in tpl.variables.items() if (placement or {}).get(v, 0) % args.ps == p)
                  for p in range(args.ps)]
        print(f"variable bytes per PS (the job's placement): {per_ps}")
    print(f"\n| Mbit/s | W | measured steps/s (median of {args.rounds}; all) | predicted (range over 8 start "
          f"offsets) | error |")
    print("|---|---|---|---|---|")
    errs = []
    for b in bws:
        one = statistics.median(measured[f"{b:g}:1"])
        fit = calibrate(tpl, one, how=args.calibrate, bandwidth_mbit=b, num_ps=args.ps)   # W=1 only (docs/async.md)
        preds = {p.workers: p for p in predict(tpl, ws, num_ps=args.ps, **fit)}
        for w in ws:
            m = statistics.median(measured[f"{b:g}:{w}"])
            p = preds[w].steps_per_s
            e = 100 * (p - m) / m
            errs.append(abs(e))
            allm = ", ".join(f"{x:.2f}" for x in measured[f"{b:g}:{w}"])
            print(f"| {b:g} | {w} | {m:.2f} ({allm}) | {p:.2f} ({preds[w].low:.2f} .. {preds[w].high:.2f}) | "
                  f"{e:+.1f} % |")
        print(f"| {b:g} | | calibrated on W=1 ({args.calibrate}): effective {fit['bandwidth_mbit']:.1f} Mbit/s, "
              f"step overhead {fit['step_overhead_us'] / 1e3:.1f} ms | | |")
    print(f"\nmax |error| {max(errs):.1f} %, median {statistics.median(errs):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
