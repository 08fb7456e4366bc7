"""Kind predicates on OpKind: one definition of compute / comm / layer / topology, used everywhere."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from dpro_kit.graph import build_global_dfg
from dpro_kit.job import Job
from dpro_kit.trace import COMM_KINDS, COMPUTE_KINDS, LAYER_KINDS, TOPOLOGY_KINDS, OpKind, load_trace

ROOT = Path(__file__).resolve().parents[1]


def test_every_kind_is_compute_comm_or_virtual_exactly_once():
    for k in OpKind:
        assert [k.is_compute, k.is_comm, k is OpKind.VIRTUAL].count(True) == 1, k
        assert (k in COMPUTE_KINDS) == k.is_compute and (k.value in COMM_KINDS) == k.is_comm
    assert {k for k in OpKind if k.is_layer} == {OpKind.FW, OpKind.BW} and LAYER_KINDS <= COMPUTE_KINDS
    assert {k for k in OpKind if k.is_topology} == {OpKind.SEND, OpKind.RECV, OpKind.AGG}
    assert TOPOLOGY_KINDS <= COMM_KINDS | COMPUTE_KINDS


def test_no_module_keeps_its_own_copy_of_a_kind_set():
    """A set literal, or a tuple/list used as one (``x in (..)``, ``isin([..])``), of kind names
    equal to one of the predicate sets is a second definition (as job.COMPUTE_KINDS = {FW, BW} was beside trace.COMPUTE_KINDS); use the predicates."""
    names = {k.value for k in OpKind}
    attrs = {f"OpKind.{k.name}.value" for k in OpKind} | {f"OpKind.{k.name}" for k in OpKind}
    defined = {frozenset(s) for s in (COMPUTE_KINDS, COMM_KINDS, LAYER_KINDS, TOPOLOGY_KINDS)}
    found = []
    for path in (ROOT / "dpro_kit").rglob("*.py"):
        if path.name == "trace.py" and path.parent.name == "dpro_kit":
            continue
        tree = ast.parse(path.read_text())
        cands = [n for n in ast.walk(tree) if isinstance(n, ast.Set)]          # {..} literals
        cands += [c for n in ast.walk(tree) if isinstance(n, ast.Compare)       # x in (..)
                  and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops) for c in n.comparators]
        cands += [a for n in ast.walk(tree) if isinstance(n, ast.Call)          # frozenset([..]), .isin([..])
                  and ast.unparse(n.func).split(".")[-1] in ("set", "frozenset", "isin") for a in n.args]
        for node in cands:
            if not isinstance(node, (ast.Set, ast.Tuple, ast.List)) or len(node.elts) < 2:
                continue
            vals = set()
            for e in node.elts:
                if isinstance(e, ast.Constant) and e.value in names:
                    vals.add(e.value)
                elif ast.unparse(e) in attrs:
                    vals.add(ast.unparse(e).split(".")[1])
                else:
                    break
            else:
                if frozenset(vals) in defined:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(vals)}")
    assert not found, found


def test_layer_ops_of_a_real_trace_are_its_forward_and_backward_ops():
    """On the recorded DDP trace: the fused-op launch cost reads only FW/BW ops, and every
    vertex of the built graph is compute, comm or an In/Out/STEP_END marker."""
    ts = load_trace(ROOT / "examples" / "traces" / "ddp-2rank-gloo")
    g = build_global_dfg(ts)
    kinds = {OpKind(d["kind"]) for _, d in g.nodes(data=True)}
    assert {OpKind.FW, OpKind.BW, OpKind.UPDATE, OpKind.SEND, OpKind.VIRTUAL} <= kinds
    for _, d in g.nodes(data=True):
        k = OpKind(d["kind"])
        assert k.is_compute or k.is_comm or k is OpKind.VIRTUAL
    job = Job.from_trace(ts)
    layer = sorted(d["dur"] for _, d in job.local.nodes(data=True) if OpKind(d["kind"]).is_layer and d["dur"] > 0)
    assert layer and job.launch_overhead_us == np.percentile(layer, 10)
