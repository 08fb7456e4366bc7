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
closest to the transfer itself), averaged over iterations.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: Used when the trace has no communication timing at all (stated in results).
DEFAULT_LATENCY_US = 20.0
DEFAULT_BANDWIDTH_BPS = 10e9 / 8  # 10 Gbit/s


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

    def transfer_us(self, nbytes: float, link: str = "") -> float:
        return self.per_link.get(link, self.default).time_us(nbytes)

    def describe(self) -> dict[str, Any]:
        return {"origin": self.origin, "latency_us": self.default.latency_us,
                "bandwidth_Mbps": self.default.bandwidth_Bps * 8 / 1e6,
                "per_link": {k: asdict(v) for k, v in self.per_link.items()}}


def fit_ring_allreduce(sizes: np.ndarray, times_us: np.ndarray, n: int) -> LinkModel | None:
    """Fit ``T = 2(N-1)(alpha + S/(N*B))`` by non-negative least squares.

    Returns ``None`` when there is nothing to fit.  With a single distinct size
    the two terms cannot be separated; latency is then taken as 0 (bandwidth
    absorbs it), which is exact for that size.
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
    if np.unique(sizes).size >= 2:
        from scipy.optimize import nnls  # scipy comes with cvxpy
        a = np.column_stack([np.ones_like(x), x])
        (alpha, inv_bw), _ = nnls(a, t)
        if inv_bw > 0:
            return LinkModel(latency_us=float(alpha), bandwidth_Bps=float(1e6 / inv_bw))
    inv_bw = float(np.sum(t * x) / np.sum(x * x))
    return LinkModel(latency_us=0.0, bandwidth_Bps=float(1e6 / inv_bw)) if inv_bw > 0 else None


def fit_from_events(events: pd.DataFrame, world_size: int) -> CommModel:
    """Fit a :class:`CommModel` to the coarse collectives (kind COMM) in a trace."""
    comm = events[(events["kind"] == "COMM") & (events["bytes"] > 0)]
    if comm.empty or world_size < 2:
        return CommModel()
    per_iter = comm.groupby(["tensor", "iteration"], observed=True).agg(bytes=("bytes", "first"), dur=("dur", "min"))
    per_tensor = per_iter.groupby(level=0).agg(bytes=("bytes", "first"), dur=("dur", "mean"))
    lm = fit_ring_allreduce(per_tensor["bytes"].to_numpy(), per_tensor["dur"].to_numpy(), world_size)
    return CommModel(default=lm, origin="fitted") if lm is not None else CommModel()
