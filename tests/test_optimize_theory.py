"""dPRO Theorems 1-3 on small cases whose answers are computed by hand (arithmetic in comments)."""
from dpro_kit.optimize.search import Searcher
from dpro_kit.optimize.state import extract_base, fused_duration, initial_strategy
from dpro_kit.optimize.examples import tiny_dfg
from dpro_kit.optimize.theory import end_times, theorem1_fuse_ops, theorem2_fuse_tensors, theorem3_joint


def test_theorem1_computation_bound_closed_form():
    # t1=50, t2=400, fused 420 (saves 30 us); T1=T2=20.
    # none: p1=50, p2=450, q1=50+20=70 <= p2 (computation-bound), q2=450+20=470 -> e=470
    # op fusion: p'=420, q=420+20+20=460 -> e=460 < 470: fuse (30 saved > T1=20)
    assert theorem1_fuse_ops(0, 0, 50, 400, 420, 20, 20)
    e = end_times(0, 0, 50, 400, 420, 20, 20, 40)
    assert (e.none, e.op_fusion) == (470, 460)
    # T1=35: none q1=85, q2=470 -> 470; fused 420+35+20=475 > 470: do not fuse (30 saved < T1=35)
    assert not theorem1_fuse_ops(0, 0, 50, 400, 420, 35, 20)


def test_theorem1_communication_heavy_refuses():
    # tiny job numbers: t1=50, t2=40, fused 70, T1=T2=1020 (ring, 2 ranks, 1 MB, 10 us + 1 GB/s)
    # none: p2=90, q1=50+1020=1070, q2=1070+1020=2090; fused: 70+2040=2110 > 2090
    assert not theorem1_fuse_ops(0, 0, 50, 40, 70, 1020, 1020)


def test_theorem2_closed_form():
    # p1=0, p2=100, T1=T2=300, T12=550 (one latency of 50 saved)
    # none: q1=300, q2=max(100,300)+300=600; fused: 100+550=650 -> no (q1-p2=200 < T12-T2=250)
    assert not theorem2_fuse_tensors(0, 100, 0, 300, 300, 550)
    # p2=20: fused 20+550=570 < 600 -> yes (q1-p2=280 > 250)
    assert theorem2_fuse_tensors(0, 20, 0, 300, 300, 550)


def test_theorem3_joint_prefers_both():
    # t1=50, t2=400, tf=420, T1=T2=20, T12=30
    # none 470; op fusion 420+40=460; tensor fusion max(450, 450+30)=480; both 420+30=450
    e = end_times(0, 0, 50, 400, 420, 20, 20, 30)
    assert (e.none, e.op_fusion, e.tensor_fusion, e.both) == (470, 460, 480, 450)
    assert theorem3_joint(0, 0, 50, 400, 420, 20, 20, 30) == "both"
    # Theorem 3 property: with T12 <= T1+T2, e(both) <= e(op_fusion)
    for T12 in (10, 30, 40):
        e = end_times(0, 0, 50, 400, 420, 20, 20, T12)
        assert e.both <= e.op_fusion


def test_sync_time_by_partial_replay_matches_hand_arithmetic():
    base = extract_base(tiny_dfg())
    s = initial_strategy(base)
    S = Searcher(base)
    # ring, 2 ranks, 1 MB: 2 steps of 500 kB at 10 us + 500 us = 1020 us
    assert S.sync_time(s, ("g1",), 1) == 1020.0
    # 2 partitions of 500 kB: each 2 steps of 250 kB (260 us); 4 transfers queue on a link: 1040 us
    assert S.sync_time(s, ("g1",), 2) == 1040.0
    # fused 2 MB: 2 steps of 1 MB = 2 x 1010 = 2020 us
    assert S.sync_time(s, ("g1", "g0"), 1) == 2020.0
    assert S.best_partition(s, ("g1",)) == (1, 1020.0)


def test_fused_op_cost_model():
    base = extract_base(tiny_dfg())
    # launch overhead = 10th percentile of {100, 50, 40} x 2 ranks = 40 us
    assert base.launch_overhead_us == 40.0
    # BW1+BW2: 90 - min(40, 0.5 x 40) = 70 us
    assert fused_duration(base, [50, 40]) == 70.0
