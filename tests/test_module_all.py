"""Every dpro_kit (and dpro_collect) module says what it exports: ``__all__`` exists and names things the module has.

(``python -m`` entry points, ``__main__.py``, run the CLI on import and are not modules to import.)
"""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import dpro_kit
import dpro_collect   # the collectors' shared package (dpro_kit puts collectors/common on sys.path)

MODULES = sorted(m.name for m in pkgutil.walk_packages(dpro_kit.__path__, "dpro_kit.")
                 if not m.name.endswith("__main__"))
COLLECT_MODULES = sorted(m.name for m in pkgutil.walk_packages(dpro_collect.__path__, "dpro_collect.")
                         if not m.name.startswith("dpro_collect.autoload"))   # a sitecustomize, not a module


def test_the_walk_finds_the_package():
    assert {"dpro_kit.session", "dpro_kit.cli", "dpro_kit.cli.replay", "dpro_kit.optimize.driver",
            "dpro_kit.graph.schemes", "dpro_kit.replay.rules"} <= set(MODULES)


@pytest.mark.parametrize("name", ["dpro_kit", *MODULES, "dpro_collect", *COLLECT_MODULES])
def test_module_defines_all_and_its_names_exist(name):
    mod = importlib.import_module(name)
    names = getattr(mod, "__all__", None)
    assert isinstance(names, (list, tuple)) and names, f"{name} defines no __all__"
    assert len(set(names)) == len(names), f"{name}.__all__ lists a name twice"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what the module does not have: {missing}"
