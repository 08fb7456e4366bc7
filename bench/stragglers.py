#!/usr/bin/env python3
"""Stragglers, ground truth: make a real emulated host slower, predict it from the balanced profile, measure.

Issue 21 item 3 (docs/stragglers.md).  For each (model, link rate) this runs the REAL job of
``examples/ddp/train.py`` (gloo, CPU, one rank per emulated host, every host with a fixed CPU
budget: ``dpro_kit.jobs.run_job(cpus_per_host=..., cpu_period_us=10000)``):

1. the balanced job under ``dpro profile`` ``--profiles`` times (before the rounds and after
   evenly spaced rounds); from each trace ``dpro replay`` predicts the balanced iteration time and
   every injected straggler: host S's CPU budget cut to 1/F of the others' ->
   ``--cpu-limit hostS=<cpus/F> --cpu-period-ms <period>`` (the CFS model: full speed until the
   period's quota is spent, then stopped; docs/stragglers.md) and, for comparison,
   ``--slow-rank S=<the cut's busy-loop factor>``; host S's link rate x f -> ``--slow-link hostS=f``.
   Predicted slowdown = median over the profiles of replay(what-if) / replay(balanced);
2. every job (balanced and each injection) without the profiler, ``--rounds`` times in
   alternating order; measured slowdown = median(injected) / median(balanced), per-round pairs;
3. the reverse direction: the job with host S at 1/``--reverse`` of the budget under
   ``dpro profile`` (``--reverse-profiles`` times, interleaved with the rounds like the balanced
   profiles): ``dpro replay --stragglers`` must name host S first on each, and its saving
   (``--like-median S`` over every profiled iteration) predicts the speed-up of fixing it, median
   over the slowed profiles (measured: median(slowed) / median(balanced)).

``--pin 0,0,1`` also pins the hosts to cores (``dpro_kit.jobs.CpuBudget`` ``cpusets``, cgroup v1
``cpuset``; one cpu list per host): with 3 hosts on 2 cores a quota alone does not stop ranks
that compute at the same moments from queueing for a core; pinned so that no core's quotas sum
to more than 1 CPU, each host runs at its quota's speed (docs/stragglers.md, "Eighth run").  The
busy-loop calibration then runs on the slowed host's cores.

``--slow-by shares`` (with ``--pin``) slows host S without a quota: no host has one, and on host
S's core a busy loop runs in a ``cpu`` group of its own whose ``cpu.shares`` gives the host 1/F
of the core while both are runnable (``dpro_kit.jobs.CpuBudget`` ``neighbours``,
``neighbour_weight``: host 1024, neighbour 1024 (F - 1); ``--neighbour-base W``: a neighbour of
weight W already in the balanced job, e.g. 1024 for 3 hosts on 2 cores so the host alone on a core
gets the half core the two sharing the other get).  The scheduler's weight sharing never stops the
host, it only slows it (docs/stragglers.md, "Ninth run").  The cut is predicted with ``--slow-host
hostS=f`` (``--cpu-share hostS=s`` with a base neighbour; f the busy loop's measured factor beside the
neighbour, s the part of its core the host gets in the balanced job): the host's computation and the
CPU part of its transfers at 1/f, from the collector's CPU record (``dpro_kit.whatif.slow_hosts``,
docs/stragglers.md "Tenth run"); for comparison ``--slow-rank S=f'`` with ``f' = 1 + (f - 1) max(C / s,
W) / W`` (``cpu_share_factor``: the whole CPU time C charged to the traced computation W, the ninth
run's rule), ``--slow-rank S=f`` and ``--slow-rank S=F`` (nominal).  With ``--sched`` also model "busy":
``--slow-host hostS=F --host-busy hostS=B`` (nominal F; "busy_cal": at f), B the part of the iteration host S's
training thread was runnable in the **balanced** plain rounds (``busy_fraction``), which at 1000 Mbit/s is the
whole iteration while the profiled job's process CPU says less (docs/stragglers.md, "Eleventh run").
Model "paced" (primary when recorded): "busy" plus ``--wire-mbps <rate>``, so that the transfers that ran at
the wire's rate in the balanced profile keep their time (docs/whatif.md, "Wire- or CPU-paced"; docs/stragglers.md,
"Twelfth"). ``--predictors paced,busy,link`` limits the models (fewer replays inside the bench lock).

``--ab SECS`` measures every CPU cut inside each plain job: host S's straggler is switched on and off in phases of
SECS seconds (``Switcher``: the busy neighbour stopped or at the cut's weight; with ``--slow-by quota`` host S's
quota), and a round's slowdown is the median of the cut's steps over the balanced ones of the same job
(``ab_split``); ``--ab-summary RUN ...`` sets every cut phase against the balanced step of the same moment.
``--probe`` asks whether a cut acts like a slower CPU for a thread that computes and sleeps (``burst_probe``).
docs/stragglers.md, "Fourteenth".

The CFS period is 10 ms (``--period-us``): with the kernel's 100 ms, a cut budget stalls a
~30 ms iteration between ops and in communication waits instead of slowing the computation
(docs/stragglers.md).  The job's parent cgroup gets ``cpu.shares`` ``--shares`` so other load on
the shared machine does not eat into the hosts' budgets.

    python bench/stragglers.py --models mlp --rates 1000,200 --cuts 1.25,1.5,2 --link-cuts 0.5 --rounds 3

Prints a table (injected, predicted, measured, error) and writes ``--out/rows.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpro_kit.jobs import core_load, run_job  # noqa: E402
from dpro_kit.whatif import COMPUTE_KINDS  # noqa: E402  (the kinds --slow-rank stretches)

TRAIN = ROOT / "examples" / "ddp" / "train.py"
PY = sys.executable
DPRO = [PY, "-m", "dpro_kit.cli"]
BATCH = {"mlp": 64, "cnn": 32, "transformer": 8}


class SchedPoll:
    """Per emulated host, how long its threads waited for a core while the job trained (``--sched``).

    Polls, every ``interval`` s while a job runs, ``/proc/<tid>/schedstat`` (CPU time, run-queue
    wait) of every thread in the job's host cgroups (``<prefix>-<bench pid>-*/host<i>``, made by
    ``dpro_kit.jobs.CpuBudget``) and each group's ``cpu.stat`` ``throttled_time``.  A thread that is
    runnable but not running counts as waiting, whether no core was free or its group's quota
    was spent, so the wait for a core is ``wait - throttled`` (a check with a lone busy thread at
    0.3 CPU: wait 1.55 s, throttled 1.04 s, on a machine with other load).  Only the training
    window counts: it ends when the rank's main thread (the one with the most CPU) stops
    computing and is as long as the rank's measured iterations (``times.json``).
    """

    def __init__(self, prefix: str, interval: float = 0.1) -> None:
        import threading
        self.glob = f"{prefix}-{os.getpid()}-*/host*"
        self.interval = interval
        self.samples: list[tuple[float, dict[str, dict]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SchedPoll":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _run(self) -> None:
        root = Path("/sys/fs/cgroup/cpu")
        while not self._stop.is_set():
            now = time.perf_counter()
            snap: dict[str, dict] = {}
            try:
                groups = list(root.glob(self.glob))
            except OSError:         # a job's group removed while listed (the job ended)
                groups = []
            for g in groups:
                th: dict[int, tuple[int, int]] = {}
                try:
                    tids = [int(x) for x in (g / "tasks").read_text().split()]
                    thr = 0
                    for line in (g / "cpu.stat").read_text().splitlines():
                        if line.startswith("throttled_time "):
                            thr = int(line.split()[1])
                except (OSError, ValueError):
                    continue
                for tid in tids:
                    try:
                        c, w, _ = (int(x) for x in Path(f"/proc/{tid}/schedstat").read_text().split())
                    except (OSError, ValueError):
                        continue
                    th[tid] = (c, w)
                snap[g.name] = {"threads": th, "throttled": thr}
            if snap:
                self.samples.append((now, snap))
            self._stop.wait(self.interval)

    def summary(self, window_s: dict[str, Any]) -> dict[str, dict[str, float]]:
        """Per host: the main thread's CPU, run-queue wait and the group's throttled time (ms) over its
        training window, and the wait for a core as a fraction of the window.

        ``window_s[host]``: ``(start, end)`` on ``time.perf_counter()`` (the samples' clock; ``train.py``'s
        ``train_window_perf_counter_s``): the samples nearest its ends; or a length in seconds (older jobs),
        ending where the main thread stopped computing — which takes in the CPU the thread spends after
        training (teardown, a trace export) and over-states its CPU (docs/stragglers.md, "Thirteenth")."""
        out: dict[str, dict[str, float]] = {}
        hosts = sorted({h for _, sn in self.samples for h in sn})
        for h in hosts:
            seq = [(t, sn[h]) for t, sn in self.samples if h in sn and sn[h]["threads"]]
            if len(seq) < 3 or h not in window_s:
                continue
            last = seq[-1][1]["threads"]
            main = max(last, key=lambda tid: last[tid][0])
            seq = [(t, d) for t, d in seq if main in d["threads"]]
            w = window_s[h]
            if isinstance(w, (tuple, list)):
                end = min(range(len(seq)), key=lambda i: abs(seq[i][0] - float(w[1])))
                start = min(range(end + 1), key=lambda i: abs(seq[i][0] - float(w[0])))
            else:
                # the end of training: the last interval in which the main thread got more than 20 % of a CPU
                end = len(seq) - 1
                while end > 0 and (seq[end][1]["threads"][main][0] - seq[end - 1][1]["threads"][main][0]) / 1e9 \
                        < 0.2 * (seq[end][0] - seq[end - 1][0]):
                    end -= 1
                start = min(range(end + 1), key=lambda i: abs(seq[i][0] - (seq[end][0] - float(w))))
            if end - start < 2:
                continue
            a, b = seq[start][1], seq[end][1]
            wall = (seq[end][0] - seq[start][0]) * 1e3
            cpu = (b["threads"][main][0] - a["threads"][main][0]) / 1e6
            wait = (b["threads"][main][1] - a["threads"][main][1]) / 1e6
            thr = (b["throttled"] - a["throttled"]) / 1e6
            others = sum(b["threads"][t][0] - a["threads"].get(t, (0, 0))[0] for t in b["threads"] if t != main) / 1e6
            out[h] = {"window_ms": round(wall, 1), "main_cpu_ms": round(cpu, 1), "main_wait_ms": round(wait, 1),
                      "throttled_ms": round(thr, 1), "other_threads_cpu_ms": round(others, 1),
                      "core_wait_frac": round(max(0.0, wait - thr) / wall, 3) if wall > 0 else None}
        return out


class Switcher:
    """``--ab``: inside one running job, turn host S's straggler on and off in phases of ``phase_s`` seconds.

    ``cycle``: the phases' cuts in turn, e.g. ``[None, 1.25, None, 2.0]`` (None: balanced; ``[2.0]``: host S at 1/2 for
    the whole job, the slowed profile of ``--slow-by quota --ab``); ``log`` gets ``(time.perf_counter(), F)`` at
    every switch (F None: balanced), on the clock of ``train.py``'s ``train_window_perf_counter_s``.  With
    ``mode`` "shares" the job's busy neighbour on host S's core (group ``nb<S>``, started by ``CpuBudget``) gets
    ``cpu.shares`` ``neighbour_weight(F, base)`` and runs; balanced, it is stopped (SIGSTOP: not runnable at all,
    the balanced job exactly) or, with a ``base`` weight, runs at that.  With "quota" host S's group gets
    ``cpu.cfs_period_us`` ``period_us`` and a quota of ``period_us / F`` (balanced: none).  Balanced and slowed
    steps then come from one process, interleaved within seconds: launch-to-launch differences and drifting
    load fall on both alike (not the load's larger toll on the slowed host at 1/2: docs/stragglers.md,
    "Fourteenth")."""

    def __init__(self, prefix: str, host: int, cycle: list[float | None], phase_s: float, mode: str = "shares",
                 base: int = 0, period_us: int = 10000, slice_us: float = 0.0) -> None:
        import threading
        self.glob = f"{prefix}-{os.getpid()}-*"
        self.host, self.cycle, self.phase_s, self.mode, self.base, self.period_us = host, cycle, phase_s, mode, base, period_us
        #: mode "shares", > 0: the neighbour's scheduler slice (``set_slice``), set once it runs
        self.slice_us = slice_us
        self.log: list[tuple[float, float | None]] = []
        #: at every switch, the machine's CPU time so far (``/proc/stat``'s first line: user nice system idle iowait
        #: irq softirq steal, in 1/100 s): what the rest of the machine did in each phase, softirq included
        self.proc_stat: list[list[int]] = []
        #: at every switch, per group of the job (``host<i>``, ``nb<S>``) every thread's ``/proc/<tid>/schedstat``
        #: ``[CPU ns, run-queue wait ns, times run]``: the slowed host's training thread and gloo's threads per phase
        self.threads: list[dict[str, dict[str, list[int]]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Switcher":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _set(self, g: Path, F: float | None) -> None:
        import signal
        from dpro_kit.jobs import neighbour_weight
        if self.mode == "quota":
            (g / "cpu.cfs_period_us").write_text(str(self.period_us))
            (g / "cpu.cfs_quota_us").write_text("-1" if F is None else str(int(round(self.period_us / F))))
            return
        pids = [int(x) for x in (g / "cgroup.procs").read_text().split()]
        if F is None and not self.base:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            return
        (g / "cpu.shares").write_text(str(neighbour_weight(F or 1.0, self.base)))
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    def _run(self) -> None:
        # a real-time thread (a few microseconds of work per phase): at the normal priority it starves beside the
        # job's groups (cpu.shares 262144 on both cores) and switched 5 times in a 44 s job (/tmp/strag11/h2-200-sh)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))     # 0: this thread
        except (OSError, AttributeError):
            pass
        name = f"nb{self.host}" if self.mode == "shares" else f"host{self.host}"
        root = Path("/sys/fs/cgroup/cpu")
        g = None
        while g is None and not self._stop.is_set():
            hits = [x for x in root.glob(f"{self.glob}/{name}") if self.mode == "quota" or (x / "cgroup.procs").read_text().strip()]
            g = hits[0] if hits else None
            if g is None:
                self._stop.wait(0.02)
        if g is not None and self.slice_us and self.mode == "shares":
            for pid in (g / "cgroup.procs").read_text().split():
                set_slice(int(pid), self.slice_us)
        cycle = self.cycle
        i = 0
        while g is not None and not self._stop.is_set():
            F = cycle[i % len(cycle)]
            try:
                self._set(g, F)
            except OSError:          # the job ended and its groups went
                break
            self.log.append((time.perf_counter(), F))
            try:
                self.proc_stat.append([int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]])
            except (OSError, ValueError):
                self.proc_stat.append([])
            self.threads.append(group_threads(g.parent))
            i += 1
            self._stop.wait(self.phase_s)


def set_slice(pid: int, us: float) -> None:
    """Give a SCHED_OTHER thread its own scheduler slice (EEVDF, Linux >= 6.12: ``sched_setattr``'s ``sched_runtime``, the kernel
    clamps it to 0.1-100 ms; ``/proc/<pid>/sched`` ``se.slice``).  ``--neighbour-slice-us``: a busy neighbour with a short slice
    gives the core back sooner to a host thread that wakes (its default slice here: 1.4 ms)."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    # struct sched_attr, first version (48 bytes): size, policy, flags, nice, priority, runtime, deadline, period
    buf = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, 0, 0, 0, 0, int(us * 1000), 0, 0))
    if libc.syscall(314 if os.uname().machine == "x86_64" else 274, pid, buf, 0) != 0:   # SYS_sched_setattr
        e = ctypes.get_errno()
        raise OSError(e, f"sched_setattr({pid}, slice {us:g} us): {os.strerror(e)}")


def group_threads(parent: Path) -> dict[str, dict[str, list[int]]]:
    """Per cgroup under ``parent`` (a job's ``CpuBudget`` group: ``host<i>``, ``nb<S>``), every thread's
    ``/proc/<tid>/schedstat``: ``{group: {tid: [CPU ns, run-queue wait ns, times run]}}`` (threads that went are left out)."""
    out: dict[str, dict[str, list[int]]] = {}
    try:
        groups = sorted(x for x in parent.iterdir() if x.is_dir())
    except OSError:
        return out
    for g in groups:
        th: dict[str, list[int]] = {}
        try:
            tids = (g / "tasks").read_text().split()
        except OSError:
            continue
        for tid in tids:
            try:
                th[tid] = [int(x) for x in Path(f"/proc/{tid}/schedstat").read_text().split()]
            except (OSError, ValueError):
                continue
        out[g.name] = th
    return out


def phase_threads(log: list[tuple[float, float | None]], threads: list[dict[str, dict[str, list[int]]]],
                  proc_stat: list[list[int]] | None = None) -> list[dict[str, Any]]:
    """``--ab``: per phase (between two switches of ``log``), per group, what its threads did, as fractions of the phase's
    wall time: ``main_cpu`` / ``main_wait`` (the thread with the most CPU in that phase: the training thread; its CPU
    and its wait for a core), ``main_runs_per_s`` (times it was put on a core: wake-ups and preemptions), ``other_cpu``
    (the group's other threads: gloo's); with ``proc_stat`` the machine's ``softirq`` and ``busy`` (all but idle and
    iowait) in CPUs, ``steal`` (a virtual machine's CPUs given to others).

    >>> log = [(0.0, None), (1.0, 2.0), (2.0, None)]
    >>> th = [{"host1": {"7": [0, 0, 0], "8": [0, 0, 0]}}, {"host1": {"7": [500_000_000, 10_000_000, 100], "8": [100_000_000, 0, 50]}},
    ...       {"host1": {"7": [900_000_000, 510_000_000, 300], "8": [300_000_000, 0, 90]}}]
    >>> phase_threads(log, th)
    [{'F': None, 's': 1.0, 'host1': {'main_cpu': 0.5, 'main_wait': 0.01, 'main_runs_per_s': 100.0, 'other_cpu': 0.1}}, {'F': 2.0, 's': 1.0, 'host1': {'main_cpu': 0.4, 'main_wait': 0.5, 'main_runs_per_s': 200.0, 'other_cpu': 0.2}}]
    """
    out: list[dict[str, Any]] = []
    for i in range(min(len(log), len(threads)) - 1):
        dt = log[i + 1][0] - log[i][0]
        if dt <= 0:
            continue
        ph: dict[str, Any] = {"F": log[i][1], "s": round(dt, 4)}
        a, b = threads[i], threads[i + 1]
        for g in sorted(set(a) & set(b)):
            d = {t: [y - x for x, y in zip(a[g][t], b[g][t])] for t in set(a[g]) & set(b[g])}
            if not d:
                continue
            main = max(d, key=lambda t: d[t][0])
            ph[g] = {"main_cpu": round(d[main][0] / 1e9 / dt, 4), "main_wait": round(d[main][1] / 1e9 / dt, 4),
                     "main_runs_per_s": round(d[main][2] / dt, 1),
                     "other_cpu": round(sum(v[0] for t, v in d.items() if t != main) / 1e9 / dt, 4)}
        if proc_stat and i + 1 < len(proc_stat) and len(proc_stat[i]) >= 7 and len(proc_stat[i + 1]) >= 7:
            p, q = proc_stat[i], proc_stat[i + 1]
            dd = [y - x for x, y in zip(p, q)]
            ph["softirq"] = round(dd[6] / 100 / dt, 3)
            ph["steal"] = round(dd[7] / 100 / dt, 3) if len(dd) > 7 else 0.0
            ph["busy"] = round((sum(dd) - dd[3] - dd[4]) / 100 / dt, 3)
        out.append(ph)
    return out


def ab_split(doc: dict[str, Any], log: list[tuple[float, float | None]], settle: int = 1
             ) -> tuple[dict[float | None, list[float]], list[tuple[float | None, float]]]:
    """The steps of an ``--ab`` job by phase: ``{F: [ms, ...]}`` (None: balanced) and per phase ``(F, median ms)`` in order.

    Each rank's measured steps are back to back from its ``train_window_perf_counter_s`` start (``train.py``), so
    step k runs from ``start + sum(times[:k])``; a step counts for a phase when it lies wholly between two switches
    (``log``) and is not one of the phase's first ``settle`` steps.  A step's time is the slowest rank's (the ranks
    meet in every allreduce); it is placed by rank 0's clock.
    >>> doc = {"iteration_times_s": {"0": [0.1] * 10, "1": [0.1] * 5 + [0.2] * 5},
    ...        "train_window_perf_counter_s": {"0": [10.0, 11.0], "1": [10.0, 11.5]}}
    >>> steps, phases = ab_split(doc, [(9.0, None), (10.45, 2.0), (10.75, None)], settle=0)
    >>> steps
    {None: [100.0, 100.0, 100.0, 100.0, 200.0, 200.0], 2.0: [200.0, 200.0]}
    >>> phases
    [(None, 100.0), (2.0, 200.0), (None, 200.0)]
    """
    times = {int(r): ts for r, ts in doc["iteration_times_s"].items()}
    start = float(doc["train_window_perf_counter_s"]["0"][0])
    n = min(len(ts) for ts in times.values())
    out: dict[float | None, list[float]] = {}
    phases: list[tuple[float | None, float]] = []
    t = start
    ends = [x for x, _ in log[1:]] + [float("inf")]
    j, kept = -1, 0
    cur: list[float] = []
    for k in range(n):
        a, b = t, t + times[0][k]
        t = b
        while j + 1 < len(log) and log[j + 1][0] <= a:
            if cur:
                phases.append((log[j][1], statistics.median(cur)))
            j, kept, cur = j + 1, 0, []
        if j < 0 or b > ends[j]:
            continue
        kept += 1
        if kept <= settle:
            continue
        ms = max(ts[k] for ts in times.values()) * 1e3
        out.setdefault(log[j][1], []).append(round(ms, 3))
        cur.append(ms)
    if cur:
        phases.append((log[j][1], statistics.median(cur)))
    return out, phases


def phase_ratios(phases: list[tuple[float | None, float]]) -> dict[float, list[float]]:
    """``--ab``: per cut, each of its phases' median step over the mean of the balanced phases on either side (how much
    one phase of a few seconds says; ``ab_split``'s second result).

    >>> phase_ratios([(None, 50.0), (2.0, 80.0), (None, 30.0), (1.5, 45.0)])
    {2.0: [2.0]}
    """
    out: dict[float, list[float]] = {}
    for i in range(1, len(phases) - 1):
        (fa, a), (f, m), (fb, b) = phases[i - 1], phases[i], phases[i + 1]
        if f is not None and fa is None and fb is None:
            out.setdefault(f, []).append(round(2 * m / (a + b), 4))
    return out


def ab_summary(dirs: list[Path], at_ms: tuple[float, ...] = (42.0, 50.0)) -> int:
    """``--ab-summary RUN ...``: every cut phase of the ``--ab`` jobs kept in these runs (``*/ab.json``) over the mean of
    the balanced phases either side, per cut: the median and p10-p90 of those ratios, and their least-squares line
    against that balanced step time (how busy the rest of the machine was shows in it), read at ``at_ms``."""
    pts: dict[float, list[tuple[float, float]]] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("*/ab.json")):
            ph = json.loads(f.read_text())["phases"]
            for i in range(1, len(ph) - 1):
                (fa, a), (F, m), (fb, b) = ph[i - 1], ph[i], ph[i + 1]
                if F is not None and fa is None and fb is None:
                    pts.setdefault(F, []).append(((a + b) / 2, 2 * m / (a + b)))
    print("| cut | phases | ratio median (p10-p90) | balanced phases (ms) | slope per 10 ms | r | "
          + " | ".join(f"line at {x:g} ms" for x in at_ms) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(at_ms))
    for F in sorted(pts):
        xs = [x for x, _ in pts[F]]
        ys = sorted(y for _, y in pts[F])
        n = len(ys)
        if n < 3:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        vx = sum((x - mx) ** 2 for x in xs)
        vy = sum((y - my) ** 2 for y in ys)
        cov = sum((x - mx) * (y - my) for x, y in pts[F])
        k = cov / vx if vx else 0.0
        r = cov / (vx * vy) ** 0.5 if vx and vy else 0.0
        print(f"| 1/{F:g} | {n} | {statistics.median(ys):.3f} ({ys[n // 10]:.3f}-{ys[9 * n // 10]:.3f}) | "
              f"{min(xs):.1f}-{max(xs):.1f} | {10 * k:+.3f} | {r:.2f} | "
              + " | ".join(f"{my + k * (x - mx):.3f}" for x in at_ms) + " |")
    ab_threads_table(dirs)
    return 0


def ab_threads_table(dirs: list[Path]) -> None:
    """``--ab-summary``, jobs with a thread record (``ab.json`` ``threads``): per cut, medians over its phases of the
    step (phase time / rank 0's steps in it) and, per step, the slowed host's training thread's CPU and wait for a core,
    that wait beyond ``(F - 1)`` x its CPU (what a thread runnable throughout at ``1/F`` of its core waits; with a base
    neighbour of weight b, ``ab.json`` ``base``, ``F (1024 + b) / 1024 - 1``), the times it was put on a core, its other threads' CPU, host0's training thread's, and the machine's softirq and
    busy CPUs (``phase_threads``)."""
    rows: dict[float | None, list[dict[str, float]]] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("*/ab.json")):
            ab = json.loads(f.read_text())
            if not ab.get("threads"):
                continue
            doc = json.loads((f.parent / "times.json").read_text())
            t, ends = float(doc["train_window_perf_counter_s"]["0"][0]), []
            for x in doc["iteration_times_s"]["0"]:
                t += x
                ends.append(t)
            log = [(float(x), F) for x, F in ab["log"]]
            k0 = (1024 + int(ab.get("base") or 0)) / 1024     # 1 / the host's share of its core in the balanced job
            for i, ph in enumerate(phase_threads(log, ab["threads"], ab.get("proc_stat"))):
                a, b = log[i][0], log[i][0] + ph["s"]
                n = sum(1 for e in ends if a < e <= b)
                nbs = [g for g in ph if g.startswith("nb")]
                S = f"host{nbs[0][2:]}" if nbs else None
                if n < 3 or S not in ph or "host0" not in ph:
                    continue
                per = ph["s"] * 1e3 / n
                rows.setdefault(ph["F"], []).append({
                    "step": per, "cpu": ph[S]["main_cpu"] * per, "wait": ph[S]["main_wait"] * per,
                    # a thread runnable throughout at a share s of its core waits (1/s - 1) x its CPU (1/s = F without a
                    # base neighbour, F (1024 + base) / 1024 with one); the rest is other waiting
                    "beyond": (ph[S]["main_wait"] - ((ph["F"] or 1.0) * k0 - 1.0) * ph[S]["main_cpu"]) * per,
                    "runs": ph[S]["main_runs_per_s"] * per / 1e3, "other": ph[S]["other_cpu"] * per,
                    "cpu0": ph["host0"]["main_cpu"] * per, "wait0": ph["host0"]["main_wait"] * per,
                    "other0": ph["host0"]["other_cpu"] * per,
                    "softirq": ph.get("softirq", float("nan")), "steal": ph.get("steal", float("nan")),
                    "busy": ph.get("busy", float("nan"))})
    if not rows:
        return
    print("\nper step, medians over the phases (ms; softirq and busy: the machine's CPUs):")
    print("| cut | phases | step | slowed host: training thread CPU | its wait for a core | wait beyond its share | times run "
          "| other threads' CPU "
          "| host0: training thread CPU | wait | other threads | softirq | steal | busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for F in sorted(rows, key=lambda x: 0.0 if x is None else x):
        v = rows[F]
        m = {k: statistics.median(r[k] for r in v) for k in v[0]}
        print(f"| {'balanced' if F is None else f'1/{F:g}'} | {len(v)} | {m['step']:.2f} | {m['cpu']:.2f} | {m['wait']:.2f} | {m['beyond']:.2f} | "
              f"{m['runs']:.1f} | {m['other']:.2f} | {m['cpu0']:.2f} | {m['wait0']:.2f} | {m['other0']:.2f} | "
              f"{m['softirq']:.3f} | {m['steal']:.3f} | {m['busy']:.3f} |")


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = a.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "jobs.log", "a")
        self.n = 0
        self.jobs: list[dict[str, Any]] = []

    def job(self, model: str, rates: list[float], cpus: list[float | None], profile: bool,
            neighbours: dict[int, int] | None = None) -> dict[str, Any]:
        """One real job; the slowest rank's median iteration (ms), and its trace when profiled."""
        a = self.a
        self.n += 1
        tag = f"{self.n:03d}-{model}-{'prof' if profile else 'plain'}"
        jdir = self.out / tag
        jdir.mkdir()
        times = jdir / "times.json"
        iters = a.iters if not profile else a.prof_start + a.prof_steps + 3 - a.warmup
        argv = [PY, str(TRAIN), "--model", model, "--batch-size", str(BATCH[model]), "--threads", "1",
                "--warmup", str(a.warmup), "--iters", str(iters), "--quiet", "--json-out", str(times),
                "--backend", "gloo", "--pin", "none"]
        if a.bucket_mb:
            argv += ["--bucket-mb", f"{a.bucket_mb:g}"]
        env = dict(DPRO_QUIET="1", PYTHONPATH=os.pathsep.join(
            [str(ROOT / "collectors" / "torch"), str(ROOT / "collectors" / "common"), str(ROOT),
             os.environ.get("PYTHONPATH", "")]))
        trace = jdir / "trace"
        poll = SchedPoll(a.prefix) if a.sched else None
        if poll:
            poll.__enter__()
        try:
            res = run_job(argv, hosts=len(cpus), ranks_per_host=1, rate_mbit=rates,
                      cpus_per_host=None if all(c is None for c in cpus) else cpus,   # None: pinned, no quota
                      cpu_period_us=a.period_us, cpu_shares=a.shares, cpusets=a.pin_layout,
                      neighbours=neighbours, profile=trace if profile else None,
                      steps=f"{a.prof_start}:{a.prof_start + a.prof_steps}", env=env, log=self.log,
                      timeout=a.job_timeout, prefix=a.prefix)
        finally:
            if poll:
                poll.__exit__()
        if not times.exists() or (profile and not (trace / "manifest.json").exists()):
            raise RuntimeError(f"job {tag} failed (exit codes {res.codes}); see {self.out / 'jobs.log'}")
        doc = json.loads(times.read_text())
        per_rank = {int(r): ts for r, ts in doc["iteration_times_s"].items()}
        row = {"tag": tag, "ms": max(statistics.median(ts) for ts in per_rank.values()) * 1e3,
               "per_rank_ms": {r: round(statistics.median(ts) * 1e3, 3) for r, ts in per_rank.items()}}
        if profile:
            row["trace"] = str(trace)
        if poll:
            # the training window of each host: its rank's measured iterations (after the warm-up), where train.py
            # recorded them on the monotonic clock; else their length, ending where the main thread stops computing
            wins = doc.get("train_window_perf_counter_s") or {}
            win = {f"host{r}": (tuple(wins[str(r)]) if wins.get(str(r)) else sum(ts)) for r, ts in per_rank.items()}
            row["sched"] = poll.summary(win)
            print(f"    {tag} wait for a core (fraction of training): " + ", ".join(
                f"{h} {v['core_wait_frac']} (throttled {v['throttled_ms']:.0f} ms of {v['window_ms']:.0f})"
                for h, v in sorted(row["sched"].items())), flush=True)
        self.jobs.append(dict(row, rates=rates, cpus=[None if c is None else round(c, 4) for c in cpus],
                              cpusets=a.pin_layout, neighbours=neighbours))
        (self.out / "jobs.json").write_text(json.dumps(self.jobs, indent=1))
        return row

    @staticmethod
    def replay(trace: str, extra: list[str]) -> dict[str, Any]:
        cmd = DPRO + ["replay", trace, "--json", "-q", "-n", "3", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"dpro replay failed: {' '.join(cmd[2:])}: {p.stderr.strip()[-500:]}")
        return json.loads(p.stdout)


BUSY_LOOP = ("import time\nend = time.perf_counter() + {secs}\nn = 0\n"
             "while time.perf_counter() < end:\n    for _ in range(2000):\n        pass\n    n += 1\nprint(n)")


def busy_speed(cpus: float | None, period_us: int, shares: int, secs: float = 1.5, prefix: str = "strg",
               cpuset: str | None = None, neighbour: int | None = None) -> float:
    """Work a single busy thread gets done per second in a cgroup with a quota of ``cpus`` CPUs
    (None: no quota; on the cores of ``cpuset`` when given, beside a busy neighbour of that
    ``cpu.shares`` when given)."""
    from dpro_kit.jobs import CpuBudget
    with CpuBudget(1, None if cpus is None else [cpus], prefix=prefix + "cal", period_us=period_us, shares=shares,
                   cpusets=[cpuset] if cpuset is not None else None,
                   neighbours={0: neighbour} if neighbour else None) as cb:
        p = subprocess.run([PY, "-c", BUSY_LOOP.format(secs=secs)], capture_output=True, text=True,
                           preexec_fn=cb.preexec(0), timeout=60)
    return int(p.stdout) / secs


def effective_cuts(cuts: list[float], cpus: float, period_us: int, shares: int, reps: int,
                   prefix: str = "strg", cpuset: str | None = None) -> dict[float, list[float]]:
    """The compute factor each budget cut really gives: busy-loop speed at ``cpus`` / at ``cpus / F``.

    A CFS quota is enforced at the scheduler tick (HZ=250 here: 4 ms), so a group may overrun its
    quota within a period: a cut budget slows a CPU-bound thread by less than its nominal F (e.g.
    0.8 CPU runs a busy loop at ~0.87-0.90 of 1.0 CPU's speed).  Measured in alternation (balanced,
    cut, balanced, ...) ``reps`` times, beside the jobs; the ratio of each adjacent pair.
    """
    out: dict[float, list[float]] = {F: [] for F in cuts}
    for _ in range(reps):
        for F in cuts:
            b1 = busy_speed(cpus, period_us, shares, prefix=prefix, cpuset=cpuset)
            c = busy_speed(cpus / F, period_us, shares, prefix=prefix, cpuset=cpuset)
            b2 = busy_speed(cpus, period_us, shares, prefix=prefix, cpuset=cpuset)
            out[F].append(round(0.5 * (b1 + b2) / c, 4))
    return out


def effective_shares_cuts(cuts: list[float], base: int, period_us: int, shares: int, reps: int, prefix: str,
                          cpuset: str, secs: float = 3.0) -> dict[float, list[float]]:
    """``--slow-by shares``: the compute factor each neighbour weight really gives a busy thread on
    the slowed host's core: its speed beside the balanced job's neighbour (``base``; 0: alone) over
    its speed beside the cut's (``neighbour_weight(F, base)``), in alternation like
    :func:`effective_cuts`."""
    from dpro_kit.jobs import neighbour_weight
    out: dict[float, list[float]] = {F: [] for F in cuts}
    for _ in range(reps):
        for F in cuts:
            b1 = busy_speed(None, period_us, shares, secs, prefix, cpuset, base or None)
            c = busy_speed(None, period_us, shares, secs, prefix, cpuset, neighbour_weight(F, base))
            b2 = busy_speed(None, period_us, shares, secs, prefix, cpuset, base or None)
            out[F].append(round(0.5 * (b1 + b2) / c, 4))
    return out


BURSTS = ("import json, time\nwork = {work}\ndef burst():\n    n = 0\n    for _ in range(work):\n        n += 1\n"
          "for _ in range(3):\n    burst()\nout = []\nend = time.perf_counter() + {secs}\n"
          "while time.perf_counter() < end:\n    t = time.perf_counter()\n    burst()\n    out.append(time.perf_counter() - t)\n"
          "    time.sleep({sleep})\nprint(json.dumps(out))")


def burst_probe(emulations: list[tuple[str, float]], burst_ms: float = 17.0, sleep_ms: float = 25.0, secs: float = 2.5,
                prefix: str = "strg", cpuset: str = "1", period_us: int = 10000, shares: int = 262144
                ) -> list[dict[str, Any]]:
    """``--probe``: does a CPU cut behave like a slower CPU for a thread that computes and then waits?

    A thread on ``cpuset`` alternates a fixed amount of pure-Python work (``burst_ms`` when alone) with a
    ``sleep_ms`` sleep (the training thread's compute and its wait for the allreduce: 17 and 25 ms on 2 hosts at
    200 Mbit/s), ``secs`` seconds per emulation; a CPU that is F times slower makes every burst exactly F times as
    long.  Emulations: ``("alone", 1)``; ``("shares", F)``: a busy neighbour of ``neighbour_weight(F)`` on the core
    (the ``--slow-by shares`` cut); ``("quota", F)``: no neighbour, the thread's group at ``1/F`` CPU with
    ``cpu.cfs_period_us`` = ``period_us`` (``("quota2ms", F)``: 2 ms, the shortest a 1/2 quota allows — the
    kernel refuses quotas under 1 ms).  Returns per emulation the bursts' median over the alone median
    (``ratio``), their p10 / p90 and the bursts' count."""
    from dpro_kit.jobs import CpuBudget, neighbour_weight
    rows: list[dict[str, Any]] = []
    alone = None
    work = 0
    for kind, F in emulations:
        if not work:      # calibrate the burst alone on the core: the loop's speed at 1 ms bursts, scaled to burst_ms
            with CpuBudget(1, None, prefix=prefix + "prb", shares=shares, cpusets=[cpuset]) as cb:
                p = subprocess.run([PY, "-c", BURSTS.format(work=50_000, secs=0.5, sleep=0.001)], capture_output=True,
                                   text=True, preexec_fn=cb.preexec(0), timeout=120)
            work = max(1000, int(50_000 * burst_ms / 1e3 / min(json.loads(p.stdout))))
            code = BURSTS.format(work=work, secs=secs, sleep=sleep_ms / 1e3)
        per = {"quota": period_us, "quota2ms": 2000}.get(kind, period_us)
        with CpuBudget(1, [1.0 / F] if kind.startswith("quota") and F != 1 else None, prefix=prefix + "prb",
                       period_us=per, shares=shares, cpusets=[cpuset],
                       neighbours={0: neighbour_weight(F)} if kind == "shares" and F != 1 else None) as cb:
            p = subprocess.run([PY, "-c", code], capture_output=True, text=True, preexec_fn=cb.preexec(0), timeout=120)
        b = sorted(x * 1e3 for x in json.loads(p.stdout))
        med = statistics.median(b)
        if alone is None:
            alone = med
        rows.append({"emulation": kind, "F": F, "period_us": per if kind.startswith("quota") else None,
                     "bursts": len(b), "median_ms": round(med, 2), "ratio": round(med / alone, 4),
                     "p10_ratio": round(b[len(b) // 10] / alone, 4), "p90_ratio": round(b[9 * len(b) // 10] / alone, 4)})
        print(f"  probe {kind:<8} F={F:<5g} bursts {len(b):3d}: median {med:7.2f} ms = x{med / alone:.3f} "
              f"(p10 x{rows[-1]['p10_ratio']:.3f}, p90 x{rows[-1]['p90_ratio']:.3f})", flush=True)
    return rows


def cpu_share_factor(trace: str, node: str, f: float, share: float = 1.0) -> tuple[float, dict[str, float]]:
    """``--slow-by shares``: the factor for ``--slow-rank`` that charges the rank's whole CPU time to
    its traced computation (docs/stragglers.md, "Ninth run").

    Beside a busy neighbour every thread of the host gets 1/f of its core, not only the traced ops:
    gloo's threads, the framework between ops and the collector's work share the host's slice on
    the same core.  With ``share`` the part of its core the host gets in the balanced job while it
    runs (1 alone on it; ``1024 / (1024 + base)`` beside ``--neighbour-base``), its CPU time per
    iteration C (the collector's ``cpu_use.cpus`` x the node's unprofiled iteration, both in the
    balanced profile's manifest) costs it C / share of wall time, which the cut stretches by f: the
    host spends ``(f - 1) C / share`` more per iteration.  Charged to the traced computation W
    (median over the profiled iterations of its computation events, wall time)::

        f' = 1 + (f - 1) max(C / share, W) / W
    """
    from dpro_kit.trace import load_trace
    m = json.loads((Path(trace) / "manifest.json").read_text()).get("extra", {})
    cpus = (m.get("cpu_use") or {}).get(node, {}).get("cpus")
    step = (m.get("measured_iteration_ms_per_node") or {}).get(node)
    ev = load_trace(trace).events
    ev = ev[(ev["node"].astype(str) == node) & ev["kind"].astype(str).isin(COMPUTE_KINDS)]
    w = statistics.median(g["dur"].sum() for _, g in ev.groupby("iteration")) / 1e3 if len(ev) else 0.0
    if not (cpus and step and w > 0):
        raise RuntimeError(f"{trace}: no CPU record (extra.cpu_use, measured_iteration_ms_per_node) or computation "
                           f"of {node}; the cpu-share factor needs both")
    c = cpus * step
    return 1.0 + (f - 1.0) * max(c / share, w) / w, {"cpu_ms": round(c, 3), "compute_ms": round(w, 3), "share": share}


def prof_args(trace: str, s: int, f: float, rate: float, base: int = 0) -> list[str]:
    """Model "prof": ``--slow-host hostS=F --wire-mbps <rate>`` with how busy the host was taken from the balanced
    profile itself (the collector's process CPU plus its training thread's wait for a core, ``dpro_kit.whatif.
    host_cpu_split``); on a trace without the thread record and a base neighbour, ``--cpu-share`` says the half
    core it had (docs/stragglers.md, "Thirteenth")."""
    args = ["--slow-host", f"host{s}={f:.4g}", "--wire-mbps", f"{rate:g}"]
    if base and (cpu_use(trace).get(f"host{s}/{s}") or {}).get("thread_wait") is None:
        args += ["--cpu-share", f"host{s}={1024 / (1024 + base):.4g}"]
    return args


def busy_fraction(scheds: list[dict[str, dict]], host: str) -> float | None:
    """The part of its iteration ``host``'s training thread was runnable (running, or ready and waiting
    for its core or stopped by its quota) in the balanced jobs without the profiler: median over their
    ``--sched`` records of ``(CPU + run-queue wait) / training window``, at most 1.  ``dpro replay
    --slow-host H=F --host-busy H=B`` takes it instead of the collector's CPU record (docs/stragglers.md,
    "Eleventh run"); None without records."""
    v = [min(1.0, (x["main_cpu_ms"] + x["main_wait_ms"]) / x["window_ms"])
         for sc in scheds if sc and (x := sc.get(host)) and x.get("window_ms")]
    return round(statistics.median(v), 4) if v else None


def balanced_scheds(jobs: list[dict], rate: float) -> list[dict]:
    """The ``--sched`` records of a run's balanced plain jobs at ``rate`` (``--out/jobs.json``): every host at
    that rate, no quota, and the lightest neighbour the run's plain jobs had (none, or ``--neighbour-base``)."""
    plain = [j for j in jobs if j["tag"].endswith("-plain") and all(r == rate for r in j["rates"])
             and all(c is None for c in j["cpus"]) and j.get("sched")]
    weight = lambda j: sum((j.get("neighbours") or {}).values())     # noqa: E731
    least = min((weight(j) for j in plain), default=0)
    return [j["sched"] for j in plain if weight(j) == least]


def cpu_use(trace: str) -> dict[str, Any]:
    """The profiled job's per-rank CPU use (manifest extra.cpu_use: CPUs per step, throttled us, limit)."""
    try:
        return json.loads((Path(trace) / "manifest.json").read_text()).get("extra", {}).get("cpu_use") or {}
    except (OSError, ValueError):
        return {}


def repredict(rows_file: Path, only: str | None = None, predictors: str | None = None) -> int:
    """Predictions of an earlier run's rows (its kept traces, its replay arguments) with this code."""
    rows = json.loads(rows_file.read_text())
    jobs_file = rows_file.parent / "jobs.json"
    jobs = json.loads(jobs_file.read_text()) if jobs_file.exists() else []
    base: dict[str, dict] = {}
    errs = []
    print("| Mbit/s | injected | predicted then | predicted now | measured | error now |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if only is not None and r["direction"] != only:
            continue
        traces = r.get("traces") or [r["trace"]]     # this bench's rows: every balanced profile
        for t in traces if r["direction"] != "fix" else []:
            if t not in base:
                base[t] = Bench.replay(t, [])
        t = traces[0]
        note = ""
        if r["direction"] == "slow":
            # every model the run predicted the row with (CFS what-if, busy-loop factor, link), else its one
            keys = ("replay_args_cfs", "replay_args_prof", "replay_args_paced", "replay_args_busy", "replay_args_host", "replay_args_cpu", "replay_args_factor", "replay_args_nominal",
                    "replay_args_link")
            extra_args = {}
            if r.get("slow_by") == "shares" and r["injected"].startswith("cpu host"):
                # the "busy" model on a run that predates it: --host-busy from the run's balanced plain jobs
                s_ = int(r["injected"].split("host", 1)[1].split()[0])
                F_ = float(r["injected"].rsplit("/", 1)[1])
                b_ = busy_fraction(balanced_scheds(jobs, r["rate"]), f"host{s_}")
                if not r.get("replay_args_prof"):
                    # the run's base neighbour (--neighbour-base): the lightest one its balanced plain jobs had
                    base_nb = min((sum((j.get("neighbours") or {}).values()) for j in jobs
                                   if j["tag"].endswith("-plain") and all(x == r["rate"] for x in j["rates"])),
                                  default=0)
                    extra_args["replay_args_prof"] = " | ".join(" ".join(prof_args(t_, s_, F_, r["rate"], base_nb))
                                                                for t_ in traces)
                if b_ is not None and not r.get("replay_args_paced"):
                    extra_args["replay_args_paced"] = (f"--slow-host host{s_}={F_:g} --host-busy host{s_}={b_:.4g} "
                                                       f"--wire-mbps {r['rate']:g}")
                if b_ is not None and not r.get("replay_args_busy"):
                    extra_args["replay_args_busy"] = f"--slow-host host{s_}={F_:g} --host-busy host{s_}={b_:.4g}"
                    if r.get("effective_factor"):
                        f_ = statistics.median(r["effective_factor"])
                        extra_args["replay_args_busy_cal"] = f"--slow-host host{s_}={f_:.4g} --host-busy host{s_}={b_:.4g}"
            for key in [k for k in keys if r.get(k)] + list(extra_args) or ["replay_args"]:
                if predictors and key != "replay_args" and key[len("replay_args_"):] not in predictors.split(","):
                    continue
                args = r.get(key) or extra_args[key]
                ratios, all_its = [], []
                # the cpu-share factor differs per profile: "ARGS | ARGS | ..." (one per trace)
                per_args = args.split(" | ") if " | " in args else [args] * len(traces)
                for t_, args_ in zip(traces, per_args):
                    d = Bench.replay(t_, args_.split())
                    ratios.append(d["iteration_time_ms"] / base[t_]["iteration_time_ms"])
                    all_its.append(all_iterations_ratio(base[t_], d))
                then = r.get("predicted_slowdown_" + key[len("replay_args_"):], float("nan")) \
                    if key != "replay_args" else r["predicted_slowdown"]
                now, m = statistics.median(ratios), r["measured_slowdown"]
                if None not in all_its:
                    a_ = statistics.median(all_its)
                    note = f" (all iterations: {a_:.3f}, {100 * (a_ / m - 1):+.1f} %)"
                errs.append(abs(now / m - 1))
                print(f"| {r['rate']:g} | slow {r['injected']} `{args}`{note} | {then:.3f} | {now:.3f} | {m:.3f} | "
                      f"{100 * (now / m - 1):+.1f} % |", flush=True)
            continue
        if r["direction"] == "fix":
            s = int(r["injected"].split("host", 1)[1].split()[0])
            per, firsts, per_host = [], [], []
            for t_ in traces:           # every slowed profile (--reverse-profiles), median of their fixes
                rep = Bench.replay(t_, ["--stragglers"])
                att = rep["stragglers"]
                per.append(fix_speedup(att, s, t_))
                firsts.append(att.get("first"))
                if r.get("slow_by") == "shares" and (not predictors or "prof" in predictors.split(",")):
                    per_host.append(fix_host(att, s, t_, r["rate"], rep,
                                             sum((r.get("neighbours") or {}).values())))
            now, then, m = statistics.median(per), r["predicted_speedup"], r["measured_speedup"]
            if m is None:
                continue
            if per_host:
                ph = statistics.median(x for x, _ in per_host)
                errs.append(abs(ph / m - 1))
                print(f"| {r['rate']:g} | fix {r['injected']}, the host's CPU back (`{' | '.join(a_ for _, a_ in per_host)}`) | "
                      f"{r.get('predicted_speedup_prof', float('nan')):.3f} | {ph:.3f} | {m:.3f} | {100 * (ph / m - 1):+.1f} % |",
                      flush=True)
            note = f" (first named: then {r.get('attribution_first')}, now {', '.join(map(str, firsts))})"
        else:
            now_ms = statistics.median(base[t_]["iteration_time_ms"] for t_ in traces)
            print(f"| {r['rate']:g} | balanced | {r['predicted_ms']:.3f} ms | {now_ms:.3f} ms | "
                  f"{r['measured_ms']:.3f} ms | {100 * (now_ms / r['measured_ms'] - 1):+.1f} % |")
            continue
        errs.append(abs(now / m - 1))
        print(f"| {r['rate']:g} | {r['direction']} {r['injected']}{note} | {then:.3f} | {now:.3f} | {m:.3f} | "
              f"{100 * (now / m - 1):+.1f} % |", flush=True)
    if errs:
        print(f"\n|error| median {100 * statistics.median(errs):.1f} %, max {100 * max(errs):.1f} % ({len(errs)} rows)")
    return 0


def sched_summary(jobs_file: Path) -> int:
    """The ``--sched`` records of a run's plain jobs (``--out/jobs.json``), per job configuration: medians
    over its rounds of each host's wait for a core, CPU and quota stops, as fractions of the training
    window (docs/stragglers.md, "Seventh run")."""
    groups: dict[tuple, list[dict]] = {}
    for j in json.loads(jobs_file.read_text()):
        if j["tag"].endswith("-plain") and j.get("sched"):
            groups.setdefault((tuple(j["cpus"]), tuple(j["rates"]), json.dumps(j.get("neighbours"))), []).append(j)
    print("| CPUs per host (busy neighbour: host: cpu.shares) | Mbit/s per host | jobs | median ms | per host: core wait / CPU / stopped (fractions of training) |")
    print("|---|---|---|---|---|")
    for (cpus, rates, nb), js in groups.items():
        cells = []
        for h in sorted({h for j in js for h in j["sched"]}):
            v = [j["sched"][h] for j in js if h in j["sched"] and j["sched"][h]["window_ms"]]
            cells.append(f"{h} {statistics.median(x['core_wait_frac'] for x in v):.3f} / "
                         f"{statistics.median(x['main_cpu_ms'] / x['window_ms'] for x in v):.3f} / "
                         f"{statistics.median(x['throttled_ms'] / x['window_ms'] for x in v):.3f}")
        print(f"| {', '.join('-' if c is None else f'{c:g}' for c in cpus)}{'' if nb == 'null' else ' (' + nb + ')'} | {', '.join(f'{r:g}' for r in rates)} | {len(js)} | "
              f"{statistics.median(j['ms'] for j in js):.1f} | " + "; ".join(cells) + " |")
    return 0


def all_iterations_ratio(base: dict, whatif: dict) -> float | None:
    """A what-if's slowdown over every profiled iteration, paired: sum of its per-iteration replays over
    the profiled job's (``dpro replay --json`` ``per_iteration_ms``); None with mean durations.  The
    what-ifs themselves replay the median iteration only (docs/stragglers.md, "Sixth")."""
    b, w = base.get("per_iteration_ms") or {}, whatif.get("per_iteration_ms") or {}
    common = [i for i in b if i in w]
    if len(common) < 2:
        return None
    return sum(w[i] for i in common) / sum(b[i] for i in common)


def fix_speedup(att: dict, rank: int, trace: str) -> float:
    """The predicted speed-up of fixing worker ``rank``: the attribution's ``baseline_ms / like_median_ms``
    (``dpro replay --stragglers``: its saving over all profiled iterations, dpro_kit.stragglers)."""
    for r in att.get("ranks", []):
        if r.get("rank") == rank and r.get("like_median_ms"):
            return float(att["baseline_ms"]) / float(r["like_median_ms"])
    raise SystemExit(f"{trace}: the attribution has no replayed row for rank {rank}")


def fix_host(att: dict, rank: int, trace: str, rate: float, slowed: dict,
             neighbour: int = 0) -> tuple[float, str]:
    """Reverse model "prof": the predicted speed-up of giving the slowed host back its CPU, every thread of it
    (``--slow-host hostS=1/F^ --wire-mbps <rate>`` on the slowed profile; ``dpro_kit.whatif.slow_hosts`` with F < 1:
    its computation and the CPU part of its CPU-paced transfers shrink, its wire-paced transfers keep their time).
    ``F^`` = the rank's traced computation over the median of the other workers' (the attribution's ``compute_ms``);
    ``slowed`` the slowed profile's own replay (``--json``).  Like the attribution's fix (``fix_speedup``) the
    speed-up is taken over every profiled iteration (``all_iterations_ratio``; the median iteration's alone
    where the replays have no per-iteration times); ``neighbour`` the cpu.shares of the busy neighbour beside the
    host in the slowed job: on a trace without the thread record ``--cpu-share`` says the part of its core it had
    (``1024 / (1024 + neighbour)``).  Returns the speed-up and the replay arguments."""
    comp = {r["rank"]: r["compute_ms"] for r in att.get("ranks", []) if r.get("compute_ms")}
    others = [v for k, v in comp.items() if k != rank]
    if rank not in comp or not others:
        raise SystemExit(f"{trace}: the attribution has no computation of rank {rank} or of another worker")
    f_hat = comp[rank] / statistics.median(others)
    args = ["--slow-host", f"host{rank}={1 / f_hat:.4g}", "--wire-mbps", f"{rate:g}"]
    if neighbour and (cpu_use(trace).get(f"host{rank}/{rank}") or {}).get("thread_wait") is None:
        args += ["--cpu-share", f"host{rank}={1024 / (1024 + neighbour):.4g}"]
    fixed = Bench.replay(trace, args)
    ratio = all_iterations_ratio(slowed, fixed)
    return (1.0 / ratio if ratio else slowed["iteration_time_ms"] / fixed["iteration_time_ms"]), " ".join(args)


def pct(x: float) -> float:
    return round(100.0 * x, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp")
    ap.add_argument("--rates", default="1000,200", help="link rates (Mbit/s), one row group each")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--slow-host", type=int, default=None, help="the host made slower (default: the last)")
    ap.add_argument("--cpus", type=float, default=0.8, help="balanced CPU budget per host")
    ap.add_argument("--period-us", type=int, default=10000)
    ap.add_argument("--shares", type=int, default=8192)
    ap.add_argument("--cuts", default="1.25,1.5,2", help="CPU-budget cuts F (host gets cpus/F)")
    ap.add_argument("--link-cuts", default="0.5", help="link-rate factors f (host's rate x f)")
    ap.add_argument("--reverse", type=float, default=1.5, help="profile the job with this cut and predict the fix (0: skip)")
    ap.add_argument("--reverse-profiles", type=int, default=1,
                    help="profile the slowed job of --reverse this many times (like --profiles: before the rounds and "
                         "after evenly spaced rounds; one: after the rounds); the predicted fix is the median over them")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prof-start", type=int, default=12)
    ap.add_argument("--prof-steps", type=int, default=12,
                    help="profiled steps per profile (the replay picks the median one; 6 moved predictions by +-7 %%)")
    ap.add_argument("--profiles", type=int, default=3,
                    help="profile the balanced job this many times (before the rounds and after evenly spaced "
                         "rounds); each prediction is the median over them")
    ap.add_argument("--sched", action="store_true",
                    help="record per host how long its training thread waited for a core (schedstat run-queue wait "
                         "less the group's throttled time) in every job's row (--out/jobs.json)")
    ap.add_argument("--pin", default=None, metavar="LAYOUT",
                    help="pin the hosts to cores (cgroup v1 cpuset): one cpu list per host, comma-separated, "
                         "ranges with '-' (0,0,1: host0 and host1 on CPU 0, host2 alone on CPU 1; 0-1,0,1 gives host0 "
                         "both); keep each core's quota sum <= 1 CPU")
    ap.add_argument("--slow-by", choices=("quota", "shares"), default="quota",
                    help="how a CPU cut F slows host S: quota (its CFS quota cut to cpus/F) or shares (needs --pin: no "
                         "quotas; a busy loop on host S's core whose cpu.shares gives the host 1/F of it; --cpus ignored)")
    ap.add_argument("--neighbour-base", type=int, default=0, metavar="W",
                    help="--slow-by shares: cpu.shares of a busy neighbour on host S's core already in the balanced job "
                         "(0: none; 1024 with 3 hosts on 2 cores, --pin 0,0,1, gives host2 the half core the others get)")
    ap.add_argument("--ab", type=float, default=0.0, metavar="SECS",
                    help="measure every CPU cut inside each plain job: host S's straggler switched on and off in phases "
                         "of SECS s (balanced, 1/F1, balanced, 1/F2, ...; class Switcher); a round is one such job and "
                         "its slowdown the median of the cut's steps over the median of the balanced ones (set --iters "
                         "so a job spans several cycles); no link cuts")
    ap.add_argument("--neighbour-slice-us", type=float, default=0.0, metavar="US",
                    help="--slow-by shares with --ab: the busy neighbour's scheduler slice (sched_setattr; 100 us is the "
                         "kernel's shortest; 0: the default, 1.4 ms here), so a host thread that wakes waits less for it")
    ap.add_argument("--ab-summary", type=Path, nargs="+", default=None, metavar="RUN",
                    help="no jobs: every cut phase of these runs' --ab jobs over its balanced neighbours, and against "
                         "the balanced step time (ab_summary)")
    ap.add_argument("--probe", action="store_true",
                    help="no jobs: the burst probe (burst_probe) of each cut under both emulations, on the slowed host's core")
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--job-timeout", type=float, default=400)
    ap.add_argument("--prefix", default="strg", help="name prefix of the emulated hosts' network namespaces and cgroups "
                    "(unique per concurrent user)")
    ap.add_argument("--calib-reps", type=int, default=3,
                    help="busy-loop measurements of each cut's real compute factor per (model, rate) (0: use nominal F)")
    ap.add_argument("--predictors", default=None, metavar="NAMES",
                    help="only these prediction models (comma-separated, e.g. busy,busy_cal,host,link; default: all), "
                         "fewer replays inside the bench lock")
    ap.add_argument("--out", type=Path, default=Path("bench-stragglers"))
    ap.add_argument("--repredict", type=Path, default=None,
                    help="no jobs: re-predict the rows of an earlier run's rows.json from its kept traces with this code")
    ap.add_argument("--only", choices=("slow", "fix", "base"), default=None,
                    help="with --repredict: only the rows of this direction (fix: the reverse rows, a few replays)")
    ap.add_argument("--sched-summary", type=Path, default=None,
                    help="no jobs: the --sched records of an earlier run's jobs.json, per job configuration")
    a = ap.parse_args(argv)
    if a.sched_summary is not None:
        return sched_summary(a.sched_summary)
    if a.ab_summary:
        return ab_summary(a.ab_summary)
    if a.probe:
        cs = [float(x) for x in a.cuts.split(",") if x]
        core = (a.pin or "0,1").split(",")[-1]
        res = burst_probe([("alone", 1.0)] + [(k, F) for k in ("shares", "quota", "quota2ms") for F in cs] + [("alone", 1.0)],
                          prefix=a.prefix, cpuset=core, period_us=a.period_us, shares=a.shares)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "probe.json").write_text(json.dumps(res, indent=1))
        return 0
    if a.repredict is not None:
        return repredict(a.repredict, a.only, a.predictors)
    H = a.hosts
    S = H - 1 if a.slow_host is None else a.slow_host
    a.pin_layout = None
    if a.pin:
        a.pin_layout = [x.strip() for x in a.pin.split(",")]
        if len(a.pin_layout) != H:
            ap.error(f"--pin {a.pin}: {len(a.pin_layout)} cpu lists for {H} hosts (one per host, e.g. 0,0,1)")
    if a.ab and (a.link_cuts or not a.pin_layout):
        ap.error("--ab needs --pin and --link-cuts \"\" (it switches CPU cuts only)")
    if a.slow_by == "shares" and not a.pin_layout:
        ap.error("--slow-by shares needs --pin (the neighbour shares the slowed host's core)")
    from dpro_kit.jobs import neighbour_weight
    shares_mode = a.slow_by == "shares"
    cuts = [float(x) for x in a.cuts.split(",") if x]
    lcuts = [float(x) for x in a.link_cuts.split(",") if x]
    b = Bench(a)
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    period_ms = f"{a.period_us / 1000:g}"
    K = max(1, a.profiles)
    # the balanced job is profiled K times: before the rounds and after evenly spaced rounds
    prof_after = {max(0, round(j * a.rounds / (K - 1)) - 1) for j in range(1, K)} if K > 1 else set()
    # the slowed job of the reverse rows likewise, --reverse-profiles times (one: after the rounds)
    KR = max(1, a.reverse_profiles)
    rev_after = {max(0, round(j * a.rounds / (KR - 1)) - 1) for j in range(1, KR)} if KR > 1 else set()
    for model in a.models.split(","):
        for rate in [float(r) for r in a.rates.split(",")]:
            rates = [rate] * H
            base_cpus: list[float | None] = [None] * H if shares_mode or a.ab else [a.cpus] * H
            base_nb = {S: a.neighbour_base} if shares_mode and a.neighbour_base else None
            # variant -> (link rates, CPU budgets, busy neighbours, {prediction model: replay arguments})
            variants: dict[str, tuple[list[float], list[float | None], dict[int, int] | None, dict[str, list[str]]]] = {
                "balanced": (rates, base_cpus, base_nb, {})}
            for F in cuts:
                if shares_mode:
                    variants[f"cpu host{S} x1/{F:g}"] = (
                        rates, base_cpus, {S: neighbour_weight(F, a.neighbour_base)},
                        {"prof": F, "paced": F, "busy": F, "busy_cal": F, "host": F, "cpu": F, "factor": ["--slow-rank", f"{S}={F:g}"],
                         "nominal": ["--slow-rank", f"{S}={F:g}"]})
                else:
                    variants[f"cpu host{S} x1/{F:g}"] = (
                        rates, [a.cpus / F if i == S else a.cpus for i in range(H)], None,
                        {"cfs": ["--cpu-limit", f"host{S}={a.cpus / F:.4g}", "--cpu-period-ms", period_ms],
                         "factor": ["--slow-rank", f"{S}={F:g}"], **({"prof": F} if a.ab else {})})
            for f in lcuts:
                variants[f"link host{S} x{f:g}"] = ([rate * f if i == S else rate for i in range(H)], base_cpus, base_nb,
                                                    {"link": ["--slow-link", f"host{S}={f:g}"]})
            print(f"== {model} {rate:g} Mbit/s, {H} hosts "
                  + (f"without quotas, slowed by a busy neighbour on host{S}'s core (cpu.shares "
                     f"{', '.join(f'1/{F:g}: {neighbour_weight(F, a.neighbour_base)}' for F in cuts)}; balanced: "
                     f"{a.neighbour_base or 'none'})" if shares_mode else
                     f"without quotas, slowed by host{S}'s quota {a.period_us} us / F per {a.period_us} us period"
                     if a.ab else f"at {a.cpus:g} CPU (period {a.period_us} us)")
                  + (f", pinned {a.pin_layout} (host{S}, the slowed one, on CPU {a.pin_layout[S]}"
                     + ("" if shares_mode or a.ab else f"; balanced quota per core {core_load(a.pin_layout, base_cpus)}")
                     + ")" if a.pin_layout else ""), flush=True)
            if shares_mode:
                eff = effective_shares_cuts(cuts, a.neighbour_base, a.period_us, a.shares, a.calib_reps, a.prefix,
                                            a.pin_layout[S]) if a.calib_reps else {}
            else:
                eff = effective_cuts(cuts, a.cpus, a.period_us, a.shares, a.calib_reps, a.prefix,
                                     cpuset=a.pin_layout[S] if a.pin_layout else None) if a.calib_reps else {}
            feff = {F: statistics.median(v) for F, v in eff.items()}
            for F in cuts:
                if F in feff:
                    print(f"  {'neighbour' if shares_mode else 'budget'} 1/{F:g}: a busy thread runs x1/{feff[F]:.3f} "
                          f"as fast ({eff[F]})", flush=True)
                    variants[f"cpu host{S} x1/{F:g}"][3]["factor"] = ["--slow-rank", f"{S}={feff[F]:.4g}"]
                    if shares_mode:
                        variants[f"cpu host{S} x1/{F:g}"][3]["cpu"] = feff[F]
                        variants[f"cpu host{S} x1/{F:g}"][3]["host"] = feff[F]
                        variants[f"cpu host{S} x1/{F:g}"][3]["busy_cal"] = feff[F]
            profs: list[dict[str, Any]] = []

            def profile_balanced() -> None:
                prof = b.job(model, rates, base_cpus, profile=True, neighbours=base_nb)
                base_pred = b.replay(prof["trace"], [])["iteration_time_ms"]
                prof.update(base_pred=base_pred, cpu_use=cpu_use(prof["trace"]))
                if not profs:
                    prof["attribution_first"] = b.replay(prof["trace"], ["--stragglers"]).get("stragglers", {}).get("first")
                profs.append(prof)
                print(f"  balanced profile {prof['tag']}: predicted {base_pred:.3f} ms (measured without the profiler in "
                      f"that job: {prof['ms']:.3f} ms)", flush=True)

            slowed_profs: list[dict[str, Any]] = []
            slow_cpus = [a.cpus / a.reverse if i == S else a.cpus for i in range(H)] if a.reverse else None
            slow_nb = None
            if a.reverse and shares_mode:
                slow_cpus, slow_nb = base_cpus, {S: neighbour_weight(a.reverse, a.neighbour_base)}

            def profile_slowed() -> None:
                if a.ab and not shares_mode:     # host S's quota at 1/F of the --ab-period-us for the whole job
                    with Switcher(a.prefix, S, [a.reverse], 1e9, "quota", 0, a.period_us):
                        sp = b.job(model, rates, base_cpus, profile=True)
                elif a.neighbour_slice_us:       # the slowed job's neighbour with the rounds' slice
                    with Switcher(a.prefix, S, [a.reverse], 1e9, "shares", a.neighbour_base, a.period_us, a.neighbour_slice_us):
                        sp = b.job(model, rates, slow_cpus, profile=True, neighbours=slow_nb)
                else:
                    sp = b.job(model, rates, slow_cpus, profile=True, neighbours=slow_nb)
                slowed_profs.append(sp)
                print(f"  slowed profile {sp['tag']} (host{S} at 1/{a.reverse:g}; measured without the profiler "
                      f"in that job: {sp['ms']:.3f} ms)", flush=True)

            profile_balanced()
            if a.reverse and KR > 1:
                profile_slowed()
            meas: dict[str, list[float]] = {k: [] for k in variants}
            scheds: dict[str, list[dict]] = {k: [] for k in variants}
            ab: dict[str, list[float]] = {k: [] for k in variants}     # --ab: per job, median cut step / median balanced
            ab_phases: dict[str, list[float]] = {}                      # --ab: every cut phase over its balanced neighbours
            for rnd in range(a.rounds):
                if a.ab:
                    nb = {S: neighbour_weight(max(cuts), a.neighbour_base)} if shares_mode else None
                    with Switcher(a.prefix, S, [c for F in cuts for c in (None, F)], a.ab, a.slow_by, a.neighbour_base,
                                  a.period_us, a.neighbour_slice_us) as sw:
                        j = b.job(model, rates, [None] * H, profile=False, neighbours=nb)
                    steps, phases = ab_split(json.loads((b.out / j["tag"] / "times.json").read_text()), sw.log)
                    (b.out / j["tag"] / "ab.json").write_text(json.dumps({"log": sw.log, "steps": {str(k): v for k, v in steps.items()},
                                                                           "phases": phases, "proc_stat": sw.proc_stat,
                                                                           "threads": sw.threads, "base": a.neighbour_base}))
                    for F, v in phase_ratios(phases).items():
                        ab_phases.setdefault(f"cpu host{S} x1/{F:g}", []).extend(v)
                    mbj = statistics.median(steps[None])
                    meas["balanced"].append(mbj)
                    line = f"  round {rnd + 1} (one job, phases of {a.ab:g} s) balanced {mbj:.3f} ms ({len(steps[None])} steps)"
                    for F in cuts:
                        k = f"cpu host{S} x1/{F:g}"
                        v = steps.get(F) or [float("nan")]
                        meas[k].append(statistics.median(v))
                        ab[k].append(statistics.median(v) / mbj)
                        line += f"; 1/{F:g} {meas[k][-1]:.3f} ms x{ab[k][-1]:.3f} ({len(v)} steps)"
                    print(line, flush=True)
                    if rnd in prof_after:
                        profile_balanced()
                    if a.reverse and rnd in rev_after:
                        profile_slowed()
                    continue
                order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
                for k in order:
                    r_, c_, nb_, _ = variants[k]
                    j = b.job(model, r_, c_, profile=False, neighbours=nb_)
                    meas[k].append(j["ms"])
                    scheds[k].append(j.get("sched") or {})
                    print(f"  round {rnd + 1} {k:<22} {j['ms']:8.3f} ms", flush=True)
                if rnd in prof_after:
                    profile_balanced()
                if a.reverse and rnd in rev_after:
                    profile_slowed()
            if a.reverse and KR == 1:
                profile_slowed()          # one slowed profile: after the rounds (the bench's rule before --reverse-profiles)
            mb = statistics.median(meas["balanced"])
            # how busy host S was in the balanced plain jobs (--sched): the "busy" model's --host-busy
            busy = busy_fraction(scheds["balanced"], f"host{S}") if shares_mode else None
            if shares_mode:
                print(f"  host{S} runnable {busy} of its iteration in the balanced plain jobs (--sched; median of "
                      f"{len([x for x in scheds['balanced'] if x])} rounds)", flush=True)
            for k, (_, _, _, how) in variants.items():
                if k == "balanced":
                    continue
                m = statistics.median(meas[k])
                ms = statistics.median(ab[k]) if a.ab else m / mb
                pairs = ab[k] if a.ab else [x / y for x, y in zip(meas[k], meas["balanced"])]
                row: dict[str, Any] = {"model": model, "rate": rate, "injected": k, "direction": "slow", "pin": a.pin_layout,
                                       "slow_by": a.slow_by, "neighbours": variants[k][2],
                                       "measured_ms": round(m, 3), "measured_balanced_ms": round(mb, 3),
                                       "measured_slowdown": round(ms, 4), "round_ratios": [round(x, 4) for x in pairs],
                                       "measured_by": f"ab {a.ab:g} s" if a.ab else "jobs",
                                       **({"phase_ratios": ab_phases.get(k, [])} if a.ab else {}),
                                       "traces": [p_["trace"] for p_ in profs],
                                       "effective_factor": eff.get(float(k.rsplit("/", 1)[1])) if k.startswith("cpu ") else None,
                                       "host_busy": busy}
                for name, extra in how.items():
                    if (name in ("busy", "busy_cal", "paced") and busy is None) or (a.predictors and name not in a.predictors.split(",")):
                        continue
                    per = []
                    stop = []
                    args_per = []
                    for p_ in profs:
                        if name == "prof":      # everything from the profile itself: its CPU record, the links' rate
                            args = prof_args(p_["trace"], S, float(extra), rate, a.neighbour_base)
                        elif name in ("busy", "busy_cal", "paced"):   # the same, with how busy the host was from --sched
                            args = ["--slow-host", f"host{S}={float(extra):.4g}", "--host-busy", f"host{S}={busy:.4g}"]
                            if name == "paced":   # ... and the transfers the wire paced kept (the links' rate)
                                args += ["--wire-mbps", f"{rate:g}"]
                        elif name == "host":     # the host at 1/f of its CPU: computation and the CPU part of transfers
                            args = ["--slow-host", f"host{S}={float(extra):.4g}"] + (
                                ["--cpu-share", f"host{S}={1024 / (1024 + a.neighbour_base):.4g}"] if a.neighbour_base else [])
                        elif name == "cpu":    # the busy-loop factor f charged with the rank's whole CPU time
                            fp, parts = cpu_share_factor(p_["trace"], f"host{S}/{S}", float(extra),
                                                         1024 / (1024 + a.neighbour_base))
                            args = ["--slow-rank", f"{S}={fp:.4g}"]
                            row.setdefault("cpu_share_parts", []).append(dict(parts, factor=round(fp, 4)))
                        else:
                            args = extra
                        args_per.append(" ".join(args))
                        rep = b.replay(p_["trace"], args)
                        per.append(rep["iteration_time_ms"] / p_["base_pred"])
                        if "cpu_limit" in rep:
                            stop.append(sum(v["stopped_ms"] for v in rep["cpu_limit"].values()))
                    ps = statistics.median(per)
                    row[f"predicted_slowdown_{name}"] = round(ps, 4)
                    row[f"per_profile_{name}"] = [round(x, 4) for x in per]
                    row[f"error_pct_{name}"] = pct(ps / ms - 1.0)
                    row[f"replay_args_{name}"] = " | ".join(args_per) if name in ("cpu", "prof") else args_per[0]
                    if stop:
                        row["predicted_stopped_ms"] = [round(x, 3) for x in stop]
                prim = next(x for x in ("cfs", "prof", "paced", "host", "busy", "cpu", "factor", "link") if f"predicted_slowdown_{x}" in row)
                row.update(predicted_slowdown=row[f"predicted_slowdown_{prim}"], error_pct=row[f"error_pct_{prim}"],
                           replay_args=row[f"replay_args_{prim}"], prediction=prim)
                rows.append(row)
            rows.append({"model": model, "rate": rate, "injected": "balanced", "direction": "base", "pin": a.pin_layout,
                         "cpu_use": [p_["cpu_use"] for p_ in profs],
                         "predicted_ms": round(statistics.median(p_["base_pred"] for p_ in profs), 3),
                         "per_profile_ms": [round(p_["base_pred"], 3) for p_ in profs],
                         "profiled_jobs_measured_ms": [round(p_["ms"], 3) for p_ in profs],
                         "measured_ms": round(mb, 3),
                         "error_pct": pct(statistics.median(p_["base_pred"] for p_ in profs) / mb - 1.0),
                         "attribution_first": profs[0].get("attribution_first"), "traces": [p_["trace"] for p_ in profs]})
            if a.reverse:
                F = a.reverse
                k = f"cpu host{S} x1/{F:g}"
                ms = (statistics.median(ab[k]) if a.ab else statistics.median(meas[k]) / mb) if k in meas else None
                per_sp, firsts, slow_preds, atts, per_host, host_args = [], [], [], [], [], []
                for sp in slowed_profs:
                    rep = b.replay(sp["trace"], ["--stragglers"])
                    att = rep.get("stragglers", {})
                    slow_preds.append(rep["iteration_time_ms"])
                    per_sp.append(fix_speedup(att, S, sp["trace"]))
                    firsts.append(att.get("first"))
                    atts.append(att)
                    if (shares_mode or a.ab) and (not a.predictors or "prof" in a.predictors.split(",")):
                        x_, args_ = fix_host(att, S, sp["trace"], rate, rep,
                                             sum((slow_nb or {}).values()))
                        per_host.append(x_)
                        host_args.append(args_)
                    print(f"  reverse profile {sp['tag']}: first named {att.get('first')}, fix predicted "
                          f"x{per_sp[-1]:.3f}" + (f" (--like-median); x{per_host[-1]:.3f} ({host_args[-1]})"
                                                  if per_host else ""), flush=True)
                pred = statistics.median(per_sp)
                slow_pred = statistics.median(slow_preds)
                rows.append({"model": model, "rate": rate, "injected": k, "direction": "fix", "pin": a.pin_layout,
                             "slow_by": a.slow_by, "neighbours": slow_nb,
                             "predicted_ms": round(slow_pred / pred, 3), "predicted_slowed_ms": round(slow_pred, 3),
                             "predicted_speedup": round(pred, 4),
                             "per_profile_speedup": [round(x, 4) for x in per_sp],
                             **({"predicted_speedup_prof": round(statistics.median(per_host), 4),
                                 "per_profile_speedup_prof": [round(x, 4) for x in per_host],
                                 "replay_args_prof": " | ".join(host_args),
                                 "error_pct_prof": pct(statistics.median(per_host) / ms - 1.0) if ms else None}
                                if per_host else {}),
                             "per_profile_slowed_ms": [round(x, 3) for x in slow_preds],
                             "slowed_profiled_jobs_measured_ms": [round(sp["ms"], 3) for sp in slowed_profs],
                             "measured_speedup": round(ms, 4) if ms else None,
                             "error_pct": pct(pred / ms - 1.0) if ms else None,
                             "attribution_first": max(set(firsts), key=firsts.count),
                             "attribution_first_per_profile": firsts,
                             "cpu_use": [cpu_use(sp["trace"]) for sp in slowed_profs],
                             "attribution": [[{k2: r.get(k2) for k2 in ("node", "saved_ms", "compute_vs_median",
                                                                         "late_start_ms", "throttled_ms")}
                                              for r in att_.get("ranks", [])] for att_ in atts],
                             "trace": slowed_profs[0]["trace"], "traces": [sp["trace"] for sp in slowed_profs]})
                print(f"  reverse: profiled host{S} at 1/{F:g} x{len(slowed_profs)}: first named {firsts}, "
                      f"fix predicted x{pred:.3f} (per profile {', '.join(f'{x:.3f}' for x in per_sp)})"
                      + (f", the host's CPU back (prof) x{statistics.median(per_host):.3f}" if per_host else "")
                      + f", measured x{ms if ms else float('nan'):.3f}", flush=True)
            (a.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print()
    print("| model | Mbit/s | injected | predicted slowdown (median of profiles) | measured slowdown (per round) | error |"
          " other model: predicted, error | per profile |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["direction"] == "slow":
            other = next((o for o in {"cfs": ["factor"], "prof": ["paced"], "paced": ["busy"], "busy": ["host"], "host": ["busy", "cpu"], "cpu": ["factor"],
                                      "factor": ["nominal"]}.get(r["prediction"], []) if f"replay_args_{o}" in r), None)
            print(f"| {r['model']} | {r['rate']:g} | {r['injected']} (`{r['replay_args']}`) | "
                  f"{r['predicted_slowdown']:.3f} | {r['measured_slowdown']:.3f} "
                  f"({', '.join(f'{x:.3f}' for x in r['round_ratios'])}) | {r['error_pct']:+.1f} % | "
                  + (f"`{r[f'replay_args_{other}']}`: {r[f'predicted_slowdown_{other}']:.3f}, "
                     f"{r[f'error_pct_{other}']:+.1f} % | " if other else "- | ")
                  + ", ".join(f"{x:.3f}" for x in r[f"per_profile_{r['prediction']}"]) + " |")
        elif r["direction"] == "fix":
            ms = f"{r['measured_speedup']:.3f}" if r["measured_speedup"] else "-"
            err = f"{r['error_pct']:+.1f} %" if r["error_pct"] is not None else "-"
            print(f"| {r['model']} | {r['rate']:g} | fix {r['injected']} (profiled slowed, `--stragglers`: fix of host S) | "
                  f"speed-up {r['predicted_speedup']:.3f} | {ms} | {err} | first named: {r['attribution_first']} | |")
        else:
            print(f"| {r['model']} | {r['rate']:g} | balanced: predicted {r['predicted_ms']:.3f} ms vs measured "
                  f"{r['measured_ms']:.3f} ms | | | {r['error_pct']:+.1f} % | | "
                  + ", ".join(f"{x:.3f}" for x in r["per_profile_ms"]) + " |")
    for name in ("cfs", "prof", "paced", "busy", "busy_cal", "host", "cpu", "factor", "nominal", "link"):
        e = [abs(r[f"error_pct_{name}"]) for r in rows if r["direction"] == "slow" and f"error_pct_{name}" in r]
        if e:
            print(f"|error| {name}: median {statistics.median(e):.1f} %, max {max(e):.1f} % ({len(e)} rows)")
    errs = [abs(r["error_pct"]) for r in rows if r["direction"] in ("slow", "fix") and r["error_pct"] is not None]
    if errs:
        print(f"\n|error| of slowdowns/speed-ups: median {statistics.median(errs):.1f} %, max {max(errs):.1f} % "
              f"({len(errs)} rows); {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
