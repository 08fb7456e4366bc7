"""Build the global DFG from a :class:`~dpro_kit.trace.TraceSet` (dPRO §4.1).

global DFG = local DFGs (one per node: computation ops and their dependencies)
           + communication topology (per tensor/bucket: In/Out virtual ops on
             each node and the fine-grained SEND/RECV ops between them).

The two halves are built separately and joined only through the In/Out ops,
so a new framework only changes how local DFGs are read, and a new
communication scheme only adds a topology in :mod:`dpro_kit.graph.topology`.
"""
from __future__ import annotations

from collections import defaultdict

import networkx as nx
import pandas as pd

from ..costmodel import CommModel, fit_from_trace
from ..errors import GraphError
from ..trace import COMM_KINDS, OpKind, TraceSet
from .model import add_op, compute_device, op_key, validate
from .topology import TOPOLOGIES, CommContext, Links


def build_global_dfg(ts: TraceSet, *, comm_model: CommModel | None = None,
                     links: Links | None = None) -> nx.DiGraph:
    """Join local DFGs and communication topologies into one replayable DAG.

    * op durations are means over the profiled iterations;
    * coarse collective events (kind COMM) are replaced by the fine-grained
      topology of their tensor; their timing feeds the fitted comm model;
    * measured SEND/RECV/AGG events (from a communication-library patch) set
      the durations of the matching fine-grained ops through their
      transaction ids — the Middleman.
    """
    m = ts.manifest
    ev = ts.events
    model = comm_model or fit_from_trace(ts)
    links = links or Links(m)
    g = nx.DiGraph()

    # ---- local DFGs ---------------------------------------------------------------
    local = ev[~ev["kind"].isin([k.value for k in COMM_KINDS])]
    stats = _mean_by(local, ["node", "op"])
    for row in stats.itertuples(index=False):
        add_op(g, op_key(row.node, row.op), node=row.node, device=compute_device(row.node, row.stream),
               kind=row.kind, dur=float(row.dur), name=row.name or row.op, tensor=row.tensor,
               bytes=int(row.bytes), source="trace")
    dropped: dict[str, set[str]] = defaultdict(set)  # ops in dependency files but not in the graph
    for node, edges in ts.edges.items():
        for u, v in edges:
            ku, kv = op_key(node, u), op_key(node, v)
            for k, o in ((ku, u), (kv, v)):
                if k not in g:
                    dropped[node].add(k)
            g.add_edge(ku, kv)
    # ops that appear only in dependency files (e.g. a coarse allreduce launch that the
    # topology replaces) are contracted: their predecessors now precede their successors.
    for node, keys in dropped.items():
        for k in keys:
            preds, succs = list(g.predecessors(k)), list(g.successors(k))
            g.remove_node(k)
            g.add_edges_from((p, s) for p in preds for s in succs)

    # ---- communication topology -----------------------------------------------------
    measured = _measured_comm(ev)
    ctx = CommContext(graph=g, manifest=m, model=model, links=links, measured=measured)
    for coll in ts.collectives:
        for node in list(coll.inputs) + list(coll.outputs):
            for op in coll.inputs.get(node, []) + coll.outputs.get(node, []):
                if op_key(node, op) not in g:
                    raise GraphError(f"collective {coll.tensor!r} names op {op!r}, which node {node!r} never ran",
                                     path=ts.path, record=f"{node}/comm.json",
                                     hint="the dependency and event files of that node disagree; re-collect")
        builder = TOPOLOGIES.get(coll.algorithm)
        if builder is None:
            raise GraphError(f"unknown communication algorithm {coll.algorithm!r} for {coll.tensor!r}",
                             path=ts.path, hint="known: " + ", ".join(sorted(TOPOLOGIES)))
        builder(ctx, coll)

    add_iteration_boundaries(g)
    g.graph["meta"] = {"job": m.job, "framework": m.framework, "comm_backend": m.comm_backend,
                       "world_size": m.world_size, "comm_model": model.describe(),
                       "hosts": {n: i.host for n, i in m.nodes.items()}}
    validate(g, where=ts.path)
    return g


def _mean_by(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean duration per key; other columns from the first occurrence."""
    if df.empty:
        return df.assign(dur=pd.Series(dtype=float))
    g = df.groupby(keys, sort=False, observed=True)
    first = g.first().drop(columns=["dur", "start", "iteration"])
    return first.join(g["dur"].mean()).reset_index()


def _measured_comm(ev: pd.DataFrame) -> dict[str, float]:
    """Mean duration per transaction id (SEND/RECV) or per AGG op, from fine-grained events.

    When a transfer's RECV was measured, its duration (clipped by the SEND's start once the
    clocks are aligned: ``dpro_kit.align.apply_offsets``) is the transfer time, and it is
    charged to the SEND op - the one that occupies the link, so that transfers sharing a link
    queue behind each other - while the RECV op takes no time.  A measured SEND alone keeps
    its own duration.  (Without alignment the RECV durations still hold the time the receiver
    waited for the sender: the error dPRO's alignment removes.)
    """
    fine = ev[ev["kind"].isin(["SEND", "RECV", "AGG"])]
    if fine.empty:
        return {}
    key = fine["kind"].astype(str) + " " + fine["txn"].where(fine["txn"] != "", fine["op"]).astype(str)
    out = fine.groupby(key)["dur"].mean().to_dict()
    for k in [k for k in out if k.startswith("RECV ")]:
        out["SEND " + k[5:]] = out[k]
        out[k] = 0.0
    return out


_NOT_FIRST = {OpKind.VIRTUAL.value, OpKind.SEND.value, OpKind.RECV.value}


def add_iteration_boundaries(g: nx.DiGraph) -> None:
    """Per node: a zero-time STEP_END op after its last ops; it precedes its first ops next iteration.

    This is the default rule for replaying several iterations: a node starts
    iteration i+1 only after it finished iteration i (including the Out op of
    every tensor, i.e. its parameters are up to date).  "Last" ops have no
    successor on the same node; "first" ops have no predecessor on the node and
    are not communication or virtual ops.  Linear in the graph size.
    """
    nodes = g.nodes
    by_node: dict[str, list[str]] = defaultdict(list)
    for k, d in g.nodes(data=True):
        by_node[d["node"]].append(k)
    iteration_edges = []
    for node, keys in by_node.items():
        if not node:
            continue
        sinks = [k for k in keys if not any(nodes[v]["node"] == node for v in g.successors(k))]
        sources = [k for k in keys if nodes[k]["kind"] not in _NOT_FIRST
                   and not any(nodes[u]["node"] == node for u in g.predecessors(k))]
        end = add_op(g, op_key(node, "STEP_END"), node=node, device="", kind=OpKind.VIRTUAL.value,
                     name="end of iteration", dur=0.0)
        g.add_edges_from((s, end) for s in sinks)
        iteration_edges.extend((end, s) for s in sources)
    g.graph["iteration_edges"] = iteration_edges
