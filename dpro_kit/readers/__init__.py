"""Readers turn one node's raw trace files into a :class:`~dpro_kit.trace.NodeTrace`.

A reader is a function ``(manifest, node, node_dir) -> NodeTrace``.  Readers are
registered by format name (``manifest.raw_format`` or a node's ``format``), so a
new framework or communication library only adds a module here; nothing
downstream changes.  Third-party readers can register through the
``dpro_kit.readers`` entry-point group.
"""
from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Callable

from ..errors import TraceFormatError
from ..trace import Manifest, NodeTrace, TraceSet

Reader = Callable[[Manifest, str, Path], NodeTrace]
_READERS: dict[str, Reader] = {}


def register_reader(name: str, reader: Reader) -> None:
    _READERS[name] = reader


def get_reader(name: str, *, path: str | None = None) -> Reader:
    if name not in _READERS:
        for ep in metadata.entry_points(group="dpro_kit.readers"):
            if ep.name == name:
                register_reader(name, ep.load())
    if name not in _READERS:
        raise TraceFormatError(f"no reader for raw trace format {name!r}", path=path,
                               hint="known formats: " + ", ".join(sorted(_READERS)))
    return _READERS[name]


#: A finisher completes a format's TraceSet once every node is read, for what one node's files
#: cannot tell alone (``finisher(ts) -> TraceSet``); :func:`dpro_kit.trace.load_trace` calls it.
Finisher = Callable[["TraceSet"], "TraceSet"]
_FINISHERS: dict[str, Finisher] = {}


def register_finisher(name: str, fn: Finisher) -> None:
    """Run ``fn`` on every TraceSet of raw format ``name`` after its nodes are read."""
    _FINISHERS[name] = fn


def get_finisher(name: str) -> Finisher | None:
    """The finisher registered for raw format ``name``, or None."""
    return _FINISHERS.get(name)


def available() -> list[str]:
    return sorted(_READERS)


#: A discoverer looks at a trace directory that has no ``manifest.json`` and returns the
#: Manifest it can build from the files it recognises, or None if it recognises none of them.
#: It raises DproError (one line: file, what is wrong, what to do) when it recognises its
#: files but they cannot make a usable trace (ranks missing, mixed runs, ...).
Discoverer = Callable[[Path], "Manifest | None"]
_DISCOVERERS: list[tuple[str, Discoverer]] = []
#: discoverers whose input is sub-folders that each hold a ``manifest.json`` (the per-host folders of
#: one ``dpro profile`` job copied together); :func:`discover_manifest` tries them before it refuses a
#: folder of job folders
_OF_JOB_FOLDERS: set[str] = set()


def register_discoverer(name: str, fn: Discoverer, *, reads_job_folders: bool = False) -> None:
    """Add ``fn`` to the discoverers tried, in registration order, by :func:`discover_manifest`.

    ``reads_job_folders``: ``fn`` reads sub-folders that each hold a ``manifest.json``; only such
    discoverers see a folder of job folders (the others would take one job in it for the folder's).
    """
    _DISCOVERERS[:] = [(n, f) for n, f in _DISCOVERERS if n != name] + [(name, fn)]
    _OF_JOB_FOLDERS.discard(name)
    if reads_job_folders:
        _OF_JOB_FOLDERS.add(name)


def discover_manifest(trace_dir: Path) -> Manifest:
    """The manifest of a trace directory without ``manifest.json``, built by the first discoverer
    that recognises its files; a one-line :class:`DproError` when none does."""
    from ..errors import DproError

    trace_dir = Path(trace_dir)
    # a folder of job folders (a bench's output, a download of several jobs): the discoverers that look one
    # folder down for their files (ps-lite, NCCL) replayed one of those jobs as if it were the folder's
    # (`dpro replay examples/traces` printed the ps-lite job's 104.8 ms). The per-host folders of one
    # `dpro profile` job copied together are read by the discoverers registered with reads_job_folders.
    jobs = sorted(p.name for p in trace_dir.iterdir() if p.is_dir() and (p / "manifest.json").is_file())
    if jobs:
        for name, fn in _DISCOVERERS:
            man = fn(trace_dir) if name in _OF_JOB_FOLDERS else None
            if man is not None:
                return man
        shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
        raise DproError(f"no manifest.json in the directory itself, but its sub-folder(s) {shown} each hold a job",
                        path=trace_dir, hint=f"pass one job's folder, e.g. {trace_dir / jobs[0]}")
    for _name, fn in _DISCOVERERS:
        man = fn(trace_dir)
        if man is not None:
            return man
    empty = not any(trace_dir.iterdir())
    raise DproError("directory is empty" if empty else "no trace this dpro can read in the directory",
                    path=trace_dir,
                    hint="pass the folder written by `dpro profile` (one per job, or the per-host folders "
                         "copied together), or a folder of torch.profiler JSON traces (one per rank)")


from . import native, torch_kineto  # noqa: E402  (the built-in readers; neither imports a framework)

register_reader("dpro-events", native.read_node)
register_reader("torch-kineto", torch_kineto.read_node)
register_finisher("torch-kineto", torch_kineto.finish)

from . import horovod  # noqa: E402  (Horovod + PyTorch: Kineto + per-rank Horovod timelines)

register_reader(horovod.FORMAT, horovod.read_node)
register_finisher(horovod.FORMAT, horovod.finish)

# plain torch.profiler folders (one Kineto JSON per rank); registered last: dpro's own folders keep
# their richer readers (and kineto_plain skips any folder holding a dpro meta.json or manifest.json)
from . import dpro_torch_discover, kineto_plain  # noqa: E402

register_discoverer(dpro_torch_discover.FORMAT, dpro_torch_discover.discover,  # per-host dpro profile folders
                    reads_job_folders=True)

# ps-lite message timestamps (patches/ps-lite): a folder of pslite-*.json files; before kineto_plain,
# which would try any JSON file
from . import pslite as _pslite  # noqa: E402

register_reader(_pslite.FORMAT, _pslite.read_node)
register_discoverer(_pslite.FORMAT, _pslite.discover)

# NCCL profiler plugin files (collectors/nccl): a folder of nccl-*.jsonl; before kineto_plain too
from . import nccl as _nccl  # noqa: E402

register_reader(_nccl.FORMAT, _nccl.read_node)
register_discoverer(_nccl.FORMAT, _nccl.discover)
register_finisher(_nccl.FORMAT, _nccl.finish)

register_reader(kineto_plain.FORMAT, kineto_plain.read_node)

# TensorFlow collector folders (collectors/tf): reader + manifest-less discovery (multi-host)
from . import tf as _tf  # noqa: E402  (imports no TensorFlow)

register_reader(_tf.FORMAT, _tf.read_node)
register_discoverer("dpro_tf", _tf.discover)
# BytePS communication timelines (comm.json per GPU + dpro's byteps_meta.json; untested against real BytePS);
# before the plain-Kineto discoverer, which would take comm.json for a torch.profiler trace
from . import byteps as _byteps  # noqa: E402

register_reader(_byteps.FORMAT, _byteps.read_node)
register_discoverer("byteps", _byteps.discover)
register_discoverer(kineto_plain.FORMAT, kineto_plain.discover)

# MXNet parameter-server folders (collectors/mxnet); imports no MXNet
from . import mxnet as _mxnet  # noqa: E402

register_reader(_mxnet.FORMAT, _mxnet.read_node)


__all__ = ["available", "discover_manifest", "Discoverer", "Finisher", "get_finisher", "get_reader", "Reader",
           "register_discoverer", "register_finisher", "register_reader"]
