"""Array-native compile: the replay arrays straight from a trace's tables, without networkx.

``compile_graph(build_global_dfg(ts))`` builds a networkx graph of every op of every rank and
then flattens it; at 1,024 ranks that graph costs ~30 µs and ~3 KB per op (``docs/scale.md``).
:func:`compile_trace` produces the **same** :class:`~dpro_kit.replay.CompiledGraph` (same keys,
arrays, devices, tie-breaks and iteration edges, so the same replay op for op) from the event
table, the dependency lists and the collectives, for the jobs it covers:

* every collective's scheme is a barrier (``nccl``: plain torch.profiler traces, docs/kineto.md),
* the profiled configuration (no fusions, no re-bucketing, no memory options), synchronous
  iterations (``STEP_END`` per node, :func:`dpro_kit.graph.build.add_iteration_boundaries`),
* every op a dependency list or a collective names was traced.

Anything else returns None and the caller builds the networkx graph (``compile_trace_or_graph``
does both).  It reproduces, in arrays, each step of ``Job.from_trace`` + ``build`` + the
``nccl`` scheme + the iteration rule + ``compile_graph``, including the order networkx would
keep (ops in insertion order, each op's successors in the order their first edge was added),
because the order sets the replay's last tie-break.  ``tests/test_graph_arrays.py`` checks
equality with the networkx path on generated jobs and on real HTA Kineto traces.

References
----------
.. [1] Hu et al., "dPRO", MLSys 2022, §4.1 (global DFG) and §4.3 (replayer)
       (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace import COMM_KINDS, OpKind, TraceSet

__all__ = ["compile_trace", "compile_trace_or_graph"]

_NOT_FIRST = {OpKind.VIRTUAL.value, OpKind.SEND.value, OpKind.RECV.value}


def compile_trace(ts: TraceSet) -> Any:
    """``compile_graph(build_global_dfg(ts))`` computed from the tables, or None when not covered.

    Parameters
    ----------
    ts : TraceSet
        A loaded trace whose collectives all use the ``nccl`` barrier scheme.

    Returns
    -------
    CompiledGraph or None
        None: a collective of another scheme, an op named by a dependency list or a
        collective but not traced, a bad duration or a cycle — build the networkx graph
        (which also words the error).
    """
    from ..job import _mean_by
    from ..replay.engine import compile_arrays

    if any(c.algorithm != "nccl" for c in ts.collectives):
        return None
    ev = ts.events
    local = ev[~ev["kind"].isin(list(COMM_KINDS))]
    stats = _mean_by(local, ["node", "op"])
    node_s = stats["node"].astype(object).to_numpy()
    op_s = stats["op"].astype(object).to_numpy()
    keys: list[str] = [f"{n}|{o}" for n, o in zip(node_s, op_s)]
    index: dict[str, int] = dict(zip(keys, range(len(keys))))
    if len(index) != len(keys):
        return None
    dur: list[float] = stats["dur"].astype(float).tolist()
    if not all(d >= 0 and np.isfinite(d) for d in dur):
        return None                     # the builder's validate() words it
    prio: list[float] = [0.0] * len(keys)
    owner: list[str] = list(node_s)
    kinds: list[str] = stats["kind"].astype(object).tolist()
    devs: list[str] = [f"{n}:{s}" for n, s in zip(node_s, stats["stream"].astype(object).to_numpy())]
    src: list[int] = []
    dst: list[int] = []

    def add(key: str, node: str, kind: str, p: float) -> int:
        i = len(keys)
        keys.append(key)
        index[key] = i
        dur.append(0.0)
        prio.append(p)
        owner.append(node)
        kinds.append(kind)
        devs.append("")
        return i

    # local dependencies, in the order Job.from_trace adds them
    for node, edges in ts.edges.items():
        for u, v in edges:
            iu, iv = index.get(f"{node}|{u}"), index.get(f"{node}|{v}")
            if iu is None or iv is None:
                return None             # an op only in the dependency list: contracted by the builder
            src.append(iu)
            dst.append(iv)
    # the nccl scheme per collective (identity strategy: one group per tensor, in the trace's order)
    virtual = OpKind.VIRTUAL.value
    seen_tensor: set[str] = set()
    for c in ts.collectives:
        if c.tensor in seen_tensor:
            return None
        seen_tensor.add(c.tensor)
        p = float(c.priority)
        ins = {n: list(dict.fromkeys(o)) for n, o in c.inputs.items()}
        outs = {n: list(dict.fromkeys(o)) for n, o in c.outputs.items()}
        for n in list(ins) + list(outs):
            for o in ins.get(n, []) + outs.get(n, []):
                if f"{n}|{o}" not in index:
                    return None         # the builder refuses it, with a message
        sync = add(f"|SYNC {c.tensor}", "", virtual, p)
        for r in c.participants:
            kin_key = f"{r}|In {c.tensor}"
            if kin_key not in index:
                kin = add(kin_key, r, virtual, p)
                kout = add(f"{r}|Out {c.tensor}", r, virtual, p)
                for o in ins.get(r, []):
                    src.append(index[f"{r}|{o}"])
                    dst.append(kin)
                for o in outs.get(r, []):
                    src.append(kout)
                    dst.append(index[f"{r}|{o}"])
            else:
                kin, kout = index[kin_key], index[f"{r}|Out {c.tensor}"]
            src += [kin, sync]
            dst += [sync, kout]
    # synchronous iterations: per node a STEP_END after its last ops, before its next first ops
    n0 = len(keys)
    s_arr, d_arr = _first_occurrence(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), n0)
    node_codes, node_names = pd.factorize(pd.Series(owner, dtype=object))
    same = node_codes[s_arr] == node_codes[d_arr]
    has_succ = np.zeros(n0, dtype=bool)
    has_pred = np.zeros(n0, dtype=bool)
    has_succ[s_arr[same]] = True
    has_pred[d_arr[same]] = True
    not_first = np.array([k in _NOT_FIRST for k in kinds], dtype=bool)
    order = np.argsort(node_codes, kind="stable")          # each node's ops in insertion order
    bounds = np.searchsorted(node_codes[order], np.arange(len(node_names) + 1))
    it_src: list[int] = []
    it_dst: list[int] = []
    extra_src: list[np.ndarray] = []
    extra_dst: list[np.ndarray] = []
    for code, node in enumerate(node_names):           # nodes in order of first appearance
        if not node:
            continue
        mine = order[bounds[code]:bounds[code + 1]]
        end = add(f"{node}|STEP_END", node, virtual, 0.0)
        sinks = mine[~has_succ[mine]]
        sources = mine[~not_first[mine] & ~has_pred[mine]]
        extra_src.append(sinks)
        extra_dst.append(np.full(sinks.size, end, dtype=np.int64))
        it_src += [end] * int(sources.size)
        it_dst += sources.tolist()
    if extra_src:
        s_arr = np.concatenate([s_arr, *extra_src])
        d_arr = np.concatenate([d_arr, *extra_dst])
    # networkx adjacency order: sources in insertion order, each one's successors in order of addition
    by_src = np.argsort(s_arr, kind="stable")
    s_arr, d_arr = s_arr[by_src], d_arr[by_src]
    dev_names: dict[str, int] = {}
    dev0 = np.fromiter((dev_names.setdefault(d, len(dev_names)) if d else -1 for d in devs), dtype=np.int64,
                       count=len(devs))
    return compile_arrays(keys, np.asarray(dur, dtype=np.float64), np.asarray(prio, dtype=np.float64), dev0,
                          list(dev_names), s_arr, d_arr, np.array([it_src, it_dst], dtype=np.int64).T)


def _first_occurrence(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges without repeats, each at its first position (networkx ignores a repeated add_edge)."""
    code = src * np.int64(max(n, 1)) + dst
    _, first = np.unique(code, return_index=True)
    first.sort()
    return src[first], dst[first]


def compile_trace_or_graph(ts: TraceSet, *, comm_model: Any = None) -> tuple[Any, str]:
    """The compiled replay arrays of ``ts``: :func:`compile_trace` where it applies, else through networkx.

    Parameters
    ----------
    ts : TraceSet
        A loaded trace.
    comm_model : CommModel or None
        For the networkx path (:func:`dpro_kit.graph.build.build_global_dfg`).

    Returns
    -------
    (CompiledGraph, str)
        The arrays and which path made them (``arrays`` or ``networkx``).
    """
    cg = compile_trace(ts)
    if cg is not None:
        return cg, "arrays"
    from ..replay import compile_graph
    from .build import build_global_dfg
    return compile_graph(build_global_dfg(ts, comm_model=comm_model)), "networkx"
