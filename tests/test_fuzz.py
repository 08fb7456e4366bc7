"""The short fuzz run (issue 19): damaged copies of the real recorded trace folders through ``dpro replay``.

``bench/fuzz.py`` makes each case (a seeded mutation of a real trace folder: examples/traces,
the BytePS fixture, plain Kineto files of ../shared/traces/hta) and sorts the outcome; here a
fixed set of case numbers runs in-process through the real command line
(:func:`dpro_kit.cli.main`) and every case must end as a clean replay, a replay with a
warning naming the repair, or a one-line refusal naming the file (exit 2): no traceback, no
hang, no non-finite result.  The long run is ``python bench/fuzz.py --cases N``
(docs/reliability.md); a failing case number here reproduces with
``python bench/fuzz.py --case N --keep DIR``.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import fuzz  # noqa: E402

#: case numbers of the short run (each case is one seeded mutation of one seed folder); cases 0-29
#: already draw every seed (checked below), 40 leave room for the outcome counts. The long run
#: (``bench/fuzz.py --cases N``) is where the defects are hunted; this run keeps them from returning.
CASES = range(0, 40)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    old = os.environ.get("DPRO_CACHE")
    os.environ["DPRO_CACHE"] = str(work / "cache")   # the mutated traces' alignment results stay here
    seeds = fuzz.seed_folders(work / "seeds", large=False)
    base = fuzz.baseline(seeds, work)
    yield seeds, base, work
    if old is None:
        os.environ.pop("DPRO_CACHE", None)
    else:
        os.environ["DPRO_CACHE"] = old


def test_seeds_cover_every_format(world):
    seeds, _, _ = world
    # dpro_torch (one and two hosts; CPU and, from a real H100 run, CUDA kernels + NCCL plugin files),
    # MXNet PS, ps-lite, BytePS, the NCCL plugin's files alone; plain Kineto when ../shared is there
    for name in ("ddp-2rank-gloo", "ddp-2host-1000mbit", "ddp-h100-2rank-nccl-cnn", "mxnet-ps-2w1s-loopback",
                 "pslite-2w1s-200mbit", "byteps-2w1s", "nccl-h100-ring-4rank", "nccl-h100-tree-4rank"):
        assert name in seeds
    # every seed is drawn by some case of the short run (make_case's first draw picks the seed)
    assert {random.Random(n).choice(sorted(seeds)) for n in CASES} == set(seeds)


def test_short_fuzz_run(world):
    seeds, base, work = world
    results = [fuzz.run_case(n, seeds, work, base, timeout=60) for n in CASES]
    counts = Counter(r["outcome"] for r in results)
    defects = [r for r in results if r["outcome"] in fuzz.DEFECTS]
    assert not defects, "\n".join(
        f"case {r['case']} ({r['seed']}: {'; '.join(r['mutations'])}): {r['outcome']}: {r['detail']}\n"
        f"{r.get('traceback', '')}" for r in defects)
    # the mutations reach the readers: some cases are refused, and some mutations do not matter
    assert counts["refused"] >= len(CASES) // 5, counts
    assert counts["ok"] + counts["repaired"] >= len(CASES) // 5, counts


def test_case_is_reproducible(world, tmp_path):
    seeds, _, _ = world
    a = fuzz.make_case(7, seeds, tmp_path / "a")
    b = fuzz.make_case(7, seeds, tmp_path / "b")
    assert a == b
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files_a)


def test_classify_counts_what_is_wrong(tmp_path):
    case = tmp_path / "c"
    ok = {"rc": 0, "stdout": '{"iteration_time_ms": 5.0, "warnings": []}', "stderr": ""}
    assert fuzz.classify(ok, case)[0] == "ok"
    nan = {"rc": 0, "stdout": '{"iteration_time_ms": NaN}', "stderr": ""}
    assert fuzz.classify(nan, case)[0] == "bad_output"
    warned = {"rc": 0, "stdout": '{"iteration_time_ms": 5.0, "warnings": ["repaired x"]}', "stderr": ""}
    assert fuzz.classify(warned, case)[0] == "repaired"
    assert fuzz.classify(warned, case, {"repaired x"})[0] == "ok"
    good = {"rc": 2, "stdout": "", "stderr": f"dpro: error: {case}/meta.json [rank]: bad (fix)\n"}
    assert fuzz.classify(good, case)[0] == "refused"
    nameless = {"rc": 2, "stdout": "", "stderr": "dpro: error: something is bad\n"}
    assert fuzz.classify(nameless, case)[0] == "bad_refusal"
    tb = {"rc": "traceback", "stdout": "", "stderr": "", "traceback": 'File "x.py", line 1, in f\nKeyError: 1'}
    assert fuzz.classify(tb, case)[0] == "traceback"


@pytest.mark.parametrize("blocked", [False, True])
def test_subprocess_runner_counts_hangs(blocked):
    """The long run's workers: a case past the CPU-time limit (spinning) or the wall-clock limit (blocked)
    is killed and counted as a hang, the run goes on."""
    # --stall 600: every case spins 10 CPU minutes (or sleeps 10 minutes) in its worker before it starts;
    # two cases where the case spins (the run goes on with a new worker after a kill), one where it blocks
    cases = 1 if blocked else 2
    r = subprocess.run([sys.executable, str(REPO / "bench" / "fuzz.py"), "--cases", str(cases), "--jobs", "1",
                        # spinning: a wall limit far beyond the CPU one (a loaded machine gives the spinning
                        # worker 2 CPU s only after several wall seconds: it was killed for wall time instead)
                        "--timeout", "2", "--wall-timeout", "4" if blocked else "120", "--small", "--stall", "600",
                        *(["--stall-sleep"] if blocked else [])], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 1, r.stdout + r.stderr
    why = "over 4 s wall" if blocked else "over 2 CPU s, killed"
    assert f"hang {cases}" in r.stdout and why in r.stdout, r.stdout + r.stderr
