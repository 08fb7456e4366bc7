#!/usr/bin/env python3
"""DeFT on a real job: DDP default vs the `dpro optimize` plan vs delayed updates on one and on two links (root).

    sudo /work/main/.venv/bin/python bench/deft_ab.py                          # mlp, 2 hosts, 500 + 500 Mbit/s
    sudo /work/main/.venv/bin/python bench/deft_ab.py --rate 1000 --rate1 300 --rounds 5 --json out.json

One session, everything measured and predicted here (``examples/ddp/train.py --model mlp --batch-size 64
--bucket-mb B``, 2 emulated hosts x 1 gloo rank, each host with two shaped links: ``eth0`` at ``--rate``
and ``eth1`` at ``--rate1``, ``dpro_kit.cluster.EmulatedCluster(second_rate_mbit=)``):

1. **profile** the stock job (``dpro profile`` on every host) -> a trace of this session;
2. **predict**: ``dpro replay TRACE --deft --links RATE,RATE1 --json`` (stock DDP, every bucket one
   iteration late on link 0, and spread over both links by ``link_assignment``) and
   ``dpro optimize TRACE`` (the plan and its predicted before/after);
3. **measure**, alternating fresh unprofiled jobs per round (``dpro_kit.jobs.alternate``):
   ``default`` (stock DDP), ``plan`` (``--plan``), ``deft-1link`` (``--deft-defer all``: every bucket
   all-reduced during the next iteration on the default group, eth0) and ``deft-2links``
   (``--deft-defer all --deft-link1 K,..``: the buckets the replay put on link 1 go over a gloo group
   bound to eth1, ``dpro_torch.deft.link_group``) and ``sync-2links`` (``--deft-link1 K,..`` alone: no
   delay, stock DDP's gradients, the same buckets on eth1: what the Preserver falls back to when the
   delay costs accuracy, delay 0, keeping the second link).  Per job: the median over iterations of the slowest
   rank; per variant: the median over rounds; speed-up: the paired ratio (median over rounds of
   default / variant in the same round);
4. **Preserver** (docs/deft.md §8): stock DDP, ``--deft-defer all`` and ``sync-2links`` with the same seed and data
   (``--data teacher``: a learnable task) for ``--loss-steps`` steps at each ``--loss-lrs``, on
   loopback (the fixed delay's arithmetic does not depend on the link); the measured ratio
   ``L_sync / L_variant`` of the final loss (mean of the last 10 steps) against ``[1 - eps, 1 + eps]``;
   and the Gaussian-walk ratio (``loss_ratio``) of the DeFT schedule's batch sequence with ``s0``,
   ``mu``, ``sigma`` estimated from the synchronous run's first 20 steps.

With ``--preserver-loop LR`` (phase 1b, after the predictions): DeFT's Preserver as a loop on real
training: from the DeFT schedule's delays in the hook's form (``fixed_delays``), train the job and
synchronous DDP with the same seed and data (loopback, ``--loss-steps``), and while the loss ratio is
outside ``1 +- eps`` make the next bucket in backward-ready order synchronous and train again
(``dpro_kit.optimize.deft.preserve_measured``).  The accepted delays go into ``plan.json``'s ``deft``
section (``plan_section``: delays, links, the ``train.py`` options, the loop's log) and become the arm
``preserved-2links``, predicted with ``dpro replay --deft --defer``.

The prediction is compared honestly: predicted speed-up = replay(stock) / replay(variant) from the
trace of this session, and each replay's error against the measured time of the same job.
Run ``python /work/notes/quiet.py $$ &`` (or any way to keep other load off) in the shell first.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from dpro_kit.jobs import alternate, paired_ratio, paired_table  # noqa: E402
from optimize_ab import Cluster, dpro_json  # noqa: E402

PY = sys.executable
TRAIN = ROOT / "examples" / "ddp" / "train.py"


def loss_run(lr: float, steps: int, seed: int, bucket_mb: float, extra: list[str], out: Path) -> list[float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", DPRO_QUIET="1", DPRO_LINK1_IFNAME="lo", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "collectors" / "torch"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([PY, str(TRAIN), "--nproc", "2", "--model", "mlp", "--batch-size", "64", "--data", "teacher",
                    "--bucket-mb", f"{bucket_mb:g}",
                    "--lr", f"{lr:g}", "--seed", str(seed), "--iters", str(steps), "--warmup", "0", "--quiet",
                    "--loss-log", str(out), *extra], env=env, check=True, timeout=1800, capture_output=True)
    return json.loads(out.read_text())["loss_mean"]


def preserver(args: argparse.Namespace, work: Path, batch_sequence: list[int], link1: str) -> list[dict[str, Any]]:
    """Phase 4 (module docstring): final-loss ratios of the delayed arms against stock DDP, same seed and data."""
    from dpro_kit.optimize.deft import loss_ratio, measured_loss_ratio, walk_statistics

    rows = []
    for lr in args.loss_lrs:
        sync = loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, [], work / f"loss-sync-{lr:g}.json")
        late = loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, ["--deft-defer", "all"],
                        work / f"loss-deft-{lr:g}.json")
        # the Preserver's fallback, delay 0 with the second link kept (loopback: its group on lo)
        two = loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, ["--deft-link1", link1],
                       work / f"loss-sync2-{lr:g}.json") if link1 else sync
        part = loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, ["--deft-defer", args.partial],
                        work / f"loss-partial-{lr:g}.json") if args.partial else None
        k = 10
        fs, fd, f2 = statistics.fmean(sync[-k:]), statistics.fmean(late[-k:]), statistics.fmean(two[-k:])
        ratio, ratio2 = measured_loss_ratio(sync, late, k), measured_loss_ratio(sync, two, k)
        gb = 64 * 2   # the Preserver's statistics from the synchronous run's first 20 steps (docs/deft.md §8)
        _, mu, sigma = walk_statistics(sync, lr, gb, 20)
        model_ratio = loss_ratio(batch_sequence or [1], sync[0], mu, sigma, gb, lr)
        ok = abs(ratio - 1.0) <= args.eps and math.isfinite(fd)
        rows.append({"lr": lr, "steps": args.loss_steps, "first_loss": sync[0], "final_sync": fs, "final_deft": fd,
                     "ratio_sync_over_deft": ratio, "within_eps": ok, "eps": args.eps, "final_sync_2links": f2,
                     "ratio_sync_over_sync_2links": ratio2, "sync_2links_within_eps": abs(ratio2 - 1.0) <= args.eps,
                     "partial": args.partial, "final_partial": statistics.fmean(part[-k:]) if part else None,
                     "ratio_sync_over_partial": measured_loss_ratio(sync, part, k) if part else None,
                     "preserver_action": "keep delay one" if ok else "lower the delay to 0 (stock DDP)",
                     "s0": sync[0], "mu": mu, "sigma": sigma, "global_batch": gb,
                     "deft_schedule_batch_sequence": batch_sequence, "model_ratio_deft_schedule": model_ratio,
                     "model_ratio_delay_one": 1.0, "sync_curve": sync, "deft_curve": late})
        print(f"preserver lr {lr:g}: final loss (mean of last {k} of {args.loss_steps}) sync {fs:.4f}, delay-one "
              f"{fd:.4f}, ratio {ratio:.4f} ({'within' if ok else 'OUTSIDE'} 1 +- {args.eps}); sync on two links "
              f"{f2:.4f} (ratio {ratio2:.4f}); " + (f"only {args.partial} delayed {statistics.fmean(part[-k:]):.4f} "
              f"(ratio {measured_loss_ratio(sync, part, k):.4f}); " if part else "") + f"model "
              f"(s0 {sync[0]:.3f}, mu {mu:.3f}, sigma {sigma:.3f}): DeFT schedule {batch_sequence} -> "
              f"{model_ratio:.4f}", file=sys.stderr, flush=True)
    return rows


def preserver_loop(args: argparse.Namespace, work: Path, rep: dict[str, Any], link1: str
                   ) -> tuple[dict[str, int], list[dict[str, Any]], dict[str, list[float]]]:
    """Phase 1b (``--preserver-loop LR``): DeFT's Preserver as a loop on real training (docs/deft.md §9).

    From the DeFT schedule's delays in the hook's form (``fixed_delays``), measure the loss ratio of
    synchronous DDP over the delayed job (``train.py --nproc 2 --data teacher``, same seed and data,
    loopback, the link-1 buckets on a second gloo group bound to ``lo``), and while it is outside
    ``1 +- eps`` make the next bucket of ``lowering_order`` synchronous and measure again
    (``preserve_measured``).  Returns the accepted delays, the loop's log and every curve it ran.
    """
    from dpro_kit.optimize.deft import measured_loss_ratio, preserve_measured

    lr = args.preserver_loop
    curves: dict[str, list[float]] = {"sync": loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, [],
                                                       work / f"loop-sync-{lr:g}.json")}

    def measure(delays: dict[str, int]) -> float:
        defer = ",".join(t.removeprefix("bucket") for t, d in sorted(delays.items()) if d > 0)
        extra = ["--deft-defer", defer] + (["--deft-link1", link1] if link1 else [])
        curves[defer] = loss_run(lr, args.loss_steps, args.seed, args.bucket_mb, extra,
                                 work / f"loop-defer-{defer.replace(',', '_')}-{lr:g}.json")
        r = measured_loss_ratio(curves["sync"], curves[defer], 10)
        print(f"preserver loop lr {lr:g}: delayed buckets {defer}: loss ratio sync / delayed {r:.4f} "
              f"({'within' if abs(r - 1) <= args.eps else 'OUTSIDE'} 1 +- {args.eps})", file=sys.stderr, flush=True)
        return r

    accepted, log = preserve_measured(rep["fixed_delays"], rep["lowering_order"], measure, eps=args.eps)
    print(f"preserver loop: accepted delays {accepted}", file=sys.stderr, flush=True)
    return accepted, log, curves


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rate", type=float, default=500.0, help="link 0 (eth0) rate per host, Mbit/s")
    ap.add_argument("--rate1", type=float, default=500.0, help="link 1 (eth1) rate per host, Mbit/s")
    ap.add_argument("--bucket-mb", type=float, default=1.0, help="DDP bucket cap (1: 3 buckets of the mlp)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prof-steps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=60.0, help="dpro optimize --budget, seconds")
    ap.add_argument("--cpus-per-host", type=float, default=None, help="CpuBudget per host (cgroup quota)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loss-steps", type=int, default=300)
    ap.add_argument("--loss-lrs", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.3])
    ap.add_argument("--eps", type=float, default=0.01, help="the Preserver's threshold (paper: 0.01)")
    ap.add_argument("--no-preserver", action="store_true")
    ap.add_argument("--partial", default="", metavar="K[,K..]",
                    help="also the arm partial-2links: only these DDP buckets one iteration late (the Preserver's "
                         "per-bucket fallback), on the links of the assignment; predicted with dpro replay --defer")
    ap.add_argument("--preserver-loop", type=float, default=None, metavar="LR",
                    help="run the Preserver as a loop on real training at this learning rate (loopback, "
                         "--loss-steps steps): start from the DeFT schedule's delays, lower them bucket by bucket "
                         "until the loss ratio is within 1 +- eps; the accepted delays become the arm "
                         "preserved-2links (predicted with dpro replay --defer) and plan.json's deft section")
    ap.add_argument("--prefix", default="dft", help="cgroup / netns name prefix of the emulated cluster")
    ap.add_argument("--keep", default="", help="keep the work folder (trace, plan, logs) here")
    ap.add_argument("--json", default="", help="write everything here")
    args = ap.parse_args()
    base = ["--model", "mlp", "--batch-size", "64", "--bucket-mb", f"{args.bucket_mb:g}", "--warmup", str(args.warmup)]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="deft-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    cl = Cluster(work, prefix=args.prefix, cpus_per_host=args.cpus_per_host)
    t0 = time.time()

    # 1. profile the stock job in this session
    trace = work / "trace"
    steps = f"{args.warmup + 2}:{args.warmup + 2 + args.prof_steps}"
    prof = cl.run(args.rate, base + ["--iters", str(args.prof_steps + 12)], "profile", profile=trace, steps=steps,
                  second_rate=args.rate1)
    # 2. predictions
    partial = [int(k) for k in args.partial.split(",") if k.strip()]
    rep = dpro_json(["replay", str(trace), "--deft", "--links", f"{args.rate:g},{args.rate1:g}", "--json", "-q"]
                    + (["--defer", ",".join(f"bucket{k}" for k in partial)] if partial else []))["deft"]
    plan_file = work / "plan.json"
    dpro_json(["optimize", str(trace), "-o", str(plan_file), "--budget", f"{args.budget:g}", "--json", "--quiet"])
    plan = json.loads(plan_file.read_text())
    assign = rep["delay_one_links"]["assignment"]
    on1 = sorted(int(n.removeprefix("bucket")) for n, j in assign.items() if j == 1)
    loop = None
    if args.preserver_loop is not None:
        from dpro_collect.plan import validate_plan
        from dpro_kit.optimize.deft import plan_section
        accepted, log, curves = preserver_loop(args, work, rep, ",".join(map(str, on1)))
        defer_acc = [t for t, d in sorted(accepted.items()) if d > 0]
        pred_acc = None
        if defer_acc:
            pa = dpro_json(["replay", str(trace), "--deft", "--links", f"{args.rate:g},{args.rate1:g}", "--json", "-q",
                            "--defer", ",".join(defer_acc)])["deft"]["partial_delay"]
            pred_acc = (pa["links"] if "links" in pa else pa["one_link"])["iteration_ms"]
        else:
            pred_acc = rep["synchronous_links"]["iteration_ms"]
        plan["deft"] = plan_section(accepted, assign, [args.rate, args.rate1], eps=args.eps, log=log,
                                    predicted={"iteration_ms": pred_acc},
                                    training={"lr": args.preserver_loop, "steps": args.loss_steps, "seed": args.seed,
                                              "data": "teacher", "last": 10})
        validate_plan(plan, where=str(plan_file))
        tmp = plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan, indent=1))
        os.replace(tmp, plan_file)
        loop = {"accepted": accepted, "log": log, "predicted_ms": pred_acc, "run": plan["deft"]["run"],
                "curves": curves}
    variants: dict[str, list[str]] = {"default": [], "plan": ["--plan", str(plan_file)],
                                      "deft-1link": ["--deft-defer", "all"]}
    link1 = ",".join(map(str, on1))
    if on1:
        variants["deft-2links"] = ["--deft-defer", "all", "--deft-link1", link1]
        variants["sync-2links"] = ["--deft-link1", link1]
        if partial:
            variants["partial-2links"] = ["--deft-defer", args.partial, "--deft-link1", link1]
    if loop is not None:
        variants["preserved-2links"] = loop["run"] if on1 else ["--deft-defer", ",".join(
            t.removeprefix("bucket") for t, d in sorted(loop["accepted"].items()) if d > 0)]
    sync_ms = rep["synchronous"]["iteration_ms"]
    predicted = {"default": sync_ms, "plan": sync_ms * plan["predicted"]["after_ms"] / plan["predicted"]["before_ms"],
                 "deft-1link": rep["delay_one"]["iteration_ms"], "deft-2links": rep["delay_one_links"]["iteration_ms"],
                 "sync-2links": rep["synchronous_links"]["iteration_ms"]}
    if partial:
        predicted["partial-2links"] = rep["partial_delay"]["links"]["iteration_ms"]
    if loop is not None:
        predicted["preserved-2links"] = loop["predicted_ms"]
    print(f"profiled (unprofiled time of that job {prof['ms']:.2f} ms); predicted: " + ", ".join(
        f"{v} {predicted[v]:.2f} ms" for v in variants) + f"; link-1 buckets {on1}", file=sys.stderr, flush=True)

    # 3. measure, alternating
    n = {v: 0 for v in variants}

    def measure(v: str) -> float:
        n[v] += 1
        return cl.run(args.rate, base + ["--iters", str(args.iters)] + variants[v], f"{v}-r{n[v]}",
                      second_rate=args.rate1)["ms"]

    rounds = alternate({v: (lambda v=v: measure(v)) for v in variants}, args.rounds, shuffle_seed=args.seed,
                       on_round=lambda r, rs: print(f"round {r + 1}: " + ", ".join(
                           f"{v} {rs[v][-1]:.2f} ms" for v in variants), file=sys.stderr, flush=True))
    paired_table(rounds, "default", file=sys.stderr)
    meas = {v: statistics.median(xs) for v, xs in rounds.items()}
    rows = []
    for v in variants:
        sp_m = paired_ratio(rounds, "default", v)   # median over rounds of default / variant
        sp_p = predicted["default"] / predicted[v]
        rows.append({"variant": v, "args": " ".join(variants[v]), "measured_ms": meas[v],
                     "measured_range_ms": [min(rounds[v]), max(rounds[v])], "measured_speedup": sp_m,
                     "predicted_ms": predicted[v], "predicted_speedup": sp_p,
                     "ms_error": predicted[v] / meas[v] - 1.0, "speedup_error": sp_p / sp_m - 1.0})
    # the trace stands for the job only if the profiled job ran like the measured one (its own unprofiled
    # iterations vs the default arm's median): a disturbed profile makes every prediction of this run wrong
    prof_off = prof["ms"] / meas["default"] - 1.0
    if abs(prof_off) > 0.10:
        print(f"WARNING: the profiled job's unprofiled iterations ran {prof['ms']:.2f} ms, {prof_off:+.1%} off the "
              f"measured default ({meas['default']:.2f} ms): the trace does not stand for the job (load during the "
              f"profile); its predictions are not a test of the replay - run again", file=sys.stderr, flush=True)
    print(f"\n{'variant':<12} {'measured ms':>22} {'speed-up':>9} {'predicted ms':>13} {'pred. speed-up':>15} "
          f"{'ms error':>9} {'speed-up error':>15}")
    for r in rows:
        lo, hi = r["measured_range_ms"]
        print(f"{r['variant']:<12} {r['measured_ms']:>8.2f} ({lo:6.2f}..{hi:6.2f}) {r['measured_speedup']:>8.2f}x "
              f"{r['predicted_ms']:>13.2f} {r['predicted_speedup']:>14.2f}x {r['ms_error']:>+8.1%} "
              f"{r['speedup_error']:>+14.1%}")
    out: dict[str, Any] = {
        "command": " ".join(sys.argv), "rate_mbit": args.rate, "rate1_mbit": args.rate1, "bucket_mb": args.bucket_mb,
        "cpus_per_host": args.cpus_per_host, "profiled_job_unprofiled_ms": prof["ms"], "trace": str(trace),
        "profiled_job_vs_default": prof_off,
        "replay_deft": {k: rep[k] for k in ("coverage_rate", "forward_ms", "backward_ms", "buckets", "batch_sequence",
                                            "update_frequency")},
        "deft_schedule_ms": rep["deft"]["iteration_ms"], "link1_buckets": on1,
        "plan_predicted": plan["predicted"], "rounds": rounds, "rows": rows,
        **({"preserver_loop": loop} if loop is not None else {})}
    # 4. the Preserver on real training
    if not args.no_preserver:
        out["preserver"] = preserver(args, work, rep["batch_sequence"], link1)
    out["wall_s"] = round(time.time() - t0, 1)
    if args.json:
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
