"""ps-lite message timestamps (patches/ps-lite) and their reader (dpro_kit/readers/pslite.py).

The fixture is a real run (examples/traces/pslite-2w1s-200mbit/README.md); the slow test builds
ps-lite with the patch (patches/ps-lite/build.sh, cached), runs its own benchmark on emulated
hosts and replays the result.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.errors import DproError, TraceFormatError
from dpro_kit.readers import pslite
from dpro_kit.session import Session
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "examples/traces/pslite-2w1s-200mbit"
sys.path.insert(0, str(REPO / "tools"))


def _dpro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpro_kit.cli", *args], capture_output=True, text=True)


def check_pairs(trace_dir: Path, length: int, workers: int, keys: int) -> dict:
    """Every kept push and pull pairs a SEND with one RECV of the same txn and size; sizes are the program's."""
    ts = load_trace(trace_dir)
    ev = ts.events
    send = ev[ev["kind"] == "SEND"].set_index(["txn", "iteration"])
    recv = ev[ev["kind"] == "RECV"].set_index(["txn", "iteration"])
    assert not send.index.duplicated().any() and not recv.index.duplicated().any()
    assert set(send.index) == set(recv.index)
    n_it = len(ts.manifest.iterations)
    assert len(send) == 2 * workers * keys * n_it          # one push and one pull per worker, key, iteration
    assert (send["bytes"] == recv.loc[send.index, "bytes"]).all()
    job = pslite.transfers(trace_dir)
    assert {x["val_bytes"] for x in job["xfers"]} == {length}   # the values the benchmark pushed / pulled
    assert set(ev.loc[ev["kind"].isin(["SEND", "RECV"]), "bytes"]) == {length + 8 + 4}   # + one key, one len
    return {"iterations": n_it, "transfers": len(send)}


def test_fixture_reads_pairs_and_replays():
    man = load_trace(FIXTURE).manifest
    assert man.raw_format == pslite.FORMAT and man.world_size == 2
    assert sorted(man.nodes) == ["host0/server0", "host1/worker1", "host2/worker0"]
    assert man.extra["link_model"] == "interface"
    got = check_pairs(FIXTURE, 256000, workers=2, keys=4)
    assert got["iterations"] == 10                         # the push-only round 0 is left out
    r = _dpro("replay", "--json", str(FIXTURE))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["iteration_time_ms"] > 0
    s = Session(str(FIXTURE))
    kinds = {d["kind"] for _, d in s.graph.nodes(data=True)}
    assert {"SEND", "RECV", "AGG", "OTHER"} <= kinds
    sources = {d.get("source") for _, d in s.graph.nodes(data=True) if d["kind"] in ("SEND", "AGG")}
    assert sources == {"trace:txn", "trace"}               # every transfer and update timed from the trace
    assert _dpro("align", str(FIXTURE)).returncode == 0


def test_bandwidth_whatif_replaces_measured_transfers():
    # measured per-transfer times used to win over --bandwidth-mbps: the what-if replayed the trace unchanged
    from dpro_kit.whatif import WhatIf
    base = Session(str(FIXTURE)).replay().iteration_time_us
    slow = Session(str(FIXTURE), whatif=WhatIf(bandwidth_mbps=20)).replay().iteration_time_us
    fast = Session(str(FIXTURE), whatif=WhatIf(bandwidth_mbps=2000)).replay().iteration_time_us
    assert fast < slow and slow > base
    g = Session(str(FIXTURE), whatif=WhatIf(bandwidth_mbps=20)).graph
    assert {d.get("source") for _, d in g.nodes(data=True) if d["kind"] == "SEND"} == {"model"}


def test_scheme_is_async_for_the_benchmark_server():
    # the benchmark's server answers each pull at once: some pull left before the other worker's push arrived
    assert pslite.transfers(FIXTURE)["sync"] is False
    cols = load_trace(FIXTURE).collectives
    assert {c.algorithm for c in cols} == {"ps_async"} and len(cols) == 4


def test_one_worker_is_synchronous(tmp_path):
    # the fixture's real records with worker 11 left out (its file removed, the job declared 1-worker):
    # every pull then leaves after all (one) pushes of its key, so the scheme is ps with one AGG per key
    t = _copy(tmp_path)
    next(t.glob("pslite-worker-11.*.json")).unlink()
    for f in t.glob("pslite-*.json"):
        doc = json.loads(f.read_text())
        f.write_text(json.dumps({**doc, "num_workers": 1}))
    job = pslite.transfers(t)
    assert job["sync"] is True and {x["worker"] for x in job["xfers"]} == {"host2/worker0"}
    s = Session(str(t))
    aggs = [d for _, d in s.graph.nodes(data=True) if d["kind"] == "AGG"]
    assert len(aggs) == 4 and {d["phase"] for d in aggs} == {"aggregate"} and {d["source"] for d in aggs} == {"trace"}
    assert s.iteration_time_ms() > 0


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "t"
    shutil.copytree(FIXTURE, dst)
    return dst


def _one_line_error(trace: Path) -> str:
    r = _dpro("replay", str(trace))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_truncated_file_names_file_and_record(tmp_path):
    t = _copy(tmp_path)
    f = next(t.glob("pslite-worker-9.*.json"))
    text = f.read_text()
    f.write_text(text[: len(text) // 2])
    msg = _one_line_error(t)
    assert f.name in msg and "truncated" in msg and "[records[" in msg
    with pytest.raises(TraceFormatError):
        pslite.read_file(f)


def test_unknown_version_and_bad_record(tmp_path):
    t = _copy(tmp_path)
    f = next(t.glob("pslite-server-*.json"))
    doc = json.loads(f.read_text())
    f.write_text(json.dumps({**doc, "version": 7}))
    msg = _one_line_error(t)
    assert f.name in msg and "unsupported version 7" in msg
    doc["records"][5][0] = "sent"
    f.write_text(json.dumps(doc))
    msg = _one_line_error(t)
    assert f.name in msg and "[records[5]]" in msg


def test_two_requests_with_one_timestamp_are_refused(tmp_path):
    t = _copy(tmp_path)
    f = next(t.glob("pslite-worker-9.*.json"))
    doc = json.loads(f.read_text())
    sends = [r for r in doc["records"] if r[0] == "send" and r[6] == 1]
    sends[1][5] = sends[0][5]                  # a second customer's request numbered like the first
    f.write_text(json.dumps(doc))
    msg = _one_line_error(t)
    assert f.name in msg and "two requests to server id 8 with timestamp" in msg


def test_missing_worker_and_mixed_runs(tmp_path):
    t = _copy(tmp_path)
    w = next(t.glob("pslite-worker-11.*.json"))
    w.unlink()
    msg = _one_line_error(t)
    assert "1 worker files for a job of 2 workers" in msg
    t2 = _copy(tmp_path / "b")
    f = next(t2.glob("pslite-worker-11.*.json"))
    doc = json.loads(f.read_text())
    f.write_text(json.dumps({**doc, "run": "10.0.0.9:1234"}))
    with pytest.raises(DproError, match="2 runs"):
        load_trace(t2)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="emulated hosts need root and iproute2")
def test_real_benchmark_on_emulated_hosts_is_read_and_replayed(tmp_path):
    import pslite_job
    try:
        binary = pslite_job.build()
    except RuntimeError as exc:
        if "exited 3" in str(exc):                        # DPRO_PSLITE_BUILD=0 and nothing cached
            pytest.skip(str(exc))
        raise
    length, keys, workers = 256000, 4, 2
    trace = tmp_path / "trace"
    res = pslite_job.run(binary, trace=trace, workers=workers, servers=1, rate_mbit=200, length=length,
                         keys_per_server=keys, rounds=6, port=9310, log_dir=tmp_path / "logs")
    got = check_pairs(trace, length, workers=workers, keys=keys)
    # the trace's own round per worker (previous round's last response handled -> this round's) is the
    # round the program timed with its own clock
    job = pslite.transfers(trace)
    b = job["bounds"]
    diffs = []
    for w in {w for w, _ in b}:
        prog = res["round_ms"][w.split("/")[0]]
        for i in job["iterations"]:
            traced = (b[(w, i)][1] - b[(w, i - 1)][1]) / 1e3
            diffs.append(abs(prog[i - 1] - traced))
    print(f"program's rounds vs the trace's: median |diff| {statistics.median(diffs):.3f} ms, max {max(diffs):.3f} ms "
          f"over {len(diffs)} rounds")
    assert statistics.median(diffs) < 5.0
    r = _dpro("replay", "--json", str(trace))
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)["iteration_time_ms"]
    measured = {h: statistics.median(v) for h, v in res["round_ms"].items()}
    slowest = max(measured.values())
    print(f"ps-lite test_benchmark 2w/1s 200 Mbit/s: {got['iterations']} iterations, {got['transfers']} transfers; "
          f"replay {pred:.3f} ms, program's median round per worker "
          + ", ".join(f"{h} {v:.3f} ms" for h, v in sorted(measured.items())))
    assert pred > 0 and 0.2 * slowest < pred < 5 * slowest    # sanity only: no accuracy claim
    assert _dpro("align", str(trace)).returncode == 0
