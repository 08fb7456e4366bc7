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

How it gets loaded: ``dpro_torch/autoload/`` holds a ``sitecustomize.py``.  With
that folder on ``PYTHONPATH``, every Python process of the job (torchrun's
workers, ``torch.multiprocessing`` children) runs it at start-up.  It does not
import torch; it adds a ``sys.meta_path`` hook that waits for the script's own
``import torch`` and then calls :func:`enable`, which patches
``DistributedDataParallel.__init__`` and ``torch.autograd.backward`` and creates
a :class:`~dpro_torch.recorder.Recorder` that counts optimizer steps.  Processes
that never step an optimizer (the launcher) write nothing.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

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
    from .recorder import Recorder, parse_steps
    steps = parse_steps(os.environ.get("DPRO_STEPS", "10:15"))
    return Recorder(out, steps=steps, host=os.environ.get("DPRO_HOST") or None, auto_step=True, _from_env=True)


def _enable_safely() -> None:
    try:
        enable()
    except Exception as exc:  # never break the user's job
        print(f"[dpro_torch] profiling disabled: {exc!r}", file=sys.stderr, flush=True)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`enable` right after ``torch`` finished importing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _enable_safely()

        loader.exec_module = exec_module
        return spec


def install_import_hook() -> None:
    """Enable now if torch is imported already, else as soon as it is."""
    if not os.environ.get("DPRO_OUT"):
        return
    if "torch" in sys.modules:
        _enable_safely()
        return
    if _STATE["hook"] is None:
        _STATE["hook"] = _TorchImportHook()
        sys.meta_path.insert(0, _STATE["hook"])
