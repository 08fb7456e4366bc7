"""DeFT (Meng & Sun; seed ``002``): communication scheduling as 0/1 (multi-)knapsack problems with delayed updates.

DeFT removes the hard dependency between a gradient bucket's synchronisation
and the next forward pass (*delayed updates*) and decides, per stage, which
bucket synchronisations run while the computation runs:

* **bucket times** (DeFT §IV-B, the Profiler): per DDP gradient bucket its
  backward computation time (the compute between the previous bucket becoming
  ready and this one), its communication time (the longest path through its
  collective's ops), and the forward stage's time: :func:`bucket_times`, read
  from a global DFG (:mod:`dpro_kit.graph`) built from a trace;
* **knapsacks** (DeFT §III-B, Problem 1): the items are bucket communications,
  weight = profit = communication time, the capacity a stage's computation
  time: :func:`knapsack` (exact, dynamic programming), :func:`recursive_knapsack`
  (Algorithm 1);
* **multi-knapsack over heterogeneous links** (DeFT §III-C, Problem 2): one
  knapsack per link, capacity scaled by the link's speed: :func:`greedy_multi_knapsack`
  (the paper's greedy) and :func:`exact_multi_knapsack` (brute force, small cases);
* **the two-stage schedule with current and future queues** (DeFT §III-B,
  the four cases; Algorithm 2 of the paper is an image lost in the text, this
  is the prose's algorithm): :func:`schedule`, iteration by iteration, until the
  queue state repeats (steady state);
* **partition constraint** (DeFT §III-D): :func:`partition_counts`.

Every formula, and where this module had to choose because the text is
ambiguous, is in ``docs/deft.md``.  Times are microseconds throughout.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

__all__ = ["Bucket", "BucketTimes", "bucket_times", "knapsack", "recursive_knapsack", "greedy_multi_knapsack",
           "exact_multi_knapsack", "multi_knapsack", "partition_counts", "partitioned", "Item", "Stage", "Step", "Schedule",
           "schedule", "link_speeds", "link_assignment", "Sync", "synchronous_syncs", "delayed_syncs", "schedule_syncs",
           "DeftReplay", "period_graph", "replay_syncs", "predict", "expected_next_loss", "loss_ratio",
           "walk_statistics", "measured_loss_ratio", "preserve", "fixed_delays", "lowering_order", "preserve_measured",
           "solver_plan",
           "plan_section"]

_REF = ("Meng and Sun, \"DeFT: Mitigating Data Dependencies for Flexible Communication Scheduling in "
        "Distributed Training\" (``/work/shared/seeds/002_d6311c65601a268e.txt``)")


# --------------------------------------------------------------------------- bucket times

@dataclass(frozen=True)
class Bucket:
    """One gradient bucket: its name, bytes and times (us).

    ``backward_us`` is the backward computation of the bucket's layers (from the
    previous bucket's ready point to this one's); ``forward_us`` an estimate of
    its layers' forward computation (the forward stage split in proportion to
    ``backward_us``: the trace does not tie forward ops to parameters);
    ``comm_us`` its synchronisation on the reference link (link 0).
    """

    name: str
    bytes: int
    backward_us: float
    forward_us: float
    comm_us: float
    #: the graph's tensor this bucket (or part of one, :func:`partitioned`) synchronises, and which fraction
    tensor: str = ""
    fraction: float = 1.0

    @property
    def graph_tensor(self) -> str:
        return self.tensor or self.name


@dataclass
class BucketTimes:
    """Bucket-level times of one node (DeFT §IV-B, the Profiler's output), buckets in backward-ready order.

    ``forward_us`` is the forward *stage*: every computation between the end of one
    backward pass and the start of the next (optimizer update, data loading and the
    forward pass: delayed communication overlaps all of it); ``backward_us`` the
    backward stage (first backward op to the last bucket's ready point);
    ``tail_us`` backward computation after the last bucket is ready (counted in
    neither capacity: DDP copies the reduced buckets back there).
    """

    node: str
    buckets: list[Bucket]
    forward_us: float
    backward_us: float
    tail_us: float = 0.0

    @property
    def comm_us(self) -> float:
        return sum(b.comm_us for b in self.buckets)

    @property
    def coverage_rate(self) -> float:
        """DeFT's CR = T_comm / (T_forward + T_backward) (§I); > 1: communication cannot all be hidden."""
        cap = self.forward_us + self.backward_us
        return self.comm_us / cap if cap > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "forward_us": self.forward_us, "backward_us": self.backward_us,
                "tail_us": self.tail_us, "comm_us": self.comm_us, "coverage_rate": self.coverage_rate,
                "buckets": [dict(b.__dict__) for b in self.buckets]}


def _collective_span(g: "nx.DiGraph", ops: list[str]) -> float:
    """Longest path (sum of op durations) through the subgraph ``ops`` induces."""
    keep = set(ops)
    best: dict[str, float] = {}
    import networkx as nx
    for k in nx.topological_sort(g.subgraph(ops)):
        before = max((best[u] for u in g.predecessors(k) if u in keep), default=0.0)
        best[k] = before + float(g.nodes[k].get("dur", 0.0))
    return max(best.values(), default=0.0)


def bucket_times(g: "nx.DiGraph", node: str | None = None) -> BucketTimes:
    """Bucket-level forward/backward computation and communication times of a DDP job's global DFG.

    For each AllReduce tensor (a DDP bucket, :func:`dpro_kit.graph.schemes.is_allreduce`)
    the op that makes it ready is the computation op before its ``In`` op; buckets
    are ordered by when that op runs on ``node``'s compute stream (a one-iteration
    replay of ``g``).  A bucket's backward time is the summed durations of the
    compute ops after the previous bucket's ready op up to and including its own;
    the forward stage is every compute op before the first backward (BW) op plus
    the ops after the last ready op that are not backward ops (the optimizer
    update of the previous iteration runs there); its communication time is the
    longest path through its collective's ops (SEND/RECV/In/Out of that tensor),
    the largest over the nodes.

    Parameters
    ----------
    g : networkx.DiGraph
        A one-iteration global DFG (``Session(trace).graph``).
    node : str or None
        The worker whose computation gives the capacities; None: the first worker (by name).

    Raises
    ------
    ValueError
        ``g`` has no AllReduce bucket (DeFT schedules DDP / AllReduce buckets only).

    References
    ----------
    .. [1] {ref}, §IV-B (Profiler: operator level to bucket level) and Table II.
    """
    from ..replay import replay
    from ..trace import OpKind

    nodes = g.nodes
    tensors: dict[str, list[str]] = {}
    for k, d in g.nodes(data=True):
        if d.get("tensor") and d.get("kind") in (OpKind.SEND.value, OpKind.RECV.value, OpKind.VIRTUAL.value):
            tensors.setdefault(d["tensor"], []).append(k)
    workers = sorted({d["node"] for _, d in g.nodes(data=True) if d.get("node")})
    if node is None:
        node = next((w for w in workers if any(nodes[k]["node"] == w for ops in tensors.values() for k in ops)), None)
    if not tensors or node is None:
        raise ValueError("the graph has no gradient bucket (AllReduce collective): DeFT schedules DDP buckets")
    res = replay(g)
    row = {k: i for i, k in enumerate(res.graph.keys)}
    compute = [k for k, d in g.nodes(data=True)
               if d["node"] == node and d.get("device", "").endswith(":compute")]
    compute.sort(key=lambda k: (res.start[row[k]], res.graph.tiebreak[row[k]]))
    pos = {k: i for i, k in enumerate(compute)}
    ready: dict[str, int] = {}
    for t, ops in tensors.items():
        ins = [k for k in ops if nodes[k]["node"] == node and nodes[k]["kind"] == OpKind.VIRTUAL.value
               and any(nodes[u]["node"] == node and u in pos for u in g.predecessors(k))]
        if ins:
            ready[t] = max(pos[u] for k in ins for u in g.predecessors(k) if u in pos)
    if not ready:
        raise ValueError(f"no bucket of {node!r} is fed by its computation: cannot place buckets in its backward pass")
    order = sorted(ready, key=lambda t: (ready[t], t))
    dur = [float(nodes[k].get("dur", 0.0)) for k in compute]
    bw = [nodes[k].get("kind") == OpKind.BW.value for k in compute]
    first_bw = next((i for i, b in enumerate(bw) if b), 0)
    last = ready[order[-1]]
    forward = sum(dur[:first_bw]) + sum(d for d, b in zip(dur[last + 1:], bw[last + 1:]) if not b)
    tail = sum(d for d, b in zip(dur[last + 1:], bw[last + 1:]) if b)
    seg, prev = [], first_bw
    for t in order:
        seg.append(sum(dur[prev:ready[t] + 1]))
        prev = ready[t] + 1
    backward = sum(seg)
    buckets = []
    for t, s in zip(order, seg):
        ops = tensors[t]
        parts = {nodes[k]["node"] for k in ops if nodes[k]["node"]}
        chunk = max((int(nodes[k].get("bytes", 0)) for k in ops if nodes[k]["kind"] == OpKind.SEND.value), default=0)
        buckets.append(Bucket(name=t, bytes=chunk * max(len(parts), 1), backward_us=s,
                              forward_us=forward * s / backward if backward > 0 else forward / len(order),
                              comm_us=_collective_span(g, ops)))
    return BucketTimes(node=node, buckets=buckets, forward_us=forward, backward_us=backward, tail_us=tail)


bucket_times.__doc__ = bucket_times.__doc__.replace("{ref}", _REF)


# --------------------------------------------------------------------------- knapsacks

def knapsack(weights: Sequence[float], capacity: float, *, resolution: float = 1e-6) -> list[int]:
    """Exact 0/1 knapsack with profit = weight (subset sum): the indices of a subset of largest sum <= ``capacity``.

    Dynamic programming over the reachable sums (each sum kept once, with the
    lexicographically smallest index set reaching it, so results are
    deterministic); exact for any real weights, at most ``2**n`` states
    (DeFT's bucket lists are short: "less than 20", §III-C).

    Parameters
    ----------
    weights : sequence of float
        Item weights (communication times, us); negative weights are refused.
    capacity : float
        The knapsack capacity (a stage's computation time, us).
    resolution : float, default 1e-6
        Sums closer than this are the same state (float round-off).

    Returns
    -------
    list of int
        Chosen indices, ascending.

    References
    ----------
    .. [1] {ref}, §III-B, Problem 1 (NaiveKnapsack of Algorithm 1).
    """
    if any(w < 0 for w in weights):
        raise ValueError("knapsack weights must be >= 0")
    states: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for i, w in enumerate(weights):
        if w > capacity + resolution:
            continue
        new = dict(states)
        for s, chosen in states.values():
            t = s + w
            if t <= capacity + resolution:
                key = round(t / resolution)
                cand = (t, chosen + (i,))
                if key not in new or cand[1] < new[key][1]:
                    new[key] = cand
        states = new
    best = max(states.values(), key=lambda v: (v[0], tuple(-i for i in v[1])))
    return list(best[1])


knapsack.__doc__ = knapsack.__doc__.replace("{ref}", _REF)


def greedy_multi_knapsack(weights: Sequence[float], capacities: Sequence[float]) -> list[int]:
    """DeFT's greedy for the 0/1 multi-knapsack: knapsacks by ascending capacity, items by descending weight.

    For each knapsack (smallest capacity first), place every not yet placed item,
    longest first, that still fits.  O(N * M) after sorting.  Not optimal in
    general (a 0/1 multi-knapsack is NP-hard): ``docs/deft.md`` and the tests
    show a case where it is and one where it is not.

    Parameters
    ----------
    weights : sequence of float
        Item weights in reference-link time (us).
    capacities : sequence of float
        Each knapsack's capacity in the same unit.

    Returns
    -------
    list of int
        ``assign[i]`` = the knapsack of item ``i``, or -1 if not placed.

    References
    ----------
    .. [1] {ref}, §III-C, Problem 2 and its greedy strategy.
    """
    assign = [-1] * len(weights)
    items = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    for j in sorted(range(len(capacities)), key=lambda j: (capacities[j], j)):
        room = capacities[j]
        for i in items:
            if assign[i] < 0 and weights[i] <= room + 1e-9:
                assign[i] = j
                room -= weights[i]
    return assign


greedy_multi_knapsack.__doc__ = greedy_multi_knapsack.__doc__.replace("{ref}", _REF)


def exact_multi_knapsack(weights: Sequence[float], capacities: Sequence[float], *, max_items: int = 14) -> list[int]:
    """Optimal 0/1 multi-knapsack (profit = weight) by brute force over all ``(M+1)**N`` assignments.

    For checking the greedy on small cases; ties go to the lexicographically
    smallest assignment vector (unplaced = -1 first).

    Parameters
    ----------
    weights, capacities : sequence of float
        As :func:`greedy_multi_knapsack`.
    max_items : int, default 14
        Refuse larger instances (the enumeration is exponential).

    References
    ----------
    .. [1] {ref}, §III-C, Problem 2.
    """
    n, m = len(weights), len(capacities)
    if n > max_items:
        raise ValueError(f"exact_multi_knapsack enumerates (M+1)^N assignments; N={n} > max_items={max_items}")
    best, best_val = [-1] * n, -1.0
    for assign in itertools.product(range(-1, m), repeat=n):
        load = [0.0] * m
        for i, j in enumerate(assign):
            if j >= 0:
                load[j] += weights[i]
        if any(load[j] > capacities[j] + 1e-9 for j in range(m)):
            continue
        val = sum(load)
        if val > best_val + 1e-9:
            best, best_val = list(assign), val
    return best


exact_multi_knapsack.__doc__ = exact_multi_knapsack.__doc__.replace("{ref}", _REF)


def multi_knapsack(weights: Sequence[float], capacities: Sequence[float], method: str = "greedy") -> list[int]:
    """One stage's placement: exact :func:`knapsack` for one link; for several, ``greedy`` (the paper) or ``exact``.

    Returns ``assign[i]`` = link of item ``i`` or -1 (not placed).
    """
    if len(capacities) == 1:
        chosen = set(knapsack(weights, capacities[0]))
        return [0 if i in chosen else -1 for i in range(len(weights))]
    if method == "exact":
        return exact_multi_knapsack(weights, capacities)
    if method != "greedy":
        raise ValueError(f"unknown multi-knapsack method {method!r}: greedy or exact")
    return greedy_multi_knapsack(weights, capacities)


def _placed(weights: Sequence[float], assign: Sequence[int]) -> float:
    return sum(w for w, j in zip(weights, assign) if j >= 0)


def recursive_knapsack(weights: Sequence[float], backward: Sequence[float], capacities: Sequence[float],
                       speeds: Sequence[float] | None = None, method: str = "greedy") -> list[int]:
    """Algorithm 1 (RecursiveKnapsack) of DeFT: place new buckets (backward-ready order) in the backward stage.

    ``order1`` places the whole list (:func:`multi_knapsack`); ``order2`` drops
    the first-ready bucket and removes its backward computation time from every
    capacity, recursively; the larger placement wins, ``order2`` on a tie (so
    among equally good placements the one that fits in the later, shorter part
    of the backward pass, where more of the chosen buckets are ready, is kept).
    With an exact knapsack ``order1`` is never smaller (more items, more room),
    so the recursion only breaks ties; with the greedy it can win outright.

    Parameters
    ----------
    weights : sequence of float
        Communication times (reference link) of the items, first-ready first.
    backward : sequence of float
        Backward computation time of each item's bucket (same order).
    capacities : sequence of float
        Per link, the capacity in reference-link time.
    speeds : sequence of float or None
        Per link, its speed relative to the reference link (capacity of link ``j``
        shrinks by ``backward * speeds[j]``); None: all 1.
    method : str, default "greedy"
        Several links: ``greedy`` (the paper) or ``exact``.

    Returns
    -------
    list of int
        ``assign[i]`` = link of item ``i`` or -1.

    References
    ----------
    .. [1] {ref}, §III-B, Algorithm 1.  The printed pseudo-code subtracts
           ``T_{{N-1}}`` when dropping ``C_N``; this module subtracts the dropped
           bucket's own backward time ``T_N`` (docs/deft.md).
    """
    n = len(weights)
    if n == 0:
        return []
    speeds = list(speeds) if speeds is not None else [1.0] * len(capacities)
    order1 = multi_knapsack(weights, capacities, method)
    rest = [c - backward[0] * s for c, s in zip(capacities, speeds)]
    if any(c >= 0 for c in rest):
        sub = recursive_knapsack(weights[1:], backward[1:], [max(c, 0.0) for c in rest], speeds, method)
        order2 = [-1] + sub
    else:
        order2 = [-1] * n
    return order1 if _placed(weights, order1) > _placed(weights, order2) + 1e-9 else order2


recursive_knapsack.__doc__ = recursive_knapsack.__doc__.replace("{ref}", _REF)


def link_speeds(rates: Sequence[float]) -> list[float]:
    """Per link, its speed relative to link 0 (``rates[j] / rates[0]``); DeFT's ``1/mu`` for the slower link.

    A bucket of ``c`` us on link 0 takes ``c / speed`` on link ``j``, so a stage of
    ``T`` us holds ``T * speed`` us of link-0 communication on link ``j``.
    """
    if not rates or any(r <= 0 for r in rates):
        raise ValueError(f"link rates must be > 0, got {list(rates)}")
    return [float(r) / float(rates[0]) for r in rates]


def partition_counts(times: BucketTimes, speeds: Sequence[float] = (1.0,)) -> dict[str, int]:
    """DeFT §III-D: into how many equal parts each bucket must be split so that it fits the smallest knapsack.

    The smallest knapsack is the shorter stage on the slowest link:
    ``cap = min(T_forward, T_backward) * min(speeds)``; a bucket of ``c`` us
    needs ``ceil(c / cap)`` parts (1 if it already fits).  DeFT first partitions
    as ByteScheduler / US-Byte do and then enforces this constraint; the first
    two steps are the optimizer's partition passes (:mod:`dpro_kit.optimize.passes`).

    References
    ----------
    .. [1] {ref}, §III-D (tensor partition with the largest bucket below the smallest capacity).
    """
    cap = min(times.forward_us, times.backward_us) * min(speeds)
    if cap <= 0:
        raise ValueError("a stage has no computation time: no knapsack can hold a bucket")
    return {b.name: max(1, math.ceil(b.comm_us / cap - 1e-9)) for b in times.buckets}


partition_counts.__doc__ = partition_counts.__doc__.replace("{ref}", _REF)


def partitioned(times: BucketTimes, counts: dict[str, int]) -> BucketTimes:
    """``times`` with bucket ``b`` split into ``counts[b]`` equal parts (``b.p0``, ``b.p1``, ...).

    Each part has ``1/count`` of the bucket's bytes, communication and forward
    time; the bucket's backward time stays on its first part (all parts become
    ready together, when the bucket's last gradient is computed).
    """
    out = []
    for b in times.buckets:
        k = int(counts.get(b.name, 1))
        if k <= 1:
            out.append(b)
            continue
        out.extend(Bucket(name=f"{b.name}.p{p}", bytes=b.bytes // k, backward_us=b.backward_us if p == 0 else 0.0,
                          forward_us=b.forward_us / k, comm_us=b.comm_us / k, tensor=b.graph_tensor,
                          fraction=b.fraction / k) for p in range(k))
    return BucketTimes(node=times.node, buckets=out, forward_us=times.forward_us, backward_us=times.backward_us,
                       tail_us=times.tail_us)


# --------------------------------------------------------------------------- the two-stage schedule

@dataclass(frozen=True)
class Item:
    """A queued synchronisation: bucket index ``bucket`` holding the (summed) gradients of ``iterations``."""

    bucket: int
    iterations: tuple[int, ...]


@dataclass
class Stage:
    """What one stage (``forward`` or ``backward``) of one iteration synchronises: ``(item, link)`` pairs."""

    name: str
    case: int
    capacity_us: list[float]
    placed: list[tuple[Item, int]] = field(default_factory=list)


@dataclass
class Step:
    """One iteration of the schedule: its two stages and the iterations whose gradients are applied at its end."""

    iteration: int
    forward: Stage
    backward: Stage
    updates: list[tuple[int, ...]] = field(default_factory=list)
    current: list[Item] = field(default_factory=list)   # the queues after the iteration
    future: list[Item] = field(default_factory=list)


@dataclass
class Schedule:
    """The DeFT schedule of a job, iteration by iteration, and its steady-state period.

    ``steps[period_start:]`` repeats with period ``period`` (the queues' state,
    relative to the iteration number, recurs); ``period`` is 0 when no state
    recurred within the simulated iterations.
    """

    times: BucketTimes
    rates: list[float]
    steps: list[Step]
    period_start: int
    period: int

    def steady(self) -> list[Step]:
        return self.steps[self.period_start:self.period_start + self.period] if self.period else self.steps[-1:]

    @property
    def update_frequency(self) -> float:
        """Parameter updates per iteration in the steady state (1.0 = synchronous DDP)."""
        st = self.steady()
        return sum(len(s.updates) for s in st) / len(st)

    def batch_sequence(self) -> list[int]:
        """DeFT §IV-C1: the steady state's updates as multiples ``k_i`` of the batch size (sum = period)."""
        return [len(u) for s in self.steady() for u in s.updates]

    def delays(self) -> dict[str, float]:
        """Per bucket, the mean number of iterations between its gradient's backward and its synchronisation.

        0: synchronised in its own iteration's backward stage; 1: in the next
        iteration (its forward or backward stage), ... (merged items count from
        their oldest iteration).  Steady state only.
        """
        out: dict[int, list[int]] = {}
        for s in self.steady():
            for stage, extra in ((s.forward, 0), (s.backward, 0)):
                for item, _ in stage.placed:
                    out.setdefault(item.bucket, []).append(s.iteration - min(item.iterations) + extra)
        return {self.times.buckets[b].name: sum(v) / len(v) for b, v in sorted(out.items())}

    def link_load_us(self) -> list[float]:
        """Per link, the steady state's communication per iteration (us on that link)."""
        speeds = link_speeds(self.rates)
        load = [0.0] * len(self.rates)
        st = self.steady()
        for s in st:
            for stage in (s.forward, s.backward):
                for item, j in stage.placed:
                    load[j] += self.times.buckets[item.bucket].comm_us / speeds[j]
        return [x / len(st) for x in load]

    def to_json(self) -> dict[str, Any]:
        def stage(st: Stage) -> dict[str, Any]:
            return {"case": st.case, "capacity_us": st.capacity_us,
                    "placed": [{"bucket": self.times.buckets[i.bucket].name, "iterations": list(i.iterations),
                                "link": j} for i, j in st.placed]}
        return {"rates": self.rates, "period_start": self.period_start, "period": self.period,
                "update_frequency": self.update_frequency, "batch_sequence": self.batch_sequence(),
                "delays": self.delays(), "link_load_us": self.link_load_us(), "times": self.times.to_json(),
                "steps": [{"iteration": s.iteration, "forward": stage(s.forward), "backward": stage(s.backward),
                           "updates": [list(u) for u in s.updates]} for s in self.steps]}


def _merge(queue: list[Item], new: Iterable[Item]) -> list[Item]:
    """Queue ``new`` into ``queue``, summing an item into the queued one of the same bucket (gradient accumulation)."""
    by = {it.bucket: it for it in queue}
    for it in new:
        old = by.get(it.bucket)
        by[it.bucket] = Item(it.bucket, tuple(sorted(set(old.iterations) | set(it.iterations)))) if old else it
    return [by[b] for b in sorted(by)]


def schedule(times: BucketTimes, rates: Sequence[float] = (1.0,), *, iterations: int = 64,
             method: str = "greedy", capacity_scale: float = 1.0, partition: bool = True) -> Schedule:
    """DeFT's two-stage schedule (Algorithm 2, as §III-B's four cases describe it), iteration by iteration.

    State: the *current* queue (buckets of older iterations still to synchronise)
    and the *future* queue (newer buckets waiting for the current queue to
    empty; a bucket queued twice is merged, i.e. its gradients are summed and
    synchronised once).  Each iteration:

    * **forward stage, Case 1**: knapsack of the current queue, capacity = the
      forward stage's time (per link, scaled by its speed);
    * **backward stage**, the iteration's new buckets arrive:

      - **Case 2** (current queue not empty and the backward capacity cannot
        hold all of it): knapsack of the current queue; the new buckets merge
        into the future queue;
      - **Case 3** (current queue not empty and it fits): all of it is
        synchronised; the new buckets merge into the future queue; Algorithm 1
        (:func:`recursive_knapsack`) on the future queue with the remaining
        capacity; what is left of the future queue becomes the current queue;
      - **Case 4** (current queue empty): the new buckets merge with the future
        queue; Algorithm 1 on them; what is left becomes the current queue;

    * **update**: at the end of the iteration, the gradients of every iteration
      all of whose buckets are now synchronised are applied (several iterations
      at once when they were merged: a larger batch, §IV-C1).

    Parameters
    ----------
    times : BucketTimes
        From :func:`bucket_times` (or built by hand).
    rates : sequence of float, default (1.0,)
        Link rates (any unit; link 0 is the one ``comm_us`` was measured on).
    iterations : int, default 64
        Iterations to simulate; the steady state is found by the queue state recurring.
    method : str, default "greedy"
        Multi-link placement: ``greedy`` (the paper) or ``exact``.
    capacity_scale : float, default 1.0
        Multiply every capacity (the Preserver's knob, §IV-C3: a larger capacity
        synchronises more per iteration, fewer delayed and merged updates).
    partition : bool, default True
        First split every bucket that does not fit the smallest knapsack
        (:func:`partition_counts`, §III-D); the schedule's ``times`` are then the
        partitioned ones.  With False, a bucket that fits no knapsack raises ValueError.

    References
    ----------
    .. [1] {ref}, §III-B (Problem 1, Algorithm 1, the four cases, Fig. 4), §III-C (Problem 2).
    """
    speeds = link_speeds(rates)
    if partition:
        scaled = BucketTimes(times.node, times.buckets, times.forward_us * capacity_scale,
                             times.backward_us * capacity_scale, times.tail_us)
        times = partitioned(times, partition_counts(scaled, speeds))
    biggest = max(max(times.forward_us, times.backward_us) * capacity_scale * s for s in speeds)
    too_big = [b for b in times.buckets if b.comm_us > biggest + 1e-9]
    if too_big:
        raise ValueError(f"bucket {too_big[0].name} ({too_big[0].comm_us:.0f} us) fits no knapsack "
                         f"(largest capacity {biggest:.0f} us): partition it (partition=True, DeFT §III-D)")
    n = len(times.buckets)
    comm = [b.comm_us for b in times.buckets]
    bwd = [b.backward_us for b in times.buckets]
    cap_f = [times.forward_us * capacity_scale * s for s in speeds]
    cap_b = [times.backward_us * capacity_scale * s for s in speeds]
    current: list[Item] = []
    future: list[Item] = []
    synced: dict[int, set[int]] = {}      # iteration -> buckets synchronised
    applied: set[int] = set()
    steps: list[Step] = []
    seen: dict[tuple, int] = {}
    period_start = period = 0

    parent: dict[int, int] = {}           # union-find: iterations merged into one update

    def sync(item: Item) -> None:
        for it in item.iterations:
            synced.setdefault(it, set()).add(item.bucket)
            parent.setdefault(it, it)
            a, b = _find(parent, it), _find(parent, item.iterations[0])
            if a != b:
                parent[max(a, b)] = min(a, b)

    for i in range(iterations):
        # forward stage (Case 1)
        fwd = Stage("forward", 1 if current else 0, list(cap_f))
        if current:
            assign = multi_knapsack([comm[it.bucket] for it in current], cap_f, method)
            fwd.placed = [(it, j) for it, j in zip(current, assign) if j >= 0]
            current = [it for it, j in zip(current, assign) if j < 0]
        for it, _ in fwd.placed:
            sync(it)
        new = [Item(b, (i,)) for b in range(n)]
        bwd_stage = Stage("backward", 0, list(cap_b))
        if current:
            assign = multi_knapsack([comm[it.bucket] for it in current], cap_b, method)
            if any(j < 0 for j in assign):                        # Case 2
                bwd_stage.case = 2
                bwd_stage.placed = [(it, j) for it, j in zip(current, assign) if j >= 0]
                current = [it for it, j in zip(current, assign) if j < 0]
                future = _merge(future, new)
            else:                                                  # Case 3
                bwd_stage.case = 3
                bwd_stage.placed = list(zip(current, assign))
                room = list(cap_b)
                for it, j in bwd_stage.placed:
                    room[j] -= comm[it.bucket]
                future = _merge(future, new)
                a2 = recursive_knapsack([comm[it.bucket] for it in future], [bwd[it.bucket] for it in future],
                                        room, speeds, method)
                bwd_stage.placed += [(it, j) for it, j in zip(future, a2) if j >= 0]
                current = [it for it, j in zip(future, a2) if j < 0]
                future = []
        else:                                                      # Case 4
            bwd_stage.case = 4
            items = _merge(future, new)
            a2 = recursive_knapsack([comm[it.bucket] for it in items], [bwd[it.bucket] for it in items],
                                    cap_b, speeds, method)
            bwd_stage.placed = [(it, j) for it, j in zip(items, a2) if j >= 0]
            current = [it for it, j in zip(items, a2) if j < 0]
            future = []
        for it, _ in bwd_stage.placed:
            sync(it)
        # update: every merged group (iterations summed into one item) whose iterations are all synchronised
        groups: list[tuple[int, ...]] = []
        for root in sorted({_find(parent, k) for k in synced if k not in applied}):
            members = sorted(k for k in parent if _find(parent, k) == root and k not in applied)
            if all(len(synced.get(k, ())) == n for k in members):
                applied.update(members)
                groups.append(tuple(members))
        steps.append(Step(i, fwd, bwd_stage, groups, list(current), list(future)))
        key = (tuple((it.bucket, tuple(i - x for x in it.iterations)) for it in current),
               tuple((it.bucket, tuple(i - x for x in it.iterations)) for it in future),
               tuple(sorted((i - k, i - _find(parent, k)) for k in synced if k not in applied)))
        if key in seen and not period:
            period_start, period = seen[key] + 1, i - seen[key]
            break
        seen[key] = i
    return Schedule(times=times, rates=list(map(float, rates)), steps=steps, period_start=period_start,
                    period=period)


def _find(parent: dict[int, int], k: int) -> int:
    while parent[k] != k:
        k = parent[k]
    return k


schedule.__doc__ = schedule.__doc__.replace("{ref}", _REF)


# --------------------------------------------------------------------------- replay of a schedule

@dataclass(frozen=True)
class Sync:
    """One synchronisation of a replayed period of iterations (``docs/deft.md`` §7).

    ``tensor`` is the graph's tensor (bucket), ``fraction`` the share of its
    collective (a part of a partitioned bucket), ``link`` the link index; it is
    planned in iteration ``at`` (``stage`` 0: forward, 1: backward); it waits for
    the backward op that makes the tensor ready in iteration ``ready`` (``<= at``;
    negative: a previous period) and the optimizer update at the end of
    iteration ``update`` (``>= at``) waits for it.
    """

    tensor: str
    fraction: float
    link: int
    at: int
    stage: int
    ready: int
    update: int


def _comm_ops(g: "nx.DiGraph") -> dict[str, str]:
    from ..trace import OpKind
    kinds = (OpKind.SEND.value, OpKind.RECV.value, OpKind.VIRTUAL.value)
    return {k: d["tensor"] for k, d in g.nodes(data=True) if d.get("tensor") and d.get("kind") in kinds}


def synchronous_syncs(g: "nx.DiGraph") -> list[Sync]:
    """Stock DDP as syncs: every bucket whole, on link 0, in its own backward, applied in its own iteration."""
    return [Sync(t, 1.0, 0, 0, 1, 0, 0) for t in sorted(set(_comm_ops(g).values()))]


def delayed_syncs(g: "nx.DiGraph", delays: dict[str, int], links: dict[str, int] | None = None) -> list[Sync]:
    """Fixed per-bucket delays (period 1): bucket ``t`` of iteration ``i`` is synchronised during iteration
    ``i + delays[t]`` and applied at its end (delay 0: stock DDP); ``links[t]``: its link (default 0).

    Every sync has stage 1 (backward), delayed or not: the DDP hook (``dpro_torch.deft``) launches each
    bucket's all-reduce the moment DDP finds it ready and only waits for it ``delays[t]`` iterations
    later, so a link runs the collectives in launch order (equal priorities: FIFO by ready time,
    docs/deft.md §7).  A smaller priority for the delayed ones would let iteration ``i``'s delayed
    bucket jump the queue ahead of the all-gather half of iteration ``i``'s synchronous bucket on a
    shared link (every unrolled copy has the same priorities) - the order a real gloo queue never runs.
    """
    links = links or {}
    out = []
    for t in sorted(set(_comm_ops(g).values())):
        d = int(delays.get(t, 0))
        if d < 0:
            raise ValueError(f"delay of {t} must be >= 0, got {d}")
        out.append(Sync(t, 1.0, int(links.get(t, 0)), 0, 1, -d, 0))
    return out


def link_assignment(times: BucketTimes, rates: Sequence[float] = (1.0,)) -> dict[str, int]:
    """Buckets over links for the fixed delay: longest-processing-time first, each bucket to the link where it ends first.

    Bucket ``k`` takes ``c_k / s_j`` on link ``j`` (:func:`link_speeds`); buckets by ``c_k`` descending
    (ties: backward-ready order), each to the link minimising ``load_j + c_k / s_j`` (ties: the lower
    link).  Minimises the busiest link's load per iteration (the delay-one iteration's bound when the
    links bound it) greedily, as DeFT's multi-knapsack (§III-C) does for its capacities.  Returns
    ``{bucket name: link}``.
    """
    speeds = link_speeds(rates)
    load = [0.0] * len(speeds)
    out: dict[str, int] = {}
    for b in sorted(times.buckets, key=lambda b: -b.comm_us):
        j = min(range(len(speeds)), key=lambda j: (load[j] + b.comm_us / speeds[j], j))
        load[j] += b.comm_us / speeds[j]
        out[b.name] = j
    return out


def schedule_syncs(sched: Schedule) -> tuple[list[Sync], int]:
    """The steady state of a :func:`schedule` as syncs, and its period.

    Each item placed in a steady iteration becomes a sync of its bucket's tensor
    (fraction of a partitioned one, its link); it waits for the newest iteration
    it holds and is applied at the end of the iteration that updates its group
    (found in the simulated steps, or one period earlier shifted by the period).
    """
    if not sched.period:
        raise ValueError("the schedule found no steady state; simulate more iterations")
    ps, period = sched.period_start, sched.period
    applied: dict[int, int] = {}
    for st in sched.steps:
        for grp in st.updates:
            for it in grp:
                applied[it] = st.iteration

    def applied_at(it: int) -> int:
        shift = 0
        while it not in applied:
            it -= period
            shift += period
            if it < 0:
                raise ValueError("a synchronised gradient is never applied in the simulated steps")
        return applied[it] + shift

    out = []
    for st in sched.steps[ps:ps + period]:
        for stage_no, stage in ((0, st.forward), (1, st.backward)):
            for item, link in stage.placed:
                b = sched.times.buckets[item.bucket]
                out.append(Sync(b.graph_tensor, b.fraction, link, st.iteration - ps, stage_no,
                                max(item.iterations) - ps, applied_at(min(item.iterations)) - ps))
    return out, period


@dataclass
class DeftReplay:
    """A replayed period of syncs: the steady iteration time and what bounds it."""

    iteration_us: float
    period: int                 # iterations per replayed copy (the schedule's period times k)
    copies: int                 # copies replayed back to back
    pattern: int                # copies after which the gaps between copies repeat (0: none found)
    lower_bound_us: float       # max over devices of its busy time per iteration
    busiest_device: str
    graph: "nx.DiGraph"
    result: Any

    def to_json(self) -> dict[str, Any]:
        return {"iteration_ms": self.iteration_us / 1e3, "period": self.period, "copies": self.copies,
                "pattern": self.pattern,
                "lower_bound_ms": self.lower_bound_us / 1e3, "busiest_device": self.busiest_device}


def period_graph(g: "nx.DiGraph", syncs: Sequence[Sync], period: int, rates: Sequence[float] = (1.0,)
                 ) -> tuple["nx.DiGraph", int]:
    """The DFG of ``L`` iterations with the syncs' collectives, and ``L`` (a multiple of ``period``).

    ``L`` copies of ``g``'s computation (ops keyed ``<op>@<t>``), joined as
    ``g``'s iteration edges join iterations; for every sync of iteration ``t`` a
    copy of its tensor's collective (``<op>@<t>#<n>``) with durations times
    ``fraction / speed`` of its link, on the link's own devices (``<device>#link<j>``
    for ``j >= 1``: a second NIC per host), its ``In`` after the ready op of
    iteration ``ready``, its ``Out`` before the update op of iteration
    ``update``.  Dependencies that reach the previous / next copy become the
    graph's ``iteration_edges``; ``L`` is the smallest multiple of ``period``
    for which every one reaches at most one copy away.  With
    :func:`synchronous_syncs` and period 1 the graph is ``g`` (op keys renamed).
    """
    import networkx as nx
    speeds = link_speeds(rates)
    for s in syncs:
        if not (s.ready <= s.at <= s.update) or not (0 <= s.at < period):
            raise ValueError(f"sync {s}: needs ready <= at <= update and 0 <= at < period {period}")
        if s.link >= len(speeds):
            raise ValueError(f"sync {s} uses link {s.link}; only {len(speeds)} link rate(s) given")
    k = max([1] + [math.ceil(-s.ready / period) for s in syncs] + [math.ceil((s.update + 1) / period) - 1
                                                                 for s in syncs])
    L = k * period
    by_at: dict[int, list[tuple[int, Sync]]] = {}
    n = 0
    for m in range(k):
        for s in syncs:
            e = Sync(s.tensor, s.fraction, s.link, s.at + m * period, s.stage, s.ready + m * period,
                     s.update + m * period)
            by_at.setdefault(e.at, []).append((n, e))
            n += 1
    comm = _comm_ops(g)
    prio0 = min((2 * s.at + s.stage for s in syncs), default=0)
    h = nx.DiGraph()
    h.graph.update({k_: v for k_, v in g.graph.items() if k_ != "iteration_edges"})
    for t in range(L):
        for key, d in g.nodes(data=True):
            if key not in comm:
                h.add_node(f"{key}@{t}", **d)
                continue
            for idx, s in by_at.get(t, []):
                if s.tensor != comm[key]:
                    continue
                a = dict(d)
                a["dur"] = float(d.get("dur", 0.0)) * s.fraction / speeds[s.link]
                if s.link and a.get("device"):
                    a["device"] = f"{a['device']}#link{s.link}"
                a["priority"] = float(d.get("priority", 0.0)) + 2 * s.at + s.stage - prio0
                h.add_node(f"{key}@{t}#{idx}", **a)
    lagged: list[tuple[str, str]] = []
    for t in range(L):
        for u, v in g.edges():
            cu, cv = u in comm, v in comm
            if not cu and not cv:
                h.add_edge(f"{u}@{t}", f"{v}@{t}")
            elif cu and cv:
                for idx, s in by_at.get(t, []):
                    if s.tensor == comm[u] == comm[v]:
                        h.add_edge(f"{u}@{t}#{idx}", f"{v}@{t}#{idx}")
            elif cv:       # ready op -> In: the sync's ready iteration
                for idx, s in by_at.get(t, []):
                    if s.tensor != comm[v]:
                        continue
                    if s.ready >= 0:
                        h.add_edge(f"{u}@{s.ready}", f"{v}@{t}#{idx}")
                    else:
                        lagged.append((f"{u}@{s.ready + L}", f"{v}@{t}#{idx}"))
            else:          # Out -> update op: the sync's update iteration
                for idx, s in by_at.get(t, []):
                    if s.tensor != comm[u]:
                        continue
                    if s.update < L:
                        h.add_edge(f"{u}@{t}#{idx}", f"{v}@{s.update}")
                    else:
                        lagged.append((f"{u}@{t}#{idx}", f"{v}@{s.update - L}"))
    for u, v in g.graph.get("iteration_edges", []):
        for t in range(L - 1):
            h.add_edge(f"{u}@{t}", f"{v}@{t + 1}")
    h.graph["iteration_edges"] = [(f"{u}@{L - 1}", f"{v}@0") for u, v in g.graph.get("iteration_edges", [])] + lagged
    return h, L


def _steady_gap(ends: Any) -> tuple[float, int]:
    """Mean gap per copy over the shortest pattern ``q`` the last gaps repeat with (``d[i] == d[i-q]`` for the
    last half of the gaps and at least ``2q`` of them, to 1e-9 relative); no pattern: the mean over the second
    half, ``q = 0``."""
    import numpy as np
    d = np.diff(np.asarray(ends, dtype=float))
    if d.size == 0:
        return float(ends[-1]) if len(ends) else 0.0, 0
    tol = 1e-9 * max(float(np.abs(d).max()), 1.0)
    for q in range(1, d.size // 3 + 1):
        tail = d[-max(3 * q, d.size // 2):]
        if np.all(np.abs(tail[q:] - tail[:-q]) <= tol):
            return float(d[-q:].mean()), q
    return float(d[(d.size - 1) // 2:].mean()), 0


def replay_syncs(g: "nx.DiGraph", syncs: Sequence[Sync], period: int = 1, rates: Sequence[float] = (1.0,), *,
                 iterations: int = 48) -> DeftReplay:
    """Replay ``syncs`` (a period of delayed, merged, multi-link synchronisations) to its steady state.

    Builds :func:`period_graph` and replays at least 8 copies and at least
    ``iterations`` iterations back to back.  The gaps between the ends of
    consecutive copies' computation (a copy's syncs may end in the next one)
    become periodic (a replay is a max-plus linear system), but not necessarily
    constant: a delayed schedule can alternate between building and draining a
    backlog on a link.  The iteration time is the mean gap over the last
    repeating pattern of gaps (:func:`_steady_gap`; the last copy left out: the
    delayed syncs that would compete with it belong to a copy not replayed),
    divided by the iterations per copy.  The
    lower bound is the busiest device's time per iteration (each device runs one
    op at a time, so no schedule beats it).

    Parameters
    ----------
    g : networkx.DiGraph
        The job's one-iteration global DFG (``Session(trace).graph``).
    syncs : sequence of Sync
        :func:`schedule_syncs`, :func:`delayed_syncs` or :func:`synchronous_syncs`.
    period : int, default 1
        Iterations the syncs span.
    rates : sequence of float, default (1.0,)
        Link rates, link 0 the one ``g`` was built for.
    iterations : int, default 48
        At least this many iterations are replayed.

    References
    ----------
    .. [1] {ref}, §III-A (delayed updates), §III-C (concurrent links).
    .. [2] Hu et al., "dPRO", MLSys 2022, §4.3 (replayer) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    from ..replay import replay
    h, L = period_graph(g, syncs, period, rates)
    copies = max(8, math.ceil(iterations / L))
    res = replay(h, iterations=copies)
    n = res.n
    import numpy as np
    own = np.array(["#" not in k for k in res.graph.keys])    # the copies' computation, not their syncs
    ends = np.array([float(res.end[i * n:(i + 1) * n][own].max(initial=0.0)) for i in range(copies)])
    # the last copy is left out: the syncs of the copy after it (a delayed bucket of its own iterations)
    # are not replayed, so nothing competes with its own syncs on a shared link and it ends early
    steady, pattern = _steady_gap(ends[:-1])
    busy: dict[str, float] = {}
    for _, d in h.nodes(data=True):
        if d.get("device"):
            busy[d["device"]] = busy.get(d["device"], 0.0) + float(d.get("dur", 0.0))
    dev = max(busy, key=lambda x: (busy[x], x)) if busy else ""
    return DeftReplay(iteration_us=steady / L, period=L, copies=copies, pattern=pattern,
                      lower_bound_us=busy.get(dev, 0.0) / L, busiest_device=dev, graph=h, result=res)


replay_syncs.__doc__ = replay_syncs.__doc__.replace("{ref}", _REF)


def predict(g: "nx.DiGraph", rates: Sequence[float] = (1.0,), *, method: str = "greedy",
            iterations: int = 48, defer: Sequence[str] = ()) -> dict[str, Any]:
    """What ``dpro replay --deft`` reports: the DeFT schedule of ``g`` and its replayed steady iteration time.

    Three replays with the same steady-state measure (:func:`replay_syncs`):
    stock DDP (:func:`synchronous_syncs`), every bucket delayed by one iteration
    on link 0 (:func:`delayed_syncs`) and the DeFT schedule (:func:`schedule`
    over ``rates``, :func:`schedule_syncs`); with several links two more on the
    links of :func:`link_assignment`: ``delay_one_links``, every bucket delayed by
    one (``train.py --deft-defer all --deft-link1 K,...``), and
    ``synchronous_links``, no delay (``train.py --deft-link1 K,...``: stock DDP's
    gradients, the Preserver's delay 0, only the second link added).

    Parameters
    ----------
    g : networkx.DiGraph
        The job's one-iteration global DFG, link 0 at ``rates[0]``.
    rates : sequence of float, default (1.0,)
        Link rates (link 0 first; only their ratios matter here).
    method : str, default "greedy"
        Multi-link placement of :func:`schedule`.
    iterations : int, default 48
        Iterations replayed (at least).
    defer : sequence of str, default ()
        Buckets (``bucket<k>``) for a partial delay: ``partial_delay`` replays only these one
        iteration late, the others synchronous, on link 0 and (several links) over the links of
        :func:`link_assignment` (``train.py --deft-defer K,.. [--deft-link1 ..]``; the Preserver's
        per-bucket fallback, docs/deft.md §9).

    References
    ----------
    .. [1] {ref}.
    """
    times = bucket_times(g)
    sched = schedule(times, rates, method=method)
    syncs, period = schedule_syncs(sched)
    tensors = sorted(set(_comm_ops(g).values()))
    base = replay_syncs(g, synchronous_syncs(g), 1, iterations=iterations)
    late = replay_syncs(g, delayed_syncs(g, {t: 1 for t in tensors}), 1, iterations=iterations)
    pred = replay_syncs(g, syncs, period, rates, iterations=iterations)
    steady = sched.steady()
    links: dict[str, Any] = {}
    if len(rates) > 1:   # the fixed delay with the buckets spread over the links (dpro_torch.deft links=)
        assign = link_assignment(times, rates)
        on = {b.graph_tensor: assign[b.name] for b in times.buckets}
        late_l = replay_syncs(g, delayed_syncs(g, {t: 1 for t in tensors}, on), 1, rates, iterations=iterations)
        sync_l = replay_syncs(g, delayed_syncs(g, {}, on), 1, rates, iterations=iterations)
        links = {"delay_one_links": {**late_l.to_json(), "assignment": assign},
                 "synchronous_links": {**sync_l.to_json(), "assignment": assign}}
    if defer:
        names = {b.name: b.graph_tensor for b in times.buckets}
        unknown = sorted(set(defer) - set(names))
        if unknown:
            raise ValueError(f"no bucket {', '.join(unknown)} in the trace (it has {', '.join(sorted(names))})")
        late_p = {names[n]: 1 for n in defer}
        part: dict[str, Any] = {"defer": sorted(defer),
                                "one_link": replay_syncs(g, delayed_syncs(g, late_p), 1, iterations=iterations).to_json()}
        if len(rates) > 1:
            assign = link_assignment(times, rates)
            part["links"] = replay_syncs(g, delayed_syncs(g, late_p, {names[n]: j for n, j in assign.items()}), 1,
                                         rates, iterations=iterations).to_json()
        links["partial_delay"] = part
    return {
        "rates": list(map(float, rates)), "coverage_rate": times.coverage_rate,
        "forward_ms": times.forward_us / 1e3, "backward_ms": times.backward_us / 1e3,
        "buckets": [{"name": b.name, "bytes": int(b.bytes), "backward_ms": b.backward_us / 1e3,
                     "comm_ms": b.comm_us / 1e3} for b in times.buckets],
        "parts": len(sched.times.buckets), "period": sched.period, "update_frequency": sched.update_frequency,
        "batch_sequence": sched.batch_sequence(), "delays": sched.delays(), "fixed_delays": fixed_delays(sched),
        "lowering_order": lowering_order(times), "link_load_ms":
            [x / 1e3 for x in sched.link_load_us()],
        "steady_steps": [{"iteration": s.iteration, "forward_case": s.forward.case,
                          "backward_case": s.backward.case,
                          "forward": [(sched.times.buckets[i.bucket].name, list(i.iterations), j)
                                      for i, j in s.forward.placed],
                          "backward": [(sched.times.buckets[i.bucket].name, list(i.iterations), j)
                                       for i, j in s.backward.placed],
                          "updates": [list(u) for u in s.updates]} for s in steady],
        "synchronous": base.to_json(), "delay_one": late.to_json(), "deft": pred.to_json(), **links,
        "speedup": base.iteration_us / pred.iteration_us if pred.iteration_us > 0 else math.inf,
    }


predict.__doc__ = predict.__doc__.replace("{ref}", _REF)


# --------------------------------------------------------------------------- the Preserver (§IV-C)

def expected_next_loss(s: float, mu: float, sigma: float, batch: float, lr: float, target: float = 0.0,
                       k: int = 1) -> float:
    """Expected loss after one update in the Gaussian walk with rebound of Yin et al. (DeFT §IV-C2, Eq. 1).

    One update moves the loss by ``lr * D``, rebounding at the objective value
    ``S*`` (``target``): ``s' - S* = |s - S* - lr * D|``.  For an update that
    applies the summed gradients of ``k`` iterations of batch ``B``,
    ``D ~ N(k mu, k sigma^2 / B)`` (**choice**: summed, as DeFT's reducer merges
    buckets; with ``k = 1`` this is the paper's formula).  With
    ``m = s - S* - lr k mu`` and ``sd = lr sigma sqrt(k / B)``, ``a = m / sd``::

        E[s'] = m (Phi(a) - Phi(-a)) + sd sqrt(2/pi) exp(-a^2 / 2) + S*

    (the mean of a folded normal).  ``sigma = 0``: ``|m| + S*``.

    Parameters
    ----------
    s : float
        The loss now (``s_t``).
    mu, sigma : float
        Mean and standard deviation (per sample) of the loss decrease per unit learning rate.
    batch : float
        The batch size ``B`` of one iteration.
    lr : float
        The learning rate ``eta``.
    target : float, default 0.0
        The objective value ``S*``.
    k : int, default 1
        Iterations whose gradients the update sums.

    References
    ----------
    .. [1] {ref}, §IV-C2.
    .. [2] Yin, Luo and Nakamura, "Small Batch or Large Batch? Gaussian Walk with Rebound Can Teach",
           KDD 2017.
    """
    m = s - target - lr * k * mu
    sd = lr * sigma * math.sqrt(k / batch)
    if sd <= 0:
        return abs(m) + target
    a = m / sd
    phi = 0.5 * (1 + math.erf(a / math.sqrt(2)))
    return m * (2 * phi - 1) + sd * math.sqrt(2 / math.pi) * math.exp(-a * a / 2) + target


expected_next_loss.__doc__ = expected_next_loss.__doc__.replace("{ref}", _REF)


def loss_ratio(batch_sequence: Sequence[int], s0: float, mu: float, sigma: float, batch: float, lr: float,
               target: float = 0.0) -> float:
    """DeFT's convergence check (§IV-C2): ``E[O_B] / E[O_D]`` over one period of ``N = sum(k_i)`` iterations.

    ``O_B``: ``N`` updates of batch ``B``; ``O_D``: one update per ``k_i`` of the
    schedule's batch sequence (:meth:`Schedule.batch_sequence`), each summing
    ``k_i`` iterations; both from the loss ``s0`` through :func:`expected_next_loss`.
    1.0: the schedule converges as synchronous training does (in expectation).
    """
    n = int(sum(batch_sequence))
    if n <= 0 or any(k <= 0 for k in batch_sequence):
        raise ValueError(f"a batch sequence is positive integers, got {list(batch_sequence)}")
    sb = s0
    for _ in range(n):
        sb = expected_next_loss(sb, mu, sigma, batch, lr, target)
    sd = s0
    for k in batch_sequence:
        sd = expected_next_loss(sd, mu, sigma, batch, lr, target, k=int(k))
    return sb / sd if sd else (1.0 if sb == 0 else math.inf)


def walk_statistics(curve: Sequence[float], lr: float, batch: float, steps: int = 20) -> tuple[float, float, float]:
    """``(s0, mu, sigma)`` of the Gaussian walk (:func:`expected_next_loss`) from a synchronous run's loss curve.

    The walk moves the loss by ``lr * D`` per update with ``D ~ N(mu, sigma^2 / B)``, so over the
    first ``steps`` updates ``D_t = (s_t - s_{t+1}) / lr``: ``mu = mean(D_t)``, ``sigma =
    stdev(D_t) * sqrt(B)``, ``s0 = s_0`` (``B``: the global batch of one update).  **choice**: the
    curve is the per-step training loss, each on a new mini-batch, so ``stdev(D_t)`` also holds the
    mini-batch loss noise (an over-estimate of the step's own noise).
    """
    if steps < 2 or len(curve) < steps + 1:
        raise ValueError(f"need at least {steps + 1} losses (steps >= 2), got {len(curve)}")
    d = [(curve[t] - curve[t + 1]) / lr for t in range(steps)]
    mean = sum(d) / steps
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (steps - 1))
    return float(curve[0]), mean, sd * math.sqrt(batch)


def measured_loss_ratio(sync: Sequence[float], other: Sequence[float], last: int = 10) -> float:
    """The Preserver's ratio measured on real training: ``mean(sync[-last:]) / mean(other[-last:])``.

    ``E[O_B] / E[O_D]`` of :func:`loss_ratio` with the expectations replaced by the final losses of
    two runs with the same seed and data (synchronous DDP and the schedule), each the mean of its
    last ``last`` steps (one step's loss is one mini-batch's).  Within ``[1 - eps, 1 + eps]``: keep
    the schedule; else lower the delay (DeFT §IV-C3).
    """
    if last < 1 or len(sync) < last or len(other) < last:
        raise ValueError(f"need at least {last} losses in both curves")
    a, b = sum(sync[-last:]) / last, sum(other[-last:]) / last
    return a / b if b else math.inf


def fixed_delays(sched: Schedule) -> dict[str, int]:
    """The DeFT schedule's delays in the form the DDP hook runs: per DDP bucket (graph tensor), 1 or 0.

    :meth:`Schedule.delays` is per item (a part of a partitioned bucket) and fractional (a mean over
    the steady period, merged items counted from their oldest iteration); the hook
    (``dpro_torch.deft.DeferredBuckets``) delays a bucket by exactly one iteration or not at all.
    **choice**: a bucket any of whose parts the schedule synchronises after its own iteration's
    backward stage starts at delay 1, the others at 0 (what the Preserver's loop then lowers,
    :func:`preserve_measured`).
    """
    tensor = {b.name: b.graph_tensor for b in sched.times.buckets}
    out: dict[str, int] = {t: 0 for t in tensor.values()}
    for name, d in sched.delays().items():
        if d > 0:
            out[tensor[name]] = 1
    return dict(sorted(out.items()))


def lowering_order(times: BucketTimes) -> list[str]:
    """The order in which the Preserver's loop makes buckets synchronous: backward-ready order (first ready first).

    DeFT's Preserver raises the knapsack capacity when the loss drifts (§IV-C3), which lets more
    communication happen inside its own iteration.  With a fixed delay per bucket, the capacity
    a bucket needs to be synchronised in its own iteration without a bubble is the backward
    computation after it becomes ready, ``sum_{j > k} T_j``: largest for the first-ready bucket (DDP's
    bucket 0, the output layers), zero for the last (the input layer, whose synchronisation only a
    delay can hide).  So a growing capacity admits buckets in backward-ready order, and the loop
    lowers their delays in that order; the last-ready bucket keeps its delay longest, which is also
    the one whose delay costs the least speed to drop last.  Names are the graph tensors.
    """
    seen: list[str] = []
    for b in times.buckets:
        if b.graph_tensor not in seen:
            seen.append(b.graph_tensor)
    return seen


def preserve_measured(start: dict[str, int], order: Sequence[str], measure: "Callable[[dict[str, int]], float]",
                      *, eps: float = 0.01, tries: int = 10) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The Preserver as a loop on real training: lower per-bucket delays until the measured loss ratio is near 1.

    ``measure(delays)`` trains the job with those per-bucket delays (same seed and data as its
    synchronous run) and returns :func:`measured_loss_ratio` of the synchronous run over it.
    Starting from ``start`` (:func:`fixed_delays` of the DeFT schedule): measure; while the
    ratio is outside ``[1 - eps, 1 + eps]``, set the delay of the next bucket of ``order``
    (:func:`lowering_order`) that still has one to 0 and measure again, at most ``tries``
    measurements (the paper re-solves at most ten times).  All delays 0 is stock DDP's
    arithmetic (ratio 1 by construction: the hook with nothing deferred gives DDP's gradients,
    ``tests/test_deft_hook.py``), accepted without a run.

    Returns the accepted delays (all 0 when no delayed schedule passed within ``tries``) and the
    log: per step ``{"delays", "ratio", "within"}`` (``ratio`` None where not measured).

    References
    ----------
    .. [1] {ref}, §IV-C3 (the feedback loop; ε = 0.01).
    """
    if eps < 0 or tries < 1:
        raise ValueError(f"need eps >= 0 and tries >= 1, got eps {eps}, tries {tries}")
    delays = {k: int(v) for k, v in start.items()}
    unknown = [k for k in order if k not in delays]
    if unknown:
        raise ValueError(f"lowering order names bucket(s) with no delay: {', '.join(unknown)}")
    log: list[dict[str, Any]] = []
    for _ in range(tries):
        if not any(delays.values()):
            log.append({"delays": dict(delays), "ratio": None, "within": True})
            return delays, log
        ratio = float(measure(dict(delays)))
        ok = math.isfinite(ratio) and abs(ratio - 1.0) <= eps
        log.append({"delays": dict(delays), "ratio": ratio, "within": ok})
        if ok:
            return delays, log
        nxt = next((k for k in order if delays[k] > 0), None)
        if nxt is None:
            break
        delays[nxt] = 0
    zero = {k: 0 for k in delays}
    log.append({"delays": zero, "ratio": None, "within": True})
    return zero, log


preserve_measured.__doc__ = preserve_measured.__doc__.replace("{ref}", _REF)


def plan_section(delays: dict[str, int], links: dict[str, int], rates: Sequence[float], *, eps: float,
                 log: Sequence[dict[str, Any]], predicted: dict[str, float] | None = None,
                 training: dict[str, Any] | None = None) -> dict[str, Any]:
    """``plan["deft"]``: the accepted per-bucket delays and links, how to run them, and the Preserver's log.

    ``run`` gives ``examples/ddp/train.py``'s options for them (``--deft-defer`` the buckets with
    delay 1, ``--deft-link1`` the buckets on link 1; ``dpro_torch.deft.DeferredBuckets`` in another
    training loop).
    """
    idx = {t: t.removeprefix("bucket") for t in delays}
    defer = [idx[t] for t, d in sorted(delays.items()) if d > 0]
    on1 = [idx[t] for t, j in sorted(links.items()) if j == 1 and t in idx]
    run = (["--deft-defer", ",".join(defer)] if defer else []) + (["--deft-link1", ",".join(on1)] if on1 else [])
    return {"delays": dict(sorted(delays.items())), "links": dict(sorted(links.items())),
            "rates_mbit": [float(r) for r in rates], "run": run,
            "preserver": {"eps": float(eps), "tries": [dict(x) for x in log], **({"training": training} if training else {})},
            **({"predicted": predicted} if predicted else {})}


def solver_plan(g: "nx.DiGraph", rates: Sequence[float] = (1.0,), ddp: dict[str, Any] | None = None) -> dict[str, Any]:
    """``plan["deft"]`` from the solver alone (``dpro optimize --deft``): the DeFT schedule's delays in the
    hook's form (:func:`fixed_delays`), the buckets on the links of :func:`link_assignment`, and the
    replayed steady iteration time of exactly that (:func:`predict`: ``partial_delay`` for some buckets
    delayed, ``delay_one[_links]`` for all, ``synchronous[_links]`` for none).

    The loss is not checked here: the Preserver's loop (:func:`preserve_measured`) needs the training
    itself (``bench/deft_ab.py --preserver-loop LR`` for ``examples/ddp/train.py``), so the section's
    ``preserver`` says so (``tries`` holds the start, unmeasured) and a plan with delays should go
    through that loop before it is trained with.
    """
    rates = [float(r) for r in rates] or [1.0]
    rep = predict(g, rates)
    delays = dict(rep["fixed_delays"])
    multi = "delay_one_links" in rep
    assign = dict(rep["delay_one_links"]["assignment"]) if multi else {t: 0 for t in delays}
    defer = [t for t, d in sorted(delays.items()) if d > 0]
    if defer and len(defer) < len(delays):
        part = predict(g, rates, defer=defer)["partial_delay"]
        it = (part["links"] if "links" in part else part["one_link"])["iteration_ms"]
    elif defer:
        it = rep["delay_one_links" if multi else "delay_one"]["iteration_ms"]
    else:
        it = rep["synchronous_links" if multi else "synchronous"]["iteration_ms"]
    sec = plan_section(delays, assign, rates, eps=0.01, log=[{"delays": dict(delays), "ratio": None, "within": None}],
                       predicted={"iteration_ms": it, "synchronous_ms": rep["synchronous"]["iteration_ms"],
                                  "speedup": rep["synchronous"]["iteration_ms"] / it if it > 0 else None})
    sec["preserver"]["note"] = ("not measured: the solver's delays; run the Preserver's loop on the training "
                                "(bench/deft_ab.py --preserver-loop LR, docs/deft.md) before training with them")
    sec["applies_to"] = ("DDP's buckets as profiled (bucket<k>: the k-th bucket after DDP's rebuild, with the traced "
                         "bucket_cap_mb): an alternative to the plan's tensor groups, not on top of them "
                         "(dpro_torch.plan.apply_plan(model, plan, mode='deft'); train.py --plan P --plan-mode deft)")
    sec["bucket_bytes"] = {b["name"]: b["bytes"] for b in rep["buckets"]}
    if ddp is not None:   # the DDP settings the buckets were traced with (the collector's meta.json ``ddp``)
        cap = ddp.get("bucket_cap_bytes")
        sec["ddp"] = {"bucket_cap_mb": None if ddp.get("bucket_cap_default") or not cap else int(cap) / 2**20}
    return sec


def preserve(times: BucketTimes, rates: Sequence[float] = (1.0,), *, s0: float, mu: float, sigma: float,
             batch: float, lr: float, target: float = 0.0, eps: float = 0.01, grow: float = 1.1,
             tries: int = 10, method: str = "greedy") -> tuple[Schedule, float, list[dict[str, float]]]:
    """The Preserver's feedback loop (DeFT §IV-C3): raise the knapsack capacity until the loss ratio is near 1.

    Solve :func:`schedule`; if :func:`loss_ratio` of its batch sequence is outside
    ``[1 - eps, 1 + eps]``, multiply every capacity by ``grow`` (**choice**: the
    paper does not say by how much) and solve again, at most ``tries`` times
    (the paper: ten).  A larger capacity synchronises more per iteration, so
    fewer iterations are merged (update frequency closer to 1).

    Returns the last schedule, its capacity scale and the tries
    (``{"capacity_scale", "update_frequency", "ratio"}`` each).

    References
    ----------
    .. [1] {ref}, §IV-C3 (ε = 0.01 in the paper's experiments).
    """
    scale, log = 1.0, []
    for _ in range(max(1, tries)):
        sched = schedule(times, rates, method=method, capacity_scale=scale)
        ratio = loss_ratio(sched.batch_sequence() or [1], s0, mu, sigma, batch, lr, target)
        log.append({"capacity_scale": scale, "update_frequency": sched.update_frequency, "ratio": ratio})
        if abs(ratio - 1.0) <= eps:
            break
        scale *= grow
    return sched, log[-1]["capacity_scale"], log


preserve.__doc__ = preserve.__doc__.replace("{ref}", _REF)
