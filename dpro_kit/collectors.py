"""Which collector ``dpro profile --framework NAME`` switches on (one place; standard library only).

Each collector lives under ``collectors/<fw>/`` and is enabled through the environment
(``dpro_collect/autoload/sitecustomize.py`` on ``PYTHONPATH``, ``DPRO_COLLECTOR=<package>``:
:func:`dpro_collect.launch.profile_env`). Collectors import only the standard library, their
framework and ``dpro_collect`` (``collectors/common``), never dpro_kit. An entry here says
which package builds that environment and writes the job's ``manifest.json`` once the command ended.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["FRAMEWORKS", "import_collector"]

#: framework name -> (collector package, folder under collectors/)
FRAMEWORKS = {"torch": ("dpro_torch", "torch"), "tensorflow": ("dpro_tf", "tf"), "mxnet": ("dpro_mxnet", "mxnet")}


def import_collector(framework: str, module: str):
    """Import ``<collector package>.<module>`` of ``framework``: from ``collectors/<fw>/`` when dpro_kit
    runs from a checkout (that checkout's copy, as for ``collectors/common``: ``dpro_kit/__init__.py``),
    else from the installed distribution.

    Parameters
    ----------
    framework : str
        A key of :data:`FRAMEWORKS`.
    module : str
        ``launch`` (``profile_env``) or ``manifest`` (``find_metas``, ``try_write_manifest``).
    """
    pkg, folder = FRAMEWORKS[framework]
    here = Path(__file__).resolve().parents[1] / "collectors" / folder
    if (here / pkg).is_dir() and str(here) not in sys.path:
        sys.path.append(str(here))
    return importlib.import_module(f"{pkg}.{module}")
