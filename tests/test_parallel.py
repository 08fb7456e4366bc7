"""Parallel ingest on Dask (dpro_kit/parallel.py, load_trace(scheduler=...)): the TraceSet read by
local Dask processes or a dask.distributed cluster is the serial one (events exact,
edges, collectives, manifest), on the example traces and a generated 24-rank Kineto job; a
broken file gives the same one-line error as the serial path; progress reaches the total."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from dpro_kit.errors import DproError
from dpro_kit.parallel import resolve_scheduler
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from test_store import assert_same  # noqa: E402


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    import scale
    d = tmp_path_factory.mktemp("par") / "job"
    scale.write_job(d, 24, layers=6, buckets=2, steps=2)
    return d


def _traces():
    return [p for p in sorted((REPO / "examples" / "traces").iterdir()) if p.is_dir()]


@pytest.mark.parametrize("scheduler", ["processes:2", "processes:3"])
def test_local_dask_equals_serial(job, scheduler):
    for d in [job, *_traces()]:
        seen = []
        par = load_trace(d, scheduler=scheduler, progress=lambda i, n: seen.append((i, n)))
        assert_same(load_trace(d, scheduler="serial"), par)
        n = len(par.nodes())
        assert seen[-1] == (n, n) if n > 1 else True


def test_env_setting(job, monkeypatch):
    monkeypatch.setenv("DPRO_SCHEDULER", "processes:2")
    assert resolve_scheduler() == ("processes", 2)
    assert_same(load_trace(job, scheduler="serial"), load_trace(job))
    for bad in ("gpu-cluster", "threads", "processes:0"):
        monkeypatch.setenv("DPRO_SCHEDULER", bad)
        with pytest.raises(DproError, match=f"unknown scheduler '{bad}'"):
            load_trace(job)


def test_error_in_a_worker_is_the_serial_error(job, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(job, d)
    p = d / "rank5.json"
    text = p.read_text()
    p.write_text(text.replace('"dur":', '"dur":-', 1))        # a negative duration in rank 5's first event
    with pytest.raises(DproError) as serial:
        load_trace(d, scheduler="serial")
    with pytest.raises(DproError) as par:
        load_trace(d, scheduler="processes:2")
    assert str(par.value) == str(serial.value) and "rank5.json" in str(par.value)


def test_distributed_cluster_equals_serial(job):
    distributed = pytest.importorskip("distributed")
    # 2 threads per worker: the readers are not thread-safe, map_nodes runs one chunk at a time per process
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster:
        par = load_trace(job, scheduler=cluster.scheduler_address)
    assert_same(load_trace(job, scheduler="serial"), par)


def test_dask_workers_on_emulated_hosts(job):
    """bench/scale.py --dask-hosts: a dask scheduler and two workers, each in its own network namespace,
    read the job over TCP between the namespaces; the TraceSet and its replay equal the serial ones;
    processes and namespaces are gone afterwards."""
    pytest.importorskip("distributed")
    from conftest import netns_unusable_reason
    reason = netns_unusable_reason("dpkq")
    if reason:
        pytest.skip(reason)
    import scale
    from dpro_kit.cluster import list_namespaces
    row = scale.dask_hosts_point(job, 2, "dpkq", 1)
    assert row["same"]
    assert sorted(row["workers"].values()) == ["10.213.0.2", "10.213.0.3"]    # hosts 1 and 2, not host 0
    assert not set(row["namespaces"]) & set(list_namespaces())
