"""dpro-kit: diagnose and speed up distributed deep-learning training.

Pipeline: traces (:mod:`dpro_kit.trace`) -> global DFG (:mod:`dpro_kit.graph`)
-> replay and critical path (:mod:`dpro_kit.replay`) -> analyses and CLI.
"""
__version__ = "0.1.0"

__all__ = ["__version__"]
