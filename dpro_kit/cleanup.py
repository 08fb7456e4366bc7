"""Clean-up of what outlives a process unless it unwinds: machine-global resources and half-written files.

Emulated clusters leave network namespaces and CPU budgets leave cgroups behind when their process
ends without closing them; an atomic write leaves its temporary file.  Two helpers make every way out
of a process run the clean-up:

* :func:`exit_on_sigterm` turns SIGTERM (``kill``, a scheduler's time limit) into ``SystemExit``, so
  ``finally`` blocks, ``with`` exits and ``atexit`` handlers run (Python's default ends the process
  at once);
* :func:`close_at_exit` registers an object whose ``close()`` runs at interpreter exit if nobody
  closed it (a ``sys.exit`` path that skipped the ``with``); its ``close`` calls :func:`closed`.

Used by :class:`dpro_kit.cluster.EmulatedCluster`, :class:`dpro_kit.jobs.CpuBudget` and the CLI.
"""
from __future__ import annotations

import atexit
import signal
import threading
import weakref
from typing import Any, Callable

__all__ = ["close_at_exit", "closed", "exit_on_sigterm"]

_OPEN: "weakref.WeakSet[Any]" = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


def exit_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM (``kill``, a job scheduler's time limit) an exit that unwinds, and return the
    function that restores the previous handler.

    Python's default for SIGTERM ends the process at once: no ``finally`` block, no ``with`` exit and
    no ``atexit`` handler runs, so an output being written atomically would leave its temporary file
    (:func:`dpro_kit.errors.atomic_write_text`) and an emulated cluster or CPU budget its network
    namespaces and cgroups (:class:`dpro_kit.cluster.EmulatedCluster`, :class:`dpro_kit.jobs.CpuBudget`,
    which call this when they are created).  With this handler SIGTERM raises ``SystemExit(143)``,
    which unwinds like any exit.  Left alone (a no-op) outside the main thread, or when someone else already
    handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def on_term(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def close_at_exit(obj: Any) -> None:
    """Call ``obj.close()`` at interpreter exit unless :func:`closed` said it was closed before.

    Held weakly: an object collected without being closed is not kept alive by this.
    """
    with _OPEN_LOCK:
        _OPEN.add(obj)


def closed(obj: Any) -> None:
    """``obj`` was closed: nothing to do for it at exit (unknown objects are ignored)."""
    with _OPEN_LOCK:
        _OPEN.discard(obj)


@atexit.register
def _close_open() -> None:
    with _OPEN_LOCK:
        left = list(_OPEN)
    for obj in left:
        try:
            obj.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
