"""collectors/tf + dpro_kit/readers/tf.py on real TensorFlow jobs (issue 13, item 1).

Real runs of ``examples/tf/train.py`` under ``dpro profile --framework tensorflow`` (no code
change): a custom ``@tf.function`` loop and Keras ``fit``. Checks what the collector recorded
(step function found, profiled steps, op executions matched to the traced graph), that the
reader types ops from the graph (BW / UPDATE / FW) and that ``dpro replay`` runs on it; bad
files give one line naming the file and exit 2. Skipped when TensorFlow is not installed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "tf" / "train.py"
pytestmark = pytest.mark.slow


def _profile(out: Path, *train_args: str, steps: str = "6:9") -> subprocess.CompletedProcess:
    cmd = [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--out", str(out),
           "--steps", steps, "--json", "--", PY, str(TRAIN), "--steps", "12", "--warmup", "3", *train_args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def loop_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tfloop") / "t"
    r = _profile(out, "--mode", "loop")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["manifest"] and summary["tasks_written"] == 1
    return out


def test_loop_recorded(loop_trace: Path):
    man = json.loads((loop_trace / "manifest.json").read_text())
    assert man["framework"] == "tensorflow" and man["raw_format"] == "tf-xplane"
    assert man["iterations"] == [6, 7, 8] and man["world_size"] == 1
    (node,) = man["nodes"].values()
    d = loop_trace / node["dir"]
    meta = json.loads((d / "meta.json").read_text())
    assert meta["step_function"] == "train_step"
    assert meta["measured"]["median_unprofiled_us"] > 0
    ops = json.loads((d / "tf_ops.json").read_text())
    graph = json.loads((d / "tf_graph.json").read_text())
    names = {o["name"] for o in graph["ops"]}
    ran = {r[0] for r in ops["ops"]}
    assert {r[2] for r in ops["ops"]} == {6, 7, 8}
    assert ran <= names, sorted(ran - names)[:5]          # a loop without tf.data: every op is a graph op
    assert any(o["type"] == "AssignSubVariableOp" for o in graph["ops"])
    assert list(d.glob("xplane/**/*.xplane.pb"))          # the raw XSpace stays


def test_loop_reader_and_replay(loop_trace: Path):
    from dpro_kit.trace import load_trace
    ts = load_trace(loop_trace)
    kinds = ts.events.groupby("kind")["op"].nunique().to_dict()
    assert kinds.get("FW", 0) > 0 and kinds.get("BW", 0) > 0 and kinds.get("UPDATE", 0) > 0
    ev = ts.events
    assert (ev[ev["kind"] == "BW"]["op"].str.contains("gradient_tape/")).all()
    (node,) = ts.edges
    assert len(ts.edges[node]) > 50
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(loop_trace), "--json"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["iteration_time_ms"] > 0 and doc["measured_iteration_ms"] > 0


def test_keras_fit(tmp_path: Path):
    out = tmp_path / "fit"
    r = _profile(out, "--mode", "fit", steps="5:7")
    assert r.returncode == 0, r.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["iterations"] == [5, 6]
    (node,) = man["nodes"].values()
    meta = json.loads((out / node["dir"] / "meta.json").read_text())
    assert "step_on_iterator" in meta["step_function"]     # Keras's train_function
    from dpro_kit.trace import load_trace
    ts = load_trace(out)
    assert set(ts.events["kind"]) >= {"FW", "BW", "UPDATE"}


def test_bad_ops_file(loop_trace: Path, tmp_path: Path):
    bad = tmp_path / "bad"
    shutil.copytree(loop_trace, bad)
    man = json.loads((bad / "manifest.json").read_text())
    (node,) = man["nodes"].values()
    f = bad / node["dir"] / "tf_ops.json"
    f.write_text(f.read_text()[: len(f.read_text()) // 2])
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "tf_ops.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    f.write_text(json.dumps({"format": "dpro-tf-ops", "version": 1, "columns": ["name", "type", "step", "start_ns",
                                                                               "dur_ns", "thread"],
                             "ops": [["a", "MatMul", 6, 0, -5, "t"]]}))
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "ops[0]" in r.stderr and "negative" in r.stderr


def test_nothing_to_record_is_said(tmp_path: Path):
    """A window after the job's last step: the job runs unchanged, the task says why it wrote nothing."""
    out = tmp_path / "late"
    r = _profile(out, "--mode", "loop", steps="50:60")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no trace written: the job ran 12 step(s)" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["tasks_written"] == 0
