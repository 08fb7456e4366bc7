"""Horovod (patches/horovod, built by `make test`): real 2-rank Horovod + PyTorch jobs on gloo.

These tests need the patched Horovod wheel (``patches/horovod/build.sh``). Without it they skip
and say why; in CI (``CI=true``) a missing build is a failure unless ``DPRO_HOROVOD_BUILD=0``
asked for no build.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "horovod" / "train.py"


def _need_horovod() -> None:
    r = subprocess.run([sys.executable, "-c", "import horovod.torch as h; assert h.gloo_built()"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return
    why = ("patched Horovod not installed (run `bash patches/horovod/build.sh .venv/bin/python` "
           "or `make test`): " + (r.stderr.strip().splitlines() or ["?"])[-1])
    if os.environ.get("CI") == "true" and os.environ.get("DPRO_HOROVOD_BUILD", "1") != "0":
        pytest.fail(why)
    pytest.skip(why)


def horovodrun(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``horovodrun -np 2 -H localhost:2 --gloo python examples/horovod/train.py ARGS`` (fails the test on error)."""
    _need_horovod()
    hvdrun = str(Path(sys.executable).with_name("horovodrun"))
    cmd = [hvdrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(TRAIN), "--quiet", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r


@pytest.mark.slow
def test_patched_horovod_writes_a_timeline_per_rank(tmp_path):
    """The patch's ``%r``: both ranks write a timeline; every gradient is allreduced on both, by gloo."""
    horovodrun("--iters", "4", "--warmup", "1", env={"HOROVOD_TIMELINE": str(tmp_path / "tl.%r.json")})
    names = {}
    for r in (0, 1):
        doc = json.loads((tmp_path / f"tl.{r}.json").read_text())
        start = [e for e in doc if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})]
        assert start and start[0]["args"]["start_time_since_epoch_in_micros"] > 1.6e15   # Unix µs
        tensor_of = {e["pid"]: e["args"]["name"] for e in doc if e.get("ph") == "M" and "name" in e.get("args", {})}
        names[r] = {tensor_of[e["pid"]] for e in doc if e.get("name") == "GLOO_ALLREDUCE"}
    # examples/ddp's MLP: 4 Linear layers (weight + bias); Horovod names them allreduce.<param>
    expected = {f"allreduce.{p}" for p in
                ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "body.2.weight",
                 "body.2.bias", "head.weight", "head.bias"]}
    assert names[0] == names[1] == expected
