"""Timeline exports are valid Chrome / Perfetto trace-event JSON.

The validator below is written from the Trace Event Format spec
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
JSON object format with a ``traceEvents`` array; every event has ``ph``; duration
events (``X``) have ``name``, ``ts``, ``dur`` >= 0, ``pid``, ``tid``; metadata events
(``M``) are one of the five documented names with their documented ``args`` key;
``args`` is an object; ``cname`` is one of the reserved colour names. On top of
the spec, what viewers need to draw a thread correctly: events of one thread appear
in time order and complete events on one thread either nest or do not overlap;
every process and thread used is named.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from dpro_kit.analysis import critical_path_summary
from dpro_kit.costmodel import fit_from_trace
from dpro_kit.graph import build_global_dfg
from dpro_kit.replay import replay
from dpro_kit.timeline import assign_lanes, replay_to_chrome, trace_to_chrome, write_chrome
from dpro_kit.trace import load_trace

from conftest import tiny_traceset

REAL = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"

METADATA_ARGS = {"process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index",
                 "thread_name": "name", "thread_sort_index": "sort_index"}
RESERVED_CNAMES = {"good", "bad", "terrible", "yellow", "olive", "generic_work", "black", "white", "grey",
                   "thread_state_uninterruptible", "thread_state_iowait", "thread_state_running",
                   "thread_state_runnable", "thread_state_sleeping", "thread_state_unknown",
                   "background_memory_dump", "light_memory_dump", "detailed_memory_dump", "vsync_highlight_color",
                   "startup", "heap_dump_stack_frame", "heap_dump_object_type", "heap_dump_child_node_highlight",
                   "cq_build_running", "cq_build_passed", "cq_build_failed", "cq_build_abandoned",
                   "cq_build_attempt_runnig", "cq_build_attempt_passed", "cq_build_attempt_failed", "rail_response",
                   "rail_animation", "rail_idle", "rail_load"}
EPS = 1e-6


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_trace_events(doc: Any) -> list[str]:
    """All violations of the trace-event format (empty list = valid)."""
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents array"]
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errs.append(f"displayTimeUnit {doc['displayTimeUnit']!r} is not ms or ns")
    json.dumps(doc, allow_nan=False)  # raises on NaN / Infinity, which JSON does not have
    proc_named, thread_named = set(), set()
    used_threads: set[tuple[int, int]] = set()
    per_thread: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for i, e in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
            errs.append(f"{where}: not an object with a 'ph'")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args is not an object")
        if "cname" in e and e["cname"] not in RESERVED_CNAMES:
            errs.append(f"{where}: cname {e['cname']!r} is not a reserved colour name")
        if not isinstance(e.get("pid"), int):
            errs.append(f"{where}: pid missing or not an integer")
            continue
        if e["ph"] == "M":
            key = METADATA_ARGS.get(e.get("name"))
            if key is None:
                errs.append(f"{where}: unknown metadata event {e.get('name')!r}")
            elif key not in e.get("args", {}):
                errs.append(f"{where}: {e['name']} needs args.{key}")
            if e.get("name", "").startswith("thread_"):
                if not isinstance(e.get("tid"), int):
                    errs.append(f"{where}: thread metadata without an integer tid")
                elif e["name"] == "thread_name":
                    thread_named.add((e["pid"], e["tid"]))
            elif e.get("name") == "process_name":
                proc_named.add(e["pid"])
            continue
        if e["ph"] != "X":
            errs.append(f"{where}: unexpected phase {e['ph']!r} (exports use X and M only)")
            continue
        for f in ("name", "ts", "dur", "tid"):
            if f not in e:
                errs.append(f"{where}: X event without {f!r}")
        if not isinstance(e.get("name"), str) or not e.get("name"):
            errs.append(f"{where}: name must be a non-empty string")
        if not isinstance(e.get("tid"), int) or not _num(e.get("ts")) or not _num(e.get("dur")) or e["dur"] < 0:
            errs.append(f"{where}: bad tid/ts/dur {e.get('tid')!r} {e.get('ts')!r} {e.get('dur')!r}")
            continue
        used_threads.add((e["pid"], e["tid"]))
        per_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for pid, tid in sorted(used_threads):
        if pid not in proc_named:
            errs.append(f"pid {pid} has events but no process_name")
        if (pid, tid) not in thread_named:
            errs.append(f"thread {pid}/{tid} has events but no thread_name")
    for (pid, tid), evs in per_thread.items():
        stack: list[float] = []
        last_ts = -math.inf
        for e in evs:
            s, end = e["ts"], e["ts"] + e["dur"]
            if s < last_ts - EPS:
                errs.append(f"thread {pid}/{tid}: {e['name']!r} at {s} comes after an event at {last_ts}")
            last_ts = max(last_ts, s)
            while stack and stack[-1] <= s + EPS:
                stack.pop()
            if stack and end > stack[-1] + EPS:
                errs.append(f"thread {pid}/{tid}: {e['name']!r} [{s}, {end}] partially overlaps an event "
                            f"ending at {stack[-1]}")
            stack.append(end)
    return errs


def _replayed(ts, iterations=1):
    g = build_global_dfg(ts, comm_model=fit_from_trace(ts))
    return g, replay(g, iterations=iterations)


# ----------------------------------------------------------------------------- the validator itself

def test_validator_catches_what_it_should():
    ok = {"traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "w0"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "compute"}},
        {"ph": "X", "pid": 1, "tid": 1, "name": "a", "ts": 0, "dur": 10},
        {"ph": "X", "pid": 1, "tid": 1, "name": "nested", "ts": 2, "dur": 3},
        {"ph": "X", "pid": 1, "tid": 1, "name": "b", "ts": 10, "dur": 1}]}
    assert validate_trace_events(ok) == []
    partial = json.loads(json.dumps(ok))
    partial["traceEvents"][3]["dur"] = 30
    assert any("partially overlaps" in e for e in validate_trace_events(partial))
    unsorted = json.loads(json.dumps(ok))
    unsorted["traceEvents"][2], unsorted["traceEvents"][4] = unsorted["traceEvents"][4], unsorted["traceEvents"][2]
    assert any("comes after" in e for e in validate_trace_events(unsorted))
    unnamed = {"traceEvents": ok["traceEvents"][2:]}
    assert any("process_name" in e for e in validate_trace_events(unnamed))
    bad = json.loads(json.dumps(ok))
    bad["traceEvents"][2].pop("dur")
    bad["traceEvents"][3]["cname"] = "pink"
    errs = validate_trace_events(bad)
    assert any("without 'dur'" in e for e in errs) and any("cname" in e for e in errs)


def test_assign_lanes_nests_clips_and_splits():
    got = assign_lanes([0, 2, 5, 9.6, 30], [10, 3, 20, 5, 1])
    assert got[0] == (0, 0, 10) and got[1] == (0, 2, 3)      # nested
    assert got[2][0] == 1                                    # [5, 25] overlaps [0, 10] by 5 us: new lane
    lane, s, d = got[3]                                      # [9.6, 14.6]: fits lane 0 after clipping 0.4 us
    assert lane == 0 and s == pytest.approx(10) and d == pytest.approx(4.6)
    assert got[4] == (0, 30, 1)


# ----------------------------------------------------------------------------- exports

@pytest.mark.parametrize("iterations", [1, 3])
def test_replay_timeline_is_valid(iterations, tmp_path):
    ts = tiny_traceset()
    g, res = _replayed(ts, iterations)
    doc = replay_to_chrome(res, g)
    write_chrome(doc, tmp_path / "tl.json")
    doc = json.loads((tmp_path / "tl.json").read_text())
    assert validate_trace_events(doc) == []
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"w0", "w1", "network", "critical path"} <= names
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in threads and any(t.startswith("link:") for t in threads)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all({"op", "kind", "iteration", "device"} <= set(e["args"]) for e in xs)
    crit = [e for e in xs if e["args"].get("critical")]
    assert len({e["args"]["op"] + str(e["args"]["iteration"]) for e in crit}) == len(res.critical_path())
    assert max(e["args"]["iteration"] for e in xs) == iterations - 1


def test_replay_timeline_of_real_trace_is_valid():
    ts = load_trace(REAL)
    g, res = _replayed(ts, 3)
    assert validate_trace_events(replay_to_chrome(res, g)) == []


def test_measured_timeline_of_real_trace():
    ts = load_trace(REAL)
    doc = trace_to_chrome(ts)
    assert validate_trace_events(doc) == []
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert set(procs.values()) == {"host0/0", "host0/1"}
    labels = [e["args"]["labels"] for e in meta if e["name"] == "process_labels"]
    assert any("rank 1" in lab and "host0" in lab for lab in labels)
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    for p in procs:
        assert {(p, "compute"), (p, "comm"), (p, "iterations")} <= threads
    # gloo runs two bucket allreduces at once on the comm stream: the second goes to a second thread
    assert any(name == "comm #2" for _, name in threads)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "iteration"]
    assert len(xs) == len(ts.events)
    assert min(e["ts"] for e in xs) == 0.0 and doc["otherData"]["t0_us"] > 1e12
    assert all({"op", "kind", "node", "iteration", "stream"} <= set(e["args"]) for e in xs)
    comm = [e for e in xs if e["cat"] == "COMM"]
    assert comm and all(e["args"]["tensor"].startswith("bucket") and e["args"]["bytes"] > 0 for e in comm)
    # clipping only ever removes profiler rounding (<= 1 us), never real time
    assert max(e["args"].get("clipped_us", 0) for e in xs) <= 2.0
    its = [e for e in doc["traceEvents"] if e.get("cat") == "iteration"]
    assert len(its) == 2 * len(ts.manifest.iterations)


def test_measured_timeline_selected_iterations_offsets_and_critical_ops():
    ts = tiny_traceset()
    g, res = _replayed(ts)
    crit = critical_path_summary(res, g)["ops"]
    doc = trace_to_chrome(ts, iterations=[1], offsets_us={"w1": 250.0}, critical_ops=crit)
    assert validate_trace_events(doc) == []
    assert doc["otherData"]["kind"] == "aligned" and doc["otherData"]["offsets_us"] == {"w1": 250.0}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "iteration"]
    assert {e["args"]["iteration"] for e in xs} == {1}
    assert any(e["args"].get("critical") for e in xs)
    w0 = min(e["ts"] for e in xs if e["args"]["node"] == "w0")
    w1 = min(e["ts"] for e in xs if e["args"]["node"] == "w1")
    assert w0 - w1 == pytest.approx(250.0)   # workers start together; aligned = raw - offset moves w1 earlier
