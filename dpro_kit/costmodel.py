"""Cost models for operations the trace did not time one by one.

The foundation needs one: the time to move ``b`` bytes over a link,
``latency + b / bandwidth`` (the alpha-beta model).  When a trace has
per-chunk SEND/RECV timestamps the graph builder uses those instead; when it
only has whole collectives (e.g. gloo's ``allreduce``), the link parameters are
fitted to them: a ring AllReduce of ``S`` bytes over ``N`` ranks is
``2(N-1)`` sequential steps of ``S/N`` bytes, so ``T(S) = 2(N-1)(alpha + S/(N*B))``
and a non-negative least-squares fit over the observed collectives gives
``alpha`` and ``B``.  Each collective's time is taken as the *minimum* over the
ranks of that iteration (the last rank to enter waits least, so its duration is
closest to the transfer itself); per tensor the median over iterations is used
(robust to the iterations in which a gloo worker thread was descheduled on a
busy machine - those can take several times longer).

A trace with two or three bucket sizes cannot separate ``alpha`` from ``B``
well, and a wrong ``alpha`` matters most where it is multiplied: plans with
many small groups.  So when the collector timed tiny allreduces on the job's
own process group (``manifest.extra.comm_calibration``, one element, median
of several), that time is the per-collective cost: ``alpha`` is fixed to
``T_tiny / (2(N-1))`` and only ``B`` is fitted (:func:`collective_latency_us`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .schema import Facts

#: Used when the trace has no communication timing at all (stated in results).
DEFAULT_LATENCY_US = 20.0
DEFAULT_BANDWIDTH_BPS = 10e9 / 8  # 10 Gbit/s
#: largest share of the median ring step a fitted per-step latency may take (else: fit through the origin)
LATENCY_SHARE_MAX = 0.5


@dataclass
class LinkModel:
    latency_us: float
    bandwidth_Bps: float  # bytes per second

    def time_us(self, nbytes: float) -> float:
        return self.latency_us + float(nbytes) / self.bandwidth_Bps * 1e6


@dataclass
class CommModel:
    """Transfer time per link; ``per_link`` overrides ``default`` for named links."""

    default: LinkModel = field(default_factory=lambda: LinkModel(DEFAULT_LATENCY_US, DEFAULT_BANDWIDTH_BPS))
    per_link: dict[str, LinkModel] = field(default_factory=dict)
    origin: str = "default"  # default | fitted | user
    #: host -> factor on the bandwidth of every network link that host's interface carries
    #: (``dpro replay --slow-link HOST=F``; :func:`link_hosts` says which hosts a link touches)
    host_bandwidth_factor: dict[str, float] = field(default_factory=dict)
    #: host -> factor on the whole time of every transfer on a link that host's interface carries: the
    #: CPU-bound part of the transfer stretched on a host with less CPU (``dpro replay --slow-host``,
    #: :func:`dpro_kit.whatif.slow_hosts`); the largest factor of the link's hosts applies
    host_time_factor: dict[str, float] = field(default_factory=dict)

    def transfer_us(self, nbytes: float, link: str = "") -> float:
        lm = self.per_link.get(link, self.default)
        t = lm.time_us(nbytes)
        if self.host_bandwidth_factor:
            f = min((self.host_bandwidth_factor.get(h, 1.0) for h in link_hosts(link)), default=1.0)
            if f != 1.0:
                t = lm.latency_us + float(nbytes) / (lm.bandwidth_Bps * f) * 1e6
        if self.host_time_factor:
            t *= max((self.host_time_factor.get(h, 1.0) for h in link_hosts(link)), default=1.0)
        return t

    def describe(self) -> dict[str, Any]:
        return {"origin": self.origin, "latency_us": self.default.latency_us,
                "bandwidth_Mbps": self.default.bandwidth_Bps * 8 / 1e6,
                "per_link": {k: asdict(v) for k, v in self.per_link.items()}}


def link_hosts(link: str) -> list[str]:
    """The hosts whose network interface a link device uses: ``link:A->B`` (hosts A and B),
    ``link:H:upload`` / ``link:H:download`` (host H); none for a link between two nodes of one
    host (``link:host0/0->host0/1``: node names, no network)."""
    if not link.startswith("link:"):
        return []
    body = link[5:]
    if "->" in body:
        ends = body.split("->", 1)
        return [] if any("/" in e for e in ends) else ends
    host, _, _direction = body.rpartition(":")
    return [host] if host else []


def fit_from_trace(ts: Any) -> CommModel:
    """The comm model of a TraceSet: :func:`fit_from_events` with the collector's calibrated
    per-collective latency when the manifest has one.  Every caller fits through here.

    Parameters
    ----------
    ts : TraceSet
        The (aligned) trace whose coarse collectives are fitted.
    """
    comm = ts.events[(ts.events["kind"] == "COMM") & (ts.events["bytes"] > 0)]
    if not comm.empty and (comm["phase"] == "push_pull").all():
        model = fit_ps_groups(comm, ts.manifest.world_size, max(1, len(ts.manifest.servers())))
        return calibrate_ps_by_replay(ts, model) if model.origin != "default" else model
    if comm.empty and ts.manifest.servers():
        model = fit_ps_transfers(ts.events)
        if model.origin != "default":
            return model
    events = ts.events
    if ts.manifest.raw_format == "horovod-torch":
        # Horovod's timeline covers the whole run: the allreduces outside the profiler's window time the
        # network without the profiler's slow-down (dpro_kit.readers.horovod.unprofiled_comm_events)
        from .readers.horovod import unprofiled_comm_events
        unprofiled = unprofiled_comm_events(ts)
        if unprofiled is not None:
            events = unprofiled
    return fit_from_events(events, ts.manifest.world_size, ts.manifest.facts.collective_latency_us)


def collective_latency_us(extra: dict[str, Any] | None) -> float | None:
    """Per-collective cost measured by the collector (``extra.comm_calibration.median_us``), if any
    (:attr:`dpro_kit.schema.Facts.collective_latency_us`)."""
    return Facts.from_extra(extra if isinstance(extra, dict) else {}).collective_latency_us


def fit_ring_allreduce(sizes: np.ndarray, times_us: np.ndarray, n: int,
                       collective_latency_us: float | None = None) -> LinkModel | None:
    """Fit ``T = 2(N-1)(alpha + S/(N*B))`` by non-negative least squares.

    Returns ``None`` when there is nothing to fit.  With a single distinct size
    the two terms cannot be separated; latency is then taken as 0 (bandwidth
    absorbs it), which is exact for that size.  The same through-origin fit is
    used when the fitted latency would be more than ``LATENCY_SHARE_MAX`` of the
    median step time (see the comment in the code).

    Parameters
    ----------
    sizes : numpy.ndarray
        Bytes of each traced collective.
    times_us : numpy.ndarray
        Their durations (us).
    n : int
        Ranks in the ring.
    collective_latency_us : float or None
        Per-collective latency calibrated by the collector (tiny AllReduce); None: fitted.

    References
    ----------
    .. [1] Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
           MPICH", IJHPCA 2005 (alpha-beta cost of ring AllReduce).
    """
    sizes = np.asarray(sizes, dtype=float)
    times_us = np.asarray(times_us, dtype=float)
    ok = np.isfinite(sizes) & np.isfinite(times_us) & (times_us > 0) & (sizes > 0)
    sizes, times_us = sizes[ok], times_us[ok]
    if n < 2 or sizes.size == 0:
        return None
    steps = 2 * (n - 1)
    x = sizes / n  # bytes per step
    t = times_us / steps
    if collective_latency_us is not None:
        alpha = collective_latency_us / steps
        rest = np.maximum(t - alpha, 0.0)
        inv_bw = float(np.sum(rest * x) / np.sum(x * x))
        if inv_bw > 0:
            return LinkModel(latency_us=float(alpha), bandwidth_Bps=float(1e6 / inv_bw))
    if np.unique(sizes).size >= 2:
        from scipy.optimize import nnls  # scipy comes with cvxpy
        a = np.column_stack([np.ones_like(x), x])
        (alpha, inv_bw), _ = nnls(a, t)
        # A per-step latency that is most of a typical step is not a latency: on the links seen
        # here (gloo over TCP, tbf-shaped) a collective pays a start-up cost once (TCP restarting
        # from idle, the shaper's burst credit) and its buckets overlap on gloo's two threads, so
        # sizes and times correlate weakly and the intercept swallows the transfer.  Multiplying
        # such an intercept by 2(N-1) steps (another world size, smaller chunks) overshoots
        # badly, so then the throughput fit through the origin (below) is used instead.
        if inv_bw > 0 and alpha <= LATENCY_SHARE_MAX * float(np.median(t)):
            return LinkModel(latency_us=float(alpha), bandwidth_Bps=float(1e6 / inv_bw))
    inv_bw = float(np.sum(t * x) / np.sum(x * x))
    return LinkModel(latency_us=0.0, bandwidth_Bps=float(1e6 / inv_bw)) if inv_bw > 0 else None


def fit_from_events(events: pd.DataFrame, world_size: int, collective_latency_us: float | None = None) -> CommModel:
    """Fit a :class:`CommModel` to the coarse collectives (kind COMM) in a trace.

    ``collective_latency_us``: a measured per-collective cost (see :func:`collective_latency_us`);
    it fixes the latency term and only the bandwidth is fitted.
    """
    comm = events[(events["kind"] == "COMM") & (events["bytes"] > 0)]
    if not comm.empty and (comm["phase"] == "push_pull").all():
        return fit_ps_groups(comm, world_size)
    if comm.empty or world_size < 2:
        return CommModel()
    per_iter = comm.groupby(["tensor", "iteration"], observed=True).agg(bytes=("bytes", "first"), dur=("dur", "min"))
    per_tensor = per_iter.groupby(level=0).agg(bytes=("bytes", "first"), dur=("dur", "median"))
    lm = fit_ring_allreduce(per_tensor["bytes"].to_numpy(), per_tensor["dur"].to_numpy(), world_size,
                            collective_latency_us)
    origin = "fitted" if collective_latency_us is None else "fitted (latency calibrated)"
    return CommModel(default=lm, origin=origin) if lm is not None else CommModel()


def fit_ps_transfers(events: pd.DataFrame) -> CommModel:
    """Link model from measured parameter-server transfers (RECV events: a link's service time per message).

    A PS trace with per-transfer times (ps-lite, TF ParameterServerStrategy) replays its own
    transfers as measured; transfers it does not have (workers a what-if adds) need a link model.
    Per message ``dur = latency + bytes / B``: least squares over the RECV events of at least
    1 KiB (smaller ones are latency only), ``latency`` clipped at 0; with one size only,
    ``B = sum bytes / sum durations``.

    Parameters
    ----------
    events : pandas.DataFrame
        The trace's events (``kind``, ``bytes``, ``dur``).
    """
    r = events[(events["kind"] == "RECV") & (events["bytes"] >= 1024) & (events["dur"] > 0)]
    if r.empty:
        return CommModel()
    x, y = r["bytes"].to_numpy(dtype=float), r["dur"].to_numpy(dtype=float)
    lat, bw = 0.0, float(x.sum() / y.sum()) * 1e6
    if len(np.unique(x)) >= 2:
        slope, icpt = np.polyfit(x, y, 1)
        if slope > 0 and icpt >= 0:
            lat, bw = float(icpt), 1e6 / float(slope)
    return CommModel(default=LinkModel(latency_us=lat, bandwidth_Bps=bw), origin="fitted (measured ps transfers)")


def fit_ps_groups(comm: pd.DataFrame, workers: int = 1, servers: int = 1) -> CommModel:
    """Link model from parameter-server push-pull spans (MXNet's ``KVStoreDist...PushPull``, phase ``push_pull``).

    A worker issues every key's push-pull at once, so each key's span holds the keys queued
    before it; per worker and iteration the group (first start to last end) is bounded by the
    busiest interface: a server's download takes every worker's pushes of its share of the
    bytes, and its upload, pipelined behind, the pulls: ``T = (W * sum S / N + S_last) / B``
    (``W`` workers, ``N`` servers; full-duplex links, the last key's pull after its push).
    ``T`` is the minimum over workers (the last to push waits least for the others), the
    median over iterations; latency 0 (absorbed in ``B``).

    Parameters
    ----------
    comm : pandas.DataFrame
        COMM events (``node``, ``iteration``, ``start``, ``dur``, ``bytes``), phase ``push_pull``.
    workers, servers : int
        The job's workers and servers.
    """
    rows = []
    for (_node, it), g in comm.groupby(["node", "iteration"], observed=True):
        g = g.sort_values("start")
        t = float((g["start"] + g["dur"]).max() - g["start"].min())
        if t > 0:
            rows.append((it, t, float(max(1, workers) * g["bytes"].sum() / max(1, servers) + g["bytes"].iloc[-1])))
    if not rows:
        return CommModel()
    df = pd.DataFrame(rows, columns=["iteration", "t", "b"]).groupby("iteration").agg(t=("t", "min"), b=("b", "max"))
    bw = float(np.median(df["b"] / df["t"])) * 1e6
    return CommModel(default=LinkModel(latency_us=0.0, bandwidth_Bps=bw), origin="fitted (ps push-pull groups)")


def _ps_group_spans_traced(ts: Any) -> dict[str, float]:
    """Per worker node, its traced push-pull group (first span start to last span end), the median over
    the profiled iterations."""
    comm = ts.events[(ts.events["kind"] == "COMM") & (ts.events["phase"] == "push_pull")]
    if comm.empty:
        return {}
    per = comm.groupby(["node", "iteration"], observed=True).apply(
        lambda g: float((g["start"] + g["dur"]).max() - g["start"].min()), include_groups=False)
    return {str(n): float(v) for n, v in per.groupby(level=0, observed=True).median().items() if v > 0}


def calibrate_ps_by_replay(ts: Any, model: CommModel, rounds: int = 3) -> CommModel:
    """Scale a PS link model until the replayed push-pull groups last as long as the traced ones.

    :func:`fit_ps_groups` assumes pushes and pulls pipeline perfectly; the real job (and
    its DFG: a pull waits for every worker's push of its key, the server's interface queues
    both workers' transfers) overlaps less.  So the bandwidth is refined on the DFG itself:
    replay the profiled job with ``B``; per worker, its replayed group (from its first ``In``
    op, when its first gradient is ready, to its last pulled byte; median over the replayed
    iterations) over its traced group (first span start to last span end: a span starts when
    the engine issues the push; median over the profiled iterations); ``B <- B * median_w
    ratio_w`` (the group is nearly all transfer, so time ~ 1/B); a few rounds.

    Why these choices (bench/ps_accuracy.py, 48 kept traces, docs/ps.md): measured from the
    push's start on the link, a replayed group leaves out the queueing behind other workers
    that a traced span holds, so with asynchronous workers in their steady state (each served
    alone by the FIFO link) the replayed groups were a third of the traced ones and ``B`` was
    calibrated far too low (MLP, 3 workers, 200 Mbit/s: 77 Mbit/s, the replay 1120 ms against
    530 measured).  Time that is not the link's lengthens some traced groups: a worker stopped
    by its cgroup's CPU quota while its transfers are in flight (dist_async CNN at 0.4 CPU per
    host: one worker's groups 52-66 ms in every iteration, the others' 5.7-15 ms, for 170 kB per
    worker on a 500 Mbit/s link; the slowest worker's median group, the rule before, calibrated
    714 Mbit/s down to 50) - the medians over iterations and workers keep such a worker from
    setting the link.

    Parameters
    ----------
    ts : TraceSet
        The profiled PS job (COMM events of phase ``push_pull``).
    model : CommModel
        The :func:`fit_ps_groups` model to refine.
    rounds : int
        Refinement rounds.
    """
    from .graph.build import build
    from .job import Job, identity
    from .replay import replay

    from .graph.schemes import asynchronous_workers

    target = _ps_group_spans_traced(ts)
    if not target:
        return model
    bw = model.default.bandwidth_Bps
    for _ in range(rounds):
        m = CommModel(default=LinkModel(model.default.latency_us, bw), origin=model.origin)
        job = Job.from_trace(ts, comm_model=m)
        g = build(job, identity(job), check=False)
        # an asynchronous job is compared in its steady state (the workers drifted apart, as in the
        # trace), not in the first replayed iteration where every worker pushes at once
        k = 12 if asynchronous_workers(g) else 1
        df = replay(g, iterations=k).to_frame(g)
        df = df[df["iteration"] >= k // 2]
        ratios = []
        for w, t in target.items():
            spans = []
            for _, d in df[df["node"] == w].groupby("iteration"):
                ready = d[(d["kind"] == "VIRTUAL") & d["name"].astype(str).str.startswith("In ")]
                push = d[(d["kind"] == "SEND") & (d["phase"] == "push")]
                pull = d[(d["kind"] == "RECV") & (d["phase"] == "pull")]
                if not push.empty and not pull.empty:
                    # from when the worker could push (its first "In" op: the gradient ready), as a traced
                    # span starts when the engine issues the push: a FIFO link's queueing is in both
                    t0 = float(ready["start"].min()) if not ready.empty else float(push["start"].min())
                    spans.append(float(pull["end"].max() - t0))
            if spans and float(np.median(spans)) > 0:
                ratios.append(float(np.median(spans)) / t)
        if not ratios:
            break
        bw *= float(np.median(ratios))
    return CommModel(default=LinkModel(model.default.latency_us, bw),
                     origin="fitted (ps push-pull groups, calibrated by replay)")


__all__ = ["DEFAULT_BANDWIDTH_BPS", "calibrate_ps_by_replay", "link_hosts", "fit_ps_groups", "fit_ps_transfers", "DEFAULT_LATENCY_US", "LATENCY_SHARE_MAX", "collective_latency_us", "CommModel",
           "fit_from_events", "fit_from_trace", "fit_ring_allreduce", "LinkModel"]
