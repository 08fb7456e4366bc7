"""The replayer's inner loop, compiled with numba (falls back to plain Python).

Discrete-event list scheduling over devices (dPRO §4.3): each device has a
queue and a clock; an op enters its device's queue when its last predecessor
finishes; a device that frees up (or an idle device that gets work) starts the
best op of its queue.  "Best" = lowest ``priority``, then earliest ready time,
then lowest index — with all priorities equal this is the FIFO order of the
frameworks' engines, and later scheduling work (TicTac, DeFT) only sets
priorities.

Events are processed in time order from one global heap, so the simulated
start times never go backwards, and every op that can be ready at time *t* is in
its device's queue before a device picks a positive-time op at *t*: releases at
*t* come before wake-ups at *t*, and a wake-up whose pick would take time is
deferred (flag 2) until the zero-time ops that run at *t* (e.g. RECVs with no
measured time) have released their successors.  Ops whose device is ``-1`` (virtual In/Out
markers, pure delays) take no device: they run as soon as they are ready.

For each op we also record which op determined its start (the predecessor that
finished last, or the op that ran before it on the same device).  Following
those links back from the op that ends last gives a critical path of the
execution graph in O(n).
"""
from __future__ import annotations

import heapq

import numpy as np

try:  # numba is a core dependency; the fallback keeps dpro usable where it cannot load
    from numba import njit
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

    def njit(*args, **kwargs):  # type: ignore[misc]
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


@njit(cache=True)
def simulate(dur, device, priority, indptr, succ, indeg0, ready0, ndev):  # pragma: no cover - compiled
    """Replay a DAG given as CSR successor arrays.

    Returns ``start, end, crit_pred, dev_prev, n_done``: ``crit_pred[i]`` is the
    op that determined op i's start (-1 if none), ``dev_prev[i]`` the op that
    ran before i on its device (-1 if none), ``n_done`` the number of ops
    executed (< n means the graph has a cycle).
    """
    n = dur.shape[0]
    start = np.zeros(n, dtype=np.float64)
    end = np.zeros(n, dtype=np.float64)
    ready = ready0.copy()
    ready_pred = np.full(n, -1, dtype=np.int64)
    crit_pred = np.full(n, -1, dtype=np.int64)
    dev_prev = np.full(n, -1, dtype=np.int64)
    indeg = indeg0.copy()
    clock = np.zeros(ndev, dtype=np.float64)
    last = np.full(ndev, -1, dtype=np.int64)
    waiting = np.zeros(ndev, dtype=np.bool_)   # a wake-up for the device is in the event heap
    deferred = np.full(ndev, -np.inf)          # time of the device's last deferred (flag 2) wake-up

    # global events: (time, flag, id); flag 0 = op released, 1 = device wake-up,
    # 2 = wake-up deferred until every zero-time cascade at this time has run
    events = [(0.0, np.int64(0), np.int64(0))]
    events.pop()
    queues = [[(0.0, 0.0, np.int64(0))] for _ in range(ndev)]
    for q in queues:
        q.pop()

    for i in range(n):
        if indeg[i] == 0:
            heapq.heappush(events, (ready[i], np.int64(0), np.int64(i)))

    n_done = 0
    while len(events) > 0:
        t, flag, x = heapq.heappop(events)
        if flag == 0:
            d = device[x]
            if d >= 0:
                heapq.heappush(queues[d], (priority[x], t, x))
                if not waiting[d]:
                    waiting[d] = True
                    heapq.heappush(events, (t, np.int64(1), np.int64(d)))
                elif dur[x] == 0.0 and deferred[d] == t and clock[d] <= t:
                    # a zero-time op joined a device that is holding back a positive-time pick at t
                    heapq.heappush(events, (t, np.int64(1), np.int64(d)))
                continue
            o = x                      # takes no device: runs as soon as it is ready
            start[o] = t
            e = t + dur[o]
            crit_pred[o] = ready_pred[o]
        else:
            d = x
            if clock[d] > t:           # stale duplicate: the device is busy, a later wake-up exists
                continue
            q = queues[d]
            if len(q) == 0:
                waiting[d] = False
                continue
            if flag == 1 and dur[q[0][2]] > 0.0:
                # picking a positive-time op now could miss ops that zero-time ops on other
                # devices release at this same time t: decide after them
                deferred[d] = t
                heapq.heappush(events, (t, np.int64(2), np.int64(d)))
                continue
            _p, r, o = heapq.heappop(q)
            start[o] = t               # the device is free (clock <= t) and o is ready (r <= t)
            e = t + dur[o]
            if last[d] >= 0 and clock[d] >= r:
                crit_pred[o] = last[d]
            else:
                crit_pred[o] = ready_pred[o]
            dev_prev[o] = last[d]
            last[d] = o
            clock[d] = e
            heapq.heappush(events, (e, np.int64(1), np.int64(d)))
        end[o] = e
        n_done += 1
        for k in range(indptr[o], indptr[o + 1]):
            v = succ[k]
            if e >= ready[v]:
                ready[v] = e
                ready_pred[v] = o
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(events, (ready[v], np.int64(0), v))
    return start, end, crit_pred, dev_prev, n_done
