"""Files collectors write and read back (standard library only): atomic writes, per-node ``meta.json``."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_text", "find_metas"]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers never see a half-written file.

    The content goes to a temporary file in the same directory, is flushed and
    fsync'ed, then renamed over the target (``os.replace`` is atomic on POSIX).

    Parameters
    ----------
    path : str or PathLike
        The file to write; its folder is created when missing.
    text : str
        The content (UTF-8).
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


def find_metas(root: str | os.PathLike, fmt: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``root/<host>/<node>/meta.json`` whose ``format`` is ``fmt``, sorted by path.

    Files that are unreadable, not JSON or of another format are skipped (the readers report
    bad files; a collector only looks for its own).

    Parameters
    ----------
    root : str or PathLike
        The trace directory.
    fmt : str
        The collector's meta format (:data:`dpro_collect.schema.TORCH_META_FORMAT`, ...).
    """
    out = []
    for p in sorted(Path(root).glob("*/*/meta.json")):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("format") == fmt:
            out.append((p, doc))
    return out
