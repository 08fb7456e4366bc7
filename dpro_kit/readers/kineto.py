"""Generic Kineto (``torch.profiler``) trace layer: what any torch.profiler JSON file holds.

No framework import and no dpro collector assumptions: this module reads a
chrome-trace JSON file written by ``torch.profiler`` (Kineto), as TensorBoard's
profiler plugin and Holistic Trace Analysis read them, and exposes

* :func:`load_doc` — the JSON document (``.json`` or ``.json.gz``) with one-line
  errors for a missing, truncated (gzip or JSON), invalid or empty file;
* :func:`iter_events` — the same file read as a stream: the ``traceEvents`` one by one,
  never the whole text or document in memory (the same one-line errors);
* :func:`parse` (a loaded document) and :func:`parse_file` (a file, streamed) →
  :class:`KinetoTrace`: complete events (``ph == "X"``) of the
  CPU (``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``cuda_driver``,
  ``python_function``) and the GPU (``kernel``, ``gpu_memcpy``, ``gpu_memset``);
  per-thread call trees (:func:`nest`); the runtime call that launched each GPU
  op (Kineto's ``correlation`` argument, and the ``ac2g`` flow events — ``ph``
  ``s`` on the launch, ``f`` on the GPU op, the same ``id`` — where a GPU op has
  no correlation); the forward-backward links (``fwdbwd`` flow events: the
  forward op that recorded an autograd node -> the backward op that ran it);
  the steps (``ProfilerStep#N`` ranges); ``distributedInfo`` (rank, world size,
  backend, process groups); ``deviceProperties`` (the GPUs);
* :func:`subtree_sizes` — events recorded inside each event (what profiler cost is paid for);
* :func:`memory_samples` — the allocator's ``[memory]`` instant events (``profile_memory=True``);
* :func:`nccl_info` — collective name, message bytes, process group and sequence
  number of an NCCL kernel, from its own arguments (newer PyTorch) or from the
  ``record_param_comms`` / ``nccl:<collective>`` range around its launch (older).

Times: ``ts``/``dur`` are microseconds (Kineto ``ts`` plus ``baseTimeNanoseconds``
when the file has it), ``start_ns``/``dur_ns`` the same as exact integer
nanoseconds (since the Unix epoch a float64 microsecond value steps by 0.25 us,
so ordering and nesting use the integers).  Two readers are built on this layer:
the reader of plain folders (:mod:`dpro_kit.readers.kineto_plain`) and the dpro
collector's reader (:mod:`dpro_kit.readers.torch_kineto`, which adds what the
collector's markers and ``meta.json`` say: iterations, phases, DDP buckets, clock
sync, profiler-cost corrections).

References
----------
* Kineto trace format: https://github.com/pytorch/kineto (``libkineto/src/output_json.cpp``).
* Holistic Trace Analysis, trace parsing: https://github.com/facebookresearch/HolisticTraceAnalysis
  (``hta/common/trace_parser.py``, ``hta/common/trace_symbol_table.py``).
"""
from __future__ import annotations

import codecs
import contextlib
import gc
import gzip
import json
import math
import re
import zlib
from sys import intern
from contextvars import ContextVar
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import TraceFormatError

__all__ = ["KEvent", "KinetoTrace", "Step", "MemorySample", "existing", "load_doc", "iter_events", "parse", "parse_file", "read_file",
           "FILE_PROGRESS", "gc_paused", "release", "nest", "top_level",
           "subtree_sizes", "memory_samples", "distributed_info", "nccl_info", "is_nccl_kernel", "CPU_CATS",
           "GPU_CATS", "ANNOTATION_CATS", "SYNC_CALLS", "DTYPE_BYTES"]

CPU_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
ANNOTATION_CATS = frozenset({"user_annotation", "python_function"})
#: CUDA runtime calls that block the calling CPU thread until GPU work has finished
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: the largest |ts| (us) and dur (us) an event may have: ~3,000 years since the epoch, ~11.6 days.
#: Larger values (a corrupt or overflowing number) would not fit the int64 nanoseconds downstream.
MAX_ABS_TS_US = 1e17
MAX_DUR_US = 1e12
#: the longest span of one file's complete events (us): one day
MAX_SPAN_US = 86_400e6
NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: bytes per element of the ``dtype`` names record_param_comms writes
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1,
               "Float8_e5m2": 1}
#: kernel-name collective (ncclKernel_<Name>_...) -> collective name as c10d calls it
_KERNEL_COLLECTIVE = {"AllReduce": "allreduce", "Broadcast": "broadcast", "AllGather": "allgather",
                      "ReduceScatter": "reduce_scatter", "Reduce": "reduce", "SendRecv": "sendrecv"}


@dataclass(eq=False, slots=True)
class KEvent:
    """One complete (``ph == "X"``) Kineto event.

    ``ts``/``dur`` in microseconds (float), ``start_ns``/``dur_ns`` the same in exact
    integer nanoseconds (see the module docstring); ``parent``/``children``: the call
    tree of its thread (:func:`nest`).
    """

    name: str
    cat: str
    pid: Any
    tid: Any
    ts: float
    dur: float
    args: dict[str, Any]
    index: int                          # position in traceEvents (the record named in errors)
    start_ns: int = 0
    dur_ns: int = 0
    children: list["KEvent"] = field(default_factory=list)
    parent: "KEvent | None" = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(frozen=True)
class MemorySample:
    """One allocator event (``[memory]``): the allocator's total after it, on one device."""

    time_ns: int          # exact ns since the epoch (as :attr:`KEvent.start_ns`)
    device: str           # "cpu" or "cuda:<i>"
    total_bytes: int      # "Total Allocated" after this allocation or free


@dataclass
class Step:
    """One ``ProfilerStep#N`` range: step number and its span on the CPU (us)."""

    number: int
    start: float
    end: float

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class KinetoTrace:
    """The parsed content of one Kineto file (see the module docstring)."""

    path: Path
    cpu: dict[tuple[Any, Any], list[KEvent]]     # (pid, tid) -> events of that CPU thread
    gpu: dict[Any, list[KEvent]]                 # stream -> GPU ops, by start
    launch: dict[int, KEvent]                    # id(GPU op) -> the runtime call that launched it
    steps: list[Step]
    distributed: dict[str, Any] | None
    thread_names: dict[tuple[Any, Any], str]
    n_flows: int = 0                             # ac2g flow pairs found (s and f with one id)
    fwdbwd: list[tuple[KEvent, KEvent]] = field(default_factory=list)  # (forward op, backward op) flows
    devices: list[dict[str, Any]] = field(default_factory=list)          # deviceProperties (GPUs)
    warnings: list[str] = field(default_factory=list)                    # what the reader took as written


def _ns(us: float) -> int:
    """Microseconds as written (Kineto: three decimals) -> exact integer nanoseconds.

    ``round(us * 1000)`` is not exact for absolute times (files without
    ``baseTimeNanoseconds``: ~1.7e15 us, whose product with 1000 exceeds 2**53), so the
    whole microseconds and the fraction are converted apart.
    """
    whole = math.floor(us)
    return int(whole) * 1000 + round((us - whole) * 1000)


# --------------------------------------------------------------------------- loading

def existing(path: str | Path) -> Path:
    """``path``, or its gzip-compressed sibling ``path.gz`` when only that exists (a user gzipped
    the trace after recording; ``meta.json`` still names the plain file).

    Raises
    ------
    TraceFormatError
        Neither exists.
    """
    path = Path(path)
    if path.is_file():
        return path
    gz = path.with_name(path.name + ".gz")
    if gz.is_file():
        return gz
    raise TraceFormatError("Kineto trace not found", path=path,
                           hint=f"copy the rank's trace file back (or its gzip-compressed {gz.name})")


def load_doc(path: str | Path) -> dict[str, Any]:
    """The JSON document of a Kineto trace (``.json`` or gzip-compressed ``.json.gz``).

    Raises
    ------
    TraceFormatError
        The file is missing, a truncated or corrupt gzip stream, not JSON (or cut short),
        not a JSON object with a ``traceEvents`` list, or ``traceEvents`` is empty.
    """
    path = existing(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (EOFError, OSError, zlib.error) as exc:
                raise TraceFormatError(f"truncated or corrupt gzip file ({exc})", path=path,
                                       hint="copy the file again; it was cut short") from None
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFormatError("not a text (UTF-8) JSON file", path=path) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read the file: {exc.strerror}", path=path) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        trunc = exc.pos >= len(text.rstrip()) - 1
        raise TraceFormatError(
            f"{'truncated' if trunc else 'invalid'} JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
            path=path, hint="the file was cut short or is not a torch.profiler trace; export it again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError("not a torch.profiler (Kineto) trace: no top-level 'traceEvents' list", path=path)
    if not doc["traceEvents"]:
        raise TraceFormatError("'traceEvents' is empty", path=path, record="traceEvents",
                               hint="the profiler recorded nothing; profile at least one step")
    return doc


#: text read per refill of the streaming reader (characters; grows for one longer value)
_CHUNK = 1 << 22
#: files at least this big report progress (``FILE_PROGRESS``) while they are read
PROGRESS_MIN_BYTES = 64 << 20
#: set by :func:`dpro_kit.trace.load_trace` while it reads: ``label -> (done, total) callback or None``
#: (:meth:`dpro_kit.session.Progress.step`); a big file's reader reports MB read of its size
FILE_PROGRESS: ContextVar[Callable[[str], Callable[[int, int], None] | None] | None] = \
    ContextVar("dpro_kineto_file_progress", default=None)
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Text:
    """The text of a ``.json`` / ``.json.gz`` file, read in chunks, with positions for error lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.raw = open(path, "rb")
        except OSError as exc:
            raise TraceFormatError(f"cannot read the file: {exc.strerror}", path=path) from None
        self.size = max(1, path.stat().st_size)
        self.fh: Any = gzip.GzipFile(fileobj=self.raw) if self.raw.read(2) == b"\x1f\x8b" else self.raw
        self.raw.seek(0)
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.dropped_lines, self.dropped_col = 0, 0   # newlines before buf; characters after the last one
        self.report: Callable[[int, int], None] | None = None
        factory = FILE_PROGRESS.get()
        if factory is not None and self.size >= PROGRESS_MIN_BYTES:
            self.report = factory(f"reading {path.name} (MB)")
        self.reported = -1

    def close(self) -> None:
        self.raw.close()

    def fill(self, n: int = _CHUNK) -> None:
        """Drop what was consumed, read about ``n`` more characters (``eof`` at the end)."""
        if self.pos:
            done = self.buf[:self.pos]
            nl = done.count("\n")
            self.dropped_lines += nl
            self.dropped_col = (self.dropped_col + len(done)) if not nl else len(done) - done.rfind("\n") - 1
            self.buf, self.pos = self.buf[self.pos:], 0
        try:
            data = self.fh.read(n)
            self.buf += self.utf8.decode(data, final=not data)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise TraceFormatError(f"truncated or corrupt gzip file ({exc})", path=self.path,
                                   hint="copy the file again; it was cut short") from None
        except UnicodeDecodeError:
            raise TraceFormatError("not a text (UTF-8) JSON file", path=self.path) from None
        except OSError as exc:
            if self.fh is not self.raw:
                raise TraceFormatError(f"truncated or corrupt gzip file ({exc})", path=self.path,
                                       hint="copy the file again; it was cut short") from None
            raise TraceFormatError(f"cannot read the file: {exc.strerror}", path=self.path) from None
        if not data:
            self.eof = True
        if self.report is not None:
            mb = self.raw.tell() >> 20
            if mb != self.reported and (mb - self.reported >= 64 or self.eof):
                self.reported = mb
                self.report(mb if not self.eof else self.size >> 20, self.size >> 20)

    def error(self, msg: str, pos: int) -> TraceFormatError:
        """load_doc's line for a JSON error at ``pos`` of the buffer (line and column in the file)."""
        before = self.buf[:pos]
        nl = before.count("\n")
        line = self.dropped_lines + nl + 1
        col = (self.dropped_col + pos if not nl else pos - before.rfind("\n") - 1) + 1
        trunc = self.eof and pos >= len(self.buf.rstrip()) - 1
        return TraceFormatError(f"{'truncated' if trunc else 'invalid'} JSON at line {line} column {col}: {msg}",
                                path=self.path, hint="the file was cut short or is not a torch.profiler trace; "
                                "export it again")

    def peek(self) -> str:
        """The next character after whitespace ("" at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return self.buf[self.pos:self.pos + 1]
            self.fill()

    def expect(self, chars: str, msg: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise self.error(msg, self.pos)
        self.pos += 1
        return c

    def value(self, key: bool = False) -> Any:
        """The JSON value (``key``: the string) at the current position; refills until it is whole."""
        self.peek()
        while True:
            try:
                if key:
                    if self.buf[self.pos:self.pos + 1] != '"':
                        raise json.JSONDecodeError("Expecting property name enclosed in double quotes",
                                                   self.buf, self.pos)
                    obj, end = json.decoder.scanstring(self.buf, self.pos + 1)
                else:
                    obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.buf) - 8
                if self.eof or not cut:
                    raise self.error(exc.msg, exc.pos) from None
                self.fill(max(_CHUNK, len(self.buf) - self.pos))
                continue
            if end >= len(self.buf) and not self.eof:   # a number may go on in the next chunk
                self.fill(max(_CHUNK, len(self.buf) - self.pos))
                continue
            self.pos = end
            return obj


def iter_events(path: str | Path, header: dict[str, Any]) -> Any:
    """The ``traceEvents`` of a Kineto file one by one, read as a stream (``.json`` or ``.json.gz``).

    Only one chunk of the text (4 M characters, more for one longer value) and the current
    event are held, never the whole file or document: the memory of a reader built on it is
    what it keeps of the events (docs/reliability.md, "Memory").  Big files (at least
    :data:`PROGRESS_MIN_BYTES`) report the MB read to :data:`FILE_PROGRESS` when it is set.

    Parameters
    ----------
    path : str or Path
        The file.
    header : dict
        Filled with the document's other top-level keys (``distributedInfo``,
        ``deviceProperties``, ``baseTimeNanoseconds``, ...) as they are read; whole once the
        generator is exhausted (Kineto writes ``baseTimeNanoseconds`` after the events).

    Raises
    ------
    TraceFormatError
        As :func:`load_doc`, with the same lines: missing file, truncated or corrupt gzip,
        not UTF-8, truncated or invalid JSON (line and column), no top-level ``traceEvents``
        list, an empty one; and two ``traceEvents`` lists.  A JSON error after some events is
        raised when the reader reaches it, after those events were yielded.
    """
    path = existing(path)
    t = _Text(path)
    n: int | None = None       # events of the last top-level traceEvents, None when it is not a list
    try:
        t.fill()
        if t.peek() != "{":
            t.value()           # the JSON error, if any; else valid JSON that is not an object
        elif t.expect("{", "") and t.peek() == "}":
            t.pos += 1
        else:
            while True:
                key = t.value(key=True)
                t.expect(":", "Expecting ':' delimiter")
                if key == "traceEvents" and t.peek() == "[":
                    if n is not None:
                        raise TraceFormatError("two 'traceEvents' lists in one file", path=path,
                                               record="traceEvents", hint="export the trace again")
                    t.pos += 1
                    n = 0
                    if t.peek() == "]":
                        t.pos += 1
                    else:
                        while True:
                            yield t.value()
                            n += 1
                            if t.expect(",]", "Expecting ',' delimiter") == "]":
                                break
                elif key == "traceEvents":
                    t.value()
                    n = None
                else:
                    header[key] = t.value()
                if t.expect(",}", "Expecting ',' delimiter") == "}":
                    break
        if t.peek():
            raise t.error("Extra data", t.pos)
    finally:
        t.close()
    if n is None:
        raise TraceFormatError("not a torch.profiler (Kineto) trace: no top-level 'traceEvents' list", path=path)
    if not n:
        raise TraceFormatError("'traceEvents' is empty", path=path, record="traceEvents",
                               hint="the profiler recorded nothing; profile at least one step")


def distributed_info(doc: dict[str, Any]) -> dict[str, Any] | None:
    """``distributedInfo`` with ``rank`` and ``world_size`` as ints, or None when absent or unusable."""
    di = doc.get("distributedInfo")
    if not isinstance(di, dict):
        return None
    try:
        rank, world = int(di["rank"]), int(di["world_size"])
    except (KeyError, TypeError, ValueError, OverflowError):   # OverflowError: int(inf)
        return None
    if world < 1 or not 0 <= rank < world:
        return None
    return dict(di, rank=rank, world_size=world)


# --------------------------------------------------------------------------- parsing

def parse(doc: dict[str, Any], path: str | Path) -> KinetoTrace:
    """Events, threads, streams, launches and steps of a loaded document (:func:`load_doc`).

    Parameters
    ----------
    doc : dict
        The document.
    path : str or Path
        Its file (named in errors).

    Raises
    ------
    TraceFormatError
        An event without a numeric ``ts``/``dur``, or a negative duration (naming the record).
    """
    return _parse(doc["traceEvents"], doc, Path(path))


def parse_file(path: str | Path, on_event: Callable[[Any], None] | None = None,
               header: dict[str, Any] | None = None) -> KinetoTrace:
    """:func:`parse` of a file read as a stream (:func:`iter_events`): the same trace, without
    the whole document in memory.

    Parameters
    ----------
    path : str or Path
        A ``.json`` or ``.json.gz`` Kineto file.
    on_event : callable, optional
        Called with every entry of ``traceEvents`` (as written, before it is checked), for a
        caller that wants more of the file than :class:`KinetoTrace` keeps.
    header : dict, optional
        Filled with the document's other top-level keys (:func:`iter_events`).

    Raises
    ------
    TraceFormatError
        As :func:`iter_events` and :func:`parse`.
    """
    path = existing(path)   # errors name the file read (meta.json may name the plain one of a .gz)
    check_memory(path)
    header = {} if header is None else header
    events = iter_events(path, header)
    if on_event is not None:
        events = _tap(events, on_event)
    with gc_paused():
        return _parse(events, header, path)


def read_file(path: str | Path) -> tuple[KinetoTrace, dict[str, Any]]:
    """:func:`parse_file` of ``path`` and a small stand-in for its document: the other top-level
    keys and, as ``traceEvents``, only the allocator events (``[memory]``, what
    :func:`memory_samples` reads).  For readers that want the parsed trace and a document
    (``torch_kineto``, ``horovod``) without the whole document in memory: reading two real 307 MB rank
    files from an H100 peaked at 1,526 MB instead of 2,255 MB with the whole document (docs/scale.md,
    "Real rank files from an H100"), and the early memory check (:func:`check_memory`) covers them.

    Raises
    ------
    TraceFormatError, DproError
        As :func:`parse_file` (a file too big for the memory available is refused before it is read).
    """
    header: dict[str, Any] = {}
    mem: list[Any] = []

    def keep(e: Any) -> None:
        if isinstance(e, dict) and e.get("name") == "[memory]":
            mem.append(e)

    kt = parse_file(path, on_event=keep, header=header)
    return kt, dict(header, traceEvents=mem)


#: what reading a plain file costs in peak resident memory, fitted on files of 53-2,049 MB
#: (``bench/memory_load.py``, docs/reliability.md "Memory"): MiB per MB of JSON, and MiB on top
MEMORY_MIB_PER_MB = 4.0
MEMORY_BASE_MIB = 90.0
#: files smaller than this are not checked (their reading needs well under a GiB)
MEMORY_CHECK_MIN_BYTES = 64 << 20


def json_bytes(path: Path) -> int | None:
    """Size of the JSON text of ``path``: the file's size, or for a ``.gz`` the size its trailer
    records (ISIZE, the size modulo 2^32: trusted only for files under 128 MiB compressed, which
    Kineto's JSON, compressing about 10-20x, keeps under 4 GiB); None when it cannot be told."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return size
            if size < 18 or size >= 128 << 20:
                return None
            fh.seek(-4, 2)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return None


def check_memory(path: Path) -> None:
    """Refuse, before reading it, a file whose parse needs more memory than this process can get.

    The need is the measured bound (:data:`MEMORY_MIB_PER_MB` x the JSON's MB +
    :data:`MEMORY_BASE_MIB`); what it can get is :func:`dpro_kit.resources.available_memory_bytes`.
    ``DPRO_MEMORY_CHECK=0`` skips the check (e.g. when swap is meant to carry it).

    Raises
    ------
    DproError
        One line: the file, its size, the memory it needs and the memory available.
    """
    import os

    if os.environ.get("DPRO_MEMORY_CHECK", "1") == "0":
        return
    n = json_bytes(path)
    if n is None or n < MEMORY_CHECK_MIN_BYTES:
        return
    from ..errors import DproError
    from ..resources import available_memory_bytes
    need = (MEMORY_MIB_PER_MB * n / 1e6 + MEMORY_BASE_MIB) * 2**20
    have = available_memory_bytes()
    if have is not None and need > have:
        raise DproError(f"reading this {n / 1e6:,.0f} MB trace needs about {need / 2**30:.1f} GiB of memory "
                        f"({MEMORY_MIB_PER_MB:g} x its size + {MEMORY_BASE_MIB:g} MiB, docs/reliability.md), and "
                        f"{have / 2**30:.1f} GiB is available", path=path,
                        hint="run dpro where it can use more memory, or export fewer steps per file from "
                             "torch.profiler (DPRO_MEMORY_CHECK=0 reads it anyway)")


@contextlib.contextmanager
def gc_paused() -> Any:
    """No cyclic garbage collection inside (restored after): building a trace's millions of
    objects otherwise triggers a full collection again and again (3x the time of reading a
    large file, docs/reliability.md "Memory"); what they leave is collected afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def release(tr: KinetoTrace) -> None:
    """Break the call trees' reference cycles (``parent`` <-> ``children``) of a trace no longer
    needed, so it is freed at once rather than by a later full garbage collection (which,
    while reading many files, comes rarely: the folders of many ranks would hold them all).

    Parameters
    ----------
    tr : KinetoTrace
        A parsed trace; its events keep their fields but lose ``parent`` and ``children``.
    """
    for evs in (*tr.cpu.values(), *tr.gpu.values()):
        for ev in evs:
            ev.parent = None
            ev.children = []


def _tap(events: Any, f: Callable[[Any], None]) -> Any:
    for e in events:
        f(e)
        yield e


#: the categories Kineto gives a ``ProfilerStep#N`` range (the CPU one, and its copy on a GPU stream)
STEP_CATS = ("user_annotation", "gpu_user_annotation")


def _check_step_event(e: dict[str, Any], name: str, ph: Any, path: Path, i: int) -> None:
    """A ``ProfilerStep...`` event must be a whole step range: ``ProfilerStep#N``, complete (``ph`` X), a user
    annotation, a positive duration.  Anything else would drop that step without a word (fuzzing: a renamed
    or zero-length step moved the replayed iteration by 1.2 %), so it is refused, naming the record."""
    why = ""
    if not STEP_RE.match(name):
        why = f"name {name[:60]!r} is not ProfilerStep#N"
    elif ph != "X":
        why = f"ph {ph!r}: a step range is a complete event (X)"
    elif e.get("cat") not in STEP_CATS:
        why = f"cat {str(e.get('cat'))[:40]!r}: Kineto writes a step range as user_annotation"
    else:
        dur = e.get("dur")
        if type(dur) in (int, float) and not dur > 0:
            why = f"duration {dur!r}: a step range has a positive duration"
    if why:
        raise TraceFormatError(f"step range {why}", path=path, record=f"traceEvents[{i}]",
                               hint="a step range's name or time is corrupt; export the trace again")


def _parse(events: Any, header: dict[str, Any], path: Path) -> KinetoTrace:
    """:func:`parse` over an iterable of events; ``header`` (the other top-level keys) is read
    only once the events are exhausted (a stream fills it as it goes)."""
    cpu: dict[tuple[Any, Any], list[KEvent]] = defaultdict(list)
    gpu: dict[Any, list[KEvent]] = defaultdict(list)
    names: dict[tuple[Any, Any], str] = {}
    flow_s: dict[Any, tuple[Any, Any, float]] = {}
    flow_f: dict[Any, tuple[Any, Any, float]] = {}
    raw_ts: dict[int, float] = {}   # id(event) -> its ts as written (flow ends carry the same value)
    fb_s: dict[Any, tuple[Any, Any, float]] = {}
    fb_f: dict[Any, tuple[Any, Any, float]] = {}
    procs: set[Any] = set()                 # pids the file names (process_name metadata)
    cpu_pid_at: dict[Any, int] = {}         # pid of CPU events -> the first such event's index
    for i, e in enumerate(events):
        if not isinstance(e, dict):   # fuzz case 47722: an annotation replaced by -1 was skipped, +1.74 % silently
            raise TraceFormatError(f"an event must be a JSON object, not {type(e).__name__}", path=path,
                                   record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
            continue
        if ph == "M" and e.get("name") == "process_name" and not isinstance(e.get("pid"), (list, dict)):
            procs.add(e.get("pid"))
            continue
        if ph in ("s", "f") and e.get("cat") in ("ac2g", "fwdbwd"):
            ends = ((flow_s if ph == "s" else flow_f) if e.get("cat") == "ac2g" else (fb_s if ph == "s" else fb_f))
            try:
                fts = float(e["ts"])
            except (KeyError, TypeError, ValueError, OverflowError):
                continue
            if not (math.isfinite(fts) and abs(fts) <= MAX_ABS_TS_US):   # fuzz case 40704: a NaN lost an edge
                raise TraceFormatError(f"flow event ts {fts!r} is not a finite time (|ts| <= {MAX_ABS_TS_US:.0e} us)",
                                       path=path, record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
            if isinstance(e.get("pid"), (list, dict)) or isinstance(e.get("tid"), (list, dict)):
                # fuzz case 72992: a flow end's pid [] raised TypeError (unhashable) when matched
                raise TraceFormatError("a flow event's pid and tid must be numbers or strings", path=path,
                                       record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
            try:
                ends[e["id"]] = (e.get("pid"), e.get("tid"), fts)
            except (KeyError, TypeError):
                pass
            continue
        nm = e.get("name")
        if type(nm) is str and nm.startswith("ProfilerStep"):
            _check_step_event(e, nm, ph, path, i)
        if ph != "X":
            continue
        cat = e.get("cat", "")
        if isinstance(cat, (list, dict)):
            raise TraceFormatError("an event's cat must be a string", path=path, record=f"traceEvents[{i}]",
                                   hint="the file is corrupt; export it again")
        if cat not in CPU_CATS and cat not in GPU_CATS:
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise TraceFormatError("event without a numeric ts/dur", path=path, record=f"traceEvents[{i}]",
                                   hint="the file is corrupt; export it again") from None
        if not (math.isfinite(ts) and abs(ts) <= MAX_ABS_TS_US):
            raise TraceFormatError(f"ts {ts!r} is not a finite time (|ts| <= {MAX_ABS_TS_US:.0e} us)", path=path,
                                   record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
        if not 0 <= dur <= MAX_DUR_US:
            raise TraceFormatError(f"negative or invalid duration {dur!r} (0 <= dur <= {MAX_DUR_US:.0e} us)",
                                   path=path, record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
        args = e.get("args")
        # one copy of each key and short string (a stream decodes every event apart, so nothing is shared)
        args = {intern(k): intern(v) if type(v) is str and len(v) <= 200 else v for k, v in args.items()} \
            if isinstance(args, dict) else {}
        pid, tid = e.get("pid"), e.get("tid")
        stream = args.get("stream", tid) if cat in GPU_CATS else None
        if isinstance(pid, (list, dict)) or isinstance(tid, (list, dict)) or isinstance(stream, (list, dict)):
            raise TraceFormatError("pid, tid and args.stream must be numbers or strings", path=path,
                                   record=f"traceEvents[{i}]", hint="the file is corrupt; export it again")
        ev = KEvent(name=intern(str(e.get("name", ""))), cat=intern(cat) if type(cat) is str else cat,
                    pid=intern(pid) if type(pid) is str else pid, tid=intern(tid) if type(tid) is str else tid,
                    ts=ts, dur=dur, args=args, index=i, start_ns=_ns(ts), dur_ns=_ns(dur))
        raw_ts[id(ev)] = round(ts, 3)
        if cat in GPU_CATS:
            gpu[stream].append(ev)
        else:
            cpu[(ev.pid, ev.tid)].append(ev)
            cpu_pid_at.setdefault(ev.pid, i)
    # Kineto names every process it recorded (process_name metadata); a CPU event of a pid it does not
    # name has a corrupt pid, and was replayed as another process's thread (fuzz case 98988: +2.1 % silently)
    stray = [(i, p) for p, i in cpu_pid_at.items() if procs and p not in procs]
    if stray:
        i, p = min(stray, key=lambda t: t[0])
        raise TraceFormatError(f"a CPU event's pid {str(p)[:40]!r}{'...' if len(str(p)) > 40 else ''} is not one of "
                               "the file's processes (no process_name metadata names it)", path=path,
                               record=f"traceEvents[{i}]", hint="the event's pid is corrupt; export the trace again")
    # the base time: Kineto writes it after the events (a stream knows it only now)
    base_ns = _base_time_ns(header, path)
    base_us = base_ns / 1e3
    for evs in (*cpu.values(), *gpu.values()):
        for ev in evs:
            ev.ts += base_us
            ev.start_ns += base_ns
    _check_span([ev for evs in (*cpu.values(), *gpu.values()) for ev in evs], path)
    for evs in gpu.values():
        evs.sort(key=lambda x: (x.start_ns, x.index))
    crossed: list[tuple[KEvent, KEvent]] = []
    for evs in cpu.values():
        nest(evs, crossed)
    warnings = [_crossing_warning(crossed, path)] if crossed else []
    moved = _out_of_order(cpu)
    if moved:
        warnings.append(_order_warning(moved, path))
    # launches: the runtime call whose correlation id the GPU op carries; ac2g flows otherwise
    runtime: dict[Any, KEvent] = {}
    at: dict[tuple[Any, Any, float], KEvent] = {}
    for evs in cpu.values():
        for ev in evs:
            if ev.cat in ("cuda_runtime", "cuda_driver"):
                c = ev.args.get("correlation")
                if c is not None:
                    runtime[c] = ev
                at[(ev.pid, ev.tid, raw_ts[id(ev)])] = ev
    pairs = {k: (flow_s[k], flow_f[k]) for k in flow_s.keys() & flow_f.keys()}
    by_flow_end: dict[tuple[Any, Any, float], KEvent] = {}
    for s, f in pairs.values():
        ev = at.get((s[0], s[1], round(s[2], 3)))
        if ev is not None:
            by_flow_end[(f[0], f[1], round(f[2], 3))] = ev
    launch: dict[int, KEvent] = {}
    for evs in gpu.values():
        for ev in evs:
            src = runtime.get(ev.args.get("correlation"))
            if src is None:
                src = by_flow_end.get((ev.pid, ev.tid, raw_ts[id(ev)]))
            if src is not None:
                launch[id(ev)] = src
    steps = []
    for evs in cpu.values():
        for ev in evs:
            m = STEP_RE.match(ev.name)
            if m and ev.cat == "user_annotation":
                steps.append(Step(int(m.group(1)), ev.ts, ev.end))
    steps.sort(key=lambda s: s.start)
    for a, b in zip(steps, steps[1:]):
        if b.number <= a.number or b.start < a.end:
            raise TraceFormatError(
                f"ProfilerStep#{b.number} starts before ProfilerStep#{a.number} ends, or the step numbers do not "
                "increase with time", path=path, record=f"ProfilerStep#{b.number}",
                hint="a step range's time or name is corrupt; export the trace again")
    gaps = [(a, b) for a, b in zip(steps, steps[1:]) if b.number != a.number + 1]
    if gaps:
        a, b = gaps[0]
        more = f" (and {len(gaps) - 1} more gap(s))" if len(gaps) > 1 else ""
        warnings.append(f"{Path(path).name}: ProfilerStep#{a.number} is followed by ProfilerStep#{b.number}{more}; "
                        "torch.profiler numbers the steps of one export consecutively: the steps in between are "
                        "missing (deleted from the file?); replayed the steps present")
    # forward -> backward links: Kineto puts the flow's start on the forward op and its end on the
    # backward op, at their own ts; the outermost cpu_op there is the op
    ops_at: dict[tuple[Any, Any, float], KEvent] = {}
    for evs in cpu.values():
        for ev in reversed(evs):            # nest order: the outermost of several at one time wins
            if ev.cat == "cpu_op":
                ops_at[(ev.pid, ev.tid, raw_ts[id(ev)])] = ev
    fwdbwd = []
    for k in sorted(fb_s.keys() & fb_f.keys(), key=lambda k: (fb_s[k][2], str(k))):
        s_, f_ = fb_s[k], fb_f[k]
        fw = ops_at.get((s_[0], s_[1], round(s_[2], 3)))
        bw = ops_at.get((f_[0], f_[1], round(f_[2], 3)))
        if fw is not None and bw is not None:
            fwdbwd.append((fw, bw))
    props = header.get("deviceProperties")
    devices = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    return KinetoTrace(path=path, cpu=dict(cpu), gpu=dict(gpu), launch=launch, steps=steps,
                       distributed=distributed_info(header), thread_names=names, n_flows=len(pairs),
                       fwdbwd=fwdbwd, devices=devices, warnings=warnings)


def _crossing_warning(crossed: list[tuple[KEvent, KEvent]], path: Path) -> str:
    """The one warning for CPU events that end after the range they start in (:func:`nest`)."""
    a, b = crossed[0]
    more = f" (and {len(crossed) - 1} more)" if len(crossed) > 1 else ""
    return (f"{Path(path).name} [traceEvents[{b.index}]]: {b.name!r:.60} starts inside {a.name!r:.60} "
            f"(traceEvents[{a.index}]) on its thread and ends {(b.end_ns - a.end_ns) / 1e3:.3f} us after it{more}; "
            "the ranges of one thread nest in every real trace measured (docs/reliability.md): taken as "
            "siblings; if the file was edited, its times are wrong")


#: per CPU category, the id Kineto numbers a thread's events with in the order they start: 0 of 568 k
#: cpu_op / user_annotation events and 0 of 64 k runtime calls of 52 real files are out of order
#: (``External id``; ``correlation`` for the CUDA runtime / driver calls; docs/reliability.md)
ORDER_IDS = {"cpu_op": "External id", "user_annotation": "External id", "cuda_runtime": "correlation",
             "cuda_driver": "correlation"}


def _out_of_order(cpu: dict[tuple[Any, Any], list[KEvent]]) -> list[tuple[KEvent, KEvent]]:
    """(earlier-numbered, event) pairs where an event starts later on its thread than an event of the same
    category with a higher id (:data:`ORDER_IDS`): its time was edited (fuzz case 43229: two events' ``ts``
    swapped replayed +1.1 % without a word).  ``cpu`` lists are sorted by start (:func:`nest`)."""
    out: list[tuple[KEvent, KEvent]] = []
    for evs in cpu.values():
        top: dict[str, KEvent] = {}
        for ev in evs:
            key = ORDER_IDS.get(ev.cat)
            v = ev.args.get(key) if key else None
            if type(v) is not int:
                continue
            hi = top.get(ev.cat)
            if hi is None or v >= hi.args[key]:
                top[ev.cat] = ev
            elif ev.start_ns > hi.start_ns:
                out.append((hi, ev))
    return out


def _order_warning(moved: list[tuple[KEvent, KEvent]], path: Path) -> str:
    a, b = moved[0]
    key = ORDER_IDS[b.cat]
    more = f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""
    return (f"{Path(path).name} [traceEvents[{b.index}]]: {b.name!r:.60} ({key} {b.args[key]}) starts after "
            f"{a.name!r:.60} (traceEvents[{a.index}], {key} {a.args[key]}) on its thread{more}; Kineto numbers a "
            "thread's events in the order they start (every real trace measured, docs/reliability.md): one of "
            "their times was edited; taken as written")


def _check_span(evs: list[KEvent], path: Path) -> None:
    """Refuse an event more than :data:`MAX_SPAN_US` from the median start of the file's events
    (a corrupt time: a profiling window lasts seconds to minutes)."""
    if not evs:
        return
    ts = sorted(e.ts for e in evs)
    mid = ts[len(ts) // 2]
    for e in evs:
        if abs(e.ts - mid) > MAX_SPAN_US or e.dur > MAX_SPAN_US:
            raise TraceFormatError(f"event {e.name!r:.60} lies {(e.ts - mid) / 86_400e6:+.1f} days from the file's "
                                   f"other events or lasts {e.dur / 86_400e6:.1f} days (at most 1 day)", path=path,
                                   record=f"traceEvents[{e.index}]", hint="the file is corrupt; export it again")


def _base_time_ns(doc: dict[str, Any], path: Path) -> int:
    """``baseTimeNanoseconds`` (0 when absent): an integer of ns since the epoch, else a one-line error."""
    v = doc.get("baseTimeNanoseconds")
    if v is None:
        return 0
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62:
        raise TraceFormatError(f"baseTimeNanoseconds must be an integer of nanoseconds since the epoch, got {v!r:.40}",
                               path=path, record="baseTimeNanoseconds", hint="the file is corrupt; export it again")
    return v


def nest(evs: list[KEvent], crossed: list[tuple[KEvent, KEvent]] | None = None) -> list[KEvent]:
    """Build the call tree of one thread's events in place (``parent``/``children``); return the roots.

    Events are sorted by (start, longest first, position in the file), in exact
    nanoseconds; an event that overlaps its would-be parent without ending inside it
    is treated as a sibling.  No real trace measured has one (0 in 1.03 M CPU events of
    48 files, docs/reliability.md), so :func:`parse` says so (``crossed``: the pairs).

    Parameters
    ----------
    evs : list of KEvent
        The events of one thread; sorted in place.
    crossed : list, optional
        Gets (range, event) for each event that starts inside a range and ends after it.
    """
    evs.sort(key=lambda e: (e.start_ns, -e.dur_ns, e.index))
    roots: list[KEvent] = []
    stack: list[KEvent] = []
    for e in evs:
        while stack and e.start_ns >= stack[-1].end_ns:
            stack.pop()
        while stack and e.end_ns > stack[-1].end_ns:
            if crossed is not None:
                crossed.append((stack[-1], e))
            stack.pop()
        if stack:
            e.parent = stack[-1]
            stack[-1].children.append(e)
        else:
            roots.append(e)
        stack.append(e)
    return roots


def top_level(evs: list[KEvent], transparent: Callable[[KEvent], bool] | None = None) -> list[KEvent]:
    """The outermost work of one thread, in start order.

    Ranges (``user_annotation``, Python frames) that wrap other events are looked
    through, so nested ops are never counted twice; an empty annotation range is an op
    of its own (it took that time on the thread); an empty Python frame is host time,
    not an op.

    Parameters
    ----------
    evs : list of KEvent
        The events of one thread, nested (:func:`nest`, done by :func:`parse`).
    transparent : callable, optional
        Events for which it returns True are looked through like a range and are never
        ops themselves, even when empty (a collector's own markers).
    """
    out = []
    todo = [e for e in reversed(evs) if e.parent is None]
    while todo:
        e = todo.pop()
        if (e.cat in ANNOTATION_CATS and e.children) or (transparent is not None and transparent(e)):
            todo.extend(reversed(e.children))
        elif e.cat == "python_function":
            continue
        else:
            out.append(e)
    out.sort(key=lambda e: (e.start_ns, -e.dur_ns, e.index))
    return out


def subtree_sizes(evs: list[KEvent], counted: Callable[[KEvent], bool] | None = None) -> dict[int, int]:
    """``id(event)`` -> how many recorded events its subtree holds, itself included.

    The profiler pays its cost per recorded event, so this is what a per-event cost
    is multiplied by.

    Parameters
    ----------
    evs : list of KEvent
        The events of one thread, nested (:func:`nest`).
    counted : callable, optional
        Events for which it returns False count 0 (their children still count).
    """
    size: dict[int, int] = {}
    for e in sorted(evs, key=lambda e: (e.start_ns, -e.dur_ns, e.index), reverse=True):  # children first
        own = 1 if counted is None or counted(e) else 0
        size[id(e)] = own + sum(size[id(c)] for c in e.children)
    return size


def memory_samples(doc: dict[str, Any]) -> list[MemorySample]:
    """The allocator events of a ``profile_memory=True`` trace, in file order.

    Each Kineto ``[memory]`` instant event carries the allocator's running total after
    one allocation or free (``Total Allocated``) and the device (``Device Type`` 0 =
    CPU, 1 = CUDA, with ``Device Id``).  Events without a numeric time or total are
    skipped.

    Parameters
    ----------
    doc : dict
        The loaded document (:func:`load_doc`).
    """
    base = int(doc.get("baseTimeNanoseconds", 0) or 0)
    out = []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        a = e.get("args") or {}
        try:
            t = _ns(float(e["ts"])) + base
            total = int(a["Total Allocated"])
        except (KeyError, TypeError, ValueError):
            continue
        dev = "cpu" if int(a.get("Device Type", 0)) == 0 else f"cuda:{int(a.get('Device Id', 0))}"
        out.append(MemorySample(t, dev, total))
    return out


# --------------------------------------------------------------------------- NCCL

def is_nccl_kernel(ev: KEvent) -> bool:
    """Whether a GPU op is an NCCL kernel (``ncclKernel_*`` / ``ncclDevKernel_*``)."""
    return ev.cat == "kernel" and ev.name.lower().startswith("nccl")


def _size_bytes(args: dict[str, Any]) -> int:
    try:
        n = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0))
    except (TypeError, ValueError):
        return 0
    return n * DTYPE_BYTES.get(str(args.get("dtype", "")), 0)


def nccl_info(kernel: KEvent, launch: KEvent | None) -> dict[str, Any]:
    """What the trace says about the collective an NCCL kernel runs.

    Returns a dict with ``collective`` (c10d's name: allreduce, allgather, all_to_all, ...),
    ``bytes`` (the larger of the input and output message, 0 when not recorded),
    ``process_group`` (name, or the ranks it spans; "" when not recorded), ``seq`` (None
    when not recorded) and ``source`` (where the name came from: ``kernel args``,
    ``record_param_comms``, ``nccl range`` or ``kernel name``).
    """
    args = kernel.args
    info: dict[str, Any] = {"collective": "", "bytes": 0, "process_group": "", "seq": None, "source": ""}
    holders = [args]
    e = launch.parent if launch is not None else None
    while e is not None:
        if e.name == "record_param_comms" or e.name.startswith("nccl:"):
            holders.append(e.args)
            if e.name.startswith("nccl:") and not info["collective"]:
                info["collective"] = e.name[len("nccl:"):].lstrip("_")
                info["source"] = "nccl range"
        e = e.parent
    for a in holders:
        name = a.get("Collective name")
        if name and (not info["collective"] or info["source"] == "nccl range"):
            info["collective"] = str(name)
            info["source"] = "kernel args" if a is args else "record_param_comms"
        if not info["bytes"]:
            info["bytes"] = _size_bytes(a)
        if not info["process_group"]:
            pg = a.get("Process Group Name") or a.get("Process Group Ranks") or ""
            info["process_group"] = str(pg)
        for key in ("Seq", "seq", "Sequence number"):
            if info["seq"] is None and a is not args and a.get(key) is not None and "Collective name" in a:
                info["seq"] = a.get(key)
        if info["seq"] is None and a.get("Seq") is not None:
            info["seq"] = a.get("Seq")
    if not info["collective"]:
        m = NCCL_KERNEL_RE.match(kernel.name)
        info["collective"] = _KERNEL_COLLECTIVE.get(m.group(1), m.group(1).lower()) if m else "nccl"
        info["source"] = "kernel name"
    return info
