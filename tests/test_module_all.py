"""Every dpro_kit module says what it exports: ``__all__`` exists and names things the module has.

(``python -m`` entry points, ``__main__.py``, run the CLI on import and are not modules to import.)
"""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import dpro_kit

MODULES = sorted(m.name for m in pkgutil.walk_packages(dpro_kit.__path__, "dpro_kit.")
                 if not m.name.endswith("__main__"))


def test_the_walk_finds_the_package():
    assert {"dpro_kit.session", "dpro_kit.cli", "dpro_kit.cli.replay", "dpro_kit.optimize.driver",
            "dpro_kit.graph.schemes", "dpro_kit.replay.rules"} <= set(MODULES)


@pytest.mark.parametrize("name", ["dpro_kit", *MODULES])
def test_module_defines_all_and_its_names_exist(name):
    mod = importlib.import_module(name)
    names = getattr(mod, "__all__", None)
    assert isinstance(names, (list, tuple)) and names, f"{name} defines no __all__"
    assert len(set(names)) == len(names), f"{name}.__all__ lists a name twice"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what the module does not have: {missing}"
