"""The one path from a trace to a prediction: load → align → fit comm model → what-if → build → replay.

Every command that predicts an iteration time (``dpro replay``, ``graph``,
``check``, ``report``, ``optimize``), the demo and the benches open a
:class:`Session`, so they predict the same number for the same trace and the
same options.  The options every command shares are the arguments of
:class:`Session`: the trace path, clock alignment on/off, a what-if spec, the
durations rule (per-iteration median or mean) and a progress object; the
number of replayed iterations is the argument of :meth:`Session.replay`.

Stages (each computed once, on first use; docs/architecture.md)::

    raw      = load_trace(path)                       # as recorded (memory samples, measured views)
    profiled = align_trace(raw, path)                 # one clock (dpro_kit.align; cached in $DPRO_CACHE/aligned/)
    trace, comm_model = whatif.apply(profiled, fit_from_trace(profiled), whatif)
    job      = Job.from_trace(trace or its median iteration, comm_model)   # dpro_kit.job
    graph    = build(job, identity(job))              # dpro_kit.graph.build: the one graph builder
    replay(iterations)                                # dpro_kit.replay.replay(graph, iterations)

Durations (docs/accuracy.md): *per iteration* builds one graph per profiled
iteration (its own op durations, the comm model fitted on all of them),
replays each once and keeps the graph whose replay is the median
(``statistics.median_low``); *mean* builds one graph of every op's mean
duration (dPRO §4.1).  The default is per iteration unless the trace has more
than :data:`PER_ITERATION_MAX_EVENTS` events.

A graph file written by ``dpro graph`` (``.json`` / ``.graphml``) is also a
session: its graph is used as is (no trace, no what-if).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .errors import DproError

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from .align import AlignResult
    from .costmodel import CommModel
    from .job import Job
    from .optimize.memory import ReplayMemory
    from .replay.engine import ReplayResult
    from .replay.overlap import OverlapFit
    from .trace import TraceSet
    from .whatif import WhatIf

#: above this many events the default durations rule is the mean (one graph per iteration
#: would cost a DFG build per profiled iteration)
PER_ITERATION_MAX_EVENTS = 2_000_000
#: with a what-if, the what-if is replayed for every profiled iteration only while its graphs have at
#: most this many ops in all (else for the median profiled iteration alone)
PER_ITERATION_MAX_OPS = 200_000

DURATIONS_MEAN = "mean over the profiled iterations"
DURATIONS_PER_ITERATION = "per iteration: the median of one replay per profiled iteration"


def median_durations(graph: "nx.DiGraph", graphs: "list[nx.DiGraph]") -> "nx.DiGraph":
    """A copy of ``graph`` whose every op's ``dur`` is the median (``statistics.median``) over ``graphs``.

    ``graphs`` are one-iteration graphs of the same job (:attr:`Session.iteration_graphs`); an op of
    ``graph`` missing from some of them takes the median over those that have it, an op in none keeps
    its duration.  Structure, devices and every other attribute are ``graph``'s.
    """
    import statistics
    out = graph.copy()
    for k, d in out.nodes(data=True):
        vals = [float(g.nodes[k].get("dur", 0.0)) for g in graphs if k in g]
        if vals:
            d["dur"] = statistics.median(vals)
    return out


class Progress(Protocol):
    """What a session reports progress to (:class:`dpro_kit.cli._common.Progress` is one)."""

    def step(self, label: str) -> Callable[[int, int], None] | None:
        """A ``(done, total)`` callback for a long step named ``label``, or None."""

    def note(self, msg: str) -> None:
        """One line about what happens next."""


def is_graph_file(path: str | Path) -> bool:
    """Whether ``path`` is a graph file written by ``dpro graph`` rather than a trace directory.

    Parameters
    ----------
    path : str or Path
        A command's TRACE argument.
    """
    p = Path(path)
    return p.is_file() and p.suffix in (".json", ".graphml") and p.name != "manifest.json"


class Session:
    """One trace (or graph file) opened with the options every predicting command shares.

    Parameters
    ----------
    path : str or Path
        A trace directory (``load_trace`` accepts it, with or without ``manifest.json``)
        or a graph file written by ``dpro graph``.
    align : bool, default True
        Apply the clock alignment of :func:`dpro_kit.align.align_trace` (cached outside the
        trace folder, :func:`dpro_kit.align.cache_dir`) before fitting and building.
    whatif : dpro_kit.whatif.WhatIf or None
        A configuration to predict instead of the profiled one (re-bucketing, bandwidth,
        world size); None or an empty spec keeps the profiled job.
    per_iteration : bool or None, default None
        True: one graph per profiled iteration, the median replay stands for the job;
        False: one graph of mean durations; None: per iteration unless the trace has more
        than :data:`PER_ITERATION_MAX_EVENTS` events (or fewer than two iterations).
    progress : Progress or None
        Receives ``step(label)`` for reading traces and ``note(msg)`` before slow stages.

    Raises
    ------
    DproError
        A what-if or ``per_iteration=True`` asked of a graph file; bad traces raise when
        the stage that reads them runs (:class:`~dpro_kit.errors.TraceFormatError`).

    Examples
    --------
    >>> s = Session("examples/traces/ddp-2rank-gloo")            # doctest: +SKIP
    >>> s.replay().iteration_time_us / 1e3, s.info["durations"]   # doctest: +SKIP
    """

    def __init__(self, path: str | Path, *, align: bool = True, whatif: "WhatIf | None" = None,
                 per_iteration: bool | None = None, progress: Progress | None = None) -> None:
        self.path = Path(path)
        self.align = bool(align)
        self.whatif = whatif if whatif is not None and whatif.any() else None
        self.per_iteration = per_iteration
        self.progress = progress
        self.is_graph_file = is_graph_file(self.path)
        if self.is_graph_file and (self.whatif is not None or per_iteration):
            raise DproError("what-if and --per-iteration need a trace directory, not a graph file", path=self.path)
        self._stages: dict[str, Any] = {}
        self._replays: dict[int, "ReplayResult"] = {}
        self._scheduled: dict[tuple, "ReplayResult"] = {}

    def derive(self, whatif: "WhatIf | None") -> "Session":
        """A session on the same trace with another what-if, sharing what does not depend on it.

        The trace as read, its alignment and the fitted comm model, and (once this session has
        replayed the profiled job per iteration) those replays' times, which a what-if session
        otherwise computes again to pick its iteration and pair its ratios.  The straggler
        attribution derives one session per rank: on a 440-iteration H100 trace each of them re-read
        the store, re-fitted and replayed the 440 iterations again.  Same results as a new
        ``Session(path, whatif=...)`` with this session's options.

        Parameters
        ----------
        whatif : WhatIf or None
            The configuration the new session predicts.
        """
        s = Session(self.path, align=self.align, whatif=whatif, per_iteration=self.per_iteration)
        for k in ("raw", "profiled", "alignment", "fitted", "base_times"):
            if k in self._stages:
                s._stages[k] = self._stages[k]
        return s

    # ------------------------------------------------------------------ stages
    def _note(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.note(msg)

    @property
    def raw(self) -> "TraceSet | None":
        """The trace as recorded (not aligned, no what-if); None for a graph file."""
        if self.is_graph_file:
            return None
        if "raw" not in self._stages:
            from .trace import load_trace
            step = self.progress.step("reading traces") if self.progress is not None else None
            self._stages["raw"] = load_trace(self.path, progress=step, file_progress=(
                self.progress.step if self.progress is not None else None))
        return self._stages["raw"]

    @property
    def profiled(self) -> "TraceSet | None":
        """The profiled job on one clock (``raw`` when alignment is off or does not apply)."""
        if "profiled" not in self._stages:
            ts, result = self.raw, None
            if ts is not None and self.align:
                from .align import align_trace
                ts, result = align_trace(ts, self.path)  # cached in $DPRO_CACHE/aligned/ (dpro_kit.align.cache_dir)
            self._stages["profiled"] = ts
            self._stages["alignment"] = result
        return self._stages["profiled"]

    @property
    def alignment(self) -> "AlignResult | None":
        """The clock alignment applied to ``profiled`` (None: alignment off, not needed or not possible)."""
        self.profiled  # noqa: B018  (aligns)
        return self._stages["alignment"]

    def _job(self) -> tuple["TraceSet | None", "CommModel | None"]:
        if "predicted" not in self._stages:
            ts, model = self.profiled, None
            if ts is not None:
                from .costmodel import fit_from_trace
                model = self._stages["fitted"] if "fitted" in self._stages else fit_from_trace(ts)   # derive() shares it
                self._stages["fitted"] = model
                if self.whatif is not None and self.whatif.recorded_quota:
                    # --recorded-quota where no rank was throttled: the plain replay, bit for bit
                    from .job import JobFacts
                    from .whatif import recorded_limits
                    rec, per = recorded_limits(ts, JobFacts.from_manifest(ts.manifest))
                    self._stages["recorded_quota"] = {"nodes": rec, "period_ms": per / 1e3 if per else None}
                    if not rec:
                        from dataclasses import replace as _replace
                        w = _replace(self.whatif, recorded_quota=False)
                        self.whatif = w if w.any() else None
                if self.whatif is not None:
                    from .whatif import apply
                    ts, model = apply(ts, model, self.whatif)
            self._stages["predicted"] = (ts, model)
        return self._stages["predicted"]

    @property
    def trace(self) -> "TraceSet | None":
        """The job to predict: ``profiled`` with the what-if applied."""
        return self._job()[0]

    @property
    def comm_model(self) -> "CommModel | None":
        """The link model fitted to ``profiled`` (what-if applied, e.g. another bandwidth)."""
        return self._job()[1]

    def uses_per_iteration(self) -> bool:
        """Whether the graph stands for the median profiled iteration (else: mean durations)."""
        ts = self.trace
        if ts is None or ts.events.empty:
            return False
        n_iter = int(ts.events["iteration"].nunique())
        per = self.per_iteration
        if per is None:
            per = len(ts.events) <= PER_ITERATION_MAX_EVENTS
        return bool(per) and n_iter >= 2

    def _build(self) -> None:
        if self.is_graph_file:
            from .graph import load_graph
            self._stages.update(graph=load_graph(self.path), graph_trace=None, job_model=None,
                                per_iteration_ms=None, median_iteration=None)
            return
        from .graph.build import build
        from .graph.model import validate
        from .job import Job, JobFacts, identity

        def build_job(ts_: "TraceSet") -> tuple["Job", "nx.DiGraph"]:
            job = Job.from_trace(ts_, comm_model=model)
            if self.whatif is not None and self.whatif.bandwidth_mbps is not None:
                # another line rate: every transfer from the link model at that rate, not as measured
                # (a trace of per-transfer times - ps-lite, TF PS - kept them and ignored the what-if)
                job.measured = {k: v for k, v in job.measured.items() if not k.startswith(("SEND ", "RECV "))}
            g_ = build(job, identity(job), check=False)
            validate(g_, where=ts_.path)
            if self.whatif is not None and (self.whatif.cpu_limit or self.whatif.recorded_quota):
                # a CPU quota is not a factor on the trace's durations: CFS stops a throttled rank for the
                # rest of each period (dpro_kit.whatif.cpu_limited_graph), which depends on the schedule
                from .whatif import cpu_limit_nodes, cpu_limited_graph, cpu_seen, recorded_limits
                facts = JobFacts.from_manifest(self.profiled.manifest)   # as profiled: a what-if drops measured_*
                limits: dict[str, float] = {}
                period_us = self.whatif.cpu_period_ms * 1e3
                if self.whatif.recorded_quota:
                    limits, rec_period = recorded_limits(ts_, facts)
                    period_us = rec_period or period_us
                    # the kernel's recorded stops are in the traced ops: out before the model puts them back
                    its = ts_.events["iteration"].unique() if not ts_.events.empty else []
                    caps = full_speed_caps.get(int(its[0])) if len(its) == 1 else None
                    for k, f in (caps or {}).items():
                        if k in g_ and g_.nodes[k].get("node") in limits:
                            g_.nodes[k]["dur"] = float(g_.nodes[k]["dur"]) * f
                limits.update(cpu_limit_nodes(ts_, self.whatif))
                if limits:
                    self._stages.setdefault("cpu_limit_of", {})[id(g_)] = cpu_limited_graph(
                        g_, limits, period_us, lambda gg: _replay(gg, 1), cpu_seen=cpu_seen(facts, ts_.manifest.nodes))
            return job, g_
        ts, model = self._job()
        full_speed_caps: dict[int, dict[str, float]] = {}
        self._note(f"building the global DFG of {len(ts.nodes())} node(s)")
        if not self.uses_per_iteration():
            job, g = build_job(ts)
            self._stages.update(graph=g, graph_trace=ts, job_model=job, per_iteration_ms=None,
                                median_iteration=None, cpu_limit=self._stages.get("cpu_limit_of", {}).get(id(g)))
            return
        # one graph per profiled iteration (its own op durations), the comm model fitted on all of them;
        # the graph whose replay is the median stands for the job.  With a what-if, the iteration that
        # stands for the PROFILED job (its median without the what-if) is the one the what-if is applied
        # to: a what-if changes the job, not which profiled iteration represents it (re-selecting the
        # median among the what-if's replays compared different iterations - e.g. one where the slowed
        # rank happened to be fast - and skewed what-if ratios and straggler savings; docs/stragglers.md)
        from .trace import split_iterations

        def iterations_of(ts_: "TraceSet") -> list[int]:
            return sorted(int(i) for i in ts_.events["iteration"].unique())

        split: dict[int, dict[int, "TraceSet"]] = {}   # id(trace) -> its iterations, split once

        def replays(ts_: "TraceSet", builder: Any, its: list[int] | None = None) -> dict[int, tuple]:
            out = {}
            if id(ts_) not in split:
                split[id(ts_)] = split_iterations(ts_)
            for it in iterations_of(ts_) if its is None else its:
                ts_it = split[id(ts_)][it]
                job_it, g_it = builder(ts_it)
                res = _replay(g_it, 1)
                # only the time and the graph of each iteration are kept (hundreds of iterations' jobs and
                # replay results held 1.5 GB for 440 iterations); the median's are rebuilt (full())
                out[it] = (res.iteration_time_us / 1e3, g_it)
            return out

        def full(ts_: "TraceSet", builder: Any, it: int) -> tuple:
            ts_it = split[id(ts_)][it]
            job_it, g_it = builder(ts_it)
            return g_it, ts_it, _replay(g_it, 1), job_it

        def median_of(runs_: dict[int, tuple]) -> int:
            order = sorted(runs_, key=lambda i: runs_[i][0])
            return order[(len(order) - 1) // 2]

        if self.whatif is None:
            runs = replays(ts, build_job)
            median_it = median_of(runs)
            self._stages["base_times"] = {i: r[0] for i, r in runs.items()}   # what derive()'d what-ifs compare to
        else:
            base_model = self._stages.get("fitted")

            def build_base(ts_: "TraceSet") -> tuple["Job", "nx.DiGraph"]:
                job = Job.from_trace(ts_, comm_model=base_model)
                g_ = build(job, identity(job), check=False)
                return job, g_
            if "base_times" in self._stages and not self.whatif.recorded_quota:
                # the job as profiled, replayed per iteration by the session this one was derived from
                base_runs = {i: (ms, None) for i, ms in self._stages["base_times"].items()}
            else:
                base_runs = replays(self.profiled, build_base)
            if self.whatif.recorded_quota:
                # per iteration and op of a throttled rank: the factor that takes the kernel's recorded stops
                # out of its traced ops (whatif.dethrottle_factors; a factor composes with --slow-rank)
                from .whatif import dethrottle_factors, recorded_limits
                pfacts = JobFacts.from_manifest(self.profiled.manifest)
                rec, _ = recorded_limits(self.profiled, pfacts)
                full_speed_caps.update(dethrottle_factors({it: r[1] for it, r in base_runs.items()}, rec, pfacts))
            its = iterations_of(ts)
            if base_runs and median_of(base_runs) in its:
                median_it = median_of(base_runs)
                # the iteration that stands for the job first; the others only while the what-if's graphs
                # stay small (a --world-size what-if of a ring job grows as W^2 ops, one build per iteration)
                runs = replays(ts, build_job, [median_it])
                ops = runs[median_it][1].number_of_nodes()
                if ops * len(its) <= PER_ITERATION_MAX_OPS:
                    runs.update(replays(ts, build_job, [i for i in its if i != median_it]))
                else:
                    self._stages["whatif_median_only"] = (
                        f"the what-if's graph has {ops:,} ops: replayed for the median profiled iteration "
                        f"({median_it}) only, not for each of the {len(its)} (more than "
                        f"{PER_ITERATION_MAX_OPS:,} ops in all)")
                    self._note(self._stages["whatif_median_only"])
                self._stages["paired"] = {str(i): round(runs[i][0] / base_runs[i][0], 6)
                                          for i in sorted(runs) if i in base_runs and base_runs[i][0] > 0}
            else:
                runs = replays(ts, build_job)
                median_it = median_of(runs)
        g, ts_it, res, job = full(ts, build_job, median_it)
        runs[median_it] = (runs[median_it][0], g)
        self._replays[1] = res
        self._stages.update(graph=g, graph_trace=ts_it, job_model=job, median_iteration=median_it,
                            per_iteration_ms={str(i): runs[i][0] for i in sorted(runs)},
                            iteration_graphs={i: runs[i][1] for i in sorted(runs)},
                            cpu_limit=self._stages.get("cpu_limit_of", {}).get(id(g)))

    @property
    def graph(self) -> "nx.DiGraph":
        """The global DFG that stands for the job (built once; do not modify it in place)."""
        if "graph" not in self._stages:
            self._build()
        return self._stages["graph"]

    @property
    def iteration_graphs(self) -> "dict[int, nx.DiGraph]":
        """Per profiled iteration, the global DFG of its own op durations (what-if applied); ``{}`` with mean durations.

        ``graph`` is the one of them whose replay of the job as profiled is the median.
        """
        self.graph  # noqa: B018  (builds them)
        return dict(self._stages.get("iteration_graphs") or {})

    @property
    def op_median_graph(self) -> "nx.DiGraph":
        """``graph`` with every op's duration the median of its durations over the profiled iterations.

        :func:`median_durations` of :attr:`iteration_graphs`; ``graph`` itself with mean durations or one
        iteration.  For schedules whose critical path runs through other ops than the profiled job's
        (``dpro replay --deft``, docs/deft.md §7): the iteration whose stock replay is the median can
        carry a one-iteration spike (a 3.8 ms ``AccumulateGrad`` where the others take 0.3-0.8 ms) that
        the stock job hides under communication and a schedule with a second link does not.
        """
        if "op_median_graph" not in self._stages:
            gs = list(self.iteration_graphs.values())
            self._stages["op_median_graph"] = median_durations(self.graph, gs) if len(gs) >= 2 else self.graph
        return self._stages["op_median_graph"]

    @property
    def job(self) -> "Job | None":
        """The :class:`~dpro_kit.job.Job` ``graph`` is ``build(job, identity(job))`` of; None for a graph file.

        The optimizer starts from it (:mod:`dpro_kit.optimize.load`), so its rebuilds and
        ``dpro replay`` come from the same job and the same builder.
        """
        self.graph  # noqa: B018  (builds it)
        return self._stages["job_model"]

    @property
    def graph_trace(self) -> "TraceSet | None":
        """The TraceSet ``graph`` was built from: ``trace``, or its median iteration; None for a graph file."""
        self.graph  # noqa: B018  (builds it)
        return self._stages["graph_trace"]

    @property
    def info(self) -> dict[str, Any]:
        """Facts about the job for a command's output (the keys of ``dpro replay --json`` they fill).

        ``job``, ``framework``, ``comm_backend``, ``world_size``, ``profiled_iterations``,
        ``whatif`` (with a what-if), ``measured_iteration_ms`` (when the trace has it and no
        what-if), ``durations`` and, per iteration, ``per_iteration_ms`` and ``median_iteration``.
        Empty for a graph file.
        """
        if self.is_graph_file:
            return {}
        prof, ts = self.profiled, self.trace
        m = prof.manifest
        info: dict[str, Any] = {"job": m.job, "framework": m.framework, "comm_backend": m.comm_backend,
                                "world_size": m.world_size, "profiled_iterations": m.iterations}
        if self.whatif is not None:
            info["whatif"] = self.whatif.describe()
            info["world_size"] = ts.manifest.world_size
        from .job import JobFacts
        measured = JobFacts.from_manifest(ts.manifest).measured_iteration_ms
        if measured is not None and self.whatif is None:
            info["measured_iteration_ms"] = measured
        self.graph  # noqa: B018  (decides the durations rule)
        if "recorded_quota" in self._stages:
            # --recorded-quota: the throttled ranks and their recorded quota ({} : nothing throttled, plain replay)
            info["recorded_quota"] = dict(self._stages["recorded_quota"])
        if isinstance(ts.manifest.extra, dict) and ts.manifest.extra.get("slow_host"):
            # --slow-host: per slowed worker its computation, CPU per iteration, CPUs while not computing and
            # the factor on its transfers (dpro_kit.whatif.slow_hosts)
            info["slow_host"] = dict(ts.manifest.extra["slow_host"])
        if self._stages.get("cpu_limit"):
            # the CPU-quota what-if on the graph that stands for the job: per limited worker its computation
            # at full speed, as stretched by the quota, and the time stopped per iteration
            info["cpu_limit"] = dict(self._stages["cpu_limit"])
        if self._stages["per_iteration_ms"] is None:
            info["durations"] = DURATIONS_MEAN
        else:
            info["durations"] = DURATIONS_PER_ITERATION
            if self._stages.get("whatif_median_only"):
                info["durations"] += f" ({self._stages['whatif_median_only']})"
            info["per_iteration_ms"] = dict(self._stages["per_iteration_ms"])
            info["median_iteration"] = self._stages["median_iteration"]
            if self._stages.get("paired"):
                # per profiled iteration: the what-if's replay / the profiled job's replay of that iteration
                info["whatif_ratio_per_iteration"] = dict(self._stages["paired"])
        return info

    # ------------------------------------------------------------------ replay
    def memory(self, res: "ReplayResult", limit: int | None = None) -> "ReplayMemory":
        """Memory of every worker over the replay ``res`` of ``graph`` and the OOM verdict against ``limit``.

        The ops' ``mem_alloc`` / ``mem_free`` come from the graph when it has them (a graph file, a
        simulated strategy), else from the trace's allocator samples (``dpro profile --memory``:
        :func:`dpro_kit.optimize.memory.graph_memory`, on a copy of ``graph``).
        """
        from .optimize.memory import build_profile, graph_memory, replay_memory
        if "memory_graph" not in self._stages:
            g = self.graph
            if not any("mem_alloc" in d or "mem_free" in d for _, d in g.nodes(data=True)):
                prof = build_profile(self.profiled) if self.profiled is not None else None
                if prof is None:
                    raise DproError("the trace has no allocator samples, so there is no memory to replay",
                                    path=self.path, hint="profile with `dpro profile --memory`")
                g = g.copy()
                graph_memory(g, prof)
            self._stages["memory_graph"] = g
        return replay_memory(res, self._stages["memory_graph"], limit)

    def overlap_fit(self) -> "OverlapFit":
        """Proteus' overlap factor fitted to the profiled trace (:func:`dpro_kit.replay.overlap.fit_overlap_factor`)."""
        if "overlap_fit" not in self._stages:
            from .replay.overlap import OverlapFit, fit_overlap_factor
            ts = self.profiled
            self._stages["overlap_fit"] = (fit_overlap_factor(ts) if ts is not None else
                                           OverlapFit(None, None, 0, 0, 0, "", reason="a graph file has no trace"))
        return self._stages["overlap_fit"]

    def replay(self, iterations: int = 1, schedule: str = "graph", device_model: str = "fifo",
               overlap_factor: "float | str" = 0.0, model_options: dict | None = None) -> "ReplayResult":
        """Replay ``graph`` for ``iterations`` back-to-back iterations (cached per count, schedule and model).

        Parameters
        ----------
        iterations : int, default 1
            Iterations to unroll; the result's ``iteration_time_us`` is the steady-state gap.
        schedule : str, default "graph"
            A priority order of :data:`dpro_kit.replay.rules.SCHEDULES` (``tic``, ``tac``,
            ``random``: TicTac's orders of PS transfers, :mod:`dpro_kit.optimize.tictac`).
        device_model : str, default "fifo"
            ``fifo`` (links are queues) or ``shared`` (Proteus: concurrent transfers share bandwidth,
            :mod:`dpro_kit.replay.sharing`).
        overlap_factor : float or "fit", default 0
            Proteus' gamma: computation overlapped with a transfer of its host is slowed by (1+gamma).
            With ``fifo`` it runs the ``shared`` executor with ``share=False`` (links stay queues).
            ``"fit"``: :meth:`overlap_fit`'s gamma (0 when the trace cannot tell).  The trace's computation
            durations are first brought back to solo times (:func:`dpro_kit.replay.overlap.deoverlap`),
            then slowed where the replayed schedule overlaps.
        model_options : dict, optional
            More options of the ``shared`` model (``capacity``, ``fabric_capacity``); the node -> host
            map is the manifest's.
        """
        opts = dict(model_options or {})
        if overlap_factor == "fit":
            overlap_factor = self.overlap_fit().gamma or 0.0
        if overlap_factor:
            opts["overlap_factor"] = float(overlap_factor)
        if device_model == "fifo" and opts:
            device_model, opts["share"] = "shared", False
        if device_model == "shared":
            ts = self.graph_trace
            if ts is not None and "hosts" not in opts:
                opts["hosts"] = {n: i.host for n, i in ts.manifest.nodes.items() if i.host}
            if "comm_devices" not in opts:   # devices that run only communication (e.g. a GPU's NCCL stream)
                kinds: dict[str, set] = {}
                for _, d in self.graph.nodes(data=True):
                    dv = d.get("device")
                    if dv and not str(dv).startswith("link:"):
                        kinds.setdefault(dv, set()).add(d.get("kind"))
                from .trace import COMM_KINDS
                opts["comm_devices"] = sorted(dv for dv, k in kinds.items() if k <= COMM_KINDS
                                              and not dv.endswith(":comm"))
        if schedule != "graph" or device_model != "fifo":
            key = (iterations, schedule, device_model, repr(sorted(opts.items())))
            if key not in self._scheduled:
                from .replay import replay as run_replay
                g = self.graph
                if opts.get("overlap_factor"):
                    # the trace's durations include the slowdown of the profiled overlap: back to solo times
                    from .replay.overlap import deoverlap
                    g, _ = deoverlap(g, self.graph_trace, opts["overlap_factor"])
                self._scheduled[key] = (_replay(g, iterations, device_model=device_model,
                                                model_options=opts or None) if schedule == "graph" else
                                        run_replay(g, iterations=iterations, schedule=schedule,
                                                   device_model=device_model, model_options=opts or None))
            return self._scheduled[key]
        if iterations not in self._replays:
            g = self.graph
            if iterations not in self._replays:   # building per iteration already replayed once
                self._replays[iterations] = _replay(g, iterations)
        return self._replays[iterations]

    def iteration_time_ms(self, iterations: int = 1) -> float:
        """The predicted iteration time (ms) of ``replay(iterations)``."""
        return self.replay(iterations).iteration_time_us / 1e3

    def fast_replay(self, iterations: int = 1) -> dict[str, Any]:
        """The iteration time only, for jobs of many ranks (``dpro replay --fast``, docs/scale.md):
        the replay arrays built straight from the event tables by
        :func:`dpro_kit.graph.arrays.compile_trace_or_graph` (through networkx where the arrays do not
        cover the job's collectives), op durations the mean over the profiled iterations; no graph,
        breakdown or what-if.  Ignores the session's what-if.

        Returns ``compiled_by`` ("arrays" or "networkx"), ``ops``, ``iterations_replayed``,
        ``iteration_time_ms``, ``makespan_ms``, ``compile_and_replay_cpu_s`` and, when the trace
        records it, ``measured_iteration_ms`` and ``error_pct``.
        """
        import time

        from .graph.arrays import compile_trace_or_graph
        from .job import JobFacts
        from .replay import replay as run
        ts = self.profiled
        if ts is None:
            raise DproError("a fast replay needs a trace directory, not a graph file", path=self.path)
        t0 = time.process_time()
        self._note("compiling the replay arrays from the event tables")
        cg, path = compile_trace_or_graph(ts, comm_model=self.comm_model)
        res = run(cg, iterations=iterations)
        out: dict[str, Any] = {"compiled_by": path, "ops": int(cg.n), "iterations_replayed": iterations,
                               "iteration_time_ms": res.iteration_time_us / 1e3, "makespan_ms": res.makespan_us / 1e3,
                               "compile_and_replay_cpu_s": round(time.process_time() - t0, 3)}
        measured = JobFacts.from_manifest(ts.manifest).measured_iteration_ms
        if measured is not None:
            out["measured_iteration_ms"] = measured
            out["error_pct"] = 100.0 * (out["iteration_time_ms"] - measured) / measured
        return out


__all__ = ["DURATIONS_MEAN", "DURATIONS_PER_ITERATION", "PER_ITERATION_MAX_EVENTS", "PER_ITERATION_MAX_OPS", "Progress", "Session",
           "is_graph_file"]


#: iterations replayed for a job whose workers run asynchronously (the first is a start-up transient)
ASYNC_ITERATIONS = 12


def _replay(g: "nx.DiGraph", iterations: int, **kw: Any) -> "ReplayResult":
    """``replay(g, iterations)``; an asynchronous job (:func:`dpro_kit.graph.schemes.asynchronous_workers`)
    is replayed for at least :data:`ASYNC_ITERATIONS` iterations and reports its workers' steady state.

    One replayed iteration of an asynchronous PS job starts every worker at 0, so every push meets
    every other worker's on the server's link; the real workers drift apart after a step and overlap
    one's computation with another's transfers (MXNet dist_async CNN, 2 workers, 200 Mbit/s: one
    iteration 45.0 ms, steady state 36.2 ms, measured 33.5 ms).
    """
    import numpy as np

    from .graph.schemes import asynchronous_workers
    from .replay import replay as run_replay
    workers = asynchronous_workers(g)
    if not workers:
        return run_replay(g, iterations=iterations, **kw)
    res = run_replay(g, iterations=max(iterations, ASYNC_ITERATIONS), **kw)
    node_of = np.array([g.nodes[k].get("node", "") for k in res.graph.keys], dtype=object)
    res.steady = {w: np.flatnonzero(node_of == w) for w in workers}
    return res
