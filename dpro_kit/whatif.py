"""What-if transforms: predict a configuration that was not profiled from one that was.

Each transform maps a :class:`~dpro_kit.trace.TraceSet` (or a comm model) to
a new one; the global DFG is then built and replayed as usual.  The comm model
must be fitted on the *profiled* trace first (its collectives are the
evidence), then transformed — see :func:`apply`.

* :func:`rebucket` — re-group gradients into DDP buckets of another size
  (needs per-parameter gradient sizes and ready ops, which ``dpro_torch``
  records);
* :func:`scale_world` — replicate workers to another world size and re-form
  the ring (one more host per added rank, like the profiled placement);
* :func:`with_bandwidth` — links of another line rate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from .costmodel import CommModel, LinkModel
from .errors import DproError
from .trace import Collective, NodeInfo, TraceSet

#: PyTorch DDP's cap for the first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
#: TCP payload / Ethernet frame bytes at MTU 1500 (1448 / 1514): goodput of a line rate
TCP_EFFICIENCY = 1448 / 1514


def ddp_bucket_assignment(sizes: list[int], cap: int, first_cap: int = DDP_FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Group tensors (in reduction order) like DDP's ``compute_bucket_assignment_by_size``.

    A bucket is closed as soon as its size reaches its limit: ``first_cap`` for
    the first bucket, ``cap`` for the others.
    """
    buckets: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, b in enumerate(sizes):
        cur.append(i)
        size += int(b)
        if size >= (first_cap if not buckets else cap):
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def rebucket(ts: TraceSet, bucket_bytes: int, first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> TraceSet:
    """The same job with its AllReduce gradients re-grouped into buckets of ``bucket_bytes``.

    Parameters keep the order in which the trace's buckets reduced them (DDP's
    gradient-ready order).  A new bucket is ready when its last gradient is,
    and it is launched after the buckets before it (``inputs`` accumulate).
    Every bucket is waited for by the ops that waited for the old ones.
    """
    ar = [c for c in ts.collectives if c.op == "allreduce"]
    if not ar:
        raise DproError("the trace has no allreduce to re-bucket", path=ts.path)
    for c in ar:
        if len(c.param_bytes) != len(c.params) or any(len(c.param_ready.get(n, [])) != len(c.params)
                                                       for n in c.participants):
            raise DproError(f"tensor {c.tensor!r} has no per-parameter gradient sizes/ready ops", path=ts.path,
                            hint="re-bucketing needs a trace from a collector that records them (dpro_torch does)")
    nodes = ar[0].participants
    params = [p for c in ar for p in c.params]
    sizes = [b for c in ar for b in c.param_bytes]
    ready = {n: [op for c in ar for op in c.param_ready[n]] for n in nodes}
    outputs = {n: list(dict.fromkeys(o for c in ar for o in c.outputs.get(n, []))) for n in nodes}
    groups = ddp_bucket_assignment(sizes, bucket_bytes, first_bucket_bytes)
    new: list[Collective] = []
    for j, idx in enumerate(groups):
        upto = [i for g in groups[:j + 1] for i in g]
        new.append(Collective(
            tensor=f"bucket{j}", op="allreduce", algorithm=ar[0].algorithm, bytes=sum(sizes[i] for i in idx),
            participants=list(nodes), params=[params[i] for i in idx], param_bytes=[sizes[i] for i in idx],
            param_ready={n: [ready[n][i] for i in idx] for n in nodes},
            inputs={n: list(dict.fromkeys(ready[n][i] for i in upto)) for n in nodes},
            outputs={n: list(outputs[n]) for n in nodes}))
    others = [c for c in ts.collectives if c.op != "allreduce"]
    return replace(ts, collectives=new + others)


def scale_world(ts: TraceSet, world_size: int) -> TraceSet:
    """The same job on ``world_size`` workers: worker ``i`` behaves like profiled worker ``i mod W``.

    Profiled workers keep their names and hosts; added ranks go on new hosts
    with as many ranks per host as the profiled job had (so a job profiled with
    one rank per host grows one host per rank).
    """
    m = ts.manifest
    workers = m.workers()
    w = len(workers)
    if world_size < 1:
        raise DproError(f"world size must be >= 1, got {world_size}")
    hosts = list(dict.fromkeys(m.nodes[n].host for n in workers))
    # one machine stays one machine; otherwise keep the profiled ranks-per-host
    per_host = world_size if len(hosts) == 1 else max(1, -(-w // len(hosts)))
    src = {}
    nodes = {n: i for n, i in m.nodes.items() if i.role != "worker"}
    for r in range(world_size):
        if r < w:
            name, info = workers[r], m.nodes[workers[r]]
        else:
            host = hosts[r // per_host] if r // per_host < len(hosts) else f"whatif-host{r // per_host}"
            name, info = f"{host}/{r}", NodeInfo(host=host, role="worker", rank=r)
        nodes[name] = info
        src[name] = workers[r % w]
    frames = []
    for name, s in src.items():
        ev = ts.events[ts.events["node"] == s].copy()
        ev["node"] = name
        ev["host"] = nodes[name].host
        frames.append(ev)
    frames.append(ts.events[~ts.events["node"].isin(workers)])
    events = pd.concat(frames, ignore_index=True)
    for col in ts.events.columns:
        events[col] = events[col].astype(ts.events[col].dtype)
    edges = {n: list(ts.edges.get(s, [])) for n, s in src.items()}
    edges.update({n: e for n, e in ts.edges.items() if n not in workers})
    colls = []
    for c in ts.collectives:
        def per_node(d: dict[str, list[str]]) -> dict[str, list[str]]:
            out = {n: list(d[s]) for n, s in src.items() if s in d}
            out.update({n: v for n, v in d.items() if n not in workers})
            return out
        colls.append(replace(c, participants=[n for n in src if src[n] in c.participants],
                             inputs=per_node(c.inputs), outputs=per_node(c.outputs),
                             param_ready=per_node(c.param_ready)))
    # measured times belong to the profiled world size
    man = replace(m, world_size=world_size, nodes=nodes,
                  extra={k: v for k, v in m.extra.items() if not k.startswith("measured_")})
    return replace(ts, manifest=man, events=events, edges=edges, collectives=colls)


def with_bandwidth(model: CommModel, mbps: float, efficiency: float = TCP_EFFICIENCY) -> CommModel:
    """``model`` with every link at ``mbps`` Mbit/s line rate (goodput = rate x ``efficiency``).

    The fitted latency is kept; per-link overrides are dropped (all links get the new rate).
    """
    if not mbps > 0:
        raise DproError(f"bandwidth must be > 0 Mbit/s, got {mbps}")
    bw = mbps * 1e6 / 8 * efficiency
    return CommModel(default=LinkModel(latency_us=model.default.latency_us, bandwidth_Bps=bw), per_link={},
                     origin=f"what-if {mbps:g} Mbit/s (latency {model.origin})")


@dataclass
class WhatIf:
    """A set of what-if changes, as the CLI takes them."""

    bucket_mb: float | None = None
    #: None: the same as ``bucket_mb`` - what DDP does when bucket_cap_mb is given (torch 2.13;
    #: only its default, bucket_cap_mb=None, uses a 1 MiB first bucket)
    first_bucket_mb: float | None = None
    bandwidth_mbps: float | None = None
    world_size: int | None = None

    def any(self) -> bool:
        return self.bucket_mb is not None or self.bandwidth_mbps is not None or self.world_size is not None

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and (k != "first_bucket_mb" or
                                                                           self.bucket_mb is not None)}


def apply(ts: TraceSet, model: CommModel, w: WhatIf) -> tuple[TraceSet, CommModel]:
    """Apply ``w`` to a trace and its fitted comm model (re-bucket, then scale, then re-rate)."""
    if ts.manifest.facts.plain_kineto and (w.bucket_mb is not None or w.bandwidth_mbps is not None):
        # plain torch.profiler input (dpro_kit.readers.kineto_plain): no bucket composition, no link model
        what = "--bucket-mb needs DDP's bucket composition and gradient-ready times" if w.bucket_mb is not None \
            else "--bandwidth-mbps needs a comm model calibrated on the job (NCCL kernel times include waiting)"
        raise DproError(f"{what}, which a plain torch.profiler trace does not record", path=ts.path,
                        hint="profile the job with `dpro profile` (docs/kineto.md); --world-size works here")
    if w.bucket_mb is not None:
        if not w.bucket_mb > 0:
            raise DproError(f"bucket size must be > 0 MB, got {w.bucket_mb}")
        first = w.bucket_mb if w.first_bucket_mb is None else w.first_bucket_mb
        ts = rebucket(ts, int(w.bucket_mb * 2**20), int(first * 2**20))
    if w.world_size is not None:
        ts = scale_world(ts, w.world_size)
    if w.bandwidth_mbps is not None:
        model = with_bandwidth(model, w.bandwidth_mbps)
    return ts, model
