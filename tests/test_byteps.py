"""BytePS communication timelines (dpro_kit.readers.byteps) on a HAND-WRITTEN fixture.

BytePS needs a GPU, so no real BytePS job runs here: ``tests/fixtures/byteps-2w1s`` is written
in BytePS 0.2.5's documented ``comm.json`` format by ``make_fixture.py`` (README there).  These
tests check the reader, the PS DFG it builds, the ``--partition-bytes`` / ``--servers`` what-ifs
and the ``BYTEPS_PARTITION_BYTES`` plan against that format - not against real BytePS.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "byteps-2w1s"


@pytest.fixture()
def trace(tmp_path):
    dst = tmp_path / "T"
    shutil.copytree(FIX, dst, ignore=shutil.ignore_patterns("*.py", "*.md"))
    return dst


def _step_period_ms(path: Path) -> float:
    """The traced steps' period, from the comm.json itself: first enqueue of step k+1 - of step k."""
    evs = json.loads(path.read_text())["traceEvents"]
    per: dict[str, list[float]] = {}
    for e in evs:
        if e["tid"] == "total":
            per.setdefault(e["name"], []).append(e["ts"])
    firsts = [min(ts[k] for ts in per.values()) for k in range(len(next(iter(per.values()))))]
    return (firsts[-1] - firsts[0]) / (len(firsts) - 1) / 1e3


def test_reader_builds_the_ps_dfg(trace):
    from dpro_kit.readers.byteps import djb2
    from dpro_kit.session import Session
    s = Session(trace)
    ts = s.raw
    m = ts.manifest
    assert m.raw_format == "byteps-comm" and m.comm_backend == "byteps"
    assert m.workers() == ["worker0/0", "worker1/0"] and m.servers() == ["server0/server0"]
    assert m.iterations == [10, 11, 12]
    meta = json.loads((trace / "byteps_meta.json").read_text())
    colls = {c.tensor: c for c in ts.collectives}
    assert set(colls) == set(meta["tensors"])
    for name, c in colls.items():
        assert c.algorithm == "ps" and c.bytes == meta["tensors"][name]
        assert sum(p["bytes"] for p in c.partitions) == c.bytes
        assert all(p["bytes"] <= meta["partition_bytes"] for p in c.partitions)
        assert sorted(c.participants) == m.workers()
    # the 6 MB gradient is two partitions: keys (declared key << 16) + i, as in the trace's tids
    assert [p["key"] for p in colls["byteps.gradient_0"].partitions] == [0, 1]
    assert djb2(0) == 5381 * 33 + ord("0")
    # computation is not in comm.json: estimated from the enqueue gaps, one chain per worker
    ev = ts.events
    assert set(ev[ev["stream"] == "compute"]["name"]) == {"BYTEPS_COMPUTE_GAP", "BYTEPS_GRADIENT_READY"}
    g = s.graph
    assert any(d.get("kind") == "AGG" for _, d in g.nodes(data=True))      # aggregation on the server
    # the replay reproduces the traced step period of the (hand-written, self-consistent) timeline
    traced = _step_period_ms(trace / "worker0" / "0" / "comm.json")
    pred = s.iteration_time_ms()
    assert abs(pred / traced - 1) < 0.05, (pred, traced)


def test_partition_whatifs(trace):
    from dpro_kit.readers.byteps import partitions
    from dpro_kit.session import Session
    from dpro_kit.whatif import WhatIf, byteps_partition_bytes
    ts = Session(trace).profiled
    small = byteps_partition_bytes(ts, 1_000_000)
    c = next(c for c in small.collectives if c.tensor == "byteps.gradient_0")
    # rounded up to a page: 1000000 -> 1003520 bytes; 6 MB -> 6 partitions
    assert [p["bytes"] for p in c.partitions] == [1003520] * 5 + [6_000_000 - 5 * 1003520]
    assert small.manifest.extra["byteps"]["partition_bytes"] == 1_000_000
    # two servers: BytePS's djb2 key hash spreads the partitions over both
    two = Session(trace, whatif=WhatIf(servers=2, partition_bytes=1_000_000)).trace
    servers = {p["server"] for c in two.collectives for p in c.partitions}
    assert len(servers) == 2 and len(two.manifest.servers()) == 2
    parts = partitions(0, 6_000_000, 1_000_000, sorted(servers))
    assert [p["server"] for p in parts] == [p["server"] for c in two.collectives if c.tensor == "byteps.gradient_0"
                                            for p in c.partitions]
    base = Session(trace).iteration_time_ms()
    finer = Session(trace, whatif=WhatIf(partition_bytes=262_144)).iteration_time_ms()
    assert finer < base          # pipelining push, aggregation and pull of the 6 MB gradient


def test_optimize_plan_sets_partition_bytes(trace, tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "optimize", str(trace), "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    bp = plan["frameworks"]["byteps"]
    grid = bp["search"]["grid"]
    assert bp["BYTEPS_PARTITION_BYTES"] in [g["BYTEPS_PARTITION_BYTES"] for g in grid]
    assert bp["export"] == [f"export BYTEPS_PARTITION_BYTES={bp['BYTEPS_PARTITION_BYTES']}"]
    from dpro_kit.optimize.knobs import TIE_TOLERANCE
    # the fastest, or one within the tie tolerance that is closer to the traced size
    assert plan["predicted"]["after_ms"] <= min(g["predicted_ms"] for g in grid) * (1 + TIE_TOLERANCE) \
        or bp["keep_traced"]
    assert plan["predicted"]["after_ms"] <= plan["predicted"]["before_ms"]
    assert "BytePS: " in r.stdout


def test_bad_input_one_line(trace):
    meta = json.loads((trace / "byteps_meta.json").read_text())
    comm = trace / "worker1" / "0" / "comm.json"
    before = comm.read_text()

    def replay_err() -> str:
        r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(trace)], capture_output=True,
                           text=True, cwd=ROOT)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    del meta["tensors"]["byteps.gradient_1"]
    (trace / "byteps_meta.json").write_text(json.dumps(meta))
    assert "byteps.gradient_1" in replay_err() and "no size" in replay_err()
    meta["tensors"]["byteps.gradient_1"] = 3_000_000      # wrong size: the trace has 1 partition, not 1
    meta["tensors"]["byteps.gradient_0"] = 9_000_000      # 9 MB would be 3 partitions, the trace has 2
    (trace / "byteps_meta.json").write_text(json.dumps(meta))
    assert "partition keys" in replay_err()
    shutil.copy(FIX / "byteps_meta.json", trace / "byteps_meta.json")
    comm.write_text(before[: len(before) // 2])
    err = replay_err()
    assert "not JSON" in err and str(comm) in err
    comm.write_text(before)
    assert comm.read_text() == before and (FIX / "worker1" / "0" / "comm.json").read_text() == before
