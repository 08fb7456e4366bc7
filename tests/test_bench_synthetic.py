"""The synthetic DFG generator (bench/synthetic.py) and the naive replay (bench/naive_replay.py).

Checks op counts against closed forms, the builder's conventions, and that the
naive networkx replay and ``dpro_kit.replay.replay`` give identical start/end
times for every op.  No timing assertions.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import naive_replay  # noqa: E402
import synthetic  # noqa: E402
from dpro_kit.graph.model import NODE_DEFAULTS, validate  # noqa: E402
from dpro_kit.graph.topology import txn_id  # noqa: E402
from dpro_kit.replay import compile_graph, replay  # noqa: E402


def kinds_by_node(g: nx.DiGraph) -> Counter:
    return Counter((d["node"], d["kind"]) for _, d in g.nodes(data=True))


def model_of(spec: synthetic.SynthSpec):
    return synthetic._draw_model(spec, np.random.default_rng(spec.seed))


@pytest.mark.parametrize("ranks,rph,buckets", [(1, 1, 1), (2, 1, 2), (3, 2, 3), (4, 2, 4), (5, 5, 2)])
def test_ring_counts(ranks, rph, buckets):
    spec = synthetic.SynthSpec(ranks=ranks, layers=6, buckets=buckets, ranks_per_host=rph, seed=ranks)
    g = synthetic.synthetic_dfg(spec=spec)
    m = model_of(spec)
    assert nx.is_directed_acyclic_graph(g)
    validate(g)
    assert g.number_of_nodes() == synthetic.count_ops(spec)
    c = kinds_by_node(g)
    n_fw, n_bw = int(m.n_fw.sum()), int(m.n_bw.sum())
    assert 3 * 6 <= n_fw <= 8 * 6 and 3 * 6 <= n_bw <= 8 * 6
    for r in range(ranks):
        w = f"w{r}"
        assert c[w, "FW"] == n_fw and c[w, "BW"] == n_bw
        assert c[w, "IO"] == 1 and c[w, "UPDATE"] == buckets
        assert c[w, "SEND"] == buckets * 2 * (ranks - 1)          # 2(N-1) SEND per rank per bucket
        assert c[w, "RECV"] == buckets * 2 * (ranks - 1)          # 2(N-1) RECV per rank per bucket
        assert c[w, "VIRTUAL"] == 2 * buckets + 1                 # In/Out per bucket + STEP_END
    assert sum(c.values()) == ranks * (1 + n_fw + n_bw + buckets + 2 * buckets + 1) + 4 * buckets * ranks * (ranks - 1)
    # every op carries every attribute; SEND -> RECV share a transaction id; links as the real Links class names them
    for k, d in g.nodes(data=True):
        assert set(NODE_DEFAULTS) <= set(d)
        if d["kind"] == "SEND":
            recvs = [v for v in g.successors(k) if g.nodes[v]["kind"] == "RECV"]
            assert len(recvs) == 1 and g.nodes[recvs[0]]["txn"] == d["txn"]
            # the RECV, the rank's next step (same node and tensor) or, after the last step, Out
            for v in g.successors(k):
                dv = g.nodes[v]
                assert dv["kind"] in ("RECV", "VIRTUAL") or (
                    dv["kind"] == "SEND" and dv["node"] == d["node"] and dv["tensor"] == d["tensor"]
                    and dv["step"] == d["step"] + 1), (k, v)
            assert d["txn"] == txn_id(d["tensor"], d["phase"], d["step"], d["chunk"], d["node"], d["peer"])
            src, dst = int(d["node"][1:]), int(d["peer"][1:])
            assert dst == (src + 1) % ranks
            if src // rph == dst // rph:
                assert d["device"] == f"link:w{src}->w{dst}"
            else:
                assert d["device"] == f"link:h{src // rph}->h{dst // rph}"
            assert d["dur"] > 0 and d["source"] == "model"
        if d["kind"] == "RECV":
            assert d["device"] == f"{d['node']}:comm"


@pytest.mark.parametrize("ranks,servers,pbytes", [(1, 1, 4 << 20), (3, 2, 1 << 20), (4, 3, 256 << 10)])
def test_ps_counts(ranks, servers, pbytes):
    spec = synthetic.SynthSpec(ranks=ranks, layers=8, buckets=4, comm="ps", servers=servers, partition_bytes=pbytes,
                               seed=7)
    g = synthetic.synthetic_dfg(spec=spec)
    m = model_of(spec)
    validate(g)
    assert g.number_of_nodes() == synthetic.count_ops(spec)
    c = kinds_by_node(g)
    parts = [p for ps in m.partitions for p in ps]
    assert all(p["bytes"] <= pbytes for p in parts)
    for r in range(ranks):
        assert c[f"w{r}", "SEND"] == len(parts) and c[f"w{r}", "RECV"] == len(parts)   # push / pull per partition
    for j in range(servers):
        ps_j = sum(1 for p in parts if p["server"] == f"s{j}")
        assert c[f"s{j}", "AGG"] == ps_j
        assert c[f"s{j}", "SEND"] == ps_j * ranks and c[f"s{j}", "RECV"] == ps_j * ranks
    for k, d in g.nodes(data=True):
        if d["kind"] == "AGG":
            assert d["device"] == f"{d['node']}:compute" and d["dur"] > 0 and d["source"] == "trace"


def test_buckets_group_reverse_consecutive_layers():
    spec = synthetic.SynthSpec(ranks=2, layers=10, buckets=3, seed=3)
    m = model_of(spec)
    flat = [l for grp in m.groups for l in grp]
    assert flat == list(range(9, -1, -1))
    assert [m.bucket_bytes[k] for k in range(3)] == [int(m.layer_bytes[grp].sum()) for grp in m.groups]
    assert (m.layer_bytes >= 4 << 10).all() and (m.layer_bytes <= 4 << 20).all()
    g = synthetic.synthetic_dfg(spec=spec)
    # In of bucket k waits for the weight-gradient ops of its layers; Out precedes its UPDATE
    for k, grp in enumerate(m.groups):
        preds = set(g.predecessors(f"w0|In bucket{k}"))
        assert preds == {f"w0|BW L{l}.{int(m.n_bw[l]) - 1}" for l in grp}
        assert set(g.successors(f"w0|Out bucket{k}")) == {f"w0|UPDATE b{k}"}


def test_iteration_boundaries_follow_the_builder_rule():
    # synthetic graphs use the builder's own rule (dpro_kit.graph.build.add_iteration_boundaries):
    # one STEP_END per node after the node's last ops, leading to its first computation op
    for kw in (dict(comm="ring", ranks=3, ranks_per_host=2), dict(comm="ps", ranks=3, servers=2)):
        g = synthetic.synthetic_dfg(layers=5, buckets=2, seed=1, **kw)
        ends = [k for k, d in g.nodes(data=True) if d["name"] == "end of iteration"]
        assert len(ends) == len({d["node"] for _, d in g.nodes(data=True) if d["node"]})
        for e in ends:
            node = g.nodes[e]["node"]
            assert g.out_degree(e) == 0
            assert all(g.nodes[p]["node"] == node for p in g.predecessors(e))
        assert {v for _, v in g.graph["iteration_edges"]} == {f"w{r}|DATA" for r in range(3)}


def test_dfg_with_about_hits_the_target():
    for n in (2_000, 20_000):
        g = synthetic.dfg_with_about(n, seed=2)
        assert abs(g.number_of_nodes() - n) <= 0.03 * n
    assert synthetic.spec_for_about(1_000_000).ranks >= 8


def _assert_same_schedule(g, iterations):
    r = replay(g, iterations=iterations)
    start, end = naive_replay.naive_replay(g, iterations)
    keys, n = r.graph.keys, r.n
    assert len(end) == n * iterations
    for row in range(n * iterations):
        op = keys[row] if iterations == 1 else (keys[row % n], row // n)
        assert (start[op], end[op]) == (r.start[row], r.end[row]), (op, start[op], end[op], r.start[row], r.end[row])
    assert naive_replay.naive_iteration_time(g, iterations) == r.iteration_time_us


CASES = [
    dict(ranks=4, layers=6, buckets=3, ranks_per_host=2),
    dict(ranks=3, layers=5, buckets=5, ranks_per_host=1, update="layer"),
    dict(ranks=6, layers=8, buckets=3, ranks_per_host=3, prioritize=True),
    dict(ranks=1, layers=4, buckets=2),
    dict(ranks=4, layers=6, buckets=3, comm="ps", servers=2, partition_bytes=512 << 10),
    dict(ranks=5, layers=7, buckets=4, comm="ps", servers=3, ranks_per_host=2, prioritize=True, update="layer"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [0, 11])
def test_naive_and_kernel_agree(case, seed):
    g = synthetic.synthetic_dfg(seed=seed, **CASES[case])
    for iterations in (1, 3):
        _assert_same_schedule(g, iterations)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_naive_and_kernel_agree_with_many_ties(seed):
    """Durations rounded to 50 us (zero-time RECVs stay 0): simultaneous events everywhere."""
    rng = np.random.default_rng(seed)
    g = synthetic.synthetic_dfg(ranks=4, layers=6, buckets=3, ranks_per_host=2, seed=seed,
                                comm="ps" if seed == 2 else "ring", prioritize=seed == 3)
    for _, d in g.nodes(data=True):
        d["dur"] = float(np.round(d["dur"] / 50.0) * 50.0)
        if seed == 3 and d["kind"] in ("FW", "BW"):
            d["priority"] = float(rng.integers(0, 3))
    _assert_same_schedule(g, 1)
    _assert_same_schedule(g, 2)


def test_naive_replay_matches_on_a_tiny_hand_graph():
    from dpro_kit.graph.model import add_op

    g = nx.DiGraph()
    add_op(g, "a", device="A", dur=2.0)
    add_op(g, "b", device="A", dur=1.0)
    add_op(g, "c", device="", dur=3.0)
    add_op(g, "d", device="A", dur=1.0, priority=-1.0)
    g.add_edges_from([("a", "c"), ("c", "d")])
    start, end = naive_replay.naive_replay(g)
    assert start == {"a": 0.0, "b": 2.0, "c": 2.0, "d": 5.0}   # a then b (FIFO by ready), c off-device
    assert end["d"] == 6.0
    assert compile_graph(g).n == 4
    _assert_same_schedule(g, 1)


def _random_dag(seed: int) -> nx.DiGraph:
    """Small random DAG: few devices, many zero-time and device-less ops, integer times, priorities."""
    from dpro_kit.graph.model import add_op

    rng = np.random.default_rng(seed)
    n, ndev = int(rng.integers(1, 50)), int(rng.integers(1, 5))
    p_edge, p_zero, p_nodev = rng.uniform(0.03, 0.3), rng.uniform(0.0, 0.8), rng.uniform(0.0, 0.4)
    g = nx.DiGraph()
    for i in range(n):
        add_op(g, f"o{i}", device="" if rng.random() < p_nodev else f"d{rng.integers(ndev)}",
               dur=0.0 if rng.random() < p_zero else float(rng.integers(1, 4)), priority=float(rng.integers(0, 3)))
    g.add_edges_from((f"o{i}", f"o{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < p_edge)
    sources = [k for k in g if g.in_degree(k) == 0][:3]
    sinks = [k for k in g if g.out_degree(k) == 0][:3]
    g.graph["iteration_edges"] = [(u, v) for u in sinks for v in sources]
    return g


def test_naive_and_kernel_agree_on_random_tie_heavy_dags():
    for seed in range(150):
        g = _random_dag(seed)
        _assert_same_schedule(g, 1)
        _assert_same_schedule(g, 2)
