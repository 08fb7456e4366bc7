"""Plain ``torch.profiler`` folders: one Kineto JSON per rank, no dpro collector (raw format ``kineto``).

A folder holding only per-rank Kineto traces (``.json`` / ``.json.gz``, any file
names, several ``ProfilerStep#N`` per file), as users export them for
TensorBoard or Holistic Trace Analysis, is a trace directory: :func:`discover`
(registered as the ``kineto`` discoverer, after dpro's own) builds its manifest
and :func:`read_node` (reader ``kineto``) reads one rank.  docs/kineto.md says
what is read and what is assumed; in short:

* **files** are recognised by content (a top-level ``traceEvents`` list); rank,
  world size and backend come from ``distributedInfo``; a single file without it
  is refused (the rank and world size are unknown), as are two files of one rank,
  files of jobs of different world sizes, empty ``traceEvents`` and truncated
  ``.gz`` files;
* **iterations** are the ``ProfilerStep#N`` ranges; the measured iteration time
  is, per step, the longest span over the ranks present, the median over steps;
* **ops**: per CPU thread the top-level work (:func:`dpro_kit.readers.kineto.top_level`:
  ranges that wrap ops are looked through, nested ops are not counted twice) on
  device ``cpu<j>`` (``cpu0``: the thread with the steps), and every kernel /
  memcpy / memset on device ``gpu:<stream>``;
* **dependencies**: program order per thread and per stream; the CPU op that
  launched a GPU op precedes it (Kineto ``correlation`` / ``ac2g`` flows); a CPU op
  that blocks in a synchronising runtime call (:data:`~dpro_kit.readers.kineto.SYNC_CALLS`)
  is split there and its second part waits for the GPU op it waited for (one of an
  earlier step: the step boundary, no edge); a GPU
  op that started later than both its launch and its stream allowed waits for
  the op of another stream that ended just before it (``cudaStreamWaitEvent``,
  inferred from the times: within :data:`WAIT_TOLERANCE_US`); a CPU op after a
  gap waits for the op of another thread that ended last in the gap (the
  training thread blocked in ``backward()``), and the rest of a thread's gaps
  is host time charged to the op after it (all of these: :mod:`dpro_kit.readers.kineto_gpu`);
* **collectives**: every NCCL kernel is one collective instance (its op is
  ``nccl<j>:<collective>#<k>``: the ``k``-th such collective of the iteration on the
  ``j``-th NCCL stream, which matches the same collective on every rank: NCCL runs a
  communicator's collectives in one order).  Scheme ``nccl``: the kernel starts
  when every rank has reached it (a barrier: In ops → one sync op → Out ops →
  the kernel), then runs for its **measured** duration.  NCCL kernel time
  includes waiting for peers that arrived late, so a straggler's wait is counted
  twice when the barrier also models it; with one rank (or identical stand-ins)
  the barrier adds nothing;
* **missing ranks** (a user with rank 0 only, or a sample): stood in by
  symmetry — each a copy of a present rank (same ops and durations).  Copies
  reach every barrier exactly when their source does, so they cannot change the
  replayed time; they are therefore not built (the manifest keeps the world size
  of ``distributedInfo``) and the output says so in one line.

References
----------
Kineto's trace format and HTA's reading of it: :mod:`dpro_kit.readers.kineto`.
dPRO's global DFG: Hu et al., "dPRO: A Generic Performance Diagnosis and
Optimization Toolkit for Expediting Distributed DNN Training", MLSys 2022, §4.1.
"""
from __future__ import annotations

import bisect
import gzip
import math
import os
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DproError, TraceFormatError
from ..trace import Collective, Manifest, NodeInfo, NodeTrace, OpKind, make_events
from . import kineto as K
from . import kineto_gpu as G
from .kineto_gpu import WAIT_TOLERANCE_US

__all__ = ["FORMAT", "discover", "read_node", "WAIT_TOLERANCE_US", "LIMITATION", "parse_rank",
           "nccl_barrier"]

FORMAT = "kineto"
#: the one line the replay prints about what a plain torch.profiler trace cannot tell
LIMITATION = ("plain torch.profiler input: bucket composition, gradient-ready times and a calibrated comm model "
              "need dpro's collector (`dpro profile`), so --bucket-mb and --bandwidth-mbps are refused; NCCL kernels "
              "keep their measured time (it includes waiting for peers), also under --world-size")
_SUFFIXES = (".json", ".json.gz")
_SNIFF_BYTES = 1 << 16
_cache: dict[tuple[str, int, int], "_Scan"] = {}


# --------------------------------------------------------------------------- discovery

@dataclass
class _Scan:
    """What discovery needs of one file, and (when it was parsed whole) the parsed trace."""

    trace: K.KinetoTrace | None     # None: streamed for discovery only (:func:`_peek`)
    distributed: dict[str, Any] | None
    steps: list[K.Step]             # every complete ProfilerStep#N event, any category
    gpu_labels: int                 # "GPU n" process labels
    device_props: int               # entries of a non-empty deviceProperties list (0: none)


#: folders of more files than this are discovered by :func:`_peek` (no parse: reading parses each
#: file once, and the parses cannot all be kept, docs/reliability.md "Memory"); smaller ones by
#: :func:`_scan`, whose parse reading then reuses
PEEK_ABOVE_FILES = 2


class _Seen:
    """The steps and GPU labels of a file's events, seen one by one (``traceEvents[i]`` in order)."""

    def __init__(self, path: Path) -> None:
        self.path, self.i, self.steps, self.labels = path, -1, [], 0

    def __call__(self, e: Any) -> None:
        self.i += 1
        if not isinstance(e, dict):
            return
        ph = e.get("ph")
        if ph == "X" and (m := K.STEP_RE.match(str(e.get("name", "")))):
            try:
                ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
            except (TypeError, ValueError, OverflowError):
                ts = dur = math.nan
            if not (math.isfinite(ts) and abs(ts) <= K.MAX_ABS_TS_US and 0 <= dur <= K.MAX_DUR_US):
                raise TraceFormatError(f"{m.group(0)} has no valid time (ts {e.get('ts')!r:.40}, dur "
                                       f"{e.get('dur')!r:.40})", path=self.path, record=f"traceEvents[{self.i}]",
                                       hint="the file is corrupt; export it again")
            self.steps.append(K.Step(int(m.group(1)), ts, ts + dur))
        elif ph == "M" and e.get("name") == "process_labels" and \
                str((e.get("args") or {}).get("labels", "")).startswith("GPU"):
            self.labels += 1


def _devices(header: dict[str, Any]) -> int:
    dp = header.get("deviceProperties")
    return len(dp) if isinstance(dp, list) else 0


def _scan(path: Path) -> _Scan:
    """:func:`kineto.parse_file` of ``path`` and its steps and GPU labels, keeping the last two
    (discovery and reading then read each file once; the JSON document is never held whole)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _cache:
        seen, header = _Seen(path), {}
        tr = K.parse_file(path, on_event=seen, header=header)
        while len(_cache) >= 2:
            old = _cache.pop(next(iter(_cache))).trace
            if old is not None:
                K.release(old)
        _cache[key] = _Scan(tr, tr.distributed, seen.steps, seen.labels, _devices(header))
    return _cache[key]


def _peek(path: Path) -> _Scan:
    """Discovery's facts of ``path`` from its event stream, without parsing the events (about a
    third of :func:`_scan`'s CPU time: ``bench/read_speed.py``, columns ``stream s`` and ``peek s``)."""
    seen, header = _Seen(path), {}
    with K.gc_paused():
        for e in K.iter_events(path, header):
            seen(e)
    return _Scan(None, K.distributed_info(header), seen.steps, seen.labels, _devices(header))


def _looks_like_kineto(path: Path) -> bool:
    """Cheap content sniff: the file starts a JSON object that mentions ``traceEvents`` or Kineto's header."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            try:
                with gzip.open(path, "rb") as fh:
                    head = fh.read(_SNIFF_BYTES)
            except (EOFError, OSError):
                return True      # a broken gzip .json.gz: let load_doc name the problem
    except OSError:
        return False
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    if len(head) < _SNIFF_BYTES:           # the whole file: it must have the key
        return b'"traceEvents"' in text
    return b'"traceEvents"' in text or b'"schemaVersion"' in text or b'"distributedInfo"' in text


def _candidates(trace_dir: Path) -> list[Path]:
    out = []
    for root, dirs, files in os.walk(trace_dir):
        dirs[:] = sorted(d for d in dirs if d != "aligned" and not d.startswith("."))
        if "meta.json" in files or "manifest.json" in files:
            continue   # a dpro collector folder: dpro's own reader handles it
        for f in sorted(files):
            if f.endswith(_SUFFIXES):
                p = Path(root) / f
                if _looks_like_kineto(p):
                    out.append(p)
    return out


def discover(trace_dir: Path) -> Manifest | None:
    """The manifest of a folder of plain torch.profiler traces, or None when it has none.

    Parameters
    ----------
    trace_dir : Path
        A directory without ``manifest.json``.

    Raises
    ------
    DproError
        One line naming the file: no ``distributedInfo`` in a single-file folder, two files
        of one rank, files of jobs of different world sizes, no ``ProfilerStep`` range, or a
        broken file (:func:`dpro_kit.readers.kineto.load_doc`).
    """
    trace_dir = Path(trace_dir)
    files = _candidates(trace_dir)
    if not files:
        return None
    found: list[tuple[Path, dict[str, Any] | None, list[K.Step]]] = []
    gpus_of: dict[Path, int] = {}
    look = _peek if len(files) > PEEK_ABOVE_FILES else _scan
    for p in files:
        scan = look(p)
        found.append((p, scan.distributed, scan.steps))
        gpus_of[p] = _gpus_per_host(scan)
    no_di = [p for p, di, _ in found if di is None]
    if no_di:
        raise DproError("torch.profiler trace without a usable 'distributedInfo' (rank, world_size)", path=no_di[0],
                        hint="export it from a job with torch.distributed initialised (torch.profiler records "
                             "distributedInfo then), one file per rank")
    worlds = {}
    for p, di, _ in found:
        worlds.setdefault(di["world_size"], p)
    if len(worlds) > 1:
        (w1, p1), (w2, p2) = list(worlds.items())[:2]
        raise DproError(f"files of different jobs in one folder: world size {w1} ({p1.name}) and {w2} ({p2.name})",
                        path=trace_dir, hint="put each job's per-rank traces in a folder of its own")
    by_rank: dict[int, Path] = {}
    for p, di, _ in found:
        r = di["rank"]
        if r in by_rank:
            raise DproError(f"two traces of rank {r}: {by_rank[r].name} and {p.name}", path=trace_dir,
                            hint="keep one file per rank (of one run) in the folder")
        by_rank[r] = p
    for p, _, steps in found:
        if not steps:
            raise DproError("no ProfilerStep#N range in the trace, so its iterations are unknown", path=p,
                            hint="profile with torch.profiler.schedule(...) and call prof.step() every iteration")
    world = next(iter(worlds))
    di0 = found[0][1]
    gpus = gpus_of[found[0][0]]
    common = sorted(set.intersection(*({s.number for s in st} for _, _, st in found)))
    if not common:
        raise DproError("the ranks' traces share no ProfilerStep number", path=trace_dir,
                        hint="export the same steps on every rank")
    nodes = {}
    for r, p in sorted(by_rank.items()):
        host = f"host{r // gpus}"
        nodes[f"{host}/{r}"] = NodeInfo(host=host, rank=r, dir=".", format=FORMAT,
                                        file=str(p.relative_to(trace_dir)))
    present = sorted(by_rank)
    # measured: per step the longest span over the ranks present (the job waits for its slowest rank),
    # the median over the steps every file has
    span: dict[int, float] = defaultdict(float)
    for _, _, steps in found:
        for st in steps:
            if st.number in common:
                span[st.number] = max(span[st.number], st.dur)
    step_ms = {str(n): span[n] / 1e3 for n in common}
    extra: dict[str, Any] = {"kineto_plain": {"ranks_present": present, "world_size": world,
                                              "gpus_per_host": gpus, "files": {str(r): str(by_rank[r].relative_to(
                                                  trace_dir)) for r in present},
                                              "step_ms": step_ms},
                             "measured_iteration_ms": statistics.median(step_ms.values()),
                             "notes": [LIMITATION]}
    missing = world - len(present)
    if missing:
        extra["notes"].insert(0, (
            f"rank(s) {_ranges(present)} of {world} replayed; the {missing} missing rank(s) are stood in by symmetry "
            f"(copies of a present rank: same ops and durations), which cannot change the replayed time, so they are "
            f"not built (--world-size builds copies)"))
    return Manifest(job=trace_dir.name or "kineto", framework="pytorch", comm_backend=str(di0.get("backend", "")),
                    world_size=world, nodes=nodes, iterations=common, raw_format=FORMAT, extra=extra)


def _ranges(xs: list[int]) -> str:
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def _gpus_per_host(scan: _Scan) -> int:
    """GPUs the trace lists (``deviceProperties``, else ``GPU n`` process labels); 1 if none."""
    return scan.device_props or max(1, scan.gpu_labels)


# --------------------------------------------------------------------------- one rank

@dataclass
class _Op:
    ev: K.KEvent
    lane: str               # "cpu<j>" or "gpu:<stream>"
    iteration: int
    start: float
    dur: float
    kind: str = OpKind.OTHER.value
    op: str = ""
    nccl: dict[str, Any] | None = None
    after_sync: bool = False    # the part of a CPU op after the synchronising call it blocked in


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """Reader ``kineto``: one rank's file (``manifest.nodes[node].file``) as a :class:`NodeTrace`."""
    info = manifest.nodes[node]
    if not getattr(info, "file", None):
        raise TraceFormatError(f"node {node!r} names no Kineto file", hint="let dpro discover the folder "
                               "(remove manifest.json) or add \"file\" to the node entry")
    path = Path(node_dir) / str(info.file)
    tr = _scan(path).trace
    for key in [k for k in _cache if k[0] == str(path.resolve())]:
        del _cache[key]   # reading is the parsed file's last use: let it go (peak memory, docs/reliability.md)
    with K.gc_paused():
        nt = parse_rank(tr, iterations=manifest.iterations)
    K.release(tr)
    return nt


def parse_rank(tr: K.KinetoTrace, iterations: list[int] | None = None) -> NodeTrace:
    """The event table, dependencies and NCCL collectives of one rank (see the module docstring)."""
    path = tr.path
    if not tr.steps:
        raise TraceFormatError("no ProfilerStep#N range in the trace", path=path,
                               hint="profile with torch.profiler.schedule(...) and call prof.step() every iteration")
    keep = set(iterations) if iterations else {s.number for s in tr.steps}
    windows = sorted((s.start, s.end, s.number) for s in tr.steps if s.number in keep)
    starts = [w[0] for w in windows]

    def iteration_of(t: float) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and windows[i][0] <= t < windows[i][1]:
            return windows[i][2]
        return None

    # ---- CPU threads: the one holding the steps is cpu0 ------------------------------------
    step_thread = next(k for k, evs in tr.cpu.items() if any(K.STEP_RE.match(e.name) for e in evs))
    threads = sorted(tr.cpu, key=lambda k: (k != step_thread, min(e.ts for e in tr.cpu[k])))
    ops: list[_Op] = []
    top_of: dict[int, _Op] = {}     # id(top-level event) -> op
    j = 0
    for key in threads:
        tops = [e for e in K.top_level(tr.cpu[key]) if iteration_of(e.ts) is not None]
        if not tops:
            continue
        lane = f"cpu{j}"
        j += 1
        for e in tops:
            o = _Op(ev=e, lane=lane, iteration=iteration_of(e.ts), start=e.ts, dur=e.dur)
            ops.append(o)
            top_of[id(e)] = o

    def top_op(e: K.KEvent | None) -> _Op | None:
        while e is not None and id(e) not in top_of:
            e = e.parent
        return top_of.get(id(e)) if e is not None else None

    # ---- GPU ops: iteration of the CPU call that launched them ------------------------------
    nccl_streams: list[Any] = []
    launched_by: dict[int, _Op] = {}   # id(gpu _Op) -> CPU op
    launch_ts: dict[int, float] = {}
    gpu_ops: dict[Any, list[_Op]] = {}
    for stream in sorted(tr.gpu, key=str):
        lst = []
        for e in tr.gpu[stream]:
            src = tr.launch.get(id(e))
            it = iteration_of(src.ts) if src is not None else iteration_of(e.ts)
            if it is None:
                continue
            o = _Op(ev=e, lane=f"gpu:{stream}", iteration=it, start=e.ts, dur=e.dur)
            if K.is_nccl_kernel(e):
                o.nccl = K.nccl_info(e, src)
                if stream not in nccl_streams:
                    nccl_streams.append(stream)
            cpu_op = top_op(src)
            if cpu_op is not None:
                launched_by[id(o)] = cpu_op
            launch_ts[id(o)] = src.ts if src is not None else e.ts
            lst.append(o)
            ops.append(o)
        if lst:
            gpu_ops[stream] = lst

    # NCCL streams in the order of their first collective (stream ids may differ between ranks)
    first_nccl = {st: min(o.start for o in lst if o.nccl is not None) for st, lst in gpu_ops.items()
                  if st in nccl_streams}
    nccl_streams.sort(key=lambda st: (first_nccl[st], str(st)))

    # ---- synchronising runtime calls: split the CPU op where it blocked (kineto_gpu) ---------
    gpu_ends = G.GpuEnds((o for lst in gpu_ops.values() for o in lst), lambda c: launch_ts[id(c)])
    waits: list[tuple[_Op, _Op]] = []   # (gpu op, cpu op that waited for it)
    for o in [o for o in ops if o.lane.startswith("cpu")]:
        syncs = G.sync_calls(o.ev)
        if not syncs:
            continue
        s = syncs[-1]              # the last blocking call of the op: what it waited for before going on
        found = G.awaited(gpu_ends, s.ts, s.end, WAIT_TOLERANCE_US)
        if found is None:
            continue               # nothing was running: the call did not wait
        g, cut = found
        after = _Op(ev=o.ev, lane=o.lane, iteration=o.iteration, start=cut, dur=max(0.0, o.start + o.dur - cut),
                    kind=o.kind, after_sync=True)
        o.dur = max(0.0, s.ts - o.start)
        ops.append(after)
        if g.iteration == o.iteration:   # a wait for an earlier step's GPU work: the iteration boundary
            waits.append((g, after))

    # ---- op ids: name#k per (iteration, lane, name) ------------------------------------------
    ops.sort(key=lambda o: (o.iteration, o.lane, o.start, o.after_sync))
    counter: dict[tuple[int, str, str], int] = defaultdict(int)
    nccl_k: dict[tuple[int, int, str], int] = defaultdict(int)
    for o in ops:
        if o.nccl is not None:
            sidx = nccl_streams.index(o.ev.args.get("stream", o.ev.tid))
            c = (o.iteration, sidx, o.nccl["collective"])
            o.op = f"nccl{sidx}:{o.nccl['collective']}#{nccl_k[c]}"
            nccl_k[c] += 1
            continue
        name = o.ev.name + (" (after sync)" if o.after_sync else "")
        c = (o.iteration, o.lane, name)
        o.op = f"{o.lane}/{name}#{counter[c]}"
        counter[c] += 1

    if not ops:
        raise TraceFormatError("no CPU or GPU op lies inside a ProfilerStep#N range", path=path,
                               record=f"ProfilerStep#{windows[0][2]}" if windows else "ProfilerStep",
                               hint="the step ranges or the op times are corrupt; export the trace again")

    # ---- dependencies -------------------------------------------------------------------------
    by_it: dict[int, list[_Op]] = defaultdict(list)
    for o in ops:
        by_it[o.iteration].append(o)
    edges_of: dict[int, list[tuple[str, str]]] = {}
    for it, lst in by_it.items():
        e: list[tuple[str, str]] = []
        lanes: dict[str, list[_Op]] = defaultdict(list)
        for o in lst:
            lanes[o.lane].append(o)
        for lane, seq in lanes.items():
            seq.sort(key=lambda o: (o.start, o.after_sync))
            e.extend((a.op, b.op) for a, b in zip(seq, seq[1:]))
        for o in lst:
            src = launched_by.get(id(o))
            if src is not None and src.iteration == it:
                e.append((G.piece(src, launch_ts[id(o)], lanes[src.lane]).op, o.op))
        e.extend((g.op, c.op) for g, c in waits if c.iteration == it)
        e.extend((u, v) for u, v, _ in G.lane_waits([s for s in lanes if s.startswith("gpu:")], lanes, launch_ts,
                                                      window=WAIT_TOLERANCE_US, tol=WAIT_TOLERANCE_US))
        cpu_waits = G.lane_waits([s for s in lanes if s.startswith("cpu")], lanes, {}, window=None,
                                 tol=WAIT_TOLERANCE_US)
        e.extend((u, v) for u, v, _ in cpu_waits)
        waited = {v: t for _, v, t in cpu_waits}
        waited.update({c.op: c.start for _, c in waits})
        step_start = next(w[0] for w in windows if w[2] == it)
        for lane, seq in lanes.items():   # host time: from the step's start on cpu0, the first op elsewhere
            if lane.startswith("cpu"):
                G.fold_host_gaps(seq, waited, step_start if lane == "cpu0" else None)
        edges_of[it] = G.acyclic(list(dict.fromkeys(e)), inferred={(g.op, c.op) for g, c in waits}
                                | {(u, v) for u, v, _ in cpu_waits})
    # representative iteration: the most common op set; its edges stand for every iteration
    sig = {it: frozenset(o.op for o in lst) for it, lst in by_it.items()}
    rep_sig = Counter(sig.values()).most_common(1)[0][0]
    rep = min(it for it, s in sig.items() if s == rep_sig)
    edges = edges_of[rep]
    common_ops = frozenset.intersection(*sig.values())

    # ---- collectives: one per NCCL kernel of the representative iteration present in every one --
    preds: dict[str, list[str]] = defaultdict(list)
    for u, v in edges:
        preds[v].append(u)
    collectives = []
    for o in sorted(by_it[rep], key=lambda o: o.start):
        if o.nccl is None or o.op not in common_ops:
            continue
        inputs = [p for p in preds.get(o.op, []) if p in common_ops]
        # bytes stay on the kernel's event (all_to_all sizes differ by rank; the scheme does not use them)
        collectives.append({"tensor": o.op, "op": "nccl", "algorithm": "nccl",
                            "bytes": 0, "inputs": inputs, "outputs": [o.op],
                            "params": []})
    rows = [{"op": o.op, "name": o.ev.name, "kind": o.kind, "iteration": o.iteration, "start": o.start,
             "dur": o.dur, "stream": o.lane, "bytes": int(o.nccl["bytes"]) if o.nccl else 0,
             "tensor": o.op if o.nccl else "", "phase": o.nccl["collective"] if o.nccl else ""}
            for o in ops]
    return NodeTrace(events=make_events(rows, path=str(path)), edges=edges, collectives=collectives,
                     warnings=list(tr.warnings))


# --------------------------------------------------------------------------- the nccl scheme

def nccl_barrier(ctx: Any, coll: Collective) -> None:
    """Scheme ``nccl``: In(r) → one sync op → Out(r) → the rank's NCCL kernel (kind COMM in the graph).

    The kernel (a local op of each rank, ``coll.outputs``) keeps its measured duration and
    starts when every participant has reached the collective.
    """
    from ..graph.model import add_op, op_key
    g = ctx.graph
    sync = op_key("", f"SYNC {coll.tensor}")
    add_op(g, sync, node="", kind=OpKind.VIRTUAL.value, name=f"SYNC {coll.tensor}", priority=coll.priority)
    for r in coll.participants:
        kin, kout = ctx.in_out(coll, r)
        g.add_edge(kin, sync)
        g.add_edge(sync, kout)
        for o in coll.outputs.get(r, []):
            k = op_key(r, o)
            if k in g:
                g.nodes[k]["kind"] = OpKind.COMM.value


def _nccl_collectives(self: Any, grp: Any) -> list[Collective]:
    return [Collective(tensor=grp.name, op=self.op, bytes=grp.bytes, participants=list(grp.participants),
                       algorithm=self.name, inputs=grp.inputs, outputs=grp.outputs, params=grp.params,
                       priority=grp.priority)]


def _nccl_recognise(g: Any, in_ops: dict[str, str]) -> tuple[list[str], list[str]] | None:
    first = next(iter(in_ops.values()))
    if any(str(g.nodes[s]["name"]).startswith("SYNC ") for s in g.successors(first)):
        return sorted(in_ops), []
    return None


def _register() -> None:
    from ..graph.schemes import CommScheme, register_scheme
    register_scheme(CommScheme(name="nccl", op="nccl", build=nccl_barrier, collectives=_nccl_collectives,
                               recognise=_nccl_recognise))


_register()
