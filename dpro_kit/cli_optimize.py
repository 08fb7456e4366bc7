"""`dpro optimize`: search op fusion / tensor fusion / partition / memory strategies (docs/optimizer.md)."""
from __future__ import annotations

import json
import time
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

import click

from .errors import DproError, atomic_write_text


#: relative growth of the predicted iteration time accepted to save one collective (see _merge_near_ties)
MERGE_TOLERANCE = 0.01


def _merge_near_ties(base: Any, searcher: Any, result: Any, deadline: float) -> Any:
    """Greedily fuse adjacent tensor groups while the replayed time stays within MERGE_TOLERANCE."""
    s = result.strategy
    from .optimize.state import group_name
    if len(s.groups) < 2 or any(s.parts(group_name(g)) > 1 for g in s.groups):
        return result
    best_t = searcher.evaluate(s)[0]
    limit = best_t * (1.0 + MERGE_TOLERANCE)
    merged = 0
    i = 0
    while i < len(s.groups) - 1 and time.perf_counter() < deadline:
        cand = s.with_fused_groups(i, i + 1)
        t = searcher.evaluate(cand)[0]
        if t <= limit:
            s, merged = cand, merged + 1
        else:
            i += 1
    if merged:
        t = searcher.evaluate(s)[0]
        result.changes.append({"pass": "tensor_fusion", "args": {"merged_adjacent_groups": merged},
                               "reason": f"fewer collectives at a predicted cost within {100 * MERGE_TOLERANCE:g} %: "
                                         f"{merged} adjacent group merge(s), {best_t / 1e3:.3f} -> {t / 1e3:.3f} ms",
                               "predicted_before_ms": best_t / 1e3, "predicted_after_ms": t / 1e3,
                               "applied_as": "tensor_fusion"})
        result.strategy, result.after_us = s, t
    return result


def _time_op_fusions(trace: Path, base: Any, searcher: Any, result: Any, mode: str, deadline: float,
                     progress: Any) -> tuple[Any, dict[str, Any]]:
    """Replace the fused-op model by torch.compile timings for the plan's fusion groups; drop the
    groups that do not pay off with the measured times (docs/optimizer.md, "Fused-op times").

    The search itself runs with the model (timing every candidate would take minutes); the
    groups it chose are rebuilt from the shapes trace and timed, then each timed group is
    kept only if the replay with measured times is not slower with it than without it.
    """
    info: dict[str, Any] = {"mode": mode, "groups": []}
    s = result.strategy
    if mode == "model" or not s.fusions:
        info["note"] = "fused-op times from the model" if mode == "model" else "no op-fusion group to time"
        return result, info
    # (mode "compile" was checked for shapes and torch before the search: _fusion_timing_unavailable)
    from .optimize.compile_timing import load_shapes, time_fusions
    why = _fusion_timing_unavailable(trace)
    if why:
        info["note"] = f"{why}: fused-op times from the model"
        return result, info
    shapes, threads = load_shapes(trace)
    timings = time_fusions(s.fusions, shapes, threads=threads, deadline=deadline, progress=progress)
    info["groups"] = [t.as_dict() for t in timings.values()]
    ratios = {g: t.ratio for g, t in timings.items() if t.ratio is not None}
    if not ratios:
        info["note"] = "no fusion group could be timed (reasons per group): fused-op times from the model"
        return result, info
    model_t = result.after_us
    base.fusion_ratios.update(ratios)
    searcher.forget_evaluations()   # durations of the timed groups changed
    t = searcher.evaluate(s)[0]
    dropped = []
    for g in list(ratios):
        if g not in s.fusions:
            continue
        s2 = dc_replace(s, fusions=tuple(f for f in s.fusions if f != g))
        t2 = searcher.evaluate(s2)[0]
        if t2 <= t:
            s, t = s2, t2
            dropped.append(list(g))
    info.update({"timed": len(ratios), "dropped": dropped, "predicted_model_ms": model_t / 1e3,
                 "predicted_measured_ms": t / 1e3})
    result.changes.append({"pass": "op_fusion_timing", "args": {"timed": len(ratios), "dropped": len(dropped)},
                           "reason": f"{len(ratios)} fusion group(s) timed with torch.compile (compiled/eager "
                                     + ", ".join(f"{r:.2f}" for r in ratios.values())
                                     + f"); {len(dropped)} dropped as not faster; predicted "
                                       f"{model_t / 1e3:.3f} ms with the model -> {t / 1e3:.3f} ms measured",
                           "predicted_before_ms": model_t / 1e3, "predicted_after_ms": t / 1e3,
                           "applied_as": "op_fusion_timing"})
    result.strategy, result.after_us = s, t
    return result, info


def _fusion_timing_unavailable(trace: Path) -> str | None:
    """Why torch.compile timing cannot run on this trace here, or None."""
    from .optimize.compile_timing import load_shapes
    if not (trace.is_dir() and load_shapes(trace)[0]):
        return "no shapes trace (record it with `dpro profile --shapes`)"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch is not installed here"
    return None


#: DDP bucket caps (MB) tried as search starts
CAP_GRID_MB = (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _best_cap_start(base: Any, searcher: Any) -> tuple[list[list[str]] | None, float]:
    """The grouping of the best DDP bucket cap of :data:`CAP_GRID_MB` (tensors in reduction order; an
    explicit cap caps the first bucket too), by replayed time; (None, 0) when tensors have no order."""
    from .optimize.state import initial_strategy
    from .whatif import ddp_bucket_assignment
    order = [t for g in base.initial_groups for t in g]
    if len(order) < 2:
        return None, 0.0
    sizes = [base.tensors[t].bytes for t in order]
    best: tuple[float, list[list[str]] | None, float] = (float("inf"), None, 0.0)
    seen = set()
    for mb in CAP_GRID_MB:
        cap = int(mb * 2**20)
        groups = [[order[i] for i in idx] for idx in ddp_bucket_assignment(sizes, cap, cap)]
        key = tuple(map(tuple, groups))
        if key in seen:
            continue
        seen.add(key)
        t = searcher.evaluate(initial_strategy(base, groups))[0]
        if t < best[0]:
            best = (t, groups, mb)
    return best[1], best[2]


def load_base(trace: Path, *, bandwidth_mbps: float | None = None, world_size: int | None = None,
              bucket_mb: float | None = None, first_bucket_mb: float | None = None, align: bool = True,
              per_param: bool = True, per_iteration: bool | None = None
              ) -> tuple[Any, list[list[str]], dict[str, Any]]:
    """:func:`dpro_kit.optimize.load.load_base` of a :class:`~dpro_kit.session.Session` opened with the CLI's options.

    Parameters
    ----------
    trace : Path
        A trace directory or a graph file.
    bandwidth_mbps, world_size, bucket_mb, first_bucket_mb
        What-if options (:class:`dpro_kit.whatif.WhatIf`).
    align, per_iteration
        As :class:`~dpro_kit.session.Session` (defaults: as ``dpro replay``).
    per_param
        As :func:`dpro_kit.optimize.load.load_base`.
    """
    from .optimize.load import load_base as base_of
    from .session import Session
    from .whatif import WhatIf

    wi = WhatIf(bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, bandwidth_mbps=bandwidth_mbps,
                world_size=world_size)
    return base_of(Session(trace, align=align, whatif=wi, per_iteration=per_iteration), per_param=per_param)


@click.command(short_help="Search for faster op/tensor fusion, partition and memory strategies.")
@click.argument("trace", type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("plan.json"),
              show_default=True, help="Write the plan here.")
@click.option("--budget", type=float, default=60.0, show_default=True, help="Search time budget (seconds).")
@click.option("--max-steps", type=click.IntRange(1), default=50, show_default=True, help="Search step budget.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (order of single-candidate retries).")
@click.option("--memory-budget", type=str, default=None, help="Peak memory budget per worker, e.g. 16GB, 512MiB.")
@click.option("--activation-bytes", type=str, default=None,
              help="Override: activation memory per worker (default: the memory timeline of the trace's "
                   "allocator samples, recorded by `dpro profile --memory`).")
@click.option("--optimizer-slots", type=float, default=None,
              help="Override: optimizer state per parameter, in parameter sizes (SGD+momentum 1, Adam 2); "
                   "default: recorded in the trace, else 1.")
@click.option("--bandwidth-mbps", type=float, default=None, help="What if: every link at this line rate (Mbit/s).")
@click.option("--world-size", type=click.IntRange(1), default=None, help="What if: this many workers.")
@click.option("--bucket-mb", type=float, default=None, help="What if: start from DDP buckets of this size (MiB).")
@click.option("--first-bucket-mb", type=float, default=None,
              help="Start buckets: size cap of the first bucket (default: the --bucket-mb value).")
@click.option("--no-op-fusion", is_flag=True, help="Search tensor fusion/partition only.")
@click.option("--fusion-timing", type=click.Choice(["auto", "compile", "model"]), default="auto", show_default=True,
              help="Fused-op times of the plan's op-fusion groups: `compile` rebuilds each group from the op "
                   "shapes of `dpro profile --shapes` and times it with torch.compile (groups that are not "
                   "faster are dropped); `model` uses the cost model; `auto`: compile when shapes were "
                   "recorded and PyTorch is installed.")
@click.option("--no-tensor-fusion", is_flag=True)
@click.option("--no-partition", is_flag=True)
@click.option("--pass", "extra_passes", multiple=True, metavar="MODULE:CLASS",
              help="Also offer this user GraphPass (repeatable).")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the search state here after every step (JSON).")
@click.option("--resume", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Continue from a checkpoint written by --checkpoint.")
@click.option("--min-gain", default=5.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Recommend a change only if it is predicted to save at least this many percent of the "
                   "iteration time; else the plan keeps the traced configuration (predictions of another "
                   "configuration are good to a few percent, and every extra collective costs something real).")
@click.option("--no-align", is_flag=True, help="Do not apply the trace time alignment.")
@click.option("--per-iteration/--mean-durations", default=None,
              help="Search on the op durations of the median profiled iteration (what `dpro replay` replays), "
                   "or on every op's mean duration.  Default: as `dpro replay`.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def optimize(trace: Path, output: Path, budget: float, max_steps: int, seed: int, memory_budget: str | None,
             activation_bytes: str | None, optimizer_slots: float | None, bandwidth_mbps: float | None, world_size: int | None,
             bucket_mb: float | None, first_bucket_mb: float | None, no_op_fusion: bool, no_tensor_fusion: bool,
             no_partition: bool, fusion_timing: str, extra_passes: tuple[str, ...], checkpoint: Path | None, resume: Path | None,
             min_gain: float, no_align: bool, per_iteration: bool | None, as_json: bool, quiet: bool) -> None:
    """Find a faster strategy for the job in TRACE (dPRO Alg. 1) and write plan.json.

    \b
    Examples:
      dpro optimize T -o plan.json
      dpro optimize T --bandwidth-mbps 200 -o plan-slow.json     optimise for a slower network
      dpro optimize T --memory-budget 8GB                          T from `dpro profile --memory`
      dpro optimize T --memory-budget 8GB --activation-bytes 6GB   activations given
    """
    from .optimize.memory import MemoryModel, parse_size
    from .optimize.passes import load_entry_point_passes, load_pass
    from .optimize.plan import make_plan
    from .optimize.search import SearchOptions, Searcher, load_checkpoint, terminal_progress
    from .optimize.state import initial_strategy

    progress = terminal_progress(not (quiet or as_json))
    if fusion_timing == "compile":   # asked for explicitly: fail before the search, not after it
        why = _fusion_timing_unavailable(trace)
        if why:
            raise DproError(f"--fusion-timing compile: {why}", path=trace,
                            hint="record the trace with `dpro profile --shapes`, or use --fusion-timing auto|model")
    load_entry_point_passes()
    extra = [load_pass(p) for p in extra_passes]
    base, initial, info = load_base(trace, bandwidth_mbps=bandwidth_mbps, world_size=world_size,
                                    bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, align=not no_align,
                                    per_iteration=per_iteration)
    memory_model = MemoryModel(activation_bytes=parse_size(activation_bytes) or 0, optimizer_slots=optimizer_slots,
                               profile=info.pop("memory_profile", None))
    if memory_budget is not None and memory_model.profile is None and not memory_model.activation_bytes:
        click.echo("warning: the trace has no allocator samples (record it with `dpro profile --memory`) and no "
                   "--activation-bytes was given: activations count as 0 in the memory estimate", err=True)
    opts = SearchOptions(budget_s=budget, max_steps=max_steps, seed=seed, memory_budget=parse_size(memory_budget),
                         memory_model=memory_model,
                         op_fusion=not no_op_fusion, tensor_fusion=not no_tensor_fusion,
                         tensor_partition=not no_partition, extra_passes=extra, checkpoint=checkpoint,
                         progress=progress)
    searcher = Searcher(base, opts)
    t_search0 = time.perf_counter()
    result = searcher.run(initial_strategy(base, initial), resume=load_checkpoint(resume) if resume else None)
    start = "traced buckets"
    if resume is None:
        # other starts, each searched with the remaining budget; the faster plan wins.  dPRO's Alg. 1
        # starts from unfused tensors; the best single DDP bucket cap of a grid is what stock DDP
        # expresses, and Alg. 1's local moves from the other starts can miss it
        starts = []
        if initial != base.initial_groups:
            starts.append((None, {"from": "unfused"}, "unfused",
                           "search from one group per tensor (dPRO Alg. 1 start) found the faster plan"))
        cap_groups, cap_mb = _best_cap_start(base, searcher)
        if cap_groups is not None and list(map(list, cap_groups)) not in (initial, base.initial_groups):
            starts.append((cap_groups, {"from": "bucket cap", "bucket_cap_mb": cap_mb}, f"bucket cap {cap_mb:g} MB",
                           f"search from the best single DDP bucket cap ({cap_mb:g} MB of a grid) found the "
                           "faster plan"))
        for groups, args, label, reason in starts:
            left = max(1.0, budget - (time.perf_counter() - t_search0))
            s_alt = Searcher(base, SearchOptions(**{**opts.__dict__, "budget_s": left, "checkpoint": None}))
            r_alt = s_alt.run(initial_strategy(base, groups))
            if r_alt.after_us < result.after_us:
                r_alt.before_us = result.before_us   # "before" stays the traced configuration
                r_alt.changes.insert(0, {"pass": "start", "args": args, "reason": reason,
                                         "predicted_before_ms": result.before_us / 1e3,
                                         "predicted_after_ms": s_alt.evaluate(initial_strategy(base, groups))[0] / 1e3,
                                         "applied_as": "start"})
                result, searcher, start = r_alt, s_alt, label
    info["search_start"] = start
    # fewer collectives when the model cannot tell the difference: merge adjacent groups (reduction order)
    # while the predicted time grows by at most MERGE_TOLERANCE.  Real collectives cost more than the
    # model's per-collective latency (a small one queues behind a large transfer on a busy link), so a
    # tie goes to the plan with fewer of them (measured: docs/optimizer.md, cnn at 100 Mbit/s)
    result = _merge_near_ties(base, searcher, result, deadline=t_search0 + budget)
    # fused-op times: torch.compile timings of the chosen groups replace the model where possible
    result, info["fusion_timing"] = _time_op_fusions(trace, base, searcher, result, fusion_timing,
                                                     deadline=t_search0 + budget, progress=progress)
    gain = result.before_us / result.after_us - 1.0 if result.after_us > 0 else 0.0
    if min_gain > 0 and gain < min_gain / 100.0 and result.strategy.mem() == result.initial.mem() \
            and result.strategy != initial_strategy(base, initial):
        # not worth a change: keep the traced configuration (memory choices forced by a budget stay)
        best = f"{result.after_us / 1e3:.3f} ms ({100 * gain:+.1f} %)"
        kept = initial_strategy(base, initial)
        result.changes = [{"pass": "keep", "args": {"min_gain_pct": min_gain},
                           "reason": f"the best plan found predicts {best}, less than --min-gain {min_gain:g} %: "
                                     "keep the traced configuration",
                           "predicted_before_ms": result.before_us / 1e3, "predicted_after_ms": result.before_us / 1e3,
                           "applied_as": "keep"}]
        result.strategy, result.after_us = kept, result.before_us
        info["kept_traced"] = True
    # gradient-ready times of the final strategy (for Horovod's cycle time)
    _, res, g = searcher.evaluate(result.strategy)
    ready: dict[str, float] = {}
    from .graph.model import op_key
    idx = {k: i for i, k in enumerate(res.graph.keys)}
    ref = base.nodes[0]
    for t, bt in base.tensors.items():
        ops = [idx[op_key(ref, o)] for o in bt.inputs.get(ref, []) if op_key(ref, o) in idx]
        if ops:
            ready[t] = float(max(res.end[i] for i in ops))
    from .optimize.tictac import plan_section
    plan = make_plan(base, result, trace=str(trace), info=info, memory_budget=opts.memory_budget, ready_us=ready,
                     schedule=plan_section(g),
                     options={"seed": seed, "budget_s": budget, "max_steps": max_steps,
                              "base_tensors": info.get("base_tensors", "graph"), "start": start,
                              "durations": info.get("durations", "as in the graph file")})
    atomic_write_text(output, json.dumps(plan, indent=1))
    if as_json:
        click.echo(json.dumps(plan, indent=1))
        return
    p = plan["predicted"]
    click.echo(f"op durations searched on: {plan['search']['durations']}")
    click.echo(f"predicted iteration time: {p['before_ms']:.3f} ms -> {p['after_ms']:.3f} ms "
               f"({p['speedup']:.3f}x), {len(plan['strategies'])} change(s), {result.steps} step(s), "
               f"{result.elapsed_s:.1f} s ({result.stopped})")
    click.echo(f"tensor groups: {len(plan['tensor_groups'])}, op-fusion groups: {len(plan['op_fusion_groups'])}, "
               f"DDP bucket_cap_mb={plan['frameworks']['pytorch_ddp']['bucket_cap_mb']:.6g} "
               f"(exact: {plan['frameworks']['pytorch_ddp']['exact']})")
    ft = plan.get("fusion_timing") or {}
    if ft.get("timed"):
        click.echo(f"op-fusion times: {ft['timed']} group(s) timed with torch.compile (compiled/eager "
                   + ", ".join(f"{g['ratio']:.2f}" for g in ft["groups"] if g.get("ratio") is not None)
                   + f"), {len(ft.get('dropped', []))} dropped as not faster")
    elif ft.get("note") and ft.get("mode") != "model" and plan["op_fusion_groups"]:
        click.echo(f"op-fusion times: {ft['note']}")
    mb, ma = plan["memory"]["estimate_before"], plan["memory"]["estimate_after"]
    if mb.get("model") == "timeline" or plan["memory"]["choices"]:
        click.echo(f"peak memory per worker (estimated, {mb.get('model', 'sum')} model): "
                   f"{mb['peak_bytes'] / 2**20:.2f} MiB -> {ma['peak_bytes'] / 2**20:.2f} MiB"
                   + (f" with {plan['memory']['choices']}" if plan["memory"]["choices"] else ""))
    sch = plan.get("schedule")
    if sch:
        click.echo("transfer order (TicTac): " + ", ".join(f"{o} {v['iteration_ms']:.3f} ms" for o, v in
                                                          sch["predicted"].items())
                   + f"; recommended: {sch['recommended']}")
    click.echo(f"plan written to {output}")


__all__ = ["CAP_GRID_MB", "MERGE_TOLERANCE", "load_base", "optimize"]
