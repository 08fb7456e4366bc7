"""What the knob passes share: a grid of a framework's runtime settings, each replayed, and its plan.

A *knob pass* (``GraphPass.knobs = True``: :class:`dpro_kit.optimize.horovod.HorovodKnobs`,
:class:`dpro_kit.optimize.byteps.BytePSPartition`) tunes settings the framework applies at
run time (Horovod's fusion threshold and cycle time, BytePS's partition size) rather than a
:class:`~dpro_kit.job.Strategy`: every candidate is a what-if of :mod:`dpro_kit.whatif`
applied to the iteration ``dpro replay`` replays, built and replayed (:func:`replay_ms`);
:func:`grid_search` keeps the fastest, ties (within :data:`TIE_TOLERANCE`) going to the
setting closest to the traced one; :func:`knob_plan` writes the plan with the settings in
``plan["frameworks"][<framework>]`` and the shell lines that apply them.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from ..costmodel import CommModel
    from ..session import Session
    from ..trace import TraceSet
    from .driver import Optimized, OptimizeOptions

__all__ = ["TIE_TOLERANCE", "grid_search", "knob_plan", "replay_ms"]

#: relative difference below which a faster setting does not replace one closer to the traced setting
TIE_TOLERANCE = 0.005


def replay_ms(ts: "TraceSet", model: "CommModel") -> float:
    """The replayed iteration time (ms) of the job ``ts`` with the comm model ``model``.

    Parameters
    ----------
    ts : TraceSet
        The job (a what-if of the traced iteration).
    model : CommModel
        Its link model.
    """
    from ..graph.build import build
    from ..job import Job, identity
    from ..replay import replay
    job = Job.from_trace(ts, comm_model=model)
    return replay(build(job, identity(job), check=False)).iteration_time_us / 1e3


def _distance(a: dict[str, float], b: dict[str, float]) -> float:
    """How far setting ``a`` is from ``b`` (sum of |log2| ratios of the positive values)."""
    return sum(abs(math.log2(max(float(a[k]), 1e-9) / max(float(b[k]), 1e-9))) for k in a)


def grid_search(evaluate: Callable[[dict[str, Any]], float], candidates: list[dict[str, Any]],
                traced: dict[str, Any], *, deadline: float | None = None) -> dict[str, Any]:
    """Replay every candidate setting (and the traced one); the fastest, ties to the closest to ``traced``.

    Parameters
    ----------
    evaluate : callable
        ``setting -> predicted iteration time (ms)``.
    candidates : list of dict
        Settings (variable name -> value), in the order to try.
    traced : dict
        The traced setting (evaluated first: the plan's "before").
    deadline : float or None
        ``time.perf_counter()`` after which no more candidates are evaluated.

    Returns
    -------
    dict
        ``traced`` and ``best`` (the setting with its ``predicted_ms``), ``grid`` (every
        evaluated setting), ``evaluations``, ``elapsed_s``, ``stopped`` (``grid`` or ``time budget``).
    """
    t0 = time.perf_counter()
    grid = [{**traced, "predicted_ms": round(evaluate(traced), 4)}]
    seen = {tuple(sorted(traced.items()))}
    stopped = "grid"
    for c in candidates:
        key = tuple(sorted(c.items()))
        if key in seen:
            continue
        if deadline is not None and time.perf_counter() > deadline:
            stopped = "time budget"
            break
        seen.add(key)
        grid.append({**c, "predicted_ms": round(evaluate(c), 4)})
    fastest = min(r["predicted_ms"] for r in grid)
    near = [r for r in grid if r["predicted_ms"] <= fastest * (1 + TIE_TOLERANCE)]

    def setting(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "predicted_ms"}
    best = min(near, key=lambda r: (_distance(setting(r), traced), r["predicted_ms"]))
    return {"traced": grid[0], "best": best, "grid": grid, "evaluations": len(grid),
            "elapsed_s": round(time.perf_counter() - t0, 3), "stopped": stopped}


def knob_plan(session: "Session", options: "OptimizeOptions", *, pass_name: str, framework: str,
              found: dict[str, Any], apply_ts: Callable[[dict[str, Any]], "TraceSet"],
              apply_hint: str) -> "Optimized":
    """The plan (``plan.json``) of a knob search: the best setting unless it saves less than ``--min-gain``.

    ``plan["frameworks"][framework]`` gets the setting's variables, ``export`` (shell lines),
    ``apply`` (``apply_hint``), ``traced``, ``keep_traced`` and the searched ``grid``; the plan's
    tensor groups are those of the chosen setting's job.

    Parameters
    ----------
    session : dpro_kit.session.Session
        The searched trace.
    options : dpro_kit.optimize.driver.OptimizeOptions
        ``min_gain_pct``, ``seed``, ``budget_s`` are used.
    pass_name, framework : str
        The knob pass's name (the plan's change) and the ``frameworks`` key it fills.
    found : dict
        :func:`grid_search`'s result.
    apply_ts : callable
        ``setting -> TraceSet`` (the what-if of ``session.graph_trace`` with that setting).
    apply_hint : str
        How to apply the plan besides the export lines.
    """
    from ..job import Job, identity
    from .driver import Optimized
    from .plan import make_plan, validate_plan
    from .search import SearchResult
    traced, best = found["traced"], found["best"]
    before, after = float(traced["predicted_ms"]), float(best["predicted_ms"])
    keep = after <= 0 or before / after - 1.0 < options.min_gain_pct / 100.0
    chosen = traced if keep else best
    setting = {k: v for k, v in chosen.items() if k != "predicted_ms"}
    after = before if keep else after
    ts = apply_ts(setting)
    base = Job.from_trace(ts, comm_model=session.comm_model)
    s = identity(base)
    reason = (f"keep the traced setting: the best of {found['evaluations']} replayed settings saves less than "
              f"--min-gain {options.min_gain_pct:g} %" if keep else
              f"fastest of {found['evaluations']} replayed settings")
    change = {"pass": pass_name, "args": setting, "reason": reason, "predicted_before_ms": before,
              "predicted_after_ms": after, "applied_as": "environment"}
    result = SearchResult(before_us=before * 1e3, after_us=after * 1e3, initial=s, strategy=s, changes=[change],
                          steps=found["evaluations"], elapsed_s=float(found["elapsed_s"]), stopped=found["stopped"],
                          replays=found["evaluations"], sync_evals=0, memory={}, memory_before={})
    info = {"job": ts.manifest.job, **({"whatif": session.whatif.describe()} if session.whatif else {})}
    plan = make_plan(base, result, trace=str(session.path), info=info,
                     options={"seed": options.seed, "budget_s": options.budget_s, "start": f"{pass_name} grid",
                              "durations": session.info.get("durations", "")})
    plan["frameworks"][framework] = {
        **setting, "keep_traced": keep,
        "traced": {k: v for k, v in traced.items() if k != "predicted_ms"},
        "export": [f"export {k}={v:g}" if isinstance(v, float) else f"export {k}={v}" for k, v in setting.items()],
        "apply": apply_hint, "search": found,
        "note": f"searched on the replayer ({pass_name}): every setting is a what-if of the traced iteration"}
    # the grid's own numbers, not their round trip through microseconds (7.0896 * 1e3 / 1e3 != 7.0896)
    plan["predicted"].update(before_ms=before, after_ms=after)
    plan["estimated"] = [e for e in plan["estimated"] if "(heuristic)" not in e] + [
        f"frameworks.{framework}.* (replayed what-ifs, {pass_name})"]
    validate_plan(plan)
    return Optimized(plan=plan, result=result)
