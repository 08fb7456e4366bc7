"""Build the global DFG of a :class:`~dpro_kit.job.Job` under a :class:`~dpro_kit.job.Strategy` (dPRO §4.1).

global DFG = local DFGs (one per node: computation ops and their dependencies;
             the strategy's op fusions and memory choices applied)
           + communication topology (per tensor group: In/Out virtual ops on
             each node and the fine-grained SEND/RECV ops between them, from the
             group's communication scheme, :mod:`dpro_kit.graph.schemes`)
           + the iteration rule (:data:`ITERATION_RULES`: which ops of iteration
             i+1 wait for which ops of iteration i).

:func:`build` is the only graph builder: the profiled job's DFG is
``build(job, identity(job))`` (:func:`build_global_dfg` from a TraceSet), and the
optimizer evaluates ``build(job, strategy)``.  The two halves are built
separately and joined only through the In/Out ops, so a new framework only
changes how local DFGs are read, and a new communication scheme only registers a
scheme.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Iterable

import networkx as nx

from ..errors import GraphError
from ..job import Job, Strategy, fused_name, group_name, identity, local_name
from ..trace import LAYER_KINDS, Collective, OpKind, TraceSet
from .model import add_op, op_key, validate
from .schemes import SCHEMES, TensorGroup, get_scheme
from .topology import CommContext, Links

if TYPE_CHECKING:  # pragma: no cover
    from ..costmodel import CommModel

__all__ = ["build", "build_global_dfg", "add_iteration_boundaries", "ITERATION_RULES", "register_iteration_rule",
           "fused_local", "fused_duration", "apply_memory", "group_collectives"]


def build(job: Job, strategy: Strategy | None = None, *, check: bool = True, links: Links | None = None,
          iteration_rule: str = "synchronous") -> nx.DiGraph:
    """The global DFG of ``job`` under ``strategy``.

    Parameters
    ----------
    job : Job
        Local DFGs, tensors, comm model, measured transfer times (:mod:`dpro_kit.job`).
    strategy : Strategy or None
        Tensor groups / partitions / op fusions / memory choices; None: ``identity(job)``,
        the profiled configuration.
    check : bool, default True
        Refuse a cyclic result (op fusions can create one) with a GraphError.
    links : Links or None
        Which link device each transfer occupies; default one per ordered host pair.
    iteration_rule : str, default "synchronous"
        A rule of :data:`ITERATION_RULES` joining consecutive iterations.
    """
    if strategy is None:
        strategy = identity(job)
    g, alias = fused_local(job, strategy)
    apply_memory(job, g, strategy)
    ctx = CommContext(graph=g, manifest=job.manifest, model=job.model, links=links or Links(job.manifest),
                      measured=job.measured)
    for coll in group_collectives(job, strategy, alias):
        SCHEMES[coll.algorithm].build(ctx, coll)
    ITERATION_RULES[iteration_rule](g)
    g.graph["meta"] = dict(job.meta)
    if check and not nx.is_directed_acyclic_graph(g):
        raise GraphError("the strategy's op fusions create a dependency cycle")
    return g


def build_global_dfg(ts: TraceSet, *, comm_model: "CommModel | None" = None,
                     links: Links | None = None) -> nx.DiGraph:
    """The profiled job's global DFG: ``build(Job.from_trace(ts), identity)``, validated.

    * op durations are means over the profiled iterations of ``ts``;
    * coarse collective events (kind COMM) are replaced by the fine-grained
      topology of their tensor; their timing feeds the fitted comm model;
    * measured SEND/RECV/AGG events (from a communication-library patch) set
      the durations of the matching fine-grained ops through their
      transaction ids — the Middleman.

    Parameters
    ----------
    ts : TraceSet
        The trace (aligned, what-if applied: :class:`dpro_kit.session.Session` does both).
    comm_model : CommModel or None
        Link model; default: fitted to ``ts`` (:func:`dpro_kit.costmodel.fit_from_trace`).
    links : Links or None
        Which device each transfer uses (default: one link per sending node).

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.1 (global DFG construction) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    job = Job.from_trace(ts, comm_model=comm_model)
    g = build(job, identity(job), check=False, links=links)
    validate(g, where=ts.path)
    return g


# --------------------------------------------------------------------------- strategy: local DFGs

def fused_duration(job: Job, durs: Iterable[float], ops: Iterable[str] | None = None) -> float:
    """Time of a fused op made of ops with traced times ``durs``.

    Measured, when ``job.fusion_ratios`` holds the group ``ops`` (timed with
    torch.compile, :mod:`dpro_kit.optimize.compile_timing`): the sum of the parts
    times the measured compiled / eager ratio.  Otherwise MODEL (not profiled): the
    sum of its ops minus one launch overhead per op saved.  The per-op launch
    overhead is estimated from the trace as the 10th percentile of computation-op
    durations (short ops are mostly launch cost), capped at half the shortest fused
    op, and never below the longest part.
    """
    ds = [float(x) for x in durs]
    if ops is not None:
        ratio = job.fusion_ratios.get(tuple(ops))
        if ratio is not None:
            return ratio * sum(ds)
    if len(ds) < 2:
        return sum(ds)
    saved = (len(ds) - 1) * min(job.launch_overhead_us, 0.5 * min(ds))
    return max(max(ds), sum(ds) - saved)


def fused_local(job: Job, strategy: Strategy,
                nodes: list[str] | None = None) -> tuple[nx.DiGraph, dict[str, str]]:
    """The local DFGs (of ``nodes``, default all) with op fusions applied; and op key -> key now standing for it."""
    if nodes is None:
        g = job.local.copy()
    else:
        keep = set(nodes)
        g = job.local.subgraph([k for k, d in job.local.nodes(data=True) if d["node"] in keep]).copy()
    alias: dict[str, str] = {}
    if not strategy.fusions:
        return g, alias
    for node in (nodes if nodes is not None else job.nodes):
        for grp in strategy.fusions:
            keys = [op_key(node, o) for o in grp]
            if not all(k in g for k in keys):
                continue
            fk = op_key(node, fused_name(grp))
            ds = [g.nodes[k] for k in keys]
            preds = {p for k in keys for p in g.predecessors(k)} - set(keys)
            succs = {s for k in keys for s in g.successors(k)} - set(keys)
            kinds = [d["kind"] for d in ds]
            add_op(g, fk, node=node, device=ds[0]["device"],
                   kind=OpKind.BW.value if OpKind.BW.value in kinds else kinds[0],
                   dur=fused_duration(job, [d["dur"] for d in ds], grp), name=fused_name(d["name"] for d in ds),
                   tensor=",".join(d["tensor"] for d in ds if d["tensor"]),
                   source="torch.compile:fused" if tuple(grp) in job.fusion_ratios else "model:fused",
                   priority=min(d["priority"] for d in ds))
            g.remove_nodes_from(keys)
            g.add_edges_from((p, fk) for p in preds)
            g.add_edges_from((fk, s) for s in succs)
            for k in keys:
                alias[k] = fk
    return g, alias


def apply_memory(job: Job, g: nx.DiGraph, strategy: Strategy) -> None:
    """Time effect of memory choices (ESTIMATED, see :mod:`dpro_kit.optimize.memory`)."""
    m = strategy.mem()
    if m.get("recompute"):
        # re-run the forward pass once more during backward: each node's backward gets the forward time
        for node in job.nodes:
            fw = sum(d["dur"] for _, d in g.nodes(data=True) if d["node"] == node and d["kind"] == OpKind.FW.value)
            bws = [k for k, d in g.nodes(data=True) if d["node"] == node and d["kind"] == OpKind.BW.value]
            if bws and fw:
                total = sum(g.nodes[k]["dur"] for k in bws) or 1.0
                for k in bws:  # spread in proportion (recompute of a segment precedes its backward)
                    g.nodes[k]["dur"] += fw * g.nodes[k]["dur"] / total
    accum = int(m.get("accum_steps", 1))
    if accum > 1:
        # m micro-batches of 1/m the batch: compute time = m x (dur/m + launch overhead), sync once
        for _, d in g.nodes(data=True):
            if d["kind"] in LAYER_KINDS:
                d["dur"] = d["dur"] + (accum - 1) * min(job.launch_overhead_us, d["dur"])


# --------------------------------------------------------------------------- strategy: collectives

def group_collectives(job: Job, strategy: Strategy, alias: dict[str, str]) -> list[Collective]:
    """The collectives of every tensor group of ``strategy``, from the group's scheme (first tensor's)."""
    out = []
    for grp in strategy.groups:
        ts = [job.tensors[t] for t in grp]
        name = group_name(grp)
        t0 = ts[0]

        def per_node(attr: str) -> dict[str, list[str]]:
            res: dict[str, list[str]] = {}
            for t in ts:
                for n, ops in getattr(t, attr).items():
                    for o in ops:
                        a = local_name(alias.get(op_key(n, o), op_key(n, o)), n)
                        if a not in res.setdefault(n, []):
                            res[n].append(a)
            return res
        scheme = get_scheme(t0.algorithm, tensor=name)
        servers: list[str] = []
        if scheme.uses_servers:
            servers = [s for t in ts for s in t.servers] or sorted(n for n, i in job.manifest.nodes.items()
                                                                   if i.role == "server")
        out += scheme.collectives(scheme, TensorGroup(
            name=name, bytes=sum(t.bytes for t in ts), k=strategy.parts(name), participants=list(t0.participants),
            servers=servers, inputs=per_node("inputs"), outputs=per_node("outputs"),
            params=[p for t in ts for p in t.params], priority=min(t.priority for t in ts),
            partitions=list(t0.partitions) if len(ts) == 1 else []))
    return out


# --------------------------------------------------------------------------- iteration rules

_NOT_FIRST = {OpKind.VIRTUAL.value, OpKind.SEND.value, OpKind.RECV.value}


def add_iteration_boundaries(g: nx.DiGraph) -> None:
    """Synchronous iterations: per node, a zero-time STEP_END op after its last ops precedes its next first ops.

    This is the default rule for replaying several iterations: a node starts
    iteration i+1 only after it finished iteration i (including the Out op of
    every tensor, i.e. its parameters are up to date).  "Last" ops have no
    successor on the same node; "first" ops have no predecessor on the node and
    are not communication or virtual ops.  Linear in the graph size.

    Parameters
    ----------
    g : networkx.DiGraph
        A one-iteration global DFG; ops and ``g.graph["iteration_edges"]`` are added in place.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.3 (replayer: iterations replayed back to back) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
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


ITERATION_RULES: dict[str, Callable[[nx.DiGraph], None]] = {"synchronous": add_iteration_boundaries}
"""How iteration i+1 depends on iteration i, by name: a function that adds the graph's
``iteration_edges`` (and any ops they need).  Delayed updates (DeFT) or asynchronous PS
register another rule here."""


def register_iteration_rule(name: str, rule: Callable[[nx.DiGraph], None]) -> None:
    """Add (or replace) an iteration rule of :data:`ITERATION_RULES`."""
    ITERATION_RULES[name] = rule
