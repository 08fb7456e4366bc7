"""Run a command with dpro_tf auto-enabled::

    python -m dpro_tf.launch --out DIR [--steps 10:15] [--host NAME] -- python train.py ...

Sets ``DPRO_OUT``/``DPRO_STEPS``/``DPRO_HOST``/``DPRO_RUN_ID``/``DPRO_COLLECTOR`` and prepends
the auto-load folder, ``collectors/common`` and ``collectors/tf`` to ``PYTHONPATH``
(:func:`dpro_collect.launch.profile_env`; what ``dpro profile --framework tensorflow`` does).
"""
from __future__ import annotations

import sys

from dpro_collect import launch as _launch

__all__ = ["profile_env", "main"]


def profile_env(out: str, steps: str = "10:15", host: str | None = None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that profiles a TensorFlow job launched with it.

    Parameters
    ----------
    out : str
        Trace directory.
    steps : str
        ``START:END`` steps to profile (START >= 1: step 0 traces the function).
    host : str, optional
        Host name for the folder layout.
    base : dict, optional
        Environment to start from (default: this process's).
    """
    return _launch.profile_env("dpro_tf", out, steps, host, base, first=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m dpro_tf.launch``: see the module docstring."""
    return _launch.main(profile_env, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
