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
