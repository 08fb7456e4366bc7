"""The job model (dpro_kit/job.py), the one graph builder and the registries of schemes / rules.

* ``build_global_dfg(ts)`` is ``build(Job.from_trace(ts), identity(job))``;
* a job recovered from a built graph (``Job.from_graph``) rebuilds the same graph;
* the optimizer's job for a trace is the same ``Job.from_trace`` (same builder, same number);
* schemes, schedules, device models and iteration rules are found by name, and a
  newly registered one is used without touching the builder or the kernel.
"""
from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np
import pytest

from conftest import tiny_traceset
from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.errors import GraphError
from dpro_kit.graph import SCHEMES, CommScheme, build, build_global_dfg, register_scheme
from dpro_kit.graph.build import ITERATION_RULES, register_iteration_rule
from dpro_kit.graph.schemes import TensorGroup, scheme_for_op
from dpro_kit.graph.topology import ring_allreduce
from dpro_kit.job import Job, JobFacts, Strategy, identity
from dpro_kit.replay import DEVICE_MODELS, SCHEDULES, compile_graph, register_schedule, replay
from dpro_kit.replay._kernel import simulate
from dpro_kit.trace import Collective, Manifest, NodeInfo, TraceSet, make_events

MODEL = CommModel(default=LinkModel(latency_us=3.0, bandwidth_Bps=1e6), origin="user")


def graph_dump(g: nx.DiGraph) -> tuple:
    """Everything of a graph, in insertion order."""
    return list(g.nodes(data=True)), list(g.edges(data=True)), dict(g.graph)


def ps_traceset(partitions: list[dict] | None = None) -> TraceSet:
    """Two workers (FW 10 us -> BW 20 us -> UPDATE 4 us), one PS tensor of 9 bytes, servers s0 and s1."""
    nodes = {"w0": NodeInfo(host="h0", role="worker", rank=0), "w1": NodeInfo(host="h1", role="worker", rank=1),
             "s0": NodeInfo(host="h2", role="server", rank=0), "s1": NodeInfo(host="h3", role="server", rank=1)}
    m = Manifest(job="ps", framework="test", comm_backend="test", world_size=2, nodes=nodes, iterations=[0])
    recs = []
    for w in ("w0", "w1"):
        recs += [dict(node=w, host=nodes[w].host, op="FW", kind="FW", iteration=0, start=0.0, dur=10.0),
                 dict(node=w, host=nodes[w].host, op="BW", kind="BW", iteration=0, start=10.0, dur=20.0),
                 dict(node=w, host=nodes[w].host, op="UPDATE", kind="UPDATE", iteration=0, start=50.0, dur=4.0)]
    coll = Collective(tensor="grad", op="push_pull", bytes=9, participants=["w0", "w1"], algorithm="ps",
                      inputs={w: ["BW"] for w in ("w0", "w1")}, outputs={w: ["UPDATE"] for w in ("w0", "w1")},
                      partitions=list(partitions or []))
    return TraceSet(manifest=m, events=make_events(recs), edges={w: [("FW", "BW"), ("BW", "UPDATE")]
                                                                  for w in ("w0", "w1")}, collectives=[coll])


@pytest.mark.parametrize("workers,hosts", [(2, None), (3, None), (4, 2)])
def test_global_dfg_is_build_of_identity(workers, hosts):
    ts = tiny_traceset(workers=workers, hosts=hosts)
    job = Job.from_trace(ts)
    assert graph_dump(build(job, identity(job))) == graph_dump(build_global_dfg(ts))
    assert list(job.tensors) == ["bucket0", "bucket1"]
    assert job.ranks == [f"w{r}" for r in range(workers)] and job.servers == []


@pytest.mark.parametrize("partitions", [None, [{"bytes": 5, "server": "s0"}, {"bytes": 4, "server": "s1"}]])
def test_ps_job_identity_keeps_traced_partitions(partitions):
    ts = ps_traceset(partitions)
    job = Job.from_trace(ts, comm_model=MODEL)
    g = build(job, identity(job))
    assert graph_dump(g) == graph_dump(build_global_dfg(ts, comm_model=MODEL))
    aggs = sorted((d["node"], d["bytes"]) for _, d in g.nodes(data=True) if d["kind"] == "AGG")
    if partitions:
        assert aggs == [("s0", 5), ("s1", 4)]
        assert identity(job).partitions == (("grad", 2),)
    else:
        assert len(aggs) == 1 and aggs[0][1] == 9 and job.tensors["grad"].servers == [aggs[0][0]]


def test_job_from_graph_rebuilds_the_same_graph():
    ts = tiny_traceset(workers=3)
    g = build_global_dfg(ts, comm_model=MODEL)
    job = Job.from_graph(g, comm_model=MODEL)
    assert [(t.name, t.algorithm, t.participants) for t in job.tensors.values()] == \
        [("bucket0", "ring", ["w0", "w1", "w2"]), ("bucket1", "ring", ["w0", "w1", "w2"])]
    assert replay(build(job, identity(job))).iteration_time_us == replay(g).iteration_time_us


def test_ps_scheme_is_recognised_from_a_graph():
    ts = ps_traceset([{"bytes": 5, "server": "s0"}, {"bytes": 4, "server": "s1"}])
    job = Job.from_graph(build_global_dfg(ts, comm_model=MODEL), comm_model=MODEL)
    t = job.tensors["grad"]
    assert (t.algorithm, t.participants, t.servers) == ("ps", ["w0", "w1"], ["s0", "s1"])


def test_strategy_regroups_and_partitions_through_the_scheme():
    job = Job.from_trace(tiny_traceset(workers=2), comm_model=MODEL)
    fused = build(job, Strategy(groups=(("bucket0", "bucket1"),), partitions=(("bucket0+bucket1", 2),)))
    tensors = {d["tensor"] for _, d in fused.nodes(data=True) if d["kind"] == "SEND"}
    assert tensors == {"bucket0+bucket1#p0", "bucket0+bucket1#p1"}


def test_job_facts_parse_extra_once():
    m = Manifest(job="j", framework="f", comm_backend="b", world_size=1, nodes={"w0": NodeInfo(host="h")},
                 iterations=[0], extra={"measured_iteration_ms": 12.5, "ddp": {"bucket_cap_mb": 25}})
    f = JobFacts.from_manifest(m)
    assert (f.measured_iteration_ms, f.ddp) == (12.5, {"bucket_cap_mb": 25})
    ts = tiny_traceset()
    assert Job.from_trace(dataclasses.replace(ts, manifest=dataclasses.replace(ts.manifest, extra=m.extra))).facts == f
    bad = JobFacts.from_manifest(dataclasses.replace(m, extra={"measured_iteration_ms": float("nan"), "ddp": 3}))
    assert bad.measured_iteration_ms is None and bad.ddp == {}


def test_registered_scheme_is_used_by_the_builder_and_recognised():
    """A new scheme (here: ring AllReduce under another name) needs no change to the builder."""
    scheme = dataclasses.replace(SCHEMES["ring"], name="test-ring2", op="allreduce2")
    register_scheme(scheme)
    try:
        assert scheme_for_op("allreduce2") == "test-ring2"
        ts = tiny_traceset(workers=2)
        ts2 = dataclasses.replace(ts, collectives=[dataclasses.replace(c, algorithm="test-ring2")
                                                   for c in ts.collectives])
        g1, g2 = build_global_dfg(ts, comm_model=MODEL), build_global_dfg(ts2, comm_model=MODEL)
        assert replay(g2).iteration_time_us == replay(g1).iteration_time_us
        colls = scheme.collectives(scheme, TensorGroup(name="T", bytes=10, k=2, participants=["w0", "w1"]))
        assert [(c.tensor, c.algorithm, c.bytes) for c in colls] == [("T#p0", "test-ring2", 5),
                                                                       ("T#p1", "test-ring2", 5)]
    finally:
        del SCHEMES["test-ring2"]
    with pytest.raises(GraphError, match="unknown communication algorithm"):
        build_global_dfg(ts2, comm_model=MODEL)


def test_scheme_objects_hold_build_and_op():
    assert isinstance(SCHEMES["ring"], CommScheme) and SCHEMES["ring"].build is ring_allreduce
    assert (scheme_for_op("allreduce"), scheme_for_op("push_pull")) == ("ring", "ps")
    assert SCHEMES["ps"].uses_servers and not SCHEMES["ring"].uses_servers


def _two_ops_one_device() -> nx.DiGraph:
    """a (10 us) and b (5 us) ready at 0 on one device; b has the better priority."""
    from dpro_kit.graph import add_op
    g = nx.DiGraph()
    add_op(g, "a", node="n", device="n:compute", kind="FW", dur=10.0, priority=1.0)
    add_op(g, "b", node="n", device="n:compute", kind="FW", dur=5.0, priority=0.0)
    return g


def test_schedules_by_name():
    g = _two_ops_one_device()
    by_prio = replay(g)
    assert by_prio.start[by_prio.graph.keys.index("b")] == 0.0      # graph priorities: b first
    fifo = replay(g, schedule="fifo")
    assert fifo.start[fifo.graph.keys.index("a")] == 0.0            # FIFO: index order, a first
    register_schedule("test-reverse", lambda cg: -cg.priority)
    try:
        rev = replay(g, schedule="test-reverse")
        assert rev.start[rev.graph.keys.index("a")] == 0.0
    finally:
        del SCHEDULES["test-reverse"]
    with pytest.raises(GraphError, match="unknown schedule"):
        replay(g, schedule="nope")
    with pytest.raises(GraphError, match="unknown device model"):
        replay(g, device_model="nope")


def test_device_model_registry_holds_the_kernel():
    assert DEVICE_MODELS["fifo"] is simulate
    g = _two_ops_one_device()
    DEVICE_MODELS["test-fifo"] = simulate
    try:
        a, b = replay(g), replay(g, device_model="test-fifo")
        assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
    finally:
        del DEVICE_MODELS["test-fifo"]


def test_iteration_rule_by_name():
    job = Job.from_trace(tiny_traceset(workers=2), comm_model=MODEL)
    assert set(ITERATION_RULES) >= {"synchronous"}

    def no_coupling(g: nx.DiGraph) -> None:     # iterations independent of each other
        g.graph["iteration_edges"] = []
    register_iteration_rule("test-independent", no_coupling)
    try:
        free = build(job, iteration_rule="test-independent")
        assert compile_graph(free).iter_src.size == 0
        # without coupling, iteration 2's compute overlaps iteration 1's transfers: only the links serialise
        assert replay(free, iterations=3).iteration_time_us < replay(build(job), iterations=3).iteration_time_us
    finally:
        del ITERATION_RULES["test-independent"]
    assert compile_graph(build(job)).iter_src.size > 0


def test_optimizer_starts_from_the_replayed_graph_for_partitioned_ps():
    """The optimizer's initial strategy keeps traced PS partitions, from a trace or from a graph file."""
    from dpro_kit.optimize.state import extract_base, initial_strategy
    ts = ps_traceset([{"bytes": 5, "server": "s0"}, {"bytes": 4, "server": "s1"}])
    g = build_global_dfg(ts, comm_model=MODEL)
    want = replay(g).iteration_time_us
    for job in (Job.from_trace(ts, comm_model=MODEL), extract_base(g, comm_model=MODEL)):
        s0 = initial_strategy(job)
        assert s0.partitions == (("grad", 2),)
        assert replay(build(job, s0)).iteration_time_us == want


def test_recognise_may_leave_out_partitions():
    """A scheme's recognise may return (participants, servers) only (as readers/kineto_plain's nccl does)."""
    register_scheme(dataclasses.replace(SCHEMES["ring"], name="test-2tuple", op="test-2tuple",
                                        recognise=lambda g, in_ops: (sorted(in_ops), [])))
    try:
        job = Job.from_graph(build_global_dfg(tiny_traceset(workers=2), comm_model=MODEL), comm_model=MODEL)
        assert {(t.algorithm, tuple(t.participants), tuple(t.partitions)) for t in job.tensors.values()} == \
            {("test-2tuple", ("w0", "w1"), ())}
    finally:
        del SCHEMES["test-2tuple"]


def test_is_allreduce_asks_the_scheme_registry():
    """What-ifs and the memory model pick gradient buckets by the scheme's `allreduce` flag, not by op name."""
    from dataclasses import replace

    from dpro_kit.graph.schemes import SCHEMES, CommScheme, is_allreduce, register_scheme
    from dpro_kit.trace import Collective
    ring = Collective(tensor="b0", op="allreduce", bytes=8, participants=["w0", "w1"])
    ps = Collective(tensor="p0", op="push_pull", bytes=8, participants=["w0"], algorithm="ps")
    other = Collective(tensor="x", op="broadcast", bytes=8, participants=["w0", "w1"], algorithm="bcast")
    assert is_allreduce(ring) and not is_allreduce(ps) and not is_allreduce(other)
    hier = Collective(tensor="t0", op="allreduce_hier", bytes=8, participants=["w0", "w1"], algorithm="test-hier")
    assert not is_allreduce(hier)                       # unknown scheme: not a bucket
    register_scheme(CommScheme(name="test-hier", op="allreduce_hier", build=SCHEMES["ring"].build,
                               collectives=SCHEMES["ring"].collectives, recognise=lambda g, i: None,
                               allreduce=True))
    try:
        assert is_allreduce(hier) and is_allreduce(replace(hier, algorithm=""))   # by name, or by its op
    finally:
        del SCHEMES["test-hier"]
    # the built-in tree AllReduce (NCCL) is a bucket too
    assert is_allreduce(Collective(tensor="t1", op="allreduce_tree", bytes=8, participants=["w0", "w1"],
                                   algorithm="tree"))
