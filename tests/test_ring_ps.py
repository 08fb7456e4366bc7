"""Global DFG of tiny AllReduce / PS jobs (dPRO §4.1) and their replayed iteration time.

Each job is a :class:`TraceSet` built in memory: per worker one FW op (10 us), one
BW op (20 us) and one UPDATE op (4 us) on ``<worker>:compute``, local edges
FW -> BW -> UPDATE, and one collective whose input is BW and output is UPDATE.
Transfers use a fixed alpha-beta model: ``T(b) = latency + b / bandwidth`` with
``bandwidth = 1e6 B/s``, i.e. one byte per microsecond, so ``T(b) = latency + b`` us.
RECV ops (not measured) take 0 us, In/Out and AGG (not measured) take 0 us.
"""
from __future__ import annotations

from collections import Counter

import networkx as nx
import pytest

from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.graph import build_global_dfg
from dpro_kit.graph.topology import txn_id
from dpro_kit.replay import replay
from dpro_kit.trace import Collective, Manifest, NodeInfo, TraceSet, make_events

FW, BW, UPD = 10.0, 20.0, 4.0
LAT = 3.0
MODEL = CommModel(default=LinkModel(latency_us=LAT, bandwidth_Bps=1e6), origin="user")


def approx(x):
    return pytest.approx(x, abs=1e-6)


def make_job(hosts: dict[str, str], *, op: str = "allreduce", nbytes: int = 60,
             servers: dict[str, str] | None = None, partitions: list[dict] | None = None,
             iterations: int = 1) -> TraceSet:
    """``hosts``: worker -> host (in rank order); ``servers``: server -> host."""
    servers = servers or {}
    nodes = {w: NodeInfo(host=h, role="worker", rank=r) for r, (w, h) in enumerate(hosts.items())}
    nodes.update({s: NodeInfo(host=h, role="server", rank=r) for r, (s, h) in enumerate(servers.items())})
    manifest = Manifest(job="tiny", framework="test", comm_backend="test", world_size=len(hosts),
                        nodes=nodes, iterations=list(range(iterations)))
    recs = []
    for w, h in hosts.items():
        for it in range(iterations):
            t0 = 100.0 * it
            recs += [
                dict(node=w, host=h, op="FW", kind="FW", iteration=it, start=t0, dur=FW),
                dict(node=w, host=h, op="BW", kind="BW", iteration=it, start=t0 + FW, dur=BW),
                dict(node=w, host=h, op="UPDATE", kind="UPDATE", iteration=it, start=t0 + 50, dur=UPD),
            ]
    workers = list(hosts)
    coll = Collective(tensor="grad", op=op, bytes=nbytes, participants=workers,
                      algorithm="ring" if op == "allreduce" else "ps",
                      inputs={w: ["BW"] for w in workers}, outputs={w: ["UPDATE"] for w in workers},
                      partitions=list(partitions or []))
    return TraceSet(manifest=manifest, events=make_events(recs),
                    edges={w: [("FW", "BW"), ("BW", "UPDATE")] for w in workers}, collectives=[coll])


def ops_of(g: nx.DiGraph, kind: str) -> list[str]:
    return [k for k, d in g.nodes(data=True) if d["kind"] == kind]


# =========================================================================== ring AllReduce

@pytest.mark.parametrize("n", [2, 3])
def test_ring_send_recv_counts_chunks_and_transactions(n):
    hosts = {f"w{r}": f"h{r}" for r in range(n)}
    ts = make_job(hosts, nbytes=60)
    g = build_global_dfg(ts, comm_model=MODEL)
    sends, recvs = ops_of(g, "SEND"), ops_of(g, "RECV")
    # 2(N-1) steps, one SEND and one RECV per rank per step
    assert Counter(g.nodes[k]["node"] for k in sends) == {w: 2 * (n - 1) for w in hosts}
    assert Counter(g.nodes[k]["node"] for k in recvs) == {w: 2 * (n - 1) for w in hosts}
    # chunk size = 60 / N bytes (30 for N=2, 20 for N=3), link time = 3 + bytes
    for k in sends + recvs:
        assert g.nodes[k]["bytes"] == 60 // n
    for k in sends:
        assert g.nodes[k]["dur"] == approx(LAT + 60 / n)        # 33 or 23 us
        assert g.nodes[k]["source"] == "model"
    for k in recvs:
        assert g.nodes[k]["dur"] == 0
    # each SEND of rank r is paired (same txn, DFG edge) with exactly one RECV on rank r+1
    recv_by_txn = {g.nodes[k]["txn"]: k for k in recvs}
    assert len(recv_by_txn) == len(recvs) == len(sends)
    ranks = list(hosts)
    for k in sends:
        d = g.nodes[k]
        r = ranks.index(d["node"])
        nxt = ranks[(r + 1) % n]
        kr = recv_by_txn[d["txn"]]
        assert g.nodes[kr]["node"] == nxt
        assert d["peer"] == nxt and g.nodes[kr]["peer"] == d["node"]
        assert g.has_edge(k, kr)
        assert d["txn"] == txn_id("grad", d["phase"], d["step"], d["chunk"], d["node"], nxt)
        assert d["device"] == f"link:h{r}->h{(r + 1) % n}"
        assert g.nodes[kr]["device"] == f"{nxt}:comm"
        # phases: steps 0..N-2 reduce-scatter, N-1..2N-3 all-gather
        assert d["phase"] == ("reduce_scatter" if d["step"] < n - 1 else "all_gather")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_chunk_schedule_forwards_received_chunk(n):
    # rank r sends in step s the chunk it received in step s-1 (after step 0)
    hosts = {f"w{r}": f"h{r}" for r in range(n)}
    g = build_global_dfg(make_job(hosts, nbytes=120), comm_model=MODEL)
    send = {(g.nodes[k]["node"], g.nodes[k]["step"]): k for k in ops_of(g, "SEND")}
    for r in range(n):
        w = f"w{r}"
        assert g.nodes[send[w, 0]]["chunk"] == r               # reduce-scatter starts with own chunk r
        for s in range(1, 2 * (n - 1)):
            ks = send[w, s]
            preds = [p for p in g.predecessors(ks) if g.nodes[p]["kind"] == "RECV"]
            assert len(preds) == 1
            assert g.nodes[preds[0]]["step"] == s - 1
            assert g.nodes[preds[0]]["chunk"] == g.nodes[ks]["chunk"]
        # all-gather: every rank receives each chunk other than the one it reduced exactly once
        ag = [g.nodes[k]["chunk"] for k in ops_of(g, "RECV")
              if g.nodes[k]["node"] == w and g.nodes[k]["phase"] == "all_gather"]
        assert sorted(ag) == sorted(set(range(n)) - {(r + 1) % n})


def test_ring_uneven_chunk_sizes():
    # 10 bytes over 3 ranks: chunks 4, 3, 3 (split differ by at most one byte)
    hosts = {"w0": "h0", "w1": "h1", "w2": "h2"}
    g = build_global_dfg(make_job(hosts, nbytes=10), comm_model=MODEL)
    for k in ops_of(g, "SEND"):
        assert g.nodes[k]["bytes"] == {0: 4, 1: 3, 2: 3}[g.nodes[k]["chunk"]]
    assert sum(g.nodes[k]["bytes"] for k in ops_of(g, "SEND") if g.nodes[k]["step"] == 0) == 10


def test_ring_two_workers_iteration_time():
    # N=2, 60 bytes: chunk 30, T = 3 + 30 = 33 us; 2 steps in lock-step on the links h0->h1 and h1->h0.
    # FW 10 + BW 20 + 2 * 33 + UPDATE 4 = 100
    g = build_global_dfg(make_job({"w0": "h0", "w1": "h1"}, nbytes=60), comm_model=MODEL)
    res = replay(g)
    assert res.iteration_time_us == approx(100)
    df = res.to_frame(g)
    s = df[df["kind"] == "SEND"].set_index(["node", "step"])
    assert s.loc[("w0", 0), "start"] == approx(30) and s.loc[("w0", 0), "end"] == approx(63)   # 30 + 33
    assert s.loc[("w1", 1), "start"] == approx(63) and s.loc[("w1", 1), "end"] == approx(96)   # 63 + 33
    upd = df[df["kind"] == "UPDATE"].set_index("node")
    assert upd.loc["w0", "start"] == approx(96) and upd.loc["w1", "end"] == approx(100)


def test_ring_three_workers_iteration_time():
    # N=3, 60 bytes: chunk 20, T = 3 + 20 = 23 us; 4 steps.
    # 10 + 20 + 4 * 23 + 4 = 126
    g = build_global_dfg(make_job({"w0": "h0", "w1": "h1", "w2": "h2"}, nbytes=60), comm_model=MODEL)
    res = replay(g)
    assert res.iteration_time_us == approx(126)
    df = res.to_frame(g)
    sends = df[df["kind"] == "SEND"]
    # lock-step: every step s of every rank runs [30 + 23 s, 30 + 23 (s+1)]
    for row in sends.itertuples():
        assert row.start == approx(30 + 23 * row.step)
        assert row.end == approx(30 + 23 * (row.step + 1))


def test_ring_late_rank_holds_back_every_step_it_sends():
    # N=3, 60 bytes (T = 23 us per step); w2's BW ends at 90 instead of 30. Links L0 = h0->h1,
    # L1 = h1->h2, L2 = h2->h0. Hand schedule (a rank sends its steps in order; each forwards the
    # chunk it received in the step before):
    #   step 0: w0, w1 at 30-53 (L0, L1); w2 at 90-113 (L2, waits for its own gradients)
    #   step 1: w1 53-76 (got w0's chunk at 53); w2 113-136 (after its step 0); w0 113-136 (got w2's at 113)
    #   step 2: all three 136-159 (w0, w1 got their step-1 chunks at 136; w2 after its step 1)
    #   step 3: all three 159-182; UPDATE 182-186
    # Before the step chain, w2 forwarded w1's chunk at 53, before it had computed its own.
    ts = make_job({"w0": "h0", "w1": "h1", "w2": "h2"}, nbytes=60)
    ev = ts.events
    late = (ev["node"] == "w2") & (ev["op"] == "BW")
    ts.events.loc[late, "dur"] = 80.0
    g = build_global_dfg(ts, comm_model=MODEL)
    df = replay(g).to_frame(g)
    s = df[df["kind"] == "SEND"].set_index(["node", "step"])["start"]
    want = {("w0", 0): 30, ("w1", 0): 30, ("w2", 0): 90, ("w1", 1): 53, ("w2", 1): 113, ("w0", 1): 113}
    want.update({(w, 2): 136 for w in ("w0", "w1", "w2")})
    want.update({(w, 3): 159 for w in ("w0", "w1", "w2")})
    assert {k: round(float(v), 6) for k, v in s.items()} == want
    assert replay(g).iteration_time_us == approx(186)


def test_ring_several_iterations_do_not_overlap():
    # STEP_END(w) after UPDATE precedes FW of the next iteration: iterations are serial.
    # 3 iterations of 126 us (N=3 as above): makespan 378, iteration time 126.
    g = build_global_dfg(make_job({"w0": "h0", "w1": "h1", "w2": "h2"}, nbytes=60), comm_model=MODEL)
    res = replay(g, iterations=3)
    assert res.makespan_us == approx(378)       # 3 * 126
    assert res.iteration_time_us == approx(126)


def test_ring_two_ranks_on_one_host_use_private_links():
    # w0, w1 on host hA, w2 on hB: w0->w1 stays on the machine (private pair link),
    # w1->w2 and w2->w0 cross machines (host pair links).
    hosts = {"w0": "hA", "w1": "hA", "w2": "hB"}
    g = build_global_dfg(make_job(hosts, nbytes=60), comm_model=MODEL)
    links = {(g.nodes[k]["node"], g.nodes[k]["peer"]): g.nodes[k]["device"] for k in ops_of(g, "SEND")}
    assert links == {("w0", "w1"): "link:w0->w1", ("w1", "w2"): "link:hA->hB", ("w2", "w0"): "link:hB->hA"}
    # each link still carries one transfer per step: lock-step, same 126 us as with 3 hosts
    assert replay(g).iteration_time_us == approx(126)


def test_ring_two_workers_one_host():
    hosts = {"w0": "h", "w1": "h"}
    g = build_global_dfg(make_job(hosts, nbytes=60), comm_model=MODEL)
    devs = {g.nodes[k]["device"] for k in ops_of(g, "SEND")}
    assert devs == {"link:w0->w1", "link:w1->w0"}
    assert replay(g).iteration_time_us == approx(100)   # as with two hosts: 10 + 20 + 2 * 33 + 4


def test_ring_four_ranks_interleaved_on_two_hosts_contend_for_links():
    # w0, w2 on hA and w1, w3 on hB: ring w0->w1->w2->w3->w0 puts w0->w1 and w2->w3 on
    # link:hA->hB and w1->w2, w3->w0 on link:hB->hA -- two transfers per link per step.
    # 60 bytes / 4 = 15 bytes per chunk, T = 3 + 15 = 18 us.
    # step 0: on each link one transfer [30, 48], the other [48, 66];
    # step k: the rank that received first sends first; transfers end at 30 + (2k+1)T and 30 + (2k+2)T,
    # so the 6 steps end at 30 + 12 T = 30 + 216 = 246; + UPDATE 4 = 250.
    hosts = {"w0": "hA", "w1": "hB", "w2": "hA", "w3": "hB"}
    g = build_global_dfg(make_job(hosts, nbytes=60), comm_model=MODEL)
    links = Counter(g.nodes[k]["device"] for k in ops_of(g, "SEND"))
    assert links == {"link:hA->hB": 12, "link:hB->hA": 12}   # 2 ranks x 6 steps each
    res = replay(g)
    assert res.iteration_time_us == approx(250)
    busy = res.device_busy_us()
    assert busy["link:hA->hB"] == approx(216) and busy["link:hB->hA"] == approx(216)   # 12 * 18, no idle gap

    # the same 4 ranks placed w0, w1 on hA and w2, w3 on hB: only w1->w2 and w3->w0 cross
    # machines, each link carries one transfer per step: 30 + 6 * 18 + 4 = 142
    hosts2 = {"w0": "hA", "w1": "hA", "w2": "hB", "w3": "hB"}
    g2 = build_global_dfg(make_job(hosts2, nbytes=60), comm_model=MODEL)
    assert replay(g2).iteration_time_us == approx(142)


def test_ring_per_link_model_override():
    # a slower link h1->h0 (latency 13 instead of 3).  N=2, chunk 30: fast T = 33, slow T = 43.
    # step 0: w0 [30, 63] on h0->h1, w1 [30, 73] on h1->h0.
    # step 1: w0 forwards the chunk it received at 73: [73, 106] on h0->h1;
    #         w1 received at 63 but its link h1->h0 is busy until 73: [73, 116].
    # Out = 116 on both ranks (last RECV / own last SEND), UPDATE ends 116 + 4 = 120.
    model = CommModel(default=LinkModel(LAT, 1e6), per_link={"link:h1->h0": LinkModel(13.0, 1e6)})
    g = build_global_dfg(make_job({"w0": "h0", "w1": "h1"}, nbytes=60), comm_model=model)
    res = replay(g)
    assert res.iteration_time_us == approx(120)
    df = res.to_frame(g)
    s = df[df["kind"] == "SEND"].set_index(["node", "step"])
    assert (s.loc[("w1", 1), "start"], s.loc[("w1", 1), "end"]) == (approx(73), approx(116))
    assert (s.loc[("w0", 1), "start"], s.loc[("w0", 1), "end"]) == (approx(73), approx(106))


# =========================================================================== parameter server

def _ps(hosts, servers, partitions=None, nbytes=9):
    return build_global_dfg(make_job(hosts, op="push_pull", nbytes=nbytes, servers=servers,
                                     partitions=partitions), comm_model=MODEL)


def test_ps_structure():
    # 2 workers, 1 server, 2 partitions on that server: per partition 2 pushes + 2 pulls and one AGG
    g = _ps({"w0": "h0", "w1": "h1"}, {"s0": "hs"},
            partitions=[{"bytes": 5, "server": "s0"}, {"bytes": 4, "server": "s0"}])
    sends, recvs, aggs = ops_of(g, "SEND"), ops_of(g, "RECV"), ops_of(g, "AGG")
    assert len(sends) == len(recvs) == 8         # 2 partitions x 2 workers x (push + pull)
    assert len(aggs) == 2
    assert Counter((g.nodes[k]["node"], g.nodes[k]["phase"]) for k in sends) == {
        ("w0", "push"): 2, ("w1", "push"): 2, ("s0", "pull"): 4}
    recv_by_txn = {g.nodes[k]["txn"]: k for k in recvs}
    for k in sends:
        d = g.nodes[k]
        kr = recv_by_txn[d["txn"]]
        assert g.has_edge(k, kr)
        assert g.nodes[kr]["node"] == d["peer"]
        assert d["bytes"] == {0: 5, 1: 4}[d["chunk"]]
        assert d["dur"] == approx(LAT + d["bytes"])      # 8 or 7 us
        if d["phase"] == "push":
            assert d["device"] == f"link:h{d['node'][1]}->hs"
            # RECV of a push feeds the AGG of the same partition on the server
            assert list(g.successors(kr)) == [f"s0|AGG grad p{d['chunk']}"]
        else:
            assert d["device"] == f"link:hs->h{d['peer'][1]}"
            assert list(g.predecessors(k)) == [f"s0|AGG grad p{d['chunk']}"]
    for k in aggs:
        assert g.nodes[k]["device"] == "s0:compute"
        assert g.in_degree(k) == 2                         # one push RECV per worker


def test_ps_two_workers_distinct_hosts():
    # 9 bytes: T = 3 + 9 = 12 us.  push [30, 42] on link:h0->hs and link:h1->hs in parallel,
    # AGG (0 us) at 42, pulls [42, 54] on link:hs->h0 and link:hs->h1 in parallel, UPDATE [54, 58].
    g = _ps({"w0": "h0", "w1": "h1"}, {"s0": "hs"})
    res = replay(g)
    assert res.iteration_time_us == approx(58)     # 10 + 20 + 12 + 0 + 12 + 4
    df = res.to_frame(g)
    pulls = df[(df["kind"] == "SEND") & (df["phase"] == "pull")]
    assert sorted(pulls["start"]) == [approx(42), approx(42)]
    assert sorted(pulls["end"]) == [approx(54), approx(54)]


def test_ps_two_workers_one_host_pushes_and_pulls_contend():
    # both workers on host h: pushes share link:h->hs, pulls share link:hs->h.
    # pushes [30, 42] and [42, 54]; AGG at 54; pulls [54, 66] and [66, 78];
    # the later worker's UPDATE ends at 78 + 4 = 82.
    g = _ps({"w0": "h", "w1": "h"}, {"s0": "hs"})
    res = replay(g)
    assert res.iteration_time_us == approx(82)
    df = res.to_frame(g)
    assert set(df.loc[df["kind"] == "SEND", "device"]) == {"link:h->hs", "link:hs->h"}
    pulls = df[(df["kind"] == "SEND") & (df["phase"] == "pull")]
    assert sorted(pulls["end"]) == [approx(66), approx(78)]
    upd = df[df["kind"] == "UPDATE"]
    assert sorted(upd["end"]) == [approx(70), approx(82)]    # 66 + 4, 78 + 4


def test_ps_two_partitions_one_server_queue_on_worker_links():
    # 2 partitions of 9 bytes on s0 (T = 12 each). Each worker's two pushes share its link:
    # p0 [30, 42], p1 [42, 54].  AGG p0 at 42 -> pulls p0 [42, 54]; AGG p1 at 54 -> pulls p1 [54, 66].
    # Out at 66, UPDATE ends 70.
    g = _ps({"w0": "h0", "w1": "h1"}, {"s0": "hs"}, nbytes=18,
            partitions=[{"bytes": 9, "server": "s0"}, {"bytes": 9, "server": "s0"}])
    res = replay(g)
    assert res.iteration_time_us == approx(70)
    df = res.to_frame(g)
    agg = df[df["kind"] == "AGG"].set_index("chunk")
    assert agg.loc[0, "start"] == approx(42) and agg.loc[1, "start"] == approx(54)


def test_ps_two_partitions_two_servers_in_parallel():
    # p0 on s0 (host hs0), p1 on s1 (host hs1): every transfer has its own link.
    # pushes [30, 42], AGGs at 42, pulls [42, 54], UPDATE ends 58.
    g = _ps({"w0": "h0", "w1": "h1"}, {"s0": "hs0", "s1": "hs1"}, nbytes=18,
            partitions=[{"bytes": 9, "server": "s0"}, {"bytes": 9, "server": "s1"}])
    res = replay(g)
    assert res.iteration_time_us == approx(58)
    devs = {d["device"] for _, d in g.nodes(data=True) if d["kind"] == "SEND"}
    assert devs == {"link:h0->hs0", "link:h1->hs0", "link:h0->hs1", "link:h1->hs1",
                    "link:hs0->h0", "link:hs0->h1", "link:hs1->h0", "link:hs1->h1"}


def test_ps_servers_do_not_get_iteration_sources():
    # the server's only sources are RECVs, which never start an iteration:
    # iteration edges only go from a worker's STEP_END to that worker's FW.
    g = _ps({"w0": "h0", "w1": "h1"}, {"s0": "hs"})
    assert sorted(g.graph["iteration_edges"]) == [("w0|STEP_END", "w0|FW"), ("w1|STEP_END", "w1|FW")]
    # 3 serial iterations of 58 us
    res = replay(g, iterations=3)
    assert res.makespan_us == approx(174)       # 3 * 58
    assert res.iteration_time_us == approx(58)


def test_ps_step_pulls_wait_for_every_update():
    # ps_step (TF ParameterServerStrategy): 1 worker, 2 partitions of 9 bytes on s0 (T = 12 each).
    # pushes share link:h0->hs: p0 [30, 42], p1 [42, 54]; AGGs (0 us) at 42 and 54; "Updated" at 54;
    # only then the pulls, on link:hs->h0: p0 [54, 66], p1 [66, 78]; UPDATE [78, 82].
    # (ps / ps_async pull p0 right after its own AGG: [42, 54], p1 [54, 66], UPDATE ends at 70.)
    from dataclasses import replace
    ts = make_job({"w0": "h0"}, op="push_pull", nbytes=18, servers={"s0": "hs"},
                  partitions=[{"bytes": 9, "server": "s0"}, {"bytes": 9, "server": "s0"}])
    step = replace(ts, collectives=[replace(c, algorithm="ps_step", op="push_pull_step") for c in ts.collectives])
    g = build_global_dfg(step, comm_model=MODEL)
    res = replay(g)
    assert res.iteration_time_us == approx(82)
    df = res.to_frame(g)
    pulls = df[(df["kind"] == "SEND") & (df["phase"] == "pull")].set_index("chunk")
    assert pulls.loc[0, "start"] == approx(54) and pulls.loc[1, "end"] == approx(78)
    assert replay(build_global_dfg(ts, comm_model=MODEL)).iteration_time_us == approx(70)
    # a graph file of it is recognised as ps_step again
    from dpro_kit.graph.schemes import recognise
    assert recognise(g, {"w0": "w0|In grad"})[0] == "ps_step"
