#!/usr/bin/env python3
"""Run a command once per emulated host (network namespace) on a shaped link.

A thin command line over :func:`dpro_kit.jobs.run_job` (the harness the benches use) and
:class:`dpro_kit.cluster.EmulatedCluster`.  Examples::

    # 2 hosts, 200 Mbit/s per host link (both directions), one rank per host
    sudo python tools/emucluster.py --hosts 2 --rate-mbit 200 -- python train.py --backend gloo

    # the same, each host profiled by its own `dpro profile`, 1 CPU per host (cgroup quota)
    sudo python tools/emucluster.py --hosts 2 --rate-mbit 200 --cpus-per-host 1 --profile trace -- \\
        python examples/ddp/train.py --backend gloo

    # remove namespaces left behind by killed runs
    sudo python tools/emucluster.py --cleanup

Each host's process gets DPRO_HOST=host<i>, HOST_RANK=<i>, NHOSTS, MASTER_ADDR=<ip of host 0>,
MASTER_PORT, GLOO_SOCKET_IFNAME and (with --ranks-per-host 1, the default) RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE; ``{i}``, ``{ip}``, ``{iface}`` and ``{master}`` in CMD are replaced
per host.  ``--ranks-per-host K`` runs K ranks per host through torchrun; ``0`` sets no rank
variables (the command starts its own ranks).  The exit code is 0 if every host succeeded,
otherwise the first failing host's code (128+N for signal N), 124 on --timeout, 2 for a
usage/setup problem.  Namespaces and cgroups are always removed, also on Ctrl-C, SIGTERM and
SIGHUP (see dpro_kit/cluster.py and dpro_kit/jobs.py).
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

try:
    from dpro_kit.cluster import DEFAULT_PREFIX, cleanup_stale
    from dpro_kit.errors import DproError
    from dpro_kit.jobs import run_job
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpro_kit.cluster import DEFAULT_PREFIX, cleanup_stale
    from dpro_kit.errors import DproError
    from dpro_kit.jobs import run_job


def _raise_exit(signum: int, _frame: object) -> None:
    # Turn SIGTERM/SIGHUP into SystemExit so that `finally` blocks clean up.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run CMD once per emulated host (network namespace, shaped link).",
        epilog="Use `--` before CMD.  Needs root and iproute2 (ip, tc).")
    ap.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    ap.add_argument("--rate-mbit", type=float, default=None,
                    help="per-host link rate in Mbit/s, both directions (default: unlimited)")
    ap.add_argument("--ranks-per-host", type=int, default=1,
                    help="1: CMD is the rank (default); K>1: K ranks per host via torchrun; 0: CMD starts its own")
    ap.add_argument("--cpus-per-host", type=float, default=None,
                    help="CPU budget of every host (cgroup v1 cpu quota; default: none)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="run each host under its own `dpro profile --out DIR --host host<i>`")
    ap.add_argument("--steps", default="10:15", help="with --profile: the profiled steps (default 10:15)")
    ap.add_argument("--prefix", default=DEFAULT_PREFIX,
                    help=f"namespace name prefix (default {DEFAULT_PREFIX})")
    ap.add_argument("--timeout", type=float, default=None,
                    help="kill all hosts after this many seconds (exit 124)")
    ap.add_argument("--fail-fast", action="store_true",
                    help="terminate the other hosts as soon as one fails")
    ap.add_argument("--cleanup", action="store_true",
                    help="remove namespaces left by killed runs (dead pid) and exit")
    ap.add_argument("--force", action="store_true",
                    help="with --cleanup: remove ALL namespaces with the prefix")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    try:
        if args.cleanup:
            removed = cleanup_stale(args.prefix, force=args.force)
            print(f"emucluster: removed {len(removed)} namespace(s)"
                  + (": " + " ".join(removed) if removed else ""))
            return 0
        if not cmd:
            ap.error("no command given (use: -- CMD ...)")
        sys.stdout.flush()
        r = run_job(cmd, hosts=args.hosts, ranks_per_host=args.ranks_per_host or None, rate_mbit=args.rate_mbit,
                    cluster=True, cpus_per_host=args.cpus_per_host, profile=args.profile, steps=args.steps,
                    log=sys.stdout, timeout=args.timeout if args.timeout is not None else float("inf"),
                    fail_fast=args.fail_fast, prefix=args.prefix)
        if r.timed_out:
            print(f"emucluster: timeout after {args.timeout} s", file=sys.stderr)
            return 124
        for i, c in enumerate(r.codes):
            if c:
                print(f"emucluster: host{i} exited with {128 - c if c < 0 else c}", file=sys.stderr)
        bad = [c for c in r.codes if c]
        return 0 if not bad else (128 - bad[0] if bad[0] < 0 else bad[0])
    except DproError as exc:
        print(f"emucluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
