"""One front door (dpro_kit.session.Session): every predicting command predicts the same number for the same trace.

Uses the real 2-rank gloo DDP recording in examples/traces/ddp-2rank-gloo (copied, so an alignment
cache is never written into the repository).
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from dpro_kit.cli import cli, main
from dpro_kit.cli.check import check
from dpro_kit.cli.report import report
from dpro_kit.errors import DproError
from dpro_kit.session import DURATIONS_MEAN, DURATIONS_PER_ITERATION, Session
from dpro_kit.whatif import WhatIf

REAL = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"


@pytest.fixture(autouse=True, scope="module")
def _registered():
    for cmd in (report, check):
        if cmd.name not in cli.commands:
            cli.add_command(cmd)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("session") / "ddp-2rank-gloo"
    shutil.copytree(REAL, dst)
    return dst


def _json(capsys, *args: str) -> dict:
    code = main([*map(str, args)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_session_stages_and_durations_rule(trace):
    per = Session(trace)
    mean = Session(trace, per_iteration=False)
    assert per.info["durations"] == DURATIONS_PER_ITERATION and mean.info["durations"] == DURATIONS_MEAN
    # the per-iteration graph is the one whose replay is the median (low) of the profiled iterations
    runs = per.info["per_iteration_ms"]
    assert len(runs) == len(per.raw.manifest.iterations) >= 2
    assert per.iteration_time_ms() == pytest.approx(statistics.median_low(runs.values()), rel=1e-12)
    assert runs[str(per.info["median_iteration"])] == pytest.approx(per.iteration_time_ms(), rel=1e-12)
    assert set(per.graph_trace.events["iteration"].unique()) == {per.info["median_iteration"]}
    # on this trace the two rules differ, so agreement between commands below is not a coincidence
    assert abs(per.iteration_time_ms() - mean.iteration_time_ms()) > 0.01
    assert per.raw is per.raw and per.graph is per.graph          # stages run once
    assert "measured_iteration_ms" in per.info and per.comm_model is not None


def test_graph_file_session_refuses_whatif(trace, tmp_path, capsys):
    out = tmp_path / "dfg.json"
    _json(capsys, "graph", trace, "-o", out, "--json")
    s = Session(out)
    assert s.is_graph_file and s.raw is None and s.info == {}
    assert s.iteration_time_ms() == pytest.approx(Session(trace).iteration_time_ms(), rel=1e-12)
    with pytest.raises(DproError, match="trace directory"):
        Session(out, whatif=WhatIf(bandwidth_mbps=100))


def test_replay_check_report_optimize_graph_predict_the_same(trace, tmp_path, capsys):
    rep = _json(capsys, "replay", trace, "--json", "-q")
    t = rep["iteration_time_ms"]
    assert rep["durations"] == DURATIONS_PER_ITERATION
    assert t == pytest.approx(Session(trace).iteration_time_ms(), rel=1e-12)

    chk = _json(capsys, "check", trace, "--max-iteration-ms", "1000", "--json", "-q")
    assert chk["checks"][0]["candidate_ms"] == pytest.approx(t, rel=1e-12)

    html = _json(capsys, "report", trace, "-o", tmp_path / "r.html", "--json", "-q", "-n", "1")
    assert html["iteration_time_ms"] == pytest.approx(t, rel=1e-12)

    plan = _json(capsys, "optimize", trace, "-o", tmp_path / "plan.json", "--json", "-q", "--budget", "5")
    assert plan["predicted"]["before_ms"] == pytest.approx(t, rel=1e-12)
    assert plan["search"]["durations"] == DURATIONS_PER_ITERATION

    _json(capsys, "graph", trace, "-o", tmp_path / "dfg.json", "--json", "-q")
    again = _json(capsys, "replay", tmp_path / "dfg.json", "--json", "-q")
    assert again["iteration_time_ms"] == pytest.approx(t, rel=1e-12)

    # a saved replay result as the baseline of the same trace: no difference
    (tmp_path / "base.json").write_text(json.dumps(rep))
    chk = _json(capsys, "check", "-b", tmp_path / "base.json", "-c", trace, "--json", "-q")
    assert chk["checks"][0]["delta_ms"] == pytest.approx(0.0, abs=1e-9)


def test_the_same_options_give_the_same_number(trace, tmp_path, capsys):
    """Mean durations and several iterations: replay, check and optimize still agree."""
    t = _json(capsys, "replay", trace, "--json", "-q", "--mean-durations")["iteration_time_ms"]
    assert t == pytest.approx(Session(trace, per_iteration=False).iteration_time_ms(), rel=1e-12)
    chk = _json(capsys, "check", trace, "--max-iteration-ms", "1000", "--json", "-q", "--mean-durations")
    assert chk["checks"][0]["candidate_ms"] == pytest.approx(t, rel=1e-12)
    plan = _json(capsys, "optimize", trace, "-o", tmp_path / "plan.json", "--json", "-q", "--budget", "5",
                 "--mean-durations")
    assert plan["predicted"]["before_ms"] == pytest.approx(t, rel=1e-12)
    assert plan["search"]["durations"] == DURATIONS_MEAN

    t3 = _json(capsys, "replay", trace, "--json", "-q", "-n", "3")["iteration_time_ms"]
    chk = _json(capsys, "check", trace, "--max-iteration-ms", "1000", "--json", "-q", "-n", "3")
    html = _json(capsys, "report", trace, "-o", tmp_path / "r.html", "--json", "-q", "-n", "3")
    assert chk["checks"][0]["candidate_ms"] == pytest.approx(t3, rel=1e-12)
    assert html["iteration_time_ms"] == pytest.approx(t3, rel=1e-12)


def test_large_whatif_is_replayed_for_the_median_iteration_only(trace, monkeypatch):
    """A what-if whose graphs would be large (a --world-size what-if of a ring job grows as W^2 ops, one
    build per profiled iteration) is built for the iteration that stands for the job only: the same
    iteration as the profiled job's median, so the same prediction as building every iteration."""
    import dpro_kit.session as session_mod
    wi = dict(world_size=8)
    full = Session(trace, whatif=WhatIf(**wi))
    assert len(full.info["per_iteration_ms"]) == len(full.raw.manifest.iterations) >= 2
    ops = full.graph.number_of_nodes()
    monkeypatch.setattr(session_mod, "PER_ITERATION_MAX_OPS", ops)   # more than one iteration's graph is too many
    one = Session(trace, whatif=WhatIf(**wi))
    assert one.iteration_time_ms() == full.iteration_time_ms()
    assert one.info["median_iteration"] == full.info["median_iteration"] == Session(trace).info["median_iteration"]
    assert list(one.info["per_iteration_ms"]) == [str(one.info["median_iteration"])]
    assert one.info["whatif_ratio_per_iteration"] == {
        k: v for k, v in full.info["whatif_ratio_per_iteration"].items() if k in one.info["per_iteration_ms"]}
    assert f"has {ops:,} ops: replayed for the median profiled iteration" in one.info["durations"]


@pytest.mark.parametrize("name", ["ddp-2rank-gloo", "ddp-h100-2rank-nccl-cnn", "mxnet-ps-2w1s-loopback"])
def test_split_iterations_equals_select_iterations(name):
    """The per-iteration rule splits the trace once (one stable sort by iteration, then slices); each
    part must equal select_iterations of that iteration: same rows in the same order, same dtypes,
    memory samples and manifest iterations (the events of several nodes interleave their iterations)."""
    import pandas.testing as pdt

    from dpro_kit.trace import load_trace, select_iterations, split_iterations
    ts = load_trace(REAL.parent / name)
    its = sorted(int(i) for i in ts.events["iteration"].unique())
    assert len(its) >= 2 and not ts.events["iteration"].is_monotonic_increasing
    parts = split_iterations(ts)
    assert sorted(parts) == its
    for i in its:
        want = select_iterations(ts, [i])
        pdt.assert_frame_equal(parts[i].events, want.events)
        pdt.assert_frame_equal(parts[i].memory, want.memory)
        assert parts[i].manifest == want.manifest and parts[i].edges is ts.edges
    assert split_iterations(ts, [its[0], 10**6])[10**6].events.empty
