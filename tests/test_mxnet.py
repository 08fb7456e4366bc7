"""MXNet parameter-server jobs: collectors/mxnet + dpro_kit/readers/mxnet.py (docs/ps.md).

The reader tests use a trace recorded from a real run (examples/traces/mxnet-ps-2w1s-loopback,
README there). The job test runs a real 2-worker / 1-server ``dist_sync`` job under
``dpro profile --framework mxnet``, one role per emulated host (network namespaces, tbf links),
and needs root and MXNet 1.9.1's Python (``DPRO_MXNET_PYTHON`` or ``make mxnet``'s
``~/.cache/dpro-kit/mxnet-venv``); skipped, saying why, otherwise.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.readers.mxnet import partitions
from dpro_kit.session import Session

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "examples/traces/mxnet-ps-2w1s-loopback"
sys.path.insert(0, str(REPO / "collectors/mxnet"))


def mxnet_python() -> str | None:
    cands = [os.environ.get("DPRO_MXNET_PYTHON", ""), str(Path.home() / ".cache/dpro-kit/mxnet-venv/bin/python")]
    return next((c for c in cands if c and Path(c).exists()), None)


def test_collector_constants_match_schema():
    import dpro_mxnet
    from dpro_kit import schema
    assert dpro_mxnet.META_FORMAT == schema.MXNET_META_FORMAT
    assert dpro_mxnet.RAW_FORMAT == schema.MXNET_RAW_FORMAT
    assert dpro_mxnet.META_VERSION in schema.MXNET_META_VERSIONS


def test_partitions_follow_encode_default_key():
    assert partitions(3, 100, 4, ["s0", "s1"], 1000) == [{"bytes": 400, "server": "s1"}]   # 3*9973 odd
    parts = partitions(1, 1_000_001, 4, ["s0", "s1"], 1_000_000)
    assert [p["server"] for p in parts] == ["s0", "s1"] and sum(p["bytes"] for p in parts) == 4_000_004


def test_fixture_reads_into_a_ps_graph_and_replays():
    s = Session(str(FIXTURE))
    ts = s.trace
    assert ts.manifest.framework == "mxnet" and ts.manifest.servers() == ["host0/server0"]
    colls = {c.tensor: c for c in ts.collectives}
    assert len(colls) == 12 and all(c.op == "push_pull" and c.algorithm == "ps" for c in colls.values())
    assert colls["dense0_weight"].bytes == 784 * 512 * 4
    assert sorted(colls["dense0_weight"].participants) == ["host1/worker1", "host2/worker0"]
    comm = ts.events[ts.events["kind"] == "COMM"]
    assert len(comm) == 12 * 3 * 2 and (comm["phase"] == "push_pull").all()
    g = s.graph
    kinds = {d["kind"] for _, d in g.nodes(data=True)}
    assert {"FW", "BW", "SEND", "RECV", "AGG"} <= kinds
    aggs = [d for _, d in g.nodes(data=True) if d["kind"] == "AGG"]
    assert {d["node"] for d in aggs} == {"host0/server0"} and len(aggs) == 12
    pred = s.iteration_time_ms()
    measured = ts.manifest.extra["measured_iteration_ms"]
    assert 0 < pred < 10 * measured


def test_fixture_refuses_a_broken_dump(tmp_path):
    bad = tmp_path / "t"
    shutil.copytree(FIXTURE, bad)
    (bad / "host2/worker0/profile.json").write_text('{"traceEvents": 3}')
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "profile.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(mxnet_python() is None, reason="no MXNet 1.9.1 Python (make mxnet, or set DPRO_MXNET_PYTHON)")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="emulated hosts need root and iproute2")
def test_real_dist_sync_job_profiled_on_emulated_hosts(tmp_path):
    from dpro_kit.jobs import run_job
    log = tmp_path / "log.txt"
    r = run_job([mxnet_python(), str(REPO / "examples/mxnet/train.py"), "--servers", "1", "--workers", "2",
                 "--steps", "20", "--batch", "32", "--json-out", str(tmp_path / "w{w}.json")],
                hosts=3, ranks_per_host=None, rate_mbit=500, profile=tmp_path / "trace", steps="8:11",
                profile_flags=["--framework", "mxnet"], timeout=240, prefix="mxnettest", log=open(log, "w"))
    assert r.ok, log.read_text()[-2000:]
    man = json.loads((tmp_path / "trace/manifest.json").read_text())
    assert man["framework"] == "mxnet" and man["world_size"] == 2
    assert sorted(n["role"] for n in man["nodes"].values()) == ["server", "worker", "worker"]
    s = Session(str(tmp_path / "trace"))
    pred = s.iteration_time_ms()
    measured = man["extra"]["measured_iteration_ms"]
    print(f"predicted {pred:.3f} ms, measured {measured:.3f} ms")
    assert measured > 0 and 0.2 * measured < pred < 5 * measured   # sanity only: accuracy lives in the bench


def test_links_queue_on_the_server_interface_and_servers_whatif():
    s = Session(str(FIXTURE))
    devs = {d["device"] for _, d in s.graph.nodes(data=True) if d["kind"] == "SEND"}
    assert devs == {"link:host0:download", "link:host0:upload"}     # the server's interface, both ways
    from dpro_kit.whatif import WhatIf
    two = Session(str(FIXTURE), whatif=WhatIf(servers=2))
    assert len(two.trace.manifest.servers()) == 2
    by = {c.tensor: c for c in two.trace.collectives}
    # below the big-array bound one partition on server (key * 9973) % 2: key 1 (dense0_weight) -> server 1
    assert [p["server"] for p in by["dense0_weight"].partitions] == ["whatif-server-host1/server1"]
    assert [p["server"] for p in by["dense0_bias"].partitions] == ["host0/server0"]
    assert two.iteration_time_ms() > 0


def test_async_scheme_updates_per_worker():
    # the fixture's collectives as the reader makes them for a dist_async job
    from dpro_kit.graph.build import build
    from dpro_kit.graph.schemes import SCHEMES
    from dpro_kit.job import Job, identity
    from dpro_kit.replay import replay
    s = Session(str(FIXTURE))
    ts = s.trace
    colls = [dataclasses.replace(c, op="push_pull_async", algorithm="ps_async") for c in ts.collectives]
    job = Job.from_trace(dataclasses.replace(ts, collectives=colls), comm_model=s.comm_model)
    g = build(job, identity(job), check=False)
    aggs = [d for _, d in g.nodes(data=True) if d["kind"] == "AGG"]
    assert len(aggs) == 12 * 2 and {d["phase"] for d in aggs} == {"update"}     # one update per worker and key
    assert "ps_async" in SCHEMES
    assert replay(g).iteration_time_us > 0


def test_asynchronous_workers_are_replayed_to_their_steady_state():
    """Hand-computed: 2 asynchronous workers, each: compute 10 -> push 5 on the server's download
    link -> update (0) -> pull 5 on its upload link -> the next iteration's compute.

    One iteration (both start at 0): w1's push waits for w0's, w1 ends at 10 + 5 + 5 + 5 = 25.
    Steady state: w1 runs 5 behind w0, their transfers interleave and neither waits: each worker's
    iteration is 10 + 5 + 5 = 20."""
    import networkx as nx

    from dpro_kit.graph import add_op
    from dpro_kit.graph.schemes import asynchronous_workers
    from dpro_kit.replay import replay
    from dpro_kit.session import ASYNC_ITERATIONS, _replay
    g = nx.DiGraph()
    it_edges = []
    for w in ("w0", "w1"):
        c = add_op(g, f"{w}|C", node=w, device=f"{w}:compute", kind="BW", dur=10.0)
        p = add_op(g, f"{w}|push", node=w, device="link:s:download", kind="SEND", phase="push", dur=5.0)
        a = add_op(g, f"s|AGG {w}", node="s", device="s:compute", kind="AGG", phase="update", dur=0.0)
        q = add_op(g, f"{w}|pull", node="s", device="link:s:upload", kind="SEND", phase="pull", dur=5.0)
        g.add_edges_from([(c, p), (p, a), (a, q)])
        it_edges.append((q, c))
    g.graph["iteration_edges"] = it_edges
    assert asynchronous_workers(g) == ["w0", "w1"]
    assert replay(g).iteration_time_us == pytest.approx(25.0)           # the start-up transient
    res = _replay(g, 1)
    assert res.iterations == ASYNC_ITERATIONS
    assert res.worker_steady_us() == pytest.approx({"w0": 20.0, "w1": 20.0})
    assert res.iteration_time_us == pytest.approx(20.0)
    # a synchronous graph (aggregate, not update) keeps the one-iteration makespan
    for k in list(g):
        if g.nodes[k]["kind"] == "AGG":
            g.nodes[k]["phase"] = "aggregate"
    assert asynchronous_workers(g) == [] and _replay(g, 1).iterations == 1


CNN_ASYNC = REPO / "examples/traces/mxnet-ps-cnn-async-2w1s-200mbit"


def test_cnn_pushes_wait_for_the_backward_segment_of_their_gradient():
    """A real dist_async CNN trace: DeleteVariable inside a bulk segment is read (not refused as two
    ops of one thread overlapping), and each key's push follows the backward bulk its spans followed:
    keys 2-9 the first backward segment, conv0 (keys 0-1) the second."""
    s = Session(str(CNN_ASYNC))
    ts = s.trace
    gates = {c.tensor: c.inputs for c in ts.collectives}
    assert all(c.algorithm == "ps_async" for c in ts.collectives) and len(gates) == 10
    for t, by_node in gates.items():
        want = "ImperativeBulk#2" if t.startswith("conv0_") else "ImperativeBulk#1"
        assert by_node == {n: [want] for n in ("host1/worker1", "host2/worker0")}, t
    kinds = ts.events.set_index(["node", "iteration", "op"])["kind"]
    assert kinds[("host2/worker0", 8, "ImperativeBulk#1")] == "BW" == kinds[("host2/worker0", 8, "ImperativeBulk#2")]
    # in the DFG the first push of conv2_weight waits for the first backward segment only
    g = s.graph
    sends = [k for k, d in g.nodes(data=True) if d["kind"] == "SEND" and d.get("phase") == "push"
             and d.get("tensor") == "conv2_weight" and d["node"] == "host2/worker0"]
    assert sends and all(any("ImperativeBulk#1" in str(a) for a in nx_ancestors(g, k)) and
                         not any("ImperativeBulk#2" in str(a) for a in nx_ancestors(g, k)) for k in sends)


def nx_ancestors(g, k):
    import networkx as nx
    return nx.ancestors(g, k)


def test_ps_link_calibration_is_not_dragged_down_by_a_worker_stopped_by_its_cpu_quota():
    """The CNN trace's worker groups are 9-42 ms for 170 kB per worker on 200 Mbit/s links (~7 ms):
    the quota stops a worker while its transfers are in flight.  The slowest worker's median group
    calibrated the link to 47 Mbit/s before (the replay then 150 ms against 104.8 measured); the
    median over workers of replayed / traced groups, both from when the worker could push, keeps it
    near the link's rate."""
    from dpro_kit.costmodel import _ps_group_spans_traced
    s = Session(str(CNN_ASYNC))
    groups = _ps_group_spans_traced(s.profiled)
    assert set(groups) == {"host1/worker1", "host2/worker0"}
    mbit = s.comm_model.default.bandwidth_Bps * 8 / 1e6
    assert 150 < mbit < 400, mbit
    pred = s.iteration_time_ms()
    print(f"calibrated {mbit:.1f} Mbit/s, predicted {pred:.1f} ms (measured 104.8 ms unprofiled)")
    assert 0.5 * 104.8 < pred < 2 * 104.8    # sanity only: accuracy lives in bench/ps_accuracy.py


def test_ps_link_calibration_counts_the_queueing_of_asynchronous_workers():
    """A real dist_async MLP trace, 3 workers on 200 Mbit/s links, link-bound: each worker's replayed
    push-pull group is timed from when it could push (as MXNet's spans are), so the FIFO link's queue
    behind the other workers is in both; timed from the transfers' start the link calibrated to
    77 Mbit/s and the replay to 1120 ms against the window's own 624.9 ms."""
    s = Session(str(REPO / "examples/traces/mxnet-ps-mlp-async-3w1s-200mbit"))
    mbit = s.comm_model.default.bandwidth_Bps * 8 / 1e6
    own = s.profiled.manifest.extra["profiled_iteration_ms"]
    pred = s.iteration_time_ms()
    print(f"calibrated {mbit:.1f} Mbit/s, predicted {pred:.1f} ms, the profiled window {own:.1f} ms")
    assert 110 < mbit < 260, mbit
    assert abs(pred / own - 1) < 0.15, (pred, own)


def test_host_gaps_are_charged_to_the_next_op_unless_it_waited_for_a_pull():
    """Hand-computed (us): ops a [0, 10000], b [12000, 20000] (2 ms between: charged to b), c [30000, 31000]
    (a pull ended at 25000: c waited for it, not charged), d [35000, 40000] (charged)."""
    from dpro_kit.readers.mxnet import _fold_host_gaps
    ops = [{"start": s, "dur": e - s} for s, e in [(0, 10000), (12000, 20000), (30000, 31000), (35000, 40000)]]
    _fold_host_gaps(ops, [25000.0])
    assert [(o["start"], o["start"] + o["dur"]) for o in ops] == [(0, 10000), (10000, 20000), (30000, 31000),
                                                                  (31000, 40000)]


def test_real_cnn_trace_keeps_the_time_between_its_ops():
    """The real dist_async CNN trace: per worker and step the compute ops (gaps charged) cover the
    traced time from the step's first op to its last op except where a pull was awaited, so each
    step's ops sum to at least what the ops alone recorded, and no op moved its end."""
    from dpro_kit.readers import mxnet as R
    s = Session(str(CNN_ASYNC))
    ev = s.trace.events
    comp = ev[ev["kind"].isin(["FW", "BW", "OTHER"])]
    raw = json.loads((CNN_ASYNC / "host2/worker0/profile.json").read_text())
    compute, _comm, _w = R._spans(raw, CNN_ASYNC / "host2/worker0/profile.json")
    ends_raw = sorted(round(r["start"] + r["dur"], 3) for r in compute)
    w0 = comp[comp["node"] == "host2/worker0"]
    assert sorted(round(x, 3) for x in (w0["start"] + w0["dur"])) == ends_raw
    assert w0["dur"].sum() > sum(r["dur"] for r in compute)
