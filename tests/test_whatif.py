"""What-if transforms: DDP re-bucketing (checked against PyTorch's own assignment), world size, bandwidth."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.graph import build_global_dfg
from dpro_kit.replay import replay
from dpro_kit.trace import load_trace
from dpro_kit.whatif import WhatIf, apply, ddp_bucket_assignment, rebucket, scale_world, with_bandwidth

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"


@pytest.mark.parametrize("seed", range(20))
def test_bucket_assignment_matches_pytorch(seed):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    rng = random.Random(seed)
    numels = [rng.choice([1, 10, 512, 4096, 65536, 262144, 1 << 20]) for _ in range(rng.randint(1, 30))]
    cap, first = rng.choice([64 << 10, 256 << 10, 1 << 20, 25 << 20]), rng.choice([256 << 10, 1 << 20])
    ours = ddp_bucket_assignment([4 * n for n in numels], cap, first)
    theirs, _ = dist._compute_bucket_assignment_by_size([torch.empty(n) for n in numels], [first, cap])
    assert ours == [list(b) for b in theirs]


def test_rebucket_reproduces_the_recorded_buckets():
    ts = load_trace(FIXTURE)
    cap = ts.manifest.extra["ddp"]["bucket_cap_bytes"]
    again = rebucket(ts, cap)
    assert [(c.params, c.bytes) for c in again.collectives] == [(c.params, c.bytes) for c in ts.collectives]
    # the same graph, so the same prediction
    a = replay(build_global_dfg(ts)).iteration_time_us
    b = replay(build_global_dfg(again)).iteration_time_us
    assert b == pytest.approx(a, rel=1e-9)


def test_rebucket_sizes_and_inputs():
    ts = load_trace(FIXTURE)
    total = sum(c.bytes for c in ts.collectives)
    one = rebucket(ts, 100 << 20, first_bucket_bytes=100 << 20)
    assert len(one.collectives) == 1 and one.collectives[0].bytes == total
    per_tensor = rebucket(ts, 1, first_bucket_bytes=1)
    assert len(per_tensor.collectives) == sum(len(c.params) for c in ts.collectives)
    # a bucket waits for every gradient up to its own (DDP launches buckets in order)
    node = ts.manifest.workers()[0]
    last = per_tensor.collectives[-1]
    assert set(last.inputs[node]) == {op for c in ts.collectives for op in c.param_ready[node]}
    g = build_global_dfg(per_tensor)
    assert replay(g).iteration_time_us > 0


def test_scale_world_re_forms_the_ring():
    ts = load_trace(FIXTURE)
    big = scale_world(ts, 4)
    assert big.manifest.world_size == 4 and len(big.manifest.workers()) == 4
    assert len({i.host for i in big.manifest.nodes.values()}) == 1  # profiled on one machine: stays on one
    g = build_global_dfg(big, comm_model=CommModel(LinkModel(10.0, 1e9)))
    sends = [k for k, d in g.nodes(data=True) if d["kind"] == "SEND"]
    assert len(sends) == len(ts.collectives) * 4 * 2 * (4 - 1)
    assert "measured_iteration_ms" not in big.manifest.extra


def test_bandwidth_whatif_slows_comm_bound_jobs():
    ts = load_trace(FIXTURE)
    model = CommModel(LinkModel(20.0, 1e9))
    slow = with_bandwidth(model, 100)
    assert slow.default.bandwidth_Bps == pytest.approx(100e6 / 8 * 1448 / 1514)
    t_fast = replay(build_global_dfg(ts, comm_model=model)).iteration_time_us
    t_slow = replay(build_global_dfg(ts, comm_model=slow)).iteration_time_us
    # 2.6 MB of gradients over a 100 Mbit/s ring of 2: at least 2.6e6 * 8 / 95.6e6 s of transfers
    assert t_slow - t_fast > 0.9 * sum(c.bytes for c in ts.collectives) * 8 / (100e6 * 1448 / 1514) * 1e6


def test_apply_combines_and_cli_reports(tiny_trace_dir):
    ts = load_trace(tiny_trace_dir)
    ts2, m2 = apply(ts, CommModel(), WhatIf(world_size=3, bandwidth_mbps=200))
    assert ts2.manifest.world_size == 3 and m2.default.bandwidth_Bps < CommModel().default.bandwidth_Bps
    with pytest.raises(Exception, match="per-parameter"):
        rebucket(ts, 1 << 20)  # the hand-built trace has no per-parameter info: a clear error
