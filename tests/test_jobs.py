"""Tests of :mod:`dpro_kit.jobs`, the one harness that launches real jobs for benches, demo and tests.

Real processes only: a real 2-host DDP job (``examples/ddp/train.py``, gloo) through :func:`run_job`
on an emulated cluster, unprofiled and profiled with one ``dpro profile`` per host (the profiled one
is replayed); a probe job checks the CPU budget (the cgroup's quota file and that the host's
process was in its group) and that no cgroup or namespace is left; several ranks per host through
torchrun.  ~40 s on 2 cores.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dpro_kit import jobs
from dpro_kit.cluster import list_namespaces
from dpro_kit.jobs import alternate, job_iteration_ms, paired_ratio, paired_table, run_job

from conftest import TRAIN, netns_unusable_reason  # noqa: E402

PREFIX = "dpjt"
PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
_NETNS = netns_unusable_reason(PREFIX)
needs_netns = pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
needs_cgroup = pytest.mark.skipif(jobs.cgroup_cpu_root() is None,
                                  reason="no writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu")

# what a host's process sees: its cpu cgroup (inside a namespace /sys is remounted, so the quota
# file is read from outside by the test) and the variables the harness sets
PROBE = textwrap.dedent(r"""
    import json, os, sys, time
    cg = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.split(":")[1] == "cpu"][0]
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DPRO_HOST", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
    json.dump({"cgroup": cg, **{k: os.environ.get(k) for k in keys}},
              open(sys.argv[1].replace("RANK", os.environ.get("RANK", "")), "w"))
    time.sleep(float(sys.argv[2]))
""")


def _ours_left() -> tuple[list[str], list[str]]:
    root = jobs.CGROUP_CPU_ROOT
    groups = [p.name for p in root.glob(f"{PREFIX}-*")] if root.exists() else []
    return groups, [ns for ns in list_namespaces() if ns.startswith(PREFIX + "-")]


@needs_netns
@needs_cgroup
def test_cpu_budget_per_host_and_cleanup(tmp_path: Path) -> None:
    """Each host's process runs in its own group with quota = cpus * period; nothing is left after."""
    seen: dict[str, list] = {}

    def watch() -> None:   # read the groups from outside while the job runs
        deadline = time.time() + 20
        while time.time() < deadline and len(seen) < 2:
            for g in jobs.CGROUP_CPU_ROOT.glob(f"{PREFIX}-{__import__('os').getpid()}-*/host*"):
                try:
                    pids = (g / "cgroup.procs").read_text().split()
                    quota = (g / "cpu.cfs_quota_us").read_text().strip()
                    period = (g / "cpu.cfs_period_us").read_text().strip()
                except OSError:
                    continue
                if pids:
                    seen[g.name] = [quota, period, pids]
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    r = run_job([PY, "-c", PROBE, str(tmp_path / "host{i}.json"), "3"], hosts=2, rate_mbit=1000,
                cpus_per_host=0.5, prefix=PREFIX, timeout=60)
    t.join()
    assert r.ok, r
    assert sorted(seen) == ["host0", "host1"], seen
    for name, (quota, period, pids) in seen.items():
        assert (quota, period) == ("50000", "100000")
    for i in range(2):
        doc = json.loads((tmp_path / f"host{i}.json").read_text())
        assert doc["cgroup"] == "/" + str(r.cgroups[i].relative_to(jobs.CGROUP_CPU_ROOT))
        assert doc["RANK"] == str(i) and doc["WORLD_SIZE"] == "2" and doc["DPRO_HOST"] == f"host{i}"
        assert doc["MASTER_ADDR"] == "10.213.0.1" and doc["GLOO_SOCKET_IFNAME"] == "eth0"
    assert not any(g.exists() for g in r.cgroups) and not r.cgroups[0].parent.exists()
    assert _ours_left() == ([], [])


@needs_cgroup
def test_loopback_and_cleanup_on_timeout(tmp_path: Path) -> None:
    """rate_mbit=None: no namespaces, MASTER_ADDR on loopback; a job past its timeout is killed and
    its groups removed all the same."""
    r = run_job([PY, "-c", PROBE, str(tmp_path / "h{i}.json"), "30"], hosts=2, cpus_per_host=1.0,
                prefix=PREFIX, timeout=3)
    assert r.codes == [-9, -9] and r.timed_out
    doc = json.loads((tmp_path / "h1.json").read_text())
    assert doc["MASTER_ADDR"] == "127.0.0.1" and doc["RANK"] == "1" and doc["GLOO_SOCKET_IFNAME"] == "lo"
    assert doc["cgroup"].endswith("/host1")
    assert not r.cgroups[0].parent.exists()
    assert _ours_left() == ([], [])


def test_several_ranks_per_host_through_torchrun(tmp_path: Path) -> None:
    """ranks_per_host=2: each host's launcher is torchrun with 2 ranks; ranks numbered host-major."""
    r = run_job([PY, "-c", PROBE, str(tmp_path / "rRANK.json"), "0"], hosts=2, ranks_per_host=2,
                prefix=PREFIX, timeout=120)
    assert r.ok, r
    docs = {k: json.loads((tmp_path / f"r{k}.json").read_text()) for k in range(4)}
    assert [(d["DPRO_HOST"], d["LOCAL_RANK"], d["WORLD_SIZE"]) for d in docs.values()] == [
        ("host0", "0", "4"), ("host0", "1", "4"), ("host1", "0", "4"), ("host1", "1", "4")]


@needs_netns
def test_real_two_host_job_plain_and_profiled(tmp_path: Path) -> None:
    """A real 2-host DDP job through the harness, unprofiled then profiled (one `dpro profile` per
    host); the trace replays."""
    train = [PY, str(TRAIN), "--model", "mlp", "--batch-size", "16", "--threads", "1", "--backend", "gloo",
             "--warmup", "2", "--quiet"]
    log = open(tmp_path / "jobs.log", "w")
    plain = run_job(train + ["--iters", "6", "--json-out", str(tmp_path / "plain.json")], hosts=2,
                    rate_mbit=1000, prefix=PREFIX, log=log, timeout=120)
    assert plain.ok, (tmp_path / "jobs.log").read_text()[-2000:]
    assert job_iteration_ms(tmp_path / "plain.json") > 0
    trace = tmp_path / "trace"
    prof = run_job(train + ["--iters", "8"], hosts=2, rate_mbit=1000, profile=trace, steps="4:7",
                   env={"DPRO_QUIET": "1"}, prefix=PREFIX, log=log, timeout=120)
    assert prof.ok, (tmp_path / "jobs.log").read_text()[-2000:]
    assert sorted(p.name for p in trace.iterdir() if p.is_dir()) == ["host0", "host1"]
    rep = subprocess.run([PY, "-m", "dpro_kit.cli", "replay", str(trace), "--json", "-q"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["iteration_time_ms"] > 0 and len(doc["nodes"]) == 2
    assert _ours_left()[1] == []


def test_alternate_and_paired_ratios() -> None:
    calls: list[str] = []
    vals = {"a": iter([10.0, 12.0, 11.0]), "b": iter([5.0, 7.0, 5.0])}

    def variant(name: str):
        return lambda: (calls.append(name), next(vals[name]))[1]
    rounds = alternate({"a": variant("a"), "b": variant("b")}, 3)
    assert calls == ["a", "b"] * 3 and rounds == {"a": [10.0, 12.0, 11.0], "b": [5.0, 7.0, 5.0]}
    assert paired_ratio(rounds, "a", "b") == 2.0          # median of 2.0, 1.714, 2.2
    buf = io.StringIO()
    text = paired_table(rounds, "b", file=buf)
    assert "| a | 11.00 | 10.00 .. 12.00 | 3 | 2.000 |" in text and buf.getvalue().strip() == text
    shuffled = alternate({"a": lambda: 1.0, "b": lambda: 2.0, "c": lambda: 3.0}, 4, shuffle_seed=0)
    assert shuffled == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}


needs_cpuset = pytest.mark.skipif(jobs.cgroup_cpu_root() is None or jobs.cgroup_cpuset_root() is None,
                                  reason="no writable cgroup v1 cpu and cpuset controllers (/sys/fs/cgroup/cpu, cpuset)")

# what a pinned host's process sees: the cores it may run on and its cgroups
PIN_PROBE = textwrap.dedent(r"""
    import json, os, sys, threading
    cg = {l.split(":")[1]: l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup")}
    seen = []
    t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))   # a thread it starts
    t.start(); t.join()
    json.dump({"affinity": sorted(os.sched_getaffinity(0)), "thread_affinity": seen[0],
               "cpu": cg.get("cpu"), "cpuset": cg.get("cpuset")}, open(sys.argv[1], "w"))
""")


def test_core_layout_parsing_and_load() -> None:
    """Kernel cpu lists, and each core's quota sum under a layout (3 hosts at 0.5 on 2 cores)."""
    assert jobs.parse_cpu_list("0") == [0] and jobs.parse_cpu_list("0,2-3") == [0, 2, 3]
    for bad in ("", "a", "1-0", "0-", "-1"):
        with pytest.raises(ValueError):
            jobs.parse_cpu_list(bad)
    assert jobs.core_load(["0", "0", "1"], [0.5, 0.5, 0.5]) == {0: 1.0, 1: 0.5}
    assert jobs.core_load(["0-1", "1"], [1.0, 0.25]) == {0: 0.5, 1: 0.75}


@needs_cpuset
def test_cpuset_layout_pins_each_host(tmp_path: Path) -> None:
    """cpusets=[...]: each host's processes (and the threads they start) run only on its cores, in a
    cpuset group whose cpuset.cpus is its list, beside its cpu quota group; both removed after."""
    have = jobs.parse_cpu_list((jobs.CGROUP_CPUSET_ROOT / "cpuset.effective_cpus").read_text())
    layout = [str(have[-1]), str(have[0])]          # reversed, so the order is checked on >= 2 cores
    cpuset_files: dict[str, str] = {}

    def watch() -> None:   # the cpuset groups' files, read from outside while the job runs
        deadline = time.time() + 20
        while time.time() < deadline and len(cpuset_files) < 2:
            for g in jobs.CGROUP_CPUSET_ROOT.glob(f"{PREFIX}-{__import__('os').getpid()}-*/host*"):
                try:
                    if (g / "cgroup.procs").read_text().split():
                        cpuset_files[g.name] = (g / "cpuset.cpus").read_text().strip()
                except OSError:
                    continue
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    r = run_job([PY, "-c", PIN_PROBE + "\nimport time; time.sleep(2)", str(tmp_path / "h{i}.json")], hosts=2,
                cpus_per_host=[0.5, 0.25], cpu_period_us=10000, cpusets=layout, prefix=PREFIX, timeout=60)
    t.join()
    assert r.ok, r
    assert cpuset_files == {"host0": layout[0], "host1": layout[1]}
    for i in range(2):
        doc = json.loads((tmp_path / f"h{i}.json").read_text())
        assert doc["affinity"] == [int(layout[i])] and doc["thread_affinity"] == [int(layout[i])], doc
        assert doc["cpuset"] == doc["cpu"] == "/" + str(r.cgroups[i].relative_to(jobs.CGROUP_CPU_ROOT)), doc
    name = r.cgroups[0].parent.name
    assert not (jobs.CGROUP_CPUSET_ROOT / name).exists() and not (jobs.CGROUP_CPU_ROOT / name).exists()
    assert not list(jobs.CGROUP_CPUSET_ROOT.glob(f"{PREFIX}-*"))


@needs_cpuset
def test_busy_neighbour_shares_the_hosts_core(tmp_path: Path) -> None:
    """neighbours={1: 512}: a real busy loop spins on host1's core, in a cpu group of its own with
    cpu.shares 512, beside host1 (no quota: cpus None); it really runs (its CPU time grows); the
    neighbour and every group are gone after the job (also the cpuset ones)."""
    import os
    have = jobs.parse_cpu_list((jobs.CGROUP_CPUSET_ROOT / "cpuset.effective_cpus").read_text())
    layout = [str(have[0]), str(have[-1])]
    seen: dict[str, object] = {}

    def watch() -> None:   # the groups and the neighbour process, read from outside while the job runs
        deadline = time.time() + 20
        while time.time() < deadline and "nb_cpu_ms" not in seen:
            for parent in jobs.CGROUP_CPU_ROOT.glob(f"{PREFIX}-{os.getpid()}-*"):
                try:
                    pids = (parent / "nb1" / "cgroup.procs").read_text().split()
                    if not pids or not (parent / "host1" / "cgroup.procs").read_text().split():
                        continue
                    seen["quotas"] = [(parent / f"host{i}" / "cpu.cfs_quota_us").read_text().strip() for i in range(2)]
                    seen["shares"] = (parent / "nb1" / "cpu.shares").read_text().strip()
                    seen["groups"] = sorted(g.name for g in parent.iterdir() if g.is_dir())
                    pid = int(pids[0])
                    seen["pid"] = pid
                    seen["affinity"] = sorted(os.sched_getaffinity(pid))
                    seen["cpuset"] = [ln.split(":", 2)[2].strip() for ln in open(f"/proc/{pid}/cgroup")
                                      if ln.split(":")[1] == "cpuset"][0]
                    c0 = int(open(f"/proc/{pid}/schedstat").read().split()[0])
                    time.sleep(0.3)
                    seen["nb_cpu_ms"] = (int(open(f"/proc/{pid}/schedstat").read().split()[0]) - c0) / 1e6
                except (OSError, IndexError):
                    continue
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    r = run_job([PY, "-c", PIN_PROBE + "\nimport time; time.sleep(2)", str(tmp_path / "h{i}.json")], hosts=2,
                cpusets=layout, neighbours={1: 512}, prefix=PREFIX, timeout=60)
    t.join()
    assert r.ok, r
    assert seen["quotas"] == ["-1", "-1"] and seen["shares"] == "512", seen
    assert seen["groups"] == ["host0", "host1", "nb1"], seen
    assert seen["affinity"] == [int(layout[1])], seen                          # on host1's core ...
    assert seen["cpuset"] == "/" + str(r.cgroups[1].relative_to(jobs.CGROUP_CPU_ROOT)), seen   # ... in its cpuset group
    assert seen["nb_cpu_ms"] > 0, seen                                         # and it really spins
    for i in range(2):
        doc = json.loads((tmp_path / f"h{i}.json").read_text())
        assert doc["affinity"] == [int(layout[i])], doc
    assert not Path(f"/proc/{seen['pid']}").exists()
    name = r.cgroups[0].parent.name
    assert not (jobs.CGROUP_CPUSET_ROOT / name).exists() and not (jobs.CGROUP_CPU_ROOT / name).exists()


def test_neighbour_weight() -> None:
    """The neighbour's cpu.shares that slows a 1024-weight host by F: F*(1024+base) - 1024."""
    assert [jobs.neighbour_weight(f) for f in (1.0, 1.25, 1.5, 2.0)] == [2, 256, 512, 1024]
    assert [jobs.neighbour_weight(f, 1024) for f in (1.0, 1.5, 2.0)] == [1024, 2048, 3072]
    from dpro_kit.errors import DproError
    with pytest.raises(DproError, match="factor >= 1"):
        jobs.neighbour_weight(0.8)


@needs_cpuset
def test_cpuset_layout_bad_input() -> None:
    """A core layout that does not fit: one line naming the host and what is wrong; nothing is made."""
    from dpro_kit.errors import DproError
    have = jobs.parse_cpu_list((jobs.CGROUP_CPUSET_ROOT / "cpuset.effective_cpus").read_text())
    cases = [(["0", "x"], "cpuset of host1: not a cpu list: 'x'"),
             (["0", str(max(have) + 1)], f"cpuset of host1: CPU(s) [{max(have) + 1}] not on this machine"),
             (["0"], "a core layout needs one cpu list per host (2)")]
    for layout, msg in cases:
        with pytest.raises(DproError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                           .replace(")", r"\)")):
            jobs.CpuBudget(2, 0.5, prefix=PREFIX, cpusets=layout)
    with pytest.raises(DproError, match="needs cpus .a quota per host. or cpusets"):
        jobs.CpuBudget(1, None, prefix=PREFIX)
    assert _ours_left()[0] == [] and not list(jobs.CGROUP_CPUSET_ROOT.glob(f"{PREFIX}-*"))
    for kw, msg in [(dict(neighbours={1: 512}), "busy neighbours need a core layout"),
                    (dict(cpusets=["0", "0"], neighbours={2: 512}), "busy neighbour of host 2: no such host"),
                    (dict(cpusets=["0", "0"], neighbours={1: 1}), "busy neighbour of host1: cpu.shares 1 is not")]:
        with pytest.raises(DproError, match=msg):
            jobs.CpuBudget(2, None if "cpusets" in kw else 1.0, prefix=PREFIX, **kw)
    assert _ours_left()[0] == [] and not list(jobs.CGROUP_CPUSET_ROOT.glob(f"{PREFIX}-*"))


@needs_cpuset
def test_cpuset_layout_without_quota(tmp_path: Path) -> None:
    """cpusets without cpus_per_host: each host pinned to its core, its cpu group has no CFS quota
    (cfs_quota_us -1: the kernel never throttles it), and the collector's reader of the quota says
    "unlimited" (None); the budget counts the host's cores as its CPUs."""
    have = jobs.parse_cpu_list((jobs.CGROUP_CPUSET_ROOT / "cpuset.effective_cpus").read_text())
    layout = [str(have[-1]), str(have[0])]
    probe = PIN_PROBE.replace("json.dump({", "sys.path.insert(0, sys.argv[2]); from dpro_torch.recorder import "
                              "cgroup_cpu_limit\nq = open('/sys/fs/cgroup/cpu' + cg['cpu'] + '/cpu.cfs_quota_us')"
                              ".read().strip()\njson.dump({'quota': q, 'limit': cgroup_cpu_limit(), ")
    r = run_job([PY, "-c", probe, str(tmp_path / "h{i}.json"), str(ROOT / "collectors" / "torch")], hosts=2,
                cpusets=layout, prefix=PREFIX, timeout=60)
    assert r.ok, r
    for i in range(2):
        doc = json.loads((tmp_path / f"h{i}.json").read_text())
        assert doc["affinity"] == [int(layout[i])] and doc["thread_affinity"] == [int(layout[i])], doc
        assert doc["quota"] == "-1" and doc["limit"] is None, doc
        assert doc["cpu"] == "/" + str(r.cgroups[i].relative_to(jobs.CGROUP_CPU_ROOT)), doc
    with jobs.CpuBudget(2, None, prefix=PREFIX, cpusets=layout) as b:
        assert b.quotas_us is None and b.quota_us is None and b.cpus_per_host == [1.0, 1.0]
        assert (b.groups[0] / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert b.core_load == {have[0]: 1.0, have[-1]: 1.0} if len(have) > 1 else {have[0]: 2.0}
    assert _ours_left()[0] == [] and not list(jobs.CGROUP_CPUSET_ROOT.glob(f"{PREFIX}-*"))
