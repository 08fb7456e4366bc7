"""Horovod's runtime knobs: ``HOROVOD_FUSION_THRESHOLD`` and ``HOROVOD_CYCLE_TIME`` searched on the replayer.

A Horovod job's tensor groups are not chosen by the program but by Horovod's background
loop: every cycle (``HOROVOD_CYCLE_TIME``) it fuses the gradients that every rank has ready
into buffers of at most ``HOROVOD_FUSION_THRESHOLD`` bytes.  So the strategy a plan can set
is the pair of knobs, and the search is over them: every candidate is the what-if of
:func:`dpro_kit.whatif.horovod_knobs` (the same model ``dpro replay --fusion-threshold-mb
--cycle-time-ms`` uses, docs/horovod.md: Horovod's loop) applied to each profiled iteration
on its own, built and replayed, and judged by the mean (:func:`evaluate`: which gradients
share a tick differs between iterations).  A grid, not a local search: two knobs, a few dozen
settings (thresholds at or above all the gradients' bytes are one setting), a few replays of
each profiled iteration each (tens of seconds), and the replayed time is not convex in either
(a threshold changes which tensors share a buffer only at the byte sums of consecutive
gradients).

The grid covers the range of Horovod's own autotuner (``horovod/common/parameter_manager.cc``
in 0.28.1: threshold 0-64 MiB, cycle time 1-100 ms) plus its defaults (128 MiB, 1 ms); a
cycle time below 1 ms is not offered (Horovod's background thread then polls more often
than the model charges for, on the same CPU as the training thread).

:class:`HorovodKnobs` is registered with the optimizer's passes
(:func:`dpro_kit.optimize.passes.register_pass`) as a *knob pass*: it does not transform a
:class:`~dpro_kit.job.Strategy` but the whole job's runtime settings, so
:func:`dpro_kit.optimize.driver.optimize` runs it instead of the strategy search on the
traces it applies to (:meth:`HorovodKnobs.applies`).

How to apply a plan: ``plan["frameworks"]["horovod"]["export"]`` holds the shell lines
(``dpro optimize`` prints them), and ``python -m dpro_torch.hvd_launch --plan plan.json``
sets the two variables for the ranks it starts.

References
----------
.. [1] Sergeev, Del Balso, "Horovod: fast and easy distributed deep learning in
   TensorFlow", arXiv:1802.05799, 2018 (tensor fusion).
.. [2] Hu et al., "dPRO", MLSys 2022, §5 (replay-guided strategy search; the tensor-fusion
   pass that these knobs express in Horovod).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import DproError
from .passes import GraphPass, PassRefused, register_pass

if TYPE_CHECKING:  # pragma: no cover
    from ..costmodel import CommModel
    from ..session import Session
    from ..trace import TraceSet
    from .driver import Optimized, OptimizeOptions

__all__ = ["CYCLES_MS", "THRESHOLDS_MB", "HorovodKnobs", "evaluate", "export_lines", "is_horovod", "search"]

#: fusion thresholds tried (MiB): Horovod's autotuner range (0-64 MiB) and its default 128 MiB
THRESHOLDS_MB = (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
#: cycle times tried (ms): Horovod's autotuner range (1-100 ms), its default 1 ms first
CYCLES_MS = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)
def is_horovod(ts: "TraceSet | None") -> bool:
    """Whether ``ts`` is a Horovod job read by :mod:`dpro_kit.readers.horovod` (its knobs can be searched).

    Parameters
    ----------
    ts : TraceSet or None
        A trace (None: a graph file, which has no Horovod ops to re-pack).
    """
    if ts is None:
        return False
    extra = ts.manifest.extra if isinstance(ts.manifest.extra, dict) else {}
    return isinstance(extra.get("horovod"), dict) and any(
        c.tensor.startswith("hvd") and c.tensor.endswith("-negotiate") for c in ts.collectives)


def evaluate(ts: "TraceSet", model: "CommModel", fusion_threshold_bytes: int, cycle_time_ms: float) -> float:
    """The replayed iteration time (ms) of ``ts`` with Horovod's knobs set to the given values: the mean
    over its profiled iterations, each through :func:`dpro_kit.whatif.horovod_knobs` on its own.

    Which gradients one tick takes depends on when they are ready, which differs between iterations
    (cnn at 100 Mbit/s: the 5 KB ``fc2`` gradient 0-3 ms before ``fc1``'s): a cycle time that fuses
    them in some iterations saves a buffer there, so every iteration gets the loop's own buffers and
    the setting is judged by the mean (the iteration ``dpro replay`` stands for may be one where they
    come together whatever the cycle).

    Parameters
    ----------
    ts : TraceSet
        A Horovod trace (one or several profiled iterations).
    model : CommModel
        Its fitted comm model.
    fusion_threshold_bytes : int
        ``HOROVOD_FUSION_THRESHOLD`` (> 0).
    cycle_time_ms : float
        ``HOROVOD_CYCLE_TIME`` (ms).
    """
    from ..trace import split_iterations
    from ..whatif import horovod_knobs
    from .knobs import replay_ms
    its = list(split_iterations(ts).values()) if ts.events["iteration"].nunique() > 1 else [ts]
    return sum(replay_ms(horovod_knobs(t, int(fusion_threshold_bytes), float(cycle_time_ms), model), model)
               for t in its) / len(its)


def search(session: "Session", *, thresholds_mb: tuple[float, ...] = THRESHOLDS_MB,
           cycles_ms: tuple[float, ...] = CYCLES_MS, deadline: float | None = None) -> dict[str, Any]:
    """Grid search of ``HOROVOD_FUSION_THRESHOLD`` x ``HOROVOD_CYCLE_TIME`` on the replayer.

    Every setting is evaluated on the same profiled iterations and comm model (``session.trace``,
    ``session.comm_model``; :func:`evaluate`: the mean over the iterations), the traced setting
    too, so ``before`` and ``best`` are replays of the same iterations
    (:func:`dpro_kit.optimize.knobs.grid_search`: ties go to the setting closest to the traced one).

    Parameters
    ----------
    session : dpro_kit.session.Session
        A Horovod trace (:func:`is_horovod`); a what-if of the session (e.g. another
        bandwidth) applies to every candidate.
    thresholds_mb, cycles_ms : tuple of float
        The grid (MiB, ms).
    deadline : float or None
        ``time.perf_counter()`` after which no more settings are evaluated.

    Returns
    -------
    dict
        :func:`dpro_kit.optimize.knobs.grid_search`'s result; settings as
        ``{"HOROVOD_FUSION_THRESHOLD": bytes, "HOROVOD_CYCLE_TIME": ms}``.

    Raises
    ------
    DproError
        The trace is not a Horovod trace.
    """
    from ..trace import split_iterations
    from .knobs import grid_search
    ts, model = session.trace, session.comm_model
    if not is_horovod(ts):
        raise DproError("the Horovod knob search needs a Horovod trace (dpro profile of a Horovod job)",
                        path=session.path, hint="docs/horovod.md")
    hv = ts.manifest.extra["horovod"]
    traced = {"HOROVOD_FUSION_THRESHOLD": int(hv.get("fusion_threshold_bytes", 128 << 20)),
              "HOROVOD_CYCLE_TIME": float(hv.get("cycle_time_ms", 1.0))}
    cands = [{"HOROVOD_FUSION_THRESHOLD": int(mb * 2**20), "HOROVOD_CYCLE_TIME": float(c)}
             for c in cycles_ms for mb in thresholds_mb]
    its = list(split_iterations(ts).values())     # split once, not per setting
    # thresholds at or above all the gradients' bytes fuse alike: replayed once per cycle time
    total = sum(b for c in ts.collectives if not c.tensor.endswith("-negotiate") for b in c.param_bytes)
    done: dict[tuple[int, float], float] = {}

    def mean_ms(k: dict[str, Any]) -> float:
        key = (min(int(k["HOROVOD_FUSION_THRESHOLD"]), total), float(k["HOROVOD_CYCLE_TIME"]))
        if key not in done:
            done[key] = sum(evaluate(t, model, key[0], key[1]) for t in its) / len(its)
        return done[key]
    return grid_search(mean_ms, cands, traced, deadline=deadline)


def export_lines(threshold_bytes: int, cycle_ms: float) -> list[str]:
    """The shell lines that set the knobs for a job's ranks (``plan["frameworks"]["horovod"]["export"]``)."""
    return [f"export HOROVOD_FUSION_THRESHOLD={int(threshold_bytes)}", f"export HOROVOD_CYCLE_TIME={cycle_ms:g}"]


@register_pass
class HorovodKnobs(GraphPass):
    """Knob pass: Horovod's fusion threshold and cycle time, searched by replaying what-ifs (module docstring).

    A knob pass changes a framework's runtime settings, not the DFG strategy, so it has no
    :meth:`apply`; :func:`dpro_kit.optimize.driver.optimize` calls :meth:`optimize` for the
    traces :meth:`applies` to.
    """

    name = "horovod_knobs"
    #: a knob pass (see :mod:`dpro_kit.optimize.passes`): the driver calls ``optimize`` instead of the search
    knobs = True

    def apply(self, state, base, **args):  # noqa: D102 - not a strategy pass
        raise PassRefused("horovod_knobs sets HOROVOD_FUSION_THRESHOLD / HOROVOD_CYCLE_TIME, not a strategy: "
                          "dpro optimize runs it on Horovod traces (dpro_kit.optimize.horovod.search)")

    def applies(self, session: "Session") -> bool:
        """True for a Horovod trace (:func:`is_horovod`)."""
        return not session.is_graph_file and is_horovod(session.trace)

    def optimize(self, session: "Session", options: "OptimizeOptions") -> "Optimized":
        """Search the knobs (:func:`search`) and make the plan (``plan.json``) of the best setting.

        The plan's tensor groups are the fusion buffers of the best setting in the replayed
        iteration (Horovod's negotiation messages left out); ``frameworks.horovod`` has the two
        variables, their ``export`` lines and the searched grid.  A setting predicted to save
        less than ``options.min_gain_pct`` keeps the traced one
        (:func:`dpro_kit.optimize.knobs.knob_plan`).

        Parameters
        ----------
        session : dpro_kit.session.Session
            A Horovod trace.
        options : dpro_kit.optimize.driver.OptimizeOptions
            ``budget_s`` bounds the search; ``min_gain_pct`` as for any plan.
        """
        from ..readers.horovod import NEGOTIATION_SUFFIX
        from ..whatif import horovod_knobs
        from .knobs import knob_plan
        found = search(session, deadline=time.perf_counter() + options.budget_s)
        done = knob_plan(session, options, pass_name=self.name, framework="horovod", found=found,
                         apply_ts=lambda k: horovod_knobs(session.graph_trace, int(k["HOROVOD_FUSION_THRESHOLD"]),
                                                          float(k["HOROVOD_CYCLE_TIME"]), session.comm_model),
                         apply_hint="run the export lines in the shell that starts the ranks, or "
                                    "`python -m dpro_torch.hvd_launch --plan plan.json -- ...`")
        plan = done.plan
        # the negotiation collectives are Horovod's control messages, not tensor groups a user sets
        plan["tensor_groups"] = [g for g in plan["tensor_groups"] if not g["name"].endswith(NEGOTIATION_SUFFIX)]
        plan["frameworks"]["pytorch_ddp"]["note"] = "not a DDP job: Horovod fuses by HOROVOD_FUSION_THRESHOLD"
        hv = plan["frameworks"]["horovod"]
        hv["HOROVOD_FUSION_THRESHOLD"] = int(hv["HOROVOD_FUSION_THRESHOLD"])
        hv["export"] = export_lines(hv["HOROVOD_FUSION_THRESHOLD"], float(hv["HOROVOD_CYCLE_TIME"]))
        return done
