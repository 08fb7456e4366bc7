"""``manifest.json`` for a directory of dpro_mxnet ``meta.json`` files (standard library only).

Every host's ``dpro profile`` calls :func:`try_write_manifest` when its command ended; the one
that finds every worker (``DMLC_NUM_WORKER``) and server (``DMLC_NUM_SERVER``) of the run
writes the manifest. Node names: ``<host>/worker<rank>`` (the kvstore rank) and
``<host>/server<i>`` (servers numbered by host; ps-lite's server ranks are not recorded).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from pathlib import Path
from typing import Any

from dpro_collect import files
from dpro_collect.files import atomic_write_text, folder_lock
from dpro_collect.schema import MANIFEST_FORMAT, MANIFEST_VERSION, MXNET_META_FORMAT, MXNET_RAW_FORMAT

from . import __version__

__all__ = ["find_metas", "build_manifest", "try_write_manifest", "measured_iteration_us"]


def find_metas(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every dpro_mxnet ``meta.json`` under ``root/<host>/<node>/``."""
    return files.find_metas(root, MXNET_META_FORMAT)


def measured_iteration_us(meta: dict[str, Any], skip: int = 2) -> float | None:
    """Median gap between consecutive Trainer step returns outside the profiled window (and the
    ``skip`` first steps, and the step right after the window: its engine waited at the stop)."""
    t = meta.get("step_end_times") or []
    a, b = (meta.get("steps") or [0, 0])[:2]
    gaps = [1e6 * (t[i] - t[i - 1]) for i in range(max(1, skip), len(t))
            if not (a - 1 <= i <= b + 1)]   # step i is the (i+1)-th; i in [a-1, b+1] touch the window
    return statistics.median(gaps) if gaps else None


def profiled_iteration_us(meta: dict[str, Any]) -> float | None:
    """Mean step time inside the profiled window (between the two engine waits)."""
    w = meta.get("window") or []
    a, b = (meta.get("steps") or [0, 0])[:2]
    return 1e6 * (w[1] - w[0]) / (b - a) if len(w) == 2 and b > a else None


def build_manifest(root: Path, metas: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The manifest of one run's metas (all of one ``run_id``)."""
    nodes: dict[str, Any] = {}
    workers = sorted((m for m in metas if m[1]["role"] == "worker"), key=lambda m: m[1]["kvstore"]["rank"])
    servers = sorted((m for m in metas if m[1]["role"] == "server"), key=lambda m: (m[1]["host"], m[1]["pid"]))
    measured, profiled = {}, {}
    for p, d in workers:
        r = int(d["kvstore"]["rank"])
        name = f"{d['host']}/worker{r}"
        nodes[name] = {"host": d["host"], "role": "worker", "rank": r, "dir": p.parent.relative_to(root).as_posix()}
        measured[name] = measured_iteration_us(d)
        profiled[name] = profiled_iteration_us(d)
    for i, (p, d) in enumerate(servers):
        nodes[f"{d['host']}/server{i}"] = {"host": d["host"], "role": "server", "rank": i,
                                           "dir": p.parent.relative_to(root).as_posix()}
    d0 = workers[0][1]
    a, b = d0["steps"]
    known = [v for v in measured.values() if v]
    known_p = [v for v in profiled.values() if v]
    kv = d0.get("kvstore") or {}
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "job": d0.get("job", "job"), "framework": "mxnet",
        "comm_backend": "ps-lite", "world_size": len(workers), "nodes": nodes, "iterations": list(range(a, b)),
        "raw_format": MXNET_RAW_FORMAT, "tool_version": f"dpro_mxnet/{__version__} mxnet/{d0.get('mxnet_version', '?')}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "extra": {"collector": "dpro_mxnet", "run_id": d0.get("run_id", ""), "strategy": "ps",
                  # ps-lite is a star over one interface per host: transfers queue on the hosts'
                  # interfaces, not per host pair (dpro_kit.graph.topology.Links)
                  "link_model": "interface",
                  "kvstore": kv.get("type"), "update_on_kvstore": kv.get("update_on_kvstore"),
                  "bigarray_bound": (d0.get("ps") or {}).get("bigarray_bound"),
                  "measured_iteration_ms": round(max(known) / 1e3, 4) if known else None,
                  "measured_iteration_ms_per_node": {n: (round(v / 1e3, 4) if v else None)
                                                     for n, v in measured.items()},
                  "profiled_iteration_ms": round(max(known_p) / 1e3, 4) if known_p else None},
    }


def _complete(metas: list[tuple[Path, dict[str, Any]]]) -> bool:
    if not metas:
        return False
    ps = metas[0][1].get("ps") or {}
    w = {d["kvstore"]["rank"] for _, d in metas if d["role"] == "worker" and d.get("kvstore")}
    s = sum(1 for _, d in metas if d["role"] == "server")
    return len(w) >= int(ps.get("num_workers") or 1) and s >= int(ps.get("num_servers") or 0)


def try_write_manifest(root: str | os.PathLike, *, run_id: str | None = None) -> bool:
    """Write ``root/manifest.json`` when every worker and server of the run has written its meta.json.

    Parameters
    ----------
    root : str or PathLike
        The trace directory (``dpro profile --out``).
    run_id : str, optional
        Only this run's metas (default: the run of the newest meta).
    """
    root = Path(root)
    with folder_lock(root):   # read and write under the lock (dpro_collect.files.folder_lock)
        metas = find_metas(root)
        if metas and run_id is None or not any(d.get("run_id") == run_id for _, d in metas):
            newest = max(metas, key=lambda m: m[0].stat().st_mtime, default=None)
            run_id = newest[1].get("run_id") if newest else None
        metas = [(p, d) for p, d in metas if d.get("run_id") == run_id]
        if not _complete(metas) or not any(d["role"] == "worker" for _, d in metas):
            return False
        atomic_write_text(root / "manifest.json", json.dumps(build_manifest(root, metas), indent=2))
    return True
