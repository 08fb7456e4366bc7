"""Clock probe: NTP-style ping-pong between rank 0 and one rank of every other host.

Collective-level traces (one range per gloo / NCCL collective) relate the hosts' clocks only
as well as the ends of one collective agree across ranks, which on a loaded machine or a slow
link is 0.1-5 ms (docs/alignment.md).  The collector therefore measures the offsets directly
when the profiling window opens (every rank opens it at the same step boundary): rank 0 sends a
one-element tensor to the first rank of each other host and waits for the echo, ``pings`` times
per host, on the job's own process group (no extra connection, no extra port).

Per ping, rank 0 records ``t1`` (before send) and ``t4`` (after the echo arrived), the peer
``t2`` (its receive returned) and ``t3`` (before sending the echo back), every reading
``time.time_ns()`` of the process that took it - the clock the reader puts Kineto times on.
With ``theta`` = a clock's offset (its reading = true time + theta), causality proves

    t3 - t4  <=  theta_peer - theta_0  <=  t2 - t1

for every ping; ``dpro_kit.align`` intersects these intervals and takes the midpoint of the
fastest pings as the estimate (symmetric one-way delays).  Each process keeps only its own
readings (``meta.json["clock_probe"]``), so a host whose clock is wrong records all of them
wrong, exactly like its trace.

Standard library and torch only: this module is loaded into the user's job.
"""
from __future__ import annotations

import os
import time
from typing import Any

PINGS = 16
SKIP = 2        # the first echoes also absorb the ranks' arrival skew at the window boundary
MAX_HOSTS = 64  # beyond this many hosts only the first MAX_HOSTS are probed (rank 0 serves them one by one)


def probe(pg: Any, host: str, *, device: Any = None, pings: int | None = None) -> dict[str, Any] | None:
    """Run the probe on process group ``pg``; every rank of ``pg`` must call it at the same point.

    Parameters
    ----------
    pg : torch.distributed.ProcessGroup
        The job's process group (a DDP module's).
    host : str
        This rank's host name as dpro records it (``--host`` / ``DPRO_HOST``).
    device : torch.device, optional
        Where the ping tensor lives (a CUDA device for NCCL groups).
    pings : int, optional
        Round trips per probed host (default :data:`PINGS`, ``DPRO_CLOCK_PINGS``).

    Returns
    -------
    dict or None
        This rank's readings: ``{"role": "client", "peers": {rank: [[t1, t4], ...]}, "hosts": [...]}``
        on rank 0, ``{"role": "server", "peer": 0, "rows": [[t2, t3], ...], ...}`` on a probed
        rank, ``{"role": "none", ...}`` on the others; None when the group has one host.
    """
    import torch
    import torch.distributed as dist

    n = int(pings if pings is not None else os.environ.get("DPRO_CLOCK_PINGS", PINGS))
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, str(host), group=pg)
    leaders: list[int] = []
    seen = {hosts[0]}
    for r, h in enumerate(hosts):
        if h not in seen:
            seen.add(h)
            leaders.append(r)
    leaders = leaders[:MAX_HOSTS]
    if not leaders or n <= 0:
        return None
    # global ranks for send/recv (they address the default group's numbering)
    glob = [dist.get_global_rank(pg, r) if pg is not None and pg is not dist.group.WORLD else r
            for r in range(world)] if hasattr(dist, "get_global_rank") else list(range(world))
    buf = torch.zeros(1, device=device)
    cuda = device is not None and str(device).startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    doc: dict[str, Any] = {"version": 1, "clock": "time.time_ns()", "pings": n, "skip": SKIP,
                           "hosts": hosts, "probed_ranks": leaders}
    if rank == 0:
        peers: dict[str, list[list[int]]] = {}
        for r in leaders:
            rows = []
            for _ in range(n):
                sync()
                t1 = time.time_ns()
                dist.send(buf, glob[r], group=pg)
                dist.recv(buf, glob[r], group=pg)
                sync()
                t4 = time.time_ns()
                rows.append([t1, t4])
            peers[str(r)] = rows
        doc.update(role="client", peers=peers)
    elif rank in leaders:
        rows = []
        for _ in range(n):
            dist.recv(buf, glob[0], group=pg)
            sync()
            t2 = time.time_ns()
            t3 = time.time_ns()
            dist.send(buf, glob[0], group=pg)
            rows.append([t2, t3])
        sync()
        doc.update(role="server", peer=0, rows=rows)
    else:
        doc.update(role="none")
    dist.barrier(group=pg)   # no rank starts its profiled iteration while rank 0 is still probing
    return doc
