"""The dpro collector's Kineto files are read as a stream, like plain torch.profiler files.

Until 2026-11-27 ``torch_kineto.read_node`` (and the Horovod reader) loaded each rank's
``kineto_trace.json[.gz]`` as one JSON document (``kineto.load_doc``) and parsed it, with no check of
the memory it needs: reading two real 307 MB rank files from an H100 (docs/scale.md, "Real rank
files from an H100") peaked at 2,255 MB that way, 1,526 MB streamed.  Now they use ``kineto.read_file`` (the streaming
parse, the other top-level keys and the ``[memory]`` events), so the bound and the early refusal of
docs/reliability.md ("Memory") hold for them too.  Checked here on the real collector traces of
the repository (gloo on CPUs, NCCL on an H100): the node read as a stream equals the node parsed
from the whole document, table for table.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from dpro_kit.cli import main
from dpro_kit.readers import kineto as K
from dpro_kit.readers import torch_kineto as T
from dpro_kit.trace import Manifest, load_manifest

ROOT = Path(__file__).resolve().parents[1]
NODES = [ROOT / "examples" / "traces" / p for p in
         ("ddp-2rank-gloo/host0/1", "ddp-h100-2rank-nccl-cnn/host0/0", "ddp-3host-200mbit-slowed/host2/2")] + \
        [ROOT / "bench" / "gpu-traces" / "h100-2026-11-27" / "ddp-transformer-b64" / "host1" / "1"]


def _whole_document(manifest: Manifest, d: Path):
    """The node as read before: the whole document loaded, then parsed."""
    meta = T._load_meta(d)
    path = d / meta["trace_file"]
    if not path.exists():
        path = path.with_name(path.name + ".gz")
    facts = manifest.facts
    ranks = {int(i.rank): n for n, i in manifest.nodes.items() if i.role == "worker"}
    return T.parse_node(meta, K.load_doc(path), path=path, fold_gaps=facts.host_gaps != "keep",
                        overhead=facts.profiler_overhead, node_of_rank=ranks)


@pytest.mark.parametrize("d", NODES, ids=lambda d: "/".join(d.parts[-4:]))
def test_streamed_node_equals_the_whole_document(d: Path):
    job = d.parents[1]
    manifest = load_manifest(job)
    node = next(n for n in manifest.nodes if (job / manifest.node_dir(n)).resolve() == d.resolve())
    got = T.read_node(manifest, node, d)
    ref = _whole_document(manifest, d)
    pd.testing.assert_frame_equal(got.events, ref.events, check_exact=True)
    assert len(got.events) > 100
    assert got.edges == ref.edges and got.collectives == ref.collectives and got.warnings == ref.warnings
    assert (got.memory is None) == (ref.memory is None)
    if got.memory is not None:
        pd.testing.assert_frame_equal(got.memory, ref.memory, check_exact=True)


def test_memory_samples_survive_the_stream(tmp_path: Path):
    """``[memory]`` events (``dpro profile --memory``) are the one part of the document kept whole:
    the stand-in ``read_file`` returns gives the same samples as the document."""
    src = ROOT / "bench" / "gpu-traces" / "h100-2026-11-27" / "ddp-transformer-b64" / "host0" / "0"
    doc = json.loads(gzip.decompress((src / "kineto_trace.json.gz").read_bytes()))
    base = doc["traceEvents"][0]["ts"]
    doc["traceEvents"][5:5] = [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                                "tid": 1, "ts": base + k, "args": {"Total Allocated": 1000 * k, "Device Type": 1,
                                                                   "Device Id": 0}} for k in range(3)]
    f = tmp_path / "kineto_trace.json"
    f.write_text(json.dumps(doc))
    kt, small = K.read_file(f)
    assert [e for e in small["traceEvents"] if e["name"] == "[memory]"] == small["traceEvents"]
    assert K.memory_samples(small) == K.memory_samples(doc) and len(K.memory_samples(small)) == 3
    assert small["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]
    ref = K.parse(doc, f)
    assert len(kt.cpu) == len(ref.cpu) and sum(map(len, kt.cpu.values())) == sum(map(len, ref.cpu.values()))


def test_a_collector_file_too_big_for_the_memory_is_refused_before_reading(tmp_path: Path, capsys, monkeypatch):
    """The check of docs/reliability.md now covers the collector's files: one line naming the file, exit 2."""
    from dpro_kit import resources
    job = tmp_path / "job"
    shutil.copytree(ROOT / "examples" / "traces" / "ddp-2rank-gloo", job)
    monkeypatch.setattr(K, "MEMORY_CHECK_MIN_BYTES", 100_000)
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 50 << 20)
    assert main(["replay", str(job), "-q"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "kineto_trace.json" in err[0] and "GiB of memory" in err[0] \
        and "0.0 GiB is available" in err[0], err
    monkeypatch.setenv("DPRO_MEMORY_CHECK", "0")
    assert main(["replay", str(job), "-q", "--json"]) == 0
