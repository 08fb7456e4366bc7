"""Parallel per-node work on Dask: local processes by default, or an existing Dask cluster.

Reading a job's traces is one independent task per node (each reader sees only its node's
files and the manifest), so :func:`dpro_kit.trace.load_trace` can hand the nodes to Dask and
keep everything after the readers serial.  The results are returned in the nodes' order, so
the loaded :class:`~dpro_kit.trace.TraceSet` is the serial one (``tests/test_parallel.py``).

Which scheduler (``load_trace(dir, scheduler=...)``, else ``$DPRO_SCHEDULER``):

============================  ===========================================================
``serial`` (default)          no Dask: the nodes are read one after the other
``processes``                 Dask's local process pool (``dask.multiprocessing``), one
                              worker per CPU; ``processes:N`` for N workers; started by
                              ``fork`` when this process runs one thread, else ``spawn``
``tcp://HOST:PORT``           an existing ``dask.distributed`` scheduler; its workers must
                              see the trace folder under the same path (shared filesystem);
                              a worker process reads one chunk at a time, whatever its threads
============================  ===========================================================

Progress: the ``progress(done, total)`` callback as tasks finish (the CLI prints it on a
terminal).  A reader's :class:`~dpro_kit.errors.DproError` in a worker reaches the caller
as the same one-line error.

References
----------
.. [1] Dask Development Team, "Dask: Library for dynamic task scheduling" (https://dask.org);
       ``dask.delayed``, ``dask.distributed.Client.map``.
"""
from __future__ import annotations

import contextvars
import os
import threading
from typing import Any, Callable, Sequence

from .errors import DproError

__all__ = ["resolve_scheduler", "map_nodes"]

#: no thread pool: the readers hold the GIL while parsing JSON (no gain), and they are not thread-safe
#: (module-level caches, gc paused while parsing: ``readers/kineto_plain.py``)
SCHEDULERS = ("serial", "processes")


def resolve_scheduler(scheduler: str | None = None) -> tuple[str, int | None]:
    """``(kind, workers)`` for ``scheduler`` or ``$DPRO_SCHEDULER``: kind is serial, processes or an address.

    Parameters
    ----------
    scheduler : str or None
        ``serial``, ``processes[:N]`` or ``tcp://HOST:PORT``; None: the
        environment's ``DPRO_SCHEDULER``, else ``serial``.
    """
    s = (scheduler if scheduler is not None else os.environ.get("DPRO_SCHEDULER", "")).strip() or "serial"
    if "://" in s:
        return s, None
    kind, _, n = s.partition(":")
    if kind not in SCHEDULERS or (n and not (n.isdigit() and int(n) > 0)):
        raise DproError(f"unknown scheduler {s!r}", record="DPRO_SCHEDULER / --scheduler",
                        hint="use serial, processes[:N] or a Dask scheduler address tcp://HOST:PORT")
    return kind, (int(n) if n else None)


def map_nodes(fn: Callable[..., Any], args: Sequence[tuple], *, scheduler: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``[fn(*a) for a in args]``, run by the chosen scheduler; results in the order of ``args``.

    Parameters
    ----------
    fn : callable
        A module-level function (it is sent to worker processes by reference).
    args : sequence of tuples
        One task's arguments each.
    scheduler : str or None
        See :func:`resolve_scheduler`.
    progress : callable or None
        ``(done, total)`` after each finished task.
    """
    kind, workers = resolve_scheduler(scheduler)
    total = len(args)
    if kind == "serial" or total <= 1:
        out = []
        for i, a in enumerate(args):
            out.append(fn(*a))
            if progress is not None:
                progress(i + 1, total)
        return out
    if "://" in kind:
        return _distributed(kind, fn, args, progress)
    import dask
    from dask.callbacks import Callback

    n = workers or os.cpu_count() or 1
    chunks = _chunks(len(args), CHUNKS_PER_WORKER * n)
    done = [0]

    class _Progress(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):   # dask's hook, in the calling process
            if progress is not None and str(key).startswith("dpro-nodes-"):
                done[0] += len(result)
                progress(done[0], total)

    # each chunk's arguments as one opaque value (traverse=False): dask would otherwise walk every
    # argument looking for dask objects (a manifest of 1,000 nodes, in every task: seconds)
    tasks = [dask.delayed(_run_chunk, pure=False)(fn, dask.delayed([args[i] for i in c], traverse=False,
                                                                    name=f"dpro-args-{k}"),
                                                   dask_key_name=f"dpro-nodes-{k}")
             for k, c in enumerate(chunks)]
    kw: dict[str, Any] = {"scheduler": kind}
    if workers:
        kw["num_workers"] = workers
    with _Progress(), dask.config.set({"multiprocessing.context": _mp_context()}):
        parts = dask.compute(*tasks, **kw)
    return [r for part in parts for r in part]


#: tasks per worker: several, so that a slow node does not leave the other workers idle at the end,
#: few, so that shared arguments (the manifest) are sent a few times, not once per node
CHUNKS_PER_WORKER = 4


def _chunks(n: int, k: int) -> list[range]:
    """``range(n)`` cut into at most ``k`` consecutive, near-equal parts."""
    k = max(1, min(n, k))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _mp_context() -> str:
    """``fork`` where it exists and this process runs one Python thread (workers start in milliseconds,
    with dpro_kit already imported), else ``spawn`` (Dask's default: each worker imports dpro_kit, ~2 s)."""
    import multiprocessing
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return "fork"
    return "spawn"


#: one chunk at a time per process: a Dask worker with several threads would otherwise run readers
#: concurrently, and they are not thread-safe
_READER_LOCK = threading.Lock()


def _run_chunk(fn: Callable[..., Any], args: list[tuple]) -> list[Any]:
    # a fresh context: the caller's context variables (a terminal progress callback, say) stay with
    # the caller and are not run from worker processes
    with _READER_LOCK:
        return [contextvars.Context().run(fn, *a) for a in args]


def _distributed(address: str, fn: Callable[..., Any], args: Sequence[tuple],
                 progress: Callable[[int, int], None] | None) -> list[Any]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise DproError(f"scheduler {address!r} needs dask.distributed", record="DPRO_SCHEDULER / --scheduler",
                        hint="pip install distributed, or use processes") from None
    try:
        client = Client(address, timeout="10s")
    except OSError as exc:
        raise DproError(f"cannot reach the Dask scheduler at {address}: {exc}", record="DPRO_SCHEDULER / --scheduler",
                        hint="start it (dask scheduler; dask worker ADDRESS) or use processes") from None
    try:
        n = sum(client.nthreads().values()) or 1
        chunks = _chunks(len(args), CHUNKS_PER_WORKER * n)
        futs = [client.submit(_run_chunk, fn, [args[i] for i in c], key=f"dpro-nodes-{k}-{os.getpid()}", pure=False)
                for k, c in enumerate(chunks)]
        done = 0
        for f in as_completed(futs):
            done += len(chunks[futs.index(f)])
            if progress is not None:
                progress(done, len(args))
        return [r for part in client.gather(futs) for r in part]
    finally:
        client.close()
