"""dpro optimize: critical-path strategy search (dPRO §5). See docs/optimizer.md.

The names below are imported from their modules on first use (PEP 562), so that
importing one module of the package (the CLI imports :mod:`~dpro_kit.optimize.driver`
for its option choices) does not load the search, networkx and numpy.
"""
from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the module of this package that defines it
_EXPORTS = {
    "OptimizeOptions": "driver", "Optimized": "driver", "optimize": "driver",
    "PASSES": "passes", "Change": "passes", "GraphPass": "passes", "PassRefused": "passes", "load_pass": "passes",
    "register_pass": "passes",
    "SearchOptions": "search", "SearchResult": "search", "Searcher": "search",
    "BaseJob": "state", "Strategy": "state", "build": "state", "extract_base": "state", "initial_strategy": "state",
    "HorovodKnobs": "horovod", "BytePSPartition": "byteps",
    "theorem1_fuse_ops": "theory", "theorem2_fuse_tensors": "theory", "theorem3_joint": "theory",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
