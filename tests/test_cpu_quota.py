"""The CPU-quota what-if (--cpu-limit): Linux CFS bandwidth control on hand-computed schedules."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from dpro_kit.replay import replay
from dpro_kit.whatif import (cfs_schedule, cpu_limited_graph, dethrottle_factors, full_speed_durations, idle_cpu,
                             recorded_limits)

ROOT = Path(__file__).resolve().parents[1]
TWO_HOST = ROOT / "examples" / "traces" / "ddp-2host-1000mbit"


def test_cfs_busy_op_runs_its_quota_then_stops():
    # quota 6 ms / 10 ms: runs 0-6, stopped 6-10, runs 10-16, stopped 16-20, runs 20-23
    s, e, stalls = cfs_schedule([(0.0, 15.0)], 6.0, 10.0)
    assert (s, e, stalls) == ([0.0], [23.0], [(6.0, 10.0), (16.0, 20.0)])


def test_cfs_quota_is_refilled_not_carried_over():
    # 5 ms of work, a 6 ms wait that crosses the boundary at 10, 5 more: no stop (quota 6 refilled at 10)
    assert cfs_schedule([(0.0, 5.0), (6.0, 5.0)], 6.0, 10.0) == ([0.0, 11.0], [5.0, 16.0], [])
    # the same without the wait: 6 of the 10 ms run in the first period, stopped 6-10, the rest at 10-14
    assert cfs_schedule([(0.0, 5.0), (0.0, 5.0)], 6.0, 10.0) == ([0.0, 5.0], [5.0, 14.0], [(6.0, 10.0)])


def test_cfs_phase_and_not_before():
    # boundaries at 3 + 10k: the partial period [-7, 3) has a full quota of 5: runs 0-3, 3-8, stopped 8-13, 13-15
    assert cfs_schedule([(0.0, 10.0)], 5.0, 10.0, phase_us=3.0) == ([0.0], [15.0], [(8.0, 13.0)])
    # an op that may not start before 30 starts at 30 whatever its gap says
    assert cfs_schedule([(0.0, 1.0), (0.0, 1.0, 30.0)], 5.0, 10.0)[0] == [0.0, 30.0]


def test_cfs_waiting_spends_quota_at_idle_cpu():
    # a 4 ms wait at half a CPU spends 2 of the 3 ms quota; the 4 ms op runs 4-5, stopped 5-10, runs 10-13
    assert cfs_schedule([(4.0, 4.0)], 3.0, 10.0, idle_cpu=0.5) == ([4.0], [13.0], [(5.0, 10.0)])
    # a 10 ms wait at a full CPU with quota 3: stopped 3-10 inside the wait (recorded), the op then runs 10-11
    s, e, stalls = cfs_schedule([(10.0, 1.0)], 3.0, 10.0, idle_cpu=1.0)
    assert (s, e, stalls) == ([10.0], [11.0], [(3.0, 10.0)])


def test_cfs_unlimited_quota_changes_nothing():
    assert cfs_schedule([(0.0, 15.0), (2.0, 3.0)], 10.0, 10.0) == ([0.0, 17.0], [15.0, 20.0], [])


def _two_ranks():
    g = nx.DiGraph()
    g.add_node("a|op", node="a", device="a:compute", kind="FW", dur=10000.0)
    g.add_node("b|op", node="b", device="b:compute", kind="FW", dur=40000.0)
    return g


def test_cpu_limited_graph_hand_computed():
    """Rank a: one 10 ms op per 40 ms iteration (b sets the pace), quota 0.5 CPU per 10 ms.

    The op starts with a fresh quota at offset x into a period; the 8 phases put x at
    0, 8.75, 7.5, 6.25, 5, 3.75, 2.5, 1.25 ms.  x <= 5: runs 5, stopped to the boundary, runs 5: 15 - x;
    x > 5: runs 10 - x, refilled, runs 5, stopped 5, runs x - 5: 15.  Mean (4 * 15 + 10 + 11.25 + 12.5
    + 13.75) / 8 = 13.4375 ms; b (not limited) keeps 40 ms, so the iteration stays 40 ms.
    """
    g = _two_ranks()
    out = cpu_limited_graph(g, {"a": 0.5}, 10000.0, lambda gg: replay(gg, iterations=1))
    assert g.nodes["a|op"]["dur"] == pytest.approx(13437.5)
    assert g.nodes["b|op"]["dur"] == 40000.0
    assert out["a"]["stopped_ms"] == pytest.approx(3.4375) and out["a"]["compute_ms"] == 10.0
    assert replay(g, iterations=1).iteration_time_us == pytest.approx(40000.0)
    # a quota of a whole CPU is never binding for one thread
    g = _two_ranks()
    cpu_limited_graph(g, {"a": 1.0}, 10000.0, lambda gg: replay(gg, iterations=1))
    assert g.nodes["a|op"]["dur"] == 10000.0


def _run(*args):
    return subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(TWO_HOST), "--json", "-q", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_cpu_limit_on_a_recorded_trace():
    import json
    base = json.loads(_run().stdout)["iteration_time_ms"]
    full = json.loads(_run("--cpu-limit", "host1=1", "--cpu-period-ms", "10").stdout)
    assert full["iteration_time_ms"] == pytest.approx(base)
    # a quota of a whole CPU per rank never stops the model's one-thread rank: replay says so
    assert [w for w in full["warnings"] if "host1/1 gets 1 CPU" in w and "never stops it" in w]
    half = _run("--cpu-limit", "host1=0.5", "--cpu-period-ms", "10")
    assert half.returncode == 0, half.stderr
    d = json.loads(half.stdout)
    lim = d["cpu_limit"]["host1/1"]
    assert d["iteration_time_ms"] > base and lim["stopped_ms"] > 0 and lim["stretched_ms"] > lim["compute_ms"]
    assert d["whatif"]["cpu_limit"] == {"host1": 0.5} and d["whatif"]["cpu_period_ms"] == 10.0
    assert not [w for w in d["warnings"] if "never stops it" in w]
    # pairs separated by commas are the same what-if as the option repeated
    both = json.loads(_run("--cpu-limit", "host0=0.5,host1=0.5", "--cpu-period-ms", "10").stdout)
    rep = json.loads(_run("--cpu-limit", "host0=0.5", "--cpu-limit", "host1=0.5", "--cpu-period-ms", "10").stdout)
    assert both["whatif"]["cpu_limit"] == {"host0": 0.5, "host1": 0.5} == rep["whatif"]["cpu_limit"]
    assert both["iteration_time_ms"] == rep["iteration_time_ms"] > d["iteration_time_ms"]
    bad = _run("--cpu-limit", "host0=1,host1")
    assert bad.returncode == 2 and "'host1': expected HOST=CPUS, e.g. host1=0.667 (repeat the option" in bad.stderr
    bad = _run("--cpu-limit", "host9=0.5")
    assert bad.returncode == 2 and "no host 'host9'" in bad.stderr and "host0, host1" in bad.stderr
    bad = _run("--cpu-limit", "host1=0", "--cpu-period-ms", "10")
    assert bad.returncode == 2 and "positive number of CPUs" in bad.stderr


def test_idle_cpu_from_the_collector_records():
    # 30 ms steps at 1.05 CPU, 2 ms of them stopped by the quota, 19 ms of computation at one CPU:
    # the other 31.5 - 19 = 12.5 ms of CPU fall in the 30 - 2 - 19 = 9 ms it ran without computing
    assert idle_cpu((1.05, 30.0, 2.0, 2.0), 19.0) == pytest.approx(12.5 / 9)
    assert idle_cpu((1.05, 30.0, 2.0), 19.0) == 1.0            # no affinity recorded: at most one CPU
    assert idle_cpu((0.5, 30.0), 10.0) == pytest.approx(5.0 / 20)   # (0.5 * 30 - 10) / (30 - 10)
    assert idle_cpu(None, 10.0) == 0.0 and idle_cpu((None, 30.0), 10.0) == 0.0 and idle_cpu((0.5, 8.0), 10.0) == 0.0


def test_cfs_waits_above_one_cpu_spend_a_whole_cpu_quota():
    # a rank whose waits use 1.5 CPUs (Horovod's background thread beside a spinning wait) under a 1-CPU
    # quota (10 of 10 ms): the 8 ms wait spends the 10 ms by 6.67, stopped to 8 inside the wait, then the
    # op, ready at 8, finds no quota: stopped 8-10, runs 10-11
    s, e, stalls = cfs_schedule([(8.0, 1.0)], 10.0, 10.0, idle_cpu=1.5)
    assert s == [8.0] and e == [11.0]
    assert stalls == [(pytest.approx(20 / 3), 8.0), (8.0, 10.0)]
    # waits at 0.9 CPU never spend a whole CPU's quota
    assert cfs_schedule([(8.0, 1.0)], 10.0, 10.0, idle_cpu=0.9) == ([8.0], [9.0], [])


def test_cpu_limited_graph_long_period_then_the_budget_bound():
    """Rank a: one 30 ms op; b sets a 40 ms pace; quota 0.5 CPU per 100 ms; one phase (boundaries at 0, 100, ...).

    K = 1 + ceil(200 / 40) = 6 iterations, op j ready at 40 j (or when op j-1 ends):
    0-30 | 40-60, stopped 60-100, 100-110 | 110-140 | 140-150, stopped 150-200, 200-220 | 220-250 |
    stopped 250-300, 300-330.  Iterations 1-5 take 70, 30, 80, 30, 80: mean 58 ms, stopped 140 / 5 = 28.
    The next round replays a at 58 ms (it sets the pace, G = 0) and the CPU budget says an iteration
    needs at least 30 / 0.5 = 60 ms, which the schedule of ready times 58 ms apart undercuts (39.5 ms):
    the bound holds a at 60 ms (stopped 30) from then on.
    """
    g = _two_ranks()
    g.nodes["a|op"]["dur"] = 30000.0
    out = cpu_limited_graph(g, {"a": 0.5}, 100000.0, lambda gg: replay(gg, iterations=1), phases=1, rounds=1)
    assert g.nodes["a|op"]["dur"] == pytest.approx(58000.0)
    assert out["a"]["stopped_ms"] == pytest.approx(28.0) and out["a"]["budget_bound"] is False
    g = _two_ranks()
    g.nodes["a|op"]["dur"] = 30000.0
    out = cpu_limited_graph(g, {"a": 0.5}, 100000.0, lambda gg: replay(gg, iterations=1), phases=1, rounds=4)
    assert g.nodes["a|op"]["dur"] == pytest.approx(60000.0)
    assert out["a"]["budget_bound"] is True and out["a"]["stopped_ms"] == pytest.approx(30.0)
    assert replay(g, iterations=1).iteration_time_us == pytest.approx(60000.0)


def test_recorded_limits_and_full_speed():
    from types import SimpleNamespace as NS
    nodes = {"h0/0": NS(host="h0", role="worker"), "h1/1": NS(host="h1", role="worker"),
             "h1/2": NS(host="h1", role="worker"), "s/3": NS(host="h1", role="server")}
    ts = NS(manifest=NS(nodes=nodes))
    facts = NS(cpu_use={"h0/0": {"limit_cpus": 1.0, "throttled_us": 0.0},            # never stopped: not listed
                        "h1/1": {"limit_cpus": 1.0, "throttled_us": 800.0, "period_us": 10000.0},
                        "h1/2": {"limit_cpus": 1.0, "throttled_us": 0.0},            # same cgroup as h1/1
                        "s/3": {"limit_cpus": 1.0, "throttled_us": 5.0}})            # not a worker
    assert recorded_limits(ts, facts) == ({"h1/1": 0.5}, 10000.0)
    assert recorded_limits(ts, NS(cpu_use={})) == ({}, None)
    gs = []
    for d in (10.0, 30.0, 12.0):      # the 30 carries a stop: the median 12 is the op at full speed
        g = nx.DiGraph()
        g.add_node("h1/1|op", node="h1/1", kind="BW", dur=d)
        g.add_node("h1/1|send", node="h1/1", kind="SEND", dur=d)
        gs.append(g)
    assert full_speed_durations(gs, {"h1/1"}) == {"h1/1|op": 12.0}


def test_cli_recorded_quota():
    import json
    # nothing recorded as throttled: the plain replay, bit for bit
    plain = json.loads(_run().stdout)
    rq = json.loads(_run("--recorded-quota").stdout)
    assert rq["iteration_time_ms"] == plain["iteration_time_ms"] and rq["recorded_quota"]["nodes"] == {}
    assert "whatif" not in rq and "cpu_limit" not in rq
    # the 3-host profile whose three cgroups were throttled (host2 at 0.4 CPU, 10 ms periods)
    slowed = ROOT / "examples" / "traces" / "ddp-3host-200mbit-slowed"
    run = lambda *a: json.loads(subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(slowed), "--json",
                                                "-q", *a], capture_output=True, text=True, cwd=ROOT,
                                               timeout=300).stdout)
    d = run("--recorded-quota", "--cpu-period-ms", "10")
    assert d["recorded_quota"]["nodes"] == {"host0/0": 0.6, "host1/1": 0.6, "host2/2": 0.4}
    assert set(d["cpu_limit"]) == {"host0/0", "host1/1", "host2/2"}
    assert d["whatif"]["recorded_quota"] is True and d["whatif"]["cpu_period_ms"] == 10.0
    assert all(r["stretched_ms"] >= r["compute_ms"] for r in d["cpu_limit"].values())


def test_dethrottle_takes_out_at_most_the_recorded_stop():
    """Op A takes 10, 30, 12 in iterations 12-14 (median 12), op B 5, 5, 9 (median 5); the kernel
    stopped the rank 0, 8 and 10 ms.  Iteration 13: A's excess 18, the stop 8: A gives back 8 of it
    (30 -> 22).  Iteration 14: B's excess 4 < the stop 10: B back to its median (9 -> 5), no further."""
    from types import SimpleNamespace as NS
    gs = {}
    for it, (a, b) in zip((12, 13, 14), ((10.0, 5.0), (30.0, 5.0), (12.0, 9.0))):
        g = nx.DiGraph()
        g.add_node("n|A", node="n", kind="FW", dur=a)
        g.add_node("n|B", node="n", kind="BW", dur=b)
        gs[it] = g
    facts = NS(cpu_use={"n": {"throttled_us": 1.0, "throttled_us_profiled": {"12": 0.0, "13": 8.0, "14": 10.0}}})
    f = dethrottle_factors(gs, {"n"}, facts)
    assert f[12] == {} and f[13] == {"n|A": pytest.approx(22 / 30)} and f[14] == {"n|B": pytest.approx(5 / 9)}
    # no per-step record (older traces): the unprofiled mean (1 us here) in every iteration
    f = dethrottle_factors(gs, {"n"}, NS(cpu_use={"n": {"throttled_us": 1.0}}))
    assert f[12] == {} and f[13] == {"n|A": pytest.approx(29 / 30)} and f[14] == {"n|B": pytest.approx(8 / 9)}
