"""One error type for everything a user can get wrong.

The CLI turns a :class:`DproError` into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.  Messages follow one shape so
that a user can act on them: *where* (file, record), *what* is wrong, *what to do*.

:class:`DproError`, :class:`TraceFormatError` and :func:`atomic_write_text` are defined in
:mod:`dpro_collect` (the collectors raise and write with them inside the job) and
re-exported here; :class:`GraphError` is dpro_kit's own.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from dpro_collect.errors import DproError, TraceFormatError
from dpro_collect.files import atomic_write_text


class GraphError(DproError):
    """The global DFG is not a valid DAG with valid durations."""


def exit_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM (``kill``, a job scheduler's time limit) an exit that unwinds, and return the
    function that restores the previous handler.

    Python's default for SIGTERM ends the process at once: no ``finally`` block, no ``with`` exit and
    no ``atexit`` handler runs, so an output being written atomically would leave its temporary file
    (:func:`atomic_write_text`) and an emulated cluster or CPU budget its network namespaces and
    cgroups (:class:`dpro_kit.cluster.EmulatedCluster`, :class:`dpro_kit.jobs.CpuBudget`, which call
    this when they are created).  With this handler SIGTERM raises ``SystemExit(143)``, which unwinds
    like any exit.  Left alone (a no-op) outside the main thread, or when someone else already
    handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def on_term(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


__all__ = ["atomic_write_text", "DproError", "exit_on_sigterm", "GraphError", "TraceFormatError"]
