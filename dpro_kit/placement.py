"""Where ranks ran on CPUs, and what that means for a prediction.

The replayer gives every rank its own compute device (dPRO §4.3).  When
several ranks of one machine run more torch threads than the CPUs they may
use, they time-share cores: each profiled op time carries the contention of
that run (a neighbour computing at the same moment, gloo threads waiting for
a core).  Replaying the same placement reproduces it - on the 2-core test VM,
rows with 3 or 4 ranks on 2 cores were within -2 ... +6 % once the ring DFG
was right (docs/accuracy.md) - but nothing in the graph knows about it, so a
what-if that changes how many ranks share a core (``--world-size`` on one
machine, going from shared to dedicated cores) cannot follow: 2 ranks with a
core each, asked for 4 ranks that then shared the 2 cores, was predicted 21 %
too fast.  Merging the ranks of a core into one device was tried and not kept
(docs/accuracy.md, "Tried and rejected").

So the tool says so: :func:`shared_core_groups` finds the ranks that
time-share cores from what the collector recorded
(``manifest.extra.cpu_placement``: each rank's CPU set, the machine's boot id -
shared by network namespaces and containers of one machine - and torch's
thread count), and :func:`placement_warnings` words it for ``dpro replay`` and
``dpro report``.  Likewise ranks that shared one GPU (:func:`shared_gpu_groups`, from the CUDA
device the collector recorded): without MPS the GPU time-slices between their processes, so
every NCCL collective also waits for the other ranks' slices (docs/accuracy.md, "On a GPU").
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import networkx as nx

from .schema import Facts

__all__ = ["shared_core_groups", "shared_gpu_groups", "cpu_limited", "placement_warnings", "world_size_warnings"]

#: a rank is CPU-limited when its cgroup's quota stopped it for at least this share of a step, or it used
#: at least CPU_LIMIT_BUSY of its limit
CPU_LIMIT_THROTTLED = 0.02
CPU_LIMIT_BUSY = 0.9


@dataclass(frozen=True)
class _Rank:
    node: str
    machine: str
    cpus: frozenset[int]   # empty when not recorded
    threads: int
    count: int             # the machine's CPUs, 0 when not recorded


def _ranks(extra: dict[str, Any] | None) -> list[_Rank]:
    """The collector's ``cpu_placement`` entries, read leniently (older traces have none)."""
    placement = Facts.from_extra(extra if isinstance(extra, dict) else {}).cpu_placement
    out = []
    for node, p in placement.items():
        aff, thr, cnt = p.get("affinity"), p.get("threads"), p.get("count")
        out.append(_Rank(node=str(node), machine=str(p.get("machine") or str(node).split("/", 1)[0]),
                         cpus=frozenset(int(c) for c in aff) if isinstance(aff, list) else frozenset(),
                         threads=thr if isinstance(thr, int) and thr > 0 else 1,
                         count=cnt if isinstance(cnt, int) and cnt > 0 else 0))
    return out


def shared_core_groups(extra: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Groups of ranks on one machine whose torch threads outnumber the CPUs they may use.

    Ranks whose CPU sets intersect are joined (connected components); a group is
    reported when the sum of its ranks' torch threads exceeds the CPUs in the
    union of their sets.  Ranks without a recorded CPU set are skipped (older
    traces, non-Linux).  Returns ``[{"nodes", "machine", "cpus", "threads"}]``.
    """
    by_machine: dict[str, list[_Rank]] = defaultdict(list)
    for r in _ranks(extra):
        if r.cpus:
            by_machine[r.machine].append(r)
    groups = []
    for machine, ranks in by_machine.items():
        g = nx.Graph()
        g.add_nodes_from(range(len(ranks)))
        g.add_edges_from((i, j) for i in range(len(ranks)) for j in range(i + 1, len(ranks))
                         if ranks[i].cpus & ranks[j].cpus)
        for comp in nx.connected_components(g):
            members = [ranks[i] for i in comp]
            cpus = frozenset().union(*(r.cpus for r in members))
            threads = sum(r.threads for r in members)
            if len(members) > 1 and threads > len(cpus):
                groups.append({"nodes": sorted(r.node for r in members), "machine": machine,
                               "cpus": sorted(cpus), "threads": threads})
    return sorted(groups, key=lambda d: d["nodes"])


def shared_gpu_groups(extra: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Groups of ranks of one machine that used the same GPU (the collector's ``cpu_placement[node].gpu``:
    the device's uuid; ranks without one are skipped).  Returns ``[{"nodes", "gpu", "mps"}]``,
    ``mps`` true when every rank of the group ran with the CUDA MPS daemon."""
    placement = Facts.from_extra(extra if isinstance(extra, dict) else {}).cpu_placement
    by_gpu: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for node, p in placement.items():
        gpu = p.get("gpu")
        if isinstance(gpu, dict) and gpu.get("uuid"):
            machine = str(p.get("machine") or str(node).split("/", 1)[0])
            by_gpu[(machine, str(gpu["uuid"]))].append((str(node), gpu))
    return sorted(({"nodes": sorted(n for n, _ in members), "gpu": str(members[0][1].get("name") or key[1]),
                    "mps": all(bool(g.get("mps")) for _, g in members)}
                   for key, members in by_gpu.items() if len(members) > 1), key=lambda d: d["nodes"])


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus) if len(cpus) <= 8 else f"{len(cpus)} CPUs"


def cpu_limited(extra: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Ranks whose cgroup's CPU quota held them back in the unprofiled steps.

    From what the collector recorded (``manifest.extra.cpu_use``: the process's CPU time and its
    cgroup's ``cpu.stat`` throttled time per step, the quota as CPUs): a rank is listed when its
    quota stopped it for at least :data:`CPU_LIMIT_THROTTLED` of a step or it used at least
    :data:`CPU_LIMIT_BUSY` of its limit.  Such a rank computes (and, with gloo, moves bytes) at the
    speed of its quota: the replay reproduces the profiled run, but any what-if that adds work to
    that rank, or a quota cut, slows it by more than its traced op times say (docs/stragglers.md).
    """
    facts = Facts.from_extra(extra if isinstance(extra, dict) else {})
    out = []
    for node, u in sorted(facts.cpu_use.items()):
        limit, cpus, thr = u.get("limit_cpus"), u.get("cpus"), u.get("throttled_us")
        step_us = (facts.measured_iteration_ms_per_node.get(node) or 0.0) * 1e3
        thr_share = thr / step_us if thr is not None and step_us > 0 else None
        busy = cpus / limit if cpus is not None and limit else None
        if (thr_share is not None and thr_share >= CPU_LIMIT_THROTTLED) or (busy is not None and busy >= CPU_LIMIT_BUSY):
            out.append({"node": node, "limit_cpus": limit, "cpus": cpus, "throttled_ms": thr / 1e3 if thr is not None
                        else None, "throttled_share": thr_share})
    return out


def placement_warnings(extra: dict[str, Any] | None) -> list[str]:
    """One sentence per group of :func:`shared_core_groups`, for the user."""
    return [f"ranks {', '.join(grp['nodes'])} time-share CPU(s) {_cpus(grp['cpus'])} "
            f"({grp['threads']} torch threads on {len(grp['cpus'])} CPU(s) of one machine): their op "
            "times include that contention, which the replay does not model; predictions hold for this "
            "placement, not for what-ifs that change how many ranks share a core "
            "(docs/accuracy.md, 'Ranks sharing cores')" for grp in shared_core_groups(extra)] + [
        f"ranks {', '.join(grp['nodes'])} share one GPU ({grp['gpu']}) "
        + ("under MPS: their kernels share its SMs at once, which the replay (a GPU per rank) does not model"
           if grp["mps"] else
           "without MPS: the GPU runs one process's kernels at a time, so a collective also waits for the other "
           "ranks' time slices (~2.3 ms each on an H100), which the replay (a GPU per rank) does not model; it "
           "predicts too fast")
        + " (docs/accuracy.md, 'On a GPU')" for grp in shared_gpu_groups(extra)] + [
        f"{r['node']} is held back by its cgroup's CPU limit ({r['limit_cpus']:g} CPU): "
        + (f"used {r['cpus']:.2f} CPU per step" if r["cpus"] is not None else "")
        + (f"{', ' if r['cpus'] is not None else ''}stopped {r['throttled_ms']:.1f} ms per step by the quota"
           if r["throttled_ms"] is not None else "")
        + "; its op times carry that, and a what-if adding work to it, or a smaller quota, slows it more than "
          "its traced times say (raise the limit, or docs/stragglers.md)" for r in cpu_limited(extra)]


def world_size_warnings(extra: dict[str, Any] | None, world_size: int) -> list[str]:
    """A ``--world-size`` what-if from a job whose ranks all ran on one machine.

    The what-if replicates the profiled ranks with their op times, i.e. as if
    every added rank had cores like theirs (new machines).  When the target
    world would not fit the profiled machine's CPUs (ranks x torch threads >
    CPUs) and the user means to run it there, the ranks will time-share cores
    and the prediction is too fast (2 -> 4 ranks on 2 cores: -22 %).
    """
    ranks = _ranks(extra)
    if len({r.machine for r in ranks}) != 1 or not all(r.count for r in ranks):
        return []
    threads, cpus = max(r.threads for r in ranks), min(r.count for r in ranks)
    if world_size * threads <= cpus:
        return []
    return [f"--world-size {world_size}: the added ranks are replayed with the profiled ranks' op times, as if "
            f"each had cores of its own; the profiled ranks all ran on one machine with {cpus} CPU(s), where "
            f"{world_size} ranks x {threads} torch thread(s) would time-share cores and run slower than predicted "
            "(docs/accuracy.md, 'Ranks sharing cores')"]
