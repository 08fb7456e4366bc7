"""The auto-load every collector shares (standard library only).

``dpro profile`` puts ``dpro_collect/autoload`` on the job's ``PYTHONPATH``
(:func:`dpro_collect.launch.profile_env`).  Python's ``site`` module imports its
``sitecustomize.py`` at start-up of every interpreter of the job (torchrun workers,
``multiprocessing`` children, every role of a parameter-server job), which calls
:func:`autoload`: without ``DPRO_OUT`` nothing happens; with it, ``<DPRO_COLLECTOR>.auto.install()``
runs (never the framework's import: a collector waits for the script's own with
:func:`when_imported`).  Any other ``sitecustomize`` further down ``sys.path`` still runs
afterwards (:func:`chain_next_sitecustomize`).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable

__all__ = ["autoload", "start", "chain_next_sitecustomize", "call_safely", "when_imported", "ImportHook"]


def autoload(sitecustomize: str) -> None:
    """What ``dpro_collect/autoload/sitecustomize.py`` does: :func:`start` the collector, then chain.

    Parameters
    ----------
    sitecustomize : str
        That file's ``__file__`` (its folder is left out when looking for the next one).
    """
    if os.environ.get("DPRO_OUT"):
        start(os.environ.get("DPRO_COLLECTOR", ""))
    chain_next_sitecustomize(os.path.dirname(os.path.abspath(sitecustomize)))


def start(package: str) -> None:
    """Run ``<package>.auto.install()``; a failure is one line on stderr, never an exception.

    Parameters
    ----------
    package : str
        The collector package (``DPRO_COLLECTOR``); empty: say so and record nothing.
    """
    if not package:
        print("[dpro] DPRO_OUT is set but DPRO_COLLECTOR is not (dpro_torch, dpro_tf or dpro_mxnet): nothing is "
              "recorded; use `dpro profile` or `python -m dpro_<fw>.launch`", file=sys.stderr, flush=True)
        return
    try:
        importlib.import_module(f"{package}.auto").install()
    except Exception as exc:  # never break start-up
        print(f"[{package}] auto-load failed: {exc!r}", file=sys.stderr, flush=True)


def chain_next_sitecustomize(folder: str) -> None:
    """Run the ``sitecustomize`` that the one in ``folder`` shadows, if any.

    Parameters
    ----------
    folder : str
        The auto-load folder, skipped in the search along ``sys.path``.
    """
    here = os.path.realpath(folder)
    rest = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        print(f"[dpro] the chained sitecustomize {spec.origin} failed: {exc!r}", file=sys.stderr)


def call_safely(fn: Callable[[], object], tag: str) -> None:
    """Call ``fn()``; an exception becomes one line on stderr (``[tag] profiling disabled: ...``).

    Parameters
    ----------
    fn : callable
        Usually the collector's ``enable``.
    tag : str
        The collector's name, printed first.
    """
    try:
        fn()
    except Exception as exc:  # never break the user's job
        print(f"[{tag}] profiling disabled: {exc!r}", file=sys.stderr, flush=True)


class ImportHook(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that calls ``then()`` right after module ``name`` finished importing.

    It removes itself on the first lookup of ``name`` and wraps that module's
    ``exec_module``; the import itself is the script's own and is not changed.

    Parameters
    ----------
    name : str
        Top-level module to wait for (``torch``, ``tensorflow``, ``mxnet``).
    then : callable
        Called once, after the module's code ran.
    """

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(self.name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig_exec, then = spec.loader.exec_module, self.then

        def exec_module(module):
            orig_exec(module)
            then()

        spec.loader.exec_module = exec_module
        return spec


def when_imported(module: str, fn: Callable[[], object], tag: str) -> ImportHook | None:
    """Call ``fn`` (through :func:`call_safely`) now if ``module`` is imported, else right after it is.

    Parameters
    ----------
    module : str
        The framework's top-level module.
    fn : callable
        What to run then (the collector's ``enable``).
    tag : str
        The collector's name for error lines.

    Returns
    -------
    ImportHook or None
        The hook put first on ``sys.meta_path``; None when ``fn`` ran already.
    """
    if module in sys.modules:
        call_safely(fn, tag)
        return None
    hook = ImportHook(module, lambda: call_safely(fn, tag))
    sys.meta_path.insert(0, hook)
    return hook
