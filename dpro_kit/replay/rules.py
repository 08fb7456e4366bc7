"""The replayer's rules by name: schedules (priority orders) and device models (dPRO §4.3).

The replay kernel (:mod:`._kernel`) picks, on each free device, the queued op
with the lowest *priority*, then the earliest ready time, then the lowest
tie-break rank.  What varies between scheduling and system studies plugs in
here, outside the kernel's inner loop:

* :data:`SCHEDULES` — ``name -> f(compiled graph) -> priority array`` (float64,
  one per op, lower runs first).  ``graph`` (the default) uses the vertices'
  ``priority`` attribute as built (all 0 for a traced job: FIFO by ready time);
  ``fifo`` ignores it.  TicTac / ByteScheduler-style orders register a function
  that computes priorities from the compiled graph (``needs_graph=True``: from the
  compiled graph and the networkx graph it came from, whose op attributes it reads).
  ``tic``, ``tac`` and ``random`` (TicTac, :mod:`dpro_kit.optimize.tictac`) are
  registered when that module is imported, which the first lookup of one of
  their names does (:data:`PLUGINS`).
* :data:`DEVICE_MODELS` — ``name -> kernel`` with the signature of
  :func:`._kernel.simulate`, or (registered with ``takes_graph=True``) ``f(cg, **options)``
  on the compiled graph with the options ``replay(..., model_options=)`` passes.
  ``fifo`` (the default): each device (compute stream, link) runs one op at a time from
  its queue.  ``shared`` (Proteus, :mod:`.sharing`): transfers share bandwidth by
  progressive filling over a hosts x links topology, an overlap factor slows computation
  that overlaps communication.

The iteration rule (how iteration i+1 waits for iteration i) is part of the
graph: :data:`dpro_kit.graph.build.ITERATION_RULES`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import GraphError
from ._kernel import simulate
from .sharing import run_shared

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from .engine import CompiledGraph

__all__ = ["SCHEDULES", "DEVICE_MODELS", "PLUGINS", "register_schedule", "register_device_model",
           "schedule_priorities", "device_model", "takes_graph"]


def _graph_priorities(cg: "CompiledGraph") -> np.ndarray:
    return cg.priority


def _fifo(cg: "CompiledGraph") -> np.ndarray:
    return np.zeros(cg.n, dtype=np.float64)


SCHEDULES: dict[str, Callable[["CompiledGraph"], np.ndarray]] = {"graph": _graph_priorities, "fifo": _fifo}
"""Priority orders by name (module docstring)."""

DEVICE_MODELS: dict[str, Callable[..., tuple]] = {"fifo": simulate, "shared": run_shared}
"""Replay kernels by name (module docstring)."""

#: device models called as ``f(cg, **options)`` (the others get :func:`._kernel.simulate`'s arrays)
_TAKES_GRAPH: set[str] = {"shared"}

#: schedules whose names are known before their module is imported (outside ``dpro_kit.replay``,
#: which must not import them at start-up): name -> module that registers it when imported
PLUGINS: dict[str, str] = {"tic": "dpro_kit.optimize.tictac", "tac": "dpro_kit.optimize.tictac",
                           "random": "dpro_kit.optimize.tictac"}

_NEEDS_GRAPH: set[str] = set()


def register_schedule(name: str, priorities: Callable[..., np.ndarray], *, needs_graph: bool = False) -> None:
    """Add (or replace) a schedule: ``priorities(cg)`` returns one float64 per op of ``cg``, lower first.

    Parameters
    ----------
    name : str
        The name ``replay(..., schedule=name)`` uses.
    priorities : callable
        ``f(cg)``, or ``f(cg, g)`` with ``needs_graph=True`` (``g``: the networkx DFG ``cg``
        was compiled from; such a schedule needs ``replay`` to be given that graph).
    needs_graph : bool, default False
        Whether ``priorities`` reads the op attributes of the networkx graph.
    """
    SCHEDULES[name] = priorities
    if needs_graph:
        _NEEDS_GRAPH.add(name)
    else:
        _NEEDS_GRAPH.discard(name)


def register_device_model(name: str, kernel: Callable[..., tuple], *, takes_graph: bool = False) -> None:
    """Add (or replace) a device model: a kernel with :func:`._kernel.simulate`'s signature and result,
    or with ``takes_graph=True`` a function ``f(cg, **options)`` of the compiled (unrolled) graph and
    the options ``replay(..., model_options=)`` gives, with the same result."""
    DEVICE_MODELS[name] = kernel
    if takes_graph:
        _TAKES_GRAPH.add(name)
    else:
        _TAKES_GRAPH.discard(name)


def takes_graph(name: str) -> bool:
    """Whether device model ``name`` is called as ``f(cg, **options)``."""
    return name in _TAKES_GRAPH


def _lookup(table: dict, kind: str, name: str):
    f = table.get(name)
    if f is None and table is SCHEDULES and name in PLUGINS:
        import importlib
        importlib.import_module(PLUGINS[name])
        f = table.get(name)
    if f is None:
        known = sorted(set(table) | (set(PLUGINS) if table is SCHEDULES else set()))
        raise GraphError(f"unknown {kind} {name!r}", hint="known: " + ", ".join(known))
    return f


def schedule_priorities(cg: "CompiledGraph", schedule: str, graph: "nx.DiGraph | None" = None) -> np.ndarray:
    """The priority array of ``schedule`` for ``cg`` (checked: one finite float per op).

    ``graph`` is the networkx DFG ``cg`` was compiled from; schedules registered with
    ``needs_graph=True`` read it (a GraphError when it is missing).
    """
    f = _lookup(SCHEDULES, "schedule", schedule)
    if schedule in _NEEDS_GRAPH:
        if graph is None:
            raise GraphError(f"schedule {schedule!r} reads op attributes: replay the networkx graph, "
                             "not a compiled one")
        prio = f(cg, graph)
    else:
        prio = f(cg)
    if prio is cg.priority:
        return prio
    prio = np.ascontiguousarray(prio, dtype=np.float64)
    if prio.shape != (cg.n,) or not np.isfinite(prio).all():
        raise GraphError(f"schedule {schedule!r} must give one finite priority per op ({cg.n})")
    return prio


def device_model(name: str) -> Callable[..., tuple]:
    """The replay kernel registered as ``name``."""
    return _lookup(DEVICE_MODELS, "device model", name)
