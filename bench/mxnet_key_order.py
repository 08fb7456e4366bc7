"""When does each parameter's pushpull complete? One host of a real MXNet PS job (run with MXNet's Python).

    python bench/mxnet_key_order.py --run ~/.cache/dpro-kit/mxnet-venv/bin/python --rate-mbit 200   # root
    dpro cluster --hosts 3 --rate-mbit 100 -- ~/.cache/dpro-kit/mxnet-venv/bin/python bench/mxnet_key_order.py \
        --names reverse [--order front|ORDER.json] [--enforce chain] --json-out /tmp/keys{w}.json

``--run MXPY`` (in dpro's Python) runs the job on 3 emulated hosts (2 workers + 1 server,
``--rate-mbit``, ``--cpus-per-host``) four times -- stock Trainer, list in layer order, ``chain`` in
name order, ``chain`` in layer order -- and prints worker 0's completion order per step.

The job of ``examples/mxnet/train.py`` (same roles, model, ``--names``, ``--order``), except that after
each ``Trainer.step`` one thread per parameter blocks in ``param.data().wait_to_read()`` -- which returns
when the parameter's ``pushpull`` engine op has written the pulled weight -- and stamps the time.  The
worker writes, per step, the parameters in completion order with their completion time (ms after
``step`` returned) and the order the Trainer issued them (key 0 first).  This is what
docs/tictac.md §4 uses to check what a Trainer built from a *list* changes on the wire.
``--order front`` is the layer order (first layer first) of the ``--names reverse`` model.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "mxnet"))

import train  # noqa: E402  (examples/mxnet/train.py)


def run_worker(args: argparse.Namespace, index: int) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon
    mx.random.seed(index)
    kv = mx.kv.create("dist_sync")
    net = train.build(args.model, 10, args.names)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize(**({"forward_bulk_size": args.fwd_bulk} if args.fwd_bulk else {}))
    params = net.collect_params()
    names = sorted(params.keys())
    if args.order == "front":
        layer = [n for n in names if n.endswith("_weight")]
        order = [f"{w[:-len('_weight')]}_{k}" for w in reversed(layer) for k in ("weight", "bias")]
    else:
        order = train.transfer_order(args.order, names) if args.order else None
    trainer = gluon.Trainer(params if order is None else [params[n] for n in order], "sgd",
                            {"learning_rate": 0.01}, kvstore=kv)
    x = mx.nd.random.uniform(shape=(args.batch, args.features))
    y = mx.nd.random.randint(0, 10, shape=(args.batch,)).astype("float32")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = []
    for it in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if args.enforce == "chain" and order is not None:
            train.chain_pushes(mx, trainer._params)
        trainer.step(args.batch)
        t0 = time.perf_counter()
        done: dict[str, float] = {}

        def wait(p) -> None:
            p.data().wait_to_read()
            done[p.name] = 1e3 * (time.perf_counter() - t0)

        threads = [threading.Thread(target=wait, args=(p,)) for p in trainer._params]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if it >= args.warmup:
            steps.append([[n, round(ms, 2)] for n, ms in sorted(done.items(), key=lambda kv: kv[1])])
    mx.nd.waitall()
    with open(args.json_out.replace("{w}", str(index)), "w") as f:
        json.dump({"worker": index, "issued": [p.name for p in trainer._params],
                   "bytes": {p.name: int(p.data().size) * 4 for p in trainer._params}, "steps": steps}, f)


def drive(args: argparse.Namespace) -> int:
    import tempfile
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpro_kit.jobs import run_job
    work = Path(tempfile.mkdtemp(prefix="key-order-"))
    names = sorted(f"l{l:02d}_{k}" for l in range(6) for k in ("weight", "bias"))
    (work / "name.json").write_text(json.dumps(names))
    cases = {"stock (dict)": [], "list, layer order": ["--order", "front"],
             "chain, name order": ["--order", str(work / "name.json"), "--enforce", "chain"],
             "chain, layer order": ["--order", "front", "--enforce", "chain"]}
    short = lambda n: n.replace("_weight", "W").replace("_bias", "b")  # noqa: E731
    for i, (case, extra) in enumerate(cases.items()):
        out = work / f"c{i}_{{w}}.json"
        with open(work / f"c{i}.log", "w") as log:
            r = run_job([args.run, __file__, "--json-out", str(out), "--names", "reverse", *extra], hosts=3,
                        ranks_per_host=None, rate_mbit=args.rate_mbit, cpus_per_host=args.cpus_per_host,
                        env={"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "PYTHONPATH": ""},
                        log=log, timeout=200, prefix="zt", fail_fast=True)
        if not r.ok:
            raise SystemExit(f"{case}: job failed (exit {r.codes}); log {work}/c{i}.log")
        d = json.loads(Path(str(out).replace("{w}", "0")).read_text())
        print(f"{case}: issued (key 0 first) {' '.join(map(short, d['issued']))}")
        for st in d["steps"]:
            print("   completed (ms after step): " + " ".join(f"{short(n)}@{ms:.0f}" for n, ms in st))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", metavar="MXPY", help="drive the four cases on emulated hosts (see above)")
    ap.add_argument("--rate-mbit", type=float, default=200.0)
    ap.add_argument("--cpus-per-host", type=float, default=0.4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--names", choices=("layer", "reverse"), default="reverse")
    ap.add_argument("--fwd-bulk", type=int, default=0)
    ap.add_argument("--order", default="", help="'front', PLAN.json[:NAME] or a JSON list (train.py --order)")
    ap.add_argument("--enforce", choices=("list", "chain"), default="list", help="train.py --enforce")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--port", type=int, default=9391)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    if args.run:
        return drive(args)
    if not args.json_out:
        ap.error("--json-out is required (or --run)")
    args.servers = 1
    host = int(os.environ.get("HOST_RANK", "0"))
    if host == 0:
        import subprocess
        procs = [subprocess.Popen([sys.executable, "-c", "import mxnet"], env=train.ps_env(r, args))
                 for r in ("server", "scheduler")]
        return max(p.wait() for p in procs)
    os.environ.update(train.ps_env("worker", args))
    run_worker(args, host - 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
