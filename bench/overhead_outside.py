"""What the PyTorch collector costs OUTSIDE its profiling window (launch-bound CPU jobs).

Runs ``examples/ddp/train.py`` (gloo, tiny batch: per-op Python/dispatch time is the iteration
time, as for small models on a GPU) plain and under ``dpro profile --steps A:B``, alternating
the variants round by round, and compares per-iteration times (train.py's own ``--json-out``
timer, every rank) before the window (steps 3..A-1) and after it (steps B+2..end)::

    python bench/overhead_outside.py --model transformer --rounds 3
    python bench/overhead_outside.py --variant nograd=DPRO_GRAD_READY=0 --variant noprobe=DPRO_CLOCK_PROBE=0

``--variant NAME=VAR=VALUE[,VAR=VALUE]`` adds a profiled run with those collector variables
(``steps=A:B`` instead gives that run its own window, e.g. ``armed=steps=1000:1001``: the
collector loaded and counting, its window never opening).
Prints one table (median over rounds of the per-round medians, all ranks pooled) and, with
``--json``, the raw numbers.  The window itself (steps A..B) and the two iterations after it
(trace export) are not compared.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(variant_env: dict[str, str] | None, args, tmp: Path, tag: str) -> dict[str, list[float]]:
    out = tmp / f"{tag}.json"
    cmd = [sys.executable, str(ROOT / "examples/ddp/train.py"), "--nproc", str(args.nproc), "--model", args.model,
           "--batch-size", str(args.batch_size), "--warmup", "0", "--iters", str(args.iters), "--quiet",
           "--json-out", str(out)]
    env = dict(os.environ)
    if variant_env is not None:
        variant_env = dict(variant_env)
        steps = variant_env.pop("steps", args.steps)
        env.update(variant_env)
        cmd = [sys.executable, "-m", "dpro_kit", "profile", "--steps", steps, "--out", str(tmp / f"{tag}-trace"),
               "--"] + cmd
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    times = json.loads(out.read_text())["iteration_times_s"]
    return {r: [t * 1e3 for t in ts] for r, ts in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="transformer", choices=("mlp", "cnn", "transformer"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--steps", default="10:15")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    a, b = (int(x) for x in args.steps.split(":"))
    variants: dict[str, dict[str, str] | None] = {"plain": None, "profiled": {}}
    for v in args.variant:
        name, _, rest = v.partition("=")
        if not name or "=" not in rest:
            ap.error(f"--variant {v!r}: expected NAME=VAR=VALUE[,VAR=VALUE]")
        variants[name] = dict(kv.split("=", 1) for kv in rest.split(","))
    res: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(prefix="dpro-ovh-") as td:
        for k in range(args.rounds):
            for name, env in variants.items():
                times = run(env, args, Path(td), f"{name}-{k}")
                pre = [t for ts in times.values() for t in ts[3:a]]
                post = [t for ts in times.values() for t in ts[b + 2:]]
                res[name].append({"pre_ms": st.median(pre), "post_ms": st.median(post)})
                print(f"round {k + 1} {name:>10}: before {res[name][-1]['pre_ms']:.3f} ms  "
                      f"after {res[name][-1]['post_ms']:.3f} ms", file=sys.stderr, flush=True)
    base_pre = st.median(r["pre_ms"] for r in res["plain"])
    base_post = st.median(r["post_ms"] for r in res["plain"])
    print(f"{args.model}, {args.nproc} ranks, batch {args.batch_size}, {args.iters} iterations, window {args.steps}, "
          f"{args.rounds} rounds (median of per-round medians, all ranks)")
    print("| variant | before window (steps 3..%d) | vs plain | after window (steps %d..) | vs plain |" % (a - 1, b + 2))
    print("|---|---|---|---|---|")
    for name, rows in res.items():
        pre = st.median(r["pre_ms"] for r in rows)
        post = st.median(r["post_ms"] for r in rows)
        print(f"| {name} | {pre:.3f} ms | {100 * (pre / base_pre - 1):+.1f} % | {post:.3f} ms | "
              f"{100 * (post / base_post - 1):+.1f} % |")
    if args.json:
        print(json.dumps({"args": vars(args), "rounds": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
