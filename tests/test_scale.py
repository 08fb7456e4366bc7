"""bench/scale.py's generated torch.profiler jobs are read by the real Kineto reader as documented
(docs/scale.md): ranks, hosts, steps, one nccl barrier per bucket, and the measured iteration
time close to the replayed one.  No timing assertions."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402
from dpro_kit.graph.build import build_global_dfg  # noqa: E402
from dpro_kit.replay import compile_graph, replay  # noqa: E402
from dpro_kit.trace import load_trace  # noqa: E402


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale") / "job"
    info = scale.write_job(d, 10, layers=6, buckets=2, steps=2)
    return d, info


def test_generated_job_reads_and_replays(job):
    d, info = job
    assert info["ranks"] == 10 and sorted(p.name for p in d.iterdir()) == sorted(f"rank{r}.json" for r in range(10))
    ts = load_trace(d)
    m = ts.manifest
    assert m.world_size == 10 and m.iterations == [100, 101]
    assert sorted(m.nodes) == sorted(f"host{r // 8}/{r}" for r in range(10))
    assert set(ts.events["stream"]) == {"cpu0", "cpu1", "gpu:7", "gpu:13", "gpu:20"}
    # one collective per bucket, all ranks in it
    assert len(ts.collectives) == 2 and all(len(c.participants) == 10 for c in ts.collectives)
    g = build_global_dfg(ts)
    syncs = [k for k, a in g.nodes(data=True) if str(a["name"]).startswith("SYNC ")]
    assert len(syncs) == 2
    res = replay(compile_graph(g))
    measured = m.extra["measured_iteration_ms"]
    assert res.iteration_time_us / 1e3 == pytest.approx(measured, rel=0.1)


def test_classes_make_identical_durations(tmp_path):
    a = scale.rank_doc(1, 8, layers=4, buckets=2, steps=1, classes=3)
    b = scale.rank_doc(4, 8, layers=4, buckets=2, steps=1, classes=3)
    c = scale.rank_doc(2, 8, layers=4, buckets=2, steps=1, classes=3)
    durs = lambda doc: [e["dur"] for e in doc["traceEvents"] if e["ph"] == "X"]   # noqa: E731
    assert durs(a) == durs(b) and durs(a) != durs(c)
