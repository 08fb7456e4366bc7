"""``manifest.json`` for a directory of dpro_tf per-task ``meta.json`` files (standard library only).

Every task that recorded calls :func:`try_write_manifest` after writing its ``meta.json``;
the one that finds every expected task present writes the manifest. Expected tasks: every
``worker`` of ``TF_CONFIG``'s cluster (one without ``TF_CONFIG``), plus the ``ps`` tasks that
wrote a trace. Node names are ``<host>/<task>`` (``h0/worker0``, ``h1/ps0``).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from dpro_collect import files
from dpro_collect.files import atomic_write_text, folder_lock
from dpro_collect.schema import MANIFEST_FORMAT, MANIFEST_VERSION, TF_META_FORMAT
from dpro_collect.schema import TF_RAW_FORMAT as RAW_FORMAT

from . import __version__

__all__ = ["find_metas", "build_manifest", "try_write_manifest", "manifest_from_dir", "RAW_FORMAT"]


def find_metas(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every dpro_tf ``meta.json`` under ``root/<host>/<task>/``."""
    return files.find_metas(root, TF_META_FORMAT)


def _expected_workers(doc: dict[str, Any]) -> int:
    cluster = doc.get("cluster") or {}
    return max(1, len(cluster.get("worker") or []))


def build_manifest(root: Path, metas: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The manifest of one run's metas (all of one ``run_id``)."""
    nodes: dict[str, Any] = {}
    iters = None
    measured, profiled = {}, {}
    for p, d in sorted(metas, key=lambda x: (x[1].get("role") != "worker", x[1].get("task_index", 0))):
        name = f"{d['host']}/{d['task']}"
        role = d.get("role", "worker")
        nodes[name] = {"host": d["host"], "role": role, "rank": int(d.get("task_index") or 0),
                       "dir": p.parent.relative_to(root).as_posix()}
        if role == "worker":
            steps = set((d.get("window") or {}).get("profiled_steps") or [])
            iters = steps if iters is None else iters & steps
            measured[name] = (d.get("measured") or {}).get("median_unprofiled_us")
            profiled[name] = (d.get("measured") or {}).get("median_profiled_us")
    d0 = metas[0][1]
    known = [v for v in measured.values() if v]
    known_p = [v for v in profiled.values() if v]
    workers = [n for n, v in nodes.items() if v["role"] == "worker"]
    strategy = "ps" if any(v["role"] == "server" for v in nodes.values()) else \
        ("collective" if len(workers) > 1 else "single")
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "job": d0.get("job", "job"), "framework": "tensorflow",
        "comm_backend": {"ps": "grpc-ps", "collective": "tf-collective"}.get(strategy, "none"),
        "world_size": len(workers), "nodes": nodes, "iterations": sorted(iters or []),
        "raw_format": RAW_FORMAT, "tool_version": f"dpro_tf/{__version__} tensorflow/{d0.get('tf_version', '?')}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "extra": {"collector": "dpro_tf", "run_id": d0.get("run_id", ""), "strategy": strategy,
                  # a PS job is a star: every host's one interface carries its traffic (topology.Links)
                  **({"link_model": "interface"} if strategy == "ps" else {}),
                  "measured_iteration_ms": round(max(known) / 1e3, 4) if known else None,
                  "measured_iteration_ms_per_node": {n: (round(v / 1e3, 4) if v else None)
                                                     for n, v in measured.items()},
                  "profiled_iteration_ms": round(max(known_p) / 1e3, 4) if known_p else None},
    }


def _complete(metas: list[tuple[Path, dict[str, Any]]]) -> bool:
    workers = {int(d.get("task_index") or 0) for _, d in metas if d.get("role") == "worker"}
    return bool(metas) and len(workers) >= _expected_workers(metas[0][1])


def manifest_from_dir(root: str | os.PathLike) -> tuple[dict[str, Any] | None, str | None]:
    """``(manifest, None)`` of the newest complete run under ``root``; ``(None, why)`` otherwise;
    ``(None, None)`` when ``root`` holds no dpro_tf meta.json."""
    root = Path(root)
    metas = find_metas(root)
    if not metas:
        return None, None
    runs: dict[str, list] = {}
    for p, d in metas:
        runs.setdefault(str(d.get("run_id") or ""), []).append((p, d))
    order = sorted(runs, key=lambda k: max(p.stat().st_mtime for p, _ in runs[k]), reverse=True)
    for k in order:
        if _complete(runs[k]):
            return build_manifest(root, runs[k]), None
    k = order[0]
    have = sorted(d["task"] for _, d in runs[k])
    return None, (f"run {k or '?'} has task(s) {have} of {_expected_workers(runs[k][0][1])} worker(s): "
                  f"copy the other hosts' folders into this one or re-run `dpro profile` on every host")


def try_write_manifest(root: str | os.PathLike, *, run_id: str | None = None) -> bool:
    """Write ``root/manifest.json`` when every worker of the run (``run_id``) has written its meta.json."""
    root = Path(root)
    with folder_lock(root):   # read and write under the lock (dpro_collect.files.folder_lock)
        metas = [(p, d) for p, d in find_metas(root) if run_id is None or d.get("run_id") == run_id]
        if not _complete(metas):
            return False
        atomic_write_text(root / "manifest.json", json.dumps(build_manifest(root, metas), indent=2))
    return True
