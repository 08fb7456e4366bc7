"""One error type for everything a user can get wrong (standard library only).

The CLI turns a :class:`DproError` into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.  Messages follow one shape so
that a user can act on them: *where* (file, record), *what* is wrong, *what to do*.
Collectors raise it too (``dpro_torch.plan``); :mod:`dpro_kit.errors` re-exports it.
"""
from __future__ import annotations

import os

__all__ = ["DproError", "TraceFormatError"]


class DproError(Exception):
    """A user-facing problem with input data or options (exit code 2).

    Parameters
    ----------
    what : str
        What is wrong.
    path : str or PathLike, optional
        The file it is in.
    record : str, optional
        The record inside that file (``nodes.host0/0.role``, ``tensor_groups[2]``).
    hint : str, optional
        What to do about it.
    """

    exit_code = 2

    def __init__(self, what: str, *, path: str | os.PathLike | None = None,
                 record: str | None = None, hint: str | None = None) -> None:
        self.what = what
        self.path = None if path is None else str(path)
        self.record = record
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``path [record]: what (hint)``; a record or message longer than :data:`MAX_PART` characters
        (a damaged file's huge value quoted in it) is cut there, and line breaks become spaces."""
        where = ""
        record = _short(self.record) if self.record else self.record
        if self.path:
            where = self.path
            if record:
                where += f" [{record}]"
            where += ": "
        elif record:
            where = f"[{record}]: "
        msg = f"{where}{_short(self.what)}"
        if self.hint:
            msg += f" ({self.hint})"
        return msg


#: longest record or message :meth:`DproError.one_line` shows (characters): room for a message naming the ops
#: of a contradiction (~700), not for a megabyte string a mutated file put in a field
MAX_PART = 2000


def _short(text: str) -> str:
    text = " ".join(str(text).splitlines())
    return text if len(text) <= MAX_PART else text[:MAX_PART] + f"... ({len(text):,} characters)"


class TraceFormatError(DproError):
    """A trace file exists but its content is not what the format says."""
