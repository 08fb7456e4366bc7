"""XSpace (``*.xplane.pb``, the TF profiler's output) -> op executions as plain JSON.

Parsing the protobuf needs TensorFlow's generated ``xplane_pb2``, so this runs inside the
profiled process (where TensorFlow is imported anyway) right after the profiler stops; dpro_kit
then reads plain JSON and never imports TensorFlow or protobuf. The ``.xplane.pb`` is kept
(TensorBoard's profile plugin reads it).

Times: XSpace stores each line's ``timestamp_ns`` relative to the session's
``profile_start_time`` (a wall-clock reading in the ``Task Environment`` plane); absolute
wall time = ``profile_start_time + line.timestamp_ns + event.offset_ps / 1000``.

Which events are ops: the executor's per-kernel events, named ``<node name>:<op type>``
(one colon). Step markers are the collector's ``dpro_step`` TraceMe events (``step_num``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_OP = re.compile(r"^([^:]+):([A-Za-z_][A-Za-z0-9_]*)$")
STEP_MARKER = "dpro_step"
COLUMNS = ["name", "type", "step", "start_ns", "dur_ns", "thread"]


def _xplane_pb2():
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TF 2.16+
    except ImportError:  # pragma: no cover - older layouts
        from tsl.profiler.protobuf import xplane_pb2
    return xplane_pb2


def _stat_value(plane, stat) -> Any:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    return getattr(stat, kind) if kind else None


def convert(path: Path, steps: list[int], window_ns: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Read one ``.xplane.pb``; return ``{"version", "profile_start_ns", "steps", "columns", "ops"}``.

    Parameters
    ----------
    path : Path
        The profiler's XSpace file.
    steps : list of int
        The profiled step numbers (markers are matched to them).
    window_ns : list of (int, int), optional
        Wall-clock ``(start, end)`` of each profiled step as the collector timed it; used when the
        XSpace holds no ``dpro_step`` marker (e.g. a remote task traced by the coordinator).
    """
    xs = _xplane_pb2().XSpace()
    xs.ParseFromString(Path(path).read_bytes())
    start_ns = 0
    for plane in xs.planes:
        if plane.name == "Task Environment":
            for s in plane.stats:
                if plane.stat_metadata[s.metadata_id].name == "profile_start_time":
                    start_ns = int(_stat_value(plane, s))
    markers: list[tuple[int, int, int]] = []
    raw: list[tuple[str, str, int, int, str]] = []
    for plane in xs.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            base = start_ns + line.timestamp_ns
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                t0 = base + ev.offset_ps // 1000
                if name == STEP_MARKER:
                    num = None
                    for s in ev.stats:
                        if plane.stat_metadata[s.metadata_id].name == "step_num":
                            num = int(_stat_value(plane, s))
                    if num is not None:
                        markers.append((num, t0, t0 + ev.duration_ps // 1000))
                    continue
                m = _OP.match(name)
                if m:
                    raw.append((m.group(1), m.group(2), t0, ev.duration_ps // 1000, line.name))
    if not markers and window_ns:
        markers = [(s, a, b) for s, (a, b) in zip(steps, window_ns)]
    markers.sort(key=lambda x: x[1])
    ops = []
    for name, typ, t0, dur, thread in raw:
        step = None
        for num, a, b in markers:   # a handful of steps: a linear scan is fine
            if a <= t0 <= b:
                step = num
                break
        if step is not None:
            ops.append([name, typ, step, t0, dur, thread])
    ops.sort(key=lambda r: (r[2], r[3]))
    return {"format": "dpro-tf-ops", "version": 1, "profile_start_ns": start_ns,
            "steps": [list(m) for m in markers], "columns": COLUMNS, "ops": ops,
            "hostnames": list(xs.hostnames)}


#: the events of a server task's XSpace (ParameterServerStrategy) this module reads besides kernels
_PROCESS, _DONE_CB, _ASYNC_START, _ASYNC_DONE = ("ExecutorState::Process", "ExecutorDoneCallback",
                                                 "ExecutorState::ProcessAsync::Start",
                                                 "ExecutorState::ProcessAsync::Done")
TASK_OP_COLUMNS = ["name", "type", "step_id", "start_ns", "dur_ns", "thread"]
TASK_SEND_COLUMNS = ["name", "from", "to", "key", "step_id", "start_ns", "dur_ns"]
TASK_RECV_COLUMNS = ["name", "step_id", "start_ns", "done_ns"]


def convert_task(path: Path) -> dict[str, Any]:
    """One server task's XSpace (a worker or PS of ParameterServerStrategy, traced remotely) -> JSON.

    What a server's XSpace holds (TF 2.21, host tracer level 2): per executed function component
    ``ExecutorState::Process`` events carrying the step ``id`` (the same id on the worker and on
    every PS for one step), the kernels they ran nested inside (``<node>:<type>``), ``_Send``
    kernels with stats ``from`` / ``to`` / ``key`` (the rendezvous key names both devices), and
    each ``_Recv`` as an ``ExecutorState::ProcessAsync::Start`` (request, stats ``name``,
    ``step_id``) / ``...::Done`` (the tensor arrived) pair.

    Parameters
    ----------
    path : Path
        The ``<host>_<port>.xplane.pb`` that ``tf.profiler.experimental.client.trace`` wrote.

    Returns
    -------
    dict
        ``{"format": "dpro-tf-task-ops", "version": 1, "profile_start_ns", "profile_stop_ns",
        "steps": [[step_id, start_ns, end_ns]], "ops", "sends", "recvs"}`` with the columns
        :data:`TASK_OP_COLUMNS`, :data:`TASK_SEND_COLUMNS`, :data:`TASK_RECV_COLUMNS`; step ids
        as strings, times wall-clock ns.
    """
    xs = _xplane_pb2().XSpace()
    xs.ParseFromString(Path(path).read_bytes())
    start_ns = stop_ns = 0
    for plane in xs.planes:
        if plane.name == "Task Environment":
            for s in plane.stats:
                name = plane.stat_metadata[s.metadata_id].name
                if name == "profile_start_time":
                    start_ns = int(_stat_value(plane, s))
                elif name == "profile_stop_time":
                    stop_ns = int(_stat_value(plane, s))
    steps: dict[str, list[int]] = {}
    ops, sends, recvs = [], [], []
    starts: dict[tuple[str, str], int] = {}
    dones: dict[tuple[str, str], int] = {}
    for plane in xs.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            base = start_ns + line.timestamp_ns
            evs = []
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                if name.startswith(("ThreadpoolListener", "Memory")):
                    continue
                t0 = base + ev.offset_ps // 1000
                evs.append((t0, ev.duration_ps // 1000, name, ev))
            evs.sort(key=lambda e: (e[0], -e[1]))
            cur: tuple[int, str] | None = None    # (end, step id) of the enclosing ExecutorState::Process
            for t0, dur, name, ev in evs:
                if name in (_PROCESS, _DONE_CB, "FunctionRun", _ASYNC_START, _ASYNC_DONE):
                    st = {plane.stat_metadata[s.metadata_id].name: _stat_value(plane, s) for s in ev.stats}
                    sid = st.get("id", st.get("step_id"))
                    if sid is None:
                        continue
                    sid = str(sid)
                    b = steps.setdefault(sid, [t0, t0 + dur])
                    b[0], b[1] = min(b[0], t0), max(b[1], t0 + dur)
                    if name == _PROCESS:
                        cur = (t0 + dur, sid)
                    elif name == _ASYNC_START and st.get("kernel_type") == "_Recv":
                        starts[(sid, str(st.get("name")))] = t0
                    elif name == _ASYNC_DONE and st.get("kernel_type") == "_Recv":
                        dones[(sid, str(st.get("name")))] = t0    # the callback's start: the tensor is in
                    continue
                m = _OP.match(name)
                if not m or cur is None or t0 > cur[0]:
                    continue
                sid = cur[1]
                if m.group(2) == "_Send":
                    st = {plane.stat_metadata[s.metadata_id].name: _stat_value(plane, s) for s in ev.stats}
                    sends.append([m.group(1), str(st.get("from", "")), str(st.get("to", "")), str(st.get("key", "")),
                                  sid, t0, dur])
                else:
                    ops.append([m.group(1), m.group(2), sid, t0, dur, line.name])
    for k, t0 in starts.items():
        if k in dones:
            recvs.append([k[1], k[0], t0, dones[k]])
    ops.sort(key=lambda r: r[3])
    sends.sort(key=lambda r: r[5])
    recvs.sort(key=lambda r: r[2])
    return {"format": "dpro-tf-task-ops", "version": 1, "profile_start_ns": start_ns, "profile_stop_ns": stop_ns,
            "steps": sorted(([k, a, b] for k, (a, b) in steps.items()), key=lambda r: r[1]),
            "op_columns": TASK_OP_COLUMNS, "ops": ops, "send_columns": TASK_SEND_COLUMNS, "sends": sends,
            "recv_columns": TASK_RECV_COLUMNS, "recvs": recvs, "hostnames": list(xs.hostnames)}
