"""Export schedules as Chrome / Perfetto trace-event JSON.

Mapping (so a timeline reads like the cluster): each worker/server is a
process, each of its streams a thread; network links form one "network"
process with a thread per link.  Every op is a complete event (``ph: "X"``,
``ts``/``dur`` in us) with its metadata in ``args``; ops on the critical path
also appear on a separate "critical path" process and carry
``args.critical = true``.  Open the file in https://ui.perfetto.dev or
chrome://tracing.
"""
from __future__ import annotations

import json
import os
from typing import Any

import networkx as nx

from .errors import atomic_write_text
from .replay import ReplayResult


def _meta(pid: int, tid: int | None, what: str, name: str, sort: int | None = None) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": what, "args": {"name": name}}]
    if tid is not None:
        ev[0]["tid"] = tid
    if sort is not None:
        ev.append({"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}),
                   "name": what.replace("_name", "_sort_index"), "args": {"sort_index": sort}})
    return ev


def replay_to_chrome(res: ReplayResult, g: nx.DiGraph, *, label: str = "replay") -> dict[str, Any]:
    """Trace-event JSON object for a replayed schedule (all replayed iterations)."""
    crit = set(res.critical_path())
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], int] = {}
    events: list[dict[str, Any]] = []

    def where(row: int) -> tuple[int, int]:
        key = res.key(row)
        dev = res.device_of(row)
        data = g.nodes[key]
        proc = "network" if dev.startswith("link:") else (data["node"] or "virtual")
        prefix = f"{data['node']}:"
        thread = dev[len(prefix):] if dev.startswith(prefix) else (dev or "markers")
        if proc not in pids:
            pids[proc] = len(pids) + 1
            events.extend(_meta(pids[proc], None, "process_name", proc, sort=pids[proc]))
        pid = pids[proc]
        if (pid, thread) not in tids:
            tids[(pid, thread)] = len(tids) + 1
            events.extend(_meta(pid, tids[(pid, thread)], "thread_name", thread))
        return pid, tids[(pid, thread)]

    rows = sorted(range(res.start.size), key=lambda r: (res.start[r], r))
    crit_pid = None
    for r in rows:
        key = res.key(r)
        data = g.nodes[key]
        pid, tid = where(r)
        args = {"op": key, "kind": data["kind"], "iteration": int(r // res.n), "device": res.device_of(r)}
        for a in ("tensor", "bytes", "txn", "phase", "step", "chunk", "peer", "source"):
            v = data.get(a)
            if v not in ("", -1, None, 0) or (a == "bytes" and v):
                args[a] = v
        if r in crit:
            args["critical"] = True
        ev = {"ph": "X", "pid": pid, "tid": tid, "name": data["name"] or key, "cat": data["kind"],
              "ts": float(res.start[r]), "dur": float(res.end[r] - res.start[r]), "args": args}
        events.append(ev)
        if r in crit:
            if crit_pid is None:
                crit_pid = 10_000
                events.extend(_meta(crit_pid, None, "process_name", "critical path", sort=0))
                events.extend(_meta(crit_pid, 1, "thread_name", "critical path"))
            events.append({**ev, "pid": crit_pid, "tid": 1, "cname": "terrible"})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "dpro-kit", "kind": label, "iterations": res.iterations,
                          "iteration_time_us": res.iteration_time_us}}


def write_chrome(obj: dict[str, Any], path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps(obj, separators=(",", ":")))
