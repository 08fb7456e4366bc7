"""Canonical trace model: round trips, validation of events, graph files, mean durations."""
from __future__ import annotations

import json

import networkx as nx
import pandas as pd
import pytest

from dpro_kit.costmodel import CommModel, LinkModel
from dpro_kit.errors import DproError, TraceFormatError
from dpro_kit.graph import add_op, build_global_dfg, load_graph, save_graph
from dpro_kit.trace import (EVENT_COLUMNS, Collective, Manifest, NodeInfo, TraceSet, load_trace, make_events,
                            save_trace)

HOSTS = {"w0": "hostA", "w1": "hostB"}


def make_traceset(iterations: int = 3) -> TraceSet:
    manifest = Manifest(job="roundtrip", framework="pytorch", comm_backend="nccl", world_size=2,
                        nodes={w: NodeInfo(host=h, role="worker", rank=r) for r, (w, h) in enumerate(HOSTS.items())},
                        iterations=list(range(iterations)), tool_version="test", created="2024-01-01T00:00:00",
                        extra={"note": "hand-made"})
    recs = []
    for r, (w, h) in enumerate(HOSTS.items()):
        for it in range(iterations):
            t0 = 1000.0 * it + 0.25 * r          # non-integer start times survive JSON
            recs += [
                dict(node=w, host=h, op="fw.conv1", name="conv1 forward", kind="FW", iteration=it,
                     start=t0, dur=10.5 + it),
                dict(node=w, host=h, op="bw.conv1", name="conv1 backward", kind="BW", iteration=it,
                     start=t0 + 20, dur=21.0 + 2 * it, tensor="conv1.weight"),
                dict(node=w, host=h, op="allreduce.b0", kind="COMM", iteration=it, start=t0 + 50, dur=30.0,
                     stream="comm", tensor="bucket0", bytes=4096, phase="allreduce"),
                dict(node=w, host=h, op="send.b0.s0", kind="SEND", iteration=it, start=t0 + 55, dur=7.0,
                     stream="comm", tensor="bucket0", bytes=2048, txn=f"bucket0:reduce_scatter:0:{r}:x",
                     phase="reduce_scatter", step=0, chunk=r, peer=f"w{1 - r}"),
                dict(node=w, host=h, op="h2d", kind="IO", iteration=it, start=t0 + 1, dur=0.0, stream="h2d"),
                dict(node=w, host=h, op="sgd", name="optimizer step", kind="UPDATE", iteration=it,
                     start=t0 + 90, dur=4.0),
            ]
    events = make_events(recs)
    edges = {w: [("h2d", "fw.conv1"), ("fw.conv1", "bw.conv1"), ("bw.conv1", "allreduce.b0"),
                 ("allreduce.b0", "sgd")] for w in HOSTS}
    colls = [
        Collective(tensor="bucket0", op="allreduce", bytes=4096, participants=["w0", "w1"], algorithm="ring",
                   inputs={w: ["bw.conv1"] for w in HOSTS}, outputs={w: ["sgd"] for w in HOSTS},
                   params=["conv1.weight", "conv1.bias"], priority=1.5),
        Collective(tensor="bucket1", op="allreduce", bytes=100, participants=["w0", "w1"], algorithm="ring",
                   inputs={w: ["fw.conv1"] for w in HOSTS}, outputs={w: ["sgd"] for w in HOSTS}),
    ]
    return TraceSet(manifest=manifest, events=events, edges=edges, collectives=colls)


def _sorted(ev: pd.DataFrame) -> pd.DataFrame:
    return ev.sort_values(["node", "iteration", "op"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- save / load

def test_save_load_round_trip(tmp_path):
    ts = make_traceset()
    out = save_trace(ts, tmp_path / "trace")
    assert (out / "manifest.json").exists()
    back = load_trace(out)
    # events: every column, dtype and value
    assert list(back.events.columns) == list(EVENT_COLUMNS)
    assert len(back.events) == 2 * 3 * 6       # 2 workers x 3 iterations x 6 ops
    pd.testing.assert_frame_equal(_sorted(back.events), _sorted(ts.events), check_exact=True)
    # local dependencies, in order
    assert back.edges == ts.edges
    # collectives: all fields (dataclass equality)
    assert back.collectives == ts.collectives
    # manifest facts
    m, m0 = back.manifest, ts.manifest
    assert (m.job, m.framework, m.comm_backend, m.world_size, m.iterations, m.tool_version, m.created,
            m.extra) == (m0.job, m0.framework, m0.comm_backend, m0.world_size, m0.iterations,
                         m0.tool_version, m0.created, m0.extra)
    assert {n: (i.host, i.role, i.rank) for n, i in m.nodes.items()} == {"w0": ("hostA", "worker", 0),
                                                                         "w1": ("hostB", "worker", 1)}
    assert back.path == str(out)


def test_round_trip_twice_is_stable(tmp_path):
    ts = make_traceset()
    back = load_trace(save_trace(ts, tmp_path / "a"))
    back2 = load_trace(save_trace(back, tmp_path / "b"))
    pd.testing.assert_frame_equal(_sorted(back2.events), _sorted(ts.events), check_exact=True)
    assert back2.collectives == ts.collectives and back2.edges == ts.edges


def test_round_trip_keeps_participant_without_local_ops(tmp_path):
    ts = make_traceset()
    ts.collectives.append(Collective(tensor="b2", op="allreduce", bytes=8, participants=["w0", "w1"],
                                     inputs={"w0": ["sgd"]}, outputs={"w0": ["sgd"]}))
    back = load_trace(save_trace(ts, tmp_path / "trace"))
    assert back.collectives[-1].participants == ["w0", "w1"]   # actual: ["w0"]


def test_save_trace_refuses_to_overwrite(tmp_path):
    ts = make_traceset()
    out = save_trace(ts, tmp_path / "trace")
    before = (out / "manifest.json").read_text()
    with pytest.raises(DproError, match="refusing to overwrite"):
        save_trace(ts, out)
    assert (out / "manifest.json").read_text() == before


def test_files_on_disk_leave_out_defaults(tmp_path):
    out = save_trace(make_traceset(), tmp_path / "trace")
    doc = json.loads((out / "hostA" / "w0" / "events.json").read_text())
    assert doc["node"] == "w0" and doc["version"] == 1
    first = doc["events"][0]
    # node/host are implied by the folder; stream "compute", bytes 0, step -1 ... are defaults
    assert first == {"op": "fw.conv1", "name": "conv1 forward", "kind": "FW", "iteration": 0,
                     "start": 0.0, "dur": 10.5}


# --------------------------------------------------------------------------- make_events validation

GOOD = dict(op="a", kind="FW", iteration=0, start=0.0, dur=1.0)


@pytest.mark.parametrize("bad, what", [
    (dict(dur=float("nan")), "dur"),
    (dict(dur=-1.0), "dur"),
    (dict(dur=float("inf")), "dur"),
    (dict(start=float("nan")), "start"),
    (dict(start=float("inf")), "start"),
    (dict(kind="FORWARD"), "kind"),
    (dict(dur="slow"), "dur"),
])
def test_make_events_rejects_bad_values_naming_the_record(bad, what):
    recs = [dict(GOOD), dict(GOOD, op="b", **bad), dict(GOOD, op="c")]
    with pytest.raises(TraceFormatError) as ei:
        make_events(recs, path="node/events.json")
    msg = str(ei.value)
    assert "events[1]" in msg                  # the second record
    assert msg.startswith("node/events.json")  # and the file
    assert what in msg


def test_make_events_unknown_kind_lists_known_kinds():
    with pytest.raises(TraceFormatError) as ei:
        make_events([dict(GOOD), dict(GOOD, op="x", kind="FORWARD")])
    msg = str(ei.value)
    assert "unknown op kind 'FORWARD'" in msg and "events[1]" in msg and "'x'" in msg
    assert "FW" in msg and "UPDATE" in msg     # the hint names the valid kinds


@pytest.mark.parametrize("field", ["op", "kind", "iteration", "start", "dur"])
def test_make_events_missing_field_in_one_record(field):
    rec = dict(GOOD, op="b")
    del rec[field]
    with pytest.raises(TraceFormatError) as ei:
        make_events([dict(GOOD), dict(GOOD, op="a2"), rec])
    msg = str(ei.value)
    assert "events[2]" in msg and repr(field) in msg and "missing" in msg


def test_make_events_missing_field_in_all_records():
    with pytest.raises(TraceFormatError, match=r"required field 'dur'"):
        make_events([{k: v for k, v in GOOD.items() if k != "dur"}])


def test_make_events_accepts_zero_duration_and_fills_defaults():
    ev = make_events([dict(GOOD, dur=0)])
    row = ev.iloc[0]
    assert row["dur"] == 0.0 and row["stream"] == "compute" and row["bytes"] == 0
    assert row["step"] == -1 and row["chunk"] == -1 and row["txn"] == ""
    assert str(ev["dur"].dtype) == "float64" and str(ev["iteration"].dtype) == "int64"


# --------------------------------------------------------------------------- graph files

def sample_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    add_op(g, "w0|FW", node="w0", device="w0:compute", kind="FW", dur=10.5, name="fw")
    add_op(g, "w0|In t", node="w0", kind="VIRTUAL", dur=0.0, tensor="t", bytes=64)
    add_op(g, "w0|SEND t:x", node="w0", device="link:hA->hB", kind="SEND", dur=3.25, tensor="t", bytes=32,
           txn="t:reduce_scatter:0:0:w0->w1", phase="reduce_scatter", step=0, chunk=0, peer="w1",
           priority=2.0, source="model")
    add_op(g, "w1|RECV t:x", node="w1", device="w1:comm", kind="RECV", dur=0.0, tensor="t", bytes=32,
           txn="t:reduce_scatter:0:0:w0->w1", phase="reduce_scatter", step=0, chunk=0, peer="w0")
    add_op(g, "w0|STEP_END", node="w0", kind="VIRTUAL", dur=0.0)
    g.add_edges_from([("w0|FW", "w0|In t"), ("w0|In t", "w0|SEND t:x"), ("w0|SEND t:x", "w1|RECV t:x"),
                      ("w0|FW", "w0|STEP_END")])
    g.graph["iteration_edges"] = [("w0|STEP_END", "w0|FW")]
    g.graph["meta"] = {"job": "j", "world_size": 2, "hosts": {"w0": "hA", "w1": "hB"}}
    return g


@pytest.mark.parametrize("suffix", [".json", ".graphml"])
def test_graph_file_round_trip(tmp_path, suffix):
    g = sample_graph()
    path = tmp_path / f"dfg{suffix}"
    save_graph(g, path)
    h = load_graph(path)
    assert list(h.nodes) == list(g.nodes)
    assert {k: dict(d) for k, d in h.nodes(data=True)} == {k: dict(d) for k, d in g.nodes(data=True)}
    for k, d in h.nodes(data=True):   # types survive: numbers stay numbers, strings strings
        assert isinstance(d["dur"], float) and isinstance(d["step"], int) and isinstance(d["txn"], str)
    assert set(h.edges) == set(g.edges)
    assert h.graph["iteration_edges"] == [("w0|STEP_END", "w0|FW")]
    assert h.graph["meta"] == g.graph["meta"]
    assert isinstance(h, nx.DiGraph) and h.is_directed()


def test_graph_unknown_suffix_rejected(tmp_path):
    with pytest.raises(DproError, match="unknown graph file type"):
        save_graph(sample_graph(), tmp_path / "g.pickle")


def test_graph_json_not_a_dpro_graph(tmp_path):
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(TraceFormatError, match="not a dpro graph file"):
        load_graph(p)


def test_built_graph_round_trips_and_replays_the_same(tmp_path):
    from dpro_kit.replay import replay
    ts = make_traceset()
    g = build_global_dfg(ts, comm_model=CommModel(default=LinkModel(2.0, 1e6)))
    for suffix in (".json", ".graphml"):
        save_graph(g, tmp_path / f"g{suffix}")
        h = load_graph(tmp_path / f"g{suffix}")
        assert set(h.edges) == set(g.edges)
        assert sorted(h.graph["iteration_edges"]) == sorted(g.graph["iteration_edges"])
        assert replay(h).makespan_us == replay(g).makespan_us


# --------------------------------------------------------------------------- mean durations

def test_build_global_dfg_uses_mean_durations():
    ts = make_traceset(iterations=3)
    g = build_global_dfg(ts, comm_model=CommModel(default=LinkModel(2.0, 1e6)))
    # fw.conv1: 10.5, 11.5, 12.5 -> mean 11.5;  bw.conv1: 21, 23, 25 -> mean 23;  sgd 4; h2d 0
    assert g.nodes["w0|fw.conv1"]["dur"] == pytest.approx(11.5)
    assert g.nodes["w1|fw.conv1"]["dur"] == pytest.approx(11.5)
    assert g.nodes["w0|bw.conv1"]["dur"] == pytest.approx(23.0)
    assert g.nodes["w0|sgd"]["dur"] == 4.0
    assert g.nodes["w0|h2d"]["dur"] == 0.0
    assert g.nodes["w0|h2d"]["device"] == "w0:h2d"
    assert g.nodes["w0|fw.conv1"]["device"] == "w0:compute"
    assert g.nodes["w0|fw.conv1"]["name"] == "conv1 forward"
    # the coarse COMM op is not a vertex: its dependency-file edges are contracted
    # (bw.conv1 -> allreduce.b0 -> sgd becomes bw.conv1 -> sgd)
    assert "w0|allreduce.b0" not in g
    assert g.has_edge("w0|bw.conv1", "w0|sgd")


def test_mean_durations_with_an_op_missing_in_one_iteration():
    # op "x" ran in iterations 0 and 2 only: mean of the two observations (2 + 6) / 2 = 4
    recs = [dict(node="w0", host="h", op="x", kind="FW", iteration=0, start=0, dur=2),
            dict(node="w0", host="h", op="x", kind="FW", iteration=2, start=0, dur=6),
            dict(node="w0", host="h", op="y", kind="BW", iteration=0, start=5, dur=1),
            dict(node="w0", host="h", op="y", kind="BW", iteration=1, start=5, dur=1),
            dict(node="w0", host="h", op="y", kind="BW", iteration=2, start=5, dur=1)]
    ts = TraceSet(manifest=Manifest(job="j", framework="f", comm_backend="c", world_size=1,
                                    nodes={"w0": NodeInfo(host="h")}, iterations=[0, 1, 2]),
                  events=make_events(recs), edges={"w0": [("x", "y")]}, collectives=[])
    g = build_global_dfg(ts, comm_model=CommModel())
    assert g.nodes["w0|x"]["dur"] == pytest.approx(4.0)
    assert g.nodes["w0|y"]["dur"] == pytest.approx(1.0)
    from dpro_kit.replay import replay
    assert replay(g).makespan_us == pytest.approx(5.0)   # x (4) then y (1) on w0:compute
