"""Run a command with dpro_torch auto-enabled::

    python -m dpro_torch.launch --out DIR [--steps 10:15] [--host NAME] -- python train.py ...

Sets ``DPRO_OUT``/``DPRO_STEPS``/``DPRO_HOST``/``DPRO_RUN_ID``/``DPRO_COLLECTOR`` and prepends
the auto-load folder, ``collectors/common`` and ``collectors/torch`` to ``PYTHONPATH``
(:func:`dpro_collect.launch.profile_env`; this is what ``dpro profile`` does), then runs the
command and returns its exit code.  The command may be ``torchrun ...`` or a script that
spawns its own ranks.
"""
from __future__ import annotations

import sys

from dpro_collect import launch as _launch

__all__ = ["profile_env", "main"]


def profile_env(out: str, steps: str = "10:15", host: str | None = None,
                base: dict[str, str] | None = None, memory: bool = False, ring: bool = False,
                shapes: bool = False) -> dict[str, str]:
    """The environment that profiles a PyTorch job launched with it.

    Parameters
    ----------
    out : str
        Trace directory.
    steps : str
        ``START:END`` iterations to profile (0-based, counted by ``optimizer.step()``).
    host : str, optional
        Host name for the folder layout.
    base : dict, optional
        Environment to start from (default: this process's).
    memory, ring, shapes : bool
        ``DPRO_MEMORY``, ``DPRO_RING``, ``DPRO_SHAPES`` (``dpro profile --memory/--ring/--shapes``).
    """
    flags = {name: "1" for name, on in (("DPRO_MEMORY", memory), ("DPRO_RING", ring), ("DPRO_SHAPES", shapes)) if on}
    return _launch.profile_env("dpro_torch", out, steps, host, base, flags=flags)


def main(argv: list[str] | None = None) -> int:
    """``python -m dpro_torch.launch``: see the module docstring."""
    return _launch.main(profile_env, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
