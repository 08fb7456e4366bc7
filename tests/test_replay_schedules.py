"""Exact schedules of the replayer (dPRO §4.3) on small hand-built graphs.

Semantics under test (documented in dpro_kit/replay/_kernel.py):

* each device has a queue and a clock; an op enters its device's queue when its
  last predecessor ends; a device starts at ``max(clock, release time)``;
* queue order: lowest ``priority``, then earliest ready time (FIFO), then the
  lowest index in the compiled graph (``CompiledGraph.keys``, a topological
  order -- for independent source ops that is node insertion order);
* ops with device ``""`` take no device and run as soon as they are ready;
* iteration time = makespan for one iteration, else the gap between the ends
  of the last two iterations.

Every expected number below is computed by hand from these rules.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import networkx as nx
import pytest

from dpro_kit.errors import GraphError
from dpro_kit.graph import add_op
from dpro_kit.replay import compile_graph, replay


def times(res, iteration: int = 0) -> dict[str, tuple[float, float]]:
    """``{key: (start, end)}`` of one replayed iteration."""
    n = res.n
    return {k: (float(res.start[iteration * n + i]), float(res.end[iteration * n + i]))
            for i, k in enumerate(res.graph.keys)}


def chain(g: nx.DiGraph, *keys: str) -> None:
    for u, v in zip(keys, keys[1:]):
        g.add_edge(u, v)


# --------------------------------------------------------------------------- basic shapes

def test_chain_on_one_device():
    g = nx.DiGraph()
    add_op(g, "A", device="w0:compute", dur=3)
    add_op(g, "B", device="w0:compute", dur=4)
    add_op(g, "C", device="w0:compute", dur=5)
    chain(g, "A", "B", "C")
    res = replay(g)
    assert times(res) == {
        "A": (0, 3),    # source, device idle at 0
        "B": (3, 7),    # 3 + 4
        "C": (7, 12),   # 7 + 5
    }
    assert res.makespan_us == 12          # 3 + 4 + 5
    assert res.iteration_time_us == 12    # one iteration: the makespan
    assert [res.key(r) for r in res.critical_path()] == ["A", "B", "C"]


def test_fan_out_fan_in_across_two_devices():
    #        +-> B (d0, 5) -+
    # A (d0, 2)             +-> D (d1, 1)
    #        +-> C (d1, 3) -+
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=2)
    add_op(g, "B", device="d0", dur=5)
    add_op(g, "C", device="d1", dur=3)
    add_op(g, "D", device="d1", dur=1)
    g.add_edges_from([("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")])
    res = replay(g)
    assert times(res) == {
        "A": (0, 2),
        "B": (2, 7),    # d0 free at 2; 2 + 5
        "C": (2, 5),    # d1 idle, ready at 2; 2 + 3 (runs in parallel with B)
        "D": (7, 8),    # ready at max(7, 5) = 7; d1 idle since 5; 7 + 1
    }
    assert res.iteration_time_us == 8
    assert [res.key(r) for r in res.critical_path()] == ["A", "B", "D"]  # C has slack 2


def test_independent_ops_on_one_device_tie_broken_by_compiled_index():
    # Both ready at 0 with equal priority: the lower index of the compiled
    # (topological) order wins; for sources this is node insertion order, NOT the
    # name order ("b" is inserted first).
    g = nx.DiGraph()
    add_op(g, "b", device="d0", dur=4)
    add_op(g, "a", device="d0", dur=2)
    cg = compile_graph(g)
    assert cg.keys == ["b", "a"]
    res = replay(g)
    assert times(res) == {"b": (0, 4), "a": (4, 6)}  # a waits for b: 4 + 2
    assert res.makespan_us == 6


def test_fifo_by_ready_time_beats_index():
    # L occupies d0 during [0, 10].  E and F both wait for d0:
    #   E has the lower compiled index but is ready at 6 (after S2 on d2, 6 us),
    #   F has the higher index but is ready at 2 (after S1 on d1, 2 us).
    # FIFO by ready time: F runs first when d0 frees at 10.
    g = nx.DiGraph()
    add_op(g, "L", device="d0", dur=10)
    add_op(g, "S2", device="d2", dur=6)
    add_op(g, "S1", device="d1", dur=2)
    add_op(g, "E", device="d0", dur=1)
    add_op(g, "F", device="d0", dur=1)
    g.add_edge("S2", "E")
    g.add_edge("S1", "F")
    cg = compile_graph(g)
    tb = dict(zip(cg.keys, cg.tiebreak))  # the queue's last tie-break (topological-generation index)
    assert tb["E"] < tb["F"]
    res = replay(g)
    t = times(res)
    assert t["L"] == (0, 10)
    assert t["F"] == (10, 11)   # ready at 2, waits for d0 until 10; 10 + 1
    assert t["E"] == (11, 12)   # ready at 6, queued behind F; 11 + 1
    assert res.makespan_us == 12


def test_same_ready_time_tie_uses_topological_index_of_successors():
    # G and H both become ready at 3 (end of A) while d0 is busy with L until 10.
    # Edge A->H is added before A->G, so H comes first in the topological order
    # (children of A are visited in edge order) and therefore runs first.
    g = nx.DiGraph()
    add_op(g, "L", device="d0", dur=10)
    add_op(g, "A", device="d1", dur=3)
    add_op(g, "G", device="d0", dur=2)
    add_op(g, "H", device="d0", dur=5)
    g.add_edge("A", "H")
    g.add_edge("A", "G")
    cg = compile_graph(g)
    tb = dict(zip(cg.keys, cg.tiebreak))
    assert tb["H"] < tb["G"]
    t = times(replay(g))
    assert t["H"] == (10, 15)   # 10 + 5
    assert t["G"] == (15, 17)   # 15 + 2


# --------------------------------------------------------------------------- links

def test_two_transfers_on_one_link_queue_behind_each_other():
    g = nx.DiGraph()
    add_op(g, "P1", device="w0:compute", dur=1)
    add_op(g, "P2", device="w0:compute", dur=1)
    add_op(g, "S1", device="link:h0->h1", dur=5, kind="SEND")
    add_op(g, "S2", device="link:h0->h1", dur=3, kind="SEND")
    add_op(g, "R1", device="w1:comm", dur=0, kind="RECV")
    add_op(g, "R2", device="w1:comm", dur=0, kind="RECV")
    g.add_edges_from([("P1", "S1"), ("P2", "S2"), ("S1", "R1"), ("S2", "R2")])
    t = times(replay(g))
    assert t["P1"] == (0, 1)
    assert t["P2"] == (1, 2)
    assert t["S1"] == (1, 6)    # ready at 1, link idle; 1 + 5
    assert t["S2"] == (6, 9)    # ready at 2 but the link is busy until 6; 6 + 3
    assert t["R1"] == (6, 6)
    assert t["R2"] == (9, 9)


def test_two_transfers_on_different_links_run_in_parallel():
    g = nx.DiGraph()
    add_op(g, "P1", device="w0:compute", dur=1)
    add_op(g, "P2", device="w0:compute", dur=1)
    add_op(g, "S1", device="link:h0->h1", dur=5, kind="SEND")
    add_op(g, "S2", device="link:h0->h2", dur=3, kind="SEND")
    g.add_edges_from([("P1", "S1"), ("P2", "S2")])
    res = replay(g)
    t = times(res)
    assert t["S1"] == (1, 6)    # 1 + 5
    assert t["S2"] == (2, 5)    # ready at 2, own link idle: 2 + 3 (overlaps S1)
    assert res.makespan_us == 6
    assert res.device_busy_us() == {"w0:compute": 2, "link:h0->h1": 5, "link:h0->h2": 3}


# --------------------------------------------------------------------------- device-less ops

def test_deviceless_virtual_op_takes_no_time_and_no_device():
    # A (d0, 3) -> V (device "", 0) -> B (d1, 2); V2 is a second virtual marker at the
    # same instant: device-less ops never queue behind each other.
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "V", device="", dur=0, kind="VIRTUAL")
    add_op(g, "V2", device="", dur=0, kind="VIRTUAL")
    add_op(g, "B", device="d1", dur=2)
    g.add_edges_from([("A", "V"), ("A", "V2"), ("V", "B")])
    res = replay(g)
    t = times(res)
    assert t["V"] == (3, 3)
    assert t["V2"] == (3, 3)
    assert t["B"] == (3, 5)     # 3 + 2
    assert res.makespan_us == 5
    assert res.device_of(res.graph.keys.index("V")) == ""
    assert set(res.device_busy_us()) == {"d0", "d1"}   # "" is not a device
    assert [res.key(r) for r in res.critical_path()] == ["A", "V", "B"]


def test_deviceless_ops_with_duration_overlap_freely():
    # two pure delays (no device) both start at 0 and end at 4; D waits for both
    g = nx.DiGraph()
    add_op(g, "X", device="", dur=4)
    add_op(g, "Y", device="", dur=4)
    add_op(g, "D", device="d0", dur=1)
    g.add_edges_from([("X", "D"), ("Y", "D")])
    t = times(replay(g))
    assert t == {"X": (0, 4), "Y": (0, 4), "D": (4, 5)}


# --------------------------------------------------------------------------- priorities

def test_lower_priority_value_runs_first_on_busy_device():
    # L (priority 0) runs [0, 10].  P1 (priority 5) is ready at 0, P2 (priority 1) only at 4
    # (after Q on d1): when d0 frees, priority beats both ready time and index.
    g = nx.DiGraph()
    add_op(g, "L", device="d0", dur=10, priority=0)
    add_op(g, "P1", device="d0", dur=1, priority=5)
    add_op(g, "Q", device="d1", dur=4)
    add_op(g, "P2", device="d0", dur=2, priority=1)
    g.add_edge("Q", "P2")
    t = times(replay(g))
    assert t["L"] == (0, 10)    # lowest priority among L, P1 at time 0
    assert t["P2"] == (10, 12)  # priority 1 < 5; 10 + 2
    assert t["P1"] == (12, 13)  # 12 + 1


def test_priority_does_not_preempt_running_op():
    # P (priority -1) becomes ready at 2 while L (priority 9) already runs: no preemption.
    g = nx.DiGraph()
    add_op(g, "L", device="d0", dur=10, priority=9)
    add_op(g, "Q", device="d1", dur=2)
    add_op(g, "P", device="d0", dur=1, priority=-1)
    g.add_edge("Q", "P")
    t = times(replay(g))
    assert t["L"] == (0, 10)
    assert t["P"] == (10, 11)


def _zero_time_release_graph(first_device: str) -> nx.DiGraph:
    # A keeps P busy until 5; Y (priority 0) waits in P's queue since 0.
    # C runs on Q until 5, then Z (zero duration, on Q) releases W (priority -1) at 5.
    # At t = 5 both Y and W are ready for P, so W (lower priority) must run first.
    g = nx.DiGraph()
    if first_device == "P":
        add_op(g, "A", device="P", dur=5)
        add_op(g, "C", device="Q", dur=5)
    else:
        add_op(g, "C", device="Q", dur=5)
        add_op(g, "A", device="P", dur=5)
    add_op(g, "Y", device="P", dur=3, priority=0)
    add_op(g, "Z", device="Q", dur=0)
    add_op(g, "W", device="P", dur=1, priority=-1)
    g.add_edges_from([("C", "Z"), ("Z", "W")])
    return g


def test_zero_time_device_op_release_seen_when_its_device_wakes_first():
    # Q gets device index 0 here, so Q's wake-up at 5 (which runs Z and releases W)
    # is processed before P's wake-up at 5.
    t = times(replay(_zero_time_release_graph("Q")))
    assert t["Z"] == (5, 5)
    assert t["W"] == (5, 6)     # priority -1 beats Y; 5 + 1
    assert t["Y"] == (6, 9)     # 6 + 3


def test_zero_time_device_op_release_seen_when_other_device_wakes_first():
    # Same graph, but P gets device index 0 (its first op is inserted first).
    t = times(replay(_zero_time_release_graph("P")))
    assert t["Z"] == (5, 5)
    assert t["W"] == (5, 6)     # as above: the order must not depend on device numbering
    assert t["Y"] == (6, 9)


# --------------------------------------------------------------------------- several iterations

def test_multi_iteration_serial_iterations():
    # A (d0, 3) -> B (d1, 5); iteration edge B -> A: iteration i+1 starts after B of i.
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d1", dur=5)
    g.add_edge("A", "B")
    g.graph["iteration_edges"] = [("B", "A")]
    res = replay(g, iterations=3)
    assert times(res, 0) == {"A": (0, 3), "B": (3, 8)}
    assert times(res, 1) == {"A": (8, 11), "B": (11, 16)}     # +8 per iteration
    assert times(res, 2) == {"A": (16, 19), "B": (19, 24)}
    assert res.makespan_us == 24           # 3 * (3 + 5)
    assert res.iteration_time_us == 8      # 24 - 16
    assert res.start.size == 6             # rows it * n + i


def test_multi_iteration_pipelined_steady_state_is_bottleneck_device():
    # iteration edge A -> A: next A only waits for this A (and d0), so iterations
    # overlap and the steady state is set by B on d1 (5 us > 3 us of A).
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d1", dur=5)
    g.add_edge("A", "B")
    g.graph["iteration_edges"] = [("A", "A")]
    res = replay(g, iterations=3)
    assert times(res, 0) == {"A": (0, 3), "B": (3, 8)}
    assert times(res, 1) == {"A": (3, 6), "B": (8, 13)}     # B ready at 6, d1 busy until 8
    assert times(res, 2) == {"A": (6, 9), "B": (13, 18)}    # B ready at 9, d1 busy until 13
    assert res.makespan_us == 18
    assert res.iteration_time_us == 5      # 18 - 13
    # critical path: A0 B0 B1 B2 (device order on d1), 3 + 5 + 5 + 5 = 18
    path = res.critical_path()
    assert [(res.key(r), int(res.iteration_of(r))) for r in path] == [("A", 0), ("B", 0), ("B", 1), ("B", 2)]


def test_iterations_must_be_positive():
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=1)
    with pytest.raises(GraphError):
        replay(g, iterations=0)


def test_cycle_in_dfg_is_rejected():
    # A -> B -> A can never run: replay must refuse, not return a partial schedule
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=1)
    add_op(g, "B", device="d0", dur=1)
    g.add_edges_from([("A", "B"), ("B", "A")])
    with pytest.raises(GraphError, match="cycle"):
        replay(g)


# --------------------------------------------------------------------------- partial replay

def _partial_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d0", dur=4)
    add_op(g, "C", device="d1", dur=5)
    add_op(g, "D", device="d1", dur=7)
    chain(g, "A", "B", "C")
    g.graph["iteration_edges"] = [("C", "A"), ("C", "B")]
    return g


def test_partial_replay_of_subgraph():
    g = _partial_graph()
    full = times(replay(g))
    # D (source, index before C on d1) runs [0, 7]; C ready at 7, d1 free at 7.
    assert full == {"A": (0, 3), "B": (3, 7), "D": (0, 7), "C": (7, 12)}
    res = replay(g, ops=["B", "C"])
    assert sorted(res.graph.keys) == ["B", "C"]
    assert times(res) == {"B": (0, 4), "C": (4, 9)}   # A and D are gone: B starts at 0; 4 + 5
    assert res.makespan_us == 9
    # only the iteration edge whose both ends are kept survives: C -> B
    res2 = replay(g, ops=["B", "C"], iterations=2)
    assert times(res2, 1) == {"B": (9, 13), "C": (13, 18)}
    assert res2.iteration_time_us == 9     # 18 - 9


_PARTIAL_TIE_SCRIPT = r"""
import json, networkx as nx
from dpro_kit.graph import add_op
from dpro_kit.replay import replay
g = nx.DiGraph()
for k in "abcdefghij":
    add_op(g, k, device="d0", dur=ord(k) - ord("a") + 1)
res = replay(g, ops=["c", "b", "a"])
print(json.dumps({k: [float(res.start[i]), float(res.end[i])] for i, k in enumerate(res.graph.keys)}))
"""


def test_partial_replay_tie_break_is_reproducible_across_processes():
    # a, b, c are independent sources on d0 (durations 1, 2, 3) in a graph of 10 ops.
    # Expected: the kept ops keep g's order, so a [0, 1], b [1, 3], c [3, 6], in every process.
    schedules = []
    for seed in ("0", "1", "2", "3", "4", "5", "6", "7"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _PARTIAL_TIE_SCRIPT], env=env, check=True,
                             capture_output=True, text=True).stdout
        schedules.append(json.loads(out))
    expected = {"a": [0, 1], "b": [1, 3], "c": [3, 6]}   # 0+1, 1+2, 3+3
    assert all(s == expected for s in schedules), schedules


# --------------------------------------------------------------------------- analyses

def test_utilisation_per_device():
    # A (d0, 3) -> B (d1, 5) -> V ("" , 0); makespan 8
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d1", dur=5)
    add_op(g, "V", device="", dur=0)
    chain(g, "A", "B", "V")
    res = replay(g)
    assert res.makespan_us == 8
    assert res.device_busy_us() == {"d0": 3, "d1": 5}
    assert res.utilisation() == pytest.approx({"d0": 3 / 8, "d1": 5 / 8})   # 0.375, 0.625


def test_utilisation_sums_over_iterations():
    # two serial iterations of A (d0, 3) -> B (d1, 5): makespan 16, each device busy twice
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d1", dur=5)
    g.add_edge("A", "B")
    g.graph["iteration_edges"] = [("B", "A")]
    res = replay(g, iterations=2)
    assert res.makespan_us == 16                   # 2 * 8
    assert res.device_busy_us() == {"d0": 6, "d1": 10}
    assert res.utilisation() == pytest.approx({"d0": 6 / 16, "d1": 10 / 16})


def test_execution_graph_has_device_order_edges():
    # X (d0, 2), Y (d0, 3) independent sources, X inserted first; Z (d0, 1) after X.
    # Schedule on d0: X [0, 2]; at 2 Y (ready 0) beats Z (ready 2): Y [2, 5], Z [5, 6].
    # W (d1, 4) after X: [2, 6], alone on d1.
    g = nx.DiGraph()
    add_op(g, "X", device="d0", dur=2)
    add_op(g, "Y", device="d0", dur=3)
    add_op(g, "Z", device="d0", dur=1)
    add_op(g, "W", device="d1", dur=4)
    g.add_edges_from([("X", "Z"), ("X", "W")])
    res = replay(g)
    assert times(res) == {"X": (0, 2), "Y": (2, 5), "Z": (5, 6), "W": (2, 6)}
    h = res.execution_graph()
    assert set(h.nodes) == {"X", "Y", "Z", "W"}
    assert set(h.edges) == {("X", "Z"), ("X", "W"), ("X", "Y"), ("Y", "Z")}
    assert h.edges["X", "Y"].get("order") is True      # device order only
    assert h.edges["Y", "Z"].get("order") is True
    assert "order" not in h.edges["X", "Z"]             # DFG edge
    assert "order" not in h.edges["X", "W"]
    assert h.nodes["Y"] == {"start": 2.0, "end": 5.0, "dur": 3.0, "device": "d0"}
    assert nx.is_directed_acyclic_graph(h)


def test_execution_graph_keeps_dfg_edge_when_it_is_also_device_order():
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=1)
    add_op(g, "B", device="d0", dur=1)
    g.add_edge("A", "B")
    h = replay(g).execution_graph()
    assert list(h.edges(data=True)) == [("A", "B", {})]


def test_execution_graph_of_several_iterations_uses_key_iteration_pairs():
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=3)
    add_op(g, "B", device="d1", dur=5)
    g.add_edge("A", "B")
    g.graph["iteration_edges"] = [("A", "A")]
    h = replay(g, iterations=2).execution_graph()
    assert set(h.nodes) == {("A", 0), ("B", 0), ("A", 1), ("B", 1)}
    # DFG edges in both copies, the iteration edge A0 -> A1 (also d0 order), and
    # the d1 order edge B0 -> B1 (B1 ready at 6, d1 busy until 8)
    assert set(h.edges) == {(("A", 0), ("B", 0)), (("A", 1), ("B", 1)), (("A", 0), ("A", 1)),
                            (("B", 0), ("B", 1))}
    assert h.edges[("B", 0), ("B", 1)].get("order") is True
    assert "order" not in h.edges[("A", 0), ("A", 1)]
    assert h.nodes[("B", 1)]["start"] == 8 and h.nodes[("B", 1)]["end"] == 13


# --------------------------------------------------------------------------- the kernel's event structures

def heapq_replay(dur, device, priority, indptr, succ, indeg0, ready0, ndev, tiebreak):
    """The kernel's rules (module docstring of dpro_kit/replay/_kernel.py) with one ``heapq`` of
    ``(time, key)`` events -- key ``i < n``: op ``i`` released, ``n + d``: device ``d`` wakes up, ``n + ndev
    + d``: its deferred wake-up -- instead of the kernel's radix heap of future instants plus a heap of the
    current instant's keys; the kernel must give the same schedule, op for op."""
    import heapq
    n = len(dur)
    w1, w2 = n, n + ndev
    ready, rpred, indeg = [float(x) for x in ready0], [-1] * n, [int(x) for x in indeg0]
    start, end, crit, prev = [0.0] * n, [0.0] * n, [-1] * n, [-1] * n
    clock, last, waiting, deferred = [0.0] * ndev, [-1] * ndev, [False] * ndev, [float("-inf")] * ndev
    queues: list[list] = [[] for _ in range(ndev)]
    ev = [(ready[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(ev)
    done = 0
    while ev:
        t, x = heapq.heappop(ev)
        if x < w1:
            d = int(device[x])
            if d >= 0:                              # into its device's queue
                heapq.heappush(queues[d], (priority[x], t, int(tiebreak[x]), x))
                if not waiting[d]:
                    waiting[d] = True
                    heapq.heappush(ev, (max(clock[d], t), w1 + d))
                elif dur[x] == 0.0 and deferred[d] == t and clock[d] <= t:
                    heapq.heappush(ev, (t, w1 + d))
                continue
            o, e = x, t + dur[x]
            start[o], end[o], crit[o], prev[o] = t, e, rpred[o], -1
        else:
            d, flag = (x - w1, 1) if x < w2 else (x - w2, 2)
            if clock[d] > t:
                continue
            if not queues[d]:
                waiting[d] = False
                continue
            _, r, _, o = queues[d][0]
            if flag == 1 and dur[o] > 0.0:          # zero-time ops released at t go first
                deferred[d] = t
                heapq.heappush(ev, (t, w2 + d))
                continue
            heapq.heappop(queues[d])
            e = t + dur[o]
            start[o], end[o] = t, e
            crit[o] = last[d] if last[d] >= 0 and clock[d] >= r else rpred[o]
            prev[o], last[d], clock[d] = last[d], o, e
            if queues[d]:
                heapq.heappush(ev, (e, w1 + d))
            else:
                waiting[d] = False
        done += 1
        for k in range(indptr[o], indptr[o + 1]):
            v = int(succ[k])
            if e >= ready[v]:
                ready[v], rpred[v] = e, o
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ev, (ready[v], v))
    return start, end, crit, prev, done


@pytest.mark.parametrize("seed", range(3))
def test_kernel_equals_one_heap_event_loop(seed):
    """simulate == heapq_replay on random DAGs: ties and zero-time ops, device-less ops, priorities,
    negative and zero ready times, times from 1e-9 to 1e12 (the radix heap's buckets), int32 and int64."""
    import numpy as np
    from dpro_kit.replay._kernel import simulate
    from dpro_kit.replay.engine import csr_from_edges
    rng = np.random.default_rng(seed)
    for it in range(150):
        n, ndev = int(rng.integers(1, 120)), int(rng.integers(1, 5))
        a, b = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
        keep = a != b
        src, dst = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
        dur = [rng.integers(0, 4, n).astype(float), rng.choice([0.0, 1e-9, 1.0, 1e6, 1e12], n),
               np.round(rng.exponential(10.0, n), 1) * (rng.random(n) > 0.2)][it % 3]
        dev = rng.integers(-1, ndev, n)
        prio = rng.integers(0, 3, n).astype(float) if it % 2 else np.zeros(n)
        ready = rng.choice([0.0, -5.0, 3.0, -0.0], n) if it % 5 == 0 else np.zeros(n)
        tb = rng.permutation(n)
        ip, sc, deg = csr_from_edges(n, src, dst)
        want = heapq_replay(dur, dev, prio, ip, sc, deg, ready, ndev, tb)
        dt = np.int32 if it % 2 else np.int64
        got = simulate(dur, dev.astype(dt), prio, ip.astype(dt), sc.astype(dt), deg.astype(dt), ready, ndev,
                       tb.astype(dt))
        assert got[4] == want[4] == n
        for g, w in zip(got[:4], want[:4]):
            assert g.tolist() == list(w)


def test_kernel_deep_device_queues_equal_one_heap_event_loop():
    """Device queues live in blocks that grow on demand (4, 8, ... entries, moved when full): many ops
    ready at once on few devices, pushed interleaved across devices, replay as the one-heap loop does."""
    import numpy as np
    from dpro_kit.replay._kernel import simulate
    from dpro_kit.replay.engine import csr_from_edges
    rng = np.random.default_rng(11)
    for it in range(6):
        n, ndev = 2000, [1, 3, 40][it % 3]
        src = np.concatenate([np.zeros(n // 2 - 1, dtype=np.int64),          # a fan-out: half the ops ready at once
                              rng.integers(0, n // 2, n // 2)])
        dst = np.concatenate([np.arange(1, n // 2), np.arange(n // 2, n)])
        dur = np.round(rng.exponential(3.0, n), 1)
        dev = rng.integers(-1, ndev, n)
        prio = rng.integers(0, 4, n).astype(float) if it % 2 else np.zeros(n)
        tb = rng.permutation(n)
        ip, sc, deg = csr_from_edges(n, src, dst)
        want = heapq_replay(dur, dev, prio, ip, sc, deg, np.zeros(n), ndev, tb)
        dt = np.int32 if it % 2 else np.int64
        got = simulate(dur, dev.astype(dt), prio, ip.astype(dt), sc.astype(dt), deg.astype(dt), np.zeros(n), ndev,
                       tb.astype(dt))
        assert got[4] == want[4] == n
        for g, w in zip(got[:4], want[:4]):
            assert g.tolist() == list(w)
