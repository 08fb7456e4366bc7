"""Stateless analyses of a replayed schedule: per-node breakdown, critical-path summary.

Each function takes a :class:`~dpro_kit.replay.ReplayResult` and the DFG it
came from and returns plain data (DataFrames / dicts), so the CLI, reports and
CI checks all show the same numbers.
"""
from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from .replay import ReplayResult
from .trace import COMM_KINDS



def union_length(iv: np.ndarray) -> float:
    """Total length covered by intervals ``iv`` (shape (k, 2))."""
    if iv.size == 0:
        return 0.0
    iv = iv[np.argsort(iv[:, 0])]
    total, cur_s, cur_e = 0.0, iv[0, 0], iv[0, 1]
    for s, e in iv[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return float(total + cur_e - cur_s)


def overlap_breakdown(comp: np.ndarray, comm: np.ndarray, span: float) -> tuple[float, float, float, float]:
    """(compute, comm, overlap, idle) time, in the units of the inputs, for intervals within ``span``.

    ``comp``/``comm`` are (k, 2) arrays of [start, end); overlap = time both run,
    idle = time neither does.  Shared by the replayed and the measured breakdowns.
    """
    c1, c2 = union_length(comp), union_length(comm)
    both = union_length(np.vstack([comp, comm])) if comp.size or comm.size else 0.0
    return c1, c2, c1 + c2 - both, span - both


def last_iteration_window(res: ReplayResult) -> tuple[float, float]:
    """Time window of the last replayed iteration (steady state when several were replayed)."""
    if res.iterations == 1:
        return 0.0, res.makespan_us
    n = res.n
    t0 = float(res.end[(res.iterations - 2) * n:(res.iterations - 1) * n].max(initial=0.0))
    return t0, res.makespan_us


def breakdown(res: ReplayResult, g: nx.DiGraph) -> pd.DataFrame:
    """Per node, within the last iteration's window: computation, communication, overlap, idle (ms).

    Communication of a node = its SEND ops (on links) and RECV ops; computation
    = its ops of every other kind that occupy a device.  ``overlap`` is time
    when both run; ``idle`` is time when neither does.

    Parameters
    ----------
    res : dpro_kit.replay.engine.ReplayResult
        A replay of ``g``.
    g : networkx.DiGraph
        The replayed graph.

    Returns
    -------
    pandas.DataFrame
        One row per node: ``node``, ``compute_ms``, ``comm_ms``, ``overlap_ms``, ``idle_ms``.
    """
    t0, t1 = last_iteration_window(res)
    span = max(t1 - t0, 0.0)
    keys = res.graph.keys
    n = res.n
    rows = np.arange(res.start.size)
    node = np.array([g.nodes[k]["node"] for k in keys], dtype=object)[rows % n]
    kind = np.array([g.nodes[k]["kind"] for k in keys], dtype=object)[rows % n]
    has_dev = np.tile(res.graph.device >= 0, res.iterations)
    s = np.clip(res.start, t0, t1)
    e = np.clip(res.end, t0, t1)
    live = (e > s) & has_dev
    is_comm = np.isin(kind, list(COMM_KINDS))
    out = []
    for nd in sorted({x for x in node if x}):
        mine = live & (node == nd)
        comp = np.column_stack([s[mine & ~is_comm], e[mine & ~is_comm]])
        comm = np.column_stack([s[mine & is_comm], e[mine & is_comm]])
        c1, c2, ov, idle = overlap_breakdown(comp, comm, span)
        out.append({"node": nd, "compute_ms": c1 / 1e3, "comm_ms": c2 / 1e3, "overlap_ms": ov / 1e3,
                    "idle_ms": idle / 1e3})
    return pd.DataFrame(out, columns=["node", "compute_ms", "comm_ms", "overlap_ms", "idle_ms"])


def critical_path_summary(res: ReplayResult, g: nx.DiGraph, top: int = 10) -> dict[str, Any]:
    """The critical path as op keys, its time by kind, and its ``top`` longest ops.

    Parameters
    ----------
    res : dpro_kit.replay.engine.ReplayResult
        A replay of ``g`` (its recorded critical predecessors give the path).
    g : networkx.DiGraph
        The replayed graph (op kinds, devices, names).
    top : int
        How many of the longest critical-path ops to list.

    Returns
    -------
    dict
        ``ops`` (op keys in order), ``by_kind_ms``, ``top`` (start, duration, kind, device, name).

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.3 (replayer: critical path) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    path = res.critical_path()
    keys = [res.key(r) for r in path]
    durs = [float(res.end[r] - res.start[r]) for r in path]
    by_kind: dict[str, float] = {}
    for k, d in zip(keys, durs):
        kind = g.nodes[k]["kind"]
        by_kind[kind] = by_kind.get(kind, 0.0) + d / 1e3
    order = sorted(range(len(path)), key=lambda i: -durs[i])[:top]
    top_ops = [{"op": keys[i], "name": g.nodes[keys[i]]["name"], "kind": g.nodes[keys[i]]["kind"],
                "node": g.nodes[keys[i]]["node"], "device": res.device_of(path[i]),
                "iteration": int(path[i] // res.n), "start_ms": float(res.start[path[i]]) / 1e3,
                "dur_ms": durs[i] / 1e3} for i in sorted(order)]
    gaps = float(res.end[path[-1]] - res.start[path[0]] - sum(durs)) / 1e3 if path else 0.0
    return {"ops": keys, "rows": [int(r) for r in path], "length_ms": sum(durs) / 1e3, "by_kind_ms": by_kind,
            "top": top_ops, "gaps_ms": gaps}


__all__ = ["breakdown", "critical_path_summary", "last_iteration_window", "overlap_breakdown", "union_length"]
