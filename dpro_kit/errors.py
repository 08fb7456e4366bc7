"""One error type for everything a user can get wrong.

The CLI turns a :class:`DproError` into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.  Messages follow one shape so
that a user can act on them: *where* (file, record), *what* is wrong, *what to do*.
"""
from __future__ import annotations

import os
from pathlib import Path


class DproError(Exception):
    """A user-facing problem with input data or options (exit code 2)."""

    exit_code = 2

    def __init__(self, what: str, *, path: str | os.PathLike | None = None,
                 record: str | None = None, hint: str | None = None) -> None:
        self.what = what
        self.path = None if path is None else str(path)
        self.record = record
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path:
            where = self.path
            if self.record:
                where += f" [{self.record}]"
            where += ": "
        elif self.record:
            where = f"[{self.record}]: "
        msg = f"{where}{self.what}"
        if self.hint:
            msg += f" ({self.hint})"
        return msg


class TraceFormatError(DproError):
    """A trace file exists but its content is not what the format says."""


class GraphError(DproError):
    """The global DFG is not a valid DAG with valid durations."""


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers never see a half-written file.

    The content goes to a temporary file in the same directory, is flushed and
    fsync'ed, then renamed over the target (``os.replace`` is atomic on POSIX).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


__all__ = ["atomic_write_text", "DproError", "GraphError", "TraceFormatError"]
