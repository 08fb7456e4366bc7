#!/usr/bin/env python3
"""Solve time of trace alignment (dpro_kit.align) on synthetic jobs of 8 ... 128 nodes.

    /work/venv/bin/python bench/align_speed.py                 # 8 16 32 64 128 nodes, 10 iterations
    /work/venv/bin/python bench/align_speed.py --nodes 8 128 --iterations 12 --json

Each job: ``ranks_per_host`` ranks per machine, a ring AllReduce of ``tensors``
tensors per iteration with per-chunk SEND/RECV events (transaction ids as
``dpro_kit.graph.txn_id``), so one iteration has 2(N-1)*N transfers per tensor.
Every machine's clock gets a known random offset (uniform +-5 ms); transfer
times get ``noise`` relative jitter; receivers post their RECV when they are
ready, so some RECVs wait for their SEND (those are the clipped ones).

Import by path for tests: ``sys.path.insert(0, "<repo>/bench"); import align_speed``;
:func:`synthetic_fine_trace` returns ``(TraceSet, true offsets)``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpro_kit.trace import EVENT_COLUMNS, Collective, Manifest, NodeInfo, TraceSet  # noqa: E402


def synthetic_fine_trace(nodes: int = 8, *, ranks_per_host: int = 2, iterations: int = 10, tensors: int = 1,
                         tensor_bytes: int = 4_000_000, max_offset_us: float = 5000.0, noise: float = 0.0,
                         node_jitter_us: float = 0.0, seed: int = 0, inter_gbps: float = 10.0,
                         intra_gbps: float = 40.0, latency_us: float = 10.0,
                         ready_spread_us: float = 300.0) -> tuple[TraceSet, dict[str, float]]:
    """A ring-AllReduce job with fine-grained SEND/RECV events and known clock offsets.

    Returns the trace set and ``offsets`` (per node: how far its clock is ahead of node 0's,
    the quantity :func:`dpro_kit.align.align` estimates).  All nodes of a machine share one
    offset unless ``node_jitter_us`` > 0.
    """
    rng = np.random.default_rng(seed)
    n = nodes
    names = [f"h{r // ranks_per_host}/{r}" for r in range(n)]
    host = np.array([r // ranks_per_host for r in range(n)])
    n_hosts = int(host.max()) + 1
    host_off = rng.uniform(-max_offset_us, max_offset_us, n_hosts)
    theta = host_off[host] + (rng.normal(0, node_jitter_us, n) if node_jitter_us > 0 else 0.0)
    theta = theta - theta[0]
    nxt = (np.arange(n) + 1) % n
    intra = host == host[nxt]                                 # link r -> r+1 inside one machine
    chunk = tensor_bytes // n
    base_tt = np.where(intra, latency_us + chunk * 8 / (intra_gbps * 1e3), latency_us + chunk * 8 / (inter_gbps * 1e3))
    cols: dict[str, list] = {k: [] for k in ("node", "op", "kind", "iteration", "start", "dur", "tensor", "bytes",
                                              "txn", "phase", "step", "chunk", "peer", "stream")}
    ranks = np.arange(n)

    def add(kind, node_idx, it, start, dur, tensor, step, chnk, src, dst, phase):
        k = len(node_idx)
        txn = [f"{tensor}:{phase}:{step}:{c}:{names[s]}->{names[d]}" for c, s, d in zip(chnk, src, dst)]
        cols["node"].extend(names[i] for i in node_idx)
        cols["op"].extend(f"{kind} {t}" for t in txn)
        cols["kind"].extend([kind] * k)
        cols["iteration"].extend([it] * k)
        cols["start"].extend(start.tolist())
        cols["dur"].extend(dur.tolist())
        cols["tensor"].extend([tensor] * k)
        cols["bytes"].extend([chunk] * k)
        cols["txn"].extend(txn)
        cols["phase"].extend([phase] * k)
        cols["step"].extend([step] * k)
        cols["chunk"].extend(chnk.tolist())
        cols["peer"].extend(names[d if kind == "SEND" else s] for s, d in zip(src, dst))
        cols["stream"].extend(["comm"] * k)

    t = 0.0
    for it in range(iterations):
        for ti in range(tensors):
            tensor = f"t{ti}"
            ready = t + rng.uniform(0, ready_spread_us, n)        # In op done on each rank (true time)
            avail = ready.copy()                                  # when rank r can send its next chunk
            recv_post = ready.copy()                              # when rank r posts its next RECV
            for s in range(2 * (n - 1)):
                phase = "reduce_scatter" if s < n - 1 else "all_gather"
                chnk = (ranks - s) % n if s < n - 1 else (ranks + 1 - (s - n + 1)) % n
                tt = base_tt * (1.0 + (rng.normal(0, noise, n) if noise > 0 else 0.0))
                send_start = avail
                arrive = send_start + tt
                dst = nxt
                post = recv_post[dst]
                recv_end = np.maximum(arrive, post + 1.0)
                add("SEND", ranks, it, send_start + theta[ranks], tt, tensor, s, chnk, ranks, dst, phase)
                add("RECV", dst, it, post + theta[dst], recv_end - post, tensor, s, chnk, ranks, dst, phase)
                new_avail = np.empty(n)
                new_avail[dst] = recv_end                          # forwards what it received
                avail = np.maximum(new_avail, send_start + tt)
                recv_post = new_avail + rng.uniform(0, 20.0, n)   # next RECV posted a little later
            t = float(avail.max()) + 200.0
        t += 2000.0
    ev = pd.DataFrame(cols)
    ev["host"] = [f"h{h}" for h in host[[int(x.split("/")[1]) for x in ev["node"]]]]
    ev["name"] = ev["kind"].astype(str) + " " + ev["tensor"].astype(str)
    for c, (dtype, _) in EVENT_COLUMNS.items():
        ev[c] = ev[c].astype(dtype)
    ev = ev[list(EVENT_COLUMNS)]
    manifest = Manifest(job="synthetic-align", framework="synthetic", comm_backend="ring", world_size=n,
                        nodes={names[r]: NodeInfo(host=f"h{host[r]}", role="worker", rank=r) for r in range(n)},
                        iterations=list(range(iterations)))
    colls = [Collective(tensor=f"t{ti}", op="allreduce", bytes=tensor_bytes, participants=list(names))
             for ti in range(tensors)]
    ts = TraceSet(manifest=manifest, events=ev, edges={nm: [] for nm in names}, collectives=colls)
    return ts, {names[r]: float(theta[r]) for r in range(n)}


def main(argv: list[str] | None = None) -> int:
    from dpro_kit.align import align

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.02, help="relative jitter of transfer times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for n in args.nodes:
        t0 = time.perf_counter()
        ts, truth = synthetic_fine_trace(n, ranks_per_host=args.ranks_per_host, iterations=args.iterations,
                                         noise=args.noise, seed=args.seed)
        gen = time.perf_counter() - t0
        t1 = time.perf_counter()
        res = align(ts)
        total = time.perf_counter() - t1
        err = np.array([res.offsets_us[k] - truth[k] for k in truth])
        rows.append({"nodes": n, "events": len(ts.events), "records": res.n_records, "families": res.n_families,
                     "constraints": res.n_constraints, "rounds": res.rounds, "solver": res.solver,
                     "align_s": round(total, 3), "generate_s": round(gen, 2),
                     "median_abs_err_us": round(float(np.median(np.abs(err))), 3),
                     "max_abs_err_us": round(float(np.max(np.abs(err))), 3)})
        if not args.json:
            r = rows[-1]
            if len(rows) == 1:
                print(f"{'nodes':>6}{'events':>10}{'records':>10}{'families':>9}{'pairs':>7}{'rounds':>7}"
                      f"{'align s':>9}{'median |err| us':>17}{'max |err| us':>14}")
            print(f"{r['nodes']:>6}{r['events']:>10}{r['records']:>10}{r['families']:>9}{r['constraints']:>7}"
                  f"{r['rounds']:>7}{r['align_s']:>9.3f}{r['median_abs_err_us']:>17.3f}{r['max_abs_err_us']:>14.3f}",
                  flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
