"""The global DFG as a networkx ``DiGraph``, and the conventions every pass follows.

Vertices are op keys (opaque strings, unique in the job; code never parses
them).  Each vertex carries typed attributes:

========== ========================================================================
attribute  meaning
========== ========================================================================
node       worker/server the op belongs to (``""`` for none)
device     replay device: ``<node>:<stream>``, ``link:<src_host>-><dst_host>``, or
           ``""`` for ops that take no device (In/Out markers)
kind       an :class:`~dpro_kit.trace.OpKind` value
dur        duration in us (mean over profiled iterations, or a cost model's)
name       human-readable op name
tensor     tensor/bucket the op produces or moves (``""`` if none)
bytes      bytes moved (communication ops)
txn        transaction id joining a SEND to its RECV (the Middleman's key)
phase      reduce_scatter / all_gather / push / pull / aggregate
step,chunk collective step and chunk/partition (-1 if not applicable)
peer       the other node of a transfer
priority   lower runs first when several ops wait for one device (default 0)
source     where ``dur`` came from: ``trace``, ``trace:txn``, ``model``
========== ========================================================================

Graph attributes: ``iteration_edges`` — list of ``(u, v)``: *u* in iteration
*i* must finish before *v* in iteration *i+1* (used to replay several
iterations); ``meta`` — a dict with the job's facts (world size, comm model).

Serialisation is JSON (node-link) or GraphML — never pickle.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import GraphError, TraceFormatError, atomic_write_text, DproError
from ..trace import OpKind, read_json

NODE_DEFAULTS: dict[str, Any] = {
    "node": "", "device": "", "kind": OpKind.OTHER.value, "dur": 0.0, "name": "", "tensor": "",
    "bytes": 0, "txn": "", "phase": "", "step": -1, "chunk": -1, "peer": "", "priority": 0.0,
    "source": "trace",
}
GRAPH_FORMAT = "dpro-dfg"
GRAPH_VERSION = 1


def add_op(g: nx.DiGraph, key: str, **attrs: Any) -> str:
    """Add one op with every attribute present (defaults filled in)."""
    data = dict(NODE_DEFAULTS)
    data.update(attrs)
    g.add_node(key, **data)
    return key


def op_key(node: str, op: str) -> str:
    """The global key of an op of ``node``: unique across the job, never parsed."""
    return f"{node}|{op}"


def compute_device(node: str, stream: str = "compute") -> str:
    return f"{node}:{stream}"


def validate(g: nx.DiGraph, *, where: str | None = None) -> None:
    """Check that ``g`` can be replayed: a DAG whose durations are finite and >= 0."""
    for key, data in g.nodes(data=True):
        dur = data.get("dur")
        if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
            raise GraphError(f"op {key!r} has duration {dur!r}; durations must be finite and >= 0",
                             path=where, hint="fix or re-collect the trace of node "
                             f"{data.get('node') or '?'}")
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        shown = " -> ".join(repr(u) for u, _ in cycle[:6]) + (" -> ..." if len(cycle) > 6 else "")
        raise GraphError(f"the dependency graph has a cycle: {shown} -> {cycle[0][0]!r}", path=where,
                         hint="an op cannot depend on itself; check the dependency file of that node")


# --------------------------------------------------------------------------- serialisation

def to_json(g: nx.DiGraph) -> dict[str, Any]:
    data = nx.node_link_data(g, edges="edges")
    data["graph"] = {"iteration_edges": [list(e) for e in g.graph.get("iteration_edges", [])],
                     "meta": g.graph.get("meta", {})}
    return {"format": GRAPH_FORMAT, "version": GRAPH_VERSION, "graph": data}


def from_json(doc: Any, *, path: str | None = None) -> nx.DiGraph:
    if not isinstance(doc, dict) or doc.get("format") != GRAPH_FORMAT:
        raise TraceFormatError("not a dpro graph file", path=path, hint=f'expected "format": "{GRAPH_FORMAT}"')
    if doc.get("version") != GRAPH_VERSION:
        raise TraceFormatError(f"unsupported graph version {doc.get('version')!r}", path=path)
    try:
        g = nx.node_link_graph(doc["graph"], directed=True, multigraph=False, edges="edges")
    except (KeyError, TypeError, nx.NetworkXError) as exc:
        raise TraceFormatError(f"malformed graph: {exc}", path=path) from None
    gattr = doc["graph"].get("graph", {})
    g.graph["iteration_edges"] = [tuple(e) for e in gattr.get("iteration_edges", [])]
    g.graph["meta"] = dict(gattr.get("meta", {}))
    for key in g.nodes:
        for a, v in NODE_DEFAULTS.items():
            g.nodes[key].setdefault(a, v)
    return g


def save_graph(g: nx.DiGraph, path: str | os.PathLike) -> None:
    """Write ``g`` as JSON (``.json``) or GraphML (``.graphml``), atomically."""
    path = Path(path)
    if path.suffix == ".graphml":
        h = g.copy()
        h.graph = {"iteration_edges": json.dumps(g.graph.get("iteration_edges", [])),
                   "meta": json.dumps(g.graph.get("meta", {}))}
        atomic_write_text(path, "\n".join(nx.generate_graphml(h)))
    elif path.suffix == ".json":
        atomic_write_text(path, json.dumps(to_json(g)))
    else:
        raise DproError(f"unknown graph file type {path.suffix!r}", path=path, hint="use .json or .graphml")


def load_graph(path: str | os.PathLike) -> nx.DiGraph:
    path = Path(path)
    if path.suffix == ".graphml":
        try:
            g = nx.read_graphml(path)
        except Exception as exc:  # graphml parser errors come in many types
            raise TraceFormatError(f"cannot read GraphML: {exc}", path=path) from None
        g.graph["iteration_edges"] = [tuple(e) for e in json.loads(g.graph.get("iteration_edges", "[]"))]
        g.graph["meta"] = json.loads(g.graph.get("meta", "{}"))
        for key in g.nodes:
            for a, v in NODE_DEFAULTS.items():
                g.nodes[key].setdefault(a, v)
        return g
    return from_json(read_json(path, what="graph file"), path=str(path))


__all__ = ["GRAPH_FORMAT", "GRAPH_VERSION", "NODE_DEFAULTS", "add_op", "compute_device", "from_json", "load_graph",
           "op_key", "save_graph", "to_json", "validate"]
