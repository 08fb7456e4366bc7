"""The baseline replayer: what one writes first — a Kahn-style list scheduler over the nx.DiGraph.

Same semantics as :mod:`dpro_kit.replay._kernel`, written independently (plain
Python over networkx's own structures, no arrays, and organised by time
instant rather than by one event heap), so it doubles as a check of the kernel:

* ops are numbered in ``nx.topological_sort`` order (as ``compile_graph``);
  op ``i`` of iteration ``it`` is number ``it * n + i`` (as ``unroll``);
  devices are numbered in order of first appearance in that order;
* an op is *released* when its last predecessor (DFG edges, plus
  ``graph["iteration_edges"]`` between consecutive iterations) has started; its
  ready time is the latest end of its predecessors (0 for a source);
* an op whose ``device`` is ``""`` takes no device: it runs at its ready time;
* every other op waits in its device's queue, ordered by ``(priority, ready
  time, number)`` (per-device FIFO by ready time, ties by topological number);
  a device is free once its last op has ended;
* at each time instant *t*, in this order:

  1. release every op whose ready time is *t* (device-less ops run at once);
  2. while some free device's best queued op takes zero time, the
     lowest-numbered such device starts it, and step 1 runs again for what it
     released (zero-time ops — RECVs without a measured time, ... — cascade
     before anything that takes time is decided at *t*);
  3. every free device with a non-empty queue starts its best op.

Returns ``(start, end)`` dicts keyed by op key (``(key, iteration)`` when
``iterations > 1``).  Not optimised on purpose: it is the "naive" column of
``bench/replay_speed.py``.
"""
from __future__ import annotations

import heapq
import math

import networkx as nx


def naive_replay(g: nx.DiGraph, iterations: int = 1) -> tuple[dict, dict]:
    """Replay ``iterations`` iterations of ``g``; return ``(start, end)`` dicts."""
    order = list(nx.topological_sort(g))
    number = {k: i for i, k in enumerate(order)}
    n = len(order)
    devices: dict[str, int] = {}
    for k in order:
        d = g.nodes[k].get("device", "")
        if d and d not in devices:
            devices[d] = len(devices)
    next_iter: dict[str, list[str]] = {}
    for u, v in g.graph.get("iteration_edges", []):
        if u in g and v in g:
            next_iter.setdefault(u, []).append(v)
    n_prev_iter: dict[str, int] = {}
    for vs in next_iter.values():
        for v in vs:
            n_prev_iter[v] = n_prev_iter.get(v, 0) + 1

    def name(k, it):
        return k if iterations == 1 else (k, it)

    def split(op):
        return (op, 0) if iterations == 1 else op

    waiting = {}                 # op -> predecessors that have not started yet
    ready = {}                   # op -> latest end of its predecessors so far
    releases = []                # heap of (ready time, number, op): all predecessors started
    for it in range(iterations):
        for k in order:
            op = name(k, it)
            waiting[op] = g.in_degree(k) + (n_prev_iter.get(k, 0) if it > 0 else 0)
            ready[op] = 0.0
            if waiting[op] == 0:
                heapq.heappush(releases, (0.0, it * n + number[k], op))
    queue = {d: [] for d in devices}        # device -> heap of (priority, ready, number, op)
    free_at = {d: 0.0 for d in devices}     # device -> end of its last op
    frees = []                              # heap of (time, device number, device): a device frees up
    dev_name = {i: d for d, i in devices.items()}
    start: dict = {}
    end: dict = {}

    def run(op, t):
        """Start ``op`` at ``t``; its successors learn its end time."""
        k, it = split(op)
        start[op] = t
        end[op] = t + g.nodes[k].get("dur", 0.0)
        succs = [(v, it) for v in g.successors(k)]
        if it + 1 < iterations:
            succs += [(v, it + 1) for v in next_iter.get(k, [])]
        for v, jt in succs:
            w = name(v, jt)
            ready[w] = max(ready[w], end[op])
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(releases, (ready[w], jt * n + number[v], w))

    def best(d):
        return queue[d][0][3] if queue[d] else None

    def dur_of(op):
        return g.nodes[split(op)[0]].get("dur", 0.0)

    while releases or frees:
        t = min(releases[0][0] if releases else math.inf, frees[0][0] if frees else math.inf)
        can_pick = set()                    # free devices that may start something at t
        while frees and frees[0][0] == t:
            can_pick.add(heapq.heappop(frees)[1])
        while True:
            # 1. releases at t
            while releases and releases[0][0] == t:
                r, num, op = heapq.heappop(releases)
                k, _ = split(op)
                d = g.nodes[k].get("device", "")
                if not d:
                    run(op, t)
                    continue
                heapq.heappush(queue[d], (g.nodes[k].get("priority", 0.0), r, num, op))
                if free_at[d] <= t:
                    can_pick.add(devices[d])
            # 2. one zero-time op on the lowest-numbered free device whose best op takes zero time
            zero = [i for i in sorted(can_pick) if best(dev_name[i]) is not None and dur_of(best(dev_name[i])) == 0.0]
            if not zero:
                break
            d = dev_name[zero[0]]
            run(heapq.heappop(queue[d])[3], t)
            free_at[d] = t
        # 3. free devices start their best (time-taking) op
        for i in sorted(can_pick):
            d = dev_name[i]
            if queue[d]:
                op = heapq.heappop(queue[d])[3]
                run(op, t)
                free_at[d] = end[op]
                heapq.heappush(frees, (end[op], i, d))
    if len(end) < n * iterations:
        raise ValueError(f"only {len(end)} of {n * iterations} ops ran: the iteration edges form a cycle")
    return start, end


def naive_iteration_time(g: nx.DiGraph, iterations: int = 1) -> float:
    """Makespan (1 iteration) or the gap between the last two iterations' ends, as ReplayResult does."""
    _, end = naive_replay(g, iterations)
    if iterations == 1:
        return max(end.values(), default=0.0)
    last = max((e for (k, it), e in end.items() if it == iterations - 1), default=0.0)
    prev = max((e for (k, it), e in end.items() if it == iterations - 2), default=0.0)
    return last - prev
