"""The streaming Kineto reader (issue 19, bounded memory) gives what the whole-document reader gives.

:func:`dpro_kit.readers.kineto.parse_file` reads a file as a stream (:func:`iter_events`,
``json.JSONDecoder.raw_decode`` over chunks of the ``traceEvents`` array) instead of
``json.loads`` of the whole text (:func:`load_doc` + :func:`parse`).  Compared here on every
real Kineto file the project has (the HTA traces in ``../shared/traces/hta`` and the dpro
collector's traces in ``examples/traces``), also with chunks of a few characters (every value
cut across refills), and on broken files built from them (the same one-line errors).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import shared_traces
from dpro_kit.errors import DproError
from dpro_kit.readers import kineto as K
from dpro_kit.readers import kineto_plain as P
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
HTA = shared_traces() / "hta"
FILES = sorted(HTA.glob("*.json.gz")) + sorted((REPO / "examples" / "traces").rglob("kineto_trace.json*"))


def _facts(tr: K.KinetoTrace) -> dict:
    """Everything a KinetoTrace holds, with events named by their record index."""
    evs = [e for d in (tr.cpu, tr.gpu) for lane in d.values() for e in lane]
    by_id = {id(e): e.index for e in evs}
    return {
        "cpu": {str(k): [(e.index, e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.start_ns, e.dur_ns, e.args,
                          e.parent.index if e.parent else None, [c.index for c in e.children]) for e in v]
                for k, v in tr.cpu.items()},
        "gpu": {str(k): [(e.index, e.name, e.ts, e.dur, e.start_ns, e.dur_ns, e.args) for e in v]
                for k, v in tr.gpu.items()},
        "launch": sorted((by_id[k], v.index) for k, v in tr.launch.items()),
        "steps": [(s.number, s.start, s.end) for s in tr.steps],
        "distributed": tr.distributed, "threads": {str(k): v for k, v in tr.thread_names.items()},
        "flows": tr.n_flows, "fwdbwd": [(a.index, b.index) for a, b in tr.fwdbwd], "devices": tr.devices,
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name + "/" + p.name)
def test_stream_parse_equals_whole_document(path):
    assert FILES, "no Kineto file found"
    whole = _facts(K.parse(K.load_doc(path), path))
    assert whole["cpu"]
    assert _facts(K.parse_file(path)) == whole


def test_tiny_chunks_cut_every_value(monkeypatch):
    """Refills every 7 characters: each event, string, number and key crosses a chunk boundary."""
    path = HTA / "sampled_128rank_rank1.json.gz" if HTA.is_dir() else FILES[-1]
    doc = K.load_doc(path)
    monkeypatch.setattr(K, "_CHUNK", 7)
    header: dict = {}
    events = list(K.iter_events(path, header))
    assert events == doc["traceEvents"]
    assert header == {k: v for k, v in doc.items() if k != "traceEvents"}


def test_plain_folder_reads_the_same(tmp_path):
    """The reader of plain folders (now streamed) builds the same rank table as parse_rank of the whole document."""
    if not HTA.is_dir():
        pytest.skip(f"real Kineto traces not found at {HTA}")
    d = tmp_path / "r128"
    d.mkdir()
    for f in ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"):
        shutil.copy(HTA / f, d / f)
    ts = load_trace(d)
    for node in ts.manifest.workers():
        p = d / ts.manifest.nodes[node].file
        ref = P.parse_rank(K.parse(K.load_doc(p), p), iterations=ts.manifest.iterations).events
        got = ts.events[ts.events["node"] == node].drop(columns=["node", "host"]).reset_index(drop=True)
        ref = ref.reset_index(drop=True)[list(got.columns)].astype(got.dtypes.to_dict())
        assert got.equals(ref), node


def _broken(tmp_path: Path) -> dict[str, bytes]:
    src = FILES[0]
    text = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
    doc = json.loads(text)
    return {
        "empty.json": b"",
        "cut.json": text[: len(text) // 2],
        "cut_end.json": text.rstrip()[:-1],
        "invalid.json": text[:1000] + b"@" + text[1001:],
        "extra.json": text + b" {}",
        "array.json": b"[1, 2]",
        "no_events.json": json.dumps({"x": 1}).encode(),
        "events_not_list.json": json.dumps({"traceEvents": {"a": 1}}).encode(),
        "events_true.json": json.dumps({"traceEvents": True}).encode(),
        "events_empty.json": json.dumps(dict(doc, traceEvents=[])).encode(),
        "not_utf8.json": text[:5000] + b"\xff\xfe" + text[5000:],
        "cut.json.gz": gzip.compress(text)[:-100],
        "corrupt.json.gz": gzip.compress(text)[:5000] + b"\x00" * 100 + gzip.compress(text)[5100:],
        "lines.json": json.dumps(doc, indent=1).encode()[:-30],
    }


def test_broken_files_give_the_same_line(tmp_path):
    for name, data in _broken(tmp_path).items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(DproError) as whole:
            K.load_doc(p)
        with pytest.raises(DproError) as stream:
            for _ in K.iter_events(p, {}):
                pass
        if name == "corrupt.json.gz":
            # a stream sees the garbage a corrupt deflate block decodes to before the gzip checksum: its
            # line names the JSON error there (the whole-file reader checks the checksum first)
            assert "invalid JSON at line" in str(stream.value) or "corrupt gzip" in str(stream.value), name
        else:
            assert str(stream.value) == str(whole.value), name
        assert "\n" not in str(stream.value) and str(p) in str(stream.value)


def test_big_file_reports_progress(tmp_path, monkeypatch):
    """A file over PROGRESS_MIN_BYTES reports MB read to FILE_PROGRESS (dpro replay prints it on a terminal)."""
    monkeypatch.setattr(K, "PROGRESS_MIN_BYTES", 1)
    monkeypatch.setattr(K, "_CHUNK", 1 << 16)
    seen: list[tuple[str, int, int]] = []
    token = K.FILE_PROGRESS.set(lambda label: (lambda done, total: seen.append((label, done, total))))
    try:
        K.parse_file(FILES[0])
    finally:
        K.FILE_PROGRESS.reset(token)
    assert seen and seen[0][0] == f"reading {FILES[0].name} (MB)"
    assert seen[-1][1] == seen[-1][2]
