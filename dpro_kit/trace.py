"""Canonical trace model: manifest, event table, local dependencies, collectives.

A *trace directory* holds ``manifest.json`` plus one folder per node (worker or
parameter server) with that node's raw traces as collected.  Readers (see
:mod:`dpro_kit.readers`) turn each node's raw files into the same three things:

* rows of the **event table** (one row per executed op per profiled iteration),
* the node's **local dependencies** (edges between op ids), and
* the **collectives** the node takes part in (which tensor/bucket, how many
  bytes, which ops produce it and which wait for it).

Everything downstream (graph, alignment, replay, optimizer) works on a
:class:`TraceSet`, never on raw files.  Columns and kinds are typed values, so no
code has to guess what an op is from a substring of its name.  The format is
specified in ``docs/trace-format.md``; bump :data:`FORMAT_VERSION` on any
incompatible change.
"""
from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from .errors import DproError, TraceFormatError, atomic_write_text
from .schema import MANIFEST_FORMAT, MANIFEST_VERSION, MANIFEST_VERSIONS, Facts, validate_manifest

FORMAT_NAME = MANIFEST_FORMAT            # one definition: dpro_kit/schema.py
FORMAT_VERSION = MANIFEST_VERSION
SUPPORTED_VERSIONS = MANIFEST_VERSIONS


class OpKind(str, enum.Enum):
    """What an op does; drives which device it runs on and how it is analysed."""

    FW = "FW"            # forward computation
    BW = "BW"            # backward computation
    UPDATE = "UPDATE"    # optimizer step / parameter update
    COMM = "COMM"        # a whole collective as the framework saw it (coarse)
    SEND = "SEND"        # producer of one transfer (occupies a network link)
    RECV = "RECV"        # consumer of one transfer (on the receiver)
    AGG = "AGG"          # aggregation of pushed gradients on a parameter server
    IO = "IO"            # data loading / host-device copies
    VIRTUAL = "VIRTUAL"  # In/Out markers of a tensor's communication (zero time)
    OTHER = "OTHER"      # anything else the framework ran

    @classmethod
    def parse(cls, value: Any, *, path: str | None = None, record: str | None = None) -> "OpKind":
        try:
            return cls(str(value))
        except ValueError:
            raise TraceFormatError(
                f"unknown op kind {value!r}", path=path, record=record,
                hint="use one of " + ", ".join(k.value for k in cls)) from None

    # kind predicates: one definition each (the sets below), used everywhere
    @property
    def is_compute(self) -> bool:
        """Work on the node's own device (:data:`COMPUTE_KINDS`)."""
        return self.value in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        """Moves data between nodes (:data:`COMM_KINDS`)."""
        return self.value in COMM_KINDS

    @property
    def is_layer(self) -> bool:
        """Runs a model layer, forward or backward (:data:`LAYER_KINDS`)."""
        return self.value in LAYER_KINDS

    @property
    def is_topology(self) -> bool:
        """Built by a communication scheme between a tensor's In and Out (:data:`TOPOLOGY_KINDS`)."""
        return self.value in TOPOLOGY_KINDS


# The kind predicates: the one definition of "compute", "communication" and the rest.  Sets of
# the string values (graph attributes and event-table columns hold strings; an OpKind is a str,
# so ``OpKind.FW in COMPUTE_KINDS`` holds too); the OpKind properties above read them.
#: work on a node's own device (computation, optimizer update, server aggregation, I/O, other):
#: what a breakdown counts as computation time
COMPUTE_KINDS = frozenset({"FW", "BW", "UPDATE", "AGG", "IO", "OTHER"})
#: moving data between nodes: a whole collective (COMM) or one transfer (SEND/RECV)
COMM_KINDS = frozenset({"COMM", "SEND", "RECV"})
#: the model's layers, forward and backward: the ops op fusion merges, gradient accumulation
#: repeats per micro-batch and recomputation re-runs (the computation ops of dPRO §5.1)
LAYER_KINDS = frozenset({"FW", "BW"})
#: what a communication scheme's topology builds between a tensor's In and Out ops
#: (transfers, and the aggregation on a parameter server)
TOPOLOGY_KINDS = frozenset({"SEND", "RECV", "AGG"})


#: Event-table columns, their dtypes and defaults for optional columns.
#: ``start``/``dur`` are microseconds on the node's own clock.
EVENT_COLUMNS: dict[str, tuple[str, Any]] = {
    "node": ("string", None),        # worker/server name as in the manifest
    "host": ("string", None),        # physical machine (filled from the manifest)
    "stream": ("string", "compute"), # resource on the node: compute, comm, h2d ...
    "op": ("string", None),          # op id, unique on the node within one iteration
    "name": ("string", ""),          # human-readable name (framework op name)
    "kind": ("string", None),        # an OpKind value
    "iteration": ("int64", None),
    "start": ("float64", None),      # us, node-local clock
    "dur": ("float64", None),        # us
    "tensor": ("string", ""),        # tensor / bucket this op sends or produces
    "bytes": ("int64", 0),
    "txn": ("string", ""),           # transaction id joining a SEND to its RECV
    "phase": ("string", ""),         # reduce_scatter / all_gather / push / pull
    "step": ("int64", -1),           # collective step (ring step)
    "chunk": ("int64", -1),          # chunk / partition index
    "peer": ("string", ""),          # the other node of a transfer
}
REQUIRED_EVENT_FIELDS = ("op", "kind", "iteration", "start", "dur")
#: the longest a node's trace may span (us): an event's start more than this from the node's median
#: start, or a duration longer than this, is a corrupt time (a profiled window is seconds to minutes)
MAX_TRACE_SPAN_US = 86_400e6


@dataclass
class NodeInfo:
    """One worker or server of the job."""

    host: str
    role: str = "worker"            # worker | server
    rank: int = 0
    dir: str | None = None          # folder with its raw traces, relative to the trace dir
    format: str | None = None       # reader for its raw traces (defaults to manifest.raw_format)
    file: str | None = None         # its one raw trace file, relative to ``dir`` (plain torch.profiler input)


@dataclass
class Manifest:
    """Job-level facts about a trace directory (``manifest.json``)."""

    job: str
    framework: str
    comm_backend: str
    world_size: int
    nodes: dict[str, NodeInfo]
    iterations: list[int]
    raw_format: str = "dpro-events"
    tool_version: str = ""
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def node_dir(self, node: str) -> str:
        info = self.nodes[node]
        return info.dir if info.dir else f"{info.host}/{node}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = {k: {kk: vv for kk, vv in asdict(v).items() if vv is not None}
                      for k, v in self.nodes.items()}
        return d

    @property
    def facts(self) -> Facts:
        """The typed job facts of ``extra`` (:class:`dpro_kit.schema.Facts`): what modules read."""
        return Facts.from_extra(self.extra if isinstance(self.extra, dict) else {})

    @classmethod
    def from_json(cls, d: Any, *, path: str) -> "Manifest":
        """A manifest from its JSON document, validated (:func:`dpro_kit.schema.validate_manifest`)."""
        validate_manifest(d, path)
        nodes = {}
        for name, info in d["nodes"].items():
            known = {k: info[k] for k in ("host", "role", "rank", "dir", "format", "file") if info.get(k) is not None}
            nodes[str(name)] = NodeInfo(**known)
        return cls(job=str(d["job"]), framework=str(d["framework"]), comm_backend=str(d["comm_backend"]),
                   world_size=int(d["world_size"]), nodes=nodes, iterations=[int(i) for i in d["iterations"]],
                   raw_format=str(d.get("raw_format", "dpro-events")), tool_version=str(d.get("tool_version", "")),
                   created=str(d.get("created", "")), extra=dict(d.get("extra") or {}),
                   format=FORMAT_NAME, version=int(d["version"]))

    def workers(self) -> list[str]:
        return sorted((n for n, i in self.nodes.items() if i.role == "worker"), key=lambda n: self.nodes[n].rank)

    def servers(self) -> list[str]:
        return sorted((n for n, i in self.nodes.items() if i.role == "server"), key=lambda n: self.nodes[n].rank)


@dataclass
class Collective:
    """One tensor (or fused bucket) synchronised across nodes.

    ``inputs[node]`` are the op ids on ``node`` whose completion makes the tensor
    ready to send (e.g. the backward ops producing the gradients of a bucket);
    ``outputs[node]`` are the op ids that wait for the synchronised tensor.
    ``op`` is ``allreduce`` (``algorithm`` ``ring``) or ``push_pull`` (parameter
    server; ``partitions`` lists ``{"bytes", "server"}`` per partition).
    """

    tensor: str
    op: str
    bytes: int
    participants: list[str]
    algorithm: str = "ring"
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    priority: float = 0.0
    #: optional, aligned with ``params``: bytes of each parameter's gradient, and per node
    #: the op in which each gradient became ready (lets what-if analyses re-bucket tensors)
    param_bytes: list[int] = field(default_factory=list)
    param_ready: dict[str, list[str]] = field(default_factory=dict)

    def to_node_json(self, node: str) -> dict[str, Any]:
        """The entry a node's ``comm.json`` holds for this collective."""
        d = {"tensor": self.tensor, "op": self.op, "algorithm": self.algorithm, "bytes": int(self.bytes),
             "inputs": list(self.inputs.get(node, [])), "outputs": list(self.outputs.get(node, [])),
             "params": list(self.params)}
        if self.partitions:
            d["partitions"] = list(self.partitions)
        if self.priority:
            d["priority"] = self.priority
        if self.param_bytes:
            d["param_bytes"] = [int(b) for b in self.param_bytes]
        if node in self.param_ready:
            d["param_ready"] = list(self.param_ready[node])
        return d


#: Memory samples (optional): allocator total after each allocation/free, per node and device.
MEMORY_COLUMNS: dict[str, str] = {"node": "string", "iteration": "int64", "time": "float64",
                                  "device": "string", "bytes": "int64"}


def empty_memory() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in MEMORY_COLUMNS.items()})


@dataclass
class NodeTrace:
    """What a reader returns for one node (``memory``: rows of MEMORY_COLUMNS without ``node``;
    ``warnings``: what the reader repaired or could not apply, one line each, docs/reliability.md)."""

    events: pd.DataFrame
    edges: list[tuple[str, str]]
    collectives: list[dict[str, Any]]
    memory: pd.DataFrame | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class TraceSet:
    """A whole job's normalised traces: the input of every analysis."""

    manifest: Manifest
    events: pd.DataFrame
    edges: dict[str, list[tuple[str, str]]]
    collectives: list[Collective]
    path: str | None = None
    #: allocator samples (MEMORY_COLUMNS; ``time`` in us on the node's clock); empty if not recorded
    memory: pd.DataFrame = field(default_factory=empty_memory)

    def nodes(self) -> list[str]:
        return self.manifest.workers() + self.manifest.servers()


def select_iterations(ts: TraceSet, iterations: Iterable[int]) -> TraceSet:
    """``ts`` restricted to some profiled iterations (events and memory samples).

    Parameters
    ----------
    ts : TraceSet
        A trace.
    iterations : iterable of int
        Profiled iteration numbers to keep.
    """
    keep = [int(i) for i in iterations]
    mem = ts.memory if ts.memory is not None else empty_memory()
    return _restricted(ts, set(keep), ts.events[ts.events["iteration"].isin(keep)], mem[mem["iteration"].isin(keep)])


def _restricted(ts: TraceSet, keep: set[int], events: pd.DataFrame, memory: pd.DataFrame) -> TraceSet:
    """``ts`` with these rows (of the iterations ``keep``) and the manifest's iterations narrowed to ``keep``."""
    man = replace(ts.manifest, iterations=[i for i in ts.manifest.iterations if i in keep])
    return replace(ts, manifest=man, events=events.reset_index(drop=True), memory=memory.reset_index(drop=True))


def split_iterations(ts: TraceSet, iterations: Iterable[int] | None = None) -> dict[int, TraceSet]:
    """``{i: select_iterations(ts, [i])}`` for each profiled iteration ``i`` (all by default), equal to it.

    The tables are sorted by iteration once (stable: rows keep their order within an iteration) and
    each iteration is a slice of that sort.  ``select_iterations`` per iteration costs a pass over the
    whole table each (a masked ``take`` of every Arrow string column): ~40-80 ms per iteration for a
    473 k-row trace of 440 iterations, most of ``dpro replay``'s per-iteration rule there
    (docs/scale.md, "Real rank files from an H100").

    Parameters
    ----------
    ts : TraceSet
        A trace.
    iterations : iterable of int or None
        The iterations wanted (default: every one in ``ts.events``); one not in the trace gives an empty one.
    """
    def by_iteration(df: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        it = df["iteration"].to_numpy(dtype=np.int64)
        order = np.argsort(it, kind="stable")
        return df.take(order), it[order]

    ev, ev_it = by_iteration(ts.events)
    mm, mm_it = by_iteration(ts.memory if ts.memory is not None else empty_memory())
    wanted = sorted({int(i) for i in ev_it}) if iterations is None else [int(i) for i in iterations]
    out: dict[int, TraceSet] = {}
    for i in wanted:
        a, b = np.searchsorted(ev_it, i, "left"), np.searchsorted(ev_it, i, "right")
        c, d = np.searchsorted(mm_it, i, "left"), np.searchsorted(mm_it, i, "right")
        out[i] = _restricted(ts, {i}, ev.iloc[a:b], mm.iloc[c:d])
    return out


# --------------------------------------------------------------------------- event table helpers

def make_events(records: Iterable[dict[str, Any]] | pd.DataFrame, *, path: str | None = None) -> pd.DataFrame:
    """Build a typed event table from records, checking every row.

    Raises :class:`TraceFormatError` naming ``path`` and the record index on a
    missing field, unknown kind, or a duration/start that is negative or not finite.
    """
    df = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    if df.empty:
        return empty_events()
    for name in REQUIRED_EVENT_FIELDS:
        if name not in df.columns:
            raise TraceFormatError(f"events lack the required field {name!r}", path=path, record="events[0]")
        if name in ("start", "dur"):
            continue  # NaN there is a bad value, reported below with the value
        missing = df[name].isna()
        if missing.any():
            i = int(np.flatnonzero(missing.to_numpy())[0])
            raise TraceFormatError(f"field {name!r} is missing", path=path, record=f"events[{i}]")
    for col, (dtype, default) in EVENT_COLUMNS.items():
        if col not in df.columns:
            df[col] = default if default is not None else ""
        elif default is not None:
            df[col] = df[col].fillna(default)
    kinds = set(OpKind._value2member_map_)
    bad = ~df["kind"].astype(str).isin(kinds)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        OpKind.parse(df["kind"].iloc[i], path=path, record=f"events[{i}] (op {df['op'].iloc[i]!r})")
    for col in ("start", "dur"):
        try:
            vals = pd.to_numeric(df[col], errors="raise").astype("float64")
        except (ValueError, TypeError):
            vals = pd.to_numeric(df[col], errors="coerce")
        badv = ~np.isfinite(vals.to_numpy(dtype="float64", na_value=np.nan))
        if col == "dur":
            badv |= vals.to_numpy(dtype="float64", na_value=np.nan) < 0
        if badv.any():
            i = int(np.flatnonzero(badv)[0])
            raw = df[col].iloc[i]
            shown = "missing or NaN" if pd.isna(raw) else f"{raw!r}"
            raise TraceFormatError(
                f"field {col!r} is {shown}; it must be a finite number" + (" >= 0" if col == "dur" else ""),
                path=path, record=f"events[{i}] (op {df['op'].iloc[i]!r})",
                hint="the trace is corrupt; re-collect this node")
        df[col] = vals
    starts = df["start"].to_numpy(dtype="float64")
    far = (np.abs(starts - np.median(starts)) > MAX_TRACE_SPAN_US) | (df["dur"].to_numpy(dtype="float64")
                                                                     > MAX_TRACE_SPAN_US)
    if far.any():
        i = int(np.flatnonzero(far)[0])
        raise TraceFormatError(
            f"op starts {(starts[i] - np.median(starts)) / 86_400e6:+.1f} days from the node's other ops or lasts "
            f"{df['dur'].iloc[i] / 86_400e6:.1f} days (at most 1 day)", path=path,
            record=f"events[{i}] (op {df['op'].iloc[i]!r})", hint="a time in the trace is corrupt; re-collect this node")
    it = pd.to_numeric(df["iteration"], errors="coerce")
    itf = it.to_numpy(dtype="float64", na_value=np.nan)
    bad_it = ~np.isfinite(itf) | (it % 1 != 0).to_numpy() | (np.abs(np.nan_to_num(itf)) >= 2.0 ** 62)
    if bad_it.any():
        i = int(np.flatnonzero(bad_it)[0])
        raise TraceFormatError(f"iteration is {df['iteration'].iloc[i]!r}; it must be an integer below 2^62"[:300],
                               path=path, record=f"events[{i}] (op {df['op'].iloc[i]!r})")
    for col, (dtype, _) in EVENT_COLUMNS.items():
        try:
            df[col] = df[col].astype(dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise TraceFormatError(f"column {col!r} cannot be read as {dtype}: {exc}", path=path) from None
    return df[list(EVENT_COLUMNS)].reset_index(drop=True)


def empty_events() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, (t, _) in EVENT_COLUMNS.items()})


def events_to_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Event rows as plain JSON-able dicts, leaving out columns at their default."""
    out = []
    cols = list(EVENT_COLUMNS)
    for row in df[cols].itertuples(index=False, name=None):
        rec = {}
        for col, val in zip(cols, row):
            default = EVENT_COLUMNS[col][1]
            if isinstance(val, (np.integer,)):
                val = int(val)
            elif isinstance(val, (np.floating,)):
                val = float(val)
            if col in ("node", "host"):
                continue  # implied by the folder; filled in when reading
            if default is not None and val == default:
                continue
            rec[col] = val
        out.append(rec)
    return out


# --------------------------------------------------------------------------- reading and writing

def read_json(path: str | os.PathLike, *, what: str = "file") -> Any:
    """Parse a JSON file, turning every way it can fail into one clear error."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{what} not found", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read {what}: {exc}", path=path) from None
    if not text.strip():
        raise TraceFormatError(f"{what} is empty", path=path, hint="the collection was interrupted; re-collect")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        trunc = exc.pos >= len(text.rstrip()) - 1
        raise TraceFormatError(
            f"{'truncated' if trunc else 'invalid'} JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
            path=path, hint="the file was cut short or is not JSON; re-collect this node") from None


def load_manifest(trace_dir: str | os.PathLike) -> Manifest:
    trace_dir = Path(trace_dir)
    if not trace_dir.exists():
        raise DproError("trace directory does not exist", path=trace_dir,
                        hint="pass the folder written by `dpro profile`")
    if not trace_dir.is_dir():
        name = trace_dir.name
        if name.endswith((".json", ".json.gz")):   # e.g. one rank's torch.profiler export
            job = re.sub(r"([_.-]?rank\d+)?(\.pt\.trace)?\.json(\.gz)?$", "", name) or "job"
            raise DproError("a file, not a trace folder", path=trace_dir,
                            hint=f"dpro reads a folder of one job's traces (one torch.profiler file per rank): "
                                 f"mkdir {job} && ln -s {trace_dir.resolve()} {job}/ && dpro replay {job}")
        raise DproError("not a directory", path=trace_dir, hint="pass the trace folder, not a file in it")
    mpath = trace_dir / "manifest.json"
    if not mpath.exists():
        # no manifest: each registered discoverer looks for what it can read (per-rank dpro_torch
        # meta.json, plain torch.profiler files, ...) and builds the manifest in memory
        from .readers import discover_manifest  # late import: readers import this module
        return discover_manifest(trace_dir)
    return Manifest.from_json(read_json(mpath, what="manifest"), path=str(mpath))


def read_node(manifest: Manifest, node: str, ndir: str, where: str) -> NodeTrace:
    """One node's :class:`NodeTrace` from its reader (a task of :func:`load_trace`, run by :mod:`dpro_kit.parallel`).

    Parameters
    ----------
    manifest : Manifest
        The job's manifest.
    node : str
        The node to read.
    ndir : str
        Its folder.
    where : str
        The manifest's path, for an unknown format's message.
    """
    from .readers import get_reader  # late import: readers import this module
    from .readers.kineto import gc_paused
    info = manifest.nodes[node]
    reader = get_reader(info.format or manifest.raw_format, path=where)
    with gc_paused():   # a reader builds 10^4..10^7 objects: collections during it cost as much as the reading
        return reader(manifest, node, Path(ndir))


def load_trace(trace_dir: str | os.PathLike, *, progress: Any = None, store: bool | None = None,
               file_progress: Any = None, scheduler: str | None = None) -> TraceSet:
    """Read a trace directory into a :class:`TraceSet` (all nodes, all iterations).

    Each node's raw files are read by the reader registered for its format
    (``manifest.raw_format`` or the node's own ``format``).

    Parameters
    ----------
    trace_dir : str or PathLike
        A trace directory (``manifest.json``, or a folder a registered discoverer recognises).
    progress : callable or None
        ``(done, total)`` callback while nodes are read.
    store : bool or None
        Use the columnar trace store (:mod:`dpro_kit.store`: what the readers returned, in
        Parquet under ``$DPRO_CACHE/store``, keyed by the raw files): read it when the files
        are unchanged, else parse and write it.  None: on when ``DPRO_STORE`` is set (not ``0``).
    file_progress : callable or None
        ``label -> (done, total) callback or None`` (:meth:`dpro_kit.session.Progress.step`):
        readers that stream a big file report the MB read through it
        (:data:`dpro_kit.readers.kineto.FILE_PROGRESS`; serial reading only).
    scheduler : str or None
        Who reads the nodes (:mod:`dpro_kit.parallel`): ``serial``, ``processes[:N]`` (local
        Dask) or a Dask scheduler address; None: ``$DPRO_SCHEDULER``, else serial.  The result
        is the serial one.

    Raises
    ------
    TraceFormatError
        A file is missing or not what its format says (one line: file, record, fix).
    """
    from .readers.kineto import FILE_PROGRESS  # late import: readers import this module

    token = FILE_PROGRESS.set(file_progress)
    try:
        return _load_trace(Path(trace_dir), progress, store, scheduler)
    finally:
        FILE_PROGRESS.reset(token)


def _load_trace(trace_dir: Path, progress: Any, store: bool | None, scheduler: str | None) -> TraceSet:
    from .readers import get_reader  # late import: readers import this module
    from .store import TraceStore, store_enabled

    stored = TraceStore(trace_dir) if store_enabled(store) else None
    if stored is not None and stored.index() is not None:
        manifest, writer = stored.manifest(), None
    else:
        manifest = load_manifest(trace_dir)
        writer = stored.writer(manifest) if stored is not None else None
        stored = None
    frames, edges, raw_colls, mem = [], {}, [], []
    warnings = [str(w) for w in manifest.facts.warnings]
    nodes = manifest.workers() + manifest.servers()
    if stored is not None:
        traces = [stored.node(node) for node in nodes]
    else:
        tasks = []
        for node in nodes:
            info = manifest.nodes[node]
            ndir = trace_dir / manifest.node_dir(node)
            if not ndir.is_dir():
                raise DproError(f"the trace of node {node!r} (rank {info.rank}) is missing", path=ndir,
                                hint="copy that node's trace folder here or re-collect the job")
            get_reader(info.format or manifest.raw_format, path=str(trace_dir / "manifest.json"))  # known format
            tasks.append((manifest, node, str(ndir), str(trace_dir / "manifest.json")))
        from .parallel import map_nodes
        traces = map_nodes(read_node, tasks, scheduler=scheduler, progress=progress)
        if writer is not None:
            for node, nt in zip(nodes, traces):
                writer.put(node, nt)
    for i, (node, nt) in enumerate(zip(nodes, traces)):
        info = manifest.nodes[node]
        ndir = trace_dir / manifest.node_dir(node)
        ev = nt.events
        ev["node"] = node
        ev["host"] = info.host
        frames.append(ev)
        edges[node] = nt.edges
        raw_colls.extend((node, c, ndir) for c in nt.collectives)
        if nt.memory is not None and not nt.memory.empty:
            mem.append(nt.memory.assign(node=node))
        warnings.extend(f"{node}: {w}" for w in nt.warnings)
        if progress is not None and stored is not None:     # else map_nodes reported it
            progress(i + 1, len(nodes))
    if writer is not None:
        writer.commit()
    events = pd.concat(frames, ignore_index=True) if frames else empty_events()
    for col, (dtype, _) in EVENT_COLUMNS.items():
        events[col] = events[col].astype(dtype)
    if warnings:   # what the readers repaired: the commands print manifest.facts.warnings
        manifest.extra["warnings"] = list(dict.fromkeys(warnings))
    collectives = merge_collectives(raw_colls, manifest)
    from .graph.schemes import SCHEMES   # a PS scheme of any kind (sync, async, step): fuzz case 87074
    ps = next((c for c in collectives if getattr(SCHEMES.get(c.algorithm), "uses_servers", False)), None)
    if ps is not None and not manifest.servers():   # fuzz case 41565: a server node deleted from the manifest
        mf = trace_dir / "manifest.json"
        raise TraceFormatError(f"tensor {ps.tensor!r} is pushed to a parameter server, and the manifest lists no "
                               "node with role 'server'", path=mf if mf.exists() else trace_dir, record="nodes",
                               hint="the job's server node(s) must be listed: restore the manifest.json that "
                                    "dpro profile wrote")
    memory = pd.concat(mem, ignore_index=True)[list(MEMORY_COLUMNS)] if mem else empty_memory()
    memory = memory.astype(MEMORY_COLUMNS)
    ts = TraceSet(manifest=manifest, events=events, edges=edges, collectives=collectives, path=str(trace_dir),
                  memory=memory)
    from .readers import get_finisher
    finish = get_finisher(manifest.raw_format)
    return finish(ts) if finish is not None else ts


def merge_collectives(raw: list[tuple[str, dict[str, Any], Path]], manifest: Manifest) -> list[Collective]:
    """Join the per-node ``comm.json`` entries of each tensor into one :class:`Collective`."""
    from .graph.schemes import scheme_for_op  # the scheme a collective's op implies (ring for allreduce)
    by_tensor: dict[str, Collective] = {}
    for node, c, ndir in raw:
        where = str(ndir / "comm.json")
        for key in ("tensor", "op", "bytes"):
            if key not in c:
                raise TraceFormatError(f"collective entry lacks {key!r}", path=where, record=str(c.get("tensor", "?")))
        name = str(c["tensor"])
        nbytes = int(c["bytes"])
        if nbytes < 0:
            raise TraceFormatError(f"negative size {nbytes}", path=where, record=name)
        col = by_tensor.get(name)
        if col is None:
            col = Collective(tensor=name, op=str(c["op"]), bytes=nbytes, participants=[],
                             algorithm=str(c["algorithm"] if "algorithm" in c else scheme_for_op(str(c["op"]))),
                             params=list(c.get("params", [])), partitions=list(c.get("partitions", [])),
                             priority=float(c.get("priority", 0.0)),
                             param_bytes=[int(b) for b in c.get("param_bytes", [])])
            by_tensor[name] = col
        elif col.bytes != nbytes or col.op != c["op"]:
            raise TraceFormatError(
                f"node {node!r} says {c['op']} of {nbytes} bytes, another node says {col.op} of {col.bytes}",
                path=where, record=name, hint="the nodes ran different models or bucket settings")
        if manifest.nodes[node].role == "worker":
            col.participants.append(node)
        col.inputs[node] = [str(x) for x in c.get("inputs", [])]
        col.outputs[node] = [str(x) for x in c.get("outputs", [])]
        if "param_ready" in c:
            ready = [str(x) for x in c["param_ready"]]
            if len(ready) != len(col.params):
                raise TraceFormatError(f"param_ready has {len(ready)} entries for {len(col.params)} params",
                                       path=where, record=name)
            col.param_ready[node] = ready
        if col.param_bytes and len(col.param_bytes) != len(col.params):
            raise TraceFormatError(f"param_bytes has {len(col.param_bytes)} entries for {len(col.params)} params",
                                   path=where, record=name)
    order = {n: (manifest.nodes[n].role != "worker", manifest.nodes[n].rank) for n in manifest.nodes}
    for col in by_tensor.values():
        col.participants.sort(key=order.__getitem__)
    return list(by_tensor.values())


def save_trace(ts: TraceSet, out_dir: str | os.PathLike) -> Path:
    """Write ``ts`` as a trace directory in the native ``dpro-events`` format.

    Writing is atomic per file and the manifest goes last, so a directory with
    a manifest is always complete.  Refuses to write into an existing trace dir.
    """
    out = Path(out_dir)
    if (out / "manifest.json").exists():
        raise DproError("refusing to overwrite an existing trace directory", path=out,
                        hint="choose a new output folder")
    m = ts.manifest
    new_nodes = {n: NodeInfo(host=i.host, role=i.role, rank=i.rank, dir=f"{i.host}/{n}", format=None)
                 for n, i in m.nodes.items()}
    for node, info in new_nodes.items():
        ndir = out / info.dir
        ev = ts.events[ts.events["node"] == node]
        atomic_write_text(ndir / "events.json", json.dumps(
            {"version": FORMAT_VERSION, "node": node, "events": events_to_records(ev)}, separators=(",", ":")))
        atomic_write_text(ndir / "dag.json", json.dumps(
            {"version": FORMAT_VERSION, "node": node, "edges": [list(e) for e in ts.edges.get(node, [])]},
            separators=(",", ":")))
        colls = [c.to_node_json(node) for c in ts.collectives
                 if node in c.participants or node in c.inputs or node in c.outputs]
        mem = ts.memory[ts.memory["node"] == node] if ts.memory is not None else empty_memory()
        if not mem.empty:
            atomic_write_text(ndir / "memory.json", json.dumps(
                {"version": FORMAT_VERSION, "node": node,
                 "columns": [c for c in MEMORY_COLUMNS if c != "node"],
                 "rows": mem[[c for c in MEMORY_COLUMNS if c != "node"]].values.tolist()},
                separators=(",", ":")))
        atomic_write_text(ndir / "comm.json", json.dumps(
            {"version": FORMAT_VERSION, "node": node, "collectives": colls}, indent=1))
    man = Manifest(job=m.job, framework=m.framework, comm_backend=m.comm_backend, world_size=m.world_size,
                   nodes=new_nodes, iterations=list(m.iterations), raw_format="dpro-events",
                   tool_version=m.tool_version, created=m.created, extra=dict(m.extra))
    atomic_write_text(out / "manifest.json", json.dumps(man.to_json(), indent=2))
    return out


__all__ = ["COMM_KINDS", "COMPUTE_KINDS", "EVENT_COLUMNS", "FORMAT_NAME", "FORMAT_VERSION", "LAYER_KINDS",
           "MEMORY_COLUMNS", "REQUIRED_EVENT_FIELDS", "SUPPORTED_VERSIONS", "TOPOLOGY_KINDS", "Collective",
           "empty_events", "empty_memory", "events_to_records", "load_manifest", "load_trace", "make_events",
           "Manifest", "merge_collectives", "NodeInfo", "NodeTrace", "OpKind", "read_json", "save_trace",
           "select_iterations", "TraceSet"]
