"""Predict a strategy: compile, replay, and report time, breakdown, memory and the OOM verdict.

:func:`predict` is what ``dpro simulate`` runs for each strategy file: compile the
strategy (:func:`dpro_kit.simulate.compiler.compile_strategy`), replay one iteration
of the execution graph (:func:`dpro_kit.replay.replay`, device model ``shared`` when
the replayer has it — concurrent transfers on one link share its bandwidth — else
``fifo``), and read off

* ``iteration_ms``: the replayed makespan (one iteration, from the first op to the last);
* per rank, the **breakdown** of that time: ``compute`` (its compute device busy),
  ``exposed_comm`` (no compute running while a transfer from or to the rank, or its
  ``comm`` stream, is busy), ``bubble`` (the rest: waiting on other ranks, pipeline
  fill and drain); they add up to ``iteration_ms``;
* per rank, the **memory**: each part at its largest (:func:`dpro_kit.simulate.compiler.stage_memory`,
  ``parts_sum`` their sum) and the **peak** of the replayed timeline (the ops' ``mem_alloc`` /
  ``mem_free``, :func:`dpro_kit.simulate.compiler.annotate_memory`, played by
  :func:`dpro_kit.optimize.memory.replay_memory`: Proteus §VI-B), which the OOM verdict
  compares with the limit.

:func:`rank_strategies` orders several predictions (fits in memory first, then time).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


from ..costmodel import DEFAULT_LATENCY_US
from .compiler import Compiled, compile_strategy
from .model import ModelGraph
from .strategy import Strategy

#: default rate between ranks of one host when the strategy file does not give one (loopback)
DEFAULT_INTRA_HOST_MBPS = 10_000.0


@dataclass
class Prediction:
    """One strategy's predicted iteration (see the module docstring)."""

    strategy: Strategy
    iteration_ms: float
    breakdown_ms: dict[str, float]
    per_rank: list[dict[str, Any]]
    peak_memory_bytes: int
    memory_limit_bytes: int | None
    oom: bool | None
    links: dict[str, Any]
    device_model: str
    collectives: dict[str, dict[str, float]]
    compiled: Compiled | None = None
    notes: list[str] = field(default_factory=list)
    overlap_factor: float = 0.0
    runtime_overhead_ms: float = 0.0
    runtime_memory_bytes: int = 0
    #: the replay (:class:`dpro_kit.replay.ReplayResult`) and its memory timeline
    #: (:class:`dpro_kit.optimize.memory.ReplayMemory`), for ``--timeline``
    result: Any = None
    memory: Any = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``dpro simulate --json``)."""
        return {"name": self.strategy.name, "path": self.strategy.path, "strategy": self.strategy.describe(),
                "iteration_ms": round(self.iteration_ms, 4),
                "breakdown_ms": {k: round(v, 4) for k, v in self.breakdown_ms.items()},
                "peak_memory_bytes": int(self.peak_memory_bytes), "memory_limit_bytes": self.memory_limit_bytes,
                "oom": self.oom, "device_model": self.device_model, "overlap_factor": self.overlap_factor,
                "links": self.links, "runtime_overhead_ms": self.runtime_overhead_ms,
                "runtime_memory_bytes": self.runtime_memory_bytes,
                "collectives": self.collectives, "ranks": self.per_rank,
                "stages": self.compiled.stage_layers if self.compiled else None, "notes": self.notes}


def _union_len(iv: list[tuple[float, float]]) -> float:
    if not iv:
        return 0.0
    iv.sort()
    tot, (a, b) = 0.0, iv[0]
    for s, e in iv[1:]:
        if s > b:
            tot += b - a
            a, b = s, e
        else:
            b = max(b, e)
    return tot + (b - a)


def _minus_len(iv: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of union(iv) not covered by union(cover)."""
    both = _union_len(list(iv) + list(cover))
    return both - _union_len(list(cover))


def pick_device_model() -> str:
    """``shared`` (bandwidth sharing, issue 16 item 3) when the replayer registers it, else ``fifo``."""
    from ..replay.rules import DEVICE_MODELS
    return "shared" if "shared" in DEVICE_MODELS else "fifo"


def predict(model: ModelGraph, strategy: Strategy, *, bandwidth_mbps: float | None = None,
            default_bandwidth_Bps: float | None = None, memory_limit: int | None = None,
            device_model: str | None = None, overlap_factor: float = 0.0,
            runtime_overhead_ms: float | None = None, runtime_memory: int | None = None,
            link_burst: int | None = None) -> Prediction:
    """Compile and replay ``strategy`` on ``model``.

    Parameters
    ----------
    model : ModelGraph
        From :func:`dpro_kit.simulate.model.from_profile`.
    strategy : Strategy
        From :func:`dpro_kit.simulate.strategy.load_strategy`.
    bandwidth_mbps : float or None
        Inter-host line rate (Mbit/s) overriding the strategy file's ``bandwidth_mbps``; transfers run
        at its goodput, ``x link_efficiency`` (default :data:`dpro_kit.whatif.TCP_EFFICIENCY`, as
        ``dpro replay --bandwidth-mbps``).
    default_bandwidth_Bps : float or None
        Rate when neither gives one (the profile's link model); None: 10 Gbit/s.
    memory_limit : int or None
        Bytes per device overriding the file's ``memory_limit``; None and no file limit: no verdict.
    device_model : str or None
        Replay kernel; None: :func:`pick_device_model`.
    overlap_factor : float
        Proteus' gamma for the ``shared`` kernel (computation slowed by ``1 + gamma`` while a
        transfer of its host is in flight); must be 0 with ``fifo``.
    runtime_overhead_ms : float or None
        The strategy runtime's own CPU time per rank and iteration, overriding the file's
        ``runtime_overhead_ms`` (None and none in the file: 0); measured, docs/simulate.md
        "Runtime overheads".
    runtime_memory : int or None
        Bytes per rank the strategy's runtime holds besides the model's parts (DTensor's, FSDP2's and the
        pipelining runtime's own state), overriding the file's ``runtime_memory`` (None and none in the
        file: 0); measured on the model's tiny twin, docs/simulate.md "Memory predicted from mechanism".
        Added to every rank's ``runtime`` part, on top of :attr:`ModelGraph.runtime_bytes`.
    link_burst : int or None
        Token-bucket depth (bytes) of every host's links between hosts, each direction (a shaper's
        burst, e.g. the emulated cluster's tbf: ``dpro_kit.cluster.tbf_params``; cloud NICs have such
        buckets too): a transfer after a pause leaves at the wire's speed for that many bytes, then at the
        rate (``shared`` device model; :func:`dpro_kit.replay.sharing.run_shared`).  None: plain links.

    Returns
    -------
    Prediction
    """
    from ..costmodel import DEFAULT_BANDWIDTH_BPS
    from ..replay import replay

    from ..whatif import TCP_EFFICIENCY
    eff = strategy.link_efficiency if strategy.link_efficiency is not None else TCP_EFFICIENCY
    if bandwidth_mbps is not None:     # a line rate: TCP goodput = rate x efficiency, as dpro replay's what-if
        bw = bandwidth_mbps * 1e6 / 8 * eff
        bw_src = "--bandwidth-mbps"
    elif strategy.bandwidth_mbps is not None:
        bw = strategy.bandwidth_mbps * 1e6 / 8 * eff
        bw_src = "strategy file"
    else:
        bw = default_bandwidth_Bps or DEFAULT_BANDWIDTH_BPS
        bw_src = "profile link model" if default_bandwidth_Bps else "default"
    intra = (strategy.intra_host_bandwidth_mbps or DEFAULT_INTRA_HOST_MBPS) * 1e6 / 8
    lat = strategy.latency_us if strategy.latency_us is not None else DEFAULT_LATENCY_US
    ovh = runtime_overhead_ms if runtime_overhead_ms is not None else (strategy.runtime_overhead_ms or 0.0)
    rmem = int(runtime_memory if runtime_memory is not None else (strategy.runtime_memory or 0))
    if rmem:
        from dataclasses import replace
        model = replace(model, runtime_bytes=model.runtime_bytes + rmem)
    comp = compile_strategy(model, strategy, bandwidth_Bps=bw, latency_us=lat, intra_Bps=intra, runtime_us=ovh * 1e3)
    dm = device_model or pick_device_model()
    opts = {"overlap_factor": float(overlap_factor)} if dm == "shared" else None
    if overlap_factor and dm != "shared":
        raise ValueError("overlap_factor needs the 'shared' device model")
    line = bandwidth_mbps if bandwidth_mbps is not None else strategy.bandwidth_mbps
    if link_burst:
        if dm != "shared":
            raise ValueError("link_burst needs the 'shared' device model")
        # tokens in us of a transfer at its solo speed: the bucket's bytes (frames) at the line rate
        line_Bps = line * 1e6 / 8 if line is not None else bw / eff
        opts.update(token_bucket_us=float(link_burst) / line_Bps * 1e6, token_floor_us=float(lat))
    res = replay(comp.graph, device_model=dm, model_options=opts)
    g = comp.graph
    T = res.makespan_us
    keys = res.graph.keys
    dev_names = res.graph.devices
    per_node_compute: dict[str, list[tuple[float, float]]] = {n: [] for n in comp.nodes}
    per_node_comm: dict[str, list[tuple[float, float]]] = {n: [] for n in comp.nodes}
    for i, k in enumerate(keys):
        d = int(res.graph.device[i])
        if d < 0:
            continue
        dv = dev_names[d]
        a = g.nodes[k]
        s, e = float(res.start[i]), float(res.end[i])
        if e <= s:
            continue
        if dv.endswith(":compute"):
            per_node_compute[a["node"]].append((s, e))
        elif dv.startswith("link:") or dv.endswith(":comm"):
            per_node_comm[a["node"]].append((s, e))
            if a.get("peer") in per_node_comm:
                per_node_comm[a["peer"]].append((s, e))
    per_rank = []
    for r, n in enumerate(comp.nodes):
        comp_us = _union_len(list(per_node_compute[n]))
        exp = _minus_len(per_node_comm[n], per_node_compute[n])
        mem = {k: int(round(v)) for k, v in comp.memory[r].items()}
        per_rank.append({"rank": r, "node": n, "stage": comp.stage_of[r], "compute_ms": comp_us / 1e3,
                         "exposed_comm_ms": exp / 1e3, "bubble_ms": max(0.0, T - comp_us - exp) / 1e3,
                         "memory": mem})
    nr = max(1, len(per_rank))
    breakdown = {"compute": sum(p["compute_ms"] for p in per_rank) / nr,
                 "exposed_comm": sum(p["exposed_comm_ms"] for p in per_rank) / nr,
                 "bubble": sum(p["bubble_ms"] for p in per_rank) / nr}
    limit = memory_limit if memory_limit is not None else strategy.memory_limit
    from ..optimize.memory import replay_memory
    mem = replay_memory(res, g, limit)
    for p in per_rank:
        n = p["node"]
        p["memory"]["parts_sum"] = p["memory"].pop("peak")
        p["memory"]["peak"] = int(mem.peak.get(n, 0))
        p["memory"]["peak_ms"] = round(mem.peak_us.get(n, 0.0) / 1e3, 4)
        p["memory"]["peak_op"] = mem.peak_op.get(n, "")
    peak = int(max(p["memory"]["peak"] for p in per_rank)) if per_rank else 0
    oom = None if limit is None else bool(peak > limit)
    colls: dict[str, dict[str, float]] = {}
    for c in comp.collectives:
        kind = c["kind"]
        e = colls.setdefault(kind, {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += c["bytes"]
    links = {"inter_host_mbps": line if line is not None else bw * 8 / 1e6, "goodput_mbps": bw * 8 / 1e6,
             "source": bw_src, "intra_host_mbps": intra * 8 / 1e6, "latency_us": lat,
             "burst_bytes": int(link_burst) if link_burst else None}
    notes = list(model.notes) + list(comp.notes)
    if ovh:
        notes.append(f"runtime overhead {ovh:g} ms per rank and iteration added (measured, not modelled: "
                     "docs/simulate.md \"Runtime overheads\")")
    if rmem:
        notes.append(f"runtime memory {rmem / 2**20:.2f} MiB per rank added (the strategy runtime's own state, "
                     "measured, not modelled: docs/simulate.md \"Memory predicted from mechanism\")")
    if dm == "fifo":
        notes.append("replayed with FIFO links (no bandwidth sharing between concurrent transfers)")
    return Prediction(strategy=strategy, iteration_ms=T / 1e3, breakdown_ms=breakdown, per_rank=per_rank,
                      peak_memory_bytes=peak, memory_limit_bytes=limit, oom=oom, links=links, device_model=dm,
                      collectives=colls, compiled=comp, notes=notes, overlap_factor=float(overlap_factor),
                      runtime_overhead_ms=float(ovh), runtime_memory_bytes=rmem,
                      result=res, memory=mem)


def profiled_strategy(model: ModelGraph) -> Strategy:
    """The configuration the profile ran: one process, DDP over a 1-rank group (docs/simulate.md)."""
    from .strategy import parse_strategy
    return parse_strategy({"name": "profiled", "ranks": 1, "hosts": 1, "strategy": {}}, default_name="profiled")


def with_measured_peak(model: ModelGraph, measured_peak: int) -> ModelGraph:
    """``model`` with :attr:`ModelGraph.runtime_bytes` = ``measured_peak`` (the profiled process's
    peak memory, measured: e.g. ``examples/strategies/train.py --ranks 1 --memory``'s ``peak_bytes``)
    minus the peak this model replays for that same process (:func:`profiled_strategy`), at least 0.

    What it stands for is whatever the process holds that the model has no part for -- framework
    and library buffers, Python objects, autograd's temporaries in the backward -- taken to be the
    same on every rank of any strategy (each rank is such a process); docs/simulate.md "Memory
    predicted from mechanism".
    """
    from dataclasses import replace
    base = replace(model, runtime_bytes=0)
    # + P: the profiled process runs DDP over one rank, which keeps its flat bucket buffers (one copy
    # of the gradients) although nothing is reduced; a strategy with dp = 1 has no DDP and no buffers
    modelled = predict(base, profiled_strategy(base), bandwidth_mbps=1000.0).peak_memory_bytes + model.param_bytes
    return replace(model, runtime_bytes=max(0, int(measured_peak) - int(modelled)))


def rank_strategies(preds: list[Prediction]) -> list[Prediction]:
    """Best first: strategies that fit in memory (or have no limit) by predicted time, then the OOM ones."""
    return sorted(preds, key=lambda p: (bool(p.oom), p.iteration_ms))


__all__ = ["DEFAULT_INTRA_HOST_MBPS", "Prediction", "pick_device_model", "predict", "profiled_strategy", "rank_strategies",
           "with_measured_peak"]

