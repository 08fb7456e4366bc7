"""Where ranks ran on CPUs, and when that is outside what the replayer models.

The replayer gives every rank its own compute device (dPRO §4.3).  That holds
when each rank has its own cores (or its own GPU).  When several ranks of one
machine are pinned to - or simply crowd - fewer cores than they run threads,
they time-share the cores: a rank's ops are slowed by whatever its neighbours
do at that moment, and its collectives wait for peers that are descheduled.
Neither is in the DFG, and the profiled op durations carry one particular mix
of it.  On the 2-core test VM, 4 ranks on 2 cores were predicted 15-19 % too
fast while 2 ranks on 2 cores were within 6 % (docs/accuracy.md).  Merging
the ranks of a core into one device, with op durations deflated by their
measured overlap, was tried and not kept (docs/accuracy.md, "Tried and
rejected").

So the tool says so instead of guessing: :func:`shared_core_groups` finds the
ranks that time-share cores from what the collector recorded
(``manifest.extra.cpu_placement``: each rank's CPU set, the machine's boot id -
shared by network namespaces and containers of one machine - and torch's
thread count), and :func:`placement_warnings` words it for ``dpro replay``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import networkx as nx

__all__ = ["shared_core_groups", "placement_warnings"]


def shared_core_groups(extra: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Groups of ranks on one machine whose torch threads outnumber the CPUs they may use.

    Ranks whose CPU sets intersect are joined (connected components); a group is
    reported when the sum of its ranks' torch threads exceeds the CPUs in the
    union of their sets.  Ranks without a recorded CPU set are skipped (older
    traces, non-Linux).  Returns ``[{"nodes", "machine", "cpus", "threads"}]``.
    """
    placement = (extra or {}).get("cpu_placement")
    if not isinstance(placement, dict):
        return []
    by_machine: dict[str, dict[str, tuple[frozenset[int], int]]] = defaultdict(dict)
    for node, p in placement.items():
        if not isinstance(p, dict) or not isinstance(p.get("affinity"), list) or not p["affinity"]:
            continue
        machine = str(p.get("machine") or node.split("/", 1)[0])
        threads = p.get("threads") if isinstance(p.get("threads"), int) and p["threads"] > 0 else 1
        by_machine[machine][str(node)] = (frozenset(int(c) for c in p["affinity"]), threads)
    groups = []
    for machine, ranks in by_machine.items():
        g = nx.Graph()
        g.add_nodes_from(ranks)
        names = sorted(ranks)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if ranks[a][0] & ranks[b][0]:
                    g.add_edge(a, b)
        for comp in nx.connected_components(g):
            if len(comp) < 2:
                continue
            cpus = frozenset().union(*(ranks[n][0] for n in comp))
            threads = sum(ranks[n][1] for n in comp)
            if threads > len(cpus):
                groups.append({"nodes": sorted(comp), "machine": machine, "cpus": sorted(cpus),
                               "threads": threads})
    return sorted(groups, key=lambda d: d["nodes"])


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus) if len(cpus) <= 8 else f"{len(cpus)} CPUs"


def placement_warnings(extra: dict[str, Any] | None) -> list[str]:
    """One sentence per group of :func:`shared_core_groups`, for the user."""
    out = []
    for grp in shared_core_groups(extra):
        out.append(f"ranks {', '.join(grp['nodes'])} time-share CPU(s) {_cpus(grp['cpus'])} "
                   f"({grp['threads']} torch threads on {len(grp['cpus'])} CPU(s) of one machine): the replay "
                   "gives each rank its own compute device, so contention between them is not modelled; "
                   "expect larger errors (docs/accuracy.md, 'Ranks sharing cores')")
    return out
