"""Peak memory of loading and replaying large inputs (issue 19, docs/reliability.md "Memory").

Two kinds of input, generated here from the real HTA traces in ``../shared/traces/hta`` (never
committed; written under ``--work``):

* one large plain torch.profiler file: ``nccl_2rank_rank0.json.gz`` (a real NCCL job, 3 steps,
  40,573 events, 9.8 MB of JSON) with its events repeated K times, each copy shifted after the
  last and its steps renumbered (``ProfilerStep#N`` -> ``#N+3k``), correlation, ``External id``
  and flow ids offset so launches still pair: a valid trace of 3K steps, written as ``.json``
  until it reaches ``--kineto-mb`` MB;
* a folder of ``--ranks`` plain torch.profiler files: ``sampled_128rank_rank0.json.gz`` (rank 0
  of a real 128-rank job) with ``distributedInfo`` set to rank r of R, r = 0..R-1.

Each measurement runs in a fresh Python process and reports its own peak resident set size
(``ru_maxrss``) and wall time, for ``load``  (:func:`dpro_kit.trace.load_trace`: the readers)
and ``replay`` (``dpro replay DIR --json`` through :func:`dpro_kit.cli.main`: load, build,
replay).

Usage::

    python bench/memory_load.py --kineto-mb 50 100 200 --ranks 64 256 --work /tmp/dpro-mem
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from fuzz import shared_traces  # noqa: E402  (one definition of where ../shared/traces is)

ID_STRIDE = 10**8


def big_kineto(out: Path, target_mb: float) -> dict:
    """Write one valid plain Kineto file of at least ``target_mb`` MB into folder ``out``; its facts."""
    src = shared_traces() / "hta" / "nccl_2rank_rank0.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    evs = doc.pop("traceEvents")
    timed = [e for e in evs if "ts" in e and e.get("ph") != "M"]
    fixed = [e for e in evs if not ("ts" in e and e.get("ph") != "M")]
    lo, hi = min(float(e["ts"]) for e in timed), max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    shift = hi - lo + 1000.0
    steps = sorted({int(e["name"].split("#")[1]) for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")})
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rank0.json"
    n = k = 0
    with open(path, "w", encoding="utf-8") as fh:
        head = json.dumps(doc)[:-1]
        fh.write(head + ', "traceEvents": [')
        first = True
        for e in fixed:
            fh.write(("" if first else ",\n") + json.dumps(e))
            first = False
            n += 1
        while fh.tell() < target_mb * 1e6:
            for e in timed:
                c = dict(e, ts=round(float(e["ts"]) + k * shift, 3))
                if isinstance(e.get("args"), dict):
                    a = dict(e["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(a.get(key), int):
                            a[key] += k * ID_STRIDE
                    c["args"] = a
                if isinstance(e.get("id"), int):
                    c["id"] = e["id"] + k * ID_STRIDE
                name = str(e.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    c["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * len(steps)}"
                fh.write(",\n" + json.dumps(c))
                n += 1
            k += 1
        fh.write("]}\n")
    return {"file_mb": round(path.stat().st_size / 1e6, 1), "events": n, "steps": k * len(steps)}


def rank_folder(out: Path, ranks: int) -> dict:
    """Write ``ranks`` plain Kineto files (rank r of ``ranks``) into folder ``out``; its facts."""
    src = shared_traces() / "hta" / "sampled_128rank_rank0.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for r in range(ranks):
        doc["distributedInfo"] = dict(doc["distributedInfo"], rank=r, world_size=ranks)
        p = out / f"rank{r}.json.gz"
        p.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1, mtime=0))
        total += p.stat().st_size
    return {"files": ranks, "folder_mb": round(total / 1e6, 1), "events_per_rank": len(doc["traceEvents"])}


_CHILD = r"""
import json, resource, sys, time, io, contextlib
what, path = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if what == "load":
    from dpro_kit.trace import load_trace
    ts = load_trace(path)
    info = {"rows": len(ts.events)}
else:
    from dpro_kit.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["replay", path, "--json"])
    d = json.loads(out.getvalue()) if rc == 0 else {}
    info = {"rc": rc, "iteration_time_ms": d.get("iteration_time_ms"), "ops": d.get("ops")}
info.update(seconds=round(time.perf_counter() - t0, 1), peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
print(json.dumps(info))
"""


def measure(what: str, path: Path, timeout: float) -> dict:
    """Peak RSS (MiB) and seconds of ``what`` (``load`` or ``replay``) on ``path`` in a fresh process."""
    env = dict(os.environ, DPRO_CACHE=str(path.parent / "cache"))
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, what, str(path)], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kineto-mb", type=float, nargs="*", default=[50, 100, 200])
    ap.add_argument("--ranks", type=int, nargs="*", default=[64, 256])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dpro-memory-bench"))
    ap.add_argument("--no-replay", action="store_true", help="measure loading only")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    if not (shared_traces() / "hta").is_dir():
        print(f"the HTA traces are not at {shared_traces() / 'hta'}", file=sys.stderr)
        return 2
    rows = []
    for mb in args.kineto_mb:
        d = args.work / f"kineto-{mb:g}mb"
        facts = big_kineto(d, mb) if not (d / "rank0.json").is_file() else \
            {"file_mb": round((d / "rank0.json").stat().st_size / 1e6, 1)}
        rows.append(("one Kineto file", facts, d))
    for n in args.ranks:
        d = args.work / f"ranks-{n}"
        facts = rank_folder(d, n) if not d.is_dir() else {"files": n}
        rows.append((f"{n} rank files", facts, d))
    print(f"{'input':<18}{'facts':<58}{'load: peak RSS, s':<24}{'replay: peak RSS, s, result'}")
    for label, facts, d in rows:
        load = measure("load", d, args.timeout)
        rep = {} if args.no_replay else measure("replay", d, args.timeout)
        fl = f"{load.get('peak_rss_mb')} MiB, {load.get('seconds')} s" if "error" not in load else load["error"]
        fr = ("" if args.no_replay else f"{rep.get('peak_rss_mb')} MiB, {rep.get('seconds')} s, "
              f"{rep.get('iteration_time_ms')} ms" if "error" not in rep else rep["error"])
        print(f"{label:<18}{json.dumps(facts):<58}{fl:<24}{fr}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
