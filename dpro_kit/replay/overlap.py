"""Fit Proteus' overlap factor gamma from one trace (seed 001 §VI-C, "Comp-Comm Overlap").

Proteus sets gamma to the increase of the backward pass's time when it overlaps gradient
communication, measured in two profiling runs.  One dpro trace already holds both cases: the
same computation op (same node, same op id) runs once per profiled iteration, and its instances
differ in whether a transfer of its host was in flight.  The estimator:

1. **Communication intervals** per host: trace events of kind COMM / SEND / RECV with a positive
   duration, and GPU kernels whose name contains ``nccl`` (GPU traces: NCCL kernels on their own
   stream); their union per host.
2. **Computation instances**: GPU kernels that are not communication when the trace has GPU
   streams (the device Proteus' gamma is about), else the events of the nodes' ``compute``
   streams that are not communication; shorter than ``min_us`` skipped (timer noise).
3. For each instance, its **overlapped fraction** f = |[start, end) ∩ comm(host)| / dur.
   Overlapped: f >= ``overlapped_at`` (0.9); alone: f == 0.
4. For each op (node, op id) with at least one instance of each kind:
   r_op = median(dur | overlapped) / median(dur | alone).
5. **gamma = weighted median of (r_op − 1)**, weight = median(dur | alone) (the time at
   stake); clipped at 0 (the replay's overlap factor only slows).  ``gamma_mean`` (the weighted
   mean) and the number of ops/instances used are reported with it.

With the rate model of :mod:`.sharing` an op overlapped for all of its duration takes
(1+gamma) x its solo time, so r_op − 1 estimates gamma directly for f >= 0.9 instances.  When no
op has instances of both kinds (e.g. every backward op overlaps a bucket in every iteration, or
the communication never overlaps computation) gamma is not identifiable from the trace: the fit
says so (``gamma`` None) and the replay keeps 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..trace import COMM_KINDS


@dataclass
class OverlapFit:
    """Result of :func:`fit_overlap_factor` (``gamma`` None: not identifiable from this trace)."""

    gamma: float | None
    gamma_mean: float | None
    ops_used: int
    instances_overlapped: int
    instances_alone: int
    compute_source: str
    reason: str = ""
    per_op: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_op"] = d["per_op"][:20]
        return d


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if starts.size == 0:
        return starts, ends
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    us, ue = [s[0]], [e[0]]
    for a, b in zip(s[1:], e[1:]):
        if a <= ue[-1]:
            ue[-1] = max(ue[-1], b)
        else:
            us.append(a)
            ue.append(b)
    return np.array(us), np.array(ue)


def overlapped_fraction(starts: np.ndarray, ends: np.ndarray, cs: np.ndarray, ce: np.ndarray) -> np.ndarray:
    """Per interval [starts, ends): the fraction of it covered by the disjoint sorted intervals [cs, ce)."""
    out = np.zeros(starts.size)
    if cs.size == 0:
        return out
    cum = np.concatenate([[0.0], np.cumsum(ce - cs)])

    def covered(t: np.ndarray) -> np.ndarray:        # |(-inf, t) ∩ comm|
        k = np.searchsorted(cs, t, side="right")     # intervals starting before t
        full = cum[np.maximum(k - 1, 0)]
        last = np.where(k > 0, np.minimum(t, ce[np.maximum(k - 1, 0)]) - cs[np.maximum(k - 1, 0)], 0.0)
        return np.where(k > 0, full + np.maximum(last, 0.0), 0.0)

    d = ends - starts
    ok = d > 0
    out[ok] = (covered(ends[ok]) - covered(starts[ok])) / d[ok]
    return np.clip(out, 0.0, 1.0)


def _is_comm(ev: pd.DataFrame) -> pd.Series:
    stream = ev["stream"].astype(str)
    return ev["kind"].isin(sorted(COMM_KINDS)) | (stream.str.startswith("gpu")
                                           & ev["name"].astype(str).str.contains("nccl", case=False))


def _computation(ts: Any, min_us: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(computation events with their overlapped fraction ``_f``, communication events, source label)."""
    ev = ts.events
    ev = ev[ev["dur"] > 0]
    comm_mask = _is_comm(ev)
    stream = ev["stream"].astype(str)
    gpu = stream.str.startswith("gpu")
    if (gpu & ~comm_mask).any():
        comp = ev[gpu & ~comm_mask]
        source = "GPU kernels (not NCCL)"
    else:
        comp = ev[(stream == "compute") & ~comm_mask]
        source = "compute-stream ops"
    comp = comp[comp["dur"] >= min_us]
    comm = ev[comm_mask]
    host_col = "host" if "host" in ev.columns else "node"
    parts = []
    for host, c in comp.groupby(host_col, sort=False):
        cm = comm[comm[host_col] == host]
        cs, ce = _union(cm["start"].to_numpy(float), (cm["start"] + cm["dur"]).to_numpy(float))
        f = overlapped_fraction(c["start"].to_numpy(float), (c["start"] + c["dur"]).to_numpy(float), cs, ce)
        parts.append(c.assign(_f=f))
    return (pd.concat(parts) if parts else comp.assign(_f=0.0)), comm, source


def deoverlap(g: Any, ts: Any, gamma: float) -> tuple[Any, int]:
    """A copy of DFG ``g`` whose computation ops take their *solo* time: ``dur x (1 - f gamma / (1+gamma))``,
    f = the op's mean overlapped fraction in ``ts`` (the trace ``g`` was built from).

    A measured duration D that overlapped communication for a fraction f ran at 1/(1+gamma) for fD and
    at 1 for (1-f)D, so its work is W = D (1 - f gamma/(1+gamma)); the replay with overlap factor gamma
    then slows each op again where *its replayed schedule* overlaps, so the profiled schedule replays as
    measured and a what-if that moves communication moves the slowdown with it.  Returns the copy and
    the number of ops scaled.
    """
    if not gamma or ts is None:
        return g, 0
    comp, _, _ = _computation(ts)
    f = comp.groupby(["node", "op"])["_f"].mean()
    h = g.copy()
    k = gamma / (1.0 + gamma)
    n = 0
    for (node, op), fo in f.items():
        key = f"{node}|{op}"
        if fo > 0 and key in h:
            h.nodes[key]["dur"] = float(h.nodes[key].get("dur", 0.0)) * (1.0 - fo * k)
            n += 1
    return h, n


def fit_overlap_factor(ts: Any, *, min_us: float = 20.0, overlapped_at: float = 0.9) -> OverlapFit:
    """gamma from a TraceSet (module docstring).

    Parameters
    ----------
    ts : TraceSet
        The (aligned) trace; one clock per host is all the estimator needs (it compares events of
        one host only).
    min_us : float, default 20
        Computation instances shorter than this are skipped.
    overlapped_at : float, default 0.9
        Overlapped fraction from which an instance counts as overlapped.
    """
    comp, comm, source = _computation(ts, min_us)
    if comp.empty or comm.empty:
        return OverlapFit(None, None, 0, 0, 0, source, reason="no communication or no computation events")
    over = comp[comp["_f"] >= overlapped_at]
    alone = comp[comp["_f"] == 0.0]
    per_op = []
    ratios, weights = [], []
    a_med = alone.groupby(["node", "op"])["dur"].agg(["median", "size"]).add_suffix("_alone")
    o_med = over.groupby(["node", "op"])["dur"].agg(["median", "size"]).add_suffix("_over")
    both = a_med.join(o_med, how="inner")
    for (node, op), r in both.iterrows():
        ratio = float(r["median_over"]) / float(r["median_alone"])
        ratios.append(ratio - 1.0)
        weights.append(float(r["median_alone"]))
        per_op.append({"node": node, "op": op, "alone_us": float(r["median_alone"]), "n_alone": int(r["size_alone"]),
                       "overlapped_us": float(r["median_over"]), "n_overlapped": int(r["size_over"]),
                       "ratio": ratio})
    n_o, n_a = int(len(over)), int(len(alone))
    if not ratios:
        why = ("no op has both overlapped and alone instances" if n_o else
               "no computation instance overlaps communication")
        return OverlapFit(None, None, 0, n_o, n_a, source, reason=why + ": gamma is not identifiable from this trace")
    x, w = np.array(ratios), np.array(weights)
    o = np.argsort(x)
    cw = np.cumsum(w[o])
    med = float(x[o][np.searchsorted(cw, 0.5 * cw[-1])])
    per_op.sort(key=lambda d: -d["alone_us"])
    return OverlapFit(gamma=max(0.0, med), gamma_mean=float(np.average(x, weights=w)), ops_used=len(ratios),
                      instances_overlapped=n_o, instances_alone=n_a, compute_source=source, per_op=per_op)


__all__ = ["deoverlap", "fit_overlap_factor", "OverlapFit", "overlapped_fraction"]
