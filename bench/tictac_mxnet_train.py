"""One host of a real MXNet parameter-server job for bench/tictac_ab.py (run with MXNet's own Python).

Standard library + MXNet 1.9.1 only (MXNet needs numpy<1.24 and its own venv).  Every
host runs this file; ``HOST_RANK`` (set by :func:`dpro_kit.jobs.run_job`) picks the roles:
host 0 runs the scheduler and the server, host *i* > 0 worker *i-1*.  ``MASTER_ADDR`` /
``GLOO_SOCKET_IFNAME`` (set by ``run_job``) become ``DMLC_PS_ROOT_URI`` / ``DMLC_INTERFACE``.

The worker trains a Gluon MLP on synthetic data with ``kvstore=dist_sync`` (update on the
server: ``Trainer.step`` calls ``kvstore.pushpull(i, grad, out=weight, priority=-i)`` per
parameter).  MXNet's CPU engine runs kvstore ops from a FIFO queue and ignores
``priority=`` (docs/tictac.md §3), so the order on the wire is the order in which ready ops
are issued.  The transfer order (``--order-file``, a JSON list of parameter indices, first
received first) is enforced in one of two ways (``--mechanism``):

* ``pull`` (default; TicTac orders the recvs): push every gradient as it is computed (as the
  stock Trainer does), wait until every push is acknowledged (in ``dist_sync`` the server
  answers a push once all workers' pushes of that key are aggregated and applied), then
  issue the pulls in the order; the server answers them in that order on its link;
* ``pushpull``: wait until every gradient is computed, then issue ``pushpull`` in the order
  (costs the overlap of the backward pass with the first pushes).

Without ``--order-file`` the Trainer is stock (``default``).

Timing: the worker stamps the moment each iteration's loss is computed (the forward pass
waits for the pulls of the previous iteration, layer by layer) and writes the gaps
between stamps after ``--warmup`` iterations to ``--json-out`` (``{w}`` = worker index).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WIDTHS = "512,1024,512,512,256,256,256,256,128,128,64,10"   # Dense widths; the first layers hold most parameters


def _ps_env(role: str, workers: int) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": os.environ.get("MASTER_ADDR", "127.0.0.1"),
              "DMLC_PS_ROOT_PORT": os.environ.get("DMLC_PS_ROOT_PORT", "9391"),
              "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": "1",
              "DMLC_INTERFACE": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
              "OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"})
    return e


def _net(args: argparse.Namespace):
    import mxnet as mx
    from mxnet import gluon
    widths = [int(w) for w in args.widths.split(",")]
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    for w in widths[:-1]:
        net.add(gluon.nn.Dense(w, activation="relu"))
    net.add(gluon.nn.Dense(widths[-1]))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net, widths


def time_layers(args: argparse.Namespace) -> None:
    """Forward / backward time of every layer alone (median of 15, ms), parameter names and sizes in the
    Trainer's order, and the server's SGD update cost per byte: the time oracle of the bench's DFG."""
    import statistics

    import mxnet as mx
    from mxnet import autograd, gluon
    net, widths = _net(args)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=None)
    x = mx.nd.random.uniform(shape=(args.batch, args.features))
    net(x).wait_to_read()
    fw, bw = [], []
    for layer in net:
        layer.hybridize()
        xs, fs, bs = x, [], []
        for _ in range(15):
            xs.attach_grad()
            t0 = time.perf_counter()
            with autograd.record():
                out = layer(xs)
            out.wait_to_read()
            t1 = time.perf_counter()
            out.backward()
            mx.nd.waitall()
            bs.append(time.perf_counter() - t1)
            fs.append(t1 - t0)
        fw.append(1e3 * statistics.median(fs))
        bw.append(1e3 * statistics.median(bs))
        x = out.detach()
    w = mx.nd.random.uniform(shape=(1 << 20,))
    g = mx.nd.random.uniform(shape=(1 << 20,))
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        mx.nd.sgd_update(w, g + g, lr=0.01, out=w)
        w.wait_to_read()
        ts.append(time.perf_counter() - t0)
    with open(args.json_out, "w") as f:
        json.dump({"fw_ms": fw, "bw_ms": bw, "params": [p.name for p in trainer._params],
                   "bytes": [int(p.data().size) * 4 for p in trainer._params],
                   "layer_of": [[i for i, layer in enumerate(net) if p.name in layer.collect_params()][0]
                                for p in trainer._params],
                   "update_ms_per_mb": 1e3 * statistics.median(ts) / 4.0}, f)


def run_worker(args: argparse.Namespace, index: int) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon

    net, widths = _net(args)
    net.hybridize()
    kv = mx.kv.create("dist_sync")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    x = mx.nd.random.uniform(shape=(args.batch, args.features))
    y = mx.nd.random.randint(0, widths[-1], shape=(args.batch,)).astype("float32")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    order = None
    if args.order_file:
        with open(args.order_file) as f:
            order = [int(i) for i in json.load(f)]

    def ordered_allreduce() -> None:
        params = trainer._params
        if args.mechanism == "pushpull":
            for p in params:                    # every gradient computed: the FIFO engine keeps issue order
                p.list_grad()[0].wait_to_read()
            for pos, i in enumerate(order):
                p = params[i]
                trainer._kvstore.pushpull(i, p.list_grad(), out=p.list_data(), priority=-pos)
            return
        # "pull": push each gradient as it is computed (as stock Gluon does), wait until every push is
        # acknowledged (dist_sync: aggregated and applied on the server), then pull the weights in order
        for i, p in enumerate(params):
            trainer._kvstore.push(i, p.list_grad(), priority=-i)
        mx.nd.waitall()                         # nothing else is queued: returns once every push is acknowledged
        for pos, i in enumerate(order):
            p = params[i]
            trainer._kvstore.pull(i, out=p.list_data(), priority=-pos)

    stamps = []
    for it in range(args.warmup + args.iters + 1):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.wait_to_read()
        stamps.append(time.perf_counter())
        loss.backward()
        if order is not None and trainer._kv_initialized and it > 0:
            trainer._allreduce_grads = ordered_allreduce
        trainer.step(args.batch)
    mx.nd.waitall()
    gaps = [1e3 * (b - a) for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
    names = [p.name for p in trainer._params]
    sizes = [int(p.data().size) * 4 for p in trainer._params]
    with open(args.json_out.replace("{w}", str(index)), "w") as f:
        json.dump({"worker": index, "iteration_ms": gaps, "params": names, "bytes": sizes,
                   "order": order, "loss": float(loss.mean().asscalar())}, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--widths", default=WIDTHS, help="Dense layer widths, comma-separated")
    ap.add_argument("--time-layers", action="store_true", help="time each layer alone (no PS job) and exit")
    ap.add_argument("--order-file", default="")
    ap.add_argument("--mechanism", choices=("pull", "pushpull"), default="pull",
                    help="how --order-file is enforced: 'pull' (push as gradients are ready, then pull in order) "
                         "or 'pushpull' (wait for every gradient, then pushpull in order)")
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()
    if args.time_layers:
        os.environ.update({"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"})
        time_layers(args)
        return 0
    host = int(os.environ.get("HOST_RANK", "0"))
    if host == 0:
        sched = subprocess.Popen([sys.executable, "-c", "import mxnet"], env=_ps_env("scheduler", args.workers))
        server = subprocess.Popen([sys.executable, "-c", "import mxnet"], env=_ps_env("server", args.workers))
        code = server.wait()
        sched.wait()
        return code
    os.environ.update(_ps_env("worker", args.workers))
    run_worker(args, host - 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
