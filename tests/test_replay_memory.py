"""Memory per worker over a replay and the OOM verdict (dpro_kit.optimize.memory.replay_memory / graph_memory)."""
from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from click.testing import CliRunner

from dpro_kit.cli.replay import replay as replay_cmd
from dpro_kit.graph import add_op
from dpro_kit.optimize.memory import build_profile, replay_memory
from dpro_kit.replay import replay
from dpro_kit.session import Session
from dpro_kit.trace import load_trace, save_trace
from test_memory_estimate import PERSISTENT, toy_traceset


def hand_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    add_op(g, "A", node="w0", device="w0:compute", dur=10, mem_alloc=100)              # 0..10
    add_op(g, "B", node="w0", device="w0:compute", dur=5, mem_alloc=50, mem_free=150)  # 10..15
    add_op(g, "D", node="w0", device="w0:aux", dur=10, mem_alloc=80, mem_free=80)      # 5..15 (after P)
    add_op(g, "P", node="w0", device="w0:aux", dur=5)
    add_op(g, "C", node="w1", device="w1:compute", dur=4, mem_alloc=30, mem_free=30)
    g.add_edges_from([("A", "B"), ("P", "D")])
    g.graph["memory_base"] = {"w0": 1000, "w1": 500}
    return g


def test_hand_schedule_peak_and_verdict():
    # w0: 1000; A +100 at 0 -> 1100; D +80 at 5 -> 1180; A frees 0 at 10, B +50 at 10 -> 1230 (peak, B);
    # B -150 and D -80 at 15 -> 1000.  w1: 500 + 30 during 0..4 -> 530.
    g = hand_graph()
    res = replay(g)
    m = replay_memory(res, g, limit=1200)
    assert m.peak == {"w0": 1230, "w1": 530}
    assert m.peak_us["w0"] == 10 and m.peak_op["w0"] == "B" and m.peak_op["w1"] == "C"
    assert m.oom == ["w0"] and m.to_dict()["verdict"] == "OOM"
    assert replay_memory(res, g, limit=1230).oom == []          # at the limit: fits
    t, b = m.timeline["w0"]
    # base, A+100, D+80, A's end (frees 0) then B+50 at 10, the two frees at 15
    assert list(b[:5]) == [1000, 1100, 1180, 1180, 1230] and b[-1] == 1000 and b[5] in (1080, 1150)
    assert list(t) == [0, 0, 5, 10, 10, 15, 15]


def test_frees_before_allocations_at_the_same_instant():
    # X frees 100 at 10 when Y allocates 100 at 10: the level never reaches base + 200
    g = nx.DiGraph()
    add_op(g, "X", node="w", device="w:compute", dur=10, mem_alloc=100, mem_free=100)
    add_op(g, "Y", node="w", device="w:aux", dur=5, mem_alloc=100, mem_free=100)
    add_op(g, "Q", node="w", device="w:aux", dur=10)
    g.add_edge("Q", "Y")
    m = replay_memory(replay(g), g)
    assert m.peak == {"w": 100}


def test_two_iterations_repeat_the_timeline():
    g = hand_graph()
    g.graph["iteration_edges"] = [("B", "A"), ("D", "P"), ("C", "C")]
    m = replay_memory(replay(g, iterations=2), g)
    assert m.peak == {"w0": 1230, "w1": 530} and m.timeline["w0"][1][-1] == 1000


@pytest.fixture()
def toy_dir(tmp_path: Path) -> Path:
    return save_trace(toy_traceset(), tmp_path / "toy")


def test_traced_memory_replays_to_the_timeline_models_peak(toy_dir: Path):
    """The trace's allocator increments put on the DFG's ops (graph_memory) and played at the replayed
    times give, per worker, the timeline model's peak (hand-computed in test_memory_estimate: 758 + 180)."""
    s = Session(toy_dir)
    res = s.replay()
    m = s.memory(res, limit=900)
    assert m.peak == {"w0": 758 + PERSISTENT, "w1": 758 + PERSISTENT}
    assert all(k.endswith("|bwC") for k in m.peak_op.values())
    assert m.oom == ["w0", "w1"]
    assert s.memory(res, limit=1000).oom == []
    from dpro_kit.optimize.memory import MemoryModel
    assert MemoryModel(profile=build_profile(load_trace(toy_dir))).peak()["peak_bytes"] == 758 + PERSISTENT


def test_cli_memory_limit(toy_dir: Path, tiny_trace_dir: Path):
    r = CliRunner().invoke(replay_cmd, [str(toy_dir), "--memory-limit", "900", "--json"])
    assert r.exit_code == 0, r.output
    mem = json.loads(r.output)["memory"]
    assert mem["verdict"] == "OOM" and mem["max_peak_bytes"] == 938 and mem["limit_bytes"] == 900
    r = CliRunner().invoke(replay_cmd, [str(toy_dir), "--memory-limit", "1KB"])
    assert r.exit_code == 0 and "verdict: fits" in r.output, r.output
    r = CliRunner().invoke(replay_cmd, [str(toy_dir), "--memory-limit", "lots"])
    assert r.exit_code == 2 and "--memory-limit" in r.output
    r = CliRunner().invoke(replay_cmd, [str(tiny_trace_dir), "--memory"])
    assert r.exit_code == 1 and "dpro profile --memory" in str(r.exception)   # main() turns it into exit 2


def test_timeline_has_a_memory_counter_per_worker(toy_dir: Path, tmp_path: Path):
    tl = tmp_path / "tl.json"
    r = CliRunner().invoke(replay_cmd, [str(toy_dir), "--memory", "--timeline", str(tl), "-q"])
    assert r.exit_code == 0, r.output
    evs = json.loads(tl.read_text())["traceEvents"]
    counters = [e for e in evs if e.get("ph") == "C"]
    assert {e["name"] for e in counters} == {"memory w0", "memory w1"}
    w0 = [e["args"]["bytes"] for e in counters if e["name"] == "memory w0"]
    assert max(w0) == 938
