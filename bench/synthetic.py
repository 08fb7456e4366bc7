"""Synthetic global DFGs of data-parallel training, built with the real builder's conventions.

Import by path (``bench/`` is not a package): scripts in ``bench/`` get it on
``sys.path`` automatically; tests do ``sys.path.insert(0, "<repo>/bench")`` and
then ``import synthetic``.

What a graph looks like (per worker rank ``w<r>`` on host ``h<r // ranks_per_host>``):

* ``DATA`` (kind IO, stream ``io``) -> forward ops of layers 0..L-1 (a chain,
  3-8 ops per layer) -> backward ops of layers L-1..0 (3-8 ops per layer).  In
  each layer's backward, the last op is the weight-gradient op: it branches off
  the op before it, and the next layer's backward continues from that op (as
  in autograd), so the weight-gradient ops queue on the compute stream behind
  the input-gradient chain.
* Durations (us) are log-normal: a per-layer scale (median 40 us forward,
  backward ~2x forward), a per-op factor, and a small per-rank jitter (the
  ranks run the same model, not exactly the same times).
* Layer gradient sizes are log-uniform in ``[min_bytes, max_bytes]`` (4 KiB to
  4 MiB by default).  Gradients of consecutive layers, in reverse order, are
  grouped into ``buckets`` buckets (PyTorch DDP style: bucket 0 holds the last
  layers, whose gradients are ready first).
* Each bucket is one :class:`dpro_kit.trace.Collective` whose inputs are the
  weight-gradient ops of its layers and whose outputs are the UPDATE op(s) of
  the bucket (``update="bucket"``) or of each of its layers (``"layer"``).
  The communication ops are added by the REAL topology builders of
  :mod:`dpro_kit.graph.topology` (``ring_allreduce`` / ``ps_push_pull``) through
  a ``CommContext`` with a ``CommModel``: In/Out virtual ops, SEND ops on link
  devices, RECV ops on ``<node>:comm``, transaction ids, AGG ops on servers.
* Like :func:`dpro_kit.graph.build.add_iteration_boundaries`, every node gets a
  zero-time ``STEP_END`` op after its sinks, and ``graph["iteration_edges"]``
  joins it to the node's first ops of the next iteration (``next_iteration=
  "barrier"``).  With ``next_iteration="per_layer"`` (MXNet's engine, TicTac's
  setting) the next iteration's first forward op of layer l waits only for the
  UPDATE of layer l's bucket (after its pull), and DATA for the previous DATA.

Op counts per rank: DATA + FW + BW ops + UPDATEs + STEP_END, and per bucket an In
and an Out op; ring AllReduce over N ranks adds 2(N-1) SEND + 2(N-1) RECV per rank
per bucket; PS adds, per partition of a bucket, one push SEND (on the worker) and
one push RECV (on the server) per worker, one AGG on the server, one pull SEND
(server) and one pull RECV (worker) per worker, and a STEP_END per server used.
:func:`count_ops` gives the exact count without building the graph.

:func:`synthetic_dfg` builds the ``nx.DiGraph`` (what ``compile_graph`` and the
naive replay take); :func:`dfg_with_about` picks parameters for a target op count.
There is no separate array builder: through networkx a 1 M-op graph takes ~12 s
(cyclic GC disabled, as ``replay_speed.py`` does) and ~1.7 GB, which is fine for a
benchmark, and building through the real topology code is the point.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.graph.build import add_iteration_boundaries
from dpro_kit.graph.model import add_op, compute_device, op_key
from dpro_kit.graph.topology import CommContext, Links, ps_push_pull, ring_allreduce, split_bytes
from dpro_kit.trace import Collective, Manifest, NodeInfo, OpKind

__all__ = ["SynthSpec", "synthetic_dfg", "dfg_with_about", "spec_for_about", "count_ops"]

#: inter-host link (25 Gbit/s, 10 us) and intra-host pair link (NVLink-class, 3 us)
INTER_HOST = LinkModel(latency_us=10.0, bandwidth_Bps=25e9 / 8)
INTRA_HOST = LinkModel(latency_us=3.0, bandwidth_Bps=50e9)


@dataclass
class SynthSpec:
    """Parameters of a synthetic job (see the module docstring)."""

    ranks: int = 4
    layers: int = 16
    buckets: int = 4
    ranks_per_host: int = 2
    comm: str = "ring"              # "ring" (AllReduce) or "ps"
    servers: int = 2                # PS only; each server on its own host ps<j>
    partition_bytes: int = 4 << 20  # PS only: buckets are split into partitions of at most this size
    update: str = "bucket"          # one UPDATE op per "bucket" or per "layer"
    min_ops: int = 3                # FW (and BW) ops per layer: uniform in [min_ops, max_ops]
    max_ops: int = 8
    fw_median_us: float = 40.0
    min_bytes: int = 4 << 10
    max_bytes: int = 4 << 20
    prioritize: bool = False        # True: bucket k gets priority -k (later buckets = front layers first)
    next_iteration: str = "barrier"  # "barrier": STEP_END -> first ops; "per_layer": see module docstring
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.layers < 1 or self.ranks_per_host < 1:
            raise ValueError("ranks, layers and ranks_per_host must be >= 1")
        if not 1 <= self.buckets <= self.layers:
            raise ValueError("need 1 <= buckets <= layers")
        if self.comm not in ("ring", "ps"):
            raise ValueError("comm must be 'ring' or 'ps'")
        if self.update not in ("bucket", "layer"):
            raise ValueError("update must be 'bucket' or 'layer'")
        if self.comm == "ps" and self.servers < 1:
            raise ValueError("PS needs at least one server")
        if self.next_iteration not in ("barrier", "per_layer"):
            raise ValueError("next_iteration must be 'barrier' or 'per_layer'")


@dataclass
class _Model:
    """The drawn model: the same on every rank (per-rank jitter is drawn separately)."""

    n_fw: np.ndarray            # ops per layer
    n_bw: np.ndarray
    fw_us: list[np.ndarray]     # per layer, per op (before per-rank jitter)
    bw_us: list[np.ndarray]
    layer_bytes: np.ndarray
    groups: list[list[int]]     # bucket k -> layers (reverse order, consecutive)
    bucket_bytes: list[int]
    partitions: list[list[dict]] = field(default_factory=list)


def _draw_model(spec: SynthSpec, rng: np.random.Generator) -> _Model:
    L = spec.layers
    n_fw = rng.integers(spec.min_ops, spec.max_ops + 1, size=L)
    n_bw = rng.integers(spec.min_ops, spec.max_ops + 1, size=L)
    scale = spec.fw_median_us * rng.lognormal(0.0, 0.8, size=L)           # per-layer cost scale
    fw_us = [scale[l] * rng.lognormal(0.0, 0.5, size=int(n_fw[l])) for l in range(L)]
    bw_us = [2.0 * scale[l] * rng.lognormal(0.0, 0.5, size=int(n_bw[l])) for l in range(L)]
    lo, hi = math.log(spec.min_bytes), math.log(spec.max_bytes)
    layer_bytes = (np.exp(rng.uniform(lo, hi, size=L)) // 4 * 4).astype(np.int64)
    groups = [list(map(int, a)) for a in np.array_split(np.arange(L - 1, -1, -1), spec.buckets)]
    bucket_bytes = [int(layer_bytes[g].sum()) for g in groups]
    parts: list[list[dict]] = []
    if spec.comm == "ps":
        for k, nb in enumerate(bucket_bytes):
            p = max(1, -(-nb // spec.partition_bytes))
            parts.append([{"bytes": b, "server": f"s{(k + i) % spec.servers}"}
                          for i, b in enumerate(split_bytes(nb, p))])
    return _Model(n_fw, n_bw, fw_us, bw_us, layer_bytes, groups, bucket_bytes, parts)


def _manifest(spec: SynthSpec) -> Manifest:
    nodes = {f"w{r}": NodeInfo(host=f"h{r // spec.ranks_per_host}", role="worker", rank=r)
             for r in range(spec.ranks)}
    if spec.comm == "ps":
        nodes.update({f"s{j}": NodeInfo(host=f"ps{j}", role="server", rank=j) for j in range(spec.servers)})
    return Manifest(job="synthetic", framework="synthetic", comm_backend="nccl" if spec.comm == "ring" else "ps",
                    world_size=spec.ranks, nodes=nodes, iterations=[0])


def _comm_model(manifest: Manifest) -> CommModel:
    by_host: dict[str, list[str]] = defaultdict(list)
    for n, i in manifest.nodes.items():
        by_host[i.host].append(n)
    per_link = {f"link:{a}->{b}": INTRA_HOST for ns in by_host.values() for a in ns for b in ns if a != b}
    return CommModel(default=INTER_HOST, per_link=per_link, origin="user")


def count_ops(spec: SynthSpec) -> int:
    """Exact number of ops :func:`synthetic_dfg` builds for ``spec``."""
    m = _draw_model(spec, np.random.default_rng(spec.seed))
    return _count(spec, m)


def _count(spec: SynthSpec, m: _Model) -> int:
    n, B = spec.ranks, spec.buckets
    per_rank = 1 + int(m.n_fw.sum() + m.n_bw.sum()) + (B if spec.update == "bucket" else spec.layers) + 1 + 2 * B
    total = n * per_rank
    if spec.comm == "ring":
        total += B * n * 4 * (n - 1) if n > 1 else 0
    else:
        p = sum(len(ps) for ps in m.partitions)
        used = {part["server"] for ps in m.partitions for part in ps}
        total += p * (4 * n + 1) + len(used)  # push/pull SEND+RECV per worker, AGG; STEP_END per used server
    return total


def synthetic_dfg(ranks: int = 4, layers: int = 16, buckets: int = 4, *, seed: int = 0,
                  spec: SynthSpec | None = None, **kw) -> nx.DiGraph:
    """A global DFG of one training iteration of ``ranks`` data-parallel workers.

    Keyword arguments are the fields of :class:`SynthSpec` (``comm="ps"``,
    ``ranks_per_host``, ``update``, ``prioritize`` ...); or pass ``spec``.
    """
    if spec is None:
        spec = SynthSpec(ranks=ranks, layers=layers, buckets=buckets, seed=seed, **kw)
    rng = np.random.default_rng(spec.seed)
    m = _draw_model(spec, rng)
    manifest = _manifest(spec)
    g = nx.DiGraph()
    L = spec.layers
    for r in range(spec.ranks):
        node = f"w{r}"
        comp = compute_device(node)
        jit = rng.lognormal(0.0, 0.03, size=2 * int(m.n_fw.sum() + m.n_bw.sum()) + 1)
        j = 0
        prev = add_op(g, op_key(node, "DATA"), node=node, device=compute_device(node, "io"), kind=OpKind.IO.value,
                      dur=float(200.0 * jit[-1]), name="data loading")
        for l in range(L):
            for i in range(int(m.n_fw[l])):
                k = add_op(g, op_key(node, f"FW L{l}.{i}"), node=node, device=comp, kind=OpKind.FW.value,
                           dur=float(m.fw_us[l][i] * jit[j]), name=f"layer{l}.fw{i}")
                j += 1
                g.add_edge(prev, k)
                prev = k
        for l in range(L - 1, -1, -1):
            nb = int(m.n_bw[l])
            for i in range(nb):
                k = add_op(g, op_key(node, f"BW L{l}.{i}"), node=node, device=comp, kind=OpKind.BW.value,
                           dur=float(m.bw_us[l][i] * jit[j]), name=f"layer{l}.bw{i}",
                           tensor=f"grad{l}" if i == nb - 1 else "")
                j += 1
                g.add_edge(prev, k)
                if i < nb - 1:      # the weight-gradient op (last) branches off; the chain goes on from here
                    prev = k
        for k_b, grp in enumerate(m.groups):
            if spec.update == "bucket":
                nbytes = m.bucket_bytes[k_b]
                add_op(g, op_key(node, f"UPDATE b{k_b}"), node=node, device=comp, kind=OpKind.UPDATE.value,
                       dur=float((2.0 + nbytes / 100e3) * jit[j % jit.size]), name=f"sgd bucket{k_b}",
                       tensor=f"bucket{k_b}", bytes=nbytes)
                j += 1
            else:
                for l in grp:
                    nbytes = int(m.layer_bytes[l])
                    add_op(g, op_key(node, f"UPDATE L{l}"), node=node, device=comp, kind=OpKind.UPDATE.value,
                           dur=float((2.0 + nbytes / 100e3) * jit[j % jit.size]), name=f"sgd layer{l}",
                           tensor=f"param{l}", bytes=nbytes)
                    j += 1
    ctx = CommContext(graph=g, manifest=manifest, model=_comm_model(manifest), links=Links(manifest),
                      measured=_agg_measured(m))
    workers = manifest.workers()
    builder = ring_allreduce if spec.comm == "ring" else ps_push_pull
    for k_b, grp in enumerate(m.groups):
        outs = [f"UPDATE b{k_b}"] if spec.update == "bucket" else [f"UPDATE L{l}" for l in grp]
        coll = Collective(tensor=f"bucket{k_b}", op="allreduce" if spec.comm == "ring" else "push_pull",
                          bytes=m.bucket_bytes[k_b], participants=list(workers), algorithm=spec.comm,
                          inputs={w: [f"BW L{l}.{int(m.n_bw[l]) - 1}" for l in grp] for w in workers},
                          outputs={w: list(outs) for w in workers}, params=[f"param{l}" for l in grp],
                          partitions=m.partitions[k_b] if spec.comm == "ps" else [],
                          priority=float(-k_b) if spec.prioritize else 0.0)
        builder(ctx, coll)
    add_iteration_boundaries(g)
    if spec.next_iteration == "per_layer":
        # as MXNet's engine runs it: the next forward of layer l waits only for layer l's update
        # (the pull of its bucket), and the next data loading for this one
        upd = {l: (f"UPDATE b{k_b}" if spec.update == "bucket" else f"UPDATE L{l}")
               for k_b, grp in enumerate(m.groups) for l in grp}
        g.graph["iteration_edges"] = [e for w in workers for e in
                                      [(op_key(w, "DATA"), op_key(w, "DATA"))]
                                      + [(op_key(w, upd[l]), op_key(w, f"FW L{l}.0")) for l in range(L)]]
    g.graph["meta"] = {"job": "synthetic", "framework": "synthetic", "comm_backend": manifest.comm_backend,
                       "world_size": spec.ranks, "comm_model": ctx.model.describe(),
                       "hosts": {n: i.host for n, i in manifest.nodes.items()},
                       "synthetic": {k: v for k, v in spec.__dict__.items()}}
    return g


def _agg_measured(m: _Model) -> dict[str, float]:
    """AGG durations as a Middleman would supply them (summing P pushes at ~20 GB/s)."""
    out = {}
    for k_b, parts in enumerate(m.partitions):
        for p, part in enumerate(parts):
            out[f"AGG AGG bucket{k_b} p{p}"] = 2.0 + part["bytes"] / 20e3
    return out


# --------------------------------------------------------------------------- sizing

def spec_for_about(n_ops: int, *, comm: str = "ring", seed: int = 0, ranks_per_host: int = 8) -> SynthSpec:
    """Parameters whose graph has about ``n_ops`` ops (within a few %), with realistic proportions.

    Searches ranks (multiples of ``ranks_per_host``, or 2/4 for small graphs)
    and layers (buckets = layers/4, as DDP's 25 MB buckets give for these
    sizes); among fits within 3 % it prefers ~64 layers.
    """
    if n_ops < 100:
        raise ValueError("n_ops must be >= 100")
    cands = []
    rank_opts = sorted({2, 4} | {ranks_per_host * h for h in range(1, 129)})
    for ranks in rank_opts:
        rph = min(ranks_per_host, ranks)
        base = SynthSpec(ranks=ranks, layers=4, buckets=1, comm=comm, seed=seed, ranks_per_host=rph)
        # ops grow ~linearly in layers: evaluate at two points and solve, then check neighbours exactly
        c1 = count_ops(replace(base, layers=64, buckets=16))
        est = max(4, int(round(64 * n_ops / c1)))
        for layers in {max(4, est + d) for d in (-2, -1, 0, 1, 2)}:
            if layers > 512:
                continue
            s = replace(base, layers=layers, buckets=max(1, layers // 4))
            c = count_ops(s)
            cands.append((abs(c - n_ops) / n_ops, s))
    good = [s for err, s in cands if err <= 0.03 and 16 <= s.layers <= 256]
    if good:
        return min(good, key=lambda s: (abs(math.log(s.layers / 64)), s.ranks))
    return min(cands, key=lambda t: t[0])[1]


def dfg_with_about(n_ops: int, seed: int = 0, *, comm: str = "ring", ranks_per_host: int = 8) -> nx.DiGraph:
    """A synthetic DFG with about ``n_ops`` ops (see :func:`spec_for_about`)."""
    return synthetic_dfg(spec=spec_for_about(n_ops, comm=comm, seed=seed, ranks_per_host=ranks_per_host))


if __name__ == "__main__":  # quick size/time check: python bench/synthetic.py 1000000
    import sys
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    t0 = time.perf_counter()
    s = spec_for_about(n)
    t1 = time.perf_counter()
    g = synthetic_dfg(spec=s)
    t2 = time.perf_counter()
    print(s)
    print(f"ops {g.number_of_nodes()} (count_ops {count_ops(s)}), edges {g.number_of_edges()}, "
          f"spec {t1 - t0:.2f}s, build {t2 - t1:.2f}s")
