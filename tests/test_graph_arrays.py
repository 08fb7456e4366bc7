"""Array-native compile (dpro_kit/graph/arrays.py): compile_trace(ts) equals
compile_graph(build_global_dfg(ts)) array for array (keys, durations, devices, priorities, CSR,
in-degrees, iteration edges, tie-breaks), so the replay is the same op for op; on generated
torch.profiler jobs and on real HTA Kineto traces; jobs it does not cover return None."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_traces

from dpro_kit.graph.arrays import compile_trace, compile_trace_or_graph
from dpro_kit.graph.build import build_global_dfg
from dpro_kit.replay import compile_graph, replay
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
HTA = shared_traces() / "hta"
sys.path.insert(0, str(REPO / "bench"))


def assert_same_compiled(a, b):
    assert a.keys == b.keys
    assert a.devices == b.devices
    for f in ("dur", "device", "priority", "indptr", "succ", "indeg", "iter_src", "iter_dst", "tiebreak"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def check(ts):
    ref = compile_graph(build_global_dfg(ts))
    cg = compile_trace(ts)
    assert cg is not None
    assert_same_compiled(cg, ref)
    for it in (1, 2):
        r1, r2 = replay(cg, iterations=it), replay(ref, iterations=it)
        assert np.array_equal(r1.start, r2.start) and np.array_equal(r1.end, r2.end)
        assert r1.iteration_time_us == r2.iteration_time_us


@pytest.mark.parametrize("ranks,classes", [(3, None), (12, 3)])
def test_generated_jobs(tmp_path, ranks, classes):
    import scale
    scale.write_job(tmp_path / "job", ranks, layers=6, buckets=3, steps=2, classes=classes)
    check(load_trace(tmp_path / "job"))


@pytest.mark.skipif(not HTA.is_dir(), reason="shared/traces/hta not present")
@pytest.mark.parametrize("files", [("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"),
                                   ("nccl_2rank_rank0.json.gz",), ("allgather_reducescatter_16rank_rank0.json.gz",)],
                         ids=["sampled128", "nccl2", "allgather16"])
def test_real_kineto(tmp_path, files):
    for f in files:
        shutil.copy(HTA / f, tmp_path / f)
    check(load_trace(tmp_path))


def test_not_covered_falls_back():
    ts = load_trace(REPO / "examples" / "traces" / "ddp-2host-1000mbit")    # dpro's ring topology
    assert compile_trace(ts) is None
    cg, how = compile_trace_or_graph(ts)
    assert how == "networkx"
    assert_same_compiled(cg, compile_graph(build_global_dfg(ts)))
