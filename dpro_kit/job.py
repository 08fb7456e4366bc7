"""The job model: what a trace says about a distributed training job, typed (dPRO §4.1).

``TraceSet → Job → build(job, strategy) → DFG``.  A :class:`Job` holds

* the **local DFGs** (computation ops of every node and their dependencies,
  durations: the mean over the TraceSet's iterations — one iteration for the
  per-iteration rule of :class:`~dpro_kit.session.Session`);
* one :class:`Tensor` per synchronised tensor (bucket), in the trace's order:
  its communication scheme (:mod:`dpro_kit.graph.schemes`), participants
  (ranks), servers, partitions, the local ops it waits for and feeds;
* the comm cost model, the manifest (ranks, servers, hosts), the measured
  per-transfer durations (the Middleman) and its facts (``Job.facts``: the typed
  ``manifest.extra`` of :class:`dpro_kit.schema.Facts`).

A :class:`Strategy` says how to synchronise and run it (tensor groups,
partitions, op fusions, memory choices); :func:`identity` is the profiled
configuration, and :func:`dpro_kit.graph.build.build` is the only graph
builder: ``build_global_dfg(ts)`` is ``build(Job.from_trace(ts), identity(job))``
and the optimizer evaluates ``build(job, strategy)`` for its candidates.

A job can also be recovered from a built DFG (a graph file written by ``dpro
graph``): :meth:`Job.from_graph` recognises each tensor's scheme from its ops.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable

import networkx as nx
import numpy as np
import pandas as pd

from .errors import GraphError
from .schema import Facts
from .trace import COMM_KINDS, LAYER_KINDS, TOPOLOGY_KINDS, Manifest, NodeInfo, OpKind

if TYPE_CHECKING:  # pragma: no cover
    from .costmodel import CommModel
    from .trace import TraceSet

__all__ = ["JobFacts", "Tensor", "Job", "Strategy", "identity", "group_name", "fused_name", "local_name",
           "FUSED_PREFIX"]

FUSED_PREFIX = "FUSED["


# --------------------------------------------------------------------------- facts

#: The typed ``manifest.extra`` facts (one definition: :class:`dpro_kit.schema.Facts`, also
#: ``Manifest.facts``); ``Job.facts`` holds them for the job.
JobFacts = Facts


# --------------------------------------------------------------------------- tensors and strategy

@dataclass
class Tensor:
    """One synchronised tensor (or traced bucket) of the job, before any regrouping."""

    name: str
    bytes: int
    algorithm: str                      # a scheme of dpro_kit.graph.schemes.SCHEMES
    participants: list[str]             # in the scheme's order (ring order)
    inputs: dict[str, list[str]]        # node -> local op ids
    outputs: dict[str, list[str]]
    params: list[str] = field(default_factory=list)
    priority: float = 0.0
    servers: list[str] = field(default_factory=list)      # PS: servers of its partitions
    partitions: list[dict[str, Any]] = field(default_factory=list)  # PS: as traced ({"bytes", "server"})


def local_name(key: str, node: str) -> str:
    """The op id of ``key`` on ``node`` (inverse of :func:`~dpro_kit.graph.model.op_key`)."""
    from .graph.model import op_key
    prefix = op_key(node, "")
    return key[len(prefix):] if key.startswith(prefix) else key


def group_name(group: Iterable[str]) -> str:
    """The tensor name of a group of base tensors (``a+b`` when fused)."""
    g = list(group)
    return g[0] if len(g) == 1 else "+".join(g)


def fused_name(ops: Iterable[str]) -> str:
    return FUSED_PREFIX + "+".join(ops) + "]"


@dataclass(frozen=True)
class Strategy:
    """How the job is synchronised and run; immutable (``with_*`` return new states).

    ``groups``: tensor groups, each a tuple of base tensor names (fused into one
    collective, in order); ``partitions``: ``(group name, k)`` for ``k > 1``;
    ``fusions``: op-fusion groups of local op ids (applied on every node that has
    them); ``memory``: ``("recompute", True)``, ``("accum_steps", 2)``.
    """

    groups: tuple[tuple[str, ...], ...]
    partitions: tuple[tuple[str, int], ...] = ()
    fusions: tuple[tuple[str, ...], ...] = ()
    memory: tuple[tuple[str, Any], ...] = ()

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


# --------------------------------------------------------------------------- the job

@dataclass
class Job:
    """A distributed training job as the graph builder and the optimizer see it (module docstring)."""

    local: nx.DiGraph                   # computation ops only (no In/Out/SEND/RECV/AGG/STEP_END)
    tensors: dict[str, Tensor]          # in the trace's order
    model: "CommModel"
    manifest: Manifest
    meta: dict[str, Any]
    initial_groups: list[list[str]] = field(default_factory=list)   # the traced grouping (one tensor each)
    measured: dict[str, float] = field(default_factory=dict)        # Middleman: "SEND <txn>" -> duration
    facts: JobFacts = field(default_factory=JobFacts)
    # fusion group (local op ids) -> measured compiled/eager ratio (optimize.compile_timing)
    fusion_ratios: dict[tuple[str, ...], float] = field(default_factory=dict)

    @cached_property
    def launch_overhead_us(self) -> float:
        """Per-op launch cost of the fused-op model (:func:`dpro_kit.graph.build.fused_duration`).

        The 10th percentile of the computation ops' positive durations (0 without any).
        """
        durs = np.array([d["dur"] for _, d in self.local.nodes(data=True)
                         if d["kind"] in LAYER_KINDS and d["dur"] > 0])
        return float(np.percentile(durs, 10)) if durs.size else 0.0

    @cached_property
    def order(self) -> dict[str, int]:
        """Local op id -> topological index on the first node (empty for a cyclic local DFG)."""
        local = self.local
        ref = min((d["node"] for _, d in local.nodes(data=True) if d["node"]), default="")
        try:
            return {local_name(k, ref): i for i, k in enumerate(nx.topological_sort(local))
                    if local.nodes[k]["node"] == ref}
        except nx.NetworkXUnfeasible:   # a cyclic trace: the builder's validation says where
            return {}

    @property
    def nodes(self) -> list[str]:
        return sorted({d["node"] for _, d in self.local.nodes(data=True) if d["node"]})

    @property
    def ranks(self) -> list[str]:
        """Worker nodes, by rank."""
        return self.manifest.workers()

    @property
    def servers(self) -> list[str]:
        """Parameter-server nodes, by rank."""
        return self.manifest.servers()

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_trace(cls, ts: "TraceSet", *, comm_model: "CommModel | None" = None,
                   params: dict[str, list[str]] | None = None) -> "Job":
        """The job a TraceSet records (op durations: the mean over its iterations).

        Parameters
        ----------
        ts : TraceSet
            Aligned or not, what-if applied or not; for the per-iteration rule, one iteration.
        comm_model : CommModel or None
            Link model; default: fitted to ``ts`` (:func:`dpro_kit.costmodel.fit_from_trace`).
        params : dict or None
            Tensor -> parameter names, overriding the collectives' ``params``.

        Raises
        ------
        GraphError
            A collective names an op its node never ran, or an unknown scheme.
        """
        from .costmodel import fit_from_trace
        from .graph.model import add_op, compute_device, op_key
        from .graph.schemes import get_scheme

        m = ts.manifest
        ev = ts.events
        model = comm_model or fit_from_trace(ts)
        g = nx.DiGraph()
        local = ev[~ev["kind"].isin(list(COMM_KINDS))]
        stats = _mean_by(local, ["node", "op"])
        for row in stats.itertuples(index=False):
            add_op(g, op_key(row.node, row.op), node=row.node, device=compute_device(row.node, row.stream),
                   kind=row.kind, dur=float(row.dur), name=row.name or row.op, tensor=row.tensor,
                   bytes=int(row.bytes), source="trace")
        dropped: dict[str, set[str]] = defaultdict(set)  # ops in dependency files but not in the graph
        for node, edges in ts.edges.items():
            for u, v in edges:
                ku, kv = op_key(node, u), op_key(node, v)
                for k in (ku, kv):
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

        tensors: dict[str, Tensor] = {}
        servers = m.servers()
        for coll in ts.collectives:
            for node in list(coll.inputs) + list(coll.outputs):
                for op in coll.inputs.get(node, []) + coll.outputs.get(node, []):
                    if op_key(node, op) not in g:
                        raise GraphError(f"collective {coll.tensor!r} names op {op!r}, which node {node!r} never ran",
                                         path=ts.path, record=f"{node}/comm.json",
                                         hint="the dependency and event files of that node disagree; re-collect")
            scheme = get_scheme(coll.algorithm, tensor=coll.tensor, path=ts.path)
            t_servers = scheme.servers_of(coll, servers) if scheme.servers_of is not None else []
            tensors[coll.tensor] = Tensor(
                name=coll.tensor, bytes=int(coll.bytes), algorithm=coll.algorithm,
                participants=list(coll.participants),
                inputs={n: list(dict.fromkeys(o)) for n, o in coll.inputs.items()},
                outputs={n: list(dict.fromkeys(o)) for n, o in coll.outputs.items()},
                params=list((params or {}).get(coll.tensor, coll.params)), priority=float(coll.priority),
                servers=t_servers, partitions=[dict(p) for p in coll.partitions])
        meta = {"job": m.job, "framework": m.framework, "comm_backend": m.comm_backend,
                "world_size": m.world_size, "comm_model": model.describe(),
                "hosts": {n: i.host for n, i in m.nodes.items()}}
        return cls._finish(g, tensors, model, m, meta, measured=_measured_comm(ev),
                           facts=JobFacts.from_manifest(m))

    @classmethod
    def from_graph(cls, g: nx.DiGraph, *, params: dict[str, list[str]] | None = None,
                   comm_model: "CommModel | None" = None) -> "Job":
        """Recover the job from a built global DFG (e.g. a graph file written by ``dpro graph``).

        Local DFGs: the computation ops; tensors: one per In-op set, ordered by their
        topological position, their scheme recognised from their ops
        (:func:`dpro_kit.graph.schemes.recognise`).  Op durations of the graph's SEND
        ops are not kept (the comm model gives them again).
        """
        from .graph.schemes import recognise
        nodes = g.nodes
        is_comm = {k for k, d in g.nodes(data=True)
                   if d["kind"] in TOPOLOGY_KINDS or (d["kind"] == OpKind.VIRTUAL.value and d["tensor"])}
        is_end = {k for k, d in g.nodes(data=True) if d["kind"] == OpKind.VIRTUAL.value and not d["tensor"]}
        keep = {k for k in g if k not in is_comm and k not in is_end}
        local = nx.DiGraph()            # in g's order (a subgraph view would follow set order)
        local.add_nodes_from((k, dict(d)) for k, d in g.nodes(data=True) if k in keep)
        local.add_edges_from((u, v, dict(d)) for u, v, d in g.edges(data=True) if u in keep and v in keep)
        tensors: dict[str, Tensor] = {}
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
            algorithm, participants, t_servers, t_parts = recognise(g, per_node)
            tensors[t] = Tensor(
                name=t, bytes=int(nodes[first]["bytes"]), algorithm=algorithm, participants=participants,
                inputs={n: [local_name(p, n) for p in g.predecessors(k) if p in local] for n, k in per_node.items()},
                outputs={n: [local_name(s, n) for s in g.successors(outs[t][n]) if s in local]
                         for n in per_node if n in outs.get(t, {})},
                params=list((params or {}).get(t, [])), priority=float(nodes[first]["priority"]),
                servers=t_servers, partitions=t_parts)
            order.append((min(topo[k] for k in per_node.values()), t))
        order.sort()
        tensors = {t: tensors[t] for _, t in order}
        meta = dict(g.graph.get("meta", {}))
        hosts = meta.get("hosts") or {n: n for n in {d["node"] for _, d in g.nodes(data=True) if d["node"]}}
        servers = {s for t in tensors.values() for s in t.servers}
        manifest = Manifest(job=str(meta.get("job", "")), framework=str(meta.get("framework", "")),
                            comm_backend=str(meta.get("comm_backend", "")),
                            world_size=int(meta.get("world_size", 1)),
                            nodes={n: NodeInfo(host=h, role="server" if n in servers else "worker", rank=i)
                                   for i, (n, h) in enumerate(sorted(hosts.items()))}, iterations=[0])
        return cls._finish(local, tensors, comm_model or _comm_model_from_meta(meta), manifest, meta)

    @classmethod
    def _finish(cls, local: nx.DiGraph, tensors: dict[str, Tensor], model: "CommModel", manifest: Manifest,
                meta: dict[str, Any], **kw: Any) -> "Job":
        return cls(local=local, tensors=tensors, model=model, manifest=manifest, meta=meta,
                   initial_groups=[[t] for t in tensors], **kw)


def identity(job: Job) -> Strategy:
    """The profiled configuration: each tensor its own group, PS partitions as traced.

    Parameters
    ----------
    job : Job
        A job (``Job.from_trace`` / ``Job.from_graph``).
    """
    parts = tuple(sorted((t.name, len(t.partitions)) for t in job.tensors.values() if len(t.partitions) > 1))
    return Strategy(groups=tuple((t,) for t in job.tensors), partitions=parts)


# --------------------------------------------------------------------------- helpers

def _comm_model_from_meta(meta: dict[str, Any]) -> "CommModel":
    from .costmodel import CommModel, LinkModel
    cm = meta.get("comm_model") or {}
    if not cm:
        return CommModel()
    default = LinkModel(latency_us=float(cm["latency_us"]), bandwidth_Bps=float(cm["bandwidth_Mbps"]) * 1e6 / 8)
    per = {k: LinkModel(**v) for k, v in cm.get("per_link", {}).items()}
    return CommModel(default=default, per_link=per, origin=str(cm.get("origin", "default")))


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
    fine = ev[ev["kind"].isin(list(TOPOLOGY_KINDS))]
    if fine.empty:
        return {}
    key = fine["kind"].astype(str) + " " + fine["txn"].where(fine["txn"] != "", fine["op"]).astype(str)
    out = fine.groupby(key)["dur"].mean().to_dict()
    for k in [k for k in out if k.startswith("RECV ")]:
        out["SEND " + k[5:]] = out[k]
        out[k] = 0.0
    return out
