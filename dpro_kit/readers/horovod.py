"""Reader for Horovod + PyTorch jobs profiled by ``dpro profile`` (raw format ``horovod-torch``).

A node folder holds what the PyTorch collector writes for any rank (``meta.json``, the
Kineto trace) plus ``horovod_timeline.json``: that rank's own Horovod timeline (every rank
writes one with the project's Horovod patch, ``patches/horovod``; stock Horovod writes rank
0's only).  What comes from where:

* **computation** - the Kineto trace, read exactly as for DDP jobs
  (:func:`dpro_kit.readers.torch_kineto.parse_node`): ops, kinds from the collector's
  markers, host-gap folding, profiler-cost subtraction, the ``dpro::grad_ready/<i>``
  markers on the ``hvd.DistributedOptimizer``'s parameters, and the ``dpro::comm_wait``
  range around its ``synchronize()`` (the training thread blocks there; the first op in or
  after it is the op that waits for the allreduces);
* **Horovod's work, per tensor** - the timeline: ``NEGOTIATE_ALLREDUCE`` (until every rank
  has the tensor ready), then ``ALLREDUCE`` with the activities ``MEMCPY_IN_FUSION_BUFFER``,
  ``GLOO_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``.  Timestamps are made Unix microseconds
  with the file's ``start_time_since_epoch_in_micros`` - the clock the Kineto times are on.
  The timeline names tensors ``allreduce.<parameter name>``; ``meta.json["horovod"]``
  maps them to the optimizer's parameters (index, bytes);
* **fusion groups** - tensors whose ``GLOO_ALLREDUCE`` ran as one (same start and end)
  were fused into one buffer.  Horovod decides this every cycle, so it can differ between
  iterations; the grouping seen in most profiled iterations is the job's (``hvd<k>`` in
  execution order), and only those iterations' Horovod events are used;
* **per group, on each rank** - a negotiation collective ``hvd<k>-negotiate`` (8 bytes over
  the ring, from the op in which the group's last gradient was ready: every rank waits
  for all ranks, as Horovod's negotiation does), then local ops on the node's ``hvd``
  stream (Horovod's background thread), in this order: ``hvd:negotiate:<g>`` (the wait
  after every rank is ready - the cycle tick and the last messages: the smallest, over
  the profiled iterations, time from the later of (last gradient ready, previous group
  finished) to the start of the fusion-buffer copy; then the smallest over the ranks,
  :func:`finish`),
  ``hvd:memcpy_in:<g>``, then the allreduce (the ``ring`` scheme's SEND/RECV steps
  between In and Out, timed by the comm model fitted to the ``GLOO_ALLREDUCE`` durations,
  which are the group's COMM events; the comm model is fitted to the allreduces outside the
  profiled window instead, :func:`unprofiled_comm_events`), then ``hvd:memcpy_out:<g>``.  Edges: the op in which
  the group's last gradient became ready -> negotiation collective -> negotiate -> memcpy_in -> In; Out ->
  memcpy_out -> the waiting op; and memcpy_out of group g -> negotiate of group g+1 (one
  background thread runs the groups one after another).

What this reader cannot see: the cycle ticks themselves (the negotiate op holds the cycle
wait and the negotiation together; ``dpro_kit.whatif.horovod`` splits them by the cycle
time) and Horovod's response cache (its hits are faster negotiations, included as timed).
"""
from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceFormatError
from ..schema import HOROVOD_RAW_FORMAT
from ..trace import Manifest, NodeTrace, OpKind, make_events
from . import kineto as K
from . import torch_kineto as TK

__all__ = ["FORMAT", "finish", "iteration_spread_us", "read_node", "load_timeline", "responses", "shared_core_responses", "summarize",
           "TensorRecord", "Response", "unprofiled_comm_events"]

FORMAT = HOROVOD_RAW_FORMAT
TIMELINE_FILE = "horovod_timeline.json"
STREAM = "hvd"            # Horovod's background thread on each rank
MEMCPY_IN = "MEMCPY_IN_FUSION_BUFFER"
MEMCPY_OUT = "MEMCPY_OUT_FUSION_BUFFER"
ALLREDUCE_ACTIVITY = "GLOO_ALLREDUCE"
NEGOTIATE = "NEGOTIATE_ALLREDUCE"
TOP_ALLREDUCE = "ALLREDUCE"
NEGOTIATION_SUFFIX = "-negotiate"   # the negotiation collective of group hvd<k>: hvd<k>-negotiate
NEGOTIATION_BYTES = 8               # what it moves per rank (a few bits per cached tensor)


@dataclass
class TensorRecord:
    """One top-level range of one tensor in a Horovod timeline (Unix microseconds)."""

    tensor: str
    kind: str                                   # NEGOTIATE_ALLREDUCE, ALLREDUCE, BROADCAST, ...
    start: float
    end: float
    activities: dict[str, tuple[float, float]] = field(default_factory=dict)
    order: dict[str, tuple[int, int]] = field(default_factory=dict)     # activity -> (B, E) file positions
    ready_ranks: list[tuple[int, float]] = field(default_factory=list)   # negotiation: (rank, time)
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Response:
    """Tensors Horovod allreduced as one fusion buffer (one response of its background loop)."""

    tensors: tuple[str, ...]
    start: float                                # MEMCPY_IN start (or the allreduce's, unfused)
    memcpy_in: tuple[float, float] | None
    allreduce: tuple[float, float]
    memcpy_out: tuple[float, float] | None
    end: float
    negotiated: float | None = None             # the last tensor's NEGOTIATE end, when recorded


def load_timeline(path: str | Path) -> list[TensorRecord]:
    """The top-level ranges of a Horovod timeline file, in the order they began.

    Raises
    ------
    TraceFormatError
        The file is missing, not JSON, not a Horovod timeline (no
        ``start_time_since_epoch_in_micros``), or its ranges do not nest.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(f"cannot read the Horovod timeline ({exc.strerror})", path=path,
                               hint="profile with the patched Horovod (patches/horovod) under `dpro profile`") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceFormatError(f"not JSON ({exc.msg} at line {exc.lineno})", path=path,
                               hint="the job was killed while writing it; profile again") from None
    if not isinstance(doc, list):
        doc = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(doc, list):
        raise TraceFormatError("not a Horovod timeline (expected a JSON list of events)", path=path)
    base = None
    names: dict[int, str] = {}
    for i, e in enumerate(doc):
        if not isinstance(e, dict):
            raise TraceFormatError("event is not an object", path=path, record=f"[{i}]")
        if e.get("ph") == "M" and isinstance(e.get("args"), dict):
            a = e["args"]
            if "start_time_since_epoch_in_micros" in a:
                base = float(a["start_time_since_epoch_in_micros"])
            elif e.get("name") == "process_name" and "name" in a:
                names[int(e.get("pid", -1))] = str(a["name"])
    if base is None:
        raise TraceFormatError("no start_time_since_epoch_in_micros metadata: not a Horovod (>= 0.23) timeline",
                               path=path, hint="pass the file HOROVOD_TIMELINE wrote")
    open_: dict[int, list[TensorRecord | tuple[str, float]]] = defaultdict(list)
    out: list[TensorRecord] = []
    for i, e in enumerate(doc):
        ph = e.get("ph")
        if ph not in ("B", "E", "X"):
            continue
        try:
            pid, ts = int(e["pid"]), base + float(e["ts"])
        except (KeyError, TypeError, ValueError):
            raise TraceFormatError("event without a numeric pid/ts", path=path, record=f"[{i}]") from None
        stack = open_[pid]
        tensor = names.get(pid, f"pid{pid}")
        if ph == "B":
            if not stack:
                stack.append(TensorRecord(tensor=tensor, kind=str(e.get("name", "")), start=ts, end=ts))
            else:
                stack.append((str(e.get("name", "")), ts, i))
        elif ph == "E":
            if not stack:
                raise TraceFormatError(f"range end without a start for tensor {tensor!r}", path=path, record=f"[{i}]")
            top = stack.pop()
            if isinstance(top, tuple):
                rec = next(x for x in stack if isinstance(x, TensorRecord))
                rec.activities[top[0]] = (top[1], ts)
                rec.order[top[0]] = (top[2], i)
            else:
                top.end = ts
                top.args = dict(e.get("args") or {})
                out.append(top)
        elif ph == "X" and stack and isinstance(stack[0], TensorRecord) and str(e.get("name", "")).isdigit():
            stack[0].ready_ranks.append((int(e["name"]), ts))
    out.sort(key=lambda r: r.start)
    return out


def responses(records: list[TensorRecord]) -> list[Response]:
    """The allreduce responses of a timeline: tensors whose gloo allreduce ran as one, by start.

    Horovod writes a fused response's activity ranges for all its tensors at once (every
    tensor's begin, then every tensor's end), so tensors whose ``GLOO_ALLREDUCE`` began in the
    file before the first of them ended are one fusion buffer.  (Timestamps cannot tell: they
    are whole microseconds, taken per tensor.)
    """
    negotiated: dict[str, list[float]] = defaultdict(list)
    ars = []
    for r in records:
        if r.kind == NEGOTIATE:
            negotiated[r.tensor].append(r.end)
        elif r.kind == TOP_ALLREDUCE and ALLREDUCE_ACTIVITY in r.order:
            ars.append(r)
    ars.sort(key=lambda r: r.order[ALLREDUCE_ACTIVITY][0])
    groups: list[list[TensorRecord]] = []
    for r in ars:
        if groups and r.order[ALLREDUCE_ACTIVITY][0] < groups[-1][0].order[ALLREDUCE_ACTIVITY][1]:
            groups[-1].append(r)
        else:
            groups.append([r])

    def span(recs: list[TensorRecord], name: str) -> tuple[float, float] | None:
        got = [r.activities[name] for r in recs if name in r.activities]
        return (min(a for a, _ in got), max(b for _, b in got)) if got else None

    out = []
    for recs in groups:
        ar = span(recs, ALLREDUCE_ACTIVITY)
        mi = span(recs, MEMCPY_IN)
        start = min(r.start for r in recs)
        neg = [max((t for t in negotiated[r.tensor] if t <= r.start), default=None) for r in recs]
        neg = [t for t in neg if t is not None]
        out.append(Response(tensors=tuple(r.tensor for r in recs), start=mi[0] if mi else ar[0], memcpy_in=mi,
                            allreduce=ar, memcpy_out=span(recs, MEMCPY_OUT), end=max(r.end for r in recs),
                            negotiated=max(neg) if neg else None))
    out.sort(key=lambda r: r.start)
    return out


def _unprofiled_spans(meta: dict[str, Any]) -> list[tuple[float, float]]:
    """Wall-clock spans (us) of a rank's unprofiled iterations from its ``meta.json``, the first two
    (start-up) left out."""
    return [(float(s["end_time_ns"]) / 1e3 - float(s["dur_us"]), float(s["end_time_ns"]) / 1e3)
            for s in meta.get("steps") or [] if not s.get("profiled") and int(s.get("step", 0)) >= 2]


def _unprofiled_grouping(meta: dict[str, Any], resp: list[Response], everything: set[str]
                         ) -> list[tuple[str, ...]] | None:
    """The fusion groups of most unprofiled iterations that allreduced every tensor of ``everything``
    (None when no such iteration is in the timeline)."""
    sigs: dict[tuple[float, float], list[tuple[str, ...]]] = defaultdict(list)
    spans = _unprofiled_spans(meta)
    for r in resp:
        sp = next((sp for sp in spans if sp[0] <= r.start <= sp[1]), None)
        if sp is not None:
            sigs[sp].append(r.tensors)
    unprof = Counter(tuple(v) for v in sigs.values() if set(t for g in v for t in g) == everything)
    return list(unprof.most_common(1)[0][0]) if unprof else None


def _job_grouping(meta: dict[str, Any], resp: list[Response], per_it: dict[int, list[Response]],
                  coordinator: tuple[dict[str, Any], list[Response]] | None = None) -> list[tuple[str, ...]]:
    """The job's fusion groups.

    Horovod fuses what is ready in the same cycle, so the profiler - which slows the
    iterations it records - can change the groups.  The timeline covers the whole run, and
    ``meta.json`` has every iteration's wall-clock end and duration: the groups are those of
    most *unprofiled* iterations (the first two, start-up, left out), else of most profiled ones.

    The responses are the coordinator's (rank 0 decides what every rank runs), so every rank's
    timeline holds the same ones, but which iteration a response falls in is each rank's own
    clock: ranks that counted their own iterations chose different groups on a loaded machine
    and the job was refused ("node ... says allreduce of X bytes, another node says ...").  With
    ``coordinator`` (its ``meta.json`` and timeline responses) every rank takes the
    coordinator's unprofiled grouping; a rank's own profiled window decides only when the
    coordinator has no unprofiled iteration with every tensor.
    """
    everything = set(t for rs in per_it.values() for r in rs for t in r.tensors)
    groups = _unprofiled_grouping(*(coordinator or (meta, resp)), everything)
    if groups is None:
        groups = list(Counter(tuple(r.tensors for r in rs) for rs in per_it.values()).most_common(1)[0][0])
    return groups


def _coordinator_node(manifest: Manifest) -> str:
    """Horovod's coordinator: the lowest-rank worker."""
    return min(manifest.workers(), key=lambda n: (manifest.nodes[n].rank is None, manifest.nodes[n].rank or 0, n))


def _coordinator(manifest: Manifest, node: str, node_dir: Path) -> tuple[dict[str, Any], list[Response]]:
    """The coordinator's ``meta.json`` and timeline responses; ``node_dir`` is ``node``'s folder, so
    the job's folder is found from it."""
    coord = _coordinator_node(manifest)
    root = Path(node_dir)
    for _ in Path(manifest.node_dir(node)).parts:
        root = root.parent
    cdir = root / manifest.node_dir(coord)
    cmeta = TK._load_meta(cdir)
    hv = cmeta.get("horovod") if isinstance(cmeta.get("horovod"), dict) else {}
    tl = TK._file_of(cdir, {"timeline_file": hv.get("timeline_file") or TIMELINE_FILE}, "timeline_file",
                     "horovod.timeline_file", "the file was damaged; profile again")
    return cmeta, responses(load_timeline(tl))


def unprofiled_comm_events(ts: Any) -> pd.DataFrame | None:
    """COMM events of the allreduces Horovod ran *outside* the profiled window, for the comm model.

    The profiler slows a rank inside its window, and Horovod's gloo allreduce runs on the
    rank's CPU (the background thread; the training thread spins in ``synchronize`` beside
    it), so the allreduces inside the window take longer than the job's (measured: mlp at
    200 Mbit/s, 1 CPU per host: 292-298 ms inside the window, 109-182 ms around it).  The
    timeline covers the whole run: every response of the unprofiled iterations (the first
    two, start-up, left out; any fusion grouping, so several buffer sizes) becomes one event
    (``tensor`` = its tensors, ``iteration`` = the step, ``bytes``, ``dur``).
    :func:`dpro_kit.costmodel.fit_from_trace` fits the link model to these instead of the
    window's (the alignment still uses the window's own events).

    Parameters
    ----------
    ts : TraceSet
        A trace of this format (``ts.path`` must be its directory).

    Returns
    -------
    pandas.DataFrame or None
        Events with the columns the fit reads; None when the trace has fewer than 3 such
        responses (then the window's events are used).
    """
    if not ts.path:
        return None
    rows = []
    for node in ts.manifest.workers():
        ndir = Path(ts.path) / ts.manifest.node_dir(node)
        meta = TK._load_meta(ndir)
        pinfo = _bytes_of(meta)
        tl_path = ndir / str((meta.get("horovod") or {}).get("timeline_file") or TIMELINE_FILE)
        spans = [(int(s["step"]), float(s["end_time_ns"]) / 1e3 - float(s["dur_us"]), float(s["end_time_ns"]) / 1e3)
                 for s in meta.get("steps") or [] if not s.get("profiled") and int(s.get("step", 0)) >= 2]
        for r in responses(load_timeline(tl_path)):
            step = next((k for k, a, b in spans if a <= r.start <= b), None)
            if step is None or any(t not in pinfo for t in r.tensors):
                continue
            rows.append({"node": node, "host": ts.manifest.nodes[node].host, "iteration": step, "stream": "comm",
                         "kind": OpKind.COMM.value, "op": "hvd:" + "+".join(r.tensors), "name": ALLREDUCE_ACTIVITY,
                         "tensor": "hvd:" + "+".join(r.tensors), "bytes": sum(pinfo[t][1] for t in r.tensors),
                         "start": r.allreduce[0], "dur": r.allreduce[1] - r.allreduce[0]})
    if len(rows) < 3:
        return None
    return make_events(rows, path=str(ts.path))


def shared_core_responses(ts: Any) -> list[tuple[int, float]]:
    """Allreduces that ran entirely during the backward pass, outside the profiled window: ``(bytes, us)``.

    On a host whose training thread and Horovod's background thread share a core, an allreduce
    that runs while the backward pass computes waits for the core at every ring step (measured,
    cnn at 100 Mbit/s, one core per host: a 5 KB response alone took 1-24 ms, the comm model
    says 0.5 ms; the 0.5 MB ones that end after the backward are on the model).  Which ran
    entirely during the backward is exact from the timeline alone: a response followed in its
    iteration by at least two more started before the last of them, whose gradients were not
    ready at the tick of the one between (else Horovod had taken them), so it ended before the
    backward pass did.  Unprofiled iterations (the first two, start-up, left out), every rank.
    :func:`dpro_kit.whatif.horovod_knobs` fits the per-step wait to them.

    Parameters
    ----------
    ts : TraceSet
        A trace of this format (``ts.path`` must be its directory).
    """
    out: list[tuple[int, float]] = []
    if not ts.path:
        return out
    for node in ts.manifest.workers():
        ndir = Path(ts.path) / ts.manifest.node_dir(node)
        meta = TK._load_meta(ndir)
        pinfo = _bytes_of(meta)
        tl_path = ndir / str((meta.get("horovod") or {}).get("timeline_file") or TIMELINE_FILE)
        spans = [(float(s["end_time_ns"]) / 1e3 - float(s["dur_us"]), float(s["end_time_ns"]) / 1e3)
                 for s in meta.get("steps") or [] if not s.get("profiled") and int(s.get("step", 0)) >= 2]
        resp = responses(load_timeline(tl_path))
        for a, b in spans:
            rs = [r for r in resp if a <= r.start <= b]
            for r in rs[:-2]:
                if all(t in pinfo for t in r.tensors):
                    out.append((sum(pinfo[t][1] for t in r.tensors), r.allreduce[1] - r.allreduce[0]))
    return out


def iteration_spread_us(ts: Any) -> float:
    """How much a rank's unprofiled iterations vary (us): 1.4826 x their median absolute deviation.

    From every worker's ``meta.json`` steps (the first two, start-up, and the profiled ones left
    out; the median over the workers).  :func:`dpro_kit.whatif.horovod_knobs` averages where the
    next iteration's first gradient falls between Horovod's ticks over it.  0 when unknown.

    Parameters
    ----------
    ts : TraceSet
        A trace of this format (``ts.path`` must be its directory).
    """
    if not ts.path:
        return 0.0
    per_node = []
    for node in ts.manifest.workers():
        meta = TK._load_meta(Path(ts.path) / ts.manifest.node_dir(node))
        durs = sorted(float(s["dur_us"]) for s in meta.get("steps") or []
                      if not s.get("profiled") and int(s.get("step", 0)) >= 2)
        if len(durs) >= 3:
            med = statistics.median(durs)
            per_node.append(1.4826 * statistics.median(abs(d - med) for d in durs))
    return float(statistics.median(per_node)) if per_node else 0.0


def _bytes_of(meta: dict[str, Any]) -> dict[str, tuple[int, int, str]]:
    """Horovod tensor name -> (parameter index, bytes, parameter name) from ``meta.json["horovod"]``."""
    hv = meta.get("horovod") or {}
    return {str(p["tensor"]): (int(p["index"]), int(p["bytes"]), str(p["name"])) for p in hv.get("params") or []}


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One Horovod rank: its Kineto trace (computation) and its Horovod timeline (module docstring)."""
    node_dir = Path(node_dir)
    meta = TK._load_meta(node_dir)
    hv = meta.get("horovod")
    if not isinstance(hv, dict) or not hv.get("params"):
        raise TraceFormatError("meta.json has no horovod section (parameters of hvd.DistributedOptimizer)",
                               path=node_dir / "meta.json",
                               hint="profile the job with `dpro profile` and Horovod's DistributedOptimizer")
    tpath = TK._file_of(node_dir, meta, "trace_file", "trace_file", "the file was damaged; profile again")
    kt, doc = K.read_file(tpath)     # streamed, as torch_kineto.read_node
    facts = manifest.facts
    extra: dict[str, Any] = {}
    nt = TK.parse_node(meta, doc, path=tpath, fold_gaps=facts.host_gaps != "keep",
                       overhead=facts.profiler_overhead, extra=extra, kt=kt)
    tl_path = TK._file_of(node_dir, {"timeline_file": hv.get("timeline_file") or TIMELINE_FILE}, "timeline_file",
                          "horovod.timeline_file", "the file was damaged; profile again")
    resp = responses(load_timeline(tl_path))
    pinfo = _bytes_of(meta)
    unknown = sorted({t for r in resp for t in r.tensors if t not in pinfo})
    if unknown:
        raise TraceFormatError(f"tensor {unknown[0]!r} of the timeline is not a parameter of the optimizer "
                               f"({len(unknown)} such)", path=tl_path,
                               hint="only hvd.DistributedOptimizer gradients are modelled; other allreduces "
                                    "(hvd.allreduce in the training loop) are not supported yet")
    spans = extra["iterations"]

    def iteration_of(t: float) -> int | None:
        return next((it for a, b, it in spans if a <= t <= b), None)

    per_it: dict[int, list[Response]] = defaultdict(list)
    for r in resp:
        it = iteration_of(r.start)
        if it is not None:
            per_it[it].append(r)
    if not per_it:
        raise TraceFormatError("no Horovod allreduce inside the profiled iterations", path=tl_path,
                               hint="the timeline and the Kineto trace are not of the same run, or the "
                                    "optimizer is not hvd.DistributedOptimizer")
    coordinator = None if node == _coordinator_node(manifest) else _coordinator(manifest, node, node_dir)
    groups = _job_grouping(meta, resp, per_it, coordinator)

    ready: dict[int, list[tuple[int, str, float]]] = extra["grad_ready"]   # param index -> (it, op, us)
    wait_op = extra["wait_op"]
    rows: list[dict[str, Any]] = []
    edges = list(nt.edges)
    collectives = []
    names = [f"hvd{k}" for k in range(len(groups))]
    # fusion-buffer copy time per byte on this rank (responses of several tensors; one tensor is not copied)
    fused = [r for rs in per_it.values() for r in rs if len(r.tensors) > 1 and r.memcpy_in and r.memcpy_out]
    nb = sum(sum(pinfo[t][1] for t in r.tensors) for r in fused)
    per_byte_in = sum(r.memcpy_in[1] - r.memcpy_in[0] for r in fused) / nb if nb else 0.0
    per_byte_out = sum(r.memcpy_out[1] - r.memcpy_out[0] for r in fused) / nb if nb else 0.0
    first_of = {g[0]: k for k, g in enumerate(groups)}
    for k, (g, tensors) in enumerate(zip(names, groups)):
        idx = [pinfo[t][0] for t in tensors]
        nbytes = sum(pinfo[t][1] for t in tensors)
        neg, mci, mco = f"hvd:negotiate:{g}", f"hvd:memcpy_in:{g}", f"hvd:memcpy_out:{g}"
        last_ready_op, resid = [], []
        for it in sorted(per_it):
            rs = [x for i in idx for x in ready.get(i, []) if x[0] == it]
            if rs:
                last_ready_op.append(max(rs, key=lambda x: x[2])[1])
            # the wait after every rank is ready: from the later of (last gradient ready, previous group
            # done) to the copy of the response that starts with this group's first tensor
            r = next((r for r in per_it[it] if r.tensors[0] == tensors[0]), None)
            if r is None:
                resid.append(0.0)       # the group starts inside a response: same cycle, no wait
                continue
            prev = next((x for x in per_it[it] if k and groups[k - 1][-1] in x.tensors), None)
            t0 = max([t for t in (max((x[2] for x in rs), default=None), prev.end if prev else None)
                      if t is not None], default=r.start)
            resid.append(max(0.0, r.start - t0))
        # the smallest over the profiled iterations - in some the rank was itself the last to be ready; the
        # wait for the others is the negotiation collective's (below), not this op's
        wait = min(resid) if resid else 0.0
        for it in sorted(per_it):
            common = {"iteration": it, "stream": STREAM, "kind": OpKind.OTHER.value, "tensor": g, "bytes": nbytes}
            same = next((r for r in per_it[it] if r.tensors == tensors), None)
            if same is not None:    # Horovod ran exactly this group in this iteration: its own times
                mi = same.memcpy_in or (same.allreduce[0], same.allreduce[0])
                mo = same.memcpy_out or (same.allreduce[1], same.allreduce[1])
                rows.append({**common, "op": f"allreduce:{g}", "name": ALLREDUCE_ACTIVITY,
                             "kind": OpKind.COMM.value, "stream": "comm", "start": same.allreduce[0],
                             "dur": same.allreduce[1] - same.allreduce[0]})
            else:                   # fused differently here: copies at this rank's time per byte
                at = min((r.start for r in per_it[it] if set(r.tensors) & set(tensors)), default=spans[0][0])
                d_in, d_out = (per_byte_in * nbytes, per_byte_out * nbytes) if len(tensors) > 1 else (0.0, 0.0)
                mi, mo = (at, at + d_in), (at + d_in, at + d_in + d_out)
            rows.append({**common, "op": neg, "name": "HOROVOD_NEGOTIATE", "start": mi[0] - wait, "dur": wait})
            rows.append({**common, "op": mci, "name": MEMCPY_IN, "start": mi[0], "dur": mi[1] - mi[0]})
            rows.append({**common, "op": mco, "name": MEMCPY_OUT, "start": mo[0], "dur": mo[1] - mo[0]})
        src = Counter(last_ready_op).most_common(1)[0][0] if last_ready_op else None
        # negotiation: every rank waits until all have the group ready - a tiny collective among the
        # ranks (Horovod's cached negotiation is a bit-vector allreduce) from the last gradient to the
        # negotiate op
        collectives.append({"tensor": f"{g}{NEGOTIATION_SUFFIX}", "op": "allreduce", "algorithm": "ring",
                            "bytes": NEGOTIATION_BYTES, "params": [], "inputs": [src] if src else [],
                            "outputs": [neg]})
        edges.append((neg, mci))
        if wait_op:
            edges.append((mco, wait_op))
        if k:
            edges.append((f"hvd:memcpy_out:{names[k - 1]}", neg))
        param_ready = [TK._mode([op for it2, op, _t in ready.get(i, [])]) for i in idx]
        collectives.append({"tensor": g, "op": "allreduce", "algorithm": "ring", "bytes": int(nbytes),
                            "params": [pinfo[t][2] for t in tensors], "inputs": [mci], "outputs": [mco],
                            "param_bytes": [pinfo[t][1] for t in tensors],
                            **({"param_ready": param_ready} if all(param_ready) else {})})
    # responses fused otherwise than the job's groups (profiled iterations) still time the network: COMM
    # events for the comm model, one op id per response position in the iteration
    for it, rs in per_it.items():
        for j, r in enumerate(rs):
            if r.tensors not in groups:
                rows.append({"iteration": it, "stream": "comm", "kind": OpKind.COMM.value,
                             "tensor": "hvd:" + "+".join(r.tensors), "bytes": sum(pinfo[t][1] for t in r.tensors),
                             "op": f"allreduce:response{j}", "name": ALLREDUCE_ACTIVITY,
                             "start": r.allreduce[0], "dur": r.allreduce[1] - r.allreduce[0]})
    hvd_events = make_events(rows, path=str(tl_path))
    events = pd.concat([nt.events, hvd_events], ignore_index=True)
    return NodeTrace(events=events, edges=edges, collectives=collectives, memory=nt.memory, warnings=nt.warnings)


def finish(ts: Any) -> Any:
    """The job's negotiation wait: per fusion group, the smallest of the ranks' ``hvd:negotiate`` waits.

    :func:`read_node` measures a rank's wait from the later of (its own last gradient, the
    previous group) to the fusion-buffer copy, the smallest over the profiled iterations.  A
    rank that was never the last one ready still holds the others' lateness in it (their
    backward passes ran slower), which the negotiation collective already models; the rank
    that was last ready measured the wait proper.  So every rank gets the smallest over the
    ranks (registered as this format's finisher: :func:`dpro_kit.trace.load_trace`).

    Parameters
    ----------
    ts : TraceSet
        A trace of this format, every node read.
    """
    ev = ts.events
    neg = ev["op"].astype(str).str.startswith(f"{STREAM}:negotiate:")
    if not neg.any():
        return ts
    ev = ev.copy()
    smallest = ev[neg].groupby(["op", "iteration"], observed=True)["dur"].transform("min")
    shift = ev.loc[neg, "dur"] - smallest
    ev.loc[neg, "start"] = ev.loc[neg, "start"] + shift     # the op still ends at the copy's start
    ev.loc[neg, "dur"] = smallest
    from dataclasses import replace
    return replace(ts, events=ev)


#: what a Horovod timeline alone cannot tell (printed by :func:`summarize`)
BARE_LIMITS = ("without the ranks' compute traces (`dpro profile`) a timeline cannot tell when each gradient "
               "was produced, which ops wait for the reduced tensors, or how long an iteration is: "
               "no replay, no critical path, no what-if; stock Horovod writes rank 0's timeline only "
               "(patches/horovod writes every rank's)")


def summarize(path: str | Path) -> dict[str, Any]:
    """What one bare Horovod timeline says: fusion groups, per-tensor negotiation, copy and allreduce times.

    Parameters
    ----------
    path : str or Path
        A file ``HOROVOD_TIMELINE`` wrote (stock Horovod: rank 0's; patched: any rank's).

    Returns
    -------
    dict
        ``responses`` (allreduce responses), ``groups`` (distinct fusion groups and how often
        each ran), ``median_us`` (negotiation, memcpy in/out, allreduce per response),
        ``last_ready_rank`` (how often each rank was the last to be ready in a negotiation:
        the straggler, when the file holds negotiations), ``limits`` (what it cannot tell).
    """
    import statistics
    recs = load_timeline(path)
    resp = responses(recs)
    if not resp:
        raise TraceFormatError("no allreduce in the Horovod timeline", path=path,
                               hint="record a training run with hvd.DistributedOptimizer")

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 1) if xs else None

    last = Counter(max(r.ready_ranks, key=lambda x: x[1])[0] for r in recs
                   if r.kind == NEGOTIATE and len(r.ready_ranks) > 1)
    return {"file": str(path), "responses": len(resp),
            "groups": [{"tensors": list(g), "count": n} for g, n in Counter(r.tensors for r in resp).most_common()],
            "median_us": {"negotiate": med([r.end - r.start for r in recs if r.kind == NEGOTIATE]),
                          "memcpy_in": med([r.memcpy_in[1] - r.memcpy_in[0] for r in resp if r.memcpy_in]),
                          "allreduce": med([r.allreduce[1] - r.allreduce[0] for r in resp]),
                          "memcpy_out": med([r.memcpy_out[1] - r.memcpy_out[0] for r in resp if r.memcpy_out])},
            "last_ready_rank": {str(k): v for k, v in sorted(last.items())},
            "limits": BARE_LIMITS}

