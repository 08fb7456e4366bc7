"""The overlap-factor estimator (dpro_kit/replay/overlap.py) on hand-made traces with hand-computed gamma."""
from __future__ import annotations

from types import SimpleNamespace

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from dpro_kit.graph import add_op
from dpro_kit.replay.overlap import deoverlap, fit_overlap_factor, overlapped_fraction


def ev(node, op, kind, stream, it, start, dur, name=None):
    return {"node": node, "host": node.split("/")[0], "op": op, "name": name or op, "kind": kind,
            "stream": stream, "iteration": it, "start": float(start), "dur": float(dur)}


def test_overlapped_fraction_against_hand_intervals():
    cs, ce = np.array([10.0, 30.0]), np.array([20.0, 35.0])
    f = overlapped_fraction(np.array([0.0, 15.0, 18.0, 40.0]), np.array([10.0, 25.0, 34.0, 50.0]), cs, ce)
    # [0,10): none; [15,25): 15..20 = 5/10; [18,34): 18..20 + 30..34 = 6/16; [40,50): none
    assert f == pytest.approx([0.0, 0.5, 6 / 16, 0.0])


def trace():
    rows = []
    # 4 iterations 1000 us apart; op A 100 us alone, 125 overlapped; op B 200 alone, 240 overlapped
    for it in range(4):
        t0 = 1000.0 * it
        over = it >= 2
        a, b = (125, 240) if over else (100, 200)
        rows.append(ev("h0/0", "A#0", "BW", "compute", it, t0, a))
        rows.append(ev("h0/0", "B#0", "BW", "compute", it, t0 + 300, b))
        if over:   # a bucket in flight over both ops (on the host's comm stream)
            rows.append(ev("h0/0", "allreduce:b0", "COMM", "comm", it, t0 - 10, 600))
        rows.append(ev("h0/0", "tiny#0", "FW", "compute", it, t0 + 700, 5))   # < min_us: ignored
    return SimpleNamespace(events=pd.DataFrame(rows))


def test_fit_is_the_weighted_median_of_per_op_ratios():
    fit = fit_overlap_factor(trace())
    # A: 125/100 - 1 = 0.25 (weight 100); B: 240/200 - 1 = 0.2 (weight 200): weighted median 0.2
    assert fit.gamma == pytest.approx(0.2)
    assert fit.gamma_mean == pytest.approx((0.25 * 100 + 0.2 * 200) / 300)
    assert fit.ops_used == 2 and fit.instances_overlapped == 4 and fit.instances_alone == 4


def test_fit_not_identifiable_when_every_instance_overlaps():
    t = trace()
    t.events = t.events[t.events["iteration"] >= 2]
    fit = fit_overlap_factor(t)
    assert fit.gamma is None and "not identifiable" in fit.reason


def test_other_hosts_communication_does_not_count():
    t = trace()
    t.events.loc[t.events["kind"] == "COMM", "host"] = "h9"
    fit = fit_overlap_factor(t)
    assert fit.gamma is None and fit.instances_overlapped == 0


def test_deoverlap_gives_solo_times():
    t = trace()
    t.events = t.events[t.events["iteration"] == 2]
    g = nx.DiGraph()
    add_op(g, "h0/0|A#0", device="h0/0:compute", dur=125)
    add_op(g, "h0/0|B#0", device="h0/0:compute", dur=240)
    h, n = deoverlap(g, t, 0.25)
    # f = 1: W = D (1 - 0.25/1.25) = 0.8 D
    assert n == 2 and h.nodes["h0/0|A#0"]["dur"] == pytest.approx(100) and h.nodes["h0/0|B#0"]["dur"] == pytest.approx(192)
    assert g.nodes["h0/0|A#0"]["dur"] == 125     # the input graph is not modified
