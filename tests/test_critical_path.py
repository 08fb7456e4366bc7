"""The replayer's critical path vs a brute-force longest path of the execution graph.

For any schedule the replayer produces, every edge of the execution graph (DFG edge
or same-device order edge) goes from an op that ends to an op that starts no
earlier, so the duration-weighted length of *any* path is at most the makespan;
the critical path built from recorded critical predecessors has no gaps, starts
at 0 and ends at the makespan, so it is a longest path and its length equals the
makespan.  Integer durations make all comparisons exact.
"""
from __future__ import annotations

import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpro_kit.graph import add_op
from dpro_kit.replay import replay


def random_dag(rng: random.Random, *, n_ops: int, n_devices: int, p_edge: float,
               deviceless: bool = False, priorities: bool = False) -> nx.DiGraph:
    g = nx.DiGraph()
    for i in range(n_ops):
        dev = f"d{rng.randrange(n_devices)}"
        if deviceless and rng.random() < 0.2:
            dev = ""
        add_op(g, f"op{i}", device=dev, dur=rng.randint(0, 9),
               priority=float(rng.randint(0, 2)) if priorities else 0.0)
    for i in range(n_ops):
        for j in range(i + 1, n_ops):
            if rng.random() < p_edge:
                g.add_edge(f"op{i}", f"op{j}")
    return g


def brute_force_longest(h: nx.DiGraph) -> int:
    """Max over all source->sink simple paths of the summed op durations."""
    dur = {k: int(round(h.nodes[k]["dur"])) for k in h}
    sources = [k for k in h if h.in_degree(k) == 0]
    sinks = [k for k in h if h.out_degree(k) == 0]
    best = 0
    for s in sources:
        if s in sinks:                       # isolated op: a path of one vertex
            best = max(best, dur[s])
        for t in sinks:
            if s == t:
                continue
            for path in nx.all_simple_paths(h, s, t):
                best = max(best, sum(dur[k] for k in path))
    return best


def check_critical_path(g: nx.DiGraph) -> None:
    res = replay(g)
    h = res.execution_graph()
    path = res.critical_path()
    keys = [res.key(r) for r in path]
    dur = {k: g.nodes[k]["dur"] for k in g}
    makespan = res.makespan_us

    assert len(set(keys)) == len(keys)
    # it is a path of the execution graph (DFG edge or device-order edge)
    for u, v in zip(keys, keys[1:]):
        assert h.has_edge(u, v), (u, v)
        assert g.has_edge(u, v) or h.edges[u, v].get("order") is True
    # no gaps: starts at 0, each op starts when its path predecessor ends, ends at the makespan
    assert res.start[path[0]] == 0
    for a, b in zip(path, path[1:]):
        assert res.start[b] == res.end[a]
    assert res.end[path[-1]] == makespan
    # simulated durations are the DFG durations
    for r in path:
        assert res.end[r] - res.start[r] == dur[res.key(r)]
    length = sum(dur[k] for k in keys)
    assert length == makespan
    # and it is a longest path of the execution graph
    longest = brute_force_longest(h)
    assert length == longest
    assert makespan == longest
    # cross-check the brute force with a node-weighted longest-path DP over a topological order
    best = {}
    for k in nx.topological_sort(h):
        best[k] = dur[k] + max((best[p] for p in h.predecessors(k)), default=0)
    assert max(best.values()) == longest


@pytest.mark.parametrize("seed", range(60))
def test_critical_path_equals_brute_force_longest_path(seed):
    rng = random.Random(seed)
    g = random_dag(rng, n_ops=rng.randint(5, 12), n_devices=rng.randint(1, 3), p_edge=rng.choice([0.15, 0.3, 0.5]))
    check_critical_path(g)


@pytest.mark.parametrize("seed", range(60, 100))
def test_critical_path_with_deviceless_ops_and_priorities(seed):
    rng = random.Random(seed)
    g = random_dag(rng, n_ops=rng.randint(5, 12), n_devices=rng.randint(1, 3), p_edge=rng.choice([0.15, 0.3]),
                   deviceless=True, priorities=True)
    check_critical_path(g)


@settings(derandomize=True, max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n_ops=st.integers(5, 12), n_devices=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       p_edge=st.sampled_from([0.1, 0.25, 0.4, 0.6]), deviceless=st.booleans(), priorities=st.booleans())
def test_critical_path_property(n_ops, n_devices, seed, p_edge, deviceless, priorities):
    g = random_dag(random.Random(seed), n_ops=n_ops, n_devices=n_devices, p_edge=p_edge,
                   deviceless=deviceless, priorities=priorities)
    check_critical_path(g)


def test_critical_path_hand_example():
    # d0: A (4) then C (2, ready at 4);  d1: B (3), then D (5) after A and B.
    # A [0,4], B [0,3], C [4,6], D ready at max(4,3)=4: [4,9].  Longest path A -> D = 4 + 5 = 9.
    g = nx.DiGraph()
    add_op(g, "A", device="d0", dur=4)
    add_op(g, "B", device="d1", dur=3)
    add_op(g, "C", device="d0", dur=2)
    add_op(g, "D", device="d1", dur=5)
    g.add_edges_from([("A", "C"), ("A", "D"), ("B", "D")])
    res = replay(g)
    assert [res.key(r) for r in res.critical_path()] == ["A", "D"]
    assert res.makespan_us == 9
    assert brute_force_longest(res.execution_graph()) == 9   # A -> D; B -> D is only 3 + 5 = 8
    check_critical_path(g)


def test_critical_path_through_device_order_edge():
    # X (d0, 5) and Y (d0, 1) are independent; Y queues behind X.  Z (d1, 2) after Y.
    # X [0,5], Y [5,6], Z [6,8]: the critical path X -> Y -> Z uses the device-order edge X -> Y,
    # which is not in the DFG; a DFG-only longest path would be Y -> Z = 3 or X = 5.
    g = nx.DiGraph()
    add_op(g, "X", device="d0", dur=5)
    add_op(g, "Y", device="d0", dur=1)
    add_op(g, "Z", device="d1", dur=2)
    g.add_edge("Y", "Z")
    res = replay(g)
    assert [res.key(r) for r in res.critical_path()] == ["X", "Y", "Z"]
    assert res.makespan_us == 8                               # 5 + 1 + 2
    assert res.execution_graph().edges["X", "Y"]["order"] is True
    assert brute_force_longest(res.execution_graph()) == 8


def test_critical_path_several_iterations_is_gap_free():
    # random DAGs replayed 3 times with iteration edges last-op -> first-op (serial iterations):
    # the critical path spans all iterations without gaps and ends at the makespan.
    for seed in range(20):
        rng = random.Random(1000 + seed)
        g = random_dag(rng, n_ops=rng.randint(5, 10), n_devices=rng.randint(1, 3), p_edge=0.3)
        sinks = [k for k in g if g.out_degree(k) == 0]
        sources = [k for k in g if g.in_degree(k) == 0]
        g.graph["iteration_edges"] = [(s, t) for s in sinks for t in sources]
        res = replay(g, iterations=3)
        path = res.critical_path()
        assert res.start[path[0]] == 0
        for a, b in zip(path, path[1:]):
            assert res.start[b] == res.end[a]
        assert res.end[path[-1]] == res.makespan_us
        assert sum(g.nodes[res.key(r)]["dur"] for r in path) == res.makespan_us
