"""Proteus' executor behaviours (seed 001 §VI) on hand-computed schedules: the ``shared`` device model.

Rules under test (dpro_kit/replay/sharing.py, docs/replayer.md "Bandwidth sharing and overlap"):

* a transfer (op on a ``link:`` device) starts when it is ready, with remaining work = its duration
  (us at solo speed); running transfers get rates by progressive filling (max-min fair) over the
  resources they cross, recomputed at every transfer start and end; rate <= 1;
* ``link:A->B`` (hosts) crosses ``egress:A`` and ``ingress:B``, capacity 1 unless given;
* with overlap factor gamma, computation on a host runs at 1/(1+gamma) while a transfer touching
  that host is in flight.

Every expected number is computed by hand in the comments.
"""
from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from dpro_kit.errors import GraphError
from dpro_kit.graph import add_op
from dpro_kit.replay import compile_graph, replay
from dpro_kit.replay.sharing import link_resources, topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def times(res) -> dict[str, tuple[float, float]]:
    return {k: (float(res.start[i]), float(res.end[i])) for i, k in enumerate(res.graph.keys)}


def close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) < 1e-9 and abs(a[1] - b[1]) < 1e-9


def shared(g, **opts):
    return times(replay(g, device_model="shared", model_options=opts))


def test_two_concurrent_transfers_on_one_link_share_it():
    g = nx.DiGraph()
    add_op(g, "S1", device="link:h0->h1", dur=10, kind="SEND")
    add_op(g, "S2", device="link:h0->h1", dur=10, kind="SEND")
    fifo = times(replay(g))
    assert fifo["S1"] == (0, 10) and fifo["S2"] == (10, 20)      # queued
    t = shared(g)
    assert t["S1"] == (0, 20) and t["S2"] == (0, 20)               # both at rate 1/2: 10 / 0.5


def test_three_transfers_on_one_link_finish_times():
    # durations 6, 12, 18 all at 0: rates 1/3 until A's 6 us of work are done at 18;
    # B, C have 6 and 12 left, rates 1/2: B done at 18 + 6/0.5 = 30; C has 6 left at rate 1: 36
    g = nx.DiGraph()
    for k, d in (("A", 6), ("B", 12), ("C", 18)):
        add_op(g, k, device="link:h0->h1", dur=d, kind="SEND")
    t = shared(g)
    assert close(t["A"], (0, 18)) and close(t["B"], (0, 30)) and close(t["C"], (0, 36))


def test_staggered_start_recomputes_rates():
    # A (10) alone from 0 to 4 (4 done, 6 left); B (10) from 4: both 1/2, A done at 4 + 12 = 16;
    # B did 6 by 16, 4 left at rate 1: 20
    g = nx.DiGraph()
    add_op(g, "P", device="host0/0:compute", dur=4)
    add_op(g, "A", device="link:h0->h1", dur=10, kind="SEND")
    add_op(g, "B", device="link:h0->h1", dur=10, kind="SEND")
    g.add_edge("P", "B")
    t = shared(g)
    assert close(t["A"], (0, 16)) and close(t["B"], (4, 20))


def test_different_links_share_the_sender_egress():
    # link:h0->h1 and link:h0->h2 are two devices (FIFO: parallel) but both leave host h0
    # S1 (5) alone 1..2 (1 done, 4 left); S2 (3) from 2: both 1/2, S2 done at 2 + 6 = 8;
    # S1 did 3 more by 8, 1 left at rate 1: 9
    g = nx.DiGraph()
    add_op(g, "P1", device="w0:compute", dur=1)
    add_op(g, "P2", device="w0:compute", dur=1)
    add_op(g, "S1", device="link:h0->h1", dur=5, kind="SEND")
    add_op(g, "S2", device="link:h0->h2", dur=3, kind="SEND")
    g.add_edges_from([("P1", "S1"), ("P2", "S2")])
    fifo = times(replay(g))
    assert fifo["S1"] == (1, 6) and fifo["S2"] == (2, 5)
    t = shared(g)
    assert close(t["S1"], (1, 9)) and close(t["S2"], (2, 8))


def test_transfer_crossing_a_shared_ingress_max_min():
    # A: h0->h2, B: h1->h2 share ingress:h2 (capacity 1); egress:h0 has capacity 0.3.
    # Progressive filling: level rises to 0.3, egress:h0 saturates: A frozen at 0.3;
    # ingress:h2 has 0.7 left for B alone: B = 0.7 (its egress:h1 is free).  C: h3->h4 untouched, 1.
    # A (3 us) ends at 3 / 0.3 = 10; B (14) did 7 by 10, then alone at 1: 17.  C (5): 5.
    g = nx.DiGraph()
    add_op(g, "A", device="link:h0->h2", dur=3, kind="SEND")
    add_op(g, "B", device="link:h1->h2", dur=14, kind="SEND")
    add_op(g, "C", device="link:h3->h4", dur=5, kind="SEND")
    t = shared(g, capacity={"egress:h0": 0.3})
    assert close(t["A"], (0, 10)) and close(t["B"], (0, 17)) and close(t["C"], (0, 5))
    # without the capacity: A and B at 1/2 on ingress:h2: A ends at 6; B 14 - 3 = 11 left at 1: 17
    t = shared(g)
    assert close(t["A"], (0, 6)) and close(t["B"], (0, 17))


def test_opposite_directions_do_not_share():
    g = nx.DiGraph()
    add_op(g, "A", device="link:h0->h1", dur=4, kind="SEND")
    add_op(g, "B", device="link:h1->h0", dur=4, kind="SEND")
    t = shared(g)
    assert t["A"] == (0, 4) and t["B"] == (0, 4)    # egress:h0 + ingress:h1 vs egress:h1 + ingress:h0


def test_fabric_capacity_limits_all_inter_host_transfers():
    # two disjoint host pairs, fabric capacity 1: both at 1/2 -> 8 + 8 ... A (4) ends at 8, B (8) at 12
    g = nx.DiGraph()
    add_op(g, "A", device="link:h0->h1", dur=4, kind="SEND")
    add_op(g, "B", device="link:h2->h3", dur=8, kind="SEND")
    assert shared(g)["B"] == (0, 8)
    t = shared(g, fabric_capacity=1.0)
    assert close(t["A"], (0, 8)) and close(t["B"], (0, 12))


def test_overlap_factor_on_a_hand_schedule():
    # C (10 us on host0/0:compute) runs with transfer T (4 us, link:host0->host1) in flight for
    # its first 4 us; gamma = 0.25: rate 0.8, 3.2 us of work done by 4, 6.8 left at rate 1: 10.8.
    # D (10 us on host2/0) is not on a host T touches: 10.
    g = nx.DiGraph()
    add_op(g, "C", device="host0/0:compute", dur=10)
    add_op(g, "D", device="host2/0:compute", dur=10)
    add_op(g, "T", device="link:host0->host1", dur=4, kind="SEND")
    for share in (True, False):
        t = shared(g, overlap_factor=0.25, share=share)
        assert close(t["C"], (0, 10.8)) and t["D"] == (0, 10) and t["T"] == (0, 4)
    assert shared(g)["C"] == (0, 10)                   # gamma 0: unchanged
    # the receiver's host is slowed too: E on host1 for 2 us, fully overlapped: 2 * 1.25 = 2.5
    add_op(g, "E", device="host1/0:compute", dur=2)
    assert close(shared(g, overlap_factor=0.25)["E"], (0, 2.5))


def test_token_bucket_links_hand_computed():
    """Bucket 5 us on every NIC resource, floor 1 us.  A (8 us on h0->h1) at 0: buckets full, 5 covered,
    3 left: ends at 3; egress:h0 / ingress:h1 empty.  B (8 us) after 4 us of compute P: the buckets refilled
    for 4 - 3 = 1 us since A ended: 1 covered, ends at 4 + 7 = 11.  C (2 us) after Q (20 us) on the same
    host: full again (5 > 2 - floor 1), so it takes the 1 us floor: 20 to 21.  D (8 us, h1->h0, the other
    direction: its own full buckets) at 0: ends at 3 beside A.  Without buckets A and B share the link
    from 4 (A's last 4 us at rate 1/2: 12; B's last 4 alone: 16), D 0-8, C 20-22."""
    g = nx.DiGraph()
    add_op(g, "A", device="link:h0->h1", dur=8, kind="SEND")
    add_op(g, "D", device="link:h1->h0", dur=8, kind="SEND")
    add_op(g, "P", device="h0/0:compute", dur=4)
    add_op(g, "B", device="link:h0->h1", dur=8, kind="SEND")
    add_op(g, "Q", device="h0/1:compute", dur=20)
    add_op(g, "C", device="link:h0->h1", dur=2, kind="SEND")
    g.add_edge("P", "B")
    g.add_edge("Q", "C")
    t = shared(g, token_bucket_us=5.0, token_floor_us=1.0)
    assert close(t["A"], (0, 3)) and close(t["D"], (0, 3)) and close(t["B"], (4, 11)) and close(t["C"], (20, 21))
    t = shared(g)
    assert close(t["A"], (0, 12)) and close(t["D"], (0, 8)) and close(t["B"], (4, 16)) and close(t["C"], (20, 22))
    # per resource: only h0's egress has a bucket -> A and B are covered by nothing (h1's ingress has none)
    t = shared(g, token_bucket_us={"egress:h0": 5.0}, token_floor_us=1.0)
    assert close(t["A"], (0, 12)) and close(t["B"], (4, 16))
    with pytest.raises(GraphError, match="no link of the graph uses"):
        shared(g, token_bucket_us={"egress:h9": 5.0})


def test_overlap_starts_mid_op():
    # C (10) from 0; T (4) after P (2, on host1) from 2 to 6: C at rate 1/(1+1) = 0.5 during 2..6
    # -> 2 + 2 + 6 = 10 us of work by 2 + 4 + 6 = 12.  P is on host1 (receiver side, idle before T).
    g = nx.DiGraph()
    add_op(g, "C", device="host0/0:compute", dur=10)
    add_op(g, "P", device="host1/0:compute", dur=2)
    add_op(g, "T", device="link:host0->host1", dur=4, kind="SEND")
    g.add_edge("P", "T")
    t = shared(g, overlap_factor=1.0)
    assert close(t["C"], (0, 12)) and close(t["T"], (2, 6))


def test_no_sharing_no_overlap_equals_fifo_kernel_op_for_op():
    from synthetic import synthetic_dfg
    for seed in range(3):
        cg = compile_graph(synthetic_dfg(ranks=4, layers=8, buckets=3, seed=seed))
        for it in (1, 3):
            a = replay(cg, iterations=it)
            b = replay(cg, iterations=it, device_model="shared", model_options={"share": False})
            assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
            assert np.array_equal(a.crit_pred, b.crit_pred) and np.array_equal(a.dev_prev, b.dev_prev)


def test_sharing_conserves_link_work_and_never_beats_capacity():
    # on one link, fair sharing ends the last transfer when the FIFO queue would (work conserved)
    from synthetic import synthetic_dfg
    cg = compile_graph(synthetic_dfg(ranks=4, layers=8, buckets=3, seed=1))
    a = replay(cg)
    b = replay(cg, device_model="shared")
    busy_a = a.device_busy_us()
    for name, d in zip(cg.devices, range(len(cg.devices))):
        if name.startswith("link:"):
            rows = np.flatnonzero(cg.device == d)
            # a link's ops take at least their solo durations
            assert (b.end[rows] - b.start[rows] >= cg.dur[rows] - 1e-6).all()
    assert set(busy_a) == set(b.device_busy_us())


def test_link_resources_and_topology():
    assert link_resources("link:host0->host1") == (["egress:host0", "ingress:host1"], ["host0", "host1"])
    assert link_resources("link:host0/0->host0/1") == (["out:host0/0", "in:host0/1"], ["host0"])
    assert link_resources("link:h2:upload", fabric=True) == (["egress:h2", "fabric"], ["h2"])
    assert link_resources("link:h2:download") == (["ingress:h2"], ["h2"])
    assert link_resources("host0/0:compute") == ([], [])
    hosts = {"w0": "hA", "w1": "hB"}
    assert link_resources("link:w0->w1", hosts) == (["egress:hA", "ingress:hB"], ["hA", "hB"])
    topo = topology(["w0:compute", "w0:comm", "link:hA->hB"], hosts)
    assert list(topo["comp_grp"][:2]) == [topo["groups"].index("hA"), -1]
    with pytest.raises(GraphError, match="capacity names resource"):
        topology(["link:a->b"], capacity={"egress:zz": 1.0})
    g = nx.DiGraph()
    add_op(g, "A", device="link:h0->h1", dur=1, kind="SEND")
    with pytest.raises(GraphError, match="overlap factor"):
        replay(g, device_model="shared", model_options={"overlap_factor": -1})
    with pytest.raises(GraphError, match="takes no options"):
        replay(g, model_options={"overlap_factor": 0.1})


def test_cli_device_model_and_overlap_factor_on_a_recorded_trace():
    """``dpro replay --device-model shared --overlap-factor`` on the recorded 2-host DDP trace: one rank per
    host, one bucket, the ring's two directions use different egress/ingress, so sharing changes nothing;
    gamma > 0 slows the receiver's backward ops that overlap the transfers, never speeds anything up."""
    import json

    from click.testing import CliRunner

    from dpro_kit.cli.replay import replay as replay_cmd
    trace = str(Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2host-1000mbit")
    out = {}
    for args in ([], ["--device-model", "shared"], ["--device-model", "shared", "--overlap-factor", "0.2"],
                 ["--overlap-factor", "0.2"]):
        r = CliRunner().invoke(replay_cmd, [trace, "--json", "--no-align", *args])
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        out[" ".join(args)] = d["iteration_time_ms"]
    assert d["overlap_factor"] == 0.2 and d["device_model"] == "fifo"
    assert out["--device-model shared"] == pytest.approx(out[""], abs=1e-9)
    assert out["--device-model shared --overlap-factor 0.2"] > out[""]
    assert out["--overlap-factor 0.2"] == pytest.approx(out["--device-model shared --overlap-factor 0.2"])
    r = CliRunner().invoke(replay_cmd, [trace, "--overlap-factor", "-1"])
    assert r.exit_code == 2


def test_overlap_with_a_gpu_communication_stream():
    # GPU node: K (10 us on gpu:7) overlaps the NCCL kernel N (5 us on gpu:40, a comm device) for 5 us;
    # gamma 1: rate 1/2 for 5 us (2.5 done), 7.5 left at 1: 12.5.  The CPU thread op C is not
    # computation on a GPU node: 10.  N keeps its FIFO queue and time: 5.
    g = nx.DiGraph()
    add_op(g, "K", device="host0/0:gpu:7", dur=10)
    add_op(g, "N", device="host0/0:gpu:40", dur=5, kind="COMM")
    add_op(g, "C", device="host0/0:cpu0", dur=10)
    t = shared(g, overlap_factor=1.0, comm_devices=["host0/0:gpu:40"])
    assert close(t["K"], (0, 12.5)) and t["C"] == (0, 10) and t["N"] == (0, 5)
    assert shared(g, overlap_factor=1.0)["K"] == (0, 10)     # not declared: no communication in flight


def _reference_fluid(g: nx.DiGraph, caps: dict) -> dict[str, tuple[float, float]]:
    """Plain-Python fluid replay of a DAG of transfers (link devices) and device-less delays: every op starts
    when its predecessors are done; transfers share resources by *global* progressive filling."""
    from dpro_kit.replay.sharing import link_resources
    res = {k: link_resources(d["device"])[0] if d.get("device") else None for k, d in g.nodes(data=True)}
    dur = {k: float(d["dur"]) for k, d in g.nodes(data=True)}
    left = {k: g.in_degree(k) for k in g}
    ready = {k: 0.0 for k in g if left[k] == 0}
    run, out, t = {}, {}, 0.0               # run: op -> remaining work
    while ready or run:
        for k in [k for k, r in ready.items() if r <= t]:
            del ready[k]
            run[k] = dur[k]
            out[k] = (t, None)
        rates, frozen, level = {}, set(), 0.0
        xs = [k for k in run if res[k]]
        while len(frozen) < len(xs):
            free = [k for k in xs if k not in frozen]
            use = {}
            for k in free:
                for r in res[k]:
                    use[r] = use.get(r, 0) + 1
            load = {r: sum(rates.get(k, 0.0) for k in frozen if r in res[k]) for r in use}
            inc = min([1.0 - level] + [(caps.get(r, 1.0) - load[r] - level * use[r]) / use[r] for r in use])
            level += inc
            for k in free:
                if level >= 1 - 1e-12 or any(caps.get(r, 1.0) - load[r] - level * use[r] <= 1e-12 for r in res[k]):
                    frozen.add(k)
                    rates[k] = min(level, 1.0)
        for k in run:
            rates.setdefault(k, 1.0)
        dt = min([run[k] / rates[k] for k in run] + [r - t for r in ready.values()])
        t += dt
        for k in list(run):
            run[k] -= rates[k] * dt
            if run[k] <= 1e-9 * max(1.0, dur[k]):
                del run[k]
                out[k] = (out[k][0], t)
                for v in g.successors(k):
                    left[v] -= 1
                    if left[v] == 0:
                        ready[v] = t
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_transfer_dags_match_a_global_progressive_filling_reference(seed):
    """The kernel fills only the connected component of the links that changed; the reference refills
    everything at every event (max-min fairness separates over components, so they must agree)."""
    rng = np.random.default_rng(seed)
    hosts = [f"h{i}" for i in range(4)]
    g = nx.DiGraph()
    keys = []
    for i in range(40):
        k = f"op{i}"
        if rng.random() < 0.2:
            add_op(g, k, device="", dur=float(rng.integers(0, 5)))
        else:
            a, b = rng.choice(len(hosts), 2, replace=False)
            add_op(g, k, device=f"link:{hosts[a]}->{hosts[b]}", dur=float(rng.integers(1, 20)), kind="SEND")
        for p in keys:
            if rng.random() < 0.06:
                g.add_edge(p, k)
        keys.append(k)
    caps = {"egress:h0": 0.5, "ingress:h3": 0.7}
    want = _reference_fluid(g, caps)
    got = shared(g, capacity=caps)
    for k in g:
        assert got[k][0] == pytest.approx(want[k][0], abs=1e-6) and got[k][1] == pytest.approx(want[k][1], abs=1e-6), k
