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

from dpro_kit.async_ps import StepOp, StepTemplate, link_model, predict, simulate, start_offsets
from dpro_kit.errors import DproError
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


def test_prediction_averages_over_evenly_spread_start_offsets():
    # the offsets of workers 2..W: a low-discrepancy set, no gap in [0, 1) wider than 2/n (d = 1), every
    # quarter of [0, 1)^2 hit (d = 2); the prediction is their mean, the same on every call
    one = sorted(x for (x,) in start_offsets(8, 1))
    assert all(0.0 <= x < 1.0 for x in one) and max(b - a for a, b in zip([one[-1] - 1] + one, one + [one[0] + 1])) < 2 / 8
    assert {(int(2 * x), int(2 * y)) for x, y in start_offsets(8, 2)} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    t = _tpl([StepOp("d", "down", 1 * MB), StepOp("u", "up", 1 * MB, [0])])
    a, b = (predict(t, [1, 2], seeds=4, bandwidth_mbit=80, steps=30, warmup=3) for _ in range(2))
    assert a == b and a[0].low <= a[1].low and a[1].low <= a[1].steps_per_s <= a[1].high


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


# --- sharing by arrival order (docs/async.md, "Link sharing") ----------------------------------------
def _ends(r, worker):
    return [t for t, w in r.finish_us if w == worker]


def test_newcomer_gets_its_share_of_a_busy_link():
    # 1 MB at 80 Mbit/s = 100 ms alone, then 50 ms of compute; worker 1 joins the link at 25 ms.
    t = _tpl([StepOp("d", "down", 1 * MB), StepOp("c", "worker", 50_000.0, [0])])
    kw = dict(bandwidth_mbit=80, steps=1, warmup=0, start_offsets_us=[0.0, 25_000.0])
    # phi = 0.2: worker 0 drains its last 750 KB at 0.8 of the link (93.75 ms, down ends at 118.75 ms),
    # worker 1 gets 0.2 x 93.75 ms = 187.5 KB meanwhile and its 812.5 KB left alone (81.25 ms): ends at 200 ms
    r = simulate(t, 2, sharing="arrival", newcomer_share=0.2, **kw)
    assert _ends(r, 0) == [pytest.approx(168_750.0)] and _ends(r, 1) == [pytest.approx(250_000.0)]
    # equal sharing: worker 0's 750 KB at 1/2 (150 ms, ends 175 ms); the link is busy until 200 ms either way
    r = simulate(t, 2, **kw)
    assert _ends(r, 0) == [pytest.approx(225_000.0)] and _ends(r, 1) == [pytest.approx(250_000.0)]
    # phi = 1/2 is equal sharing
    r = simulate(t, 2, sharing="arrival", newcomer_share=0.5, **kw)
    assert _ends(r, 0) == [pytest.approx(225_000.0)] and _ends(r, 1) == [pytest.approx(250_000.0)]
    # goodput 0.8 with two on the link: worker 0 at 0.8 x 0.8 = 0.64 (117.1875 ms), worker 1 gets
    # 0.16 x 117.1875 ms = 187.5 KB, then 812.5 KB alone at the full rate (81.25 ms)
    r = simulate(t, 2, sharing="arrival", newcomer_share=0.2, goodput=[1.0, 0.8], **kw)
    assert _ends(r, 0) == [pytest.approx(25_000 + 117_187.5 + 50_000)]
    assert _ends(r, 1) == [pytest.approx(25_000 + 117_187.5 + 81_250 + 50_000)]
    # per direction: an up-only phi does not touch the down link
    r = simulate(t, 2, sharing="arrival", newcomer_share={"down": 0.5, "up": 0.2}, **kw)
    assert _ends(r, 0) == [pytest.approx(225_000.0)]


def test_three_sessions_weights_by_arrival_rank():
    # phi = 1/3 -> ratio 1/2: weights 1, 1/2, 1/4 for sessions that joined at 0, 10, 20 ms
    t = _tpl([StepOp("d", "down", 1 * MB)])
    r = simulate(t, 3, bandwidth_mbit=80, steps=1, warmup=0, sharing="arrival", newcomer_share=1 / 3,
                 start_offsets_us=[0.0, 10_000.0, 20_000.0])
    # 0-10 ms: w0 alone, 100 KB (900 KB left). 10-20 ms: w0 2/3, w1 1/3: w0 66.67 KB (833.33 left), w1 33.33 KB.
    # from 20 ms: w0 4/7 of 10 B/us -> 833.33 KB in 145.83 ms -> ends at 165.83 ms
    assert _ends(r, 0) == [pytest.approx(20_000 + 833_333.333 / (10 * 4 / 7), rel=1e-6)]
    assert _ends(r, 2) == [pytest.approx(300_000.0)]        # the link is busy from 0 with 3 MB: the last ends at 300 ms


def test_fifo_like_sharing_drives_two_workers_into_interleaving():
    # transfers only (1 MB down, then 1 MB up, 100 ms each alone), worker 1 starts 10 ms after worker 0.
    t = _tpl([StepOp("d", "down", 1 * MB), StepOp("u", "up", 1 * MB, [0])])
    kw = dict(bandwidth_mbit=80, steps=200, warmup=20, start_offsets_us=[0.0, 10_000.0])
    # equal sharing keeps the 10 ms offset (the ends of two overlapping transfers stay 10 ms apart):
    # a period of 2 x (200 - 10) ms for 2 steps
    assert simulate(t, 2, **kw).steps_per_s == pytest.approx(2 / 0.380, rel=1e-6)
    # the newcomer's smaller share widens the gap every step until one's down overlaps the other's
    # up only: both links always busy, 10 steps/s (twice one worker's 5)
    assert simulate(t, 2, sharing="arrival", newcomer_share=0.2, **kw).steps_per_s == pytest.approx(10.0, rel=1e-3)


def test_a_run_of_n_steps_from_a_common_start():
    # ClusterCoordinator: N steps scheduled at once, taken by whichever worker is free; steps/s = N / makespan.
    # chain(): 100 ms down, 10 ms compute, 100 ms up at 80 Mbit/s.
    one = simulate(chain(), 1, bandwidth_mbit=80, steps=10, total_steps=5)
    assert one.steps_per_s == pytest.approx(5 / 1.050, rel=1e-9)
    # equal sharing, both start at 0: lockstep forever, 200 + 10 + 200 ms per pair of steps; 6 steps = 3 pairs
    eq = simulate(chain(), 2, bandwidth_mbit=80, steps=10, total_steps=6)
    assert eq.steps_per_s == pytest.approx(6 / 1.230, rel=1e-9)
    # first-come-first-served (phi = 0): the tie at 0 is broken at random, the loser downloads after the winner
    # (100 .. 200 ms); from then on one's down overlaps the other's up: the winner ends steps at 210, 420, 630 ms,
    # the other at 310, 520, 730 ms (6 steps in all)
    ff = simulate(chain(), 2, bandwidth_mbit=80, steps=10, total_steps=6, sharing="arrival", newcomer_share=0.0)
    assert sorted(t for t, _ in ff.finish_us) == pytest.approx([210e3, 310e3, 420e3, 520e3, 630e3, 730e3])
    assert ff.steps_per_s == pytest.approx(6 / 0.730, rel=1e-9)


def test_sharing_arguments_are_checked():
    with pytest.raises(ValueError, match="sharing"):
        simulate(chain(), 2, bandwidth_mbit=80, steps=10, sharing="tcp")
    with pytest.raises(ValueError, match="newcomer_share"):
        simulate(chain(), 2, bandwidth_mbit=80, steps=10, sharing="arrival", newcomer_share=1.5)
    with pytest.raises(ValueError, match="start_offsets_us"):
        simulate(chain(), 2, bandwidth_mbit=80, steps=10, start_offsets_us=[0.0])


def test_equal_window_rule_gives_every_flow_of_a_ps_the_same_rate():
    # docs/async.md, "the equal-window rule": with m = max(n_up, n_down) >= 2 transfers in one direction of
    # the PS's link, each of its transfers in either direction gets at most 1/m. 80 Mbit/s = 10 MB/s.
    for first, then in (("down", "up"), ("up", "down")):
        t = _tpl([StepOp("a", first, 1 * MB), StepOp("b", then, 1 * MB, [0])])
        # one step each, workers 0 and 1 at 0, worker 2 at 100 ms. Equal sharing: 0-100 ms two `first`
        # transfers at 1/2 (0.5 MB each); 100-250 three at 1/3 (workers 0, 1 end their 1 MB at 250, worker 2
        # has 0.5 MB); 250-300 workers 0, 1 `then` at 1/2 (0.25 MB each) while worker 2's `first` is alone
        # (ends 300); 300-525 three `then` at 1/3 (workers 0, 1 end at 525, worker 2 has 0.75 MB), then
        # worker 2 alone: 550 ms.
        eq = simulate(t, 3, bandwidth_mbit=80, steps=1, warmup=0, start_offsets_us=[0.0, 0.0, 100e3])
        assert sorted(x for x, _ in eq.finish_us) == pytest.approx([525e3, 525e3, 550e3])
        # the rule: 250-350 worker 2's lone `first` runs beside two `then` transfers, so at 1/2: its last
        # 0.5 MB ends at 350 (workers 0, 1 have 0.5 MB of `then` by then); 350-500 three `then` at 1/3
        # (workers 0, 1 end at 500, worker 2 has 0.5 MB); worker 2 alone: 550 ms.
        win = simulate(t, 3, bandwidth_mbit=80, steps=1, warmup=0, start_offsets_us=[0.0, 0.0, 100e3],
                       reverse_path="window")
        assert sorted(x for x, _ in win.finish_us) == pytest.approx([500e3, 500e3, 550e3])
    # two workers whose transfers never meet in one direction (down -> up, half a step apart): no change
    c = _tpl([StepOp("d", "down", 1 * MB), StepOp("u", "up", 1 * MB, [0])])
    a = simulate(c, 2, bandwidth_mbit=80, steps=20, warmup=4, start_offsets_us=[0.0, 100e3])
    b = simulate(c, 2, bandwidth_mbit=80, steps=20, warmup=4, start_offsets_us=[0.0, 100e3], reverse_path="window")
    assert b.steps_per_s == pytest.approx(a.steps_per_s, rel=1e-12) == pytest.approx(10.0, rel=1e-9)
    # two lockstep workers with an independent up and down each have two transfers in both directions:
    # 1/2 each with or without the rule (10 steps/s)
    t = _tpl([StepOp("u", "up", 1 * MB), StepOp("d", "down", 1 * MB)])
    both = simulate(t, 2, bandwidth_mbit=80, steps=20, warmup=4, start_offsets_us=[0.0, 0.0], reverse_path="window")
    assert both.steps_per_s == pytest.approx(10.0, rel=1e-9)
    # one worker has at most one transfer per direction: W = 1 (the calibration) never changes
    for tpl in (t, chain()):
        assert (simulate(tpl, 1, bandwidth_mbit=80, steps=20, warmup=4, reverse_path="window").steps_per_s
                == simulate(tpl, 1, bandwidth_mbit=80, steps=20, warmup=4).steps_per_s)
    with pytest.raises(ValueError, match="reverse_path"):
        simulate(t, 2, bandwidth_mbit=80, steps=10, reverse_path="tcp")


def _link_doc():
    t1 = {"down": 0.1, "up": 0.1}
    rows = {
        "alone down": [{"1": [0.0, 0.1]}], "alone up": [{"1": [0.0, 0.1]}],
        # f = 0.5: worker 1 ends at 0.05 + 0.05 / (1 - phi): phi = 0.2 -> 0.1125; phi = 0 -> 0.1
        "newcomer down 0.5": [{"1": [0.0, 0.1125], "2": [0.05, 0.2]}, {"1": [0.0, 0.1], "2": [0.05, 0.25]}],
        "newcomer up 0.5": [{"1": [0.0, 0.15], "2": [0.05, 0.2]}],
        "together down 3": [{"1": [0.0, 0.3], "2": [0.0, 0.3], "3": [0.0, 0.5]}],
        "together up 2": [{"1": [0.0, 0.2], "2": [0.0, 0.2]}],
    }
    return {"mb": 1.0, "results": {"100": {"t1": t1, "rows": rows}}}


def test_link_model_from_link_experiments(tmp_path: Path):
    m = link_model(_link_doc(), 100.5)
    assert m["newcomer_share"]["down"] == [pytest.approx(0.2), pytest.approx(0.0)]
    assert m["newcomer_share"]["up"] == [pytest.approx(0.5)]
    # k = 2 down: 2 x (2 x 0.1 s) ideal over 0.2 + 0.25 s busy; k = 3: 0.3 s over 0.5 s
    assert m["goodput"]["down"] == [1.0, pytest.approx(0.4 / 0.45), pytest.approx(0.6)]
    assert m["goodput"]["up"] == [1.0, pytest.approx(1.0)]
    with pytest.raises(DproError, match="no link experiments at 300"):
        link_model(_link_doc(), 300)
    with pytest.raises(DproError, match="link_sharing"):
        link_model({"mb": 1}, 100)
    # the CLI: --sharing arrival needs --link; a link file at another bandwidth is one line, exit 2
    f = tmp_path / "link.json"
    f.write_text(json.dumps(_link_doc()))
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(tmp_path), "--bandwidth", "100",
                        "--sharing", "arrival"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--link" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(tmp_path), "--bandwidth", "300",
                        "--sharing", "arrival", "--link", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "300" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(tmp_path), "--bandwidth", "100",
                        "--workers", "1-4", "--run-steps", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--run-steps 3" in r.stderr


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
    assert doc["trace_workers"] == 1 and doc["note"] is None and "note:" not in r.stderr
    # 3 dense layers of width 256: (256*256 + 256) * 2 + 256*10 + 10 floats + lr + step counter
    params = (256 * 256 + 256) * 2 + 256 * 10 + 10
    assert params * 4 <= doc["bytes_down_per_step"] <= params * 4 + 64
    ps = [p["steps_per_s"] for p in doc["predicted"]]
    assert len(ps) == 3 and all(p > 0 for p in ps) and ps[1] >= ps[0] * 0.99
    # the measured link's sharing (a hand-made link file at 100 Mbit/s): same W=1, one prediction per W
    link = tmp_path / "link.json"
    link.write_text(json.dumps(_link_doc()))
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "100",
                        "--workers", "1-3", "--sharing", "arrival", "--link", str(link), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc2 = json.loads(r.stdout)
    assert doc2["sharing"] == "arrival" and doc2["link"]["goodput"]["down"] == pytest.approx([1.0, 0.4 / 0.45, 0.6])
    assert doc2["predicted"][0]["steps_per_s"] == pytest.approx(ps[0], rel=1e-9)
    assert len(doc2["predicted"]) == 3 and all(p["steps_per_s"] > 0 for p in doc2["predicted"])
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "100",
                        "--workers", "1-2", "--sharing", "arrival", "--link", str(link), "--run-steps", "20",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc3 = json.loads(r.stdout)
    assert doc3["run_steps"] == 20 and all(p["steps_per_s"] > 0 for p in doc3["predicted"])
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(out), "--bandwidth", "100",
                        "--workers", "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--workers" in r.stderr


def test_cli_refuses_a_non_tf_trace(tiny_trace_dir: Path):
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(tiny_trace_dir), "--bandwidth",
                        "100"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "TensorFlow step trace" in r.stderr and str(tiny_trace_dir) in r.stderr


def test_link_sharing_bench_on_a_real_emulated_link(tmp_path: Path):
    """bench/link_sharing.py end to end on real namespaces (small transfers, 2 repetitions): its file is
    what link_model reads. No timing is asserted (the machine is shared), only what the file must hold."""
    from conftest import netns_unusable_reason
    reason = netns_unusable_reason("tlnk")
    if reason is not None:
        pytest.skip(str(reason))
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "link.json"
    r = subprocess.run([sys.executable, str(root / "bench/link_sharing.py"), "--bandwidths", "100", "--mb", "0.2",
                        "--reps", "2", "--max-k", "2", "--prefix", "tlnk", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    res = doc["results"]["100"]
    assert set(res["rows"]) >= {"alone down", "alone up", "newcomer down 0.5", "together up 2", "reverse"}
    assert all(len(rows) == 1 for rows in res["rows"].values())     # the first repetition is left out
    for rows in res["rows"].values():
        for row in rows:
            assert all(0 <= s < e for s, e in row.values())          # every transfer ended after it started
    m = link_model(doc, 100)
    assert len(m["newcomer_share"]["down"]) == 3 and all(0 <= x <= 0.95 for x in m["newcomer_share"]["up"])
    assert m["goodput"]["down"][0] == 1.0 and len(m["goodput"]["down"]) == 2
    assert all(0 < g <= 1 for g in m["goodput"]["up"])
    assert {"down", "up"} == set(res["ping"])
    # the reverse-path experiment alone (3 workers: two upload, one downloads)
    out2 = tmp_path / "rev.json"
    r = subprocess.run([sys.executable, str(root / "bench/link_sharing.py"), "--bandwidths", "100", "--mb", "0.2",
                        "--reps", "2", "--max-k", "3", "--only-reverse2", "--prefix", "tlnk", "--out", str(out2)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out2.read_text())["results"]["100"]["rows"]
    assert {k for k, v in rows.items() if v} == {"alone down", "alone up", "reverse2 0.25", "reverse2 0.5",
                                                 "reverse2u 0.25", "reverse2u 0.5"}
    assert all(0 <= row["1"][0] < row["1"][1] for n in rows if n.startswith("reverse2") for row in rows[n])


def test_template_from_a_real_mxnet_ps_trace():
    """examples/traces/mxnet-ps-mlp-async-3w1s-200mbit (a real dist_async job): per parameter an up op
    after the backward op that computes its gradient, the server's update, then the down op; the
    compute ops chained with each profiled step's durations.  At 1e6 Mbit/s (transfers ~0) one worker
    runs at 1 / (its mean compute per step)."""
    from dpro_kit.async_ps import template_from_trace
    from dpro_kit.trace import load_trace
    trace = Path(__file__).resolve().parents[1] / "examples/traces/mxnet-ps-mlp-async-3w1s-200mbit"
    ts = load_trace(trace)
    node = ts.manifest.workers()[0]
    tpl = template_from_trace(trace)
    params = {c.tensor: c.bytes for c in ts.collectives}
    assert tpl.variables == params and tpl.total_bytes("up") == tpl.total_bytes("down") == sum(params.values())
    ops = tpl.ops
    for i, o in enumerate(ops):
        if o.res == "up":
            gate = ops[o.deps[0]]
            assert gate.res == "worker" and ops[i + 1].res == "ps" and ops[i + 1].deps == [i]
            assert ops[i + 2].res == "down" and ops[i + 2].deps == [i + 1]
            c = next(c for c in ts.collectives if o.name.startswith(f"up:{c.tensor}:"))
            assert gate.name in c.inputs[node]
    worker = [i for i, o in enumerate(ops) if o.res == "worker"]
    assert all(ops[i].deps == ([worker[k - 1]] if k else []) for k, i in enumerate(worker))
    ev = ts.events[(ts.events["node"] == node) & ts.events["kind"].isin(["FW", "BW", "OTHER"])]
    assert len(tpl.samples) == ev["iteration"].nunique()
    per_step = ev.groupby("iteration")["dur"].sum()
    assert sorted(sum(r[i] for i in worker) for r in tpl.samples) == pytest.approx(sorted(per_step), rel=1e-9)
    # the 6 profiled steps' compute sums range 4.7-29 ms: the mean of 4 runs of 400 sampled steps
    rate = sum(simulate(tpl, 1, bandwidth_mbit=1e6, steps=400, seed=s).steps_per_s for s in range(4)) / 4
    assert rate == pytest.approx(1e6 / per_step.mean(), rel=0.05)


def test_cli_says_when_the_trace_has_several_workers():
    """The method wants one worker's steps run alone; a 3-worker dist_async trace is used (worker0's
    steps) with a note on stderr that names the trace, the worker and what to do, and in --json."""
    trace = Path(__file__).resolve().parents[1] / "examples/traces/mxnet-ps-mlp-async-3w1s-200mbit"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(trace), "--bandwidth", "200",
                        "--workers", "1-2", "--seeds", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["trace_workers"] == 3 and doc["worker"] == "host3/worker0"
    note = [ln for ln in r.stderr.splitlines() if "note:" in ln]
    assert len(note) == 1 and str(trace) in note[0] and "has 3 workers" in note[0] and "host3/worker0" in note[0]
    assert "profile a 1-worker job" in note[0] and doc["note"] in note[0]


def test_cli_reverse_path_window():
    """`--reverse-path window` (the equal-window rule) on the kept MXNet trace: named in --json, W = 1 (one
    transfer per direction) unchanged; an unknown value is refused by the option parser (exit 2)."""
    trace = Path(__file__).resolve().parents[1] / "examples/traces/mxnet-ps-mlp-async-3w1s-200mbit"
    docs = {}
    for rp in ("none", "window"):
        r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(trace), "--bandwidth", "200",
                            "--workers", "1-2", "--seeds", "2", "--reverse-path", rp, "--json"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        docs[rp] = json.loads(r.stdout)
    assert docs["window"]["reverse_path"] == "window" and docs["none"]["reverse_path"] == "none"
    assert docs["window"]["predicted"][0]["steps_per_s"] == pytest.approx(docs["none"]["predicted"][0]["steps_per_s"])
    assert all(p["steps_per_s"] > 0 for p in docs["window"]["predicted"])
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "async-predict", str(trace), "--bandwidth", "200",
                        "--reverse-path", "fair"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--reverse-path" in r.stderr


def test_reverse_tcpinfo_bench_on_a_real_emulated_link(tmp_path: Path):
    """bench/reverse_tcpinfo.py end to end (tiny transfers, 2 repetitions): every sender's TCP_INFO samples
    are written; no timing is asserted."""
    from conftest import netns_unusable_reason
    reason = netns_unusable_reason("trti")
    if reason is not None:
        pytest.skip(str(reason))
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "rt.json"
    r = subprocess.run([sys.executable, str(root / "bench/reverse_tcpinfo.py"), "100", "0.2", "0.25", "2", str(out),
                        "5", "trti"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [len(doc[h]["recs"]) for h in ("1", "2", "3")] == [2, 2, 2] and len(doc["1"]["srv"]) == 2
    assert [op for op, *_ in doc["1"]["recs"]] == ["down", "down"] and doc["2"]["recs"][0][0] == "up"
    # samples: [time, srtt us, cwnd bytes, pacing Mbit/s, bytes acked, min rtt us, delivery Mbit/s, in flight bytes]
    assert all(len(s) == 8 and s[2] > 0 for s in doc["1"]["srv"][1] + doc["2"]["recs"][1][3])
    assert "rep 1: download" in r.stdout


def test_phasing_of_two_workers_from_step_times():
    """bench/async_tf.py's W = 2 phasing on hand-made step times: worker A starts every 100 ms, B 30 ms after it
    (then, from the fourth step, 50 ms after it); gradients 40 ms after each start."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import async_tf
    a = [0.0, 0.1, 0.2, 0.3, 0.4]
    b = [0.03, 0.13, 0.23, 0.35]
    steps = [[s, s + 0.04] for s in b + a]      # any order
    seqs = async_tf.worker_steps(steps, 2)
    assert [[s for s, _ in q] for q in seqs] == [a, b]
    ph = async_tf.phasing(steps)
    assert ph["phase"] == pytest.approx([0.3, 0.3, 0.3, 0.5])
    assert ph["distance"] == pytest.approx([0.3, 0.3, 0.3, 0.5])
    assert ph["period_ms"] == pytest.approx(100.0) and ph["download_ms"] == pytest.approx(40.0)
    # the steady part: one worker starting every 100 ms, then a 50 ms pause before its last 2 steps; the first
    # 4 starts (4 W) left out, the rest 0.4, 0.5, 0.65, 0.75 s: (n - 1) / span = 3 / 0.35 steps/s
    one = [[0.1 * i, 0.1 * i + 0.04] for i in range(6)] + [[0.65, 0.69], [0.75, 0.79]]
    assert async_tf.steady_rate(one, 1) == pytest.approx(3 / 0.35)
    assert async_tf.steady_rate(one[:4], 1) != async_tf.steady_rate(one[:4], 1)     # nothing left: nan
