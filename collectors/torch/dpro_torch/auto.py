"""Profile an unmodified training script, driven by environment variables.

=================  ==========================================================
``DPRO_OUT``       trace directory (required; nothing happens without it)
``DPRO_STEPS``     ``START:END`` iterations to profile, 0-based, END exclusive
                   (default ``10:15``); iterations are counted by
                   ``optimizer.step()`` calls
``DPRO_HOST``      host name used in the directory layout (default: hostname)
``DPRO_JOB``       job name for the manifest (default: the script's name)
``DPRO_RUN_ID``    groups the ranks of one run (default: torchrun's run id or
                   MASTER_ADDR:MASTER_PORT)
``DPRO_QUIET=1``   no log lines on stderr
=================  ==========================================================

How it gets loaded: ``dpro profile`` puts ``dpro_collect/autoload/`` (a
``sitecustomize.py``) on ``PYTHONPATH`` with ``DPRO_COLLECTOR=dpro_torch``, so every
Python process of the job (torchrun's workers, ``torch.multiprocessing`` children)
calls :func:`install` at start-up (:mod:`dpro_collect.auto`).  It does not
import torch; it adds a ``sys.meta_path`` hook that waits for the script's own
``import torch`` and then calls :func:`enable`, which patches
``DistributedDataParallel.__init__`` and ``torch.autograd.backward`` and creates
a :class:`~dpro_torch.recorder.Recorder` that counts optimizer steps.  Processes
that never step an optimizer (the launcher) write nothing.
"""
from __future__ import annotations

import os

from dpro_collect.auto import when_imported
from dpro_collect.launch import parse_steps

__all__ = ["enable", "install"]

_STATE = {"enabled": False, "hook": None}


def enable():
    """Start recording as the environment says (idempotent); returns the Recorder or None."""
    if _STATE["enabled"]:
        from .recorder import active_recorder
        return active_recorder()
    out = os.environ.get("DPRO_OUT")
    if not out:
        return None
    _STATE["enabled"] = True
    from .recorder import Recorder
    steps = parse_steps(os.environ.get("DPRO_STEPS", "10:15"))
    return Recorder(out, steps=steps, host=os.environ.get("DPRO_HOST") or None, auto_step=True, _from_env=True)


def install() -> None:
    """Enable now if torch is imported already, else as soon as it is (what the auto-load calls)."""
    if os.environ.get("DPRO_OUT") and _STATE["hook"] is None:
        _STATE["hook"] = when_imported("torch", enable, "dpro_torch")
