"""A real 1-worker / 1-PS ParameterServerStrategy job under `dpro profile`, replayed (issue 13 item 3).

Three emulated hosts (network namespaces, dpro_kit.cluster, 300 Mbit/s links, a CPU quota per
host when the cgroup controller is there): host 0 runs the PS, host 1 the coordinator (the
``chief``, under ``dpro profile --framework tensorflow``), host 2 the worker; the PS and the worker
run ``examples/tf/train.py --serve`` unchanged and unprofiled: the coordinator traces them
through their profiler service (collectors/tf/dpro_tf/ps.py). Then ``dpro replay`` builds the
PS DFG (per variable: push, the PS's update; after all updates of the step, the pulls; ``ps_step``) and its iteration time is
printed beside the coordinator's measured step time (sanity bound only: wall-clock accuracy
belongs to bench/, docs/tensorflow.md).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import netns_unusable_reason  # noqa: E402

pytest.importorskip("tensorflow")
PREFIX = "tfps"
PY = sys.executable
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "tf" / "train.py"
_REASON = netns_unusable_reason(PREFIX)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def run_ps_job(out: Path, *, rate_mbit: float = 300, width: int = 256, steps: str = "6:10", iters: int = 16,
               cpus: float | None = 0.5, timeout: float = 240) -> str:
    """Profile a 1-worker / 1-PS ParameterServerStrategy job on 3 emulated hosts; returns the chief's stderr."""
    from dpro_kit.cluster import EmulatedCluster
    from dpro_kit.jobs import CpuBudget, cgroup_cpu_root
    budget = CpuBudget(3, cpus, prefix=PREFIX) if cpus and cgroup_cpu_root() else None
    try:
        with EmulatedCluster(3, rate_mbit=rate_mbit, prefix=PREFIX) as c:
            cluster = {"ps": [f"{c.host_ip(0)}:23456"], "chief": [f"{c.host_ip(1)}:23456"],
                       "worker": [f"{c.host_ip(2)}:23456"]}

            def env(task: str) -> dict[str, str]:
                return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}}),
                        "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}

            common = ["--width", str(width)]
            servers = [c.run(h, [PY, str(TRAIN), "--serve", *common], env=env(t), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=budget.preexec(h) if budget else None)
                       for h, t in ((0, "ps"), (2, "worker"))]
            try:
                cmd = [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--out", str(out),
                       "--host", "host1", "--steps", steps, "--json", "--", PY, str(TRAIN), "--strategy", "ps",
                       "--steps", str(iters), "--warmup", "5", *common]
                # warm-up 5 > START-2: the trace starts before train.py's join after the warm-up, which must
                # not hold the job (it did: an idle trace, no task written)
                chief = c.run(1, cmd, env=env("chief"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=budget.preexec(1) if budget else None)
                so, se = chief.communicate(timeout=timeout)
                assert chief.returncode == 0, se[-3000:]
            finally:
                for s in servers:
                    s.kill()
                    s.wait()
            return so + se
    finally:
        if budget:
            budget.close()


@pytest.fixture(scope="module")
def ps_trace(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("tfps") / "t"
    log = run_ps_job(out)
    return out, log


def test_servers_traced_by_the_coordinator(ps_trace):
    out, log = ps_trace
    man = json.loads((out / "manifest.json").read_text())
    assert man["comm_backend"] == "grpc-ps" and man["extra"]["strategy"] == "ps"
    roles = sorted(v["role"] for v in man["nodes"].values())
    assert roles == ["server", "worker"] and man["world_size"] == 1
    assert man["iterations"] and man["extra"]["measured_iteration_ms"] > 0
    from dpro_kit.readers.tf_ps import job_transfers
    from dpro_kit.trace import Manifest
    job = job_transfers(Manifest.from_json(man, path="manifest.json"), out)
    pushes = {x["tensor"]: x for x in job["xfers"] if x["phase"] == "push"}
    pulls = {x["tensor"]: x for x in job["xfers"] if x["phase"] == "pull"}
    # every trainable variable of the 3 dense layers goes both ways, with its own bytes
    kernels = [t for t in pushes if t.endswith("kernel:0")]
    assert len(kernels) == 3 and set(kernels) <= set(pulls)
    assert all(pushes[t]["bytes"] > 0 and pushes[t]["bytes"] == pulls[t]["bytes"] for t in kernels)
    # a transfer arrives after it is posted; a gradient's update on the PS starts after it arrived
    for x in job["xfers"]:
        assert x["arr"] >= x["rstart"] >= 0
        if x["phase"] == "push" and x["agg"] is not None:
            assert x["agg"][0] >= x["arr"] - 1000     # ns; one clock on emulated hosts
    assert any(x["agg"] for x in pushes.values())
    # one ps_step collective per step: a partition per variable, on the PS
    from dpro_kit.trace import load_trace
    (coll,) = load_trace(out).collectives
    assert coll.algorithm == "ps_step" and {p["variable"] for p in coll.partitions} >= set(kernels)
    assert all(p["server"].endswith("/ps0") for p in coll.partitions)


def test_replay_against_measured(ps_trace):
    out, _ = ps_trace
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(out), "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    pred, meas = doc["iteration_time_ms"], doc.get("measured_iteration_ms")
    print(f"TF ParameterServerStrategy 1 worker / 1 PS, 300 Mbit/s, width 256: replay {pred:.3f} ms, "
          f"measured (coordinator, unprofiled) {meas} ms, critical path {doc.get('critical_path_ms_by_kind')}")
    assert meas and 0.2 * meas < pred < 5 * meas     # a sanity bound, not an accuracy claim
    # another line rate: the transfers come from the link model instead of the measured ones
    slow = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(out), "--json", "--bandwidth-mbps", "30"],
                          capture_output=True, text=True, timeout=300)
    assert slow.returncode == 0, slow.stderr[-3000:]
    assert json.loads(slow.stdout)["iteration_time_ms"] > pred


def test_async_template_from_the_ps_trace(ps_trace):
    """`dpro async-predict` on the traced job (issue 13 item 4): the step DAG is the trace's, exactly."""
    from collections import deque

    from dpro_kit.async_ps import template_from_trace
    from dpro_kit.readers.tf_ps import LAUNCH, job_transfers
    from dpro_kit.trace import load_trace
    out, _ = ps_trace
    ts = load_trace(out)
    (worker,) = ts.manifest.workers()
    job = job_transfers(ts.manifest, out)
    mine = [x for x in job["xfers"] if x["worker"] == worker]
    tpl = template_from_trace(out)
    ops = tpl.ops
    # the variables and bytes are the traced transfers': one down per pulled, one up per pushed variable
    assert tpl.variables == {x["tensor"]: x["bytes"] for x in mine}
    pulls = {x["tensor"]: x["bytes"] for x in mine if x["phase"] == "pull"}
    pushes = {x["tensor"]: x["bytes"] for x in mine if x["phase"] == "push"}
    assert {o.name: o.work for o in ops if o.res == "down"} == {f"down:{v}": b for v, b in pulls.items()}
    assert {o.name: o.work for o in ops if o.res == "up"} == {f"up:{v}": b for v, b in pushes.items()}
    assert tpl.total_bytes("down") == sum(pulls.values()) and tpl.total_bytes("up") == sum(pushes.values())
    assert all(o.ps == 0 for o in ops)                                      # one PS: all on it
    # a DAG rooted at the launch: deps resolve, only the launch waits for nothing, no cycle
    assert ops[0].name == LAUNCH and ops[0].deps == []
    assert all(o.deps and all(0 <= d < len(ops) and d != i for d in o.deps) for i, o in enumerate(ops) if i)
    indeg = [len(o.deps) for o in ops]
    succ = [[] for _ in ops]
    for i, o in enumerate(ops):
        for d in o.deps:
            succ[d].append(i)
    todo, seen = deque([0]), 0
    while todo:
        i = todo.popleft()
        seen += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                todo.append(j)
    assert seen == len(ops)
    # every read feeds a kernel, every gradient leaves after a kernel, every update follows its gradient
    assert all(succ[i] and all(ops[j].res == "worker" for j in succ[i]) for i, o in enumerate(ops) if o.res == "down")
    assert all(all(ops[d].res == "worker" and d for d in o.deps) for o in ops if o.res == "up")
    assert all(len(o.deps) == 1 and ops[o.deps[0]].name == "up:" + o.name[len("apply:"):]
               for o in ops if o.res == "ps")
    # per profiled step: the launch and the kernels' measured durations, the PS's update (AGG) of each variable
    ev = ts.events[ts.events["node"] == worker]
    its = sorted(int(i) for i in ev["iteration"].unique())
    assert len(tpl.samples) == len(its) >= 2
    agg = ts.events[(ts.events["kind"] == "AGG") & (ts.events["peer"] == worker)]
    for it, row in zip(its, tpl.samples):
        launch = ev[(ev["op"] == LAUNCH) & (ev["iteration"] == it)]["dur"]
        assert row[0] == pytest.approx(float(launch.sum()))
        upd = agg[agg["iteration"] == it]["dur"]
        assert sum(w for o, w in zip(ops, row) if o.res == "ps") == pytest.approx(float(upd.sum()))
        assert [w for o, w in zip(ops, row) if o.res in ("down", "up")] == [o.work for o in ops if o.res in ("down", "up")]
    # a what-if placement on 2 PS moves the transfers, not the bytes
    var = sorted(pushes)[0]
    two = template_from_trace(out, num_ps=2, placement={var: 1})
    assert {o.name for o in two.ops if o.ps == 1} == {f"down:{var}", f"up:{var}", f"apply:{var}"} & {o.name for o in ops}


def test_async_predict_calibrates_on_the_traced_job(ps_trace):
    out, _ = ps_trace
    man = json.loads((out / "manifest.json").read_text())
    one = 1e3 / man["extra"]["measured_iteration_ms"]          # the coordinator's unprofiled 1-worker steps/s
    cmd = [PY, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "300", "--workers", "1-2",
           "--seeds", "2", "--steps", "40", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["measured_1w_from_trace"] and doc["measured_1w"] == pytest.approx(one, rel=1e-12)
    (w1,) = [p for p in doc["predicted"] if p["workers"] == 1]
    if doc["calibrated"]:
        assert w1["steps_per_s"] == pytest.approx(one, rel=1e-6)            # W=1 is the calibration
    else:   # the traced step was slower than the unprofiled one at any bandwidth (seen once, CI 14:30 UTC on a
        # slow machine: 9.76 predicted vs 23.83 measured): said, and W=1 below the measurement, never above it
        assert w1["steps_per_s"] < one and "W = 1 is not calibrated" in r.stderr
    assert [p["workers"] for p in doc["predicted"]] == [1, 2]
    # a measurement given on the command line wins over the trace's
    r = subprocess.run(cmd + ["--measured-1w", str(one / 2)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert not doc["measured_1w_from_trace"] and doc["predicted"][0]["steps_per_s"] == pytest.approx(one / 2, rel=1e-6)


def test_step_times_of_a_real_two_worker_job():
    """bench/async_tf.py ``--step-times`` (train.py ``--step-times``) on a real 2-worker job, unprofiled: every
    measured step comes back with its worker's clock at its start and when its gradients were ready, the steps
    split into two workers' sequences, and a phase per step (docs/async.md, the W = 2 phasing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import async_tf
    sps = async_tf.run_pss(2, 300, steps=8, warmup=3, width=256, depth=2, batch=32, cpus=None, prefix="tfpsst",
                           step_times=True)
    steps = async_tf.STEP_TIMES
    assert sps > 0 and len(steps) == 8 and all(s < g for s, g in steps)
    seqs = async_tf.worker_steps(steps, 2)
    assert sum(map(len, seqs)) == 8 and all(seqs)
    for seq in seqs:     # a worker's steps do not overlap
        assert all(g <= s2 for (_, g), (s2, _) in zip(seq, seq[1:]))
    ph = async_tf.phasing(steps)
    assert ph["distance"] and all(0.0 <= d <= 0.5 for d in ph["distance"]) and ph["period_ms"] > ph["download_ms"] > 0
    # the PS's clock once each step's writes were done: after its gradients were ready
    assert len(async_tf.STEP_APPLIED) == 8 and all(g < a for (_, g), a in zip(steps, async_tf.STEP_APPLIED))
    # every host's TCP loss counters and shaper drops were read from its namespace (bench/async_tf.py tcp_counters)
    assert [len(async_tf.RUN_TCP[r]) for r in ("ps", "chief", "worker")] == [1, 1, 2]
    assert all(h["RetransSegs"] >= 0 and h["up_drops"] >= 0 and h["down_drops"] >= 0
               for hs in async_tf.RUN_TCP.values() for h in hs)
