"""plan.json: what ``dpro optimize`` writes (schema :data:`PLAN_SCHEMA`, validated by :func:`validate_plan`;
both defined in :mod:`dpro_collect.plan`, which ``dpro_torch.plan`` uses inside the job).

Every number that comes from a model rather than a measurement is listed in
``plan["estimated"]``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# the format and its check live with the collectors (dpro_torch.plan reads plans inside the job)
from dpro_collect.plan import PLAN_FORMAT, PLAN_SCHEMA, PLAN_VERSION, validate_plan

from .search import SearchResult
from .state import BaseJob, Strategy, fused_duration, group_name, split_bytes


def _ddp_cap(groups_bytes: list[int], sizes_in_order: list[int]) -> tuple[float, bool]:
    """The bucket_cap_mb whose DDP assignment reproduces the plan's groups, else the closest (max group)."""
    from ..whatif import ddp_bucket_assignment
    want = []
    i = 0
    for gb in groups_bytes:
        n = 0
        acc = 0
        while acc < gb and i + n < len(sizes_in_order):
            acc += sizes_in_order[i + n]
            n += 1
        want.append(n)
        i += n
    cands = sorted({max(1, b) for b in groups_bytes})
    for cap in cands:
        got = [len(b) for b in ddp_bucket_assignment(sizes_in_order, cap, cap)]
        if got == want:
            return cap / 2**20, True
    return (max(groups_bytes) if groups_bytes else 25 * 2**20) / 2**20, False


def _internal(names: list[str]) -> bool:
    """Fusion regions made only of framework-internal ops (DDP reducer copies ...) are not offered to compilers."""
    return all(n.startswith("torch.distributed") or n.startswith("aten::as_strided") for n in names)


def _memory_provenance(est: dict[str, Any]) -> dict[str, Any]:
    """Where the memory estimate's numbers came from (plan.json -> memory.model / memory.sources)."""
    if est.get("model") == "timeline":
        model = ("timeline model: allocations and frees of the trace's allocator samples (dpro profile --memory), "
                 "transformed for recomputation / accumulation; + persistent parameters, buffers, optimizer state")
    else:
        model = "sum model: params + grads + optimizer state + activations (" + \
                str(est.get("activation_source", "as given")) + ")"
    return {"model": model, "sources": dict(est.get("sources", {}))}


def make_plan(base: BaseJob, r: SearchResult, *, trace: str = "", info: dict[str, Any] | None = None,
              options: dict[str, Any] | None = None, memory_budget: int | None = None,
              ready_us: dict[str, float] | None = None, schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan.json document of a search result (validated against :data:`PLAN_SCHEMA`).

    Parameters
    ----------
    base : BaseJob
        The job the search started from.
    r : SearchResult
        The search's result (strategy, predicted times, changes).
    trace, info, options, memory_budget, ready_us
        Facts for the plan (see ``dpro optimize``).
    schedule : dict or None
        ``plan["schedule"]``: TicTac transfer orders of a PS job
        (:func:`dpro_kit.optimize.tictac.plan_section`); left out when None.
    """
    s: Strategy = r.strategy
    groups = []
    for grp in s.groups:
        name = group_name(grp)
        nbytes = sum(base.tensors[t].bytes for t in grp)
        k = s.parts(name)
        groups.append({"name": name, "tensors": list(grp), "params": [p for t in grp for p in base.tensors[t].params],
                       "bytes": int(nbytes), "partitions": int(k), "partition_bytes": split_bytes(nbytes, k)})
    ref = base.nodes[0] if base.nodes else ""
    fusions = []
    from ..graph.model import op_key
    timed = {tuple(t["ops"]): t for t in ((info or {}).get("fusion_timing") or {}).get("groups", [])}
    for f in s.fusions:
        parts = [float(base.local.nodes[op_key(ref, o)]["dur"]) for o in f if op_key(ref, o) in base.local]
        ratio = base.fusion_ratios.get(tuple(f))
        entry = {"ops": list(f), "names": [base.local.nodes[op_key(ref, o)]["name"] for o in f
                                           if op_key(ref, o) in base.local],
                 "fused_us": fused_duration(base, parts, f), "parts_us": parts,
                 "source": "torch.compile" if ratio is not None else "model"}
        if ratio is not None:
            t = timed.get(tuple(f), {})
            entry["cost_model"] = (f"sum of parts x measured compiled/eager ratio {ratio:.3f} (region rebuilt from "
                                   f"recorded shapes: eager {t.get('eager_us') or 0:.1f} us, torch.compile "
                                   f"{t.get('compiled_us') or 0:.1f} us) [MEASURED]")
        else:
            why = timed.get(tuple(f), {}).get("reason")
            entry["cost_model"] = ("sum of parts - (n-1) x launch overhead "
                                   f"({base.launch_overhead_us:.2f} us, p10 of traced op durations) [MODEL]"
                                   + (f"; not timed: {why}" if why else ""))
        fusions.append(entry)
    # framework settings
    sizes = [base.tensors[t].bytes for grp in s.groups for t in grp]
    gbytes = [g["bytes"] for g in groups]
    cap_mb, exact = _ddp_cap(gbytes, sizes)
    max_group = max(gbytes) if gbytes else 0
    part_sizes = [max(g["partition_bytes"]) for g in groups if g["partitions"] > 1]
    ready = ready_us or {}
    spans = []
    for grp in s.groups:
        rs = [ready[t] for t in grp if t in ready]
        if len(rs) > 1:
            spans.append(max(rs) - min(rs))
    cycle_ms = max(0.5, round(float(np.median(spans)) / 1e3, 3)) if spans else 1.0
    inf = info or {}
    traced = inf.get("traced_ddp") or {}
    keep = bool(inf.get("kept_traced")) and not inf.get("whatif")
    if keep and traced.get("bucket_cap_bytes"):
        # no change recommended: the DDP settings the job was traced with
        cap_mb, exact = int(traced["bucket_cap_bytes"]) / 2**20, True
    frameworks = {
        "pytorch_ddp": {"bucket_cap_mb": round(cap_mb, 6), "bucket_cap_bytes": int(round(cap_mb * 2**20)),
                        "keep_traced": keep, "traced_default_cap": bool(traced.get("bucket_cap_default", False)),
                        "bucket_plan": [g["params"] for g in groups],
                        "exact": bool(exact),
                        "note": ("no change recommended (the best plan's predicted gain is below --min-gain): keep "
                                 + ("DDP's default buckets (bucket_cap_mb=None)" if traced.get("bucket_cap_default")
                                    else f"bucket_cap_mb={cap_mb:g}") if keep else
                                 "DDP(bucket_cap_mb=...) reproduces these groups exactly (parameter order as traced)"
                                 if exact else "no single bucket_cap_mb reproduces the groups; bucket_cap_mb is the "
                                 "largest group (closest); exact groups need a comm hook or parameter re-ordering"),
                        "first_bucket_note": "an explicit bucket_cap_mb caps DDP's first bucket too (torch 2.13); "
                                             "only DDP's default (None) uses a 1 MiB first bucket",
                        "partitions_note": "DDP has no tensor partition; groups with partitions > 1 need a comm hook"
                        if any(g["partitions"] > 1 for g in groups) else ""},
        "horovod": {"HOROVOD_FUSION_THRESHOLD": int(max_group) if any(len(g["tensors"]) > 1 for g in groups) else 0,
                    "HOROVOD_CYCLE_TIME": cycle_ms,
                    "note": "fusion threshold = largest tensor group (0 = no fusion: every group is one tensor); "
                            "cycle time = median span between the first and last gradient-ready time inside a "
                            "group (replayed) [heuristic]"},
        "byteps": {"BYTEPS_PARTITION_BYTES": int(max(part_sizes) if part_sizes else max(max_group, 4096)),
                   "note": "largest partition of a partitioned group, else the largest group (no partitioning)"},
        "xla": {"fusion_regions": [f["ops"] for f in fusions if not _internal(f["names"])],
                "note": "ops of the same region should be fused (e.g. as one HLO fusion / jit region)"},
        "torch_compile": {"regions": [f["names"] for f in fusions if not _internal(f["names"])],
                          "note": "compile each region as one graph (torch.compile on the module(s) running these "
                                  "ops); regions are op names as traced"},
    }
    plan = {
        "format": PLAN_FORMAT, "version": PLAN_VERSION, "trace": trace, **({"whatif": info["whatif"]}
                                                                          if info and "whatif" in info else {}),
        "job": (info or {}).get("job", base.meta.get("job", "")), "world_size": base.meta.get("world_size"),
        "comm_model": base.meta.get("comm_model"),
        "predicted": {"before_ms": r.before_us / 1e3, "after_ms": r.after_us / 1e3,
                      "speedup": (r.before_us / r.after_us) if r.after_us > 0 else 1.0},
        "strategies": r.changes, "tensor_groups": groups, "op_fusion_groups": fusions,
        "memory": {"choices": s.mem(), "budget_bytes": memory_budget, "estimate_before": r.memory_before,
                   "estimate_after": r.memory, **_memory_provenance(r.memory_before)},
        "frameworks": frameworks,
        "search": {"steps": r.steps, "elapsed_s": r.elapsed_s, "stopped": r.stopped, "replays": r.replays,
                   "sync_evals": r.sync_evals, **(options or {})},
        "strategy_state": s.to_json(),
        "fusion_timing": {k: v for k, v in ((info or {}).get("fusion_timing") or {"mode": "model"}).items()},
        "estimated": ["predicted.* (replay of the rebuilt DFG)",
                      "op_fusion_groups[].fused_us (cost model where source is 'model'; measured ratio x traced "
                      "parts where source is 'torch.compile')",
                      "memory.* (" + _memory_provenance(r.memory_before)["model"] + ")",
                      "communication of re-grouped tensors (comm model: latency + bytes/bandwidth)",
                      "frameworks.horovod.HOROVOD_CYCLE_TIME (heuristic)"],
    }
    if schedule is not None:
        plan["schedule"] = schedule
        plan["estimated"].append("schedule.predicted.* (replay of the plan's DFG with each transfer order)")
    validate_plan(plan)
    return plan


__all__ = ["PLAN_FORMAT", "PLAN_SCHEMA", "PLAN_VERSION", "make_plan", "validate_plan"]
