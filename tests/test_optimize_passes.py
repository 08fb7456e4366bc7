"""Graph passes: rewrite, undo, cycle safety, registry."""
import pytest

from dpro_kit.errors import DproError, GraphError
from dpro_kit.graph.model import op_key
from dpro_kit.optimize import PASSES, GraphPass, PassRefused, Strategy, build, extract_base, initial_strategy
from dpro_kit.optimize.examples import tiny_dfg
from dpro_kit.optimize.passes import load_pass
from dpro_kit.replay import replay


@pytest.fixture
def base():
    return extract_base(tiny_dfg())


def test_rebuild_reproduces_the_source_graph(base):
    g = tiny_dfg()
    h = build(base, initial_strategy(base))
    assert sorted(h.nodes) == sorted(g.nodes)
    assert set(h.edges) == set(g.edges)
    # FW 100, BW1 -> 150, BW2 -> 190; g1 150 -> 1170; g0 waits for the link: 1170 -> 2190; UPD +5
    assert replay(h).iteration_time_us == replay(g).iteration_time_us == 2195.0


def test_op_fusion_rewrite_and_undo(base):
    s0 = initial_strategy(base)
    ch = PASSES["op_fusion"]().change(s0, base, a=["BW1"], b=["BW2"])
    g = build(base, ch.after)
    fk = op_key("w0", "FUSED[BW1+BW2]")
    assert fk in g and op_key("w0", "BW1") not in g
    assert g.nodes[fk]["dur"] == 70.0 and g.nodes[fk]["source"] == "model:fused"
    # both tensors now wait for the fused op (ends at 170): g1 170 -> 1190, g0 -> 2210, UPD -> 2215
    assert replay(g).iteration_time_us == 2215.0
    assert ch.undo() == s0
    assert set(build(base, ch.undo()).nodes) == set(tiny_dfg().nodes)


def test_op_fusion_refuses_a_cycle():
    base = extract_base(tiny_dfg(sync_bn=True))   # BW1 -> allreduce s -> BW2
    s0 = initial_strategy(base)
    with pytest.raises(PassRefused, match="cycle"):
        PASSES["op_fusion"]().apply(s0, base, a=["BW1"], b=["BW2"])
    # forced past the check, the rebuild itself refuses the cyclic graph
    bad = PASSES["op_fusion"]().apply(s0, base, a=["BW1"], b=["BW2"], check=False)
    with pytest.raises(GraphError, match="cycle"):
        build(base, bad)
    # FW + BW1 is fine
    ok = PASSES["op_fusion"]().apply(s0, base, a=["FW"], b=["BW1"])
    build(base, ok)


def test_tensor_fusion_and_partition(base):
    s0 = initial_strategy(base)
    s1 = PASSES["tensor_fusion"]().apply(s0, base, a="g1", b="g0")
    assert s1.groups == (("g1", "g0"),)
    g = build(base, s1)
    assert op_key("w0", "In g1+g0") in g
    # fused 2 MB ready at 190: 190 + 2020 = 2210, UPD 2215
    assert replay(g).iteration_time_us == 2215.0
    s2 = PASSES["tensor_partition"]().apply(s1, base, tensor="g0", k=2)
    assert s2.parts("g1+g0") == 2
    g2 = build(base, s2)
    assert op_key("w0", "In g1+g0#p0") in g2 and op_key("w0", "In g1+g0#p1") in g2
    assert PASSES["tensor_partition"]().apply(s2, base, tensor="g1", k=1) == s1
    with pytest.raises(PassRefused):
        PASSES["tensor_fusion"]().apply(s1, base, a="g1", b="g0")


def test_memory_passes_change_time(base):
    s0 = initial_strategy(base)
    t0 = replay(build(base, s0)).iteration_time_us
    s1 = PASSES["recomputation"]().apply(s0, base)
    # backward ops get the forward time (100 us) spread over them: BW1 50+55.6, BW2 40+44.4 -> +100 us
    g1 = build(base, s1)
    assert g1.nodes[op_key("w0", "BW1")]["dur"] == pytest.approx(50 + 100 * 50 / 90)
    assert replay(g1).iteration_time_us > t0
    s2 = PASSES["gradient_accumulation"]().apply(s0, base, steps=2)
    assert s2.mem() == {"accum_steps": 2}
    assert replay(build(base, s2)).iteration_time_us >= t0


def test_strategy_json_roundtrip(base):
    s = initial_strategy(base).with_fused_groups(0, 1).with_partitions("g1+g0", 4).with_op_fusion(["FW"], ["BW1"])
    assert Strategy.from_json(s.to_json()) == s


class HalfLatency(GraphPass):
    name = "test_user_pass"

    def apply(self, state, base, **args):
        return state.with_memory(user_flag=True)


def test_user_pass_registry():
    cls = load_pass("tests.test_optimize_passes:HalfLatency")
    assert PASSES["test_user_pass"] is cls
    with pytest.raises(DproError):
        load_pass("nonexistent.module:Nope")
    with pytest.raises(DproError):
        load_pass("no-colon")
