"""Horovod's background loop: which gradients each cycle takes, how they are fused, and when they run.

Horovod (0.28.1) does not allreduce a gradient when it is ready.  One background thread per
rank runs a loop (``horovod/common/operations.cc``, ``RunLoopOnce``)::

    sleep until last_cycle_start + CYCLE_TIME          # no sleep when the last cycle took longer
    last_cycle_start = now                             # the tick
    responses = ComputeResponseList()                  # every rank's ready tensors (negotiation;
                                                       # with the response cache a bit-vector allreduce)
    for buffer in FuseResponses(responses):            # in order, while the bytes stay <= threshold
        PerformOperation(buffer)                       # copy in, allreduce, copy out

So the number of fusion buffers, their sizes and the wait of a gradient before its allreduce
all follow from *when the gradients are ready* relative to the ticks: a longer cycle time
takes more gradients per tick (fewer buffers, each with its fixed negotiation, copy and
allreduce latency) but lets a gradient wait up to a cycle for its tick; a tick that follows a
long allreduce comes right after it (the thread was late) and takes everything that became
ready meanwhile.

:func:`cycles` is that loop over one iteration, for given ready times and buffer run times.
With ``r_i`` the time tensor ``i`` is ready on every rank (tensors in Horovod's order),
``C`` the cycle time, ``L`` the negotiation of a cycle (tick to its first copy) and
``D(B)`` the run time of a buffer ``B`` (copies and allreduce):

* the first tick ``t_0 = r_min + phase`` (default ``phase = C/2``: the first gradient falls
  uniformly within a cycle; :func:`next_phase` instead carries the loop's ticks over from the
  previous iteration, which is what locks a long cycle to the iteration);
* tick ``t_j`` takes ``T_j = {i not yet taken: r_i <= t_j}``; an empty ``T_j`` is an idle
  tick (next tick ``t_j + C``);
* ``T_j`` in order is cut into buffers: a buffer takes the next tensor while its bytes stay
  ``<= threshold`` (a tensor larger than the threshold runs alone): Horovod's
  ``FuseResponses`` for tensors of one dtype;
* the buffers run one after another: ``e_j = t_j + L + sum_B D(B)`` (``D`` may depend on when
  ``B`` starts: :func:`dpro_kit.whatif.horovod_knobs` slows what runs beside the backward pass);
* the next tick ``t_{j+1} = max(t_j + C, e_j)``.

The iteration's communication ends at the last ``e_j``.  The wait a buffer sees after its
gradients and the previous buffer are done is ``start(B) - max(max_{i in B} r_i, end(previous))``:
``t_j + L - ...`` for a cycle's first buffer, 0 for the others.

What is not modelled: the per-rank phase of the ticks (the negotiation makes the ranks agree
once per cycle; one common tick is used), the CPU that idle ticks take from the training thread
on a shared core (and their negotiations: a tick never waits for an idle one), Horovod's
look-ahead over tensors of another dtype, and the response cache's order (the tensors keep
the profiled order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["Cycle", "cycles", "fuse", "next_phase"]


@dataclass
class Cycle:
    """One tick of the loop that took tensors: when, which buffers, when its last buffer was done (us)."""

    tick: float
    buffers: list[list[int]]
    start: list[float]          # per buffer: its first copy begins
    end: list[float]            # per buffer: its last copy is done

    @property
    def done(self) -> float:
        return self.end[-1]


def fuse(order: Sequence[int], sizes: Sequence[int], threshold: int) -> list[list[int]]:
    """Cut the tensors ``order`` (indices into ``sizes``) into fusion buffers of at most ``threshold`` bytes.

    A buffer takes the next tensor while its bytes stay ``<= threshold``; a tensor larger than
    the threshold runs alone (Horovod's ``FuseResponses``, one dtype).

    >>> fuse([0, 1, 2, 3], [4, 4, 4, 10], 8)
    [[0, 1], [2], [3]]
    """
    out: list[list[int]] = []
    size = 0
    for i in order:
        if out and size + sizes[i] <= threshold:
            out[-1].append(i)
            size += sizes[i]
        else:
            out.append([i])
            size = sizes[i]
    return out


def cycles(ready: Sequence[float], sizes: Sequence[int], threshold: int, cycle_us: float,
           run_us: Callable[[list[int], float], float], *, negotiate_us: float = 0.0,
           phase_us: float | None = None, given: Sequence[Sequence[Sequence[int]]] | None = None) -> list[Cycle]:
    """Horovod's background loop over one iteration (module docstring): the cycles that took tensors.

    Parameters
    ----------
    ready : sequence of float
        Per tensor, when it is ready on every rank (us), in Horovod's order.
    sizes : sequence of int
        Per tensor, its bytes.
    threshold : int
        ``HOROVOD_FUSION_THRESHOLD`` (bytes).
    cycle_us : float
        ``HOROVOD_CYCLE_TIME`` (us, >= 0).
    run_us : callable
        ``(buffer (tensor indices), its start in us) -> us`` from its first copy to its last
        (copies and allreduce; the start lets a caller slow what runs beside the backward pass).
    negotiate_us : float
        ``L``: from a tick to its first buffer's copy.
    phase_us : float or None
        From the first ready tensor to the first tick (default ``cycle_us / 2``).
    given : sequence or None
        The buffers of each cycle (tensor indices), to time a grouping instead of finding it:
        cycle ``j`` then runs at the first tick (same rule) at which all its tensors are ready.

    Returns
    -------
    list of Cycle
        In order; every tensor is in exactly one buffer.

    Examples
    --------
    Three tensors ready at 0, 1 and 5 ms, a 2 ms cycle, every buffer 3 ms: the first tick at
    1 ms (half a cycle) takes the first two, which run until 4 ms; the next tick (late: 4 ms
    instead of 3) finds nothing ready, the one after it (6 ms) takes the third.

    >>> cs = cycles([0, 1000, 5000], [8, 8, 8], 1 << 20, 2000, lambda b, start: 3000.0)
    >>> [(c.tick, c.buffers, c.done) for c in cs]
    [(1000.0, [[0, 1]], 4000.0), (6000.0, [[2]], 9000.0)]
    """
    if len(ready) == 0:
        return []
    phase = cycle_us / 2 if phase_us is None else phase_us

    def tick_at_or_after(t: float, r: float) -> float:
        """The first tick ``t + k C`` (idle ticks in between) at or after ``r``."""
        if r <= t:
            return t
        return t + math.ceil((r - t) / cycle_us) * cycle_us if cycle_us > 0 else r

    pending = list(range(len(ready)))
    t = min(ready) + phase
    out: list[Cycle] = []
    todo = [list(map(list, c)) for c in given] if given is not None else None
    while (todo if todo is not None else pending):
        if todo is not None:
            bufs = todo.pop(0)
            t = tick_at_or_after(t, max(ready[i] for b in bufs for i in b))
        else:
            t = tick_at_or_after(t, min(ready[i] for i in pending))
            taken = [i for i in pending if ready[i] <= t]
            pending = [i for i in pending if ready[i] > t]
            bufs = fuse(taken, sizes, threshold)
        start, end = [], []
        at = t + negotiate_us
        for b in bufs:
            start.append(at)
            at += float(run_us(b, at))
            end.append(at)
        out.append(Cycle(tick=float(t), buffers=bufs, start=start, end=end))
        t = max(t + cycle_us, at)
    return out


def next_phase(last: Cycle, cycle_us: float, first_ready: float, jitter_us: Sequence[float] = (0.0,)) -> float:
    """The next iteration's tick phase: from its first ready gradient to the loop's first tick after it.

    The loop does not restart with an iteration: after the last cycle that took tensors (``last``)
    the thread ticks at ``T_0 = max(last.tick + C, last.done)`` and every ``C`` after it (idle
    ticks), so the next iteration's first tick is the first ``T_0 + k C`` at or after its first
    ready gradient ``first_ready`` (same clock as ``last``).  A cycle longer than the work after
    the tick locks to the iteration (the next tick comes ``C`` after the last one: an iteration of
    ``C``, or of a multiple of it), a short one falls anywhere within ``C``.  ``jitter_us``: offsets
    of ``first_ready`` (the iteration-to-iteration spread of real runs) over which the phase is
    averaged; where the spread is larger than ``C`` the mean tends to ``C / 2``.

    >>> c = Cycle(tick=0.0, buffers=[[0]], start=[0.0], end=[30.0])
    >>> next_phase(c, 50.0, 40.0)       # ticks at 50, 100, ...: the first one after 40
    10.0
    >>> next_phase(c, 10.0, 41.0)       # ticks at 30, 40, 50, ...
    9.0
    """
    t0 = max(last.tick + cycle_us, last.done)
    out = []
    for d in jitter_us:
        r = first_ready + d
        t = t0 if r <= t0 else (t0 + math.ceil((r - t0) / cycle_us) * cycle_us if cycle_us > 0 else r)
        out.append(t - r)
    return sum(out) / len(out)
