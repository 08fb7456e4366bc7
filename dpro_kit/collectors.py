"""Which collector ``dpro profile --framework NAME`` switches on (one place; standard library only).

Each collector lives under ``collectors/<fw>/`` and is enabled through the environment
(an ``autoload/sitecustomize.py`` on ``PYTHONPATH``). An entry here says how to build that
environment and how to write the job's ``manifest.json`` once the command ended.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["FRAMEWORKS", "import_collector"]

#: framework name -> (collector package, folder under collectors/)
FRAMEWORKS = {"torch": ("dpro_torch", "torch"), "tensorflow": ("dpro_tf", "tf"), "mxnet": ("dpro_mxnet", "mxnet")}


def import_collector(framework: str, module: str):
    """Import ``<collector package>.<module>`` of ``framework`` (from the installed distribution,
    else from ``collectors/<fw>/`` of this checkout).

    Parameters
    ----------
    framework : str
        A key of :data:`FRAMEWORKS`.
    module : str
        ``launch`` (``profile_env``) or ``manifest`` (``find_metas``, ``try_write_manifest``).
    """
    pkg, folder = FRAMEWORKS[framework]
    try:
        return importlib.import_module(f"{pkg}.{module}")
    except ImportError:
        here = Path(__file__).resolve().parents[1] / "collectors" / folder
        if not here.is_dir():
            raise
        sys.path.append(str(here))
        return importlib.import_module(f"{pkg}.{module}")
