#!/usr/bin/env python3
"""Run a command once per emulated host (network namespace) on a shaped link.

Examples::

    # 2 hosts, 200 Mbit/s per host link (both directions), one rank per host
    sudo python tools/emucluster.py --hosts 2 --rate-mbit 200 -- \\
        python train.py --rank {i} --master {master}

    # remove namespaces left behind by killed runs
    sudo python tools/emucluster.py --cleanup

Each process gets DPRO_HOST=host<i>, HOST_RANK=<i>, NHOSTS, MASTER_ADDR=<ip of
host 0> and GLOO_SOCKET_IFNAME=<iface>; ``{i}``, ``{ip}``, ``{iface}`` and
``{master}`` in CMD are replaced per host.  The exit code is 0 if every host
succeeded, otherwise the first failing host's code (128+N for signal N), 124
on --timeout, 2 for a usage/setup problem.  Namespaces are always removed,
also on Ctrl-C, SIGTERM and SIGHUP (see dpro_kit/cluster.py for details).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    from dpro_kit.cluster import DEFAULT_PREFIX, DEFAULT_SUBNET, EmulatedCluster, cleanup_stale
    from dpro_kit.errors import DproError
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpro_kit.cluster import DEFAULT_PREFIX, DEFAULT_SUBNET, EmulatedCluster, cleanup_stale
    from dpro_kit.errors import DproError


def _exit_code(rc: int) -> int:
    """Popen reports death by signal N as -N; shells report 128+N."""
    return 128 - rc if rc < 0 else rc


def _raise_exit(signum: int, _frame: object) -> None:
    # Turn SIGTERM/SIGHUP into SystemExit so that `with`/finally blocks clean up.
    raise SystemExit(128 + signum)


def _wait(procs: list[subprocess.Popen], timeout: float | None, fail_fast: bool) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    codes: dict[int, int] = {}
    first_fail: int | None = None
    while len(codes) < len(procs):
        for i, p in enumerate(procs):
            if i in codes:
                continue
            rc = p.poll()
            if rc is None:
                continue
            codes[i] = _exit_code(rc)
            if codes[i] != 0:
                print(f"emucluster: host{i} exited with {codes[i]}", file=sys.stderr)
                if first_fail is None:
                    first_fail = codes[i]
                    if fail_fast:
                        for q in procs:
                            if q.poll() is None:
                                q.terminate()
        if deadline is not None and time.monotonic() > deadline:
            print(f"emucluster: timeout after {timeout} s; stopping hosts "
                  f"{[i for i in range(len(procs)) if i not in codes]}", file=sys.stderr)
            return 124
        time.sleep(0.05)
    return 0 if first_fail is None else first_fail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run CMD once per emulated host (network namespace, shaped link).",
        epilog="Use `--` before CMD.  Needs root and iproute2 (ip, tc).")
    ap.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    ap.add_argument("--rate-mbit", type=float, default=None,
                    help="per-host link rate in Mbit/s, both directions (default: unlimited)")
    ap.add_argument("--prefix", default=DEFAULT_PREFIX,
                    help=f"namespace name prefix (default {DEFAULT_PREFIX})")
    ap.add_argument("--subnet", default=DEFAULT_SUBNET,
                    help=f"private IPv4 subnet inside the cluster (default {DEFAULT_SUBNET})")
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
        with EmulatedCluster(hosts=args.hosts, rate_mbit=args.rate_mbit,
                             prefix=args.prefix, subnet=args.subnet) as cluster:
            procs = cluster.run_all(cmd)
            return _wait(procs, args.timeout, args.fail_fast)
    except DproError as exc:
        print(f"emucluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
