"""Reader for the TensorFlow collector's node folders (``raw_format: tf-xplane``).

A node folder (``collectors/tf``, written inside the profiled process) holds:

* ``meta.json``     task, cluster, window, clock readings (format ``dpro-tf-meta``);
* ``tf_ops.json``   op executions converted from the profiler's XSpace: ``[name, type, step,
  start_ns, dur_ns, thread]`` rows (wall-clock ns; ``step`` = the collector's step marker);
* ``tf_graph.json`` the step function's traced graph, functions flattened with the runtime's
  inlined names (``<call op>/<inner op>``): inputs, control inputs, output bytes, collective keys.

What this reader decides, and from what (never from a downstream guess):

* kind: collective ops (``CollectiveReduceV2`` ... by op *type*) -> ``COMM`` on stream
  ``comm``; ops that write a variable (``AssignSubVariableOp``, ``ResourceApply*`` ...) and the
  ops that only feed them -> ``UPDATE``; ops TensorFlow's autodiff created (under the
  ``gradient_tape/`` name scope that ``tf.GradientTape`` gives every gradient op) -> ``BW``;
  ops that are not in the step function's graph (``tf.data``'s threads) -> ``IO`` on stream
  ``io``; the rest -> ``FW``.
* op ids: the runtime node name; a node that ran k > 1 times in one step (loops) gets
  ``name#1`` ... for the later runs.
* edges: the graph's data and control edges, joined across function calls (a call op's i-th
  input feeds its body's i-th argument, the body's outputs feed the call op); ops that did not
  run (placeholders, call ops, fused-away nodes) are contracted by the graph builder.
* collectives: one ``allreduce``/``ring`` collective per collective op (tensor = the op's name,
  identical on every worker; bytes from the traced shape; ``inputs``/``outputs`` = the nearest
  ops that ran before/after it in the graph; ``group_key``/``instance_key`` kept).
"""
from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..schema import TF_META_FORMAT, TF_META_VERSIONS, TF_RAW_FORMAT
from ..trace import Manifest, NodeTrace, OpKind, make_events, read_json

FORMAT = TF_RAW_FORMAT
STEP_BEGIN, STEP_END = "dpro/step_launch", "dpro/step_return"
__all__ = ["FORMAT", "read_node", "classify"]

COLLECTIVE_TYPES = frozenset({"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2",
                              "CollectiveReduce", "CollectiveGather", "CollectiveReduceScatterV2",
                              "NcclAllReduce", "CollectiveReduceV3", "CollectiveAllToAllV3"})
_UPDATE_TYPES = frozenset({"AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp",
                           "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate"})


def _writes_variable(op_type: str) -> bool:
    return op_type in _UPDATE_TYPES or op_type.startswith(("ResourceApply", "ResourceSparseApply"))


def _load(node_dir: Path, name: str, fmt: str) -> dict[str, Any]:
    path = node_dir / name
    doc = read_json(path, what=f"TensorFlow collector file {name}")
    if not isinstance(doc, dict) or doc.get("format") != fmt or doc.get("version") != 1:
        raise TraceFormatError(f"not a {fmt} version 1 file", path=path,
                               hint="re-collect with `dpro profile --framework tensorflow`")
    return doc


def _graph(gdoc: dict[str, Any], path: Path) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    ops, edges = {}, []
    for i, o in enumerate(gdoc.get("ops") or []):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) or not isinstance(o.get("type"), str):
            raise TraceFormatError("graph op needs a string name and type", path=path, record=f"ops[{i}]")
        ops[o["name"]] = o
    for o in ops.values():
        for src in list(o.get("inputs") or []) + list(o.get("control") or []):
            edges.append((src, o["name"]))
        for src, dst in zip(o.get("inputs") or [], o.get("body_inputs") or []):
            edges.append((src, dst))
        for src in list(o.get("body_outputs") or []) + list(o.get("body_control_outputs") or []):
            edges.append((src, o["name"]))
    return ops, edges


def classify(graph_ops: dict[str, dict], succ: dict[str, list[str]]) -> dict[str, OpKind]:
    """Kind of every graph op (see the module docstring), UPDATE propagated backwards to the ops
    whose every successor is an UPDATE op."""
    kinds: dict[str, OpKind] = {}
    for name, o in graph_ops.items():
        t = o["type"]
        if t in COLLECTIVE_TYPES:
            kinds[name] = OpKind.COMM
        elif _writes_variable(t):
            kinds[name] = OpKind.UPDATE
        elif "gradient_tape/" in name:
            kinds[name] = OpKind.BW
        else:
            kinds[name] = OpKind.FW
    changed = True
    while changed:  # feeders of updates only (learning rate, momentum arithmetic) are UPDATE too
        changed = False
        for name, k in kinds.items():
            if k != OpKind.FW:
                continue
            outs = [s for s in succ.get(name, ()) if s in kinds]
            if outs and all(kinds[s] == OpKind.UPDATE for s in outs):
                kinds[name] = OpKind.UPDATE
                changed = True
    return kinds


def _nearest(start: str, nbrs: dict[str, list[str]], ran: set[str]) -> list[str]:
    """The ops that ran nearest to ``start`` along ``nbrs`` (walking through ops that did not run)."""
    out, seen, todo = [], {start}, deque(nbrs.get(start, ()))
    while todo:
        n = todo.popleft()
        if n in seen:
            continue
        seen.add(n)
        if n in ran:
            out.append(n)
        else:
            todo.extend(nbrs.get(n, ()))
    return sorted(out)


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One task's events, local edges and collectives (see the module docstring)."""
    node_dir = Path(node_dir)
    meta = read_json(node_dir / "meta.json", what="collector meta file")
    if not isinstance(meta, dict) or meta.get("format") != TF_META_FORMAT or meta.get("version") not in TF_META_VERSIONS:
        raise TraceFormatError(f"not a {TF_META_FORMAT} meta.json of version {list(TF_META_VERSIONS)}",
                               path=node_dir / "meta.json",
                               hint="re-collect with `dpro profile --framework tensorflow`")
    if meta.get("strategy") == "ps":     # ParameterServerStrategy, traced by the coordinator
        from .tf_ps import read_node as read_ps_node
        return read_ps_node(manifest, node, node_dir)
    odoc = _load(node_dir, "tf_ops.json", "dpro-tf-ops")
    gdoc = _load(node_dir, "tf_graph.json", "dpro-tf-graph")
    gops, gedges = _graph(gdoc, node_dir / "tf_graph.json")
    succ, pred = defaultdict(list), defaultdict(list)
    for a, b in gedges:
        succ[a].append(b)
        pred[b].append(a)
    kinds = classify(gops, succ)
    cols = odoc.get("columns")
    if cols != ["name", "type", "step", "start_ns", "dur_ns", "thread"]:
        raise TraceFormatError(f"unexpected columns {cols!r}", path=node_dir / "tf_ops.json")
    wanted = set(manifest.iterations) if manifest.iterations else None
    # TF runs ready ops on an inter-op thread pool: each executor thread is a compute stream of its
    # own (the busiest is "compute"), so the replay keeps the parallelism the profile showed
    busy: dict[str, int] = defaultdict(int)
    for r in odoc.get("ops") or []:
        if isinstance(r, list) and len(r) == 6 and r[0] in gops:
            busy[str(r[5])] += 1
    stream_of = {t: ("compute" if i == 0 else f"compute{i}")
                 for i, t in enumerate(sorted(busy, key=lambda t: (-busy[t], t)))}
    rows, seen = [], defaultdict(int)
    for i, r in enumerate(odoc.get("ops") or []):
        try:
            name, typ, step, t0, dur, _thread = r
            step, t0, dur = int(step), int(t0), int(dur)
        except (TypeError, ValueError):
            raise TraceFormatError("op row must be [name, type, step, start_ns, dur_ns, thread]",
                                   path=node_dir / "tf_ops.json", record=f"ops[{i}]") from None
        if dur < 0:
            raise TraceFormatError(f"negative duration {dur}", path=node_dir / "tf_ops.json", record=f"ops[{i}]")
        if wanted is not None and step not in wanted:
            continue
        k = seen[(step, name)]
        seen[(step, name)] += 1
        op_id = name if k == 0 else f"{name}#{k}"
        kind = kinds.get(name, OpKind.IO)
        row = {"op": op_id, "name": f"{name}:{typ}", "kind": kind.value, "iteration": step,
               "start": t0 / 1e3, "dur": dur / 1e3,
               "stream": "comm" if kind == OpKind.COMM else ("io" if name not in gops
                                                              else stream_of.get(str(_thread), "compute"))}
        if kind == OpKind.COMM:
            row["tensor"] = name
            row["bytes"] = int((gops[name].get("collective") or {}).get("bytes") or gops[name].get("bytes") or 0)
        rows.append(row)
    # the step's time outside its ops: the function call's launch before the first op and its
    # return after the last one (measured per step from the collector's step marker)
    first, last = {}, {}
    for r in rows:
        it = r["iteration"]
        first[it] = min(first.get(it, r["start"]), r["start"])
        last[it] = max(last.get(it, r["start"] + r["dur"]), r["start"] + r["dur"])
    for m in odoc.get("steps") or []:
        num, a, b = int(m[0]), m[1] / 1e3, m[2] / 1e3
        if num in first:
            rows.append({"op": STEP_BEGIN, "name": "step launch (marker start .. first op)", "kind": "OTHER",
                         "iteration": num, "start": a, "dur": max(0.0, first[num] - a)})
            rows.append({"op": STEP_END, "name": "step return (last op .. marker end)", "kind": "OTHER",
                         "iteration": num, "start": last[num], "dur": max(0.0, b - last[num])})
    if not rows:
        raise TraceFormatError(f"no op of the profiled steps {sorted(wanted or [])}", path=node_dir / "tf_ops.json",
                               hint="the window recorded nothing: profile more steps (--steps) or check the job ran")
    events = make_events(rows, path=str(node_dir / "tf_ops.json"))
    ran = set(events["op"])
    colls = []
    for name, o in gops.items():
        if kinds[name] != OpKind.COMM or name not in ran:
            continue
        info = o.get("collective") or {}
        colls.append({"tensor": name, "op": "allreduce", "algorithm": "ring",
                      "bytes": int(info.get("bytes") or o.get("bytes") or 0),
                      "params": [], "inputs": _nearest(name, pred, ran - {name}),
                      "outputs": _nearest(name, succ, ran - {name}),
                      "group_key": info.get("group_key"), "instance_key": info.get("instance_key")})
    edges = [(a, b) for a, b in gedges if kinds.get(a) != OpKind.COMM and kinds.get(b) != OpKind.COMM]
    if STEP_BEGIN in ran:
        for op in ran - {STEP_BEGIN, STEP_END}:
            edges.append((STEP_BEGIN, op))
            edges.append((op, STEP_END))
    return NodeTrace(events=events, edges=edges, collectives=colls)


def discover(trace_dir: Path) -> Manifest | None:
    """The manifest of a folder of dpro_tf ``meta.json`` without ``manifest.json`` (built in memory)."""
    from ..collectors import import_collector
    from ..errors import DproError
    try:
        manifest = import_collector("tensorflow", "manifest")   # stdlib-only module of the collector
    except ImportError:
        return None
    doc, err = manifest.manifest_from_dir(trace_dir)
    if doc is None and err is None:
        return None
    if err:
        raise DproError(err, path=trace_dir)
    return Manifest.from_json(doc, path=str(Path(trace_dir) / "manifest.json (built from meta.json)"))
