"""Profile an unmodified TensorFlow script, driven by environment variables.

=================  ==========================================================
``DPRO_OUT``       trace directory (required; nothing happens without it)
``DPRO_STEPS``     ``START:END`` steps to profile, 0-based, END exclusive
                   (default ``10:15``)
``DPRO_HOST``      host name used in the directory layout (default: hostname)
``DPRO_JOB``       job name for the manifest (default: the script's name)
``DPRO_RUN_ID``    groups the tasks of one run
``DPRO_QUIET=1``   no log lines on stderr
=================  ==========================================================

How it gets loaded: ``dpro_tf/autoload/sitecustomize.py`` runs in every Python process
started with that folder on ``PYTHONPATH``. It adds a ``sys.meta_path`` hook that waits
for the script's own ``import tensorflow`` and then calls :func:`enable`, which wraps
``tf.function`` calls (``polymorphic_function.Function.__call__``).

What a *step* is: one top-level (eager) call of the ``tf.function`` that updates variables
(its traced graph holds a variable-writing op: ``AssignSubVariableOp``,
``ResourceApply*`` ...). Keras ``fit`` calls its ``train_function`` once per step
(``steps_per_execution=1``), a custom loop calls its own ``@tf.function`` step: both are
counted without code change. Functions that write no variable (evaluation, metrics) are
not steps.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_STATE = {"enabled": False, "hook": None, "recorder": None}


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)`` with ``1 <= A < B``; ValueError with the reason otherwise."""
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ValueError(f"expected START:END, got {text!r}") from None
    if not 1 <= a < b:
        raise ValueError(f"need 1 <= START < END, got {a}:{b}")
    return a, b


def enable():
    """Start recording as the environment says (idempotent); returns the Recorder or None."""
    if _STATE["enabled"]:
        return _STATE["recorder"]
    out = os.environ.get("DPRO_OUT")
    if not out:
        return None
    _STATE["enabled"] = True
    from .recorder import Recorder
    rec = Recorder(out, steps=parse_steps(os.environ.get("DPRO_STEPS", "10:15")),
                   host=os.environ.get("DPRO_HOST") or None)
    rec.install()
    _STATE["recorder"] = rec
    return rec


def _enable_safely() -> None:
    try:
        enable()
    except Exception as exc:  # never break the user's job
        print(f"[dpro_tf] profiling disabled: {exc!r}", file=sys.stderr, flush=True)


class _TFImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`enable` right after ``tensorflow`` finished importing."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec("tensorflow")
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
    """Enable now if tensorflow is imported already, else as soon as it is."""
    if not os.environ.get("DPRO_OUT"):
        return
    if "tensorflow" in sys.modules:
        _enable_safely()
        return
    if _STATE["hook"] is None:
        _STATE["hook"] = _TFImportHook()
        sys.meta_path.insert(0, _STATE["hook"])
