"""Alg. 1 search: improvement, speed-up switches, budgets, checkpoint/resume, memory budget."""
import sys
from pathlib import Path

import pytest

from dpro_kit.optimize import SearchOptions, Searcher, extract_base, initial_strategy
from dpro_kit.optimize.examples import tiny_dfg
from dpro_kit.optimize.memory import MemoryModel, parse_size
from dpro_kit.optimize.search import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import synthetic  # noqa: E402


def test_latency_bound_job_fuses_tensors():
    # 500 us latency, ~free bandwidth: each tensor 2 x (500 + 0.5) = 1001 us.
    # unfused: g1 150 -> 1151, g0 1151 -> 2152, UPD -> 2157
    # fused: ready 190, 190 + 2 x (500 + 1) = 1192, UPD -> 1197
    base = extract_base(tiny_dfg(latency_us=500.0, bandwidth_Bps=1e12))
    r = Searcher(base, SearchOptions(budget_s=10)).run()
    assert r.before_us == pytest.approx(2157.0)
    assert r.strategy.groups == (("g1", "g0"),)
    assert r.after_us == pytest.approx(1197.0)
    assert any(c["pass"] == "tensor_fusion" and "Theorem" in c["reason"] for c in r.changes)


def test_bandwidth_bound_job_is_not_made_worse():
    base = extract_base(tiny_dfg())
    r = Searcher(base, SearchOptions(budget_s=10)).run()
    assert r.after_us <= r.before_us == 2195.0


@pytest.mark.parametrize("flags", [dict(coarsened=False, partial_replay=False, symmetry=False),
                                   dict(coarsened=True, partial_replay=False, symmetry=False),
                                   dict(coarsened=True, partial_replay=True, symmetry=False),
                                   dict(coarsened=True, partial_replay=True, symmetry=True)])
def test_speedup_switches_all_improve_a_slow_synthetic_job(flags):
    g = synthetic.synthetic_dfg(ranks=4, layers=8, buckets=8, seed=3)
    base = extract_base(g)
    base.model.default.bandwidth_Bps = 1e9 / 8   # 1 Gbit/s: communication-bound
    base.model.per_link = {}
    r = Searcher(base, SearchOptions(budget_s=20, **flags)).run()
    assert r.after_us < r.before_us
    assert r.steps >= 1 and r.replays >= 1


def test_step_budget_and_checkpoint_resume(tmp_path):
    base = extract_base(tiny_dfg(latency_us=500.0, bandwidth_Bps=1e12))
    ck = tmp_path / "ck.json"
    r1 = Searcher(base, SearchOptions(max_steps=1, checkpoint=ck)).run()
    assert r1.stopped == "step budget" or r1.steps == 1
    d = load_checkpoint(ck)
    assert d["format"] == "dpro-optimize-checkpoint" and d["steps"] == 1
    r2 = Searcher(base, SearchOptions(max_steps=5)).run(resume=d)
    assert r2.after_us == pytest.approx(1197.0)
    assert r2.steps >= 1


def test_memory_budget_forces_a_memory_pass():
    base = extract_base(tiny_dfg())
    # params = grads = 2 MB, optimizer state 2 MB (1 slot), activations 10 MB -> 16 MB peak
    mm = MemoryModel(activation_bytes=10_000_000)
    assert mm.estimate(base, initial_strategy(base))["peak_bytes"] == 16_000_000
    r = Searcher(base, SearchOptions(memory_budget=12_000_000, memory_model=mm)).run()
    assert r.changes[0]["applied_as"] == "memory"
    assert r.memory["peak_bytes"] <= 12_000_000
    # recomputation (L=2 tensors: keeps min(1, 2*sqrt(2)/2) = all activations -> 16 MB, over budget),
    # accumulation 2 -> 6 + 5 = 11 MB fits: chosen
    assert r.strategy.mem() == {"accum_steps": 2}
    with pytest.raises(Exception, match="budget"):
        Searcher(base, SearchOptions(memory_budget=1_000_000, memory_model=mm)).run()


def test_parse_size():
    assert parse_size("16GB") == 16_000_000_000
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1e6") == 1_000_000
