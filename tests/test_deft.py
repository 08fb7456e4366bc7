"""DeFT (seed 002) solver: knapsacks, the greedy multi-knapsack vs brute force, Algorithm 1, the four cases.

Every expected value below is hand-computed (the reasoning is in the comments);
the last tests read a real recorded DDP trace (examples/traces/ddp-2rank-gloo)
and check structural identities of the bucket times, not numbers copied from a run.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpro_kit.optimize import deft
from dpro_kit.optimize.deft import Bucket, BucketTimes, Item

REPO = Path(__file__).resolve().parents[1]


def times(comm, backward, forward_total, backward_total=None):
    bs = [Bucket(name=f"b{i}", bytes=0, backward_us=b, forward_us=0.0, comm_us=c)
          for i, (c, b) in enumerate(zip(comm, backward))]
    return BucketTimes(node="w", buckets=bs, forward_us=forward_total,
                       backward_us=sum(backward) if backward_total is None else backward_total)


# ----------------------------------------------------------------- knapsacks (hand-computed)

def test_knapsack_exact_subset_sum():
    # {6,5,5} into 10: 5+5 = 10 beats 6 (6+5 = 11 > 10)
    assert deft.knapsack([6, 5, 5], 10) == [1, 2]
    # {3,4,5} into 8: 3+5 = 8 (3+4 = 7, 4+5 = 9 > 8)
    assert deft.knapsack([3, 4, 5], 8) == [0, 2]
    # nothing fits
    assert deft.knapsack([7, 9], 5) == []
    # ties keep the lexicographically smallest index set: {4} or {4}: item 0
    assert deft.knapsack([4, 4], 5) == [0]
    with pytest.raises(ValueError):
        deft.knapsack([-1], 3)


def test_greedy_multi_knapsack_optimal_case():
    # capacities 5 and 4, items 4, 3, 2 (hand): the greedy fills the smaller knapsack (4) first with
    # the longest item that fits (4), then knapsack 5 with 3 and 2: everything placed, 9 = optimum
    w, caps = [4, 3, 2], [5, 4]
    g = deft.greedy_multi_knapsack(w, caps)
    assert g == [1, 0, 0]
    e = deft.exact_multi_knapsack(w, caps)
    assert sum(x for x, j in zip(w, g) if j >= 0) == sum(x for x, j in zip(w, e) if j >= 0) == 9


def test_greedy_multi_knapsack_suboptimal_case():
    # capacities 4 and 6, items 3, 3, 2, 2, 2 (hand): greedy puts 3 into the 4-knapsack (1 left,
    # nothing fits), then 3 + 2 into the 6-knapsack (1 left): 8.  Optimum: 2+2 | 3+3 = 10 (= both full).
    w, caps = [3, 3, 2, 2, 2], [4, 6]
    g = deft.greedy_multi_knapsack(w, caps)
    assert g == [0, 1, 1, -1, -1]
    assert sum(x for x, j in zip(w, g) if j >= 0) == 8
    e = deft.exact_multi_knapsack(w, caps)
    assert sum(x for x, j in zip(w, e) if j >= 0) == 10
    # one knapsack: the greedy is not optimal either ({6,5,5} into 10: greedy 6, exact 10)
    assert deft.greedy_multi_knapsack([6, 5, 5], [10]) == [0, -1, -1]
    assert deft.multi_knapsack([6, 5, 5], [10]) == [-1, 0, 0]   # one link: the exact DP


def test_exact_multi_knapsack_refuses_large():
    with pytest.raises(ValueError):
        deft.exact_multi_knapsack([1.0] * 20, [5.0, 5.0])


def test_recursive_knapsack_tie_prefers_later_bucket():
    # items 3, 3 (first-ready first), backward 1 each, capacity 4: order1 = {item 0} (3);
    # order2 drops item 0, capacity 4 - 1 = 3: {item 1} (3).  Tie -> order2.
    assert deft.recursive_knapsack([3, 3], [1, 1], [4]) == [-1, 0]
    # capacity 3: order2's capacity is 2, nothing fits (0 < 3) -> order1
    assert deft.recursive_knapsack([3, 3], [1, 1], [3]) == [0, -1]


def test_recursive_knapsack_greedy_beaten_by_recursion():
    # two links (capacities 10 and 0, speeds 1): greedy on {6,5,5} places 6 only; dropping the
    # first bucket (backward 0, capacities unchanged) places 5 + 5 = 10 on link 0 -> order2 wins
    assert deft.recursive_knapsack([6, 5, 5], [0, 0, 0], [10, 0], [1, 1]) == [-1, 0, 0]


def test_partition_counts_and_parts():
    t = times([10.0, 3.0], [2.0, 2.0], forward_total=6.0)          # stages 6 and 4
    # smallest knapsack: min(6, 4) * 0.5 (slow link) = 2 -> ceil(10/2) = 5 parts, ceil(3/2) = 2
    assert deft.partition_counts(t, [1.0, 0.5]) == {"b0": 5, "b1": 2}
    p = deft.partitioned(t, {"b0": 5, "b1": 2})
    assert [b.name for b in p.buckets] == ["b0.p0", "b0.p1", "b0.p2", "b0.p3", "b0.p4", "b1.p0", "b1.p1"]
    assert [b.comm_us for b in p.buckets] == [2.0] * 5 + [1.5, 1.5]
    assert [b.backward_us for b in p.buckets] == [2.0, 0, 0, 0, 0, 2.0, 0]


# ----------------------------------------------------------------- the two-stage schedule (hand-computed)

def _placed(stage):
    return [(i.bucket, i.iterations, j) for i, j in stage.placed]


def test_schedule_two_buckets_delay_one():
    # buckets A, B: comm 4 each, backward 2 each; forward stage 4, backward stage 4 (CR = 8/8 = 1).
    # it 0, Case 4: Algorithm 1 on [A, B] cap 4: order1 = {A}; order2 drops A (cap 4-2 = 2): nothing.
    #   -> A0 synced in backward, B0 left in the current queue.
    # it 1, Case 1: B0 in the forward stage; Case 4 again: A1; update of iteration 0.
    # queue state after it 1 = after it 0 (B of the last iteration pending) -> period 1 from it 1.
    s = deft.schedule(times([4, 4], [2, 2], 4), iterations=10)
    assert _placed(s.steps[0].backward) == [(0, (0,), 0)] and s.steps[0].backward.case == 4
    assert s.steps[0].updates == []
    assert _placed(s.steps[1].forward) == [(1, (0,), 0)] and s.steps[1].forward.case == 1
    assert _placed(s.steps[1].backward) == [(0, (1,), 0)]
    assert s.steps[1].updates == [(0,)]
    assert (s.period_start, s.period) == (1, 1)
    assert s.update_frequency == 1.0 and s.batch_sequence() == [1]
    assert s.delays() == {"b0": 0.0, "b1": 1.0}
    assert s.link_load_us() == [8.0]


def test_schedule_four_cases_merged_updates():
    # three buckets of comm 3, backward 1 each; forward stage 3, backward stage 3: CR = 9/6 = 1.5.
    # it0 Case 4: A0 (order2: cap 2 holds nothing) | cur [B0 C0]
    # it1 fwd B0 | Case 3: C0 fits (3 <= 3), new -> future, room 0 -> nothing | cur [A1 B1 C1]; update (0,)
    # it2 fwd A1 | Case 2: [B1 C1] does not fit 3: B1; new A2 B2 C2 -> future | cur [C1]
    # it3 fwd C1 | Case 4: future merged with new: A,B,C of (2,3); A(2,3) | cur [B C](2,3); update (1,)
    # it4 fwd B(2,3) | Case 3: C(2,3); new -> future; room 0 | cur [A4 B4 C4]; update (2, 3) at once
    # state after it4 = after it1 -> period 3 from it2: updates [(1,), (2,3)] -> batch sizes 1, 2
    s = deft.schedule(times([3, 3, 3], [1, 1, 1], 3), iterations=20)
    st = s.steps
    assert [x.backward.case for x in st[:5]] == [4, 3, 2, 4, 3]
    assert [x.forward.case for x in st[:5]] == [0, 1, 1, 1, 1]
    assert _placed(st[0].backward) == [(0, (0,), 0)]
    assert _placed(st[1].forward) == [(1, (0,), 0)] and _placed(st[1].backward) == [(2, (0,), 0)]
    assert _placed(st[2].forward) == [(0, (1,), 0)] and _placed(st[2].backward) == [(1, (1,), 0)]
    assert _placed(st[3].forward) == [(2, (1,), 0)] and _placed(st[3].backward) == [(0, (2, 3), 0)]
    assert _placed(st[4].forward) == [(1, (2, 3), 0)] and _placed(st[4].backward) == [(2, (2, 3), 0)]
    assert [x.updates for x in st[:5]] == [[], [(0,)], [], [(1,)], [(2, 3)]]
    assert (s.period_start, s.period) == (2, 3)
    assert s.batch_sequence() == [1, 2] and s.update_frequency == pytest.approx(2 / 3)
    assert s.link_load_us() == [6.0]          # 9 us of gradients per iteration, synchronised as 6


def test_schedule_second_link_absorbs_the_excess():
    # same job, a second link at half speed: per stage link 0 holds 3 us, link 1 holds 3 * 0.5 = 1.5 us
    # of link-0 time; partition (§III-D): smallest knapsack min(3,3) * 0.5 = 1.5 -> each bucket in 2 parts
    # of 1.5 us.  Per iteration 6 parts = 9 us; capacity per iteration (3 + 1.5) * 2 = 9: all fits.
    s = deft.schedule(times([3, 3, 3], [1, 1, 1], 3), rates=[2.0, 1.0], iterations=20)
    assert len(s.times.buckets) == 6
    assert s.update_frequency == 1.0 and s.batch_sequence() == [1]
    load = s.link_load_us()
    assert load[0] + load[1] * 0.5 == pytest.approx(9.0)      # all 9 us of link-0 work done every iteration


def test_schedule_refuses_unpartitioned_oversized_bucket():
    with pytest.raises(ValueError, match="partition"):
        deft.schedule(times([10], [1], 3), partition=False)


def test_merge_sums_same_bucket():
    q = deft._merge([Item(0, (1,)), Item(2, (1,))], [Item(0, (2,)), Item(1, (2,))])
    assert q == [Item(0, (1, 2)), Item(1, (2,)), Item(2, (1,))]


# ----------------------------------------------------------------- bucket times of a real trace

def test_bucket_times_real_ddp_trace():
    from dpro_kit.session import Session
    from dpro_kit.trace import OpKind
    g = Session(REPO / "examples" / "traces" / "ddp-2rank-gloo").graph
    bt = deft.bucket_times(g)
    # 3 DDP buckets (README of the trace), in backward-ready order: DDP fills bucket 0 first
    assert [b.name for b in bt.buckets] == ["bucket0", "bucket1", "bucket2"]
    assert [b.bytes for b in bt.buckets] == [1071144, 1050624, 526336]
    node = bt.node
    compute = [d for _, d in g.nodes(data=True) if d["node"] == node and d["device"].endswith(":compute")]
    # forward + backward + tail is all of the node's computation, the backward split over the buckets
    assert bt.forward_us + bt.backward_us + bt.tail_us == pytest.approx(sum(d["dur"] for d in compute))
    assert sum(b.backward_us for b in bt.buckets) == pytest.approx(bt.backward_us)
    assert sum(b.forward_us for b in bt.buckets) == pytest.approx(bt.forward_us)
    # a 2-node ring: per node a reduce-scatter SEND then an all-gather SEND (RECVs take no time here)
    for b in bt.buckets:
        sends = {}
        for _, d in g.nodes(data=True):
            if d["tensor"] == b.name and d["kind"] == OpKind.SEND.value:
                sends.setdefault(d["node"], []).append(d["dur"])
        assert b.comm_us == pytest.approx(max(sum(v) for v in sends.values()))
    assert bt.coverage_rate == pytest.approx(bt.comm_us / (bt.forward_us + bt.backward_us))


# ----------------------------------------------------------------- replay of delayed updates and a second link

def hand_graph(tensors=("T",), send_us=6.0):
    """One worker ``w``: F (2 us) -> B (2 us) -> U (1 us) on ``w:compute``; every tensor's gradient is ready
    after B (In), its collective is one SEND of ``send_us`` on ``link:a->b``, its Out precedes U; STEP_END
    after U joins iterations.  Computation 5 us per iteration."""
    import networkx as nx

    from dpro_kit.graph.model import add_op
    g = nx.DiGraph()
    add_op(g, "F", node="w", device="w:compute", kind="FW", dur=2.0)
    add_op(g, "B", node="w", device="w:compute", kind="BW", dur=2.0)
    for t in tensors:
        add_op(g, f"In {t}", node="w", kind="VIRTUAL", tensor=t)
        add_op(g, f"SEND {t}", node="w", device="link:a->b", kind="SEND", tensor=t, dur=send_us, bytes=6)
        add_op(g, f"Out {t}", node="w", kind="VIRTUAL", tensor=t)
    add_op(g, "U", node="w", device="w:compute", kind="UPDATE", dur=1.0)
    add_op(g, "STEP_END", node="w", kind="VIRTUAL")
    g.add_edge("F", "B")
    for t in tensors:
        g.add_edges_from([("B", f"In {t}"), (f"In {t}", f"SEND {t}"), (f"SEND {t}", f"Out {t}"), (f"Out {t}", "U")])
    g.add_edges_from([("B", "U"), ("U", "STEP_END")])
    g.graph["iteration_edges"] = [("STEP_END", "F")]
    return g


def test_replay_hand_delayed_update():
    g = hand_graph()
    # synchronous: F 2 + B 2 + SEND 6 + U 1 = 11 us per iteration
    assert deft.replay_syncs(g, deft.synchronous_syncs(g)).iteration_us == pytest.approx(11.0)
    # delay 1: SEND of iteration i-1 (ready after B(i-1)) runs during iteration i; U(i) waits for it.
    # by hand: SEND_0 0-6, U_0 6-7; SEND_1 6-12 (B_0 ended at 4), U_1 12-13; SEND_2 12-18 ... the link
    # is never idle: 6 us per iteration = the link's busy time (the lower bound), computation 5 idles 1
    r = deft.replay_syncs(g, deft.delayed_syncs(g, {"T": 1}))
    assert r.iteration_us == pytest.approx(6.0)
    assert r.lower_bound_us == pytest.approx(6.0) and r.busiest_device == "link:a->b"
    # delay 2 (period 2 built from period 1): the same link bound, no faster
    assert deft.replay_syncs(g, deft.delayed_syncs(g, {"T": 2})).iteration_us == pytest.approx(6.0)


def test_replay_hand_second_link():
    g = hand_graph(("T1", "T2"))
    # two 6 us collectives on one link, both delayed: 12 us per iteration on the link
    one = deft.replay_syncs(g, deft.delayed_syncs(g, {"T1": 1, "T2": 1}))
    assert one.iteration_us == pytest.approx(12.0) and one.lower_bound_us == pytest.approx(12.0)
    # T2 on a second link of the same speed (its own device link:a->b#link1): 6 us per iteration
    two = deft.replay_syncs(g, deft.delayed_syncs(g, {"T1": 1, "T2": 1}, {"T2": 1}), rates=[1.0, 1.0])
    assert two.iteration_us == pytest.approx(6.0)
    assert {d["device"] for _, d in two.graph.nodes(data=True) if d["kind"] == "SEND"} == {"link:a->b",
                                                                                         "link:a->b#link1"}
    # the second link at half speed: T2 takes 12 us there -> 12 us per iteration
    half = deft.replay_syncs(g, deft.delayed_syncs(g, {"T1": 1, "T2": 1}, {"T2": 1}), rates=[2.0, 1.0])
    assert half.iteration_us == pytest.approx(12.0) and half.busiest_device == "link:a->b#link1"
    # synchronous on two links: F 2 + B 2 + max(6, 6) + U 1 = 11
    two_sync = deft.replay_syncs(g, deft.delayed_syncs(g, {}, {"T2": 1}), rates=[1.0, 1.0])
    assert two_sync.iteration_us == pytest.approx(11.0)


def test_replay_hand_partial_delay_fifo_by_launch():
    """A delayed bucket does not jump the link queue ahead of the current iteration's synchronous one.

    One worker: F 2 -> B1 1 -> B2 1 -> U 1 on ``w:compute``.  T1 (ready after B1, synchronous) is a ring
    of two halves on the link ``L``: S1a (2), then a wait for the peer ``P1`` on its own device (1.5),
    then S1b (2); T2 (ready after B2, delayed by one) is S2a (2) -> S2b (2) on ``L``.  U(i) waits for
    T1(i) and T2(i-1).  By hand, FIFO by ready time (the DDP hook launches both when DDP finds them
    ready; gloo runs its queue in that order): iteration i starts at 0 (F 0-2, B1 2-3, B2 3-4); S1a 3-5;
    S2a(i) ready 4, runs 5-7; S1b ready 6.5 (S1a 5 + P1 1.5), S2b ready 7: at 7 S1b (ready first) runs
    7-9, S2b 9-11; U(i) needs T1(i) (9) and T2(i-1) (done at 11 of the previous iteration): 9-10, and
    the next iteration starts at 10.  Its S1a is ready at 13 > 11: the link is idle in between, so
    every iteration repeats the first: 10 us.  The old rule (the delayed sync at a smaller priority
    than the synchronous one, the same in every unrolled copy) ran S2b(i) first at 7-9, S1b 9-11, U
    11-12: 12 us per iteration.
    """
    import networkx as nx

    from dpro_kit.graph.model import add_op
    g = nx.DiGraph()
    add_op(g, "F", node="w", device="w:compute", kind="FW", dur=2.0)
    add_op(g, "B1", node="w", device="w:compute", kind="BW", dur=1.0)
    add_op(g, "B2", node="w", device="w:compute", kind="BW", dur=1.0)
    add_op(g, "U", node="w", device="w:compute", kind="UPDATE", dur=1.0)
    add_op(g, "STEP_END", node="w", kind="VIRTUAL")
    for t, ops in (("T1", [("S1a", "L", 2.0), ("P1", "peer", 1.5), ("S1b", "L", 2.0)]),
                   ("T2", [("S2a", "L", 2.0), ("S2b", "L", 2.0)])):
        add_op(g, f"In {t}", node="w", kind="VIRTUAL", tensor=t)
        for name, dev, dur in ops:
            add_op(g, name, node="w", device=f"link:{dev}", kind="SEND", tensor=t, dur=dur, bytes=1)
        add_op(g, f"Out {t}", node="w", kind="VIRTUAL", tensor=t)
        chain = [f"In {t}"] + [o[0] for o in ops] + [f"Out {t}", "U"]
        g.add_edges_from(zip(chain, chain[1:]))
    g.add_edges_from([("F", "B1"), ("B1", "B2"), ("B1", "In T1"), ("B2", "In T2"), ("B2", "U"), ("U", "STEP_END")])
    g.graph["iteration_edges"] = [("STEP_END", "F")]
    syncs = deft.delayed_syncs(g, {"T2": 1})
    assert {(s.tensor, s.stage, s.ready) for s in syncs} == {("T1", 1, 0), ("T2", 1, -1)}
    r = deft.replay_syncs(g, syncs)
    assert r.iteration_us == pytest.approx(10.0)
    # the old priorities (delayed sync at stage 0) reproduce the hand count of the old rule: 12 us
    old = [deft.Sync(s.tensor, s.fraction, s.link, s.at, 0 if s.ready < 0 else 1, s.ready, s.update) for s in syncs]
    assert deft.replay_syncs(g, old).iteration_us == pytest.approx(12.0)
    # synchronous: F 2 + B1 1 + B2 1, T1 3-9 and T2 (S2a 5-7, S2b 9-11) -> U 11-12: 12 us
    assert deft.replay_syncs(g, deft.synchronous_syncs(g)).iteration_us == pytest.approx(12.0)


def test_replay_hand_schedule_four_cases():
    # the CR 1.5 schedule of test_schedule_four_cases_merged_updates on a hand graph: 3 tensors of 3 us,
    # forward stage = F (2) + U (1) = 3, backward B = 3 split evenly by the schedule's bucket times
    from dpro_kit.graph.model import add_op  # noqa: F401
    s = deft.schedule(times([3, 3, 3], [1, 1, 1], 3), iterations=20)
    s.times = BucketTimes("w", [Bucket(f"T{i}", 0, 1.0, 0.0, 3.0) for i in range(3)], 3.0, 3.0)
    syncs, period = deft.schedule_syncs(s)
    assert period == 3
    # steady iterations 2, 3, 4 of the hand trace, relative to iteration 2: (tensor, at, stage, ready, update)
    assert sorted((x.tensor, x.at, x.stage, x.ready, x.update) for x in syncs) == sorted([
        ("T0", 0, 0, -1, 1), ("T1", 0, 1, -1, 1),          # it2: A1 fwd, B1 bwd; iteration 1 applied at it3
        ("T2", 1, 0, -1, 1), ("T0", 1, 1, 1, 2),           # it3: C1 fwd; A(2,3) bwd -> applied at it4
        ("T1", 2, 0, 1, 2), ("T2", 2, 1, 1, 2)])           # it4: B(2,3), C(2,3)
    g = hand_graph(("T0", "T1", "T2"), send_us=3.0)
    r = deft.replay_syncs(g, syncs, period)
    # 6 us of link work per iteration (2 syncs of 3 us), 5 us of computation: the link bounds it
    assert r.lower_bound_us == pytest.approx(6.0)
    assert r.iteration_us >= r.lower_bound_us - 1e-9
    assert r.iteration_us < deft.replay_syncs(g, deft.synchronous_syncs(g)).iteration_us


def test_zero_delay_replay_is_the_synchronous_replay_exactly():
    import numpy as np

    from dpro_kit.replay import replay
    from dpro_kit.session import Session
    g = Session(REPO / "examples" / "traces" / "ddp-2rank-gloo").graph
    h, L = deft.period_graph(g, deft.synchronous_syncs(g), 1)
    assert L == 1 and h.number_of_nodes() == g.number_of_nodes() and h.number_of_edges() == g.number_of_edges()
    a, b = replay(g, iterations=4), replay(h, iterations=4)
    assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
    assert [k.rsplit("@", 1)[0] for k in b.graph.keys] == a.graph.keys     # same ops in the same order, renamed


def test_deft_on_recorded_trace_bounds():
    from dpro_kit.session import Session
    g = Session(REPO / "examples" / "traces" / "ddp-2host-1000mbit").graph
    for rates in ([1.0], [1000.0, 300.0]):
        d = deft.predict(g, rates, defer=["bucket0"])
        sync, late, pred = d["synchronous"], d["delay_one"], d["deft"]
        # the trace's one bucket deferred alone: the same replay as every bucket delayed
        assert d["partial_delay"]["one_link"]["iteration_ms"] == pytest.approx(late["iteration_ms"], rel=1e-9)
        # no replay beats its busiest device; the synchronous one is the plain replay's
        for r in (sync, late, pred):
            assert r["iteration_ms"] >= r["lower_bound_ms"] * (1 - 1e-9)
        assert sync["iteration_ms"] == pytest.approx(Session(REPO / "examples" / "traces" /
                                                             "ddp-2host-1000mbit").iteration_time_ms(4))
        # delaying (and merging) only removes waits here: never slower than synchronous DDP
        assert late["iteration_ms"] <= sync["iteration_ms"] and pred["iteration_ms"] <= sync["iteration_ms"]
        assert d["update_frequency"] < 1.0      # CR ~2: DeFT merges iterations (accuracy: the Preserver's job)
        if len(rates) > 1:   # one bucket: the assignment keeps it on the faster link, as delay_one
            dl = d["delay_one_links"]
            assert dl["assignment"] == {"bucket0": 0}
            assert dl["iteration_ms"] == pytest.approx(late["iteration_ms"], rel=1e-9)
            assert d["synchronous_links"]["iteration_ms"] == pytest.approx(sync["iteration_ms"], rel=1e-9)
            assert d["partial_delay"]["links"]["iteration_ms"] == pytest.approx(dl["iteration_ms"], rel=1e-9)
    with pytest.raises(ValueError, match="no bucket bucket7"):
        deft.predict(g, [1.0], defer=["bucket7"])


def test_link_assignment_hand():
    # c = 4, 3, 3, 2 on two equal links: 4 -> L0; 3 -> L1; 3 -> L1 (6 < 7); 2 -> L0 (6 < 8): loads 6 | 6
    t = times([4, 3, 3, 2], [1, 1, 1, 1], 5)
    assert deft.link_assignment(t, [1, 1]) == {"b0": 0, "b1": 1, "b2": 1, "b3": 0}
    # link 1 at half speed (c / 0.5): 4 -> L0 (4 < 8); 3 -> L1 (6 < 7); 3 -> L0 (7 < 12); 2 -> L0 (9 < 10)
    assert deft.link_assignment(t, [1000, 500]) == {"b0": 0, "b1": 1, "b2": 0, "b3": 0}
    assert deft.link_assignment(t, [1]) == {"b0": 0, "b1": 0, "b2": 0, "b3": 0}


def test_cli_replay_deft_json_and_refusals():
    import json

    from click.testing import CliRunner

    from dpro_kit.cli.replay import replay as cmd
    tr = str(REPO / "examples" / "traces" / "ddp-2rank-gloo")
    r = CliRunner().invoke(cmd, [tr, "--deft", "--links", "1000,300", "--json", "-q"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["deft"]
    assert d["rates"] == [1000.0, 300.0] and d["period"] >= 1
    assert d["deft"]["iteration_ms"] >= d["deft"]["lower_bound_ms"] * (1 - 1e-9)
    assert CliRunner().invoke(cmd, [tr, "--links", "1000"]).exit_code == 2
    assert CliRunner().invoke(cmd, [tr, "--deft", "--links", "0,x"]).exit_code == 2
    assert CliRunner().invoke(cmd, [tr, "--defer", "bucket0"]).exit_code == 2          # --defer needs --deft
    r = CliRunner().invoke(cmd, [tr, "--deft", "--defer", "bucket9", "-q"])
    assert "no bucket bucket9" in str(r.exception)     # a DproError: the dpro entry point prints it, exit 2


# ----------------------------------------------------------------- the Preserver (hand-computed)

def test_expected_next_loss_hand():
    import math
    # no noise: a plain step, or a rebound off the objective (|0.2 - 0.3| = 0.1)
    assert deft.expected_next_loss(1.0, 0.3, 0.0, 1, 1.0) == pytest.approx(0.7)
    assert deft.expected_next_loss(0.2, 0.3, 0.0, 1, 1.0) == pytest.approx(0.1)
    # at the objective with no drift: the mean of |N(0, 1)| = sqrt(2/pi)
    assert deft.expected_next_loss(0.0, 0.0, 1.0, 1, 1.0) == pytest.approx(math.sqrt(2 / math.pi))
    # batch 4 halves the standard deviation; k = 4 summed iterations doubles it and moves 4 mu
    assert deft.expected_next_loss(0.0, 0.0, 1.0, 4, 1.0) == pytest.approx(0.5 * math.sqrt(2 / math.pi))
    assert deft.expected_next_loss(0.0, 0.0, 1.0, 1, 1.0, k=4) == pytest.approx(2 * math.sqrt(2 / math.pi))
    assert deft.expected_next_loss(10.0, 1.0, 0.0, 1, 1.0, k=4) == pytest.approx(6.0)


def test_loss_ratio_and_preserver_loop():
    # far from the objective and no noise, merging (summed gradients) changes nothing: ratio 1
    assert deft.loss_ratio([1, 2], 10.0, 1.0, 0.0, 1, 0.1) == pytest.approx(1.0)
    assert deft.loss_ratio([1, 1, 1], 0.3, 0.5, 1.0, 1, 0.1) == pytest.approx(1.0)
    # near it with noise, the merged update rebounds differently: the ratio leaves [0.99, 1.01]
    r = deft.loss_ratio([1, 2], 0.3, 0.5, 1.0, 1, 0.1)
    assert abs(r - 1) > 0.01
    # the CR 1.5 job of test_schedule_four_cases_merged_updates: a stage (3 us) holds one 3 us bucket
    # until its capacity reaches 6 (two buckets): scales 1, 1.1, ..., 1.1^7 = 1.95 keep [1, 2];
    # 1.1^8 = 2.14 synchronises all 9 us per iteration (forward 6.4 + backward 6.4 hold 2 + 2 buckets):
    # update frequency 1, ratio 1
    sched, scale, log = deft.preserve(times([3, 3, 3], [1, 1, 1], 3), s0=0.3, mu=0.5, sigma=1.0, batch=1,
                                      lr=0.1)
    assert [round(x["capacity_scale"], 6) for x in log] == [round(1.1 ** i, 6) for i in range(9)]
    assert [x["update_frequency"] for x in log[:-1]] == [pytest.approx(2 / 3)] * 8
    assert log[-1]["update_frequency"] == 1.0 and log[-1]["ratio"] == pytest.approx(1.0)
    assert scale == pytest.approx(1.1 ** 8) and sched.batch_sequence() == [1]


def test_walk_statistics_and_measured_ratio_hand():
    # losses 3, 2.9, 2.7, 2.6 at lr 0.5: D = 0.2, 0.4, 0.2 -> mu 0.8/3, stdev sqrt(((0.2-m)^2*2+(0.4-m)^2)/2)
    s0, mu, sigma = deft.walk_statistics([3.0, 2.9, 2.7, 2.6, 9.9], lr=0.5, batch=4, steps=3)
    m = 0.8 / 3
    assert s0 == 3.0 and mu == pytest.approx(m)
    assert sigma == pytest.approx(math.sqrt(((0.2 - m) ** 2 * 2 + (0.4 - m) ** 2) / 2) * 2)
    assert deft.measured_loss_ratio([5, 1, 1.2], [5, 2, 2.4], last=2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        deft.walk_statistics([1.0, 0.9], lr=0.1, batch=1, steps=3)


# ----------------------------------------------------------------- the Preserver as a loop on real training

FIXTURE = Path(__file__).parent / "fixtures" / "deft_preserver_curves.json"


def test_preserver_loop_on_recorded_real_loss_curves():
    """The loop replayed on loss curves recorded from real 2-rank training (bench/deft_ab.py preserver_loop).

    Synchronous DDP and three delayed jobs with the same seed and data (lr 0.1, 300 steps): every bucket
    delayed, buckets 1 and 2, bucket 2 only.  From all delays 1 the loop lowers bucket 0 first (backward-ready
    order), then bucket 1, and accepts bucket 2 alone: ratios 0.530, 0.901, 1.003 (eps 0.01).
    """
    import json
    doc = json.loads(FIXTURE.read_text())
    curves = doc["loss_mean"]
    seen = []

    def measure(delays):
        key = ",".join(t.removeprefix("bucket") for t, d in sorted(delays.items()) if d > 0)
        seen.append(key)
        return deft.measured_loss_ratio(curves["sync"], curves[key], 10)

    start = {"bucket0": 1, "bucket1": 1, "bucket2": 1}
    accepted, log = deft.preserve_measured(start, ["bucket0", "bucket1", "bucket2"], measure, eps=0.01)
    assert accepted == {"bucket0": 0, "bucket1": 0, "bucket2": 1} == doc["accepted"]
    assert seen == ["0,1,2", "1,2", "2"]
    assert [round(x["ratio"], 3) for x in log] == [0.530, 0.901, 1.003]
    assert [x["within"] for x in log] == [False, False, True]
    # the same decisions as the live loop that recorded the curves
    assert [x["delays"] for x in log] == [x["delays"] for x in doc["log"]]
    for a, b in zip(log, doc["log"]):
        assert a["ratio"] == pytest.approx(b["ratio"], abs=1e-4)
    # a tighter threshold accepts no delay: every bucket lowered, stock DDP (no run for all zeros)
    seen.clear()
    acc0, log0 = deft.preserve_measured(start, ["bucket0", "bucket1", "bucket2"], measure, eps=0.001)
    assert acc0 == {"bucket0": 0, "bucket1": 0, "bucket2": 0} and seen == ["0,1,2", "1,2", "2"]
    assert log0[-1] == {"delays": acc0, "ratio": None, "within": True}


def test_preserver_loop_hand_cases():
    calls = []

    def never(delays):
        calls.append(dict(delays))
        return 0.5
    # tries bounds the measurements; what is left is stock DDP
    acc, log = deft.preserve_measured({"a": 1, "b": 1, "c": 1}, ["a", "b", "c"], never, tries=2)
    assert len(calls) == 2 and acc == {"a": 0, "b": 0, "c": 0} and log[-1]["ratio"] is None
    # nothing delayed: accepted without a run
    calls.clear()
    acc, log = deft.preserve_measured({"a": 0}, ["a"], never)
    assert calls == [] and acc == {"a": 0} and log == [{"delays": {"a": 0}, "ratio": None, "within": True}]
    # a non-finite ratio (a diverged run) is outside
    acc, log = deft.preserve_measured({"a": 1, "b": 1}, ["b", "a"], lambda d: math.nan if d["b"] else 1.0)
    assert acc == {"a": 1, "b": 0} and [x["within"] for x in log] == [False, True]
    with pytest.raises(ValueError):
        deft.preserve_measured({"a": 1}, ["z"], never)


def test_fixed_delays_lowering_order_and_plan_section():
    # the CR 1.5 schedule of test_schedule_four_cases_merged_updates: every bucket synchronised after its
    # own iteration's backward at some point of the steady period -> delay 1 each
    s = deft.schedule(times([3, 3, 3], [1, 1, 1], 3), iterations=20)
    assert set(deft.fixed_delays(s).values()) == {1}
    # c = 4, 1; T = 1, 3; forward 10, backward 4.  By hand: each iteration is Case 4 (current empty):
    # Algorithm 1 on [b0, b1] with B = 4: knapsack -> {b0} (4; 4 + 1 > 4), dropping b0 gives
    # knapsack([1], 4 - 1) = 1 < 4, so b0 is synchronised in its own backward, b1 becomes the current
    # queue and goes in the next forward stage (Case 1, 1 <= 10): delays 0 and 1
    t = times([4, 1], [1, 3], 10)
    sched = deft.schedule(t, iterations=10)
    assert sched.delays() == {"b0": 0.0, "b1": 1.0}
    assert deft.fixed_delays(sched) == {"b0": 0, "b1": 1}
    assert deft.lowering_order(t) == ["b0", "b1"]
    from dpro_collect.plan import PLAN_SCHEMA, validate_plan
    sec = deft.plan_section({"bucket0": 0, "bucket1": 0, "bucket2": 1}, {"bucket0": 0, "bucket1": 1, "bucket2": 1},
                            [500, 500], eps=0.01, log=[{"delays": {"bucket2": 1}, "ratio": 1.003, "within": True}])
    assert sec["run"] == ["--deft-defer", "2", "--deft-link1", "1,2"]
    validate_plan(sec, PLAN_SCHEMA["properties"]["deft"], where="plan.deft")


def test_cli_optimize_deft_writes_the_solver_plan(tmp_path):
    """`dpro optimize --deft --links`: plan["deft"] is the solver's fixed delays and link assignment, its
    train.py options, and the replayed iteration time of exactly that (the trace's one bucket delayed: the
    delay-one replay of `dpro replay --deft`); the Preserver's part says it was not measured."""
    import json

    from click.testing import CliRunner

    from dpro_collect.plan import validate_plan
    from dpro_kit.cli.optimize import optimize as cmd
    from dpro_kit.cli.replay import replay as rcmd
    tr = str(REPO / "examples" / "traces" / "ddp-2host-1000mbit")
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cmd, [tr, "--deft", "--links", "500,500", "--budget", "5", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    validate_plan(plan, where=str(out))
    d = plan["deft"]
    rep = json.loads(CliRunner().invoke(rcmd, [tr, "--deft", "--links", "500,500", "--json", "-q"]).output)["deft"]
    assert d["delays"] == rep["fixed_delays"] == {"bucket0": 1}
    assert d["links"] == rep["delay_one_links"]["assignment"] and d["rates_mbit"] == [500.0, 500.0]
    assert d["run"] == ["--deft-defer", "0"]
    assert d["predicted"]["iteration_ms"] == pytest.approx(rep["delay_one_links"]["iteration_ms"], rel=1e-9)
    assert d["predicted"]["synchronous_ms"] == pytest.approx(rep["synchronous"]["iteration_ms"], rel=1e-9)
    assert d["preserver"]["tries"][0]["ratio"] is None and "not measured" in d["preserver"]["note"]
    assert "as profiled" in d["applies_to"] and "mode='deft'" in d["applies_to"]
    # what apply_plan(mode="deft") checks DDP's buckets against: the traced bucket's bytes and DDP's cap
    meta = json.loads(next(Path(tr).rglob("meta.json")).read_text())["ddp"][0]
    assert d["bucket_bytes"] == {f"bucket{b['index']}": b["bytes"] for b in meta["buckets"]}
    assert d["ddp"] == {"bucket_cap_mb": None if meta.get("bucket_cap_default") else meta["bucket_cap_bytes"] / 2**20}
    assert "the loss is not checked" in CliRunner().invoke(cmd, [tr, "--deft", "--budget", "5", "-o",
                                                                 str(tmp_path / "p1.json")]).output
    assert CliRunner().invoke(cmd, [tr, "--links", "500", "-o", str(tmp_path / "p2.json")]).exit_code == 2
