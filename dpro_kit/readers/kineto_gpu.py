"""What a Kineto trace says about the GPU's dependencies, for every reader of torch.profiler files.

dPRO models a GPU job as CPU threads that launch work onto GPU streams, each stream
running its ops in order, and CPU calls that block until the GPU caught up (dPRO §4.1;
``../shared/seeds/000_c1a77e7f0e0abdd5.txt``).  The launches are in the trace
(:mod:`dpro_kit.readers.kineto`: correlation ids); the rest is here, one definition for
both readers of Kineto files (the plain-folder reader :mod:`.kineto_plain` and the dpro
collector's :mod:`.torch_kineto`):

* :func:`sync_calls` - the synchronising runtime calls (:data:`SYNC_CALLS`) inside a CPU op;
* :func:`awaited` - the GPU op a synchronising call waited for: of the GPU ops launched
  before the call, the one that ended last before the call returned (within
  :data:`WAIT_TOLERANCE_US`), if it was still running when the call began (else the call
  did not wait);
* :func:`lane_waits` - waits between lanes inferred from the times: an op that started
  later than its lane (and its launch) allowed waited for the op of another lane that
  ended last before it (GPU streams: ``cudaStreamWaitEvent``; CPU threads: the training
  thread blocked in ``backward()`` while the autograd thread ran);
* :func:`piece` - the part of a split CPU op that was running at a time (a launch);
* :func:`fold_host_gaps` - one CPU thread's idle time that no wait explains, charged to
  the op after it (host time: Python between ops);
* :func:`acyclic` - the edge list without the cycles inferred waits can close on ties.

Ops are any objects with ``start``, ``dur`` (one time unit: the caller's), ``op`` (id)
and, for :func:`piece`, ``ev`` (the Kineto event they come from); ``tol`` is
:data:`WAIT_TOLERANCE_US` in that unit (pass ``WAIT_TOLERANCE_US * 1e3`` for ns).
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Iterable

from .gaps import fold_gaps
from .kineto import SYNC_CALLS, KEvent

__all__ = ["WAIT_TOLERANCE_US", "SYNC_CALLS", "sync_calls", "GpuEnds", "awaited", "lane_waits", "piece",
           "fold_host_gaps", "acyclic"]

#: a GPU op that starts within this of another op's end (and no earlier than its launch and
#: stream allowed) is taken to have waited for it; also the slack of synchronising calls
WAIT_TOLERANCE_US = 20.0


def sync_calls(e: KEvent) -> list[KEvent]:
    """The synchronising CUDA runtime calls (:data:`SYNC_CALLS`) in ``e``'s call tree, by start."""
    out, todo = [], [e]
    while todo:
        x = todo.pop()
        if x.cat == "cuda_runtime" and x.name in SYNC_CALLS:
            out.append(x)
        todo.extend(x.children)
    return sorted(out, key=lambda x: (x.start_ns, x.index))


class GpuEnds:
    """A node's GPU ops sorted by end, with the time each was launched (for :func:`awaited`)."""

    def __init__(self, ops: Iterable[Any], launch_of: Callable[[Any], float]) -> None:
        self.ops = sorted(ops, key=lambda o: o.start + o.dur)
        self.ends = [o.start + o.dur for o in self.ops]
        self.launch = [launch_of(o) for o in self.ops]


def awaited(gpu: GpuEnds, call_start: float, call_end: float, tol: float,
            accept: Callable[[Any], bool] | None = None) -> tuple[Any, float] | None:
    """The GPU op a synchronising call from ``call_start`` to ``call_end`` waited for, and the
    time the wait ended (its end, at most ``call_end``); None when nothing it could wait for
    was running when it began.

    Of the GPU ops launched at or before ``call_start`` (and ``accept``-ed), the one that
    ended last at or before ``call_end + tol``.
    """
    i = bisect.bisect_right(gpu.ends, call_end + tol) - 1
    while i >= 0:
        if gpu.launch[i] <= call_start and (accept is None or accept(gpu.ops[i])):
            break
        i -= 1
    if i < 0 or gpu.ends[i] <= call_start:
        return None
    return gpu.ops[i], min(call_end, gpu.ends[i])


def piece(src: Any, t: float, same_lane: list[Any]) -> Any:
    """The part of a (possibly split) CPU op ``src`` that was running at time ``t``: the latest
    op of ``same_lane`` from the same Kineto event that started at or before ``t``."""
    best = src
    for o in same_lane:
        if o.ev is src.ev and o.start <= t and o is not src and o.start >= best.start:
            best = o
    return best


def lane_waits(names: list[str], lanes: dict[str, list[Any]], launch_ts: dict[int, float],
               window: float | None, tol: float) -> list[tuple[str, str, float]]:
    """Waits between lanes (threads, or streams) inferred from the times: ``(op waited for, op, its end)``.

    An op that started more than ``tol`` after it could have (its lane's previous op
    ended, and for a GPU op its launch call started: ``launch_ts[id(op)]``) waited for
    something: the op of another lane of ``names`` that ended last before it started
    (within ``tol``) and after it could have started; with ``window``, only one that ended
    at most ``window`` before it (GPU: ``cudaStreamWaitEvent`` releases the stream at
    once; CPU: the training thread blocked in ``backward()`` while the autograd thread
    ran returns through Python first, so any end inside the gap counts).

    Parameters
    ----------
    names : list of str
        The lanes to relate (keys of ``lanes``).
    lanes : dict
        Lane -> its ops in start order.
    """
    ends = {s: [o.start + o.dur for o in lanes[s]] for s in names}
    out = []
    for s in names:
        prev_end = float("-inf")
        for o in lanes[s]:
            ready = max(prev_end, launch_ts.get(id(o), float("-inf")))
            prev_end = max(prev_end, o.start + o.dur)
            if o.start - ready <= tol:
                continue
            best, best_end = None, float("-inf")
            for s2 in names:
                if s2 == s:
                    continue
                i = bisect.bisect_right(ends[s2], o.start + tol) - 1
                if i >= 0 and ends[s2][i] > ready and ends[s2][i] > best_end:
                    best, best_end = lanes[s2][i], ends[s2][i]
            if best is not None and (window is None or best_end >= o.start - window):
                out.append((best.op, o.op, best_end))
    return out


def fold_host_gaps(seq: list[Any], waited: dict[str, float], start: float | None) -> None:
    """One CPU thread's idle time that no wait explains, charged to the op after it (host time;
    the rule: :func:`dpro_kit.readers.gaps.fold_gaps`).  Gaps are folded from ``start`` (the
    step's start; None: from the thread's first op); for an op that waited (``waited[op]``: when
    what it waited for ended) only the time after that end.  ``seq``: the thread's ops in start
    order, changed in place.
    """
    new = fold_gaps([o.start for o in seq], [o.start + o.dur for o in seq], start,
                    after=[waited.get(o.op) for o in seq])
    for o, s in zip(seq, new):
        o.dur += o.start - s
        o.start = s


def acyclic(edges: list[tuple[str, str]], inferred: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """``edges`` without cycles: waits inferred from times within the tolerance could close one
    (ties); such an inferred edge is dropped (any edge of the cycle if none is inferred)."""
    import networkx as nx
    g = nx.DiGraph(edges)
    if nx.is_directed_acyclic_graph(g):
        return edges
    while True:
        try:
            cyc = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            break
        drop = next(((u, v) for u, v, *_ in cyc if (u, v) in inferred), cyc[0][:2])
        g.remove_edge(*drop)
    return [e for e in edges if g.has_edge(*e)]
