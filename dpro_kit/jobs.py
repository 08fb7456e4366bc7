"""Run a job on N emulated hosts, profiled or not; alternate variants; medians and paired ratios.

The one harness every bench (and the demo, and the tests) uses to launch real distributed jobs:

* :func:`run_job` starts **one launcher per host**: inside an
  :class:`~dpro_kit.cluster.EmulatedCluster` host (network namespace, link shaped to
  ``rate_mbit``) or, with ``rate_mbit=None``, on this machine's loopback (no namespaces).
  Every host's processes get ``DPRO_HOST=host<i>``, ``MASTER_ADDR``/``MASTER_PORT`` and
  ``GLOO_SOCKET_IFNAME``; with ``ranks_per_host=1`` the command *is* the rank (``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``); with ``ranks_per_host=K > 1`` the
  host runs ``torchrun --nnodes H --node-rank i --nproc-per-node K --no-python CMD`` (as users
  launch multi-node jobs); with ``ranks_per_host=None`` the command starts its own ranks
  (``train.py --nproc N``) and no rank variables are set.
* ``profile=DIR``: each host's launcher is ``dpro profile --out DIR --host host<i> -- ...``, one
  per host, as a multi-node job is profiled.
* ``cpus_per_host=C``: every host's processes run in their own cgroup (v1 ``cpu`` controller,
  ``cpu.cfs_quota_us = C * cpu.cfs_period_us``) under a parent group unique to the call,
  removed afterwards (also on errors).  Without the controller, :class:`~dpro_kit.errors.DproError`
  says so.  ``cpusets=["0", "0", "1"]`` also pins each host to its cores (v1 ``cpuset``);
  ``cpusets`` without ``cpus_per_host`` pins the hosts and sets no quota (a host has its cores,
  no CFS bandwidth control stops it).
* :func:`alternate` runs variants A/B/A/B... (or a seeded shuffle per round) and collects
  their numbers; :func:`paired_table` prints medians and ratios taken within each round.

Example::

    from dpro_kit.jobs import run_job, job_iteration_ms
    r = run_job([sys.executable, "examples/ddp/train.py", "--json-out", "t.json"],
                hosts=2, rate_mbit=1000, cpus_per_host=1.0, profile="trace", steps="15:20")
    print(job_iteration_ms("t.json"), r.trace)
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from dpro_kit.cleanup import close_at_exit, closed, exit_on_sigterm
from dpro_kit.errors import DproError

__all__ = [
    "JobResult",
    "CpuBudget",
    "run_job",
    "job_iteration_ms",
    "alternate",
    "paired_ratio",
    "paired_table",
    "cgroup_cpu_root",
    "cgroup_cpuset_root",
    "core_load",
    "parse_cpu_list",
    "neighbour_weight",
    "CGROUP_CPU_ROOT",
    "CGROUP_CPUSET_ROOT",
]

#: where the cgroup v1 ``cpu`` controller is mounted (checked by :func:`cgroup_cpu_root`)
CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: where the cgroup v1 ``cpuset`` controller is mounted (checked by :func:`cgroup_cpuset_root`)
CGROUP_CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
_DPRO = [sys.executable, "-m", "dpro_kit.cli"]
_COUNTER = itertools.count()
_LOCK = threading.Lock()


@dataclasses.dataclass
class JobResult:
    """What :func:`run_job` saw.

    Attributes
    ----------
    codes:
        Exit code of every host's launcher (in host order); ``-9`` for one killed at the timeout.
    wall_s:
        Seconds from the first start to the last exit.
    trace:
        The ``dpro profile`` output folder, or ``None`` when not profiled.
    cgroups:
        The cgroup directories the hosts ran in (removed by the time this is returned), or ``[]``.
    timed_out:
        The job ran into ``timeout``.
    """

    codes: list[int]
    wall_s: float
    trace: Path | None = None
    cgroups: list[Path] = dataclasses.field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Every launcher exited with 0."""
        return not any(self.codes)


def cgroup_cpu_root() -> Path | None:
    """The cgroup v1 ``cpu`` controller's mount point if it is usable here (root, writable), else None."""
    if not (CGROUP_CPU_ROOT / "cpu.cfs_quota_us").exists() or not os.access(CGROUP_CPU_ROOT, os.W_OK):
        return None
    return CGROUP_CPU_ROOT


def cgroup_cpuset_root() -> Path | None:
    """The cgroup v1 ``cpuset`` controller's mount point if it is usable here (root, writable), else None."""
    if not (CGROUP_CPUSET_ROOT / "cpuset.cpus").exists() or not os.access(CGROUP_CPUSET_ROOT, os.W_OK):
        return None
    return CGROUP_CPUSET_ROOT


def core_load(cpusets: Sequence[str], cpus: Sequence[float]) -> dict[int, float]:
    """Per CPU, the quotas (in CPUs) of the hosts pinned to it by a core layout (one cpu list per
    host, ``cpus`` each host's budget), each host's spread evenly over its CPUs."""
    load: dict[int, float] = {}
    for cs, c in zip(cpusets, cpus):
        cl = parse_cpu_list(cs)
        for cpu in cl:
            load[cpu] = round(load.get(cpu, 0.0) + c / len(cl), 4)
    return dict(sorted(load.items()))


def neighbour_weight(factor: float, base_weight: int = 0, host_weight: int = 1024) -> int:
    """``cpu.shares`` of a busy neighbour that slows a host alone on its core by ``factor``.

    A host of weight ``h`` beside a busy neighbour of weight ``w`` gets ``h / (h + w)`` of the core
    while both are runnable.  With a neighbour ``base_weight`` already there in the balanced job
    (0: none; e.g. 1024 puts a host alone on a core at the half core that two hosts sharing the
    other core get), the host runs ``factor`` times slower when ``h / (h + w) = h / (h + base) /
    factor``, i.e. ``w = factor * (h + base) - h`` (factor 1.5, no base: 512; base 1024: 2048).
    """
    if factor < 1.0:
        raise DproError(f"a neighbour can only slow a host (factor >= 1), got {factor:g}")
    return max(2, int(round(factor * (host_weight + base_weight) - host_weight)))


def parse_cpu_list(text: str) -> list[int]:
    """The CPUs of a kernel cpu list (``"0"``, ``"0-3"``, ``"0,2-3"``), sorted; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpu list: {text!r} (expected e.g. 0, 0-1, 0,2-3)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"not a cpu list: {text!r} ({part} runs backwards)")
        cpus.update(range(a, b + 1))
    return sorted(cpus)


class CpuBudget:
    """One cgroup v1 ``cpu`` group per host, with a fixed CPU quota, under a parent unique to this object.

    Parameters
    ----------
    hosts:
        Number of groups (``host0`` .. ``host<hosts-1>``).
    cpus:
        CPUs each group may use: ``cpu.cfs_quota_us = cpus * cpu.cfs_period_us``;
        a sequence gives each host its own budget (a slowed host: stragglers).  ``None`` (only
        with ``cpusets``): no quota at all (``cpu.cfs_quota_us`` stays -1); each host's budget is
        its cores, so the kernel never throttles it (:attr:`cpus_per_host` = the number of CPUs
        in its list, :attr:`quotas_us` None).  A host pinned alone to one core uses at most one
        CPU, like a 1-CPU quota, without the quota's stops of the rest of a period when its
        threads together ran more than one CPU-period's worth (docs/horovod.md, "pinned").
    period_us:
        ``cpu.cfs_period_us`` (default 100 ms, the kernel's).  A throttled group runs its quota and
        then stalls for the rest of the period: with 100 ms, a cut budget shows in a ~30 ms
        iteration as stalls, often between ops and in communication waits, not as slower
        computation.  With 10 ms the stalls (measured here, HZ=250: 4-8 ms each) fall inside every
        busy stretch, so computation runs at ``cpus`` of its speed (a CPU-bound loop: 0.499 of
        wall at ``cpus=0.5``); the kernel refuses quotas under 1 ms.  That holds for a thread that never
        sleeps: one that computes and then waits (a training thread, 18 ms bursts between 25 ms sleeps) is
        slowed by x0.99 / x1.33 / x1.67 at 1/1.25, 1/1.5, 1/2 of a core with 10 ms, and a shorter period is
        no slower CPU either: with 2 ms the tick lets the group overrun its quota, which it repays at the
        quota's rate (x1.97 / x2.37 / x2.63); a busy neighbour's ``cpu.shares`` gives x1.25 / x1.44 / x1.89
        (``bench/stragglers.py --probe``, docs/stragglers.md "Fourteenth").
    prefix:
        Name prefix of the parent group (``<prefix>-<pid>-<n>``).
    shares:
        ``cpu.shares`` of the parent group (default: the kernel's 1024, the weight of ONE busy
        thread outside it): raise it so other load on a shared machine does not eat into the
        hosts' budgets (the quotas still cap each host).
    cpusets:
        Optional core layout, one kernel cpu list per host (``["0", "0", "1"]``: host0 and host1
        on CPU 0, host2 alone on CPU 1): every host also gets a cgroup v1 ``cpuset`` group
        (``cpuset.cpus`` = its list, ``cpuset.mems`` = the machine's) under a parent of the same
        name, so its threads run only there.  A quota caps a host's CPU per period but not *when*
        it runs: with more busy hosts than cores (3 on 2) ranks that compute at the same moments
        queue for a core whatever their quotas sum to.  Pinned so that no core's quotas add up to
        more than 1 CPU (:attr:`core_load`), a host runs at its quota's speed whichever of the
        other hosts are busy (docs/stragglers.md, "Eighth run").  Needs the ``cpuset`` hierarchy
        (:func:`cgroup_cpuset_root`); every CPU must be one this machine's root cpuset has.
    neighbours:
        Optional ``{host: weight}`` (needs ``cpusets``): a busy neighbour for each listed host, one
        process spinning ``while True: pass`` on that host's cores (its cpuset group) in a ``cpu``
        group of its own, ``nb<host>``, whose ``cpu.shares`` is ``weight`` (the hosts' groups have the
        kernel's 1024).  A host alone on one core with such a neighbour gets ``1024 / (1024 +
        weight)`` of the core while both are runnable (the scheduler's weight sharing: no quota, so
        never *stopped*, only slowed), all of it while the neighbour is the only one there:
        a straggler slowed by weight instead of by a quota (docs/stragglers.md, "Ninth run";
        :func:`neighbour_weight`).  Started here, killed and its group removed by :meth:`close`.

    Use as a context manager; :meth:`close` kills what is left in the groups (our own processes)
    and removes them.  :meth:`preexec` returns a function for ``Popen(preexec_fn=...)`` that
    moves the child into its host's group before it executes the command, so every process it
    starts is in the group as well.
    """

    PERIOD_US = 100_000

    def __init__(self, hosts: int, cpus: "float | Sequence[float] | None", *, prefix: str = "dpro",
                 period_us: int = PERIOD_US, shares: int | None = None,
                 cpusets: "Sequence[str] | None" = None, neighbours: "Mapping[int, int] | None" = None) -> None:
        root = cgroup_cpu_root()
        if root is None:
            raise DproError(f"no usable cgroup v1 cpu controller at {CGROUP_CPU_ROOT} (needs root and the "
                            "cgroup v1 `cpu` hierarchy mounted)",
                            hint="run without a CPU budget (cpus_per_host=None), or as root on a machine "
                                 "with /sys/fs/cgroup/cpu")
        if cpus is None and cpusets is None:
            raise DproError("a CPU budget needs cpus (a quota per host) or cpusets (cores per host)",
                            hint="e.g. cpus=1.0, or cpusets=['0', '1'] for one core per host without a quota")
        self.cpusets = self._check_cpusets(hosts, cpusets) if cpusets is not None else None
        if cpus is None:
            per_host = [float(len(cs)) for cs in self.cpusets or []]
        else:
            per_host = [float(c) for c in cpus] if isinstance(cpus, (list, tuple)) else [float(cpus)] * hosts
        if len(per_host) != hosts or min(per_host) <= 0:
            raise DproError(f"cpus_per_host must be > 0 for each of the {hosts} hosts, got {cpus}")
        with _LOCK:
            n = next(_COUNTER)
        self.parent = root / f"{prefix}-{os.getpid()}-{n}"
        self.groups = [self.parent / f"host{i}" for i in range(hosts)]
        self.period_us = int(period_us)
        if not 1000 <= self.period_us <= 1_000_000:
            raise DproError(f"cpu period must be 1000..1000000 us, got {period_us}")
        #: per host ``cpu.cfs_quota_us`` written, or None: no quota (``cpus=None``, pinned only)
        self.quotas_us: "list[int] | None" = None if cpus is None else [int(round(c * self.period_us)) for c in per_host]
        self.quota_us = self.quotas_us[0] if self.quotas_us else None
        if self.quotas_us and min(self.quotas_us) < 1000:
            raise DproError(f"a CPU budget of {min(per_host):g} CPU is a quota under 1 ms in a {self.period_us} us "
                            "period, which the kernel refuses", hint="use a longer period or a larger budget")
        self.cpus_per_host = per_host
        self.cpuset_parent = CGROUP_CPUSET_ROOT / self.parent.name if self.cpusets is not None else None
        self.cpuset_groups = [self.cpuset_parent / f"host{i}" for i in range(hosts)] if self.cpuset_parent else []
        self.neighbours = self._check_neighbours(hosts, neighbours) if neighbours else {}
        self.neighbour_groups = [self.parent / f"nb{h}" for h in self.neighbours]
        self.neighbour_procs: list[subprocess.Popen] = []
        self.parent.mkdir()
        close_at_exit(self)   # a `sys.exit` path that skipped close() (dpro_kit.cleanup)
        exit_on_sigterm()     # and a `kill` of the bench: both still remove the groups
        try:
            if shares is not None:
                (self.parent / "cpu.shares").write_text(str(int(shares)))
            for i, g in enumerate(self.groups):
                g.mkdir()
                if self.quotas_us is not None:
                    (g / "cpu.cfs_period_us").write_text(str(self.period_us))
                    (g / "cpu.cfs_quota_us").write_text(str(self.quotas_us[i]))
            if self.cpuset_parent is not None:
                # a new cpuset group starts with no CPUs and no memory nodes: the parent needs both before
                # a child can have any (a child's are a subset of its parent's)
                mems = (CGROUP_CPUSET_ROOT / "cpuset.mems").read_text().strip()
                self.cpuset_parent.mkdir()
                (self.cpuset_parent / "cpuset.cpus").write_text(
                    ",".join(str(c) for c in sorted({c for cs in self.cpusets for c in cs})))
                (self.cpuset_parent / "cpuset.mems").write_text(mems)
                for g, cs in zip(self.cpuset_groups, self.cpusets):
                    g.mkdir()
                    (g / "cpuset.cpus").write_text(",".join(map(str, cs)))
                    (g / "cpuset.mems").write_text(mems)
            for (h, w), g in zip(self.neighbours.items(), self.neighbour_groups):
                g.mkdir()
                (g / "cpu.shares").write_text(str(w))
                self.neighbour_procs.append(subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, preexec_fn=self._enter([g, self.cpuset_groups[h]])))
        except BaseException:
            self.close()
            raise

    def _check_neighbours(self, hosts: int, neighbours: Mapping[int, int]) -> dict[int, int]:
        if self.cpusets is None:
            raise DproError("busy neighbours need a core layout (cpusets): a neighbour shares its host's cores",
                            hint="give cpusets, e.g. ['0', '1'] for 2 hosts")
        out = {}
        for h, w in neighbours.items():
            if not (isinstance(h, int) and 0 <= h < hosts):
                raise DproError(f"busy neighbour of host {h!r}: no such host (0..{hosts - 1})")
            if not (isinstance(w, int) and 2 <= w <= 262144):
                raise DproError(f"busy neighbour of host{h}: cpu.shares {w!r} is not an integer in 2..262144",
                                hint="e.g. 512 (the host, 1024, gets 2/3 of its core)")
            out[h] = w
        return out

    @staticmethod
    def _check_cpusets(hosts: int, cpusets: Sequence[str]) -> list[list[int]]:
        if cgroup_cpuset_root() is None:
            raise DproError(f"no usable cgroup v1 cpuset controller at {CGROUP_CPUSET_ROOT} (needs root and the "
                            "cgroup v1 `cpuset` hierarchy mounted)", hint="run without a core layout (cpusets=None)")
        if isinstance(cpusets, str) or len(cpusets) != hosts:
            raise DproError(f"a core layout needs one cpu list per host ({hosts}), got {cpusets!r}",
                            hint="e.g. ['0', '0', '1'] for 3 hosts on 2 cores")
        have = set(parse_cpu_list((CGROUP_CPUSET_ROOT / "cpuset.effective_cpus").read_text()))
        out = []
        for i, cs in enumerate(cpusets):
            try:
                cpus = parse_cpu_list(str(cs))
            except ValueError as e:
                raise DproError(f"cpuset of host{i}: {e}", hint="one kernel cpu list per host, e.g. 0 or 0-1") from None
            if not set(cpus) <= have:
                raise DproError(f"cpuset of host{i}: CPU(s) {sorted(set(cpus) - have)} not on this machine "
                                f"(its cpuset has {sorted(have)})", hint="pick CPUs of /sys/fs/cgroup/cpuset/cpuset.cpus")
            out.append(cpus)
        return out

    @property
    def core_load(self) -> dict[int, float]:
        """With a core layout: :func:`core_load` of its hosts; empty without one."""
        return core_load([",".join(map(str, c)) for c in self.cpusets or []], self.cpus_per_host)

    def preexec(self, host: int) -> Callable[[], None]:
        """A ``preexec_fn`` that puts the starting child into host ``host``'s group(s)."""
        return self._enter([self.groups[host], *([self.cpuset_groups[host]] if self.cpuset_groups else [])])

    @staticmethod
    def _enter(groups: Sequence[Path]) -> Callable[[], None]:
        procs = [str(g / "cgroup.procs") for g in groups]

        def _enter() -> None:
            for path in procs:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
        return _enter

    def close(self) -> None:
        """Kill processes still in the groups (the busy neighbours too) and remove them (idempotent)."""
        for p in getattr(self, "neighbour_procs", []):
            if p.poll() is None:
                p.kill()
            p.wait()
        for g in [*getattr(self, "neighbour_groups", []), *self.groups, self.parent, *self.cpuset_groups,
                  *([self.cpuset_parent] if self.cpuset_parent is not None else [])]:
            if not g.exists():
                continue
            for _ in range(50):
                try:
                    g.rmdir()
                    break
                except OSError:
                    pids = [int(p) for p in (g / "cgroup.procs").read_text().split()] if g.exists() else []
                    for p in pids:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.1)
        closed(self)

    def __enter__(self) -> "CpuBudget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _substitute(argv: Sequence[str], subs: Mapping[str, str]) -> list[str]:
    out = []
    for a in argv:
        for k, v in subs.items():
            a = a.replace(k, v)
        out.append(a)
    return out


def _kill(p: subprocess.Popen) -> None:
    """Kill a launcher and its process group (it was started in a session of its own)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()
        p.wait()


def _wait(procs: list[subprocess.Popen], timeout: float, fail_fast: bool) -> list[int]:
    """Exit codes of ``procs`` (-N for signal N, -9 for killed at the timeout)."""
    deadline = time.time() + timeout
    codes: list[int | None] = [None] * len(procs)
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None and (rc := p.poll()) is not None:
                codes[i] = rc
                if rc != 0 and fail_fast:
                    for q in procs:
                        _kill(q)
        if time.time() > deadline:
            for i, p in enumerate(procs):
                if codes[i] is None:
                    _kill(p)
                    codes[i] = -9
        time.sleep(0.05)
    return [int(c) for c in codes]  # type: ignore[arg-type]


def run_job(argv: Sequence[str], *, hosts: int = 1, ranks_per_host: int | None = 1,
            rate_mbit: "float | Sequence[float | None] | None" = None, cluster: bool | None = None,
            second_rate_mbit: "float | Sequence[float | None] | None" = None,
            cpus_per_host: "float | Sequence[float] | None" = None, cpu_period_us: int = CpuBudget.PERIOD_US,
            cpu_shares: int | None = None, cpusets: "Sequence[str] | None" = None,
            neighbours: "Mapping[int, int] | None" = None,
            profile: str | os.PathLike | None = None, steps: str = "10:15", profile_flags: Sequence[str] = (),
            env: Mapping[str, str] | None = None, host_env: Callable[[int], Mapping[str, str]] | None = None,
            log: IO | None = None, timeout: float = 600.0, fail_fast: bool = False,
            prefix: str = "dpj") -> JobResult:
    """Run one job: one launcher per host, on emulated hosts or loopback, profiled or not.

    Parameters
    ----------
    argv:
        The command of one rank (``ranks_per_host`` 1 or K) or of one host (``ranks_per_host=None``);
        ``{i}`` (host index), ``{ip}`` (its address), ``{iface}`` and ``{master}`` in it are replaced
        per host (plain replacement, other braces are left alone).
    hosts:
        Number of hosts, each with its own launcher.
    ranks_per_host:
        1: the command is the rank (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` set);
        K > 1: the host runs ``torchrun --no-python`` with K ranks; None: the command starts its
        own ranks and no rank variables are set (``train.py --nproc N``).
    rate_mbit:
        Per-host link rate (Mbit/s; a list: one per host) of an :class:`~dpro_kit.cluster.EmulatedCluster`; ``None``: no
        cluster, every host's processes on this machine's loopback (``MASTER_ADDR=127.0.0.1``).
    second_rate_mbit:
        Give each emulated host a second link at this rate (:class:`~dpro_kit.cluster.EmulatedCluster`
        ``second_rate_mbit``; its processes get ``DPRO_LINK1_IFNAME``/``DPRO_LINK1_ADDR``); needs a cluster.
    cluster:
        Force (True) an emulated cluster with unshaped links when ``rate_mbit`` is None; default:
        a cluster exactly when ``rate_mbit`` is given.
    cpus_per_host:
        CPU budget of each host (a :class:`CpuBudget` cgroup; a list: one per host), or None for none.
    cpu_period_us:
        The budget's CFS period (:class:`CpuBudget` ``period_us``; 10 ms makes a cut budget slow
        the computation itself).
    cpu_shares:
        :class:`CpuBudget` ``shares`` (the job's weight against other load on this machine).
    cpusets:
        :class:`CpuBudget` ``cpusets``: one kernel cpu list per host (the cores its processes may
        run on; cgroup v1 ``cpuset``), or None.  Without ``cpus_per_host`` the hosts are pinned
        and get no CFS quota (:class:`CpuBudget` ``cpus=None``).
    neighbours:
        :class:`CpuBudget` ``neighbours``: ``{host: cpu.shares}`` of a busy loop on that host's cores
        (slows it by weight, not by a quota); needs ``cpusets``.
    profile:
        Folder for ``dpro profile --out``; every host's launcher is ``dpro profile --host host<i>``.
    steps:
        ``dpro profile --steps`` (profiled jobs only).
    profile_flags:
        More ``dpro profile`` options (``--ring``, ``--memory``, ``--shapes``).
    env:
        Extra environment for every process (on top of ``os.environ``).
    host_env:
        Per-host extra environment, ``host_env(i) -> dict`` (applied last).
    log:
        File the processes' stdout and stderr go to (default: discarded).
    timeout:
        Seconds after which the launchers still running are killed (their code reads ``-9``).
    fail_fast:
        Stop the other hosts as soon as one launcher fails.
    prefix:
        Name prefix of the namespaces (see :func:`dpro_kit.cluster.cleanup_stale`) and cgroups.

    Returns
    -------
    JobResult
        Exit codes, wall time, the trace folder.  A failing job is not an exception: the caller
        decides (a gloo abort at exit after every result was written is common here).
    """
    from dpro_kit.cluster import EmulatedCluster

    if hosts < 1:
        raise DproError(f"hosts must be >= 1, got {hosts}")
    use_cluster = rate_mbit is not None if cluster is None else cluster
    if second_rate_mbit is not None and not use_cluster:
        raise DproError("a second link (second_rate_mbit) needs an emulated cluster",
                        hint="give rate_mbit, or cluster=True")
    out = subprocess.DEVNULL if log is None else log
    budget = CpuBudget(hosts, cpus_per_host, prefix=prefix, period_us=cpu_period_us, shares=cpu_shares,
                       cpusets=cpusets, neighbours=neighbours) if cpus_per_host is not None or cpusets is not None else None
    emu = None
    procs: list[subprocess.Popen] = []
    t0 = time.time()
    try:
        if use_cluster:
            emu = EmulatedCluster(hosts=hosts, rate_mbit=rate_mbit, prefix=prefix, second_rate_mbit=second_rate_mbit)
            master, port, iface = emu.master_addr, 29500, emu.iface(0)   # fresh namespaces: any port is free
        else:
            master, port, iface = "127.0.0.1", _free_port(), "lo"
        k = ranks_per_host
        world = hosts * (k or 1)
        for i in range(hosts):
            e = dict(os.environ)
            # no shared DPRO_RUN_ID: each host's `dpro profile` is a launcher as a user would start it
            # (its ranks agree on the run id through the job's own rendezvous: c10d store, TF_CONFIG)
            e.update({"DPRO_HOST": f"host{i}", "HOST_RANK": str(i), "NHOSTS": str(hosts)})
            if k is not None or hosts > 1:
                e.update({"MASTER_ADDR": master, "MASTER_PORT": str(port)})
            if use_cluster or hosts > 1:
                e["GLOO_SOCKET_IFNAME"] = iface
            if k == 1:
                e.update({"RANK": str(i), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
            e.update(env or {})
            if host_env is not None:
                e.update(host_env(i))
            cmd = _substitute(argv, {"{i}": str(i), "{master}": master,
                                     "{ip}": emu.host_ip(i) if emu is not None else master, "{iface}": iface})
            if k is not None and k > 1:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--node-rank", str(i),
                       "--nproc-per-node", str(k), "--master-addr", master, "--master-port", str(port),
                       "--no-python", *cmd]
            if profile is not None:
                cmd = _DPRO + ["profile", "--out", str(profile), "--steps", steps, "--host", f"host{i}",
                               *profile_flags, "--", *cmd]
            kw: dict[str, Any] = {"stdout": out, "stderr": subprocess.STDOUT, "start_new_session": True}
            if budget is not None:
                kw["preexec_fn"] = budget.preexec(i)
            if emu is not None:
                procs.append(emu.run(i, cmd, env=e, inherit_env=False, **kw))
            else:
                procs.append(subprocess.Popen(cmd, env=e, **kw))
        codes = _wait(procs, timeout, fail_fast)
        return JobResult(codes=codes, wall_s=round(time.time() - t0, 1),
                         trace=Path(profile) if profile is not None else None,
                         cgroups=list(budget.groups) if budget is not None else [],
                         timed_out=-9 in codes and time.time() - t0 >= timeout)
    finally:
        for p in procs:
            _kill(p)
        if emu is not None:
            emu.close()
        if budget is not None:
            budget.close()


def job_iteration_ms(times_json: str | os.PathLike) -> float:
    """The job's iteration time from ``train.py --json-out``: the slowest rank's median, in ms."""
    doc = json.loads(Path(times_json).read_text())
    return max(statistics.median(ts) for ts in doc["iteration_times_s"].values()) * 1e3


def alternate(variants: Mapping[str, Callable[[], float]], rounds: int, *, shuffle_seed: int | None = None,
              on_round: Callable[[int, dict[str, list[float]]], None] | None = None) -> dict[str, list[float]]:
    """Run every variant once per round, alternating (A, B, A, B, ...), and collect their numbers.

    Parameters
    ----------
    variants:
        Name -> a function that runs the variant once and returns its number (e.g. ms).
    rounds:
        Number of rounds.
    shuffle_seed:
        None: the same order every round; an int: the order is shuffled per round with this seed
        (so slow drift of a shared machine does not always hit the same variant last).
    on_round:
        Called after each round with its index and the numbers so far (for progress lines).

    Returns
    -------
    dict
        Name -> one number per round, in round order (``rounds[name][i]`` ran in round ``i``).
    """
    out: dict[str, list[float]] = {v: [] for v in variants}
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    for r in range(rounds):
        order = list(variants)
        if rng is not None:
            rng.shuffle(order)
        for v in order:
            out[v].append(variants[v]())
        if on_round is not None:
            on_round(r, out)
    return out


def paired_ratio(rounds: Mapping[str, Sequence[float]], a: str, b: str) -> float:
    """Median over rounds of ``a[i] / b[i]``: each ratio taken within one round (A and B ran minutes
    apart at most; the machine drifts between rounds)."""
    n = min(len(rounds[a]), len(rounds[b]))
    return statistics.median(rounds[a][i] / rounds[b][i] for i in range(n))


def paired_table(rounds: Mapping[str, Sequence[float]], baseline: str, *, unit: str = "ms",
                 file: IO | None = None) -> str:
    """Print (and return) one line per variant: median, min..max, paired ratio to ``baseline``.

    Parameters
    ----------
    rounds:
        Name -> one number per round (from :func:`alternate`).
    baseline:
        The variant the ratios are taken against.
    unit:
        Unit of the numbers, for the header.
    file:
        Where to print (default stdout).
    """
    lines = [f"| variant | median {unit} | min .. max {unit} | runs | paired ratio to {baseline} |",
             "|---|---:|---:|---:|---:|"]
    for v, xs in rounds.items():
        ratio = "1" if v == baseline else f"{paired_ratio(rounds, v, baseline):.3f}"
        lines.append(f"| {v} | {statistics.median(xs):.2f} | {min(xs):.2f} .. {max(xs):.2f} | {len(xs)} | {ratio} |")
    text = "\n".join(lines)
    print(text, file=file or sys.stdout, flush=True)
    return text
