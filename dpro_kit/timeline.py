"""Export schedules as Chrome / Perfetto trace-event JSON.

Two exports share one layout:

* :func:`replay_to_chrome` — a replayed schedule (``dpro replay --timeline``);
* :func:`trace_to_chrome` — the *measured* trace, straight from the event table
  (optionally corrected by per-node clock offsets, ``aligned = raw - offset``: the
  "aligned" view).

Mapping (so a timeline reads like the cluster): each worker/server is a
process (``process_name``, ``process_labels`` with host/rank/role), each of its
streams a thread (``thread_name``); network links form one "network" process
with a thread per link.  Every op is a complete event (``ph: "X"``, ``ts`` /
``dur`` in us) with its metadata in ``args``; ops on the critical path also
appear on a separate "critical path" process and carry ``args.critical = true``.

Events of one thread are written in time order and never overlap partially
(an event either ends before the next starts or contains it, which viewers
draw as nesting).  Measured traces can overlap on one stream (e.g. two gloo
collectives in flight at once); such events go to an extra thread
(``comm #2``).  Overlaps of at most :data:`CLIP_US` (timestamp rounding in
the profiler) are clipped instead, and the clipped amount is kept in
``args.clipped_us``.  Open the files in https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

import networkx as nx

from .errors import atomic_write_text
from .replay import ReplayResult

#: partial overlaps up to this many microseconds are clipped rather than moved to a new thread
CLIP_US = 1.0
#: pid of the memory counters of a replay
MEMORY_PID = 999_998
CRITICAL_PID = 10_000
_STREAM_ORDER = {"iterations": -1, "compute": 0, "comm": 1}


def _meta(pid: int, tid: int | None, what: str, name: str, sort: int | None = None) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": what, "args": {"name": name}}]
    if tid is not None:
        ev[0]["tid"] = tid
    if sort is not None:
        ev.append({"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}),
                   "name": what.replace("_name", "_sort_index"), "args": {"sort_index": sort}})
    return ev


def assign_lanes(starts: Sequence[float], durs: Sequence[float], *,
                 clip_us: float = CLIP_US) -> list[tuple[int, float, float]]:
    """Place intervals on as few lanes as possible so that no lane has a partial overlap.

    Returns, per input interval, ``(lane, start, dur)``: lane 0 is the first; an
    interval contained in an open one nests on the same lane; partial overlaps of
    at most ``clip_us`` are clipped (start moved to the other's end, or end moved
    back to the enclosing one's end) instead of opening a new lane.
    """
    n = len(starts)
    order = sorted(range(n), key=lambda i: (starts[i], -durs[i], i))
    lanes: list[list[float]] = []  # per lane: stack of end times of open intervals
    out: list[tuple[int, float, float]] = [(0, 0.0, 0.0)] * n
    for i in order:
        s0 = float(starts[i])
        e0 = s0 + float(durs[i])
        for li, st in enumerate(lanes):
            while st and st[-1] <= s0:
                st.pop()                                 # closed for good: later intervals start later
            s, e, j = s0, e0, len(st)
            while j and e > st[j - 1] and st[j - 1] - s <= clip_us:
                s = st[j - 1]                            # tiny overlap: start at the other's end
                j -= 1
                while j and st[j - 1] <= s:
                    j -= 1
            if j and e > st[j - 1]:
                if e - st[j - 1] > clip_us:
                    continue                             # a real partial overlap: try the next lane
                e = st[j - 1]                            # tiny overhang: nest
            del st[j:]
            st.append(e)
            out[i] = (li, s, max(e - s, 0.0))
            break
        else:
            lanes.append([e0])
            out[i] = (len(lanes) - 1, s0, e0 - s0)
    return out


class _Layout:
    """Collects (process, thread, event) triples and writes valid, monotone trace-event JSON."""

    def __init__(self) -> None:
        self.procs: dict[str, dict[str, Any]] = {}
        self.items: list[tuple[str, str, dict[str, Any]]] = []

    def process(self, name: str, *, sort: int, labels: str = "", pid: int | None = None) -> None:
        if name not in self.procs:
            self.procs[name] = {"sort": sort, "labels": labels, "pid": pid}

    def add(self, proc: str, thread: str, ev: dict[str, Any]) -> None:
        self.items.append((proc, thread, ev))

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        by_thread: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for proc, thread, ev in self.items:
            by_thread.setdefault((proc, thread), []).append(ev)
        procs = sorted(self.procs, key=lambda p: (self.procs[p]["sort"], p))
        pids: dict[str, int] = {}
        for i, p in enumerate(procs):
            pids[p] = self.procs[p]["pid"] or i + 1
            out.extend(_meta(pids[p], None, "process_name", p, sort=self.procs[p]["sort"]))
            if self.procs[p]["labels"]:
                out.append({"ph": "M", "pid": pids[p], "name": "process_labels",
                            "args": {"labels": self.procs[p]["labels"]}})
        xs: list[dict[str, Any]] = []
        tid = 0
        keys = sorted(by_thread, key=lambda k: (procs.index(k[0]), _STREAM_ORDER.get(k[1], 2), k[1]))
        for proc, thread in keys:
            evs = by_thread[(proc, thread)]
            placed = assign_lanes([e["ts"] for e in evs], [e["dur"] for e in evs])
            lane_tid: dict[int, int] = {}
            for ev, (lane, s, d) in zip(evs, placed):
                if lane not in lane_tid:
                    tid += 1
                    lane_tid[lane] = tid
                    name = thread if lane == 0 else f"{thread} #{lane + 1}"
                    out.extend(_meta(pids[proc], tid, "thread_name", name, sort=tid))
                clipped = (ev["ts"] + ev["dur"]) - (s + d) + (s - ev["ts"])
                if clipped > 1e-9:
                    ev["args"]["clipped_us"] = round(clipped, 3)
                ev.update(pid=pids[proc], tid=lane_tid[lane], ts=s, dur=d)
                xs.append(ev)
        xs.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
        return out + xs


def replay_to_chrome(res: ReplayResult, g: nx.DiGraph, *, label: str = "replay", memory: Any = None) -> dict[str, Any]:
    """Trace-event JSON object for a replayed schedule (all replayed iterations).

    ``memory`` (a :class:`dpro_kit.optimize.memory.ReplayMemory` of ``res``) adds one counter track per
    worker, ``memory <node>`` in bytes, in a ``memory`` process.
    """
    crit = set(res.critical_path())
    lay = _Layout()
    node_rank: dict[str, int] = {}
    for _, d in g.nodes(data=True):
        if d.get("node") and d["node"] not in node_rank:
            node_rank[d["node"]] = len(node_rank) + 1
    for r in sorted(range(res.start.size), key=lambda r: (res.start[r], r)):
        key = res.key(r)
        data = g.nodes[key]
        dev = res.device_of(r)
        proc = "network" if dev.startswith("link:") else (data["node"] or "virtual")
        prefix = f"{data['node']}:"
        thread = dev[len(prefix):] if dev.startswith(prefix) else (dev or "markers")
        lay.process(proc, sort=node_rank.get(proc, len(node_rank) + 1))
        args = {"op": key, "kind": data["kind"], "node": data["node"], "iteration": int(r // res.n), "device": dev}
        for a in ("tensor", "bytes", "txn", "phase", "step", "chunk", "peer", "source"):
            v = data.get(a)
            if v not in ("", -1, None, 0) or (a == "bytes" and v):
                args[a] = v
        if r in crit:
            args["critical"] = True
        ev = {"ph": "X", "name": data["name"] or key, "cat": data["kind"],
              "ts": round(float(res.start[r]), 3), "dur": round(float(res.end[r] - res.start[r]), 3), "args": args}
        lay.add(proc, thread, ev)
        if r in crit:
            lay.process("critical path", sort=0, pid=CRITICAL_PID)
            lay.add("critical path", "critical path", {**ev, "args": dict(args), "cname": "terrible"})
    events = lay.events()
    if memory is not None and memory.timeline:
        events.extend(_meta(MEMORY_PID, None, "process_name", "memory", sort=10**6))
        for node, (t, b) in memory.timeline.items():
            events.extend({"ph": "C", "pid": MEMORY_PID, "name": f"memory {node}", "ts": round(float(x), 3),
                           "args": {"bytes": int(round(float(y)))}} for x, y in zip(t, b))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "dpro-kit", "kind": label, "iterations": res.iterations,
                          "iteration_time_us": res.iteration_time_us}}


def trace_to_chrome(ts: Any, *, iterations: Iterable[int] | None = None,
                    offsets_us: dict[str, float] | None = None, critical_ops: Iterable[str] = (),
                    label: str | None = None) -> dict[str, Any]:
    """Trace-event JSON object for the *measured* trace of a :class:`~dpro_kit.trace.TraceSet`.

    ``iterations`` limits the export to those profiled iterations (default: all).
    ``offsets_us`` (node -> us, from time alignment: how far the node's clock is ahead
    of the reference's) is *subtracted* from each node's timestamps (``aligned = raw -
    offset``, as ``dpro_kit.align``), giving the aligned view; ``label`` defaults to ``measured`` or
    ``aligned``.  Op keys in ``critical_ops`` (``"<node>|<op>"``, as on a replayed
    critical path) are marked ``args.critical``.  Times are relative to the
    earliest exported event (``otherData.t0_us`` keeps the clock value).  Each
    node also gets an ``iterations`` thread with one event per iteration.
    """
    from .graph.model import op_key

    ev = ts.events
    if iterations is not None:
        keep = set(int(i) for i in iterations)
        ev = ev[ev["iteration"].isin(keep)]
    offsets = {str(k): float(v) for k, v in (offsets_us or {}).items()}
    label = label or ("aligned" if offsets else "measured")
    crit = set(critical_ops)
    m = ts.manifest
    order = {n: i + 1 for i, n in enumerate(ts.nodes())}
    starts = ev["start"].to_numpy(dtype="float64") - ev["node"].map(lambda n: offsets.get(str(n), 0.0)).to_numpy(
        dtype="float64")
    t0 = float(starts.min()) if len(starts) else 0.0
    lay = _Layout()
    for n in ts.nodes():
        info = m.nodes[n]
        lay.process(n, sort=order[n], labels=f"host {info.host}, {info.role} rank {info.rank}")
    cols = ["node", "stream", "op", "name", "kind", "iteration", "dur", "tensor", "bytes", "txn", "phase", "step",
            "chunk", "peer"]
    spans: dict[tuple[str, int], list[float]] = {}
    for rec, s in zip(ev[cols].itertuples(index=False, name=None), starts):
        node, stream, op, name, kind, it, dur, tensor, nbytes, txn, phase, step, chunk, peer = rec
        node = str(node)
        rel = float(s) - t0
        args: dict[str, Any] = {"op": op_key(node, str(op)), "kind": str(kind), "node": node,
                                "iteration": int(it), "stream": str(stream)}
        for a, v in (("tensor", tensor), ("bytes", nbytes), ("txn", txn), ("phase", phase), ("step", step),
                     ("chunk", chunk), ("peer", peer)):
            if v not in ("", -1, 0, None):
                args[a] = int(v) if a in ("bytes", "step", "chunk") else str(v)
        if node in offsets:
            args["offset_us"] = offsets[node]
        if args["op"] in crit:
            args["critical"] = True
        lay.process(node, sort=order.get(node, len(order) + 1))
        lay.add(node, str(stream), {"ph": "X", "name": str(name) or str(op), "cat": str(kind),
                                    "ts": round(rel, 3), "dur": round(float(dur), 3), "args": args})
        sp = spans.setdefault((node, int(it)), [rel, rel + float(dur)])
        sp[0] = min(sp[0], rel)
        sp[1] = max(sp[1], rel + float(dur))
    for (node, it), (a, b) in sorted(spans.items()):
        lay.add(node, "iterations", {"ph": "X", "name": f"iteration {it}", "cat": "iteration",
                                     "ts": round(a, 3), "dur": round(b - a, 3),
                                     "args": {"node": node, "iteration": it, "span_ms": round((b - a) / 1e3, 6)}})
    other: dict[str, Any] = {"producer": "dpro-kit", "kind": label, "job": m.job, "framework": m.framework,
                             "comm_backend": m.comm_backend, "t0_us": t0,
                             "iterations": sorted({int(i) for i in ev["iteration"]})}
    if offsets:
        other["offsets_us"] = offsets
    return {"traceEvents": lay.events(), "displayTimeUnit": "ms", "otherData": other}


def write_chrome(obj: dict[str, Any], path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps(obj, separators=(",", ":")))


__all__ = ["CLIP_US", "CRITICAL_PID", "assign_lanes", "replay_to_chrome", "trace_to_chrome", "write_chrome"]
