"""dpro_kit/schema.py: one definition of manifest.json / meta.json shared by the collector and the
readers, its one-line validation errors, the typed facts of manifest.extra.

Inputs are the real recorded traces in examples/traces (see their README.md); bad variants are
those files with one value changed, in a tmp copy (the examples are never written).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit import schema as S
from dpro_kit.cli import main
from dpro_kit.errors import TraceFormatError
from dpro_kit.trace import load_manifest

ROOT = Path(__file__).resolve().parents[1]
# the PyTorch collector's recordings (the MXNet one is tests/test_mxnet.py's)
TRACES = sorted(p for p in (ROOT / "examples" / "traces").iterdir() if (p / "manifest.json").is_file()
                and json.loads((p / "manifest.json").read_text()).get("framework") == "pytorch")
TWOHOST = ROOT / "examples" / "traces" / "ddp-2host-1000mbit"


def test_importing_the_schema_loads_only_the_standard_library():
    """dpro_kit.schema needs nothing but the standard library and dpro_collect (collectors/common), which
    dpro_kit finds beside it in a checkout (tests/test_collector_imports.py: what collectors import)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import dpro_kit.schema; "
            "mods = [m for m in sys.modules if not m.startswith('_') and m.split('.')[0] not in sys.stdlib_module_names]; "
            "print(sorted(mods))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                         check=True).stdout
    assert sorted(eval(out)) == ["dpro_collect", "dpro_collect.errors", "dpro_collect.files",   # noqa: S307 (our output)
                                 "dpro_collect.schema", "dpro_kit", "dpro_kit.errors", "dpro_kit.schema"]


def test_collector_uses_the_schema_definitions():
    from dpro_torch import manifest as CM
    from dpro_torch import markers as M
    assert M.as_dict() == S.MARKERS and M.META_FORMAT == S.TORCH_META_FORMAT and M.META_VERSION == S.TORCH_META_VERSION
    assert (CM.MANIFEST_FORMAT, CM.MANIFEST_VERSION, CM.RAW_FORMAT) == \
        (S.MANIFEST_FORMAT, S.MANIFEST_VERSION, S.TORCH_RAW_FORMAT)
    assert {M.FORWARD: "FW", M.BACKWARD: "BW", M.OPTIMIZER: "UPDATE"} == M.PHASES


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_recorded_files_validate(trace: Path):
    man = json.loads((trace / "manifest.json").read_text())
    assert S.validate_manifest(man, trace / "manifest.json") is man
    metas = sorted(trace.glob("*/*/meta.json"))
    assert len(metas) == man["world_size"]
    for p in metas:
        meta = json.loads(p.read_text())
        S.validate_torch_meta(meta, p)
        # what the collector wrote is what the reader reads (older recordings lack dpro::calibrate)
        assert meta["markers"].items() <= S.MARKERS.items() and len(meta["markers"]) >= 6


def test_facts_are_the_typed_extra_of_a_real_manifest():
    m = load_manifest(TWOHOST)
    extra, f = m.extra, m.facts
    assert f.measured_iteration_ms == extra["measured_iteration_ms"] == 36.2473
    assert f.measured_iteration_ms_per_node == extra["measured_iteration_ms_per_node"]
    assert f.profiled_iteration_ms == extra["profiled_iteration_ms"]
    assert f.collective_latency_us == extra["comm_calibration"]["median_us"] == 107.5
    assert (f.optimizer_class, f.optimizer_state_bytes) == ("SGD", extra["optimizer"]["state_bytes"])
    assert f.ddp == extra["ddp"] and set(f.cpu_placement) == set(m.workers())
    assert (f.collector, f.run_id, f.host_gaps, f.profiler_overhead) == ("dpro_torch", extra["run_id"], "fold", "window")
    assert not f.plain_kineto and f.offsets_us == {} and f.peak_memory_bytes == {}


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "t"
    shutil.copytree(TWOHOST, dst, ignore=shutil.ignore_patterns("aligned"))
    return dst


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _bad(args: list[str], capsys, *must: str) -> str:
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for s in must:
        assert s in err, err
    return err


@pytest.mark.parametrize("change, record, what", [
    (lambda d: d.update(world_size="2"), "world_size", "must be an integer"),
    (lambda d: d["nodes"]["host1/1"].update(rank="1"), "nodes.host1/1.rank", "must be an integer"),
    (lambda d: d["extra"].update(measured_iteration_ms="36 ms"), "extra.measured_iteration_ms", "must be"),
    (lambda d: d["extra"].update(torch_kineto={"profiler_overhead": "half"}), "extra.torch_kineto", "half"),
    (lambda d: d.update(iterations=[15, "16"]), "iterations", "integers"),
])
def test_bad_manifest_one_line_names_file_record_and_fix(tmp_path: Path, capsys, change, record, what):
    t = _copy(tmp_path)
    _edit(t / "manifest.json", change)
    err = _bad(["replay", str(t)], capsys, str(t / "manifest.json"), f"[{record}]", what)
    assert "fix or remove" in err or "use one of" in err or "re-create" in err     # says what to do


@pytest.mark.parametrize("change, record, what", [
    (lambda d: d["ddp"][0]["params"][1].pop("bytes"), "ddp[0].params[1]", "missing field 'bytes'"),
    (lambda d: d["ddp"][0]["params"][0].update(layer=3), "ddp[0].params[0].layer", "must be a string"),
    (lambda d: d["ddp"][0]["buckets"][0]["params"].append(999), "ddp[0].buckets[0]", "missing from meta.json"),
    (lambda d: d.update(window=[15, 20]), "window", "must be an object"),
    (lambda d: d.update(version=7), "", "unsupported meta.json version 7"),
])
def test_bad_meta_one_line_names_file_record_and_fix(tmp_path: Path, capsys, change, record, what):
    t = _copy(tmp_path)
    meta = t / "host1" / "1" / "meta.json"
    _edit(meta, change)
    err = _bad(["replay", str(t)], capsys, str(meta), f"[{record}]" if record else "", what)
    assert "re-collect" in err or "understands versions" in err


def test_validate_names_the_record_directly():
    with pytest.raises(TraceFormatError) as e:
        S.validate_manifest({"format": "dpro-trace", "version": 1, "job": "j", "framework": "pytorch",
                             "comm_backend": "gloo", "world_size": 1, "iterations": [1],
                             "nodes": {"h/0": {"host": "h", "role": "boss"}}}, "m.json")
    assert str(e.value).startswith("m.json [nodes.h/0]: role must be 'worker' or 'server', got 'boss' (re-create")
