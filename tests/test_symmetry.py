"""Replay by symmetry (dpro_kit/symmetry.py): on generated torch.profiler jobs whose ranks come in
identical classes (bench/scale.py --classes), the representatives' replay expanded to every op
equals the full replay exactly (start and end of every op, iteration time); jobs without identical
ranks, or whose graph shares devices between nodes, are replayed in full with the reason."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402
import synthetic  # noqa: E402
from dpro_kit.costmodel import fit_from_trace  # noqa: E402
from dpro_kit.graph.build import build_global_dfg  # noqa: E402
from dpro_kit.replay import compile_graph, replay  # noqa: E402
from dpro_kit.symmetry import _not_exact_reason, rank_classes, replay_by_symmetry  # noqa: E402
from dpro_kit.trace import load_trace  # noqa: E402


def _job(tmp_path_factory, name, ranks, classes):
    d = tmp_path_factory.mktemp(name) / "job"
    scale.write_job(d, ranks, layers=5, buckets=2, steps=2, classes=classes)
    return load_trace(d)


@pytest.fixture(scope="module")
def ts3(tmp_path_factory):
    return _job(tmp_path_factory, "sym3", 12, 3)


def test_classes_found(ts3):
    rc = rank_classes(ts3)
    assert rc.k == 3
    assert sorted(sorted(int(n.split("/")[1]) for n in c) for c in rc.classes) == \
        [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


@pytest.mark.parametrize("iterations", [1, 2])
def test_expansion_equals_full_replay(ts3, iterations):
    full_g = build_global_dfg(ts3, comm_model=fit_from_trace(ts3))
    full = replay(compile_graph(full_g), iterations=iterations)
    sym = replay_by_symmetry(ts3, iterations=iterations)
    assert sym.used, sym.report()
    assert sym.ops_replayed < full_g.number_of_nodes() / 3     # 3 of 12 ranks (+ the shared barriers)
    keys = list(full.graph.keys)
    for it in range(iterations):
        s, e = sym.times(keys, it)
        rows = slice(it * full.n, (it + 1) * full.n)
        assert np.array_equal(s, full.start[rows]) and np.array_equal(e, full.end[rows])
    assert sym.iteration_time_us == full.iteration_time_us
    assert "12 nodes in 3 classes" in sym.report()


def test_jittered_ranks_fall_back(tmp_path_factory):
    ts = _job(tmp_path_factory, "symnone", 4, None)
    sym = replay_by_symmetry(ts)
    assert not sym.used and "no two of the 4 nodes are identical" in sym.report()
    full = replay(compile_graph(build_global_dfg(ts)))
    assert sym.iteration_time_us == full.iteration_time_us


def test_one_changed_duration_splits_a_class(ts3):
    ev = ts3.events.copy()
    i = ev.index[(ev["node"] == "host1/9") & (ev["kind"] == "OTHER")][0]
    ev.loc[i, "dur"] = ev.loc[i, "dur"] + 1e-9           # exact equality: a nanosecond's millionth counts
    from dataclasses import replace
    rc = rank_classes(replace(ts3, events=ev))
    assert rc.k == 4 and ["host1/9"] in rc.classes


def test_shared_device_is_not_exact():
    # parameter servers: the 2 workers of a host push over one link device
    g = synthetic.synthetic_dfg(4, 3, 1, seed=0, ranks_per_host=2, comm="ps")
    why = _not_exact_reason(g)
    assert why is not None and "link" in why
