"""dpro-kit: diagnose and speed up distributed deep-learning training.

Pipeline: traces (:mod:`dpro_kit.trace`) -> global DFG (:mod:`dpro_kit.graph`)
-> replay and critical path (:mod:`dpro_kit.replay`) -> analyses and CLI.

dpro_kit uses the collectors' shared package :mod:`dpro_collect` (``collectors/common``: the
trace format names, :class:`DproError`, the plan format; ``dpro_kit.errors`` and
``dpro_kit.schema`` re-export it).  It ships in the same distribution; run from a checkout,
the checkout's ``collectors/common`` is put on ``sys.path`` here, so dpro_kit and the
collectors always use the same copy.
"""
import os as _os
import sys as _sys

__version__ = "0.1.0"

__all__ = ["__version__"]

_COMMON = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "collectors", "common")
if _os.path.isdir(_os.path.join(_COMMON, "dpro_collect")) and _COMMON not in _sys.path:
    _sys.path.append(_COMMON)
