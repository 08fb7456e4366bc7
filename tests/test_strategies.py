"""Real strategy jobs (examples/strategies/train.py): FSDP2 and pipelining on 2 gloo ranks, and their prediction.

Each job is the real thing: ``torch.distributed`` on CPU with gloo, 2 ranks, launched as the bench
does (``dpro_kit.jobs.run_job``: one rank per emulated host at 1000 Mbit/s, each host a fixed CPU
budget of 0.5 CPU in a 10 ms CFS period; on loopback without budgets where namespaces or cgroups are
unusable).  The jobs must run and time finite iterations; the single-process profile of the same
model (``dpro profile --shapes``, same CPU budget) is simulated with ``dpro simulate`` under the same
strategy file and the prediction must be within a loose sanity band (1/3x..3x) of the measured
time.  The accuracy targets live in bench/simulate_accuracy.py's table (docs/simulate.md), not
here: one short run on a shared machine is too noisy for a tight bound.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit import jobs as J

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "strategies" / "train.py"
STRATS = ROOT / "examples" / "strategies"
ENV = {"PYTHONWARNINGS": "ignore", "DPRO_QUIET": "1"}
RATE, CPUS = 1000.0, 0.5


def _emulated_unusable() -> str | None:
    from conftest import netns_unusable_reason
    if J.cgroup_cpu_root() is None:
        return "no writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    return netns_unusable_reason("svt")


EMULATED = _emulated_unusable() is None


def run_job(tmp: Path, model: str, strategy: str | None, iters: int = 6, profile: Path | None = None) -> dict:
    """One real job: 2 emulated hosts for a strategy file, 1 host for the (profiled) single process."""
    out = tmp / f"{model}-{strategy or 'single'}.json"
    argv = [sys.executable, str(TRAIN), "--model", model, "--iters", str(iters), "--warmup", "2", "--quiet",
            "--threads", "1", "--json-out", str(out)]
    if strategy:
        argv += ["--strategy", str(STRATS / f"{strategy}.yaml")]
    hosts = 2 if strategy else 1
    with open(tmp / "jobs.log", "a") as log:
        r = J.run_job(argv, hosts=hosts, ranks_per_host=1, rate_mbit=RATE if EMULATED and hosts > 1 else None,
                      cpus_per_host=CPUS if EMULATED else None, cpu_period_us=10000,
                      cpu_shares=8192 if EMULATED else None, profile=profile, steps="3:6", profile_flags=["--shapes"],
                      env=ENV, log=log, timeout=180, prefix="svt")
    assert r.ok and out.exists(), (r, (tmp / "jobs.log").read_text()[-2000:])
    return json.loads(out.read_text())


def check_times(doc: dict, ranks: int, iters: int = 6) -> None:
    assert doc["world_size"] == ranks
    assert sorted(doc["iteration_times_s"]) == [str(r) for r in range(ranks)]
    for ts in doc["iteration_times_s"].values():
        assert len(ts) == iters and all(math.isfinite(t) and t > 0 for t in ts)
    assert doc["iteration_ms"] == pytest.approx(max(doc["per_rank_median_ms"].values()))
    assert all(b is None for b in doc["peak_bytes"].values())      # measured only with --memory


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strategies")
    return tmp, {("mlp", "fsdp-2"): run_job(tmp, "mlp", "fsdp-2"),
                 ("mlp", "1f1b-2"): run_job(tmp, "mlp", "1f1b-2")}   # one model: one profile for both predictions


def test_fsdp_job_runs(jobs):
    doc = jobs[1][("mlp", "fsdp-2")]
    check_times(doc, 2)
    assert doc["sharding"] == "fsdp" and doc["describe"].startswith("FSDP2 fully_shard")


def test_pipeline_job_runs(jobs):
    doc = jobs[1][("mlp", "1f1b-2")]
    check_times(doc, 2)
    assert doc["stages"] == 2 and doc["micro_batches"] == 4 and "Schedule1F1B" in doc["describe"]


def test_memory_run_measures_each_ranks_peak(tmp_path):
    """--memory (one process, loopback): the peak holds at least parameters, gradients and momentum."""
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(TRAIN), "--model", "mlp", "--iters", "3", "--warmup", "2", "--quiet",
                        "--memory", "--json-out", str(out)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    peak = doc["peak_bytes"]["0"]
    assert peak is not None and peak > 3 * 4 * doc["params"], (peak, doc["params"])


def test_bad_strategy_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ranks: 2\nstrategy:\n  data_parallel: {degree: 2, sharding: zero9}\n")
    r = subprocess.run([sys.executable, str(TRAIN), "--strategy", str(bad)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, **ENV})
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "sharding 'zero9'" in r.stderr and str(bad) in r.stderr


@pytest.mark.parametrize("model,strategy", [("mlp", "fsdp-2"), ("mlp", "1f1b-2")])
def test_prediction_within_sanity_band(jobs, model, strategy):
    if not EMULATED:
        pytest.skip(f"the prediction is checked on emulated hosts with a CPU budget: {_emulated_unusable()}")
    tmp, docs = jobs
    trace = tmp / f"profile-{model}"
    if not (trace / "manifest.json").exists():
        run_job(tmp, model, None, profile=trace)
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "simulate", str(trace), "--strategy",
                        str(STRATS / f"{strategy}.yaml"), "--bandwidth-mbps", f"{RATE:g}", "--json"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr[-2000:]
    pred = float(json.loads(r.stdout)["iteration_ms"])
    meas = docs[(model, strategy)]["iteration_ms"]
    assert math.isfinite(pred) and meas / 3 < pred < 3 * meas, (pred, meas)
