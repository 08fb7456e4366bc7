"""The traced graph of the step function, as plain JSON (imports TensorFlow; runs in the job).

``tf_graph.json``: ``{"format": "dpro-tf-graph", "version": 1, "function", "ops": [...]}``,
one entry per op of the step function's graph *and of every function it calls*
(``PartitionedCall`` / ``StatefulPartitionedCall``), flattened with the names the runtime
gives inlined bodies: ``<call op name>/<inner op name>`` (TensorFlow's function inlining).
Each entry: ``name``, ``type``, ``inputs`` (data producers), ``control`` (control
predecessors), ``bytes`` (output bytes where the shape is static), ``device``, and for
collective ops ``collective``: ``{group_key, instance_key, group_size, ...}`` (``"call-time"`` for a key
fed anew at every call, as MultiWorkerMirroredStrategy does with instance keys); the placeholders that
capture a variable carry ``variable``: ``{name, bytes, trainable}``.

Edges into an inlined body: the call op's i-th input feeds the body's i-th argument;
the body's return values feed the call op's consumers. The reader joins these so that
dependencies cross function boundaries (its op ids are the runtime names).
"""
from __future__ import annotations

from typing import Any, Iterator

CALL_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
COLLECTIVE_TYPES = frozenset({"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2",
                              "CollectiveReduce", "CollectiveGather", "CollectiveBcastSend",
                              "CollectiveBcastRecv", "CollectiveReduceScatterV2", "NcclAllReduce",
                              "CollectiveReduceV3", "CollectiveAllToAllV3"})


def _body_graph(op):
    """The FuncGraph a call op runs, or None."""
    try:
        fname = op.get_attr("f").name
    except Exception:
        return None
    fn = op.graph._functions.get(fname) if hasattr(op.graph, "_functions") else None
    if fn is None:
        return None
    return getattr(fn, "graph", None) or getattr(getattr(fn, "_function", None), "graph", None)


def function_ops(graph, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every op of ``graph`` and of the functions it calls, as ``(prefix, op)``."""
    for op in graph.get_operations():
        yield prefix, op
        if op.type in CALL_TYPES and depth < 8:
            body = _body_graph(op)
            if body is not None:
                yield from function_ops(body, prefix + op.name + "/", depth + 1)


def _bytes(op) -> int:
    total = 0
    for t in op.outputs:
        try:
            n = t.shape.num_elements()
            size = t.dtype.size
        except Exception:
            continue
        if n is not None and size:
            total += int(n) * int(size)
    return total


def _static(t) -> Any:
    import tensorflow as tf
    try:
        v = tf.get_static_value(t)
    except Exception:
        return None
    return v.tolist() if v is not None and hasattr(v, "tolist") else v


def _collective(op) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for attr in ("group_key", "instance_key", "group_size", "merge_op", "final_op", "communication_hint"):
        try:
            v = op.get_attr(attr)
            info[attr] = v.decode() if isinstance(v, bytes) else v
        except Exception:
            pass
    if op.type.endswith(("V2", "V3")):  # keys are inputs: input, group_size, group_key, instance_key
        for i, key in ((1, "group_size"), (2, "group_key"), (3, "instance_key")):
            if len(op.inputs) > i and key not in info:
                info[key] = _static(op.inputs[i])
    info["bytes"] = _bytes(op)
    return info


def export(fn) -> dict[str, Any]:
    """Flattened graph of the ``tf.function`` ``fn`` (its largest traced concrete function)."""
    cfs = list(fn._list_all_concrete_functions())
    cf = max(cfs, key=lambda c: len(c.graph.get_operations()))
    ops = []
    # captured variables: the placeholder inside the graph -> the variable (name, bytes)
    var_of: dict[str, dict[str, Any]] = {}
    handles = {}
    for v in getattr(cf.graph, "variables", ()) or ():
        try:
            handles[id(v.handle)] = v
        except Exception:
            continue
    captured_value: dict[str, Any] = {}
    for ext, internal in getattr(cf.graph, "captures", ()) or ():
        try:   # captured scalars (e.g. a collective's instance key) keep their value
            if ext.dtype.is_integer and ext.shape.rank == 0:
                captured_value[internal.op.name] = int(ext.numpy())
        except Exception:
            pass
        v = handles.get(id(ext))
        if v is not None:
            n = v.shape.num_elements()
            var_of[internal.op.name] = {"name": v.name, "bytes": int(n or 0) * int(v.dtype.size),
                                        "trainable": bool(getattr(v, "trainable", True))}
    for prefix, op in function_ops(cf.graph):
        name = prefix + op.name
        entry = {"name": name, "type": op.type,
                 "inputs": [prefix + t.op.name for t in op.inputs],
                 "control": [prefix + c.name for c in op.control_inputs],
                 "bytes": _bytes(op), "device": op.device or ""}
        if op.type in COLLECTIVE_TYPES:
            entry["collective"] = _collective(op)
            for i, key in ((1, "group_size"), (2, "group_key"), (3, "instance_key")):
                if entry["collective"].get(key) is None and len(op.inputs) > i:
                    # MWMS feeds instance keys as call-time values (a new key every call): no static value
                    entry["collective"][key] = captured_value.get(op.inputs[i].op.name, "call-time")
        if not prefix and op.name in var_of:
            entry["variable"] = var_of[op.name]
        if op.type in CALL_TYPES:
            body = _body_graph(op)
            if body is not None:
                p = name + "/"
                entry["body_inputs"] = [p + t.op.name for t in body.inputs]
                entry["body_outputs"] = [p + t.op.name for t in body.outputs]
                for c in body.control_outputs:
                    entry.setdefault("body_control_outputs", []).append(p + c.name)
        ops.append(entry)
    return {"format": "dpro-tf-graph", "version": 1, "function": getattr(fn, "__name__", ""),
            "ops": ops}
