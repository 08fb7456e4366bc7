"""Reader for PyTorch traces recorded by the ``dpro_torch`` collector (raw format ``torch-kineto``).

A node folder holds ``meta.json`` (written by ``collectors/torch/dpro_torch``)
and the Kineto (chrome-trace JSON) trace it names (``kineto_trace.json``, or
``.json.gz``).  Two layers: the generic Kineto layer (:mod:`dpro_kit.readers.kineto`:
loading, events in exact nanoseconds, per-thread call trees, top-level work, events
recorded per subtree, allocator samples, launches and flows) and, here, what the
collector adds — its markers and ``meta.json`` — read in the named steps of
:func:`parse_node` (training thread, clock offset, iterations and phases, compute
threads, top-level ops, gradient-ready markers, collectives and DDP buckets, host
gaps, profiler cost).  What the reader takes from where:

* **iterations** - the ``dpro::step_end`` markers on the training thread; the
  ``i``-th marker ends profiled step ``meta.window.profiled_steps[i]``, the
  first iteration starts after the ``dpro::clock_sync`` markers;
* **ops** - one row per *top-level* op per iteration: the outermost Kineto
  event on a compute thread that is not a ``record_function`` range wrapping
  other ops (framework ranges such as ``DistributedDataParallel.forward`` or
  ``Optimizer.step#SGD.step`` are looked through; a range with nothing inside,
  such as ``Optimizer.zero_grad``, is an op).  The op id is ``name#k``, the
  ``k``-th op of that name in the iteration on that thread, so the same op has
  the same id in every iteration;
* **kind** - only from the collector's phase markers: inside
  ``dpro::forward`` -> FW, ``dpro::backward`` -> BW, ``dpro::optimizer_step``
  -> UPDATE, anything else (data, loss, zero_grad) -> OTHER; collectives run by
  the communication library -> COMM.  Op names are never inspected for this;
* **stream** - ``compute`` for the training thread and any autograd thread: on
  CPU both run on the same cores and the training thread blocks inside
  ``backward()`` while an autograd thread works, so one device per node is the
  faithful model; ``comm`` for collectives; ``gpu:<stream>`` for CUDA kernels,
  copies and memsets.  Threads that record only CUDA runtime calls (NCCL's
  watchdog polling events) are not compute threads;
* **communication** - gloo: the launch ``c10d::<collective>`` (the c10d
  operator namespace) on a compute thread and the ``gloo:<collective>`` range
  on a gloo worker thread, paired per collective type in launch order; the
  worker range is the COMM event (stream ``comm``).  NCCL: the launches paired
  in order with the ``nccl*`` kernels launched in the profiled iterations; the
  kernel is the COMM event (validated on real H100 traces,
  ``examples/traces/ddp-h100-2rank-nccl-*``, tests/test_gpu_traces.py);
* **GPU** (a trace with CUDA kernels; docs/accuracy.md, "On a GPU") - as dPRO
  models it, with the dependencies of :mod:`dpro_kit.readers.kineto_gpu` (shared
  with the plain torch.profiler reader): a GPU op belongs to the iteration and
  phase of the top-level CPU op that launched it (Kineto correlation id) and
  follows the part of that op running at the launch; each stream runs in order
  and waits inferred from the times join streams (``cudaStreamWaitEvent``); a
  CPU op holding a synchronising call is cut at its last one, the second part
  (``<name> (after sync)``) starting when the GPU op it waited for ended (a
  wait for the previous iteration's GPU work, the training loop's
  ``torch.cuda.synchronize()``, is the replay's iteration boundary, no edge);
  a CPU thread that idled until another thread's op ended (the training thread
  blocked in ``backward()`` while the autograd thread ran) waits for that op.
  A DDP bucket's collective also waits for the GPU op launched last before its
  NCCL kernel (the gradients), and DDP's wait for the buckets is the first GPU
  op launched after the last bucket (``copy_bucket_to_grad``): the GPU waits,
  the CPU goes on launching the optimizer;
* **per-chunk transfers** (``dpro profile --ring``): the collector's timed ring comm hook
  (``dpro_torch.ringhook``) records per ring step SEND/RECV posted..completed times in
  ``ring_chunks.json``; they become SEND/RECV events with the graph builder's transaction
  ids (:func:`_ring_rows`); its ranges ``dpro_ring::allreduce`` (launch) and
  ``dpro_ring::work`` (the bucket's whole ring) stand in for ``c10d::allreduce_`` and
  ``gloo:all_reduce``;
* **DDP buckets** - ``meta.ddp[0].buckets`` (composition after DDP's bucket
  rebuild, in reduction order); the ``j``-th allreduce launched inside the
  backward phase of an iteration is bucket ``j``.  Each bucket becomes one
  collective (``allreduce``/``ring``).  ``inputs``: the backward op that
  launched it.  The ``dpro::grad_ready/<param>`` markers give the op in which
  the bucket's last gradient became ready (``ready_op`` in the collective
  entry; DDP launches then, or later when it holds a bucket back to keep bucket
  order); it stands in for the launch op when no launch was recorded.
  ``outputs``: the op after the last bucket's launch op on that thread - the
  first op of DDP's finalize, which waits for the reduced buckets (the first
  UPDATE op if there is none).  Ranges on gloo worker threads can end late
  (the thread is descheduled after it completed the work), so the reader does
  not infer waits from their end times;
* **host time** - on the training thread the Python time between two
  top-level ops is charged to the op that follows (``start`` moves back to the
  previous op's end; ``dur`` grows), except from the bucket-wait op to the end
  of the backward phase, where the gaps are waiting for the allreduces, not
  work.  On a GPU trace every compute thread's gaps are folded except the time
  before an inferred wait ended (:func:`dpro_kit.readers.kineto_gpu.fold_host_gaps`).  Eager PyTorch spends a large share of a small model's iteration in the
  interpreter; without this the replay would miss it.
  ``manifest.extra["torch_kineto"]["host_gaps"] = "keep"`` turns it off;
* **profiler overhead** - every top-level op's ``dur`` (after host-gap
  folding) loses a per-event cost times the number of events the profiler
  recorded inside it (itself included), floored at 0 (the part of a split op
  after its synchronising call is not charged).  The per-event cost
  (``manifest.extra["torch_kineto"]["profiler_overhead"]``):
  ``"calibrated"`` - the collector times a C++ loop of small ops just before
  the profiler starts and again inside a ``dpro::calibrate`` range right after
  (``meta.profiler_overhead``): ``(min profiled - min plain) / events recorded
  per loop`` (~0.3 us on the 2-core test VM; a lower bound: real ops cost the
  profiler more than these hot, tiny ones); ``"window"`` (default) - the larger
  of that and the cost measured on the job itself: (median profiled iteration,
  the first excluded - median unprofiled iteration of the same rank, or the
  same difference of the process's CPU time per step when larger: a
  communication-bound iteration hides the profiler's cost in its wait) / events
  recorded per iteration inside ops (:func:`window_overhead_ns`), at most
  20 us; ``"keep"`` - nothing is subtracted;
* **COMM durations** - collectives that ran at the same time on a node (gloo
  has two worker threads) share its one network path, so each COMM event's
  ``dur`` is the time it ran alone plus an equal share of the time it
  overlapped others (its ``start`` is as recorded).  Only the fitted
  communication model reads these durations.

Times are microseconds since the Unix epoch (Kineto ``ts`` + the trace's
``baseTimeNanoseconds``; the ``dpro::clock_sync`` marker checks this against
``time.time_ns()`` and corrects it when the two clocks disagree), so the nodes
of one machine share a clock.  As float64 such values step by 0.25 us;
durations are exact (computed in integer nanoseconds).
"""
from __future__ import annotations

import math
import statistics

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceFormatError
from ..trace import Manifest, NodeTrace, OpKind, make_events, read_json
from .. import schema as S
from . import kineto as K
from . import kineto_gpu as G
from .gaps import fold_gaps

# the collector's meta.json format and markers: one definition (dpro_kit/schema.py), shared with the collector
META_FORMAT = S.TORCH_META_FORMAT
META_VERSIONS = S.TORCH_META_VERSIONS
MARKERS = S.MARKERS
MARKER_NS = S.MARKER_PREFIX

#: operator namespace of c10d collectives as dispatched on the launching thread (gloo and NCCL)
C10D_NS = "c10d::"
#: c10d launch op -> collective name used for tensor/op ids
C10D_COLLECTIVES = {
    "c10d::allreduce_": "allreduce", "c10d::allreduce_coalesced_": "allreduce",
    "c10d::broadcast_": "broadcast", "c10d::allgather_": "allgather", "c10d::_allgather_base_": "allgather",
    "c10d::allgather_into_tensor_coalesced_": "allgather", "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::reduce_": "reduce", "c10d::gather_": "gather", "c10d::scatter_": "scatter",
    "c10d::alltoall_": "alltoall", "c10d::alltoall_base_": "alltoall", "c10d::barrier": "barrier",
    "c10d::send": "send", "c10d::recv_": "recv",
    "dpro_ring::allreduce": "allreduce",  # the collector's timed ring comm hook (dpro_torch.ringhook)
}
#: ranges gloo's worker threads record around the collective they execute
GLOO_WORKER = {
    "gloo:all_reduce": "allreduce", "gloo:broadcast": "broadcast", "gloo:all_gather": "allgather",
    "gloo:reduce_scatter": "reduce_scatter", "gloo:reduce": "reduce", "gloo:gather": "gather",
    "gloo:scatter": "scatter", "gloo:all_to_all": "alltoall", "gloo:barrier": "barrier",
    "gloo:send": "send", "gloo:recv": "recv",
    "dpro_ring::work": "allreduce",       # the timed ring's thread, one range per bucket
}
RING_FORMAT = "dpro-ring-chunks"
RING_COLUMNS = ["bucket", "step", "send_chunk", "recv_chunk", "send_bytes", "recv_bytes",
                "send_start_ns", "send_end_ns", "recv_start_ns", "recv_end_ns"]


@dataclass
class _Op:
    ev: K.KEvent
    thread: str           # "" for the training thread, "t<j>/" for other compute threads, "gpu<s>/" for streams
    stream: str
    kind: str
    iteration: int
    op: str = ""
    start: int = 0        # ns
    dur: int = 0          # ns
    after_sync: bool = False   # the part of a CPU op after the synchronising call it blocked in

    @property
    def name(self) -> str:
        return self.ev.name + (" (after sync)" if self.after_sync else "")


# --------------------------------------------------------------------------- reading files

def _load_meta(node_dir: Path) -> dict[str, Any]:
    path = node_dir / "meta.json"
    return S.validate_torch_meta(read_json(path, what="dpro_torch meta file"), path)


def _contains(intervals: list[tuple[int, int, Any]], t: int) -> Any:
    """The payload of the interval (sorted, non-overlapping) that contains time ``t``, else None."""
    lo, hi = 0, len(intervals)
    while lo < hi:
        mid = (lo + hi) // 2
        if intervals[mid][0] <= t:
            lo = mid + 1
        else:
            hi = mid
    i = lo - 1
    if i >= 0 and intervals[i][0] <= t < intervals[i][1]:
        return intervals[i][2]
    return None


def _root_of(e: K.KEvent | None, tops: dict[int, Any]) -> K.KEvent | None:
    while e is not None and id(e) not in tops:
        e = e.parent
    return e


# --------------------------------------------------------------------------- the reader

def _file_of(node_dir: Path, doc: dict[str, Any], key: str, record: str, hint: str) -> Path:
    """``node_dir / doc[key]``: a file name the collector wrote into the node's folder (one-line error
    for anything else: a path, '..', a name the filesystem refuses, fuzz case 6615's 1 MB string)."""
    v = doc.get(key)
    if not (isinstance(v, str) and 0 < len(v) <= 255 and "/" not in v and "\0" not in v and v not in (".", "..")):
        raise TraceFormatError(f"{key!r} must name a file in the node's folder; got {v!r}"[:300],
                               path=node_dir / "meta.json", record=record, hint=hint)
    return node_dir / v


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    node_dir = Path(node_dir)
    meta = _load_meta(node_dir)
    tpath = _file_of(node_dir, meta, "trace_file", "trace_file", "the file was damaged; profile again")
    kt, doc = K.read_file(tpath)     # streamed: never the whole document (docs/reliability.md, "Memory")
    facts = manifest.facts
    fold_gaps = facts.host_gaps != "keep"
    overhead = facts.profiler_overhead
    if overhead not in OVERHEAD_MODES:
        raise TraceFormatError(f"unknown torch_kineto.profiler_overhead {overhead!r} in the manifest",
                               hint="use one of " + ", ".join(OVERHEAD_MODES))
    ring = None
    if meta.get("ring_file"):
        rpath = _file_of(node_dir, meta, "ring_file", "ring_file",
                         "the file was damaged; profile again (dpro profile --ring)")
        ring = (rpath, read_json(rpath))
    ranks = {int(i.rank): n for n, i in manifest.nodes.items() if i.role == "worker"}
    return parse_node(meta, doc, path=tpath, fold_gaps=fold_gaps, overhead=overhead, ring=ring,
                      node_of_rank=ranks, kt=kt)


def read_op_shapes(node_dir: Path) -> dict[str, dict[str, Any]]:
    """Op id -> recorded inputs of the training thread's top-level ops, from ``kineto_shapes.json``.

    ``dpro profile --shapes`` records the iteration after the window once more with
    ``record_shapes=True``; its ops get the ids of the window's ops (same numbering,
    :func:`parse_node`).  Values: the Kineto ``args`` (``Input Dims``, ``Input type``,
    ``Concrete Inputs``) plus ``kind`` (FW/BW/UPDATE/OTHER).  Empty when no shapes were recorded.
    """
    node_dir = Path(node_dir)
    meta = _load_meta(node_dir)
    sh = meta.get("shapes") or {}
    if not sh.get("trace_file"):
        return {}
    path = _file_of(node_dir, sh, "trace_file", "shapes.trace_file",
                    "the file was damaged; profile again (dpro profile --shapes)")
    doc = K.load_doc(path)
    m = dict(meta, window=dict(meta["window"], profiled_steps=[int(sh["step"])]),
             clock={"sync": []}, steps=[], measured={})
    out: dict[str, dict[str, Any]] = {}
    parse_node(m, doc, path=path, fold_gaps=False, overhead="keep", op_args=out)
    return out


#: how the reader removes the profiler's cost from op durations (manifest extra torch_kineto.profiler_overhead)
OVERHEAD_MODES = S.OVERHEAD_MODES
#: the words every warning of a node whose op times keep part of the profiler's cost contains (the
#: "window" correction could not be measured on the job); ``dpro simulate`` passes such warnings on as notes
COST_NOT_MEASURED = "the profiler's cost is the calibration loop's only"
#: upper bound on the per-event cost the "window" mode may attribute (ns)
MAX_EVENT_OVERHEAD_NS = 20_000.0


def window_overhead_ns(meta: dict[str, Any], events_per_iteration: float) -> float | None:
    """Per-event profiler cost measured on the job itself (the "window" mode), or None.

    (median wall time of this rank's profiled iterations, the first one excluded:
    it holds the profiler start) - (median of its unprofiled iterations, both
    recorded by the collector), divided by the events recorded per profiled
    iteration inside the ops.  The profiler and the collector's markers are the
    only difference between the two sets of iterations, and their cost is paid per
    recorded event, so this is the measured per-event overhead of this job on this
    machine; drift between the window and the rest of the run would be attributed
    to it too, which is why the unprofiled iterations on both sides are used.

    When the steps carry the process's CPU time (``cpu_us``, the collector since
    2026-11), the excess is the larger of the wall-clock one and the same
    difference of CPU time per step (profiled steps, the first excluded, vs the
    unprofiled steps of ``measured.unprofiled_steps_used``): in a
    communication-bound job the profiler's cost on the computation is hidden in
    the wait for the network and the wall clock shows only part of it (a
    2-host gloo job at 500 Mbit/s: wall +1.2..1.7 ms, CPU +4.3..6.1 ms per
    iteration; docs/deft.md §7, "Which graph").
    """
    steps = meta.get("steps") or []
    prof = [float(s["dur_us"]) for s in steps if s.get("profiled")][1:]
    unprof = (meta.get("measured") or {}).get("median_unprofiled_us")
    if len(prof) < 2 or not unprof or events_per_iteration <= 0:
        return None
    excess = statistics.median(prof) - float(unprof)
    # the same difference in the process's CPU time per step: where the iteration waits for the network
    # (a communication-bound job) the profiler's cost on the computation hides in that wait and the wall
    # clock shows little of it; the CPU clock does not wait (docs/deft.md §7, "Which graph")
    try:
        used = {int(k) for k in (meta.get("measured") or {}).get("unprofiled_steps_used") or []}
        cpu_p = [float(s["cpu_us"]) for s in steps if s.get("profiled") and "cpu_us" in s][1:]
        cpu_u = [float(s["cpu_us"]) for s in steps if s.get("step") in used and "cpu_us" in s]
    except (TypeError, ValueError, OverflowError):   # an older or damaged meta.json: the wall clock only
        cpu_p, cpu_u = [], []
    if len(cpu_p) >= 2 and cpu_u and all(math.isfinite(x) for x in cpu_p + cpu_u):
        excess = max(excess, statistics.median(cpu_p) - statistics.median(cpu_u))
    return min(MAX_EVENT_OVERHEAD_NS, max(0.0, excess * 1e3 / events_per_iteration))


def profiler_overhead_ns(meta: dict[str, Any], main: list[K.KEvent], markers: list[K.KEvent]) -> float:
    """The profiler's cost per recorded event, from the collector's calibration (0 when there is none).

    ``meta.profiler_overhead`` holds the wall times (ns) of the same C++ loop of
    small ops run ``calls`` times without the profiler (``plain_ns``) and inside
    the ``dpro::calibrate`` range with it (``profiled_ns``); the events the
    profiler recorded inside that range, divided by ``calls``, are the events per
    loop.  Cost per event = (min profiled - min plain) / events per loop.

    Parameters
    ----------
    meta : dict
        The node's ``meta.json``.
    main : list of KEvent
        The training thread's events, the collector's markers excluded.
    markers : list of KEvent
        The collector's markers on the training thread.
    """
    po = meta.get("profiler_overhead") or {}
    try:
        plain, prof = min(int(x) for x in po["plain_ns"]), min(int(x) for x in po["profiled_ns"])
        calls = int(po["calls"])
    except (KeyError, TypeError, ValueError, OverflowError):   # OverflowError: an infinite reading (case 13074)
        return 0.0
    name = po.get("marker") or MARKERS["calibrate"]
    ranges = [m for m in markers if m.name == name]
    if not ranges or calls <= 0:
        return 0.0
    r = ranges[0]
    inside = sum(1 for e in main if r.start_ns <= e.start_ns and e.end_ns <= r.end_ns)
    per_call = inside / calls
    if per_call < 1:
        return 0.0
    return max(0.0, (prof - plain) / per_call)


# --------------------------------------------------------------------------- the steps of parse_node

def _marker_names(meta: dict[str, Any]) -> dict[str, str]:
    """The collector's marker names: the defaults, overridden by those meta.json lists."""
    mk = dict(MARKERS)
    mk.update({k: v for k, v in (meta.get("markers") or {}).items() if isinstance(v, str)})
    return mk


def _is_marker(e: K.KEvent) -> bool:
    return e.name.startswith(MARKER_NS)


def _training_thread(kt: K.KinetoTrace, meta: dict[str, Any], path: Path) -> tuple[Any, Any]:
    """The (pid, tid) of the training thread: meta.json's ``main_tid`` if it holds dpro markers,
    else the thread with the most markers."""
    key = next((k for k in kt.cpu if k[1] == meta.get("main_tid")), None)
    if key is None or not any(_is_marker(e) for e in kt.cpu[key]):
        counts = Counter(k for k, es in kt.cpu.items() for e in es if _is_marker(e))
        if not counts:
            raise TraceFormatError("the trace has no dpro:: markers", path=path,
                                   hint="record it with the dpro_torch collector (collectors/torch)")
        key = counts.most_common(1)[0][0]
    return key


def _in_file_order(evs: list[K.KEvent]) -> list[K.KEvent]:
    return sorted(evs, key=lambda e: e.index)


def _clock_offset(markers: list[K.KEvent], meta: dict[str, Any], mk: dict[str, str]) -> int:
    """ns to add to Kineto times to put them on ``time.time_ns()``: 0 unless the
    ``dpro::clock_sync`` marker with the tightest ``time.time_ns()`` bracket lies outside it."""
    sync = sorted((e for e in markers if e.name == mk["clock_sync"]), key=lambda e: e.start_ns)
    sync_meta = (meta.get("clock") or {}).get("sync") or []
    pairs = list(zip(sync, sync_meta))
    if not pairs:
        return 0
    s, m = min(pairs, key=lambda p: int(p[1]["time_ns_after"]) - int(p[1]["time_ns_before"]))
    lo, hi = int(m["time_ns_before"]), int(m["time_ns_after"])
    if lo <= s.start_ns and s.end_ns <= hi:
        return 0
    return (lo + hi) // 2 - (s.start_ns + s.dur_ns // 2)


@dataclass
class _Window:
    """The profiled iterations on the training thread and the phase ranges inside them (ns)."""

    steps: list[int]                          # profiled step numbers, one per dpro::step_end marker
    spans: list[tuple[int, int, int]]         # (start, end, step), sorted
    phases: list[tuple[int, int, str]]        # (start, end, OpKind value), sorted, non-overlapping

    def iteration_of(self, t: int) -> int | None:
        return _contains(self.spans, t)

    def kind_at(self, t: int) -> str:
        return _contains(self.phases, t) or OpKind.OTHER.value


def _iterations(markers: list[K.KEvent], main: list[K.KEvent], meta: dict[str, Any], mk: dict[str, str],
                path: Path) -> _Window:
    """Iteration ``i`` ends at the ``i``-th ``dpro::step_end`` marker and is profiled step
    ``meta.window.profiled_steps[i]``; the first starts after the last ``dpro::clock_sync``."""
    ends = sorted((e for e in markers if e.name == mk["step_end"]), key=lambda e: e.start_ns)
    steps = [int(s) for s in meta["window"].get("profiled_steps", [])]
    if not ends or not steps:
        raise TraceFormatError("no complete profiled iteration in the trace (no dpro::step_end marker)", path=path,
                               hint="the job stopped inside the first profiled iteration; profile earlier steps")
    if len(ends) > len(steps):
        raise TraceFormatError(f"{len(ends)} step_end markers but meta.json lists {len(steps)} profiled steps",
                               path=path, hint="meta.json does not belong to this trace")
    steps = steps[:len(ends)]
    sync = sorted((e for e in markers if e.name == mk["clock_sync"]), key=lambda e: e.start_ns)
    prev = sync[-1].end_ns if sync else min(e.start_ns for e in main)
    spans = []
    for it, e in zip(steps, ends):
        spans.append((prev, e.start_ns, it))
        prev = e.end_ns
    phase_of_marker = {mk[role]: OpKind(kind).value for role, kind in S.PHASE_MARKERS.items()}
    phases = _flatten(sorted((e.start_ns, e.end_ns, phase_of_marker[e.name]) for e in markers
                             if e.name in phase_of_marker))
    return _Window(steps=steps, spans=spans, phases=phases)


@dataclass
class _Thread:
    key: tuple[Any, Any]                      # (pid, tid)
    prefix: str                               # op id prefix: "" training thread, "t<j>/" others
    events: list[K.KEvent]                    # its events, markers and collective work excluded (file order)
    counted: Any                              # predicate: does an event count as recorded work


def _threads(kt: K.KinetoTrace, main_key: tuple[Any, Any],
             win: _Window) -> tuple[list[_Thread], list[K.KEvent]]:
    """The compute threads (the training thread first, then by first event) and the collective
    work ranges of the communication library's worker threads (gloo), sorted by start.

    Whatever runs inside a collective on its worker thread is part of the collective; a
    thread is a compute thread when anything else on it falls in a profiled iteration and it
    records more than CUDA runtime calls.
    """
    def plain(e: K.KEvent) -> bool:
        return not _is_marker(e)

    threads = [_Thread(main_key, "", [e for e in _in_file_order(kt.cpu[main_key]) if plain(e)], plain)]
    comm_work: list[K.KEvent] = []
    for key, es in sorted(kt.cpu.items(), key=lambda kv: min(e.start_ns for e in kv[1])):
        if key == main_key:
            continue
        es = _in_file_order(es)
        work = [e for e in es if e.name in GLOO_WORKER]
        counted = plain
        if work:
            comm_work.extend(work)
            busy = _flatten(sorted((w.start_ns, w.end_ns, True) for w in work))

            def counted(e: K.KEvent, busy=busy) -> bool:
                return plain(e) and e.name not in GLOO_WORKER and not _contains(busy, e.start_ns)
        kept = [e for e in es if counted(e)]
        # a thread with operators in a profiled iteration (CUDA runtime calls alone: the NCCL watchdog
        # polling events, a runtime helper thread, not the job's computation)
        if kept and any(win.iteration_of(e.start_ns) is not None for e in kept) and \
                any(e.cat not in ("cuda_runtime", "cuda_driver") for e in kept):
            threads.append(_Thread(key, f"t{len(threads)}/", kept, counted))
    return threads, sorted(comm_work, key=lambda e: e.start_ns)


def _top_level_ops(kt: K.KinetoTrace, threads: list[_Thread], win: _Window
                   ) -> tuple[list[_Op], dict[int, int], dict[Any, list[tuple[int, int, _Op]]]]:
    """One op per top-level event of a compute thread in a profiled iteration (the collector's
    markers are looked through), kind from the phase it starts in; the events recorded inside
    each; per thread the ops' (start, end, op) spans."""
    ops: list[_Op] = []
    sizes: dict[int, int] = {}
    op_spans: dict[Any, list[tuple[int, int, _Op]]] = {}
    for th in threads:
        evs = kt.cpu[th.key]
        sizes.update(K.subtree_sizes(evs, counted=th.counted))
        spans = []
        for e in K.top_level(evs, transparent=_is_marker):
            if not th.counted(e):
                continue
            it = win.iteration_of(e.start_ns)
            if it is None:
                continue
            o = _Op(ev=e, thread=th.prefix, stream="compute", kind=win.kind_at(e.start_ns), iteration=it,
                    start=e.start_ns, dur=e.dur_ns)
            ops.append(o)
            spans.append((e.start_ns, max(e.end_ns, e.start_ns + 1), o))
        op_spans[th.key] = sorted(spans, key=lambda x: x[0])
    return ops, sizes, op_spans


def _gpu_ops(kt: K.KinetoTrace, win: _Window, cpu_ops: list[_Op]
             ) -> tuple[list[_Op], list[K.KEvent], dict[int, _Op], dict[int, int]]:
    """One op per CUDA kernel / copy / memset on its stream (``gpu:<stream>``), in the iteration and
    phase of the top-level CPU op that launched it (Kineto correlation id; its own start when the
    launch was not recorded); the NCCL kernels apart (collectives), in their launch's iteration.
    Returns the ops, the NCCL kernels, id(GPU op) -> launching CPU op, id(GPU op or kernel) ->
    launch time (ns)."""
    top_of = {id(o.ev): o for o in cpu_ops}
    ops, nccl = [], []
    launched_by: dict[int, _Op] = {}
    launch_ns: dict[int, int] = {}
    for e in _all_gpu(kt):
        src = kt.launch.get(id(e))
        cpu = top_of.get(id(_root_of(src, top_of))) if src is not None else None
        t = src.start_ns if src is not None else e.start_ns
        launch_ns[id(e)] = t
        it = cpu.iteration if cpu is not None else win.iteration_of(t)
        if it is None:
            continue
        if K.is_nccl_kernel(e):
            nccl.append(e)
            continue
        o = _Op(ev=e, thread=f"gpu{e.tid}/", stream=f"gpu:{e.tid}", kind=cpu.kind if cpu is not None
                else win.kind_at(t), iteration=it, start=e.start_ns, dur=e.dur_ns)
        ops.append(o)
        launch_ns[id(o)] = t
        if cpu is not None:
            launched_by[id(o)] = cpu
    return ops, nccl, launched_by, launch_ns


def _all_gpu(kt: K.KinetoTrace) -> list[K.KEvent]:
    return sorted((e for evs in kt.gpu.values() for e in evs), key=lambda e: (e.start_ns, e.index))


def _split_at_syncs(cpu_ops: list[_Op], gpu_ops: list[_Op], launch_ns: dict[int, int], all_gpu: list[K.KEvent]
                    ) -> tuple[list[_Op], list[tuple[_Op, _Op]]]:
    """A CPU op holding a synchronising CUDA call (:func:`kineto_gpu.sync_calls`) is cut at its last
    one: the op keeps the time before the call, a new op ``<name> (after sync)`` starts when the
    GPU op it waited for (:func:`kineto_gpu.awaited`) ended.  Returns the new ops and the (GPU op,
    op after sync) waits inside one iteration; a wait for the previous iteration's GPU work (the
    training loop's ``torch.cuda.synchronize()`` after ``optimizer.step()``) is the iteration
    boundary of the replay, so it gets no edge."""
    # what a call can wait for: every GPU op, also NCCL kernels and work launched before the window
    # (the first profiled iteration's synchronize waits for it), which are not ops of the graph
    ops_of = {id(o.ev): o for o in gpu_ops}
    every = [ops_of.get(id(e)) or _Op(ev=e, thread="", stream="", kind="", iteration=-1, start=e.start_ns,
                                       dur=e.dur_ns) for e in all_gpu]
    gpu = G.GpuEnds(every, lambda c: launch_ns.get(id(c), launch_ns.get(id(c.ev), c.start)))
    new, waits = [], []
    for o in cpu_ops:
        syncs = G.sync_calls(o.ev)
        if not syncs:
            continue
        s = syncs[-1]
        found = G.awaited(gpu, s.start_ns, s.end_ns, G.WAIT_TOLERANCE_US * 1e3)
        if found is None:
            continue
        g, cut = found
        cut = int(cut)
        after = _Op(ev=o.ev, thread=o.thread, stream=o.stream, kind=o.kind, iteration=o.iteration, start=cut,
                    dur=max(0, o.start + o.dur - cut), after_sync=True)
        o.dur = max(0, s.start_ns - o.start)
        new.append(after)
        if g.iteration == o.iteration and id(g.ev) in ops_of:
            waits.append((g, after))
    return new, waits


def _gpu_dependencies(ops: list[_Op], launched_by: dict[int, _Op], launch_ns: dict[int, int],
                      sync_waits: list[tuple[_Op, _Op]]
                      ) -> tuple[dict[int, tuple[list[tuple[str, str]], set[tuple[str, str]]]], dict[int, dict[str, float]]]:
    """Per iteration, the edges a CUDA trace implies beyond program order (:mod:`kineto_gpu`): the
    part of the CPU op running at a launch -> the GPU op; the GPU op a synchronising call waited
    for -> the op after the call; waits between streams (``cudaStreamWaitEvent``) and between CPU
    threads (the training thread blocked in ``backward()`` while the autograd thread ran),
    inferred from the times.  Also, per iteration, op -> when what it waited for ended (host-gap
    folding starts there)."""
    tol = G.WAIT_TOLERANCE_US * 1e3
    by_it: dict[int, dict[str, list[_Op]]] = defaultdict(lambda: defaultdict(list))
    for o in ops:
        by_it[o.iteration][o.thread].append(o)
    out: dict[int, tuple[list[tuple[str, str]], set[tuple[str, str]]]] = {}
    waited: dict[int, dict[str, float]] = {}
    for it, lanes in by_it.items():
        for seq in lanes.values():
            seq.sort(key=lambda o: (o.start, o.after_sync))
        edges: list[tuple[str, str]] = []
        for th, seq in lanes.items():
            for o in seq:
                src = launched_by.get(id(o))
                if src is not None and src.iteration == it:
                    edges.append((G.piece(src, launch_ns[id(o)], lanes[src.thread]).op, o.op))
        syncs = [(g.op, c.op) for g, c in sync_waits if c.iteration == it]
        gpu = G.lane_waits([t for t in lanes if t.startswith("gpu")], lanes, launch_ns, window=tol, tol=tol)
        cpu = G.lane_waits([t for t in lanes if not t.startswith("gpu")], lanes, {}, window=None, tol=tol)
        edges.extend(syncs)
        edges.extend((u, v) for u, v, _ in gpu + cpu)
        out[it] = (edges, set(syncs) | {(u, v) for u, v, _ in cpu})
        waited[it] = {v: t for _, v, t in cpu}
        waited[it].update({c.op: c.start for _, c in sync_waits if c.iteration == it})
        waited[it].update({o.op: o.start for seq in lanes.values() for o in seq if o.after_sync})
    return out, waited


def _on_gpu_streams(collectives: list[dict[str, Any]], per_bucket: dict[int, list[dict[str, Any]]],
                    gpu_ops: list[_Op], launch_ns: dict[int, int]) -> None:
    """NCCL: a bucket's collective also waits for the GPU op launched last before it (its stream waits
    for the compute stream's event: the gradients are computed there), and DDP's wait for the buckets
    is on the GPU: the first GPU op launched after the last bucket's collective (``copy_bucket_to_grad``
    or the optimizer's first kernel) waits for them, not a CPU op (the CPU thread goes on)."""
    by_it: dict[int, list[_Op]] = defaultdict(list)
    for o in gpu_ops:
        by_it[o.iteration].append(o)
    times: dict[int, list[int]] = {}
    for it, lst in by_it.items():
        lst.sort(key=lambda o: launch_ns[id(o)])
        times[it] = [launch_ns[id(o)] for o in lst]
    last: dict[int, int] = {}
    for j, lst in per_bucket.items():
        before = []
        for x in lst:
            t = launch_ns.get(id(x["work"])) if x["work"] is not None else None
            if t is None or x["iteration"] not in by_it:
                continue
            last[x["iteration"]] = max(last.get(x["iteration"], t), t)
            i = bisect.bisect_left(times[x["iteration"]], t) - 1
            before.append(by_it[x["iteration"]][i].op if i >= 0 else None)
        gin = _mode(before)
        if gin is not None and j < len(collectives):
            collectives[j]["inputs"] = [*collectives[j]["inputs"], gin]
    after = []
    for it, t in last.items():
        i = bisect.bisect_right(times[it], t)
        after.append(by_it[it][i].op if i < len(by_it[it]) else None)
    gout = _mode(after)
    if gout is not None:
        for c in collectives:
            c["outputs"] = [gout]


def _number_ops(ops: list[_Op]) -> dict[tuple[int, str], list[_Op]]:
    """Stable op ids ``<thread>name#k`` (the k-th op of that name in the iteration on that thread);
    returns the CPU ops per (iteration, thread) in start order."""
    ops.sort(key=lambda o: (o.iteration, o.thread, o.start, o.after_sync))
    counter: dict[tuple[int, str, str], int] = defaultdict(int)
    for o in ops:
        key = (o.iteration, o.thread, o.name)
        o.op = f"{o.thread}{o.name}#{counter[key]}"
        counter[key] += 1
    seqs: dict[tuple[int, str], list[_Op]] = defaultdict(list)
    for o in ops:
        if not o.thread.startswith("gpu"):
            seqs[(o.iteration, o.thread)].append(o)
    for seq in seqs.values():
        seq.sort(key=lambda o: (o.start, o.after_sync))
    return seqs


def _grad_ready(kt: K.KinetoTrace, op_spans: dict[Any, list[tuple[int, int, _Op]]],
                mk: dict[str, str]) -> dict[int, list[tuple[int, _Op]]]:
    """Parameter index -> [(time, top-level op)] of its ``dpro::grad_ready/<index>`` markers
    (on whichever thread ran autograd)."""
    gprefix = mk["grad_ready_prefix"]
    ready: dict[int, list[tuple[int, _Op]]] = defaultdict(list)
    for key, es in kt.cpu.items():
        if key not in op_spans:
            continue
        for e in _in_file_order(es):
            if e.name.startswith(gprefix):
                o = _contains(op_spans[key], e.start_ns)
                if o is not None and e.name[len(gprefix):].isdigit():
                    ready[int(e.name[len(gprefix):])].append((e.start_ns, o))
    return ready


def _pair_collectives(threads: list[_Thread], comm_work: list[K.KEvent], nccl: list[K.KEvent]
                      ) -> list[tuple[K.KEvent, K.KEvent | None, str]]:
    """(launch, work, collective) per collective: launches ``c10d::*`` on a compute thread (the
    training thread on CPU, the autograd thread on CUDA) paired, per collective type and in
    launch order, with the gloo worker ranges; with NCCL, with the kernels in launch order."""
    launches = sorted((e for th in threads for e in th.events if e.name in C10D_COLLECTIVES),
                      key=lambda e: e.start_ns)
    work_by_type: dict[str, list[K.KEvent]] = defaultdict(list)
    for e in comm_work:
        work_by_type[GLOO_WORKER[e.name]].append(e)
    if not comm_work and nccl:
        work_by_type["*"] = nccl
    taken: dict[str, int] = defaultdict(int)
    pairs = []
    for e in launches:
        coll = C10D_COLLECTIVES[e.name]
        queue = work_by_type.get(coll) or work_by_type.get("*") or []
        key = coll if coll in work_by_type else "*"
        w = queue[taken[key]] if taken[key] < len(queue) else None
        taken[key] += 1
        pairs.append((e, w, coll))
    return pairs


def _ddp_buckets(meta: dict[str, Any], path: Path) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The first DDP module's buckets from meta.json (``tensor``, param indices, names, bytes)
    and every parameter's size."""
    ddp = (meta.get("ddp") or [{}])[0] if meta.get("ddp") else {}
    params = ddp.get("params") or []
    pname = {int(p["index"]): str(p["name"]) for p in params}
    pbytes = {int(p["index"]): int(p["bytes"]) for p in params}
    out = []
    for j, b in enumerate(ddp.get("buckets") or []):
        idx = [int(i) for i in b["params"]]
        if any(i not in pname for i in idx):
            raise TraceFormatError(f"DDP bucket {j} names a parameter missing from meta.json", path=path)
        out.append({"tensor": f"bucket{j}", "params": idx, "names": [pname[i] for i in idx],
                    "bytes": sum(pbytes[i] for i in idx)})
    return out, pbytes


def _comm_events(pairs, win: _Window, bucket_info: list[dict[str, Any]], top_ids: dict[int, _Op],
                 path: Path) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """COMM rows (one per collective that has work) and, per DDP bucket, its launches per iteration.

    The ``j``-th allreduce launched inside backward in an iteration is bucket ``j``; each
    COMM row's ``dur`` is its exclusive time plus an equal share of overlapped time
    (:func:`_exclusive_ns`: collectives running at once share the node's one network path).
    """
    comm_rows: list[dict[str, Any]] = []
    per_bucket: dict[int, list[dict[str, Any]]] = defaultdict(list)  # j -> [{iteration, launch, work}]
    n_other: dict[tuple[int, str], int] = defaultdict(int)
    n_bucket: dict[int, int] = defaultdict(int)
    for launch, work, coll in pairs:
        it = win.iteration_of(launch.start_ns)
        if it is None:
            continue
        top = _root_of(launch, top_ids)
        in_bw = _contains(win.phases, launch.start_ns) == OpKind.BW.value
        j = n_bucket[it] if (coll == "allreduce" and in_bw) else None
        if j is not None and j < len(bucket_info):
            n_bucket[it] += 1
            b = bucket_info[j]
            tensor, nbytes, op_id = b["tensor"], b["bytes"], f"allreduce:{b['tensor']}"
            per_bucket[j].append({"iteration": it, "launch": top_ids[id(top)].op if top is not None else None,
                                  "work": work})
        else:
            k = n_other[(it, coll)]
            n_other[(it, coll)] += 1
            tensor, nbytes, op_id = "", 0, f"{coll}#{k}"
        if work is not None:
            comm_rows.append({"op": op_id, "name": work.name, "kind": OpKind.COMM.value, "iteration": it,
                              "start": work.start_ns, "dur": work.dur_ns, "stream": "comm", "tensor": tensor,
                              "bytes": nbytes, "_ev": work})
    shares = _exclusive_ns([(r["_ev"].start_ns, r["_ev"].end_ns) for r in comm_rows])
    for r, sh in zip(comm_rows, shares):
        r["dur"] = sh
        del r["_ev"]
    if bucket_info:
        for it in win.steps:
            if n_bucket.get(it, 0) != len(bucket_info):
                raise TraceFormatError(
                    f"iteration {it}: {n_bucket.get(it, 0)} bucket allreduces launched in backward, "
                    f"but DDP has {len(bucket_info)} buckets", path=path,
                    hint="buckets changed inside the profiled window (profile later steps) or the model "
                         "launches its own allreduce in backward")
    return comm_rows, per_bucket


def _bucket_ready(bucket_info: list[dict[str, Any]], ready: dict[int, list[tuple[int, _Op]]],
                  pbytes: dict[int, int]) -> None:
    """Per bucket: the op in which its last gradient became ready, per iteration (``ready``), and
    per parameter the op in which its gradient did (most common over iterations)."""
    for b in bucket_info:
        last: dict[int, tuple[int, _Op]] = {}
        for i in b["params"]:
            for t, o in ready.get(i, []):
                if o.iteration not in last or t > last[o.iteration][0]:
                    last[o.iteration] = (t, o)
        b["ready"] = {it: o.op for it, (t, o) in last.items()}
        b["param_ready"] = [_mode([o.op for _t, o in ready.get(i, [])]) for i in b["params"]]
        b["param_bytes"] = [pbytes[i] for i in b["params"]]


def _fold_host_gaps(seqs: dict[tuple[int, str], list[_Op]], win: _Window, wait_op: str | None,
                    waits: list[tuple[int, int]] = ()) -> None:
    """Training thread: the Python time between two top-level ops is charged to the op after it
    (:func:`dpro_kit.readers.gaps.fold_gaps`), except from the bucket-wait op to the end of
    backward (waiting for the allreduces, not work) and for gaps that overlap a ``dpro::comm_wait``
    range (``waits``: the framework blocked there for its collectives, e.g. Horovod's ``synchronize``)."""
    for (it, thread), seq in seqs.items():
        if thread != "":
            continue
        waiting, w = [], False
        for o in seq:
            w = (w and o.kind == OpKind.BW.value) or o.op == wait_op
            waiting.append(w)
        starts = [o.start for o in seq]
        new = fold_gaps(starts, [o.ev.end_ns for o in seq], next(s[0] for s in win.spans if s[2] == it),
                        keep=lambda i, frm: waiting[i] or any(a < starts[i] and b > frm for a, b in waits))
        for o, s in zip(seq, new):
            o.dur += o.start - s
            o.start = s


def _first_op_after_wait(seqs: dict[tuple[int, str], list[_Op]], win: _Window,
                         waits: list[tuple[int, int]]) -> str | None:
    """The op that waits for a framework's collectives: per iteration, the training thread's first
    op starting at or after the iteration's first ``dpro::comm_wait`` range; the most common one."""
    found = []
    for (it, thread), seq in seqs.items():
        w = next((a for a, _b in waits if win.iteration_of(a) == it), None)
        if thread == "" and w is not None:
            found.append(next((o.op for o in seq if o.start >= w), None))
    return _mode([f for f in found if f])


def _subtract_profiler_cost(ops: list[_Op], sizes: dict[int, int], meta: dict[str, Any], overhead: str,
                            main: list[K.KEvent], markers: list[K.KEvent]) -> str | None:
    """Every CPU op loses the per-event profiler cost (:data:`OVERHEAD_MODES`) times the events
    recorded inside it, floored at 0.  Returns a warning when the "window" mode lacks the step
    times it needs (meta.json ``steps`` / ``measured``) and only the calibration loop was used."""
    if overhead == "keep":
        return None
    per_event = profiler_overhead_ns(meta, main, markers)  # the collector's micro-calibration
    warning = None
    if overhead == "window":
        cpu_ops = [o for o in ops if not o.thread.startswith("gpu") and not o.after_sync]
        n_iter = len({o.iteration for o in cpu_ops}) or 1
        w = window_overhead_ns(meta, sum(sizes.get(id(o.ev), 1) for o in cpu_ops) / n_iter)
        per_event = max(per_event, w) if w is not None else per_event
        n_prof = sum(1 for x in (meta.get("steps") or []) if isinstance(x, dict) and x.get("profiled"))
        if w is None and not meta.get("steps"):
            warning = (f"meta.json has no step times ('steps', 'measured'): {COST_NOT_MEASURED}, not measured on "
                       "the job's own iterations (re-collect for the usual correction)")
        elif w is None and not (meta.get("measured") or {}).get("median_unprofiled_us"):
            win = meta.get("window")
            steps = win.get("profiled_steps") if isinstance(win, dict) else None
            span = (f"steps {min(steps)}..{max(steps)}" if isinstance(steps, list) and steps
                    and all(type(x) is int for x in steps) else "steps ?")
            warning = (f"no unprofiled iteration after warm-up outside the profiled window ({span}; the one after it "
                       f"holds the export, and one more the --shapes iteration): {COST_NOT_MEASURED}, so "
                       "the op times carry the rest of it (often 10-30 % of a small model's iteration; "
                       "docs/simulate.md): run the script a few more iterations after the window")
        elif w is None and n_prof < 3:
            warning = (f"the profiled window has {n_prof} iteration(s) and the first holds the profiler's start: "
                       f"{COST_NOT_MEASURED}, so the op times carry the rest of it (profile 3 or more iterations)")
    if per_event > 0:
        for o in ops:   # the part of a split op after its synchronising call waited: it is not charged
            if not o.thread.startswith("gpu") and not o.after_sync:
                o.dur = max(0, o.dur - round(per_event * sizes.get(id(o.ev), 1)))
    return warning


def _memory(doc: dict[str, Any], win: _Window, offset_ns: int) -> pd.DataFrame | None:
    """Allocator samples (``dpro profile --memory``) inside the profiled iterations, on the node's clock."""
    rows = [(int(it), (s.time_ns + offset_ns) / 1e3, s.device, s.total_bytes)
            for s in K.memory_samples(doc) if (it := win.iteration_of(s.time_ns)) is not None]
    if not rows:
        return None
    return pd.DataFrame(rows, columns=["iteration", "time", "device", "bytes"])


def parse_node(meta: dict[str, Any], doc: dict[str, Any], *, path: Path, fold_gaps: bool = True,
               overhead: str = "window", ring: tuple[Path, Any] | None = None,
               node_of_rank: dict[int, str] | None = None,
               op_args: dict[str, dict[str, Any]] | None = None,
               extra: dict[str, Any] | None = None, kt: K.KinetoTrace | None = None) -> NodeTrace:
    """One rank's trace: the generic Kineto layer's events and call trees (:mod:`.kineto`), read
    with what the collector's markers and ``meta.json`` say (the module docstring, step by step).

    Parameters
    ----------
    meta : dict
        The rank's ``meta.json``.
    doc : dict
        Its Kineto document (:func:`dpro_kit.readers.kineto.load_doc`), or with ``kt`` the stand-in
        :func:`dpro_kit.readers.kineto.read_file` returns.
    path : Path
        The Kineto file, named in errors.
    fold_gaps : bool
        Charge the training thread's host time between ops to the op after it.
    overhead : str
        One of :data:`OVERHEAD_MODES`.
    ring : (Path, document), optional
        The timed ring's ``ring_chunks.json`` (``dpro profile --ring``).
    node_of_rank : dict, optional
        Global rank -> node name (for the ring's peers).
    op_args : dict, optional
        Receives op id -> Kineto ``args`` of the training thread's top-level ops (input
        shapes for a ``record_shapes`` trace).
    extra : dict, optional
        Receives what a reader that adds its own collectives needs: ``wait_op`` (the op that
        waits for the collectives), ``grad_ready`` (parameter index -> [(iteration, op id,
        time in us)]) and ``iterations`` ([(start us, end us, step)]), times on the Unix clock.
    kt : KinetoTrace, optional
        ``doc`` already parsed (:func:`dpro_kit.readers.kineto.read_file`).
    """
    mk = _marker_names(meta)
    kt = K.parse(doc, path) if kt is None else kt
    main_key = _training_thread(kt, meta, path)
    markers = [e for e in _in_file_order(kt.cpu[main_key]) if _is_marker(e)]
    main = [e for e in _in_file_order(kt.cpu[main_key]) if not _is_marker(e)]
    offset_ns = _clock_offset(markers, meta, mk)
    win = _iterations(markers, main, meta, mk, path)
    threads, comm_work = _threads(kt, main_key, win)

    ops, sizes, op_spans = _top_level_ops(kt, threads, win)
    ready = _grad_ready(kt, op_spans, mk)
    gpu_ops, nccl, launched_by, launch_ns = _gpu_ops(kt, win, ops)
    cuda = bool(gpu_ops or nccl)     # a CUDA trace: launches, streams and synchronising calls are modelled
    after_sync, sync_waits = _split_at_syncs(ops, gpu_ops, launch_ns, _all_gpu(kt)) if cuda else ([], [])
    ops.extend(after_sync)
    ops.extend(gpu_ops)
    seqs = _number_ops(ops)
    if op_args is not None:
        op_args.update({o.op: dict(o.ev.args, kind=o.kind) for o in ops if o.thread == "" and not o.after_sync})
    top_ids = {id(o.ev): o for seq in seqs.values() for o in seq if not o.after_sync}
    dep_edges, waited = _gpu_dependencies(ops, launched_by, launch_ns, sync_waits) if cuda else ({}, {})

    bucket_info, pbytes = _ddp_buckets(meta, path)
    comm_rows, per_bucket = _comm_events(_pair_collectives(threads, comm_work, nccl), win, bucket_info,
                                         top_ids, path)
    _bucket_ready(bucket_info, ready, pbytes)
    collectives, wait_op = _collectives(bucket_info, per_bucket, seqs)
    if cuda and collectives:
        _on_gpu_streams(collectives, per_bucket, gpu_ops, launch_ns)
    waits = sorted((e.start_ns, e.end_ns) for e in markers if e.name == mk.get("comm_wait"))
    if wait_op is None and waits:  # no DDP bucket wait: the first op inside/after a comm_wait range
        wait_op = _first_op_after_wait(seqs, win, waits)
    if extra is not None:  # for readers that add their own collectives (readers/horovod.py)
        extra["wait_op"] = wait_op
        extra["grad_ready"] = {i: [(o.iteration, o.op, (t + offset_ns) / 1e3) for t, o in lst]
                               for i, lst in ready.items()}
        extra["iterations"] = [((a + offset_ns) / 1e3, (b + offset_ns) / 1e3, it) for a, b, it in win.spans]

    if fold_gaps and cuda:  # every CPU thread, except where it waited (for a thread or the GPU)
        for (it, thread), seq in seqs.items():
            G.fold_host_gaps(seq, waited.get(it, {}), next(s[0] for s in win.spans if s[2] == it)
                             if thread == "" else None)
    elif fold_gaps:
        _fold_host_gaps(seqs, win, wait_op, waits)
    cost_warning = _subtract_profiler_cost(ops, sizes, meta, overhead, main, markers)

    rows = [{"op": o.op, "name": o.name, "kind": o.kind, "iteration": o.iteration,
             "start": (o.start + offset_ns) / 1e3, "dur": o.dur / 1e3, "stream": o.stream} for o in ops]
    for r in comm_rows:
        r["start"] = (r["start"] + offset_ns) / 1e3
        r["dur"] = r["dur"] / 1e3
    rows.extend(comm_rows)
    if ring is not None:
        rows.extend(_ring_rows(ring[1], ring[0], win.iteration_of, offset_ns, node_of_rank or {},
                               {b["tensor"] for b in bucket_info}))
    events = make_events(rows, path=str(path))
    edges = _edges(ops, win.steps, dep_edges)
    return NodeTrace(events=events, edges=edges, collectives=collectives, memory=_memory(doc, win, offset_ns),
                     warnings=kt.warnings + ([cost_warning] if cost_warning else []))


def _ring_rows(doc: Any, path: Path, iteration_of: Any, offset_ns: int, node_of_rank: dict[int, str],
               tensors: set[str]) -> list[dict[str, Any]]:
    """SEND/RECV events from the timed ring's records (``ring_chunks.json``, dpro_torch.ringhook).

    Transaction ids are the graph builder's (``topology.txn_id``) for the same ring step, so the
    events join up across nodes and with the topology's SEND/RECV ops.  Times are
    ``time.time_ns()``: the clock the reader moves Kineto times onto.
    """
    from ..graph.topology import txn_id
    if not isinstance(doc, dict) or doc.get("format") != RING_FORMAT or doc.get("version") != 1:
        raise TraceFormatError("not a dpro ring record file (format dpro-ring-chunks, version 1)", path=path)
    if doc.get("columns") != RING_COLUMNS:
        raise TraceFormatError(f"unexpected columns {doc.get('columns')!r}", path=path,
                               hint=f"expected {RING_COLUMNS}")
    try:
        n, me = int(doc["world_size"]), int(doc["rank"])
        granks = [int(r) for r in doc["global_ranks"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"ring header field missing or not an integer: {exc}", path=path) from None
    if len(granks) != n or not 0 <= me < n:
        raise TraceFormatError(f"rank {me} / global_ranks {granks} do not fit world_size {n}", path=path)
    missing = [r for r in granks if r not in node_of_rank]
    if missing:
        raise TraceFormatError(f"ring peers {missing} are not nodes of the manifest", path=path,
                               hint="every rank's folder must be in the trace directory")
    name = [node_of_rank[r] for r in granks]
    rows: list[dict[str, Any]] = []
    for k, rec in enumerate(doc.get("records") or []):
        try:
            b, st, cs, cr, sb, rb, s0, s1, r0, r1 = (int(x) for x in rec)
        except (TypeError, ValueError):
            raise TraceFormatError(f"record {k} is not {len(RING_COLUMNS)} integers", path=path,
                                   record=f"records[{k}]") from None
        if not (0 <= st < 2 * (n - 1)) or s1 < s0 or r1 < r0:
            raise TraceFormatError(f"record {k}: step {st} or times out of order", path=path,
                                   record=f"records[{k}]")
        it = iteration_of(s0 - offset_ns)
        tensor = f"bucket{b}"
        if it is None or tensor not in tensors:
            continue
        phase = "reduce_scatter" if st < n - 1 else "all_gather"
        right, left = name[(me + 1) % n], name[(me - 1) % n]
        common = {"kind": None, "iteration": it, "stream": "comm", "tensor": tensor, "phase": phase, "step": st}
        ts = txn_id(tensor, phase, st, cs, name[me], right)
        tr = txn_id(tensor, phase, st, cr, left, name[me])
        rows.append({**common, "kind": OpKind.SEND.value, "op": f"SEND {ts}", "name": f"SEND {tensor}",
                     "start": s0 / 1e3, "dur": (s1 - s0) / 1e3, "bytes": sb, "txn": ts, "chunk": cs,
                     "peer": right})
        rows.append({**common, "kind": OpKind.RECV.value, "op": f"RECV {tr}", "name": f"RECV {tensor}",
                     "start": r0 / 1e3, "dur": (r1 - r0) / 1e3, "bytes": rb, "txn": tr, "chunk": cr,
                     "peer": left})
    return rows


def _flatten(intervals: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Phase intervals sorted and made non-overlapping (a later phase cuts an earlier one short)."""
    out: list[tuple[int, int, str]] = []
    for s, e, p in intervals:
        if out and out[-1][1] > s:
            ps, _, pp = out[-1]
            out[-1] = (ps, s, pp)
        out.append((s, e, p))
    return [x for x in out if x[1] > x[0]]


def _mode(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return Counter(values).most_common(1)[0][0] if values else None


def _collectives(bucket_info, per_bucket, seqs) -> tuple[list[dict[str, Any]], str | None]:
    """One allreduce collective per DDP bucket (see the module docstring); returns them and the wait op."""
    if not bucket_info:
        return [], None
    launch = {j: _mode([x["launch"] for x in per_bucket.get(j, [])]) for j in range(len(bucket_info))}
    ready = {j: _mode(list(b.get("ready", {}).values())) for j, b in enumerate(bucket_info)}
    for j in launch:  # no launch seen (e.g. its thread was not recognised): the gradient-ready op
        launch[j] = launch[j] or ready[j]
    # the op that waits for the reduced buckets: the op after the last bucket's launch op, on its thread
    waits = []
    for (it, thread), seq in seqs.items():
        ids = [o.op for o in seq]
        pos = [ids.index(launch[j]) for j in launch if launch[j] in ids]
        if pos and max(pos) + 1 < len(ids):
            waits.append(ids[max(pos) + 1])
    wait = _mode(waits)
    if wait is None:  # fall back: the first UPDATE op
        for (it, thread) in sorted(seqs):
            ups = [o.op for o in seqs[(it, thread)] if o.kind == OpKind.UPDATE.value]
            if ups:
                wait = ups[0]
                break
    out = []
    for j, b in enumerate(bucket_info):
        out.append({"tensor": b["tensor"], "op": "allreduce", "algorithm": "ring", "bytes": int(b["bytes"]),
                    "params": list(b["names"]), "inputs": [launch[j]] if launch[j] else [],
                    "outputs": [wait] if wait else [],
                    # informational (not part of the comm.json schema): where the last gradient was ready
                    "ready_op": ready[j], "param_bytes": list(b["param_bytes"]),
                    **({"param_ready": list(b["param_ready"])} if all(b["param_ready"]) else {})})
    return out, wait


def _exclusive_ns(intervals: list[tuple[int, int]]) -> list[float]:
    """Per interval: its length with time shared equally among the intervals active at once."""
    points = sorted({t for iv in intervals for t in iv})
    share = [0.0] * len(intervals)
    if len(points) < 2:
        return [float(e - s) for s, e in intervals]
    starts = sorted(range(len(intervals)), key=lambda i: intervals[i][0])
    active: set[int] = set()
    nxt = 0
    for a, b in zip(points, points[1:]):
        while nxt < len(starts) and intervals[starts[nxt]][0] <= a:
            active.add(starts[nxt])
            nxt += 1
        active = {i for i in active if intervals[i][1] > a}
        if active:
            part = (b - a) / len(active)
            for i in active:
                share[i] += part
    return share


def _edges(ops: list[_Op], steps: list[int],
           deps: dict[int, tuple[list[tuple[str, str]], set[tuple[str, str]]]] | None = None) -> list[tuple[str, str]]:
    """Per-thread program order, plus backward-after-forward and optimizer-after-backward across threads;
    a CUDA trace's launches and waits (``deps``: iteration -> (edges, those inferred from times),
    :func:`_gpu_dependencies`)."""
    seqs: dict[int, dict[str, list[_Op]]] = defaultdict(lambda: defaultdict(list))
    for o in ops:
        seqs[o.iteration][o.thread].append(o)
    # representative iteration: the one whose op sequence is the most common
    sig = {it: tuple(o.op for th in sorted(t) for o in sorted(t[th], key=lambda o: o.start))
           for it, t in seqs.items()}
    if not sig:
        return []
    common = Counter(sig.values()).most_common(1)[0][0]
    rep = next(it for it in steps if sig.get(it) == common)
    edges: list[tuple[str, str]] = []
    threads = {th: sorted(lst, key=lambda o: o.start) for th, lst in seqs[rep].items()}
    for th, lst in threads.items():
        edges.extend((a.op, b.op) for a, b in zip(lst, lst[1:]))
    cpu = [lst for th, lst in threads.items() if not th.startswith("gpu")]
    last = {k: [lst_k[-1].op for lst_k in ([o for o in lst if o.kind == k] for lst in cpu) if lst_k]
            for k in (OpKind.FW.value, OpKind.BW.value)}
    first = {k: [lst_k[0].op for lst_k in ([o for o in lst if o.kind == k] for lst in cpu) if lst_k]
             for k in (OpKind.BW.value, OpKind.UPDATE.value)}
    edges.extend((a, b) for a in last[OpKind.FW.value] for b in first[OpKind.BW.value])
    edges.extend((a, b) for a in last[OpKind.BW.value] for b in first[OpKind.UPDATE.value])
    if deps and rep in deps:
        dep, inferred = deps[rep]
        edges.extend(dep)
        return G.acyclic(list(dict.fromkeys(edges)), inferred)
    return list(dict.fromkeys(edges))


__all__ = ["COST_NOT_MEASURED", "C10D_COLLECTIVES", "C10D_NS", "GLOO_WORKER", "MARKER_NS", "MARKERS", "MAX_EVENT_OVERHEAD_NS",
           "META_FORMAT", "META_VERSIONS", "OVERHEAD_MODES", "RING_COLUMNS", "RING_FORMAT", "finish", "parse_node",
           "profiler_overhead_ns", "read_node", "read_op_shapes", "window_overhead_ns"]


def finish(ts: Any) -> Any:
    """Refuse a job whose ranks disagree on DDP: DDP wraps the same model on every rank, so when
    some workers' collectives are DDP buckets (their ``meta.json`` describes the module), every
    worker that communicates takes part in them.  A rank whose ``meta.json`` lost its ``ddp``
    entry (fuzz case 6838: ``ddp`` emptied on one of two ranks) otherwise replays as a job whose
    buckets only the other rank all-reduces (+6.0 %).  Registered as this format's finisher."""
    workers = [n for n, i in ts.manifest.nodes.items() if i.role == "worker"]
    colls = [c for c in ts.collectives if str(c.tensor).startswith("bucket")]
    if len(workers) < 2 or not colls:
        return ts
    ev = ts.events
    talking = set(ev.loc[ev["kind"] == OpKind.COMM.value, "node"])
    inside = set().union(*(set(c.participants) for c in colls))
    left = [n for n in workers if n in talking and n not in inside]
    if left:
        info = ts.manifest.nodes[left[0]]
        where = Path(ts.path or ".") / (info.dir or left[0]) / "meta.json"
        raise TraceFormatError(f"{left[0]} communicates but takes part in no DDP bucket, which "
                               f"{', '.join(sorted(inside))[:200]} all-reduce: its meta.json has no DDP module "
                               "(ddp) while theirs do; DDP wraps the same model on every rank", path=where,
                               record="ddp", hint="the file was damaged; profile again")
    return ts
