"""Reading speed of the Kineto reader on real trace files (issue 17 item 1, issue 19's long fuzz
run, whose cases spend most of their time here).

For every file: CPU seconds (``time.process_time``, median of ``--reps``) of

* ``load``  — :func:`dpro_kit.readers.kineto.load_doc` (the JSON decode);
* ``parse`` — :func:`dpro_kit.readers.kineto.parse` of the loaded document (events, call trees,
  launches, steps, flows);
* ``stream`` — :func:`dpro_kit.readers.kineto.parse_file` (the same parse, the file read as a stream:
  how plain torch.profiler files are read);
* ``peek`` — :func:`dpro_kit.readers.kineto_plain._peek` (what discovery of a folder of more than
  two plain files reads of each: the stream, no parse);
* ``node``  — :func:`dpro_kit.trace.read_node` of the rank's folder when the file is a dpro
  collector's ``kineto_trace.json[.gz]`` (everything a rank costs ``dpro replay``);

events per CPU second, and a digest of the parsed trace (every event's fields, its parent and
children, launches, steps, forward/backward pairs, warnings), so two versions of the reader can be
checked to give identical traces: run it before and after a change and compare the ``digest``
column.

Usage::

    python bench/read_speed.py [FILE ...] [--reps 5] [--json out.json]

Without files it reads the real traces under ``examples/traces`` and ``../shared/traces/hta``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from fuzz import shared_traces  # noqa: E402

from dpro_kit.readers import kineto  # noqa: E402


def default_files() -> list[Path]:
    ex = REPO / "examples" / "traces"
    files = sorted(ex.glob("ddp-*/host*/*/kineto_trace.json*"))
    hta = shared_traces() / "hta"
    files += sorted(p for p in hta.glob("*.json.gz") if p.stat().st_size < 20e6)[:3]
    return files


def digest(tr: kineto.KinetoTrace) -> str:
    """sha256 over everything :func:`kineto.parse` returns (events by file position)."""
    h = hashlib.sha256()
    evs = [ev for k in sorted(tr.cpu, key=repr) for ev in tr.cpu[k]] + \
          [ev for k in sorted(tr.gpu, key=repr) for ev in tr.gpu[k]]

    def ix(e: kineto.KEvent | None) -> int:
        return -1 if e is None else e.index

    for ev in evs:
        h.update(repr((ev.name, ev.cat, ev.pid, ev.tid, ev.ts, ev.dur, ev.start_ns, ev.dur_ns, ev.index,
                       sorted(ev.args.items(), key=lambda kv: kv[0]), ix(ev.parent),
                       [c.index for c in ev.children])).encode())
    by_id = {id(ev): ev for ev in evs}
    h.update(repr(sorted((by_id[k].index, v.index) for k, v in tr.launch.items())).encode())
    h.update(repr([(s.number, s.start, s.end) for s in tr.steps]).encode())
    h.update(repr([(a.index, b.index) for a, b in tr.fwdbwd]).encode())
    h.update(repr((tr.distributed, sorted(tr.thread_names.items(), key=repr), tr.n_flows, tr.warnings)).encode())
    return h.hexdigest()[:16]


def measure(path: Path, reps: int) -> dict:
    loads, parses = [], []
    tr = None
    for _ in range(reps):
        t0 = time.process_time()
        doc = kineto.load_doc(path)
        t1 = time.process_time()
        tr = kineto.parse(doc, path)
        t2 = time.process_time()
        loads.append(t1 - t0)
        parses.append(t2 - t1)
        del doc
    n = sum(len(v) for v in tr.cpu.values()) + sum(len(v) for v in tr.gpu.values())
    row = {"file": str(path), "events": n, "load_s": statistics.median(loads),
           "parse_s": statistics.median(parses), "digest": digest(tr)}
    from dpro_kit.readers import kineto_plain
    for col, f in (("stream_s", kineto.parse_file), ("peek_s", kineto_plain._peek)):
        ts_ = []
        for _ in range(reps):
            t0 = time.process_time()
            with kineto.gc_paused():
                f(path)
            ts_.append(time.process_time() - t0)
        row[col] = statistics.median(ts_)
    row["parse_events_per_s"] = n / row["parse_s"] if row["parse_s"] else float("inf")
    job = path.parents[2]
    if (path.parent / "meta.json").is_file() and (job / "manifest.json").is_file():
        from dpro_kit import trace
        man = trace.load_manifest(job)
        node = next(n for n, i in man.nodes.items() if (job / (i.dir or n)).resolve() == path.parent.resolve())
        nodes = []
        for _ in range(reps):
            t0 = time.process_time()
            trace.read_node(man, node, str(path.parent), str(job / "manifest.json"))
            nodes.append(time.process_time() - t0)
        row["node_s"] = statistics.median(nodes)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--reps", type=int, default=5, help="repetitions per file (the median is reported)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    rows = [measure(p, args.reps) for p in (args.files or default_files())]
    print(f"{'file':50} {'events':>8} {'load s':>7} {'parse s':>8} {'stream s':>8} {'peek s':>7} {'node s':>7} "
          f"{'ev/s':>9}  digest")
    for r in rows:
        name = str(r["file"])[-50:]
        node = f"{r['node_s']:7.3f}" if "node_s" in r else f"{'-':>7}"
        print(f"{name:50} {r['events']:8d} {r['load_s']:7.3f} {r['parse_s']:8.3f} {r['stream_s']:8.3f} "
              f"{r['peek_s']:7.3f} {node} {r['parse_events_per_s']:9.0f}  {r['digest']}")
    tot_e = sum(r["events"] for r in rows)
    tot_p = sum(r["parse_s"] for r in rows)
    print(f"all: {tot_e} events, parse {tot_p:.3f} s CPU ({tot_e / tot_p:.0f} events/s), "
          f"load {sum(r['load_s'] for r in rows):.3f} s, stream {sum(r['stream_s'] for r in rows):.3f} s, "
          f"peek {sum(r['peek_s'] for r in rows):.3f} s, node {sum(r.get('node_s', 0) for r in rows):.3f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
