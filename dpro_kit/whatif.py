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
* :func:`with_bandwidth` — links of another line rate;
* :func:`horovod_knobs` — a Horovod job (``readers/horovod.py``) with another fusion
  threshold (``HOROVOD_FUSION_THRESHOLD``) and/or cycle time (``HOROVOD_CYCLE_TIME``);
* :func:`byteps_partition_bytes` — a BytePS job (``readers/byteps.py``) with another
  ``BYTEPS_PARTITION_BYTES``.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from .costmodel import CommModel, LinkModel
from .errors import DproError
from .trace import Collective, NodeInfo, TraceSet, make_events

#: PyTorch DDP's cap for the first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
#: TCP payload / Ethernet frame bytes at MTU 1500 (1448 / 1514): goodput of a line rate
TCP_EFFICIENCY = 1448 / 1514


def ddp_bucket_assignment(sizes: list[int], cap: int, first_cap: int = DDP_FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Group tensors (in reduction order) like DDP's ``compute_bucket_assignment_by_size``.

    A bucket is closed as soon as its size reaches its limit: ``first_cap`` for
    the first bucket, ``cap`` for the others.

    Parameters
    ----------
    sizes : list of int
        Gradient bytes, in reduction order.
    cap : int
        Bucket size limit (bytes), DDP's ``bucket_cap_mb``.
    first_cap : int
        Limit of the first bucket (DDP's default 1 MiB).

    Returns
    -------
    list of list of int
        Indices into ``sizes`` per bucket.
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
    from .graph.schemes import is_allreduce
    ar = [c for c in ts.collectives if is_allreduce(c)]
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
            tensor=f"bucket{j}", op=ar[0].op, algorithm=ar[0].algorithm, bytes=sum(sizes[i] for i in idx),
            participants=list(nodes), params=[params[i] for i in idx], param_bytes=[sizes[i] for i in idx],
            param_ready={n: [ready[n][i] for i in idx] for n in nodes},
            inputs={n: list(dict.fromkeys(ready[n][i] for i in upto)) for n in nodes},
            outputs={n: list(outputs[n]) for n in nodes}))
    others = [c for c in ts.collectives if not is_allreduce(c)]
    return replace(ts, collectives=new + others)


def scale_world(ts: TraceSet, world_size: int) -> TraceSet:
    """The same job on ``world_size`` workers: worker ``i`` behaves like profiled worker ``i mod W``.

    Profiled workers keep their names and hosts; added ranks go on new hosts
    with as many ranks per host as the profiled job had (so a job profiled with
    one rank per host grows one host per rank).

    Parameters
    ----------
    ts : TraceSet
        The profiled job.
    world_size : int
        Workers of the predicted job (>= 1).
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


def scale_servers(ts: TraceSet, servers: int) -> TraceSet:
    """The same parameter-server job on ``servers`` servers (each on its own host).

    Profiled servers keep their names; added ones are ``whatif-server-host<i>/server<i>``.
    Every PS collective is re-partitioned: an MXNet trace (``manifest.extra.bigarray_bound``)
    as ``KVStoreDist::EncodeDefaultKey`` does (:func:`dpro_kit.readers.mxnet.partitions`, the
    collective's position among the PS collectives as its key, 4-byte elements), any other
    trace keeps its partition sizes and places them round-robin.

    Parameters
    ----------
    ts : TraceSet
        The profiled PS job.
    servers : int
        Servers of the predicted job (>= 1).
    """
    from .graph.schemes import SCHEMES
    m = ts.manifest
    if servers < 1:
        raise DproError(f"servers must be >= 1, got {servers}")
    old = m.servers()
    if not old:
        raise DproError("--servers needs a parameter-server trace (the manifest lists no server)", path=ts.path)
    names = old[:servers] + [f"whatif-server-host{i}/server{i}" for i in range(len(old), servers)]
    nodes = {n: i for n, i in m.nodes.items() if i.role != "server" or n in names[:servers]}
    for i, n in enumerate(names):
        if n not in nodes:
            nodes[n] = NodeInfo(host=n.split("/")[0], role="server", rank=i)
    bound = m.extra.get("bigarray_bound") if isinstance(m.extra, dict) else None
    colls, key = [], 0
    for c in ts.collectives:
        s = SCHEMES.get(c.algorithm)
        if s is None or not s.uses_servers:
            colls.append(c)
            continue
        if bound:
            from .readers.mxnet import partitions
            parts = partitions(key, c.bytes // 4, 4, names, int(bound))
        elif _byteps_facts(ts) is not None and c.partitions and "key" in c.partitions[0]:
            parts = _byteps_parts(ts, c, names[:servers], None)
        else:
            parts = [{"bytes": int(p["bytes"]), "server": names[j % servers]} for j, p in enumerate(c.partitions)]
        key += 1
        colls.append(replace(c, partitions=parts))
    events = ts.events[~ts.events["node"].isin([n for n in old if n not in nodes])]
    man = replace(m, nodes=nodes, extra={k: v for k, v in m.extra.items() if not k.startswith("measured_")})
    return replace(ts, manifest=man, events=events, collectives=colls,
                   edges={n: e for n, e in ts.edges.items() if n in nodes})


def _byteps_facts(ts: TraceSet) -> dict[str, Any] | None:
    """``manifest.extra["byteps"]`` of a BytePS trace (:mod:`dpro_kit.readers.byteps`), else None."""
    bp = ts.manifest.extra.get("byteps") if isinstance(ts.manifest.extra, dict) else None
    return bp if isinstance(bp, dict) else None


def _byteps_parts(ts: TraceSet, c: Collective, servers: list[str], partition_bytes: int | None) -> list[dict]:
    """``c``'s partitions as BytePS makes them (:func:`dpro_kit.readers.byteps.partitions`): its declared key
    from the traced partition keys, the trace's partition size unless ``partition_bytes`` is given."""
    from .readers.byteps import partitions
    bp = _byteps_facts(ts) or {}
    pb = int(partition_bytes if partition_bytes is not None else bp.get("partition_bytes", 4096000))
    return partitions(int(c.partitions[0]["key"]) >> 16, c.bytes, pb, servers, str(bp.get("key_hash", "djb2")))


def byteps_partition_bytes(ts: TraceSet, partition_bytes: int) -> TraceSet:
    """The same BytePS job with ``BYTEPS_PARTITION_BYTES = partition_bytes``: every tensor re-partitioned
    and its partitions placed on the servers by BytePS's key hash (:func:`dpro_kit.readers.byteps.partitions`).

    Parameters
    ----------
    ts : TraceSet
        A trace read by :mod:`dpro_kit.readers.byteps` (``manifest.extra["byteps"]``).
    partition_bytes : int
        The partition size (> 0; BytePS rounds it up to a whole page).

    Raises
    ------
    DproError
        Not a BytePS trace, or a size that is not positive.
    """
    if _byteps_facts(ts) is None:
        raise DproError("--partition-bytes needs a BytePS trace (docs/byteps.md)", path=ts.path)
    if partition_bytes <= 0:
        raise DproError(f"partition size must be > 0 bytes, got {partition_bytes}")
    servers = ts.manifest.servers()
    colls = [replace(c, partitions=_byteps_parts(ts, c, servers, partition_bytes))
             if c.partitions and "key" in c.partitions[0] else c for c in ts.collectives]
    extra = {k: v for k, v in ts.manifest.extra.items() if not k.startswith("measured_")}
    extra["byteps"] = {**extra["byteps"], "partition_bytes": int(partition_bytes)}
    return replace(ts, manifest=replace(ts.manifest, extra=extra), collectives=colls)


def with_bandwidth(model: CommModel, mbps: float, efficiency: float = TCP_EFFICIENCY) -> CommModel:
    """``model`` with every link at ``mbps`` Mbit/s line rate (goodput = rate x ``efficiency``).

    The fitted latency is kept; per-link overrides are dropped (all links get the new rate); the per-host
    factors of ``--slow-link`` / ``--slow-host`` are kept (they apply to the new rate).

    Parameters
    ----------
    model : CommModel
        The fitted link model.
    mbps : float
        Line rate of every link (Mbit/s).
    efficiency : float
        TCP goodput / line rate (measured, :data:`TCP_EFFICIENCY`).
    """
    if not mbps > 0:
        raise DproError(f"bandwidth must be > 0 Mbit/s, got {mbps}")
    bw = mbps * 1e6 / 8 * efficiency
    return replace(model, default=LinkModel(latency_us=model.default.latency_us, bandwidth_Bps=bw), per_link={},
                   origin=f"what-if {mbps:g} Mbit/s (latency {model.origin})")


HVD = "hvd:"   # op-id prefix of the Horovod background-thread ops (dpro_kit.readers.horovod)


def _hvd_batches(colls: list[Collective], threshold: int) -> list[list[int]]:
    """Indices of ``colls`` (Horovod fusion groups in execution order) that ran in one cycle.

    Horovod fuses the tensors of one cycle's response list in order while the buffer stays
    within the threshold, so group ``k`` and group ``k+1`` were cut by the threshold (same
    cycle) exactly when ``k``'s bytes plus ``k+1``'s first tensor exceed it.
    """
    batches: list[list[int]] = []
    for k, c in enumerate(colls):
        if batches and sum(colls[batches[-1][-1]].param_bytes) + c.param_bytes[0] > threshold:
            batches[-1].append(k)
        else:
            batches.append([k])
    return batches


#: most replay -> re-group rounds of :func:`horovod_knobs` (it stops earlier once the buffers repeat)
HVD_ROUNDS = 4
#: laps over the profiled iterations (in order, the last followed by the first) that carry Horovod's
#: loop from one iteration to the next before its first-tick phases are used (:func:`_hvd_phases`)
HVD_PHASE_LAPS = 3
#: where the next iteration's first gradient falls, in units of the job's iteration spread: the
#: quantiles of a normal distribution at (i + 0.5) / 7, over which the first tick's phase is averaged
HVD_SPREAD_QUANTILES = (-1.465, -0.792, -0.366, 0.0, 0.366, 0.792, 1.465)


def _hvd_phases(seen: dict[int, Any], sizes: list[int], threshold: int, c_us: float, negotiate_us: float,
                spread_us: float) -> dict[int, float]:
    """Per profiled iteration, its first tick's phase with Horovod's loop carried over from the iteration before.

    ``seen``: iteration -> ``(ready, run, (start, tail))`` from :func:`_hvd_replayed` (``start`` the
    iteration's first op, ``tail`` its end after the last buffer's copy out).  The iterations run in
    order, back to back, the last followed by the first, :data:`HVD_PHASE_LAPS` times from a phase
    of ``C / 2``; an iteration ends ``tail`` after its last cycle is done, and the next one's first
    gradient is ready as long after that as in its own replay, give or take the job's iteration
    spread ``spread_us`` (:data:`HVD_SPREAD_QUANTILES`): the phase is
    :func:`dpro_kit.horovod_loop.next_phase` averaged over it.  A cycle much longer than the
    spread locks to the iteration (measured: cycles of 82-100 ms ran iterations of the cycle,
    50 ms ones iterations of 100 ms, where half a cycle per iteration predicted 1.6-1.7x the
    default's and 1.36x); a much shorter one falls anywhere (about ``C / 2``).
    """
    from .horovod_loop import cycles, next_phase
    its = list(seen)
    if c_us <= 0:
        return {it: 0.0 for it in its}
    phase = {it: c_us / 2 for it in its}
    jitter = [q * spread_us for q in HVD_SPREAD_QUANTILES]
    for _ in range(HVD_PHASE_LAPS):
        for k, it in enumerate(its):
            ready, run, (_, tail) = seen[it]
            last = cycles(ready, sizes, threshold, c_us, run, negotiate_us=negotiate_us, phase_us=phase[it])[-1]
            nxt = its[(k + 1) % len(its)]
            r_n, _, (s_n, _) = seen[nxt]
            phase[nxt] = next_phase(last, c_us, last.done + tail + (min(r_n) - s_n), jitter)
    return phase


def horovod_knobs(ts: TraceSet, fusion_threshold_bytes: int | None = None,
                  cycle_time_ms: float | None = None, model: CommModel | None = None) -> TraceSet:
    """The same Horovod job with another fusion threshold and/or cycle time.

    Model: Horovod 0.28's background loop, :mod:`dpro_kit.horovod_loop` (the tick every cycle
    time ``C``, the buffers of the tensors ready at a tick, the next tick at
    ``max(tick + C, the cycle's work done)``), on the ops :mod:`dpro_kit.readers.horovod`
    makes.  Which tensors share a tick depends on when the gradients are ready and how long
    the buffers before run, which is what the replay says, so the grouping is found by
    iterating (at most :data:`HVD_ROUNDS` rounds, until the buffers repeat):

    1. round 0: the tensors that ran in one profiled cycle (:func:`_hvd_batches`) re-packed
       into buffers of the new threshold, a cycle's first buffer waiting ``L + C/2``;
    2. each profiled iteration of that job is built and replayed: ``r_i`` = when tensor
       ``i``'s gradient is ready on every rank, ``D(B)`` = a buffer's replayed run time (the
       last rank's first copy to the last rank's last copy, its ``hvd:shared_core`` wait left
       out; a buffer the replay did not have: its copies at the measured time per byte plus
       ``ring(bytes)``, the ring's ``2(N-1)`` steps of ``bytes/N`` by the comm model);
    3. :func:`dpro_kit.horovod_loop.cycles` with ``r``, ``D + S``, the new threshold and
       ``C`` and a tick-to-copy time of ``n + L`` (``n = ring(8 bytes)``, the negotiation;
       ``L`` the largest over the nodes of their median profiled ``hvd:negotiate`` wait, which
       the reader measures after every rank was ready: the late tick's negotiation) gives the
       cycles of each iteration, its first tick where the loop carried over from the iteration
       before puts it (:func:`_hvd_phases`: the profiled iterations back to back, the phase
       averaged over the job's iteration spread, :func:`dpro_kit.readers.horovod.iteration_spread_us`;
       a cycle longer than the iteration locks to it); the job's buffers are those most iterations got (Horovod's
       order within a cycle), and every iteration's waits come from the loop run with those
       buffers: a cycle's first buffer waits ``t_j + n + L - max(r_cycle + n, end of the
       previous buffer)`` (``t_j`` its tick), the other buffers of a cycle none;
    4. the job is rebuilt with them (a cycle's negotiation collective takes every tensor of
       the cycle; buffers after the first of a cycle have none: one negotiation per cycle).

    **The core shared with the backward pass** (``S``): on a host whose training thread and
    Horovod's background thread share a core, an allreduce that runs beside the backward pass
    waits for the core at its ring steps (measured, cnn at 100 Mbit/s, one core per host: a
    5 KB buffer alone took 1-24 ms where the comm model says 0.5 ms).  Each of a buffer's
    ``2(N-1)`` ring steps that ends before the last gradient is ready waits ``w``
    (:func:`_shared_core_step_us`, fitted to the allreduces that ran entirely beside the
    backward pass outside the profiled window,
    :func:`dpro_kit.readers.horovod.shared_core_responses`); ``S`` is an op
    ``hvd:shared_core:<g>`` between the allreduce and its copy out.  It is what makes a
    longer cycle faster there: one buffer for the gradients of the first layers instead of a
    small one alone beside the backward pass and the large one after it.

    The fusion-buffer copies cost the node's measured time per byte (a buffer of one tensor
    is not copied, as in Horovod); the allreduce is the ring scheme's, timed by the comm model.

    Parameters
    ----------
    ts : TraceSet
        A trace read by :mod:`dpro_kit.readers.horovod` (``manifest.extra["horovod"]``).
    fusion_threshold_bytes : int or None
        ``HOROVOD_FUSION_THRESHOLD``; None keeps the profiled one.
    cycle_time_ms : float or None
        ``HOROVOD_CYCLE_TIME`` in ms; None keeps the profiled one.
    model : CommModel or None
        The comm model fitted to ``ts`` (default: :func:`dpro_kit.costmodel.fit_from_trace`).

    Raises
    ------
    DproError
        The trace is not a Horovod trace, or a value is not positive.
    """
    from .horovod_loop import cycles, fuse
    hv = ts.manifest.extra.get("horovod") if isinstance(ts.manifest.extra, dict) else None
    colls = [c for c in ts.collectives if c.tensor.startswith("hvd") and c.inputs and
             all(o.startswith(HVD) for os_ in c.inputs.values() for o in os_)]
    negotiations = [c for c in ts.collectives if c.tensor.startswith("hvd") and c.tensor.endswith("-negotiate")]
    if not isinstance(hv, dict) or not colls:
        raise DproError("--fusion-threshold-mb/--cycle-time-ms need a Horovod trace", path=ts.path,
                        hint="profile a Horovod job with `dpro profile` (docs/horovod.md)")
    t_old = int(hv.get("fusion_threshold_bytes", 128 << 20))
    c_old = float(hv.get("cycle_time_ms", 1.0))
    t_new = t_old if fusion_threshold_bytes is None else int(fusion_threshold_bytes)
    c_new = c_old if cycle_time_ms is None else float(cycle_time_ms)
    if t_new <= 0 or c_new < 0:
        raise DproError(f"fusion threshold must be > 0 bytes and cycle time >= 0 ms, got {t_new} / {c_new}")
    if model is None:
        from .costmodel import fit_from_trace
        model = fit_from_trace(ts)
    nodes = list(colls[0].participants)
    ev = ts.events
    hvd_ops = ev["op"].astype(str).str.startswith(HVD)
    mean = ev[hvd_ops & ev["node"].isin(nodes)].groupby(["node", "op"], observed=True)["dur"].mean()
    # per node: the profiled wait after every rank is ready (tick to copy), and the copy time per byte
    lat, per_byte = {}, {}
    for n in nodes:
        negs = [mean.get((n, f"{HVD}negotiate:{c.tensor}"), 0.0) for c in colls]
        lat[n] = float(pd.Series(negs).median())
        fused = [c for c in colls if len(c.params) > 1]
        copied = sum(mean.get((n, f"{HVD}memcpy_{d}:{c.tensor}"), 0.0) for c in fused for d in ("in", "out"))
        per_byte[n] = copied / (2 * sum(c.bytes for c in fused)) if fused else 0.0
    params = [(p, b, {n: c.param_ready[n][i] for n in nodes}) for c in colls
              for i, (p, b) in enumerate(zip(c.params, c.param_bytes))]
    sizes = [b for _, b, _ in params]
    first_param = {c.tensor: sum(len(x.params) for x in colls[:k]) for k, c in enumerate(colls)}
    plan = [fuse([first_param[colls[k].tensor] + i for k in batch for i in range(len(colls[k].params))],
                 sizes, t_new) for batch in _hvd_batches(colls, t_old)]
    iters = sorted(int(i) for i in ev["iteration"].unique())
    c_us, lat_all, n_ranks = c_new * 1e3, max(lat.values()), len(nodes)
    steps = 2 * (n_ranks - 1)

    def ring_us(nbytes: float) -> float:      # the ring scheme's 2(N-1) steps of nbytes/N, nothing queued
        return steps * model.transfer_us(nbytes / n_ranks)

    per_byte_max = max(per_byte.values())

    def estimate(buf: list[int]) -> float:   # a buffer the last replay did not have: copies + ring
        nbytes = sum(sizes[i] for i in buf)
        return (2 * per_byte_max * nbytes if len(buf) > 1 else 0.0) + ring_us(nbytes)

    neg = ring_us(negotiations[0].bytes if negotiations else 8)
    # the wait of a ring step for the core while the backward pass computes beside it
    from .readers.horovod import iteration_spread_us, shared_core_responses
    key = str(ts.path or "")
    if key not in _SHARED_CORE:
        _SHARED_CORE[key] = shared_core_responses(ts) if ts.manifest.raw_format == "horovod-torch" else []
    during = _SHARED_CORE[key]
    if key not in _SPREAD:
        _SPREAD[key] = iteration_spread_us(ts) if ts.manifest.raw_format == "horovod-torch" else 0.0
    spread = _SPREAD[key]
    step_wait = _shared_core_step_us(during, ring_us, steps)

    def shared(buf: list[int], start: float, backward_end: float) -> float:
        """The buffer's waits for the core: ``step_wait`` for each ring step that ends before the backward pass."""
        nbytes = sum(sizes[i] for i in buf)
        t = start + (per_byte_max * nbytes if len(buf) > 1 else 0.0)
        extra = 0.0
        for _ in range(steps):
            t += ring_us(nbytes) / steps
            if t < backward_end:
                t += step_wait
                extra += step_wait
        return extra

    # round 0: each profiled cycle's tensors re-packed; its first buffer waits L + C/2
    waits = {it: [[(lat_all + c_us / 2, 0.0)] + [(0.0, 0.0)] * (len(cyc) - 1) for cyc in plan] for it in iters}
    out = _hvd_rebuild(ts, colls, negotiations, nodes, params, per_byte, plan, waits, t_new, c_new)
    for _ in range(HVD_ROUNDS):
        seen, sims = {}, {}
        for it, ts_it in _split(out).items():
            ready, runs, span = _hvd_replayed(ts_it, model, nodes, params, plan)
            end = max(ready)

            def run(b: list[int], start: float, runs=runs, end=end) -> float:
                return (runs.get(tuple(b)) or estimate(b)) + shared(b, start, end)
            seen[it] = (ready, run, span)
        phase = _hvd_phases(seen, sizes, t_new, c_us, neg + lat_all, spread)
        for it, (ready, run, _) in seen.items():
            sims[it] = cycles(ready, sizes, t_new, c_us, run, negotiate_us=neg + lat_all, phase_us=phase[it])
        votes = Counter(repr([c.buffers for c in cs]) for cs in sims.values())   # ties: the first iteration's
        new_plan = next([c.buffers for c in cs] for cs in sims.values()
                        if repr([c.buffers for c in cs]) == votes.most_common(1)[0][0])
        new_waits = {}
        for it, (ready, run, _) in seen.items():
            forced = cycles(ready, sizes, t_new, c_us, run, negotiate_us=neg + lat_all, given=new_plan,
                            phase_us=phase[it])
            new_waits[it], prev_end = [], -math.inf
            for cyc in forced:
                r_cyc = max(ready[i] for b in cyc.buffers for i in b)
                w0 = max(0.0, cyc.start[0] - max(r_cyc + neg, prev_end))
                new_waits[it].append([(w0 if j == 0 else 0.0, shared(b, st, max(ready)))
                                      for j, (b, st) in enumerate(zip(cyc.buffers, cyc.start))])
                prev_end = cyc.done
        stable = new_plan == plan and all(abs(x[0] - y[0]) < 1.0 and abs(x[1] - y[1]) < 1.0 for it in iters
                                          for cx, cy in zip(new_waits[it], waits[it]) for x, y in zip(cx, cy))
        plan, waits = new_plan, new_waits
        out = _hvd_rebuild(ts, colls, negotiations, nodes, params, per_byte, plan, waits, t_new, c_new)
        if stable:
            break
    return out


def _shared_core_step_us(during: list[tuple[int, float]], ring_us: Any, steps: int) -> float:
    """The wait of one ring step for a core the backward pass computes on, from allreduces that ran beside it.

    ``during``: ``(bytes, us)`` of allreduces that ran entirely during the backward pass
    (:func:`dpro_kit.readers.horovod.shared_core_responses`).  A least-squares line ``us = a + b * bytes``
    through them: its intercept ``a`` is an allreduce's fixed cost beside the backward pass (the slope
    holds the bandwidth, which the comm model fitted to the same responses already has), so each of
    the ring's ``steps`` waits ``(a - ring_us(0)) / steps`` (>= 0).  One size only: the median excess
    over ``ring_us``.  None: 0.
    """
    if not during:
        return 0.0
    xs = np.array([float(b) for b, _ in during])
    ys = np.array([float(us) for _, us in during])
    if len(set(xs.tolist())) >= 2:
        a = float(np.polyfit(xs, ys, 1)[1])
        return max(0.0, (a - ring_us(0.0)) / steps)
    return max(0.0, float(np.median(ys - np.array([ring_us(x) for x in xs]))) / steps)


#: trace folder -> :func:`dpro_kit.readers.horovod.shared_core_responses` (read once: a knob grid calls
#: :func:`horovod_knobs` for every setting)
_SHARED_CORE: dict[str, list[tuple[int, float]]] = {}
#: trace folder -> :func:`dpro_kit.readers.horovod.iteration_spread_us`
_SPREAD: dict[str, float] = {}


def _split(ts: TraceSet) -> dict[int, TraceSet]:
    from .trace import split_iterations
    return split_iterations(ts)


def _hvd_replayed(ts: TraceSet, model: CommModel, nodes: list[str], params: list, plan: list[list[list[int]]]
                  ) -> tuple[list[float], dict[tuple[int, ...], float]]:
    """One iteration of a :func:`horovod_knobs` job replayed: per tensor when its gradient is ready on every
    rank, per buffer of ``plan`` its run time (the last rank's first copy to the last rank's last copy)."""
    from .graph.build import build
    from .job import Job, identity
    from .replay import replay
    job = Job.from_trace(ts, comm_model=model)
    res = replay(build(job, identity(job), check=False))
    row = {k: i for i, k in enumerate(res.graph.keys)}

    def at(times: Any, n: str, op: str) -> float:
        return float(times[row[f"{n}|{op}"]])
    ready = [max(at(res.end, n, r[n]) for n in nodes) for _, _, r in params]
    bufs = [b for cyc in plan for b in cyc]
    def waited(n: str, k: int) -> float:
        return at(res.end, n, f"{HVD}shared_core:hvd{k}") - at(res.start, n, f"{HVD}shared_core:hvd{k}")
    runs = {tuple(b): max(at(res.end, n, f"{HVD}memcpy_out:hvd{k}") for n in nodes) -
            max(at(res.start, n, f"{HVD}memcpy_in:hvd{k}") for n in nodes) - max(waited(n, k) for n in nodes)
            for k, b in enumerate(bufs)}
    last = max(at(res.end, n, f"{HVD}memcpy_out:hvd{len(bufs) - 1}") for n in nodes)
    return ready, runs, (float(np.min(res.start)), float(np.max(res.end)) - last)


def _hvd_rebuild(ts: TraceSet, colls: list[Collective], negotiations: list[Collective], nodes: list[str],
                 params: list, per_byte: dict[str, float], plan: list[list[list[int]]],
                 waits: dict[int, list[list[tuple[float, float]]]], t_new: int, c_new: float) -> TraceSet:
    """The job with Horovod's buffers ``plan`` (cycles of buffers of tensor indices into ``params``) and each
    iteration's ``waits`` (per cycle, per buffer: its ``hvd:negotiate`` and ``hvd:shared_core`` durations),
    :func:`horovod_knobs`."""
    ev = ts.events
    hvd_ops = ev["op"].astype(str).str.startswith(HVD)
    hv = ts.manifest.extra["horovod"]
    waits_on = {n: [v for u, v in ts.edges.get(n, []) if u.startswith(f"{HVD}memcpy_out:") and not v.startswith(HVD)]
                for n in nodes}
    rows, new_colls = [], []
    edges = {n: [(u, v) for u, v in e if not (u.startswith(HVD) or v.startswith(HVD))] for n, e in ts.edges.items()}
    k = 0
    for ci, cyc in enumerate(plan):
        for j, idx in enumerate(cyc):
            g = f"hvd{k}"
            nbytes = sum(params[i][1] for i in idx)
            for n in nodes:
                copy = per_byte[n] * nbytes if len(idx) > 1 else 0.0
                for it, w in waits.items():
                    for what, d in (("negotiate", w[ci][j][0]), ("memcpy_in", copy), ("shared_core", w[ci][j][1]),
                                    ("memcpy_out", copy)):
                        rows.append({"node": n, "host": ts.manifest.nodes[n].host, "op": f"{HVD}{what}:{g}",
                                     "name": f"HOROVOD_{what.upper()}", "kind": "OTHER", "stream": "hvd",
                                     "iteration": int(it), "start": 0.0, "dur": float(d), "tensor": g,
                                     "bytes": nbytes})
                e = edges.setdefault(n, [])
                e.append((f"{HVD}negotiate:{g}", f"{HVD}memcpy_in:{g}"))
                e.append((f"{HVD}shared_core:{g}", f"{HVD}memcpy_out:{g}"))
                e += [(f"{HVD}memcpy_out:{g}", v) for v in dict.fromkeys(waits_on[n])]
                if k:
                    e.append((f"{HVD}memcpy_out:hvd{k - 1}", f"{HVD}negotiate:{g}"))
            if j == 0:   # one negotiation per cycle: every rank has all the cycle's tensors (readers/horovod.py)
                new_colls.append(Collective(
                    tensor=f"{g}-negotiate", op="allreduce", algorithm=colls[0].algorithm,
                    bytes=negotiations[0].bytes if negotiations else 8, participants=list(nodes),
                    inputs={n: list(dict.fromkeys(params[i][2][n] for b in cyc for i in b)) for n in nodes},
                    outputs={n: [f"{HVD}negotiate:{g}"] for n in nodes}))
            new_colls.append(Collective(
                tensor=g, op=colls[0].op, algorithm=colls[0].algorithm, bytes=nbytes, participants=list(nodes),
                params=[params[i][0] for i in idx], param_bytes=[params[i][1] for i in idx],
                param_ready={n: [params[i][2][n] for i in idx] for n in nodes},
                inputs={n: [f"{HVD}memcpy_in:{g}"] for n in nodes},
                outputs={n: [f"{HVD}shared_core:{g}"] for n in nodes}))
            k += 1
    keep = ev[~(hvd_ops | ((ev["kind"] == "COMM") & ev["tensor"].isin([c.tensor for c in colls])))]
    events = pd.concat([keep, make_events(rows, path=ts.path)], ignore_index=True)
    for col in ev.columns:
        events[col] = events[col].astype(ev[col].dtype)
    others = [c for c in ts.collectives if c not in colls and c not in negotiations]
    extra = dict(ts.manifest.extra)
    extra["horovod"] = {**hv, "fusion_threshold_bytes": t_new, "cycle_time_ms": c_new}
    extra = {k: v for k, v in extra.items() if not k.startswith("measured_")}
    return replace(ts, manifest=replace(ts.manifest, extra=extra), events=events, edges=edges,
                   collectives=new_colls + others)


#: event kinds that are computation (what --slow-rank / --like-median scale); transfers and collectives come
#: from the link model
COMPUTE_KINDS = ("FW", "BW", "UPDATE", "OTHER", "IO", "AGG")


def _rank_nodes(ts: TraceSet, rank: int, what: str) -> list[str]:
    nodes = [n for n, i in ts.manifest.nodes.items() if i.role == "worker" and int(i.rank) == int(rank)]
    if not nodes:
        ranks = sorted(int(i.rank) for i in ts.manifest.nodes.values() if i.role == "worker")
        raise DproError(f"{what}: the job has no worker of rank {rank}", path=ts.path,
                        hint=f"ranks of this trace: {', '.join(map(str, ranks))}")
    return nodes


def slow_ranks(ts: TraceSet, factors: dict[int, float]) -> TraceSet:
    """The job with the computation of worker rank ``r`` taking ``factors[r]`` times as long.

    Every computation event (:data:`COMPUTE_KINDS`) of that rank's node is scaled; its transfers
    keep the link model's times (a slow CPU, not a slow network: see ``slow_links``).

    Parameters
    ----------
    ts : TraceSet
        The profiled job.
    factors : dict
        Rank -> factor (> 0; 1.5 = 50 % slower, 0.8 = 20 % faster).
    """
    ev = ts.events.copy()
    comp = ev["kind"].astype(str).isin(COMPUTE_KINDS).to_numpy()
    dur = ev["dur"].to_numpy(float).copy()
    for r, f in factors.items():
        if not (f > 0 and math.isfinite(f)):
            raise DproError(f"--slow-rank {r}={f}: the factor must be a positive number", path=ts.path,
                            hint="e.g. --slow-rank 1=1.5 (rank 1's computation 1.5x as long)")
        sel = comp & ev["node"].astype(str).isin(_rank_nodes(ts, r, "--slow-rank")).to_numpy()
        dur[sel] *= float(f)
    ev["dur"] = dur
    return _retimed(ts, ev)


def like_median(ts: TraceSet, ranks: list[int]) -> TraceSet:
    """The job with each of ``ranks`` computing as fast as the median worker.

    Per computation op (same op id and iteration on every worker: data parallelism), the rank's
    duration becomes the median of that op's durations over the *other* workers (with 2 workers:
    the other one); an op the others do not have is scaled by the ratio of their median total
    computation to this rank's.

    Parameters
    ----------
    ts : TraceSet
        The profiled job.
    ranks : list of int
        Worker ranks to replace.
    """
    ev = ts.events.copy()
    workers = [n for n, i in ts.manifest.nodes.items() if i.role == "worker"]
    comp = ev["kind"].astype(str).isin(COMPUTE_KINDS) & ev["node"].astype(str).isin(workers)
    c = ev[comp]
    totals = c.groupby(c["node"].astype(str), observed=True)["dur"].sum()
    dur = ev["dur"].to_numpy(float).copy()
    for r in ranks:
        for node in _rank_nodes(ts, r, "--like-median"):
            others = c[c["node"].astype(str) != node]
            med = others.groupby(["op", "iteration"], observed=True)["dur"].median()
            rest = totals.drop(node, errors="ignore")
            scale = float(rest.median() / totals[node]) if len(rest) and totals.get(node, 0) > 0 else 1.0
            sel = (comp & (ev["node"].astype(str) == node)).to_numpy()
            keys = list(zip(ev.loc[sel, "op"], ev.loc[sel, "iteration"]))
            dur[sel] = [float(med.get(k, d * scale)) for k, d in zip(keys, dur[sel])]
    ev["dur"] = dur
    return _retimed(ts, ev)


def computation_per_iteration_ms(ts: TraceSet, node: str) -> float:
    """The traced computation of ``node`` per iteration (ms): the median over the profiled iterations
    of the sum of its computation events (:data:`COMPUTE_KINDS`; wall time, profiler included)."""
    ev = ts.events
    ev = ev[(ev["node"].astype(str) == node) & ev["kind"].astype(str).isin(COMPUTE_KINDS)]
    if ev.empty:
        return 0.0
    return float(ev.groupby("iteration", observed=True)["dur"].sum().median()) / 1e3


def _transfers(ts: TraceSet, node: str) -> list[tuple[int, float]]:
    """(count, bytes) of the transfers of ``node``'s collectives per iteration by the link model: a ring
    AllReduce of S bytes over N ranks is 2(N − 1) steps of S/N bytes, any other collective one transfer."""
    from .graph.schemes import is_allreduce
    out = []
    for c in ts.collectives:
        if node not in c.participants:
            continue
        n = len(c.participants)
        out.append((2 * (n - 1), c.bytes / n) if is_allreduce(c) and n > 1 else (1, float(c.bytes)))
    return out


def transfer_time_ms(ts: TraceSet, model: CommModel, node: str) -> float:
    """The time ``node`` spends in its collectives per iteration by the link model alone (ms, no waiting):
    a ring AllReduce of S bytes over N ranks is 2(N − 1) steps of S/N bytes, any other collective one
    transfer of its bytes."""
    return sum(k * model.transfer_us(b) for k, b in _transfers(ts, node)) / 1e3


#: a collective whose fastest profiled instance took its wire's time at the line rate's goodput, within this
#: part, was bound by the wire's rate (:func:`wire_bound_share`; docs/whatif.md, "Wire- or CPU-paced")
WIRE_BOUND_TOLERANCE = 0.15


def fastest_collectives(ts: TraceSet) -> dict[str, tuple[int, float]]:
    """Tensor (bucket) -> (bytes, fastest instance in us) of the traced collectives: per iteration the shortest
    rank's COMM event (the last to enter waits least: its time is the transfer's, as :func:`dpro_kit.costmodel.
    fit_from_events` takes it), then the shortest iteration."""
    ev = ts.events
    comm = ev[(ev["kind"].astype(str) == "COMM") & (ev["bytes"] > 0)]
    if comm.empty:
        return {}
    per = comm.groupby(["tensor", "iteration"], observed=True).agg(bytes=("bytes", "first"), dur=("dur", "min"))
    fast = per.groupby(level=0, observed=True).agg(bytes=("bytes", "first"), dur=("dur", "min"))
    return {str(t): (int(r.bytes), float(r.dur)) for t, r in fast.iterrows() if r.dur > 0}


def wire_bound_share(ts: TraceSet, model: CommModel, node: str, wire_mbps: float) -> tuple[float, dict[str, float]]:
    """The part of ``node``'s transfer time (link model) in collectives the wire's rate bound when profiled.

    A collective of S bytes over a ring of N ranks moves 2(N − 1) S/N bytes per rank, which the wire needs
    ``t_wire = 2(N − 1) S / (N G)`` for at the goodput ``G = wire_mbps x`` :data:`TCP_EFFICIENCY`; its fastest
    profiled instance ``t_min`` (:func:`fastest_collectives`) is the most the wire can have taken in any
    instance.  ``rho = t_min / t_wire`` within :data:`WIRE_BOUND_TOLERANCE` of 1: the wire's rate bound it.
    Well below 1, the wire moved those bytes faster than its rate (a shaper's burst credit carried most of
    them), so its rate did not bound the transfer and the time came from the hosts; well above 1, the hosts
    held it even in its best instance.  Returns the share (0 without traced collectives) and rho per tensor.
    """
    from .graph.schemes import is_allreduce
    g = float(wire_mbps) * 1e6 / 8 * TCP_EFFICIENCY
    fast = fastest_collectives(ts)
    rho: dict[str, float] = {}
    bound = total = 0.0
    for c in ts.collectives:
        if node not in c.participants or c.tensor not in fast:
            continue
        n = len(c.participants)
        k, b = (2 * (n - 1), c.bytes / n) if is_allreduce(c) and n > 1 else (1, float(c.bytes))
        r = fast[c.tensor][1] / (k * b / g * 1e6)
        rho[c.tensor] = round(r, 4)
        t = k * model.transfer_us(b)
        total += t
        if abs(r - 1.0) <= WIRE_BOUND_TOLERANCE:
            bound += t
    return (bound / total if total > 0 else 0.0), rho


def host_cpu_split(ts: TraceSet, model: CommModel, host: str, share: float | None = None,
                   busy: float | None = None) -> dict[str, dict[str, Any]]:
    """Where the CPU of each worker node of ``host`` went per iteration, from the collector's record
    (:func:`slow_hosts` stretches each part): its computation ``W`` (traced), the wall time ``C / s`` its CPU
    work took (below), ``u`` the CPUs it used while not computing (:func:`idle_cpu`: ``(C/s − W) / (T − W)``
    clipped to [0, 1]) and the CPU time spent during its transfers, ``u`` x their link-model time
    (:func:`transfer_time_ms`, at most ``T − W``).  ms per iteration; ``cpu_ms`` None and ``u`` 0 without a
    CPU record.

    ``C / s``, per unprofiled iteration ``T`` (``cpu_source`` in the result says which):

    * ``"busy"``: ``B T`` with ``busy = B`` given, the part of its iteration the host's training thread was
      runnable (running, or ready and waiting for its core) in the job without the profiler, measured outside
      dpro (``bench/stragglers.py --sched``; replaces everything below);
    * ``"share"``: ``C / s`` with ``share = s`` given, the part of its core it got while runnable (1 alone on
      it, 1/2 beside a busy neighbour of equal weight), ``C`` the process's CPU (``extra.cpu_use.cpus`` x T);
    * ``"process+wait"`` (the default where the collector recorded its training thread's schedstat):
      ``C + D``, ``D`` the time per step that thread was runnable but waited for its core
      (``extra.cpu_use.thread_wait`` x T): the wall time the host's CPU work took at the share it had,
      measured in the profiled job itself (docs/stragglers.md, "Thirteenth");
    * ``"process"``: ``C`` (older traces).
    """
    seen = cpu_seen(ts.manifest.facts, [n for n, i in ts.manifest.nodes.items() if i.host == host])
    out: dict[str, dict[str, Any]] = {}
    for n, (cpus, step, thr, cap) in seen.items():
        if ts.manifest.nodes[n].role != "worker":
            continue
        w = computation_per_iteration_ms(ts, n)
        if busy is not None and not step:
            raise DproError(f"--host-busy {host}: node {n} has no unprofiled iteration time in its meta.json, and B "
                            "is a part of it", path=ts.path,
                            hint="re-profile with a few iterations outside the window, or leave --host-busy out")
        wait = (ts.manifest.facts.cpu_use.get(n) or {}).get("thread_wait")
        if busy is not None:
            c, src = (float(busy) * float(step), "busy")
        elif cpus is None or not step:
            c, src = None, None
        elif share is not None:
            c, src = float(cpus) * float(step) / float(share), "share"
        elif wait is not None:
            # a quota's stops count as run-queue wait too: those are not a share of the core (idle_cpu takes them)
            c, src = float(cpus) * float(step) + max(0.0, float(wait) * float(step) - float(thr or 0.0)), "process+wait"
        else:
            c, src = float(cpus) * float(step), "process"
        u = min(1.0, idle_cpu((c / float(step), float(step), thr, cap), w)) if c is not None else 0.0
        tr = min(transfer_time_ms(ts, model, n), max(0.0, float(step) - w)) if c is not None else 0.0
        out[n] = {"compute_ms": w, "cpu_ms": c, "cpu_source": src, "step_ms": step, "idle_cpu": u, "transfer_ms": tr,
                  "transfer_cpu_ms": min(max(0.0, c - w), u * tr) if c is not None else 0.0}
    return out


def transfer_factor(f: float, u: float, p_w: float = 0.0) -> float:
    """How much longer a host's transfers take when it gets ``1 / f`` of the CPU it had (:func:`slow_hosts`).

    ``u``: the part of a transfer's time ``t`` the host's CPU worked (``u t`` of CPU wall time at the share it
    had); ``p_w``: the part of its transfer time the wire's rate paced (:func:`wire_bound_share`).

    * CPU-paced (the rest: latency, the peer, the host's CPU one after the other): the CPU part stretched,
      ``t' = t (1 − u) + f u t``, factor ``1 + u (f − 1)``;
    * wire-paced: the host's CPU work overlapped the bytes on the wire, ``t = max(t_wire, u t) = t_wire``; at
      ``1 / f`` the work takes ``f u t``, and the transfer ends when both the wire and the work are done::

          t' = max(t_wire, f u t) = t max(1, f u)

      (unchanged while ``f u <= 1``: the slowed CPU still fits under the wire's time; ``f < 1`` never speeds up
      a wire-paced transfer).

    The host's factor is the mix, ``(1 − p_w)(1 + u (f − 1)) + p_w max(1, f u)``; docs/whatif.md, "Wire- or
    CPU-paced", has the derivation.
    """
    return (1.0 - p_w) * (1.0 + u * (f - 1.0)) + p_w * max(1.0, f * u)


def slow_hosts(ts: TraceSet, model: CommModel, factors: dict[str, float],
               shares: dict[str, float] | None = None,
               busy: dict[str, float] | None = None,
               wire_mbps: float | None = None) -> tuple[TraceSet, CommModel, dict[str, Any]]:
    """The job with host ``h`` getting ``1 / factors[h]`` of the CPU it had when profiled, every thread.

    A host slowed by a competitor for its core (a busy neighbour of lower weight, a noisy VM) runs
    all its CPU work at 1/F of the speed: its computation, the framework between ops, and the CPU
    part of its communication (gloo's threads copying, reducing, polling sockets); the wire is not
    slowed.  From the profile of the unslowed job, per worker node of the host
    (:func:`host_cpu_split`): it spends ``C/s`` of wall time on CPU per iteration, ``W`` of it in
    its traced computation, and while not computing it uses ``u`` CPUs, so ``R_t = u t`` of the CPU
    falls in its transfers (link-model time ``t``), ``C/s − W − R_t`` between ops.  At 1/F every
    part takes F times as long:

    * a transfer on a link of the host: its CPU part ``u`` stretched, the rest (wire, peer) not::

          t' = t (1 − u) + t u F = t (1 + u (F − 1))       (CommModel.host_time_factor)

      (several workers on the host: the largest ``u``);
    * its computation ops, charged with the CPU between ops too::

          factor = 1 + (F − 1) (C/s − R_t) / W             (at least F)

    The whole CPU time is stretched once: ``(F − 1) C/s`` more per iteration, in computation and
    transfers.  Without a CPU record ``u = 0`` and the factor is F: ``--slow-rank`` on the host's ranks.

    ``wire_mbps`` (the links' line rate when profiled) decides per collective whether the wire's rate or the
    hosts paced it (:func:`wire_bound_share`: its fastest profiled instance at the wire's time).  The wire
    paces the share ``p_w`` of the host's transfer time: the host's CPU work there overlaps the bytes on the
    wire, and a wire-paced transfer takes ``max(t, F u t)`` at 1/F (:func:`transfer_factor`)::

          t' = t ((1 − p_w)(1 + u (F − 1)) + p_w max(1, F u))

    (the twelfth pass kept wire-paced transfers at ``t`` whatever F; docs/stragglers.md, "Thirteenth").
    Derivation and what it gets: docs/whatif.md, "Wire- or CPU-paced".

    ``F < 1`` (the host given more CPU than it had: the fix of a slowed host from its slowed profile) applies
    the same rules: its computation and CPU-paced transfers shrink, its wire-paced ones keep their time.

    Parameters
    ----------
    ts : TraceSet
        The profiled job.
    model : CommModel
        Its fitted link model.
    factors : dict
        Host -> F (2: the host gets half the CPU it had).
    shares : dict, optional
        Host -> the part of its core it got while runnable when profiled (default: from the collector's
        record of its training thread's run-queue wait where recorded, else 1; :func:`host_cpu_split`).
    busy : dict, optional
        Host -> the part of its iteration its training thread was runnable without the profiler
        (:func:`host_cpu_split`; replaces the collector's CPU record and ``shares`` for that host).
    wire_mbps : float, optional
        Line rate of the links when profiled (Mbit/s; goodput x :data:`TCP_EFFICIENCY`): the transfers its rate
        bound are not stretched.  None: every transfer of the host is stretched.

    Returns
    -------
    (TraceSet, CommModel, dict)
        The job, the link model, and per slowed node what was used (:func:`host_cpu_split`, plus
        ``factor``, ``compute_factor``, ``transfer_factor``).
    """
    check_host_values(ts, factors, "--slow-host", "the factor must be a positive number",
                      "e.g. --slow-host host1=2 (host1 gets half the CPU it had)")
    shares = dict(shares or {})
    check_host_values(ts, shares, "--cpu-share", "the share must be a positive number",
                      "e.g. --cpu-share host1=0.5 (host1 had half its core when profiled)")
    busy = dict(busy or {})
    check_host_values(ts, busy, "--host-busy", "the busy part must be a number in (0, 1]",
                      "e.g. --host-busy host1=0.95 (host1's training thread runnable 95 % of its iteration)")
    for h, b in busy.items():
        if b > 1:
            raise DproError(f"--host-busy {h}={b:g}: the busy part must be a number in (0, 1]", path=ts.path,
                            hint="the part of the iteration the host's training thread was runnable, e.g. 0.95")
        if h in shares:
            raise DproError(f"--host-busy and --cpu-share both describe what {h} had when profiled; give one",
                            path=ts.path, hint="--host-busy already counts the time it waited for its core")
        if h not in factors:
            raise DproError(f"--host-busy {h}: needs --slow-host {h}=F", path=ts.path)
    if wire_mbps is not None and not (wire_mbps > 0 and math.isfinite(wire_mbps)):
        raise DproError(f"--wire-mbps {wire_mbps:g}: the line rate must be a positive number of Mbit/s", path=ts.path,
                        hint="e.g. --wire-mbps 1000 (the links were 1 Gbit/s when profiled)")
    ev = ts.events.copy()
    comp = ev["kind"].astype(str).isin(COMPUTE_KINDS).to_numpy()
    nodes = ev["node"].astype(str).to_numpy()
    dur = ev["dur"].to_numpy(float).copy()
    info: dict[str, Any] = {}
    time_factor: dict[str, float] = {}
    for h, f in factors.items():
        f = float(f)
        split = host_cpu_split(ts, model, h, float(shares[h]) if h in shares else None, busy.get(h))
        if not split:
            raise DproError(f"--slow-host {h}={f:g}: host {h} runs no worker", path=ts.path)
        wire = {n: wire_bound_share(ts, model, n, wire_mbps) for n in split} if wire_mbps is not None else {}
        time_factor[h] = max(transfer_factor(f, s["idle_cpu"], wire[n][0] if wire else 0.0) for n, s in split.items())
        for n, s in split.items():
            w, c = s["compute_ms"], s["cpu_ms"]
            cf = 1.0 + (f - 1.0) * max(c - s["transfer_cpu_ms"], w) / w if c is not None and w > 0 else f
            # F < 1 (the host given more CPU): the CPU between ops shrinks with the ops, never below nothing
            cf = max(cf, 1e-3)
            dur[comp & (nodes == n)] *= cf
            info[n] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()} | {
                "factor": f, "compute_factor": round(cf, 4), "transfer_factor": round(time_factor[h], 4)}
            if wire:
                info[n] |= {"wire_bound_share": round(wire[n][0], 4), "fastest_vs_wire": wire[n][1]}
    ev["dur"] = dur
    return _retimed(ts, ev), replace(model, host_time_factor={**model.host_time_factor, **time_factor}), info


def _retimed(ts: TraceSet, ev: Any) -> TraceSet:
    """``ts`` with new event durations; the measured iteration times no longer describe it."""
    extra = {k: v for k, v in ts.manifest.extra.items() if not k.startswith("measured_")}
    return replace(ts, manifest=replace(ts.manifest, extra=extra), events=ev)


def check_host_values(ts: TraceSet, values: dict[str, float], option: str, must: str, example: str) -> None:
    """Refuse a per-host what-if (``--slow-link``, ``--cpu-limit``) naming a host the job does not have, or
    a value that is not a positive finite number: one :class:`DproError` naming the option and the host."""
    hosts = sorted({i.host for i in ts.manifest.nodes.values()})
    for h, v in values.items():
        if h not in hosts:
            raise DproError(f"{option}: the job has no host {h!r}", path=ts.path,
                            hint=f"hosts of this trace: {', '.join(hosts)}")
        if not (v > 0 and math.isfinite(v)):
            raise DproError(f"{option} {h}={v}: {must}", path=ts.path, hint=example)


def slow_links(model: CommModel, ts: TraceSet, factors: dict[str, float]) -> CommModel:
    """The link model with host ``h``'s network interface at ``factors[h]`` times its bandwidth.

    Parameters
    ----------
    model : CommModel
        The fitted link model.
    ts : TraceSet
        The job (names the hosts).
    factors : dict
        Host -> bandwidth factor (0.5 = half the bandwidth).
    """
    check_host_values(ts, factors, "--slow-link", "the factor must be a positive number",
                      "e.g. --slow-link host1=0.5 (host1's link at half its bandwidth)")
    return replace(model, host_bandwidth_factor={**model.host_bandwidth_factor, **factors})


#: CFS bandwidth control: the kernel's default period of a cgroup's CPU quota (``cpu.cfs_period_us``)
CFS_PERIOD_MS = 100.0
#: period phases the CPU-quota what-if averages over (where the period boundaries fall in the iteration)
CFS_PHASES = 8
#: fixed-point rounds of the CPU-quota what-if (replay -> CFS schedule of the limited ranks -> replay)
CFS_ROUNDS = 4


def cfs_schedule(ops: list[tuple[float, float]], quota_us: float, period_us: float, phase_us: float = 0.0,
                 idle_cpu: float = 0.0) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """One thread's ops under a CFS CPU quota: full speed until the period's quota is spent, then stopped.

    Linux CFS bandwidth control (cgroup ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, cgroup v2
    ``cpu.max``): at every period boundary the group's run time is refilled to ``quota_us`` (unused
    quota is not carried over); while the group has run time left its thread runs at full speed;
    when it is spent the group is throttled - stopped, not slowed - until the next boundary.
    Waiting (the gap before an op is ready: a collective's peer, a transfer) uses ``idle_cpu`` CPUs
    of quota (gloo's threads and the network stack while a transfer is in flight); when that spends
    the quota the group is stopped until the boundary (the gap keeps its length - it is the
    replayed wait - but the stop is recorded and delays the next op if it is ready before the boundary).

    Parameters
    ----------
    ops : list of (gap_us, work_us) or (gap_us, work_us, not_before_us)
        In execution order: op ``i`` is ready ``gap_us`` after op ``i-1`` ended (op 0: after time
        0), and not before ``not_before_us`` when given; it needs ``work_us`` of CPU at full speed.
    quota_us, period_us : float
        The quota per period (CPUs x period; ``quota_us >= period_us``: never throttled).
    phase_us : float, default 0
        Where a period boundary falls: boundaries at ``phase_us + k * period_us``.
    idle_cpu : float, default 0
        CPUs used while waiting in a gap (>= 0; above 1 where the rank's other threads - Horovod's
        background thread, a spinning wait - use more than one CPU together while it waits).

    Returns
    -------
    (starts, ends, stalls)
        Per op its start and end (the end includes the stops inside it); ``stalls``: the
        ``(from, to)`` intervals the group was stopped.

    Examples
    --------
    Quota 6 ms per 10 ms, one op of 15 ms from time 0: runs 0-6, stopped 6-10, runs 10-16,
    stopped 16-20, runs 20-23: ends at 23 ms.

    >>> cfs_schedule([(0.0, 15.0)], 6.0, 10.0)[1]
    [23.0]

    A 4 ms wait at half a CPU before a 4 ms op, quota 3 ms per 10 ms: the wait spends 2 ms of quota,
    the op runs 1 ms (4-5), is stopped 5-10 and runs 3 ms more (10-13).

    >>> cfs_schedule([(4.0, 4.0)], 3.0, 10.0, idle_cpu=0.5)
    ([4.0], [13.0], [(5.0, 10.0)])
    """
    u = max(0.0, float(idle_cpu))
    if quota_us >= period_us * max(1.0, u):     # never spends its quota: at most max(1, u) CPUs at a time
        t, starts, ends = 0.0, [], []
        for op in ops:
            gap, w = op[0], op[1]
            t = max(t + gap, op[2]) if len(op) > 2 else t + gap
            starts.append(t)
            t += w
            ends.append(t)
        return starts, ends, []
    t = 0.0
    # the current period [p0, p0 + period) and the run time used in it
    p0 = phase_us - math.ceil(phase_us / period_us) * period_us
    used = 0.0
    starts, ends, stalls = [], [], []

    def to(t_new: float) -> None:   # idle until t_new: new periods refill the quota
        nonlocal p0, used
        if t_new >= p0 + period_us:
            p0 += math.floor((t_new - p0) / period_us) * period_us
            used = 0.0

    for op in ops:
        gap, w = op[0], op[1]
        end_gap = max(t + gap, op[2]) if len(op) > 2 else t + gap
        while u > 0 and t < end_gap - 1e-9:     # waiting: quota spent at u CPUs, stopped when it is gone
            room = quota_us - used
            nxt = p0 + period_us
            if room <= 1e-9:
                stalls.append((t, min(nxt, end_gap)))
                t = min(nxt, end_gap)
                to(t)
                continue
            dt = min(end_gap - t, room / u, nxt - t)
            t += dt
            used += u * dt
            to(t)
        t = end_gap
        to(t)
        starts.append(t)
        left = float(w)
        while left > 1e-9:
            room = quota_us - used
            if room <= 1e-9:          # throttled: stopped until the next boundary
                nxt = p0 + period_us
                stalls.append((t, nxt))
                t, p0, used = nxt, nxt, 0.0
                continue
            run = min(left, room, p0 + period_us - t)
            t += run
            used += run
            left -= run
            to(t)
        ends.append(t)
    return starts, ends, stalls


def _overlap(a: float, b: float, stalls: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in stalls)


def idle_cpu(seen: tuple | None, work_ms: float) -> float:
    """CPUs a rank uses while it waits, from what the collector measured without the profiler.

    ``seen = (cpus, step_ms[, throttled_ms[, max_cpus]])``: CPU time per unprofiled step over the
    step's wall time (``extra.cpu_use.cpus``), the step (``measured_iteration_ms_per_node``), the time
    per step the cgroup's quota stopped the rank (``extra.cpu_use.throttled_us`` / 1e3) and the CPUs it
    may run on (its affinity).  The rank runs ``step_ms - throttled_ms`` per step and computes
    ``work_ms`` of it at one CPU (the training thread); the rest of its CPU time is spent in the rest
    of its running time::

        u = (cpus * step_ms - work_ms) / (step_ms - throttled_ms - work_ms),   clipped to [0, max_cpus]

    (``max_cpus`` 1 when not given; 0 when nothing was recorded or the step is not longer than the work).
    """
    if not seen or seen[0] is None or not seen[1] or not seen[1] > work_ms:
        return 0.0
    thr = float(seen[2]) if len(seen) > 2 and seen[2] else 0.0
    cap = float(seen[3]) if len(seen) > 3 and seen[3] else 1.0
    run = float(seen[1]) - thr
    if not run > work_ms:
        return cap
    return min(cap, max(0.0, (float(seen[0]) * float(seen[1]) - work_ms) / (run - work_ms)))


def cpu_seen(facts: Any, nodes: Any) -> dict[str, tuple]:
    """Node -> ``(cpus, step_ms, throttled_ms, max_cpus)`` for :func:`idle_cpu`, from a profiled job's
    :class:`~dpro_kit.schema.Facts` (``cpu_use``, ``measured_iteration_ms_per_node``, ``cpu_placement``)."""
    out = {}
    for n in nodes:
        use = facts.cpu_use.get(n) or {}
        thr = use.get("throttled_us")
        aff = (facts.cpu_placement.get(n) or {}).get("affinity")
        out[n] = (use.get("cpus"), facts.measured_iteration_ms_per_node.get(n),
                  None if thr is None else float(thr) / 1e3, float(len(aff)) if isinstance(aff, list) and aff else None)
    return out


def cpu_limited_graph(g: Any, limits: dict[str, float], period_us: float, replay_one: Any,
                      cpu_seen: dict[str, tuple] | None = None,
                      phases: int = CFS_PHASES, rounds: int = CFS_ROUNDS) -> dict[str, Any]:
    """Stretch the ops of CPU-limited worker nodes in a built graph by the CFS model (in place).

    The graph's durations are the ranks' computation at full speed (an unthrottled profile, or a
    throttled one with its stops taken out: :func:`full_speed_durations`).  For each limited node
    (node -> CPUs of its quota), a fixed point: replay ``g`` (``replay_one(g)``, one iteration),
    take the node's computation in replayed order with the idle gaps between its ops (waiting for
    a collective, a transfer), run it through :func:`cfs_schedule` for ``K = 1 + ceil(2 P / T)``
    iterations back to back (P the period, T the replayed iteration; at least 2: each inherits the
    quota the one before left, iteration j's first op is ready j T after the first one's) and set
    every computation op's duration to its mean start-to-end over iterations 1 .. K-1 (the first,
    with a fresh quota, left out) and ``phases`` evenly spaced period phases; a transfer of that
    node (SEND/RECV/COMM whose node or peer it is) is lengthened by the time the node is stopped
    while it is in flight (a stopped rank does not answer a ring step).  Then the CPU budget: the
    group gets ``cpus`` CPU-seconds per second, so with W its computation and G = T - (its ops'
    replayed durations) the time it waits, an iteration lasts at least ``(W + min(u, cpus) G) / cpus``
    and the node's computation at least that less G: when the schedule's durations sum to less (it
    sets the pace and the schedule's ready times gave it fresh quota), they are scaled up to that.
    (Waiting above the quota's rate counts at the quota's rate: a stop inside a wait costs only
    where the wait ends inside it, which the schedule has already counted.)  ``rounds`` times (the gaps change as the node slows).

    The CPUs a node uses while it waits (``u``, ``idle_cpu`` of :func:`cfs_schedule`) come from what
    the collector measured without the profiler (:func:`idle_cpu`; ``cpu_seen`` from :func:`cpu_seen`);
    0 when not recorded.

    Returns
    -------
    dict
        Node -> {"cpus", "stopped_ms" (per iteration, phase mean; under the budget bound the
        stretched computation less the work), "compute_ms" (work), "stretched_ms", "idle_cpu",
        "budget_bound" (whether the bound set the durations)}.
    """
    import numpy as np
    if not limits:
        return {}
    keys_of: dict[str, list] = {n: [] for n in limits}
    comm_of: dict[str, list] = {n: [] for n in limits}
    for k, d in g.nodes(data=True):
        n = d.get("node")
        if str(d.get("kind")) in COMPUTE_KINDS and n in keys_of and not str(d.get("device", "")).startswith("link:"):
            keys_of[n].append(k)
        else:
            for m in limits:
                if str(d.get("kind")) not in COMPUTE_KINDS and (n == m or d.get("peer") == m):
                    comm_of[m].append(k)
    work = {k: float(g.nodes[k]["dur"]) for n in limits for k in keys_of[n]}
    cwork = {k: float(g.nodes[k]["dur"]) for n in limits for k in comm_of[n]}
    out: dict[str, Any] = {}
    for _ in range(max(1, rounds)):
        res = replay_one(g)
        pos = {k: i for i, k in enumerate(res.graph.keys)}
        for n, cpus in limits.items():
            ks = sorted(keys_of[n], key=lambda k: (res.start[pos[k]], res.end[pos[k]]))
            if not ks:
                continue
            st = np.array([res.start[pos[k]] for k in ks])
            en = np.array([res.end[pos[k]] for k in ks])
            gaps = np.maximum(0.0, st - np.concatenate([[st[0]], np.maximum.accumulate(en)[:-1]]))
            gaps[0] = st[0]
            ops = [(float(gp), work[k]) for gp, k in zip(gaps, ks)]
            # back to back: iteration j's first op is ready j (replayed) iterations after this one's; enough
            # iterations to span two periods (a 100 ms period holds several iterations), the first one left
            # out of the averages (it starts with a fresh quota)
            t_it = float(res.iteration_time_us)
            n_it = 1 + (max(1, math.ceil(2 * period_us / t_it)) if t_it > 0 else 1)
            seq = list(ops)
            for j in range(1, n_it):
                seq += [(0.0, ops[0][1], float(st[0]) + j * t_it)] + ops[1:]
            durs = np.zeros(len(ks))
            extra = {k: 0.0 for k in comm_of[n]}
            stopped = 0.0
            quota = cpus * period_us
            W = sum(work[k] for k in ks) / 1e3
            u = idle_cpu((cpu_seen or {}).get(n), W)
            m = len(ks)
            for ph in range(max(1, phases)):
                s_, e_, stalls = cfs_schedule(seq, quota, period_us, phase_us=period_us * ph / max(1, phases),
                                             idle_cpu=u)
                for j in range(1, n_it):
                    a0 = j * m
                    # iteration j, moved back onto the first one's time axis
                    shift = s_[a0] - s_[0]
                    hi = s_[a0 + m] if j < n_it - 1 else math.inf
                    durs += np.array(e_[a0:a0 + m]) - np.array(s_[a0:a0 + m])
                    st2 = [(x - shift, min(y, hi) - shift) for x, y in stalls if y > s_[a0] and x < hi]
                    stopped += sum(y - max(x, s_[0]) for x, y in st2 if y > s_[0])
                    for k in comm_of[n]:
                        x0 = float(res.start[pos[k]])
                        extra[k] += _overlap(x0, x0 + cwork[k], st2)
            reps = max(1, phases) * (n_it - 1)
            durs /= reps
            # the CPU budget: over many periods the group gets `cpus` CPU-seconds per second, so an iteration
            # in which the rank computes W (one CPU) and waits the rest G of it at u CPUs lasts at least
            # (W + min(u, cpus) G) / cpus (a stop inside a wait costs only where the schedule says); a schedule of ready times that give it fresh quota can undercut that when
            # the rank itself sets the pace (the fixed point then oscillates) - the bound holds it
            cur = float(sum(res.end[pos[k]] - res.start[pos[k]] for k in ks))
            gap_us = max(0.0, t_it - cur)
            need = (W * 1e3 + min(u, cpus) * gap_us) / cpus - gap_us if cpus > 0 else 0.0
            bound = bool(durs.sum() > 0 and need > float(durs.sum()) * (1 + 1e-9))    # not float noise
            if bound:
                durs *= need / float(durs.sum())
            for k, d in zip(ks, durs):
                g.nodes[k]["dur"] = float(d)
            for k in comm_of[n]:
                g.nodes[k]["dur"] = cwork[k] + extra[k] / reps
            # stopped per iteration: the schedule's stops, or under the budget bound what it adds to the work
            stop_ms = (float(durs.sum()) / 1e3 - W) if bound else stopped / reps / 1e3
            out[n] = {"cpus": cpus, "stopped_ms": round(stop_ms, 4),
                      "compute_ms": round(sum(work[k] for k in ks) / 1e3, 4),
                      "stretched_ms": round(float(durs.sum()) / 1e3, 4), "idle_cpu": round(u, 4),
                      "budget_bound": bound}
    return out


def cpu_limit_warnings(limited: dict[str, Any] | None) -> list[str]:
    """One sentence per worker whose ``--cpu-limit`` quota is at least ``max(1, idle_cpu)`` CPUs
    (``limited``: the node -> result of :func:`cpu_limited_graph`): the model runs a rank's
    computation as one thread and its waits at ``idle_cpu`` CPUs (:func:`idle_cpu`), so such a quota
    never stops it and the prediction is the unlimited one.  A real rank whose threads together use more than a CPU
    (Horovod's background thread, gloo's) can still be throttled by the kernel at that quota:
    measured on Horovod jobs at 1 CPU per host (docs/horovod.md, "Accuracy", 2026-11-27)."""
    return [f"--cpu-limit: {n} gets {r['cpus']:g} CPU: the CFS what-if runs a rank's computation as one thread "
            f"and its waits at {float(r.get('idle_cpu', 0.0)):.2f} CPU (measured), so this quota never stops it and "
            "this prediction is the unlimited one; a rank whose "
            "threads use more than a CPU together (Horovod, gloo) can still be throttled by the kernel "
            "(its throttled_us; docs/horovod.md, 'Accuracy')"
            for n, r in sorted((limited or {}).items())
            if float(r.get("cpus", 0.0)) >= max(1.0, float(r.get("idle_cpu", 0.0)))]


@dataclass
class WhatIf:
    """A set of what-if changes, as the CLI takes them."""

    bucket_mb: float | None = None
    #: None: the same as ``bucket_mb`` - what DDP does when bucket_cap_mb is given (torch 2.13;
    #: only its default, bucket_cap_mb=None, uses a 1 MiB first bucket)
    first_bucket_mb: float | None = None
    bandwidth_mbps: float | None = None
    world_size: int | None = None
    #: Horovod: HOROVOD_FUSION_THRESHOLD (MiB) and HOROVOD_CYCLE_TIME (ms) (:func:`horovod_knobs`)
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    #: parameter-server jobs: number of servers (:func:`scale_servers`)
    servers: int | None = None
    #: BytePS: BYTEPS_PARTITION_BYTES (:func:`byteps_partition_bytes`)
    partition_bytes: int | None = None
    #: stragglers: rank -> computation factor (:func:`slow_ranks`), ranks made median (:func:`like_median`),
    #: host -> link bandwidth factor (:func:`slow_links`)
    slow_rank: dict[int, float] = field(default_factory=dict)
    like_median: list[int] = field(default_factory=list)
    slow_link: dict[str, float] = field(default_factory=dict)
    #: host -> F: the host gets 1/F of the CPU it had, its computation and the CPU part of its transfers
    #: (:func:`slow_hosts`); host -> the part of its core it had when profiled (default 1)
    slow_host: dict[str, float] = field(default_factory=dict)
    cpu_share: dict[str, float] = field(default_factory=dict)
    #: host -> the part of its iteration its training thread was runnable without the profiler
    #: (:func:`host_cpu_split`; replaces the collector's CPU record in :func:`slow_hosts`)
    host_busy: dict[str, float] = field(default_factory=dict)
    #: the links' line rate when profiled (Mbit/s): with ``slow_host``, the transfers its rate bound are not
    #: stretched (:func:`slow_hosts`, :func:`wire_bound_share`)
    wire_mbps: float | None = None
    #: host -> CPUs of its CFS quota (:func:`cpu_limited_graph`; applied to the built graph by the session),
    #: and the quota's period (ms)
    cpu_limit: dict[str, float] = field(default_factory=dict)
    cpu_period_ms: float = CFS_PERIOD_MS
    #: replay the quota each rank's cgroup had when profiled where the kernel throttled it
    #: (:func:`recorded_limits`; ``dpro replay --recorded-quota``)
    recorded_quota: bool = False

    def any(self) -> bool:
        return self.bucket_mb is not None or self.bandwidth_mbps is not None or self.world_size is not None \
            or self.fusion_threshold_mb is not None or self.cycle_time_ms is not None or self.servers is not None \
            or self.partition_bytes is not None or bool(self.slow_rank or self.like_median or self.slow_link or self.slow_host or self.cpu_share or self.host_busy or self.cpu_limit or self.recorded_quota) \
            or self.wire_mbps is not None

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {} and v != [] and
                (k != "first_bucket_mb" or self.bucket_mb is not None) and (k != "cpu_period_ms" or self.cpu_limit or self.recorded_quota)
                and (k != "recorded_quota" or self.recorded_quota) and (k not in ("cpu_share", "host_busy", "wire_mbps") or self.slow_host)}


def apply(ts: TraceSet, model: CommModel, w: WhatIf) -> tuple[TraceSet, CommModel]:
    """Apply ``w`` to a trace and its fitted comm model (re-bucket, then scale, then re-rate).

    Parameters
    ----------
    ts : TraceSet
        The profiled job (aligned).
    model : CommModel
        Its fitted link model.
    w : WhatIf
        The configuration to predict.

    Returns
    -------
    (TraceSet, CommModel)
        The job and link model of the what-if configuration.
    """
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
    if w.fusion_threshold_mb is not None or w.cycle_time_ms is not None:
        if w.fusion_threshold_mb is not None and not w.fusion_threshold_mb > 0:
            raise DproError(f"fusion threshold must be > 0 MB, got {w.fusion_threshold_mb}")
        ts = horovod_knobs(ts, None if w.fusion_threshold_mb is None else int(w.fusion_threshold_mb * 2**20),
                           w.cycle_time_ms, model)
    if w.world_size is not None:
        ts = scale_world(ts, w.world_size)
    if w.servers is not None:
        ts = scale_servers(ts, w.servers)
    if w.partition_bytes is not None:
        ts = byteps_partition_bytes(ts, int(w.partition_bytes))
    if w.cpu_share and not w.slow_host:
        raise DproError("--cpu-share needs --slow-host (the share a slowed host had when profiled)", path=ts.path)
    if w.host_busy and not w.slow_host:
        raise DproError("--host-busy needs --slow-host (how busy a slowed host was without the profiler)", path=ts.path)
    if w.wire_mbps is not None and not w.slow_host:
        raise DproError("--wire-mbps needs --slow-host (which of a slowed host's transfers the wire paced)",
                        path=ts.path)
    if w.slow_host:
        ts, model, info = slow_hosts(ts, model, dict(w.slow_host), dict(w.cpu_share), dict(w.host_busy),
                                     w.wire_mbps)
        # what the what-if used, per slowed node (dpro replay --json: slow_host)
        ts = replace(ts, manifest=replace(ts.manifest, extra={**ts.manifest.extra, "slow_host": info}))
    if w.slow_rank:
        ts = slow_ranks(ts, dict(w.slow_rank))
    if w.like_median:     # after --slow-rank: "what if the slowed rank were fixed"
        ts = like_median(ts, list(w.like_median))
    if w.bandwidth_mbps is not None:
        model = with_bandwidth(model, w.bandwidth_mbps)
    if w.slow_link:
        model = slow_links(model, ts, dict(w.slow_link))
    if w.cpu_limit:
        cpu_limit_nodes(ts, w)    # checks the hosts and values; the session applies it to the built graph
    return ts, model


def recorded_limits(ts: TraceSet, facts: Any) -> tuple[dict[str, float], float | None]:
    """Worker node -> CPUs of the quota its cgroup had when profiled, for the nodes the kernel throttled.

    From the collector's records (``facts.cpu_use``: ``limit_cpus``, ``throttled_us`` per unprofiled
    step, ``throttled_us_profiled`` per profiled step, ``period_us`` where recorded): a node is listed
    when it had a quota and was stopped by it (in the unprofiled or the profiled steps); workers of one host with the same quota share it (one cgroup per
    host, as ``dpro_kit.jobs.CpuBudget`` makes them), so each gets ``limit / count``.  Returns
    the nodes and the recorded period in us (None when not recorded: the caller's ``--cpu-period-ms``).
    Nothing throttled: ``({}, None)`` and the replay is the plain one.
    """
    hit: dict[str, float] = {}
    periods = set()
    for n, info in ts.manifest.nodes.items():
        use = facts.cpu_use.get(n) or {}
        lim, thr = use.get("limit_cpus"), use.get("throttled_us")
        prof = use.get("throttled_us_profiled")
        hit_prof = isinstance(prof, dict) and any(v and v > 0 for v in prof.values())
        if info.role == "worker" and lim and lim > 0 and ((thr and thr > 0) or hit_prof):
            hit[n] = float(lim)
            if use.get("period_us"):
                periods.add(float(use["period_us"]))
    out = {}
    for n, lim in hit.items():
        host = ts.manifest.nodes[n].host
        share = [m for m, i in ts.manifest.nodes.items() if i.host == host and i.role == "worker"
                 and (facts.cpu_use.get(m) or {}).get("limit_cpus") == lim]
        out[n] = lim / max(1, len(share))
    return out, (max(periods) if periods else None)


def full_speed_durations(graphs: list[Any], nodes: Any) -> dict[str, float]:
    """Graph key -> the median of its duration over the per-iteration graphs, for the computation ops of ``nodes``."""
    import statistics
    vals: dict[str, list[float]] = {}
    for g in graphs:
        for k, d in g.nodes(data=True):
            if d.get("node") in nodes and str(d.get("kind")) in COMPUTE_KINDS \
                    and not str(d.get("device", "")).startswith("link:"):
                vals.setdefault(k, []).append(float(d["dur"]))
    return {k: float(statistics.median(v)) for k, v in vals.items()}


def dethrottle_factors(graphs: dict[int, Any], nodes: Any, facts: Any) -> dict[int, dict[str, float]]:
    """Iteration -> graph key -> factor that takes the kernel's stops out of a throttled rank's traced ops.

    A quota stops a thread, it does not slow every op (docs/stragglers.md): in profiled iteration i
    the collector recorded that rank ``n`` was stopped ``S_i`` (``cpu_use[n].throttled_us_profiled``;
    traces without it: the mean over the unprofiled steps, ``throttled_us``), and the stops sit in
    the ops that took longer than usual.  With ``m_k`` an op's median over the profiled iterations
    and ``x_k = max(0, d_k - m_k)`` its excess in iteration i (``E_i`` their sum over the rank's
    computation), each op gives back the same share of its excess::

        d_k' = d_k - x_k * min(1, S_i / E_i)

    so the rank's computation loses ``min(S_i, E_i)`` - at most what the kernel says it was
    stopped, never below the per-op medians.  Returned as factors ``d_k' / d_k`` (they compose with
    ``--slow-rank``); ops without excess are left out.
    """
    med = full_speed_durations(list(graphs.values()), nodes)
    out: dict[int, dict[str, float]] = {}
    for it, g in graphs.items():
        f: dict[str, float] = {}
        for n in nodes:
            use = facts.cpu_use.get(n) or {}
            per = use.get("throttled_us_profiled")
            s_i = (per or {}).get(str(it)) if isinstance(per, dict) else None
            if s_i is None:
                s_i = use.get("throttled_us") or 0.0
            exc = {k: float(g.nodes[k]["dur"]) - m for k, m in med.items()
                   if k in g and g.nodes[k].get("node") == n and float(g.nodes[k]["dur"]) > m}
            tot = sum(exc.values())
            if s_i <= 0 or tot <= 0:
                continue
            share = min(1.0, float(s_i) / tot)
            for k, x in exc.items():
                d = float(g.nodes[k]["dur"])
                f[k] = (d - x * share) / d
        out[it] = f
    return out


def cpu_limit_nodes(ts: TraceSet, w: WhatIf) -> dict[str, float]:
    """Worker node -> CPUs of its quota for ``w.cpu_limit`` (a host's quota split evenly over its workers).

    Raises
    ------
    DproError
        An unknown host, a limit that is not a positive number, a period that is not > 0.
    """
    if not (w.cpu_period_ms > 0 and math.isfinite(w.cpu_period_ms)):
        raise DproError(f"--cpu-period-ms {w.cpu_period_ms}: the period must be a positive number of ms",
                        path=ts.path, hint="the kernel's default is 100 (cpu.cfs_period_us 100000)")
    check_host_values(ts, w.cpu_limit, "--cpu-limit", "the limit must be a positive number of CPUs",
                      "e.g. --cpu-limit host1=0.667 (host1's cgroup quota: 2/3 of a CPU)")
    out: dict[str, float] = {}
    for h, c in w.cpu_limit.items():
        nodes = [n for n, i in ts.manifest.nodes.items() if i.host == h and i.role == "worker"]
        for n in nodes:
            out[n] = float(c) / len(nodes)
    return out


__all__ = ["CFS_PERIOD_MS", "COMPUTE_KINDS", "cfs_schedule", "cpu_seen", "dethrottle_factors", "full_speed_durations", "idle_cpu", "recorded_limits", "WIRE_BOUND_TOLERANCE", "fastest_collectives", "wire_bound_share", "cpu_limit_nodes", "cpu_limit_warnings", "cpu_limited_graph", "DDP_FIRST_BUCKET_BYTES", "HVD", "TCP_EFFICIENCY", "apply", "byteps_partition_bytes",
           "like_median", "slow_links", "slow_ranks", "slow_hosts", "host_cpu_split", "transfer_factor", "computation_per_iteration_ms",
           "ddp_bucket_assignment", "HVD_ROUNDS", "horovod_knobs",
           "rebucket", "scale_servers", "scale_world", "WhatIf", "with_bandwidth"]
