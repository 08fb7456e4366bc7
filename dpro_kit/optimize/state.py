"""Strategy state and DFG rebuild: the optimizer's core data model.

Design (see docs/optimizer.md, "Design"): passes never edit a DFG in place.
The optimizer keeps

* a :class:`BaseJob` — extracted ONCE from a global DFG: the local
  (computation) DFG of every node, one :class:`BaseTensor` per synchronised
  tensor (inputs/outputs per node, bytes, algorithm, parameter names), the comm
  model and the host map;
* an immutable, JSON-serialisable :class:`Strategy` — tensor groups (which base
  tensors are fused into one collective, in order), the partition number of
  each group, op-fusion groups (local op names, applied on every node that has
  them — symmetry), and memory choices.

``build(base, strategy)`` rebuilds the global DFG with the REAL topology
builders (:mod:`dpro_kit.graph.topology`).  Undo is therefore trivial (keep
the previous ``Strategy``), evaluation is "build + replay", a checkpoint is
the strategy's JSON, and cycle safety is checked by :func:`fusion_creates_cycle`
on the small *condensed graph* (local ops + one vertex per tensor group, which
has exactly the reachability of the full DFG) before a fusion is accepted, and
again by ``build`` (which refuses a cyclic result).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import networkx as nx
import numpy as np

from ..costmodel import CommModel, LinkModel
from ..errors import GraphError
from ..graph.build import add_iteration_boundaries
from ..graph.model import add_op, op_key
from ..graph.topology import TOPOLOGIES, CommContext, Links, split_bytes
from ..trace import Collective, Manifest, NodeInfo, OpKind

COMM_OP_KINDS = {OpKind.SEND.value, OpKind.RECV.value, OpKind.AGG.value}
COMPUTE_KINDS = {OpKind.FW.value, OpKind.BW.value}
FUSED_PREFIX = "FUSED["


def local_name(key: str, node: str) -> str:
    """The op id of ``key`` on ``node`` (inverse of :func:`op_key`; keys are built only by ``op_key``)."""
    prefix = op_key(node, "")
    return key[len(prefix):] if key.startswith(prefix) else key


@dataclass
class BaseTensor:
    """One synchronised tensor of the profiled (or what-if) job, before any regrouping."""

    name: str
    bytes: int
    algorithm: str                      # ring | ps
    participants: list[str]
    inputs: dict[str, list[str]]        # node -> local op ids
    outputs: dict[str, list[str]]
    params: list[str] = field(default_factory=list)
    priority: float = 0.0
    servers: list[str] = field(default_factory=list)  # PS: servers of its partitions (round-robin)


@dataclass
class BaseJob:
    local: nx.DiGraph                   # computation ops only (no In/Out/SEND/RECV/AGG/STEP_END)
    tensors: dict[str, BaseTensor]      # in the original order (reduction order)
    initial_groups: list[list[str]]     # grouping of the source graph (= tensors one by one here)
    model: CommModel
    manifest: Manifest
    meta: dict[str, Any]
    launch_overhead_us: float = 0.0     # fused-op cost model (see fused_duration)
    # fusion group (local op ids) -> measured compiled/eager ratio (optimize.compile_timing)
    fusion_ratios: dict[tuple[str, ...], float] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # local op id -> topological index (first node)

    @property
    def nodes(self) -> list[str]:
        return sorted({d["node"] for _, d in self.local.nodes(data=True) if d["node"]})


@dataclass(frozen=True)
class Strategy:
    """What the optimizer decided; immutable (``with_*`` return new states)."""

    groups: tuple[tuple[str, ...], ...]                 # tensor groups, each a tuple of base tensor names
    partitions: tuple[tuple[str, int], ...] = ()        # (group name, k) for k > 1
    fusions: tuple[tuple[str, ...], ...] = ()           # op-fusion groups of local op ids (all nodes)
    memory: tuple[tuple[str, Any], ...] = ()            # ("recompute", True), ("accum_steps", 2)

    # ---- views
    def parts(self, group: str) -> int:
        return dict(self.partitions).get(group, 1)

    def mem(self) -> dict[str, Any]:
        return dict(self.memory)

    def group_of(self, tensor: str) -> int:
        for i, g in enumerate(self.groups):
            if tensor in g:
                return i
        raise KeyError(tensor)

    # ---- updates (return new states)
    def with_partitions(self, group: str, k: int) -> "Strategy":
        p = {g: v for g, v in self.partitions if g != group}
        if k > 1:
            p[group] = int(k)
        return replace(self, partitions=tuple(sorted(p.items())))

    def with_fused_groups(self, i: int, j: int) -> "Strategy":
        """Fuse tensor groups ``i`` and ``j`` (any order); the fused group takes the later position."""
        if i == j:
            return self
        i, j = sorted((i, j))
        gs = list(self.groups)
        names = (group_name(gs[i]), group_name(gs[j]))
        merged = tuple(gs[i]) + tuple(gs[j])
        gs[j] = merged
        del gs[i]
        parts = tuple((g, k) for g, k in self.partitions if g not in names)
        return replace(self, groups=tuple(gs), partitions=parts)

    def with_op_fusion(self, a: Iterable[str], b: Iterable[str]) -> "Strategy":
        """Fuse the op groups containing ops ``a`` and ``b`` (local op ids)."""
        a, b = tuple(a), tuple(b)
        want = set(a) | set(b)
        rest = [f for f in self.fusions if not set(f) & want]
        merged = list(a) + list(b)
        for f in self.fusions:
            if set(f) & want:
                merged += list(f)
        return replace(self, fusions=tuple(rest) + (tuple(dict.fromkeys(merged)),))

    def with_memory(self, **kw: Any) -> "Strategy":
        m = self.mem()
        m.update(kw)
        return replace(self, memory=tuple(sorted(m.items())))

    def to_json(self) -> dict[str, Any]:
        return {"groups": [list(g) for g in self.groups], "partitions": dict(self.partitions),
                "fusions": [list(f) for f in self.fusions], "memory": dict(self.memory)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Strategy":
        return cls(groups=tuple(tuple(g) for g in d["groups"]),
                   partitions=tuple(sorted((str(k), int(v)) for k, v in d.get("partitions", {}).items())),
                   fusions=tuple(tuple(f) for f in d.get("fusions", [])),
                   memory=tuple(sorted(d.get("memory", {}).items())))


def group_name(group: Iterable[str]) -> str:
    g = list(group)
    return g[0] if len(g) == 1 else "+".join(g)


def fused_name(ops: Iterable[str]) -> str:
    return FUSED_PREFIX + "+".join(ops) + "]"


# --------------------------------------------------------------------------- extraction

def _comm_model_from_meta(meta: dict[str, Any]) -> CommModel:
    cm = meta.get("comm_model") or {}
    if not cm:
        return CommModel()
    default = LinkModel(latency_us=float(cm["latency_us"]), bandwidth_Bps=float(cm["bandwidth_Mbps"]) * 1e6 / 8)
    per = {k: LinkModel(**v) for k, v in cm.get("per_link", {}).items()}
    return CommModel(default=default, per_link=per, origin=str(cm.get("origin", "default")))


def extract_base(g: nx.DiGraph, *, params: dict[str, list[str]] | None = None,
                 comm_model: CommModel | None = None) -> BaseJob:
    """Split a built global DFG into its local DFGs and its synchronised tensors."""
    nodes = g.nodes
    is_comm = {k for k, d in g.nodes(data=True)
               if d["kind"] in COMM_OP_KINDS or (d["kind"] == OpKind.VIRTUAL.value and d["tensor"])}
    is_end = {k for k, d in g.nodes(data=True) if d["kind"] == OpKind.VIRTUAL.value and not d["tensor"]}
    local = g.subgraph([k for k in g if k not in is_comm and k not in is_end]).copy()
    tensors: dict[str, BaseTensor] = {}
    order: list[tuple[float, str]] = []
    ins: dict[str, dict[str, str]] = {}
    outs: dict[str, dict[str, str]] = {}
    for k in is_comm:
        d = nodes[k]
        if d["kind"] != OpKind.VIRTUAL.value:
            continue
        (ins if d["name"].startswith("In ") else outs).setdefault(d["tensor"], {})[d["node"]] = k
    topo = {k: i for i, k in enumerate(nx.topological_sort(g))}
    for t, per_node in ins.items():
        first = next(iter(per_node.values()))
        agg = [k for k in g.successors(first)]
        is_ps = any(nodes[s]["phase"] == "push" for s in agg)
        parts = sorted({(nodes[k]["chunk"], nodes[k]["node"]) for k in is_comm
                        if nodes[k]["kind"] == OpKind.AGG.value and nodes[k]["tensor"] == t}) if is_ps else []
        participants = _ring_order(g, per_node) if not is_ps else sorted(per_node)
        tensors[t] = BaseTensor(
            name=t, bytes=int(nodes[first]["bytes"]), algorithm="ps" if is_ps else "ring",
            participants=participants,
            inputs={n: [local_name(p, n) for p in g.predecessors(k) if p in local] for n, k in per_node.items()},
            outputs={n: [local_name(s, n) for s in g.successors(outs[t][n]) if s in local]
                     for n in per_node if n in outs.get(t, {})},
            params=list((params or {}).get(t, [])), priority=float(nodes[first]["priority"]),
            servers=[s for _, s in parts])
        order.append((min(topo[k] for k in per_node.values()), t))
    order.sort()
    tensors = {t: tensors[t] for _, t in order}
    meta = dict(g.graph.get("meta", {}))
    hosts = meta.get("hosts") or {n: n for n in {d["node"] for _, d in g.nodes(data=True) if d["node"]}}
    servers = {s for t in tensors.values() for s in t.servers}
    manifest = Manifest(job=str(meta.get("job", "")), framework=str(meta.get("framework", "")),
                        comm_backend=str(meta.get("comm_backend", "")), world_size=int(meta.get("world_size", 1)),
                        nodes={n: NodeInfo(host=h, role="server" if n in servers else "worker", rank=i)
                               for i, (n, h) in enumerate(sorted(hosts.items()))}, iterations=[0])
    durs = np.array([d["dur"] for _, d in local.nodes(data=True) if d["kind"] in COMPUTE_KINDS and d["dur"] > 0])
    overhead = float(np.percentile(durs, 10)) if durs.size else 0.0
    ref = min((d["node"] for _, d in local.nodes(data=True) if d["node"]), default="")
    op_order = {local_name(k, ref): i for i, k in enumerate(nx.topological_sort(local))
                if local.nodes[k]["node"] == ref}
    return BaseJob(local=local, tensors=tensors, initial_groups=[[t] for t in tensors],
                   model=comm_model or _comm_model_from_meta(meta), manifest=manifest, meta=meta,
                   launch_overhead_us=overhead, order=op_order)


def _ring_order(g: nx.DiGraph, in_ops: dict[str, str]) -> list[str]:
    """Participants in ring order (following the step-0 SEND of each In op)."""
    nxt = {}
    for n, k in in_ops.items():
        for s in g.successors(k):
            d = g.nodes[s]
            if d["kind"] == OpKind.SEND.value and d["step"] == 0:
                nxt[n] = d["peer"]
    if len(nxt) != len(in_ops):
        return sorted(in_ops)
    start = sorted(in_ops)[0]
    order, cur = [start], nxt[start]
    while cur != start and len(order) <= len(in_ops):
        order.append(cur)
        cur = nxt[cur]
    return order if len(order) == len(in_ops) else sorted(in_ops)


def initial_strategy(base: BaseJob, groups: list[list[str]] | None = None) -> Strategy:
    return Strategy(groups=tuple(tuple(g) for g in (groups or base.initial_groups)))


# --------------------------------------------------------------------------- cost models

def fused_duration(base: BaseJob, durs: Iterable[float], ops: Iterable[str] | None = None) -> float:
    """Time of a fused op made of ops with traced times ``durs``.

    Measured, when ``base.fusion_ratios`` holds the group ``ops`` (timed with
    torch.compile, :mod:`.compile_timing`): the sum of the parts times the measured
    compiled / eager ratio.  Otherwise MODEL (not profiled): the sum of its ops minus
    one launch overhead per op saved.  The per-op launch overhead is estimated from
    the trace as the 10th percentile of computation-op durations (short ops are
    mostly launch cost), capped at half the shortest fused op, and never below the
    longest part.
    """
    ds = [float(x) for x in durs]
    if ops is not None:
        ratio = base.fusion_ratios.get(tuple(ops))
        if ratio is not None:
            return ratio * sum(ds)
    if len(ds) < 2:
        return sum(ds)
    saved = (len(ds) - 1) * min(base.launch_overhead_us, 0.5 * min(ds))
    return max(max(ds), sum(ds) - saved)


# --------------------------------------------------------------------------- rebuild

def fused_local(base: BaseJob, strategy: Strategy,
                nodes: list[str] | None = None) -> tuple[nx.DiGraph, dict[str, str]]:
    """The local DFGs (of ``nodes``, default all) with op fusions applied; and op key -> key now standing for it."""
    if nodes is None:
        g = base.local.copy()
    else:
        keep = set(nodes)
        g = base.local.subgraph([k for k, d in base.local.nodes(data=True) if d["node"] in keep]).copy()
    alias: dict[str, str] = {}
    for node in (nodes if nodes is not None else base.nodes):
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
                   dur=fused_duration(base, [d["dur"] for d in ds], grp), name=fused_name(d["name"] for d in ds),
                   tensor=",".join(d["tensor"] for d in ds if d["tensor"]),
                   source="torch.compile:fused" if tuple(grp) in base.fusion_ratios else "model:fused",
                   priority=min(d["priority"] for d in ds))
            g.remove_nodes_from(keys)
            g.add_edges_from((p, fk) for p in preds)
            g.add_edges_from((fk, s) for s in succs)
            for k in keys:
                alias[k] = fk
    return g, alias


def group_collectives(base: BaseJob, strategy: Strategy, alias: dict[str, str]) -> list[Collective]:
    out = []
    for grp in strategy.groups:
        ts = [base.tensors[t] for t in grp]
        name = group_name(grp)
        k = strategy.parts(name)
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
        inputs, outputs = per_node("inputs"), per_node("outputs")
        nbytes = sum(t.bytes for t in ts)
        params = [p for t in ts for p in t.params]
        prio = min(t.priority for t in ts)
        if t0.algorithm == "ps":
            servers = [s for t in ts for s in t.servers] or sorted(n for n, i in base.manifest.nodes.items()
                                                                   if i.role == "server")
            parts = [{"bytes": b, "server": servers[i % len(servers)]} for i, b in enumerate(split_bytes(nbytes, k))]
            out.append(Collective(tensor=name, op="push_pull", bytes=nbytes, participants=list(t0.participants),
                                  algorithm="ps", inputs=inputs, outputs=outputs, params=params, partitions=parts,
                                  priority=prio))
        else:
            for p, b in enumerate(split_bytes(nbytes, k)):
                out.append(Collective(tensor=name if k == 1 else f"{name}#p{p}", op="allreduce", bytes=b,
                                      participants=list(t0.participants), algorithm=t0.algorithm, inputs=inputs,
                                      outputs=outputs, params=params, priority=prio))
    return out


def apply_memory(base: BaseJob, g: nx.DiGraph, strategy: Strategy) -> None:
    """Time effect of memory choices (ESTIMATED, see :mod:`.memory`)."""
    m = strategy.mem()
    if m.get("recompute"):
        # re-run the forward pass once more during backward: each node's backward gets the forward time
        for node in base.nodes:
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
            if d["kind"] in COMPUTE_KINDS:
                d["dur"] = d["dur"] + (accum - 1) * min(base.launch_overhead_us, d["dur"])


def build(base: BaseJob, strategy: Strategy, *, check: bool = True) -> nx.DiGraph:
    """The global DFG of ``base`` under ``strategy`` (raises GraphError on a cycle)."""
    g, alias = fused_local(base, strategy)
    apply_memory(base, g, strategy)
    ctx = CommContext(graph=g, manifest=base.manifest, model=base.model, links=Links(base.manifest))
    for coll in group_collectives(base, strategy, alias):
        TOPOLOGIES[coll.algorithm](ctx, coll)
    add_iteration_boundaries(g)
    g.graph["meta"] = dict(base.meta)
    if check and not nx.is_directed_acyclic_graph(g):
        raise GraphError("the strategy's op fusions create a dependency cycle")
    return g


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
