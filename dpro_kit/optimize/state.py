"""Strategy state and DFG rebuild: the optimizer's core data model.

Design (see docs/optimizer.md, "Design"): passes never edit a DFG in place.
The optimizer keeps

* a :class:`~dpro_kit.job.Job` (``BaseJob`` here) — the local (computation)
  DFG of every node, one :class:`~dpro_kit.job.Tensor` (``BaseTensor``) per
  synchronised tensor (inputs/outputs per node, bytes, scheme, parameter
  names), the comm model and the host map: the same Job the replayed DFG is
  built from (``Job.from_trace``; ``Job.from_graph`` for a graph file);
* an immutable, JSON-serialisable :class:`~dpro_kit.job.Strategy` — tensor
  groups (which base tensors are fused into one collective, in order), the
  partition number of each group, op-fusion groups (local op names, applied on
  every node that has them — symmetry), and memory choices.

``build(base, strategy)`` is :func:`dpro_kit.graph.build.build`, the one graph
builder (with the REAL topology builders of the registered communication
schemes).  Undo is therefore trivial (keep the previous ``Strategy``),
evaluation is "build + replay", a checkpoint is the strategy's JSON, and cycle
safety is checked by :func:`fusion_creates_cycle` on the small *condensed
graph* (local ops + one vertex per tensor group, which has exactly the
reachability of the full DFG) before a fusion is accepted, and again by
``build`` (which refuses a cyclic result).
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import networkx as nx

from ..graph.build import apply_memory, build, fused_duration, fused_local, group_collectives
from ..graph.model import op_key
from ..graph.topology import split_bytes
from ..job import (FUSED_PREFIX, Job, Strategy, Tensor, fused_name, group_name,
                   identity, local_name)

#: the optimizer's names for the job model (kept for callers of the earlier API)
BaseJob = Job
BaseTensor = Tensor

__all__ = ["BaseJob", "BaseTensor", "Strategy", "build", "extract_base", "initial_strategy", "fused_duration",
           "fused_local", "apply_memory", "group_collectives", "condensed_graph", "contract",
           "fusion_creates_cycle", "dumps_strategy", "split_bytes", "group_name", "fused_name", "local_name",
           "FUSED_PREFIX"]


def extract_base(g: nx.DiGraph, *, params: dict[str, list[str]] | None = None,
                 comm_model: Any = None) -> Job:
    """The job of a built global DFG (a graph file): :meth:`dpro_kit.job.Job.from_graph`."""
    return Job.from_graph(g, params=params, comm_model=comm_model)


def initial_strategy(base: Job, groups: list[list[str]] | None = None) -> Strategy:
    """Strategy with ``groups`` (default: the job's traced grouping, one tensor per group).

    A group that is one traced tensor keeps its traced partitions (PS), as in
    ``identity(base)``, so the optimizer starts from the graph ``dpro replay`` replays.
    """
    gs = tuple(tuple(g) for g in (groups or base.initial_groups))
    single = {g[0] for g in gs if len(g) == 1}
    parts = tuple((t, k) for t, k in identity(base).partitions if t in single)
    return Strategy(groups=gs, partitions=parts)


# --------------------------------------------------------------------------- cycle safety

def condensed_graph(base: BaseJob, strategy: Strategy, nodes: list[str] | None = None) -> nx.DiGraph:
    """Local ops (fusions applied) + one vertex per tensor group joining its inputs to its outputs.

    Reachability between computation ops equals that of the full DFG (a
    collective's SEND/RECV subgraph connects every input to every output).
    With ``nodes`` (symmetry: one rank stands for all) only those nodes' ops
    are kept; a path that leaves the rank through a tensor vertex re-enters it
    only through a tensor vertex, so reachability among the kept ops is unchanged.
    """
    g, alias = fused_local(base, strategy, nodes)
    keep = set(nodes) if nodes is not None else None
    for coll in group_collectives(base, strategy, alias):
        v = "TENSOR " + coll.tensor.rsplit("#p", 1)[0]
        if keep is not None:
            coll.inputs = {n: o for n, o in coll.inputs.items() if n in keep}
            coll.outputs = {n: o for n, o in coll.outputs.items() if n in keep}
        g.add_node(v)
        g.add_edges_from((op_key(n, o), v) for n, ops in coll.inputs.items() for o in ops)
        g.add_edges_from((v, op_key(n, o)) for n, ops in coll.outputs.items() for o in ops)
    return g


def contract(cg: nx.DiGraph, group: Iterable[str], new: str) -> None:
    """Contract the vertices ``group`` of ``cg`` into ``new`` (in place)."""
    grp = [k for k in group if k in cg]
    preds = {p for k in grp for p in cg.predecessors(k)} - set(grp)
    succs = {s for k in grp for s in cg.successors(k)} - set(grp)
    cg.remove_nodes_from(grp)
    cg.add_node(new)
    cg.add_edges_from((p, new) for p in preds)
    cg.add_edges_from((new, s) for s in succs)


def fusion_creates_cycle(cg: nx.DiGraph, group: Iterable[str]) -> bool:
    """True when contracting ``group`` (op keys) in ``cg`` would create a cycle.

    A cycle appears iff some path leaves the group and re-enters it.  BFS from
    the group's outside successors; exact, linear in the part of the graph
    reachable from the group.
    """
    grp = set(group)
    seen: set[str] = set()
    stack = [s for k in grp for s in cg.successors(k) if s not in grp]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        for s in cg.successors(u):
            if s in grp:
                return True
            if s not in seen:
                stack.append(s)
    return False


def dumps_strategy(s: Strategy) -> str:
    return json.dumps(s.to_json(), indent=1)
