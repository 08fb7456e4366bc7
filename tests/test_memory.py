"""Memory over the iteration: `dpro profile --memory` on a real 2-rank DDP job, reader, round trip, report."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import profile_ddp
from dpro_kit.report.data import memory as report_memory
from dpro_kit.trace import load_trace, save_trace


@pytest.fixture(scope="module")
def mem_trace(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return profile_ddp(tmp_path_factory.mktemp("mem") / "trace", "--memory", steps="8:11",
                       train=["--model", "mlp", "--iters", "14", "--warmup", "2"])


@pytest.mark.slow
def test_profile_memory_records_allocator_samples(mem_trace: Path, tmp_path: Path):
    ts = load_trace(mem_trace)
    m = ts.memory
    assert set(m["node"]) == set(ts.manifest.workers())
    assert set(m["iteration"]) <= set(ts.manifest.iterations) and len(set(m["iteration"])) >= 2
    assert (m["bytes"] >= 0).all() and m["bytes"].max() > 0
    # samples lie inside the profiled iterations of their node
    for (node, it), g in m.groupby(["node", "iteration"]):
        ev = ts.events[(ts.events["node"] == node) & (ts.events["iteration"] == it)]
        assert g["time"].min() >= ev["start"].min() - 1e3 and g["time"].max() <= (ev["start"] + ev["dur"]).max() + 1e3
    # native round trip keeps them
    again = load_trace(save_trace(ts, tmp_path / "copy"))
    assert again.memory.reset_index(drop=True).equals(m.reset_index(drop=True))
    # and the report plots them
    view = report_memory(ts)
    assert view["available"] and set(view["series"]) == set(ts.manifest.workers())
    # the collector records the optimizer's state size (SGD with momentum: one buffer per parameter)
    opt = ts.manifest.extra["optimizer"]
    params = sum(b for c in ts.collectives for b in c.param_bytes)
    assert opt["class"] == "SGD" and opt["state_bytes"] == params > 0


def test_report_says_not_available_without_memory(tiny_trace_dir: Path):
    view = report_memory(load_trace(tiny_trace_dir))
    assert not view["available"] and "--memory" in view["reason"]


@pytest.mark.slow
def test_apply_offsets_moves_memory_samples_with_their_node(mem_trace: Path):
    """align.apply_offsets shifts each node's allocator samples by its clock offset, as its events
    (it used to drop them: the aligned TraceSet had no memory)."""
    from dpro_kit.align import apply_offsets

    ts = load_trace(mem_trace)
    a, b = ts.manifest.workers()
    out = apply_offsets(ts, {b: 1234.5})
    assert len(out.memory) == len(ts.memory) > 0
    for node, off in ((a, 0.0), (b, 1234.5)):
        before, after = ts.memory[ts.memory["node"] == node], out.memory[out.memory["node"] == node]
        assert len(before) > 0
        assert (after["time"].to_numpy() == before["time"].to_numpy() - off).all()
        assert (after["bytes"].to_numpy() == before["bytes"].to_numpy()).all()
        ev0, ev1 = ts.events[ts.events["node"] == node], out.events[out.events["node"] == node]
        # samples keep their place relative to their node's events
        assert ((after["time"] - ev1["start"].min()).to_numpy() ==
                pytest.approx((before["time"] - ev0["start"].min()).to_numpy()))
    assert ts.memory["time"].equals(load_trace(mem_trace).memory["time"])   # the input is not modified
