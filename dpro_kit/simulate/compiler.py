"""Execution-graph compiler (Proteus §V): model graph + strategy tree -> distributed DFG.

:func:`compile_strategy` turns a :class:`~dpro_kit.simulate.model.ModelGraph` and a
:class:`~dpro_kit.simulate.strategy.Strategy` into a global DFG in the replayer's
conventions (:mod:`dpro_kit.graph.model`: ops on ``<node>:compute`` /
``<node>:comm`` devices, transfers on link devices of :class:`dpro_kit.graph.topology.Links`)
that :func:`dpro_kit.replay.replay` runs, plus the memory of every device.

Placement: rank ``r = stage * (dp * tp) + d * tp + t`` (tensor-parallel ranks adjacent,
then data-parallel replicas, then pipeline stages); rank ``r`` on host
``r // (ranks / hosts)``, node name ``h<host>/<r>``.

Rules (derived in docs/simulate.md):

* **Compute.**  The profiled batch is the iteration's global batch: each of the ``dp``
  replicas processes ``1/dp`` of it and a pipeline splits that into ``m`` micro-batches:
  every op runs at the batch fraction ``x = 1/(dp m)`` (:meth:`Op.time`: ``t x`` with one
  profile, interpolated between profiles at several batch sizes, :func:`.model.fit_batches`),
  activations and activation transfers are ``/(dp m)``; tensor-parallel ranks take
  the whole batch.  Pipeline
  stages are contiguous layer ranges balancing ``fwd + bwd (+ recomputed fwd)`` (linear
  partition, minimal largest stage), or (``split: even``) :func:`even_stages`.
* **Tensor parallel** (Megatron): in a layer with ``tensor_parallel.degree = k > 1`` the
  Linear ops are paired in forward order: a column group (consecutive Linears reading the
  same input with only views between them: ``q, k, v``) and the next Linear as the row;
  the ops from the column group to its row Linear (attention, activation) run on ``1/k`` of
  the features: time ``t(x/k)``, activation bytes ``/k``, the weights ``/k``.  The row Linear's output is all-reduced over the TP group in the forward
  (``out_bytes / m``), the column Linear's input gradient in the backward
  (``in_bytes / m``).  An unpaired Linear stays replicated.
* **Recomputation**: the layer's forward is re-run (its segments, with their tensor-parallel
  all-reduces) right before its backward, per micro-batch; only the layer's input stays
  alive between forward and backward.
* **Backward** time of a segment = the layer's backward x the segment's share of the
  layer's (scaled) forward time.
* **Data parallel** (over ranks of equal stage and TP index):
  ``none`` — DDP buckets (parameters in reverse registration order, first bucket 1 MiB,
  then ``bucket_mb``), each all-reduced once its layers' last backward is done;
  ``zero1`` — the same (DDP + ``ZeroRedundancyOptimizer``), the optimizer step on ``1/dp``
  of the parameters, then the updated parameters all-gathered;
  ``zero2`` — each layer an FSDP unit with ``reshard_after_forward=False``: its parameters
  all-gathered before its first forward and kept until its last backward, its gradients
  reduce-scattered after its last backward;
  ``zero3``/``fsdp`` — each layer an FSDP unit: its parameters all-gathered before its forward
  and again before its backward (every micro-batch; prefetch one unit ahead), its
  gradients reduce-scattered after its last backward.
* **Pipeline**: activations (the next stage's first layer's input, ``/m``) and their
  gradients are sent point to point between stages; each stage runs its forward and
  backward units in the schedule's order (control dependencies, §V-A): at most ``c``
  forward micro-batches ahead of the backward, ``c = m`` for GPipe,
  ``stages - s`` for 1F1B, capped by ``max_in_flight``: ``F_0 .. F_{c-1}``, then
  ``B_0, F_c, B_1, F_{c+1}, ...``, then the remaining backwards.
* **Collectives** are rings (:func:`dpro_kit.graph.topology.ring_allreduce` and the
  reduce-scatter / all-gather halves): ``2(k-1)`` (all-reduce) or ``k-1`` steps of
  ``bytes/k`` per rank, each transfer ``alpha + b/B`` from the project's link model
  (:class:`dpro_kit.costmodel.CommModel`), one link device per ordered host pair.  On a gloo
  profile a reduce-scatter is replayed as an all-reduce: gloo's ``reduce_scatter_tensor``
  sends an all-reduce's bytes (interface counters, docs/simulate.md "Validation").

References
----------
.. [1] Duan et al., "Proteus: Simulating the Performance of Distributed DNN Training", §V
       (execution graph compiler: splitting, inferred collectives, control dependencies)
       (``/work/shared/seeds/001_b74cee54beaaa4e0.txt``).
.. [2] Shoeybi et al., "Megatron-LM", 2019 (column/row parallel Linear pairs).
.. [3] Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020.
.. [4] Huang et al., "GPipe", NeurIPS 2019; Narayanan et al., "PipeDream" (1F1B), SOSP 2019.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from ..costmodel import CommModel, LinkModel
from ..errors import DproError
from ..graph.model import add_op, compute_device, op_key
from ..graph.topology import CommContext, Links, ring_allreduce, ring_pass
from ..trace import Collective, Manifest, NodeInfo, OpKind
from .model import Layer, ModelGraph
from .strategy import Settings, Strategy

#: DDP's first gradient bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES)
FIRST_BUCKET_BYTES = 1 << 20
#: layers whose parameters are sharded between iterations (FSDP units: zero2 keeps them gathered from the
#: unit's forward to its backward, zero3/fsdp reshards after each)
SHARDED_PARAMS = ("zero2", "zero3", "fsdp")
SHARDED_GRADS = ("zero2", "zero3", "fsdp")
#: layers synchronised by DDP bucket all-reduces (zero1: DDP + ZeroRedundancyOptimizer)
DDP_SYNC = ("none", "zero1")


@dataclass
class Segment:
    """A run of a layer's forward ops between tensor-parallel communication points.

    ``fwd_us`` / ``bwd_us`` are per micro-batch on one rank (the ops at the rank's batch fraction,
    :meth:`dpro_kit.simulate.model.Op.time`); ``act_bytes`` is for the whole profiled batch (the
    memory model divides by ``dp m``: tensor bytes are linear in the batch)."""

    fwd_us: float
    bwd_us: float
    act_bytes: float
    fwd_ar_bytes: int = 0     # all-reduce after this segment's forward (row-parallel output)
    bwd_ar_bytes: int = 0     # all-reduce after this segment's backward (column-parallel input grad)


@dataclass
class LayerPlan:
    """What one layer becomes on one rank of its stage."""

    layer: Layer
    settings: Settings
    segments: list[Segment]
    params_local: float       # bytes on a rank before data-parallel sharding (TP-split weights / tp)
    act_local: float          # activation bytes per full batch on a rank (TP-split parts / tp)


@dataclass
class Compiled:
    """The compiled strategy: the DFG, the ranks, their memory and the facts the report needs.

    Attributes
    ----------
    graph : networkx.DiGraph
        The distributed execution graph (replay with :func:`dpro_kit.replay.replay`).
    nodes : list of str
        Node names by rank.
    stage_of : list of int
        Pipeline stage of each rank.
    stage_layers : list of list of str
        Layers of each stage.
    memory : list of dict
        Per rank: ``params``, ``grads``, ``optimizer``, ``comm_buffers``, ``gathered_params``,
        ``activations``, ``peak`` (bytes).
    collectives : list of dict
        One entry per inferred collective: ``kind``, ``group`` (node names), ``bytes``, ``tag``.
    comm_model : CommModel
        Link model used for the transfers.
    """

    graph: nx.DiGraph
    nodes: list[str]
    stage_of: list[int]
    stage_layers: list[list[str]]
    memory: list[dict[str, float]]
    collectives: list[dict[str, Any]] = field(default_factory=list)
    comm_model: CommModel | None = None
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers

def partition_stages(costs: list[float], stages: int) -> list[list[int]]:
    """Contiguous split of ``costs`` into ``stages`` non-empty groups minimising the largest sum.

    Parameters
    ----------
    costs : list of float
        Per layer cost (forward + backward time).
    stages : int
        Number of groups.

    Examples
    --------
    >>> partition_stages([1, 1, 1, 1], 2)
    [[0, 1], [2, 3]]
    >>> partition_stages([3, 1, 1, 1], 2)
    [[0], [1, 2, 3]]
    """
    n = len(costs)
    if stages > n:
        raise ValueError(f"{stages} stages for {n} layers")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                v = max(best[s - 1][j], pre[i] - pre[j])
                if v < best[s][i] - 1e-12:
                    best[s][i], cut[s][i] = v, j
    groups, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        groups.append(list(range(j, i)))
        i = j
    return groups[::-1]


def even_stages(names: list[str], stages: int) -> list[list[int]]:
    """``pipeline.split: even`` (as ``torch.distributed.pipelining`` jobs usually cut a model): the numbered
    layers of the model's container (``layers.0 .. layers.N-1``) split by count, earlier stages taking the
    remainder; the layers before them go to the first stage, those after them to the last.

    Examples
    --------
    >>> even_stages(["inp", "layers.0", "layers.1", "layers.2", "head"], 2)
    [[0, 1, 2], [3, 4]]
    """
    import re
    num = [i for i, n in enumerate(names) if re.search(r"\.\d+$", n)]
    if num:
        parent = max({names[i].rsplit(".", 1)[0] for i in num},
                     key=lambda p: sum(1 for i in num if names[i].rsplit(".", 1)[0] == p))
        num = [i for i in num if names[i].rsplit(".", 1)[0] == parent]
        num = list(range(num[0], num[-1] + 1))
    else:
        num = list(range(len(names)))
    if len(num) < stages:
        raise ValueError(f"{stages} stages for {len(num)} numbered layers")
    base, extra = divmod(len(num), stages)
    groups, lo = [], 0
    for s in range(stages):
        hi = lo + base + (1 if s < extra else 0)
        groups.append([num[i] for i in range(lo, hi)])
        lo = hi
    groups[0] = list(range(0, num[0])) + groups[0]
    groups[-1] = groups[-1] + list(range(num[-1] + 1, len(names)))
    return groups


def schedule_order(stage: int, stages: int, m: int, schedule: str, max_in_flight: int | None) -> list[tuple[str, int]]:
    """The order of a stage's forward (``"F"``) and backward (``"B"``) micro-batches.

    ``c`` = micro-batches in flight: ``m`` for GPipe, ``stages - stage`` for 1F1B, capped by
    ``max_in_flight`` and ``m``; order ``F_0..F_{c-1}``, then ``B_0, F_c, B_1, ...``, then the
    remaining backwards.

    Examples
    --------
    >>> schedule_order(0, 2, 3, "1f1b", None)
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    >>> schedule_order(1, 2, 3, "gpipe", None)
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('B', 1), ('B', 2)]
    """
    c = in_flight(stage, stages, m, schedule, max_in_flight)
    out = [("F", j) for j in range(c)]
    nf = c
    for b in range(m):
        out.append(("B", b))
        if nf < m:
            out.append(("F", nf))
            nf += 1
    return out


def p2p_steps(stage: int, stages: int, m: int, schedule: str, max_in_flight: int | None) -> list[tuple]:
    """A stage's program as ``torch.distributed.pipelining`` runs it: its actions and the points where
    it posts and waits for its point-to-point transfers (torch 2.13 ``schedules.py``).

    Steps: ``("run", "F"|"B", j)``; ``("post", ops)``; ``("wait", ops)``; an op is ``("recv"|"send",
    "act"|"grad", j)`` (``act``: micro-batch ``j``'s activation, from stage ``s-1`` / to ``s+1``;
    ``grad``: its gradient, from ``s+1`` / to ``s-1``).  Where a receive is posted matters: gloo's
    transport is a rendezvous (a send's bytes leave only once the receiver has posted its receive,
    ``gloo/transport/tcp/pair.cc``), so a transfer starts at the later of the two posts.

    * fill-drain (GPipe, every micro-batch in flight: ``ScheduleGPipe``): each receive is posted right
      before the action that needs it and waited for at once; each send is posted right after its
      action and waited for only at the end of the phase (all forward sends before the first backward
      receive, all backward sends at the end).
    * otherwise (``Schedule1F1B``, warm-up ``c`` = :func:`in_flight`): warm-up forwards as above, each
      send waited for after the next forward; in the steady state an action's send is posted together
      with the next action's receive and the rank waits for both before that action; cool-down
      backwards wait for the previous backward's send after their own compute.

    Examples
    --------
    >>> p2p_steps(1, 2, 2, "gpipe", None)  # doctest: +NORMALIZE_WHITESPACE
    [('post', [('recv', 'act', 0)]), ('wait', [('recv', 'act', 0)]), ('run', 'F', 0), ('post', []),
     ('post', [('recv', 'act', 1)]), ('wait', [('recv', 'act', 1)]), ('run', 'F', 1), ('post', []),
     ('wait', []), ('post', []), ('wait', []), ('run', 'B', 0), ('post', [('send', 'grad', 0)]),
     ('post', []), ('wait', []), ('run', 'B', 1), ('post', [('send', 'grad', 1)]),
     ('wait', [('send', 'grad', 0), ('send', 'grad', 1)])]
    >>> [x for x in p2p_steps(0, 2, 2, "1f1b", None) if x[0] != "run" and x[1]]  # doctest: +NORMALIZE_WHITESPACE
    [('post', [('send', 'act', 0)]), ('wait', [('send', 'act', 0)]),
     ('post', [('send', 'act', 1), ('recv', 'grad', 0)]), ('wait', [('send', 'act', 1), ('recv', 'grad', 0)]),
     ('post', [('recv', 'grad', 1)]), ('wait', [('recv', 'grad', 1)])]
    """
    first, last = stage == 0, stage == stages - 1
    frecv = lambda j: [] if first else [("recv", "act", j)]   # noqa: E731
    fsend = lambda j: [] if last else [("send", "act", j)]    # noqa: E731
    brecv = lambda j: [] if last else [("recv", "grad", j)]   # noqa: E731
    bsend = lambda j: [] if first else [("send", "grad", j)]  # noqa: E731
    c = in_flight(stage, stages, m, schedule, max_in_flight)
    out: list[tuple] = []
    if c == m and schedule == "gpipe":                     # ScheduleGPipe._step_microbatches
        for phase, recv, send in (("F", frecv, fsend), ("B", brecv, bsend)):
            pending: list[tuple] = []
            for j in range(m):
                out += [("post", recv(j)), ("wait", recv(j)), ("run", phase, j), ("post", send(j))]
                pending += send(j)
            out.append(("wait", pending))
        return out
    send_work: list[tuple] = []                            # Schedule1F1B._step_microbatches
    fwd_sends: list[tuple] = []
    fi = bi = 0
    for k in range(c):                                     # warm-up
        out += [("post", frecv(fi)), ("wait", frecv(fi)), ("run", "F", fi), ("wait", send_work)]
        send_work = []
        if k != c - 1:
            send_work = fsend(fi)
            out.append(("post", send_work))
        else:
            fwd_sends = fsend(fi)
        fi += 1
    while True:                                            # 1B1F
        ops = fwd_sends + brecv(bi)
        out += [("post", ops), ("wait", ops), ("run", "B", bi)]
        bwd_sends = bsend(bi)
        bi += 1
        if fi == m:
            break
        ops = bwd_sends + frecv(fi)
        out += [("post", ops), ("wait", ops), ("run", "F", fi)]
        fwd_sends = fsend(fi)
        fi += 1
    out.append(("post", bwd_sends))
    send_work = bwd_sends
    while bi < m:                                          # cool-down
        out += [("post", brecv(bi)), ("wait", brecv(bi)), ("run", "B", bi), ("wait", send_work)]
        send_work = bsend(bi)
        out.append(("post", send_work))
        bi += 1
    out.append(("wait", send_work))
    return out


def in_flight(stage: int, stages: int, m: int, schedule: str, max_in_flight: int | None) -> int:
    """Forward micro-batches a stage holds at most (its activations' multiplier)."""
    c = m if schedule == "gpipe" else stages - stage
    if max_in_flight is not None:
        c = min(c, max_in_flight)
    return max(1, min(c, m))


def plan_layers(layers: list[Layer], settings: list[Settings], x: float = 1.0) -> list[LayerPlan]:
    """Segments of each layer of one stage after the Megatron pairing (module docstring).

    Parameters
    ----------
    layers : list of Layer
        One stage's layers, forward order.
    settings : list of Settings
        Their propagated configurations.
    x : float, default 1.0
        A rank's micro-batch as a fraction of the profiled batch (``1/(dp m)``): every op runs at
        ``x``, an op split ``k`` ways by tensor parallelism at ``x/k`` (:meth:`Op.time`; linear
        with one profile, so ``t x / k``); a segment's backward is the layer's backward at ``x``
        times the segment's share of the layer's forward at ``x``.
    """
    # Megatron pairs inside each TP layer: a column group (consecutive Linears reading the same input,
    # only views between them: q, k, v) and the next Linear as the row; the ops in between are split
    from .model import VIEW_OPS
    sharded: set[tuple[int, int]] = set()
    col_at: set[tuple[int, int]] = set()       # first Linear of a column group: segment start, backward all-reduce
    col_member: set[tuple[int, int]] = set()   # every Linear of a column group: weight and bias split
    row_at: set[tuple[int, int]] = set()
    for li, lay in enumerate(layers):
        if settings[li].tp <= 1:
            continue
        group: list[int] = []
        for oi, op in enumerate(lay.ops):
            if op.linear is None:
                continue
            if not group:
                group = [oi]
                continue
            first = lay.ops[group[0]]
            views_only = all(lay.ops[x].name in VIEW_OPS for x in range(group[-1] + 1, oi))
            if views_only and op.linear[0] == first.linear[0] and op.in_bytes == first.in_bytes:
                group.append(oi)
                continue
            sharded.update((li, x) for x in range(group[0], oi + 1))
            col_at.add((li, group[0]))
            col_member.update((li, x) for x in group)
            row_at.add((li, oi))
            group = []
    plans = []
    for li, lay in enumerate(layers):
        tp = settings[li].tp
        segs: list[Segment] = []
        cur = Segment(0.0, 0.0, 0.0)
        raw_total = lay.fwd_time(x)
        p_local = float(lay.param_bytes)
        a_local = 0.0
        for oi, op in enumerate(lay.ops):
            if (li, oi) in col_at and (cur.fwd_us > 0 or cur.act_bytes > 0 or segs):
                segs.append(cur)
                cur = Segment(0.0, 0.0, 0.0)
            if (li, oi) in col_at:
                cur.bwd_ar_bytes = op.in_bytes
            f = 1.0 / tp if (li, oi) in sharded else 1.0
            cur.fwd_us += op.time(x * f)
            cur.act_bytes += op.act_bytes * f
            a_local += op.act_bytes * f
            if (li, oi) in col_member:
                p_local -= (op.weight_bytes + op.bias_bytes) * (1 - 1.0 / tp)
            elif (li, oi) in row_at:
                p_local -= op.weight_bytes * (1 - 1.0 / tp)
            if (li, oi) in row_at:
                cur.fwd_ar_bytes = op.out_bytes
                segs.append(cur)
                cur = Segment(0.0, 0.0, 0.0)
        if cur.fwd_us > 0 or cur.act_bytes > 0 or not segs:
            segs.append(cur)
        bwd = lay.bwd_time(x)
        for s in segs:
            if raw_total > 0:
                s.bwd_us = bwd * s.fwd_us / raw_total
            else:
                s.bwd_us = bwd / len(segs)
        plans.append(LayerPlan(layer=lay, settings=settings[li], segments=segs, params_local=max(0.0, p_local),
                               act_local=a_local))
    return plans


def ddp_buckets(items: list[tuple[str, int, int]], bucket_mb: float) -> list[list[tuple[str, int, int]]]:
    """DDP's buckets over ``(param, bytes, layer index)`` given in backward (reverse registration) order:
    the first closes at 1 MiB, the others at ``bucket_mb`` MB."""
    cap_first, cap = FIRST_BUCKET_BYTES, int(bucket_mb * 1024 * 1024)
    out: list[list[tuple[str, int, int]]] = []
    cur: list[tuple[str, int, int]] = []
    size = 0
    for it in items:
        cur.append(it)
        size += it[1]
        if size >= (cap_first if not out else cap):
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


# --------------------------------------------------------------------------- compiler

class _Builder:
    """Graph under construction: compute ops, collectives (rings) and transfers."""

    def __init__(self, nodes: list[str], hosts: list[str], model: CommModel, rs_as_allreduce: bool = False) -> None:
        self.g = nx.DiGraph()
        self.g.graph["iteration_edges"] = []
        man = Manifest(job="simulate", framework="simulate", comm_backend="ring", world_size=len(nodes),
                       nodes={n: NodeInfo(host=h, rank=i, dir=None) for i, (n, h) in enumerate(zip(nodes, hosts))},
                       iterations=[0])
        self.ctx = CommContext(graph=self.g, manifest=man, model=model, links=Links(man))
        self.collectives: list[dict[str, Any]] = []
        self.n_coll = 0
        #: gloo: reduce_scatter_tensor moves an all-reduce's bytes (measured, docs/simulate.md Validation)
        self.rs_as_allreduce = rs_as_allreduce
        #: (node, "F"/"B", micro-batch, unit) -> Out op of that FSDP unit's all-gather (prefetch chain)
        self.fsdp_ag: dict[tuple[str, str, int, int], str] = {}

    def compute(self, node: str, name: str, dur: float, *, kind: str, tensor: str = "") -> str:
        key = op_key(node, name)
        add_op(self.g, key, node=node, device=compute_device(node, "compute"), kind=kind, dur=max(0.0, float(dur)),
               name=name, tensor=tensor, source="model")
        return key

    def collective(self, kind: str, group: list[str], nbytes: float, deps: dict[str, list[str]], tag: str,
                   buffer: float = 0.0) -> dict[str, str]:
        """A ring collective over ``group``; returns node -> its Out op (ready when the result is).

        ``kind``: ``allreduce`` (2(k-1) steps), ``reduce_scatter`` or ``all_gather`` (k-1 steps);
        ``nbytes``: the whole tensor (each step moves ``nbytes / k`` per rank); ``buffer``: bytes the
        caller holds on each rank while it runs (FSDP's flat all-gather output / reduce-scatter input).
        On a gloo profile the library's own buffers are held too: :func:`gloo_ring_scratch` for an
        all-reduce (and a reduce-scatter, which gloo runs as one), the whole ``nbytes`` for an
        all-gather (gathered into a flat buffer of its own, then copied out).
        """
        self.n_coll += 1
        tensor = f"{tag}#{self.n_coll}"
        nb = int(round(nbytes))
        coll = Collective(tensor=tensor, op="allreduce", bytes=nb, participants=list(group))
        self.collectives.append({"kind": kind, "group": list(group), "bytes": nb, "tag": tag, "tensor": tensor})
        as_allreduce = kind == "allreduce" or (kind == "reduce_scatter" and self.rs_as_allreduce)
        if as_allreduce:
            ring_allreduce(self.ctx, coll)
        else:
            _ring_half(self.ctx, coll, kind)
        # gloo's own buffers while the collective runs (measured: docs/simulate.md "Memory, 2026-11-28")
        scratch = 0.0
        if self.rs_as_allreduce and len(group) > 1:
            scratch = gloo_ring_scratch(nb, len(group)) if as_allreduce else float(nb)
        scratch += float(buffer)
        out = {}
        for r in group:
            kin, kout = self.ctx.in_out(coll, r)
            for d in deps.get(r, []):
                self.g.add_edge(d, kin)
            out[r] = kout
            if scratch:
                _mem(self.g, kin, alloc=scratch)
                _mem(self.g, kout, free=scratch)
        return out

    def p2p(self, src: str, dst: str, nbytes: float, deps: list[str], tag: str,
            rendezvous: tuple[str | None, str | None, list[str], list[str]] | None = None) -> str:
        """One point-to-point transfer after ``deps`` on ``src``; returns the RECV op on ``dst``.

        ``rendezvous`` = (the op after which ``src`` posts the send, the op after which ``dst`` posts the
        receive, the ops that wait for the send's completion, those that wait for the receive's): the
        bytes leave at the later of the send's post and the receive's post plus the link's latency (the
        receiver's ready notice travelling back, gloo's ``NOTIFY_RECV_READY``); the send is complete
        then (gloo sizes the socket's buffer to the message), the receive when the bytes are in."""
        self.n_coll += 1
        tensor = f"{tag}#{self.n_coll}"
        coll = Collective(tensor=tensor, op="send", bytes=int(round(nbytes)), participants=[src, dst])
        self.collectives.append({"kind": "send_recv", "group": [src, dst], "bytes": int(round(nbytes)), "tag": tag,
                                 "tensor": tensor})
        ks, kr = self.ctx.transfer(coll, phase="p2p", step=0, chunk=0, src=src, dst=dst, nbytes=int(round(nbytes)))
        for dep in deps:
            self.g.add_edge(dep, ks)
        if rendezvous is not None:
            q, p, send_waits, recv_waits = rendezvous
            link = self.ctx.links.device(dst, src)
            notice = add_op(self.g, op_key(dst, f"recv ready {tensor}"), node=dst, kind=OpKind.VIRTUAL.value,
                            name="recv ready", dur=self.ctx.model.transfer_us(0, link), tensor=tensor)
            sent = add_op(self.g, op_key(src, f"send start {tensor}"), node=src, kind=OpKind.VIRTUAL.value,
                          name="send start", tensor=tensor)
            for a, z in ((q, sent), (p, notice), (notice, sent), (sent, ks)):
                if a is not None:
                    self.g.add_edge(a, z)
            for w in send_waits:
                self.g.add_edge(sent, w)
            for w in recv_waits:
                self.g.add_edge(kr, w)
        return kr


def _rendezvous(posted: dict, waited: dict, src: str, dst: str, what: tuple[str, int]) -> tuple:
    """:meth:`_Builder.p2p`'s ``rendezvous`` for transfer ``what`` = (``"act"|"grad"``, micro-batch)."""
    snd, rcv = (src, ("send", *what)), (dst, ("recv", *what))
    return posted.get(snd), posted.get(rcv), waited.get(snd, []), waited.get(rcv, [])


#: gloo's ring all-reduce sends at most this many bytes per send/recv (``AllreduceOptionsImpl::kMaxSegmentSize``)
GLOO_MAX_SEGMENT = 1 << 20


def gloo_ring_scratch(nbytes: float, k: int, elem: int = 4) -> float:
    """Bytes gloo's ring all-reduce allocates while it runs: two segments (gloo ``allreduce.cc``
    ``ring``: ``tmpAllocation(new uint8_t[segmentBytes * 2])``, one segment in flight while the
    other is reduced).  The input is cut into ``numSegments`` = ``max(ceil(bytes / 1 MiB), 2k)``
    rounded up to a multiple of ``k``; a segment is ``ceil(bytes / numSegments)`` rounded up to the
    element size.  (The other gloo collectives FSDP2 uses on a CPU, an all-gather into a flat
    buffer, allocate the whole output instead: :meth:`_Builder.collective`.)

    >>> gloo_ring_scratch(4 << 20, 2)          # 4 segments of 1 MiB, two of them
    2097152
    >>> gloo_ring_scratch(1 << 20, 2)          # at least 2k = 4 segments: 2 x 256 KiB
    524288
    >>> gloo_ring_scratch(7 << 20, 2)          # 8 segments (7 rounded up to a multiple of 2): 2 x 896 KiB
    1835008
    """
    nb = int(nbytes)
    if nb <= 0 or k < 2:
        return 0
    nseg = max(-(-nb // GLOO_MAX_SEGMENT), 2 * k)
    nseg = -(-nseg // k) * k
    seg = -(-nb // nseg)
    seg = -(-seg // elem) * elem
    return 2 * seg


def _ring_half(ctx: CommContext, coll: Collective, kind: str) -> None:
    """Ring reduce-scatter (or all-gather): ``k-1`` steps, the first / second half of the ring
    all-reduce (:func:`dpro_kit.graph.topology.ring_pass`)."""
    ring_pass(ctx, coll, (kind,))


def comm_model_for(strategy: Strategy, nodes: list[str], hosts: list[str], *, bandwidth_Bps: float,
                   latency_us: float, intra_Bps: float) -> CommModel:
    """The link model: ``default`` between hosts, ``per_link`` for every pair of ranks sharing a host."""
    cm = CommModel(default=LinkModel(latency_us, bandwidth_Bps), origin="user")
    for a, ha in zip(nodes, hosts):
        for b, hb in zip(nodes, hosts):
            if a != b and ha == hb:
                cm.per_link[f"link:{a}->{b}"] = LinkModel(latency_us, intra_Bps)
    return cm


def compile_strategy(model: ModelGraph, strategy: Strategy, *, bandwidth_Bps: float, latency_us: float,
                     intra_Bps: float, runtime_us: float = 0.0) -> Compiled:
    """Compile ``model`` under ``strategy`` into a distributed execution graph (module docstring).

    Parameters
    ----------
    model : ModelGraph
        Layers with times and sizes (:func:`dpro_kit.simulate.model.from_profile`).
    strategy : Strategy
        The parsed tree (:func:`dpro_kit.simulate.strategy.load_strategy`).
    bandwidth_Bps : float
        Link rate between hosts (bytes/s).
    latency_us : float
        Per-transfer latency (the alpha of the alpha-beta model).
    intra_Bps : float
        Link rate between ranks of one host.
    runtime_us : float
        The strategy runtime's own CPU time per rank and iteration (``Strategy.runtime_overhead_ms``,
        measured): split evenly over the rank's ``2m`` actions (each micro-batch's forward and
        backward), one compute op ``runtime F|B mb<j>`` at the start of each, after the pipeline
        receive that action waits for.

    Returns
    -------
    Compiled

    Raises
    ------
    DproError
        More pipeline stages than layers, a child naming no layer.
    """
    st = strategy
    strategy.check_modules(model.layer_names())
    dp, tp, S, m = st.dp, st.tp, st.stages, st.micro_batches
    div = dp * m          # the profiled (global) batch: 1/dp per replica, 1/m of that per micro-batch
    if S > len(model.layers):
        raise DproError(f"pipeline.stages {S} > the model's {len(model.layers)} layers", path=st.path,
                        record="strategy.pipeline.stages", hint="layers: " + ", ".join(model.layer_names()))
    per_host = st.ranks // st.hosts
    nodes = [f"h{r // per_host}/{r}" for r in range(st.ranks)]
    hosts = [f"h{r // per_host}" for r in range(st.ranks)]
    cm = comm_model_for(st, nodes, hosts, bandwidth_Bps=bandwidth_Bps, latency_us=latency_us, intra_Bps=intra_Bps)
    b = _Builder(nodes, hosts, cm, rs_as_allreduce=model.comm_backend == "gloo")
    # gloo (torch on CPU): FSDP2's collectives block the rank (FSDPParamGroup.unshard_async_op is False by
    # default and a CPU has no side streams), so each runs between two of the rank's compute ops: chains[node]
    # is the rank's compute order, _fsdp_units puts the collectives into it
    chains: dict[str, list[str]] | None = {} if model.comm_backend == "gloo" else None
    settings = [st.settings(lay.name) for lay in model.layers]

    def rank(s: int, d: int, t: int) -> int:
        return s * dp * tp + d * tp + t

    x = 1.0 / div         # a rank's micro-batch as a fraction of the profiled batch
    costs = [lay.fwd_time(x) * (2 if se.recompute else 1) + lay.bwd_time(x) for lay, se in zip(model.layers, settings)]
    if st.split == "even":
        try:
            groups = even_stages(model.layer_names(), S)
        except ValueError as exc:
            raise DproError(f"pipeline.split even: {exc}", path=st.path, record="strategy.pipeline.split",
                            hint="layers: " + ", ".join(model.layer_names())) from None
    else:
        groups = partition_stages(costs, S)
    stage_plans = [plan_layers([model.layers[i] for i in grp], [settings[i] for i in grp], x) for grp in groups]
    total_p = max(1, model.param_bytes)
    opt_ratio = model.optimizer_state_bytes / total_p
    stage_of = [r // (dp * tp) for r in range(st.ranks)]
    memory: list[dict[str, float]] = [{} for _ in range(st.ranks)]
    # pipeline transfers: (node, ("recv"|"send", "act"|"grad", j)) -> the op after which the rank posts it,
    # the gates (virtual ops) that wait for it; end_of: the rank's last op before its optimizer step
    posted: dict[tuple[str, tuple], str] = {}
    waited: dict[tuple[str, tuple], list[str]] = {}
    end_of: dict[str, str] = {}
    # per rank: keys of its compute ops
    for s, plans in enumerate(stage_plans):
        L = len(plans)
        for d in range(dp):
            for t in range(tp):
                r = rank(s, d, t)
                node = nodes[r]
                # a replica's data is its 1/dp of the batch (a pipeline's first stage makes the whole replica's)
                other = b.compute(node, "other (data, zero_grad)", model.other_time(1.0 / dp), kind=OpKind.OTHER.value)
                last = other
                chain = [other]
                # units in schedule order; each unit = list of compute ops (keys), built now, chained; with
                # pipeline stages, the points where the rank posts and waits for its transfers (p2p_steps)
                for step in p2p_steps(s, S, m, st.schedule, st.max_in_flight) if S > 1 else \
                        [("run", k_, j_) for k_, j_ in schedule_order(s, S, m, st.schedule, st.max_in_flight)]:
                    if step[0] == "post":
                        for op in step[1]:
                            posted[(node, op)] = last
                        continue
                    if step[0] == "wait":
                        if step[1]:
                            gate = op_key(node, f"wait {' '.join(f'{a} {k_} mb{j_}' for a, k_, j_ in step[1])}")
                            add_op(b.g, gate, node=node, kind=OpKind.VIRTUAL.value, name="p2p wait")
                            b.g.add_edge(last, gate)
                            for op in step[1]:
                                waited.setdefault((node, op), []).append(gate)
                            last = gate
                        continue
                    _, kind_, j = step
                    if runtime_us > 0:     # the runtime's own CPU time for this action (measured)
                        key = b.compute(node, f"runtime {kind_} mb{j}", runtime_us / (2 * m), kind=OpKind.OTHER.value)
                        b.g.add_edge(last, key)
                        last = key
                        chain.append(key)
                    if kind_ == "F":
                        for li, pl in enumerate(plans):
                            for k, seg in enumerate(pl.segments):
                                key = b.compute(node, f"F mb{j} {pl.layer.name} seg{k}", seg.fwd_us,
                                                kind=OpKind.FW.value, tensor=pl.layer.name)
                                b.g.add_edge(last, key)
                                last = key
                                chain.append(key)
                    else:
                        for li in range(L - 1, -1, -1):
                            pl = plans[li]
                            if pl.settings.recompute:   # the forward again, segment by segment
                                for k, seg in enumerate(pl.segments):
                                    key = b.compute(node, f"R mb{j} {pl.layer.name} seg{k}", seg.fwd_us,
                                                    kind=OpKind.FW.value, tensor=pl.layer.name)
                                    b.g.add_edge(last, key)
                                    last = key
                                    chain.append(key)
                            for k in range(len(pl.segments) - 1, -1, -1):
                                key = b.compute(node, f"B mb{j} {pl.layer.name} seg{k}", pl.segments[k].bwd_us,
                                                kind=OpKind.BW.value, tensor=pl.layer.name)
                                b.g.add_edge(last, key)
                                last = key
                                chain.append(key)
                if chains is not None:
                    chains[node] = chain
                end_of[node] = last
    # data dependencies: TP all-reduces between segments, pipeline sends; a stage's forward output is
    # ready at fwd_tail (its last segment, or that segment's all-reduce), its input gradient at bwd_tail
    K = lambda node, nm: op_key(node, nm)  # noqa: E731
    fwd_tail: dict[tuple[str, int], str] = {}
    bwd_tail: dict[tuple[str, int], list[str]] = {}
    for s, plans in enumerate(stage_plans):
        for d in range(dp):
            tp_group = [nodes[rank(s, d, t)] for t in range(tp)]
            for j in range(m):
                for nd in tp_group:
                    fwd_tail[(nd, j)] = K(nd, f"F mb{j} {plans[-1].layer.name} seg{len(plans[-1].segments) - 1}")
                    bwd_tail[(nd, j)] = [K(nd, f"B mb{j} {plans[0].layer.name} seg0")]
                for li, pl in enumerate(plans):
                    if pl.settings.tp <= 1:
                        continue
                    for k, seg in enumerate(pl.segments):
                        if seg.fwd_ar_bytes:
                            deps = {nd: [K(nd, f"F mb{j} {pl.layer.name} seg{k}")] for nd in tp_group}
                            outs = b.collective("allreduce", tp_group, seg.fwd_ar_bytes / div, deps,
                                                f"tp fwd mb{j} {pl.layer.name}")
                            nxt = _next_fwd(plans, li, k)
                            for nd in tp_group:
                                if nxt is not None:
                                    b.g.add_edge(outs[nd], K(nd, f"F mb{j} {plans[nxt[0]].layer.name} seg{nxt[1]}"))
                                else:
                                    fwd_tail[(nd, j)] = outs[nd]
                            if pl.settings.recompute:   # the recomputed forward all-reduces again (Megatron)
                                deps = {nd: [K(nd, f"R mb{j} {pl.layer.name} seg{k}")] for nd in tp_group}
                                outs = b.collective("allreduce", tp_group, seg.fwd_ar_bytes / div, deps,
                                                    f"tp recompute mb{j} {pl.layer.name}")
                                nxt_key = (f"R mb{j} {pl.layer.name} seg{k + 1}" if k + 1 < len(pl.segments)
                                           else f"B mb{j} {pl.layer.name} seg{k}")
                                for nd in tp_group:
                                    b.g.add_edge(outs[nd], K(nd, nxt_key))
                        if seg.bwd_ar_bytes:
                            deps = {nd: [K(nd, f"B mb{j} {pl.layer.name} seg{k}")] for nd in tp_group}
                            outs = b.collective("allreduce", tp_group, seg.bwd_ar_bytes / div, deps,
                                                f"tp bwd mb{j} {pl.layer.name}")
                            prv = _prev_bwd(plans, li, k)
                            for nd in tp_group:
                                if prv is not None:
                                    b.g.add_edge(outs[nd], _bwd_entry_key(nd, j, plans, prv))
                                else:
                                    bwd_tail[(nd, j)].append(outs[nd])
                for nd in tp_group:   # a micro-batch's backward starts after its own forward
                    b.g.add_edge(fwd_tail[(nd, j)], _first_bwd_key(nd, j, plans))
    for s in range(S - 1):
        plans, nplans = stage_plans[s], stage_plans[s + 1]
        act = nplans[0].layer.input_bytes / div
        for d in range(dp):
            for t in range(tp):
                src, dst = nodes[rank(s, d, t)], nodes[rank(s + 1, d, t)]
                for j in range(m):
                    kr = b.p2p(src, dst, act, [fwd_tail[(src, j)]], f"pp act mb{j} s{s}->{s + 1}",
                               rendezvous=_rendezvous(posted, waited, src, dst, ("act", j)))
                    b.g.add_edge(kr, K(dst, f"F mb{j} {nplans[0].layer.name} seg0"))
                    kg = b.p2p(dst, src, act, bwd_tail[(dst, j)], f"pp grad mb{j} s{s + 1}->{s}",
                               rendezvous=_rendezvous(posted, waited, dst, src, ("grad", j)))
                    b.g.add_edge(kg, _first_bwd_key(src, j, plans))
                    if runtime_us > 0:   # the action's runtime work starts once its input has arrived
                        b.g.add_edge(kr, K(dst, f"runtime F mb{j}"))
                        b.g.add_edge(kg, K(src, f"runtime B mb{j}"))
    # data-parallel gradient synchronisation and the optimizer step
    notes: list[str] = [batch_note(model, x, tp)] if div > 1 or tp > 1 else []
    if b.rs_as_allreduce and any(pl.settings.sharding in SHARDED_PARAMS for plans in stage_plans for pl in plans):
        notes.append("gloo profile: reduce-scatters replayed as all-reduces (gloo's reduce_scatter_tensor sends "
                     "an all-reduce's bytes); FSDP's collectives block the rank's compute (torch on CPU: no "
                     "overlap, no prefetch ahead of compute)")
    if tp > 1 and not any(sg.fwd_ar_bytes for plans in stage_plans for pl in plans for sg in pl.segments):
        notes.append(f"tensor_parallel degree {tp}: no Linear pair (column group -> row) in any layer, so nothing "
                     "is split: every TP rank computes the whole model")
    for s, plans in enumerate(stage_plans):
        L = len(plans)
        for t in range(tp):
            group = [nodes[rank(s, d, t)] for d in range(dp)]
            # every backward of the rank is done before its step
            upd_deps = {nd: [_last_bwd_key(nd, j, plans) for j in range(m)] + [end_of[nd]] for nd in group}
            upd_scale = 0.0
            for pl in plans:
                f = 1.0 / dp if pl.settings.sharding != "none" else 1.0
                upd_scale += pl.params_local * f
            upd_us = model.update_us * upd_scale / total_p
            ag_after: list[tuple[float, str]] = []
            if dp > 1:
                # DDP buckets (sharding none, zero1): parameters in reverse registration order, one
                # all-reduce per bucket once its layers' last backward is done
                items = []
                for li in range(L - 1, -1, -1):
                    pl = plans[li]
                    if pl.settings.sharding not in DDP_SYNC:
                        continue
                    scale = pl.params_local / max(1, pl.layer.param_bytes)
                    for nm, by in reversed(list(pl.layer.params.items())):
                        items.append((nm, int(by * scale), li))
                for bi, bucket in enumerate(ddp_buckets(items, st.bucket_mb)):
                    lis = {li for _, _, li in bucket}
                    size = sum(by for _, by, _ in bucket)
                    deps = {nd: [_bwd_layer_done_key(nd, m - 1, plans, min(lis))] for nd in group}
                    outs = b.collective("allreduce", group, size, deps, f"dp allreduce bucket{bi} s{s}")
                    for nd in group:
                        upd_deps[nd].append(outs[nd])
                # zero1 (ZeroRedundancyOptimizer): each rank steps its 1/dp, then the updated parameters
                # reach every rank (torch broadcasts each rank's shard: the volume of one all-gather)
                z1 = sum(pl.params_local for pl in plans if pl.settings.sharding == "zero1")
                if z1:
                    ag_after.append((z1, f"zero1 all_gather params s{s}"))
                # FSDP units (zero2, zero3, fsdp): all-gather before forward (zero3/fsdp: and before backward),
                # reduce-scatter after backward
                _fsdp_units(b, plans, group, m, upd_deps, schedule_order(s, S, m, st.schedule, st.max_in_flight),
                            chains)
            for nd in group:
                key = b.compute(nd, "optimizer step", upd_us, kind=OpKind.UPDATE.value)
                for dkey in upd_deps[nd]:
                    b.g.add_edge(dkey, key)
            for size, tag in ag_after:
                deps = {nd: [op_key(nd, "optimizer step")] for nd in group}
                b.collective("all_gather", group, size, deps, tag)
    # memory per rank: the parts (each at its largest) and, on the ops, what the replay tracks over time
    for r in range(st.ranks):
        s = stage_of[r]
        plans = stage_plans[s]
        memory[r] = stage_memory(plans, s, st, opt_ratio, model.transient_bytes, model.runtime_bytes)
    for s, plans in enumerate(stage_plans):
        annotate_memory(b.g, plans, s, st, [nodes[r] for r in range(st.ranks) if stage_of[r] == s],
                        model.transient_bytes, opt_ratio, model.runtime_bytes)
    return Compiled(graph=b.g, nodes=nodes, stage_of=stage_of,
                    stage_layers=[[pl.layer.name for pl in plans] for plans in stage_plans], memory=memory,
                    collectives=b.collectives, comm_model=cm, notes=notes)


def batch_note(model: ModelGraph, x: float, tp: int) -> str:
    """What the op times at a rank's batch fraction ``x`` rest on (one profile: linear, an assumption)."""
    split = f", ops split by tensor parallelism at {x / tp:g}" if tp > 1 else ""
    if model.batch_scaling == "linear":
        return (f"op times scaled linearly to a rank's micro-batch ({x:g} of the profiled batch{split}): one profile, "
                "so linear in the batch is an assumption (CPU ops are not: docs/simulate.md); give profiles at the "
                "rank's batch with --profile-at-batch")
    fr = model.batch_fractions
    lo = min(x / tp if tp > 1 else x, x)
    where = ("extrapolated below the smallest profiled batch" if lo < min(fr) - 1e-9 else
             "interpolated between the profiles")
    return (f"op times at {x:g} of the profiled batch{split} {where} (measured at "
            + ", ".join(f"{v:g}" for v in fr) + ")")


def _fsdp_units(b: _Builder, plans: list[LayerPlan], group: list[str], m: int,
                upd_deps: dict[str, list[str]], order: list[tuple[str, int]],
                chains: dict[str, list[str]] | None = None) -> None:
    """The FSDP units of one stage (layers with sharding zero2/zero3/fsdp) over data-parallel ``group``.

    zero3/fsdp (``reshard_after_forward=True``): per micro-batch, an all-gather of the unit's
    parameters before its forward, issued after the previous all-gather and after the forward two
    layers back (one unit of prefetch), and again before its backward (in backward order, after
    the backward two layers later).  zero2 (``reshard_after_forward=False``): one all-gather before
    the unit's first forward, the parameters kept until its last backward.  Every unit: a
    reduce-scatter of its gradients after its last backward.

    ``chains`` (gloo profiles: ``{node: the rank's compute op keys in order}``): every collective
    blocks the rank, as FSDP2 runs them on a CPU (``unshard_async_op`` False by default, no side
    streams; measured: the calls return after their bytes are sent, docs/simulate.md "pinned"): an
    all-gather starts after the compute op just before the op it feeds, and the compute op just
    after a unit's last backward waits for its reduce-scatter -- no compute overlaps them.
    """
    pos = {nd: {k: i for i, k in enumerate(chains[nd])} for nd in group} if chains is not None else None

    def before(nd: str, key: str) -> list[str]:
        """Blocking: the rank's compute op right before ``key`` (none for the first)."""
        if pos is None:
            return []
        i = pos[nd][key]
        return [chains[nd][i - 1]] if i > 0 else []

    def after(nd: str, key: str) -> str | None:
        """Blocking: the rank's compute op right after ``key`` (None for the last)."""
        if pos is None:
            return None
        i = pos[nd][key]
        return chains[nd][i + 1] if i + 1 < len(chains[nd]) else None

    units = [li for li, pl in enumerate(plans) if pl.settings.sharding in SHARDED_PARAMS]
    if not units:
        return
    reshard = [li for li in units if plans[li].settings.sharding != "zero2"]
    m_last = max(j for k, j in order if k == "B")
    last: dict[str, str | None] = {nd: None for nd in group}
    for kind_, j in order:
        if kind_ == "B":
            _fsdp_bwd(b, plans, reshard, group, j, last, before if chains is not None else None)
            continue
        for li in units:
            pl = plans[li]
            keep = pl.settings.sharding == "zero2"
            if keep and j > 0:
                continue
            deps: dict[str, list[str]] = {}
            for nd in group:
                dl = [last[nd]] if last[nd] else []
                if li >= 2:
                    dl.append(op_key(nd, f"F mb{j} {plans[li - 2].layer.name} seg{len(plans[li - 2].segments) - 1}"))
                elif j > 0:
                    dl.append(op_key(nd, f"F mb{j - 1} {plans[-1].layer.name} seg{len(plans[-1].segments) - 1}"))
                deps[nd] = dl + before(nd, op_key(nd, f"F mb{j} {pl.layer.name} seg0"))
            outs = b.collective("all_gather", group, pl.params_local, deps, f"fsdp all_gather fwd mb{j} {pl.layer.name}",
                                buffer=pl.params_local)
            gathered = pl.params_local      # the unsharded parameters, beside the rank's shard
            for nd in group:
                last[nd] = outs[nd]
                b.g.add_edge(outs[nd], op_key(nd, f"F mb{j} {pl.layer.name} seg0"))
                _mem(b.g, outs[nd], alloc=gathered)     # resharded after the unit's forward (zero2: backward)
                _mem(b.g, op_key(nd, f"B mb{m_last} {pl.layer.name} seg0") if keep
                     else op_key(nd, f"F mb{j} {pl.layer.name} seg{len(pl.segments) - 1}"), free=gathered)
    for li in reversed(units):
        pl = plans[li]
        deps = {nd: [_bwd_layer_done_key(nd, m - 1, plans, li)] for nd in group}
        outs = b.collective("reduce_scatter", group, pl.params_local, deps, f"fsdp reduce_scatter {pl.layer.name}",
                            buffer=pl.params_local)     # the gradients copied into one flat input
        for nd in group:
            upd_deps[nd].append(outs[nd])
            nxt = after(nd, deps[nd][0])
            if nxt is not None:
                b.g.add_edge(outs[nd], nxt)
            _mem(b.g, outs[nd], free=pl.params_local * (1 - 1 / len(group)))   # only the shard's gradient stays


def _fsdp_bwd(b: _Builder, plans: list[LayerPlan], units: list[int], group: list[str], j: int,
              last: dict[str, str | None], before: Callable[[str, str], list[str]] | None = None) -> None:
    """The backward all-gathers of micro-batch ``j`` (units in backward order), chained after ``last``.

    ``before`` (blocking, :func:`_fsdp_units`): the rank's compute op before a given one.  FSDP2 gathers
    a unit in its own pre-backward hook or, prefetched, in that of the next unit (layer order), so the
    last unit's all-gather and the one prefetched for the unit before it both run before the last
    unit's backward, and so on: each all-gather runs between ``before`` and the backward entry of the
    unit after it (its own for the last unit) and holds that op back."""
    L = len(plans)
    for idx in range(len(units) - 1, -1, -1):
        li = units[idx]
        pl = plans[li]
        host = units[idx + 1] if idx + 1 < len(units) else li
        deps, entry = {}, {}
        for nd in group:
            dl = [last[nd]] if last[nd] else []
            if li + 2 < L:
                dl.append(_bwd_layer_done_key(nd, j, plans, li + 2))
            else:
                dl.append(op_key(nd, f"F mb{j} {plans[-1].layer.name} seg{len(plans[-1].segments) - 1}"))
            entry[nd] = _bwd_entry_key(nd, j, plans, (host, len(plans[host].segments) - 1))
            deps[nd] = dl + (before(nd, entry[nd]) if before is not None else [])
        outs = b.collective("all_gather", group, pl.params_local, deps, f"fsdp all_gather bwd mb{j} {pl.layer.name}",
                            buffer=pl.params_local)
        gathered = pl.params_local
        for nd in group:
            last[nd] = outs[nd]
            b.g.add_edge(outs[nd], _bwd_entry_key(nd, j, plans, (li, len(pl.segments) - 1)))
            if before is not None:
                b.g.add_edge(outs[nd], entry[nd])
            _mem(b.g, outs[nd], alloc=gathered)         # resharded after the unit's backward
            _mem(b.g, op_key(nd, f"B mb{j} {pl.layer.name} seg0"), free=gathered)


def _mem(g: nx.DiGraph, key: str, alloc: float = 0.0, free: float = 0.0) -> None:
    """Add bytes taken when op ``key`` starts (``mem_alloc``) / given back when it ends (``mem_free``)
    (:func:`dpro_kit.optimize.memory.replay_memory` reads them)."""
    d = g.nodes[key]
    if alloc:
        d["mem_alloc"] = float(d.get("mem_alloc", 0.0)) + float(alloc)
    if free:
        d["mem_free"] = float(d.get("mem_free", 0.0)) + float(free)


def annotate_memory(g: nx.DiGraph, plans: list[LayerPlan], stage: int, st: Strategy, nodes: list[str],
                    transient_bytes: float, opt_ratio: float, runtime_bytes: float = 0.0) -> None:
    """Memory of one stage's ranks as op attributes, for a replay (Proteus §VI-B: the executor tracks
    every tensor's allocation and release).

    ``memory_base`` = resident parameters + optimizer state + DDP buffers + the process's runtime
    bytes (:attr:`ModelGraph.runtime_bytes`); a layer's gradients
    (``P``, unsharded) are taken when its first backward starts; per micro-batch, a forward segment
    takes its activations (``A_seg/m``; a recomputed layer only its input ``I/m``), the recompute op
    takes the layer's ``A/m``, each backward segment gives its ``A_seg/m`` back (the last one also the
    input of a recomputed layer); the last stage's first backward op of a micro-batch holds the
    transient ``X/m`` while it runs.  The collectives add theirs (FSDP gathers, ZeRO reduce-scatters).
    """
    dp, m = st.dp, st.micro_batches
    div = dp * m
    base = float(runtime_bytes)
    for pl in plans:
        P, sh = pl.params_local, pl.settings.sharding
        base += (P / dp if sh in SHARDED_PARAMS else P) + opt_ratio * (P / dp if sh != "none" else P)
        if sh in DDP_SYNC and dp > 1:
            base += P
    mb = g.graph.setdefault("memory_base", {})
    for nd in nodes:
        mb[nd] = mb.get(nd, 0.0) + base
        for li, pl in enumerate(plans):
            _mem(g, _bwd_entry_key(nd, 0, plans, (li, len(pl.segments) - 1)), alloc=pl.params_local)
            rec = pl.settings.recompute
            for j in range(m):
                for k, seg in enumerate(pl.segments):
                    fkey = op_key(nd, f"F mb{j} {pl.layer.name} seg{k}")
                    bkey = op_key(nd, f"B mb{j} {pl.layer.name} seg{k}")
                    if rec:
                        if k == 0:
                            _mem(g, fkey, alloc=pl.layer.input_bytes / div)
                            _mem(g, bkey, free=pl.layer.input_bytes / div)
                    else:
                        _mem(g, fkey, alloc=seg.act_bytes / div)
                    _mem(g, bkey, free=seg.act_bytes / div)
                if rec:
                    _mem(g, op_key(nd, f"R mb{j} {pl.layer.name} seg0"), alloc=pl.act_local / div)
        if stage == st.stages - 1 and transient_bytes:
            for j in range(m):
                _mem(g, _first_bwd_key(nd, j, plans), alloc=transient_bytes / div, free=transient_bytes / div)


def _next_fwd(plans: list[LayerPlan], li: int, k: int) -> tuple[int, int] | None:
    if k + 1 < len(plans[li].segments):
        return li, k + 1
    return (li + 1, 0) if li + 1 < len(plans) else None


def _prev_bwd(plans: list[LayerPlan], li: int, k: int) -> tuple[int, int] | None:
    """The backward segment that runs after segment (li, k)'s backward."""
    if k > 0:
        return li, k - 1
    return (li - 1, len(plans[li - 1].segments) - 1) if li > 0 else None


def _bwd_entry_key(node: str, j: int, plans: list[LayerPlan], pos: tuple[int, int]) -> str:
    """The op that starts backward segment ``pos`` (the recompute op when it is the layer's first)."""
    li, k = pos
    pl = plans[li]
    if pl.settings.recompute and k == len(pl.segments) - 1:
        return op_key(node, f"R mb{j} {pl.layer.name} seg0")
    return op_key(node, f"B mb{j} {pl.layer.name} seg{k}")


def _first_bwd_key(node: str, j: int, plans: list[LayerPlan]) -> str:
    return _bwd_entry_key(node, j, plans, (len(plans) - 1, len(plans[-1].segments) - 1))


def _last_bwd_key(node: str, j: int, plans: list[LayerPlan]) -> str:
    return op_key(node, f"B mb{j} {plans[0].layer.name} seg0")


def _bwd_layer_done_key(node: str, j: int, plans: list[LayerPlan], li: int) -> str:
    return op_key(node, f"B mb{j} {plans[li].layer.name} seg0")


def stage_memory(plans: list[LayerPlan], stage: int, st: Strategy, opt_ratio: float,
                 transient_bytes: float = 0.0, runtime_bytes: float = 0.0) -> dict[str, float]:
    """Peak memory of a rank of ``stage`` (bytes), by part (docs/simulate.md "Memory").

    params ``P/dp`` for zero2/zero3/fsdp layers else ``P`` (P: TP-local bytes); grads ``P/dp`` for
    zero2/zero3/fsdp; optimizer state ``ratio x P/dp`` for any sharding; DDP's flat bucket
    buffers (none, zero1; dp > 1) = their gradients; gathered parameters (unsharded, beside the
    shard): every zero2 unit's ``P`` (held from forward to backward) + the two largest adjacent
    zero3/fsdp units'; runtime: :attr:`ModelGraph.runtime_bytes` on every rank; activations = ``c``
    micro-batches in flight x per micro-batch bytes (``A/m``; a recomputed layer keeps its
    input ``I/m``) + the largest recomputed layer's ``A/m`` (re-materialised for its backward);
    transient (the loss's and backward's temporaries, :attr:`ModelGraph.transient_bytes`) ``/m``
    on the last stage.
    """
    dp, m = st.dp, st.micro_batches
    div = dp * m
    c = in_flight(stage, st.stages, m, st.schedule, st.max_in_flight)
    params = grads = opt = bufs = held = 0.0
    unit_full = []
    kept = 0.0
    recomp_peak = 0.0
    for pl in plans:
        P = pl.params_local
        sh = pl.settings.sharding
        params += P / dp if sh in SHARDED_PARAMS else P
        grads += P / dp if sh in SHARDED_GRADS else P
        opt += opt_ratio * (P / dp if sh != "none" else P)
        if sh in DDP_SYNC and dp > 1:
            bufs += P
        unit_full.append(P if sh in ("zero3", "fsdp") else 0.0)
        held += P if sh == "zero2" else 0.0
        if pl.settings.recompute:
            kept += pl.layer.input_bytes / div
            recomp_peak = max(recomp_peak, pl.act_local / div)
        else:
            kept += pl.act_local / div
    gathered = held + (max((unit_full[i] + (unit_full[i + 1] if i + 1 < len(unit_full) else 0.0))
                           for i in range(len(unit_full))) if unit_full else 0.0)
    acts = c * kept + recomp_peak
    transient = transient_bytes / div if stage == st.stages - 1 else 0.0
    out = {"params": params, "grads": grads, "optimizer": opt, "comm_buffers": bufs, "gathered_params": gathered,
           "activations": acts, "transient": transient, "runtime": float(runtime_bytes), "in_flight_micro_batches": c}
    out["peak"] = params + grads + opt + bufs + gathered + acts + transient + float(runtime_bytes)
    return out


__all__ = ["Compiled", "FIRST_BUCKET_BYTES", "GLOO_MAX_SEGMENT", "LayerPlan", "annotate_memory", "even_stages", "Segment",
           "compile_strategy", "comm_model_for", "gloo_ring_scratch",
           "ddp_buckets", "in_flight", "partition_stages", "plan_layers", "schedule_order", "stage_memory"]
