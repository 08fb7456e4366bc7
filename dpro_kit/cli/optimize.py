"""``dpro optimize``: search op fusion / tensor fusion / partition / memory strategies (docs/optimizer.md).

The search is :func:`dpro_kit.optimize.driver.optimize`; this module parses options and prints.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import atomic_write_text
from ..optimize.driver import FUSION_TIMING_MODES
from ._common import make_whatif, open_session, output_options, session_options, whatif_options

EPILOG = """\b
Examples:
  dpro optimize trace -o plan.json
  dpro optimize trace --bandwidth-mbps 200 -o plan-slow.json     optimise for a slower network
  dpro optimize trace --memory-budget 8GB                         trace from `dpro profile --memory`
  dpro optimize trace --memory-budget 8GB --activation-bytes 6GB  activations given
  dpro optimize trace --budget 300 --checkpoint ck.json           resumable: --resume ck.json
  dpro optimize ddp-trace --deft --links 500,500                 also DeFT's delays over two links (docs/deft.md)
  dpro report trace --plan plan.json -o report.html               show the plan with its gain
"""


@click.command(short_help="Search for faster op/tensor fusion, partition and memory strategies.",
               epilog=EPILOG)
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
@whatif_options(bucket_help="What if: start from DDP buckets of this size (MiB).",
                first_bucket_help="Start buckets: size cap of the first bucket (default: the --bucket-mb value).")
@click.option("--no-op-fusion", is_flag=True, help="Search tensor fusion/partition only.")
@click.option("--fusion-timing", type=click.Choice(list(FUSION_TIMING_MODES)), default="auto", show_default=True,
              help="Fused-op times of the plan's op-fusion groups: `compile` rebuilds each group from the op "
                   "shapes of `dpro profile --shapes` and times it with torch.compile (groups that are not "
                   "faster are dropped); `model` uses the cost model; `auto`: compile when shapes were "
                   "recorded and PyTorch is installed.")
@click.option("--no-tensor-fusion", is_flag=True, help="Search op fusion/partition only.")
@click.option("--no-partition", is_flag=True, help="Do not split tensors into partitions.")
@click.option("--pass", "extra_passes", multiple=True, metavar="MODULE:CLASS",
              help="Also offer this user GraphPass (repeatable).")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the search state here after every step (JSON).")
@click.option("--resume", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Continue from a checkpoint written by --checkpoint.")
@click.option("--deft", "deft", is_flag=True,
              help="Also write DeFT's schedule (DDP): per bucket a delay of one iteration or none and its link, "
                   "as the replayer predicts it (plan['deft']; applied by dpro_torch.plan.apply_plan(model, plan, "
                   "mode='deft') or train.py --plan P --plan-mode deft). The loss is not "
                   "checked: run the Preserver's loop before training with delays (docs/deft.md).")
@click.option("--links", default=None, metavar="R0[,R1...]",
              help="With --deft: link rates in Mbit/s, one per link per host (default: one link as traced).")
@click.option("--min-gain", default=5.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Recommend a change only if it is predicted to save at least this many percent of the "
                   "iteration time; else the plan keeps the traced configuration (predictions of another "
                   "configuration are good to a few percent, and every extra collective costs something real).")
@session_options(per_iteration_help="Search on the op durations of the median profiled iteration (what `dpro "
                                    "replay` replays), or on every op's mean duration.  Default: as `dpro replay`.")
@output_options("Print the plan as JSON on stdout.")
def optimize(trace: Path, output: Path, budget: float, max_steps: int, seed: int, memory_budget: str | None,
             activation_bytes: str | None, optimizer_slots: float | None, bandwidth_mbps: float | None, world_size: int | None,
             bucket_mb: float | None, first_bucket_mb: float | None, no_op_fusion: bool, no_tensor_fusion: bool,
             no_partition: bool, fusion_timing: str, extra_passes: tuple[str, ...], checkpoint: Path | None, resume: Path | None,
             min_gain: float, deft: bool, links: str | None, no_align: bool, per_iteration: bool | None,
             as_json: bool, quiet: bool) -> None:
    """Find a faster strategy for the job in TRACE (dPRO Alg. 1) and write plan.json.

    The search starts from the job `dpro replay` replays (same alignment,
    what-if and durations), so the plan's "before" is `dpro replay`'s
    prediction.  Logic: dpro_kit.optimize.driver.optimize; docs/optimizer.md.
    """
    from ..optimize.driver import OptimizeOptions
    from ..optimize.driver import optimize as run_optimize
    from ..optimize.memory import parse_size
    from ..optimize.passes import load_entry_point_passes, load_pass
    from ..optimize.search import terminal_progress

    from .replay import _link_rates
    rates = _link_rates(links, deft, bandwidth_mbps)
    if rates and links:
        bandwidth_mbps = rates[0]
    progress = terminal_progress(not (quiet or as_json))
    load_entry_point_passes()
    extra = [load_pass(p) for p in extra_passes]
    session = open_session(trace, no_align=no_align, per_iteration=per_iteration,
                           whatif=make_whatif(bucket_mb, first_bucket_mb, bandwidth_mbps, world_size))
    opts = OptimizeOptions(budget_s=budget, max_steps=max_steps, seed=seed, memory_budget=parse_size(memory_budget),
                           activation_bytes=parse_size(activation_bytes) or 0, optimizer_slots=optimizer_slots,
                           op_fusion=not no_op_fusion, tensor_fusion=not no_tensor_fusion,
                           tensor_partition=not no_partition, fusion_timing=fusion_timing, extra_passes=extra,
                           checkpoint=checkpoint, resume=resume, min_gain_pct=min_gain, progress=progress,
                           warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    done = run_optimize(session, opts)
    plan, result = done.plan, done.result
    if deft:
        from ..errors import DproError
        from ..optimize.deft import solver_plan
        try:
            # the op-median graph, as dpro replay --deft (docs/deft.md §7, "Which graph")
            plan["deft"] = solver_plan(session.op_median_graph, rates or [1.0], ddp=session.job.facts.ddp or {})
        except ValueError as e:
            raise DproError(f"--deft: {e}", path=trace) from None
    atomic_write_text(output, json.dumps(plan, indent=1))
    if as_json:
        click.echo(json.dumps(plan, indent=1))
        return
    p = plan["predicted"]
    click.echo(f"op durations searched on: {plan['search']['durations']}")
    click.echo(f"predicted iteration time: {p['before_ms']:.3f} ms -> {p['after_ms']:.3f} ms "
               f"({p['speedup']:.3f}x), {len(plan['strategies'])} change(s), {result.steps} step(s), "
               f"{result.elapsed_s:.1f} s ({result.stopped})")
    knob = any(plan["frameworks"][fw].get("export") for fw in ("horovod", "byteps"))
    click.echo(f"tensor groups: {len(plan['tensor_groups'])}, op-fusion groups: {len(plan['op_fusion_groups'])}"
               + ("" if knob else f", DDP bucket_cap_mb={plan['frameworks']['pytorch_ddp']['bucket_cap_mb']:.6g} "
                                  f"(exact: {plan['frameworks']['pytorch_ddp']['exact']})"))
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
    for fw, label in (("horovod", "Horovod"), ("byteps", "BytePS")):
        sec = plan["frameworks"][fw]
        if sec.get("export"):     # a knob pass's plan (dpro_kit.optimize.knobs)
            click.echo(f"{label}: " + ("keep the traced settings; " if sec.get("keep_traced") else "")
                       + "; ".join(sec["export"]) + f" ({sec['search']['evaluations']} settings replayed)")
    d = plan.get("deft")
    if d:
        pr = d["predicted"]
        click.echo(f"DeFT over {len(d['rates_mbit'])} link(s) {d['rates_mbit']}: delays {d['delays']}, links "
                   f"{d['links']}; predicted {pr['iteration_ms']:.3f} ms vs synchronous DDP {pr['synchronous_ms']:.3f} ms"
                   + (f" (x{pr['speedup']:.2f})" if pr.get("speedup") else "")
                   + (f"; train.py {' '.join(d['run'])}" if d["run"] else ""))
        click.echo("  for DDP's buckets as profiled, instead of (not with) the tensor groups above: "
                   f"train.py --plan {output} --plan-mode deft, or dpro_torch.plan.apply_plan(model, plan, mode='deft')")
        if any(d["delays"].values()):
            click.echo("  the loss is not checked: run the Preserver's loop before training with these delays "
                       "(bench/deft_ab.py --preserver-loop LR, docs/deft.md)")
    click.echo(f"plan written to {output}")


__all__ = ["optimize"]
