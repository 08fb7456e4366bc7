"""dpro simulate (issue 16): strategy trees, the compiler's collectives and hand-computed schedules.

Tiny models are built by hand (layers with measured-like times and sizes) so every
number below is computed in the comments; one real one-process ``dpro profile
--shapes`` of examples/ddp/train.py (transformer) feeds the model reader and the CLI.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from dpro_kit.errors import DproError
from dpro_kit.simulate.compiler import compile_strategy, ddp_buckets, even_stages, partition_stages, schedule_order
from dpro_kit.simulate.model import Layer, ModelGraph, Op
from dpro_kit.simulate.predict import predict
from dpro_kit.simulate.strategy import parse_memory, parse_strategy

ROOT = Path(__file__).resolve().parents[1]
MBIT = 1e6 / 8


def strat(doc: dict, name: str = "t"):
    return parse_strategy(doc, path=f"{name}.yaml", default_name=name)


def chain_model(n: int, fwd: float = 1000.0, bwd: float = 2000.0, params: int = 0, act: int = 0,
                inp: int = 0, update: float = 0.0) -> ModelGraph:
    layers = [Layer(name=f"layers.{i}", params={f"layers.{i}.w": params} if params else {},
                    ops=[Op("aten::mul", fwd, act_bytes=act)], bwd_us=bwd, input_bytes=inp) for i in range(n)]
    return ModelGraph(layers=layers, update_us=update, other_us=0.0, optimizer_state_bytes=n * params)


def run(model, doc, **kw):
    kw.setdefault("device_model", "fifo")
    return predict(model, strat(doc), **kw)


# --------------------------------------------------------------------------- strategy tree

def test_parse_and_propagate():
    s = strat({"ranks": 8, "hosts": 2, "strategy": {
        "data_parallel": {"degree": 2, "sharding": "zero2"}, "tensor_parallel": {"degree": 2},
        "pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b", "max_in_flight": 2},
        "children": [{"module": "blocks", "recompute": True, "children": [
            {"module": "blocks.1", "data_parallel": {"sharding": "fsdp"}, "tensor_parallel": {"degree": 1}}]},
            {"module": "head", "recompute": False}]}})
    assert (s.dp, s.tp, s.stages, s.micro_batches, s.schedule, s.max_in_flight) == (2, 2, 2, 4, "1f1b", 2)
    root = s.settings("embed")
    assert (root.sharding, root.tp, root.recompute) == ("zero2", 2, False)
    b0 = s.settings("blocks.0")              # inherits sharding and tp from the root, recompute from "blocks"
    assert (b0.sharding, b0.tp, b0.recompute) == ("zero2", 2, True)
    b1 = s.settings("blocks.1.mlp")          # deepest node wins, unset keys come from its parent
    assert (b1.sharding, b1.tp, b1.recompute) == ("fsdp", 1, True)
    assert s.settings("blocks.10").sharding == "zero2"   # whole components: blocks.1 does not cover blocks.10
    assert s.settings("blocks.10").recompute is True


@pytest.mark.parametrize("doc,record,words", [
    ({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}}, "colour": 1}, "colour", "unknown key"),
    ({"ranks": 4, "strategy": {"data_parallel": {"degree": 2}}}, "strategy", "ranks is 4"),
    ({"ranks": 2, "strategy": {"data_parallel": {"degree": 2, "sharding": "zero4"}}},
     "strategy.data_parallel.sharding", "unknown sharding"),
    ({"ranks": 2, "strategy": {"pipeline": {"stages": 2, "schedule": "interleaved"}}},
     "strategy.pipeline.schedule", "unknown schedule"),
    ({"ranks": 2, "strategy": {"pipeline": {"stages": 2, "micro_batches": 0}}},
     "strategy.pipeline.micro_batches", "integer >= 1"),
    ({"ranks": 3, "hosts": 2, "strategy": {"data_parallel": {"degree": 3}}}, "hosts", "evenly"),
    ({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}, "children": [{"module": "a", "pipeline": {}}]}},
     "strategy.children[0].pipeline", "root only"),
    ({"ranks": 2, "strategy": {"tensor_parallel": {"degree": 2}, "children": [
        {"module": "a", "tensor_parallel": {"degree": 4}}]}}, "strategy.children[0].tensor_parallel.degree", "1"),
    ({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}, "children": [
        {"module": "a", "children": [{"module": "b"}]}]}}, "strategy.children[0].children[0].module", "not inside"),
    ({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}, "recompute": "yes"}}, "strategy.recompute",
     "true or false"),
    ({"ranks": 1, "strategy": {"data_parallel": {"degree": 1, "sharding": "fsdp"}}},
     "strategy.data_parallel.sharding", ">= 2"),
    ({"ranks": 2, "memory_limit": "lots", "strategy": {"data_parallel": {"degree": 2}}}, "memory_limit",
     "memory size"),
    ({"strategy": {}}, "ranks", "missing"),
    ({"ranks": 1, "link_efficiency": 1.5, "strategy": {}}, "link_efficiency", "(0, 1]"),
    ({"ranks": 2, "strategy": {"pipeline": {"stages": 2, "split": "random"}}}, "strategy.pipeline.split",
     "unknown split"),
])
def test_bad_strategy_is_one_line_naming_file_and_key(doc, record, words):
    with pytest.raises(DproError) as e:
        strat(doc, name="bad")
    line = e.value.one_line()
    assert "\n" not in line and line.startswith(f"bad.yaml [{record}]: ") and words in line, line


def test_child_must_name_a_layer():
    s = strat({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}, "children": [{"module": "layers.7"}]}})
    with pytest.raises(DproError, match=r"\[strategy.children\[0\].module\]: module 'layers.7' matches no layer"):
        compile_strategy(chain_model(2), s, bandwidth_Bps=1e9, latency_us=0, intra_Bps=1e9)
    s = strat({"ranks": 2, "strategy": {"data_parallel": {"degree": 2}, "children": [{"module": "layers.1.fc"}]}})
    with pytest.raises(DproError, match="inside layer 'layers.1'"):
        compile_strategy(chain_model(2), s, bandwidth_Bps=1e9, latency_us=0, intra_Bps=1e9)


def test_memory_sizes():
    assert parse_memory("8GiB") == 8 * 2**30 and parse_memory("512MB") == 512 * 10**6 and parse_memory(4096) == 4096
    with pytest.raises(DproError):
        parse_memory("-1GB")


# --------------------------------------------------------------------------- helpers of the compiler

def test_partition_and_orders():
    assert partition_stages([1, 1, 1, 1], 2) == [[0, 1], [2, 3]]
    assert partition_stages([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert partition_stages([1, 2, 3, 4, 5], 3) == [[0, 1, 2], [3], [4]]
    # 1F1B: stage s keeps stages - s micro-batches in flight; GPipe all of them; max_in_flight caps both
    assert schedule_order(0, 3, 4, "1f1b", None) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                                    ("B", 2), ("B", 3)]
    assert schedule_order(2, 3, 4, "1f1b", None) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2),
                                                    ("F", 3), ("B", 3)]
    assert schedule_order(0, 2, 3, "gpipe", 2) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    # split: even -- the numbered layers by count (earlier stages take the remainder), the rest at the ends
    names = ["inp", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    assert even_stages(names, 2) == [[0, 1, 2], [3, 4, 5]]
    assert even_stages(names, 3) == [[0, 1, 2], [3], [4, 5]]
    assert even_stages(["a", "b", "c"], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError):
        even_stages(names, 5)
    # DDP buckets: the first closes at 1 MiB, the next at bucket_mb
    items = [("a", 600_000, 0), ("b", 600_000, 0), ("c", 2_000_000, 1), ("d", 100, 1)]
    assert [[x[0] for x in b] for b in ddp_buckets(items, 2.0)] == [["a", "b"], ["c", "d"]]


# --------------------------------------------------------------------------- hand-computed schedules

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_bubble_equal_stages(schedule):
    """4 equal layers (fwd 1 ms, bwd 2 ms) on 2 stages, m = 4 micro-batches, free transfers:
    per stage and micro-batch f = 2 x 1000 / 4 = 500 us, b = 1000 us; both schedules take
    (m + p - 1)(f + b) = 5 x 1500 = 7500 us; each rank computes m(f + b) = 6000 us, so the
    bubble is 1500 us = (p - 1)/(m + p - 1) = 1/5 of the iteration."""
    p = run(chain_model(4), {"ranks": 2, "hosts": 2, "latency_us": 0, "strategy": {
        "pipeline": {"stages": 2, "micro_batches": 4, "schedule": schedule}}})
    assert p.iteration_ms == pytest.approx(7.5, abs=1e-9)
    assert p.compiled.stage_layers == [["layers.0", "layers.1"], ["layers.2", "layers.3"]]
    for r in p.per_rank:
        assert r["compute_ms"] == pytest.approx(6.0, abs=1e-9)
        assert r["bubble_ms"] / p.iteration_ms == pytest.approx((2 - 1) / (4 + 2 - 1), abs=1e-9)
        assert r["exposed_comm_ms"] == pytest.approx(0.0, abs=1e-9)
    # one activation and one gradient send per micro-batch, stage 0 <-> stage 1
    sends = [c for c in p.compiled.collectives if c["kind"] == "send_recv"]
    assert len(sends) == 8
    assert sorted({tuple(c["group"]) for c in sends}) == [("h0/0", "h1/1"), ("h1/1", "h0/0")]


@pytest.mark.parametrize("schedule,expect_us", [("gpipe", 9600.0), ("1f1b", 9400.0)])
def test_pipeline_rendezvous_hand_computed(schedule, expect_us):
    """gloo's p2p is a rendezvous: the bytes leave at max(send posted, receive posted + alpha) (the
    receiver's ready notice), and torch's schedules post a receive only right before the action that
    needs it (p2p_steps).  4 layers (fwd 1 ms, bwd 2 ms) on 2 stages, m = 2: f = 1000, b = 2000 us per
    stage and micro-batch; every transfer (and notice) alpha = 100 us.

    GPipe: r1 posts recv act0 at 0 (notice 100); act0 leaves at max(1000, 100), in at 1100; r1 F0
    1100-2100, posts recv act1 at 2100 (notice 2200): act1 leaves at max(2000, 2200) = 2200, F1
    2300-3300, B0 -3300-5300, B1 -7300.  r0 waits its sends (2200), posts recv grad0 at 2200: grad0
    leaves at 5300, B0 5400-7400; recv grad1 posted at 7400, notice 7500, grad1 leaves at max(7300,
    7500), B1 7600-9600.  1F1B: r0 F0, F1 0-2000, posts send act1 + recv grad0 at 2000; r1 F0 1100-2100,
    B0 -4100, posts send grad0 + recv act1 at 4100 (notice 4200): act1 leaves at 4200, grad0 at
    max(4100, 2100); r0 B0 4200-6200, posts recv grad1 at 6200; r1 F1 4300-5300, B1 -7300, grad1 in
    at 7400, r0 B1 7400-9400.  Without the rendezvous both took 9200 us (each transfer leaving at its
    send): GPipe now pays a notice and a transfer on r1's second forward and r0's second backward,
    1F1B one transfer fewer where its receive was posted early (r0's recv grad0)."""
    p = run(chain_model(4), {"ranks": 2, "hosts": 2, "latency_us": 100, "strategy": {
        "pipeline": {"stages": 2, "micro_batches": 2, "schedule": schedule}}})
    assert p.iteration_ms * 1e3 == pytest.approx(expect_us, abs=1e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_runtime_overhead_per_action(schedule):
    """The pipeline above with a measured runtime overhead of 4 ms per rank and iteration: 2m = 8
    actions per rank, 0.5 ms each, at the start of every forward and backward (after the receive it
    waits for), so f = 500 + 500 = 1000 us, b = 1000 + 500 = 1500 us per stage and micro-batch:
    (m + p - 1)(f + b) = 5 x 2500 = 12500 us; each rank's compute m(f + b) = 10 ms.  The file's key
    and predict()'s argument give the same; predict()'s wins."""
    doc = {"ranks": 2, "hosts": 2, "latency_us": 0, "strategy": {
        "pipeline": {"stages": 2, "micro_batches": 4, "schedule": schedule}}}
    p = run(chain_model(4), doc, runtime_overhead_ms=4.0)
    assert p.iteration_ms == pytest.approx(12.5, abs=1e-9)
    for r in p.per_rank:
        assert r["compute_ms"] == pytest.approx(10.0, abs=1e-9)
    q = run(chain_model(4), {**doc, "runtime_overhead_ms": 4.0})
    assert q.iteration_ms == pytest.approx(12.5, abs=1e-9)
    assert run(chain_model(4), {**doc, "runtime_overhead_ms": 4.0}, runtime_overhead_ms=0.0).iteration_ms == \
        pytest.approx(7.5, abs=1e-9)
    with pytest.raises(DproError, match="runtime_overhead_ms"):
        strat({**doc, "runtime_overhead_ms": -1})


def test_pipeline_activation_memory_by_schedule():
    """Activations per layer 1000 B, 2 layers per stage, m = 4: 500 B per micro-batch and stage.
    GPipe holds all 4 micro-batches (2000 B); 1F1B stage 0 holds 2 (1000 B), stage 1 holds 1 (500 B).
    Recomputation keeps only each layer's input (400 B / 4 per micro-batch, 200 B per stage) plus one
    layer re-materialised (1000 / 4 = 250 B): GPipe 4 x 200 + 250 = 1050 B."""
    m = chain_model(4, act=1000, inp=400)
    base = {"ranks": 2, "hosts": 2, "latency_us": 0, "bandwidth_mbps": 1e6}
    g = run(m, {**base, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4, "schedule": "gpipe"}}})
    f = run(m, {**base, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b"}}})
    c = run(m, {**base, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b",
                                                  "max_in_flight": 1}}})
    rc = run(m, {**base, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4}, "recompute": True}})
    for p, want in ((g, [2000, 2000]), (f, [1000, 500]), (c, [500, 500]), (rc, [1050, 1050])):
        # the formula (parts) and the replayed timeline (the ops' mem_alloc / mem_free) agree here
        assert [r["memory"]["activations"] for r in p.per_rank] == want
        assert [r["memory"]["peak"] for r in p.per_rank] == want


def test_recompute_time():
    """Recomputation re-runs each layer's forward before its backward: b = 1000 + 500 us per stage and
    micro-batch, f = 500: GPipe (m + p - 1)(f + b) = 5 x 2000 = 10000 us."""
    p = run(chain_model(4), {"ranks": 2, "hosts": 2, "latency_us": 0, "strategy": {
        "pipeline": {"stages": 2, "micro_batches": 4}, "recompute": True}})
    assert p.iteration_ms == pytest.approx(10.0, abs=1e-9)
    assert sum(1 for k in p.compiled.graph if "|R mb" in k) == 2 * 2 * 4   # ranks x layers x micro-batches


def one_layer(params=4_000_000, update=500.0):
    return ModelGraph(layers=[Layer(name="fc", params={"fc.weight": params}, ops=[Op("aten::mul", 1000.0)],
                                    bwd_us=2000.0)], update_us=update, optimizer_state_bytes=params)


DP2 = {"ranks": 2, "hosts": 2, "bandwidth_mbps": 1000, "latency_us": 0, "link_efficiency": 1}


def test_ddp_allreduce():
    """One 4 MB parameter, 2 ranks on 2 hosts at 1000 Mbit/s (125e6 B/s).  The profiled batch is the
    global batch: each rank computes half of it (fwd 500, bwd 1000 us).  One bucket, a ring
    all-reduce of 2(n-1) = 2 steps of 2e6 B = 2 x 16000 us; the step after it:
    500 + 1000 + 32000 + 500 = 34000 us.  Memory: params, grads, SGD state and DDP's bucket
    buffer, 4e6 B each."""
    p = run(one_layer(), {**DP2, "strategy": {"data_parallel": {"degree": 2}}})
    assert p.iteration_ms == pytest.approx(34.0, abs=1e-9)
    colls = p.compiled.collectives
    assert [(c["kind"], c["group"], c["bytes"]) for c in colls] == [("allreduce", ["h0/0", "h1/1"], 4_000_000)]
    # 2 ring steps x 2 ranks: SEND ops on both directions' links, 2e6 B each
    sends = [d for _, d in p.compiled.graph.nodes(data=True) if d["kind"] == "SEND"]
    assert sorted((d["device"], d["bytes"], d["dur"]) for d in sends) == \
        [("link:h0->h1", 2_000_000, 16000.0)] * 2 + [("link:h1->h0", 2_000_000, 16000.0)] * 2
    r = p.per_rank[0]
    assert (r["compute_ms"], r["exposed_comm_ms"], r["bubble_ms"]) == pytest.approx((2.0, 32.0, 0.0))
    assert {k: r["memory"][k] for k in ("params", "grads", "optimizer", "comm_buffers")} == \
        dict(params=4_000_000, grads=4_000_000, optimizer=4_000_000, comm_buffers=4_000_000)
    # by default a line rate carries TCP goodput (1448/1514 of it, as dpro replay --bandwidth-mbps)
    from dpro_kit.whatif import TCP_EFFICIENCY
    g = run(one_layer(), {**DP2, "link_efficiency": None, "strategy": {"data_parallel": {"degree": 2}}})
    assert g.iteration_ms == pytest.approx(2.0 + 32.0 / TCP_EFFICIENCY, abs=1e-9)
    assert g.links["goodput_mbps"] == pytest.approx(1000 * TCP_EFFICIENCY)


def test_zero1_ddp_allreduce_then_sharded_step():
    """ZeRO-1 as torch runs it (DDP + ZeroRedundancyOptimizer): the bucket all-reduce (32000 us), the step
    on half the parameters (250 us), then the updated halves reach every rank (one all-gather of 4e6 B:
    1 step of 2e6 B = 16000 us): 1500 + 32000 + 250 + 16000 = 49750 us.  Memory: parameters, gradients
    and DDP's buffer whole, optimizer state halved: 14e6 B."""
    p = run(one_layer(), {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "zero1"}}})
    assert p.iteration_ms == pytest.approx(49.75, abs=1e-9)
    assert [(c["kind"], c["bytes"]) for c in p.compiled.collectives] == [("allreduce", 4_000_000),
                                                                         ("all_gather", 4_000_000)]
    mem = p.per_rank[1]["memory"]
    assert (mem["params"], mem["grads"], mem["optimizer"], mem["comm_buffers"], mem["peak"]) == \
        (4_000_000, 4_000_000, 2_000_000, 4_000_000, 14_000_000)


def test_zero2_unit_gathered_forward_to_backward():
    """ZeRO-2 as FSDP with reshard_after_forward=False: one all-gather of the unit before its forward
    (16000 us), none before the backward, the reduce-scatter after it (16000 us), the step on half
    (250 us): 16000 + 500 + 1000 + 16000 + 250 = 33750 us.  Memory replayed: shards of parameters and
    state (4e6) + the unsharded parameters (4e6, FSDP2 keeps them beside the shard, held to the end of
    the backward) + the whole gradient from the backward's start (4e6) = 12e6 at 16.5 ms (again 12e6 at
    17.5 ms: the parameters go, the reduce-scatter's flat input of 4e6 comes); the parts at their
    largest (gradient shard) sum to 2 + 2 + 2 + 4 = 10e6."""
    p = run(one_layer(), {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "zero2"}}})
    assert p.iteration_ms == pytest.approx(33.75, abs=1e-9)
    assert [(c["kind"], c["bytes"]) for c in p.compiled.collectives] == [("all_gather", 4_000_000),
                                                                         ("reduce_scatter", 4_000_000)]
    mem = p.per_rank[1]["memory"]
    assert (mem["params"], mem["grads"], mem["optimizer"], mem["comm_buffers"], mem["gathered_params"]) == \
        (2_000_000, 2_000_000, 2_000_000, 0, 4_000_000)
    assert (mem["peak"], mem["peak_ms"], mem["parts_sum"]) == (12_000_000, pytest.approx(16.5), 10_000_000)


def test_gloo_reduce_scatter_costs_an_allreduce():
    """On a gloo profile the reduce-scatter is a ring all-reduce (gloo sends an all-reduce's bytes):
    ZeRO-2 above with 2 steps of 2e6 B (32000 us) instead of 1: 33750 + 16000 = 49750 us."""
    m = one_layer()
    m.comm_backend = "gloo"
    p = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "zero2"}}})
    assert p.iteration_ms == pytest.approx(49.75, abs=1e-9)
    sends = [d for _, d in p.compiled.graph.nodes(data=True) if d["kind"] == "SEND" and "reduce_scatter" in d["tensor"]]
    assert len(sends) == 2 * 2 and any("replayed as all-reduces" in n for n in p.notes)


def test_fsdp_on_gloo_blocks_the_rank():
    """torch on CPU (a gloo profile): FSDP2's collectives block the rank (``unshard_async_op`` False, no
    side streams; measured in docs/simulate.md "pinned"), so nothing overlaps them. test_fsdp_units'
    two units, the reduce-scatters as all-reduces (2 steps of 1e6 B = 16000 us), FIFO links, in the
    real job's order (A's backward all-gather prefetched in B's pre-backward hook, before B's backward):
    AG_fwd(A) 0-8000, F(A) 8000-8500, AG_fwd(B) 8500-16500, F(B) 16500-17000, AG_bwd(B) 17000-25000,
    AG_bwd(A) 25000-33000, B(B) 33000-34000, RS(B) 34000-50000, B(A) 50000-51000, RS(A) 51000-67000,
    step 250 us: 67250 us = every collective (64000) + every compute op (3250).
    Memory: shards 2e6 + optimizer 2e6 = 4e6; every all-gather holds FSDP's flat output (2e6) and
    gloo's own flat buffer (2e6) while it runs, then the unit's unsharded parameters (2e6) until its
    forward / backward ends; a reduce-scatter holds FSDP's flat input (2e6) and gloo's ring scratch
    (two segments of 2e6 / 4 = 1e6) while it runs.  At 33000 both units are gathered (4e6) and B's
    gradient (2e6) comes: 10e6; at 34000 B's parameters go (-2e6) and RS(B) starts (+3e6): peak
    11e6 B at 34000 us."""
    m = ModelGraph(layers=[Layer(name=n, params={f"{n}.w": 2_000_000}, ops=[Op("aten::mul", 1000.0)], bwd_us=2000.0)
                           for n in ("a", "b")], update_us=500.0, optimizer_state_bytes=4_000_000)
    m.comm_backend = "gloo"
    p = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "fsdp"}}})
    assert [c["kind"] for c in p.compiled.collectives].count("all_gather") == 4
    assert p.iteration_ms == pytest.approx(67.25, abs=1e-9)
    g = p.compiled.graph

    def coll(nd: str, tag: str) -> list[str]:
        return [k for k, d in g.nodes(data=True) if k.startswith(nd) and tag in str(d.get("tensor"))]
    for nd in ("h0/0", "h1/1"):
        assert nx.has_path(g, f"{nd}|F mb0 a seg0", coll(nd, "all_gather fwd mb0 b")[0])   # after F(A)
        assert all(nx.has_path(g, k, f"{nd}|B mb0 b seg0") for k in coll(nd, "all_gather bwd mb0 a"))  # prefetch
        assert all(nx.has_path(g, k, f"{nd}|B mb0 a seg0") for k in coll(nd, "reduce_scatter b"))
    mem = p.per_rank[0]["memory"]
    assert (mem["peak"], mem["peak_ms"]) == (11_000_000, pytest.approx(34.0))
    assert any("block the rank" in n for n in p.notes)


def test_fsdp_units():
    """Two FSDP units of 2e6 B (1 all-gather step of 1e6 B = 8000 us on each link direction), each
    rank on half the batch (fwd 500, bwd 1000 us per unit):
    AG_fwd(A) 0-8000, AG_fwd(B) 8000-16000, F(A) 8000-8500, F(B) 16000-16500,
    AG_bwd(B) 16500-24500, AG_bwd(A) 24500-32500 (FIFO link), B(B) 24500-25500,
    RS(B) waits for the link: 32500-40500, B(A) 32500-33500, RS(A) 40500-48500,
    step on half the parameters 500 x 0.5 = 250 us: 48750 us."""
    m = ModelGraph(layers=[Layer(name=n, params={f"{n}.w": 2_000_000}, ops=[Op("aten::mul", 1000.0)], bwd_us=2000.0)
                           for n in ("a", "b")], update_us=500.0, optimizer_state_bytes=4_000_000)
    p = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "fsdp"}}})
    kinds = [(c["kind"], c["tag"].split(" mb")[0], c["bytes"]) for c in p.compiled.collectives]
    assert sorted(kinds) == sorted([("all_gather", "fsdp all_gather fwd", 2_000_000)] * 2
                                   + [("all_gather", "fsdp all_gather bwd", 2_000_000)] * 2
                                   + [("reduce_scatter", "fsdp reduce_scatter a", 2_000_000),
                                      ("reduce_scatter", "fsdp reduce_scatter b", 2_000_000)])
    assert all(c["group"] == ["h0/0", "h1/1"] for c in p.compiled.collectives)
    assert p.iteration_ms == pytest.approx(48.75, abs=1e-9)
    mem = p.per_rank[0]["memory"]
    # params, grads and optimizer state sharded; both units gathered at once (prefetch): 2e6 + 2e6 unsharded
    assert (mem["params"], mem["grads"], mem["optimizer"], mem["gathered_params"]) == \
        (2_000_000, 2_000_000, 2_000_000, 4_000_000)
    # replayed: shards 4e6; every collective holds FSDP's flat buffer (2e6) while it runs.  At 32500 us
    # AG_bwd(A) ends (its buffer goes, A's parameters stay: 2e6) and B(A) takes A's gradient (2e6), beside
    # B's gradient (2e6) and RS(B)'s flat input (2e6, queued on the link since 25500): 4 + 2 + 2 + 2 + 2 = 12e6
    assert mem["peak"] == 12_000_000 and mem["peak_ms"] == pytest.approx(32.5)


def tp_model():
    ops = [Op("aten::linear", 1000.0, act_bytes=800_000, linear=(4, 8), in_bytes=800_000, out_bytes=1_600_000,
              weight_bytes=128, bias_bytes=32),
           Op("aten::relu", 200.0, act_bytes=1_600_000),
           Op("aten::linear", 1000.0, act_bytes=1_600_000, linear=(8, 4), in_bytes=1_600_000, out_bytes=800_000,
              weight_bytes=128, bias_bytes=16),
           Op("aten::layer_norm", 300.0, act_bytes=800_000)]
    return ModelGraph(layers=[Layer(name="mlp", params={"fc1.w": 160, "fc2.w": 144}, ops=ops, bwd_us=5000.0)],
                      update_us=0.0, optimizer_state_bytes=304)


def test_tensor_parallel_megatron_pair():
    """Column fc1 -> relu -> row fc2 run on half the features: 2200 / 2 = 1100 us; layer_norm 300 us
    replicated.  Forward all-reduce of fc2's output (8e5 B), backward all-reduce of fc1's input
    gradient (8e5 B); 2 ranks on one host at 1000 Mbit/s: 2 steps x 4e5 B = 6400 us each.
    Backward 5000 us split by forward share: 5000 x 1100/2500 = 2200, 5000 x 300/2500 = 600.
    1100 + 6400 + 300 + 600 + 2200 + 6400 = 17000 us.  Parameters: fc1 (160 B) and fc2's weight
    (128 B) halved, fc2's bias (16 B) replicated: 304 - 80 - 64 = 160 B."""
    p = run(tp_model(), {"ranks": 2, "hosts": 1, "intra_host_bandwidth_mbps": 1000, "latency_us": 0,
                         "strategy": {"tensor_parallel": {"degree": 2}}})
    assert [(c["kind"], c["group"], c["bytes"]) for c in p.compiled.collectives] == \
        [("allreduce", ["h0/0", "h0/1"], 800_000)] * 2
    assert p.iteration_ms == pytest.approx(17.0, abs=1e-9)
    assert p.per_rank[0]["memory"]["params"] == 160
    # activations: fc1 .. fc2 inputs halved (800k + 1.6M + 1.6M) / 2, layer_norm's input whole
    assert p.per_rank[0]["memory"]["activations"] == 2_000_000 + 800_000
    # recomputation re-runs the forward with its all-reduce before the backward:
    # 17000 + 1100 + 6400 + 300 = 24800 us, three all-reduces (forward, recompute, backward)
    r = run(tp_model(), {"ranks": 2, "hosts": 1, "intra_host_bandwidth_mbps": 1000, "latency_us": 0,
                         "strategy": {"tensor_parallel": {"degree": 2}, "recompute": True}})
    assert [c["tag"].split(" mb")[0] for c in r.compiled.collectives] == ["tp fwd", "tp recompute", "tp bwd"]
    assert r.iteration_ms == pytest.approx(24.8, abs=1e-9)
    # no Linear pair anywhere: said, not silently replicated
    n = run(chain_model(2), {"ranks": 2, "strategy": {"tensor_parallel": {"degree": 2}}})
    assert any("no Linear pair" in x for x in n.notes) and n.compiled.collectives == []
    # tensor_parallel degree 1 on the subtree: nothing split, no collective
    q = run(tp_model(), {"ranks": 2, "hosts": 1, "strategy": {"tensor_parallel": {"degree": 2}, "children": [
        {"module": "mlp", "tensor_parallel": {"degree": 1}}]}})
    assert q.compiled.collectives == [] and q.iteration_ms == pytest.approx(7.5, abs=1e-9)


def test_pipeline_split_even_vs_balanced():
    """inp (tiny), 4 equal blocks, a heavy head: balanced by time puts fewer blocks with the head; even
    cuts the blocks by count (inp on the first stage, head on the last), as pipelining jobs do."""
    lay = [Layer(name="inp", ops=[Op("aten::mul", 10.0)], bwd_us=10.0)]
    lay += [Layer(name=f"layers.{i}", ops=[Op("aten::mul", 1000.0)], bwd_us=2000.0) for i in range(4)]
    lay += [Layer(name="head", ops=[Op("aten::mul", 3000.0)], bwd_us=3000.0)]
    m = ModelGraph(layers=lay)
    doc = {"ranks": 2, "hosts": 2, "latency_us": 0, "strategy": {"pipeline": {"stages": 2, "micro_batches": 2}}}
    bal = run(m, doc)
    assert bal.compiled.stage_layers == [["inp", "layers.0", "layers.1", "layers.2"], ["layers.3", "head"]]
    doc["strategy"]["pipeline"]["split"] = "even"
    ev = run(m, doc)
    assert ev.compiled.stage_layers == [["inp", "layers.0", "layers.1"], ["layers.2", "layers.3", "head"]]
    assert bal.iteration_ms < ev.iteration_ms
    doc["strategy"]["pipeline"]["stages"] = 5
    doc["ranks"] = 5
    doc["hosts"] = 5
    with pytest.raises(DproError, match=r"\[strategy.pipeline.split\]: pipeline.split even: 5 stages for 4"):
        run(m, doc)


def block_model():
    """inp Linear, one attention + MLP block with separate q, k, v, o (as examples/strategies/train.py), head."""
    X = 8 * 32 * 128 * 4        # one activation of the block (batch 8, seq 32, d 128)

    def lin(i, o, us=100.0):
        return Op("aten::linear", us, act_bytes=X // 128 * i, linear=(i, o), in_bytes=X // 128 * i,
                  out_bytes=X // 128 * o, weight_bytes=i * o * 4, bias_bytes=o * 4)
    v = lambda n: Op(n, 0.0)  # noqa: E731
    blk = [Op("aten::layer_norm", 50.0, act_bytes=X), lin(128, 128), v("aten::view"), v("aten::transpose"),
           lin(128, 128), v("aten::view"), v("aten::transpose"), lin(128, 128), v("aten::view"),
           v("aten::transpose"), Op("aten::scaled_dot_product_attention", 200.0, act_bytes=3 * X),
           v("aten::transpose"), v("aten::reshape"), lin(128, 128), Op("aten::add", 10.0, act_bytes=2 * X),
           Op("aten::layer_norm", 50.0, act_bytes=X), lin(128, 512), Op("aten::gelu", 40.0, act_bytes=4 * X),
           lin(512, 128), Op("aten::add", 10.0, act_bytes=2 * X)]
    pb = sum(o.weight_bytes + o.bias_bytes for o in blk if o.linear) + 4 * 128 * 4
    return ModelGraph(layers=[
        Layer(name="inp", params={"inp.weight": 128 * 128 * 4}, ops=[lin(128, 128)], bwd_us=200.0),
        Layer(name="layers.0", params={"layers.0.w": pb}, ops=blk, bwd_us=2000.0),
        Layer(name="head", params={"head.proj.weight": 128 * 1000 * 4}, ops=[lin(128, 1000)], bwd_us=200.0)],
        optimizer_state_bytes=0), X


def test_tensor_parallel_column_group_and_replicated_ends():
    """q, k, v read the same input with only views between them: one column group, o its row; fc1 / fc2 the
    second pair.  Forward all-reduces of o's and fc2's outputs, backward all-reduces of the q/k/v input and
    fc1's input: 4 x X bytes (batch 8 x seq 32 x 128 x 4 B).  inp and head (single Linears) stay replicated.
    Parameters on a rank: q, k, v, fc1 weights+biases and o, fc2 weights halved; biases of o, fc2, the two
    layer norms and the whole of inp and head kept."""
    m, X = block_model()
    p = run(m, {"ranks": 2, "hosts": 1, "latency_us": 0, "strategy": {"tensor_parallel": {"degree": 2}}})
    tags = [(c["kind"], c["tag"].split(" mb")[0], c["bytes"]) for c in p.compiled.collectives]
    assert tags == [("allreduce", "tp fwd", X), ("allreduce", "tp bwd", X), ("allreduce", "tp fwd", X),
                    ("allreduce", "tp bwd", X)]
    assert all("layers.0" in c["tag"] for c in p.compiled.collectives)
    col = 3 * (128 * 128 + 128) * 4 + (128 * 512 + 512) * 4
    row_w = (128 * 128 + 512 * 128) * 4
    blk = m.layers[1].param_bytes
    assert p.per_rank[0]["memory"]["params"] == 128 * 128 * 4 + blk - (col + row_w) // 2 + 128 * 1000 * 4
    # segments of layers.0: [ln1] [q k v sdpa o]/2 +AR [add ln2] [fc1 gelu fc2]/2 +AR [add]
    segs = [d for k, d in p.compiled.graph.nodes(data=True) if d["node"] == "h0/0" and d["name"].startswith("F mb0 layers.0")]
    assert [round(d["dur"], 3) for d in segs] == [50.0, (4 * 100 + 200) / 2, 60.0, (100 + 40 + 100) / 2, 10.0]


def test_gloo_allreduce_scratch_in_the_ddp_peak():
    """On a gloo profile each rank holds gloo's ring scratch while a bucket's all-reduce runs: two
    segments, the 4e6 B bucket cut into max(ceil(4e6 / 1 MiB), 2 x 2) = 4 segments of 1e6 B -> 2e6
    (gloo allreduce.cc; measured: docs/simulate.md "Memory predicted from mechanism").  test_ddp_allreduce's
    peak, 16e6 (parameters, state, bucket buffer, gradient), becomes 18e6 when the all-reduce starts
    after the backward (1500 us); the parts (each at its largest) stay 16e6."""
    from dpro_kit.simulate.compiler import gloo_ring_scratch
    assert gloo_ring_scratch(4_000_000, 2) == 2_000_000
    assert gloo_ring_scratch(7_622_640, 2) == 1_905_664     # the mlp's second DDP bucket: 8 segments; measured 1.82 MiB
    assert gloo_ring_scratch(1_000_000, 1) == 0              # one rank: gloo returns before the ring
    m = one_layer()
    m.comm_backend = "gloo"
    p = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2}}})
    mem = p.per_rank[0]["memory"]
    assert (mem["peak"], mem["parts_sum"]) == (18_000_000, 16_000_000)
    assert mem["peak_ms"] == pytest.approx(1.5) and "In dp allreduce" in mem["peak_op"]
    plain = run(one_layer(), {**DP2, "strategy": {"data_parallel": {"degree": 2}}})
    assert plain.per_rank[0]["memory"]["peak"] == 16_000_000     # other backends: no scratch modelled


def test_runtime_bytes_from_the_profiled_peak():
    """--profiled-peak: the profiled process (one rank, DDP over a 1-rank group) replays to parameters
    4e6 + SGD state 4e6 + gradient 4e6 = 12e6, plus DDP's bucket buffer 4e6 that a 1-rank DDP keeps
    (the compiler leaves buffers out at dp = 1): 16e6.  Measured 17.5e6 -> runtime 1.5e6, added to
    every rank of every strategy: ZeRO-2's 12e6 -> 13.5e6, DDP-2's 16e6 -> 17.5e6.  A measurement
    below the model gives 0, never a negative."""
    from dpro_kit.simulate.predict import with_measured_peak
    m = with_measured_peak(one_layer(), 17_500_000)
    assert m.runtime_bytes == 1_500_000
    z2 = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2, "sharding": "zero2"}}})
    ddp = run(m, {**DP2, "strategy": {"data_parallel": {"degree": 2}}})
    assert z2.peak_memory_bytes == 13_500_000 and ddp.peak_memory_bytes == 17_500_000
    assert z2.per_rank[0]["memory"]["runtime"] == 1_500_000
    assert with_measured_peak(one_layer(), 10_000_000).runtime_bytes == 0
    # a strategy runtime's own memory (runtime_memory: the file's key, or predict's argument, which wins)
    # comes on top on every rank: DDP-2 17.5e6 + 0.5e6
    doc = {**DP2, "runtime_memory": "0.5MB", "strategy": {"data_parallel": {"degree": 2}}}
    assert strat(doc).runtime_memory == 500_000
    both = run(m, doc)
    assert both.peak_memory_bytes == 18_000_000 and both.per_rank[1]["memory"]["runtime"] == 2_000_000
    assert both.runtime_memory_bytes == 500_000 and any("runtime memory 0.48 MiB" in n for n in both.notes)
    assert run(m, doc, runtime_memory=0).peak_memory_bytes == 17_500_000
    assert strat({**doc, "runtime_memory": 0}).runtime_memory == 0      # an amount on top: 0 is allowed
    with pytest.raises(DproError, match="not a memory size"):
        strat({**doc, "runtime_memory": -1})


def test_oom_verdict_and_ranking():
    from dpro_kit.simulate.predict import rank_strategies
    ddp = run(one_layer(), {**DP2, "name": "ddp", "strategy": {"data_parallel": {"degree": 2}}},
              memory_limit=13_000_000)
    z2 = run(one_layer(), {**DP2, "name": "z2", "strategy": {"data_parallel": {"degree": 2, "sharding": "zero2"}}},
             memory_limit=13_000_000)
    # DDP: parameters + SGD state + bucket buffer (12e6) + the gradient from the backward (4e6)
    assert ddp.peak_memory_bytes == 16_000_000 and ddp.oom is True
    # ZeRO-2 (test_zero2_unit_gathered_forward_to_backward): 12e6
    assert z2.peak_memory_bytes == 12_000_000 and z2.oom is False
    assert [p.strategy.name for p in rank_strategies([ddp, z2])] == ["z2", "ddp"]


# --------------------------------------------------------------------------- a real profile and the CLI

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "collectors" / "common"),
                                         str(ROOT / "collectors" / "torch"), env.get("PYTHONPATH", "")])
    return env


def dpro(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dpro_kit", *map(str, args)], capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("sim") / "one"
    r = dpro("profile", "--shapes", "--memory", "-o", out, "--steps", "4:6", "--", sys.executable,
             ROOT / "examples/ddp/train.py", "--nproc", "1", "--model", "transformer", "--batch-size", "4",
             "--iters", "6", "--warmup", "2", "--threads", "1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_model_from_real_profile(profile):
    from dpro_kit.simulate.model import from_profile
    mg = from_profile(profile)
    names = mg.layer_names()
    assert names == ["tok", "pos", "blocks.layers.0", "blocks.layers.1", "norm", "head"]
    # parameter bytes per layer = the model's (train.py TinyLM: vocab 2000, d 128, 4d MLP, 2 blocks)
    d = 128
    block = (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 4 * d
    assert [lay.param_bytes for lay in mg.layers] == [2000 * d * 4, 64 * d * 4, block * 4, block * 4, 2 * d * 4,
                                                      (2000 * d + 2000) * 4]
    # every Linear found in its layer with its features (in_proj, out_proj, linear1, linear2; head)
    lin = {lay.name: [o.linear for o in lay.ops if o.linear] for lay in mg.layers}
    assert lin["blocks.layers.0"] == [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] == lin["blocks.layers.1"]
    assert lin["head"] == [(d, 2000)]
    assert all(lay.fwd_us > 0 for lay in mg.layers[2:4]) and all(lay.bwd_us > 0 for lay in mg.layers[2:4])
    assert mg.optimizer_state_bytes == mg.param_bytes     # SGD momentum, recorded by the collector
    # activations: the allocator's (what each layer's backward frees); the head's are dominated by the
    # logits the loss keeps (batch 4 x seq 64 x vocab 2000 x 4 B), which the shape bound finds too
    # (the loss ops, kind OTHER between forward and backward, belong to the last layer)
    logits = 4 * 64 * 2000 * 4
    assert "allocator" in mg.activation_source and mg.transient_bytes > 0
    assert logits <= mg.layers[-1].act_bytes <= 1.2 * logits
    shp = from_profile(profile, allocator=False)
    # without allocator samples the transient is the loss's backward temporaries from shapes: the logits'
    # gradient and the gradient it comes from (log_softmax's output's), 2 x the loss's input
    assert "input shapes" in shp.activation_source and shp.transient_bytes == 2 * logits
    assert logits <= shp.layers[-1].act_bytes <= 1.3 * logits
    # the shape bound is an upper bound on what the blocks' backward frees
    for a, b in zip(mg.layers[2:4], shp.layers[2:4]):
        assert 0 < a.act_bytes <= b.act_bytes
    # one DDP rank = the profiled run: its predicted peak + DDP's bucket buffers is the traced timeline peak
    from dpro_kit.optimize.memory import MemoryModel, build_profile
    from dpro_kit.session import Session
    traced = MemoryModel(profile=build_profile(Session(profile, align=False).profiled)).peak()["peak_bytes"]
    one = predict(mg, strat({"ranks": 1, "strategy": {}}), device_model="fifo")
    assert one.peak_memory_bytes + mg.param_bytes == pytest.approx(traced, abs=8)
    assert one.per_rank[0]["memory"]["peak_op"].endswith(f"B mb0 head seg0")


def test_one_rank_strategy_is_dpro_replay(profile, tmp_path):
    """A 1-rank strategy replays the profiled iteration itself: the same number `dpro replay` predicts."""
    (tmp_path / "one.yaml").write_text("ranks: 1\nstrategy: {}\n")
    sim = json.loads(dpro("simulate", profile, "-s", tmp_path / "one.yaml", "--json").stdout)
    rep = json.loads(dpro("replay", profile, "--no-align", "--json").stdout)
    assert sim["iteration_ms"] == pytest.approx(rep["iteration_time_ms"], abs=1e-3)
    assert sim["breakdown_ms"]["compute"] == pytest.approx(sim["iteration_ms"], abs=1e-3)


def test_cli_compare_json_and_text(profile, tmp_path):
    (tmp_path / "ddp.yaml").write_text("name: ddp\nranks: 2\nhosts: 2\nbandwidth_mbps: 1000\n"
                                       "strategy:\n  data_parallel: {degree: 2}\n")
    (tmp_path / "pp.json").write_text(json.dumps({"name": "pp", "ranks": 2, "hosts": 2, "strategy": {
        "pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b"}, "recompute": True}}))
    (tmp_path / "tp.yaml").write_text("name: tp\nranks: 4\nhosts: 2\nstrategy:\n  data_parallel: {degree: 2, "
                                      "sharding: fsdp}\n  tensor_parallel: {degree: 2}\n  children:\n"
                                      "    - {module: tok, tensor_parallel: {degree: 1}}\n")
    r = dpro("simulate", profile, "--strategy", tmp_path / "ddp.yaml", "--compare", tmp_path / "pp.json",
             "--compare", tmp_path / "tp.yaml", "--memory-limit", "1GiB", "--runtime-memory", "tp=2MiB",
             "--link-burst", "64KiB", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["runtime_memory_bytes"] for s in doc["strategies"]] == [0, 0, 2 * 2**20]
    assert {s["links"]["burst_bytes"] for s in doc["strategies"]} == {65536}
    assert [s["name"] for s in doc["strategies"]] == ["ddp", "pp", "tp"]
    first = doc["strategies"][0]      # the --strategy's numbers are also at the top level
    assert (doc["name"], doc["iteration_ms"], doc["peak_memory_bytes"], doc["oom"]) == \
        ("ddp", first["iteration_ms"], first["peak_memory_bytes"], False)
    assert sorted(doc["ranking"]) == ["ddp", "pp", "tp"]
    for s in doc["strategies"]:
        b = s["breakdown_ms"]
        assert b["compute"] + b["exposed_comm"] + b["bubble"] == pytest.approx(s["iteration_ms"], abs=1e-3)
        assert s["oom"] is False and s["peak_memory_bytes"] > 0
    by = {s["name"]: s for s in doc["strategies"]}
    assert set(by["ddp"]["collectives"]) == {"allreduce"}
    assert by["pp"]["collectives"]["send_recv"]["count"] == 2 * 4
    assert set(by["tp"]["collectives"]) == {"allreduce", "all_gather", "reduce_scatter"}
    t = dpro("simulate", profile, "-s", tmp_path / "ddp.yaml", "--compare", tmp_path / "pp.json",
             "--memory-limit", "1KiB", "--bandwidth-mbps", "200", "--timeline", tmp_path / "tl.json")
    assert t.returncode == 0, t.stderr
    assert "ranking (fits in memory first" in t.stdout and "OOM" in t.stdout and "200 Mbit/s" in t.stdout
    tl = json.loads((tmp_path / "tl.json").read_text())      # the --strategy's replay, for Perfetto
    ev = tl["traceEvents"] if isinstance(tl, dict) else tl
    names = {e.get("name", "") for e in ev if e.get("ph") == "X"}
    assert any(n.startswith("F mb0 head") for n in names) and any(n.startswith("SEND") for n in names)


def test_cli_errors(profile, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ranks: 2\nstrategy:\n  data_parallel: {degree: 2, shardng: fsdp}\n")
    r = dpro("simulate", profile, "--strategy", bad)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"{bad} [strategy.data_parallel.shardng]: unknown key 'shardng'" in r.stderr
    syn = tmp_path / "syn.yaml"
    syn.write_text("ranks: [2\n")
    r = dpro("simulate", profile, "--strategy", syn)
    assert r.returncode == 2 and "not valid YAML" in r.stderr and str(syn) in r.stderr
    r = dpro("simulate", profile, "--strategy", tmp_path / "missing.yaml")
    assert r.returncode == 2 and "cannot read the strategy file" in r.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text("ranks: 2\nstrategy:\n  pipeline: {stages: 2}\n  children: [{module: blocks.layers.9}]\n")
    r = dpro("simulate", profile, "--strategy", ok)
    assert r.returncode == 2 and "matches no layer" in r.stderr and "tok, pos, blocks.layers.0" in r.stderr
    r = dpro("simulate", profile, "--strategy", ok, "--device-model", "fifo", "--overlap-factor", "0.1")
    assert r.returncode == 2 and "--overlap-factor needs the shared device model" in r.stderr
    r = dpro("simulate", profile, "--strategy", ok, "--memory-limit", "big")
    assert r.returncode == 2 and "--memory-limit" in r.stderr
    r = dpro("simulate", profile, "--strategy", ok, "--runtime-overhead", "nope=3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no strategy named 'nope'" in r.stderr
    r = dpro("simulate", profile, "--strategy", ok, "--runtime-overhead", "ok=-1")
    assert r.returncode == 2 and "expected NAME=MS" in r.stderr
    # --runtime-memory: the same NAME=VALUE rules (one helper), 0 allowed, a bad size named
    for arg, want in (("ok", "expected NAME=SIZE"), ("nope=1MiB", "no strategy named 'nope'"),
                      ("ok=lots", "not a memory size")):
        r = dpro("simulate", profile, "--strategy", ok, "--runtime-memory", arg)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and want in r.stderr and "--runtime-memory" in r.stderr
    # a profile without --shapes (the committed 2-rank trace)
    r = dpro("simulate", ROOT / "examples/traces/ddp-2rank-gloo", "--strategy", ok)
    assert r.returncode == 2 and "no op shapes" in r.stderr and "--shapes" in r.stderr
    h = dpro("simulate", "--help")
    assert h.returncode == 0 and "data_parallel: {degree: 2, sharding: fsdp}" in h.stdout and "--compare" in h.stdout


# --------------------------------------------------------------------------- op time as a function of the batch

def test_batch_time_rule():
    from dpro_kit.simulate.model import batch_time
    assert batch_time([(1.0, 40.0)], 0.25) == 10.0                      # one profile: linear through 0
    two = [(0.5, 30.0), (1.0, 40.0)]                                     # t = 20 + 20 x
    assert batch_time(two, 0.25) == 25.0 and batch_time(two, 0.75) == 35.0 and batch_time(two, 2.0) == 60.0
    three = [(1.0, 42.0), (0.25, 30.0), (0.5, 30.0)]                     # any order; piecewise linear
    assert batch_time(three, 0.5) == 30.0 and batch_time(three, 0.75) == 36.0 and batch_time(three, 0.125) == 30.0
    assert batch_time([(0.5, 10.0), (1.0, 40.0)], 0.125) == 0.0           # the line goes below 0: clamped


def _fit_pair(fwd1=(1000.0, 3000.0), fwd2=(700.0, 1600.0), bwd1=(2000.0, 6000.0), bwd2=(1400.0, 3200.0)):
    """Two 2-layer models of one script, profiled at batch 8 (input 8 x 16 x 4 B) and batch 4."""
    def mg(fwd, bwd, batch, src, other):
        inp = batch * 16 * 4
        lay = [Layer(name=f"layers.{i}", params={f"layers.{i}.w": 1000}, bwd_us=bwd[i], input_bytes=inp,
                     ops=[Op("aten::linear", fwd[i], act_bytes=inp, linear=(16, 16), in_bytes=inp, out_bytes=inp)])
               for i in range(2)]
        return ModelGraph(layers=lay, update_us=500.0, other_us=other, optimizer_state_bytes=2000, source=src)
    return mg(fwd1, bwd1, 8, "b8", 400.0), mg(fwd2, bwd2, 4, "b4", 300.0)


def test_fit_batches_times_in_the_compiled_graph():
    from dpro_kit.simulate.model import fit_batches
    main, half = _fit_pair()
    fit_batches(main, [half])
    assert main.batch_fractions == [0.5, 1.0] and main.batch_scaling == "fitted"
    # per op: t(x) = t(0.5) + (t(1) - t(0.5)) (x - 0.5) / 0.5 -> layers.0 fwd at 0.25: 700 - 300/2 = 550
    assert main.layers[0].ops[0].time(0.5) == 700.0 and main.layers[0].ops[0].time(0.25) == 550.0
    assert main.layers[1].bwd_time(0.25) == 3200.0 - 2800.0 / 2
    # DDP over 2 replicas: every op at x = 1/2 = the batch-4 profile's own times; the data at 1/2 too
    p = run(main, {"ranks": 2, "hosts": 2, "strategy": {"data_parallel": {"degree": 2}}})
    dur = {d["name"]: d["dur"] for _, d in p.compiled.graph.nodes(data=True) if d.get("node") == "h0/0"}
    assert dur["F mb0 layers.0 seg0"] == 700.0 and dur["B mb0 layers.1 seg0"] == 3200.0
    assert dur["other (data, zero_grad)"] == 300.0 and dur["optimizer step"] == 500.0
    assert any("interpolated between the profiles" in n for n in p.notes)
    # a pipeline of 2 stages x 2 micro-batches: 1/2 again; 4 micro-batches: 1/4, below the profiles (extrapolated)
    pp = run(main, {"ranks": 2, "hosts": 2, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4}}})
    dur = {d["name"]: d["dur"] for _, d in pp.compiled.graph.nodes(data=True) if d.get("node") == "h1/1"}
    assert dur["F mb3 layers.1 seg0"] == 1600.0 - 1400.0 / 2 and dur["B mb0 layers.1 seg0"] == 3200.0 - 2800.0 / 2
    assert dur["other (data, zero_grad)"] == 400.0       # the replica's whole batch (dp = 1)
    assert any("extrapolated below the smallest profiled batch" in n for n in pp.notes)
    # one profile: linear (today's rule) and the note says it is an assumption
    lin, _ = _fit_pair()
    pl = run(lin, {"ranks": 2, "hosts": 2, "strategy": {"pipeline": {"stages": 2, "micro_batches": 4}}})
    dur = {d["name"]: d["dur"] for _, d in pl.compiled.graph.nodes(data=True) if d.get("node") == "h1/1"}
    assert dur["F mb3 layers.1 seg0"] == 3000.0 / 4 and dur["other (data, zero_grad)"] == 400.0
    assert any("linear in the batch is an assumption" in n for n in pl.notes)


def test_fit_batches_tensor_parallel_split_ops():
    """Megatron-split ops run at x / tp (the same work as 1/tp of the batch), the rest at x."""
    from dpro_kit.simulate.model import fit_batches
    def mg(scale, src):
        lin = lambda i, o, t: Op("aten::linear", t, act_bytes=scale * 64 * i * 4, linear=(i, o),  # noqa: E731
                                 in_bytes=scale * 64 * i * 4, out_bytes=scale * 64 * o * 4, weight_bytes=i * o * 4)
        ops = [Op("aten::layer_norm", 100.0 * scale + 50.0), lin(16, 64, 400.0 * scale + 200.0),
               Op("aten::gelu", 80.0 * scale + 20.0), lin(64, 16, 400.0 * scale + 200.0)]
        return ModelGraph(layers=[Layer(name="mlp", params={"fc1.w": 4096, "fc2.w": 4096}, ops=ops,
                                        bwd_us=1000.0 * scale + 500.0, input_bytes=scale * 64 * 16 * 4)],
                          optimizer_state_bytes=8192, source=f"s{scale}")
    main = fit_batches(mg(2, "s2"), [mg(1, "s1")])       # every op linear in scale: t = a + c scale
    p = run(main, {"ranks": 2, "hosts": 2, "strategy": {"tensor_parallel": {"degree": 2}}})
    dur = {d["name"]: d["dur"] for _, d in p.compiled.graph.nodes(data=True) if d.get("node") == "h0/0"}
    # segments: [layer_norm] at x = 1 (scale 2): 250; [fc1 gelu fc2] at x/2 = scale 1: 600 + 100 + 600
    assert dur["F mb0 mlp seg0"] == 250.0 and dur["F mb0 mlp seg1"] == 1300.0
    # backward: the layer's at x (2500) x the segment's share of the layer's forward at x (250 + 2 x 1000 + 180)
    assert dur["B mb0 mlp seg1"] == pytest.approx(2500.0 * 1300.0 / 2430.0)


def test_fit_batches_refuses_other_profiles():
    from dpro_kit.simulate.model import fit_batches
    main, half = _fit_pair()
    half.layers[1].name = "head"
    with pytest.raises(DproError, match=r"its layers \(layers.0, head\) are not those of b8") as exc:
        fit_batches(main, [half])
    assert "\n" not in str(exc.value) and str(exc.value).startswith("b4")     # one line, naming the profile
    main, half = _fit_pair()
    half.layers[1].ops.insert(0, Op("aten::relu", 10.0))
    with pytest.raises(DproError, match="layer layers.1: op 0 is aten::relu where b8 has aten::linear"):
        fit_batches(main, [half])
    main, half = _fit_pair()
    half.layers[1].ops[0].in_bytes *= 2          # a Linear input that does not scale with the model's input
    with pytest.raises(DproError, match="differ in more than the batch size"):
        fit_batches(main, [half])
    main, half = _fit_pair()
    _, again = _fit_pair()
    with pytest.raises(DproError, match="the same as b4's"):
        fit_batches(main, [half, again])
    main, _ = _fit_pair()
    same, _ = _fit_pair()
    with pytest.raises(DproError, match="its batch is 1 x"):
        fit_batches(main, [same])


@pytest.fixture(scope="module")
def half_profile(tmp_path_factory):
    """The `profile` fixture's script at half its batch (without --memory, which only slows it: the tests
    below check which times are used, not how good a fit across the two is)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("sim") / "half"
    # 3 profiled iterations and 4 unprofiled ones after the window (steps 9-12; 7 holds the export, 8 the
    # --shapes one): the reader measures the profiler's cost on them (test_profiler_cost_note)
    r = dpro("profile", "--shapes", "-o", out, "--steps", "4:7", "--", sys.executable,
             ROOT / "examples/ddp/train.py", "--nproc", "1", "--model", "transformer", "--batch-size", "2",
             "--iters", "11", "--warmup", "2", "--threads", "1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_fit_from_real_profiles(profile, half_profile, tmp_path):
    """Two real profiles (batch 4 and 2): the batch fraction from the shapes, op times at the ranks' batch."""
    from dpro_kit.simulate.model import batch_fraction, fit_batches, from_profile
    main, half = from_profile(profile), from_profile(half_profile, allocator=False)
    assert batch_fraction(main, half) == 0.5
    fit_batches(main, [half])
    # a DDP replica runs every op at half the batch: the batch-2 profile's measured times, op by op
    p = predict(main, strat({"ranks": 2, "hosts": 2, "strategy": {"data_parallel": {"degree": 2}}}), device_model="fifo")
    dur = {d["name"]: d["dur"] for _, d in p.compiled.graph.nodes(data=True) if d.get("node") == "h0/0"}
    for la, lb in zip(main.layers, half.layers):
        assert dur[f"F mb0 {la.name} seg0"] == pytest.approx(lb.fwd_us, abs=1e-6)
        assert dur[f"B mb0 {la.name} seg0"] == pytest.approx(lb.bwd_us, abs=1e-6)
    # shapes-based activation bytes are linear in the batch (the memory model's /(dp m)) but for small
    # batch-independent inputs: the positional layer reads its position ids and table whatever the batch
    shp = from_profile(profile, allocator=False)
    const = {la.name: 2 * lb.act_bytes - la.act_bytes for la, lb in zip(shp.layers, half.layers)}
    assert const["pos"] > 0 and sum(const.values()) < 0.01 * sum(lay.act_bytes for lay in shp.layers)
    assert all(v == 0 for k, v in const.items() if k != "pos")
    # the CLI: --profile-at-batch, the model's measured fractions in --json, the note on every strategy
    (tmp_path / "pp.yaml").write_text("name: pp\nranks: 2\nhosts: 2\nstrategy:\n  pipeline: {stages: 2, micro_batches: 2}\n")
    r = dpro("simulate", profile, "--profile-at-batch", half_profile, "-s", tmp_path / "pp.yaml", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"]["batch_scaling"] == "fitted" and doc["model"]["batch_fractions"] == [0.5, 1.0]
    assert any("interpolated between the profiles" in n for n in doc["strategies"][0]["notes"])
    one = json.loads(dpro("simulate", profile, "-s", tmp_path / "pp.yaml", "--json").stdout)
    assert one["model"]["batch_scaling"] == "linear"
    assert any("linear in the batch is an assumption" in n for n in one["strategies"][0]["notes"])
    # at x = 1/2 the fitted ops take the batch-2 profile's times, the linear rule half the batch-4 ones
    assert doc["iteration_ms"] != one["iteration_ms"]
    t = dpro("simulate", profile, "--profile-at-batch", half_profile, "-s", tmp_path / "pp.yaml")
    assert t.returncode == 0 and "op times at batch fractions 0.5: fwd" in t.stdout
    # refusal: one line, exit 2 (the same profile again: the same batch; other cases: test_fit_batches_refuses_...)
    r = dpro("simulate", profile, "--profile-at-batch", profile, "-s", tmp_path / "pp.yaml")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "its batch is 1 x" in r.stderr


def test_profiler_cost_note(profile, half_profile, tmp_path):
    """A profile with no unprofiled iteration after its window keeps part of the profiler's cost in its op
    times (the reader can subtract only its calibration loop's; measured on the bench's single-process
    profiles: their replays 11-30 % above the unprofiled process, docs/simulate.md): dpro simulate says so,
    for the main profile and for a --profile-at-batch one.  With unprofiled iterations after the window
    (half_profile) the reader measures the cost on the job's own iterations and there is no note."""
    from dpro_kit.readers.torch_kineto import COST_NOT_MEASURED, window_overhead_ns
    from dpro_kit.simulate.model import fit_batches, from_profile
    meta = json.loads(next(Path(half_profile).glob("*/*/meta.json")).read_text())
    assert meta["measured"]["unprofiled_steps_used"] == [9, 10, 11, 12]
    assert window_overhead_ns(meta, 100.0) is not None
    main, half = from_profile(profile, allocator=False), from_profile(half_profile, allocator=False)
    mine = [n for n in main.notes if COST_NOT_MEASURED in n]
    assert len(mine) == 1 and "no unprofiled iteration after warm-up outside the profiled window (steps 4..5" in mine[0]
    assert str(profile) in mine[0]
    assert not any(COST_NOT_MEASURED in n for n in half.notes)
    fit_batches(half, [main])           # the other profile's note comes along
    assert mine[0] in half.notes
    (tmp_path / "ddp.yaml").write_text("name: d\nranks: 2\nhosts: 2\nstrategy:\n  data_parallel: {degree: 2}\n")
    doc = json.loads(dpro("simulate", half_profile, "-s", tmp_path / "ddp.yaml", "--json").stdout)
    assert not any(COST_NOT_MEASURED in n for n in doc["strategies"][0]["notes"])
    doc = json.loads(dpro("simulate", profile, "--profile-at-batch", half_profile, "-s", tmp_path / "ddp.yaml",
                          "--json").stdout)
    assert sum(COST_NOT_MEASURED in n for n in doc["strategies"][0]["notes"]) == 1


def test_bench_predicts_in_process_what_the_command_prints(profile, half_profile, tmp_path):
    """bench/simulate_accuracy.py predicts in its own process (each profile read once: a --repredict of 50 rows
    took 20+ minutes as 50 `dpro simulate` runs): the same numbers as the command line it records; and a
    --repredict never writes into the folder of the rows it reads."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("simulate_accuracy", ROOT / "bench" / "simulate_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sf = tmp_path / "pp.yaml"
    sf.write_text("name: pp\nranks: 2\nhosts: 2\nstrategy:\n  pipeline: {stages: 2, micro_batches: 2}\n")
    got = bench.simulate(str(profile), sf, 200.0, 2**20, [str(half_profile)], profiled_peak=30 * 2**20,
                         overhead_ms=1.23456, runtime_memory=2**20, burst=True, gamma=0.4)
    assert "error" not in got, got
    r = dpro(*got["cmd"].split())
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (got["ms"], got["peak_bytes"], got["oom"]) == (doc["iteration_ms"], doc["peak_memory_bytes"], doc["oom"])
    assert "--runtime-overhead pp=1.235" in got["cmd"] and "--link-burst 65536" in got["cmd"]
    assert "--overlap-factor 0.4" in got["cmd"]
    assert bench._rate_values("1000=0.41,200=1.87") == {"1000": 0.41, "200": 1.87}
    rows = tmp_path / "run" / "rows.json"
    rows.parent.mkdir()
    rows.write_text("{}")
    with pytest.raises(SystemExit) as e:
        bench.main(["--repredict", str(rows), "--out", str(rows.parent)])
    assert e.value.code == 2


def test_bench_profile_rounds_keeps_the_median_process():
    """--profile-rounds N: of N profiles the one whose process ran its unprofiled iterations at the median speed."""
    import argparse
    import importlib.util
    spec = importlib.util.spec_from_file_location("simulate_accuracy", ROOT / "bench" / "simulate_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Jobs:
        speeds = iter([15.4, 12.0, 13.0])

        def job(self, model, sfile, ranks, rate, profile=False, batch=None):
            ms = next(self.speeds)
            return {"tag": f"p{ms}", "ms": ms + 5, "unprofiled_ms": ms, "trace": f"t{ms}", "batch": batch}
    got = bench.profile_job(argparse.Namespace(profile_rounds=3), Jobs(), "mlp", 16)
    assert (got["trace"], got["rounds_unprofiled_ms"]) == ("t13.0", [15.4, 12.0, 13.0])
