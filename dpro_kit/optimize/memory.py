"""Peak-memory model: a timeline of allocations and frees over one iteration, from the trace.

Why a timeline and not a sum: the peak is one moment of the iteration (in the
jobs measured, early in the backward pass or at the loss, when every saved
activation is still alive and the loss gradients appear), and what is alive
then depends on the program order: gradients appear one by one as the
backward produces them, activations are freed as it consumes them, the
previous iteration's output lives until the new one is assigned.  Summing
params + grads + activations over-counts, and a sum cannot say what gradient
accumulation or recomputation changes.  See docs/optimizer.md ("Cost models",
"Memory estimate vs real peak").

What comes from where (each estimate says so in ``sources``):

* **timeline** — ``dpro profile --memory`` records the allocator's running total
  after every allocation and free (``TraceSet.memory``), counted from the moment
  the profiling window opened.  Its increments, attributed to the op running at
  that time, are the iteration's allocation/free sequence: parameters and
  state allocated before the window are *not* in it, everything allocated each
  iteration (inputs, activations, gradients, temporaries) is.  The first
  profiled iteration is skipped: tensors from before the window (the previous
  gradients and output) are freed in it without being counted.
* **gradients** — an allocation of exactly a parameter's size in the backward,
  before that parameter's gradient-ready op (``dpro::grad_ready`` markers, in
  ``Collective.param_ready``), is its gradient; its free of the same size
  outside the backward (``zero_grad(set_to_none=True)``) is matched the same
  way.  A parameter with no such allocation keeps its gradient across
  iterations (zeroed in place, or a DDP bucket view): it counts as persistent.
* **persistent** (not in the timeline): parameters (the synchronised tensors'
  bytes), DDP's flat bucket buffers (one per bucket unless
  ``gradient_as_bucket_view``; ``manifest.extra.ddp``), optimizer state
  (``manifest.extra.optimizer.state_bytes`` when the collector records it, else
  ``optimizer_slots`` x parameters — SGD+momentum 1, Adam 2, labelled assumed).
  Model buffers outside DDP's parameters (e.g. BatchNorm statistics) are not
  counted.

The estimate of the traced configuration replays the increments (peak = the
window-relative peak + persistent).  The memory passes transform them:

* **gradient accumulation** (m micro-batches of batch/m, DDP ``no_sync`` on the
  first m-1, inputs loaded once for the whole batch): every increment of the
  forward, loss and backward is scaled by 1/m (activations are proportional to
  the batch) and played m times; the inputs (allocated before the forward) and
  the optimizer step are not scaled; gradients are allocated in the first
  micro-batch and, in the later ones, exist twice between the allocation of the
  new gradient and its gradient-ready op (it is added in place, then freed).
* **recomputation** = ``torch.utils.checkpoint.checkpoint_sequential`` over the
  L parameterised layers in round(sqrt(L)) segments, the last segment not
  checkpointed (torch's rule).  A parameter's layer is what the trace says
  (``manifest.extra.layers``, :attr:`dpro_kit.schema.Facts.layers`: the collector
  reads it from the module tree — the child of the outermost ``nn.Sequential`` /
  ``nn.ModuleList`` on the parameter's path, the unit ``checkpoint_sequential``
  runs, else its top-level submodule; ``dpro_torch.recorder.layer_names``); for a
  trace without it (older recordings, other collectors, graph files) the explicit
  fallback :func:`layer_of` reads the name (up to the first numeric component:
  ``body.0``, ``conv1``, ``blocks.layers.1``), which gives the same layers for
  containers PyTorch numbers and one layer per named ``Sequential``.  A layer's saved
  activations R are what its backward frees (the backward ops between the
  previous layer's last gradient-ready op and its own).  A checkpointed
  segment frees sum R at the end of its forward and keeps only its input; in
  the backward it is re-run (the forward increments of its ops, found where the
  forward's cumulative allocation reaches its layers' sum R) right before its
  first backward op, after which the traced timeline continues.

Without allocator samples (a trace recorded without ``--memory``, or a graph
file) the model falls back to a sum: params + grads + optimizer state + a
user-given ``activation_bytes`` (recomputation keeps min(1, 2 sqrt(L)/L) of the
activations, accumulation divides them by m).  ``activation_bytes`` also
overrides the trace: peak = persistent + gradients + activation_bytes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .state import BaseJob, Strategy

#: the CUDA caching allocator reports block sizes (multiples of 512 bytes); the CPU allocator exact sizes
CUDA_BLOCK = 512


def layer_of(param: str, layers: dict[str, str] | None = None) -> str:
    """A parameter's layer: the one the trace recorded, else its name up to the first numeric
    component (``body.0``), else the name's first component.

    The recorded layer (``layers``: :attr:`dpro_kit.schema.Facts.layers`, written by the
    collector from the module tree) is the unit activation checkpointing takes.  The name
    rule is the fallback for traces without it: a numbered component is a child of an
    ``nn.Sequential`` / ``nn.ModuleList`` (PyTorch numbers their children), so it finds the
    same units unless a container names its children.

    Parameters
    ----------
    param : str
        Parameter name (``named_parameters``).
    layers : dict, optional
        Parameter name -> layer, as recorded in the trace.
    """
    if layers and param in layers:
        return layers[param]
    parts = param.split(".")
    for i, c in enumerate(parts[:-1]):
        if c.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


def checkpoint_segments(n_layers: int) -> list[list[int]]:
    """Layer indices per segment of ``checkpoint_sequential`` with round(sqrt(L)) segments (last one kept)."""
    k = max(1, round(math.sqrt(n_layers))) if n_layers else 1
    if k <= 1:
        return [list(range(n_layers))]
    size = n_layers // k
    segs = [list(range(s * size, (s + 1) * size)) for s in range(k - 1)]
    segs.append(list(range((k - 1) * size, n_layers)))
    return segs


@dataclass
class Step:
    """One allocator increment of an iteration (bytes; + allocation, - free)."""

    delta: int
    op: int                 # index of the op running when it happened
    phase: str              # pre | fw | loss | bw | post
    kind: str = "x"         # x (inputs, activations, temporaries) | grad | grad_free
    param: int = -1         # grad / grad_free: index into MemoryProfile.params


@dataclass
class IterationTimeline:
    """The allocator increments of one profiled iteration on one node, classified."""

    node: str
    iteration: int
    device: str
    start_level: int                    # window-relative total when the iteration begins
    grads_at_start: int                 # part of it that is gradients (freed in this iteration)
    steps: list[Step]
    op_names: list[str]
    op_phase: list[str]
    ready_op: dict[int, int] = field(default_factory=dict)   # param index -> op index (gradient ready)
    complete: bool = True               # False: first profiled iteration (pre-window frees not counted)
    op_ids: list[str] = field(default_factory=list)   # the trace's op ids (graph keys "<node>|<op id>")


@dataclass
class ParamInfo:
    name: str
    bytes: int
    layer: int                          # index into MemoryProfile.layers (forward order)


@dataclass
class MemoryProfile:
    """What a trace says about memory: per-iteration timelines and the persistent parts."""

    params: list[ParamInfo]
    layers: list[str]                   # forward order
    timelines: list[IterationTimeline]
    persistent: dict[str, int]          # params, comm_buffers, optimizer_state, grads
    sources: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def usable(self) -> list[IterationTimeline]:
        """Complete iterations (all of them if only incomplete ones were profiled)."""
        full = [t for t in self.timelines if t.complete]
        return full or list(self.timelines)


# --------------------------------------------------------------------------- building the profile

def _phases(kinds: list[str]) -> list[str]:
    fw = [i for i, k in enumerate(kinds) if k == "FW"]
    bw = [i for i, k in enumerate(kinds) if k == "BW"]
    if not fw or not bw:
        return ["pre"] * len(kinds)
    f0, b0, bl = fw[0], bw[0], bw[-1]
    out = []
    for i, k in enumerate(kinds):
        if i < f0:
            out.append("pre")
        elif i < b0:
            out.append("fw" if k == "FW" or i <= fw[-1] else "loss")
        elif i <= bl:
            out.append("bw")
        else:
            out.append("post")
    return out


def build_profile(ts: Any, *, optimizer_slots: float | None = None) -> MemoryProfile | None:
    """The memory profile of a TraceSet, or None when it has no allocator samples.

    ``ts``'s events and memory samples must share each node's clock (as loaded, or
    aligned with :func:`dpro_kit.align.apply_offsets`, which shifts both).
    ``optimizer_slots`` (parameter sizes of optimizer state per parameter) is
    used only when the trace does not record the optimizer's state size.
    """
    mem = getattr(ts, "memory", None)
    if mem is None or mem.empty:
        return None
    from ..job import JobFacts
    facts = JobFacts.from_manifest(ts.manifest)
    # parameters (per-parameter sizes and gradient-ready ops, from the DDP buckets)
    params: list[ParamInfo] = []
    ready_ids: dict[str, dict[int, str]] = {}
    bucket_bytes = 0
    from ..graph.schemes import is_allreduce
    for c in ts.collectives:
        if not is_allreduce(c) or not c.params:
            continue
        bucket_bytes += int(c.bytes)
        sizes = list(c.param_bytes) if len(c.param_bytes) == len(c.params) else []
        for j, name in enumerate(c.params):
            i = len(params)
            params.append(ParamInfo(name=name, bytes=int(sizes[j]) if sizes else 0, layer=-1))
            for node, ops in (c.param_ready or {}).items():
                if j < len(ops) and ops[j]:
                    ready_ids.setdefault(node, {})[i] = ops[j]
    if not params or any(p.bytes <= 0 for p in params):
        return None
    notes: list[str] = []
    timelines: list[IterationTimeline] = []
    ev = ts.events
    for node in ts.manifest.workers():
        m = mem[mem["node"] == node]
        if m.empty:
            continue
        devs = sorted(set(m["device"]))
        dev = next((d for d in devs if d.startswith("cuda")), devs[0])
        m = m[m["device"] == dev].sort_values("time", kind="stable")
        t_all = m["time"].to_numpy(dtype=float)
        b_all = m["bytes"].to_numpy(dtype=np.int64)
        it_all = m["iteration"].to_numpy()
        stream = ev["stream"].astype(str)
        e_node = ev[(ev["node"] == node) & (stream != "comm") & ~stream.str.startswith("gpu")]
        first_it = min(ts.manifest.iterations) if ts.manifest.iterations else None
        for it in sorted(set(int(x) for x in it_all)):
            sel = np.nonzero(it_all == it)[0]
            if sel.size == 0:
                continue
            e = e_node[e_node["iteration"] == it].sort_values("start", kind="stable")
            if e.empty:
                continue
            starts = e["start"].to_numpy(dtype=float)
            kinds = [str(k) for k in e["kind"]]
            names = [str(n) for n in e["name"]]
            op_ids = {str(o): i for i, o in enumerate(e["op"])}
            phase = _phases(kinds)
            prev = sel[0] - 1
            complete = prev >= 0 and it != first_it
            start_level = int(b_all[prev]) if prev >= 0 else int(b_all[sel[0]])
            level = start_level
            steps: list[Step] = []
            for k in sel:
                d = int(b_all[k]) - level
                level = int(b_all[k])
                if d == 0:
                    continue
                op = max(0, int(np.searchsorted(starts, t_all[k], side="right")) - 1)
                steps.append(Step(delta=d, op=op, phase=phase[op]))
            ready = {p: op_ids[o] for p, o in ready_ids.get(node, {}).items() if o in op_ids}
            tl = IterationTimeline(node=node, iteration=it, device=dev, start_level=start_level, grads_at_start=0,
                                   steps=steps, op_names=names, op_phase=phase, ready_op=ready, complete=complete,
                                   op_ids=[str(o) for o in e["op"]])
            _match_gradients(tl, params)
            timelines.append(tl)
    if not timelines:
        return None
    # layers in forward order: reverse of the order their gradients become ready
    first_ready: dict[str, int] = {}
    ref = timelines[-1]
    for i, p in enumerate(params):
        lay = layer_of(p.name, facts.layers)
        r = ref.ready_op.get(i)
        if r is not None:
            first_ready[lay] = min(first_ready.get(lay, r), r)
    layers = [lay for lay, _ in sorted(first_ready.items(), key=lambda kv: -kv[1])]
    for p in params:
        lay = layer_of(p.name, facts.layers)
        p.layer = layers.index(lay) if lay in layers else -1
    # persistent parts
    P = sum(p.bytes for p in params)
    ddp = facts.ddp
    as_view = bool(ddp.get("gradient_as_bucket_view"))
    persistent = {"params": P, "comm_buffers": 0, "optimizer_state": 0, "grads": 0}
    sources = {"params": "trace: bytes of the synchronised parameters (DDP buckets, meta.json)"}
    if ddp:
        persistent["comm_buffers"] = bucket_bytes
        sources["comm_buffers"] = ("trace: DDP flat bucket buffers, one per bucket "
                                   f"(gradient_as_bucket_view={str(as_view).lower()})")
    else:
        sources["comm_buffers"] = "not counted (no DDP information in the trace)"
    if facts.optimizer_state_bytes is not None:
        persistent["optimizer_state"] = facts.optimizer_state_bytes
        sources["optimizer_state"] = (f"trace: optimizer state recorded by the collector "
                                      f"({facts.optimizer_class or '?'})")
    else:
        slots = 1.0 if optimizer_slots is None else float(optimizer_slots)
        persistent["optimizer_state"] = int(slots * P)
        sources["optimizer_state"] = (f"assumed: {slots:g} x parameters (--optimizer-slots; the trace does not "
                                      "record the optimizer's state)")
    usable = [t for t in timelines if t.complete] or timelines
    matched = {s.param for t in usable for s in t.steps if s.kind == "grad"}
    if not matched and not as_view:   # allocated before the window and zeroed in place: always alive
        persistent["grads"] = P
        sources["grads"] = ("persistent: no gradient allocation seen in the backward (zero_grad without "
                            "set_to_none?)")
    elif as_view:
        sources["grads"] = "persistent: views into the DDP bucket buffers (gradient_as_bucket_view)"
    else:
        sources["grads"] = (f"trace: {len(matched)} of {len(params)} gradients identified in the backward "
                            "(allocation of the parameter's size before its gradient-ready op); the others, if any, "
                            "count with the activations")
    sources["activations"] = ("trace: allocator samples (dpro profile --memory): everything allocated per "
                              "iteration that is not a gradient (inputs, activations, temporaries)")
    if not any(t.complete for t in timelines):
        notes.append("only the first profiled iteration has samples: tensors from before the window (previous "
                     "gradients and output) are not counted; profile >= 2 iterations")
    if len(layers) < 2:
        notes.append("fewer than 2 layers found from parameter names: recomputation does not change the estimate")
    return MemoryProfile(params=params, layers=layers, timelines=timelines, persistent=persistent,
                         sources=sources, notes=notes)


def _match_gradients(tl: IterationTimeline, params: list[ParamInfo]) -> None:
    """Mark gradient allocations (backward, before the gradient-ready op) and their frees (outside it).

    A parameter's gradient is the latest backward allocation of exactly its size (on CUDA: its
    caching-allocator block size) at or before its gradient-ready op; its free, the first free of
    that size outside the backward.
    """
    allocs: dict[int, list[int]] = {}     # size -> step indices (ascending) of candidate allocations
    frees: dict[int, list[int]] = {}      # size -> step indices of candidate frees
    for j, s in enumerate(tl.steps):
        if s.kind != "x":
            continue
        if s.phase == "bw" and s.delta > 0:
            allocs.setdefault(s.delta, []).append(j)
        elif s.phase != "bw" and s.delta < 0:
            frees.setdefault(-s.delta, []).append(j)
    cuda = tl.device.startswith("cuda")
    for p, r in sorted(tl.ready_op.items(), key=lambda kv: kv[1]):
        g = params[p].bytes
        cand = allocs.get(-(-g // CUDA_BLOCK) * CUDA_BLOCK if cuda else g, [])
        for k in range(len(cand) - 1, -1, -1):
            if tl.steps[cand[k]].op <= r:
                j = cand.pop(k)
                tl.steps[j].kind, tl.steps[j].param = "grad", p
                break
    first_bw = next((j for j, s in enumerate(tl.steps) if s.phase == "bw"), len(tl.steps))
    for p in sorted({s.param for s in tl.steps if s.kind == "grad"}, key=lambda q: tl.ready_op.get(q, 0)):
        size = next(s for s in tl.steps if s.kind == "grad" and s.param == p).delta
        cand = frees.get(size, [])
        if cand:
            k = cand.pop(0)
            tl.steps[k].kind, tl.steps[k].param = "grad_free", p
            if k < first_bw:        # freed before this iteration's backward: the previous gradient
                tl.grads_at_start += size
    if not tl.complete:
        tl.grads_at_start = 0   # its frees of pre-window gradients were not counted


# --------------------------------------------------------------------------- simulation

@dataclass
class _Play:
    delta: float
    kind: str
    phase: str
    op: int
    param: int = -1


def _layer_R(tl: IterationTimeline, prof: MemoryProfile) -> tuple[dict[int, int], list[int | None]]:
    """Saved activations per layer (what its backward frees) and the backward layer of every op."""
    ready = sorted((r, prof.params[p].layer) for p, r in tl.ready_op.items() if prof.params[p].layer >= 0)
    op_layer: list[int | None] = [None] * len(tl.op_names)
    j = 0
    for op in range(len(tl.op_names)):
        while j < len(ready) and ready[j][0] < op:
            j += 1
        if tl.op_phase[op] == "bw" and j < len(ready):
            op_layer[op] = ready[j][1]
    R: dict[int, int] = {}
    for s in tl.steps:
        if s.kind == "x" and s.phase == "bw" and op_layer[s.op] is not None:
            R[op_layer[s.op]] = R.get(op_layer[s.op], 0) - s.delta
    return {k: max(0, v) for k, v in R.items()}, op_layer


def saved_activations(prof: MemoryProfile) -> dict[str, int]:
    """Saved activations per layer name (bytes its backward frees, :func:`_layer_R`): the median over the
    complete timelines (every timeline when none is complete).  ``dpro simulate`` reads it
    (:mod:`dpro_kit.simulate.model`)."""
    usable = [t for t in prof.timelines if t.complete] or prof.timelines
    per: dict[str, list[int]] = {}
    for tl in usable:
        R, _ = _layer_R(tl, prof)
        for i, name in enumerate(prof.layers):
            per.setdefault(name, []).append(int(R.get(i, 0)))
    return {k: int(statistics.median(v)) for k, v in per.items()}


def _recompute(tl: IterationTimeline, prof: MemoryProfile, play: list[_Play]) -> tuple[list[_Play], dict[str, Any]]:
    """Rewrite the increments for checkpoint_sequential over the layers (see the module docstring)."""
    segs = checkpoint_segments(len(prof.layers))
    info = {"layers": list(prof.layers), "segments": [[prof.layers[i] for i in s] for s in segs],
            "checkpointed": [[prof.layers[i] for i in s] for s in segs[:-1]]}
    if len(segs) < 2:
        return play, info
    R, op_layer = _layer_R(tl, prof)
    S = [sum(R.get(layer, 0) for layer in seg) for seg in segs]
    # forward boundaries: where the forward's cumulative allocation reaches the segments' backward frees
    fw_idx = [i for i, p in enumerate(play) if p.phase == "fw" and p.kind == "x"]
    cum, c = [], 0.0
    for i in fw_idx:
        c += play[i].delta
        cum.append(c)
    bounds: list[int] = []          # index into play of the last forward increment of each checkpointed segment
    out_bytes: list[int] = []       # size of each checkpointed segment's output
    target, lo = 0.0, 0
    for s in range(len(segs) - 1):
        target += S[s]
        if lo >= len(fw_idx):
            bounds.append(-1)
            out_bytes.append(0)
            continue
        best = min(range(lo, len(fw_idx)), key=lambda j: (abs(cum[j] - target), j))
        bounds.append(fw_idx[best])
        lo = best + 1
        # its output: the largest allocation of the last forward op that allocated (heuristic: the trace has
        # no tensor identities); it stays alive as the next segment's input
        allocs = [play[i] for i in fw_idx[: best + 1] if play[i].delta > 0]
        last_op = allocs[-1].op if allocs else -1
        out_bytes.append(int(max((q.delta for q in allocs if q.op == last_op), default=0)))
    # what a checkpointed segment does not keep: its layers' backward frees (S) minus the gradient of its
    # output that their backward also frees, plus the gradient of its input that it produces
    saved = {s: max(0, S[s] - out_bytes[s] + (out_bytes[s - 1] if s else 0)) for s in range(len(segs) - 1)}
    frees = {b: s for s, b in enumerate(bounds) if b >= 0}
    seg_fw: dict[int, list[_Play]] = {}
    start = 0
    for s, b in enumerate(bounds):
        seg_fw[s] = [play[i] for i in fw_idx if start <= i <= b] if b >= 0 else []
        start = b + 1 if b >= 0 else start
    # backward: re-run a checkpointed segment right before its first backward op
    first_bw: dict[int, int] = {}
    for i, p in enumerate(play):
        if p.phase == "bw" and op_layer[p.op] is not None:
            for s in range(len(segs) - 1):
                if op_layer[p.op] in segs[s] and s not in first_bw:
                    first_bw[s] = i
    at_bw = {i: s for s, i in first_bw.items()}
    out: list[_Play] = []
    for i, p in enumerate(play):
        if i in at_bw:
            s = at_bw[i]
            rec = [_Play(q.delta, "x", "bw", p.op) for q in seg_fw.get(s, [])]
            out += rec
            out.append(_Play(saved[s] - sum(q.delta for q in rec), "x", "bw", p.op))
        out.append(p)
        if i in frees:
            out.append(_Play(-saved[frees[i]], "x", "fw", p.op))
    info["dropped_bytes"] = [int(saved[s]) for s in range(len(segs) - 1)]
    return out, info


def simulate(tl: IterationTimeline, prof: MemoryProfile, *, accum_steps: int = 1,
             recompute: bool = False) -> dict[str, Any]:
    """Peak of one iteration's timeline (window-relative) under the memory choices, and what is alive then."""
    m = max(1, int(accum_steps))
    play = [_Play(float(s.delta), s.kind, s.phase, s.op, s.param) for s in tl.steps]
    info: dict[str, Any] = {}
    if recompute:
        play, info = _recompute(tl, prof, play)
    x0 = tl.start_level - tl.grads_at_start
    inputs = sum(p.delta for p in play if p.phase == "pre" and p.kind == "x" and p.delta > 0)
    carried = max(0.0, x0 - inputs)          # the previous (micro-)batch's output: scales with the batch
    g, x = float(tl.grads_at_start), x0 - carried * (1.0 - 1.0 / m)
    best = {"level": g + x, "grads": g, "x": x, "phase": "pre", "op": 0}

    def see(phase: str, op: int) -> None:
        if g + x > best["level"]:
            best.update(level=g + x, grads=g, x=x, phase=phase, op=op)

    body = [p for p in play if p.phase in ("fw", "loss", "bw")]
    pre = [p for p in play if p.phase == "pre"]
    post = [p for p in play if p.phase == "post"]
    def once(steps: list) -> None:   # steps played once per iteration (not per micro-batch)
        nonlocal g, x
        for p in steps:
            if p.kind == "x":
                x += p.delta
            else:
                g += p.delta
            see(p.phase, p.op)

    once(pre)
    for j in range(m):
        pending: list[tuple[int, float]] = []      # (ready op, bytes) of gradients to add in place
        for p in body:
            while pending and pending[0][0] < p.op:
                g -= pending.pop(0)[1]
            if p.kind == "x":
                x += p.delta / m
            elif p.kind == "grad":
                g += p.delta
                if j > 0:
                    pending.append((tl.ready_op.get(p.param, p.op), p.delta))
                    pending.sort()
            else:
                g += p.delta
            see(p.phase, p.op)
        g -= sum(b for _, b in pending)
    once(post)
    op = int(best["op"])
    return {"peak": int(round(best["level"])), "grads": int(round(best["grads"])), "other": int(round(best["x"])),
            "phase": best["phase"], "op": tl.op_names[op] if op < len(tl.op_names) else "", **info}


# --------------------------------------------------------------------------- the model

@dataclass
class MemoryModel:
    """Peak memory per worker for a strategy (ESTIMATED; checked against real peaks in docs/optimizer.md).

    ``profile`` (from :func:`build_profile`, the trace's allocator samples): the
    timeline model; without one, the sum model with ``activation_bytes``.
    ``activation_bytes`` > 0 overrides the trace's activations (sum model with the
    trace's persistent parts).  ``optimizer_slots``: optimizer state in parameter
    sizes, overriding the trace; None = the trace's recorded state, else 1.
    """

    activation_bytes: int = 0
    optimizer_slots: float | None = None
    layers: int = 0          # sum model: L for recomputation's sqrt(L); 0 = the trace's layers or tensors
    profile: MemoryProfile | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def estimate(self, base: BaseJob | None, strategy: Strategy) -> dict[str, Any]:
        """Estimated peak bytes per worker and its parts (``sources`` says where each came from).

        ``base`` gives the parameter bytes to the sum model (None: the profile's).
        """
        m = strategy.mem()
        recompute, accum = bool(m.get("recompute")), max(1, int(m.get("accum_steps", 1)))
        if self.profile is None or self.activation_bytes:
            return self._sum_model(base, recompute, accum)
        return self.peak(recompute=recompute, accum_steps=accum)

    def peak(self, *, recompute: bool = False, accum_steps: int = 1) -> dict[str, Any]:
        """The timeline model's estimate for these memory choices (needs ``profile``); memoised."""
        if self.profile is None:
            raise ValueError("no memory profile: the trace has no allocator samples (dpro profile --memory)")
        key = (bool(recompute), max(1, int(accum_steps)))
        if key not in self._cache:
            self._cache[key] = self._timeline_model(*key)
        return dict(self._cache[key])

    def _optimizer_state(self, params: int) -> tuple[int, str] | None:
        """(bytes, source) when the user gave ``optimizer_slots``."""
        if self.optimizer_slots is None:
            return None
        return int(float(self.optimizer_slots) * params), f"user: {self.optimizer_slots:g} x parameters " \
                                                           "(--optimizer-slots)"

    def _sum_model(self, base: BaseJob | None, recompute: bool, accum: int) -> dict[str, Any]:
        prof = self.profile
        if base is not None:
            params = sum(t.bytes for t in base.tensors.values())
        elif prof is not None:
            params = prof.persistent["params"]
        else:
            raise ValueError("the sum model needs the job (base) or a memory profile")
        act = float(self.activation_bytes)
        L = self.layers or (len(prof.layers) if prof else 0) or max(1, len(base.tensors))
        if recompute:
            act *= min(1.0, 2.0 * math.sqrt(L) / L)
        act /= accum
        opt = self._optimizer_state(params) or (params, "assumed: 1 x parameters (SGD with momentum)")
        parts = {"params": params, "grads": params, "optimizer_state": opt[0], "activations": int(act)}
        sources = {"params": "trace: bytes of the synchronised tensors", "grads": "assumed: = parameters",
                   "optimizer_state": opt[1],
                   "activations": ("user (--activation-bytes)" if self.activation_bytes else "unknown (0): the trace "
                                   "has no allocator samples (dpro profile --memory) and --activation-bytes is 0")
                   + (f"; recomputation keeps min(1, 2 sqrt(L)/L), L={L}" if recompute else "")
                   + (f"; / {accum} micro-batches" if accum > 1 else "")}
        if prof is not None:   # user activations on a traced job: the trace's persistent parts
            parts["comm_buffers"] = prof.persistent["comm_buffers"]
            sources["comm_buffers"] = prof.sources["comm_buffers"]
            if self.optimizer_slots is None:
                parts["optimizer_state"] = prof.persistent["optimizer_state"]
                sources["optimizer_state"] = prof.sources["optimizer_state"]
        return {"peak_bytes": int(sum(parts.values())), "parts": parts, "sources": sources, "estimated": True,
                "model": "sum", "accum_steps": accum, "recompute": recompute,
                "activation_source": sources["activations"]}

    def _timeline_model(self, recompute: bool, accum: int) -> dict[str, Any]:
        prof = self.profile
        assert prof is not None
        persistent, sources = dict(prof.persistent), dict(prof.sources)
        opt = self._optimizer_state(persistent["params"])
        if opt is not None:
            persistent["optimizer_state"], sources["optimizer_state"] = opt
        per_node: dict[str, list[tuple[IterationTimeline, dict[str, Any]]]] = {}
        for tl in prof.usable():
            per_node.setdefault(tl.node, []).append(
                (tl, simulate(tl, prof, accum_steps=accum, recompute=recompute)))
        # the job's peak is its largest worker's; per worker the median over the profiled iterations
        node, runs = max(per_node.items(), key=lambda kv: statistics.median(r["peak"] for _, r in kv[1]))
        med = statistics.median(r["peak"] for _, r in runs)
        tl, rep = min(runs, key=lambda tr: abs(tr[1]["peak"] - med))
        parts = {"params": persistent["params"], "comm_buffers": persistent["comm_buffers"],
                 "optimizer_state": persistent["optimizer_state"],
                 "grads": persistent["grads"] + rep["grads"], "activations": rep["other"]}
        out = {"peak_bytes": int(round(sum(persistent.values()) + med)), "parts": parts, "sources": sources,
               "estimated": True, "model": "timeline", "accum_steps": accum, "recompute": recompute,
               "activation_source": sources["activations"],
               "at": {"node": node, "iteration": tl.iteration, "phase": rep["phase"], "op": rep["op"]},
               "iterations": sorted({t.iteration for t, _ in runs}), "notes": list(prof.notes)}
        if recompute:
            out["checkpoint"] = {k: rep[k] for k in ("layers", "segments", "checkpointed", "dropped_bytes")
                                 if k in rep}
        return out


# --------------------------------------------------------------------------- memory over a replay

def graph_memory(g: Any, prof: MemoryProfile) -> int:
    """Put the trace's memory on the DFG's ops, for :func:`replay_memory` (returns the ops annotated).

    Per worker, the profiled iteration whose peak (:func:`simulate`) is the median stands for it
    (as in :meth:`MemoryModel.peak`).  Its allocator increments are grouped by the op running when
    they happened; in an op's own order their running sum rises to a maximum A (>= 0) and ends at
    net N, so the op gets ``mem_alloc = A`` (at its start) and ``mem_free = A - N`` (at its end):
    played in program order the levels, and so the peak, are :func:`simulate`'s.  An increment of
    an op that is not in the graph goes to the previous op of that worker that is (or to the base).
    ``g.graph["memory_base"][node]`` = the persistent parts (parameters, DDP buffers, optimizer
    state, persistent gradients) + the window-relative level when the iteration starts.
    """
    base_all = int(sum(prof.persistent.values()))
    by_node: dict[str, list[tuple[IterationTimeline, int]]] = {}
    for tl in prof.usable():
        by_node.setdefault(tl.node, []).append((tl, simulate(tl, prof)["peak"]))
    bases = dict(g.graph.get("memory_base") or {})
    n = 0
    for node, runs in by_node.items():
        med = statistics.median(p for _, p in runs)
        tl = min(runs, key=lambda r: abs(r[1] - med))[0]
        base = base_all + int(tl.start_level)
        per_op: dict[str, list[int]] = {}
        last_key = None
        for st in tl.steps:
            op = tl.op_ids[st.op] if st.op < len(tl.op_ids) else ""
            key = f"{node}|{op}"
            if key in g:
                last_key = key
            elif last_key is not None:
                key = last_key
            else:
                base += st.delta
                continue
            per_op.setdefault(key, []).append(st.delta)
        for key, deltas in per_op.items():
            run = np.cumsum(deltas)
            a = max(0, int(run.max()))
            g.nodes[key]["mem_alloc"] = a
            g.nodes[key]["mem_free"] = a - int(run[-1])
            n += 1
        bases[node] = base
    g.graph["memory_base"] = bases
    return n


@dataclass
class ReplayMemory:
    """Memory of every worker (node) over a replay: ``timeline[node] = (times_us, bytes)``, step
    points after each change; ``peak`` / ``peak_us`` / ``peak_op`` per node; ``limit`` and ``oom``
    (the nodes whose peak exceeds it) when a limit was given."""

    timeline: dict[str, tuple[np.ndarray, np.ndarray]]
    peak: dict[str, int]
    peak_us: dict[str, float]
    peak_op: dict[str, str]
    limit: int | None = None

    @property
    def oom(self) -> list[str]:
        return [n for n, p in self.peak.items() if self.limit is not None and p > self.limit]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_bytes": dict(self.peak), "peak_ms": {k: v / 1e3 for k, v in self.peak_us.items()},
                               "peak_op": dict(self.peak_op), "max_peak_bytes": max(self.peak.values(), default=0)}
        if self.limit is not None:
            out.update(limit_bytes=self.limit, oom=self.oom, verdict="OOM" if self.oom else "fits")
        return out


def replay_memory(res: Any, g: Any, limit: int | None = None) -> ReplayMemory:
    """Per-worker memory over a replay of ``g`` from its ops' ``mem_alloc`` / ``mem_free`` (bytes,
    :func:`graph_memory`, or set by a graph builder) and ``g.graph["memory_base"]``.

    An op's ``mem_alloc`` is taken when it starts and its ``mem_free`` given back when it ends, on the
    op's ``node``; at equal times frees come first.  The OOM verdict: a node whose peak exceeds
    ``limit`` (Proteus §VI-B "Memory Consumption": monitor each executor's footprint over the run).
    """
    keys = res.graph.keys
    n = res.n
    rows = np.arange(res.start.size)
    attrs = [g.nodes[k] for k in keys]
    alloc = np.array([float(a.get("mem_alloc", 0) or 0) for a in attrs])
    free = np.array([float(a.get("mem_free", 0) or 0) for a in attrs])
    nodes = np.array([str(a.get("node", "")) for a in attrs], dtype=object)
    base = {str(k): int(v) for k, v in (g.graph.get("memory_base") or {}).items()}
    names = sorted(set(base) | {x for x, a, f in zip(nodes, alloc, free) if x and (a or f)})
    out = ReplayMemory({}, {}, {}, {}, limit)
    idx = rows % n
    for node in names:
        sel = rows[(nodes[idx] == node) & ((alloc[idx] != 0) | (free[idx] != 0))]
        t = np.concatenate([res.start[sel], res.end[sel]])
        d = np.concatenate([alloc[sel % n], -free[sel % n]])
        who = np.concatenate([sel, sel])
        order = np.lexsort((d > 0, t))          # by time; at equal times frees (d <= 0) first
        level = base.get(node, 0) + np.cumsum(d[order])
        times = t[order]
        if level.size:
            j = int(np.argmax(level))
            pk, pt, po = int(round(level[j])), float(times[j]), keys[int(who[order][j]) % n]
        else:
            pk, pt, po = base.get(node, 0), 0.0, ""
        if base.get(node, 0) >= pk:
            pk, pt, po = base.get(node, 0), 0.0, ""
        out.timeline[node] = (np.concatenate([[0.0], times]), np.concatenate([[float(base.get(node, 0))], level]))
        out.peak[node], out.peak_us[node], out.peak_op[node] = pk, pt, po
    return out


def parse_size(text: str | int | None) -> int | None:
    """'16GB', '512MiB', '1e9' -> bytes."""
    if text is None or isinstance(text, int):
        return text
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "K": 2**10, "M": 2**20, "G": 2**30, "B": 1}
    for u, f in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * f)
    return int(float(s))


__all__ = ["CUDA_BLOCK", "build_profile", "graph_memory", "replay_memory", "ReplayMemory", "saved_activations", "checkpoint_segments", "IterationTimeline", "layer_of", "MemoryModel",
           "MemoryProfile", "ParamInfo", "parse_size", "simulate", "Step"]
