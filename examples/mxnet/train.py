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


def build(model: str, classes: int, names: str = "layer"):
    """The Gluon net. ``names="reverse"``: every layer with parameters gets the prefix ``lNN_`` with NN
    counting down from the input, so Gluon's Trainer (which sorts a ParameterDict by name and gives key i
    to the i-th name) issues the last layer first -- a name order far from the layer order."""
    from mxnet import gluon
    nn = gluon.nn
    if model == "mlp":
        specs = [(nn.Dense, (w,), {"activation": "relu"}) for w in (512, 512, 256, 256, 128)]
    elif model == "cnn":
        specs = [(nn.Conv2D, (16, 3), {"padding": 1, "activation": "relu"}), (nn.MaxPool2D, (2,), {}),
                 (nn.Conv2D, (32, 3), {"padding": 1, "activation": "relu"}), (nn.MaxPool2D, (2,), {}),
                 (nn.Conv2D, (64, 3), {"padding": 1, "activation": "relu"}), (nn.GlobalAvgPool2D, (), {}),
                 (nn.Dense, (256,), {"activation": "relu"})]
    else:
        raise SystemExit(f"unknown --model {model!r}: mlp or cnn")
    specs.append((nn.Dense, (classes,), {}))
    weighted = [i for i, (cls, _, _) in enumerate(specs) if cls in (nn.Dense, nn.Conv2D)]
    net = nn.HybridSequential()
    for i, (cls, a, kw) in enumerate(specs):
        if names == "reverse" and i in weighted:
            kw = {**kw, "prefix": f"l{len(weighted) - 1 - weighted.index(i):02d}_"}
        net.add(cls(*a, **kw))
    return net


def _bad(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def transfer_order(spec: str, names: list[str]) -> list[str] | None:
    """Parameter names in the transfer order that ``spec`` names, or None for the stock (name-sorted) order.

    ``spec`` is ``PLAN.json[:ORDER]`` -- a plan of ``dpro optimize`` (``plan["schedule"]``, docs/tictac.md;
    ORDER: ``recommended`` (default), ``tic``, ``tac``, ``random``) -- or a JSON file with a list of names.
    MXNet keys a parameter by its position in the Trainer's list, and every worker must use the same keys,
    so one order serves all workers: the plan's first worker's (they agree for data-parallel workers).
    A tensor group of the plan (``plan["tensor_groups"]``, fused tensors) stands for its members, in name order.
    Parameters the order does not name follow in name order. Bad input: one line naming the file, exit 2.
    """
    path, _, which = spec.partition(":")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        _bad(f"{path}: cannot read the transfer order ({e}); give a plan.json of `dpro optimize` "
             "or a JSON list of parameter names")
    if isinstance(doc, list):
        seq = [str(x) for x in doc]
    else:
        sch = doc.get("schedule") if isinstance(doc, dict) else None
        if not isinstance(sch, dict) or "orders" not in sch:
            _bad(f"{path}: no plan['schedule'] (dpro optimize writes it for a PS trace); "
                             "profile the job with `dpro profile --framework mxnet` and run `dpro optimize` on it")
        which = which or "recommended"
        if which == "recommended":
            which = sch.get("recommended", "default")
        if which == "default":
            return None
        if which not in sch["orders"]:
            _bad(f"{path}: the plan has no order {which!r} (known: recommended, default, "
                             + ", ".join(sorted(sch["orders"])) + ")")
        per_worker = sch["orders"][which]
        entries = per_worker[sorted(per_worker)[0]]
        # the plan's DFG may fuse tensors into groups (plan["tensor_groups"]): a group's members go together
        members = {g["name"]: list(g["tensors"]) for g in doc.get("tensor_groups", [])
                   if isinstance(g, dict) and "name" in g and "tensors" in g}
        seq = [n for e in sorted(entries, key=lambda e: (e["rank"], e["tensor"], e["chunk"]))
               for n in sorted(members.get(e["tensor"], [e["tensor"]]))]
    known = set(names)
    unknown = sorted({n for n in seq if n not in known})
    if unknown:
        _bad(f"{path}: the order names parameters this model does not have ({', '.join(unknown[:3])}); "
                         "was the plan made from a trace of this model?")
    out = list(dict.fromkeys(seq))
    return out + sorted(n for n in names if n not in set(out))


def chain_pushes(mx, params) -> None:
    """Make the pushpull of ``params[k]`` ready only after that of ``params[k-1]`` (call after ``backward``).

    MXNet's engine dispatches the pushpull ops whose gradients one backward segment completes in an order of
    its own, not the Trainer's issue order (docs/tictac.md §4). This adds, per parameter k >= 1, two tiny
    engine ops: ``t = zeros_like(grad[k-1][first element])`` and ``grad[k] += t`` (in place, broadcast). The pushpull of
    key k reads ``grad[k]``, so it waits for the add, which waits for ``t``; ``t`` becomes ready together
    with the pushpull of key k-1 and was queued before it. Cost: one pass over every gradient but the
    first; a gradient computed early waits for the ones before it in the order (overlap with the rest of
    the backward pass is lost when the order runs against it).
    """
    prev = None
    for p in params:
        g = p.list_grad()[0]
        if prev is not None:
            head = prev.reshape((-1,))[0:1]                     # a view: reading it waits for prev's writes
            mx.nd.broadcast_add(g, mx.nd.zeros_like(head).reshape((1,) * g.ndim), out=g)
        prev = g


def run_worker(args: argparse.Namespace, index: int) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon
    mx.random.seed(index)
    kv = mx.kv.create(args.kvstore)
    net = build(args.model, 10, args.names)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize(**({"forward_bulk_size": args.fwd_bulk} if args.fwd_bulk else {}))
    params = net.collect_params()
    spec = args.order or os.environ.get("DPRO_TRANSFER_ORDER", "")
    order = transfer_order(spec, sorted(params.keys())) if spec else None
    # a dict: Gluon sorts it by name (key i = i-th name); a list: key i = i-th parameter of the order, and the
    # Trainer issues its asynchronous pushpull ops in that order (docs/tictac.md §4)
    trainer = gluon.Trainer(params if order is None else [params[n] for n in order], "sgd",
                            {"learning_rate": 0.01}, kvstore=kv)
    shape = (args.batch, args.features) if args.model == "mlp" else (args.batch, 3, args.image, args.image)
    x = mx.nd.random.uniform(shape=shape)
    y = mx.nd.random.randint(0, 10, shape=(args.batch,)).astype("float32")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    stamps = []
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if args.enforce == "chain" and order is not None:
            chain_pushes(mx, trainer._params)
        trainer.step(args.batch)
        loss.wait_to_read()
        stamps.append(time.time())
    mx.nd.waitall()
    if args.json_out:
        gaps = [1e3 * (b - a) for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
        with open(args.json_out.replace("{w}", str(index)), "w") as f:
            json.dump({"worker": index, "rank": kv.rank, "iteration_ms": gaps, "model": args.model,
                       "kvstore": args.kvstore, "order": order, "params": [[p.name, int(p.data().size) * 4] for p in trainer._params],
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
    ap.add_argument("--names", choices=("layer", "reverse"), default="layer",
                    help="parameter names: Gluon's (dense0, dense1, ...) or 'reverse' (sorted by name, the last "
                         "layer first)")
    ap.add_argument("--fwd-bulk", type=int, default=0,
                    help="hybridize(forward_bulk_size=N): ops per forward engine segment (default: MXNet's 15); "
                         "1 lets layer l's forward wait for layer l's weights only")
    ap.add_argument("--enforce", choices=("list", "chain"), default="chain",
                    help="how --order reaches the wire: 'chain' (default: the Trainer gets the parameters as a list "
                         "in that order, and a tiny engine op per gradient makes the engine dispatch the pushpulls "
                         "in that order) or 'list' (the list alone: keys and issue order; MXNet's engine then "
                         "dispatches the pushpulls of one backward segment in its own order, docs/tictac.md §4)")
    ap.add_argument("--order", default="",
                    help="transfer order: PLAN.json[:recommended|tic|tac|random|default] (dpro optimize) or a "
                         "JSON list of parameter names; default: $DPRO_TRANSFER_ORDER, else Gluon's name order")
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
