"""TicTac A/B: default vs TIC vs TAC vs a random transfer order (seed 003; docs/tictac.md).

    python bench/tictac_ab.py --synthetic                 # replayer only: bench/synthetic.py PS graphs
    python bench/tictac_ab.py --mxnet-python ~/.cache/dpro-kit/mxnet-venv/bin/python   # real MXNet PS jobs (root)

Real mode: a 2-worker / 1-server MXNet ``dist_sync`` job (``bench/tictac_mxnet_train.py``,
a Gluon MLP on synthetic data) on emulated hosts (``dpro_kit.jobs.run_job``: host 0 runs the
scheduler and the server, hosts 1.. one worker each; tbf-shaped links, a cgroup CPU budget
per host), run as

* ``default`` -- the stock Gluon Trainer (pushpull per parameter as its gradient is ready);
* ``index``   -- pulls in the Trainer's parameter order (the control: the same mechanism as the
  orders below, with Gluon's own ``priority=-i`` order -- its parameters sorted by name);
* ``tic`` / ``tac`` / ``random`` -- the same mechanism in TicTac's orders / a random one.

``--mechanism pull`` (default): gradients are pushed as they are computed, the worker waits for
every push to be acknowledged, then pulls in the order; ``--mechanism pushpull``: the worker
waits for every gradient, then issues ``pushpull`` in the order (``bench/tictac_mxnet_train.py``).

The orders come from a DFG of the job built here (the time oracle of TicTac §5): per layer
forward / backward times measured by ``tictac_mxnet_train.py --time-layers`` under the same
CPU budget, the parameters' sizes, the server's SGD update cost per byte, links at the tbf
rate (95.6 % goodput) shared at the server (its upload carries every pull, its download every
push), per-parameter iteration edges (the next forward of layer l waits for layer l's pull, as
MXNet's engine runs it) and, for the ordered variants, the mechanism's extra waits (every pull
after every aggregation, or every push after the last backward op).
The replayer's prediction of each variant is printed next to the measurement.  Variants
alternate within each round (``dpro_kit.jobs.alternate``, shuffled per round); ratios are paired
within rounds.  Spread: across iterations, (p90 - p10) / median of each worker's iteration
times; across workers, (max - min) / mean of the workers' medians; medians over rounds.

``--synthetic`` replays PS graphs of :mod:`synthetic` (``next_iteration="per_layer"``:
the next forward of layer l waits only for its own pull, as MXNet's engine runs it;
``--barrier``: every op of the next iteration waits for every pull) under each order
and prints, per graph, the replayed iteration time (steady state of ``--iterations``),
TicTac's scheduling efficiency E and speed-up bound S (reference worker), and the
change against the default order.  No MXNet needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402
from dpro_kit.optimize import tictac  # noqa: E402
from dpro_kit.replay import replay  # noqa: E402

ORDERS = ("default", "tic", "tac", "random")


def predict(g, iterations: int) -> dict[str, dict[str, float]]:
    """Replayed iteration time (ms), E and S of ``g`` under each order."""
    out = {}
    for o in ORDERS:
        res = replay(g, iterations=iterations, schedule="graph" if o == "default" else o)
        e = tictac.scheduling_efficiency(res, g)
        out[o] = {"ms": res.iteration_time_us / 1e3, "E": e.get("E"), "S": e.get("S")}
    return out


def synthetic_table(args: argparse.Namespace) -> list[dict]:
    rows = []
    print(f"replayed PS graphs (bench/synthetic.py, next iteration: {'barrier' if args.barrier else 'per layer'}, "
          f"{args.ranks_per_host} worker(s) per host sharing its links, layer gradients up to {args.max_mb:g} MiB, "
          f"{args.iterations} iterations, steady state); ms, E in brackets; change vs default")
    print(f"{'ranks':>5} {'srv':>3} {'layers':>6} {'seed':>4} {'S':>5} "
          + " ".join(f"{o:>17}" for o in ORDERS))
    for servers in args.servers:
        for seed in range(args.seeds):
            g = synthetic.synthetic_dfg(ranks=args.ranks, layers=args.layers, buckets=args.buckets, comm="ps",
                                        servers=servers, update="layer", seed=seed,
                                        ranks_per_host=args.ranks_per_host, max_bytes=int(args.max_mb * 2**20),
                                        next_iteration="barrier" if args.barrier else "per_layer")
            p = predict(g, args.iterations)
            base = p["default"]["ms"]
            cells = [f"{v['ms']:7.2f} [{v['E']:.2f}] {100 * (v['ms'] / base - 1):+5.1f}%" for v in p.values()]
            print(f"{args.ranks:>5} {servers:>3} {args.layers:>6} {seed:>4} {p['default']['S']:>5.2f} " + " ".join(cells))
            rows.append({"ranks": args.ranks, "servers": servers, "layers": args.layers, "seed": seed, **p})
    for o in ORDERS[1:]:
        ch = sorted(100 * (r[o]["ms"] / r["default"]["ms"] - 1) for r in rows)
        print(f"{o:>7}: change vs default over {len(ch)} graphs: median {ch[len(ch) // 2]:+.1f} %, "
              f"best {ch[0]:+.1f} %, worst {ch[-1]:+.1f} %")
    return rows


# ----------------------------------------------------------------------------- real MXNet jobs

def build_mxnet_dfg(doc: dict, *, workers: int, rate_mbit: float, latency_us: float, gated: str | None = None):
    """The DFG of ``tictac_mxnet_train.py``'s job from its ``--time-layers`` output (see the module docstring).

    ``gated``: None for the stock Trainer; ``"pull"``: every pull of a worker after every aggregation
    (the worker waits for all push acknowledgements, then pulls); ``"pushpull"``: every push of a
    worker after its last backward op.
    """
    import networkx as nx

    from dpro_kit.costmodel import CommModel, LinkModel
    from dpro_kit.graph.model import add_op, op_key
    from dpro_kit.graph.topology import CommContext, Links, ps_push_pull
    from dpro_kit.trace import Collective, Manifest, NodeInfo

    class ServerSideLinks(Links):
        """Every push queues on the server host's download, every pull on its upload (the shared tbf)."""

        def device(self, src: str, dst: str) -> str:
            return "link:host0:download" if dst == "s0" else "link:host0:upload"

    ws = [f"w{i}" for i in range(workers)]
    nodes = {w: NodeInfo(host=f"host{i + 1}", role="worker", rank=i) for i, w in enumerate(ws)}
    nodes["s0"] = NodeInfo(host="host0", role="server", rank=0)
    manifest = Manifest(job="tictac-mxnet", framework="mxnet", comm_backend="ps", world_size=workers, nodes=nodes,
                        iterations=[0])
    n = len(doc["fw_ms"])
    g = nx.DiGraph()
    for w in ws:
        prev = None
        for l in range(n):
            k = add_op(g, op_key(w, f"FW L{l}"), node=w, device=f"{w}:compute", kind="FW", dur=1e3 * doc["fw_ms"][l],
                       name=f"dense{l} forward")
            if prev:
                g.add_edge(prev, k)
            prev = k
        for l in range(n - 1, -1, -1):
            k = add_op(g, op_key(w, f"BW L{l}"), node=w, device=f"{w}:compute", kind="BW", dur=1e3 * doc["bw_ms"][l],
                       name=f"dense{l} backward")
            g.add_edge(prev, k)
            prev = k
    model = CommModel(default=LinkModel(latency_us=latency_us, bandwidth_Bps=rate_mbit * 1e6 / 8 * 0.956),
                      origin="user")
    measured = {f"AGG AGG p{i} p0": doc["update_ms_per_mb"] * b / 2**20 * 1e3 for i, b in enumerate(doc["bytes"])}
    ctx = CommContext(graph=g, manifest=manifest, model=model, links=ServerSideLinks(manifest), measured=measured)
    it_edges = []
    for i, (b, l) in enumerate(zip(doc["bytes"], doc["layer_of"])):
        ps_push_pull(ctx, Collective(tensor=f"p{i}", op="push_pull", bytes=int(b), participants=ws, algorithm="ps",
                                     inputs={w: [f"BW L{l}"] for w in ws}, outputs={w: [] for w in ws},
                                     partitions=[{"bytes": int(b), "server": "s0"}]))
        for w in ws:
            it_edges.append((op_key(w, f"Out p{i}"), op_key(w, f"FW L{l}")))
            if gated == "pushpull":
                g.add_edge(op_key(w, "BW L0"), op_key(w, f"In p{i}"))
    for w in ws:
        it_edges.append((op_key(w, "BW L0"), op_key(w, "FW L0")))
    if gated == "pull":
        aggs = [k for k, d in g.nodes(data=True) if d["kind"] == "AGG"]
        for w in ws:
            acked = add_op(g, op_key(w, "pushes acknowledged"), node=w, kind="VIRTUAL", name="waitall")
            g.add_edges_from((a, acked) for a in aggs)
            g.add_edges_from((acked, k) for k, d in g.nodes(data=True)
                             if d["kind"] == "SEND" and d["phase"] == "pull" and d["peer"] == w)
    g.graph["iteration_edges"] = it_edges
    g.graph["meta"] = {"job": "tictac-mxnet", "comm_model": model.describe(),
                       "hosts": {k: v.host for k, v in nodes.items()}}
    return g


def mxnet_orders(g, seed: int) -> dict[str, list[int]]:
    """Parameter indices in transfer order: Gluon's index order, TIC (ties in index order), TAC, random."""
    ords = tictac.orders(g, seed=seed)
    n = len(next(iter(ords["tac"].values())))
    out = {"index": list(range(n))}
    for o in ("tic", "tac", "random"):
        ranks = ords[o]["w0"]
        out[o] = sorted(range(n), key=lambda i: (ranks[(f"p{i}", 0)], i))
    return out


def predict_mxnet(doc: dict, orders_: dict[str, list[int]], args: argparse.Namespace) -> dict[str, dict]:
    import networkx as nx  # noqa: F401

    kw = dict(workers=args.workers, rate_mbit=args.rate_mbit, latency_us=args.latency_us)
    out = {}
    g0 = build_mxnet_dfg(doc, **kw)
    res = replay(g0, iterations=args.replay_iterations)
    e = tictac.scheduling_efficiency(res, g0)
    out["default"] = {"ms": res.iteration_time_us / 1e3, "E": e["E"], "S": e["S"]}
    g1 = build_mxnet_dfg(doc, gated=args.mechanism, **kw)
    for name, order in orders_.items():
        h = g1.copy()
        rank = {f"p{i}": float(pos) for pos, i in enumerate(order)}
        for k, d in h.nodes(data=True):
            if d["tensor"] in rank and d["kind"] in ("SEND", "RECV", "AGG"):
                d["priority"] = rank[d["tensor"]]
        res = replay(h, iterations=args.replay_iterations)
        e = tictac.scheduling_efficiency(res, h)
        out[name] = {"ms": res.iteration_time_us / 1e3, "E": e["E"], "S": e["S"]}
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def real_ab(args: argparse.Namespace) -> dict:
    import statistics
    import tempfile

    from dpro_kit.jobs import alternate, paired_ratio, run_job

    train = str(Path(__file__).resolve().parent / "tictac_mxnet_train.py")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tictac-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    common = ["--workers", str(args.workers), "--batch", str(args.batch), "--features", str(args.features),
              "--widths", args.widths]
    env = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "PYTHONPATH": ""}
    lay = work / "layers.json"
    r = run_job([args.mxnet_python, train, "--time-layers", "--json-out", str(lay), *common], hosts=1,
                ranks_per_host=None, cpus_per_host=args.cpus_per_host, env=env, timeout=300, prefix="tictac")
    if not r.ok:
        raise SystemExit(f"layer timing failed (exit {r.codes}); is {args.mxnet_python} an MXNet 1.9.1 Python?")
    doc = json.loads(lay.read_text())
    orders_ = mxnet_orders(build_mxnet_dfg(doc, workers=args.workers, rate_mbit=args.rate_mbit,
                                           latency_us=args.latency_us), args.seed)
    pred = predict_mxnet(doc, orders_, args)
    for name, order in orders_.items():
        (work / f"order_{name}.json").write_text(json.dumps(order))
    runs: dict[str, list[list[list[float]]]] = {v: [] for v in ("default", *orders_)}
    counter = [0]

    def variant(name: str):
        def run() -> float:
            counter[0] += 1
            out = work / f"{name}_{counter[0]}_{{w}}.json"
            argv = [args.mxnet_python, train, "--iters", str(args.iters), "--warmup", str(args.warmup),
                    "--json-out", str(out), *common]
            if name != "default":
                argv += ["--order-file", str(work / f"order_{name}.json"), "--mechanism", args.mechanism]
            with open(work / f"{name}_{counter[0]}.log", "w") as log:
                res = run_job(argv, hosts=args.workers + 1, ranks_per_host=None, rate_mbit=args.rate_mbit,
                              cpus_per_host=args.cpus_per_host, env={**env, "DMLC_PS_ROOT_PORT": "9391"},
                              log=log, timeout=args.timeout, prefix="tictac", fail_fast=True)
            files = [Path(str(out).replace("{w}", str(i))) for i in range(args.workers)]
            if not res.ok or not all(f.exists() for f in files):
                raise SystemExit(f"{name} run {counter[0]} failed (exit {res.codes}); log {work}/{name}_{counter[0]}.log")
            per_worker = [json.loads(f.read_text())["iteration_ms"] for f in files]
            runs[name].append(per_worker)
            return max(statistics.median(x) for x in per_worker)
        return run

    rounds = alternate({v: variant(v) for v in runs}, args.rounds, shuffle_seed=args.seed,
                       on_round=lambda i, o: print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                           f"{k} {v[-1]:.1f}" for k, v in o.items()), flush=True))
    print(f"\nMXNet 1.9.1 dist_sync, orders enforced by '{args.mechanism}', {args.workers} workers + 1 server "
          f"(host 0), {args.rate_mbit:g} Mbit/s links, "
          f"{args.cpus_per_host:g} CPU per host, batch {args.batch}, {args.iters} iterations after {args.warmup} "
          f"warm-up, {args.rounds} rounds")
    print(f"orders (parameter indices, first sent first): " + "; ".join(f"{k} {v}" for k, v in orders_.items()))
    hdr = (f"{'variant':<8} {'measured ms':>11} {'vs default':>10} {'iter spread':>11} {'worker spread':>13} "
           f"{'predicted ms':>12} {'vs default':>10} {'pred. E':>7}")
    print(hdr)
    print("-" * len(hdr))
    table = {}
    for v, xs in rounds.items():
        it_spread = statistics.median(100 * (_pct(w, 0.9) - _pct(w, 0.1)) / statistics.median(w)
                                      for run in runs[v] for w in run)
        wk_spread = statistics.median(100 * (max(map(statistics.median, run)) - min(map(statistics.median, run)))
                                      / statistics.mean(map(statistics.median, run)) for run in runs[v])
        ratio = 1.0 if v == "default" else paired_ratio(rounds, v, "default")
        p = pred[v]
        table[v] = {"measured_ms": statistics.median(xs), "runs_ms": xs, "ratio": ratio,
                    "iteration_spread_pct": it_spread, "worker_spread_pct": wk_spread, "predicted": p,
                    "predicted_ratio": p["ms"] / pred["default"]["ms"]}
        print(f"{v:<8} {statistics.median(xs):>11.1f} {100 * (ratio - 1):>+9.1f}% {it_spread:>10.1f}% "
              f"{wk_spread:>12.1f}% {p['ms']:>12.1f} {100 * (p['ms'] / pred['default']['ms'] - 1):>+9.1f}% "
              f"{p['E']:>7.2f}")
    print(f"(work folder {work}; per-run iteration times in its JSON files)")
    return {"orders": orders_, "layers": doc, "table": table}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", action="store_true", help="replayer-only table on synthetic PS graphs")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--ranks-per-host", type=int, default=2, help="workers sharing one host's links")
    ap.add_argument("--max-mb", type=float, default=16.0, help="largest layer gradient (MiB; smallest 4 KiB)")
    ap.add_argument("--servers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--barrier", action="store_true", help="synthetic: the synchronous iteration rule")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--mxnet-python", help="real mode: the Python of an MXNet 1.9.1 venv")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate-mbit", type=float, default=1000.0)
    ap.add_argument("--latency-us", type=float, default=100.0, help="link latency in the predicted DFG")
    ap.add_argument("--cpus-per-host", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--widths", default="512,1024,512,512,256,256,256,256,128,128,64,10")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replay-iterations", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", help="keep the runs' files here (default: a new temporary folder)")
    ap.add_argument("--mechanism", choices=("pull", "pushpull"), default="pull",
                    help="how the orders are enforced (bench/tictac_mxnet_train.py --mechanism)")
    args = ap.parse_args(argv)
    if not args.synthetic:
        if not args.mxnet_python:
            ap.error("give --synthetic or --mxnet-python")
        out = real_ab(args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    rows = synthetic_table(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
