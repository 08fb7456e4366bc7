"""Files collectors write and read back (standard library only): atomic writes, per-node ``meta.json``."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:   # not POSIX: no lock, the writers' race stays (see folder_lock)
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write_text", "find_metas", "folder_lock", "pid_alive", "sweep_stale_temps"]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers never see a half-written file.

    The content goes to a temporary file of its own in the same directory
    (``.NAME.tmp-PID-RANDOM``, created exclusively, so concurrent writers in several
    processes or threads never share one), is flushed and fsync'ed, then renamed over the
    target (``os.replace`` is atomic on POSIX: a reader sees the old file or the new one,
    and of two concurrent writers the last rename wins whole).  The temporary file is removed
    when the write fails or the process is interrupted (``dpro`` turns SIGTERM into an exit
    that runs this cleanup); one left by a process killed with SIGKILL is removed by the next
    write of the same file once its process is gone (:func:`sweep_stale_temps`).

    Parameters
    ----------
    path : str or PathLike
        The file to write; its folder is created when missing.
    text : str
        The content (UTF-8).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    sweep_stale_temps(path)


def sweep_stale_temps(path: str | os.PathLike, *, min_age_s: float = 60.0) -> list[Path]:
    """Remove the temporary files :func:`atomic_write_text` left beside ``path`` when its process
    was killed (SIGKILL, power loss): those whose process no longer runs on this machine and that
    are older than ``min_age_s`` (a writer on another machine sharing the folder is not removed
    while it writes).  Returns the files removed.

    Parameters
    ----------
    path : str or PathLike
        The target file.
    min_age_s : float
        Only temporary files not modified for this long are candidates.
    """
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f".{path.name}.tmp-*"))
    except OSError:
        return removed
    now = time.time()
    for tmp in candidates:
        try:
            pid = int(tmp.name.rsplit(".tmp-", 1)[1].split("-")[0])
            if now - tmp.stat().st_mtime < min_age_s or pid_alive(pid):
                continue
            tmp.unlink()
            removed.append(tmp)
        except (ValueError, IndexError, OSError):
            continue
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def folder_lock(root: str | os.PathLike, *, timeout_s: float = 30.0) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the folder ``root`` itself (no lock file is left behind).

    Every rank writes its own ``meta.json`` and then rebuilds ``manifest.json`` from all of them.
    Without a lock two ranks finishing together can both read, and the one that read an older
    ``meta.json`` of the other (the version written when the profiling window ended, before the
    rest of the run's steps were timed) can rename its manifest last: a manifest whose
    ``measured_iteration_ms`` is not the ranks' final median (CI, 2026-11-28: 12.50 vs 12.05 ms).
    Because each rank writes its ``meta.json`` *before* taking this lock, the last holder reads
    every final ``meta.json``.  Yields whether the lock was taken: after ``timeout_s`` (a holder
    stuck on a network file system), or where ``flock`` is not supported, the caller goes on
    without it.

    Parameters
    ----------
    root : str or PathLike
        The trace directory (must exist).
    timeout_s : float
        How long to wait for another process's lock.
    """
    fd = None
    got = False
    try:
        if fcntl is not None:
            fd = os.open(os.fspath(root), os.O_RDONLY)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)
    except OSError:
        got = False
    try:
        yield got
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                if got:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


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
