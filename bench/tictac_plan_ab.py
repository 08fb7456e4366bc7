"""TicTac on a real MXNet PS job, the tool's own path: profile -> dpro optimize -> the job reads the plan.

    python bench/tictac_plan_ab.py --mxnet-python ~/.cache/dpro-kit/mxnet-venv/bin/python --rate-mbit 200   # root

Per bandwidth:

1. the stock job (``examples/mxnet/train.py``, 2 workers + 1 server on emulated hosts: tbf links, a
   cgroup CPU budget per host) runs once under ``dpro profile --framework mxnet`` (steps 8..10);
2. ``dpro optimize TRACE`` writes ``plan["schedule"]``: TIC / TAC / random orders of the parameter
   transfers, the replayed iteration time of each and ``recommended`` (TIC or TAC when predicted faster
   than the default, else ``default``);
3. the job runs unprofiled, variants alternating within each round (shuffled per round):
   ``default`` (the stock Trainer: a ParameterDict, sorted by name), ``recommended`` / ``tic`` /
   ``tac`` / ``random`` (``--order PLAN:NAME``: the Trainer gets a *list* of parameters in the plan's order, so key i
   is the i-th parameter of the order and Gluon issues its asynchronous ``pushpull`` ops in that order;
   no other change, no extra waits -- docs/tictac.md §4; ``--enforce chain``: also the chain of tiny
   engine ops of ``train.chain_pushes`` that makes the engine dispatch the pushpulls in that order).  When the plan recommends ``default`` the
   ``recommended`` variant is the stock job again (and when it recommends an order equal to the stock one,
   the ordered variant is the stock job with a list): the paired ratio is then the noise floor.  ``--front``
   adds ``front``: the layer order, first layer first (``--names reverse`` only; not in the plan, so not
   predicted).

Measured: per run the slowest worker's median step gap (``--steps`` after ``--warmup``); "vs default" is
the median over rounds of the ratio to the same round's default.  Predicted: ``plan["schedule"]
["predicted"]`` relative to its default.  Spreads: per round the range of the ratios (min..max).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dpro_kit.jobs import alternate, paired_ratio, run_job  # noqa: E402

TRAIN = str(REPO / "examples" / "mxnet" / "train.py")


def one_rate(args: argparse.Namespace, rate: float, work: Path) -> dict:
    common = ["--servers", "1", "--workers", str(args.workers), "--model", args.model, "--names", args.names,
              "--batch", str(args.batch), *(["--fwd-bulk", str(args.fwd_bulk)] if args.fwd_bulk else [])]
    env = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "PYTHONPATH": ""}
    kw = dict(hosts=args.workers + 1, ranks_per_host=None, rate_mbit=rate, cpus_per_host=args.cpus_per_host,
              env=env, timeout=args.timeout, prefix="zt", fail_fast=True)
    trace = work / f"trace_{rate:g}"
    with open(work / f"profile_{rate:g}.log", "w") as log:
        r = run_job([args.mxnet_python, TRAIN, *common, "--steps", "14", "--warmup", "3"], profile=trace,
                    steps="8:11", profile_flags=["--framework", "mxnet"], log=log, **kw)
    if not r.ok:
        raise SystemExit(f"profiled run failed (exit {r.codes}); log {work}/profile_{rate:g}.log")
    plan = work / f"plan_{rate:g}.json"
    dpro = [sys.executable, "-c", "import sys; from dpro_kit.cli import main; sys.exit(main())"]
    out = subprocess.run([*dpro, "optimize", str(trace), "-o", str(plan), "--budget", "10"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode != 0:
        raise SystemExit(f"dpro optimize {trace} failed: {out.stderr.strip()[-400:]}")
    sch = json.loads(plan.read_text())["schedule"]
    print(f"{rate:g} Mbit/s: plan {plan}: " + ", ".join(f"{o} {v['iteration_ms']:.1f} ms" for o, v in
                                                        sch["predicted"].items())
          + f"; recommended {sch['recommended']}", flush=True)
    variants = {"default": None, "recommended": f"{plan}:recommended", "tic": f"{plan}:tic", "tac": f"{plan}:tac",
                "random": f"{plan}:random"}
    if args.front:
        # the layer order, first layer first (what TicTac sends first when the next forward pass waits for each
        # layer's weights alone), from the trace's parameters: with --names reverse, lNN counts down from the input
        names = sorted(p["name"] for p in json.loads(next(trace.glob("*/worker*/meta.json")).read_text())["params"])
        if args.names != "reverse":
            raise SystemExit("--front needs --names reverse (the layer index is in the name)")
        front = work / "front.json"
        front.write_text(json.dumps(sorted(names, key=lambda n: (n.split("_")[0], n), reverse=True)))
        variants["front"] = str(front)
    counter = [0]
    orders: dict[str, list] = {}

    def variant(name: str, spec: str | None):
        def run() -> float:
            counter[0] += 1
            js = work / f"r{rate:g}_{name}_{counter[0]}_{{w}}.json"
            argv = [args.mxnet_python, TRAIN, *common, "--steps", str(args.steps + args.warmup),
                    "--warmup", str(args.warmup), "--json-out", str(js),
                    *(["--order", spec, "--enforce", args.enforce] if spec else [])]
            with open(work / f"r{rate:g}_{name}_{counter[0]}.log", "w") as log:
                res = run_job(argv, log=log, **kw)
            files = [Path(str(js).replace("{w}", str(i))) for i in range(args.workers)]
            if not res.ok or not all(f.exists() for f in files):
                raise SystemExit(f"{name} run {counter[0]} failed (exit {res.codes}); log in {work}")
            docs = [json.loads(f.read_text()) for f in files]
            orders[name] = docs[0].get("order") or [p[0] for p in docs[0]["params"]]
            return max(statistics.median(d["iteration_ms"]) for d in docs)
        return run

    rounds = alternate({k: variant(k, v) for k, v in variants.items()}, args.rounds, shuffle_seed=args.seed,
                       on_round=lambda i, o: print(f"  round {i + 1}/{args.rounds}: " + ", ".join(
                           f"{k} {v[-1]:.1f}" for k, v in o.items()), flush=True))
    base = sch["predicted"]["default"]["iteration_ms"]
    rows = {}
    for v, xs in rounds.items():
        ratios = [x / d for x, d in zip(xs, rounds["default"])]
        pname = sch["recommended"] if v == "recommended" else v
        pred = sch["predicted"].get(pname, {}).get("iteration_ms", float("nan"))
        rows[v] = {"measured_ms": statistics.median(xs), "runs_ms": xs,
                   "ratio": 1.0 if v == "default" else paired_ratio(rounds, v, "default"),
                   "ratio_min": min(ratios), "ratio_max": max(ratios),
                   "predicted_ms": pred, "predicted_ratio": pred / base, "order": orders.get(v)}
    return {"rate_mbit": rate, "plan": str(plan), "recommended": sch["recommended"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mxnet-python", required=True, help="the Python of an MXNet 1.9.1 venv")
    ap.add_argument("--rate-mbit", type=lambda s: [float(x) for x in s.split(",")], default=[200.0, 500.0],
                    help="link rates, comma-separated (one plan and one A/B per rate)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    ap.add_argument("--names", default="reverse", choices=("layer", "reverse"),
                    help="examples/mxnet/train.py --names (reverse: the stock name order sends the last layer first)")
    ap.add_argument("--enforce", choices=("list", "chain"), default="chain",
                    help="examples/mxnet/train.py --enforce for the ordered variants: 'list' (the Trainer built from a "
                         "list) or 'chain' (also a tiny engine op per gradient so the pushpulls are dispatched in order)")
    ap.add_argument("--front", action="store_true",
                    help="also run 'front': the layer order, first layer first (not predicted: the plan has no such order)")
    ap.add_argument("--fwd-bulk", type=int, default=0, help="examples/mxnet/train.py --fwd-bulk")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--cpus-per-host", type=float, default=0.4)
    ap.add_argument("--steps", type=int, default=15, help="measured steps per run (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--workdir", help="keep traces, plans and runs here (default: a new temporary folder)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tictac-plan-"))
    work.mkdir(parents=True, exist_ok=True)
    results = [one_rate(args, r, work) for r in args.rate_mbit]
    print(f"\nMXNet 1.9.1 dist_sync, {args.model} (--names {args.names}, --enforce {args.enforce}"
          + (f", --fwd-bulk {args.fwd_bulk}" if args.fwd_bulk else "") + f"), batch {args.batch}, "
          f"{args.workers} workers + 1 server, {args.cpus_per_host:g} CPU per host, {args.steps} steps after "
          f"{args.warmup} warm-up, {args.rounds} alternating rounds; orders from dpro optimize of a profiled run")
    hdr = (f"{'Mbit/s':>6} {'variant':<12} {'order':<8} {'measured ms':>11} {'vs default':>10} "
           f"{'per-round range':>17} {'predicted ms':>12} {'vs default':>10}")
    print(hdr)
    print("-" * len(hdr))
    for res in results:
        for v, r in res["rows"].items():
            o = res["recommended"] if v == "recommended" else v
            print(f"{res['rate_mbit']:>6g} {v:<12} {o:<8} {r['measured_ms']:>11.1f} {100 * (r['ratio'] - 1):>+9.1f}% "
                  f"{100 * (r['ratio_min'] - 1):>+7.1f}..{100 * (r['ratio_max'] - 1):+.1f}% "
                  f"{r['predicted_ms']:>12.1f} {100 * (r['predicted_ratio'] - 1):>+9.1f}%")
        for v in ("default", "tac", "front"):
            if v not in res["rows"]:
                continue
            print(f"       {v} order (key 0 first): {res['rows'][v]['order']}")
    print(f"(work folder {work})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
