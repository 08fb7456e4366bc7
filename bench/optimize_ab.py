#!/usr/bin/env python3
"""Do `dpro optimize` plans make real jobs faster?  A/B on the emulated cluster (root).

    sudo /work/venv/bin/python bench/optimize_ab.py                        # 3 configurations, 3 rounds
    sudo /work/venv/bin/python bench/optimize_ab.py --configs transformer-200 --rounds 2 --iters 20

Per configuration (model, per-host link rate, batch; 2 hosts x 1 rank, gloo, CPU):

1. profile the job as users run it (DDP's default buckets: ``bucket_cap_mb=None``, 25 MB after a
   1 MB first bucket) with ``dpro profile``
   in an :class:`~dpro_kit.cluster.EmulatedCluster`;
2. ``dpro optimize TRACE -o plan.json`` (budget ``--budget`` s) -> the plan and its
   predicted iteration time;
3. measure, alternating in rounds (the order shuffled per round, one fresh job per variant
   and round, ``--iters`` timed iterations after warm-up): DDP default, one bucket per tensor
   (``--bucket-mb 1e-6``), an exhaustive sweep of bucket caps (``--sweep``, MB) and the plan
   applied with ``examples/ddp/train.py --plan plan.json`` (``dpro_torch.plan.apply_plan``).

The measured time of a variant is the median over its rounds of the job's median iteration
(slowest rank).  Printed: default, per-tensor, best of the sweep, plan, plan speed-up over
default, plan vs best sweep, the plan's predicted time and its error.  ``--json FILE`` keeps
everything (every round's medians, the plan summary).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpro_kit.jobs import alternate, job_iteration_ms, paired_ratio, paired_table, run_job  # noqa: E402

PY = sys.executable
TRAIN = ROOT / "examples" / "ddp" / "train.py"
DPRO = [PY, "-m", "dpro_kit.cli"]

#: name -> model, per-host link rate (Mbit/s), batch size: backward compute comparable to the
#: gradient transfer, where bucketing decides how much of it overlaps
CONFIGS: dict[str, dict[str, Any]] = {
    # gradient transfer time (ring of 2: the gradient bytes once over each link) vs compute time
    # of one iteration on one core, measured on loopback:
    "transformer-200": {"model": "transformer", "rate": 200.0, "batch": 32},  # 3.5 MiB: ~154 ms vs ~250 ms
    "mlp-200": {"model": "mlp", "rate": 200.0, "batch": 512},                 # 2.5 MiB: ~111 ms vs ~55 ms
    "cnn-50": {"model": "cnn", "rate": 50.0, "batch": 128},                   # 0.6 MiB: ~105 ms vs ~97 ms
    # added after the first three were measured (docs/optimizer.md says so): half the batch, twice the rate
    "cnn-100": {"model": "cnn", "rate": 100.0, "batch": 64},                  # 0.6 MiB: ~53 ms vs ~50 ms (est.)
}
SWEEP_MB = [0.25, 0.5, 1.0, 2.0, 4.0, 25.0]


class Cluster:
    """Runs one 2-host job (1 rank per host) per call through :func:`dpro_kit.jobs.run_job`: a fresh
    emulated cluster each time."""

    def __init__(self, work: Path, hosts: int = 2, timeout: float = 600.0, cpus_per_host: float | None = None,
                 prefix: str = "dpab") -> None:
        self.prefix = prefix
        self.work, self.hosts, self.timeout, self.cpus = work, hosts, timeout, cpus_per_host
        self.n = 0
        self.log = open(work / "jobs.log", "a")

    def run(self, rate: float, train_args: list[str], tag: str, profile: Path | None = None,
            steps: str = "", second_rate: float | None = None) -> dict[str, Any]:
        self.n += 1
        times = self.work / f"{self.n:03d}-{tag}.json"
        env = dict(DPRO_QUIET="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            [str(ROOT / "collectors" / "torch"), os.environ.get("PYTHONPATH", "")]))
        print(f"[{time.strftime('%H:%M:%S')}] job {self.n:03d} {tag}", file=self.log, flush=True)
        cmd = [PY, str(TRAIN), *train_args, "--threads", "1", "--pin", "rank", "--backend", "gloo",
               "--quiet", "--json-out", str(times)]
        job = run_job(cmd, hosts=self.hosts, rate_mbit=rate, second_rate_mbit=second_rate, profile=profile, steps=steps, env=env, log=self.log,
                      timeout=self.timeout, prefix=self.prefix, cpus_per_host=self.cpus)
        if not times.exists():
            raise RuntimeError(f"job {tag} failed (exit codes {job.codes}); see {self.work / 'jobs.log'}")
        doc = json.loads(times.read_text())
        return {"ms": job_iteration_ms(times), "wall_s": job.wall_s, "codes": job.codes, "plan": doc.get("plan")}


def dpro_json(args: list[str], timeout: float = 900.0) -> dict[str, Any]:
    p = subprocess.run(DPRO + args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"dpro {' '.join(args)} failed: {p.stderr.strip()[-800:]}")
    return json.loads(p.stdout)


def one_config(name: str, spec: dict[str, Any], cl: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    base = ["--model", spec["model"], "--batch-size", str(spec["batch"]), "--warmup", str(args.warmup)]
    rate = spec["rate"]
    trace = cl.work / f"{name}-trace"
    steps = f"{args.warmup + 2}:{args.warmup + 2 + args.prof_steps}"
    prof = cl.run(rate, base + ["--iters", str(args.prof_steps + 12)], f"{name}-profile",
                  profile=trace, steps=steps)
    replay = dpro_json(["replay", str(trace), "--json", "-q"])
    plan_file = cl.work / f"{name}-plan.json"
    t0 = time.time()
    dpro_json(["optimize", str(trace), "-o", str(plan_file), "--budget", str(args.budget), "--json", "--quiet"])
    search_s = time.time() - t0
    plan = json.loads(plan_file.read_text())
    variants: dict[str, list[str]] = {"default": [], "per-tensor": ["--bucket-mb", "1e-6"]}
    for mb in args.sweep:
        variants[f"cap {mb:g} MB"] = ["--bucket-mb", f"{mb:g}"]
    variants["plan"] = ["--plan", str(plan_file)]
    plan_desc = None
    done: dict[str, int] = {v: 0 for v in variants}

    def measure(v: str) -> float:
        nonlocal plan_desc
        res = cl.run(rate, base + variants[v] + ["--iters", str(args.iters)], f"{name}-{v.replace(' ', '')}-r{done[v]}")
        done[v] += 1
        if v == "plan" and res.get("plan"):
            plan_desc = res["plan"].get("description")
        return res["ms"]

    def progress(r: int, rounds: dict[str, list[float]]) -> None:
        print(f"  {name} round {r + 1}/{args.rounds}: " + ", ".join(f"{v} {rounds[v][-1]:.1f}" for v in variants),
              file=sys.stderr, flush=True)
    rounds = alternate({v: (lambda v=v: measure(v)) for v in variants}, args.rounds, shuffle_seed=args.seed,
                       on_round=progress)
    paired_table(rounds, "default", file=sys.stderr)
    meas = {v: statistics.median(xs) for v, xs in rounds.items()}
    predicted = predict_variants(trace, variants, plan)
    sweep = {v: meas[v] for v in variants if v not in ("plan",)}
    best = min(sweep, key=sweep.get)
    pred_after = plan["predicted"]["after_ms"]
    return {
        "config": name, **spec, "profiled_default": {"unprofiled_ms": prof["ms"], "trace": str(trace)},
        "replay_default_ms": replay.get("iteration_time_ms"), "search_s": round(search_s, 1),
        "plan_predicted_before_ms": plan["predicted"]["before_ms"], "plan_predicted_after_ms": pred_after,
        "plan_groups": len(plan.get("tensor_groups", [])), "plan_ddp": plan["frameworks"]["pytorch_ddp"],
        "plan_applied_as": plan_desc, "rounds": rounds, "measured_ms": meas, "best_sweep": best,
        "speedup_vs_default": meas["default"] / meas["plan"], "plan_vs_best": meas["plan"] / meas[best] - 1.0,
        "plan_prediction_error": pred_after / meas["plan"] - 1.0,
        "predicted_ms": predicted,
    }


def predict_variants(trace: Path, variants: dict[str, list[str]], plan: dict[str, Any]) -> dict[str, float]:
    """What the replay predicts for every measured variant (``dpro replay TRACE --bucket-mb X``): how well
    the model ranks the configurations the search chooses between."""
    out: dict[str, float] = {"plan": plan["predicted"]["after_ms"]}
    for v, a in variants.items():
        if v == "plan":
            continue
        args = ["replay", str(trace), "--json", "-q"]
        if v == "default":
            pass
        elif "--bucket-mb" in a:
            args += ["--bucket-mb", a[a.index("--bucket-mb") + 1]]
        out[v] = dpro_json(args)["iteration_time_ms"]
    return out


def paired(r: dict[str, Any]) -> tuple[float, float]:
    """Median over rounds of default/plan and of plan/best-1, each ratio taken within one round (the
    variants of a round ran minutes apart; the machine drifts between rounds)."""
    rd = r["rounds"]
    return paired_ratio(rd, "default", "plan"), paired_ratio(rd, "plan", r["best_sweep"]) - 1.0


def render(rows: list[dict[str, Any]]) -> str:
    head = ("| config | default ms | per-tensor ms | best sweep | plan ms (predicted) | plan speed-up | "
            "plan vs best | paired speed-up | paired vs best | plan prediction error |")
    out = [head, "|" + "---|" * 10]
    detail = ["", "measured (predicted) ms of every variant:", ""]
    for r in rows:
        m = r["measured_ms"]
        out.append(f"| {r['config']} (batch {r['batch']}) | {m['default']:.1f} | {m['per-tensor']:.1f} | "
                   f"{r['best_sweep']} {m[r['best_sweep']]:.1f} | {m['plan']:.1f} ({r['plan_predicted_after_ms']:.1f}) | "
                   f"{r['speedup_vs_default']:.2f}x | {100 * r['plan_vs_best']:+.1f} % | "
                   f"{paired(r)[0]:.2f}x | {100 * paired(r)[1]:+.1f} % | "
                   f"{100 * r['plan_prediction_error']:+.1f} % |")
        pr = r.get("predicted_ms") or {}
        detail.append(f"* {r['config']}: " + ", ".join(f"{v} {m[v]:.1f} ({pr[v]:.1f})" if v in pr else f"{v} {m[v]:.1f}"
                                                      for v in m))
    return "\n".join(out + detail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus-per-host", type=float, default=None,
                    help="CPU budget of every emulated host (cgroup cpu quota, dpro_kit.jobs.CpuBudget; root)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per measured job")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prof-steps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=60.0, help="dpro optimize --budget (s)")
    ap.add_argument("--sweep", type=float, nargs="+", default=SWEEP_MB, help="bucket caps (MB) of the sweep")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dpro-optimize-ab"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the emulated cluster is cleaned up on kill
    if os.geteuid() != 0:
        print("needs root (network namespaces for the emulated cluster)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    cl = Cluster(args.work, cpus_per_host=args.cpus_per_host)
    rows = []
    t0 = time.time()
    for name in args.configs:
        print(f"== {name}", file=sys.stderr, flush=True)
        rows.append(one_config(name, CONFIGS[name], cl, args))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print(render(rows))
    print(f"\n({len(rows)} configurations, {args.rounds} rounds, {time.time() - t0:.0f} s; work dir {args.work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
