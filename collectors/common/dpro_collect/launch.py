"""How a collector is switched on: the environment of the profiled job (standard library only).

Every collector's ``launch.py`` (``python -m dpro_<fw>.launch --out DIR -- CMD``, and
``dpro profile``, which calls its ``profile_env``) builds the job's environment here:

=================  ====================================================================
``DPRO_OUT``       the trace directory (absolute)
``DPRO_STEPS``     ``START:END``: the steps to profile (:func:`parse_steps`)
``DPRO_COLLECTOR`` the collector package the auto-load starts (``dpro_torch``, ``dpro_tf``, ``dpro_mxnet``)
``DPRO_RUN_ID``    a fresh id per launcher unless already set (groups one run's nodes)
``DPRO_HOST``      ``--host``, when given
``PYTHONPATH``     first ``collectors/common/dpro_collect/autoload`` (its ``sitecustomize.py``),
                   ``collectors/common`` and ``collectors/<fw>``: the job imports the collector
                   from there, in its own environment, where dpro-kit need not be installed
                   (installed dpro-kit: a folder of links to the two packages, never
                   dpro-kit's site-packages; :func:`collector_path`)
=================  ====================================================================
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Callable

__all__ = ["AUTOLOAD", "parse_steps", "collector_path", "profile_env", "main"]

#: the folder whose ``sitecustomize.py`` every Python process of the profiled job runs
AUTOLOAD = Path(__file__).resolve().parent / "autoload"


def parse_steps(text: str, first: int = 0) -> tuple[int, int]:
    """``"10:15"`` -> ``(10, 15)``: profile steps 10..14 (0-based, END exclusive).

    Parameters
    ----------
    text : str
        ``START:END``.
    first : int
        The smallest START the collector can profile (dpro_tf and dpro_mxnet start the window
        after step START-1 returned, so they need 1).

    Raises
    ------
    ValueError
        Not two integers, or not ``first <= START < END``; the message says which.
    """
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ValueError(f"expected START:END, e.g. 10:15; got {text!r}") from None
    if not first <= a < b:
        raise ValueError(f"need {first} <= START < END, got {a}:{b}")
    return a, b


def collector_path(package: str) -> list[str]:
    """The ``PYTHONPATH`` entries that let a job import ``package`` and its auto-load.

    Parameters
    ----------
    package : str
        The collector package (``dpro_torch``, ``dpro_tf``, ``dpro_mxnet``).

    Returns
    -------
    list of str
        :data:`AUTOLOAD`, the folder holding ``dpro_collect`` (``collectors/common``) and the folder
        holding ``package`` (``collectors/<fw>``), without repeats.
    """
    here = Path(__file__).resolve().parent
    pkg = Path(importlib.import_module(package).__file__).resolve().parent
    if here.parent.parent.name == "collectors" and pkg.parent.parent.name == "collectors":
        parts = [str(AUTOLOAD), str(here.parent), str(pkg.parent)]       # a checkout: collectors/<x>
    else:
        # installed: both packages sit in dpro-kit's own site-packages, which must not reach the
        # job's PYTHONPATH (its numpy, torch ... would shadow the job's environment's, e.g. the
        # numpy<1.24 MXNet needs); the job gets a folder holding links to the two packages only
        parts = [str(AUTOLOAD), str(_isolated_folder([here, pkg]))]
    return list(dict.fromkeys(parts))


def _isolated_folder(packages: list[Path]) -> Path:
    """A folder holding only symbolic links to ``packages`` (made once, atomically, then reused).

    Under ``$DPRO_CACHE/pythonpath/`` (default ``~/.cache/dpro-kit``), named by a hash of the
    packages' paths, so every launcher of one installation shares it.
    """
    cache = Path(os.environ.get("DPRO_CACHE") or Path.home() / ".cache" / "dpro-kit") / "pythonpath"
    dest = cache / hashlib.sha256("\n".join(map(str, packages)).encode()).hexdigest()[:12]

    def complete() -> bool:
        return all((dest / p.name).resolve() == p for p in packages)

    if complete():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp."))
    tmp.chmod(0o755)                   # mkdtemp makes it 0700; a job may run as another user
    for p in packages:
        (tmp / p.name).symlink_to(p, target_is_directory=True)
    try:
        os.rename(tmp, dest)
    except OSError:                    # another launcher made it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not complete():
            raise
    return dest


def profile_env(package: str, out: str, steps: str = "10:15", host: str | None = None,
                base: dict[str, str] | None = None, *, first: int = 0,
                flags: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that profiles a job with ``package`` (see the module's table).

    Parameters
    ----------
    package : str
        The collector package, imported by every Python process of the job.
    out : str
        Trace directory.
    steps : str
        ``START:END`` steps to profile (checked with :func:`parse_steps`).
    host : str, optional
        Host name for the folder layout (``DPRO_HOST``).
    base : dict, optional
        Environment to start from (default: this process's).
    first : int
        The smallest START the collector accepts (:func:`parse_steps`).
    flags : dict, optional
        The collector's own variables (``DPRO_MEMORY``, ``DPRO_RING`` ...).

    Raises
    ------
    ValueError
        ``steps`` is not ``START:END`` with ``first <= START < END``.
    """
    parse_steps(steps, first)
    env = dict(os.environ if base is None else base)
    env["DPRO_OUT"] = str(Path(out).resolve())
    env["DPRO_STEPS"] = steps
    env["DPRO_COLLECTOR"] = package
    env.setdefault("DPRO_RUN_ID", uuid.uuid4().hex[:12])   # groups this run's nodes for the manifest
    if host:
        env["DPRO_HOST"] = host
    env.update(flags or {})
    env["PYTHONPATH"] = os.pathsep.join(collector_path(package) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def main(make_env: Callable[..., dict[str, str]], doc: str, argv: list[str] | None = None) -> int:
    """``python -m dpro_<fw>.launch --out DIR [--steps A:B] [--host NAME] -- CMD ...``: run CMD profiled.

    Parameters
    ----------
    make_env : callable
        The collector's ``profile_env(out, steps, host)``.
    doc : str or None
        The launcher's docstring (its first paragraph is the ``--help`` description).
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The command's exit code.
    """
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", default="10:15")
    ap.add_argument("--host", default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command to run after --")
    try:
        env = make_env(args.out, args.steps, args.host)
    except ValueError as exc:
        ap.error(f"--steps {args.steps!r}: {exc}")
    return subprocess.call(cmd, env=env)
