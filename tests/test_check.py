"""`dpro check`: the CI gate. Exit 0 pass, 1 regression / over budget, 2 bad input; text, JSON, JUnit."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import tiny_traceset
from dpro_kit.check import parse_percent, phase_of
from dpro_kit.cli import cli, main
from dpro_kit.cli.check import check
from dpro_kit.cli.report import report
from dpro_kit.errors import DproError
from dpro_kit.trace import save_trace

REAL = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"


@pytest.fixture(autouse=True, scope="module")
def _registered():
    for cmd in (report, check):
        if cmd.name not in cli.commands:
            cli.add_command(cmd)


def _variant(tmp_path: Path, name: str, *, kind: str | None = None, factor: float = 1.0,
             measured: float | None = None) -> Path:
    """tiny_traceset with the durations of one kind scaled (a controlled regression)."""
    ts = tiny_traceset()
    if kind is not None:
        sel = ts.events["kind"] == kind
        ts.events.loc[sel, "dur"] = ts.events.loc[sel, "dur"] * factor
    if measured is not None:
        ts.manifest.extra["measured_iteration_ms"] = measured
    return save_trace(ts, tmp_path / name)


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check", *map(str, args)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_pass_same_run(tmp_path, capsys):
    a = _variant(tmp_path, "a")
    code, out, err = _run(capsys, "--baseline", a, "--candidate", a)
    assert code == 0, err
    assert out.startswith("dpro check: PASS  predicted iteration time") and "(+0.0 %, limit +5 %)" in out


def test_small_change_within_threshold_passes(tmp_path, capsys):
    a, b = _variant(tmp_path, "a"), _variant(tmp_path, "b", kind="FW", factor=1.05)
    code, out, _ = _run(capsys, "--baseline", a, "--candidate", b, "--max-regression", "10%")
    assert code == 0 and "PASS" in out
    code, out, _ = _run(capsys, "--baseline", a, "--candidate", b, "--max-regression", "0.5")
    assert code == 1 and "limit +0.5 %" in out


def test_compute_regression_says_what_got_slower(tmp_path, capsys):
    a, b = _variant(tmp_path, "a"), _variant(tmp_path, "b", kind="BW", factor=1.5)
    code, out, err = _run(capsys, "--baseline", a, "--candidate", b)
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0].startswith("dpro check: FAIL  predicted iteration time")
    phase = next(l for l in lines if l.strip().startswith("critical path by phase:"))
    assert phase.split(":", 1)[1].strip().startswith("BW +")          # the largest change comes first
    measured = next(l for l in lines if l.strip().startswith("measured time by phase:"))
    assert measured.split(":", 1)[1].strip().startswith("BW +0.600 ms (+50 %)")   # 3 layers: 200+400+600 us
    assert any(l.strip().startswith("computation vs communication") and "compute" in l for l in lines)
    ops = lines[lines.index(next(l for l in lines if "ops that got slower (measured)" in l)) + 1:]
    assert "BW" in ops[0] and ops[0].strip().endswith("bw2")             # bw2 (600 us) grew most
    assert "+0.300 ms" in ops[0]


def test_comm_regression_is_attributed_to_comm(tmp_path, capsys):
    a, b = _variant(tmp_path, "a"), _variant(tmp_path, "b", kind="COMM", factor=3.0)
    code, out, _ = _run(capsys, "--baseline", a, "--candidate", b, "--json")
    assert code == 1
    rep = json.loads(out)
    assert rep["status"] == "fail" and rep["exit_code"] == 1
    cp = rep["what_changed"]["critical_path_by_phase"]
    assert cp["comm"]["delta_ms"] > 0 and max(cp, key=lambda k: cp[k]["delta_ms"]) == "comm"
    assert rep["what_changed"]["compute_vs_comm"]["comm"]["delta_ms"] > 0
    assert rep["what_changed"]["compute_vs_comm"]["compute"]["delta_ms"] == pytest.approx(0, abs=1e-9)
    assert rep["what_changed"]["top_ops"][0]["kind"] == "COMM"


def test_json_output_shape(tmp_path, capsys):
    a, b = _variant(tmp_path, "a"), _variant(tmp_path, "b", kind="UPDATE", factor=2)
    code, out, err = _run(capsys, "--baseline", a, "--candidate", b, "--json", "--max-regression", "50%")
    assert code == 0 and err == ""                       # --json: no progress, one object
    rep = json.loads(out)
    assert set(rep) >= {"status", "exit_code", "baseline", "candidate", "max_regression_pct", "checks", "what_changed"}
    (c,) = rep["checks"]
    assert c["name"] == "predicted_iteration_time" and c["status"] == "pass"
    assert c["candidate_ms"] - c["baseline_ms"] == pytest.approx(c["delta_ms"]) and c["limit_ms"] > c["baseline_ms"]
    assert rep["max_regression_pct"] == 50.0


def test_junit_output(tmp_path, capsys):
    a = _variant(tmp_path, "a", measured=2.0)
    b = _variant(tmp_path, "b", kind="BW", factor=1.5, measured=2.02)
    junit = tmp_path / "out" / "dpro.xml"
    code, out, _ = _run(capsys, "--baseline", a, "--candidate", b, "--metric", "both", "--junit", junit,
                        "--max-iteration-ms", "100")
    assert code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    names = [c.get("name") for c in cases]
    assert names == ["predicted_iteration_time", "measured_iteration_time", "predicted_iteration_time_budget",
                     "measured_iteration_time_budget"]
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["predicted_iteration_time"]                 # measured +1 %, budget generous
    assert suites[0].get("tests") == "4" and suites[0].get("failures") == "1" and suites[0].get("errors") == "0"
    msg = cases[0].find("failure")
    assert "predicted iteration time" in msg.get("message") and "critical path by phase" in msg.text
    assert all(c.get("classname") == "dpro.check" and c.get("time") is not None for c in cases)


def test_budget(tmp_path, capsys):
    a = _variant(tmp_path, "a")
    code, out, _ = _run(capsys, a, "--max-iteration-ms", "100")
    assert code == 0 and "<= budget 100 ms" in out
    code, out, _ = _run(capsys, a, "--max-iteration-ms", "1", "--json")
    rep = json.loads(out)
    assert code == 1 and rep["status"] == "fail" and rep["checks"][0]["name"] == "predicted_iteration_time_budget"
    assert rep["checks"][0]["candidate_ms"] > 1 and rep["baseline"] is None
    assert rep["what_changed"]["critical_path_by_phase"]          # where the time goes
    code, out, _ = _run(capsys, a, "--max-iteration-ms", "1")
    assert "> budget 1 ms (over by" in out and "longest ops on the critical path" in out


def test_saved_replay_results(tmp_path, capsys):
    """`dpro replay --json` files on either side; iterations follow the saved result."""
    a, b = _variant(tmp_path, "a"), _variant(tmp_path, "b", kind="BW", factor=1.5)
    saved = {}
    for name, d in (("a", a), ("b", b)):
        assert main(["replay", str(d), "--json", "-n", "2"]) == 0
        saved[name] = tmp_path / f"{name}.json"
        saved[name].write_text(capsys.readouterr().out)
    code, out, _ = _run(capsys, "--baseline", saved["a"], "--candidate", saved["b"])
    assert code == 1 and "critical path by phase: BW +" in out and "ops that got slower (critical path)" in out
    code, out, _ = _run(capsys, "--baseline", saved["a"], "--candidate", a, "--json")
    rep = json.loads(out)
    assert code == 0 and rep["checks"][0]["delta_ms"] == pytest.approx(0, abs=1e-9)
    assert rep["what_changed"]["top_ops"] == []                  # no spurious "new on the critical path"
    code, out, _ = _run(capsys, saved["b"], "--max-iteration-ms", "1000")
    assert code == 0


def test_measured_metric_needs_a_measurement(tmp_path, capsys):
    a = _variant(tmp_path, "a")
    code, _, err = _run(capsys, "--baseline", a, "--candidate", a, "--metric", "measured")
    assert code == 2 and "measured_iteration_ms" in err and str(a) in err


@pytest.mark.parametrize("case", ["missing", "not_json", "not_replay", "bad_pct", "nothing", "no_reference",
                                  "bad_budget", "empty_dir"])
def test_bad_input_is_one_line_exit_2(case, tmp_path, capsys):
    a = _variant(tmp_path, "a")
    junk = tmp_path / "junk.json"
    args: list = []
    must = ""
    if case == "missing":
        args, must = ["--baseline", tmp_path / "nope", "--candidate", a], str(tmp_path / "nope")
    elif case == "not_json":
        junk.write_text("{oops")
        args, must = ["--baseline", junk, "--candidate", a], str(junk)
    elif case == "not_replay":
        junk.write_text(json.dumps({"hello": 1}))
        args, must = ["--baseline", a, "--candidate", junk], "iteration_time_ms"
    elif case == "bad_pct":
        args, must = ["--baseline", a, "--candidate", a, "--max-regression", "five"], "--max-regression"
    elif case == "nothing":
        args, must = [], "nothing to check"
    elif case == "no_reference":
        args, must = [a], "--max-iteration-ms"
    elif case == "bad_budget":
        args, must = [a, "--max-iteration-ms", "-3"], "positive"
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        args, must = [tmp_path / "empty", "--max-iteration-ms", "3"], "empty"
    code, out, err = _run(capsys, *args)
    assert code == 2, (out, err)
    err = err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dpro: error:") and must in err, err
    assert "Traceback" not in err and out == ""


def test_real_trace_against_its_budget(capsys):
    code, out, _ = _run(capsys, REAL, "--max-iteration-ms", "1000", "--metric", "both")
    assert code == 0 and out.count("PASS") == 2


def test_helpers():
    assert parse_percent("5%") == 5 and parse_percent("2.5") == 2.5 and parse_percent("+1 %") == 1
    with pytest.raises(DproError):
        parse_percent("-5%")
    assert [phase_of(k) for k in ("FW", "BW", "UPDATE", "SEND", "RECV", "COMM", "AGG", "VIRTUAL")] == \
        ["FW", "BW", "UPDATE", "comm", "comm", "comm", "other", "other"]
