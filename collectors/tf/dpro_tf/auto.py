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

How it gets loaded: ``dpro profile --framework tensorflow`` puts ``dpro_collect/autoload``
(a ``sitecustomize.py``) on ``PYTHONPATH`` with ``DPRO_COLLECTOR=dpro_tf``; every Python process
then calls :func:`install` (:mod:`dpro_collect.auto`), which adds a ``sys.meta_path`` hook
that waits for the script's own ``import tensorflow`` and then calls :func:`enable`, which wraps
``tf.function`` calls (``polymorphic_function.Function.__call__``).

What a *step* is: one top-level (eager) call of the ``tf.function`` that updates variables
(its traced graph holds a variable-writing op: ``AssignSubVariableOp``,
``ResourceApply*`` ...). Keras ``fit`` calls its ``train_function`` once per step
(``steps_per_execution=1``), a custom loop calls its own ``@tf.function`` step: both are
counted without code change. Functions that write no variable (evaluation, metrics) are
not steps.
"""
from __future__ import annotations

import os

from dpro_collect.auto import when_imported
from dpro_collect.launch import parse_steps

__all__ = ["enable", "install"]

_STATE = {"enabled": False, "hook": None, "recorder": None}


def enable():
    """Start recording as the environment says (idempotent); returns the Recorder or None."""
    if _STATE["enabled"]:
        return _STATE["recorder"]
    out = os.environ.get("DPRO_OUT")
    if not out:
        return None
    _STATE["enabled"] = True
    from .recorder import Recorder
    rec = Recorder(out, steps=parse_steps(os.environ.get("DPRO_STEPS", "10:15"), first=1),
                   host=os.environ.get("DPRO_HOST") or None)
    rec.install()
    _STATE["recorder"] = rec
    return rec


def install() -> None:
    """Enable now if tensorflow is imported already, else as soon as it is (what the auto-load calls)."""
    if os.environ.get("DPRO_OUT") and _STATE["hook"] is None:
        _STATE["hook"] = when_imported("tensorflow", enable, "dpro_tf")
