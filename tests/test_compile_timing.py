"""Fused-op times from torch.compile: `dpro profile --shapes` on a real 2-rank job, regions rebuilt
from the recorded shapes, timed, and used by `dpro optimize` (dpro_kit/optimize/compile_timing.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import profile_ddp
from dpro_kit.optimize.compile_timing import RecordedOp, Region, RegionError, parse_concrete, time_fusions
from dpro_kit.optimize.state import extract_base, fused_duration
from dpro_kit.readers.torch_kineto import read_op_shapes
from dpro_kit.trace import load_trace


def test_parse_concrete():
    assert parse_concrete("") is None
    assert parse_concrete("False") is False and parse_concrete("True") is True
    assert parse_concrete("-100") == -100 and isinstance(parse_concrete("1"), int)
    assert parse_concrete("1.0000000000000001e-05") == pytest.approx(1e-5)
    assert parse_concrete("-inf") == float("-inf")
    assert parse_concrete("[1, 1]") == [1, 1] and parse_concrete("[]") == []
    with pytest.raises(RegionError):
        parse_concrete("[1, ")
    with pytest.raises(RegionError):
        parse_concrete("torch.float32")


def test_fused_duration_uses_measured_ratio():
    from dpro_kit.graph import build_global_dfg
    from tests.conftest import tiny_traceset
    base = extract_base(build_global_dfg(tiny_traceset()))
    model = fused_duration(base, [50.0, 40.0], ("a", "b"))
    base.fusion_ratios[("a", "b")] = 1.5
    assert fused_duration(base, [50.0, 40.0], ("a", "b")) == pytest.approx(135.0)
    assert fused_duration(base, [50.0, 40.0], ("b", "a")) == model   # another group: the model
    assert fused_duration(base, [50.0, 40.0]) == model


@pytest.fixture(scope="module")
def shapes_trace(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return profile_ddp(tmp_path_factory.mktemp("shapes") / "trace", "--shapes", steps="6:9",
                       train=["--model", "mlp", "--iters", "12", "--warmup", "2", "--threads", "1"])


@pytest.mark.slow
def test_shapes_trace_has_the_window_op_ids(shapes_trace: Path):
    ts = load_trace(shapes_trace)
    node_dir = next(shapes_trace.glob("*/0"))
    meta = json.loads((node_dir / "meta.json").read_text())
    assert meta["shapes"] == {"trace_file": "kineto_shapes.json", "step": 9}
    assert 9 not in meta["measured"]["unprofiled_steps_used"] and 10 not in meta["measured"]["unprofiled_steps_used"]
    shapes = read_op_shapes(node_dir)
    node = next(n for n, info in ts.manifest.nodes.items() if info.rank == 0)
    fw = ts.events[(ts.events["node"] == node) & (ts.events["kind"] == "FW")]
    fw_ids = set(fw["op"])
    rec_fw = {k for k, v in shapes.items() if v["kind"] == "FW"}
    assert fw_ids == rec_fw and len(fw_ids) == 7          # 4 linear + 3 relu, same ids in both traces
    assert shapes["aten::linear#0"]["Input Dims"][1] == [512, 256]   # MLP(256 -> 512): weight shape


@pytest.mark.slow
def test_region_rebuilds_the_forward_chain(shapes_trace: Path):
    import torch
    import torch.nn.functional as F
    shapes = read_op_shapes(next(shapes_trace.glob("*/0")))
    ops = ["aten::linear#0", "aten::relu#0", "aten::linear#1", "aten::relu#1"]
    region = Region([RecordedOp.from_args(o, shapes[o]) for o in ops])
    # data flow inferred: x, w0, b0, w1, b1 are inputs; relu and the 2nd linear consume earlier outputs
    assert len(region.inputs) == 5
    x, w0, b0, w1, b1 = region.inputs
    y0, r0, y1, r1 = region.function()(*region.inputs)
    ref0 = F.linear(x, w0, b0)
    assert torch.allclose(y0, ref0) and torch.allclose(r0, ref0.relu())
    assert torch.allclose(r1, F.linear(ref0.relu(), w1, b1).relu())
    # a backward op has no recorded inputs: refused with the reason
    bw = next(k for k, v in shapes.items() if v["kind"] == "BW" and v.get("Input Dims") is None)
    with pytest.raises(RegionError, match="no recorded inputs"):
        RecordedOp.from_args(bw, shapes[bw])
    t = time_fusions([tuple(ops), (ops[0], bw)], shapes, threads=1)
    ok, refused = t[tuple(ops)], t[(ops[0], bw)]
    assert ok.eager_us > 0 and ok.compiled_us > 0 and ok.ratio == pytest.approx(ok.compiled_us / ok.eager_us)
    assert refused.ratio is None and "only forward ops" in refused.reason


@pytest.mark.slow
def test_optimize_cli_reports_fusion_timing(shapes_trace: Path, tmp_path: Path):
    """`dpro optimize --fusion-timing compile` on a real trace: the plan says, per chosen group, where its
    time comes from (which groups the search chooses depends on the trace's timings)."""
    plan_path = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "optimize", str(shapes_trace), "-o", str(plan_path),
                        "--fusion-timing", "compile", "--min-gain", "0", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(plan_path.read_text())
    ft = plan["fusion_timing"]
    assert ft["mode"] == "compile"
    by_ops = {tuple(g["ops"]): g for g in ft.get("groups", [])}
    for f in plan["op_fusion_groups"]:
        g = by_ops[tuple(f["ops"])]                      # every surviving group was looked at
        assert f["source"] == g["source"]
        if f["source"] == "torch.compile":
            assert f["fused_us"] == pytest.approx(sum(f["parts_us"]) * g["ratio"])
        else:
            assert g["reason"] and "[MODEL]" in f["cost_model"]


@pytest.mark.slow
def test_timed_fusion_replaces_the_model_and_slower_groups_are_dropped(shapes_trace: Path):
    """The forward chain as a fusion group: timed, the replay uses ratio x parts, and the group is
    kept only if the replay is not slower with it."""
    from dataclasses import replace

    from dpro_kit.graph.model import op_key
    from dpro_kit.optimize.driver import time_op_fusions
    from dpro_kit.optimize.load import load_base
    from dpro_kit.session import Session
    from dpro_kit.optimize.search import SearchOptions, Searcher
    from dpro_kit.optimize.state import initial_strategy

    base, initial, _ = load_base(Session(shapes_trace))
    chain = ("aten::linear#0", "aten::relu#0", "aten::linear#1", "aten::relu#1")
    searcher = Searcher(base, SearchOptions(budget_s=30, op_fusion=False))
    result = searcher.run(initial_strategy(base, initial))
    result.strategy = replace(result.strategy, fusions=(chain,))
    with_model = searcher.evaluate(result.strategy)[0]
    without = searcher.evaluate(replace(result.strategy, fusions=()))[0]
    result.after_us = with_model
    result, info = time_op_fusions(shapes_trace, base, searcher, result, "compile", deadline=float("inf"),
                                   progress=None)
    (g,) = info["groups"]
    assert g["source"] == "torch.compile" and g["ratio"] > 0 and info["timed"] == 1
    ratio = base.fusion_ratios[chain]
    ref = base.nodes[0]
    parts = [base.local.nodes[op_key(ref, o)]["dur"] for o in chain]
    from dpro_kit.optimize.state import fused_duration
    assert fused_duration(base, parts, chain) == pytest.approx(ratio * sum(parts))
    with_measured = searcher.evaluate(replace(result.strategy, fusions=(chain,)))[0]
    if with_measured >= without:
        assert info["dropped"] == [list(chain)] and result.strategy.fusions == ()
        assert result.after_us == pytest.approx(without)
    else:
        assert info["dropped"] == [] and result.strategy.fusions == (chain,)
        assert result.after_us == pytest.approx(with_measured)
    assert result.changes[-1]["pass"] == "op_fusion_timing"


def test_compile_mode_without_shapes_is_a_clear_error(tiny_trace_dir: Path, tmp_path: Path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "optimize", str(tiny_trace_dir), "-o", str(out),
                        "--fusion-timing", "compile", "--min-gain", "0", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and not out.exists()   # 2: bad input
    assert "dpro profile --shapes" in r.stderr
