"""Proteus' executor behaviours in the replayer: bandwidth sharing and the overlap factor (seed 001 §VI).

The ``shared`` device model of :data:`dpro_kit.replay.rules.DEVICE_MODELS`.  Where the
``fifo`` kernel (:mod:`._kernel`) runs one op at a time on every device — transfers on a
link queue behind each other — this kernel is a fluid simulation: every running op has a
*remaining work* (microseconds at its solo speed) and a *rate* (fraction of its solo speed),
and the rates are recomputed at every start and end of a transfer.

* **Bandwidth sharing** (``share=True``): transfers (ops on ``link:`` devices) do not queue;
  a transfer starts when it is ready and the running transfers share the capacity of the
  resources they cross by *progressive filling* (max-min fairness): all unfrozen rates grow
  together; when a resource is saturated, the transfers crossing it are frozen at the current
  level; a transfer never exceeds its solo speed (rate 1).
* **Hierarchical topology (hosts x links)**: a link device is mapped to the resources it uses
  (:func:`link_resources`): ``link:A->B`` between hosts = the sender host's ``egress:A`` and the
  receiver host's ``ingress:B`` (a full-duplex NIC per host; what the emulated cluster's tbf per
  direction is), plus ``fabric`` (every inter-host transfer) when ``fabric_capacity`` is given;
  ``link:H:upload`` = ``egress:H``, ``link:H:download`` = ``ingress:H`` (parameter-server
  interface links); a link between two nodes of one host uses the nodes' own ports ``out:n`` and
  ``in:m`` (loopback, not the NIC).  A resource's capacity is in units of a transfer's solo
  speed (default 1: one transfer alone runs at the speed its duration was measured or modelled
  at); ``capacity={"egress:host0": 0.5}`` halves host0's upload.
* **Overlap factor** ``gamma`` (``overlap_factor``): a computation op runs at rate 1/(1+gamma)
  while at least one transfer touching its host (as sender or receiver) is in flight, else at 1;
  so an op overlapped for its whole duration takes (1+gamma) x its duration (Proteus: "its cost
  will increase by gamma").  Computation = ops on devices that are not links and not a node's
  ``:comm`` stream.  The fit of gamma from a trace: :mod:`dpro_kit.replay.overlap`.

With ``share=False`` the links are FIFO queues as in the ``fifo`` kernel (only the overlap
factor acts); with ``share=False`` and ``gamma=0`` the schedule equals the ``fifo`` kernel's
(``tests/test_sharing.py`` checks it op for op on random graphs).  Queue rule, release-before-
pick at equal times and the critical-predecessor records are the ``fifo`` kernel's.

Cost: each event scans the running ops (O(running)), and a change in the set of running
transfers re-runs progressive filling (O(levels x transfers x resources per transfer)); the
``fifo`` default kernel is untouched.  docs/replayer.md "Bandwidth sharing and overlap (Proteus)".

References
----------
.. [1] Duan et al., "Proteus: Simulating the Performance of Distributed DNN Training", §VI
       (``/work/shared/seeds/001_b74cee54beaaa4e0.txt``).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import GraphError
from ._kernel import _ev_pop, _ev_push, _q_pop, _q_push, njit

#: per-transfer rate and saturation tolerance (relative)
_EPS = 1e-12


def _host_of(node: str, hosts: Mapping[str, str] | None) -> str:
    if hosts and node in hosts:
        return str(hosts[node])
    return node.split("/", 1)[0] if "/" in node else node


def _is_node(name: str, hosts: Mapping[str, str] | None) -> bool:
    return bool(hosts and name in hosts) or ("/" in name and not hosts)


def link_resources(device: str, hosts: Mapping[str, str] | None = None, *,
                   fabric: bool = False) -> tuple[list[str], list[str]]:
    """``(resources, hosts touched)`` of a link device (module docstring); ``([], [])`` for a non-link.

    Parameters
    ----------
    device : str
        A device name of the DFG (``link:A->B``, ``link:H:upload``, ``link:n1->n2``, ...).
    hosts : mapping, optional
        Node -> host (the manifest's); without it a node is a name with a ``/`` (``host0/1``)
        and its host the part before the ``/``.
    fabric : bool
        Whether inter-host transfers also cross the shared ``fabric`` resource.
    """
    if not device.startswith("link:"):
        return [], []
    body = device[5:]
    if "->" in body:
        a, b = body.split("->", 1)
        if _is_node(a, hosts) and _is_node(b, hosts):
            ha, hb = _host_of(a, hosts), _host_of(b, hosts)
            if ha == hb:                     # two processes of one host: loopback ports
                return [f"out:{a}", f"in:{b}"], [ha]
            res, touched = [f"egress:{ha}", f"ingress:{hb}"], [ha, hb]
        else:
            res, touched = [f"egress:{a}", f"ingress:{b}"], [a, b]
        return res + (["fabric"] if fabric else []), touched
    host, _, direction = body.rpartition(":")
    if direction in ("upload", "download") and host:
        return [("egress:" if direction == "upload" else "ingress:") + host] + (["fabric"] if fabric else []), [host]
    return [device], []


def topology(devices: Sequence[str], hosts: Mapping[str, str] | None = None, *,
             capacity: Mapping[str, float] | None = None, fabric_capacity: float | None = None,
             comm_devices: Sequence[str] = ()) -> dict:
    """The kernel's topology arrays for a compiled graph's device list (see the module docstring).

    ``comm_devices``: devices that are not links but run communication (e.g. a GPU's NCCL stream,
    ``host0/0:gpu:40``): they keep their FIFO queue, count as communication in flight on their
    node's host, and are not computation.  Computation devices are the others that are not a
    ``:comm`` stream; on a node with GPU streams (``:gpu`` in the name) only those.

    Returns a dict: ``is_link`` (bool per device), ``is_comm`` (links and ``comm_devices``),
    ``res_ptr``/``res_idx`` (CSR: device ->
    resources), ``res_cap``, ``resources`` (names), ``comp_grp`` (per device: the host group of a
    computation device, -1 otherwise), ``grp_ptr``/``grp_idx`` (CSR: link device -> host groups
    it touches), ``groups`` (host names).
    """
    capacity = dict(capacity or {})
    res_names: dict[str, int] = {}
    grp_names: dict[str, int] = {}
    is_link = np.zeros(len(devices), dtype=np.bool_)
    is_comm = np.zeros(len(devices), dtype=np.bool_)
    comm_set = set(comm_devices)
    gpu_nodes = {name.rpartition(":")[0].split(":gpu", 1)[0] for name in devices
                 if ":gpu" in name and name not in comm_set and not name.startswith("link:")}
    comp_grp = np.full(len(devices), -1, dtype=np.int64)
    res_ptr, res_idx, grp_ptr, grp_idx = [0], [], [0], []
    fabric = fabric_capacity is not None
    for d, name in enumerate(devices):
        res, touched = link_resources(name, hosts, fabric=fabric)
        if res:
            is_link[d] = is_comm[d] = True
            res_idx += [res_names.setdefault(r, len(res_names)) for r in res]
            grp_idx += [grp_names.setdefault(h, len(grp_names)) for h in dict.fromkeys(touched)]
        else:
            node, _, stream = name.partition(":")
            if name in comm_set:
                is_comm[d] = True
                grp_idx.append(grp_names.setdefault(_host_of(node, hosts), len(grp_names)))
            elif node and stream != "comm" and (node not in gpu_nodes or stream.startswith("gpu")):
                comp_grp[d] = grp_names.setdefault(_host_of(node, hosts), len(grp_names))
        res_ptr.append(len(res_idx))
        grp_ptr.append(len(grp_idx))
    unknown = sorted(set(capacity) - set(res_names) - {"fabric"})
    if unknown:
        raise GraphError(f"capacity names resource {unknown[0]!r}, which no link of the graph uses",
                         hint="known: " + ", ".join(sorted(res_names)) if res_names else "the graph has no link")
    cap = np.ones(len(res_names), dtype=np.float64)
    for r, i in res_names.items():
        c = float(fabric_capacity) if r == "fabric" else float(capacity.get(r, 1.0))
        if not np.isfinite(c) or c <= 0:
            raise GraphError(f"capacity of resource {r!r} must be a positive number, got {c!r}")
        cap[i] = c
    return {"is_link": is_link, "is_comm": is_comm, "res_ptr": np.array(res_ptr, np.int64), "res_idx": np.array(res_idx, np.int64),
            "res_cap": cap, "resources": list(res_names), "comp_grp": comp_grp,
            "grp_ptr": np.array(grp_ptr, np.int64), "grp_idx": np.array(grp_idx, np.int64),
            "groups": list(grp_names)}


@njit(cache=True)
def _executor(dur, device, priority, indptr, succ, indeg0, ready0, ndev, tiebreak,  # pragma: no cover - compiled
              share, is_link, is_comm, res_ptr, res_idx, res_cap, rd_ptr, rd_idx, comp_grp, grp_ptr, grp_idx,
              ngrp, gc_ptr, gc_idx, gamma, tok_cap, tok_floor):
    """The fluid replay (module docstring).  Returns ``start, end, crit_pred, dev_prev, n_done``
    like :func:`._kernel.simulate`; a shared transfer has no device predecessor (``dev_prev`` -1).

    Running ops sit in a heap of projected ends (an entry is stale when the op's projected end has
    changed since: rate changes push a new entry); each link device keeps a list of its running shared
    transfers, and progressive filling runs over the connected component (links sharing resources,
    ``rd_ptr``/``rd_idx``: resource -> link devices) of the links whose transfers changed; ``gc_ptr``/``gc_idx`` list each host group's computation devices, whose
    running ops get the group's rate (1/(1+gamma) while a transfer touching it is in flight) at the end
    of every instant at which a transfer of the group or one of its computation ops started or ended.
    ``tok_cap`` (per resource, us of solo-speed transfer; 0: none) are token buckets: a transfer starting
    on resources that all hold tokens has that much of its work (beyond ``tok_floor``) done at once; a
    resource's bucket refills at its capacity while no transfer runs on it (:func:`run_shared`).
    """
    n = dur.shape[0]
    nres = res_cap.shape[0]
    ready = ready0.copy()
    indeg = indeg0.copy()
    rpred = np.full(n, -1, np.int64)
    start = np.zeros(n)
    end = np.zeros(n)
    crit = np.full(n, -1, np.int64)
    prev = np.full(n, -1, np.int64)
    rate = np.ones(n)
    te = np.zeros(n)                    # projected end at the current rate
    running = np.zeros(n, np.bool_)
    busy = np.full(ndev, -1, np.int64)
    last = np.full(ndev, -1, np.int64)
    devend = np.full(ndev, -np.inf)
    ng = max(ngrp, 1)
    inflight = np.zeros(ng, np.int64)
    gdirty = np.empty(ng, np.int64)
    isgdirty = np.zeros(ng, np.bool_)
    ngdirty = 0
    # running shared transfers (unordered, with positions)
    # per link device, a doubly linked list of its running shared transfers
    dhead = np.full(ndev, -1, np.int64)
    dcount = np.zeros(ndev, np.int64)
    nxt = np.full(n, -1, np.int64)
    prv = np.full(n, -1, np.int64)
    inlist = np.zeros(n, np.bool_)
    ddirty = np.empty(ndev + 1, np.int64)
    isddirty = np.zeros(ndev, np.bool_)
    nddirty = 0
    # component search (resources <-> link devices with running transfers)
    seen_r = np.zeros(max(nres, 1), np.bool_)
    seen_d = np.zeros(ndev, np.bool_)
    rlist = np.empty(max(nres, 1), np.int64)
    dlist = np.empty(ndev + 1, np.int64)
    trn = np.empty(n, np.int64)         # the transfers of the component being filled
    # heap of projected ends (time, op); capacity grows by compaction (see below)
    cap = 2 * n + 16
    e_t = np.empty(cap)
    e_k = np.empty(cap, np.int64)
    ne = 0
    # release heap (ready time, op)
    h_t = np.empty(n + 1)
    h_k = np.empty(n + 1, np.int64)
    nh = 0
    # device queues: heap per device segment
    qoff = np.zeros(ndev + 1, np.int64)
    for i in range(n):
        if device[i] >= 0:
            qoff[device[i] + 1] += 1
    for d in range(ndev):
        qoff[d + 1] += qoff[d]
    qlen = np.zeros(ndev, np.int64)
    m_all = max(qoff[ndev], 1)
    q_p = np.empty(m_all)
    q_r = np.empty(m_all)
    q_i = np.empty(m_all, np.int64)
    q_t = np.empty(m_all, np.int64)
    dirty = np.empty(ndev + 1, np.int64)
    isdirty = np.zeros(ndev, np.bool_)
    ndirty = 0
    # progressive-filling scratch
    cap_left = np.empty(max(nres, 1))
    cnt = np.zeros(max(nres, 1), np.int64)
    frozen = np.zeros(n, np.bool_)
    # token buckets per resource: tokens (us of work) at idle_since, transfers running on it
    tokens = tok_cap.copy()
    idle_since = np.zeros(max(nres, 1))
    res_run = np.zeros(max(nres, 1), np.int64)
    any_tok = False
    for r in range(nres):
        if tok_cap[r] > 0.0:
            any_tok = True

    for i in range(n):
        if indeg[i] == 0:
            _ev_push(h_t, h_k, nh, ready[i], i)
            nh += 1
    n_done = 0
    t = 0.0
    while True:
        # drop stale projected ends from the top
        while ne > 0 and (not running[e_k[0]] or e_t[0] != te[e_k[0]]):
            _ev_pop(e_t, e_k, ne)
            ne -= 1
        tn = np.inf
        if nh > 0:
            tn = h_t[0]
        if ne > 0 and e_t[0] < tn:
            tn = e_t[0]
        if tn == np.inf:
            break
        if tn > t:
            t = tn
        comm_changed = False
        while True:                      # settle everything that happens at t
            progress = False
            while ne > 0 and e_t[0] <= t:    # completions
                o = e_k[0]
                valid = running[o] and e_t[0] == te[o]
                _ev_pop(e_t, e_k, ne)
                ne -= 1
                if not valid:
                    continue
                progress = True
                end[o] = te[o]
                running[o] = False
                n_done += 1
                d = device[o]
                if d >= 0:
                    if inlist[o]:
                        inlist[o] = False
                        if any_tok:
                            for rr in range(res_ptr[d], res_ptr[d + 1]):
                                r = res_idx[rr]
                                res_run[r] -= 1
                                if res_run[r] == 0:
                                    idle_since[r] = t
                        if prv[o] >= 0:
                            nxt[prv[o]] = nxt[o]
                        else:
                            dhead[d] = nxt[o]
                        if nxt[o] >= 0:
                            prv[nxt[o]] = prv[o]
                        dcount[d] -= 1
                        if not isddirty[d]:
                            isddirty[d] = True
                            ddirty[nddirty] = d
                            nddirty += 1
                    if is_comm[d] and dur[o] > 0.0:
                        comm_changed = True
                        for gg in range(grp_ptr[d], grp_ptr[d + 1]):
                            g0 = grp_idx[gg]
                            inflight[g0] -= 1
                            if not isgdirty[g0]:
                                isgdirty[g0] = True
                                gdirty[ngdirty] = g0
                                ngdirty += 1
                    if busy[d] == o:
                        busy[d] = -1
                        devend[d] = end[o]
                        if not isdirty[d]:
                            isdirty[d] = True
                            dirty[ndirty] = d
                            ndirty += 1
                e = end[o]
                for kk in range(indptr[o], indptr[o + 1]):
                    v = succ[kk]
                    if e >= ready[v]:
                        ready[v] = e
                        rpred[v] = o
                    indeg[v] -= 1
                    if indeg[v] == 0:
                        _ev_push(h_t, h_k, nh, ready[v], v)
                        nh += 1
            while nh > 0 and h_t[0] <= t:   # releases
                progress = True
                x = h_k[0]
                _ev_pop(h_t, h_k, nh)
                nh -= 1
                d = device[x]
                if d < 0 or (share and is_link[d]):      # starts now, no queue
                    start[x] = t
                    crit[x] = rpred[x]
                    rate[x] = 1.0
                    work = dur[x]
                    if any_tok and d >= 0 and work > 0.0:    # token buckets: what all its resources cover
                        cov = np.inf
                        for rr in range(res_ptr[d], res_ptr[d + 1]):
                            r = res_idx[rr]
                            if tok_cap[r] <= 0.0:
                                cov = 0.0
                                break
                            if res_run[r] == 0:
                                tokens[r] = min(tok_cap[r], tokens[r] + (t - idle_since[r]) * res_cap[r])
                            if tokens[r] < cov:
                                cov = tokens[r]
                        if cov > work - tok_floor:
                            cov = work - tok_floor
                        if cov > 0.0:
                            work -= cov
                            for rr in range(res_ptr[d], res_ptr[d + 1]):
                                tokens[res_idx[rr]] -= cov
                        for rr in range(res_ptr[d], res_ptr[d + 1]):
                            res_run[res_idx[rr]] += 1
                    te[x] = t + work
                    running[x] = True
                    if ne == cap:
                        ne = _compact(e_t, e_k, running, te, n)
                    _ev_push(e_t, e_k, ne, te[x], x)
                    ne += 1
                    if d >= 0 and dur[x] > 0.0:
                        comm_changed = True
                        inlist[x] = True
                        prv[x] = -1
                        nxt[x] = dhead[d]
                        if dhead[d] >= 0:
                            prv[dhead[d]] = x
                        dhead[d] = x
                        dcount[d] += 1
                        if not isddirty[d]:
                            isddirty[d] = True
                            ddirty[nddirty] = d
                            nddirty += 1
                        for gg in range(grp_ptr[d], grp_ptr[d + 1]):
                            g0 = grp_idx[gg]
                            inflight[g0] += 1
                            if not isgdirty[g0]:
                                isgdirty[g0] = True
                                gdirty[ngdirty] = g0
                                ngdirty += 1
                    continue
                base = qoff[d]
                p = priority[x]
                tbx = tiebreak[x]
                _q_push(q_p, q_r, q_i, q_t, base, qlen[d], p, t, x, tbx)
                qlen[d] += 1
                if not isdirty[d]:
                    isdirty[d] = True
                    dirty[ndirty] = d
                    ndirty += 1
            # start zero-time heads now; positive-time ones once nothing else happens at t
            for phase in range(2):
                for jd in range(ndirty):
                    d = dirty[jd]
                    if busy[d] >= 0 or qlen[d] == 0:
                        continue
                    base = qoff[d]
                    o = q_i[base]
                    if phase == 0 and dur[o] > 0.0:
                        continue
                    r = q_r[base]
                    m = qlen[d] - 1
                    qlen[d] = m
                    _q_pop(q_p, q_r, q_i, q_t, base, m)
                    start[o] = t
                    if last[d] >= 0 and devend[d] >= r:
                        crit[o] = last[d]
                    else:
                        crit[o] = rpred[o]
                    prev[o] = last[d]
                    last[d] = o
                    busy[d] = o
                    rate[o] = 1.0
                    if gamma > 0.0 and comp_grp[d] >= 0:
                        g0 = comp_grp[d]
                        if inflight[g0] > 0:
                            rate[o] = 1.0 / (1.0 + gamma)
                        if not isgdirty[g0]:      # re-checked once the instant is settled
                            isgdirty[g0] = True
                            gdirty[ngdirty] = g0
                            ngdirty += 1
                    te[o] = t + dur[o] / rate[o]
                    running[o] = True
                    if ne == cap:
                        ne = _compact(e_t, e_k, running, te, n)
                    _ev_push(e_t, e_k, ne, te[o], o)
                    ne += 1
                    progress = True
                    if is_comm[d] and dur[o] > 0.0:
                        comm_changed = True
                        for gg in range(grp_ptr[d], grp_ptr[d + 1]):
                            g0 = grp_idx[gg]
                            inflight[g0] += 1
                            if not isgdirty[g0]:
                                isgdirty[g0] = True
                                gdirty[ngdirty] = g0
                                ngdirty += 1
                if phase == 0 and progress:
                    break                 # settle the zero-time work first
            if not progress:
                break
        for jd in range(ndirty):
            isdirty[dirty[jd]] = False
        ndirty = 0
        # ---- overlap: the running computation of every host group touched at t gets its group's rate
        for jg in range(ngdirty):
            g0 = gdirty[jg]
            isgdirty[g0] = False
            if gamma > 0.0:
                nr = 1.0 / (1.0 + gamma) if inflight[g0] > 0 else 1.0
                for cc in range(gc_ptr[g0], gc_ptr[g0 + 1]):
                    o = busy[gc_idx[cc]]
                    if o >= 0 and running[o] and te[o] > t and nr != rate[o]:
                        te[o] = t + (te[o] - t) * rate[o] / nr
                        rate[o] = nr
                        if ne == cap:
                            ne = _compact(e_t, e_k, running, te, n)
                        _ev_push(e_t, e_k, ne, te[o], o)
                        ne += 1
        ngdirty = 0
        if not comm_changed or not share or nddirty == 0:
            continue
        # ---- progressive filling over the connected component(s) of the changed links: max-min
        # fairness separates over components of the transfer/resource graph, the others keep their rates
        nr_ = 0
        nd_ = 0
        for jd in range(nddirty):
            d = ddirty[jd]
            isddirty[d] = False
            if not seen_d[d]:
                seen_d[d] = True
                dlist[nd_] = d
                nd_ += 1
        nddirty = 0
        qd = 0
        while qd < nd_:
            d = dlist[qd]
            qd += 1
            for rr in range(res_ptr[d], res_ptr[d + 1]):
                r = res_idx[rr]
                if seen_r[r]:
                    continue
                seen_r[r] = True
                rlist[nr_] = r
                nr_ += 1
                for k2 in range(rd_ptr[r], rd_ptr[r + 1]):
                    d2 = rd_idx[k2]
                    if not seen_d[d2] and dcount[d2] > 0:
                        seen_d[d2] = True
                        dlist[nd_] = d2
                        nd_ += 1
        ntr = 0
        for jd in range(nd_):
            d = dlist[jd]
            seen_d[d] = False
            o = dhead[d]
            while o >= 0:
                trn[ntr] = o
                ntr += 1
                o = nxt[o]
        for jr in range(nr_):
            seen_r[rlist[jr]] = False
        if ntr == 0:
            continue
        for a in range(ntr):
            o = trn[a]
            frozen[o] = False
            d = device[o]
            for rr in range(res_ptr[d], res_ptr[d + 1]):
                cnt[res_idx[rr]] = 0
                cap_left[res_idx[rr]] = res_cap[res_idx[rr]]
        for a in range(ntr):
            d = device[trn[a]]
            for rr in range(res_ptr[d], res_ptr[d + 1]):
                cnt[res_idx[rr]] += 1
        level = 0.0
        nfree = ntr
        while nfree > 0:
            inc = 1.0 - level
            for a in range(ntr):
                o = trn[a]
                if frozen[o]:
                    continue
                d = device[o]
                for rr in range(res_ptr[d], res_ptr[d + 1]):
                    r = res_idx[rr]
                    sh = cap_left[r] / cnt[r]
                    if sh < inc:
                        inc = sh
            if inc < 0.0:
                inc = 0.0
            level += inc
            for a in range(ntr):          # every unfrozen transfer grows by inc on each of its resources
                o = trn[a]
                if frozen[o]:
                    continue
                d = device[o]
                for rr in range(res_ptr[d], res_ptr[d + 1]):
                    cap_left[res_idx[rr]] -= inc
            for a in range(ntr):          # freeze the transfers on saturated resources (all at level 1)
                o = trn[a]
                if frozen[o]:
                    continue
                d = device[o]
                sat = level >= 1.0 - _EPS
                if not sat:
                    for rr in range(res_ptr[d], res_ptr[d + 1]):
                        r = res_idx[rr]
                        if cap_left[r] <= _EPS * res_cap[r]:
                            sat = True
                            break
                if sat:
                    frozen[o] = True
                    nfree -= 1
                    nr = level if level < 1.0 else 1.0
                    if nr != rate[o] and te[o] > t:
                        te[o] = t + (te[o] - t) * rate[o] / nr
                        rate[o] = nr
                        if ne == cap:
                            ne = _compact(e_t, e_k, running, te, n)
                        _ev_push(e_t, e_k, ne, te[o], o)
                        ne += 1
            for a in range(ntr):          # recount the transfers still growing
                d = device[trn[a]]
                for rr in range(res_ptr[d], res_ptr[d + 1]):
                    cnt[res_idx[rr]] = 0
            for a in range(ntr):
                o = trn[a]
                if not frozen[o]:
                    d = device[o]
                    for rr in range(res_ptr[d], res_ptr[d + 1]):
                        cnt[res_idx[rr]] += 1
    return start, end, crit, prev, n_done


@njit(cache=True)
def _compact(e_t, e_k, running, te, n):  # pragma: no cover - compiled
    """Rebuild the projected-end heap from the running ops only (one valid entry each); returns its size.

    The heap holds at most 2n + 16 entries; every running op has exactly one valid entry, so after
    compaction at most n remain and the next n pushes fit.
    """
    m = 0
    for o in range(n):
        if running[o]:
            _ev_push(e_t, e_k, m, te[o], o)
            m += 1
    return m


def run_shared(cg, *, share: bool = True, overlap_factor: float = 0.0, hosts: Mapping[str, str] | None = None,
               capacity: Mapping[str, float] | None = None, fabric_capacity: float | None = None,
               comm_devices: Sequence[str] = (), token_bucket_us: float | Mapping[str, float] | None = None,
               token_floor_us: float = 0.0) -> tuple:
    """Run the executor on a (possibly unrolled) :class:`~dpro_kit.replay.engine.CompiledGraph`.

    Parameters
    ----------
    cg : CompiledGraph
        The graph's arrays (``replay`` unrolls them first).
    share : bool, default True
        Transfers share their resources' bandwidth (progressive filling); False: links are FIFO queues.
    overlap_factor : float, default 0
        Proteus' gamma: computation overlapped with a transfer of its host runs at 1/(1+gamma).
    hosts : mapping, optional
        Node -> host (the manifest's); default: the part of a node name before ``/``.
    capacity : mapping, optional
        Resource name (``egress:H``, ``ingress:H``, ``out:n``, ``in:n``, ``fabric``) -> capacity in
        units of a transfer's solo speed (default 1).
    fabric_capacity : float, optional
        Capacity of one ``fabric`` resource every inter-host transfer crosses (None: no fabric limit).
    comm_devices : sequence of str
        Non-link devices that run communication (:func:`topology`).
    token_bucket_us : float or mapping, optional
        Token-bucket links (``share=True`` only), in microseconds of a transfer at its solo speed
        (= the bucket's bytes / the line rate): a number gives every host NIC resource (``egress:H``,
        ``ingress:H``) that bucket, a mapping names resources.  A bucket starts full and refills at the
        resource's capacity while no transfer runs on it; a transfer starting when all its resources
        hold tokens has that much of its duration (beyond ``token_floor_us``) done at once, taken from
        each bucket -- a shaper's burst (the emulated cluster's tbf: ``dpro_kit.cluster.tbf_params``)
        lets a short message after a pause leave at the wire's speed.  A resource without a bucket
        (loopback ports, or not named) covers nothing.
    token_floor_us : float
        What a transfer takes at least however many tokens there are (the link's latency).

    Returns ``start, end, crit_pred, dev_prev, n_done`` as :func:`._kernel.simulate`.
    """
    gamma = float(overlap_factor)
    if not np.isfinite(gamma) or gamma < 0:
        raise GraphError(f"overlap factor must be a number >= 0, got {overlap_factor!r}")
    topo = topology(cg.devices, hosts, capacity=capacity, fabric_capacity=fabric_capacity,
                    comm_devices=comm_devices)
    ndev = max(len(cg.devices), 1)
    pad = (lambda a, fill: a if a.size >= ndev else np.concatenate([a, np.full(ndev - a.size, fill, a.dtype)]))
    is_link = pad(topo["is_link"], False)
    is_comm = pad(topo["is_comm"], False)
    comp_grp = pad(topo["comp_grp"], -1)
    res_ptr = topo["res_ptr"] if topo["res_ptr"].size == ndev + 1 else np.zeros(ndev + 1, np.int64)
    grp_ptr = topo["grp_ptr"] if topo["grp_ptr"].size == ndev + 1 else np.zeros(ndev + 1, np.int64)
    ngrp = len(topo["groups"])
    gc_idx = np.argsort(comp_grp, kind="stable").astype(np.int64)
    gc_idx = gc_idx[comp_grp[gc_idx] >= 0]
    gc_ptr = np.zeros(max(ngrp, 1) + 1, np.int64)
    np.cumsum(np.bincount(comp_grp[comp_grp >= 0], minlength=max(ngrp, 1)), out=gc_ptr[1:])
    nres = len(topo["resources"])
    res_idx = topo["res_idx"]
    dev_of = np.repeat(np.arange(ndev, dtype=np.int64), np.diff(res_ptr))
    o2 = np.argsort(res_idx, kind="stable")
    rd_idx = dev_of[o2].astype(np.int64)
    rd_ptr = np.zeros(max(nres, 1) + 1, np.int64)
    np.cumsum(np.bincount(res_idx, minlength=max(nres, 1)), out=rd_ptr[1:])
    tok = np.zeros(max(nres, 1))
    if token_bucket_us is not None and share:
        names = topo["resources"]
        if isinstance(token_bucket_us, Mapping):
            unknown = sorted(set(token_bucket_us) - set(names))
            if unknown:
                raise GraphError(f"token_bucket_us names resource {unknown[0]!r}, which no link of the graph uses",
                                 hint="known: " + ", ".join(names) if names else "the graph has no link")
            per = {k: float(v) for k, v in token_bucket_us.items()}
        else:
            per = {r: float(token_bucket_us) for r in names if r.startswith(("egress:", "ingress:"))}
        for r, i in ((r, i) for i, r in enumerate(names) if r in per):
            if not np.isfinite(per[r]) or per[r] < 0:
                raise GraphError(f"token bucket of resource {r!r} must be a number >= 0, got {per[r]!r}")
            tok[i] = per[r]
    floor = float(token_floor_us)
    if not np.isfinite(floor) or floor < 0:
        raise GraphError(f"token_floor_us must be a number >= 0, got {token_floor_us!r}")
    return _executor(cg.dur, cg.device, cg.priority, cg.indptr, cg.succ, cg.indeg, np.zeros(cg.n), ndev,
                     cg.tiebreak, bool(share), is_link, is_comm, res_ptr, res_idx, topo["res_cap"], rd_ptr, rd_idx,
                     comp_grp, grp_ptr, topo["grp_idx"], ngrp, gc_ptr, gc_idx, gamma, tok, floor)


__all__ = ["link_resources", "run_shared", "topology"]
