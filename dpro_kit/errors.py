"""One error type for everything a user can get wrong.

The CLI turns a :class:`DproError` into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.  Messages follow one shape so
that a user can act on them: *where* (file, record), *what* is wrong, *what to do*.

:class:`DproError`, :class:`TraceFormatError` and :func:`atomic_write_text` are defined in
:mod:`dpro_collect` (the collectors raise and write with them inside the job) and
re-exported here; :class:`GraphError` is dpro_kit's own.
"""
from __future__ import annotations

from dpro_collect.errors import DproError, TraceFormatError
from dpro_collect.files import atomic_write_text


class GraphError(DproError):
    """The global DFG is not a valid DAG with valid durations."""


__all__ = ["atomic_write_text", "DproError", "GraphError", "TraceFormatError"]
