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
from dpro_kit.align import (align, align_cached, aligned_traceset, apply_offsets, offsets_path,  # noqa: E402
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


def test_cache_next_to_raw_traces(tmp_path):
    ts, truth = align_speed.synthetic_fine_trace(4, noise=0.0, seed=2)
    d = tmp_path / "trace"
    save_trace(ts, d)
    before = {p: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}
    loaded = load_trace(d)
    al = aligned_traceset(loaded, d)
    p = offsets_path(d)
    assert p.exists() and p.parent.name == "aligned"
    assert {q: q.stat().st_mtime_ns for q in before} == before          # raw traces untouched
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

    from dpro_kit.cli_align import align as align_cmd
    ts, truth = align_speed.synthetic_fine_trace(4, noise=0.0, seed=5)
    d = tmp_path / "t"
    save_trace(ts, d)
    r = CliRunner().invoke(align_cmd, [str(d), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out["offsets_us"]) == set(truth)
    assert all(abs(out["offsets_us"][n] - truth[n]) < 0.05 for n in truth)
    assert out["solve_time_s"] >= 0 and "binding" in out and "violated" in out and out["written"]
    assert isinstance(align_cmd, click.Command)


# --------------------------------------------------------------------------- a real 2-host run

_NETNS = netns_unusable_reason()


@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
def test_real_two_host_run_with_injected_offsets(tmp_path):
    import align_accuracy
    trace = tmp_path / "job"
    align_accuracy.run_job(trace, hosts=2, per_host=1, rate=None, bucket_mb=25, iters=12, timeout=120)
    ts = load_trace(trace)
    base = align(ts)
    shifts = {n: (3100.0 if ts.manifest.nodes[n].host == "host1" else -1700.0) for n in ts.nodes()}
    dst = tmp_path / "shifted"
    shift_trace_dir(trace, dst, shifts)
    res = align(load_trace(dst))
    ref = ts.nodes()[0]
    other = ts.nodes()[1]
    injected = shifts[other] - shifts[ref]
    # the estimator is exactly shift-equivariant ...
    assert abs((res.offsets_us[other] - base.offsets_us[other]) - injected) < 1.0
    # ... and coarse gloo traces pin the offset to within about a millisecond here (docs/alignment.md)
    err = res.offsets_us[other] - injected
    print(f"real 2-host gloo run: injected {injected:.1f} us, estimated {res.offsets_us[other]:.1f} us, "
          f"error {err:.1f} us")
    assert abs(err) < 2000.0


@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
def test_real_two_host_ring_run_recovers_offsets_to_microseconds(tmp_path):
    """Per-chunk SEND/RECV times from `dpro profile --ring` (2 hosts x 2 ranks, the same-machine
    term at work): injected offsets come back within the issue's 50 us (typically < 10 us)."""
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
    assert res.mode == "fine" and res.statistic == "min"
    ref = ts.nodes()[0]
    errs = {n: res.offsets_us[n] - (shifts[n] - shifts[ref]) for n in ts.nodes() if n != ref}
    print("real 2x2 ring run, errors (us):", {n: round(e, 1) for n, e in errs.items()})
    assert np.median(np.abs(list(errs.values()))) <= 50.0
