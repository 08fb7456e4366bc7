"""Asynchronous SGD throughput: predicted (dpro async-predict) vs measured (TF ParameterServerStrategy).

Issue 13 item 4 (seed 004, Li et al. ICPE'20). For each bandwidth and W = 1..N workers, a real
ParameterServerStrategy job of examples/tf/train.py runs on emulated hosts (dpro_kit.cluster:
one network namespace per task, every host link shaped to the bandwidth in both directions;
dpro_kit.jobs.CpuBudget: a fixed CPU quota per host, so a host's speed does not depend on how
many hosts run): host 0 = the PS, host 1 = the coordinator, hosts 2.. = the workers. Measured
steps/s = the coordinator's steps after warm-up / wall time. Configurations run in alternating
order, ``--rounds`` times; the median is compared.

The prediction starts (``--source ps-trace``, the default) from a ``dpro profile`` of the real
1-worker job at each bandwidth (its coordinator traces the worker and PS: variables, placement,
updates, launch measured; ``OUT/ps-trace-<Mbit/s>``), or (``--source step-trace``) from a dpro_tf
trace of the training step in one process (``--trace``, or one recorded here); the measured
1-worker steps/s at each bandwidth (the unprofiled runs) calibrates it (docs/async.md), then
W = 1..N are simulated.

    sudo python bench/async_tf.py --bandwidths 100,300 --workers 1-4 --rounds 2 --out bench-async

``--link FILE`` (a ``bench/link_sharing.py --out`` file at the same bandwidths) adds the predictions
with the link's measured sharing (``--sharing arrival``), each as the steady window after random
start offsets and as the bench's own run (``--steps`` steps from a common start), next to equal
sharing; every run also records each host group's CFS throttled time (docs/async.md). Every table
also has equal sharing with the equal-window rule (``dpro async-predict --reverse-path window``).
``--step-times`` also keeps every measured step's start and gradients-ready times (``OUT/step_times.json``)
and prints the W = 2 phasing and the runs' steady part against the prediction (docs/async.md, "TF W = 2").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAIN = ROOT / "examples" / "tf" / "train.py"
PY = sys.executable
PLACEMENT: dict[str, int] = {}   # variable -> PS index, as the real job placed them (train.py prints it)


class _CpuSampler:
    """CPU time (user + system, /proc/PID/stat) of processes, sampled every ``dt`` s from a thread."""

    def __init__(self, pids: list[int], dt: float = 0.1, groups: list[Path] | None = None):
        self.pids, self.dt, self.samples = pids, dt, []
        self.groups = groups or []     # CpuBudget groups: their throttled time (cpu.stat), sampled after the pids'
        self.n = len(pids) + len(self.groups)
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _cpu(self, pid: int) -> float:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / self._tick     # utime, stime
        except (OSError, IndexError, ValueError):
            return float("nan")

    def _throttled(self, group: Path) -> float:
        try:
            for line in (group / "cpu.stat").read_text().splitlines():
                if line.startswith("throttled_time "):
                    return int(line.split()[1]) / 1e9
        except (OSError, ValueError):
            pass
        return float("nan")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), [self._cpu(p) for p in self.pids] +
                                 [self._throttled(g) for g in self.groups]))
            self._stop.wait(self.dt)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[float]:
        """CPU seconds per process in [t0, t1] (linear between samples)."""
        def at(t: float, i: int) -> float:
            pts = [(ts, v[i]) for ts, v in self.samples if v[i] == v[i]]
            if not pts:
                return float("nan")
            prev = max((p for p in pts if p[0] <= t), default=pts[0])
            nxt = min((p for p in pts if p[0] >= t), default=pts[-1])
            if nxt[0] == prev[0]:
                return prev[1]
            return prev[1] + (nxt[1] - prev[1]) * (t - prev[0]) / (nxt[0] - prev[0])
        return [at(t1, i) - at(t0, i) for i in range(self.n)]


# the last run, per role (ps, chief, worker): CPU s per step and CPUs used over the measured steps
# (profiled: the chief's entry is the dpro profile process, not the job)
RUN_CPU: dict[str, dict] = {}
# the last run's measured steps (--step-times): [[worker clock at the step's start, when its gradients were ready], ...]
STEP_TIMES: list[list[float]] = []
# ... and per step the PS's clock once its variable writes were done (train.py "applied_times"), same order
STEP_APPLIED: list[float] = []
# the last run's losses, per role (ps, chief, worker): TCP counters of each host's namespace and the packets its
# link's two tbf shapers dropped, over the whole run (warm-up included)
RUN_TCP: dict[str, list[dict[str, int]]] = {}
TCP_KEYS = {"Tcp": ("RetransSegs",), "TcpExt": ("TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPFastRetrans")}


def tcp_counters(c, host: int) -> dict[str, int]:
    """Host ``host``'s TCP loss counters (/proc/net/snmp and netstat of its namespace: retransmitted segments,
    retransmission timeouts, tail-loss probes, fast retransmits) and the drops of its upload (``up_drops``) and
    download (``down_drops``) tbf shapers."""
    import re
    out: dict[str, int] = {}
    cp = subprocess.run(["nsenter", f"--net=/run/netns/{c.netns(host)}", "cat", "/proc/net/snmp", "/proc/net/netstat"],
                        capture_output=True, text=True, check=True)
    lines = cp.stdout.splitlines()
    for head, vals in zip(lines, lines[1:]):
        name, _, keys = head.partition(":")
        vname, _, nums = vals.partition(":")
        if name != vname or name not in TCP_KEYS or not nums.split() or not nums.split()[0].lstrip("-").isdigit():
            continue
        row = dict(zip(keys.split(), nums.split()))
        out.update({k: int(row[k]) for k in TCP_KEYS[name] if k in row})
    for key, ns, dev in (("up_drops", c.netns(host), "eth0"), ("down_drops", c.bridge_ns, f"h{host}")):
        q = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
        m = re.search(r"dropped (\d+)", q)
        out[key] = int(m.group(1)) if m else -1
    return out


def run_pss(workers: int, rate_mbit: float, *, steps: int, warmup: int, width: int, depth: int, batch: int,
            cpus: float | None, ps_cpus: float | None = None, num_ps: int = 1, prefix: str = "tfas",
            timeout: float = 400.0, profile: tuple[Path, str] | None = None, step_times: bool = False) -> float:
    """One real ParameterServerStrategy run; returns the coordinator's steps/s.

    ``cpus``: CPU quota of every host; ``ps_cpus``: the PS host's (default ``cpus``);
    ``profile``: ``(out, "START:END")`` runs the coordinator under ``dpro profile --framework
    tensorflow`` (it traces the worker and PS tasks; docs/tensorflow.md); ``step_times``: train.py
    ``--step-times``, the steps' times into ``STEP_TIMES``."""
    from dpro_kit.cluster import EmulatedCluster
    from dpro_kit.jobs import CpuBudget
    hosts = workers + 1 + num_ps
    port = 23456
    ps_hosts = [0] + [2 + workers + j for j in range(num_ps - 1)]   # host 0 and, for 2 PS, the last host
    with EmulatedCluster(hosts, rate_mbit=rate_mbit, prefix=prefix) as c:
        cluster = {"ps": [f"{c.host_ip(h)}:{port}" for h in ps_hosts], "chief": [f"{c.host_ip(1)}:{port}"],
                   "worker": [f"{c.host_ip(2 + i)}:{port}" for i in range(workers)]}
        budget = CpuBudget(hosts, cpus, prefix=prefix) if cpus else None
        if budget and ps_cpus:   # the PS hosts get their own quota
            for h in ps_hosts:
                (budget.groups[h] / "cpu.cfs_quota_us").write_text(str(int(round(ps_cpus * budget.PERIOD_US))))
        try:
            def start(host: int, task: str, index: int, args: list[str], **kw):
                env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": index}}),
                       "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
                pre = budget.preexec(host) if budget else None
                return c.run(host, [PY, str(TRAIN), *args], env=env, preexec_fn=pre, **kw)
            common = ["--width", str(width), "--depth", str(depth), "--batch", str(batch)]
            servers = [start(h, "ps", j, ["--serve", *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for j, h in enumerate(ps_hosts)]
            servers += [start(2 + i, "worker", i, ["--serve", *common], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i in range(workers)]
            job = [str(TRAIN), "--strategy", "ps", "--steps", str(steps), "--warmup", str(warmup), *common]
            if step_times:
                job.append("--step-times")
            if profile is not None:
                job = ["-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--out", str(profile[0]),
                       "--host", "host1", "--steps", profile[1], "--", PY, *job]
            env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
                   "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
            if profile is not None:   # this checkout's dpro_kit (and its collectors) in the profiled job
                env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            chief = c.run(1, [PY, *job], env=env, preexec_fn=budget.preexec(1) if budget else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            sampler = _CpuSampler([s.pid for s in servers[:num_ps]] + [chief.pid] + [s.pid for s in servers[num_ps:]],
                                  groups=[budget.groups[h] for h in ps_hosts + [1] + [2 + i for i in range(workers)]]
                                  if budget else None)
            lines: list[tuple[float, str]] = []     # the coordinator's stdout lines, timed as they arrive
            errs: list[str] = []
            readers = [threading.Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in chief.stdout)),
                       threading.Thread(target=lambda: errs.append(chief.stderr.read()))]
            for r in readers:
                r.start()
            try:
                chief.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                chief.kill()
                chief.wait()
            for r in readers:
                r.join()
            err = "".join(errs)
            sampler.stop()
            out = "".join(ln for _, ln in lines)
            hosts_of = {"ps": ps_hosts, "chief": [1], "worker": [2 + i for i in range(workers)]}
            RUN_TCP.clear()
            try:
                RUN_TCP.update({role: [tcp_counters(c, h) for h in hs] for role, hs in hosts_of.items()})
            except (OSError, subprocess.CalledProcessError) as exc:     # a diagnostic: never fail the run for it
                print(f"TCP counters not read: {exc}", file=sys.stderr)
            for s in servers:
                s.kill()
            if profile is not None:   # what dpro profile said (the trace's conversion)
                Path(f"{profile[0]}.log").write_text(out + err)
            if chief.returncode != 0:
                raise RuntimeError(f"coordinator failed ({chief.returncode}): {err[-1500:]}")
            t_end, last = [(t, ln) for t, ln in lines if ln.strip()][-1]
            doc = json.loads(last)
            PLACEMENT.update(doc.get("placement") or {})
            STEP_TIMES[:] = doc.get("step_times") or []
            STEP_APPLIED[:] = doc.get("applied_times") or []
            # every task's CPU time over the measured steps (they end when train.py prints its line)
            both = sampler.between(t_end - float(doc["wall_s"]), t_end)
            n = len(servers) + 1
            cpu, thr = both[:n], both[n:]
            RUN_CPU.clear()
            for role, sl in (("ps", slice(0, num_ps)), ("chief", slice(num_ps, num_ps + 1)), ("worker", slice(num_ps + 1, n))):
                RUN_CPU[role] = {"cpu_s_per_step": [c / doc["steps"] for c in cpu[sl]],
                                 "cpus_used": [c / float(doc["wall_s"]) for c in cpu[sl]]}
                if thr:   # the fraction of the measured wall time the host's group was throttled (CFS quota spent)
                    RUN_CPU[role]["throttled_frac"] = [t / float(doc["wall_s"]) for t in thr[sl]]
            return float(doc["steps_per_s"])
        finally:
            if budget:
                budget.close()


def worker_steps(steps: list[list[float]], workers: int) -> list[list[tuple[float, float]]]:
    """The ``--step-times`` steps of one run, [[start, gradients ready], ...], split into the workers' own
    sequences: in order of start, a step goes to a worker whose last step's gradients were ready by then
    (the longest-running such worker; any worker if none). The job does not say which worker ran a step;
    a worker runs one at a time, so this holds while a worker's next step starts after its gradients."""
    seqs: list[list[tuple[float, float]]] = [[] for _ in range(workers)]
    for start, grads in sorted(map(tuple, steps)):
        free = [w for w in range(workers) if not seqs[w] or seqs[w][-1][1] <= start] or list(range(workers))
        w = min(free, key=lambda w: seqs[w][-1][0] if seqs[w] else float("-inf"))
        seqs[w].append((start, grads))
    return seqs


def phasing(steps: list[list[float]]) -> dict[str, float | list[float]]:
    """How two workers' steps interleave (W = 2, ``--step-times``): for every step of the first worker, where
    the second's next start falls within it, as a fraction of the step (0: together, 0.5: half a step
    apart, i.e. one downloads while the other uploads), and ``distance`` = min(p, 1 - p) per step; plus the
    workers' median step period (start to start, ms) and the median download phase (start to gradients, ms)."""
    a, b = ([s for s, _ in seq] for seq in worker_steps(steps, 2))
    raw = []
    for s0, s1 in zip(a, a[1:]):
        nxt = [x for x in b if s0 <= x < s1]
        if nxt:
            raw.append((nxt[0] - s0) / (s1 - s0))
    dist = [min(p, 1 - p) for p in raw]
    periods = [y - x for seq in (a, b) for x, y in zip(seq, seq[1:])]
    return {"phase": raw, "distance": dist,
            "median_distance": statistics.median(dist) if dist else float("nan"),
            "period_ms": 1e3 * statistics.median(periods) if periods else float("nan"),
            "download_ms": 1e3 * statistics.median(g - s for s, g in steps) if steps else float("nan")}


def steady_rate(steps: list[list[float]], workers: int) -> float:
    """Steps/s of a ``--step-times`` run over its steady part (the paper's measurement, §4.1, which the
    prediction's steady window is): the step starts after the first ``4 * workers``, (n - 1) / their span.
    The bench's own steps/s counts every step from a common start (all workers' first steps together)."""
    starts = sorted(s for s, _ in steps)[4 * workers:]
    return (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 and starts[-1] > starts[0] else float("nan")


def profile_step(out: Path, *, width: int, depth: int, batch: int) -> Path:
    """The dpro_tf trace of the step (custom loop, one process, one thread)."""
    if (out / "manifest.json").exists():
        return out
    cmd = [PY, "-m", "dpro_kit.cli", "profile", "--framework", "tensorflow", "--steps", "10:20", "--out", str(out),
           "--", PY, str(TRAIN), "--steps", "30", "--width", str(width), "--depth", str(depth), "--batch", str(batch)]
    subprocess.run(cmd, check=True, capture_output=True, text=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default="100,300", help="Mbit/s, comma-separated")
    ap.add_argument("--workers", default="1-4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cpus-per-host", type=float, default=0.3)
    ap.add_argument("--ps-cpus", type=float, default=None, help="the PS host's CPU quota (default: --cpus-per-host)")
    ap.add_argument("--ps", type=int, default=1, choices=[1, 2], help="parameter servers (real job and prediction)")
    ap.add_argument("--source", choices=["ps-trace", "step-trace"], default="ps-trace",
                    help="what the prediction starts from: a dpro profile of the real 1-worker job at each "
                         "bandwidth (its coordinator traces the worker and PS), or one process's training step")
    ap.add_argument("--trace", type=Path, default=None, help="the step trace (--source step-trace)")
    ap.add_argument("--out", type=Path, default=Path("bench-async"))
    ap.add_argument("--prefix", default="tfas", help="name prefix of the emulated cluster's namespaces and cgroups "
                                                    "(unique per concurrent user)")
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--step-times", action="store_true",
                    help="the job's measured steps also return their start / gradients-ready times (train.py "
                         "--step-times), kept per run in OUT/step_times.json (how the workers interleave)")
    ap.add_argument("--calibrate", choices=["bandwidth", "overhead"], default="bandwidth",
                    help="what the measured W=1 fits (dpro async-predict --calibrate)")
    ap.add_argument("--link", type=Path, default=None,
                    help="a bench/link_sharing.py --out file measured at these bandwidths: adds the prediction "
                         "with the link's measured sharing (dpro async-predict --sharing arrival --link)")
    args = ap.parse_args(argv)
    lo, _, hi = args.workers.partition("-")
    ws = list(range(int(lo), int(hi or lo) + 1))
    bws = [float(b) for b in args.bandwidths.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    meas_path = args.out / "measured.json"
    measured: dict[str, list[float]] = json.loads(meas_path.read_text()) if meas_path.exists() else {}
    cpu_path = args.out / "cpu.json"     # per run and role: CPU s per step and CPUs used
    cpu_runs: dict[str, list[dict]] = json.loads(cpu_path.read_text()) if cpu_path.exists() else {}
    tcp_path = args.out / "tcp.json"     # per run and role: TCP loss counters and shaper drops per host (tcp_counters)
    tcp_runs: dict[str, list[dict]] = json.loads(tcp_path.read_text()) if tcp_path.exists() else {}
    st_path = args.out / "step_times.json"    # per run (--step-times): the steps' [start, gradients ready]
    st_runs: dict[str, list] = json.loads(st_path.read_text()) if st_path.exists() else {}
    ap_path = args.out / "applied_times.json"   # per run (--step-times): the PS's clock when each step's writes were done
    ap_runs: dict[str, list] = json.loads(ap_path.read_text()) if ap_path.exists() else {}
    configs = [(b, w) for b in bws for w in ws]
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))   # alternate the order every round
        for b, w in order:
            key = f"{b:g}:{w}"
            if len(measured.get(key, [])) > r:
                continue
            t = time.time()
            sps = run_pss(w, b, steps=args.steps, warmup=args.warmup, width=args.width, depth=args.depth,
                          batch=args.batch, cpus=args.cpus_per_host, ps_cpus=args.ps_cpus, num_ps=args.ps,
                          prefix=args.prefix, step_times=args.step_times)
            measured.setdefault(key, []).append(sps)
            if args.step_times:
                st_runs.setdefault(key, []).append(list(STEP_TIMES))
                st_path.write_text(json.dumps(st_runs))
                ap_runs.setdefault(key, []).append(list(STEP_APPLIED))
                ap_path.write_text(json.dumps(ap_runs))
            meas_path.write_text(json.dumps(measured, indent=1))
            cpu_runs.setdefault(key, []).append(dict(RUN_CPU))
            cpu_path.write_text(json.dumps(cpu_runs, indent=1))
            tcp_runs.setdefault(key, []).append(dict(RUN_TCP))
            tcp_path.write_text(json.dumps(tcp_runs, indent=1))
            loss = "; ".join(f"{role} " + ", ".join(f"{k} {sum(h.get(k, 0) for h in hs)}" for k in
                                                   ("RetransSegs", "TCPTimeouts", "TCPLossProbes", "up_drops", "down_drops"))
                             for role, hs in RUN_TCP.items() if role != "chief")
            print(f"round {r} {b:g} Mbit/s W={w}: {sps:.3f} steps/s ({time.time() - t:.0f} s); {loss}", flush=True)
    if st_runs:    # --step-times: how the W = 2 runs' workers interleaved (docs/async.md)
        print("\n| Mbit/s | W | run | steady period per worker, ms | download phase, ms | W = 2: phase distance "
              "min(p, 1 - p) per step, median (share >= 0.4) | first 8 steps |")
        print("|---|---|---|---|---|---|---|")
        for key in sorted(st_runs, key=lambda k: (float(k.split(":")[0]), int(k.split(":")[1]))):
            b, w = key.split(":")
            for r, steps in enumerate(st_runs[key]):
                if not steps or int(w) > 2:
                    continue
                if w == "1":
                    seq = sorted(steps)
                    per = 1e3 * statistics.median(y[0] - x[0] for x, y in zip(seq, seq[1:]))
                    dl = 1e3 * statistics.median(g - s for s, g in steps)
                    print(f"| {b} | 1 | {r} | {per:.1f} | {dl:.1f} | — | — |")
                    continue
                ph = phasing(steps)
                d = ph["distance"]
                print(f"| {b} | 2 | {r} | {ph['period_ms']:.1f} | {ph['download_ms']:.1f} | {ph['median_distance']:.2f} "
                      f"({sum(x >= 0.4 for x in d) / max(1, len(d)):.0%}) | {' '.join(f'{x:.2f}' for x in d[:8])} |")
    place_path = args.out / "placement.json"     # the job's placement as train.py printed it (--source step-trace)
    if PLACEMENT:
        place_path.write_text(json.dumps(PLACEMENT, indent=1))
    if args.measure_only:
        return 0
    from dpro_kit.async_ps import calibrate, link_model, predict, template_from_trace
    placement = json.loads(place_path.read_text()) if place_path.exists() else None
    templates = {}
    if args.source == "ps-trace":   # the real 1-worker job under dpro profile, once per bandwidth
        for b in bws:
            tdir = args.out / f"ps-trace-{b:g}"
            if not (tdir / "manifest.json").exists():
                if tdir.exists():
                    import shutil
                    shutil.rmtree(tdir)
                t = time.time()
                run_pss(1, b, steps=args.steps, warmup=args.warmup, width=args.width, depth=args.depth,
                        batch=args.batch, cpus=args.cpus_per_host, ps_cpus=args.ps_cpus, num_ps=args.ps,
                        prefix=args.prefix, profile=(tdir, f"{args.warmup + 4}:{args.warmup + 10}"))
                # (steps after the warm-up; the trace starts 2 steps before START)
                print(f"profiled the 1-worker job at {b:g} Mbit/s: {tdir} ({time.time() - t:.0f} s)", flush=True)
            templates[b] = template_from_trace(tdir, num_ps=args.ps)    # the job's own placement is in the trace
        tpl = templates[bws[0]]
    else:
        trace = args.trace or profile_step(args.out / "step-trace", width=args.width, depth=args.depth,
                                           batch=args.batch)
        tpl = template_from_trace(trace, num_ps=args.ps, placement=placement if args.ps > 1 else None)
        templates = {b: tpl for b in bws}
    if args.ps > 1:   # what the prediction places on each PS: the bytes of the template's reads
        per_ps = [int(sum(o.work for o in tpl.ops if o.res == "down" and o.ps == p)) for p in range(args.ps)]
        print(f"bytes read per step from each PS (the prediction's placement): {per_ps}")
    cpu_doc = json.loads((args.out / "cpu.json").read_text()) if (args.out / "cpu.json").exists() else {}
    quota = {"ps": args.ps_cpus or args.cpus_per_host, "chief": args.cpus_per_host, "worker": args.cpus_per_host}

    def cpu_use(key: str) -> str:
        """Median over the runs of each role's CPUs used (the busiest task of the role), of its quota."""
        runs = [r for r in cpu_doc.get(key, []) if r.get("ps")]
        if not runs:
            return "—"
        out = ", ".join(f"{role} {statistics.median(max(r[role]['cpus_used']) for r in runs):.3f}/{quota[role]:g}"
                        for role in ("ps", "chief", "worker"))
        thr = [r for r in runs if "throttled_frac" in r["ps"]]
        if thr:   # cpu.stat throttled_time over the measured steps / their wall time (summed over the 2 CPUs)
            out += "; throttled " + ", ".join(
                f"{role} {statistics.median(max(r[role]['throttled_frac']) for r in thr):.3f}"
                for role in ("ps", "chief", "worker"))
        return out
    link_doc = json.loads(args.link.read_text()) if args.link else None
    # the prediction variants: (sharing, protocol); "steady" = evenly spread start offsets, steady window (the
    # paper's measurement), "run" = the bench's own run: --steps steps scheduled at once after a join,
    # all workers starting together, steps/s = steps / time until the last one ends (docs/async.md)
    # "window": equal sharing plus the equal-window rule (dpro async-predict --reverse-path window)
    variants = [("equal", "steady"), ("window", "steady")] + ([("equal", "run"), ("arrival", "steady"), ("arrival", "run")]
                                        if link_doc else [])
    names = {("equal", "steady"): "equal sharing, steady (range over 8 start offsets)",
             ("window", "steady"): "equal sharing + equal-window rule, steady",
             ("equal", "run"): "equal, run from a common start", ("arrival", "steady"): "arrival, steady",
             ("arrival", "run"): "arrival sharing on the measured link, run from a common start"}
    print(f"\n| Mbit/s | W | measured steps/s (median of {args.rounds}; all) | " +
          " | ".join(f"{names[v]} | error" for v in variants) + " | CPUs used / quota (median of runs) |")
    print("|---|---|---|" + "---|---|" * len(variants) + "---|")
    errs: dict = {v: [] for v in variants}
    steady_rows = []     # (b, w, steady part of each measured run, the equal-window rule's prediction)
    for b in bws:
        one = statistics.median(measured[f"{b:g}:1"])
        tpl = templates[b]
        if args.source == "ps-trace":
            man = json.loads((args.out / f"ps-trace-{b:g}" / "manifest.json").read_text())
            print(f"| {b:g} | | the profiled 1-worker job's own unprofiled steps: "
                  f"{1e3 / man['extra']['measured_iteration_ms']:.2f} steps/s |" + " | |" * len(variants) + " |")
        fit = calibrate(tpl, one, how=args.calibrate, bandwidth_mbit=b, num_ps=args.ps)   # W=1 only (docs/async.md)
        if not fit.pop("reached"):
            print(f"| {b:g} | | W = 1 is not calibrated: the traced step is slower than the measured one, every "
                  "prediction is low |" + " | |" * len(variants) + " |")
        lm = link_model(link_doc, b, path=args.link) if link_doc else None
        preds = {}
        for sh, proto in variants:
            kw = dict(fit, num_ps=args.ps, sharing="equal" if sh == "window" else sh)
            if sh == "window":
                kw["reverse_path"] = "window"
            if sh == "arrival":     # W=1 has one transfer per link at a time: the same calibration holds
                kw.update(newcomer_share=lm["newcomer_share"], goodput=lm["goodput"])
            if proto == "run":
                kw["total_steps"] = args.steps
            preds[(sh, proto)] = {p.workers: p for p in predict(tpl, ws, **kw)}
        for w in ws:
            m = statistics.median(measured[f"{b:g}:{w}"])
            allm = ", ".join(f"{x:.2f}" for x in measured[f"{b:g}:{w}"])
            cols = []
            for v in variants:
                p = preds[v][w]
                e = 100 * (p.steps_per_s - m) / m
                if w > 1:
                    errs[v].append(abs(e))
                cols.append(f"{p.steps_per_s:.2f} ({p.low:.2f} .. {p.high:.2f}) | {e:+.1f} %")
            print(f"| {b:g} | {w} | {m:.2f} ({allm}) | " + " | ".join(cols) + f" | {cpu_use(f'{b:g}:{w}')} |")
            if st_runs.get(f"{b:g}:{w}"):
                steady_rows.append((b, w, [steady_rate(x, w) for x in st_runs[f"{b:g}:{w}"] if x],
                                    preds[("window", "steady")][w].steps_per_s))
        print(f"| {b:g} | | calibrated on W=1 ({args.calibrate}): effective {fit['bandwidth_mbit']:.1f} Mbit/s, "
              f"step overhead {fit['step_overhead_us'] / 1e3:.1f} ms |" + " | |" * len(variants) + " |")
        if lm:
            print(f"| {b:g} | | link ({args.link}): mean newcomer share " +
                  ", ".join(f"{d} {statistics.mean(v):.2f}" for d, v in lm["newcomer_share"].items()) +
                  "; goodput k=1.. " + "; ".join(f"{d} " + " ".join(f"{g:.2f}" for g in v)
                                                 for d, v in lm["goodput"].items()) + " |" + " | |" * len(variants) + " |")
    print()
    for v in variants:
        e = errs[v] or [0.0]
        print(f"{names[v]}: W > 1 median |error| {statistics.median(e):.1f} %, max {max(e):.1f} %")
    if steady_rows:   # --step-times runs: the same predictions against the runs' steady part
        print("\n| Mbit/s | W | measured steps/s, steady part (after the first 4 W steps; median; all) | "
              "equal sharing + equal-window rule, steady | error |\n|---|---|---|---|---|")
        es = []
        for b, w, runs, pw in steady_rows:
            m = statistics.median(runs)
            if w > 1:
                es.append(abs(100 * (pw / m - 1)))
            print(f"| {b:g} | {w} | {m:.2f} ({', '.join(f'{x:.2f}' for x in runs)}) | {pw:.2f} | {100 * (pw / m - 1):+.1f} % |")
        if es:
            print(f"\nagainst the steady part: W > 1 median |error| {statistics.median(es):.1f} %, max {max(es):.1f} %, "
                  f"{sum(e <= 10 for e in es)} of {len(es)} rows within 10 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
