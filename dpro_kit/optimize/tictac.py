"""TicTac (Hashemi et al., MLSys'19; seed ``003``): scheduling efficiency and transfer priorities for PS jobs.

Three things, all computed from the global DFG (:mod:`dpro_kit.graph`) and
the replayer (:mod:`dpro_kit.replay`); docs/tictac.md derives every formula.

* **Scheduling efficiency** *E* and **speed-up bound** *S* (TicTac §3.2) of a
  replayed iteration, per worker: :func:`scheduling_efficiency`.  A worker's
  partition is its own ops plus the transfers from and to it; ``U`` is the sum
  of their times (everything serial), ``L`` the busiest resource's share (all
  resources busy all the time), ``m`` the worker's replayed makespan::

      E = (U - m) / (U - L)        S = (U - L) / L

* **TIC and TAC** (TicTac §4, Algorithms 1-3): an order of the parameter
  transfers of each worker.  The "recv" ops of the paper are the *pulls* of a
  PS job (one per tensor partition and worker; :func:`worker_partitions`);
  the ops that wait for them are the worker's computation after the pulls of
  one iteration and before those of the next (through the graph's iteration
  edges: with the ``synchronous`` rule every op of the next iteration waits
  for every pull, so all orders tie, as they should).  :func:`tic_order`,
  :func:`tac_order`; :func:`random_order` is the baseline the paper compares
  with (frameworks that do not order transfers).
* **Priorities for the replayer**: the schedules ``tic``, ``tac`` and
  ``random`` of :data:`dpro_kit.replay.rules.SCHEDULES` give every transfer of
  a tensor partition (its push SEND, the AGG, its pull SEND and RECV) the
  rank of that partition in the order, so the kernel's device queues (links,
  server compute) serve them in that order (:func:`schedule_priorities`);
  :func:`plan_section` is what ``dpro optimize`` writes to ``plan["schedule"]``.

The paper orders only the pulls ("recv" ops at the worker); applying the
same rank to the push and the aggregation of the same partition is this
module's extension (the pull of a partition cannot start before every
worker's push of it is aggregated, so pushing it late delays its pull).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import networkx as nx
import numpy as np

from ..trace import LAYER_KINDS, OpKind

if TYPE_CHECKING:  # pragma: no cover
    from ..replay.engine import CompiledGraph, ReplayResult

__all__ = ["WorkerPartition", "worker_partitions", "update_properties", "tic_order", "tac_order", "random_order",
           "orders", "schedule_priorities", "prioritized", "scheduling_efficiency", "plan_section", "from_plan",
           "ORDERS"]

_SEND, _RECV, _AGG, _VIRTUAL = OpKind.SEND.value, OpKind.RECV.value, OpKind.AGG.value, OpKind.VIRTUAL.value
#: the orders this module computes (``default`` = no priorities: the graph as built)
ORDERS = ("tic", "tac", "random")


# --------------------------------------------------------------------------- worker partitions

@dataclass
class WorkerPartition:
    """One worker's view for TIC/TAC (TicTac §4.1): its recv ops and the ops that wait for them.

    Attributes
    ----------
    worker : str
        The worker node.
    recvs : list of (str, int)
        ``(tensor, chunk)`` of every pull to ``worker``, in the graph's order (the default order).
    recv_time : list of float
        ``Time(r)`` in us: the pull's transfer time (its SEND on the link plus its RECV).
    loads : dict of int to float
        The computation that waits for pulls, grouped by communication dependency:
        ``mask -> total time (us)``, bit ``i`` of ``mask`` = ``recvs[i]`` (``op.dep`` of
        the paper; ops with the same ``dep`` are interchangeable in Algorithm 1).
    """

    worker: str
    recvs: list[tuple[str, int]]
    recv_time: list[float]
    loads: dict[int, float] = field(default_factory=dict)


def _pull_sends(g: nx.DiGraph) -> dict[str, str]:
    """pull RECV key -> its SEND key."""
    out = {}
    for k, d in g.nodes(data=True):
        if d.get("kind") == _RECV and d.get("phase") == "pull":
            for p in g.predecessors(k):
                if g.nodes[p].get("kind") == _SEND and g.nodes[p].get("txn") == d.get("txn"):
                    out[k] = p
    return out


def worker_partitions(g: nx.DiGraph) -> dict[str, WorkerPartition]:
    """Every worker's :class:`WorkerPartition` of a PS DFG (empty dict when ``g`` has no pulls).

    The recv ops of worker *w* are its pull RECVs (one per tensor partition).  The
    communication dependency of an op is the set of *w*'s pulls it depends on, over two
    iterations: an op of *w* in iteration *i* after a pull of iteration *i* (e.g. the
    update that waits for it), or an op of *w* in iteration *i+1* reached from such a
    pull through ``g.graph["iteration_edges"]`` and not after a pull of iteration *i+1*
    (TicTac's iteration starts with the pulls).  Only ops with a device and a positive
    duration count (virtual markers take no time).

    Parameters
    ----------
    g : networkx.DiGraph
        A global DFG with PS push/pull transfers (:func:`dpro_kit.graph.topology.ps_push_pull`).
    """
    sends = _pull_sends(g)
    if not sends:
        return {}
    bit: dict[str, int] = {}
    parts: dict[str, WorkerPartition] = {}
    order = list(nx.topological_sort(g))
    for k in order:                                    # bits in topological order: the default order
        if k in sends:
            d = g.nodes[k]
            w = d["node"]
            p = parts.setdefault(w, WorkerPartition(worker=w, recvs=[], recv_time=[]))
            bit[k] = len(bit)
            p.recvs.append((d["tensor"], int(d["chunk"])))
            p.recv_time.append(float(g.nodes[sends[k]]["dur"]) + float(d["dur"]))
    local = {}                                         # global bit -> (worker, local bit)
    seen: dict[str, int] = {}
    for k in bit:
        w = g.nodes[k]["node"]
        local[bit[k]] = (w, seen.get(w, 0))
        seen[w] = seen.get(w, 0) + 1
    it_in: dict[str, list[str]] = {}
    for u, v in g.graph.get("iteration_edges", []):
        it_in.setdefault(v, []).append(u)
    dep0: dict[str, int] = {}       # pulls of iteration i an op of iteration i depends on
    dep1: dict[str, int] = {}       # pulls of iteration i an op of iteration i+1 depends on
    after1: dict[str, bool] = {}    # whether an op of iteration i+1 is after a pull of iteration i+1
    nodes = g.nodes
    for k in order:
        m0 = 0
        for u in g.predecessors(k):
            m0 |= dep0[u]
        dep0[k] = m0 | (1 << bit[k]) if k in bit else m0
    for k in order:
        m1 = 0
        a1 = k in bit
        for u in g.predecessors(k):
            m1 |= dep1[u]
            a1 = a1 or after1[u]
        for u in it_in.get(k, ()):
            m1 |= dep0[u]
        dep1[k], after1[k] = m1, a1
    for k in order:
        d = nodes[k]
        w = d.get("node", "")
        if w not in parts or not d.get("device") or d.get("kind") in (_SEND, _RECV, _VIRTUAL) \
                or not d.get("dur", 0.0) > 0:
            continue
        p = parts[w]
        for m in (dep0[k], 0 if after1[k] else dep1[k]):
            mask = _localise(m, local, w)
            if mask:
                p.loads[mask] = p.loads.get(mask, 0.0) + float(d["dur"])
    return parts


def _localise(m: int, local: dict[int, tuple[str, int]], w: str) -> int:
    out = 0
    while m:
        low = m & -m
        b = low.bit_length() - 1
        ww, lb = local[b]
        if ww == w:
            out |= 1 << lb
        m ^= low
    return out


# --------------------------------------------------------------------------- Algorithms 1-3

def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def update_properties(loads: dict[int, float], recv_time: list[float], outstanding: int
                      ) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """TicTac Algorithm 1 (UpdateProperties) for the outstanding recvs ``outstanding`` (a bit mask).

    Parameters
    ----------
    loads : dict of int to float
        Computation grouped by communication dependency (``WorkerPartition.loads``).
    recv_time : list of float
        ``Time(r)`` per recv (bit index).
    outstanding : int
        Bit mask of the outstanding recvs ``R``.

    Returns
    -------
    (M, P, M+) : dicts keyed by recv index (outstanding ones only)
        ``M[r] = Time(r)``; ``P[r]``: total time of the ops whose only outstanding
        dependency is ``r`` (directly-dependent compute load); ``M+[r]``: the least
        ``op.M = sum of Time over op.dep ∩ R`` over ops with several outstanding
        dependencies including ``r`` (impending communication load; ``inf`` if none).
    """
    out = _bits(outstanding)
    P = {r: 0.0 for r in out}
    Mp = {r: math.inf for r in out}
    for mask, t in loads.items():
        d = mask & outstanding
        if not d:
            continue
        if d & (d - 1) == 0:                              # |D| = 1
            P[d.bit_length() - 1] += t
        else:
            bs = _bits(d)
            m = sum(recv_time[b] for b in bs)
            for b in bs:
                if m < Mp[b]:
                    Mp[b] = m
    return {r: recv_time[r] for r in out}, P, Mp


def tic_order(part: WorkerPartition) -> list[float]:
    """TIC (TicTac Algorithm 2): priority number of each recv, lower first, ties allowed.

    With the general time oracle (Time = 1 for a recv, 0 for any other op) the
    priority of recv *r* is its impending communication load ``M+``: the least number
    of outstanding recvs that an op depending on *r* and others still waits for
    (``inf`` -- last -- when no op waits for *r* together with others).

    Parameters
    ----------
    part : WorkerPartition
        The worker's recvs and dependent computation (:func:`worker_partitions`).
    """
    n = len(part.recvs)
    _, _, Mp = update_properties({m: 0.0 for m in part.loads}, [1.0] * n, (1 << n) - 1)
    return [Mp[r] for r in range(n)]


def _comes_first(a: int, b: int, M: dict, P: dict, Mp: dict) -> bool:
    """TAC's comparator: does recv ``a`` precede recv ``b``?  (TicTac eq. 6, then ``M+``.)

    ``a`` first iff ``min(P_b, M_a) < min(P_a, M_b)``: the two-recv makespans are
    ``M_a + max(P_a, M_b) + P_b`` and ``M_b + max(P_b, M_a) + P_a``, and
    ``max(x, y) = x + y - min(x, y)``.  (Algorithm 3 as printed compares
    ``min(P_a, M_b) < min(P_b, M_a)``, the reverse of its own eq. 6; it would send the
    recv that unblocks nothing first in Figure 1 -- docs/tictac.md.)
    """
    x, y = min(P[b], M[a]), min(P[a], M[b])
    if x != y:
        return x < y
    return Mp[a] < Mp[b]


def tac_order(part: WorkerPartition) -> list[int]:
    """TAC (TicTac Algorithm 3): the recvs in transfer order (indices into ``part.recvs``).

    Repeatedly: update the properties of the outstanding recvs (Algorithm 1),
    take the minimum under the comparator -- *A* before *B* iff
    ``min(P_B, M_A) < min(P_A, M_B)`` (eq. 6), ties broken by the smaller ``M+`` --
    and mark it done.  The minimum is found by one scan in the default order (the
    comparator is not transitive in general; the scan keeps the first recv that no
    later one beats).

    Parameters
    ----------
    part : WorkerPartition
        The worker's recvs and dependent computation (:func:`worker_partitions`).
    """
    n = len(part.recvs)
    outstanding = (1 << n) - 1
    order: list[int] = []
    while outstanding:
        M, P, Mp = update_properties(part.loads, part.recv_time, outstanding)
        cands = _bits(outstanding)
        best = cands[0]
        for r in cands[1:]:
            if _comes_first(r, best, M, P, Mp):
                best = r
        order.append(best)
        outstanding &= ~(1 << best)
    return order


def random_order(part: WorkerPartition, seed: int = 0) -> list[int]:
    """A uniformly random transfer order (the unordered baseline of TicTac §6), reproducible by ``seed``."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.permutation(len(part.recvs))]


def _ranks_from_order(order: list[int]) -> list[float]:
    rank = [0.0] * len(order)
    for pos, r in enumerate(order):
        rank[r] = float(pos)
    return rank


def _dense(prio: list[float]) -> list[float]:
    """Priority numbers -> dense ranks 0, 1, ... (ties share one; ``inf`` last)."""
    vals = sorted(set(prio))
    pos = {v: float(i) for i, v in enumerate(vals)}
    return [pos[p] for p in prio]


def orders(g: nx.DiGraph, *, seed: int = 0) -> dict[str, dict[str, dict[tuple[str, int], float]]]:
    """Rank of every ``(tensor, chunk)`` per worker under each order of :data:`ORDERS`.

    ``{"tic": {worker: {(tensor, chunk): rank}}, "tac": ..., "random": ...}``; ranks
    are 0, 1, ... (lower first; TIC's ties share a rank).  Empty dicts for a graph
    without pulls.

    Parameters
    ----------
    g : networkx.DiGraph
        A global DFG.
    seed : int, default 0
        Seed of the random order (one permutation per worker, seeds ``seed``, ``seed+1``, ...).
    """
    out: dict[str, dict[str, dict[tuple[str, int], float]]] = {o: {} for o in ORDERS}
    for i, (w, p) in enumerate(sorted(worker_partitions(g).items())):
        ranks = {"tic": _dense(tic_order(p)), "tac": _ranks_from_order(tac_order(p)),
                 "random": _ranks_from_order(random_order(p, seed + i))}
        for o, rk in ranks.items():
            out[o][w] = dict(zip(p.recvs, rk))
    return out


# --------------------------------------------------------------------------- priorities for the replayer

def _op_ranks(g: nx.DiGraph, ranks: dict[str, dict[tuple[str, int], float]]) -> dict[str, float]:
    """op key -> priority for the PS ops of every ranked (worker, tensor, chunk)."""
    out: dict[str, float] = {}
    for k, d in g.nodes(data=True):
        kind, phase = d.get("kind"), d.get("phase")
        key = (d.get("tensor", ""), int(d.get("chunk", -1)))
        if phase == "push" and kind in (_SEND, _RECV):
            w = d["node"] if kind == _SEND else d["peer"]
        elif phase == "pull" and kind in (_SEND, _RECV):
            w = d["peer"] if kind == _SEND else d["node"]
        elif kind == _AGG:
            rs = [r[key] for r in ranks.values() if key in r]
            if rs:
                out[k] = min(rs)
            continue
        else:
            continue
        r = ranks.get(w, {}).get(key)
        if r is not None:
            out[k] = r
    return out


def prioritized(g: nx.DiGraph, order: str, *, seed: int = 0) -> nx.DiGraph:
    """A copy of ``g`` whose PS transfer ops carry the ``order``'s ranks as vertex ``priority``.

    ``replay(prioritized(g, "tac"))`` equals ``replay(g, schedule="tac")``; a graph
    file written from it keeps the order.

    Parameters
    ----------
    g : networkx.DiGraph
        A global DFG.
    order : {"tic", "tac", "random"}
    seed : int, default 0
        Seed of the random order.
    """
    h = g.copy()
    for k, p in _op_ranks(g, orders(g, seed=seed)[order]).items():
        h.nodes[k]["priority"] = p
    return h


def schedule_priorities(cg: "CompiledGraph", g: nx.DiGraph, order: str, *, seed: int = 0) -> np.ndarray:
    """The priority array of ``order`` for ``cg`` (compiled from ``g``): a schedule of the replayer.

    Ops of a ranked tensor partition get its rank; every other op keeps its graph
    priority (0 for a traced job: it competes like the first-ranked transfer, as
    unprioritised ops do in TicTac §3.1).

    Parameters
    ----------
    cg : CompiledGraph
        ``compile_graph(g)``.
    g : networkx.DiGraph
        The graph ``cg`` was compiled from (the schedule reads op attributes).
    order : {"tic", "tac", "random"}
    seed : int, default 0
        Seed of the random order.
    """
    prio = np.array(cg.priority, dtype=np.float64, copy=True)
    ranks = _op_ranks(g, orders(g, seed=seed)[order])
    if ranks:
        idx = {k: i for i, k in enumerate(cg.keys)}
        for k, p in ranks.items():
            i = idx.get(k)
            if i is not None:
                prio[i] = p
    return prio


def _register() -> None:
    from ..replay.rules import register_schedule
    for o in ORDERS:
        register_schedule(o, (lambda cg, g, _o=o: schedule_priorities(cg, g, _o)), needs_graph=True)


_register()


# --------------------------------------------------------------------------- E and S

def scheduling_efficiency(res: "ReplayResult", g: nx.DiGraph) -> dict[str, Any]:
    """Scheduling efficiency *E* and speed-up bound *S* (TicTac §3.2) of a replayed iteration, per worker.

    A worker's partition: its ops plus every transfer from or to it (SEND ops whose
    ``node`` or ``peer`` is the worker), with their replayed durations as ``Time``;
    its resources are the devices they run on (compute/comm streams, links).  A link
    shared with other workers (a parameter server's NIC, which every worker's pushes
    and pulls cross) is one resource of the partition with its whole load: the worker
    queues behind the other workers' transfers there, so leaving them out would put
    the makespan above ``U`` (TicTac's model gives each worker its own links).

    * ``U = sum of Time(op)`` (upper bound on the makespan: one resource at a time, eq. 1);
    * ``L = max over resources d of sum of Time(op) on d`` (lower bound, eq. 2);
    * ``m``: the worker's makespan in the replay (last end minus first start of its ops in
      the last replayed iteration; with several iterations, last end minus the previous
      iteration's last end);
    * ``E = (U - m) / (U - L)`` (eq. 3; 1 = as fast as the busiest resource allows,
      0 = fully serial; below 0 when the worker waits for others' computation, e.g. a
      server aggregating a slower worker's push), None when ``U = L``;
    * ``S = (U - L) / L`` (eq. 4; the most a better order could gain over the worst), None when ``L = 0``.

    Parameters
    ----------
    res : ReplayResult
        A replay of ``g`` (any number of iterations).
    g : networkx.DiGraph
        The replayed graph.

    Returns
    -------
    dict
        ``{"workers": {w: {"U_ms", "L_ms", "makespan_ms", "E", "S", "bottleneck"}},
        "reference": w, "E": ..., "S": ...}``; the reference worker is the one with the
        longest makespan (the one that sets the iteration time).  ``{}`` when the graph has
        no worker with computation.
    """
    cg = res.graph
    n = cg.n
    it = res.iterations - 1
    start, end = res.start[it * n:(it + 1) * n], res.end[it * n:(it + 1) * n]
    prev_end = res.end[(it - 1) * n:it * n] if it > 0 else None
    dur = end - start
    workers = sorted({d["node"] for _, d in g.nodes(data=True)
                      if d.get("kind") in LAYER_KINDS and d.get("node")})
    wset = set(workers)
    rows: dict[str, list[int]] = {w: [] for w in workers}
    own: dict[str, list[int]] = {w: [] for w in workers}
    for i, k in enumerate(cg.keys):
        d = g.nodes[k]
        node = d.get("node", "")
        if node in wset:
            rows[node].append(i)
            own[node].append(i)
        if d.get("kind") == _SEND and d.get("peer") in wset and d.get("peer") != node:
            rows[d["peer"]].append(i)
    out: dict[str, Any] = {"workers": {}}
    dev_of = cg.device
    for w in workers:
        r = np.asarray(rows[w], dtype=np.int64)
        r = r[dev_of[r] >= 0]
        # a link the worker's transfers use but other workers' transfers use too (the
        # server's NIC in a star) is one resource: its whole load is in the partition,
        # else the worker's makespan exceeds U whenever it queues behind them (E < 0)
        shared = [int(x) for x in np.unique(dev_of[r]) if cg.devices[int(x)].startswith("link:")]
        if shared:
            r = np.union1d(r, np.flatnonzero(np.isin(dev_of, shared)))
        U = float(dur[r].sum())
        per_dev = np.bincount(cg.device[r], weights=dur[r], minlength=len(cg.devices)) if r.size else np.zeros(1)
        L = float(per_dev.max())
        bottleneck = cg.devices[int(per_dev.argmax())] if r.size else ""
        mine = np.asarray(own[w], dtype=np.int64)
        if prev_end is not None:
            m = float(end[mine].max() - prev_end[mine].max())
        else:
            m = float(end[mine].max() - start[mine].min())
        out["workers"][w] = {"U_ms": U / 1e3, "L_ms": L / 1e3, "makespan_ms": m / 1e3,
                             "E": (U - m) / (U - L) if U > L else None, "S": (U - L) / L if L > 0 else None,
                             "bottleneck": bottleneck}
    if not workers:
        return {}
    ref = max(workers, key=lambda w: (out["workers"][w]["makespan_ms"], w))
    out.update(reference=ref, E=out["workers"][ref]["E"], S=out["workers"][ref]["S"])
    return out


# --------------------------------------------------------------------------- plan

def plan_section(g: nx.DiGraph, *, iterations: int = 3, seed: int = 0) -> dict[str, Any] | None:
    """``plan["schedule"]``: TIC / TAC / random orders of a PS job with the replayed time of each.

    For every order: per worker the tensor partitions in transfer order with their
    rank, MXNet's ``priority=`` value for ``kvstore.push/pull`` (``-rank``: higher is
    served first), the replayed iteration time (``iterations`` iterations, steady state)
    and *E* / *S*.  None for a graph without PS pulls (nothing to order).

    Parameters
    ----------
    g : networkx.DiGraph
        The DFG of the plan's strategy.
    iterations : int, default 3
        Iterations replayed for each order (orders matter where iterations overlap).
    seed : int, default 0
        Seed of the random order.
    """
    from ..replay import replay
    if not worker_partitions(g):
        return None
    ords = orders(g, seed=seed)
    pred: dict[str, Any] = {}
    for name in ("default",) + ORDERS:
        res = replay(g, iterations=iterations) if name == "default" else replay(g, iterations=iterations,
                                                                                  schedule=name)
        eff = scheduling_efficiency(res, g)
        pred[name] = {"iteration_ms": res.iteration_time_us / 1e3, "E": eff.get("E"), "S": eff.get("S")}
    best = min(("tic", "tac"), key=lambda o: (pred[o]["iteration_ms"], o))
    out = {"applies_to": "parameter-server transfers (push, aggregation, pull of each tensor partition)",
           "recommended": best if pred[best]["iteration_ms"] < pred["default"]["iteration_ms"] else "default",
           "predicted": pred, "iterations_replayed": iterations, "orders": {}}
    for o in ORDERS:
        out["orders"][o] = {w: [{"tensor": t, "chunk": c, "rank": int(r), "mxnet_priority": -int(r)}
                                for (t, c), r in sorted(rk.items(), key=lambda kv: (kv[1], kv[0]))]
                            for w, rk in ords[o].items()}
    return out


def from_plan(g: nx.DiGraph, section: dict[str, Any], order: str) -> nx.DiGraph:
    """A copy of ``g`` with the priorities of ``plan["schedule"]["orders"][order]`` (a plan read back).

    Parameters
    ----------
    g : networkx.DiGraph
        The DFG the plan was made for.
    section : dict
        ``plan["schedule"]`` (:func:`plan_section`).
    order : {"tic", "tac", "random"}
    """
    from ..errors import DproError
    if order not in section.get("orders", {}):
        raise DproError(f"the plan's schedule has no order {order!r}",
                        hint="known: " + ", ".join(sorted(section.get("orders", {}))))
    ranks = {w: {(e["tensor"], int(e["chunk"])): float(e["rank"]) for e in entries}
             for w, entries in section["orders"][order].items()}
    h = g.copy()
    for k, p in _op_ranks(g, ranks).items():
        h.nodes[k]["priority"] = p
    return h
