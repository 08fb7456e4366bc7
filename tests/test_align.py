"""Trace time alignment (dpro_kit.align, `dpro align`): synthetic cases with known offsets and a real run.

Synthetic fine-grained jobs come from ``bench/align_speed.py`` (ring AllReduce with per-chunk
SEND/RECV events and known per-machine clock offsets).  The real case profiles a 2-host gloo
job in the emulated cluster (root only) and injects offsets through the trace model.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import align_speed  # noqa: E402
from dpro_kit.align import (align, align_cached, aligned_traceset, apply_offsets, cache_dir, load_cached, offsets_path,  # noqa: E402
                            shift_trace, shift_trace_dir)
from dpro_kit.errors import DproError  # noqa: E402
from dpro_kit.trace import Manifest, NodeInfo, TraceSet, load_trace, make_events, save_trace  # noqa: E402

from conftest import netns_unusable_reason, tiny_traceset  # noqa: E402


def _errs(res, truth):
    return np.array([res.offsets_us[n] - truth[n] for n in truth])


@pytest.mark.parametrize("nodes,per_host", [(4, 2), (6, 1), (8, 2)])
def test_exact_recovery_fine_grained(nodes, per_host):
    ts, truth = align_speed.synthetic_fine_trace(nodes, ranks_per_host=per_host, iterations=10, noise=0.0, seed=3)
    res = align(ts)
    assert res.mode == "fine" and res.solver == "CLARABEL"
    assert np.max(np.abs(_errs(res, truth))) < 0.05
    assert res.violated == []
    assert max(abs(v) for v in truth.values()) > 500   # the offsets were not trivially 0


def test_recovery_with_noise_is_close():
    ts, truth = align_speed.synthetic_fine_trace(16, noise=0.02, seed=1)
    res = align(ts)
    assert np.median(np.abs(_errs(res, truth))) < 20


def _manual(records, nodes):
    man = Manifest(job="t", framework="synthetic", comm_backend="ring", world_size=len(nodes),
                   nodes={n: NodeInfo(host=h, rank=i) for i, (n, h) in enumerate(nodes.items())}, iterations=[0, 1])
    ev = make_events(records)
    ev["host"] = ev["node"].map(lambda n: nodes[n])
    return TraceSet(manifest=man, events=ev, edges={n: [] for n in nodes}, collectives=[])


def _xfer(src, dst, it, send_start, recv_start, recv_end, nbytes=1000, tag="t"):
    txn = f"{tag}:p:0:0:{src}->{dst}"
    return [{"node": src, "op": f"SEND {txn}", "kind": "SEND", "iteration": it, "start": send_start, "dur": 1.0,
             "txn": txn, "bytes": nbytes, "tensor": tag, "peer": dst},
            {"node": dst, "op": f"RECV {txn}", "kind": "RECV", "iteration": it, "start": recv_start,
             "dur": recv_end - recv_start, "txn": txn, "bytes": nbytes, "tensor": tag, "peer": src}]


def test_same_machine_term():
    # a and b share machine m0, c is on m1; only a <-> c communicate: b's offset comes from the machine term
    th = {"a": 0.0, "b": 0.0, "c": 700.0}
    recs = []
    for it in range(2):
        t = 10_000.0 * it
        recs += _xfer("a", "c", it, t + th["a"], t - 50 + th["c"], t + 100 + th["c"], tag=f"x{it}")
        recs += _xfer("c", "a", it, t + 200 + th["c"], t + 150 + th["a"], t + 300 + th["a"], tag=f"y{it}")
    ts = _manual(recs, {"a": "m0", "b": "m0", "c": "m1"})
    res = align(ts)
    assert abs(res.offsets_us["c"] - 700.0) < 0.01
    assert abs(res.offsets_us["b"] - res.offsets_us["a"]) < 0.01
    assert res.undetermined == []
    res0 = align(ts, beta=0.0)                 # without the term b is not tied to anything
    assert "b" not in res0.undetermined         # (still connected through the machine in the report)
    ts_split = _manual(recs, {"a": "m0", "b": "m2", "c": "m1"})
    assert align(ts_split).undetermined == ["b"]


def test_same_machine_term_pulls_noisy_estimates_together():
    ts, truth = align_speed.synthetic_fine_trace(8, ranks_per_host=2, noise=0.05, node_jitter_us=0.0, seed=4)
    tight = align(ts, beta=1e4).residuals["machine_spread_us"]
    loose = align(ts, beta=0.0).residuals["machine_spread_us"]
    assert max(tight.values()) < max(loose.values())
    assert max(tight.values()) < 1.0


def test_recv_clipping():
    # RECVs are posted long before their SEND starts: their raw durations are mostly waiting.
    th_c = -1234.0
    recs = []
    for it in range(3):
        t = 10_000.0 * it
        wait = [3000.0, 500.0, 1500.0][it]       # how early the RECV was posted
        recs += _xfer("a", "c", it, t, t - wait + th_c, t + 400 + th_c, tag=f"x{it}")
        recs += _xfer("c", "a", it, t + 1000 + th_c, t + 1000 - wait, t + 1400, tag=f"y{it}")
    ts = _manual(recs, {"a": "m0", "c": "m1"})
    res = align(ts)
    assert abs(res.offsets_us["c"] - th_c) < 0.01
    fam = res.residuals["family_std_us"]
    assert all(v["after"] < 1e-3 for v in fam.values())       # clipped durations all 400 us
    out = apply_offsets(ts, res.offsets_us)
    recv = out.events[out.events["kind"] == "RECV"]
    assert np.allclose(recv["dur"].to_numpy(float), 400.0)    # transfer time, not waiting time
    raw = ts.events[ts.events["kind"] == "RECV"]
    assert raw["dur"].max() > 3000


def test_infeasible_names_ops_and_nodes():
    recs = (_xfer("a", "c", 0, 500.0, 0.0, 100.0, tag="x")      # c's RECV ends 400 us before a's SEND starts ...
            + _xfer("c", "a", 0, 500.0, 0.0, 100.0, tag="y"))   # ... and a's RECV 400 us before c's SEND
    ts = _manual(recs, {"a": "m0", "c": "m1"})
    with pytest.raises(DproError) as ei:
        align(ts)
    msg = str(ei.value)
    assert "contradictory cross-node dependencies" in msg
    assert "RECV x:p:0:0:a->c" in msg and "SEND y:p:0:0:c->a" in msg
    assert "'a'" in msg and "'c'" in msg and "800.0 us" in msg


def test_single_node_and_single_machine_skip(tmp_path):
    ts = tiny_traceset(workers=1)
    res = align(ts)
    assert res.mode == "skipped" and "single-node" in res.skipped and res.offsets_us == {"w0": 0.0}
    ts2 = tiny_traceset(workers=2, hosts=1)
    res2 = align(ts2)
    assert res2.mode == "skipped" and "share its clock" in res2.skipped
    assert aligned_traceset(ts2, tmp_path) is ts2


def test_no_communication_is_an_error():
    recs = [{"node": n, "op": "fw", "kind": "FW", "iteration": 0, "start": 0.0, "dur": 1.0} for n in ("a", "c")]
    with pytest.raises(DproError, match="never communicate"):
        align(_manual(recs, {"a": "m0", "c": "m1"}))


def test_coarse_collectives_are_shift_equivariant():
    ts = tiny_traceset(workers=4, hosts=2, iterations=4)
    shifts = {"w0": 0.0, "w1": 2500.0, "w2": 0.0, "w3": 2500.0}    # hosts h0 = {w0, w2}, h1 = {w1, w3}
    a = align(ts)
    b = align(shift_trace(ts, shifts))
    assert a.mode == "coarse"
    for n in shifts:
        assert abs((b.offsets_us[n] - a.offsets_us[n]) - shifts[n]) < 0.5


def _probe_rows(theta_us: float, up_us: list[float], down_us: list[float], turn_us: float = 3.0):
    """Hand-made probe readings (ns): rank 0 on the true clock, the peer's clock ahead by theta;
    ping i takes up_us[i] to the peer and down_us[i] back."""
    client, server, t = [], [], 1_700_000_000_000_000_000
    for up, down in zip(up_us, down_us):
        t1 = t
        t2 = t1 + round((up + theta_us) * 1e3)        # arrival, read on the peer's clock
        t3 = t2 + round(turn_us * 1e3)
        t4 = t1 + round((up + turn_us + down) * 1e3)
        client.append([t1, t4])
        server.append([t2, t3])
        t += 1_000_000
    return client, server


def test_clock_probe_hand_computed():
    """Per ping t3 - t4 <= theta <= t2 - t1, i.e. [theta - down_i, theta + up_i].  Offset 1000 us,
    pings (up, down) us = (999, 999) skipped, (40, 60), (30, 30), (100, 20), (50, 50):
    lo = 1000 - min(down) = 980, hi = 1000 + min(up) = 1030; round trips 100, 60, 120, 100; the
    fastest quarter (at least 3: 60, 100, 100) has midpoints 1000, 990, 1000 -> median 1000."""
    from dataclasses import replace

    from dpro_kit.align import probe_offsets, shift_probe_readings
    ts = tiny_traceset(workers=2, hosts=2, iterations=3)
    a, b = ts.nodes()
    c, s = _probe_rows(1000.0, [999, 40, 30, 100, 50], [999, 60, 30, 20, 50])
    probes = {a: {"role": "client", "skip": 1, "peers": {b: c}}, b: {"role": "server", "peer": a, "rows": s}}
    ts2 = replace(ts, manifest=replace(ts.manifest, extra={**ts.manifest.extra, "clock_probe": probes}))
    p = probe_offsets(ts2)[b]
    assert p["lo_us"] == pytest.approx(1000 - 20) and p["hi_us"] == pytest.approx(1000 + 30)
    assert p["estimate_us"] == pytest.approx(1000.0) and p["rtt_min_us"] == pytest.approx(60.0)
    assert p["pings"] == 4 and p["consistent"]
    # a collective-level trace: the probe pins the offset (error bound = the proven half-width, 30 us)
    res = align(ts2)
    assert res.mode == "coarse+probe" and res.undetermined == []
    assert res.offsets_us[b] == pytest.approx(1000.0) and res.uncertainty_us[b] == pytest.approx(30.0)
    assert res.bounds_us[b] == pytest.approx([980.0, 1030.0])
    # the clock of b's host moved by +2 ms: every reading of b moves, the answer moves by 2 ms
    sh = replace(ts2, manifest=replace(ts2.manifest, extra={**ts2.manifest.extra, "clock_probe":
                                                           shift_probe_readings(probes, {b: 2000.0})}))
    assert probe_offsets(sh)[b]["estimate_us"] == pytest.approx(3000.0)


def test_cache_outside_the_trace_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DPRO_CACHE", str(tmp_path / "cache"))
    ts, truth = align_speed.synthetic_fine_trace(4, noise=0.0, seed=2)
    d = tmp_path / "trace"
    save_trace(ts, d)
    before = {p: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}
    loaded = load_trace(d)
    al = aligned_traceset(loaded, d)
    p = offsets_path(d)
    assert p.exists() and p.parent == cache_dir() and d not in p.parents   # cached outside the trace folder
    assert {q: q.stat().st_mtime_ns for q in d.rglob("*") if q.is_file()} == before   # trace folder untouched
    m = p.stat().st_mtime_ns
    res = align_cached(load_trace(d), d)                                  # cache hit: not rewritten
    assert p.stat().st_mtime_ns == m
    assert abs(res.offsets_us["h1/2"] - truth["h1/2"]) < 0.05
    ev = al.events
    assert ev["start"].min() < loaded.events["start"].max()


def test_cli_align_json(tmp_path):
    import json

    import click
    from click.testing import CliRunner

    from dpro_kit.cli.align import align as align_cmd
    ts, truth = align_speed.synthetic_fine_trace(4, noise=0.0, seed=5)
    d = tmp_path / "t"
    save_trace(ts, d)
    files = sorted(d.rglob("*"))
    r = CliRunner().invoke(align_cmd, [str(d), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out["offsets_us"]) == set(truth)
    assert all(abs(out["offsets_us"][n] - truth[n]) < 0.05 for n in truth)
    assert out["solve_time_s"] >= 0 and "binding" in out and "violated" in out and out["written"]
    assert isinstance(align_cmd, click.Command)
    # cached outside the trace folder, and found there by the other commands
    assert sorted(d.rglob("*")) == files and Path(out["written"]).parent == cache_dir()
    assert load_cached(load_trace(d), d).offsets_us == out["offsets_us"]


# --------------------------------------------------------------------------- recorded collective-level traces

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"


def _two_host_copy(dst):
    """The real 2-rank gloo recording with rank 1 declared on a second machine: both ranks still
    share one kernel clock, so the true offset is 0 (a collective-level trace, no --ring)."""
    import json
    import shutil
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("aligned"))
    man = json.loads((dst / "manifest.json").read_text())
    man["nodes"]["host0/1"]["host"] = "host1"
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def test_comm_spans_recover_the_gloo_ranges_from_the_readers_shares():
    """The torch-kineto reader stores overlapping collectives' shares, not spans; comm_spans inverts
    that exactly: compared with the raw gloo:all_reduce ranges of the recorded Kineto files."""
    import json

    from dpro_kit.align import comm_spans
    ts = load_trace(EXAMPLE)
    spans = comm_spans(ts)
    for node in ts.nodes():
        doc = json.loads((EXAMPLE / ts.manifest.nodes[node].dir / "kineto_trace.json").read_text())
        base = int(doc["baseTimeNanoseconds"])
        raw = sorted(((round(float(e["ts"]) * 1000) + base) / 1e3, round(float(e["dur"]) * 1000) / 1e3)
                     for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce")
        mine = spans[spans["node"] == node].sort_values("start")
        shift = float(np.median([s - r0 for s in mine["start"] for r0, _ in raw if abs(s - r0) < 1e5][:1] or [0.0]))
        by_start = {round(s + shift, 1): d for s, d in raw}
        got = [(round(s, 1), e - s) for s, e in zip(mine["start"], mine["end"])]
        matched = [(d, by_start[s]) for s, d in got if s in by_start]
        assert len(matched) == len(got) >= 12
        assert max(abs(a - b) for a, b in matched) < 1.0   # epoch us as float64 step by 0.25 us
        assert (mine["dur"].to_numpy() < mine["end"].to_numpy() - mine["start"].to_numpy() - 1).any()


def test_recorded_collective_trace_true_zero_and_raw_shift(tmp_path):
    """Real CVXPY solves on the recorded trace: the estimate is within its stated uncertainty of
    the true 0, the proven interval holds 0, and moving host1's clock by -5 ms in the raw files
    moves estimate and interval by exactly that; an undetermined offset is applied as the point
    of the interval nearest to 0."""
    sys.path.insert(0, str(BENCH))
    import align_accuracy
    d = _two_host_copy(tmp_path / "t")
    res = align(load_trace(d))
    assert res.mode == "coarse" and res.violated == []
    est, unc = res.estimate_us["host0/1"], res.uncertainty_us["host0/1"]
    lo, hi = res.bounds_us["host0/1"]
    assert abs(est) <= unc and lo <= 0.0 <= hi and hi - lo < 2000
    sh = align(load_trace(align_accuracy.shift_raw_trace(d, tmp_path / "s", {"host1": -5000.0})))
    assert sh.estimate_us["host0/1"] == pytest.approx(est - 5000.0, abs=1.0)
    assert sh.bounds_us["host0/1"] == pytest.approx([lo - 5000.0, hi - 5000.0], abs=1.0)
    # 12 collectives of a loaded 2-core box cannot pin the offset to 100 us: undetermined
    assert res.undetermined == sh.undetermined == ["host0/1"] and unc > 100
    assert res.offsets_us["host0/1"] == 0.0                           # the clock as recorded
    assert sh.offsets_us["host0/1"] == pytest.approx(hi - 5000.0, abs=1.0)   # moved only as far as proven
    loose = align(load_trace(d), undetermined_us=1e4)                 # a looser tolerance: a number
    assert loose.undetermined == [] and loose.offsets_us["host0/1"] == pytest.approx(est)


def test_cli_reports_undetermined_with_its_interval(tmp_path):
    import json

    from click.testing import CliRunner

    from dpro_kit.cli.align import align as align_cmd
    d = _two_host_copy(tmp_path / "t")
    r = CliRunner().invoke(align_cmd, [str(d)])
    assert r.exit_code == 0, r.output
    assert "UNDETERMINED" in r.output and "host0/1: offset in [" in r.output
    r = CliRunner().invoke(align_cmd, [str(d), "--json", "--no-write"])
    out = json.loads(r.output)
    assert out["undetermined"] == ["host0/1"] and len(out["bounds_us"]["host0/1"]) == 2
    assert out["uncertainty_us"]["host0/1"] > 100 and "host0/1" in out["estimate_us"]


def test_report_shows_undetermined_not_a_number(tmp_path):
    from dpro_kit.report.data import alignment
    d = _two_host_copy(tmp_path / "t")
    ts = load_trace(d)
    res = align(ts)
    al = alignment(ts, d, res)
    assert al["available"] and al["undetermined"] == ["host0/1"] and al["offsets_us"]["host0/1"] == 0.0
    from dpro_kit.report.html import _undetermined_cell
    assert _undetermined_cell(al["bounds_us"]["host0/1"]).startswith("UNDETERMINED, in [-")


# --------------------------------------------------------------------------- a real 2-host run

_NETNS = netns_unusable_reason()


@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
def test_real_two_host_run_with_injected_offsets(tmp_path):
    """A real 2-host gloo job (collectives only, no --ring) on one kernel clock (true offset 0),
    then host1's clock moved by 4.8 ms in its RAW files (Kineto base time and meta.json)."""
    import align_accuracy
    trace = tmp_path / "job"
    align_accuracy.run_job(trace, hosts=2, per_host=1, rate=None, bucket_mb=1, iters=12, timeout=120, after=3)
    ts = load_trace(trace)
    base = align(ts)
    ref, other = ts.nodes()
    dst = align_accuracy.shift_raw_trace(trace, tmp_path / "shifted", {"host1": 4800.0})
    loaded = load_trace(dst)
    res = align(loaded)
    # dpro profile's clock probe (ping-pong with rank 0 when the window opened) is in the trace
    assert base.mode == res.mode == "coarse+probe" and set(res.probe_us) == {other}
    # the estimate follows the clock exactly, and carries no millisecond bias (issue 11: 6.3 ms)
    assert abs((res.estimate_us[other] - base.estimate_us[other]) - 4800.0) < 1.0
    err = res.estimate_us[other] - 4800.0
    p = res.probe_us[other]
    print(f"real 2-host gloo run: estimate error {err:.1f} us, +-{res.uncertainty_us[other]:.1f} us, "
          f"undetermined {res.undetermined}, proven {res.bounds_us[other]}; probe fastest round trip "
          f"{p['rtt_min_us']:.0f} us")
    lo, hi = res.bounds_us[other]
    assert lo <= 4800.0 <= hi                                   # the proven interval holds the truth
    assert abs(err) <= res.uncertainty_us[other] + 1.0          # the probe's bound is proven, not statistical
    assert hi - lo <= p["rtt_min_us"] + 1.0                     # no wider than the fastest round trip
    if other in res.undetermined:   # applied: the point of the interval nearest to 0, not the estimate
        assert res.offsets_us[other] == pytest.approx(min(max(0.0, lo), hi))
    # without the probe: the collectives alone (what plain torch.profiler input has)
    sys.path.insert(0, str(BENCH))
    from align_accuracy import without_probe
    nop = align(without_probe(loaded))
    assert nop.mode == "coarse" and nop.probe_us == {}
    assert nop.bounds_us[other][0] <= 4800.0 <= nop.bounds_us[other][1]
    print(f"  collectives only: estimate error {nop.estimate_us[other] - 4800.0:.1f} us, "
          f"+-{nop.uncertainty_us[other]:.1f} us, proven {nop.bounds_us[other]}")


@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
def test_real_two_host_ring_run_recovers_offsets_to_microseconds(tmp_path):
    """Per-chunk SEND/RECV times from `dpro profile --ring` (2 hosts x 2 ranks, the same-machine
    term at work): injected offsets come back within issue 11's 100 us (typically < 10 us)."""
    import align_accuracy
    trace = tmp_path / "job"
    align_accuracy.run_job(trace, hosts=2, per_host=2, rate=None, bucket_mb=1, iters=12, timeout=180, ring=True,
                           after=3)
    ts = load_trace(trace)
    assert {"SEND", "RECV"} <= set(ts.events["kind"].astype(str))
    shifts = {n: (2300.0 if ts.manifest.nodes[n].host == "host1" else -4100.0) for n in ts.nodes()}
    dst = tmp_path / "shifted"
    shift_trace_dir(trace, dst, shifts)
    res = align(load_trace(dst))
    assert res.mode == "fine+probe" and res.statistic == "min"   # per-chunk estimate, the probe bounds it
    ref = ts.nodes()[0]
    errs = {n: res.offsets_us[n] - (shifts[n] - shifts[ref]) for n in ts.nodes() if n != ref}
    print("real 2x2 ring run, errors (us):", {n: round(e, 1) for n, e in errs.items()})
    # issue 11's target, median <= 100 us (on a quiet machine < 10 us, docs/alignment.md; a CI run
    # under load 7 on the 2 cores gave 62 us)
    assert np.median(np.abs(list(errs.values()))) <= 100.0
