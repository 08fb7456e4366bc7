"""Write ``manifest.json`` for a directory of per-rank ``meta.json`` files.

Every rank calls :func:`try_write_manifest` after writing its own ``meta.json``;
the rank that finds all ``world_size`` ranks present writes the manifest (the
last one to finish always does; several writers write the same content).
When ranks ran on machines without a shared file system, copy their
``<host>/<rank>/`` folders into one directory and run::

    python -m dpro_torch.manifest DIR
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from dpro_collect import files
from dpro_collect.files import atomic_write_text as _atomic_write
from dpro_collect.files import folder_lock
from dpro_collect.schema import HOROVOD_RAW_FORMAT, MANIFEST_FORMAT, MANIFEST_VERSION, TORCH_META_FORMAT
from dpro_collect.schema import TORCH_RAW_FORMAT as RAW_FORMAT

HOROVOD_DEFAULTS = {"fusion_threshold_bytes": 128 * 1024 * 1024, "cycle_time_ms": 1.0}   # Horovod 0.28.1


def _first_known(d: dict, *keys: str) -> Any:
    """The first of ``keys`` that ``d`` has (None: none)."""
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _profiled_throttled(doc: dict[str, Any]) -> dict[str, float] | None:
    """Step -> throttled us of a rank's profiled steps (meta.json ``steps``), or None when not recorded."""
    out = {str(s["step"]): float(s["throttled_us"]) for s in doc.get("steps") or []
           if isinstance(s, dict) and s.get("profiled") and isinstance(s.get("throttled_us"), (int, float))
           and "step" in s}
    return out or None


def horovod_settings(hvd: dict[str, Any]) -> dict[str, Any]:
    """``manifest.extra["horovod"]``: the fusion threshold and cycle time the job ran with."""
    env = hvd.get("env") or {}
    out = dict(HOROVOD_DEFAULTS)
    try:
        if env.get("HOROVOD_FUSION_THRESHOLD"):
            out["fusion_threshold_bytes"] = int(env["HOROVOD_FUSION_THRESHOLD"])
        if env.get("HOROVOD_CYCLE_TIME"):
            out["cycle_time_ms"] = float(env["HOROVOD_CYCLE_TIME"])
    except ValueError:
        pass
    out["autotune"] = env.get("HOROVOD_AUTOTUNE", "0") not in ("", "0")
    out["env"] = dict(env)
    return out


def find_metas(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every dpro_torch ``meta.json`` under ``root/<host>/<rank>/``."""
    return files.find_metas(root, TORCH_META_FORMAT)


def build_manifest(root: Path, metas: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    by_rank: dict[int, tuple[Path, dict]] = {}
    for p, doc in metas:
        by_rank[int(doc["rank"])] = (p, doc)
    world = max(int(d["world_size"]) for _, d in metas)
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        raise ValueError(f"meta.json missing for rank(s) {missing} under {root}")
    nodes, iters = {}, None
    for r in range(world):
        p, doc = by_rank[r]
        rel = p.parent.relative_to(root).as_posix()
        # node names say where the rank ran (<host>/<rank>, docs/trace-format.md)
        nodes[f"{doc['host']}/{r}"] = {"host": doc["host"], "role": "worker", "rank": r, "dir": rel}
        steps = set(doc.get("window", {}).get("profiled_steps", [])) if doc.get("trace_file") else set()
        iters = steps if iters is None else iters & steps
    d0 = by_rank[0][1]
    medians = {f"{by_rank[r][1]['host']}/{r}": (by_rank[r][1].get("measured") or {}).get("median_unprofiled_us")
               for r in range(world)}
    known = [v for v in medians.values() if v]
    prof = {f"{by_rank[r][1]['host']}/{r}": (by_rank[r][1].get("measured") or {}).get("median_profiled_us")
            for r in range(world)}
    known_prof = [v for v in prof.values() if v]
    ddp0 = (d0.get("ddp") or [{}])[0]
    hvd = d0.get("horovod")
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
        "job": d0.get("job", "job"), "framework": "pytorch", "comm_backend": d0.get("backend") or "unknown",
        "world_size": world, "nodes": nodes, "iterations": sorted(iters or []),
        "raw_format": HOROVOD_RAW_FORMAT if hvd else RAW_FORMAT,
        "tool_version": f"dpro_torch/{_version()} torch/{d0.get('torch_version', '?')}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "extra": {"collector": "dpro_torch", "run_id": d0.get("run_id", ""),
                  "ddp": {k: ddp0.get(k) for k in ("bucket_cap_bytes", "bucket_cap_default", "gradient_as_bucket_view",
                                                   "find_unused_parameters", "static_graph", "device")},
                  # median wall time of the unprofiled iterations; the job's is its slowest rank's
                  "measured_iteration_ms": round(max(known) / 1e3, 4) if known else None,
                  "measured_iteration_ms_per_node": {n: (round(v / 1e3, 4) if v else None)
                                                     for n, v in medians.items()},
                  # the same inside the profiling window (profiler overhead = this / measured - 1)
                  "profiled_iteration_ms": round(max(known_prof) / 1e3, 4) if known_prof else None,
                  # class and state size of rank 0's optimizer (peak-memory model)
                  "optimizer": d0.get("optimizer"),
                  # parameter -> its layer, from the module tree (recorder.layer_names; peak-memory model)
                  "layers": {str(p["name"]): str(p["layer"]) for p in (ddp0.get("params") or []) if p.get("layer")},
                  # per-collective cost: the slowest rank's median time of a one-element allreduce
                  "comm_calibration": _slowest_calibration([by_rank[r][1] for r in range(world)]),
                  # CPUs used per unprofiled step, the cgroup's CPU limit and its throttling (dpro_kit.cpu_use)
                  "cpu_use": {f"{by_rank[r][1]['host']}/{r}": {
                      "cpus": (by_rank[r][1].get("measured") or {}).get("median_cpus"),
                      # the training thread alone (its /proc schedstat): the part of a step it ran, and the
                      # part it was runnable but waited for its core (dpro_kit.whatif.host_cpu_split)
                      "thread_cpus": (by_rank[r][1].get("measured") or {}).get("median_thread_cpus"),
                      "thread_wait": (by_rank[r][1].get("measured") or {}).get("median_thread_wait"),
                      # per step on average (older traces: their median)
                      "throttled_us": _first_known((by_rank[r][1].get("measured") or {}),
                                                   "mean_throttled_us", "median_throttled_us"),
                      "limit_cpus": (by_rank[r][1].get("cpu") or {}).get("limit_cpus"),
                      "period_us": (by_rank[r][1].get("cpu") or {}).get("period_us"),
                      # per profiled step, the time the quota stopped the rank (dpro replay --recorded-quota
                      # takes it out of the traced ops)
                      "throttled_us_profiled": _profiled_throttled(by_rank[r][1])} for r in range(world)},
                  # CPU set, machine and torch threads of every rank (dpro_kit.placement)
                  "cpu_placement": {f"{by_rank[r][1]['host']}/{r}": {**(by_rank[r][1].get("cpu") or {}),
                                                                     "threads": by_rank[r][1].get("threads"),
                                                                     **({"gpu": by_rank[r][1]["gpu"]}
                                                                        if by_rank[r][1].get("gpu") else {})}
                                    for r in range(world)},
                  # each probed rank's own clock-probe readings (dpro_torch.clockprobe; dpro_kit.align)
                  **({"clock_probe": probes} if (probes := _clock_probes(by_rank, world)) else {}),
                  **({"horovod": horovod_settings(hvd)} if hvd else {})},
    }


def _clock_probes(by_rank: dict[int, tuple[Path, dict]], world: int) -> dict[str, Any]:
    """node -> its clock-probe readings, peers named as nodes (``<host>/<rank>``)."""
    name = {r: f"{by_rank[r][1]['host']}/{r}" for r in range(world)}
    out: dict[str, Any] = {}
    for r in range(world):
        doc = by_rank[r][1].get("clock_probe")
        if not isinstance(doc, dict) or doc.get("role") not in ("client", "server"):
            continue
        keep = {k: doc[k] for k in ("version", "clock", "skip", "role") if k in doc}
        if doc["role"] == "client":
            keep["peers"] = {name[int(q)]: rows for q, rows in (doc.get("peers") or {}).items()
                             if str(q).isdigit() and int(q) in name}
        else:
            keep["peer"] = name.get(int(doc.get("peer", 0)), name[0])
            keep["rows"] = doc.get("rows") or []
        out[name[r]] = keep
    return out


def _slowest_calibration(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    cals = [d.get("comm_calibration") for d in docs if isinstance(d.get("comm_calibration"), dict)]
    cals = [c for c in cals if isinstance(c.get("median_us"), (int, float))]
    return max(cals, key=lambda c: c["median_us"]) if cals else None


def _version() -> str:
    from . import __version__
    return __version__


def _run_key(doc: dict[str, Any]) -> str:
    return str(doc.get("run_id") or "")


def _recorded_s(p: Path, doc: dict[str, Any]) -> float:
    """When the rank recorded (its first clock-sync wall reading; survives ``cp -r``), else the file's mtime."""
    try:
        return float(doc["clock"]["sync"][0]["time_ns_before"]) / 1e9
    except (KeyError, IndexError, TypeError, ValueError):
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0


def _when(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def select_run(root: Path, metas: list[tuple[Path, dict[str, Any]]]
               ) -> tuple[list[tuple[Path, dict[str, Any]]], list[str], str | None]:
    """Pick the newest *complete* run among the ``meta.json`` files of ``root``.

    Returns ``(metas of that run, notes naming the stale ranks ignored, error)``: ``error`` is
    one line (the missing ranks and what to run or copy) when no run has all its ranks; then
    the first list is empty. Runs are told apart by ``run_id`` (the ranks of one job agree on
    it through the job's c10d store, :mod:`dpro_torch.recorder`); newest = recorded last.
    """
    runs: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for p, d in metas:
        runs.setdefault(_run_key(d), []).append((p, d))
    newest = lambda ms: max(_recorded_s(p, d) for p, d in ms)  # noqa: E731
    order = sorted(runs, key=lambda k: newest(runs[k]), reverse=True)

    def complete(ms):
        world = max(int(d["world_size"]) for _, d in ms)
        return len({int(d["rank"]) for _, d in ms}) >= world

    chosen = next((k for k in order if complete(runs[k])), None)
    if chosen is None:
        k = order[0]
        ms = runs[k]
        world = max(int(d["world_size"]) for _, d in ms)
        have = sorted({int(d["rank"]) for _, d in ms})
        missing = sorted(set(range(world)) - set(have))
        where = ", ".join(sorted(p.parent.relative_to(root).as_posix() for p, _ in ms))
        others = f"; {len(order) - 1} older incomplete run(s) also here" if len(order) > 1 else ""
        return [], [], (f"run {k or '?'} has rank(s) {have} of world size {world} ({where}); rank(s) {missing} "
                        f"missing{others}: copy the other hosts' folders into this one (cp -r HOST_DIR/* "
                        f"{root}/, or dpro merge) or re-run `dpro profile` on every host")
    notes = []
    for k in order:
        if k == chosen:
            continue
        dirs = ", ".join(sorted(p.parent.relative_to(root).as_posix() for p, _ in runs[k]))
        notes.append(f"ignored stale rank folder(s) {dirs} of an older run {k or '?'} "
                     f"(recorded {_when(newest(runs[k]))}); "
                     f"using run {chosen}")
    return runs[chosen], notes, None


def _identity_problem(d: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what is wrong) when a meta.json lacks what names its node: ``host`` (a name), ``rank`` and
    ``world_size`` (integers, 0 <= rank < world_size); None when they are usable."""
    host = d.get("host")
    if not isinstance(host, str) or not host or len(host) > 255:
        return "host", "must be a host name (a non-empty string of at most 255 characters)"
    for k, lo in (("rank", 0), ("world_size", 1)):
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or v >= 1 << 31:
            return k, f"must be an integer >= {lo}"
    if d["rank"] >= d["world_size"]:
        return "rank", f"rank {d['rank']} is not below world_size {d['world_size']}"
    return None


def manifest_from_dir(root: str | os.PathLike) -> tuple[dict[str, Any] | None, list[str], str | None]:
    """The manifest of ``root`` built in memory from its per-rank ``meta.json``.

    The one place that builds a manifest from metas (``try_write_manifest``, ``python -m
    dpro_torch.manifest`` and dpro_kit's loader all call it). Returns ``(manifest or None,
    notes, error)``: ``(None, [], None)`` when there is no dpro_torch meta.json at all.
    """
    root = Path(root)
    metas = find_metas(root)
    if not metas:
        return None, [], None
    for p, d in metas:   # what building the manifest reads (fuzz case 47210: a meta.json without host, a KeyError)
        bad = _identity_problem(d)
        if bad:
            return None, [], (f"{p.relative_to(root).as_posix()} [{bad[0]}]: {bad[1]}: the manifest cannot be built "
                              "from this meta.json (restore it, or the manifest.json dpro profile wrote)")
    chosen, notes, err = select_run(root, metas)
    if err:
        return None, notes, err
    doc = build_manifest(root, chosen)
    if notes:
        doc["extra"]["notes"] = list(doc["extra"].get("notes") or []) + notes
    return doc, notes, None


def try_write_manifest(root: str | os.PathLike, *, run_id: str | None = None) -> bool:
    """Write ``root/manifest.json`` if every rank's meta.json (of this run) is there."""
    root = Path(root)
    with folder_lock(root):   # read and write under the lock: the last writer has read every final meta.json
        metas = find_metas(root)
        if run_id is not None:
            metas = [(p, d) for p, d in metas if d.get("run_id") == run_id]
        if not metas:
            return False
        world = max(int(d["world_size"]) for _, d in metas)
        if len({int(d["rank"]) for _, d in metas}) < world:
            return False
        _atomic_write(root / "manifest.json", json.dumps(build_manifest(root, metas), indent=2))
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write manifest.json for a dpro_torch trace directory")
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    root = Path(args.dir)
    doc, notes, err = manifest_from_dir(root)
    if doc is None and err is None:
        print(f"{root}: no */*/meta.json written by dpro_torch (run `dpro profile --out {root} -- python train.py`)",
              file=sys.stderr)
        return 2
    for n in notes:
        print(f"dpro_torch.manifest: {n}", file=sys.stderr)
    if err:
        print(f"{root}: {err}", file=sys.stderr)
        return 2
    _atomic_write(root / "manifest.json", json.dumps(doc, indent=2))
    print(root / "manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
