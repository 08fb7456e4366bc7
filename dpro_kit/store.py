"""Columnar trace store: each node's parsed events in Parquet, so a trace is parsed once.

Parsing a job's raw traces is most of the time from a trace folder to a replay
(``docs/scale.md``: ~80 % at 64–256 ranks).  With the store on (``load_trace(dir,
store=True)`` or ``DPRO_STORE=1``), the first load writes what each node's reader
returned — its event table to Parquet, its dependencies, collectives, memory samples and
warnings beside it — and the discovered manifest; later loads of the same, unchanged
files read those instead of parsing.  Everything after the readers (concatenation,
collectives merged, the format's finisher) runs as before, so a stored load returns the
same :class:`~dpro_kit.trace.TraceSet` as a parse (``tests/test_store.py``).

Where: ``$DPRO_CACHE/store/<key>/`` (default ``~/.cache/dpro-kit/store``), never in the
trace folder (trace folders may be read-only or under version control; docs/reliability.md).
``<key>`` is a hash of

* the trace folder's resolved path,
* every file under it (relative path, size, modification time in ns) — a changed,
  added or removed file gives another key, so an old entry is never used for new files
  (a file rewritten with the same size within the same nanosecond tick is not noticed),
* the source of the code that parses (``dpro_kit/trace.py``, ``dpro_kit/readers/*.py``,
  this module), so a reader change never returns an old parse.

An entry is written in a temporary folder beside it and renamed into place whole, so a
killed writer leaves no half entry (a temporary folder older than an hour is swept).  An
unwritable cache is said once on stderr and the load goes on without it.

``read_events(dir, columns=[...])`` reads only some columns of a stored trace.

References
----------
.. [1] Apache Parquet, columnar file format; pyarrow (https://arrow.apache.org/docs/python/parquet.html).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["store_root", "raw_fingerprint", "TraceStore", "read_events", "store_enabled"]

#: format of an entry; part of the key
STORE_VERSION = 1
STORE_DIR = "store"
_code_fp: str | None = None
_warned = False


def store_root() -> Path:
    """``$DPRO_CACHE/store`` (default ``~/.cache/dpro-kit/store``): the cache root every dpro-kit cache uses."""
    root = os.environ.get("DPRO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dpro-kit")
    return Path(root) / STORE_DIR


def store_enabled(store: bool | None) -> bool:
    """``store`` if given, else whether ``DPRO_STORE`` is set to something other than ``0``."""
    if store is not None:
        return bool(store)
    return os.environ.get("DPRO_STORE", "") not in ("", "0")


def _code_fingerprint() -> str:
    global _code_fp
    if _code_fp is None:
        here = Path(__file__).resolve().parent
        h = hashlib.sha256(f"store v{STORE_VERSION}".encode())
        for p in [here / "trace.py", here / "store.py", *sorted((here / "readers").glob("*.py"))]:
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        _code_fp = h.hexdigest()
    return _code_fp


def raw_fingerprint(trace_dir: str | os.PathLike) -> str:
    """Hash of the folder's resolved path, every file's (relative path, size, mtime_ns) and the parsing code.

    Parameters
    ----------
    trace_dir : str or PathLike
        A trace folder.
    """
    root = Path(trace_dir).resolve()
    h = hashlib.sha256(f"{root}\0{_code_fingerprint()}\0".encode())
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = Path(dirpath) / f
            try:
                st = p.stat()
            except OSError:
                continue
            h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _say_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"dpro: {msg}", file=sys.stderr)


class TraceStore:
    """The store entry of one trace folder (it may not exist yet).

    Parameters
    ----------
    trace_dir : str or PathLike
        The trace folder (only read).
    """

    def __init__(self, trace_dir: str | os.PathLike):
        self.trace_dir = Path(trace_dir)
        self.key = raw_fingerprint(trace_dir)
        self.path = store_root() / self.key
        self._index: dict[str, Any] | None = None

    # ---------------------------------------------------------------- reading
    def index(self) -> dict[str, Any] | None:
        """The entry's ``entry.json`` (manifest, node -> file), or None when there is no complete entry."""
        if self._index is None:
            try:
                self._index = json.loads((self.path / "entry.json").read_text())
            except (OSError, ValueError):
                return None
        return self._index

    def manifest(self):
        """The stored manifest, or None.

        Not re-validated as a ``manifest.json`` would be: it is the manifest the loader
        had (a discovered one may list fewer ranks than the world size, docs/kineto.md).
        """
        from .trace import Manifest, NodeInfo
        idx = self.index()
        if idx is None:
            return None
        d = idx["manifest"]
        nodes = {str(k): NodeInfo(**v) for k, v in d["nodes"].items()}
        return Manifest(**{**d, "nodes": nodes})

    def node(self, node: str):
        """The stored :class:`~dpro_kit.trace.NodeTrace` of ``node`` (what its reader returned)."""
        from .trace import NodeTrace
        ent = self.index()["nodes"][node]
        events = pd.read_parquet(self.path / ent["events"], engine="pyarrow")
        memory = pd.read_parquet(self.path / ent["memory"], engine="pyarrow") if ent.get("memory") else None
        return NodeTrace(events=events, edges=[tuple(e) for e in ent["edges"]], collectives=ent["collectives"],
                         memory=memory, warnings=list(ent["warnings"]))

    def events(self, columns: list[str] | None = None) -> pd.DataFrame:
        """All nodes' stored events (reader columns + ``node``), reading only ``columns`` from the files."""
        idx = self.index()
        frames = []
        for node, ent in idx["nodes"].items():
            df = pd.read_parquet(self.path / ent["events"], columns=columns, engine="pyarrow")
            frames.append(df.assign(node=node))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=(columns or []) + ["node"])

    # ---------------------------------------------------------------- writing
    def writer(self, manifest) -> "_Writer | None":
        """A writer for a new entry (None, said once on stderr, when the cache is not writable)."""
        try:
            return _Writer(self, manifest)
        except (OSError, TypeError, ValueError) as exc:
            _say_once(f"trace store not written ({exc}); traces are parsed on every load "
                      "(set DPRO_CACHE to a writable folder)")
            return None


class _Writer:
    def __init__(self, st: TraceStore, manifest) -> None:
        self.st = st
        root = store_root()
        root.mkdir(parents=True, exist_ok=True)
        _sweep(root)
        self.tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.index: dict[str, Any] = {"version": STORE_VERSION, "trace_dir": str(st.trace_dir.resolve()),
                                      "manifest": json.loads(json.dumps(manifest.to_json())), "nodes": {}}
        self.failed: str | None = None

    def put(self, node: str, nt) -> None:
        """Store what the reader returned for ``node`` (before load_trace adds its columns)."""
        if self.failed:
            return
        try:
            i = len(self.index["nodes"])
            ent: dict[str, Any] = {"events": f"n{i}.parquet", "edges": [list(e) for e in nt.edges],
                                   "collectives": json.loads(json.dumps(nt.collectives)),
                                   "warnings": [str(w) for w in nt.warnings]}
            nt.events.to_parquet(self.tmp / ent["events"], engine="pyarrow", index=False)
            if nt.memory is not None:
                ent["memory"] = f"m{i}.parquet"
                nt.memory.to_parquet(self.tmp / ent["memory"], engine="pyarrow", index=False)
            self.index["nodes"][node] = ent
        except (OSError, TypeError, ValueError, ImportError) as exc:   # not storable: parse next time too
            self.failed = f"{node}: {exc}"

    def commit(self) -> Path | None:
        """Rename the entry into place (a concurrent writer's identical entry wins if it came first)."""
        try:
            if self.failed:
                _say_once(f"trace store not written ({self.failed})")
                return None
            (self.tmp / "entry.json").write_text(json.dumps(self.index))
            try:
                os.rename(self.tmp, self.st.path)
            except OSError:
                if (self.st.path / "entry.json").exists():   # another process stored the same files first
                    return self.st.path
                raise
            return self.st.path
        except OSError as exc:
            _say_once(f"trace store not written ({exc}); traces are parsed on every load "
                      "(set DPRO_CACHE to a writable folder)")
            return None
        finally:
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)


def _sweep(root: Path, age_s: float = 3600.0) -> None:
    """Remove temporary entry folders a killed writer left (older than ``age_s``)."""
    now = time.time()
    for p in root.glob(".tmp-*"):
        try:
            if now - p.stat().st_mtime > age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def read_events(trace_dir: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    """The events of a trace folder, reading only ``columns`` when it is stored (else parsing and storing it).

    Parameters
    ----------
    trace_dir : str or PathLike
        A trace folder.
    columns : list of str or None
        Reader columns to read (``node`` is always added); None: all.
    """
    st = TraceStore(trace_dir)
    if st.index() is None:
        from .trace import load_trace
        load_trace(trace_dir, store=True)
        st = TraceStore(trace_dir)
        if st.index() is None:            # the cache is not writable: from the parse
            ev = load_trace(trace_dir, store=False).events
            return ev[list(columns) + ["node"]] if columns else ev
    return st.events(columns)
