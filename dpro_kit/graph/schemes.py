"""Communication schemes by name: how a synchronised tensor becomes ops (dPRO §4.1).

A :class:`CommScheme` bundles everything the rest of dpro-kit needs to know
about one way of synchronising tensors, so that no module branches on
``"ring"`` / ``"ps"``:

* ``op`` — the collective ``op`` a trace records for it (``comm.json``); a
  collective without an ``algorithm`` field gets the scheme registered for its
  op (:func:`scheme_for_op`);
* ``build(ctx, coll)`` — the fine-grained topology of one
  :class:`~dpro_kit.trace.Collective` (:mod:`dpro_kit.graph.topology`);
* ``collectives(group)`` — the collectives that synchronise a
  :class:`TensorGroup` (tensors fused into one, split into ``k`` partitions):
  what :func:`dpro_kit.graph.build.build` asks of a scheme for every group of a
  :class:`~dpro_kit.job.Strategy`;
* ``recognise(g, in_ops)`` — from a built DFG (a graph file), the tensor's
  participants (in the scheme's order), servers and (optionally) partitions, or None when
  the tensor's ops are not this scheme's; tried newest registration first, so
  the first registered scheme (``ring``) is the fallback;
* ``uses_servers`` — whether the scheme's ops run on server nodes; then
  ``servers_of(coll, servers)`` gives the servers of a traced collective (one per
  partition) given the job's server nodes;
* ``allreduce`` — whether it is an AllReduce among the workers (every participant ends
  with the reduced tensor): its collectives are the gradient buckets that what-ifs
  re-bucket and the memory model counts (:func:`is_allreduce`).

Built in: ``ring`` (ring AllReduce), ``tree`` (one chunk of NCCL's tree AllReduce: reduce up a
binary tree, broadcast down), ``ps`` (parameter-server push/pull), ``ps_async``
(asynchronous PS: per-worker updates) and ``ps_step`` (asynchronous PS whose step ends when all its
updates are done: TensorFlow's ParameterServerStrategy).
Adding one (tree, hierarchical, Horovod fusion, BytePS partitions): write its
topology builder in :mod:`dpro_kit.graph.topology` and ``register_scheme(...)``
it here (docs/architecture.md, "Adding a communication scheme").
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import networkx as nx

from ..errors import GraphError
from ..trace import Collective, OpKind
from .topology import (CommContext, ps_async_push_pull, ps_push_pull, ps_step_push_pull, ring_allreduce, split_bytes,
                       tree_allreduce, tree_order)

__all__ = ["asynchronous_workers", "CommScheme", "TensorGroup", "SCHEMES", "register_scheme", "get_scheme", "scheme_for_op",
           "is_allreduce", "recognise", "ps_server_of"]


@dataclass
class TensorGroup:
    """Tensors synchronised as one (a bucket of the optimizer's strategy), split into ``k`` partitions.

    Parameters
    ----------
    name : str
        The group's tensor name (``a+b`` for a fused group).
    bytes : int
        Total size.
    k : int
        Partitions (ring: ``k`` collectives ``name#p0..``; PS: ``k`` partitions over the servers).
    participants : list of str
        Worker nodes, in the scheme's order.
    servers : list of str
        PS: servers to place partitions on, round-robin.
    partitions : list of dict
        As traced (``{"bytes", "server"}``), used as is when ``k`` equals their number.
    """

    name: str
    bytes: int
    k: int
    participants: list[str]
    servers: list[str] = field(default_factory=list)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)
    priority: float = 0.0
    partitions: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class CommScheme:
    """One communication scheme (see the module docstring)."""

    name: str
    op: str
    build: Callable[[CommContext, Collective], None]
    collectives: Callable[["CommScheme", TensorGroup], list[Collective]]
    recognise: Callable[[nx.DiGraph, dict[str, str]], "tuple[list[str], list[str], list[dict]] | None"]
    uses_servers: bool = False
    servers_of: Callable[[Collective, list[str]], list[str]] | None = None
    allreduce: bool = False
    #: workers do not wait for each other (asynchronous PS): an iteration time is each worker's steady
    #: state over several replayed iterations, not one iteration's makespan (:func:`asynchronous_workers`)
    asynchronous: bool = False


SCHEMES: dict[str, CommScheme] = {}
"""Registered communication schemes by name (the ``algorithm`` of a collective)."""


def register_scheme(scheme: CommScheme) -> CommScheme:
    """Add (or replace) ``scheme`` in :data:`SCHEMES`; returns it."""
    SCHEMES[scheme.name] = scheme
    return scheme


def get_scheme(name: str, *, tensor: str = "", path: object = None) -> CommScheme:
    """The scheme registered as ``name``; GraphError naming the known ones otherwise."""
    s = SCHEMES.get(name)
    if s is None:
        raise GraphError(f"unknown communication algorithm {name!r}" + (f" for {tensor!r}" if tensor else ""),
                         path=path, hint="known: " + ", ".join(sorted(SCHEMES)))
    return s


def scheme_for_op(op: str) -> str:
    """The scheme a collective recorded as ``op`` uses when the trace does not say (ring for allreduce)."""
    for s in SCHEMES.values():
        if s.op == op:
            return s.name
    return "ps"


def is_allreduce(coll: Collective) -> bool:
    """Whether ``coll`` is an AllReduce among workers (a gradient bucket), by its registered scheme.

    The scheme is the one named by ``coll.algorithm``, else the one registered for
    ``coll.op`` (:func:`scheme_for_op`); its ``allreduce`` flag answers.  Ring (and any
    tree / hierarchical / fused AllReduce registered with ``allreduce=True``) yes, PS
    push/pull and barriers no.

    Parameters
    ----------
    coll : dpro_kit.trace.Collective
        A traced (or what-if) collective.
    """
    s = SCHEMES.get(coll.algorithm) or SCHEMES.get(scheme_for_op(coll.op))
    return bool(s is not None and s.allreduce)


def recognise(g: nx.DiGraph, in_ops: dict[str, str]) -> tuple[str, list[str], list[str], list[dict]]:
    """``(scheme, participants, servers, partitions)`` of the tensor whose In op on each node is ``in_ops[node]``."""
    for s in reversed(list(SCHEMES.values())):
        found = s.recognise(g, in_ops)
        if found is not None:     # (participants, servers[, partitions])
            participants, servers, *rest = found
            return s.name, list(participants), list(servers), list(rest[0]) if rest else []
    return "ring", sorted(in_ops), [], []      # pragma: no cover - ring always recognises


def ps_server_of(tensor: str, servers: list[str]) -> str:
    """The server of an unpartitioned PS tensor (as :func:`~dpro_kit.graph.topology.ps_push_pull` places it)."""
    return servers[zlib.crc32(tensor.encode()) % len(servers)]


def _ps_servers_of(coll: Collective, servers: list[str]) -> list[str]:
    if coll.partitions:
        return [str(p["server"]) for p in coll.partitions]
    return [ps_server_of(coll.tensor, servers)] if servers else []


# --------------------------------------------------------------------------- ring

def _ring_collectives(self: CommScheme, grp: TensorGroup) -> list[Collective]:
    return [Collective(tensor=grp.name if grp.k == 1 else f"{grp.name}#p{p}", op=self.op, bytes=b,
                       participants=list(grp.participants), algorithm=self.name, inputs=grp.inputs,
                       outputs=grp.outputs, params=grp.params, priority=grp.priority)
            for p, b in enumerate(split_bytes(grp.bytes, grp.k))]


def _ring_recognise(g: nx.DiGraph, in_ops: dict[str, str]) -> tuple[list[str], list[str], list[dict]]:
    """Participants in ring order (following the step-0 SEND of each In op), from the sorted first."""
    nxt = {}
    for n, k in in_ops.items():
        for s in g.successors(k):
            d = g.nodes[s]
            if d["kind"] == OpKind.SEND.value and d["step"] == 0:
                nxt[n] = d["peer"]
    if len(nxt) != len(in_ops):
        return sorted(in_ops), [], []
    start = sorted(in_ops)[0]
    order, cur = [start], nxt[start]
    while cur != start and len(order) <= len(in_ops):
        order.append(cur)
        cur = nxt[cur]
    return (order if len(order) == len(in_ops) else sorted(in_ops)), [], []


# --------------------------------------------------------------------------- tree (NCCL)

def _tree_recognise(g: nx.DiGraph, in_ops: dict[str, str]) -> tuple[list[str], list[str]] | None:
    """Participants in tree order, from each node's reduce-phase SEND (its parent); None if not a tree."""
    parent: dict[str, str | None] = {}
    tree_ops = False
    for n, k in in_ops.items():
        parent[n] = None
        for s in g.successors(k):
            d = g.nodes[s]
            if d["kind"] == OpKind.SEND.value and d.get("phase") in ("reduce", "broadcast"):
                tree_ops = True
                if d["phase"] == "reduce":
                    parent[n] = d["peer"]
    if not tree_ops:
        return None
    order = tree_order(parent, (g.graph.get("meta") or {}).get("hosts"))
    return (order, []) if order is not None else None


# --------------------------------------------------------------------------- parameter server

def _ps_collectives(self: CommScheme, grp: TensorGroup) -> list[Collective]:
    if grp.partitions and len(grp.partitions) == grp.k:
        parts = [dict(p) for p in grp.partitions]
    elif not grp.servers:
        raise GraphError(f"tensor {grp.name!r} uses push_pull but the manifest lists no server node")
    else:
        parts = [{"bytes": b, "server": grp.servers[i % len(grp.servers)]}
                 for i, b in enumerate(split_bytes(grp.bytes, grp.k))]
    return [Collective(tensor=grp.name, op=self.op, bytes=grp.bytes, participants=list(grp.participants),
                       algorithm=self.name, inputs=grp.inputs, outputs=grp.outputs, params=grp.params,
                       partitions=parts, priority=grp.priority)]


def _ps_recognise(g: nx.DiGraph, in_ops: dict[str, str], phase: str = "aggregate"
                  ) -> tuple[list[str], list[str], list[dict]] | None:
    first = next(iter(in_ops.values()))
    if not any(g.nodes[s]["phase"] == "push" for s in g.successors(first)):
        return None
    tensor = g.nodes[first]["tensor"]
    aggs = [d for _, d in g.nodes(data=True) if d["kind"] == OpKind.AGG.value and d["tensor"] == tensor]
    if not aggs or any(d["phase"] != phase for d in aggs):
        return None
    parts = sorted({(d["chunk"], d["node"], d["bytes"]) for d in aggs})
    return sorted(in_ops), [s for _, s, _ in parts], [{"bytes": int(b), "server": s} for _, s, b in parts]


register_scheme(CommScheme(name="ring", op="allreduce", build=ring_allreduce, collectives=_ring_collectives,
                           recognise=_ring_recognise, allreduce=True))
# NCCL's tree AllReduce, one chunk per collective (after ring: recognised before it, newest first)
register_scheme(CommScheme(name="tree", op="allreduce_tree", build=tree_allreduce, collectives=_ring_collectives,
                           recognise=_tree_recognise, allreduce=True))
register_scheme(CommScheme(name="ps", op="push_pull", build=ps_push_pull, collectives=_ps_collectives,
                           recognise=_ps_recognise, uses_servers=True, servers_of=_ps_servers_of))
# asynchronous PS (MXNet dist_async): the same collectives, per-worker updates on the server
register_scheme(CommScheme(name="ps_async", op="push_pull_async", build=ps_async_push_pull,
                           collectives=_ps_collectives,
                           recognise=lambda g, in_ops: _ps_recognise(g, in_ops, phase="update"),
                           uses_servers=True, servers_of=_ps_servers_of, asynchronous=True))



def _ps_step_recognise(g: nx.DiGraph, in_ops: dict[str, str]) -> tuple[list[str], list[str], list[dict]] | None:
    first = next(iter(in_ops.values()))
    tensor = g.nodes[first]["tensor"]
    node = g.nodes[first]["node"]
    if f"Updated {tensor}" not in {g.nodes[k].get("name") for k in g.nodes if g.nodes[k].get("node") == node
                                   and g.nodes[k].get("kind") == OpKind.VIRTUAL.value}:
        return None
    return _ps_recognise(g, in_ops, phase="update")


# asynchronous PS with a step barrier (TF ParameterServerStrategy: a step ends when all its updates are done)
register_scheme(CommScheme(name="ps_step", op="push_pull_step", build=ps_step_push_pull,
                           collectives=_ps_collectives, recognise=_ps_step_recognise,
                           uses_servers=True, servers_of=_ps_servers_of, asynchronous=True))


def asynchronous_workers(g: nx.DiGraph) -> list[str]:
    """The worker nodes of ``g`` when its communication is asynchronous, else ``[]``.

    A graph is asynchronous when it has a server-side update op (``AGG`` in phase ``update``:
    :func:`dpro_kit.graph.topology.ps_async_push_pull`, one update per worker's push). Its
    workers then run at their own pace, coupled only through links and servers, and the first
    replayed iteration (every worker starting at 0, all pushes at once) is a transient the real
    job leaves after one step: :meth:`dpro_kit.session.Session.replay` reports the steady state.
    """
    if not any(d.get("kind") == OpKind.AGG.value and d.get("phase") == "update" for _, d in g.nodes(data=True)):
        return []
    servers = {d.get("node") for _, d in g.nodes(data=True) if d.get("kind") == OpKind.AGG.value}
    return sorted({str(d["node"]) for _, d in g.nodes(data=True)
                   if d.get("node") and d.get("node") not in servers})
