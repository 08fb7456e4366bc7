"""A real 2-worker MultiWorkerMirroredStrategy job on 2 emulated hosts under `dpro profile` (issue 13).

Each emulated host (network namespace, dpro_kit.cluster, 1000 Mbit/s links) runs its own
``dpro profile --framework tensorflow --host hostN`` around ``examples/tf/train.py --strategy
mwms`` -- one launcher per machine, no coordination by the user: the tasks agree on a run id
through their identical TF_CONFIG cluster. Then ``dpro replay`` builds the ring DFG from the
collective ops (CollectiveReduceV2, their group/instance keys and sizes from the traced graph)
and is compared with the job's own unprofiled steps (printed, not asserted: wall-clock numbers
belong to bench/, docs/tensorflow.md). A bandwidth what-if must slow the replay down.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import netns_unusable_reason  # noqa: E402

pytest.importorskip("tensorflow")
PREFIX = "tfmw"
PY = sys.executable
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "tf" / "train.py"
_REASON = netns_unusable_reason(PREFIX)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def run_mwms(out: Path, *, rate_mbit: float = 1000, width: int = 256, steps: str = "6:9", iters: int = 14,
             cpus: float | None = None) -> list[str]:
    """Profile a 2-worker MWMS job on 2 emulated hosts into ``out``; returns the launchers' stderr."""
    from dpro_kit.cluster import EmulatedCluster
    from dpro_kit.jobs import CpuBudget, cgroup_cpu_root
    budget = CpuBudget(2, cpus, prefix=PREFIX) if cpus and cgroup_cpu_root() else None
    try:
        with EmulatedCluster(2, rate_mbit=rate_mbit, prefix=PREFIX) as c:
            cluster = {"worker": [f"{c.host_ip(i)}:23456" for i in range(2)]}
            procs = []
            for i in range(2):
                env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
                cmd = [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--out", str(out),
                       "--host", f"host{i}", "--steps", steps, "--", PY, str(TRAIN), "--strategy", "mwms",
                       "--steps", str(iters), "--warmup", "3", "--width", str(width)]
                procs.append(c.run(i, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=budget.preexec(i) if budget else None))
            errs = []
            for p in procs:
                _, err = p.communicate(timeout=400)
                assert p.returncode == 0, err[-3000:]
                errs.append(err)
            return errs
    finally:
        if budget:
            budget.close()


@pytest.fixture(scope="module")
def mwms_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mwms") / "t"
    run_mwms(out)
    return out


def _replay(trace: Path, *extra: str) -> dict:
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(trace), "--json", *extra], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_two_workers_recorded_with_collectives(mwms_trace: Path):
    man = json.loads((mwms_trace / "manifest.json").read_text())
    assert man["world_size"] == 2 and man["comm_backend"] == "tf-collective"
    assert sorted(man["nodes"]) == ["host0/worker0", "host1/worker1"]
    for node in man["nodes"].values():
        g = json.loads((mwms_trace / node["dir"] / "tf_graph.json").read_text())
        colls = [o for o in g["ops"] if "collective" in o]
        assert colls, "no collective op in the traced MWMS step"
        for o in colls:
            info = o["collective"]
            assert info["group_size"] == 2 and isinstance(info["group_key"], int)
            assert info["instance_key"] is not None          # an int, or "call-time" (MWMS: new per call)
            assert info["bytes"] > 0
    from dpro_kit.trace import load_trace
    ts = load_trace(mwms_trace)
    by_tensor = {}
    for c in ts.collectives:
        by_tensor.setdefault(c.tensor, c)
    assert by_tensor and all(c.bytes > 0 for c in by_tensor.values())


def test_replay_ring_and_bandwidth_whatif(mwms_trace: Path):
    base = _replay(mwms_trace)
    assert base["iteration_time_ms"] > 0
    kinds = base["critical_path_ms_by_kind"]
    print(f"MWMS 2 hosts 1000 Mbit/s: replay {base['iteration_time_ms']:.3f} ms, measured "
          f"{base.get('measured_iteration_ms')} ms, critical path {kinds}")
    slow = _replay(mwms_trace, "--bandwidth-mbps", "50")
    assert slow["iteration_time_ms"] > base["iteration_time_ms"]
