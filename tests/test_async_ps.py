"""dpro_kit.async_ps: the discrete-event simulation of asynchronous PS training (seed 004, Alg. 3.1).

Hand-built step DAGs whose throughput follows from the model's rules by arithmetic, plus the
template built from a real dpro_tf trace (tests/test_tf_collector.py's job) and the CLI.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.async_ps import StepOp, StepTemplate, simulate
from dpro_kit.cli.async_predict import parse_range, saturation

MB = 1e6


def _tpl(ops):
    return StepTemplate(ops=ops, samples=[[o.work for o in ops]])


def chain(down=1 * MB, comp=10_000.0, up=1 * MB):
    return _tpl([StepOp("d", "down", down), StepOp("c", "worker", comp, [0]), StepOp("u", "up", up, [1]),
                 StepOp("a", "ps", 0.0, [2])])


def test_one_worker_is_the_sum_of_its_chain():
    # 1 MB at 80 Mbit/s = 100 ms each way, + 10 ms compute = 210 ms per step
    r = simulate(chain(), 1, bandwidth_mbit=80, steps=50, warmup=5)
    assert r.steps_per_s == pytest.approx(1e3 / 210, rel=1e-6)


def test_lockstep_workers_share_the_link_equally():
    # transfers only, two workers started together: every transfer shares the link 1/2 forever
    t = _tpl([StepOp("d", "down", 1 * MB), StepOp("u", "up", 1 * MB, [0])])
    one = simulate(t, 1, bandwidth_mbit=80, steps=40, warmup=4).steps_per_s
    two = simulate(t, 2, bandwidth_mbit=80, steps=40, warmup=4).steps_per_s
    assert two == pytest.approx(one, rel=1e-6)      # 2 workers x half speed


def test_interleaved_workers_overlap_down_and_up():
    # second worker starts half a step later: down of one overlaps up of the other, no sharing
    t = _tpl([StepOp("d", "down", 1 * MB), StepOp("u", "up", 1 * MB, [0])])
    one = simulate(t, 1, bandwidth_mbit=80, steps=40, warmup=4).steps_per_s
    two = simulate(t, 2, bandwidth_mbit=80, steps=40, warmup=4, start_spread_us=1e-9).steps_per_s
    assert one < two <= 2 * one + 1e-9


def test_http2_window_serves_a_large_stream_in_two_chunks():
    # Fig. 12: with WIN smaller than A, A is preempted once after WIN bytes and B (small) goes first
    # to completion; compute c waits for B only, so it ends earlier than with FIFO streams.
    ops = [StepOp("A", "down", 3 * MB), StepOp("B", "down", 1 * MB), StepOp("c", "worker", 0.0, [1]),
           StepOp("e", "worker", 0.0, [0, 2])]
    t = _tpl(ops)
    whole = simulate(t, 1, bandwidth_mbit=80, steps=20, warmup=2, win_bytes=100 * MB).steps_per_s
    split = simulate(t, 1, bandwidth_mbit=80, steps=20, warmup=2, win_bytes=1 * MB).steps_per_s
    assert whole == pytest.approx(split, rel=1e-6)   # same bytes on the link: same step time
    assert whole == pytest.approx(1e3 / 400, rel=1e-6)


def test_parsing_overhead_and_step_overhead_add_up():
    r = simulate(chain(), 1, bandwidth_mbit=80, steps=30, warmup=3, alpha_us_per_mb=1000.0, beta_us=500.0,
                 step_overhead_us=2000.0)
    # 210 ms + 2 x (1 ms + 0.5 ms) parsing + 2 ms per step
    assert r.steps_per_s == pytest.approx(1e3 / 215, rel=1e-6)


def test_two_ps_split_the_bytes():
    one = _tpl([StepOp("d", "down", 2 * MB, ps=0), StepOp("u", "up", 2 * MB, [0], ps=0)])
    two = _tpl([StepOp("d0", "down", 1 * MB, ps=0), StepOp("d1", "down", 1 * MB, ps=1),
                StepOp("u0", "up", 1 * MB, [0, 1], ps=0), StepOp("u1", "up", 1 * MB, [0, 1], ps=1)])
    a = simulate(one, 2, bandwidth_mbit=80, steps=30, warmup=3).steps_per_s
    b = simulate(two, 2, bandwidth_mbit=80, steps=30, warmup=3, num_ps=2).steps_per_s
    # 2 workers in lockstep: 1 PS gives each 1/2 of one link; 2 PS give each 1/2 of both links, which
    # is 1/2 + 1/2 = all of the worker's own NIC (the section-5 cap 1 - 1/n is not binding): twice as fast
    assert b == pytest.approx(2 * a, rel=1e-6)
    # one worker alone: a worker's NIC caps the sum over PS links, so 2 PS give nothing more
    a1 = simulate(one, 1, bandwidth_mbit=80, steps=30, warmup=3).steps_per_s
    b1 = simulate(two, 1, bandwidth_mbit=80, steps=30, warmup=3, num_ps=2).steps_per_s
    assert b1 == pytest.approx(a1, rel=1e-6)


def test_parse_range_and_saturation():
    assert parse_range("1-4") == [1, 2, 3, 4] and parse_range("1,3,8") == [1, 3, 8]
    assert saturation([(1, 1.0), (2, 1.9), (3, 1.95), (4, 2.01)]) == 2
    assert saturation([(1, 1.0), (2, 2.0)]) is None


def test_cli_on_a_real_trace(tmp_path: Path):
    pytest.importorskip("tensorflow")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--steps",
                        "5:8", "--out", str(out), "--", sys.executable, str(root / "examples/tf/train.py"),
                        "--steps", "10", "--width", "256"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "100",
                        "--workers", "1-3", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    # 3 dense layers of width 256: (256*256 + 256) * 2 + 256*10 + 10 floats + lr + step counter
    params = (256 * 256 + 256) * 2 + 256 * 10 + 10
    assert params * 4 <= doc["bytes_down_per_step"] <= params * 4 + 64
    ps = [p["steps_per_s"] for p in doc["predicted"]]
    assert len(ps) == 3 and all(p > 0 for p in ps) and ps[1] >= ps[0] * 0.99
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "100",
                        "--workers", "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--workers" in r.stderr


def test_cli_refuses_a_non_tf_trace(tiny_trace_dir: Path):
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(tiny_trace_dir), "--bandwidth",
                        "100"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "TensorFlow step trace" in r.stderr and str(tiny_trace_dir) in r.stderr
