"""Horovod's background loop (dpro_kit.horovod_loop) on hand-computed schedules."""
from __future__ import annotations

import pytest

from dpro_kit.horovod_loop import Cycle, cycles, fuse, next_phase


def summary(cs):
    return [(c.tick, c.buffers, c.start, c.end) for c in cs]


def test_fuse_in_order_within_the_threshold():
    assert fuse([0, 1, 2, 3], [4, 4, 4, 10], 8) == [[0, 1], [2], [3]]
    assert fuse([2, 0], [5, 5, 5], 100) == [[2, 0]]                # the order given, not the indices'
    assert fuse([0, 1], [10, 1], 8) == [[0], [1]]                  # larger than the threshold: alone
    assert fuse([], [1], 8) == []


def test_default_cycle_one_buffer_per_tick():
    """Ready at 0, 0.3 and 5 ms; C = 1 ms; each buffer 2 ms, negotiation 0.1 ms.

    t0 = 0 + C/2 = 0.5: takes tensors 0 and 1 (both ready), runs 0.6 .. 2.6; next tick
    max(1.5, 2.6) = 2.6: nothing ready (tensor 2 at 5.0), idle ticks 3.6, 4.6, 5.6: takes 2,
    runs 5.7 .. 7.7.
    """
    cs = cycles([0.0, 300.0, 5000.0], [8, 8, 8], 1 << 20, 1000.0, lambda b, s: 2000.0, negotiate_us=100.0)
    assert summary(cs) == [(500.0, [[0, 1]], [600.0], [2600.0]), (5600.0, [[2]], [5700.0], [7700.0])]


def test_longer_cycle_takes_more_per_tick():
    """Same tensors, C = 2 ms, the second ready at 0.8 ms: tick 1.0 takes both.

    With C = 1 ms tick 0.5 takes tensor 0 alone (its buffer 0.5 .. 2.5), tensor 1 at the late
    tick 2.5 (2.5 .. 4.5): two buffers end at 4.5, one buffer at 3.0 with C = 2 ms.
    """
    run = lambda b, s: 2000.0      # noqa: E731 - one fixed cost per buffer, whatever its bytes
    short = cycles([0.0, 800.0], [8, 8], 1 << 20, 1000.0, run)
    long_ = cycles([0.0, 800.0], [8, 8], 1 << 20, 2000.0, run)
    assert summary(short) == [(500.0, [[0]], [500.0], [2500.0]), (2500.0, [[1]], [2500.0], [4500.0])]
    assert summary(long_) == [(1000.0, [[0, 1]], [1000.0], [3000.0])]


def test_threshold_cuts_a_tick_into_buffers_run_back_to_back():
    cs = cycles([0.0, 0.0, 0.0], [6, 6, 6], 12, 1000.0, lambda b, s: 100.0 * len(b), negotiate_us=50.0)
    assert summary(cs) == [(500.0, [[0, 1], [2]], [550.0, 750.0], [750.0, 850.0])]


def test_run_time_may_depend_on_the_start():
    """The caller's run time sees each buffer's start (horovod_knobs slows buffers beside the backward pass)."""
    seen = []

    def run(b, start):
        seen.append((tuple(b), start))
        return 1000.0 if start < 1000.0 else 10.0
    cs = cycles([0.0, 0.0, 0.0], [6, 6, 6], 6, 0.0, run)
    assert seen == [((0,), 0.0), ((1,), 1000.0), ((2,), 1010.0)] and cs[0].done == 1020.0


def test_given_grouping_waits_for_its_tensors():
    """A grouping timed instead of found: a cycle runs at the first tick by which all its tensors are ready."""
    ready = [0.0, 1500.0]
    free = cycles(ready, [8, 8], 1 << 20, 1000.0, lambda b, s: 100.0)
    assert [c.buffers for c in free] == [[[0]], [[1]]]
    # both in one cycle: tick 0.5 lacks tensor 1, the idle tick 1.5 has it
    forced = cycles(ready, [8, 8], 1 << 20, 1000.0, lambda b, s: 100.0, given=[[[0, 1]]])
    assert summary(forced) == [(1500.0, [[0, 1]], [1500.0], [1600.0])]


def test_zero_cycle_time_ticks_when_ready():
    cs = cycles([0.0, 50.0], [8, 8], 1 << 20, 0.0, lambda b, s: 10.0)
    assert summary(cs) == [(0.0, [[0]], [0.0], [10.0]), (50.0, [[1]], [50.0], [60.0])]
    assert cycles([], [], 8, 1000.0, lambda b, s: 1.0) == []


@pytest.mark.parametrize("cycle_us", [500.0, 1000.0, 3000.0, 10000.0])
def test_every_tensor_once_and_ticks_in_order(cycle_us):
    ready = [0.0, 120.0, 900.0, 4000.0, 4100.0, 12000.0]
    sizes = [100, 5000, 300, 40, 7000, 10]
    cs = cycles(ready, sizes, 5000, cycle_us, lambda b, s: 250.0)
    taken = [i for c in cs for b in c.buffers for i in b]
    assert sorted(taken) == list(range(len(ready)))
    assert all(ready[i] <= c.tick for c in cs for b in c.buffers for i in b)
    assert all(b.tick >= max(a.tick + cycle_us, a.done) for a, b in zip(cs, cs[1:]))


def test_next_phase_carries_the_ticks_over():
    """After a cycle ticked at 0 and done at 30 ms the loop ticks at max(0 + C, 30) and every C after."""
    last = Cycle(tick=0.0, buffers=[[0]], start=[0.0], end=[30000.0])
    assert next_phase(last, 50000.0, 40000.0) == 10000.0      # the tick C after the last one, not C/2
    assert next_phase(last, 10000.0, 41000.0) == 9000.0       # ticks 30, 40, 50 ms: the one at 50
    assert next_phase(last, 10000.0, 30000.0) == 0.0          # ready at the late tick itself
    assert next_phase(last, 0.0, 41000.0) == 0.0              # no cycle time: ticks when ready
    # spread over the next first gradient: the mean of the phases (ticks 30, 40, 50 ms)
    assert next_phase(last, 10000.0, 41000.0, [-2000.0, 0.0, 2000.0]) == pytest.approx((1000 + 9000 + 7000) / 3)


def test_a_cycle_longer_than_the_iteration_locks_to_it():
    """Iterations whose gradient is ready 5 ms after they start and whose buffer runs 20 ms, then 3 ms of tail.

    With C = 50 ms the loop ticks every C and each iteration waits for the next tick: carried
    over, every iteration takes exactly 50 ms (the first tick C after the previous one), where
    half a cycle per iteration would give 5 + 25 + 20 + 3 = 53 ms.
    """
    c, start, lengths = 50000.0, 0.0, []
    phase = c / 2
    for _ in range(6):
        last = cycles([start + 5000.0], [8], 1 << 20, c, lambda b, s: 20000.0, phase_us=phase)[-1]
        end = last.done + 3000.0
        lengths.append(end - start)
        phase = next_phase(last, c, end + 5000.0)
        start = end
    assert lengths[0] == 53000.0 and lengths[1:] == [50000.0] * 5


def test_every_rank_takes_the_coordinators_fusion_groups():
    """Ranks that counted their own iterations could choose different groups (a loaded machine: the
    job was refused); with the coordinator's meta and timeline every rank takes its unprofiled
    grouping, and a rank's own profiled window decides only when the coordinator has none.
    Hand-made Response lists (the reader's own data structure, not a third-party format)."""
    from dpro_kit.readers.horovod import Response, _job_grouping

    def resp(*groups_at):
        return [Response(tensors=g, start=t, memcpy_in=None, allreduce=(t, t + 1.0), memcpy_out=None, end=t + 1.0)
                for g, t in groups_at]

    def meta(*spans):   # unprofiled steps (us): step 2.. (steps 0 and 1 are start-up and left out)
        return {"steps": [{"step": 2 + i, "profiled": False, "end_time_ns": b * 1e3, "dur_us": b - a}
                          for i, (a, b) in enumerate(spans)]}

    # this rank's clock put the boundary between 'a' and 'b': its own unprofiled iterations say (a) (b, c)
    own_meta = meta((100_000, 200_000), (200_000, 300_000))
    own = resp((("a",), 110_000), (("b", "c"), 150_000), (("a",), 210_000), (("b", "c"), 250_000))
    per_it = {7: resp((("a", "b"), 1e6), (("c",), 1.1e6))}          # the profiled window: (a, b) (c)
    assert _job_grouping(own_meta, own, per_it) == [("a",), ("b", "c")]
    coord_meta = meta((100_000, 200_000), (200_000, 300_000), (300_000, 400_000))
    coord = resp((("a", "b"), 120_000), (("c",), 150_000), (("a", "b"), 220_000), (("c",), 250_000),
                 (("a",), 310_000), (("b", "c"), 350_000))
    assert _job_grouping(own_meta, own, per_it, (coord_meta, coord)) == [("a", "b"), ("c",)]
    # a coordinator without an unprofiled iteration of every tensor: the window's groups
    assert _job_grouping(own_meta, own, per_it, ({"steps": []}, coord)) == [("a", "b"), ("c",)]
    assert _job_grouping({"steps": []}, own, per_it) == [("a", "b"), ("c",)]
