"""Per-host ``dpro profile`` on 2 emulated hosts, no coordination by the user (issue 11, item 1).

Real jobs: each emulated host (network namespace, dpro_kit.cluster) runs its own ``dpro profile
--host hostN -- python examples/ddp/train.py`` -- one launcher per machine, as multi-node jobs
are launched -- (a) into one shared folder, (b) each into its own folder, copied together
afterwards with plain ``cp -r``. No manifest.json is written by anyone; ``dpro replay DIR --json``
must work with no extra step (the loader builds the manifest from the per-rank meta.json). A
rank folder of an older run left in the folder must be ignored and named on stderr.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import netns_unusable_reason  # noqa: E402

PREFIX = "dpmh"
PY = sys.executable
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "ddp" / "train.py"
_REASON = netns_unusable_reason(PREFIX)
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


def _profile_per_host(outs: list[Path], port: int) -> list[str]:
    """One ``dpro profile`` per emulated host (host i writes into outs[i]); their stderr."""
    from dpro_kit.cluster import EmulatedCluster
    with EmulatedCluster(2, rate_mbit=1000, prefix=PREFIX) as c:
        procs = []
        for i in range(2):
            env = {"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            cmd = [PY, "-m", "dpro_kit.cli", "profile", "--out", str(outs[i]), "--host", f"host{i}",
                   "--steps", "3:5", "--", PY, str(TRAIN), "--quiet", "--iters", "6", "--warmup", "1",
                   "--batch-size", "8", "--backend", "gloo"]
            procs.append(c.run(i, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        errs = []
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
            errs.append(err)
    return errs


def _replay(d: Path) -> tuple[dict, str]:
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(d), "--json"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout), r.stderr


def _nodes(doc: dict) -> set[str]:
    return {n for n in json.dumps(doc).split('"') if n in ("host0/0", "host1/1")}


def test_per_host_profile_shared_and_copied_folders(tmp_path):
    # (a) both hosts write into one shared folder
    shared = tmp_path / "shared"
    errs = _profile_per_host([shared, shared], 29631)
    assert any("rank" in e for e in errs)
    doc, _ = _replay(shared)
    assert _nodes(doc) == {"host0/0", "host1/1"}, doc
    metas = [json.loads(p.read_text()) for p in shared.glob("*/*/meta.json")]
    assert len({m["run_id"] for m in metas}) == 1, "ranks of one job must agree on one run id"

    # (b) each host writes its own folder; the user copies them together with plain cp -r
    a, b, both = tmp_path / "hostA", tmp_path / "hostB", tmp_path / "both"
    errs = _profile_per_host([a, b], 29632)
    assert not (a / "manifest.json").exists() and not (b / "manifest.json").exists()
    assert all("other hosts" in e for e in errs), errs
    both.mkdir()
    for src in (a, b):
        subprocess.run(["cp", "-r", *[str(x) for x in src.iterdir()], str(both)], check=True)
    doc_b, _ = _replay(both)
    assert _nodes(doc_b) == {"host0/0", "host1/1"}, doc_b
    # dpro merge: the same folders, checked to be one complete run; a second merge into it is refused
    m = subprocess.run([PY, "-m", "dpro_kit.cli", "merge", str(a), str(b), "-o", str(tmp_path / "m"), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert m.returncode == 0, m.stderr
    mj = json.loads(m.stdout)
    assert mj["world_size"] == 2 and mj["rank_folders"] == ["host0/0", "host1/1"], mj
    m2 = subprocess.run([PY, "-m", "dpro_kit.cli", "merge", str(a), str(b), "-o", str(tmp_path / "m")],
                        capture_output=True, text=True, timeout=60)
    assert m2.returncode == 2 and "refusing to overwrite" in m2.stderr, m2.stderr
    # one host's folder alone: one line naming the missing rank and what to copy
    r = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(a)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "missing" in r.stderr and "[1]" in r.stderr, r.stderr

    # stale: rank 0 of the older shared-folder run left in as oldhost/0 -> ignored and named
    shutil.copytree(shared / "host0" / "0", both / "oldhost" / "0")
    doc_s, err_s = _replay(both)
    assert _nodes(doc_s) == {"host0/0", "host1/1"}
    assert "oldhost/0" in err_s and "stale" in err_s, err_s
