"""Run a command with dpro_mxnet auto-enabled::

    python -m dpro_mxnet.launch --out DIR [--steps 10:15] [--host NAME] -- python train.py ...

Sets ``DPRO_OUT``/``DPRO_STEPS``/``DPRO_HOST``/``DPRO_RUN_ID``/``DPRO_COLLECTOR`` and prepends
the auto-load folder, ``collectors/common`` and ``collectors/mxnet`` to ``PYTHONPATH``
(:func:`dpro_collect.launch.profile_env`; what ``dpro profile --framework mxnet`` does).
Nothing else in the job's environment changes (a hybridized block stays bulked: docs/ps.md).
"""
from __future__ import annotations

import sys

from dpro_collect import launch as _launch

__all__ = ["profile_env", "main"]


def profile_env(out: str, steps: str = "10:15", host: str | None = None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that profiles an MXNet job (every role) launched with it.

    Parameters
    ----------
    out : str
        Trace directory.
    steps : str
        ``START:END`` Trainer steps to profile (START >= 1: the window opens after step START-1).
    host : str, optional
        Host name for the folder layout.
    base : dict, optional
        Environment to start from (default: this process's).
    """
    return _launch.profile_env("dpro_mxnet", out, steps, host, base, first=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m dpro_mxnet.launch``: see the module docstring."""
    return _launch.main(profile_env, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
