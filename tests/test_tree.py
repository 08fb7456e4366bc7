"""NCCL's tree AllReduce in the global DFG (``topology.tree_allreduce``, scheme ``tree``).

Tiny jobs as in tests/test_ring_ps.py: per worker FW 10 us -> BW 20 us -> UPDATE 4 us, one
collective (BW -> ... -> UPDATE), one host per worker, transfers ``T(b) = 3 + b`` us (one byte per
microsecond), RECVs 0 us.  The expected trees and times are worked out by hand in each test.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from dpro_kit.graph import build, build_global_dfg
from dpro_kit.graph.schemes import SCHEMES, TensorGroup, is_allreduce
from dpro_kit.graph.topology import btree, double_tree_orders, nccl_tree, tree_order, txn_id
from dpro_kit.job import Job, identity
from dpro_kit.replay import replay

from test_ring_ps import MODEL, approx, make_job, ops_of


def tree_job(order: list[str], nbytes: int = 60, hosts: dict[str, str] | None = None):
    """``order``: participants in tree order (``order[p]`` at btree position p); worker wR on host hR
    unless ``hosts`` says otherwise."""
    ts = make_job(hosts or {f"w{r}": f"h{r}" for r in range(len(order))}, nbytes=nbytes)
    colls = [dataclasses.replace(c, op="allreduce_tree", algorithm="tree", participants=list(order))
             for c in ts.collectives]
    return dataclasses.replace(ts, collectives=colls)


def test_btree_shapes_are_nccls():
    # NCCL's comment in src/graph/trees.cc draws the tree of 14: 0 -> 8 -> {4, 12}, 4 -> {2, 6}, 12 -> {10, 13} ...
    assert [btree(14, p) for p in (0, 8, 4, 12, 2, 6, 10, 13, 1)] == [
        (-1, [8]), (0, [4, 12]), (8, [2, 6]), (8, [10, 13]), (4, [1, 3]), (4, [5, 7]), (12, [9, 11]), (12, []),
        (2, [])]
    assert [btree(4, p) for p in range(4)] == [(-1, [2]), (2, []), (0, [1, 3]), (2, [])]
    assert [btree(2, p) for p in range(2)] == [(-1, [1]), (0, [])]
    # double binary tree: mirrored for even n, shifted by one for odd n
    assert double_tree_orders(["a", "b", "c", "d"]) == (["a", "b", "c", "d"], ["d", "c", "b", "a"])
    assert double_tree_orders(["a", "b", "c"]) == (["a", "b", "c"], ["b", "c", "a"])
    # every position is an inner node of at most one of the two trees (n = 4, 8, 13)
    for n in (4, 8, 13):
        t0, t1 = double_tree_orders(list(range(n)))
        inner = [{order[p] for p in range(n) if btree(n, p)[1]} for order in (t0, t1)]
        assert len(inner[0] & inner[1]) <= 1


def test_tree_order_recovers_a_labelling():
    par = {"w0": None, "w2": "w0", "w1": "w2", "w3": "w2"}
    order = tree_order(par)
    assert order is not None and order[0] == "w0" and order[2] == "w2" and set(order[1::2]) == {"w1", "w3"}
    assert tree_order({"a": None, "b": "a", "c": "b", "d": "c"}) is None       # a chain of 4 is no btree
    assert tree_order({"a": None, "b": None}) is None                         # two roots
    assert tree_order({"a": "b", "b": "a"}) is None                           # no root


@pytest.mark.parametrize("n", [2, 4, 5])
def test_tree_structure_and_transactions(n):
    """Each non-root sends the chunk to its parent (reduce) and gets it back from it (broadcast);
    each SEND has one RECV on its peer with the same txn; a node forwards only what it received."""
    order = [f"w{r}" for r in range(n)]
    g = build_global_dfg(tree_job(order), comm_model=MODEL)
    sends, recvs = ops_of(g, "SEND"), ops_of(g, "RECV")
    assert len(sends) == len(recvs) == 2 * (n - 1)
    parent = {order[p]: order[btree(n, p)[0]] for p in range(1, n)}
    got = Counter((g.nodes[k]["phase"], g.nodes[k]["node"], g.nodes[k]["peer"]) for k in sends)
    assert got == Counter([("reduce", c, p) for c, p in parent.items()] +
                          [("broadcast", p, c) for c, p in parent.items()])
    recv_by_txn = {g.nodes[k]["txn"]: k for k in recvs}
    for k in sends:
        d = g.nodes[k]
        kr = recv_by_txn[d["txn"]]
        assert g.has_edge(k, kr) and g.nodes[kr]["node"] == d["peer"] and d["bytes"] == 60
        assert d["txn"] == txn_id("grad", d["phase"], d["step"], 0, d["node"], d["peer"])
        assert d["step"] == (0 if d["phase"] == "reduce" else 1)
        preds = {(g.nodes[x]["kind"], g.nodes[x].get("phase")) for x in g.predecessors(k)}
        if d["phase"] == "reduce":      # waits for In and for every child's reduce RECV
            kids = [c for c, p in parent.items() if p == d["node"]]
            assert sum(1 for x in g.predecessors(k) if g.nodes[x]["kind"] == "RECV") == len(kids)
        elif d["node"] == order[0]:     # the root broadcasts once all children reduced
            assert ("RECV", "reduce") in preds
        else:                           # the others forward what their parent broadcast
            assert preds == {("RECV", "broadcast")}
    assert is_allreduce(tree_job(order).collectives[0])


def test_tree_four_ranks_iteration_time():
    # tree 0 -> 2 -> {1, 3}; T = 3 + 60 = 63 us per transfer, each on its own link:
    # w1->w2, w3->w2 [30, 93]; w2->w0 [93, 156]; w0->w2 [156, 219]; w2->w1, w2->w3 [219, 282];
    # UPDATE of w1/w2/w3 [282, 286]
    g = build_global_dfg(tree_job(["w0", "w1", "w2", "w3"]), comm_model=MODEL)
    res = replay(g)
    assert res.iteration_time_us == approx(286)
    df = res.to_frame(g)
    s = df[df["kind"] == "SEND"].set_index(["node", "peer"])
    assert s.loc[("w1", "w2"), "start"] == approx(30) and s.loc[("w3", "w2"), "end"] == approx(93)
    assert s.loc[("w2", "w0"), "start"] == approx(93) and s.loc[("w0", "w2"), "start"] == approx(156)
    assert s.loc[("w2", "w1"), "start"] == approx(219) and s.loc[("w2", "w3"), "end"] == approx(282)
    upd = df[df["kind"] == "UPDATE"].set_index("node")
    assert upd.loc["w0", "start"] == approx(219) and upd.loc["w1", "start"] == approx(282)


def test_tree_two_ranks_iteration_time():
    # w1->w0 [30, 93], w0->w1 [93, 156], UPDATE [156, 160]
    assert replay(build_global_dfg(tree_job(["w0", "w1"]), comm_model=MODEL)).iteration_time_us == approx(160)


def test_tree_scheme_is_recognised_and_rebuilt_from_a_graph():
    """The mirrored tree (tree 1 of 4 ranks: 3 -> 1 -> {2, 0}) survives a graph round trip."""
    _, t1 = double_tree_orders(["w0", "w1", "w2", "w3"])
    g = build_global_dfg(tree_job(t1), comm_model=MODEL)
    job = Job.from_graph(g, comm_model=MODEL)
    t = job.tensors["grad"]
    assert t.algorithm == "tree" and t.participants[0] == "w3" and t.participants[2] == "w1"
    g2 = build(job, identity(job))
    assert {g2.nodes[k]["txn"] for k in ops_of(g2, "SEND")} == {g.nodes[k]["txn"] for k in ops_of(g, "SEND")}
    assert replay(g2).iteration_time_us == replay(g).iteration_time_us
    colls = SCHEMES["tree"].collectives(SCHEMES["tree"], TensorGroup(name="T", bytes=10, k=2, participants=t1))
    assert [(c.tensor, c.algorithm, c.op, c.bytes, c.participants) for c in colls] == [
        ("T#p0", "tree", "allreduce_tree", 5, t1), ("T#p1", "tree", "allreduce_tree", 5, t1)]


def test_nccl_tree_chains_the_ranks_of_a_node():
    """Several ranks per host: the hosts form the binary tree, each host's ranks a chain below its first
    rank (NCCL's TREE pattern); tree 1 moves whole hosts, keeping each chain."""
    host = {"a0": "A", "a1": "A", "b0": "B", "b1": "B", "c0": "C", "c1": "C"}
    parent, kids = nccl_tree(["a0", "a1", "b0", "b1"], host)
    assert parent == {"a0": None, "a1": "a0", "b0": "a0", "b1": "b0"}
    assert kids == {"a0": ["a1", "b0"], "a1": [], "b0": ["b1"], "b1": []}
    # 3 hosts (odd): tree 0 = A -> C -> B (btree(3): 0 -> 2 -> 1), tree 1 shifted: B -> A -> C
    t0, t1 = double_tree_orders(["a0", "a1", "b0", "b1", "c0", "c1"], host)
    assert t0 == ["a0", "a1", "b0", "b1", "c0", "c1"] and t1 == ["b0", "b1", "c0", "c1", "a0", "a1"]
    p1, _ = nccl_tree(t1, host)
    assert p1 == {"b0": None, "b1": "b0", "a0": "b0", "a1": "a0", "c0": "a0", "c1": "c0"}
    assert nccl_tree(tree_order(p1, host), host)[0] == p1
    # a chain entered below its head, or two heads on one host: not NCCL's tree
    assert tree_order({"a0": None, "a1": "a0", "b0": "a1", "b1": "b0"}, host) is None
    assert tree_order({"a0": None, "a1": "a0", "b0": "a0", "b1": "a0"}, host) is None
    # one host: one chain
    one = {r: "A" for r in "wxyz"}
    assert nccl_tree(list("wxyz"), one)[0] == {"w": None, "x": "w", "y": "x", "z": "y"}


def test_tree_two_hosts_of_two_ranks_iteration_time():
    # w0, w1 on host A; w2, w3 on B: w0 -> {w1, w2}, w2 -> w3; T = 63 us, every edge its own link
    # (w1->w0, w3->w2 private; w2->w0 on B->A): w1->w0, w3->w2 [30, 93]; w2->w0 [93, 156];
    # w0->w1, w0->w2 [156, 219]; w2->w3 [219, 282]; UPDATE of w3 [282, 286]
    hosts = {"w0": "A", "w1": "A", "w2": "B", "w3": "B"}
    g = build_global_dfg(tree_job(["w0", "w1", "w2", "w3"], hosts=hosts), comm_model=MODEL)
    sends = {(g.nodes[k]["phase"], g.nodes[k]["node"], g.nodes[k]["peer"]): g.nodes[k] for k in ops_of(g, "SEND")}
    assert set(sends) == {("reduce", "w1", "w0"), ("reduce", "w2", "w0"), ("reduce", "w3", "w2"),
                          ("broadcast", "w0", "w1"), ("broadcast", "w0", "w2"), ("broadcast", "w2", "w3")}
    assert sends[("reduce", "w2", "w0")]["device"] == "link:B->A"
    res = replay(g)
    assert res.iteration_time_us == approx(286)
    upd = res.to_frame(g)
    upd = upd[upd["kind"] == "UPDATE"].set_index("node")
    assert upd.loc["w1", "start"] == approx(219) and upd.loc["w3", "start"] == approx(282)
    job = Job.from_graph(g, comm_model=MODEL)
    assert job.tensors["grad"].algorithm == "tree" and job.tensors["grad"].participants == ["w0", "w1", "w2", "w3"]
