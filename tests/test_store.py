"""The columnar trace store (dpro_kit/store.py): a stored load returns exactly the parsed TraceSet
(Parquet round trip of every node's events, memory samples, edges, collectives, manifest), on
real traces of several formats; a changed raw file invalidates the entry; the trace folder is
never written; only some columns can be read."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import shared_traces

from dpro_kit.store import TraceStore, read_events, store_root
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
HTA = shared_traces() / "hta"
sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DPRO_STORE", raising=False)
    return tmp_path / "cache"


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.events, b.events, check_exact=True)
    pd.testing.assert_frame_equal(a.memory, b.memory, check_exact=True)
    assert a.edges == b.edges
    assert a.collectives == b.collectives
    assert a.manifest == b.manifest
    assert a.path == b.path


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def _traces():
    out = [p for p in sorted((REPO / "examples" / "traces").iterdir()) if p.is_dir()]
    return out


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_round_trip_examples(trace):
    parsed = load_trace(trace, store=False)
    before = _snapshot(trace)
    first = load_trace(trace, store=True)            # parses and stores
    st = TraceStore(trace)
    assert st.index() is not None, "entry not written"
    second = load_trace(trace, store=True)           # from the store
    assert_same(parsed, first)
    assert_same(parsed, second)
    assert _snapshot(trace) == before                # nothing written into the trace folder


@pytest.mark.skipif(not HTA.is_dir(), reason="shared/traces/hta not present")
def test_round_trip_real_kineto(tmp_path):
    d = tmp_path / "r128"
    d.mkdir()
    for f in ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"):
        shutil.copy(HTA / f, d / f)
    parsed = load_trace(d, store=False)
    load_trace(d, store=True)
    assert_same(parsed, load_trace(d, store=True))


def test_changed_file_invalidates(tmp_path, cache):
    import scale
    d = tmp_path / "job"
    scale.write_job(d, 3, layers=4, buckets=2, steps=2)
    a = load_trace(d, store=True)
    key_a = TraceStore(d).key
    # rank 1 re-exported with other durations (another seed): new key, new parse, new times
    doc = scale.rank_doc(1, 3, layers=4, buckets=2, steps=2, seed=7)
    import json
    (d / "rank1.json").write_text(json.dumps(doc))
    st = TraceStore(d)
    assert st.key != key_a and st.index() is None
    b = load_trace(d, store=True)
    assert_same(load_trace(d, store=False), b)
    assert not a.events["dur"].equals(b.events["dur"])
    assert len([p for p in (cache / "store").iterdir() if not p.name.startswith(".")]) == 2


def test_read_only_columns(tmp_path):
    import scale
    d = tmp_path / "job"
    scale.write_job(d, 2, layers=3, buckets=1, steps=1)
    full = load_trace(d, store=False).events
    ev = read_events(d, ["op", "dur"])
    assert list(ev.columns) == ["op", "dur", "node"]
    assert ev["dur"].tolist() == full["dur"].tolist() and ev["op"].tolist() == full["op"].tolist()


def test_unwritable_cache_goes_on(tmp_path, monkeypatch, capsys):
    import scale
    d = tmp_path / "job"
    scale.write_job(d, 2, layers=3, buckets=1, steps=1)
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    monkeypatch.setenv("DPRO_CACHE", str(ro / "cache"))
    import dpro_kit.store as S
    monkeypatch.setattr(S, "_warned", False)
    if os.geteuid() == 0:       # root writes anywhere: make the cache root a file instead
        os.chmod(ro, 0o700)
        (ro / "cache").write_text("not a folder")
    ts = load_trace(d, store=True)
    assert len(ts.events) and "trace store not written" in capsys.readouterr().err
    assert store_root().parent.is_file() or not store_root().exists()


def test_cli_replay_same_with_store(tmp_path, cache):
    """``DPRO_STORE=1 dpro replay`` (first load writes, second reads) prints what a parse does."""
    import subprocess
    import scale
    d = tmp_path / "job"
    scale.write_job(d, 4, layers=4, buckets=2, steps=2)
    env = dict(os.environ, DPRO_CACHE=str(cache))
    env.pop("DPRO_STORE", None)
    cmd = [sys.executable, "-m", "dpro_kit", "replay", str(d), "--mean-durations"]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    env["DPRO_STORE"] = "1"
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    assert TraceStore(d).index() is not None
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    assert plain == first == second and "predicted iteration time" in plain
