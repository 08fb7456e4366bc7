"""The replayer's inner loop, compiled with numba (falls back to plain Python).

Discrete-event list scheduling over devices (dPRO §4.3): each device has a
queue and a clock; an op enters its device's queue when its last predecessor
finishes; a device that frees up (or an idle device that gets work) starts the
best op of its queue.  "Best" = lowest ``priority``, then earliest ready time,
then lowest index — with all priorities equal this is the FIFO order of the
frameworks' engines, and later scheduling work (TicTac, DeFT) only sets
priorities (a schedule of :data:`dpro_kit.replay.rules.SCHEDULES`).  This
kernel is the ``fifo`` device model of :data:`dpro_kit.replay.rules.DEVICE_MODELS`.
The event heap and the device-queue heaps are written out in the loop: as
helper functions they measured slower on 1 M ops (numba ``inline="always"``
helpers incl. the event-heap pop: 15-20 %; queue push/pop as closures: equal on
the kernel alone, 0-12 % slower in ``bench/replay_speed.py``).

Events are processed in (time, key) order, so the simulated
start times never go backwards, and every op that can be ready at time *t* is in
its device's queue before a device picks a positive-time op at *t*: releases at
*t* come before wake-ups at *t*, and a wake-up whose pick would take time is
deferred (flag 2) until the zero-time ops that run at *t* (e.g. RECVs with no
measured time) have released their successors.  Events at the current instant wait in a small
heap of their own (a release's wake-up of an idle device is one; the next event is the smaller
root of the two heaps), and a device whose queue is empty when it starts an op gets no wake-up at
the op's end: a release while it runs pushes one for that end instead.  Both keep the one-heap
order of events and cut the big heap's events from ~3 to ~1 per op (896 k ops: 0.33 -> 0.24 s).
The future events (all later than the current instant) are in a **radix heap** (Ahuja, Mehlhorn, Orlin
and Tarjan, "Faster algorithms for the shortest path problem", JACM 1990): an event's order key is its
time's IEEE bits mapped so that unsigned order is float order (``b ^ (sign ? ~0 : 1 << 63)``); bucket
``i`` holds the events whose key differs from the current instant's key first in bit ``i - 1`` (bucket
0: equal).  Taking the next instant empties the lowest non-empty bucket: its least key becomes the
current one, its events at that time go to the small heap and the others to lower buckets (a key only
moves down, at most 64 times; as a rule once or twice).  That replaces ~12 levels of unpredictable
comparisons per pop of a binary heap of ~4,000 releases (896 k ops: 0.34 -> 0.27 s, docs/scale.md
"Fourth pass").  Since events at the same time are taken in key order from the small heap, the order
is still the one-heap ``(time, key)`' order (``tests/test_replay_schedules.py::
test_kernel_equals_one_heap_event_loop``).  Ops whose device is ``-1`` (virtual In/Out
markers, pure delays) take no device: they run as soon as they are ready.

For each op we also record which op determined its start (the predecessor that
finished last, or the op that ran before it on the same device).  Following
those links back from the op that ends last gives a critical path of the
execution graph in O(n).
"""
from __future__ import annotations

import numpy as np

try:  # numba is a core dependency; the fallback keeps dpro usable where it cannot load
    from numba import njit
    from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros
    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

    def njit(*args, **kwargs):  # type: ignore[misc]
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

    def leading_zeros(x):  # type: ignore[misc]
        return 64 - int(x).bit_length()

    def trailing_zeros(x):  # type: ignore[misc]
        x = int(x)
        return (x & -x).bit_length() - 1


@njit(inline="always")
def _before(t1, k1, t2, k2):
    return t1 < t2 or (t1 == t2 and k1 < k2)


@njit(inline="always")
def _q_before(p1, r1, i1, p2, r2, i2):
    if p1 != p2:
        return p1 < p2
    if r1 != r2:
        return r1 < r2
    return i1 < i2


@njit(inline="always")
def _q_push(q_p, q_r, q_i, q_t, base, j, p, r, x, tb):
    """Insert op ``x`` (priority ``p``, release time ``r``, tie-break ``tb``) into a device's ready
    queue: the min-heap ``q_*[base:base+j]`` ordered by :func:`_q_before`; it then holds ``j+1``."""
    while j > 0:
        pj = (j - 1) >> 1
        if _q_before(p, r, tb, q_p[base + pj], q_r[base + pj], q_t[base + pj]):
            q_p[base + j] = q_p[base + pj]
            q_r[base + j] = q_r[base + pj]
            q_i[base + j] = q_i[base + pj]
            q_t[base + j] = q_t[base + pj]
            j = pj
        else:
            break
    q_p[base + j] = p
    q_r[base + j] = r
    q_i[base + j] = x
    q_t[base + j] = tb


@njit(inline="always")
def _q_pop(q_p, q_r, q_i, q_t, base, m):
    """Remove the head of a device's ready queue (:func:`_q_push`), which then holds ``m`` entries:
    the last entry moves to the root and sifts down."""
    if m > 0:
        lp = q_p[base + m]
        lr = q_r[base + m]
        li = q_i[base + m]
        lt2 = q_t[base + m]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= m:
                break
            if c + 1 < m and _q_before(q_p[base + c + 1], q_r[base + c + 1], q_t[base + c + 1],
                                       q_p[base + c], q_r[base + c], q_t[base + c]):
                c += 1
            if _q_before(q_p[base + c], q_r[base + c], q_t[base + c], lp, lr, lt2):
                q_p[base + j] = q_p[base + c]
                q_r[base + j] = q_r[base + c]
                q_i[base + j] = q_i[base + c]
                q_t[base + j] = q_t[base + c]
                j = c
            else:
                break
        q_p[base + j] = lp
        q_r[base + j] = lr
        q_i[base + j] = li
        q_t[base + j] = lt2


@njit(inline="always")
def _ev_push(ev_t, ev_k, ne, t, k):
    """Push (t, k) on the event heap holding ne entries (capacity is never exceeded, see below)."""
    j = ne
    while j > 0:
        pj = (j - 1) >> 1
        if _before(t, k, ev_t[pj], ev_k[pj]):
            ev_t[j] = ev_t[pj]
            ev_k[j] = ev_k[pj]
            j = pj
        else:
            break
    ev_t[j] = t
    ev_k[j] = k


@njit(inline="always")
def _ev_pop(ev_t, ev_k, ne):
    """Remove the root of the event heap holding ne entries (it then holds ne - 1): the last entry
    sifts down from the root."""
    ne -= 1
    if ne > 0:
        lt = ev_t[ne]
        lk = ev_k[ne]
        j = 0
        while True:                      # the hole goes down to a leaf along the smaller children ...
            c = 2 * j + 1
            if c >= ne:
                break
            if c + 1 < ne and _before(ev_t[c + 1], ev_k[c + 1], ev_t[c], ev_k[c]):
                c += 1
            ev_t[j] = ev_t[c]
            ev_k[j] = ev_k[c]
            j = c
        while j > 0:                     # ... and the last entry rises from there (bottom-up pop:
            pj = (j - 1) >> 1            # one comparison per level on the way down)
            if _before(lt, lk, ev_t[pj], ev_k[pj]):
                ev_t[j] = ev_t[pj]
                ev_k[j] = ev_k[pj]
                j = pj
            else:
                break
        ev_t[j] = lt
        ev_k[j] = lk


@njit(inline="always")
def _k_push(hk, ns, k):
    """Push key ``k`` on the min-heap ``hk`` holding ns entries (the current instant's events)."""
    j = ns
    while j > 0:
        pj = (j - 1) >> 1
        if k < hk[pj]:
            hk[j] = hk[pj]
            j = pj
        else:
            break
    hk[j] = k


@njit(inline="always")
def _k_pop(hk, ns):
    """Remove the root of the key heap ``hk`` holding ns entries (it then holds ns - 1)."""
    ns -= 1
    if ns > 0:
        lk = hk[ns]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= ns:
                break
            if c + 1 < ns and hk[c + 1] < hk[c]:
                c += 1
            if hk[c] < lk:
                hk[j] = hk[c]
                j = c
            else:
                break
        hk[j] = lk


@njit(cache=True)
def simulate(dur, device, priority, indptr, succ, indeg0, ready0, ndev, tiebreak):  # pragma: no cover - compiled
    """Replay a DAG given as CSR successor arrays.

    Returns ``start, end, crit_pred, dev_prev, n_done``: ``crit_pred[i]`` is the
    op that determined op i's start (-1 if none), ``dev_prev[i]`` the op that
    ran before i on its device (-1 if none), ``n_done`` the number of ops
    executed (< n means the graph has a cycle).

    ``tiebreak[i]`` is op i's rank in the last tie-break of its device queue
    (after priority and ready time).  It is separate from the op's index so the
    caller can number ops for memory locality (see ``engine.locality_order``)
    without changing the schedule.  The heaps are flat arrays and the per-op
    state lives in the result arrays: an op's ready time in ``start`` and the predecessor that set it
    in ``crit_pred`` until the op starts, its in-degree in a copy; durations, devices and the CSR are
    read from the caller's arrays (no packed copies: at 10 M ops fresh memory costs more than the
    cache misses the packing saved, docs/scale.md "Seventh pass").
    """
    n = dur.shape[0]
    # results in their own arrays (ops run nearly in index order after the locality renumbering, so
    # these writes stream); until an op starts, start[i] is its ready time and crit_pred[i] the
    # predecessor that set it (-1: none)
    start = np.empty(n, dtype=np.float64)
    end = np.empty(n, dtype=np.float64)
    crit_pred = np.empty(n, dtype=indptr.dtype)    # (op indices: int32 on the array path, 8 bytes less per op)
    dev_prev = np.empty(n, dtype=indptr.dtype)
    deg = np.empty(n, dtype=indeg0.dtype)          # predecessors not done yet (int32 on the array path)
    for i in range(n):
        start[i] = ready0[i]
        crit_pred[i] = -1
        deg[i] = indeg0[i]
    clock = np.zeros(ndev, dtype=np.float64)
    last = np.full(ndev, -1, dtype=np.int64)
    waiting = np.zeros(ndev, dtype=np.bool_)
    deferred = np.full(ndev, -np.inf)

    # event heap of (time, key): key < n: op released; n + d: device wake-up; n + ndev + d: deferred
    # wake-up.  (time, key) orders exactly as (time, flag, id).
    # capacity: at most n events are pending at any time -- each op accounts for its own pending
    # release, or for the one pending wake-up of the chain its release started (every processed
    # wake-up pushes at most one wake-up); checked with NUMBA_BOUNDSCHECK=1 and capacity n + 1.
    cap = n + ndev + 16
    # radix heap of future events: pool entries (time, key, order key, next), bucket lists by the highest
    # bit in which an entry's order key differs from ``cur_key`` (the order key of the current instant)
    pt = np.empty(cap, dtype=np.float64)
    pk = np.empty(cap, dtype=np.int64)
    pkey = np.empty(cap, dtype=np.uint64)
    pnext = np.empty(cap, dtype=np.int64)
    bh = np.full(65, -1, dtype=np.int64)
    occ = np.uint64(0)
    cur_key = np.uint64(0)
    free = -1
    top = 0
    sc = np.zeros(1, dtype=np.float64)
    scb = sc.view(np.uint64)
    ne = 0
    # per-device queues: a heap per device in its own block of four shared pool arrays.  A device's block
    # starts at 4 entries on its first push and moves to one twice as large (at most its op count) when
    # full, so only the entries queues reach are touched (blocks of each device's op count, laid end to
    # end, touched a page for nearly every device: ~24 B per op of fresh memory on a first call)
    qcnt = np.zeros(ndev, dtype=np.int64)
    for i in range(n):
        if device[i] >= 0:
            qcnt[device[i]] += 1
    qbase = np.zeros(ndev, dtype=np.int64)
    qcap = np.zeros(ndev, dtype=np.int64)
    qlen = np.zeros(ndev, dtype=np.int64)
    qtop = 0
    m_all = 3 * n + 4 * ndev + 16                    # >= the blocks' sum: 4 + 8 + ... + count <= 3 * count + 4
    q_p = np.empty(m_all, dtype=np.float64)         # (np.empty: pages touched only as far as used)
    q_r = np.empty(m_all, dtype=np.float64)
    q_i = np.empty(m_all, dtype=indptr.dtype)     # (int32 on the array path: less fresh memory)
    q_t = np.empty(m_all, dtype=tiebreak.dtype)   # tie-break rank of the queued op (see docstring)

    for i in range(n):
        if deg[i] == 0:
            if free >= 0:                               # radix push (start[i], i)
                e_ = free
                free = pnext[e_]
            else:
                e_ = top
                top += 1
            pt[e_] = start[i]
            pk[e_] = i
            sc[0] = start[i] + 0.0
            b_ = scb[0]
            b_ ^= (np.uint64(0) - (b_ >> np.uint64(63))) | np.uint64(0x8000000000000000)
            pkey[e_] = b_
            x_ = b_ ^ cur_key
            if x_ == 0:
                pnext[e_] = bh[0]
                bh[0] = e_
            else:
                bi_ = 64 - np.int64(leading_zeros(x_))
                pnext[e_] = bh[bi_]
                bh[bi_] = e_
                occ |= np.uint64(1) << np.uint64(bi_ - 1)
            ne += 1

    # events at the current instant ``tcur`` (the time of the last event taken) wait in a small
    # heap of keys of their own, ``hk``, instead of the big one: the wake-up a release pushes for
    # an idle device is at the release's own time (about a third of all events).  The next event
    # is the smaller (time, key) of the two heaps' roots, so the order is the one-heap order.
    hk = np.empty(cap, dtype=np.int64)
    ns = 0
    tcur = -np.inf
    n_done = 0
    W1 = n
    W2 = n + ndev
    while ne > 0 or ns > 0:
        if ns == 0:                                  # next instant: its events from the radix heap to hk
            if bh[0] >= 0:
                bi = 0
            else:
                bi = np.int64(trailing_zeros(occ)) + 1
            e_ = bh[bi]
            mn = pkey[e_]
            em = e_
            e2 = pnext[e_]
            while e2 >= 0:
                if pkey[e2] < mn:
                    mn = pkey[e2]
                    em = e2
                e2 = pnext[e2]
            cur_key = mn
            tcur = pt[em]
            bh[bi] = -1
            if bi > 0:
                occ &= ~(np.uint64(1) << np.uint64(bi - 1))
            while e_ >= 0:
                nx_ = pnext[e_]
                x_ = pkey[e_] ^ cur_key
                if x_ == 0:
                    _k_push(hk, ns, pk[e_])
                    ns += 1
                    pnext[e_] = free
                    free = e_
                    ne -= 1
                else:
                    b2 = 64 - np.int64(leading_zeros(x_))
                    pnext[e_] = bh[b2]
                    bh[b2] = e_
                    occ |= np.uint64(1) << np.uint64(b2 - 1)
                e_ = nx_
        t = tcur
        x = hk[0]
        _k_pop(hk, ns)
        ns -= 1
        if x < W1:                                   # release of op x
            d = device[x]
            if d >= 0:
                m = qlen[d]
                if m == qcap[d]:                     # the device's block is full (or none yet): a larger one
                    c = min(max(4, 2 * m), qcnt[d])
                    base = qtop
                    qtop += c
                    ob = qbase[d]
                    for j in range(m):
                        q_p[base + j] = q_p[ob + j]
                        q_r[base + j] = q_r[ob + j]
                        q_i[base + j] = q_i[ob + j]
                        q_t[base + j] = q_t[ob + j]
                    qbase[d] = base
                    qcap[d] = c
                base = qbase[d]
                p = priority[x]
                tbx = tiebreak[x]
                _q_push(q_p, q_r, q_i, q_t, base, qlen[d], p, t, x, tbx)
                qlen[d] += 1
                if not waiting[d]:
                    waiting[d] = True
                    if clock[d] > t:                 # busy: wake it when its op ends
                        if free >= 0:                               # radix push (clock[d], W1 + d)
                            e_ = free
                            free = pnext[e_]
                        else:
                            e_ = top
                            top += 1
                        pt[e_] = clock[d]
                        pk[e_] = W1 + d
                        sc[0] = clock[d] + 0.0
                        b_ = scb[0]
                        b_ ^= (np.uint64(0) - (b_ >> np.uint64(63))) | np.uint64(0x8000000000000000)
                        pkey[e_] = b_
                        x_ = b_ ^ cur_key
                        if x_ == 0:
                            pnext[e_] = bh[0]
                            bh[0] = e_
                        else:
                            bi_ = 64 - np.int64(leading_zeros(x_))
                            pnext[e_] = bh[bi_]
                            bh[bi_] = e_
                            occ |= np.uint64(1) << np.uint64(bi_ - 1)
                        ne += 1
                    else:
                        _k_push(hk, ns, W1 + d)
                        ns += 1
                elif dur[x] == 0.0 and deferred[d] == t and clock[d] <= t:
                    _k_push(hk, ns, W1 + d)
                    ns += 1
                continue
            o = x
            e = t + dur[o]
            start[o] = t
            end[o] = e
            dev_prev[o] = -1                         # (crit_pred[o]: the predecessor that made it ready)
        else:                                        # device wake-up
            if x < W2:
                d = x - W1
                flag = 1
            else:
                d = x - W2
                flag = 2
            if clock[d] > t:
                continue
            m = qlen[d]
            if m == 0:
                waiting[d] = False
                continue
            base = qbase[d]
            o = q_i[base]
            if flag == 1 and dur[o] > 0.0:
                deferred[d] = t
                _k_push(hk, ns, W2 + d)
                ns += 1
                continue
            r = q_r[base]
            m -= 1                                   # pop the queue's head
            qlen[d] = m
            _q_pop(q_p, q_r, q_i, q_t, base, m)
            e = t + dur[o]
            start[o] = t
            end[o] = e
            if last[d] >= 0 and clock[d] >= r:
                crit_pred[o] = last[d]                 # (else: the predecessor that made it ready)
            dev_prev[o] = last[d]
            last[d] = o
            clock[d] = e
            if m == 0:                               # nothing queued: no wake-up at its end (a release
                waiting[d] = False                   # before then pushes one for the end, see above)
            elif e == t:
                _k_push(hk, ns, W1 + d)
                ns += 1
            else:
                if free >= 0:                               # radix push (e, W1 + d)
                    e_ = free
                    free = pnext[e_]
                else:
                    e_ = top
                    top += 1
                pt[e_] = e
                pk[e_] = W1 + d
                sc[0] = e + 0.0
                b_ = scb[0]
                b_ ^= (np.uint64(0) - (b_ >> np.uint64(63))) | np.uint64(0x8000000000000000)
                pkey[e_] = b_
                x_ = b_ ^ cur_key
                if x_ == 0:
                    pnext[e_] = bh[0]
                    bh[0] = e_
                else:
                    bi_ = 64 - np.int64(leading_zeros(x_))
                    pnext[e_] = bh[bi_]
                    bh[bi_] = e_
                    occ |= np.uint64(1) << np.uint64(bi_ - 1)
                ne += 1
        n_done += 1
        for kk in range(indptr[o], indptr[o + 1]):       # release successors
            v = succ[kk]
            if e >= start[v]:
                start[v] = e
                crit_pred[v] = o
            deg[v] -= 1
            if deg[v] == 0:
                if start[v] == t:
                    _k_push(hk, ns, v)
                    ns += 1
                else:
                    if free >= 0:                               # radix push (start[v], v)
                        e_ = free
                        free = pnext[e_]
                    else:
                        e_ = top
                        top += 1
                    pt[e_] = start[v]
                    pk[e_] = v
                    sc[0] = start[v] + 0.0
                    b_ = scb[0]
                    b_ ^= (np.uint64(0) - (b_ >> np.uint64(63))) | np.uint64(0x8000000000000000)
                    pkey[e_] = b_
                    x_ = b_ ^ cur_key
                    if x_ == 0:
                        pnext[e_] = bh[0]
                        bh[0] = e_
                    else:
                        bi_ = 64 - np.int64(leading_zeros(x_))
                        pnext[e_] = bh[bi_]
                        bh[bi_] = e_
                        occ |= np.uint64(1) << np.uint64(bi_ - 1)
                    ne += 1
    return start, end, crit_pred, dev_prev, n_done


__all__ = ["simulate"]
