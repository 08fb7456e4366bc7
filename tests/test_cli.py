"""The `dpro` CLI end to end: output shapes and the bad-input contract (one line, exit 2, nothing written)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpro_kit.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command_with_purpose():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("replay", "graph"):
        line = next(l for l in r.stdout.splitlines() if l.strip().startswith(cmd + " "))
        assert len(line.split(None, 1)[1]) > 10, line  # a one-line purpose follows the name


def test_replay_text_json_and_timeline(tiny_trace_dir: Path, tmp_path: Path):
    tl = tmp_path / "tl.json"
    r = run("replay", str(tiny_trace_dir), "--json", "--timeline", str(tl))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["iteration_time_ms"] > 0
    assert out["critical_path"] and all(isinstance(k, str) for k in out["critical_path"])
    assert set(out["nodes"]) == {"w0", "w1"}
    for v in out["nodes"].values():
        assert set(v) == {"compute_ms", "comm_ms", "overlap_ms", "idle_ms"}
        # compute + comm - overlap + idle = the iteration
        assert v["compute_ms"] + v["comm_ms"] - v["overlap_ms"] + v["idle_ms"] == pytest.approx(
            out["iteration_time_ms"], rel=1e-9)
    trace = json.loads(tl.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs and all({"ts", "dur", "pid", "tid", "name"} <= set(e) for e in xs)
    text = run("replay", str(tiny_trace_dir))
    assert text.returncode == 0 and "predicted iteration time" in text.stdout and "critical path" in text.stdout


def test_multi_iteration_replay_is_steady(tiny_trace_dir: Path):
    one = json.loads(run("replay", str(tiny_trace_dir), "--json").stdout)
    three = json.loads(run("replay", str(tiny_trace_dir), "--json", "-n", "3").stdout)
    assert three["makespan_ms"] > 2 * one["iteration_time_ms"]
    assert three["iteration_time_ms"] <= one["iteration_time_ms"] + 1e-9


def test_graph_export_roundtrip(tiny_trace_dir: Path, tmp_path: Path):
    out = tmp_path / "dfg.json"
    r = run("graph", str(tiny_trace_dir), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ops"] > 0
    a = json.loads(run("replay", str(tiny_trace_dir), "--json").stdout)
    b = json.loads(run("replay", str(out), "--json").stdout)
    assert a["iteration_time_ms"] == pytest.approx(b["iteration_time_ms"])
    assert a["critical_path"] == b["critical_path"]


# ---------------------------------------------------------------- bad input: one line, exit 2

def _bad(args: list[str], *must_contain: str, capsys=None) -> str:
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for s in must_contain:
        assert s in err, err
    return err


def test_missing_and_empty_directory(tmp_path: Path, capsys):
    _bad(["replay", str(tmp_path / "nope")], "does not exist", capsys=capsys)
    (tmp_path / "empty").mkdir()
    _bad(["replay", str(tmp_path / "empty")], "empty", capsys=capsys)


def test_truncated_and_non_json(tiny_trace_dir: Path, capsys):
    ev = tiny_trace_dir / "h0" / "w0" / "events.json"
    ev.write_text(ev.read_text()[:200])
    _bad(["replay", str(tiny_trace_dir)], str(ev), "truncated JSON", capsys=capsys)
    ev.write_text("this is not json")
    _bad(["replay", str(tiny_trace_dir)], str(ev), "invalid JSON", capsys=capsys)


def test_unknown_version(tiny_trace_dir: Path, capsys):
    m = tiny_trace_dir / "manifest.json"
    d = json.loads(m.read_text())
    d["version"] = 99
    m.write_text(json.dumps(d))
    _bad(["replay", str(tiny_trace_dir)], "unsupported trace format version 99", capsys=capsys)


def test_missing_rank(tiny_trace_dir: Path, capsys):
    import shutil
    shutil.rmtree(tiny_trace_dir / "h1" / "w1")
    _bad(["replay", str(tiny_trace_dir)], "w1", "missing", capsys=capsys)


def test_cycle(tiny_trace_dir: Path, capsys):
    dag = tiny_trace_dir / "h0" / "w0" / "dag.json"
    d = json.loads(dag.read_text())
    d["edges"].append(["update", "fw0"])
    dag.write_text(json.dumps(d))
    _bad(["replay", str(tiny_trace_dir)], "cycle", capsys=capsys)


@pytest.mark.parametrize("value", ["NaN", "-5.0"])
def test_bad_durations(tiny_trace_dir: Path, tmp_path: Path, value: str, capsys):
    ev = tiny_trace_dir / "h1" / "w1" / "events.json"
    d = json.loads(ev.read_text())
    d["events"][3]["dur"] = float(value)
    ev.write_text(json.dumps(d))
    tl = tmp_path / "timeline.json"
    _bad(["replay", str(tiny_trace_dir), "--timeline", str(tl)], str(ev), "events[3]", "dur", capsys=capsys)
    assert not tl.exists()  # nothing written half-way


def test_measured_timeline_export(tiny_trace_dir: Path, tmp_path: Path):
    mt = tmp_path / "measured.json"
    r = run("replay", str(tiny_trace_dir), "--json", "--measured-timeline", str(mt))
    assert r.returncode == 0, r.stderr
    trace = json.loads(mt.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # every measured event of the trace is exported (plus per-node iteration markers)
    assert len([e for e in xs if e["args"].get("op")]) >= 2 * 3 * 9
    assert trace["otherData"]["kind"] == "measured"


def test_per_iteration_replay_reports_the_median(tiny_trace_dir: Path):
    out = json.loads(run("replay", str(tiny_trace_dir), "--json", "--per-iteration").stdout)
    per = out["per_iteration_ms"]
    assert set(per) == {"0", "1", "2"}          # the three profiled iterations of the fixture
    vals = sorted(per.values())
    assert out["iteration_time_ms"] == pytest.approx(vals[1])
    assert per[str(out["median_iteration"])] == pytest.approx(out["iteration_time_ms"])
    # the fixture's durations scale by 0.9 / 1.0 / 1.1 per iteration: compute time orders the replays
    assert per["0"] < per["1"] < per["2"]
    text = run("replay", str(tiny_trace_dir), "--per-iteration")
    assert text.returncode == 0 and "replayed each of 3 profiled iterations" in text.stdout
    # per iteration is the default; --mean-durations replays the mean durations once
    default = json.loads(run("replay", str(tiny_trace_dir), "--json").stdout)
    assert default["iteration_time_ms"] == pytest.approx(out["iteration_time_ms"])
    mean = json.loads(run("replay", str(tiny_trace_dir), "--json", "--mean-durations").stdout)
    assert "per_iteration_ms" not in mean and mean["durations"].startswith("mean")
