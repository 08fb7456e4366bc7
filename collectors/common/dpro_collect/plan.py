"""``plan.json``: the format ``dpro optimize`` writes and ``dpro_torch.plan`` applies (standard library only).

:data:`PLAN_SCHEMA` is a JSON Schema (draft 2020-12); :func:`validate_plan` checks a document
against its type, const, required, properties and items keywords and raises a one-line
:class:`~dpro_collect.errors.DproError` at the first mismatch.  :mod:`dpro_kit.optimize.plan`
(which builds plans) re-exports both, so writer and reader share one definition.
"""
from __future__ import annotations

from typing import Any

from .errors import DproError

__all__ = ["PLAN_FORMAT", "PLAN_SCHEMA", "PLAN_VERSION", "validate_plan"]

PLAN_FORMAT = "dpro-plan"
PLAN_VERSION = 1

_num = {"type": "number"}
_int = {"type": "integer"}
_str = {"type": "string"}
_strs = {"type": "array", "items": _str}

#: JSON Schema (draft 2020-12 subset: type, required, properties, items) of plan.json
PLAN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "dpro optimize plan", "type": "object",
    "required": ["format", "version", "predicted", "strategies", "tensor_groups", "op_fusion_groups", "memory",
                 "frameworks", "search", "estimated"],
    "properties": {
        "format": {"type": "string", "const": PLAN_FORMAT}, "version": _int, "trace": _str,
        "whatif": {"type": "object"},
        "predicted": {"type": "object", "required": ["before_ms", "after_ms", "speedup"],
                      "properties": {"before_ms": _num, "after_ms": _num, "speedup": _num}},
        "strategies": {"type": "array", "items": {
            "type": "object", "required": ["pass", "args", "reason", "predicted_before_ms", "predicted_after_ms"],
            "properties": {"pass": _str, "args": {"type": "object"}, "reason": _str,
                           "predicted_before_ms": _num, "predicted_after_ms": _num}}},
        "tensor_groups": {"type": "array", "items": {
            "type": "object", "required": ["name", "tensors", "params", "bytes", "partitions", "partition_bytes"],
            "properties": {"name": _str, "tensors": _strs, "params": _strs, "bytes": _int, "partitions": _int,
                           "partition_bytes": {"type": "array", "items": _int}}}},
        "op_fusion_groups": {"type": "array", "items": {
            "type": "object", "required": ["ops", "fused_us", "parts_us", "source"],
            "properties": {"ops": _strs, "fused_us": _num, "parts_us": {"type": "array", "items": _num},
                           "source": {"enum": ["model", "torch.compile"]}}}},
        "memory": {"type": "object", "required": ["choices", "estimate_before", "estimate_after"],
                   "properties": {"choices": {"type": "object"}, "estimate_before": {"type": "object"},
                                  "estimate_after": {"type": "object"}}},
        "frameworks": {"type": "object", "required": ["pytorch_ddp", "horovod", "byteps", "xla", "torch_compile"],
                       "properties": {
                           "pytorch_ddp": {"type": "object", "required": ["bucket_cap_mb", "bucket_plan", "exact"],
                                           "properties": {"bucket_cap_mb": _num, "exact": {"type": "boolean"},
                                                          "bucket_plan": {"type": "array", "items": _strs}}},
                           "horovod": {"type": "object",
                                       "required": ["HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"],
                                       "properties": {"HOROVOD_FUSION_THRESHOLD": _int, "HOROVOD_CYCLE_TIME": _num}},
                           "byteps": {"type": "object", "required": ["BYTEPS_PARTITION_BYTES"],
                                      "properties": {"BYTEPS_PARTITION_BYTES": _int}},
                           "xla": {"type": "object"}, "torch_compile": {"type": "object"}}},
        "search": {"type": "object"},
        "estimated": _strs,
        # optional: TicTac orders of a parameter-server job's transfers (dpro_kit.optimize.tictac.plan_section)
        "schedule": {"type": "object", "required": ["recommended", "predicted", "orders"],
                     "properties": {"recommended": {"enum": ["default", "tic", "tac"]},
                                    "predicted": {"type": "object"},
                                    "orders": {"type": "object", "properties": {o: {"type": "object"} for o in
                                                                                 ("tic", "tac", "random")}}}},
        # optional: DeFT per-bucket delays and links accepted by the Preserver's loop on real training
        # (dpro_kit.optimize.deft.plan_section; bench/deft_ab.py --preserver-loop)
        "deft": {"type": "object", "required": ["delays", "links", "rates_mbit", "run", "preserver"],
                 "properties": {"delays": {"type": "object"}, "links": {"type": "object"},
                                "rates_mbit": {"type": "array", "items": _num}, "run": _strs,
                                "preserver": {"type": "object", "required": ["eps", "tries"],
                                              "properties": {"eps": _num, "tries": {"type": "array"}}}}},
    },
}

_TYPES = {"object": dict, "array": list, "string": str, "number": (int, float), "integer": int, "boolean": bool}


def validate_plan(doc: Any, schema: dict[str, Any] | None = None, where: str = "plan") -> None:
    """Check ``doc`` against :data:`PLAN_SCHEMA` (the subset it uses); raise DproError at the first mismatch.

    Parameters
    ----------
    doc : any
        The parsed ``plan.json``.
    schema : dict, optional
        The (sub)schema to check against (default :data:`PLAN_SCHEMA`; the recursion passes parts of it).
    where : str
        The record named in the error (``plan.tensor_groups[2].params``).
    """
    schema = PLAN_SCHEMA if schema is None else schema
    t = schema.get("type")
    if t:
        ok = isinstance(doc, _TYPES[t]) and not (t in ("number", "integer") and isinstance(doc, bool))
        if not ok:
            raise DproError(f"{where}: expected {t}, got {type(doc).__name__}")
    if "const" in schema and doc != schema["const"]:
        raise DproError(f"{where}: expected {schema['const']!r}")
    if isinstance(doc, dict):
        for k in schema.get("required", []):
            if k not in doc:
                raise DproError(f"{where}: missing {k!r}")
        for k, sub in schema.get("properties", {}).items():
            if k in doc:
                validate_plan(doc[k], sub, f"{where}.{k}")
    if isinstance(doc, list) and "items" in schema:
        for i, x in enumerate(doc):
            validate_plan(x, schema["items"], f"{where}[{i}]")
