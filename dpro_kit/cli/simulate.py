"""``dpro simulate``: predict data / sharded / tensor / pipeline parallel strategies from one profile (Proteus)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import DproError
from ._common import Progress, echo_json, open_session, output_options

EPILOG = """\b
Examples:
  dpro profile --shapes -o one -- python examples/ddp/train.py --nproc 1 --model transformer
  dpro simulate one --strategy fsdp.yaml                  time, breakdown, memory per rank
  dpro simulate one --strategy ddp.yaml --compare fsdp.yaml --compare pp.yaml --memory-limit 8GiB
  dpro simulate one --strategy pp.yaml --bandwidth-mbps 200 --json
  dpro simulate one --strategy pp.yaml --timeline pp.json   the replayed schedule, for ui.perfetto.dev
  dpro simulate one --profile-at-batch half --profile-at-batch quarter --strategy pp.yaml
                           op times measured at the ranks' batch (same script, --batch-size /2, /4)

\b
A strategy file (YAML or JSON; docs/simulate.md):
  name: fsdp-2x1
  ranks: 2                 # world size = dp degree x tp degree x stages
  hosts: 2                 # ranks spread evenly over the hosts
  bandwidth_mbps: 1000     # link between hosts (optional)
  strategy:
    data_parallel: {degree: 2, sharding: fsdp}     # none | zero1 | zero2 | zero3 | fsdp
    tensor_parallel: {degree: 1}                   # Megatron column/row Linear pairs
    pipeline: {stages: 1, micro_batches: 1, schedule: gpipe}   # or 1f1b; max_in_flight
    recompute: false
    children:              # per subtree, by module-name prefix (the profile's layers)
      - {module: "blocks.layers.0", recompute: true}

\b
Output: the predicted iteration time; its breakdown per rank (compute, exposed
communication, bubble = waiting on other ranks / pipeline fill and drain), which
add up to the time; memory per rank: each part at its largest (parameters, gradients,
optimizer state, buffers, gathered parameters, activations, transient, runtime) and the peak of
the replayed memory timeline (which also holds the collectives' buffers while they run), which the
OOM verdict compares with the limit.  --profiled-peak: the profiled process's measured peak; the
part of it the model does not explain is added to every device.
With --compare, the strategies ranked: those that fit first, fastest first.

\b
Op times and the batch: PROFILE's batch is the job's global batch; a rank runs its ops on
1/(dp x micro_batches) of it.  With one profile, op times are scaled linearly (an
assumption: on CPUs small batches cost more per sample).  --profile-at-batch adds profiles of
the same script at other batch sizes (found from the input shapes); each op's time is then
interpolated between the measured batch sizes (docs/simulate.md).
"""


@click.command(short_help="Predict parallelization strategies (DP, ZeRO/FSDP, TP, PP) from one profile.",
               epilog=EPILOG)
@click.argument("profile", type=click.Path(path_type=Path))
@click.option("--strategy", "-s", "strategy_path", required=True, type=click.Path(path_type=Path),
              help="Strategy file (YAML or JSON) to predict.")
@click.option("--compare", "compare", multiple=True, type=click.Path(path_type=Path),
              help="Another strategy file to predict and rank against --strategy (repeatable).")
@click.option("--profile-at-batch", "at_batch", multiple=True, type=click.Path(path_type=Path), metavar="PROFILE2",
              help="A profile of the same script at another --batch-size (repeatable): op times are interpolated "
                   "between the profiled batch sizes instead of scaled linearly (docs/simulate.md).")
@click.option("--memory-limit", default=None, metavar="SIZE",
              help="Memory per device (8GiB, 512MB, bytes): each strategy gets an OOM verdict. "
                   "Overrides the files' memory_limit.")
@click.option("--profiled-peak", default=None, metavar="SIZE",
              help="The profiled process's measured peak memory (e.g. examples/strategies/train.py --ranks 1 "
                   "--memory: peak_bytes): what the model has no part for in it (framework buffers, Python objects, "
                   "autograd temporaries) is added to every device as 'runtime' (docs/simulate.md \"Memory\").")
@click.option("--bandwidth-mbps", type=float, default=None,
              help="Link rate between hosts (Mbit/s) for every strategy, overriding the files' bandwidth_mbps. "
                   "Default: the file's, else the profile's link model (10 Gbit/s for a one-process profile).")
@click.option("--device-model", type=click.Choice(["auto", "fifo", "shared"]), default="auto", show_default=True,
              help="Replay kernel: fifo (a link serves one transfer at a time), shared (concurrent transfers share "
                   "the hosts' egress/ingress bandwidth, Proteus' executor; docs/replayer.md); auto: shared if "
                   "the replayer has it.")
@click.option("--overlap-factor", type=click.FloatRange(0.0), default=0.0, show_default=True,
              help="Proteus' gamma: computation runs (1+gamma) x slower while a transfer of its host is in flight "
                   "(shared device model only).")
@click.option("--runtime-overhead", "runtime_overhead", multiple=True, metavar="NAME=MS",
              help="The strategy NAME's runtime CPU time per rank and iteration besides the model's ops (DTensor "
                   "dispatch, FSDP2's copies, the pipelining schedule), measured (bench/simulate_accuracy.py "
                   "--calibrate); overrides the file's runtime_overhead_ms (repeatable; docs/simulate.md).")
@click.option("--runtime-memory", "runtime_memory", multiple=True, metavar="NAME=SIZE",
              help="The strategy NAME's runtime memory per rank besides the model's parts (DTensor's and FSDP2's "
                   "state, the pipelining runtime's buffers), measured (bench/simulate_accuracy.py "
                   "--calibrate-memory); overrides the file's runtime_memory (repeatable; docs/simulate.md).")
@click.option("--link-burst", default=None, metavar="SIZE",
              help="Token-bucket depth of the links between hosts, each direction (a traffic shaper's burst, e.g. "
                   "the emulated cluster's tbf: 64KiB at 200 Mbit/s; a cloud NIC's): a transfer after a pause "
                   "leaves at the wire's speed for that many bytes (shared device model; docs/simulate.md).")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the --strategy's replayed iteration (every rank's ops, transfers, memory counters) as "
                   "Chrome/Perfetto trace JSON (open in https://ui.perfetto.dev).")
@output_options("Print one JSON object: the model, every strategy's prediction, the ranking.")
def simulate(profile: Path, strategy_path: Path, compare: tuple[Path, ...], at_batch: tuple[Path, ...],
             memory_limit: str | None, profiled_peak: str | None,
             bandwidth_mbps: float | None, device_model: str, overlap_factor: float,
             runtime_overhead: tuple[str, ...], runtime_memory: tuple[str, ...], link_burst: str | None,
             timeline: Path | None,
             as_json: bool, quiet: bool) -> None:
    """Predict how a training job would run under other parallelization strategies.

    PROFILE is a `dpro profile --shapes` trace of the training script run with one
    process (under DDP, so parameters and their gradient-ready ops are recorded). Its
    layers, measured forward/backward times, parameter and activation sizes, plus each
    strategy tree, are compiled into a distributed execution graph with the inferred
    collectives (DP all-reduce buckets, ZeRO/FSDP all-gather and reduce-scatter, TP
    all-reduces, pipeline send/recv) and replayed (docs/simulate.md).
    """
    from ..simulate.model import fit_batches, from_profile
    from ..simulate.predict import predict, rank_strategies
    from ..simulate.strategy import load_strategy, parse_memory

    if bandwidth_mbps is not None and not bandwidth_mbps > 0:
        raise DproError(f"--bandwidth-mbps must be > 0, got {bandwidth_mbps}")
    limit = parse_memory(memory_limit, record="--memory-limit") if memory_limit is not None else None
    measured = parse_memory(profiled_peak, record="--profiled-peak") if profiled_peak is not None else None
    strategies = [load_strategy(p) for p in (strategy_path, *compare)]   # all files checked before any work
    names = [s.name for s in strategies]

    def per_strategy(items: tuple[str, ...], option: str, unit: str, parse: Any) -> dict[str, Any]:
        """``NAME=VALUE`` options (repeatable) -> {strategy name: parsed value}; one-line errors."""
        out = {}
        for item in items:
            nm, eq, val = item.rpartition("=")
            if not (eq and nm):
                raise DproError(f"{option} {item!r}: expected NAME={unit}")
            if nm not in names:
                raise DproError(f"{option} {item!r}: no strategy named {nm!r}", hint="names: " + ", ".join(names))
            out[nm] = parse(item, val)
        return out

    def overhead_ms(item: str, val: str) -> float:
        try:
            ms = float(val)
        except ValueError:
            ms = float("nan")
        if not ms >= 0 or ms == float("inf"):
            raise DproError(f"--runtime-overhead {item!r}: expected NAME=MS with MS a number >= 0")
        return ms

    overheads = per_strategy(runtime_overhead, "--runtime-overhead", "MS with MS a number >= 0", overhead_ms)
    rmems = per_strategy(runtime_memory, "--runtime-memory", "SIZE (e.g. tp-2=2MiB, or 0)",
                         lambda item, val: parse_memory(val, record="--runtime-memory", zero=True))
    burst = parse_memory(link_burst, record="--link-burst") if link_burst is not None else None
    from ..simulate.predict import pick_device_model
    dm = pick_device_model() if device_model == "auto" else device_model
    if burst and dm != "shared":
        raise DproError("--link-burst needs the shared device model", hint="drop --device-model fifo")
    if dm == "shared" and pick_device_model() != "shared":
        raise DproError("the replayer has no 'shared' device model", hint="use --device-model fifo")
    if overlap_factor and dm != "shared":
        raise DproError("--overlap-factor needs the shared device model", hint="add --device-model shared")
    session = open_session(profile, no_align=True, progress=Progress(not (quiet or as_json)))
    model = from_profile(profile, session=session)
    if at_batch:
        fit_batches(model, [from_profile(p, allocator=False) for p in at_batch])
    if measured is not None:
        from ..simulate.predict import with_measured_peak
        model = with_measured_peak(model, measured)
    cm = session.comm_model
    default_bw = cm.default.bandwidth_Bps if cm is not None and cm.origin != "default" else None
    preds = [predict(model, s, bandwidth_mbps=bandwidth_mbps, default_bandwidth_Bps=default_bw, memory_limit=limit,
                     device_model=dm, overlap_factor=overlap_factor, runtime_overhead_ms=overheads.get(s.name),
                     runtime_memory=rmems.get(s.name), link_burst=burst)
             for s in strategies]
    ranked = rank_strategies(preds)
    if timeline is not None:
        from ..timeline import replay_to_chrome, write_chrome
        p0 = preds[0]
        write_chrome(replay_to_chrome(p0.result, p0.compiled.graph, label=f"dpro simulate {p0.strategy.name}",
                                      memory=p0.memory), timeline)
    if as_json:
        main = preds[0].to_json()
        echo_json({"profile": str(profile),
                   # the --strategy's prediction at the top level (scripts predicting one strategy)
                   "name": main["name"], "iteration_ms": main["iteration_ms"],
                   "peak_memory_bytes": main["peak_memory_bytes"], "memory_limit_bytes": main["memory_limit_bytes"],
                   "oom": main["oom"], "breakdown_ms": main["breakdown_ms"],
                   "model": model.describe(), "strategies": [p.to_json() for p in preds],
                   "ranking": [p.strategy.name for p in ranked]})
        return
    lay = model.layers
    click.echo(f"model: {len(lay)} layers, {model.param_bytes / 2**20:.2f} MiB parameters, "
               f"fwd {sum(x.fwd_us for x in lay) / 1e3:.2f} ms + bwd {sum(x.bwd_us for x in lay) / 1e3:.2f} ms "
               f"+ step {model.update_us / 1e3:.2f} ms per iteration on one process ({profile})")
    if model.batch_scaling == "fitted":
        click.echo("op times at batch fractions " + ", ".join(
            f"{x:g}: fwd {sum(ly.fwd_time(x) for ly in lay) / 1e3:.2f} + bwd {sum(ly.bwd_time(x) for ly in lay) / 1e3:.2f} ms"
            for x in model.batch_fractions) + " (measured; interpolated between them)")
    else:
        click.echo("op times: linear in the batch (one profile: an assumption; --profile-at-batch measures them)")
    for p in preds:
        _print_prediction(p)
    if len(preds) > 1:
        click.echo("")
        click.echo("ranking (fits in memory first, then fastest):")
        best = ranked[0].iteration_ms
        for i, p in enumerate(ranked, 1):
            oom = " OOM" if p.oom else ""
            click.echo(f"  {i}. {p.strategy.name:<24} {p.iteration_ms:9.2f} ms  x{p.iteration_ms / best:5.2f}"
                       f"  peak {p.peak_memory_bytes / 2**20:9.1f} MiB{oom}")


def _print_prediction(p) -> None:
    s = p.strategy
    d = s.describe()
    click.echo("")
    click.echo(f"{s.name}: {s.ranks} ranks on {s.hosts} host(s), dp {s.dp} ({d['sharding']}), tp {s.tp}, "
               f"pp {s.stages} x {s.micro_batches} micro-batches ({s.schedule})"
               + (", recompute" if d["recompute"] else "")
               + (f", {len(d['children'])} subtree override(s)" if d["children"] else ""))
    b = p.breakdown_ms
    click.echo(f"  predicted iteration: {p.iteration_ms:.2f} ms   (mean per rank: compute {b['compute']:.2f}, "
               f"exposed comm {b['exposed_comm']:.2f}, bubble {b['bubble']:.2f} ms)")
    lk = p.links
    click.echo(f"  links: {lk['inter_host_mbps']:g} Mbit/s between hosts ({lk['source']}; goodput "
               f"{lk['goodput_mbps']:.4g}), "
               f"{lk['intra_host_mbps']:g} within a host, {lk['latency_us']:g} us latency; replay: {p.device_model}"
               + (f", overlap factor {p.overlap_factor:g}" if p.overlap_factor else ""))
    if p.collectives:
        click.echo("  collectives: " + ", ".join(f"{k} x{v['count']} ({v['bytes'] / 2**20:.2f} MiB)"
                                                 for k, v in sorted(p.collectives.items())))
    limit = p.memory_limit_bytes
    verdict = "" if limit is None else (f"  -> OOM (limit {limit / 2**20:.1f} MiB)" if p.oom
                                        else f"  -> fits (limit {limit / 2**20:.1f} MiB)")
    click.echo(f"  peak memory: {p.peak_memory_bytes / 2**20:.2f} MiB (largest rank, replayed timeline){verdict}")
    click.echo("  rank stage  compute  exp.comm   bubble |  params   grads   optim  buffers gathered    acts   trans"
               " runtime     sum | peak (MiB) at ms")
    for r in p.per_rank:
        m = r["memory"]
        mib = [m.get(k, 0) / 2**20 for k in ("params", "grads", "optimizer", "comm_buffers", "gathered_params",
                                              "activations", "transient", "runtime", "parts_sum")]
        click.echo(f"  {r['rank']:>4} {r['stage']:>5} {r['compute_ms']:8.2f} {r['exposed_comm_ms']:9.2f} "
                   f"{r['bubble_ms']:8.2f} | " + " ".join(f"{v:7.2f}" for v in mib)
                   + f" | {m['peak'] / 2**20:10.2f} {m['peak_ms']:6.2f}")
    for n in p.notes:
        click.echo(f"  note: {n}")


__all__ = ["simulate"]
