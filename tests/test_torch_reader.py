"""The PyTorch collector (collectors/torch, package dpro_torch) and the torch-kineto reader.

* fixture tests parse the real 2-rank gloo DDP trace in examples/traces/ddp-2rank-gloo
  (recorded on this kind of machine, see its README.md);
* the ``slow`` tests run real jobs in subprocesses: a 2-rank gloo DDP job run under
  ``dpro profile`` and replayed with ``dpro replay --json`` (compared with the job's measured
  median; the accuracy figures live in bench/accuracy.py and docs/accuracy.md), a job killed
  with SIGTERM inside the window (environment auto-enable), and the Recorder API in a custom loop.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpro_kit.errors import TraceFormatError
from dpro_kit.graph import build_global_dfg
from dpro_kit.readers import register_reader
from dpro_kit.readers import torch_kineto
from dpro_kit.placement import placement_warnings
from dpro_kit.replay import replay
from dpro_kit.trace import OpKind, load_manifest, load_trace

register_reader("torch-kineto", torch_kineto.read_node)  # until readers/__init__.py registers it

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "examples" / "traces" / "ddp-2rank-gloo"
COLLECTOR = ROOT / "collectors" / "torch"
TRAIN = ROOT / "examples" / "ddp" / "train.py"
PY = sys.executable


@pytest.fixture(scope="module")
def fixture_ts():
    return load_trace(FIXTURE)


def _metas(trace_dir: Path) -> dict[str, dict]:
    m = load_manifest(trace_dir)
    return {n: json.loads((trace_dir / m.node_dir(n) / "meta.json").read_text()) for n in m.workers()}


def _measured_ms(trace_dir: Path) -> float:
    """The job's measured iteration time: the slowest rank's median over unprofiled iterations."""
    return max(m["measured"]["median_unprofiled_us"] for m in _metas(trace_dir).values()) / 1e3


def _predicted_ms(ts) -> float:
    return replay(build_global_dfg(ts), iterations=3).iteration_time_us / 1e3


# --------------------------------------------------------------------------- the recorded fixture

def test_fixture_manifest_and_iterations(fixture_ts):
    m = fixture_ts.manifest
    assert m.raw_format == "torch-kineto" and m.framework == "pytorch" and m.comm_backend == "gloo"
    assert m.world_size == 2 and m.workers() == ["host0/0", "host0/1"]
    assert m.iterations == [12, 13, 14, 15]
    ev = fixture_ts.events
    for node in m.workers():
        assert sorted(ev[ev["node"] == node]["iteration"].unique()) == m.iterations


def test_fixture_event_counts_per_kind(fixture_ts):
    ev = fixture_ts.events
    # per iteration and rank: 7 FW (4 linear + 3 relu), 38 BW (autograd functions + DDP's bucket copies),
    # 24 UPDATE (SGD with momentum: mul_/add_/add_ per parameter), 4 OTHER (randn, randint, zero_grad,
    # the loss), 3 COMM (one gloo allreduce per DDP bucket)
    expected = {"FW": 7, "BW": 38, "UPDATE": 24, "OTHER": 4, "COMM": 3}
    counts = ev.groupby(["node", "iteration", "kind"]).size()
    for (node, it), per in counts.groupby(level=[0, 1]):
        assert {k[2]: int(v) for k, v in per.items()} == expected, (node, it)
    assert set(ev[ev["kind"] == "COMM"]["stream"]) == {"comm"}
    assert set(ev[ev["kind"] != "COMM"]["stream"]) == {"compute"}


def test_fixture_every_op_in_every_iteration(fixture_ts):
    ev = fixture_ts.events
    for node, e in ev.groupby("node"):
        per_iter = e.groupby("iteration")["op"].apply(list)
        first = sorted(per_iter.iloc[0])
        for it, ops in per_iter.items():
            assert len(ops) == len(set(ops)), f"{node} iteration {it}: op ids not unique"
            assert sorted(ops) == first, f"{node} iteration {it}: different op ids"
        # an op keeps its kind and name in every iteration
        assert (e.groupby("op")["kind"].nunique() == 1).all()
        assert (e.groupby("op")["name"].nunique() == 1).all()


def test_fixture_times(fixture_ts):
    ev = fixture_ts.events
    assert (ev["dur"] >= 0).all()
    metas = _metas(FIXTURE)
    for node, e in ev.groupby("node"):
        sync = metas[node]["clock"]["sync"][0]
        t_sync = sync["time_ns_before"] / 1e3
        # us since the epoch, after the profiler started, ops of an iteration before the next one's
        assert (e["start"] >= t_sync - 1).all()
        assert (e["start"] - t_sync < 60e6).all()
        comp = e[e["kind"] != "COMM"]
        ends = comp.assign(end=comp["start"] + comp["dur"]).groupby("iteration")
        span = ends["start"].min().to_numpy(), ends["end"].max().to_numpy()
        assert (span[0][1:] >= span[1][:-1] - 0.5).all()
        # the training thread runs one top-level op at a time
        for _, it in comp.groupby("iteration"):
            it = it.sort_values("start")
            assert (it["start"].to_numpy()[1:] >= (it["start"] + it["dur"]).to_numpy()[:-1] - 0.5).all()


def test_fixture_buckets(fixture_ts):
    metas = _metas(FIXTURE)
    colls = {c.tensor: c for c in fixture_ts.collectives}
    assert sorted(colls) == ["bucket0", "bucket1", "bucket2"]
    for node, meta in metas.items():
        ddp = meta["ddp"][0]
        params = {p["name"]: p for p in ddp["params"]}
        assert len(params) == 8
        seen = []
        for j, b in enumerate(ddp["buckets"]):
            c = colls[f"bucket{j}"]
            names = [ddp["params"][i]["name"] for i in b["params"]]
            assert c.params == names
            assert c.bytes == sum(params[n]["bytes"] for n in names) == b["bytes"] == b["buffer_bytes"]
            assert c.op == "allreduce" and c.algorithm == "ring"
            assert c.participants == ["host0/0", "host0/1"]
            seen += names
        assert sorted(seen) == sorted(params)  # every parameter in exactly one bucket
        # DDP reduces the last layer first
        assert colls["bucket0"].params[:2] == ["head.bias", "head.weight"]
    ev = fixture_ts.events
    comm = ev[ev["kind"] == "COMM"]
    for c in colls.values():
        rows = comm[comm["tensor"] == c.tensor]
        assert len(rows) == 2 * 4 and (rows["bytes"] == c.bytes).all()


def test_fixture_collective_inputs_outputs(fixture_ts):
    ev = fixture_ts.events
    for c in fixture_ts.collectives:
        for node in ("host0/0", "host0/1"):
            e = ev[(ev["node"] == node) & (ev["iteration"] == 12)].set_index("op")
            (inp,), (out,) = c.inputs[node], c.outputs[node]
            assert e.loc[inp, "kind"] == "BW"          # launched from a backward op
            assert e.loc[out, "start"] > e.loc[inp, "start"]
    # buckets become ready in order: bucket j's input op runs before bucket j+1's
    e = ev[(ev["node"] == "host0/0") & (ev["iteration"] == 13)].set_index("op")
    starts = [e.loc[c.inputs["host0/0"][0], "start"] for c in sorted(fixture_ts.collectives, key=lambda c: c.tensor)]
    assert starts == sorted(starts)
    # the gradient-ready markers agree with the launches: DDP launched each bucket in the op in
    # which its last gradient became ready
    meta, doc, path = _fixture_node()
    for c in torch_kineto.parse_node(meta, doc, path=path).collectives:
        assert c["ready_op"] == c["inputs"][0]
    # every wait op comes before the first UPDATE op
    first_update = e[e["kind"] == "UPDATE"]["start"].min()
    assert all(e.loc[c.outputs["host0/0"][0], "start"] < first_update for c in fixture_ts.collectives)


def test_fixture_edges(fixture_ts):
    ev = fixture_ts.events
    for node, edges in fixture_ts.edges.items():
        e = ev[(ev["node"] == node)]
        ops = set(e["op"])
        assert edges and all(u in ops and v in ops for u, v in edges)
        first = e[e["iteration"] == 12].set_index("op")
        kinds = first["kind"]
        # program order: every edge goes forward in time
        assert all(first.loc[u, "start"] < first.loc[v, "start"] for u, v in edges)
        last_fw = first[kinds == "FW"]["start"].idxmax()
        first_bw = first[kinds == "BW"]["start"].idxmin()
        assert (last_fw, first_bw) in edges
        comp = first[kinds != "COMM"].sort_values("start").index.tolist()
        assert all((a, b) in edges for a, b in zip(comp, comp[1:]))


def test_fixture_replay_vs_measured(fixture_ts):
    g = build_global_dfg(fixture_ts)
    assert g.graph["meta"]["comm_model"]["origin"] == "fitted"
    predicted = _predicted_ms(fixture_ts)
    measured = _measured_ms(FIXTURE)
    readme = (FIXTURE / "README.md").read_text()
    assert f"{measured:.2f} ms" in readme
    print(f"\nfixture: predicted {predicted:.2f} ms/iteration, measured median {measured:.2f} ms "
          f"(ratio {predicted / measured:.2f})")
    assert 0.5 * measured <= predicted <= 2.0 * measured


# --------------------------------------------------------------------------- typed classification

def _fixture_node(rank: int = 0):
    ndir = FIXTURE / "host0" / str(rank)
    meta = json.loads((ndir / "meta.json").read_text())
    doc = json.loads((ndir / meta["trace_file"]).read_text())
    return meta, doc, ndir / meta["trace_file"]


def test_kinds_never_come_from_op_names():
    meta, doc, path = _fixture_node()
    ref = torch_kineto.parse_node(meta, doc, path=path)
    # give every framework op an opaque name: kinds, counts and collectives must not change
    renamed = copy.deepcopy(doc)
    names: dict[str, str] = {}
    for e in renamed["traceEvents"]:
        n = e.get("name", "")
        if e.get("ph") == "X" and not n.startswith("dpro::") and not n.startswith("c10d::") \
                and not n.startswith("gloo:"):
            e["name"] = names.setdefault(n, f"op{len(names)}")
    got = torch_kineto.parse_node(meta, renamed, path=path)
    assert list(got.events["kind"]) == list(ref.events["kind"])
    assert [c["bytes"] for c in got.collectives] == [c["bytes"] for c in ref.collectives]
    # without the collector's phase markers nothing is FW/BW/UPDATE, whatever the names say
    bare = copy.deepcopy(doc)
    phase = set(torch_kineto.MARKERS[k] for k in ("forward", "backward", "optimizer"))
    bare["traceEvents"] = [e for e in bare["traceEvents"] if e.get("name") not in phase]
    with pytest.raises(TraceFormatError, match="0 bucket allreduces launched in backward"):
        torch_kineto.parse_node(meta, bare, path=path)  # buckets are only matched inside backward
    kinds = set(torch_kineto.parse_node({**meta, "ddp": []}, bare, path=path).events["kind"])
    assert kinds <= {OpKind.OTHER.value, OpKind.COMM.value}


def test_host_gaps_can_be_kept():
    meta, doc, path = _fixture_node()
    fold = torch_kineto.parse_node(meta, doc, path=path, overhead="keep").events
    keep = torch_kineto.parse_node(meta, doc, path=path, fold_gaps=False, overhead="keep").events
    assert list(fold["op"]) == list(keep["op"])
    assert (fold["dur"] >= keep["dur"] - 1e-6).all() and fold["dur"].sum() > keep["dur"].sum()
    # ends do not move (epoch microseconds as float64 step by 0.25 us)
    assert ((fold["start"] + fold["dur"]) - (keep["start"] + keep["dur"])).abs().max() <= 0.5


def test_profiler_overhead_is_subtracted_per_recorded_event():
    meta, doc, path = _fixture_node()
    keep = torch_kineto.parse_node(meta, doc, path=path, overhead="keep").events
    # the fixture predates the collector's micro-calibration: "calibrated" subtracts nothing
    assert meta.get("profiler_overhead") is None
    cal = torch_kineto.parse_node(meta, doc, path=path, overhead="calibrated").events
    assert list(cal["dur"]) == list(keep["dur"])
    win = torch_kineto.parse_node(meta, doc, path=path).events  # default: "window"
    assert list(win["op"]) == list(keep["op"])
    assert (win["dur"] <= keep["dur"] + 1e-9).all() and (win["dur"] >= 0).all()
    comm = keep["kind"] == "COMM"
    assert list(win[comm]["dur"]) == list(keep[comm]["dur"])  # collectives are not the profiler's
    # per iteration the ops lose at most (median profiled iteration - median unprofiled one): less
    # where an op has fewer microseconds than its events' share (the floor at 0)
    prof = sorted(s["dur_us"] for s in meta["steps"] if s["profiled"])[1:]
    excess = (prof[len(prof) // 2] + prof[(len(prof) - 1) // 2]) / 2 - meta["measured"]["median_unprofiled_us"]
    assert excess > 0
    lost = (keep[~comm].groupby("iteration")["dur"].sum() - win[~comm].groupby("iteration")["dur"].sum())
    assert ((lost > 0.25 * excess) & (lost <= excess + 1)).all(), (lost.to_list(), excess)
    # a per-event cost is never negative, and never more than the cap
    assert torch_kineto.window_overhead_ns({**meta, "measured": {"median_unprofiled_us": 1e9}}, 100) == 0.0
    assert torch_kineto.window_overhead_ns(meta, 1e-6) == torch_kineto.MAX_EVENT_OVERHEAD_NS


def test_window_overhead_takes_the_cpu_clock_when_the_wall_clock_hides_it():
    # a communication-bound rank: profiled steps take the same wall time as unprofiled ones (the
    # profiler's cost hides in the wait for the network) but 1000 us more CPU time each
    steps = [{"step": k, "dur_us": 50_000.0, "cpu_us": 15_000.0, "profiled": False} for k in range(1, 10)]
    steps += [{"step": k, "dur_us": 50_000.0 + (9_000.0 if k == 10 else 0.0), "cpu_us": 16_000.0, "profiled": True}
              for k in range(10, 15)]
    meta = {"steps": steps, "measured": {"median_unprofiled_us": 50_000.0, "unprofiled_steps_used": list(range(1, 10))}}
    # 1000 us of CPU over 500 recorded events per iteration: 2000 ns per event (the first profiled step,
    # +9 ms of wall time for the profiler's start, is excluded)
    assert torch_kineto.window_overhead_ns(meta, 500) == pytest.approx(2000.0)
    # without cpu_us (an older collector): the wall clock alone, 0 here
    old = {**meta, "steps": [{k: v for k, v in st.items() if k != "cpu_us"} for st in steps]}
    assert torch_kineto.window_overhead_ns(old, 500) == 0.0
    # the wall clock wins where it shows more (a compute-bound job: 3000 us per iteration)
    wall = {**meta, "steps": [{**st, "dur_us": st["dur_us"] + 3000.0} if st["profiled"] else st for st in steps]}
    assert torch_kineto.window_overhead_ns(wall, 500) == pytest.approx(6000.0)
    # a damaged cpu_us is ignored, not a crash
    bad = {**meta, "steps": [{**st, "cpu_us": "n/a"} for st in steps]}
    assert torch_kineto.window_overhead_ns(bad, 500) == 0.0


def test_micro_calibration_is_read_from_the_calibrate_marker():
    meta, doc, path = _fixture_node()
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    main_tid = meta["main_tid"]
    base = min(float(e["ts"]) for e in evs) - 1000.0  # before the clock-sync marker: outside every iteration
    pid = next(e["pid"] for e in evs if e.get("tid") == main_tid)
    extra = [{"ph": "X", "cat": "user_annotation", "name": "dpro::calibrate", "ts": base, "dur": 500.0,
              "pid": pid, "tid": main_tid}]
    for c in range(2):  # 2 calls x 3 recorded events
        for k in range(3):
            extra.append({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": base + 10 + 100 * c + 10 * k,
                          "dur": 5.0, "pid": pid, "tid": main_tid})
    doc2 = dict(doc, traceEvents=extra + doc["traceEvents"])
    meta2 = dict(meta, profiler_overhead={"marker": "dpro::calibrate", "calls": 2, "plain_ns": [9000, 9100],
                                          "profiled_ns": [12000, 12600]})
    keep = torch_kineto.parse_node(meta2, doc2, path=path, overhead="keep").events
    cal = torch_kineto.parse_node(meta2, doc2, path=path, overhead="calibrated").events
    # (12000 - 9000) ns / 3 events per call = 1 us per recorded event
    assert len(cal) == len(keep)
    ops = keep["kind"] != "COMM"
    diff = (keep["dur"] - cal["dur"])[ops]
    assert (diff >= 0).all() and diff.max() > 0
    # whole microseconds (1 us x events inside each op), unless the op was floored at 0
    assert (((diff - diff.round()).abs() < 1e-6) | (cal["dur"][ops] == 0)).all()


def test_clock_sync_corrects_a_shifted_kineto_clock():
    meta, doc, path = _fixture_node()
    ref = torch_kineto.parse_node(meta, doc, path=path).events
    shifted = dict(doc, baseTimeNanoseconds=int(doc["baseTimeNanoseconds"]) + 5_000_000_000)
    got = torch_kineto.parse_node(meta, shifted, path=path).events
    sync = meta["clock"]["sync"]
    slack_us = min(m["time_ns_after"] - m["time_ns_before"] for m in sync) / 1e3
    assert (got["start"] - ref["start"]).abs().max() <= slack_us / 2 + 1
    assert list(got["dur"]) == list(ref["dur"])


def test_reader_errors(tmp_path):
    import shutil
    bad = tmp_path / "t"
    shutil.copytree(FIXTURE, bad)
    trace = bad / "host0" / "1" / "kineto_trace.json"
    trace.write_text(trace.read_text()[:5000])
    with pytest.raises(TraceFormatError, match="truncated"):
        load_trace(bad)
    trace.unlink()
    with pytest.raises(TraceFormatError, match="Kineto trace not found"):
        load_trace(bad)
    meta_p = bad / "host0" / "1" / "meta.json"
    meta = json.loads(meta_p.read_text())
    meta["trace_file"] = None
    meta_p.write_text(json.dumps(meta))
    with pytest.raises(TraceFormatError, match="no Kineto trace was written"):
        load_trace(bad)
    meta_p.write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(TraceFormatError, match="unsupported meta.json version"):
        load_trace(bad)


# --------------------------------------------------------------------------- real jobs

def _profile_env(out: Path, steps: str, **extra: str) -> dict[str, str]:
    """What `dpro profile` / `python -m dpro_torch.launch` set up (written out here on purpose)."""
    env = dict(os.environ)
    common = ROOT / "collectors" / "common"
    env.update(DPRO_OUT=str(out), DPRO_STEPS=steps, DPRO_HOST="testhost", DPRO_QUIET="1", DPRO_COLLECTOR="dpro_torch",
               PYTHONPATH=os.pathsep.join([str(common / "dpro_collect" / "autoload"), str(common), str(COLLECTOR)]
                                          + [env.get("PYTHONPATH", "")]),
               **extra)
    return env


@pytest.mark.slow
def test_e2e_ddp_job_profiled_with_dpro_profile(tmp_path):
    """A real 2-rank gloo DDP job run under `dpro profile`, then `dpro replay --json` (the user's path)."""
    out = tmp_path / "trace"
    times = tmp_path / "times.json"
    t0 = time.time()
    env = dict(os.environ, DPRO_QUIET="1")
    proc = subprocess.run(
        [PY, "-m", "dpro_kit.cli", "profile", "--out", str(out), "--steps", "8:14", "--host", "testhost", "--",
         PY, str(TRAIN), "--nproc", "2", "--model", "mlp", "--threads", "1", "--bucket-mb", "0.5",
         "--warmup", "5", "--iters", "30", "--quiet", "--json-out", str(times)],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "manifest.json").exists(), "the last rank to finish writes the manifest"
    ts = load_trace(out)
    assert ts.manifest.iterations == [8, 9, 10, 11, 12, 13]
    assert ts.manifest.workers() == ["testhost/0", "testhost/1"]
    assert len(ts.collectives) == 3
    metas = _metas(out)
    for m in metas.values():  # the collector calibrated the profiler's cost per event
        assert len(m["profiler_overhead"]["plain_ns"]) == m["profiler_overhead"]["calls"]
        assert m["grad_ready_markers"] is True  # per-parameter ready ops for `dpro replay --bucket-mb`
    rep = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(out), "--json", "-q", "-n", "3"],
                         capture_output=True, text=True, timeout=240)
    assert rep.returncode == 0, rep.stderr[-2000:]
    doc = json.loads(rep.stdout)
    # where each rank ran: its CPU set and the machine (boot id); replay warns when ranks time-share cores
    place = ts.manifest.extra["cpu_placement"]
    assert set(place) == {"testhost/0", "testhost/1"}
    assert all(p["affinity"] and p["threads"] == 1 and p["machine"] == place["testhost/0"]["machine"]
               for p in place.values())
    assert doc["warnings"] == placement_warnings(ts.manifest.extra)
    predicted, measured = doc["iteration_time_ms"], doc["measured_iteration_ms"]
    assert measured == pytest.approx(_measured_ms(out), rel=1e-3)
    script_median = json.loads(times.read_text())["median_iteration_s"] * 1e3
    profiled = max(m["measured"]["median_profiled_us"] for m in metas.values()) / 1e3
    print(f"\ne2e job ({time.time() - t0:.1f} s): predicted {predicted:.2f} ms/iteration, measured median "
          f"{measured:.2f} ms (unprofiled iterations; train.py's own median {script_median:.2f} ms), "
          f"ratio {predicted / measured:.2f}; profiled iterations {profiled:.2f} ms")
    # A smoke bound, not an accuracy claim (those are bench/accuracy.py's, medians over real bandwidth-limited
    # jobs): this 30-step 1-thread MLP swings 5-10 ms from run to run on a shared 2-core machine and drifts within
    # a run (one CI run predicted 4.04 ms from its profiled window and measured 8.24 ms on the rest), and the
    # profiled median still carries the profiler's own cost. So: within the band the run itself spans.
    lo, hi = min(measured, profiled), max(measured, profiled)
    assert 0.4 * lo <= predicted <= 2.0 * hi


SIGTERM_JOB = r"""
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
i = 0
while True:
    opt.zero_grad()
    model(torch.randn(16, 64)).square().mean().backward()
    opt.step()
    print(i, flush=True)
    i += 1
    time.sleep(0.02)
"""


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigterm_inside_the_window_flushes(tmp_path):
    out = tmp_path / "trace"
    script = tmp_path / "job.py"
    script.write_text(SIGTERM_JOB)
    proc = subprocess.Popen([PY, str(script), str(_free_port())], env=_profile_env(out, "3:100000"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, step = time.time() + 600, -1   # generous: on a loaded machine the job crawls
        for line in proc.stdout:
            step = int(line)
            if step >= 8 or time.time() > deadline:
                break
        assert step >= 8, f"the job reached step {step} in 600 s; the signal must come inside the window (3..)"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, proc.stderr.read()[-2000:]  # default action still taken
    meta = json.loads((out / "testhost" / "0" / "meta.json").read_text())
    assert meta["window"]["stop_reason"] == "SIGTERM"
    assert meta["window"]["profiled_steps"][:3] == [3, 4, 5]
    ts = load_trace(out)
    assert ts.manifest.iterations == meta["window"]["profiled_steps"]
    kinds = set(ts.events["kind"])
    assert {"FW", "BW", "UPDATE"} <= kinds
    assert len(ts.collectives) == 1 and ts.collectives[0].participants == ["testhost/0"]
    replay(build_global_dfg(ts))


RECORDER_JOB = r"""
import sys, torch
sys.path[:0] = sys.argv[2:4]          # collectors/torch and collectors/common (dpro_collect), as from a checkout
from dpro_torch import Recorder
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
opt = torch.optim.Adam(net.parameters())
rec = Recorder(sys.argv[1], steps=(2, 5), host="box", model=net)
for i in range(8):
    loss = net(torch.randn(8, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    rec.step()
rec.close()
"""


@pytest.mark.slow
def test_recorder_api_custom_loop(tmp_path):
    out = tmp_path / "trace"
    script = tmp_path / "loop.py"
    script.write_text(RECORDER_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")}
    env["DPRO_QUIET"] = "1"
    proc = subprocess.run([PY, str(script), str(out), str(COLLECTOR), str(ROOT / "collectors" / "common")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "box" / "0" / "meta.json").read_text())
    assert meta["window"]["counting"] == "Recorder.step" and meta["window"]["profiled_steps"] == [2, 3, 4]
    assert len(meta["steps"]) == 8 and meta["measured"]["median_unprofiled_us"] > 0
    ts = load_trace(out)
    assert ts.manifest.iterations == [2, 3, 4] and ts.collectives == []
    ev = ts.events
    assert set(ev["kind"]) == {"FW", "BW", "UPDATE", "OTHER"}
    assert replay(build_global_dfg(ts)).iteration_time_us > 0


OUTSIDE_WINDOW_JOB = r"""
import json, os, sys, tempfile, torch
sys.path[:0] = sys.argv[3:5]          # collectors/torch and collectors/common
import torch.distributed as dist
from torch.profiler import ProfilerActivity
from dpro_torch import Recorder
mode = sys.argv[2]
if mode == "ddp":          # a real (1-rank gloo) DDP job: forward, grad-ready and phase hooks in the window
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    rec = Recorder(sys.argv[1], steps=(2, 4), host="box", calibrate=False, auto_step=True)
    acts = None
else:                      # CUDA activity asked for (a CPU build warns and records the CPU)
    net = torch.nn.Linear(8, 2)
    rec = Recorder(sys.argv[1], steps=(1, 2), host="box", model=net, calibrate=False, auto_step=True,
                   activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
opt = torch.optim.SGD(net.parameters(), lr=0.01)
seen = {}
for i in range(6):
    net(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if True:               # state once iteration i ended (the window opens at the end of iteration START-1)
        mods = [net] + list(net.modules())
        seen[i] = {"fw_hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in mods),
                   "grad_hooks": sum(len(p._post_accumulate_grad_hooks or {}) for p in net.parameters()),
                   "profiler": torch.autograd._profiler_enabled(), "recorder_prof": rec._prof is not None,
                   "teardown": os.environ.get("TEARDOWN_CUPTI")}
rec.close()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("mode,preset", [("ddp", None), ("cuda", None), ("cuda", "0")])
def test_nothing_left_outside_the_window(tmp_path, mode, preset):
    # what the collector leaves in the job after its window (docs/accuracy.md, "Outside the window"):
    # no module or parameter hook, no profiler; with CUDA, TEARDOWN_CUPTI=1 unless the job set it
    script = tmp_path / "job.py"
    script.write_text(OUTSIDE_WINDOW_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_") and k != "TEARDOWN_CUPTI"}
    env["DPRO_QUIET"] = "1"
    if preset is not None:
        env["TEARDOWN_CUPTI"] = preset
    proc = subprocess.run([PY, str(script), str(tmp_path / "t"), mode, str(COLLECTOR), str(ROOT / "collectors" / "common")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    before, inside, after = (seen[0], seen[2], seen[5]) if mode == "ddp" else (None, seen[0], seen[5])
    assert inside["profiler"] and inside["recorder_prof"] and inside["fw_hooks"] >= 2
    if mode == "ddp":
        assert inside["grad_hooks"] == 4                   # one per DDP parameter
    for state in (before, after):
        if state is not None:
            assert state["fw_hooks"] == 0 and state["grad_hooks"] == 0
            assert not state["profiler"] and not state["recorder_prof"]
    meta = json.loads((tmp_path / "t" / "box" / "0" / "meta.json").read_text())
    want = None if mode == "ddp" else (preset or "1")
    assert meta["cupti_teardown"] == want and after["teardown"] == want
