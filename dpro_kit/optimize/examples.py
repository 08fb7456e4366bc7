"""Small hand-made global DFGs for tests and docs (built with the real topology code)."""
from __future__ import annotations

import networkx as nx

from ..costmodel import CommModel, LinkModel
from ..graph.build import add_iteration_boundaries
from ..graph.model import add_op, compute_device, op_key
from ..graph.topology import CommContext, Links, ring_allreduce
from ..trace import Collective, Manifest, NodeInfo, OpKind


def tiny_dfg(*, ranks: int = 2, sync_bn: bool = False, latency_us: float = 10.0,
             bandwidth_Bps: float = 1e9) -> nx.DiGraph:
    """Per rank: FW (100 us) -> BW1 (50 us, grad g1) -> BW2 (40 us, grad g0) -> UPD (5 us).

    Tensors g1 (1 MB) and g0 (1 MB), ring AllReduce, both waited for by UPD.
    ``sync_bn=True`` adds a tensor ``s`` produced by BW1 and waited for by BW2
    (like a SyncBatchNorm allreduce inside backward): fusing BW1 and BW2 would
    then create a cycle.  Links: ``latency_us`` + bytes / ``bandwidth_Bps``.
    """
    nodes = {f"w{r}": NodeInfo(host=f"h{r}", rank=r) for r in range(ranks)}
    m = Manifest(job="tiny", framework="test", comm_backend="nccl", world_size=ranks, nodes=nodes, iterations=[0])
    g = nx.DiGraph()
    for n in nodes:
        dev = compute_device(n)
        add_op(g, op_key(n, "FW"), node=n, device=dev, kind=OpKind.FW.value, dur=100.0, name="fw")
        add_op(g, op_key(n, "BW1"), node=n, device=dev, kind=OpKind.BW.value, dur=50.0, name="bw1", tensor="g1")
        add_op(g, op_key(n, "BW2"), node=n, device=dev, kind=OpKind.BW.value, dur=40.0, name="bw2", tensor="g0")
        add_op(g, op_key(n, "UPD"), node=n, device=dev, kind=OpKind.UPDATE.value, dur=5.0, name="upd")
        g.add_edges_from([(op_key(n, "FW"), op_key(n, "BW1")), (op_key(n, "BW1"), op_key(n, "BW2")),
                          (op_key(n, "BW2"), op_key(n, "UPD"))])
    model = CommModel(default=LinkModel(latency_us=latency_us, bandwidth_Bps=bandwidth_Bps), origin="user")
    ctx = CommContext(graph=g, manifest=m, model=model, links=Links(m))
    ws = list(nodes)
    colls = [Collective(tensor="g1", op="allreduce", bytes=1_000_000, participants=ws,
                        inputs={w: ["BW1"] for w in ws}, outputs={w: ["UPD"] for w in ws}, params=["layer1.weight"]),
             Collective(tensor="g0", op="allreduce", bytes=1_000_000, participants=ws,
                        inputs={w: ["BW2"] for w in ws}, outputs={w: ["UPD"] for w in ws}, params=["layer0.weight"])]
    if sync_bn:
        colls.append(Collective(tensor="s", op="allreduce", bytes=1000, participants=ws,
                                inputs={w: ["BW1"] for w in ws}, outputs={w: ["BW2"] for w in ws}, params=["bn.stats"]))
    for c in colls:
        ring_allreduce(ctx, c)
    add_iteration_boundaries(g)
    g.graph["meta"] = {"job": "tiny", "world_size": ranks, "comm_model": model.describe(),
                       "hosts": {n: i.host for n, i in nodes.items()}}
    return g


__all__ = ["tiny_dfg"]
