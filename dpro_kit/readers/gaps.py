"""Host gaps: the time a thread spent between two recorded ops, charged to the op after it.

A trace records ops; the thread that runs them also spends time between them that no op
records: Python (the interpreter, the training loop, the framework's dispatch), events a
sampled trace left out, the stops of a CPU quota.  A replay that chains the thread's ops
back to back leaves that time out and predicts the iteration short (eager PyTorch: often
10-30 % of a small model's iteration, docs/pytorch.md; MXNet: every PS row 1-10 % short,
docs/ps.md "Host gaps").  So every reader charges such a gap to the op after it: the op's
start moves back to where the gap began, its duration grows, its end stays.

Not every gap is host time.  Where the thread waited for something the DFG already models
as an edge (a GPU op, another thread, a collective, a pulled weight), the edge accounts for
the wait; folding it too would count it twice.  :func:`fold_gaps` is the one rule, and a
reader says where its waits are:

* ``after[i]``: op ``i`` waited for something that ended at that time; only the gap after
  it is folded (the Kineto readers: inferred waits between lanes, synchronising calls);
* ``keep(i, frm)``: op ``i`` keeps its start, the gap since ``frm`` being a wait (the torch
  collector's bucket wait and ``dpro::comm_wait`` ranges; MXNet's pulls).

Readers: :mod:`.kineto_plain` and :mod:`.torch_kineto` (via
:func:`dpro_kit.readers.kineto_gpu.fold_host_gaps`), :mod:`.mxnet`.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

__all__ = ["fold_gaps"]


def fold_gaps(starts: Sequence[float], ends: Sequence[float], prev_end: Optional[float] = None, *,
              after: Optional[Sequence[Optional[float]]] = None,
              keep: Optional[Callable[[int, float], bool]] = None) -> list[float]:
    """New starts for one thread's ops (``starts``/``ends`` in start order, any one time unit):
    each op starts where the ops before it ended (the latest end so far), at ``prev_end`` for the
    first (None: the first op keeps its start), unless ``after``/``keep`` (module docstring) say
    the gap was a wait.  An op that started before that time keeps its start; ends never move.
    """
    out = list(starts)
    for i, s in enumerate(starts):
        frm = prev_end
        if after is not None and after[i] is not None:
            frm = after[i] if frm is None else max(frm, after[i])
        if frm is not None and s > frm and not (keep is not None and keep(i, frm)):
            out[i] = frm
        prev_end = ends[i] if prev_end is None else max(prev_end, ends[i])
    return out
