"""Straggler what-ifs (--slow-rank, --like-median, --slow-link) and the attribution analyzer."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_traceset
from dpro_kit.costmodel import CommModel, LinkModel, link_hosts
from dpro_kit.errors import DproError
from dpro_kit.whatif import COMPUTE_KINDS, host_cpu_split, like_median, slow_hosts, slow_links, slow_ranks

ROOT = Path(__file__).resolve().parents[1]
TWO_HOST = ROOT / "examples" / "traces" / "ddp-2host-1000mbit"
THREE_HOST_SLOWED = ROOT / "examples" / "traces" / "ddp-3host-200mbit-slowed"


def _compute(ts, node):
    ev = ts.events
    sel = (ev["node"] == node) & ev["kind"].astype(str).isin(COMPUTE_KINDS)
    return float(ev.loc[sel, "dur"].sum())


def test_slow_rank_scales_only_that_ranks_computation():
    ts = tiny_traceset(workers=3, hosts=3, iterations=2)
    out = slow_ranks(ts, {1: 1.5})
    assert _compute(out, "w1") == pytest.approx(1.5 * _compute(ts, "w1"))
    assert _compute(out, "w0") == pytest.approx(_compute(ts, "w0"))
    comm = lambda t: t.events.loc[t.events["kind"].astype(str) == "COMM", "dur"].sum()  # noqa: E731
    assert comm(out) == pytest.approx(comm(ts))                  # transfers are the link model's
    with pytest.raises(DproError, match="no worker of rank 7"):
        slow_ranks(ts, {7: 2.0})
    with pytest.raises(DproError, match="positive"):
        slow_ranks(ts, {0: -1.0})


def test_like_median_takes_the_other_workers_median_per_op():
    """Rank 2 made 2x slower, then 'like the median of the others' (w0, w1 are identical): back to w0's."""
    ts = tiny_traceset(workers=3, hosts=3, iterations=2)
    slow = slow_ranks(ts, {2: 2.0})
    fixed = like_median(slow, [2])
    assert _compute(slow, "w2") == pytest.approx(2 * _compute(ts, "w0"))
    assert _compute(fixed, "w2") == pytest.approx(_compute(ts, "w0"))


def test_slow_link_hand_computed():
    assert link_hosts("link:h0->h1") == ["h0", "h1"]
    assert link_hosts("link:host0:download") == ["host0"]
    assert link_hosts("link:host0/0->host0/1") == []                # two nodes of one host: no network
    m = CommModel(default=LinkModel(10.0, 1e6))                      # 10 us + 1 us per byte
    ts = tiny_traceset(workers=2, hosts=2)
    s = slow_links(m, ts, {"h1": 0.5})
    assert s.transfer_us(1000, "link:h0->h1") == pytest.approx(10 + 2000)   # h1's interface at half
    assert s.transfer_us(1000, "link:h0:upload") == pytest.approx(10 + 1000)  # another host's interface
    assert m.transfer_us(1000, "link:h0->h1") == pytest.approx(10 + 1000)   # the original is untouched
    with pytest.raises(DproError, match="no host 'h9'"):
        slow_links(m, ts, {"h9": 0.5})


def _with_cpu_record(ts, node="w1", step_ms=9.85, cpu_ms=3.85):
    """``ts`` whose ``node`` used ``cpu_ms`` of CPU per unprofiled iteration of ``step_ms`` (the collector's record)."""
    from dataclasses import replace
    extra = {**ts.manifest.extra, "measured_iteration_ms_per_node": {node: step_ms},
             "cpu_use": {node: {"cpus": cpu_ms / step_ms}}}
    return replace(ts, manifest=replace(ts.manifest, extra=extra))


def test_slow_host_hand_computed():
    """--slow-host h1=2 on a hand-built 2-host job whose numbers are worked out by hand.

    Worker w1 (host h1), per iteration: computation W = 1.8 ms of FW/BW (x 0.9, 1.0, 1.1 over the three
    iterations: median 1.8) + 0.05 ms UPDATE = 1.85 ms; unprofiled iteration T = 9.85 ms with C = 3.85 ms
    of CPU.  Link model: no latency, 1e9 B/s; bucket0 4 MB, bucket1 2 MB, 2 ranks: a ring step moves half
    a bucket, 2 ms and 1 ms, two steps each: t = 6 ms of transfers per iteration.

        u = (C - W) / (T - W) = 2 / 8 = 0.25          CPUs while not computing
        R_t = min(C - W, u t) = min(2, 1.5) = 1.5      CPU during transfers (ms)
        transfers:   1 + u (F - 1) = 1.25
        computation: 1 + (F - 1) (C - R_t) / W = 1 + 2.35 / 1.85 = 2.27027
    """
    ts = _with_cpu_record(tiny_traceset(workers=2, hosts=2, iterations=3))
    model = CommModel(default=LinkModel(0.0, 1e9))
    split = host_cpu_split(ts, model, "h1")["w1"]
    assert split["compute_ms"] == pytest.approx(1.85)
    assert split["idle_cpu"] == pytest.approx(0.25)
    assert split["transfer_ms"] == pytest.approx(6.0)
    assert split["transfer_cpu_ms"] == pytest.approx(1.5)
    out, m, info = slow_hosts(ts, model, {"h1": 2.0})
    assert info["w1"]["compute_factor"] == pytest.approx(1 + 2.35 / 1.85, abs=1e-4)
    assert _compute(out, "w1") == pytest.approx((1 + 2.35 / 1.85) * _compute(ts, "w1"))
    assert _compute(out, "w0") == pytest.approx(_compute(ts, "w0"))          # the other host untouched
    assert m.transfer_us(2e6, "link:h0->h1") == pytest.approx(1.25 * 2000)   # a link of h1
    assert m.transfer_us(2e6, "link:h0:upload") == pytest.approx(2000)       # h0's own interface
    assert model.transfer_us(2e6, "link:h0->h1") == pytest.approx(2000)      # the fitted model untouched
    # in the built graph: every ring step of the 2-host job touches h1 (2 ms / 1 ms steps at 1.25)
    from dpro_kit.graph import build_global_dfg
    g = build_global_dfg(out, comm_model=m)
    sends = sorted({round(d["dur"], 3) for _, d in g.nodes(data=True) if d.get("kind") == "SEND"})
    assert sends == [1250.0, 2500.0]
    # the host had half its core when profiled (beside a neighbour of equal weight): C/s = 7.7 ms
    #   u = 5.85 / 8 = 0.73125, R_t = min(5.85, 0.73125 * 6) = 4.3875, computation 1 + (7.7 - 4.3875) / 1.85
    _, m2, info2 = slow_hosts(ts, model, {"h1": 2.0}, {"h1": 0.5})
    assert info2["w1"]["transfer_factor"] == pytest.approx(1.73125, abs=1e-4)
    assert info2["w1"]["compute_factor"] == pytest.approx(1 + 3.3125 / 1.85, abs=1e-4)
    # no CPU record: --slow-rank on the host's ranks, transfers as the link model has them
    plain, m3, _ = slow_hosts(tiny_traceset(workers=2, hosts=2, iterations=3), model, {"h1": 2.0})
    assert _compute(plain, "w1") == pytest.approx(2 * _compute(ts, "w1"))
    assert m3.transfer_us(2e6, "link:h0->h1") == pytest.approx(2000)
    with pytest.raises(DproError, match="no host 'h9'"):
        slow_hosts(ts, model, {"h9": 2.0})
    with pytest.raises(DproError, match="positive"):
        slow_hosts(ts, model, {"h1": 0.0})


def test_slow_host_busy_hand_computed():
    """--slow-host h1=2 --host-busy h1=0.9 on the job of test_slow_host_hand_computed: the host's training
    thread was runnable 0.9 of its unprofiled iteration T = 9.85 ms, which replaces the collector's
    C = 3.85 ms (and any --cpu-share):

        C/s = B T = 8.865 ms
        u = (C/s - W) / (T - W) = 7.015 / 8 = 0.876875
        R_t = min(C/s - W, u t) = min(7.015, 5.26125) = 5.26125
        transfers:   1 + u (F - 1) = 1.876875
        computation: 1 + (F - 1) (C/s - R_t) / W = 1 + 3.60375 / 1.85 = 2.947973
    """
    ts = _with_cpu_record(tiny_traceset(workers=2, hosts=2, iterations=3))
    model = CommModel(default=LinkModel(0.0, 1e9))
    split = host_cpu_split(ts, model, "h1", busy=0.9)["w1"]
    assert split["cpu_ms"] == pytest.approx(8.865)
    assert split["idle_cpu"] == pytest.approx(0.876875)
    assert split["transfer_cpu_ms"] == pytest.approx(5.26125)
    out, m, info = slow_hosts(ts, model, {"h1": 2.0}, busy={"h1": 0.9})
    assert info["w1"]["transfer_factor"] == pytest.approx(1.876875, abs=1e-4)
    assert info["w1"]["compute_factor"] == pytest.approx(1 + 3.60375 / 1.85, abs=1e-4)
    assert _compute(out, "w1") == pytest.approx((1 + 3.60375 / 1.85) * _compute(ts, "w1"))
    assert m.transfer_us(2e6, "link:h0->h1") == pytest.approx(1.876875 * 2000)
    # busy all the time: every transfer of the host CPU-bound (u = 1), R_t = t = 6 ms,
    # the computation charged with the rest: 1 + (9.85 - 6) / 1.85
    _, m1, info1 = slow_hosts(ts, model, {"h1": 2.0}, busy={"h1": 1.0})
    assert info1["w1"]["transfer_factor"] == pytest.approx(2.0)
    assert info1["w1"]["compute_factor"] == pytest.approx(1 + 3.85 / 1.85, abs=1e-4)
    # without a collector CPU record the busy part still gives C/s (it needs only the unprofiled step)
    from dataclasses import replace
    no_cpu = replace(ts, manifest=replace(ts.manifest, extra={**ts.manifest.extra, "cpu_use": {}}))
    assert host_cpu_split(no_cpu, model, "h1", busy=0.9)["w1"]["idle_cpu"] == pytest.approx(0.876875)
    # nor an unprofiled iteration time: B is a part of it, so the what-if is refused, not run without it
    no_step = replace(no_cpu, manifest=replace(no_cpu.manifest, extra={**no_cpu.manifest.extra,
                                                                       "measured_iteration_ms_per_node": {}}))
    with pytest.raises(DproError, match="no unprofiled iteration time"):
        slow_hosts(no_step, model, {"h1": 2.0}, busy={"h1": 0.9})
    for kw, msg in (({"busy": {"h1": 1.5}}, r"\(0, 1\]"), ({"busy": {"h1": 0.0}}, r"\(0, 1\]"),
                    ({"busy": {"h1": 0.9}, "shares": {"h1": 0.5}}, "give one"),
                    ({"busy": {"h0": 0.9}}, "needs --slow-host h0"), ({"busy": {"h9": 0.9}}, "no host 'h9'")):
        with pytest.raises(DproError, match=msg):
            slow_hosts(ts, model, {"h1": 2.0}, **kw)


def test_slow_host_wire_bound_hand_computed():
    """--slow-host h1=F --host-busy h1=0.9 --wire-mbps R on the job of test_slow_host_hand_computed: the
    collectives whose fastest profiled instance took their wire's time at the goodput G = R x 1448/1514 (within
    15 %) were bound by the wire's rate; that share p_w of the host's transfer time takes max(t, F u t) (the
    host's CPU work in it, u t, overlaps the wire), the rest t (1 + u (F - 1)).  The split and the computation
    factor (2.947973 at F = 2) do not change.

    Both buckets' fastest instance: 810 us (900 us x 0.9); 2 ranks, each moves the bucket's bytes (2 ring
    steps of S/2): bucket0 4 MB, bucket1 2 MB; link-model time (1e9 B/s) 4 ms and 2 ms, t = 6 ms; u = 0.876875.

        G = 4e6 / 810 us:  rho0 = 810 / 810 = 1.0 (wire),  rho1 = 810 / 405 = 2.0 (the hosts held it)
            p_w = 4 / 6,   F = 2: F u = 1.75375 > 1, the slowed work outlasts the wire:
                           transfers x (1/3) 1.876875 + (2/3) 1.75375 = 1.794792
                           F = 1.1: F u = 0.9645625 <= 1, the work still fits under the wire:
                           x (1/3)(1 + 0.1 u) + 2/3 = 1.029229 (= the twelfth pass's 1 + (1 - p_w) u (F - 1))
        G = 2e6 / 810 us:  rho0 = 0.5 (faster than the rate: not bound), rho1 = 1.0 (wire)
            p_w = 2 / 6,   F = 2: x (2/3) 1.876875 + (1/3) 1.75375 = 1.835833
        G = 1e12:          rho = 2000 both: p_w = 0, x 1.876875 (as without --wire-mbps)
    """
    from dpro_kit.whatif import TCP_EFFICIENCY, fastest_collectives, wire_bound_share
    ts = _with_cpu_record(tiny_traceset(workers=2, hosts=2, iterations=3))
    model = CommModel(default=LinkModel(0.0, 1e9))
    assert fastest_collectives(ts) == {"bucket0": (4_000_000, pytest.approx(810.0)),
                                       "bucket1": (2_000_000, pytest.approx(810.0))}
    mbps = lambda g: g * 8 / 1e6 / TCP_EFFICIENCY                     # noqa: E731  line rate of goodput g (B/s)
    share, rho = wire_bound_share(ts, model, "w1", mbps(4e6 / 810e-6))
    assert share == pytest.approx(4 / 6) and rho == {"bucket0": pytest.approx(1.0), "bucket1": pytest.approx(2.0)}
    out, m, info = slow_hosts(ts, model, {"h1": 2.0}, busy={"h1": 0.9}, wire_mbps=mbps(4e6 / 810e-6))
    assert info["w1"]["compute_factor"] == pytest.approx(1 + 3.60375 / 1.85, abs=1e-4)    # as without it
    assert info["w1"]["wire_bound_share"] == pytest.approx(0.6667, abs=1e-4)
    f2 = 1.876875 / 3 + 2 / 3 * 1.75375
    assert info["w1"]["transfer_factor"] == pytest.approx(f2, abs=1e-4)
    assert m.transfer_us(2e6, "link:h0->h1") == pytest.approx(2000 * f2)
    assert m.transfer_us(2e6, "link:h0:upload") == pytest.approx(2000)        # h0's own interface
    _, m11, info11 = slow_hosts(ts, model, {"h1": 1.1}, busy={"h1": 0.9}, wire_mbps=mbps(4e6 / 810e-6))
    assert info11["w1"]["transfer_factor"] == pytest.approx(1 + 0.876875 * 0.1 / 3, abs=1e-4)
    _, m2, info2 = slow_hosts(ts, model, {"h1": 2.0}, busy={"h1": 0.9}, wire_mbps=mbps(2e6 / 810e-6))
    assert info2["w1"]["wire_bound_share"] == pytest.approx(1 / 3, abs=1e-4)
    assert info2["w1"]["transfer_factor"] == pytest.approx(2 / 3 * 1.876875 + 1.75375 / 3, abs=1e-4)
    _, m3, info3 = slow_hosts(ts, model, {"h1": 2.0}, busy={"h1": 0.9}, wire_mbps=mbps(1e12))
    assert info3["w1"]["wire_bound_share"] == 0.0
    assert info3["w1"]["transfer_factor"] == pytest.approx(1.876875, abs=1e-4)
    # in the built graph: the 2 ms / 1 ms ring steps of h1's links at x 1.794792
    from dpro_kit.graph import build_global_dfg
    g = build_global_dfg(out, comm_model=m)
    sends = sorted({round(d["dur"], 1) for _, d in g.nodes(data=True) if d.get("kind") == "SEND"})
    assert sends == [pytest.approx(1794.8, abs=0.1), pytest.approx(3589.6, abs=0.1)]
    # --bandwidth-mbps after --slow-host (whatif.apply's order) keeps the host's stretch on the new rate
    from dpro_kit.whatif import with_bandwidth
    m8 = with_bandwidth(m, 8000)
    assert m8.transfer_us(2e6, "link:h0->h1") == pytest.approx(2e6 / (8000e6 / 8 * TCP_EFFICIENCY) * 1e6 * f2)
    # no traced collectives (COMM events): nothing is known to be wire-bound, every transfer stretched
    from dataclasses import replace
    no_comm = replace(ts, events=ts.events[ts.events["kind"].astype(str) != "COMM"])
    assert wire_bound_share(no_comm, model, "w1", 1000.0) == (0.0, {})
    for bad in (0.0, -5.0, float("inf")):
        with pytest.raises(DproError, match="line rate must be a positive"):
            slow_hosts(ts, model, {"h1": 2.0}, wire_mbps=bad)


def test_transfer_factor_hand_computed():
    """whatif.transfer_factor: CPU-paced t (1 + u (F - 1)), wire-paced max(1, F u), mixed by p_w."""
    from dpro_kit.whatif import transfer_factor
    assert transfer_factor(2.0, 0.25) == pytest.approx(1.25)                 # CPU-paced: its CPU part twice as long
    assert transfer_factor(2.0, 0.25, 1.0) == 1.0                            # wire-paced, 2 x 0.25 <= 1: fits under
    assert transfer_factor(2.0, 0.6, 1.0) == pytest.approx(1.2)              # 2 x 0.6 of t: the work outlasts the wire
    assert transfer_factor(2.0, 0.6, 0.5) == pytest.approx(0.5 * 1.6 + 0.5 * 1.2)
    assert transfer_factor(0.5, 0.6) == pytest.approx(0.7)                   # F < 1: CPU-paced shrinks,
    assert transfer_factor(0.5, 0.6, 1.0) == 1.0                             # wire-paced keeps its time


def test_slow_host_from_the_thread_record_hand_computed():
    """Where the collector recorded its training thread's schedstat, --slow-host takes the host's CPU wall time
    from the profile: C + D, D the time per step that thread waited for its core (thread_wait x T).

    The job of test_slow_host_hand_computed (W = 1.85, T = 9.85, C = 3.85 ms, t = 6 ms) with thread_wait 0.1:
        D = 0.985, C/s = 4.835, u = 2.985 / 8 = 0.373125, R_t = min(2.985, 2.23875) = 2.23875
        F = 2:   transfers x 1.373125, computation x 1 + (4.835 - 2.23875) / 1.85 = 2.403378
        F = 0.5: transfers x 1 - 0.5 u = 0.8134375, computation x 1 - 0.5 x 2.59625 / 1.85 = 0.298311
    With 0.5 ms per step of quota stops recorded (throttled_us 500): they are run-queue wait too, not a share,
        D = 0.485, C/s = 4.335, u = (4.335 - 1.85) / (9.85 - 0.5 - 1.85) = 0.331333 (idle_cpu takes the stops out)
    """
    from dataclasses import replace
    ts = _with_cpu_record(tiny_traceset(workers=2, hosts=2, iterations=3))
    rec = {"cpus": 3.85 / 9.85, "thread_cpus": 0.18, "thread_wait": 0.1}
    ts = replace(ts, manifest=replace(ts.manifest, extra={**ts.manifest.extra, "cpu_use": {"w1": rec}}))
    model = CommModel(default=LinkModel(0.0, 1e9))
    split = host_cpu_split(ts, model, "h1")["w1"]
    assert split["cpu_source"] == "process+wait"
    assert split["cpu_ms"] == pytest.approx(4.835)
    assert split["idle_cpu"] == pytest.approx(0.373125)
    assert split["transfer_cpu_ms"] == pytest.approx(2.23875)
    out, m, info = slow_hosts(ts, model, {"h1": 2.0})
    assert info["w1"]["transfer_factor"] == pytest.approx(1.373125, abs=1e-4)
    assert info["w1"]["compute_factor"] == pytest.approx(1 + 2.59625 / 1.85, abs=1e-4)
    _, mh, infoh = slow_hosts(ts, model, {"h1": 0.5})
    assert infoh["w1"]["transfer_factor"] == pytest.approx(0.8134375, abs=1e-4)
    assert infoh["w1"]["compute_factor"] == pytest.approx(1 - 0.5 * 2.59625 / 1.85, abs=1e-4)
    # given explicitly, --cpu-share and --host-busy win over the record
    assert host_cpu_split(ts, model, "h1", 0.5)["w1"]["cpu_ms"] == pytest.approx(7.7)
    assert host_cpu_split(ts, model, "h1", busy=0.9)["w1"]["cpu_source"] == "busy"
    thr = replace(ts, manifest=replace(ts.manifest, extra={**ts.manifest.extra,
                                                           "cpu_use": {"w1": {**rec, "throttled_us": 500.0}}}))
    s2 = host_cpu_split(thr, model, "h1")["w1"]
    assert s2["cpu_ms"] == pytest.approx(4.335) and s2["idle_cpu"] == pytest.approx(2.485 / 7.5)
    # an older trace (no thread record): the process CPU alone, as before
    assert host_cpu_split(_with_cpu_record(tiny_traceset(workers=2, hosts=2, iterations=3)), model,
                          "h1")["w1"]["cpu_source"] == "process"


def test_thread_schedstat_counts_this_threads_cpu():
    """The collector's per-step reading of its training thread (dpro_torch.recorder.thread_schedstat): this
    thread's id and CPU time, which grows by the CPU it burns (the kernel updates it at least every tick),
    and another thread's reading is its own."""
    import threading
    import time
    from dpro_torch.recorder import thread_schedstat
    a = thread_schedstat()
    assert a is not None and a[0] == threading.get_native_id() and a[1] > 0 and a[2] >= 0
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:      # 50 ms of this thread's CPU, however long it takes
        pass
    b = thread_schedstat()
    assert b[0] == a[0] and b[1] - a[1] >= 0.04e9
    other = []
    th = threading.Thread(target=lambda: other.append(thread_schedstat()))
    th.start()
    th.join()
    assert other[0][0] != a[0]


def test_bench_busy_fraction_from_sched_records():
    """bench/stragglers.py: the busy part of the "busy" model, from the balanced plain jobs' --sched records
    only (the lightest neighbour, every link at the rate, no quota): median of (CPU + wait) / window."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rec = lambda cpu, wait, win: {"host2": {"main_cpu_ms": cpu, "main_wait_ms": wait, "window_ms": win}}  # noqa: E731
    jobs = [
        {"tag": "003-cnn-plain", "rates": [1000.0] * 3, "cpus": [None] * 3, "neighbours": {"2": 1024}, "sched": rec(450, 450, 1000)},
        {"tag": "004-cnn-plain", "rates": [1000.0] * 3, "cpus": [None] * 3, "neighbours": {"2": 2048}, "sched": rec(300, 700, 1000)},
        {"tag": "005-cnn-plain", "rates": [1000.0, 1000.0, 500.0], "cpus": [None] * 3, "neighbours": {"2": 1024},
         "sched": rec(100, 100, 1000)},                                            # a link cut: not balanced
        {"tag": "006-cnn-prof", "rates": [1000.0] * 3, "cpus": [None] * 3, "neighbours": {"2": 1024}, "sched": rec(1, 1, 1000)},
        {"tag": "007-cnn-plain", "rates": [1000.0] * 3, "cpus": [None] * 3, "neighbours": {"2": 1024}, "sched": rec(500, 480, 1000)},
        {"tag": "008-cnn-plain", "rates": [1000.0] * 3, "cpus": [None] * 3, "neighbours": {"2": 1024}, "sched": rec(520, 520, 1000)},
    ]
    sc = bench.balanced_scheds(jobs, 1000.0)
    assert len(sc) == 3                                   # 003, 007, 008
    assert bench.busy_fraction(sc, "host2") == pytest.approx(0.98)      # 0.9, 0.98, 1.0 (1.04 clipped)
    assert bench.busy_fraction(sc, "host0") is None
    two = [dict(j, neighbours=None, rates=[200.0, 200.0]) for j in jobs[:1]]
    assert bench.busy_fraction(bench.balanced_scheds(two, 200.0), "host2") == pytest.approx(0.9)


def test_format_attribution_core_wait():
    """The --stragglers text block adds a 'core wait' column where the record has the training thread's wait
    for its core (the part of its step), '-' for a rank without it."""
    from dpro_kit.stragglers import format_attribution
    doc = {"baseline_ms": 65.5, "first": "host1/1", "ranks": [
        {"node": "host1/1", "rank": 1, "compute_ms": 43.0, "compute_vs_median": 1.4, "saved_ms": 20.0,
         "saved_pct": 30.5, "late_start_ms": 0.0, "cpus_used": 0.43, "limit_cpus": None, "throttled_ms": 0.0,
         "core_wait": 0.342},
        {"node": "host0/0", "rank": 0, "compute_ms": 17.8, "compute_vs_median": 0.6, "saved_ms": 0.1,
         "saved_pct": 0.2, "late_start_ms": 1.0, "cpus_used": 0.39, "limit_cpus": None, "throttled_ms": 0.0}]}
    lines = format_attribution(doc).splitlines()
    assert lines[1].endswith("core wait") and lines[2].endswith("0.34") and lines[3].endswith("-")
    no_wait = format_attribution({**doc, "ranks": [{k: v for k, v in r.items() if k != "core_wait"}
                                                   for r in doc["ranks"]]})
    assert "core wait" not in no_wait


def test_bench_sched_window_from_train_py():
    """bench/stragglers.py SchedPoll.summary: with train.py's training window (perf_counter start, end) the main
    thread's CPU is taken over exactly that window; with its length alone the window ends at the last interval
    the thread computed, which takes in a post-training burst.  Synthetic samples every 0.1 s: 0.44 CPU while
    training (0 - 2 s), 0.95 for 0.8 s after it, then idle:

        (0, 2):  880 ms of CPU in 2000 ms (0.44)
        2 s:     the window slides to 0.8 - 2.8 s: 0.44 x 1200 + 0.95 x 800 = 1288 ms (0.644)
    """
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    cpu = lambda t: 0.44 * min(t, 2.0) + 0.95 * min(max(t - 2.0, 0.0), 0.8)     # noqa: E731  seconds of CPU at t
    poll = bench.SchedPoll("nothing")
    poll.samples = [(100.0 + k / 10, {"host1": {"threads": {7: (round(cpu(k / 10) * 1e9), 1000 * k)}, "throttled": 0}})
                    for k in range(31)]
    new = poll.summary({"host1": (100.0, 102.0)})["host1"]
    assert new["window_ms"] == pytest.approx(2000.0) and new["main_cpu_ms"] == pytest.approx(880.0)
    old = poll.summary({"host1": 2.0})["host1"]
    assert old["window_ms"] == pytest.approx(2000.0) and old["main_cpu_ms"] == pytest.approx(1288.0)


def test_bench_prof_args(tmp_path):
    """bench/stragglers.py model "prof": --slow-host and the links' rate, how busy the host was from the profile;
    --cpu-share only where a base neighbour shared the host's core and the trace lacks the thread record."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    old, new = tmp_path / "old", tmp_path / "new"
    for d, rec in ((old, {"cpus": 0.6}), (new, {"cpus": 0.6, "thread_cpus": 0.45, "thread_wait": 0.4})):
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"extra": {"cpu_use": {"host2/2": rec}}}))
    assert bench.prof_args(str(old), 2, 1.5, 200.0) == ["--slow-host", "host2=1.5", "--wire-mbps", "200"]
    assert bench.prof_args(str(old), 2, 2.0, 1000.0, 1024)[-2:] == ["--cpu-share", "host2=0.5"]
    assert bench.prof_args(str(new), 2, 2.0, 1000.0, 1024) == ["--slow-host", "host2=2", "--wire-mbps", "1000"]


def test_bench_ab_split():
    """bench/stragglers.py --ab: the steps of one job by the phase they lie wholly in (rank 0's clock, the slowest
    rank's time), less each phase's first `settle` steps; a step across a switch counts for neither phase.

        rank 0: ten 100 ms steps from 10.0 s; rank 1 (same steps) 100 ms x 5, then 200 ms x 5
        switches: balanced at 9.0, 1/2 at 10.45, balanced at 10.75
        10.0-10.4: 4 balanced steps of 100 ms; 10.4-10.5 across a switch; 10.5-10.7: 2 at 1/2 (200 ms, rank 1's);
        10.7-10.8 across; 10.8-11.0: 2 balanced of 200 ms.  settle=1 drops the first of each phase."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    doc = {"iteration_times_s": {"0": [0.1] * 10, "1": [0.1] * 5 + [0.2] * 5},
           "train_window_perf_counter_s": {"0": [10.0, 11.0], "1": [10.0, 11.5]}}
    log = [(9.0, None), (10.45, 2.0), (10.75, None)]
    steps, phases = bench.ab_split(doc, log, settle=0)
    assert steps == {None: [100.0] * 4 + [200.0] * 2, 2.0: [200.0] * 2}
    assert phases == [(None, 100.0), (2.0, 200.0), (None, 200.0)]
    steps, _ = bench.ab_split(doc, log, settle=1)
    assert steps == {None: [100.0] * 3 + [200.0], 2.0: [200.0]}


def test_bench_set_slice():
    """bench/stragglers.py --neighbour-slice-us: a process's EEVDF slice set through sched_setattr shows in /proc/PID/sched
    (se.slice, ns); skipped where the kernel has no per-task slice (before 6.12) or no /proc/PID/sched."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    p = subprocess.Popen(["sleep", "30"])
    try:
        f = Path(f"/proc/{p.pid}/sched")
        if not f.exists() or "se.slice" not in f.read_text():
            pytest.skip("no per-task slice in /proc/PID/sched")
        try:
            bench.set_slice(p.pid, 250)
        except OSError as e:       # EINVAL: a kernel without the slice; EPERM: not allowed here
            pytest.skip(str(e))
        line = next(x for x in f.read_text().splitlines() if x.startswith("se.slice"))
        assert int(line.split(":")[1]) == 250_000
    finally:
        p.kill()
        p.wait()


def test_bench_phase_threads():
    """bench/stragglers.py --ab's thread record, per phase: the thread with the most CPU in the phase is the training
    thread (its CPU, wait for a core and times run, over the phase's wall time), the rest of its group is 'other';
    /proc/stat's softirq (7th field) and busy (all but idle and iowait) in CPUs.

        phase 1 (0-1 s, balanced): tid 7 ran 0.5 s, waited 0.01 s, was run 100 times; tid 8 ran 0.1 s
        phase 2 (1-3 s, 1/2): tid 7 ran 0.4 s, waited 1.0 s, 200 runs; tid 8 ran 0.8 s (now the main thread)
        /proc/stat over phase 2 (2 s, 100 Hz): softirq 20 ticks -> 0.1 CPU, steal 60 -> 0.3; 300 ticks busy, 100 idle -> 1.5 CPUs"""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import stragglers as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    log = [(0.0, None), (1.0, 2.0), (3.0, None)]
    th = [{"host1": {"7": [0, 0, 0], "8": [0, 0, 0]}},
          {"host1": {"7": [500_000_000, 10_000_000, 100], "8": [100_000_000, 0, 50]}},
          {"host1": {"7": [900_000_000, 1_010_000_000, 300], "8": [900_000_000, 0, 90]}, "nb1": {}}]
    ps = [[0] * 8, [0] * 8, [200, 0, 20, 100, 0, 0, 20, 60]]
    out = bench.phase_threads(log, th, ps)
    assert out[0] == {"F": None, "s": 1.0, "host1": {"main_cpu": 0.5, "main_wait": 0.01, "main_runs_per_s": 100.0,
                                                     "other_cpu": 0.1}, "softirq": 0.0, "steal": 0.0, "busy": 0.0}
    assert out[1] == {"F": 2.0, "s": 2.0, "host1": {"main_cpu": 0.4, "main_wait": 0.0, "main_runs_per_s": 20.0,
                                                    "other_cpu": 0.2}, "softirq": 0.1, "steal": 0.3, "busy": 1.5}


def test_cli_slow_host():
    """Through the CLI: the recorded 2-host trace has no CPU record, so --slow-host is --slow-rank of its
    rank; bad input is one line and exit 2."""
    host = _replay_json("--slow-host", "host1=1.5")
    rank = _replay_json("--slow-rank", "1=1.5")
    assert host["iteration_time_ms"] == pytest.approx(rank["iteration_time_ms"])
    assert host["slow_host"]["host1/1"]["cpu_ms"] is None and host["whatif"]["slow_host"] == {"host1": 1.5}
    for args, msg in ((["--slow-host", "host9=2"], "no host 'host9'"),
                      (["--cpu-share", "host1=0.5"], "--cpu-share needs --slow-host"),
                      (["--host-busy", "host1=0.9"], "--host-busy needs --slow-host"),
                      (["--slow-host", "host1=2", "--host-busy", "host1=1.2"], "(0, 1]"),
                      (["--wire-mbps", "200"], "--wire-mbps needs --slow-host"),
                      (["--slow-host", "host1=2", "--wire-mbps", "0"], "line rate must be a positive")):
        bad = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(TWO_HOST), *args],
                             capture_output=True, text=True, cwd=ROOT)
        assert bad.returncode == 2 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) <= 2, bad.stderr


def _replay_json(*args):
    p = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(TWO_HOST), "--json", "-q", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_cli_slowed_rank_is_named_first_and_slows_the_job():
    """A real recorded 2-host trace: rank 0 made 1.5x slower is what the attribution names first."""
    base = _replay_json()
    slow = _replay_json("--slow-rank", "0=1.5", "--stragglers")
    assert slow["iteration_time_ms"] > base["iteration_time_ms"]
    st = slow["stragglers"]
    assert st["first"] == "host0/0" and st["ranks"][0]["saved_ms"] > 0
    link = _replay_json("--slow-link", "host1=0.5")
    assert link["iteration_time_ms"] > base["iteration_time_ms"]
    bad = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(TWO_HOST), "--slow-rank", "1=x"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "expected RANK=FACTOR" in bad.stderr



def test_saved_over_iterations_hand_computed():
    from dpro_kit.stragglers import saved_over_iterations
    base = {"1": 100.0, "2": 80.0, "3": 120.0, "4": 100.0}
    fixed = {"1": 90.0, "2": 80.0, "3": 90.0, "4": 99.5, "5": 10.0}   # "5" not in base: ignored
    frac, held = saved_over_iterations(base, fixed)
    assert frac == pytest.approx(1 - 359.5 / 400.0)                  # the whole run's saving, paired
    assert held == [2, 4]                                             # 10 % and 25 % > 1 %; 0 and 0.5 % not
    assert saved_over_iterations({"1": 5.0}, {"1": 4.0}) == (None, None)


def test_recorded_3host_slowed_host_is_named_over_all_iterations():
    """A real 3-host CNN job at 200 Mbit/s with host2's CPU budget at 1/1.5 of the others' (the
    straggler bench's reverse profile, examples/traces/ddp-3host-200mbit-slowed/README.md): host2
    computes the longest in 10 of 12 profiled iterations, but not in the one whose replay is the
    median.  The saving over all iterations names host2 first; the saving of the median iteration
    alone named host0 (the fifth run's wrong answer, docs/stragglers.md)."""
    p = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(THREE_HOST_SLOWED), "--json", "-q",
                        "--stragglers"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    st = doc["stragglers"]
    by = {r["node"]: r for r in st["ranks"]}
    assert st["first"] == "host2/2", st
    h2 = by["host2/2"]
    assert h2["held_back_iterations"][1] == 12 and h2["held_back_iterations"][0] >= 7, st
    assert h2["saved_ms"] > 3 * max(by["host0/0"]["saved_ms"], by["host1/1"]["saved_ms"]), st
    assert h2["like_median_ms"] == pytest.approx(st["baseline_ms"] - h2["saved_ms"], abs=2e-3)
    # the one median iteration: host2 is not the slowest there, so fixing it saves less than fixing host0
    assert h2["saved_median_iteration_ms"] < by["host0/0"]["saved_median_iteration_ms"], st
    # the rank-level evidence agrees: the most computation, the latest into collectives, the most stopped
    assert h2["compute_vs_median"] > 1.2 and h2["late_start_ms"] > max(by["host0/0"]["late_start_ms"],
                                                                        by["host1/1"]["late_start_ms"]), st
    assert h2["limit_cpus"] == 0.4 and h2["throttled_ms"] > 3 * max(by["host0/0"]["throttled_ms"],
                                                                   by["host1/1"]["throttled_ms"]), st


def test_report_shows_the_attribution(tmp_path):
    from dpro_kit.report import data
    d = data.collect(TWO_HOST, iterations=1)
    att = d.stragglers["attribution"]
    assert {r["node"] for r in att["ranks"]} == {"host0/0", "host1/1"}
    assert all(r["saved_ms"] is not None for r in att["ranks"])


def _real_job_unusable() -> str | None:
    from conftest import netns_unusable_reason
    from dpro_kit import jobs
    if jobs.cgroup_cpu_root() is None:
        return "no writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    return netns_unusable_reason("strt")


@pytest.mark.skipif(_real_job_unusable() is not None, reason=str(_real_job_unusable()))
def test_real_slowed_host_is_named_first(tmp_path):
    """A real 2-host DDP job (CNN, gloo, 1000 Mbit/s) with host1's CPU budget half host0's (10 ms CFS
    period: the cut slows host1's computation, docs/stragglers.md), profiled on both hosts: the
    attribution names host1 first, its traced computation is well above host0's, and fixing it
    (--like-median 1) is predicted to speed the job up."""
    from conftest import TRAIN
    from dpro_kit.jobs import run_job
    train = [sys.executable, str(TRAIN), "--model", "cnn", "--batch-size", "32", "--threads", "1",
             "--backend", "gloo", "--warmup", "3", "--iters", "10", "--quiet"]
    trace = tmp_path / "trace"
    log = open(tmp_path / "jobs.log", "w")
    r = run_job(train, hosts=2, rate_mbit=1000, cpus_per_host=[1.0, 0.5], cpu_period_us=10000, cpu_shares=8192,
                profile=trace, steps="6:10", env={"DPRO_QUIET": "1"}, prefix="strt", log=log, timeout=240)
    assert (trace / "manifest.json").exists(), (r, (tmp_path / "jobs.log").read_text()[-2000:])
    p = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(trace), "--json", "-q", "--stragglers"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    st = doc["stragglers"]
    by = {x["node"]: x for x in st["ranks"]}
    assert st["first"] == "host1/1", st
    assert by["host1/1"]["like_median_ms"] < doc["iteration_time_ms"], st
    # the collector recorded each rank's cgroup quota and how long it stopped the rank per step
    h1, h0 = by["host1/1"], by["host0/0"]
    assert h1["limit_cpus"] == 0.5 and h0["limit_cpus"] == 1.0, st
    assert h1["throttled_ms"] is not None and h1["throttled_ms"] >= 0, st
    assert 0 < h1["cpus_used"] <= 0.6, st
    # and its training thread's own CPU and wait for a core per step (/proc/thread-self/schedstat): a part of
    # the process's CPU (within a scheduler tick's staleness per step)
    use = json.loads((trace / "manifest.json").read_text())["extra"]["cpu_use"]
    for n in ("host0/0", "host1/1"):
        assert 0 < use[n]["thread_cpus"] <= use[n]["cpus"] + 0.1 and use[n]["thread_wait"] >= 0, use
    if h0["cpus_used"] and h0["cpus_used"] >= 1.5 * h1["cpus_used"]:
        # host0 really got more CPU than host1: its ops ran faster.  Half the budget gives ~1.3-2x the traced
        # computation on a quiet machine (1.26x beside a fuzz run); the bound asks for a clear margin over
        # per-op noise.  (A fresh-clone CI run at load ~7, beside
        # other engineers' benches, slowed host0 as much as host1's quota did: 48.7 vs 47.8 ms, both named
        # right; there the attribution above is the test.)
        assert h1["compute_ms"] > 1.15 * h0["compute_ms"], st
    if h1["cpus_used"] >= 0.4:
        # the quota bound: host1 was stopped by it, more than host0, and the replay says so.  (On a
        # machine so loaded that host1 could not even use its 0.5 CPU, the quota never stopped it: a
        # fresh-clone CI run beside three benches and a fuzz run, load ~10, recorded 0 ms.)
        assert h1["throttled_ms"] > 0 and h1["throttled_ms"] > by["host0/0"]["throttled_ms"], st
        # the quota's stops are run-queue wait of the training thread, and the attribution shows it
        assert use["host1/1"]["thread_wait"] > use["host0/0"]["thread_wait"], use
        assert h1["core_wait"] == use["host1/1"]["thread_wait"], st
        assert any(w.startswith("host1/1 is held back by its cgroup's CPU limit (0.5 CPU)")
                   for w in doc["warnings"]), doc["warnings"]


def test_cpu_limited_from_recorded_use():
    """placement.cpu_limited reads the collector's per-node CPU use leniently and flags the quota-bound rank."""
    from dpro_kit.placement import cpu_limited, placement_warnings
    from dpro_kit.schema import Facts
    extra = {"measured_iteration_ms_per_node": {"h0/0": 20.0, "h1/1": 20.0, "h2/2": 20.0, "h3/3": 20.0},
             "cpu_use": {"h0/0": {"cpus": 0.55, "throttled_us": 100.0, "limit_cpus": 1.0},    # 0.5 % throttled: fine
                         "h1/1": {"cpus": 0.49, "throttled_us": 6000.0, "limit_cpus": 0.5},   # 30 %: limited
                         "h2/2": {"cpus": 0.95, "throttled_us": None, "limit_cpus": 1.0},     # busy at its limit
                         "h3/3": {"cpus": float("nan"), "throttled_us": -5, "limit_cpus": "x"}}}
    assert Facts.from_extra(extra).cpu_use["h3/3"] == {"cpus": None, "throttled_us": None, "limit_cpus": None,
                                                              "period_us": None}
    got = {r["node"]: r for r in cpu_limited(extra)}
    assert sorted(got) == ["h1/1", "h2/2"]
    assert got["h1/1"]["throttled_ms"] == 6.0 and abs(got["h1/1"]["throttled_share"] - 0.3) < 1e-12
    w = [x for x in placement_warnings(extra) if "CPU limit" in x]
    assert w[0].startswith("h1/1 is held back by its cgroup's CPU limit (0.5 CPU): used 0.49 CPU per step, "
                           "stopped 6.0 ms per step by the quota")
    assert cpu_limited({}) == [] and cpu_limited({"cpu_use": "x"}) == []
