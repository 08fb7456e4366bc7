"""The optimizer's starting point: the :class:`~dpro_kit.job.Job` of a :class:`~dpro_kit.session.Session`.

The optimizer's job is the one ``dpro replay`` builds its graph from (same
alignment, what-if, comm model and durations rule: ``Session.job``), and the
optimizer's ``build`` is the same builder, so the plan's ``predicted.before_ms``
is the number ``dpro replay -n 1`` prints for the same options.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DproError

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Session
    from ..job import Job


def load_base(session: "Session", *, per_param: bool = True) -> tuple["Job", list[list[str]], dict[str, Any]]:
    """The base job of ``session``, the initial tensor groups, and facts for the plan.

    Parameters
    ----------
    session : dpro_kit.session.Session
        The trace (or graph file) with the command's options (alignment, what-if,
        durations rule).
    per_param : bool, default True
        With per-parameter gradient sizes in the trace (dpro_torch records them), make
        the base tensors single parameters (``rebucket`` to 1 byte) and the initial groups
        the traced (or what-if) buckets; otherwise (or without them) the traced
        collectives are the base tensors.

    Returns
    -------
    (Job, list of list of str, dict)
        The base job, the initial grouping (base tensor names per group, in reduction
        order) and facts: ``job``, ``world_size``, ``memory_profile`` (the allocator
        samples of ``dpro profile --memory`` on the recorded clocks, or None),
        ``traced_ddp``, ``whatif``, ``base_tensors`` and ``durations`` (which op
        durations the search uses).  Empty facts for a graph file.
    """
    from ..job import Job
    from ..whatif import rebucket
    from .memory import build_profile

    if session.is_graph_file:
        base = Job.from_graph(session.graph)
        return base, base.initial_groups, {}
    ts = session.trace
    info: dict[str, Any] = {"job": ts.manifest.job, "world_size": ts.manifest.world_size,
                            # built before time alignment, so samples and ops share a clock
                            "memory_profile": build_profile(session.raw),
                            "traced_ddp": session.job.facts.ddp,
                            "durations": session.info["durations"]}
    if session.whatif is not None:
        info["whatif"] = session.whatif.describe()
    # the job replay stands for: mean durations, or the median profiled iteration
    job_ts = session.graph_trace
    from ..graph.schemes import is_allreduce
    groups_by_param = [list(c.params) for c in job_ts.collectives if is_allreduce(c)]
    fine = None
    if per_param:
        try:
            fine = rebucket(job_ts, 1, 1)
        except DproError:
            fine = None
    if fine is not None:
        base = Job.from_trace(fine, comm_model=session.comm_model)
        by_param = {p: t for t, bt in base.tensors.items() for p in bt.params}
        initial = [[by_param[p] for p in grp if p in by_param] for grp in groups_by_param]
        initial = [g_ for g_ in initial if g_]
        covered = {t for g_ in initial for t in g_}
        initial += [[t] for t in base.tensors if t not in covered]
        info["base_tensors"] = "per parameter"
    else:
        base = session.job
        initial = base.initial_groups
        info["base_tensors"] = "traced collectives"
    return base, initial, info


__all__ = ["load_base"]
