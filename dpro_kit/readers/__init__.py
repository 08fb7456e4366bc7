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
from ..trace import Manifest, NodeTrace

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


def available() -> list[str]:
    return sorted(_READERS)


from . import native, torch_kineto  # noqa: E402  (the built-in readers; neither imports a framework)

register_reader("dpro-events", native.read_node)
register_reader("torch-kineto", torch_kineto.read_node)
