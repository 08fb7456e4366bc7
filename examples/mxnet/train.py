"""One host of a real MXNet 1.9.1 parameter-server job (Gluon, synthetic data); run it with MXNet's Python.

Standard library + MXNet only. Every host of the job runs this file (``dpro_kit.jobs.run_job``
with ``ranks_per_host=None`` sets ``HOST_RANK``, ``MASTER_ADDR`` and ``GLOO_SOCKET_IFNAME``);
with ``--servers S --workers W`` host 0 runs the scheduler and server 0, host ``i < S`` server
``i``, host ``S + j`` worker ``j`` (S + W hosts). Each role is its own process, started with
``DMLC_ROLE``, ``DMLC_PS_ROOT_URI/PORT`` (host 0's address), ``DMLC_NUM_WORKER/SERVER`` and
``DMLC_INTERFACE`` (this host's interface), so ps-lite binds every process to its own host.

The worker trains ``--model`` (``mlp``: Dense layers; ``cnn``: a small conv net) with
``gluon.Trainer(kvstore=dist_sync | dist_async)`` and writes the gaps between Trainer steps
(after ``--warmup``) to ``--json-out`` (``{w}`` = worker index): the measured iteration time
of an unprofiled run. Run under ``dpro profile --framework mxnet`` the same command is profiled.

Example (3 emulated hosts, 200 Mbit/s)::

    dpro cluster --hosts 3 --rate-mbit 200 -- ~/.cache/dpro-kit/mxnet-venv/bin/python \
        examples/mxnet/train.py --servers 1 --workers 2 --steps 30 --json-out /tmp/w{w}.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def ps_env(role: str, args: argparse.Namespace) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": os.environ.get("MASTER_ADDR", "127.0.0.1"),
              "DMLC_PS_ROOT_PORT": os.environ.get("DMLC_PS_ROOT_PORT", str(args.port)),
              "DMLC_NUM_WORKER": str(args.workers), "DMLC_NUM_SERVER": str(args.servers),
              "DMLC_INTERFACE": os.environ.get("GLOO_SOCKET_IFNAME", "lo")})
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    return e


def build(model: str, classes: int):
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    if model == "mlp":
        for w in (512, 512, 256, 256, 128):
            net.add(gluon.nn.Dense(w, activation="relu"))
    elif model == "cnn":
        net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
                gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
                gluon.nn.Conv2D(64, 3, padding=1, activation="relu"), gluon.nn.GlobalAvgPool2D(),
                gluon.nn.Dense(256, activation="relu"))
    else:
        raise SystemExit(f"unknown --model {model!r}: mlp or cnn")
    net.add(gluon.nn.Dense(classes))
    return net


def run_worker(args: argparse.Namespace, index: int) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon
    mx.random.seed(index)
    kv = mx.kv.create(args.kvstore)
    net = build(args.model, 10)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    shape = (args.batch, args.features) if args.model == "mlp" else (args.batch, 3, args.image, args.image)
    x = mx.nd.random.uniform(shape=shape)
    y = mx.nd.random.randint(0, 10, shape=(args.batch,)).astype("float32")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    stamps = []
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch)
        loss.wait_to_read()
        stamps.append(time.time())
    mx.nd.waitall()
    if args.json_out:
        gaps = [1e3 * (b - a) for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
        with open(args.json_out.replace("{w}", str(index)), "w") as f:
            json.dump({"worker": index, "rank": kv.rank, "iteration_ms": gaps, "model": args.model,
                       "kvstore": args.kvstore, "params": [[p.name, int(p.data().size) * 4] for p in trainer._params],
                       "loss": float(loss.mean().asscalar())}, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--kvstore", choices=("dist_sync", "dist_async"), default="dist_sync")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--port", type=int, default=9391, help="DMLC_PS_ROOT_PORT unless that is set")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    host = int(os.environ.get("HOST_RANK", "0"))
    if host < args.servers:
        procs = [subprocess.Popen([sys.executable, "-c", "import mxnet"], env=ps_env("server", args))]
        if host == 0:
            procs.append(subprocess.Popen([sys.executable, "-c", "import mxnet"], env=ps_env("scheduler", args)))
        return max(p.wait() for p in procs)
    os.environ.update(ps_env("worker", args))
    run_worker(args, host - args.servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
