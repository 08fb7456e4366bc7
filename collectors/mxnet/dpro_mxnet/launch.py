"""Run a command with dpro_mxnet auto-enabled::

    python -m dpro_mxnet.launch --out DIR [--steps 10:15] [--host NAME] -- python train.py ...

Sets ``DPRO_OUT``/``DPRO_STEPS``/``DPRO_HOST``/``DPRO_RUN_ID`` and prepends
``dpro_mxnet/autoload`` to ``PYTHONPATH`` (what ``dpro profile --framework mxnet`` does).
Nothing else in the job's environment changes (a hybridized block stays bulked: docs/ps.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path

AUTOLOAD = Path(__file__).resolve().parent / "autoload"
__all__ = ["profile_env", "main"]


def profile_env(out: str, steps: str = "10:15", host: str | None = None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that profiles an MXNet job (every role) launched with it.

    Parameters
    ----------
    out : str
        Trace directory.
    steps : str
        ``START:END`` Trainer steps to profile.
    host : str, optional
        Host name for the folder layout.
    base : dict, optional
        Environment to start from (default: this process's).
    """
    from .auto import parse_steps
    parse_steps(steps)
    env = dict(os.environ if base is None else base)
    env["DPRO_OUT"] = str(Path(out).resolve())
    env["DPRO_STEPS"] = steps
    env.setdefault("DPRO_RUN_ID", uuid.uuid4().hex[:12])
    if host:
        env["DPRO_HOST"] = host
    parts = [str(AUTOLOAD), str(AUTOLOAD.parent.parent)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", default="10:15")
    ap.add_argument("--host", default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command to run after --")
    return subprocess.call(cmd, env=profile_env(args.out, args.steps, args.host))


if __name__ == "__main__":
    sys.exit(main())
