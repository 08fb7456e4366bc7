"""TicTac (seed 003): scheduling efficiency E / speed-up bound S, TIC and TAC orders, their replay, the plan.

The PS graph below is hand-built (so every number can be checked by hand): one
worker ``w0`` (host h0), one server ``s0`` (host hs), links ``link:h0->hs``
(pushes) and ``link:hs->h0`` (pulls), a link model of 1 byte per us and no latency,
zero-time RECV / AGG / In / Out.  Worker ops on ``w0:compute``: BW (10 us), then the
gradients of two tensors go out; after its pull, tensor A's update UA takes 10 us and
tensor B's UB 1 us.  A is 2 bytes (push 2 us, pull 2 us), B 8 bytes (8 us each).
Tensor B's collective is built first, so the default (FIFO, then build order) sends
B first.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.graph.build import add_iteration_boundaries
from dpro_kit.graph.model import add_op, save_graph
from dpro_kit.graph.topology import CommContext, Links, ps_push_pull
from dpro_kit.optimize import tictac
from dpro_kit.optimize.plan import validate_plan
from dpro_kit.optimize.tictac import WorkerPartition
from dpro_kit.replay import replay
from dpro_kit.trace import Collective, Manifest, NodeInfo

REPO = Path(__file__).resolve().parents[1]


def approx(x):
    return pytest.approx(x, abs=1e-9)


def hand_ps_graph() -> nx.DiGraph:
    manifest = Manifest(job="hand", framework="test", comm_backend="ps", world_size=1,
                        nodes={"w0": NodeInfo(host="h0", role="worker", rank=0),
                               "s0": NodeInfo(host="hs", role="server", rank=0)}, iterations=[0])
    g = nx.DiGraph()
    add_op(g, "w0|BW", node="w0", device="w0:compute", kind="BW", dur=10.0, name="BW")
    add_op(g, "w0|UA", node="w0", device="w0:compute", kind="UPDATE", dur=10.0, name="UA")
    add_op(g, "w0|UB", node="w0", device="w0:compute", kind="UPDATE", dur=1.0, name="UB")
    ctx = CommContext(graph=g, manifest=manifest, model=CommModel(default=LinkModel(0.0, 1e6), origin="user"),
                      links=Links(manifest))
    for t, nbytes, upd in (("B", 8, "UB"), ("A", 2, "UA")):
        ps_push_pull(ctx, Collective(tensor=t, op="push_pull", bytes=nbytes, participants=["w0"], algorithm="ps",
                                     inputs={"w0": ["BW"]}, outputs={"w0": [upd]},
                                     partitions=[{"bytes": nbytes, "server": "s0"}]))
    add_iteration_boundaries(g)
    g.graph["meta"] = {"job": "hand", "comm_model": ctx.model.describe(), "hosts": {"w0": "h0", "s0": "hs"}}
    return g


def starts(res, g, kind, phase):
    df = res.to_frame(g)
    sel = df[(df["kind"] == kind) & (df["phase"] == phase)]
    return {r.tensor: (round(r.start, 9), round(r.end, 9)) for r in sel.itertuples()}


# --------------------------------------------------------------------------- E and S

def test_efficiency_and_bound_by_hand():
    # w0's partition: compute BW 10 + UA 10 + UB 1 = 21 on w0:compute, pushes 2 + 8 = 10 on
    # link:h0->hs, pulls (peer w0) 2 + 8 = 10 on link:hs->h0: U = 41, L = 21, S = 20 / 21.
    g = hand_ps_graph()
    # default order (B first): pushes B [10, 18], A [18, 20]; pulls B [18, 26], A [26, 28] (link busy);
    # UB [26, 27], UA [28, 38]: m = 38, E = (41 - 38) / (41 - 21) = 0.15
    res = replay(g)
    assert res.iteration_time_us == approx(38)
    assert starts(res, g, "SEND", "pull") == {"B": (18, 26), "A": (26, 28)}
    e = tictac.scheduling_efficiency(res, g)
    w = e["workers"]["w0"]
    assert (w["U_ms"], w["L_ms"], w["makespan_ms"]) == (approx(0.041), approx(0.021), approx(0.038))
    assert w["bottleneck"] == "w0:compute"
    assert e["reference"] == "w0"
    assert e["E"] == approx(3 / 20) and e["S"] == approx(20 / 21)
    # A first (TAC, below): pushes A [10, 12], B [12, 20]; pulls A [12, 14], B [20, 28];
    # UA [14, 24], UB [28, 29]: m = 29, E = (41 - 29) / 20 = 0.6, S unchanged
    res = replay(g, schedule="tac")
    assert res.iteration_time_us == approx(29)
    assert starts(res, g, "SEND", "push") == {"A": (10, 12), "B": (12, 20)}
    assert starts(res, g, "SEND", "pull") == {"A": (12, 14), "B": (20, 28)}
    e = tictac.scheduling_efficiency(res, g)
    assert e["E"] == approx(12 / 20) and e["S"] == approx(20 / 21)


def test_efficiency_steady_state_over_iterations():
    # serial iterations (synchronous rule): 3 x 29 us under TAC; m = 87 - 58 = 29 in the last one
    g = hand_ps_graph()
    res = replay(g, iterations=3, schedule="tac")
    assert res.iteration_time_us == approx(29)
    e = tictac.scheduling_efficiency(res, g)
    assert e["workers"]["w0"]["makespan_ms"] == approx(0.029)
    assert e["E"] == approx(0.6)


def test_efficiency_undefined_on_one_resource():
    # one op on one device: U = L = 5, E has no meaning (None), S = 0
    g = nx.DiGraph()
    add_op(g, "w|BW", node="w", device="w:compute", kind="BW", dur=5.0)
    e = tictac.scheduling_efficiency(replay(g), g)
    assert e["E"] is None and e["S"] == 0


# --------------------------------------------------------------------------- the worker partition

def test_worker_partition_of_the_hand_graph():
    g = hand_ps_graph()
    parts = tictac.worker_partitions(g)
    assert list(parts) == ["w0"]
    p = parts["w0"]
    i = {r: n for n, r in enumerate(p.recvs)}
    assert set(i) == {("A", 0), ("B", 0)}
    # Time(recv) = pull SEND + RECV: 2 and 8 us
    assert p.recv_time[i["A", 0]] == approx(2) and p.recv_time[i["B", 0]] == approx(8)
    # UA waits only for A's pull (10 us), UB only for B's (1 us); the next iteration's BW waits for both
    # (synchronous rule: STEP_END -> BW) - 10 us with dependency {A, B}
    both = (1 << i["A", 0]) | (1 << i["B", 0])
    assert p.loads == {1 << i["A", 0]: approx(10), 1 << i["B", 0]: approx(1), both: approx(10)}


def test_no_partition_without_pulls():
    g = nx.DiGraph()
    add_op(g, "w|BW", node="w", device="w:compute", kind="BW", dur=5.0)
    assert tictac.worker_partitions(g) == {}
    assert tictac.plan_section(g) is None


# --------------------------------------------------------------------------- Algorithms 1-3 on the paper's DAGs

def test_figure_1_properties_and_orders():
    # TicTac Figure 1(a): recv1 -> op1; recv1, recv2 -> op2.  Time: recv1 3, recv2 4, op1 5, op2 6.
    part = WorkerPartition(worker="w", recvs=[("r1", 0), ("r2", 0)], recv_time=[3.0, 4.0],
                           loads={0b01: 5.0, 0b11: 6.0})
    M, P, Mp = tictac.update_properties(part.loads, part.recv_time, 0b11)
    # op1.M = Time(recv1), op2.M = Time(recv1) + Time(recv2) (§4.1 example)
    assert M == {0: 3.0, 1: 4.0}
    assert P == {0: 5.0, 1: 0.0}            # recv1.P = Time(op1), recv2.P = 0
    assert Mp == {0: 7.0, 1: 7.0}           # recv1.M+ = recv2.M+ = 3 + 4
    # TIC: both M+ = 2 recvs -> tie (same priority)
    assert tictac.tic_order(part) == [2.0, 2.0]
    # TAC: recv1 first (the "good order" of Figure 1(b)), for either default order
    assert tictac.tac_order(part) == [0, 1]
    swapped = WorkerPartition(worker="w", recvs=[("r2", 0), ("r1", 0)], recv_time=[4.0, 3.0],
                              loads={0b10: 5.0, 0b11: 6.0})
    assert tictac.tac_order(swapped) == [1, 0]


def test_figure_4a_case_1_johnson_rule():
    # two independent recvs: A (M 1, P 5), B (M 4, P 1).  Makespan(A->B) = 1 + max(5, 4) + 1 = 7,
    # Makespan(B->A) = 4 + max(1, 1) + 5 = 10: A first, as eq. 6 says (min(P_B, M_A) = 1 < min(P_A, M_B) = 4)
    for recvs, times, loads, want in (
            ([("A", 0), ("B", 0)], [1.0, 4.0], {0b01: 5.0, 0b10: 1.0}, [0, 1]),
            ([("B", 0), ("A", 0)], [4.0, 1.0], {0b01: 1.0, 0b10: 5.0}, [1, 0])):
        assert tictac.tac_order(WorkerPartition("w", recvs, times, loads)) == want


def test_figure_4b_case_2_impending_load_breaks_ties():
    # recvA, recvB -> op1; op1, recvC -> op2; op2, recvD -> op3 (as dependency sets), given in the
    # order D, C, B, A.  All P = 0 at first; M+ (TIC: numbers of recvs) A = B = 2 < C = 3 < D = 4.
    D, C, B, A = 1, 2, 4, 8
    part = WorkerPartition(worker="w", recvs=[("D", 0), ("C", 0), ("B", 0), ("A", 0)],
                           recv_time=[1.0, 1.0, 1.0, 1.0],
                           loads={A | B: 2.0, A | B | C: 2.0, A | B | C | D: 2.0})
    assert tictac.tic_order(part) == [4.0, 3.0, 2.0, 2.0]
    # TAC: B (first of the tied A, B in the given order), then A (now P_A = op1), then C, then D
    assert [part.recvs[i][0] for i in tictac.tac_order(part)] == ["B", "A", "C", "D"]


def test_tac_on_the_hand_graph_and_random_is_a_permutation():
    part = tictac.worker_partitions(hand_ps_graph())["w0"]
    # A: M 2, P 10; B: M 8, P 1 -> min(P_B, M_A) = 1 < min(P_A, M_B) = 8: A first
    assert [part.recvs[i][0] for i in tictac.tac_order(part)] == ["A", "B"]
    # TIC: the only op waiting for both is the next iteration's BW: M+ = 2 for both, a tie
    assert tictac.tic_order(part) == [2.0, 2.0]
    r = tictac.random_order(part, seed=3)
    assert sorted(r) == [0, 1] and r == tictac.random_order(part, seed=3)


# --------------------------------------------------------------------------- the replayer honours the order

def test_replay_schedules_give_ranks_to_push_agg_pull():
    g = hand_ps_graph()
    ords = tictac.orders(g)
    assert ords["tac"] == {"w0": {("A", 0): 0.0, ("B", 0): 1.0}}
    assert ords["tic"] == {"w0": {("A", 0): 0.0, ("B", 0): 0.0}}
    h = tictac.prioritized(g, "tac")
    prio = {(d["kind"], d["phase"], d["tensor"]): d["priority"] for _, d in h.nodes(data=True) if d["tensor"]
            and d["kind"] in ("SEND", "RECV", "AGG")}
    assert prio == {(k, ph, t): (0.0 if t == "A" else 1.0) for k, ph, t in prio}
    assert len(prio) == 2 * 5               # per tensor: push SEND/RECV, AGG, pull SEND/RECV
    # the graph with vertex priorities replays exactly like the schedule
    a, b = replay(h), replay(g, schedule="tac")
    assert (a.start == b.start).all() and (a.end == b.end).all()
    # TIC ties A and B: same as the default (build order, B first)
    assert replay(g, schedule="tic").iteration_time_us == approx(38)


def test_schedule_needs_the_networkx_graph():
    from dpro_kit.errors import GraphError
    from dpro_kit.replay import compile_graph
    with pytest.raises(GraphError, match="networkx"):
        replay(compile_graph(hand_ps_graph()), schedule="tac")


def test_synthetic_ps_per_layer_tac_not_slower_than_random(monkeypatch):
    # bench/synthetic.py PS graphs where the next forward of layer l waits for its own pull (MXNet's
    # engine): TAC sends the front layers first.  Replayed over 4 iterations (steady state).
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import synthetic
    g = synthetic.synthetic_dfg(ranks=4, layers=16, buckets=8, comm="ps", servers=1, update="layer", seed=1,
                                next_iteration="per_layer")
    part = tictac.worker_partitions(g)["w0"]
    # bucket 7 holds layers 0-1 (the first forward ops): TAC's order is front to back
    assert [part.recvs[i][0] for i in tictac.tac_order(part)] == [f"bucket{k}" for k in range(7, -1, -1)]
    t = {s: replay(g, iterations=4, schedule=s).iteration_time_us for s in ("graph", "tic", "tac", "random")}
    # measured on this graph (seed 1): default 17.95 ms, TIC 17.59, TAC 17.13, random 18.20
    assert t["tac"] < t["graph"] < t["random"]
    assert t["tac"] < t["tic"] < t["graph"]


# --------------------------------------------------------------------------- plan

def test_plan_section_round_trip(tmp_path):
    g = hand_ps_graph()
    sec = tictac.plan_section(g, iterations=2)
    assert sec["recommended"] == "tac"
    assert sec["predicted"]["default"]["iteration_ms"] == approx(0.038)
    assert sec["predicted"]["tac"]["iteration_ms"] == approx(0.029)
    assert sec["predicted"]["tac"]["E"] == approx(0.6)
    assert sec["orders"]["tac"]["w0"] == [
        {"tensor": "A", "chunk": 0, "rank": 0, "mxnet_priority": 0},
        {"tensor": "B", "chunk": 0, "rank": 1, "mxnet_priority": -1}]
    back = json.loads(json.dumps(sec))
    for order in ("tic", "tac", "random"):
        res = replay(tictac.from_plan(g, back, order), iterations=2)
        assert res.iteration_time_us / 1e3 == approx(sec["predicted"][order]["iteration_ms"])


def test_dpro_optimize_writes_the_schedule(tmp_path):
    # a graph file of the hand PS job through the real CLI: plan["schedule"] is there and valid
    gf = tmp_path / "ps.json"
    save_graph(hand_ps_graph(), gf)
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "optimize", str(gf), "-o", str(out), "--budget", "3"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    validate_plan(plan)
    sch = plan["schedule"]
    # fusing A and B (one 10-byte transfer, 41 us) is slower than the graph (38 us): the groups stay
    assert [t["tensors"] for t in plan["tensor_groups"]] == [["B"], ["A"]]
    assert [e["tensor"] for e in sch["orders"]["tac"]["w0"]] == ["A", "B"]
    assert sch["recommended"] == "tac"
    assert sch["predicted"]["default"]["iteration_ms"] == approx(0.038)
    assert sch["predicted"]["tac"]["iteration_ms"] == approx(0.029)
    assert "transfer order (TicTac)" in r.stdout
    # and `dpro replay --schedule tac --json` of the same file shows E and S
    r = subprocess.run([sys.executable, "-m", "dpro_kit.cli", "replay", str(gf), "--schedule", "tac", "--json"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["iteration_time_ms"] == approx(0.029)
    assert doc["scheduling"]["E"] == approx(0.6) and doc["scheduling"]["S"] == approx(20 / 21)


def test_on_the_builders_ps_dfg():
    # the PS DFG of tests/test_ring_ps.py (TraceSet -> build_global_dfg): 2 workers on one host (their pushes
    # share link:h->hs, pulls link:hs->h), 1 server, a 9-byte gradient in partitions of 5 and 4 bytes;
    # T(b) = 3 + b us.  UPDATE (4 us) waits for both pulls of its worker.
    from test_ring_ps import MODEL, make_job

    from dpro_kit.graph import build_global_dfg
    ts = make_job({"w0": "h", "w1": "h"}, op="push_pull", nbytes=9, servers={"s0": "hs"},
                  partitions=[{"bytes": 5, "server": "s0"}, {"bytes": 4, "server": "s0"}])
    g = build_global_dfg(ts, comm_model=MODEL)
    parts = tictac.worker_partitions(g)
    assert sorted(parts) == ["w0", "w1"]
    for p in parts.values():
        assert sorted(p.recvs) == [("grad", 0), ("grad", 1)]
        i = {r: n for n, r in enumerate(p.recvs)}
        assert p.recv_time[i["grad", 0]] == approx(8) and p.recv_time[i["grad", 1]] == approx(7)
        # UPDATE (4 us) needs both pulls; the next iteration (FW 10 + BW 20, synchronous rule) too
        assert p.loads == {0b11: approx(34)}
        assert tictac.tic_order(p) == [2.0, 2.0]          # M+ = 2 recvs for both: a tie
        # P = 0 for both: eq. 6 ties (min(0, M) = 0); M+ ties (8 + 7): the default order stays
        assert tictac.tac_order(p) == [0, 1]
    e = tictac.scheduling_efficiency(replay(g), g)
    assert set(e["workers"]) == {"w0", "w1"} and e["reference"] in ("w0", "w1")
    # both workers' transfers share link:h->hs (pushes 8, 7, 8, 7 us) and link:hs->h (pulls, the same):
    # each is one resource of either worker's partition with its whole load, so for both workers
    # U = FW 10 + BW 20 + UPDATE 4 + 30 + 30 = 94 and L = max(34, 30, 30) = 34.  Replayed (FIFO):
    # w0 ends at 80 (E = (94 - 80) / 60), w1 queues behind w0's transfers and ends at 87 (E = 7 / 60,
    # the reference); counting only its own transfers (U = 64) would give E = -23 / 30.
    for w, m in (("w0", 80.0), ("w1", 87.0)):
        row = e["workers"][w]
        assert row["U_ms"] * 1e3 == approx(94) and row["L_ms"] * 1e3 == approx(34)
        assert row["makespan_ms"] * 1e3 == approx(m) and row["E"] == approx((94 - m) / 60)
    assert e["reference"] == "w1" and e["S"] == approx(60 / 34)
    for s in ("tic", "tac", "random"):
        assert replay(g, schedule=s).iteration_time_us > 0
