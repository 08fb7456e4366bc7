"""dPRO Theorems 1-3 as decision functions (derivations in docs/optimizer.md).

Notation (dPRO Table 1), for two consecutive computation ops n-1, n on the
critical path and their tensors:

* ``p0`` end of the computation before op n-1; ``q0`` end of the previous
  communication (when the link becomes free);
* ``t1, t2`` durations of ops n-1 and n; ``tf`` the fused op's duration;
* ``T1, T2`` sync time of tensors n-1 and n at their optimal partition
  numbers; ``T12`` sync time of the fused tensor at its optimal partition number.

The two-op recurrence (one computation stream, one communication channel,
FIFO) gives end times p (computation) and q (communication):

* no fusion:        p1 = p0+t1, p2 = p1+t2, q1 = max(p1,q0)+T1, q2 = max(p2,q1)+T2
* op fusion only:   p' = p0+tf, q1' = max(p',q0)+T1, q2' = q1'+T2
* tensor fusion:    q'' = max(p2,q0)+T12
* both (Thm 3):     q''' = max(p',q0)+T12

and the objective is e = max(p_end, q_end) (end of computation op n and of its
communication).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ends:
    none: float
    op_fusion: float
    tensor_fusion: float
    both: float

    def best(self) -> str:
        opts = {"none": self.none, "op_fusion": self.op_fusion, "tensor_fusion": self.tensor_fusion,
                "both": self.both}
        return min(opts, key=lambda k: (opts[k], ["none", "op_fusion", "tensor_fusion", "both"].index(k)))


def end_times(p0: float, q0: float, t1: float, t2: float, tf: float, T1: float, T2: float, T12: float) -> Ends:
    """End time e = max(computation end, communication end) under the four choices."""
    p1, p2 = p0 + t1, p0 + t1 + t2
    q1 = max(p1, q0) + T1
    q2 = max(p2, q1) + T2
    pf = p0 + tf
    q2_op = max(pf, q0) + T1 + T2
    q_tf = max(p2, q0) + T12
    q_both = max(pf, q0) + T12
    return Ends(none=max(p2, q2), op_fusion=max(pf, q2_op), tensor_fusion=max(p2, q_tf), both=max(pf, q_both))


def theorem1_fuse_ops(p0: float, q0: float, t1: float, t2: float, tf: float, T1: float, T2: float = 0.0) -> bool:
    """Theorem 1 (op fusion, tensors kept apart): fuse iff it ends earlier.

    Closed form (derived in docs/optimizer.md): with the link free when the
    fused op ends (q0 <= p0+tf), fusing is better iff

        p0 + tf + T1  <  max(p2, q1)          i.e. the first tensor, now sent after the fused op,
                                              still finishes before op n's tensor could start before;

    in the computation-bound case (q1 <= p2) this is ``t1 + t2 - tf > T1``: the
    computation saved must exceed the communication of tensor n-1 that was
    hidden behind op n and no longer is.

    Parameters
    ----------
    p0, q0 : float
        End of the computation before op n-1, and of the previous communication (the link is free).
    t1, t2 : float
        Durations of ops n-1 and n; ``tf`` the fused op's duration.
    T1, T2 : float
        Sync times of the tensors ops n-1 and n produce (at their optimal partition numbers).

    Returns
    -------
    bool
        True when fusing ops n-1 and n ends earlier.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §5.1, Theorem 1 (op fusion) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    e = end_times(p0, q0, t1, t2, tf, T1, T2, T1 + T2)
    return e.op_fusion < e.none


def theorem2_fuse_tensors(p1: float, p2: float, q0: float, T1: float, T2: float, T12: float) -> bool:
    """Theorem 2 (tensor fusion/partition): fuse tensors n-1 and n iff the fused sync ends earlier.

    q1 = max(p1, q0) + T1 and q2 = max(p2, q1) + T2 without fusion; q' = max(p2, q0) + T12
    with.  In the communication-bound case (q1 >= p2, q0 <= p2) fusion is better iff

        q1 - p2  >  T12 - T2

    (the time tensor n-1 still occupies the link after tensor n is ready exceeds
    the extra time the fused tensor needs over tensor n alone).

    Parameters
    ----------
    p1, p2 : float
        When tensors n-1 and n are ready (us).
    q0 : float
        When the link is free before tensor n-1.
    T1, T2, T12 : float
        Communication times of tensor n-1, tensor n and the fused tensor.

    Returns
    -------
    bool
        True when fusing the two tensors ends the synchronisation earlier.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §5.1, Theorem 2 (tensor fusion/partition) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    q1 = max(p1, q0) + T1
    q2 = max(p2, q1) + T2
    return max(p2, q0) + T12 < q2


def theorem3_joint(p0: float, q0: float, t1: float, t2: float, tf: float, T1: float, T2: float,
                   T12: float) -> str:
    """Theorem 3: decide op fusion and tensor fusion together.

    If T12 <= T1 + T2 (true for the alpha-beta link model at the optimal
    partition numbers: one latency less), then e(both) <= e(op_fusion) and
    e(both) <= ... so whenever op fusion is better than none, fusing the
    tensors as well is at least as good; and whenever tensor fusion is better,
    fusing the producing ops (if tf <= t1 + t2) is at least as good.
    Returns ``none``, ``op_fusion``, ``tensor_fusion`` or ``both``.

    Parameters
    ----------
    p0, q0, t1, t2, tf, T1, T2 : float
        As :func:`theorem1_fuse_ops`.
    T12 : float
        Communication time of the fused tensor.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §5.1, Theorem 3 (op fusion and tensor fusion/partition) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    return end_times(p0, q0, t1, t2, tf, T1, T2, T12).best()


__all__ = ["end_times", "Ends", "theorem1_fuse_ops", "theorem2_fuse_tensors", "theorem3_joint"]
