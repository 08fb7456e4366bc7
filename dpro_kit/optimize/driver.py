"""``optimize(session, options) -> Optimized``: the whole strategy search behind ``dpro optimize``.

What runs, in order (docs/optimizer.md):

1. the base job of the session (:func:`dpro_kit.optimize.load.load_base`: the job
   ``dpro replay`` replays, per-parameter tensors when the trace has them);
2. dPRO's critical-path search (Alg. 1, :class:`~dpro_kit.optimize.search.Searcher`)
   from the traced buckets, then from other starts with the remaining budget
   (one group per tensor — Alg. 1's own start — and the best single DDP bucket cap of
   :data:`CAP_GRID_MB`); the fastest plan wins (:func:`best_cap_start`);
3. near-tie merging (:func:`merge_near_ties`): fewer collectives when the model cannot
   tell the difference (:data:`MERGE_TOLERANCE`);
4. fused-op timing (:func:`time_op_fusions`): torch.compile timings of the chosen
   op-fusion groups replace the cost model, groups that are not faster are dropped;
5. the min-gain rule: a plan predicted to save less than ``min_gain_pct`` keeps the
   traced configuration;
6. the plan (:func:`dpro_kit.optimize.plan.make_plan`).

A trace that a knob pass applies to (a Horovod job: :mod:`dpro_kit.optimize.horovod`; a
BytePS job: :mod:`dpro_kit.optimize.byteps`) gets that pass's plan instead: the framework's
runtime settings, searched on the replayer (:mod:`dpro_kit.optimize.knobs`).

References
----------
.. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for
   Expediting Distributed DNN Training", MLSys 2022, §5 and Alg. 1
   (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DproError

if TYPE_CHECKING:  # pragma: no cover
    from ..job import Job
    from ..session import Session
    from .search import Searcher, SearchResult

#: relative growth of the predicted iteration time accepted to save one collective (see :func:`merge_near_ties`)
MERGE_TOLERANCE = 0.01

#: DDP bucket caps (MB) tried as search starts (see :func:`best_cap_start`)
CAP_GRID_MB = (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)

#: ``fusion_timing`` modes: torch.compile timings, the cost model, or compile when possible
FUSION_TIMING_MODES = ("auto", "compile", "model")


@dataclass
class OptimizeOptions:
    """How :func:`optimize` searches (the options of ``dpro optimize`` that are not Session options).

    Parameters
    ----------
    budget_s : float
        Search time budget (seconds), shared by all starts, merging and fused-op timing.
    max_steps : int
        Search step budget of each start.
    seed : int
        Order of single-candidate retries.
    memory_budget : int or None
        Peak memory budget per worker (bytes); None: no memory constraint.
    activation_bytes : int
        Activation memory per worker to assume (0: from the trace's allocator samples).
    optimizer_slots : float or None
        Optimizer state per parameter in parameter sizes (None: recorded in the trace, else 1).
    op_fusion, tensor_fusion, tensor_partition : bool
        Which passes the search offers.
    fusion_timing : str
        One of :data:`FUSION_TIMING_MODES`.
    extra_passes : list
        User :class:`~dpro_kit.optimize.passes.GraphPass` instances also offered.
    checkpoint, resume : Path or None
        Write the search state after every step / continue from such a file.  A resumed
        search runs from the checkpoint only (no other starts).
    min_gain_pct : float
        Recommend a change only if it saves at least this many percent of the iteration time.
    progress : callable or None
        The search's progress callback (:func:`dpro_kit.optimize.search.terminal_progress`).
    warn : callable or None
        Called with one line for each warning (e.g. no memory samples for a memory budget).
    """

    budget_s: float = 60.0
    max_steps: int = 50
    seed: int = 0
    memory_budget: int | None = None
    activation_bytes: int = 0
    optimizer_slots: float | None = None
    op_fusion: bool = True
    tensor_fusion: bool = True
    tensor_partition: bool = True
    fusion_timing: str = "auto"
    extra_passes: list[Any] = field(default_factory=list)
    checkpoint: Path | None = None
    resume: Path | None = None
    min_gain_pct: float = 5.0
    progress: Callable[..., Any] | None = None
    warn: Callable[[str], None] | None = None


@dataclass
class Optimized:
    """What :func:`optimize` returns: the plan (``plan.json``'s object) and the search result it came from."""

    plan: dict[str, Any]
    result: "SearchResult"


def merge_near_ties(base: "Job", searcher: "Searcher", result: "SearchResult", deadline: float) -> "SearchResult":
    """Greedily fuse adjacent tensor groups while the replayed time stays within :data:`MERGE_TOLERANCE`.

    Real collectives cost more than the model's per-collective latency (a small one queues
    behind a large transfer on a busy link), so a near tie goes to the plan with fewer of
    them (measured: docs/optimizer.md, cnn at 100 Mbit/s).  Strategies with partitions are
    left as they are.

    Parameters
    ----------
    base : dpro_kit.job.Job
        The job searched.
    searcher : dpro_kit.optimize.search.Searcher
        Evaluates candidate strategies (its cache is reused).
    result : dpro_kit.optimize.search.SearchResult
        The search's best; changed in place (strategy, ``after_us``, one ``tensor_fusion`` change).
    deadline : float
        ``time.perf_counter()`` value after which no more candidates are tried.
    """
    s = result.strategy
    from .state import group_name
    if len(s.groups) < 2 or any(s.parts(group_name(g)) > 1 for g in s.groups):
        return result
    best_t = searcher.evaluate(s)[0]
    limit = best_t * (1.0 + MERGE_TOLERANCE)
    merged = 0
    i = 0
    while i < len(s.groups) - 1 and time.perf_counter() < deadline:
        cand = s.with_fused_groups(i, i + 1)
        t = searcher.evaluate(cand)[0]
        if t <= limit:
            s, merged = cand, merged + 1
        else:
            i += 1
    if merged:
        t = searcher.evaluate(s)[0]
        result.changes.append({"pass": "tensor_fusion", "args": {"merged_adjacent_groups": merged},
                               "reason": f"fewer collectives at a predicted cost within {100 * MERGE_TOLERANCE:g} %: "
                                         f"{merged} adjacent group merge(s), {best_t / 1e3:.3f} -> {t / 1e3:.3f} ms",
                               "predicted_before_ms": best_t / 1e3, "predicted_after_ms": t / 1e3,
                               "applied_as": "tensor_fusion"})
        result.strategy, result.after_us = s, t
    return result


def fusion_timing_unavailable(trace: Path) -> str | None:
    """Why torch.compile timing of op-fusion groups cannot run on ``trace`` here, or None.

    Parameters
    ----------
    trace : Path
        The trace directory (it needs the shapes trace of ``dpro profile --shapes``).
    """
    from .compile_timing import load_shapes
    if not (trace.is_dir() and load_shapes(trace)[0]):
        return "no shapes trace (record it with `dpro profile --shapes`)"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch is not installed here"
    return None


def time_op_fusions(trace: Path, base: "Job", searcher: "Searcher", result: "SearchResult", mode: str,
                    deadline: float, progress: Any) -> tuple["SearchResult", dict[str, Any]]:
    """Replace the fused-op model by torch.compile timings for the plan's fusion groups; drop the
    groups that do not pay off with the measured times (docs/optimizer.md, "Fused-op times").

    The search itself runs with the model (timing every candidate would take minutes); the
    groups it chose are rebuilt from the shapes trace and timed, then each timed group is
    kept only if the replay with measured times is not slower with it than without it.

    Parameters
    ----------
    trace : Path
        The trace directory (shapes trace of ``dpro profile --shapes``).
    base : dpro_kit.job.Job
        The job searched; its ``fusion_ratios`` receive the measured compiled/eager ratios.
    searcher : dpro_kit.optimize.search.Searcher
        Re-evaluates the strategy with the measured durations.
    result : dpro_kit.optimize.search.SearchResult
        Changed in place (strategy, ``after_us``, one ``op_fusion_timing`` change).
    mode : str
        One of :data:`FUSION_TIMING_MODES` (``model``: nothing is timed).
    deadline : float
        ``time.perf_counter()`` value after which no more groups are timed.
    progress : callable or None
        Progress callback of :func:`dpro_kit.optimize.compile_timing.time_fusions`.

    Returns
    -------
    (SearchResult, dict)
        The result and the plan's ``fusion_timing`` facts (mode, groups, timed, dropped, note).
    """
    info: dict[str, Any] = {"mode": mode, "groups": []}
    s = result.strategy
    if mode == "model" or not s.fusions:
        info["note"] = "fused-op times from the model" if mode == "model" else "no op-fusion group to time"
        return result, info
    # (mode "compile" was checked for shapes and torch before the search: fusion_timing_unavailable)
    from .compile_timing import load_shapes, time_fusions
    why = fusion_timing_unavailable(trace)
    if why:
        info["note"] = f"{why}: fused-op times from the model"
        return result, info
    shapes, threads = load_shapes(trace)
    timings = time_fusions(s.fusions, shapes, threads=threads, deadline=deadline, progress=progress)
    info["groups"] = [t.as_dict() for t in timings.values()]
    ratios = {g: t.ratio for g, t in timings.items() if t.ratio is not None}
    if not ratios:
        info["note"] = "no fusion group could be timed (reasons per group): fused-op times from the model"
        return result, info
    model_t = result.after_us
    base.fusion_ratios.update(ratios)
    searcher.forget_evaluations()   # durations of the timed groups changed
    t = searcher.evaluate(s)[0]
    dropped = []
    for g in list(ratios):
        if g not in s.fusions:
            continue
        s2 = dc_replace(s, fusions=tuple(f for f in s.fusions if f != g))
        t2 = searcher.evaluate(s2)[0]
        if t2 <= t:
            s, t = s2, t2
            dropped.append(list(g))
    info.update({"timed": len(ratios), "dropped": dropped, "predicted_model_ms": model_t / 1e3,
                 "predicted_measured_ms": t / 1e3})
    result.changes.append({"pass": "op_fusion_timing", "args": {"timed": len(ratios), "dropped": len(dropped)},
                           "reason": f"{len(ratios)} fusion group(s) timed with torch.compile (compiled/eager "
                                     + ", ".join(f"{r:.2f}" for r in ratios.values())
                                     + f"); {len(dropped)} dropped as not faster; predicted "
                                       f"{model_t / 1e3:.3f} ms with the model -> {t / 1e3:.3f} ms measured",
                           "predicted_before_ms": model_t / 1e3, "predicted_after_ms": t / 1e3,
                           "applied_as": "op_fusion_timing"})
    result.strategy, result.after_us = s, t
    return result, info


def best_cap_start(base: "Job", searcher: "Searcher") -> tuple[list[list[str]] | None, float]:
    """The grouping of the best DDP bucket cap of :data:`CAP_GRID_MB`, by replayed time.

    Tensors in reduction order; an explicit cap caps the first bucket too (as DDP does
    when ``bucket_cap_mb`` is given).

    Parameters
    ----------
    base : dpro_kit.job.Job
        The job searched (its ``initial_groups`` give the reduction order).
    searcher : dpro_kit.optimize.search.Searcher
        Evaluates each cap's grouping.

    Returns
    -------
    (list of list of str or None, float)
        The groups and the cap (MB); ``(None, 0.0)`` when there are fewer than two tensors.
    """
    from ..whatif import ddp_bucket_assignment
    from .state import initial_strategy
    order = [t for g in base.initial_groups for t in g]
    if len(order) < 2:
        return None, 0.0
    sizes = [base.tensors[t].bytes for t in order]
    best: tuple[float, list[list[str]] | None, float] = (float("inf"), None, 0.0)
    seen = set()
    for mb in CAP_GRID_MB:
        cap = int(mb * 2**20)
        groups = [[order[i] for i in idx] for idx in ddp_bucket_assignment(sizes, cap, cap)]
        key = tuple(map(tuple, groups))
        if key in seen:
            continue
        seen.add(key)
        t = searcher.evaluate(initial_strategy(base, groups))[0]
        if t < best[0]:
            best = (t, groups, mb)
    return best[1], best[2]


def optimize(session: "Session", options: OptimizeOptions | None = None) -> Optimized:
    """Search a faster strategy for the job of ``session`` (dPRO §5, Alg. 1 [1]_) and make its plan.

    Parameters
    ----------
    session : dpro_kit.session.Session
        The trace (or graph file) with the Session options (alignment, what-if, durations
        rule): the search starts from ``session.job``, so the plan's ``predicted.before_ms``
        is what ``dpro replay -n 1`` predicts with the same options.
    options : OptimizeOptions or None
        How to search (default: ``OptimizeOptions()``, as ``dpro optimize`` without options).

    Returns
    -------
    Optimized
        ``plan`` (the ``plan.json`` object, :data:`dpro_kit.optimize.plan.PLAN_SCHEMA`) and the
        search ``result``.

    Raises
    ------
    DproError
        ``fusion_timing="compile"`` where it cannot run (no shapes trace, no PyTorch), bad
        traces (from the Session), a cyclic strategy.

    References
    ----------
    .. [1] Hu et al., "dPRO", MLSys 2022, §5 and Alg. 1.
    """
    from ..graph.model import op_key
    from .load import load_base
    from .memory import MemoryModel
    from .plan import make_plan
    from .search import SearchOptions, Searcher, load_checkpoint
    from .state import initial_strategy

    o = options or OptimizeOptions()
    trace = session.path
    if o.fusion_timing not in FUSION_TIMING_MODES:
        raise DproError(f"unknown fusion timing mode {o.fusion_timing!r}", hint="use " + ", ".join(FUSION_TIMING_MODES))
    if o.fusion_timing == "compile":   # asked for explicitly: fail before the search, not after it
        why = fusion_timing_unavailable(trace)
        if why:
            raise DproError(f"--fusion-timing compile: {why}", path=trace,
                            hint="record the trace with `dpro profile --shapes`, or use --fusion-timing auto|model")
    # knob passes (Horovod's fusion threshold and cycle time): the framework decides the tensor groups at run
    # time from its settings, so the plan is those settings, searched on the replayer
    from . import byteps, horovod  # noqa: F401  (register the byteps_partition and horovod_knobs passes)
    from .passes import PASSES
    for cls in PASSES.values():
        if getattr(cls, "knobs", False):
            knob_pass = cls()
            if knob_pass.applies(session):
                return knob_pass.optimize(session, o)
    base, initial, info = load_base(session)
    memory_model = MemoryModel(activation_bytes=o.activation_bytes or 0, optimizer_slots=o.optimizer_slots,
                               profile=info.pop("memory_profile", None))
    if o.memory_budget is not None and memory_model.profile is None and not memory_model.activation_bytes \
            and o.warn is not None:
        o.warn("the trace has no allocator samples (record it with `dpro profile --memory`) and no "
               "--activation-bytes was given: activations count as 0 in the memory estimate")
    opts = SearchOptions(budget_s=o.budget_s, max_steps=o.max_steps, seed=o.seed, memory_budget=o.memory_budget,
                         memory_model=memory_model, op_fusion=o.op_fusion, tensor_fusion=o.tensor_fusion,
                         tensor_partition=o.tensor_partition, extra_passes=list(o.extra_passes),
                         checkpoint=o.checkpoint, progress=o.progress)
    searcher = Searcher(base, opts)
    t_search0 = time.perf_counter()
    result = searcher.run(initial_strategy(base, initial), resume=load_checkpoint(o.resume) if o.resume else None)
    start = "traced buckets"
    if o.resume is None:
        # other starts, each searched with the remaining budget; the faster plan wins.  dPRO's Alg. 1
        # starts from unfused tensors; the best single DDP bucket cap of a grid is what stock DDP
        # expresses, and Alg. 1's local moves from the other starts can miss it
        starts = []
        if initial != base.initial_groups:
            starts.append((None, {"from": "unfused"}, "unfused",
                           "search from one group per tensor (dPRO Alg. 1 start) found the faster plan"))
        cap_groups, cap_mb = best_cap_start(base, searcher)
        if cap_groups is not None and list(map(list, cap_groups)) not in (initial, base.initial_groups):
            starts.append((cap_groups, {"from": "bucket cap", "bucket_cap_mb": cap_mb}, f"bucket cap {cap_mb:g} MB",
                           f"search from the best single DDP bucket cap ({cap_mb:g} MB of a grid) found the "
                           "faster plan"))
        for groups, args, label, reason in starts:
            left = max(1.0, o.budget_s - (time.perf_counter() - t_search0))
            s_alt = Searcher(base, SearchOptions(**{**opts.__dict__, "budget_s": left, "checkpoint": None}))
            r_alt = s_alt.run(initial_strategy(base, groups))
            if r_alt.after_us < result.after_us:
                r_alt.before_us = result.before_us   # "before" stays the traced configuration
                r_alt.changes.insert(0, {"pass": "start", "args": args, "reason": reason,
                                         "predicted_before_ms": result.before_us / 1e3,
                                         "predicted_after_ms": s_alt.evaluate(initial_strategy(base, groups))[0] / 1e3,
                                         "applied_as": "start"})
                result, searcher, start = r_alt, s_alt, label
    info["search_start"] = start
    # fewer collectives when the model cannot tell the difference: merge adjacent groups (reduction order)
    # while the predicted time grows by at most MERGE_TOLERANCE
    result = merge_near_ties(base, searcher, result, deadline=t_search0 + o.budget_s)
    # fused-op times: torch.compile timings of the chosen groups replace the model where possible
    result, info["fusion_timing"] = time_op_fusions(trace, base, searcher, result, o.fusion_timing,
                                                    deadline=t_search0 + o.budget_s, progress=o.progress)
    gain = result.before_us / result.after_us - 1.0 if result.after_us > 0 else 0.0
    if o.min_gain_pct > 0 and gain < o.min_gain_pct / 100.0 and result.strategy.mem() == result.initial.mem() \
            and result.strategy != initial_strategy(base, initial):
        # not worth a change: keep the traced configuration (memory choices forced by a budget stay)
        best = f"{result.after_us / 1e3:.3f} ms ({100 * gain:+.1f} %)"
        kept = initial_strategy(base, initial)
        result.changes = [{"pass": "keep", "args": {"min_gain_pct": o.min_gain_pct},
                           "reason": f"the best plan found predicts {best}, less than --min-gain {o.min_gain_pct:g} %: "
                                     "keep the traced configuration",
                           "predicted_before_ms": result.before_us / 1e3, "predicted_after_ms": result.before_us / 1e3,
                           "applied_as": "keep"}]
        result.strategy, result.after_us = kept, result.before_us
        info["kept_traced"] = True
    # gradient-ready times of the final strategy (for Horovod's cycle time)
    _, res, g = searcher.evaluate(result.strategy)
    ready: dict[str, float] = {}
    idx = {k: i for i, k in enumerate(res.graph.keys)}
    ref = base.nodes[0]
    for t, bt in base.tensors.items():
        ops = [idx[op_key(ref, op)] for op in bt.inputs.get(ref, []) if op_key(ref, op) in idx]
        if ops:
            ready[t] = float(max(res.end[i] for i in ops))
    from .tictac import plan_section
    plan = make_plan(base, result, trace=str(trace), info=info, memory_budget=opts.memory_budget, ready_us=ready,
                     schedule=plan_section(g),
                     options={"seed": o.seed, "budget_s": o.budget_s, "max_steps": o.max_steps,
                              "base_tensors": info.get("base_tensors", "graph"), "start": start,
                              "durations": info.get("durations", "as in the graph file")})
    return Optimized(plan=plan, result=result)


__all__ = ["CAP_GRID_MB", "FUSION_TIMING_MODES", "MERGE_TOLERANCE", "OptimizeOptions", "Optimized", "best_cap_start",
           "fusion_timing_unavailable", "merge_near_ties", "optimize", "time_op_fusions"]
