"""Everything the HTML report shows, as plain data (no HTML here).

:func:`collect` reads a trace directory, replays it and derives the views:
measured and replayed timelines of one iteration, per-node breakdowns (measured
and replayed), per-bucket communication times, straggler statistics, alignment
offsets, memory samples and the optimizer plan.  Each optional view is ``None``
(or has ``available = False``) with a reason when the inputs do not have it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from ..analysis import last_iteration_window, overlap_breakdown, union_length
from ..errors import DproError
from ..schema import find_offsets
from ..trace import COMM_KINDS, COMPUTE_KINDS, TraceSet



@dataclass
class Bar:
    """One op on a timeline lane; times in us relative to the panel's origin."""

    start: float
    dur: float
    kind: str
    name: str
    critical: bool = False
    tip: str = ""


@dataclass
class Lane:
    group: str          # node (or "network", "critical path")
    label: str          # stream / link, e.g. "compute", "comm #2", "link:h0->h1"
    bars: list[Bar] = field(default_factory=list)
    gaps: bool = True   # draw idle gaps


@dataclass
class TimelinePanel:
    title: str
    span_us: float
    lanes: list[Lane]
    note: str = ""


@dataclass
class ReportData:
    trace_dir: str
    facts: dict[str, Any]
    replay: dict[str, Any]
    measured_tl: TimelinePanel
    replayed_tl: TimelinePanel
    breakdown: list[dict[str, Any]]         # per node: measured_* and replayed_* (ms)
    buckets: list[dict[str, Any]]
    stragglers: dict[str, Any]
    alignment: dict[str, Any]
    memory: dict[str, Any]
    plan: dict[str, Any] | None
    critical_top: list[dict[str, Any]]
    critical_by_kind: dict[str, float]
    critical_ops_last: int = 0
    critical_length_ms: float = 0.0
    ts: TraceSet | None = None
    graph: nx.DiGraph | None = None
    result: Any = None


# ----------------------------------------------------------------------------- measured side

def _iteration_spans(ev: pd.DataFrame) -> pd.DataFrame:
    end = ev["start"] + ev["dur"]
    return ev.assign(end=end).groupby("iteration")[["start", "end"]].agg({"start": "min", "end": "max"})


def representative_iteration(ev: pd.DataFrame) -> int | None:
    """The profiled iteration whose span (all nodes) is the median one."""
    if ev.empty:
        return None
    sp = _iteration_spans(ev)
    span = (sp["end"] - sp["start"]).sort_values(kind="stable")
    return int(span.index[(len(span) - 1) // 2])


def measured_timeline(ts: TraceSet, iteration: int | None, critical_ops: set[str],
                      offsets_us: dict[str, float] | None = None) -> TimelinePanel:
    """One profiled iteration per node stream; with ``offsets_us``, on aligned clocks (raw - offset)."""
    from ..graph.model import op_key
    from ..timeline import assign_lanes

    ev = ts.events
    if iteration is None or ev.empty:
        return TimelinePanel("measured", 0.0, [], note="the trace has no events")
    ev = ev[ev["iteration"] == iteration]
    if offsets_us:
        ev = ev.assign(start=ev["start"] - ev["node"].astype(str).map(lambda n: float(offsets_us.get(n, 0.0))))
    t0 = float(ev["start"].min())
    span = float((ev["start"] + ev["dur"]).max() - t0)
    lanes: list[Lane] = []
    for node in ts.nodes():
        mine = ev[ev["node"] == node]
        for stream in sorted(mine["stream"].astype(str).unique(), key=lambda s: ({"compute": 0, "comm": 1}.get(s, 2), s)):
            part = mine[mine["stream"] == stream].sort_values("start", kind="stable")
            placed = assign_lanes(part["start"].tolist(), part["dur"].tolist())
            by_lane: dict[int, Lane] = {}
            for rec, (lane, s, d) in zip(part.itertuples(index=False), placed):
                if lane not in by_lane:
                    by_lane[lane] = Lane(node, stream if lane == 0 else f"{stream} #{lane + 1}")
                key = op_key(node, str(rec.op))
                tip = f"{rec.name or rec.op} [{rec.kind}] {(s - t0) / 1e3:.3f} ms + {d / 1e3:.3f} ms"
                if rec.tensor:
                    tip += f" · {rec.tensor} {int(rec.bytes):,} B"
                by_lane[lane].bars.append(Bar(s - t0, d, str(rec.kind), str(rec.name or rec.op),
                                              key in critical_ops, tip + (" · on the replayed critical path"
                                                                          if key in critical_ops else "")))
            lanes.extend(by_lane[k] for k in sorted(by_lane))
    return TimelinePanel(f"measured: profiled iteration {iteration} (the median-length one)", span, lanes,
                         note="clocks aligned with the offsets below" if offsets_us else "node clocks as recorded")


def measured_breakdown(ts: TraceSet) -> dict[str, dict[str, float]]:
    """Per node, mean over profiled iterations of compute / comm / overlap / idle within the node's iteration span."""
    ev = ts.events
    out: dict[str, dict[str, float]] = {}
    for node in ts.nodes():
        rows = []
        for _, part in ev[ev["node"] == node].groupby("iteration"):
            s = part["start"].to_numpy(float)
            e = s + part["dur"].to_numpy(float)
            kind = part["kind"].astype(str).to_numpy()
            comp = np.column_stack([s, e])[np.isin(kind, list(COMPUTE_KINDS))]
            comm = np.column_stack([s, e])[np.isin(kind, list(COMM_KINDS))]
            span = float(e.max() - s.min()) if len(s) else 0.0
            rows.append((*overlap_breakdown(comp, comm, span), span))
        if rows:
            m = np.mean(np.array(rows), axis=0) / 1e3
            out[node] = {"compute_ms": m[0], "comm_ms": m[1], "overlap_ms": m[2], "idle_ms": m[3], "span_ms": m[4]}
    return out


def stragglers(ts: TraceSet) -> dict[str, Any]:
    """Per rank: iteration span and compute time per profiled iteration; spread across ranks."""
    ev = ts.events
    per_node: list[dict[str, Any]] = []
    per_node_measured = ts.manifest.facts.measured_iteration_ms_per_node
    for node in ts.nodes():
        mine = ev[ev["node"] == node]
        spans, comps, comms = [], [], []
        for _, part in mine.groupby("iteration"):
            s = part["start"].to_numpy(float)
            e = s + part["dur"].to_numpy(float)
            kind = part["kind"].astype(str).to_numpy()
            spans.append(float(e.max() - s.min()) / 1e3)
            comps.append(union_length(np.column_stack([s, e])[np.isin(kind, list(COMPUTE_KINDS))]) / 1e3)
            comms.append(union_length(np.column_stack([s, e])[np.isin(kind, list(COMM_KINDS))]) / 1e3)
        info = ts.manifest.nodes[node]
        rec = {"node": node, "rank": info.rank, "host": info.host, "role": info.role,
               "span_ms": spans, "compute_ms": comps, "comm_ms": comms,
               "mean_span_ms": float(np.mean(spans)) if spans else 0.0,
               "mean_compute_ms": float(np.mean(comps)) if comps else 0.0,
               "mean_comm_ms": float(np.mean(comms)) if comms else 0.0}
        v = per_node_measured.get(node)
        if v is not None:
            rec["unprofiled_iteration_ms"] = v
        per_node.append(rec)
    comp = [r["mean_compute_ms"] for r in per_node if r["role"] == "worker"]
    out: dict[str, Any] = {"nodes": per_node}
    if len(comp) >= 2 and min(comp) > 0:
        slow = max((r for r in per_node if r["role"] == "worker"), key=lambda r: r["mean_compute_ms"])
        fast = min((r for r in per_node if r["role"] == "worker"), key=lambda r: r["mean_compute_ms"])
        out["compute_spread_pct"] = 100.0 * (max(comp) - min(comp)) / min(comp)
        out["slowest"] = slow["node"]
        out["fastest"] = fast["node"]
        out["straggler"] = out["compute_spread_pct"] > 10.0
    return out


def buckets(ts: TraceSet, res: Any, g: nx.DiGraph) -> list[dict[str, Any]]:
    """Per tensor/bucket: size, measured collective time (mean/min/max), replayed synchronisation span."""
    ev = ts.events
    comm = ev[ev["kind"].astype(str).isin(list(COMM_KINDS)) & (ev["tensor"] != "")]
    t0, t1 = last_iteration_window(res)
    last = np.arange((res.iterations - 1) * res.n, res.iterations * res.n)
    span_by_tensor: dict[str, list[float]] = {}
    busy_by_tensor: dict[str, float] = {}
    for r in last:
        d = g.nodes[res.key(int(r))]
        t = d.get("tensor") or ""
        if not t or d.get("kind") not in ("SEND", "RECV", "VIRTUAL"):
            continue
        sp = span_by_tensor.setdefault(t, [math.inf, -math.inf])
        sp[0] = min(sp[0], float(res.start[r]))
        sp[1] = max(sp[1], float(res.end[r]))
        if d.get("kind") == "SEND":
            busy_by_tensor[t] = busy_by_tensor.get(t, 0.0) + float(res.end[r] - res.start[r])
    out = []
    order = {c.tensor: i for i, c in enumerate(ts.collectives)}
    sizes = {c.tensor: c.bytes for c in ts.collectives}
    tensors = sorted(set(sizes) | set(comm["tensor"].astype(str)) | set(span_by_tensor), key=lambda t: (order.get(t, 1e9), t))
    for t in tensors:
        mine = comm[comm["tensor"] == t]
        # a collective's time per iteration: min over ranks (the last rank to enter waits least), as the cost model
        per_it = mine.groupby("iteration")["dur"].min() if len(mine) else pd.Series(dtype=float)
        rec: dict[str, Any] = {"tensor": t, "bytes": int(sizes.get(t, int(mine["bytes"].max()) if len(mine) else 0))}
        if len(per_it):
            rec.update(measured_mean_ms=float(per_it.mean()) / 1e3, measured_min_ms=float(per_it.min()) / 1e3,
                       measured_max_ms=float(per_it.max()) / 1e3,
                       measured_all_ranks_mean_ms=float(mine["dur"].mean()) / 1e3)
        if t in span_by_tensor:
            a, b = span_by_tensor[t]
            rec["replayed_span_ms"] = (b - a) / 1e3
            rec["replayed_start_ms"] = (a - t0) / 1e3
            rec["replayed_link_busy_ms"] = busy_by_tensor.get(t, 0.0) / 1e3
        if rec.get("measured_mean_ms"):
            rec["measured_goodput_Mbps"] = round(rec["bytes"] * 8 / (rec["measured_mean_ms"] * 1e3))
        out.append(rec)
    return out


# ----------------------------------------------------------------------------- optional inputs

def _alignment_facts(doc: dict[str, Any]) -> dict[str, Any]:
    extra = {k: doc[k] for k in ("reference", "mode", "status", "solver", "solve_time_s", "skipped",
                                 "constraints", "residual", "convention")
             if doc.get(k) is not None and not isinstance(doc[k], (dict, list))}
    if doc.get("undetermined"):   # dpro align: offsets the data cannot pin
        extra["undetermined"] = [str(x) for x in doc["undetermined"]]
        extra["bounds_us"] = {str(k): v for k, v in (doc.get("bounds_us") or {}).items()}
    for nd, u in (doc.get("uncertainty_us") or {}).items():   # ~95 % (collective ends) or proven (clock probe)
        if _finite(u):
            extra[f"error bound {nd}"] = f"+-{float(u):.1f} us"
    for nd, p in (doc.get("probe_us") or {}).items():          # dpro_torch.clockprobe round trips
        if isinstance(p, dict) and all(_finite(p.get(k)) for k in ("estimate_us", "lo_us", "hi_us")):
            extra[f"clock probe {nd}"] = (f"{p['estimate_us']:.1f} us, proven in [{p['lo_us']:.1f}, {p['hi_us']:.1f}]"
                                          + (f", fastest round trip {p['rtt_min_us']:.0f} us"
                                             if _finite(p.get("rtt_min_us")) else ""))
    res = doc.get("residuals")
    if isinstance(res, dict):
        extra.update({f"residuals.{k}": v for k, v in res.items() if _finite(v) or isinstance(v, str)})
    return extra


def alignment(ts: TraceSet, trace_dir: Path, result: Any = None, *, applied: bool = True) -> dict[str, Any]:
    """Per-node clock offsets: from ``manifest.extra``, the alignment the replay applied, or a file.

    Looked for, in order: ``manifest.extra.alignment.offsets_us`` / ``manifest.extra.offsets_us``,
    then ``result`` (the :class:`~dpro_kit.align.AlignResult` the Session applied,
    ``Session.alignment``; cached by ``dpro align`` / the replay outside the trace folder),
    then ``TRACE_DIR/alignment.json`` / ``aligned.json`` (an object with ``offsets_us``,
    possibly under ``alignment``: offsets from elsewhere, e.g. PTP).  Absent -> ``available: False``.

    Parameters
    ----------
    ts : TraceSet
        The trace as recorded.
    trace_dir : Path
        Its folder.
    result : dpro_kit.align.AlignResult or None
        The alignment applied to the replayed trace (a skipped one counts as none).
    applied : bool
        False when alignment was switched off (``--no-align``): said in the reason.
    """
    found = ts.manifest.facts.offsets_us
    if found:
        return {"available": True, "offsets_us": found, "source": "manifest.json (extra)"}
    if result is not None and result.mode != "skipped":
        doc = result.to_json()
        return {"available": True, "offsets_us": dict(result.offsets_us),
                "source": "dpro align (applied by the replay)", **_alignment_facts(doc)}
    for p in [trace_dir / n for n in ("alignment.json", "aligned.json") if (trace_dir / n).is_file()]:
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        found = find_offsets(doc)
        if found:
            extra = _alignment_facts(doc) if isinstance(doc, dict) else {}
            return {"available": True, "offsets_us": found, "source": str(p.relative_to(trace_dir)), **extra}
    if not applied:
        return {"available": False, "reason": "not applied (--no-align)"}
    return {"available": False, "reason": "not computed (no offsets in manifest.extra, no cross-host alignment "
                                          "applies, no TRACE_DIR/alignment.json)"}


def memory(ts: TraceSet) -> dict[str, Any]:
    """Memory over one profiled iteration (the middle one), when the trace carries it.

    Source: ``ts.memory`` (allocator samples; ``dpro profile --memory``), times
    relative to the node's first op of that iteration; peaks per node over all
    profiled iterations.  ``manifest.extra.peak_memory_bytes`` (node -> bytes)
    adds peaks a collector measured another way.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    peaks: dict[str, float] = {}
    mem = ts.memory
    iteration = None
    if mem is not None and not mem.empty:
        its = sorted(int(i) for i in mem["iteration"].unique())
        iteration = its[len(its) // 2]
        for node, m in mem[mem["iteration"] == iteration].groupby("node", observed=True):
            ev = ts.events[(ts.events["node"] == node) & (ts.events["iteration"] == iteration)]
            t0 = float(ev["start"].min()) if not ev.empty else float(m["time"].min())
            series[str(node)] = sorted(zip((m["time"] - t0).astype(float).tolist(),
                                           m["bytes"].astype(float).tolist()))
        peaks = {str(k): float(v) for k, v in mem.groupby("node", observed=True)["bytes"].max().items()}
    for k, v in ts.manifest.facts.peak_memory_bytes.items():
        peaks.setdefault(k, v)
    if not series and not peaks:
        return {"available": False,
                "reason": "not available: the trace has no memory data (profile with `dpro profile --memory`)"}
    return {"available": True, "series": series, "peak_bytes": peaks, "iteration": iteration}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def load_plan(path: Path) -> dict[str, Any]:
    """An optimizer plan (any JSON object): its top-level entries and predicted before/after if present."""
    if not path.is_file():
        raise DproError("plan file not found", path=path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DproError(f"cannot read plan: {exc}", path=path) from None
    except json.JSONDecodeError as exc:
        raise DproError(f"plan is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})", path=path) from None
    if not isinstance(doc, dict):
        raise DproError("plan must be a JSON object", path=path)
    before, after = _before_after(doc)
    out: dict[str, Any] = {"path": str(path), "doc": doc, "entries": list(doc.items())}
    if before is not None and after is not None:
        out.update(before_ms=before[1], after_ms=after[1], before_key=before[0], after_key=after[0],
                   speedup=before[1] / after[1] if after[1] > 0 else None)
    return out


def _before_after(doc: dict[str, Any]) -> tuple[tuple[str, float] | None, tuple[str, float] | None]:
    """Numeric leaves whose path says before/after (preferring ones about iteration time)."""
    found: dict[str, list[tuple[int, str, float]]] = {"before": [], "after": []}

    def walk(x: Any, path: list[str]) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + [str(k)])
        elif _finite(x) and path:
            p = ".".join(path).lower()
            for which in ("before", "after"):
                if which in p:
                    score = ("iteration" in p) * 2 + ("predicted" in p) + ("ms" in p)
                    scale = 1e-3 if p.endswith("_us") else (1e3 if p.endswith("_s") else 1.0)
                    found[which].append((-score, ".".join(path), float(x) * scale))

    walk(doc, [])
    pick = {w: (sorted(v)[0][1:] if v else None) for w, v in found.items()}
    return pick["before"], pick["after"]  # type: ignore[return-value]


# ----------------------------------------------------------------------------- everything

def collect(trace_dir: str | Path, *, plan: str | Path | None = None, iterations: int = 3,
            progress: Any = None, align: bool = True, per_iteration: bool | None = None) -> ReportData:
    """Everything the report shows about ``trace_dir``.

    Parameters
    ----------
    trace_dir : str or Path
        A trace directory.
    plan : str or Path or None
        An optimizer plan (``dpro optimize``) to show.
    iterations : int
        Iterations to replay (the report shows the last).
    progress : dpro_kit.session.Progress or None
    align, per_iteration
        As :class:`~dpro_kit.session.Session` (defaults: as ``dpro replay``).
    """
    from ..check import replay_summary
    from ..session import Session

    trace_dir = Path(trace_dir)
    note = (progress.note if progress is not None else (lambda _m: None))
    plan_data = load_plan(Path(plan)) if plan is not None else None  # bad plan: fail before the slow part
    # the replayed side is what `dpro replay` replays; the measured views use the recorded clocks
    # (``alignment()`` below shows the offsets and the measured timeline applies them)
    session = Session(trace_dir, align=align, per_iteration=per_iteration, progress=progress)
    if session.is_graph_file:
        raise DproError("the report needs a trace directory, not a graph file", path=trace_dir)
    ts, g = session.raw, session.graph
    note(f"replaying {g.number_of_nodes()} ops x {iterations} iteration(s)")
    res = session.replay(iterations)
    rs = replay_summary(res, g, top=15)
    m = ts.manifest
    facts: dict[str, Any] = {"job": m.job, "framework": m.framework, "comm_backend": m.comm_backend,
                             "world_size": m.world_size, "nodes": len(m.nodes), "hosts": len({i.host for i in m.nodes.values()}),
                             "profiled_iterations": list(m.iterations), "tool_version": m.tool_version,
                             "created": m.created, "ops": g.number_of_nodes(), "edges": g.number_of_edges(),
                             "iterations_replayed": iterations, "comm_model": g.graph.get("meta", {}).get("comm_model"),
                             "durations": session.info["durations"]}
    from ..placement import placement_warnings
    facts["warnings"] = m.facts.warnings + placement_warnings(m.extra)
    from ..job import JobFacts
    measured = JobFacts.from_manifest(m).measured_iteration_ms
    if measured is not None:
        facts["measured_iteration_ms"] = measured
        facts["error_pct"] = 100.0 * (rs["iteration_time_ms"] - measured) / measured
    note("building the report")
    crit_rows = res.critical_path()
    crit_keys = {res.key(r) for r in crit_rows}
    it = representative_iteration(ts.events)
    al = alignment(ts, trace_dir, session.alignment, applied=align)
    meas = measured_timeline(ts, it, crit_keys, al.get("offsets_us") if al.get("available") else None)
    rep_tl = replayed_timeline(res, g, set(crit_rows))
    mb = measured_breakdown(ts)
    bd = []
    for node in ts.nodes():
        rec: dict[str, Any] = {"node": node}
        for k, v in mb.get(node, {}).items():
            rec[f"measured_{k}"] = v
        for k, v in rs["nodes"].get(node, {}).items():
            rec[f"replayed_{k}"] = v
        bd.append(rec)
    by_kind, top, n_last, length = critical_in_last_iteration(res, g, crit_rows, top=15)
    st = stragglers(ts)
    if sum(1 for i in ts.manifest.nodes.values() if i.role == "worker") >= 2:
        from ..stragglers import attribute
        note("replaying once more per rank (straggler attribution)")
        try:
            st["attribution"] = attribute(session)
        except DproError as exc:     # a what-if this trace cannot take: say so in the section
            st["attribution_error"] = exc.one_line() if hasattr(exc, "one_line") else str(exc)
    return ReportData(trace_dir=str(trace_dir), facts=facts, replay=rs, measured_tl=meas, replayed_tl=rep_tl,
                      breakdown=bd, buckets=buckets(ts, res, g), stragglers=st,
                      alignment=al, memory=memory(ts), plan=plan_data,
                      critical_top=top, critical_by_kind=by_kind, critical_ops_last=n_last,
                      critical_length_ms=length, ts=ts, graph=g, result=res)


def critical_in_last_iteration(res: Any, g: nx.DiGraph, crit_rows: list[int], *, top: int = 15
                               ) -> tuple[dict[str, float], list[dict[str, Any]], int, float]:
    """The critical path's time by kind and its longest ops, within the last iteration's window."""
    t0, t1 = last_iteration_window(res)
    by_kind: dict[str, float] = {}
    ops = []
    for r in crit_rows:
        s, e = max(float(res.start[r]), t0), min(float(res.end[r]), t1)
        if e < s or (e == s and not t0 <= s <= t1):
            continue
        d = g.nodes[res.key(r)]
        by_kind[d["kind"]] = by_kind.get(d["kind"], 0.0) + (e - s) / 1e3
        ops.append({"op": res.key(r), "name": d["name"], "kind": d["kind"], "node": d["node"],
                    "device": res.device_of(r), "iteration": int(r // res.n), "start_ms": (s - t0) / 1e3,
                    "dur_ms": (e - s) / 1e3})
    longest = sorted(sorted(ops, key=lambda o: -o["dur_ms"])[:top], key=lambda o: o["start_ms"])
    return by_kind, longest, len(ops), sum(by_kind.values())


def replayed_timeline(res: Any, g: nx.DiGraph, crit_rows: set[int]) -> TimelinePanel:
    """The last replayed iteration (steady state) per node stream and network link, plus a critical-path lane."""
    t0, t1 = last_iteration_window(res)
    lanes: dict[tuple[str, str], Lane] = {}
    crit_lane = Lane("critical path", "critical path", gaps=False)
    node_order: dict[str, int] = {}
    rows = np.flatnonzero((res.end > t0) & (res.start < t1) | ((res.start == res.end) & (res.start >= t0)
                                                                & (res.start <= t1)))
    for r in sorted(rows.tolist(), key=lambda r: (res.start[r], r)):
        key = res.key(r)
        d = g.nodes[key]
        dev = res.device_of(r)
        s, e = max(float(res.start[r]), t0), min(float(res.end[r]), t1)
        crit = r in crit_rows
        tip = (f"{d['name'] or key} [{d['kind']}] {(s - t0) / 1e3:.3f} ms + {(e - s) / 1e3:.3f} ms"
               f" · iteration {r // res.n}" + (f" · {d['tensor']}" if d.get("tensor") else "")
               + (" · CRITICAL PATH" if crit else ""))
        bar = Bar(s - t0, e - s, d["kind"], d["name"] or key, crit, tip)
        if crit and e > s:
            crit_lane.bars.append(bar)
        if not dev:
            continue  # In/Out markers: no device
        if dev.startswith("link:"):
            group, label = "network", dev[len("link:"):]
        else:
            group = d["node"] or "virtual"
            label = dev[len(group) + 1:] if dev.startswith(group + ":") else dev
        node_order.setdefault(group, len(node_order) if group != "network" else 10**6)
        lanes.setdefault((group, label), Lane(group, label)).bars.append(bar)
    ordered = sorted(lanes.values(), key=lambda ln: (node_order[ln.group], {"compute": 0, "comm": 1}.get(ln.label, 2),
                                                     ln.label))
    title = (f"replayed: iteration {res.iterations} of {res.iterations} (steady state)" if res.iterations > 1
             else "replayed: one iteration")
    return TimelinePanel(title, t1 - t0, [crit_lane] + ordered)


__all__ = ["alignment", "Bar", "buckets", "collect", "critical_in_last_iteration", "Lane", "load_plan",
           "measured_breakdown", "measured_timeline", "memory", "replayed_timeline", "ReportData",
           "representative_iteration", "stragglers", "TimelinePanel"]
