"""Discoverer for a ``dpro profile`` folder that has per-rank ``meta.json`` but no ``manifest.json``.

That is what a multi-host job leaves: each host runs its own ``dpro profile`` (one launcher
per machine), so no single process sees every rank's ``meta.json`` -- either the hosts wrote
into one shared folder, or each into its own folder that the user copied together. The
manifest is built in memory (nothing is written into the user's folder) by the one builder,
:func:`dpro_torch.manifest.manifest_from_dir`; ranks of an older run left in the folder are
named on stderr and ignored.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import DproError
from ..trace import Manifest

FORMAT = "dpro_torch"


def discover(trace_dir: Path) -> Manifest | None:
    """The manifest of the newest complete run under ``trace_dir``, or None without dpro_torch metas.

    Raises DproError (one line: which ranks of which run are missing, what to copy or run)
    when no run in the folder has all its ranks.
    """
    from dpro_torch.manifest import manifest_from_dir  # stdlib-only module of the collector

    doc, notes, err = manifest_from_dir(trace_dir)
    if doc is None and err is None:
        return None
    for n in notes:
        print(f"dpro: {trace_dir}: {n}", file=sys.stderr)
    if err:
        raise DproError(err, path=trace_dir)
    return Manifest.from_json(doc, path=str(Path(trace_dir) / "manifest.json (built from meta.json)"))


__all__ = ["FORMAT", "discover"]
