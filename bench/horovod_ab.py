#!/usr/bin/env python3
"""Horovod's knobs: defaults vs ``dpro optimize``'s plan vs ``HOROVOD_AUTOTUNE=1`` after it converged.  (docs/horovod.md)

For every configuration (model x link rate) on 2 emulated hosts (one rank per host,
``dpro_torch.hvd_launch``, ``dpro_kit.jobs.run_job`` with a CPU budget per host):

1. **profile** the job once with Horovod's defaults (``dpro profile``), then ``dpro optimize``
   it (:class:`dpro_kit.optimize.horovod.HorovodKnobs`: a grid of fusion threshold x cycle
   time on the replayer) -> ``plan.json``; the search time is printed;
2. **alternate** per round (:func:`dpro_kit.jobs.alternate`, order shuffled per round):
   ``default`` (no knob set), ``plan`` (``hvd_launch --plan plan.json``) and ``autotune``
   (``HOROVOD_AUTOTUNE=1``, ``HOROVOD_AUTOTUNE_LOG``: the job runs long enough for the
   autotuner to converge; ``train.py`` records the log's size every iteration, the
   autotuner writes one line per sample and its best setting last, then stops; only the
   iterations after the log stopped growing are measured, at least ``--iters``; a run in
   which it did not converge is reported and left out);
3. the table: median per variant, min..max, and the ratio to ``default`` taken within
   each round (:func:`dpro_kit.jobs.paired_table`).

The autotuner's sampling (``HOROVOD_AUTOTUNE_WARMUP_SAMPLES``, ``..._STEPS_PER_SAMPLE``,
``..._BAYES_OPT_MAX_SAMPLES``) is Horovod's default unless ``--autotune-env`` sets it.

    python bench/horovod_ab.py                                  # mlp,cnn x 100,300 Mbit/s, 3 rounds
    python bench/horovod_ab.py --models mlp --rates 200 --rounds 2
    python bench/horovod_ab.py --configs cnn-100,cnn-300,mlp-300 --json ab.json --keep ab/
    python bench/horovod_ab.py --configs cnn-300 --pin 0,1      # one core per host, no CFS quota

``--keep DIR`` keeps the profile, the plan, the autotuner's logs and every run's per-iteration times
(``times-<config>-<variant>-<n>.json``): ``bench/horovod_autotune_sweep.py DIR`` puts every setting the
autotuner sampled next to the what-if of the profile.

``--setting MB:MS`` (comma-separated for several) replaces the autotune runs by plain runs at a fixed
fusion threshold (MiB) and cycle time (ms), e.g. the setting an earlier autotune run converged to (its
log's last line): the autotuner's *result* measured in as many short alternating rounds as the noise
needs, instead of a few runs of thousands of iterations (variants ``setting-<MB>MB-<MS>ms``):

    python bench/horovod_ab.py --configs cnn-100 --pin 0,1 --setting 4:5 --rounds 8 --iters 60

``--pin`` as in bench/horovod_accuracy.py: each host pinned to its cores (``dpro_kit.jobs.CpuBudget``
``cpusets``) with no CFS quota, for the profile and every measured run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collectors" / "torch"))
from dpro_kit.jobs import alternate, job_iteration_ms, paired_table, run_job  # noqa: E402

TRAIN = ROOT / "examples" / "horovod" / "train.py"
PY = sys.executable


def job(args, work: Path, model: str, rate: float, tag: str, *, iters: int, plan: Path | None = None,
        env: dict[str, str] | None = None, profile: Path | None = None) -> Path | None:
    """Run one job; the times JSON of train.py, or None when the job wrote none."""
    times = work / f"times-{tag}.json"
    times.unlink(missing_ok=True)
    launch = [PY, "-m", "dpro_torch.hvd_launch"] + (["--plan", str(plan)] if plan else [])
    argv = launch + ["--", PY, str(TRAIN), "--model", model, "--quiet", "--threads",
                     str(threads_per_host(args)), "--warmup", str(args.warmup), "--iters", str(iters),
                     "--json-out", str(times)]
    with open(work / "jobs.log", "a") as log:
        log.write(f"\n=== {tag} {' '.join(argv)}\n")
        log.flush()
        run_job(argv, hosts=2, ranks_per_host=None, rate_mbit=rate, cluster=True,
                env={"PYTHONPATH": f"{ROOT}:{ROOT / 'collectors' / 'torch'}", **(env or {})},
                cpus_per_host=None if args.pin else args.cpus_per_host, cpusets=args.pin, profile=profile, steps=args.prof_steps, log=log,
                timeout=args.job_timeout, prefix=args.prefix)
    if not times.exists():
        print(f"  job failed ({tag}); see {work / 'jobs.log'}", flush=True)
        return None
    if args.keep:       # every run's per-iteration times (an autotune run's: per sampled setting)
        dst = Path(args.keep)
        dst.mkdir(parents=True, exist_ok=True)
        n = len(list(dst.glob(f"times-{tag}-*.json")))
        shutil.copy(times, dst / f"times-{tag}-{n}.json")
    return times


def threads_per_host(args) -> int:
    """torch threads of a rank: the host's CPUs (its pinned cores, or its quota), at least 1."""
    if args.pin:
        from dpro_kit.jobs import parse_cpu_list
        return max(1, min(len(parse_cpu_list(cs)) for cs in args.pin))
    return max(1, int(args.cpus_per_host))


def converged_ms(times: Path, log: Path, min_iters: int) -> tuple[float | None, dict]:
    """The slowest rank's median iteration time after the autotuner's log stopped growing."""
    doc = json.loads(times.read_text())
    sizes = doc.get("autotune_log_bytes") or []
    info = {"log_lines": len(log.read_text().splitlines()) if log.exists() else 0}
    if not sizes or sizes[-1] == 0:
        return None, {**info, "why": "no autotune log"}
    last = len(sizes) - 1
    while last > 0 and sizes[last - 1] == sizes[-1]:
        last -= 1
    start = last + 5            # Horovod broadcasts the final setting with the next cycle's responses
    n = len(sizes) - start
    info.update(converged_at_iteration=last, measured_iterations=max(0, n))
    if n < min_iters:
        return None, {**info, "why": f"converged at iteration {last} of {len(sizes)}: fewer than {min_iters} after"}
    lines = log.read_text().splitlines() if log.exists() else []
    # when it converged the autotuner appends its best setting, a copy of one sampled line (params and score)
    best = lines[-1] if lines else ""
    info["best_line"] = best     # hierarchical_allreduce,hierarchical_allgather,torus,cache,cycle_ms,threshold_mb,score
    if best not in lines[1:-1]:
        return None, {**info, "why": "the log does not end with the autotuner's best setting: not converged"}
    per_rank = [statistics.median(ts[start:]) for ts in doc["iteration_times_s"].values()]
    return max(per_rank) * 1e3, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rates", default="100,300", help="emulated link rates (Mbit/s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--iters", type=int, default=40, help="measured iterations (default, plan; autotune after it "
                                                          "converged)")
    ap.add_argument("--configs", default="", help="MODEL-RATE,... instead of --models x --rates (e.g. cnn-100,mlp-300)")
    ap.add_argument("--autotune-iters", type=int, default=3000,
                    help="iterations of an autotune run: Horovod 0.28.1's autotuner with its default sampling "
                         "converged after 1975 and 2178 iterations in two runs here (~40 samples of 5 x 10 "
                         "steps), --iters to spare")
    ap.add_argument("--autotune-env", default="", help="extra HOROVOD_AUTOTUNE_* settings, KEY=VALUE,...")
    ap.add_argument("--setting", default="", metavar="MB:MS[,MB:MS...]",
                    help="instead of autotune runs: plain runs at these fusion thresholds (MiB) and cycle times "
                         "(ms), one variant each, e.g. what earlier autotune runs converged to")
    ap.add_argument("--prof-steps", default="12:17")
    ap.add_argument("--cpus-per-host", type=float, default=1.0)
    ap.add_argument("--pin", default="", metavar="LAYOUT",
                    help="pin the 2 hosts to cores instead of a CPU quota: one kernel cpu list per host, "
                         "comma-separated (0,1); no CFS quota then (--cpus-per-host is ignored)")
    ap.add_argument("--budget", type=float, default=60.0, help="dpro optimize search budget (s)")
    ap.add_argument("--min-gain", type=float, default=None,
                    help="dpro optimize --min-gain (%%): a setting predicted to save less keeps the traced one "
                         "(default: dpro optimize's)")
    ap.add_argument("--job-timeout", type=float, default=900)
    ap.add_argument("--prefix", default="hvp", help="name prefix of the namespaces and cgroups")
    ap.add_argument("--json", default="", help="write every measurement here")
    ap.add_argument("--keep", default="", help="keep traces and plans under this folder")
    args = ap.parse_args(argv)
    fixed: dict[str, dict[str, str]] = {}     # variant name -> the knobs' environment
    for one in filter(None, args.setting.split(",")):
        try:
            mb, ms = (float(x) for x in one.split(":"))
        except ValueError:
            ap.error(f"--setting {one!r}: want MB:MS, e.g. 4:5")
        if not (mb > 0 and ms > 0):
            ap.error(f"--setting {one!r}: both must be positive")
        fixed[f"setting-{mb:g}MB-{ms:g}ms"] = {"HOROVOD_FUSION_THRESHOLD": str(int(mb * 2 ** 20)),
                                                "HOROVOD_CYCLE_TIME": f"{ms:g}"}
    args.pin = [x.strip() for x in args.pin.split(",")] if args.pin else None
    if args.pin is not None and len(args.pin) != 2:
        ap.error(f"--pin: {len(args.pin)} cpu lists for 2 hosts (one per host, e.g. 0,1)")
    cpu_desc = f"pinned to CPUs {args.pin} (no quota)" if args.pin else f"{args.cpus_per_host:g} CPU per host"
    from dpro_kit.optimize.driver import OptimizeOptions, optimize
    from dpro_kit.session import Session
    tune_env = dict(kv.split("=", 1) for kv in args.autotune_env.split(",") if kv)
    work = Path(tempfile.mkdtemp(prefix="dpro-hvd-ab-"))
    out: dict = {"args": vars(args), "configs": {}}
    try:
        configs = [c.rsplit("-", 1) for c in args.configs.split(",")] if args.configs else \
            [(m, r) for m in args.models.split(",") for r in args.rates.split(",")]
        for model, rate_s in configs:
            if True:
                rate = float(rate_s)
                cfg = f"{model}-{rate_s}"
                print(f"\n## {model}, 2 hosts x 1 rank, {rate_s} Mbit/s, {cpu_desc}",
                      flush=True)
                trace = work / f"T-{cfg}"
                prof_iters = int(args.prof_steps.split(":")[1]) + 3 - args.warmup
                job(args, work, model, rate, f"{cfg}-prof", iters=prof_iters, profile=trace)
                if not (trace / "manifest.json").exists():
                    print("  profiling failed; skipped", flush=True)
                    continue
                t0 = time.perf_counter()
                opts = OptimizeOptions(budget_s=args.budget, **({} if args.min_gain is None else
                                                                 {"min_gain_pct": args.min_gain}))
                done = optimize(Session(trace), opts)
                search_s = time.perf_counter() - t0
                plan = work / f"plan-{cfg}.json"
                plan.write_text(json.dumps(done.plan, indent=1))
                hv = done.plan["frameworks"]["horovod"]
                print(f"  plan: HOROVOD_FUSION_THRESHOLD={hv['HOROVOD_FUSION_THRESHOLD']} "
                      f"HOROVOD_CYCLE_TIME={hv['HOROVOD_CYCLE_TIME']:g} (keep traced: {hv['keep_traced']}); predicted "
                      f"{done.plan['predicted']['before_ms']:.2f} -> {done.plan['predicted']['after_ms']:.2f} ms; "
                      f"{hv['search']['evaluations']} settings replayed, {search_s:.1f} s including loading the trace",
                      flush=True)
                tune_info: list[dict] = []

                def autotune(cfg=cfg, model=model, rate=rate) -> float:
                    log = work / f"autotune-{cfg}-{len(tune_info)}.csv"
                    log.unlink(missing_ok=True)
                    t = job(args, work, model, rate, f"{cfg}-autotune", iters=args.autotune_iters,
                            env={"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log), **tune_env})
                    ms, info = converged_ms(t, log, args.iters) if t else (None, {"why": "job failed"})
                    tune_info.append(info)
                    print(f"  autotune: {info}", flush=True)
                    return ms if ms is not None else float("nan")

                def plain(knob_plan: Path | None, tag: str, cfg=cfg, model=model, rate=rate,
                          env: dict[str, str] | None = None) -> float:
                    t = job(args, work, model, rate, f"{cfg}-{tag}", iters=args.iters, plan=knob_plan, env=env)
                    return job_iteration_ms(t) if t else float("nan")

                others = {name: (lambda name=name, env=env: plain(None, name, env=env)) for name, env in
                          fixed.items()} or {"autotune": autotune}
                rounds = alternate({"default": lambda: plain(None, "default"), "plan": lambda: plain(plan, "plan"),
                                    **others}, args.rounds, shuffle_seed=1,
                                   on_round=lambda r, o: print(f"  round {r}: " + ", ".join(
                                       f"{k} {v[-1]:.2f} ms" for k, v in o.items()), flush=True))
                ok = [i for i in range(args.rounds) if all(v[i] == v[i] for v in rounds.values())]
                clean = {k: [v[i] for i in ok] for k, v in rounds.items()}
                if ok:
                    paired_table(clean, "default")
                    for other in others:
                        ratios = [clean['plan'][i] / clean[other][i] for i in range(len(ok))]
                        print(f"  plan / {other} (paired): median {statistics.median(ratios):.3f}, "
                              f"{sum(r <= 1 for r in ratios)} of {len(ratios)} rounds <= 1, "
                              f"range {min(ratios):.3f}..{max(ratios):.3f}")
                out["configs"][cfg] = {"rounds": rounds, "plan": hv, "predicted": done.plan["predicted"],
                                       "search_s": search_s, "autotune": tune_info}
                if args.keep:
                    dst = Path(args.keep)
                    dst.mkdir(parents=True, exist_ok=True)
                    shutil.copy(plan, dst / plan.name)
                    for f in work.glob(f"autotune-{cfg}-*.csv"):
                        shutil.copy(f, dst / f.name)
                    shutil.rmtree(dst / trace.name, ignore_errors=True)
                    shutil.copytree(trace, dst / trace.name)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
