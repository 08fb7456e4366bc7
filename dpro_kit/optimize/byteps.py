"""BytePS's ``BYTEPS_PARTITION_BYTES`` searched on the replayer (a knob pass, :mod:`dpro_kit.optimize.knobs`).

BytePS cuts every tensor into partitions of ``BYTEPS_PARTITION_BYTES`` and spreads them over
the servers by a hash of their keys; smaller partitions pipeline push, aggregation and pull
(and balance the servers), larger ones cost fewer messages.  Every candidate size is the
what-if :func:`dpro_kit.whatif.byteps_partition_bytes` of the iteration ``dpro replay``
replays (partitions and their servers as BytePS makes them,
:func:`dpro_kit.readers.byteps.partitions`), built and replayed.

**Untested against real BytePS** (it needs a GPU): the reader, the what-if and this search run
on a hand-written fixture in BytePS's documented trace format (docs/byteps.md).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import DproError
from .passes import GraphPass, PassRefused, register_pass

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Session
    from ..trace import TraceSet
    from .driver import Optimized, OptimizeOptions

__all__ = ["PARTITION_BYTES", "BytePSPartition", "is_byteps", "search"]

#: partition sizes tried (bytes): 64 KiB .. 64 MiB by powers of two, and BytePS's default 4096000
PARTITION_BYTES = tuple(sorted({4096000, *(2**k for k in range(16, 27))}))


def is_byteps(ts: "TraceSet | None") -> bool:
    """Whether ``ts`` was read by :mod:`dpro_kit.readers.byteps` (its partitions carry BytePS keys).

    Parameters
    ----------
    ts : TraceSet or None
        A trace (None: a graph file).
    """
    if ts is None or not isinstance(ts.manifest.extra, dict) or not isinstance(ts.manifest.extra.get("byteps"), dict):
        return False
    return any(c.partitions and "key" in c.partitions[0] for c in ts.collectives)


def search(session: "Session", *, sizes: tuple[int, ...] = PARTITION_BYTES,
           deadline: float | None = None) -> dict[str, Any]:
    """Replay every ``BYTEPS_PARTITION_BYTES`` of ``sizes`` (and the traced one) on the traced iteration.

    Parameters
    ----------
    session : dpro_kit.session.Session
        A BytePS trace (:func:`is_byteps`).
    sizes : tuple of int
        The candidate partition sizes (bytes).
    deadline : float or None
        ``time.perf_counter()`` after which no more sizes are evaluated.

    Returns
    -------
    dict
        :func:`dpro_kit.optimize.knobs.grid_search`'s result (settings ``{"BYTEPS_PARTITION_BYTES": n}``).
    """
    from ..whatif import byteps_partition_bytes
    from .knobs import grid_search, replay_ms
    ts, model = session.graph_trace, session.comm_model
    if not is_byteps(ts):
        raise DproError("the BytePS partition search needs a BytePS trace", path=session.path, hint="docs/byteps.md")
    traced = {"BYTEPS_PARTITION_BYTES": int(ts.manifest.extra["byteps"].get("partition_bytes", 4096000))}
    return grid_search(lambda k: replay_ms(byteps_partition_bytes(ts, int(k["BYTEPS_PARTITION_BYTES"])), model),
                       [{"BYTEPS_PARTITION_BYTES": int(b)} for b in sizes], traced, deadline=deadline)


@register_pass
class BytePSPartition(GraphPass):
    """Knob pass: ``BYTEPS_PARTITION_BYTES`` by replaying what-ifs (module docstring)."""

    name = "byteps_partition"
    knobs = True

    def apply(self, state, base, **args):  # noqa: D102 - not a strategy pass
        raise PassRefused("byteps_partition sets BYTEPS_PARTITION_BYTES, not a strategy: dpro optimize runs it "
                          "on BytePS traces (dpro_kit.optimize.byteps.search)")

    def applies(self, session: "Session") -> bool:
        """True for a BytePS trace (:func:`is_byteps`)."""
        return not session.is_graph_file and is_byteps(session.trace)

    def optimize(self, session: "Session", options: "OptimizeOptions") -> "Optimized":
        """Search the partition size (:func:`search`) and make the plan of the best one
        (:func:`dpro_kit.optimize.knobs.knob_plan`).

        Parameters
        ----------
        session : dpro_kit.session.Session
            A BytePS trace.
        options : dpro_kit.optimize.driver.OptimizeOptions
            ``budget_s`` bounds the search; ``min_gain_pct`` as for any plan.
        """
        from ..whatif import byteps_partition_bytes
        from .knobs import knob_plan
        found = search(session, deadline=time.perf_counter() + options.budget_s)
        return knob_plan(session, options, pass_name=self.name, framework="byteps", found=found,
                         apply_ts=lambda k: byteps_partition_bytes(session.graph_trace,
                                                                   int(k["BYTEPS_PARTITION_BYTES"])),
                         apply_hint="set it in the environment of every worker and server (BytePS rounds it up to "
                                    "a multiple of local_size x page size)")
