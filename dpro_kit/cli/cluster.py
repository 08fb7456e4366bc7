"""``dpro cluster``: run a command once per emulated host (network namespace) on a shaped link.

A thin command over :func:`dpro_kit.jobs.run_job` (the harness the benches and tests use)
and :class:`dpro_kit.cluster.EmulatedCluster` (namespaces, veth, tbf); needs root and
iproute2 (``ip``, ``tc``).  The emulated cluster lives in those two modules only.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from ..cluster import DEFAULT_PREFIX

EPILOG = """\b
Examples:
  # 2 hosts, 200 Mbit/s per host link (both directions), one rank per host
  sudo dpro cluster --hosts 2 --rate-mbit 200 -- python train.py --backend gloo
  # the same, each host profiled by its own `dpro profile`, 1 CPU per host (cgroup quota)
  sudo dpro cluster --hosts 2 --rate-mbit 200 --cpus-per-host 1 --profile trace -- \\
      python examples/ddp/train.py --backend gloo
  # a second link per host (eth1, 300 Mbit/s): DeFT's deferred buckets on it (docs/deft.md)
  sudo dpro cluster --hosts 2 --rate-mbit 1000 --second-rate-mbit 300 -- \\
      python examples/ddp/train.py --backend gloo --deft-defer all --deft-link1 all
  # ... or the DeFT section of a `dpro optimize T --deft --links 1000,300` plan
  sudo dpro cluster --hosts 2 --rate-mbit 1000 --second-rate-mbit 300 -- \\
      python examples/ddp/train.py --backend gloo --plan plan.json --plan-mode deft
  # 2 ranks per host through torchrun
  sudo dpro cluster --hosts 2 --ranks-per-host 2 -- python train.py
  # remove namespaces left behind by killed runs
  sudo dpro cluster --cleanup

\b
Each host's process gets DPRO_HOST=host<i>, HOST_RANK=<i>, NHOSTS, MASTER_ADDR=<ip of host 0>,
MASTER_PORT, GLOO_SOCKET_IFNAME (with --second-rate-mbit also DPRO_LINK1_IFNAME and
DPRO_LINK1_ADDR, the second interface) and (with --ranks-per-host 1, the default) RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE; {i}, {ip}, {iface} and {master} in CMD are replaced per host.
Exit code: 0 if every host succeeded, else the first failing host's code (128+N for signal N),
124 on --timeout, 2 for a usage/setup problem.  Namespaces and cgroups are always removed, also
on Ctrl-C, SIGTERM and SIGHUP.
"""


def _raise_exit(signum: int, _frame: object) -> None:
    # SIGTERM/SIGHUP -> SystemExit, so that `finally` blocks remove namespaces and cgroups
    raise SystemExit(128 + signum)


@click.command(short_help="Run a command once per emulated host (network namespaces, shaped links; root).",
               epilog=EPILOG, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1), help="Number of hosts.")
@click.option("--rate-mbit", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Per-host link rate in Mbit/s, both directions (default: unlimited).")
@click.option("--second-rate-mbit", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Give every host a second link (eth1, its own subnet and bridge) at this rate, Mbit/s "
                   "(default: no second link).")
@click.option("--ranks-per-host", default=1, show_default=True, type=click.IntRange(0),
              help="1: CMD is the rank; K>1: K ranks per host via torchrun; 0: CMD starts its own ranks.")
@click.option("--cpus-per-host", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="CPU budget of every host (cgroup cpu quota; default: none).")
@click.option("--profile", "profile_dir", default=None, metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Run each host under its own `dpro profile --out DIR --host host<i>`.")
@click.option("--steps", default="10:15", show_default=True, help="With --profile: the profiled steps.")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="Namespace name prefix.")
@click.option("--timeout", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Kill all hosts after this many seconds (exit 124).")
@click.option("--fail-fast", is_flag=True, help="Terminate the other hosts as soon as one fails.")
@click.option("--cleanup", is_flag=True, help="Remove namespaces left by killed runs (dead pid) and exit.")
@click.option("--force", is_flag=True, help="With --cleanup: remove ALL namespaces with the prefix.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def cluster(hosts: int, rate_mbit: float | None, second_rate_mbit: float | None, ranks_per_host: int, cpus_per_host: float | None,
            profile_dir: Path | None, steps: str, prefix: str, timeout: float | None, fail_fast: bool, cleanup: bool,
            force: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND once per emulated host: one network namespace per host on a tbf-shaped link.

    Put COMMAND after `--`.  Output of every host goes to stdout.
    """
    from ..cluster import cleanup_stale
    from ..errors import DproError
    from ..jobs import run_job

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    if cleanup:
        removed = cleanup_stale(prefix, force=force)
        click.echo(f"dpro cluster: removed {len(removed)} namespace(s)" + (": " + " ".join(removed) if removed else ""))
        return
    cmd = list(command[1:] if command[:1] == ("--",) else command)
    if not cmd:
        raise DproError("no command given", hint="put the command to run on every host after --")
    sys.stdout.flush()
    r = run_job(cmd, hosts=hosts, ranks_per_host=ranks_per_host or None, rate_mbit=rate_mbit, cluster=True,
                second_rate_mbit=second_rate_mbit,
                cpus_per_host=cpus_per_host, profile=profile_dir, steps=steps, log=sys.stdout,
                timeout=timeout if timeout is not None else float("inf"), fail_fast=fail_fast, prefix=prefix)
    if r.timed_out:
        click.echo(f"dpro cluster: timeout after {timeout} s", err=True)
        sys.exit(124)
    for i, c in enumerate(r.codes):
        if c:
            click.echo(f"dpro cluster: host{i} exited with {128 - c if c < 0 else c}", err=True)
    bad = [c for c in r.codes if c]
    sys.exit(0 if not bad else (128 - bad[0] if bad[0] < 0 else bad[0]))


__all__ = ["cluster"]
