"""``dpro profile``: run a training command with a collector switched on through the environment.

The job is not changed: the collector (``collectors/torch``: dpro_torch, ``collectors/tf``:
dpro_tf, ``collectors/mxnet``: dpro_mxnet; with their shared ``collectors/common``: dpro_collect)
is imported by every Python process the command starts, records the profiled
steps into ``--out`` and writes the manifest when all ranks are in.  On a multi-host job
every host runs its own ``dpro profile`` (each a launcher like a user's); the ranks agree
on one run id through the job's c10d store.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..collectors import FRAMEWORKS
from ..errors import DproError

EPILOG = """\b
Examples:
  dpro profile --out trace -- torchrun --nproc_per_node 2 train.py
  dpro profile --steps 20:25 --host node3 -- python train.py --epochs 1
  dpro profile --ring --memory --out trace -- torchrun --nproc_per_node 2 train.py
  dpro profile --framework tensorflow --out tf-trace -- python train_tf.py
  dpro profile --framework mxnet --host h1 -- MXNET_PY examples/mxnet/train.py   (one per PS host, docs/ps.md)
  dpro cluster --hosts 2 --rate-mbit 200 --profile trace -- python train.py   (emulated hosts)
"""


@click.command(short_help="Run a training command with the profiler enabled (no code change).",
               epilog=EPILOG, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "-o", default="dpro-trace", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Trace directory to write (one folder per rank under <host>/<rank>/, plus manifest.json).")
@click.option("--steps", default="10:15", show_default=True,
              help="Profile iterations A..B-1 (counted at optimizer.step()); A >= 2 skips DDP's bucket rebuild.")
@click.option("--host", default=None, help="Host name recorded for the ranks (default: $DPRO_HOST or hostname).")
@click.option("--memory", is_flag=True,
              help="Also record allocator events (memory over the iteration, peak); adds profiling overhead.")
@click.option("--ring", is_flag=True,
              help="gloo: run DDP's bucket AllReduce as a timed ring (a comm hook) to record per-chunk SEND/RECV "
                   "times (what `dpro align` needs for microsecond clock alignment across hosts).")
@click.option("--shapes", is_flag=True,
              help="Record op input shapes in one extra iteration after the window (kineto_shapes.json); "
                   "`dpro optimize` rebuilds op-fusion candidates from them and times them with torch.compile.")
@click.option("--framework", type=click.Choice(list(FRAMEWORKS)), default="torch", show_default=True,
              help="Which collector to enable (dpro_kit/collectors.py; tensorflow: collectors/tf, tf.profiler on "
                   "every task; mxnet: collectors/mxnet, mx.profiler on every worker of a PS job, docs/ps.md).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary after the job ends.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile(out: Path, steps: str, host: str | None, memory: bool, ring: bool, shapes: bool, framework: str,
            as_json: bool, command: tuple[str, ...]) -> None:
    """Profile COMMAND (e.g. `python train.py`, `torchrun ...`) without changing it.

    The collector is switched on through the environment: every Python process
    the command starts imports it, marks iterations at optimizer.step() and
    profiles steps A..B-1 after warm-up. The job's output and exit code pass
    through unchanged; if it crashes or is killed, what was collected stays
    readable. Then run `dpro replay OUT`.
    """
    import signal
    import subprocess

    if framework != "torch":   # the other collectors: launch.profile_env + manifest (dpro_kit/collectors.py)
        return _profile_collector(framework, out, steps, host, as_json, command)
    from ..collectors import import_collector

    launch, manifest = import_collector("torch", "launch"), import_collector("torch", "manifest")
    try:
        env = launch.profile_env(str(out), steps, host or os.environ.get("DPRO_HOST"), memory=memory, ring=ring,
                                 shapes=shapes)
    except ValueError as exc:
        raise DproError(f"--steps {steps!r}: {exc}", hint="profile steps START..END-1: --steps START:END") from None
    cmd = list(command[1:] if command[:1] == ("--",) else command)
    if not cmd:
        raise DproError("no command given", hint="put the training command after --")
    if (out / "manifest.json").exists():
        raise DproError("refusing to overwrite an existing trace directory", path=out,
                        hint="choose a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    import time
    t_launch = time.time() - 1.0  # meta.json newer than this are this launch's (1 s: mtime granularity)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise DproError(f"cannot start {cmd[0]!r}: {exc.strerror}", hint="check the command after --") from None
    forwarded = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        forwarded[sig] = signal.signal(sig, lambda s, _f: proc.send_signal(s))
    try:
        code = proc.wait()
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)
    find_metas, try_write_manifest = manifest.find_metas, manifest.try_write_manifest
    # this launcher's ranks: the meta.json written since it started (their run id is the job's,
    # agreed through the job's c10d store, so it can differ from this launcher's DPRO_RUN_ID)
    mine = [d for p, d in find_metas(out) if p.stat().st_mtime >= t_launch
            and (not env.get("DPRO_HOST") or d.get("host") == env["DPRO_HOST"])]
    run_ids = {d.get("run_id") for d in mine}
    run_id = run_ids.pop() if len(run_ids) == 1 else env.get("DPRO_RUN_ID")
    have_manifest = (out / "manifest.json").exists() or try_write_manifest(out, run_id=run_id)
    ranks, world = len(mine), max([int(d.get("world_size") or 1) for d in mine] or [0])
    here = len({int(d["rank"]) for p, d in find_metas(out) if d.get("run_id") == run_id})
    summary = {"out": str(out), "exit_code": code, "ranks_written": ranks, "manifest": have_manifest,
               "run_id": run_id, "world_size": world, "ranks_of_run_here": here}
    if as_json:
        click.echo(json.dumps(summary))
    elif have_manifest or not ranks:
        click.echo(f"dpro: {ranks} rank trace(s) in {out}" + (f"; next: dpro replay {out}" if have_manifest else ""),
                   err=True)
    else:  # a multi-host job: the other hosts' launchers write the other ranks
        click.echo(f"dpro: {ranks} rank trace(s) of run {run_id} in {out}; {here} of its {world} ranks are here. "
                   f"The other hosts' `dpro profile` write the rest: with a shared folder, `dpro replay {out}` "
                   f"once all hosts finished; else copy every host's folder into one (cp -r HOST_DIR/* {out}/ "
                   f"or dpro merge) and replay that", err=True)
    sys.exit(code if code >= 0 else 128 - code)


def _profile_collector(framework: str, out: Path, steps: str, host: str | None, as_json: bool,
                       command: tuple[str, ...]) -> None:
    """`dpro profile --framework NAME` (not torch): run the command with that collector enabled.

    The collector package (:data:`dpro_kit.collectors.FRAMEWORKS`) provides
    ``launch.profile_env(out, steps, host)`` and ``manifest.find_metas`` / ``try_write_manifest``.
    """
    import subprocess

    from ..collectors import import_collector

    launch, manifest = import_collector(framework, "launch"), import_collector(framework, "manifest")
    cmd = list(command[1:] if command[:1] == ("--",) else command)
    if not cmd:
        raise DproError("no command given", hint="put the training command after --")
    if (out / "manifest.json").exists():
        raise DproError("refusing to overwrite an existing trace directory", path=out, hint="choose a new --out folder")
    try:
        env = launch.profile_env(str(out), steps, host or os.environ.get("DPRO_HOST"))
    except ValueError as exc:
        raise DproError(f"--steps {steps!r}: {exc}", hint="profile steps START..END-1: --steps START:END") from None
    out.mkdir(parents=True, exist_ok=True)
    import time
    t_launch = time.time() - 1.0   # meta.json newer than this are this launch's (1 s: mtime granularity)
    try:
        code = subprocess.call(cmd, env=env)
    except OSError as exc:
        raise DproError(f"cannot start {cmd[0]!r}: {exc.strerror}", hint="check the command after --") from None
    # this launcher's tasks (a multi-task job's run id comes from its TF_CONFIG cluster, not DPRO_RUN_ID)
    mine = [d for p, d in manifest.find_metas(out) if p.stat().st_mtime >= t_launch]
    run_id = mine[0].get("run_id") if mine else env["DPRO_RUN_ID"]
    have = (out / "manifest.json").exists() or manifest.try_write_manifest(out, run_id=run_id)
    summary = {"out": str(out), "exit_code": code, "tasks_written": len(mine), "manifest": have, "run_id": run_id}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"dpro: {len(mine)} task trace(s) in {out}" + (
            f"; next: dpro replay {out}" if have else
            "; the job's other tasks write the rest (one dpro profile per host): replay once all finished"), err=True)
    sys.exit(code if code >= 0 else 128 - code)


__all__ = ["profile"]
