"""The generic Kineto layer (dpro_kit/readers/kineto.py) on the real traces in examples/traces,
and the dpro-collector layer (readers/torch_kineto.py) built on it.

The traces are the recorded `dpro profile` runs described in each folder's README.md.
"""
from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from dpro_kit.readers import kineto as K
from dpro_kit.readers import torch_kineto as T

ROOT = Path(__file__).resolve().parents[1]
GLOO = ROOT / "examples" / "traces" / "ddp-2rank-gloo" / "host0" / "0"
TWOHOST = ROOT / "examples" / "traces" / "ddp-2host-1000mbit" / "host0" / "0"


def _trace(node_dir: Path) -> tuple[dict, K.KinetoTrace, Path]:
    meta = json.loads((node_dir / "meta.json").read_text())
    path = node_dir / meta["trace_file"]
    doc = K.load_doc(path)
    return meta, K.parse(doc, path), path


def test_times_are_the_exact_nanoseconds_written():
    """start_ns/dur_ns equal the decimal text of ts/dur (+ baseTimeNanoseconds) for every event.

    This trace's ts are ~4.4e12 us: ``round(ts * 1000)`` on the float is 1 ns off for
    hundreds of its events (e.g. 4441180524680.307 -> ...306), which the old copy in
    torch_kineto used."""
    path = GLOO / "kineto_trace.json"
    text = json.loads(path.read_text(), parse_float=Decimal)
    base = int(text.get("baseTimeNanoseconds", 0))
    want = {i: (int(Decimal(e["ts"]) * 1000) + base, int(Decimal(e.get("dur", 0)) * 1000))
            for i, e in enumerate(text["traceEvents"]) if e.get("ph") == "X"}
    tr = K.parse(K.load_doc(path), path)
    got = [e for evs in tr.cpu.values() for e in evs]
    assert len(got) > 1000
    assert all((e.start_ns, e.dur_ns) == want[e.index] for e in got)
    floats = json.loads(path.read_text())["traceEvents"]
    assert sum(1 for i, (ns, _) in want.items() if round(float(floats[i]["ts"]) * 1000) + base != ns) > 100


def test_call_tree_sizes_cover_every_event_once():
    """Each event lies in exactly one root's subtree; counted=False removes exactly those events."""
    _, tr, _ = _trace(TWOHOST)
    for evs in tr.cpu.values():
        roots = [e for e in evs if e.parent is None]
        sizes = K.subtree_sizes(evs)
        assert sum(sizes[id(r)] for r in roots) == len(evs)
        marker = lambda e: e.name.startswith(T.MARKER_NS)  # noqa: E731
        sizes2 = K.subtree_sizes(evs, counted=lambda e: not marker(e))
        assert sum(sizes2[id(r)] for r in roots) == len(evs) - sum(map(marker, evs))
        for e in evs:   # children inside their parent
            assert all(e.start_ns <= c.start_ns and c.end_ns <= e.end_ns for c in e.children)


def test_top_level_with_transparent_markers_never_nests_or_returns_a_marker():
    meta, tr, _ = _trace(TWOHOST)
    main = next(k for k in tr.cpu if k[1] == meta["main_tid"])
    plain_tops = K.top_level(tr.cpu[main])
    tops = K.top_level(tr.cpu[main], transparent=lambda e: e.name.startswith(T.MARKER_NS))
    assert any(e.name.startswith("dpro::") for e in plain_tops)      # empty marker ranges are ops without it
    assert not any(e.name.startswith("dpro::") for e in tops)
    assert len(tops) > 100
    chosen = {id(e) for e in tops}
    for e in tops:   # no top-level op inside another
        assert not any(id(a) in chosen for a in _ancestors(e))


def _ancestors(e):
    out = []
    while e.parent is not None:
        e = e.parent
        out.append(e)
    return out


def test_forward_backward_flows_link_forward_ops_to_their_backward_ops():
    """Kineto's fwdbwd flows: 65 in this trace; every backward end runs inside dpro::backward and
    after its forward op, and is an autograd node (``*Backward<k>``)."""
    _, tr, _ = _trace(TWOHOST)
    doc = K.load_doc(TWOHOST / "kineto_trace.json.gz")
    ids = {e["id"] for e in doc["traceEvents"] if e.get("cat") == "fwdbwd" and e.get("ph") == "s"} & \
          {e["id"] for e in doc["traceEvents"] if e.get("cat") == "fwdbwd" and e.get("ph") == "f"}
    assert len(tr.fwdbwd) == len(ids) == 65
    bw_ranges = [e for evs in tr.cpu.values() for e in evs if e.name == "dpro::backward"]
    for fw, bw in tr.fwdbwd:
        assert fw.cat == bw.cat == "cpu_op"
        assert fw.end_ns <= bw.start_ns
        assert "Backward" in bw.name and "Backward" not in fw.name
        assert any(r.start_ns <= bw.start_ns < r.end_ns for r in bw_ranges)


def test_dpro_layer_reads_only_through_the_generic_layer():
    """The collector layer's ops are the generic layer's top-level events (markers looked through):
    same names, same exact nanosecond starts on the training thread."""
    meta, tr, path = _trace(TWOHOST)
    nt = T.parse_node(meta, K.load_doc(path), path=path, fold_gaps=False, overhead="keep")
    main = next(k for k in tr.cpu if k[1] == meta["main_tid"])
    tops = {(e.name, e.start_ns) for e in K.top_level(tr.cpu[main], transparent=lambda e: e.name.startswith("dpro::"))}
    ev = nt.events[(nt.events["stream"] == "compute") & ~nt.events["op"].str.contains("/")]
    assert len(ev) > 100
    by_name: dict[str, list[int]] = {}
    for name, start in tops:
        by_name.setdefault(name, []).append(start)
    for name, start_us in zip(ev["name"], ev["start"]):   # float us since the epoch: 0.25 us steps
        assert min(abs(s / 1e3 - start_us) for s in by_name[name]) <= 0.5, name
