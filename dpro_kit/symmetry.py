"""Replay by symmetry: ranks that are identical are replayed once, through a representative.

A 1,024-rank data-parallel job often has only a few *kinds* of rank (same model, same
collectives).  When ranks are exactly identical, replaying one of each kind and copying its
schedule to the others gives exactly the full replay at the cost of ``k`` ranks.

**Identical** (an equivalence, decided on the :class:`~dpro_kit.trace.TraceSet`, before any
graph is built): two nodes are in one class when

* their event tables are equal row for row (same order) in every column the graph builder
  reads except the node's own name and host: stream, op, name, kind, iteration, dur,
  tensor, bytes, txn, phase, step, chunk, peer — durations compared **exactly** (float
  equality, no tolerance);
* their dependency lists (``ts.edges[node]``) are equal, in order;
* their comm roles are equal: for every collective, in order, whether the node takes part
  and, if so, its ``inputs``/``outputs`` ops.

``start`` times are not compared: the builder uses durations (means over iterations) only,
and clocks differ between hosts.  Ranks with near-identical durations (a real job's ranks
jitter by a few per cent) are *not* grouped: the result would no longer be exact.  No
tolerance is offered for that reason; the report says how many classes there are.

**When it is exact.**  The representatives' graph is built from the trace restricted to
them (``build_global_dfg`` with the comm model fitted on the *whole* trace).  Their replayed
schedule equals the full one when nodes interact only through shared, device-less ops
(``nccl`` barriers: the ``SYNC`` op of a collective) and every device is used by one node
only: then by induction over time every member of a class sees the same ready times as its
representative, a barrier's ready time (the max over its participants) is the max over the
representatives, and each private device's queue holds the same ops in the same order.
This is checked on the representatives' graph; when it does not hold (e.g. dpro's ring
topology, where the ranks of a host share a link device) the full graph is replayed and the
report says why.  ``tests/test_symmetry.py`` checks expansion == full replay exactly.

References
----------
.. [1] Hu et al., "dPRO", MLSys 2022, §4.3 (replay) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from .trace import TraceSet

__all__ = ["RankClasses", "SymmetricReplay", "rank_classes", "subset_nodes", "replay_by_symmetry"]

#: the event columns a node's class depends on (all of EVENT_COLUMNS but node, host and start)
CLASS_COLUMNS = ("stream", "op", "name", "kind", "iteration", "dur", "tensor", "bytes", "txn", "phase", "step",
                 "chunk", "peer")


@dataclass
class RankClasses:
    """Nodes grouped into classes of identical nodes (representative first in each class)."""

    classes: list[list[str]]

    @property
    def k(self) -> int:
        return len(self.classes)

    @property
    def representatives(self) -> list[str]:
        return [c[0] for c in self.classes]

    def representative_of(self) -> dict[str, str]:
        """node -> its class's representative."""
        return {n: c[0] for c in self.classes for n in c}


def rank_classes(ts: TraceSet) -> RankClasses:
    """Group the nodes of ``ts`` into classes of identical nodes (module docstring: "Identical").

    Parameters
    ----------
    ts : TraceSet
        A loaded trace.

    Returns
    -------
    RankClasses
        Classes in the order of their first node (manifest order: workers by rank, then
        servers); each class's first node is its representative.
    """
    nodes = ts.nodes()
    ev = ts.events
    # every node's rows (the loader concatenates nodes, but do not rely on it), in table order
    codes, uniq = pd.factorize(ev["node"].astype(object))
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    rows = {str(u): order[bounds[i]:bounds[i + 1]] for i, u in enumerate(uniq)}
    none = np.zeros(0, dtype=np.int64)
    # a cheap key (a hash of every value) finds candidates; membership is then decided by exact equality
    h = pd.util.hash_pandas_object(ev[list(CLASS_COLUMNS)], index=False).to_numpy()
    cols = [ev[c].to_numpy() for c in CLASS_COLUMNS]
    floats = [c.dtype.kind == "f" for c in cols]
    parts = [set(c.participants) for c in ts.collectives]

    def roles(node: str) -> tuple:
        return tuple((c.tensor, c.algorithm, node in p, tuple(c.inputs.get(node, ())), tuple(c.outputs.get(node, ())))
                     for c, p in zip(ts.collectives, parts))

    def same_rows(a: np.ndarray, b: np.ndarray) -> bool:
        try:
            return len(a) == len(b) and all(
                np.array_equal(c[a], c[b], equal_nan=True) if f else bool((c[a] == c[b]).all())
                for c, f in zip(cols, floats))
        except (TypeError, ValueError):   # a missing value (pd.NA) compared: not provably equal
            return False

    classes: list[list[str]] = []
    by_key: dict[tuple, list[list[str]]] = {}
    for node in nodes:
        r = rows.get(node, none)
        key = (len(r), hashlib.sha256(h[r].tobytes()).digest(), tuple(ts.edges.get(node, ())), roles(node))
        for cls in by_key.setdefault(key, []):
            if same_rows(rows.get(cls[0], none), r):
                cls.append(node)
                break
        else:
            cls = [node]
            by_key[key].append(cls)
            classes.append(cls)
    return RankClasses(classes=classes)


def subset_nodes(ts: TraceSet, nodes: list[str]) -> TraceSet:
    """``ts`` restricted to ``nodes`` (events, edges, memory, collectives' participants/inputs/outputs).

    The manifest keeps its world size; collectives no kept node takes part in are dropped.

    Parameters
    ----------
    ts : TraceSet
        A trace.
    nodes : list of str
        Nodes to keep.
    """
    keep = set(nodes)
    man = replace(ts.manifest, nodes={n: i for n, i in ts.manifest.nodes.items() if n in keep})
    ev = ts.events[ts.events["node"].isin(list(keep))].reset_index(drop=True)
    mem = ts.memory[ts.memory["node"].isin(list(keep))].reset_index(drop=True) if len(ts.memory) else ts.memory
    colls = []
    for c in ts.collectives:
        parts = [p for p in c.participants if p in keep]
        if not parts:
            continue
        colls.append(replace(c, participants=parts, inputs={n: v for n, v in c.inputs.items() if n in keep},
                             outputs={n: v for n, v in c.outputs.items() if n in keep},
                             param_ready={n: v for n, v in c.param_ready.items() if n in keep}))
    return replace(ts, manifest=man, events=ev, edges={n: e for n, e in ts.edges.items() if n in keep},
                   collectives=colls, memory=mem)


def _not_exact_reason(g: Any) -> str | None:
    """Why replaying representatives would not be exact for this graph (None: it is)."""
    owner: dict[str, str] = {}
    for k, d in g.nodes(data=True):
        node, dev = d.get("node", ""), d.get("device", "")
        if not node:
            if dev:
                return f"op {k!r}, shared by nodes, runs on device {dev!r}"
            continue
        if not str(k).startswith(f"{node}|"):
            return f"op {k!r} of node {node!r} is not named after its node"
        if dev:
            o = owner.setdefault(dev, node)
            if o != node:
                return f"device {dev!r} is used by nodes {o!r} and {node!r}"
    return None


@dataclass
class SymmetricReplay:
    """A replay through class representatives, expandable to every node.

    ``result`` is the representatives' :class:`~dpro_kit.replay.ReplayResult` (or the full
    replay's, when ``exact_reason`` says symmetry was not used).
    """

    classes: RankClasses
    result: Any
    used: bool
    reason: str = ""
    ops_replayed: int = 0
    _rep_of: dict[str, str] = field(default_factory=dict)
    _index: dict[str, int] | None = None

    @property
    def iteration_time_us(self) -> float:
        return self.result.iteration_time_us

    def rep_key(self, key: str) -> str:
        """The representative's op key standing for op ``key`` of the full graph."""
        node, sep, op = key.partition("|")
        if not sep or not node:
            return key                      # a shared op: same key in both graphs
        return f"{self._rep_of.get(node, node)}|{op}"

    def times(self, keys: list[str], iteration: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (us) of the full graph's ops ``keys`` in replayed iteration ``iteration``."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.result.graph.keys)}
        n = self.result.graph.n
        rows = np.fromiter((self._index[self.rep_key(k)] + iteration * n for k in keys), dtype=np.int64,
                           count=len(keys))
        return self.result.start[rows], self.result.end[rows]

    def report(self) -> str:
        """One line: classes, what was replayed, or why the full graph was."""
        sizes = sorted((len(c) for c in self.classes.classes), reverse=True)
        n = sum(sizes)
        shown = ", ".join(str(s) for s in sizes[:8]) + (", ..." if len(sizes) > 8 else "")
        if self.used:
            return (f"symmetry: {n} nodes in {self.classes.k} classes of identical nodes (sizes {shown}); replayed "
                    f"{self.classes.k} representatives ({self.ops_replayed:,} ops) and expanded, exact")
        return f"symmetry not used ({self.reason}): replayed all {n} nodes ({self.ops_replayed:,} ops)"


def replay_by_symmetry(ts: TraceSet, *, iterations: int = 1, comm_model: Any = None,
                       classes: RankClasses | None = None) -> SymmetricReplay:
    """Replay ``ts`` through one representative per class of identical nodes, else in full.

    Parameters
    ----------
    ts : TraceSet
        A loaded trace (aligned / what-if applied as for :func:`dpro_kit.graph.build.build_global_dfg`).
    iterations : int, default 1
        Iterations to replay.
    comm_model : CommModel or None
        Link model; default: fitted to the whole of ``ts`` (not to the representatives).
    classes : RankClasses or None
        :func:`rank_classes` of ``ts`` when already computed.

    Returns
    -------
    SymmetricReplay
        ``used`` is False, with ``reason``, when every node is its own class or the
        representatives' graph has a shared device (module docstring); the full graph
        was then replayed.
    """
    from .costmodel import fit_from_trace
    from .graph.build import build_global_dfg
    from .replay import compile_graph, replay

    classes = classes if classes is not None else rank_classes(ts)
    model = comm_model if comm_model is not None else fit_from_trace(ts)
    reason = ""
    if classes.k == len(ts.nodes()):
        reason = f"no two of the {classes.k} nodes are identical"
    else:
        g = build_global_dfg(subset_nodes(ts, classes.representatives), comm_model=model)
        why = _not_exact_reason(g)
        if why is None:
            res = replay(compile_graph(g), iterations=iterations)
            return SymmetricReplay(classes=classes, result=res, used=True, ops_replayed=g.number_of_nodes(),
                                   _rep_of=classes.representative_of())
        reason = f"not exact for this graph: {why}"
    g = build_global_dfg(ts, comm_model=model)
    res = replay(compile_graph(g), iterations=iterations)
    return SymmetricReplay(classes=classes, result=res, used=False, reason=reason, ops_replayed=g.number_of_nodes())
