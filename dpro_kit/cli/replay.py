"""``dpro replay``: predict the iteration time of a trace (or graph file) and show its critical path."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import DproError
from ._common import (Progress, echo_json, horovod_options, make_whatif, open_session, output_options,
                      session_options, straggler_options, whatif_options)

EPILOG = """\b
Examples:
  dpro replay trace                          predicted vs measured, per-node breakdown
  dpro replay trace --json > base.json       a baseline for `dpro check`
  dpro replay trace -n 3 --timeline t.json   3 iterations; open t.json in ui.perfetto.dev
  dpro replay trace --bucket-mb 1            what if: smaller DDP buckets
  dpro replay trace --bandwidth-mbps 200     what if: slower network
  dpro replay trace --world-size 8           what if: more workers
  dpro replay hvd-trace --fusion-threshold-mb 1 --cycle-time-ms 5   Horovod's knobs (docs/horovod.md)
  dpro replay ps-trace --schedule tac        TicTac's transfer order (docs/tictac.md)
  dpro replay trace --device-model shared --overlap-factor 0.1   Proteus' executor (docs/replayer.md)
  dpro replay mem-trace --memory-limit 2GiB  peak memory per worker over the replay, OOM verdict
  dpro replay ddp-trace --deft --links 1000,300   DeFT's delayed-update schedule on two links (docs/deft.md)
  dpro replay dfg.json                       a graph file written by `dpro graph`
  dpro replay big-trace --fast               1,000+ ranks: the iteration time only, from the event tables (docs/scale.md)
"""


def _overlap_arg(ctx: click.Context, param: click.Parameter, value: str) -> "float | str":
    if str(value).strip().lower() == "fit":
        return "fit"
    try:
        g = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a number >= 0 (e.g. 0.1) or 'fit'") from None
    if not g >= 0 or g == float("inf"):
        raise click.BadParameter(f"{value!r}: the overlap factor must be a finite number >= 0")
    return g


@click.command(short_help="Predict the iteration time and show the critical path.", epilog=EPILOG)
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--iterations", "-n", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Replay this many iterations back to back; the iteration time is the steady-state gap.")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the simulated timeline as Chrome/Perfetto trace JSON to this file.")
@click.option("--measured-timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the measured (aligned, when alignment applies) trace as Chrome/Perfetto JSON.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(0, 10000),
              help="How many of the longest critical-path ops to list.")
@whatif_options()
@horovod_options()
@straggler_options()
@click.option("--servers", type=click.IntRange(1), default=None,
              help="What if (parameter server): this many servers, tensors re-partitioned as the job's "
                   "kvstore does (docs/ps.md).")
@click.option("--partition-bytes", type=click.IntRange(1), default=None,
              help="What if (BytePS): BYTEPS_PARTITION_BYTES of this many bytes, tensors re-partitioned and "
                   "placed as BytePS does (docs/byteps.md).")
@session_options()
@click.option("--schedule", default="graph", show_default=True,
              type=click.Choice(["graph", "fifo", "tic", "tac", "random"]),
              help="Order of the transfers on each link / server: as the graph says (traced: FIFO), or "
                   "TicTac's TIC / TAC order of a parameter-server job's transfers, or a random one "
                   "(docs/tictac.md).")
@click.option("--device-model", default="fifo", show_default=True, type=click.Choice(["fifo", "shared"]),
              help="What a link does with concurrent transfers: fifo = they queue, one at a time; shared = "
                   "they share the bandwidth of the sender's egress and the receiver's ingress (max-min fair, "
                   "recomputed at every transfer start and end; Proteus, docs/replayer.md).")
@click.option("--overlap-factor", default="0", show_default=True, metavar="GAMMA|fit", callback=_overlap_arg,
              help="Proteus' gamma: computation running while a transfer of its host is in flight runs "
                   "1+gamma times slower; 'fit' estimates it from this trace (same op with vs without "
                   "communication in flight; docs/replayer.md \"Overlap factor\").")
@click.option("--memory", "show_memory", is_flag=True,
              help="Memory of every worker over the replayed iteration(s): peak and when (from the trace's "
                   "allocator samples, `dpro profile --memory`, or the graph's mem_alloc/mem_free); with "
                   "--timeline also a memory counter per worker.")
@click.option("--memory-limit", default=None, metavar="SIZE",
              help="Implies --memory: the OOM verdict of every worker against this limit (e.g. 16GiB, 512MB, "
                   "1e9 bytes).")
@click.option("--stragglers", is_flag=True,
              help="Rank the workers by what they cost the job: the iteration time saved if each computed like "
                   "the median worker (one more replay per rank), and how late it enters collectives "
                   "(docs/stragglers.md).")
@click.option("--deft", "deft", is_flag=True,
              help="What if (DDP): DeFT's knapsack schedule with delayed updates; prints the schedule and its "
                   "replayed steady iteration time vs synchronous DDP (docs/deft.md).")
@click.option("--defer", "defer_buckets", default=None, metavar="BUCKET[,BUCKET...]",
              help="With --deft: also replay only these buckets (bucket<k>) one iteration late, the others "
                   "synchronous, on link 0 and over the --links (train.py --deft-defer K,..).")
@click.option("--links", default=None, metavar="R0[,R1...]",
              help="With --deft: link rates in Mbit/s, one per link per host (link 0 also sets "
                   "--bandwidth-mbps); default: one link as traced.")
@click.option("--fast", is_flag=True,
              help="Jobs of many ranks: the predicted iteration time only, replayed from arrays built straight "
                   "from the event tables (no networkx graph; op durations: the mean over the profiled "
                   "iterations); no breakdown, critical path, timeline or what-if (docs/scale.md).")
@output_options()
def replay(trace: Path, iterations: int, timeline: Path | None, measured_timeline: Path | None, top: int,
           bucket_mb: float | None, first_bucket_mb: float | None, bandwidth_mbps: float | None,
           world_size: int | None, fusion_threshold_mb: float | None, cycle_time_ms: float | None,
           slow_rank: dict[int, float], like_median: tuple[int, ...], slow_link: dict[str, float],
           slow_host: dict[str, float], cpu_share: dict[str, float], host_busy: dict[str, float], wire_mbps: float | None, cpu_limit: dict[str, float], cpu_period_ms: float, recorded_quota: bool,
           servers: int | None, partition_bytes: int | None, stragglers: bool, no_align: bool, per_iteration: bool | None, schedule: str, device_model: str, overlap_factor: float | str, show_memory: bool, memory_limit: str | None,
           deft: bool, defer_buckets: str | None, links: str | None, fast: bool, as_json: bool,
           quiet: bool) -> None:
    """Predict the iteration time of a job by replaying its global DFG.

    TRACE is a trace directory (with manifest.json) or a graph file written by
    `dpro graph`.  Prints the predicted iteration time, the computation /
    communication / overlap / idle time of every node, and the longest ops on
    the critical path.  The what-if options predict a configuration you did
    not profile.
    """
    from ..analysis import breakdown, critical_path_summary
    from ..optimize.tictac import scheduling_efficiency
    from ..timeline import replay_to_chrome, trace_to_chrome, write_chrome

    progress = Progress(not (quiet or as_json))
    rates = _link_rates(links, deft, bandwidth_mbps)
    if defer_buckets is not None and not deft:
        raise click.UsageError("--defer needs --deft")
    defer = [b.strip() for b in (defer_buckets or "").split(",") if b.strip()]
    if rates and links:
        bandwidth_mbps = rates[0]
    wi = make_whatif(bucket_mb, first_bucket_mb, bandwidth_mbps, world_size, fusion_threshold_mb, cycle_time_ms)
    wi.servers = servers
    wi.partition_bytes = partition_bytes
    wi.slow_rank, wi.like_median, wi.slow_link = dict(slow_rank), list(like_median), dict(slow_link)
    wi.slow_host, wi.cpu_share, wi.host_busy = dict(slow_host), dict(cpu_share), dict(host_busy)
    wi.wire_mbps = wire_mbps
    wi.cpu_limit, wi.cpu_period_ms, wi.recorded_quota = dict(cpu_limit), cpu_period_ms, recorded_quota
    if fast:
        others = [o for o, on in (("what-if options", wi.any()), ("--timeline", timeline is not None),
                                  ("--measured-timeline", measured_timeline is not None), ("--stragglers", stragglers),
                                  ("--deft", deft), ("--memory/--memory-limit", show_memory or memory_limit is not None),
                                  ("--schedule", schedule != "graph"), ("--device-model", device_model != "fifo"),
                                  ("--overlap-factor", overlap_factor != 0), ("--per-iteration", bool(per_iteration)))
                  if on]
        if others:
            raise click.UsageError(f"--fast gives the iteration time only: not with {', '.join(others)}")
        _fast(trace, open_session(trace, no_align=no_align, per_iteration=False, progress=progress), iterations,
              as_json)
        return
    session = open_session(trace, no_align=no_align, per_iteration=per_iteration, whatif=wi, progress=progress)
    g, info, ts = session.graph, session.info, session.profiled
    if deft:
        from ..optimize.deft import predict
        progress.note("solving the DeFT schedule and replaying it")
        try:
            # the op-median graph: a schedule with a second link exposes computation the stock job hides,
            # and one profiled iteration's spike with it (docs/deft.md §7, "Which graph")
            out_d = {"trace": str(trace), **info, "deft": predict(session.op_median_graph, rates or [1.0],
                                                                  iterations=max(iterations, 48), defer=defer)}
        except ValueError as e:
            raise DproError(f"--deft: {e}", path=trace) from None
        if as_json:
            echo_json(out_d)
        else:
            print_deft(out_d["deft"])
        return
    if measured_timeline is not None and ts is None:
        raise DproError("--measured-timeline needs a trace directory, not a graph file", path=trace)
    progress.note(f"replaying {g.number_of_nodes()} ops x {iterations} iteration(s)")
    res = session.replay(iterations, schedule=schedule, device_model=device_model, overlap_factor=overlap_factor)
    bd = breakdown(res, g)
    cp = critical_path_summary(res, g, top=top)
    mem = None
    if show_memory or memory_limit is not None:
        from ..optimize.memory import parse_size
        try:
            limit = parse_size(memory_limit)
        except ValueError:
            raise click.BadParameter(f"{memory_limit!r}: give a size such as 16GiB, 512MB or 1e9",
                                     param_hint="--memory-limit") from None
        mem = session.memory(res, limit)
    if timeline is not None:
        write_chrome(replay_to_chrome(res, g, memory=mem), timeline)
    if measured_timeline is not None:
        # the TraceSet is already aligned when alignment applied, so no offsets are passed again
        write_chrome(trace_to_chrome(ts, critical_ops=cp["ops"], label="measured"), measured_timeline)
    it_ms = res.iteration_time_us / 1e3
    out: dict[str, Any] = {
        "trace": str(trace), **info, "iterations_replayed": iterations, "iteration_time_ms": it_ms,
        "makespan_ms": res.makespan_us / 1e3, "ops": g.number_of_nodes(), "edges": g.number_of_edges(),
        "critical_path": cp["ops"], "critical_path_ms_by_kind": cp["by_kind_ms"], "critical_path_top": cp["top"],
        "nodes": {r.node: {k: getattr(r, k) for k in ("compute_ms", "comm_ms", "overlap_ms", "idle_ms")}
                  for r in bd.itertuples()},
        "device_utilisation": res.utilisation(), "comm_model": g.graph.get("meta", {}).get("comm_model"),
        "schedule": schedule, "scheduling": scheduling_efficiency(res, g),
        "device_model": device_model,
        "overlap_factor": (session.overlap_fit().gamma or 0.0) if overlap_factor == "fit" else overlap_factor,
    }
    if mem is not None:
        out["memory"] = mem.to_dict()
    if overlap_factor == "fit":
        out["overlap_fit"] = session.overlap_fit().to_dict()
    if "measured_iteration_ms" in info:
        out["error_pct"] = 100.0 * (it_ms - info["measured_iteration_ms"]) / info["measured_iteration_ms"]
    if ts is not None:
        from ..placement import placement_warnings, world_size_warnings
        # one line each about what the input is and cannot tell (e.g. plain torch.profiler folders)
        out["notes"] = [str(x) for x in (ts.manifest.extra.get("notes") or [])]
        out["warnings"] = ts.manifest.facts.warnings + placement_warnings(ts.manifest.extra)
        if world_size is not None:
            out["warnings"] += world_size_warnings(ts.manifest.extra, world_size)
        if info.get("cpu_limit"):
            from ..whatif import cpu_limit_warnings
            out["warnings"] += cpu_limit_warnings(info["cpu_limit"])
    if stragglers:
        from ..stragglers import attribute
        progress.note("replaying once more per rank (straggler attribution)")
        out["stragglers"] = attribute(session)
    if timeline is not None:
        out["timeline"] = str(timeline)
    if measured_timeline is not None:
        out["measured_timeline"] = str(measured_timeline)
    if as_json:
        echo_json(out)
        return
    print_replay(out, bd, cp)


def _fast(trace: Path, session: Any, iterations: int, as_json: bool) -> None:
    """``dpro replay --fast``: :meth:`dpro_kit.session.Session.fast_replay`, printed."""
    if session.profiled is None:
        raise DproError("--fast needs a trace directory, not a graph file", path=trace)
    m = session.profiled.manifest
    out: dict[str, Any] = {"trace": str(trace), "job": m.job, "framework": m.framework,
                           "comm_backend": m.comm_backend, "world_size": m.world_size,
                           "profiled_iterations": m.iterations, "durations": "mean", "fast": True,
                           **session.fast_replay(iterations), "warnings": list(m.facts.warnings)}
    path, cpu_s, measured = out["compiled_by"], out["compile_and_replay_cpu_s"], out.get("measured_iteration_ms")
    if as_json:
        echo_json(out)
        return
    echo = click.echo
    echo(f"job {m.job}: {m.framework} + {m.comm_backend}, {m.world_size} worker(s)")
    echo(f"replayed {out['ops']:,} ops x {iterations} iteration(s) from "
         + ("arrays built from the event tables" if path == "arrays" else "the networkx graph (the arrays do not "
            "cover this job's collectives)")
         + f", mean op durations; compile + replay {cpu_s:.2f} s CPU")
    line = f"predicted iteration time: {out['iteration_time_ms']:.3f} ms"
    if measured is not None:
        line += f"   (measured {measured:.3f} ms, error {out['error_pct']:+.1f} %)"
    echo(line)
    for w in out["warnings"]:
        echo(f"warning: {w}", err=True)


def _link_rates(links: str | None, deft: bool, bandwidth_mbps: float | None) -> list[float]:
    """``--links`` as rates (Mbit/s); refuses it without ``--deft`` or against another ``--bandwidth-mbps``."""
    if links is None:
        return []
    if not deft:
        raise click.UsageError("--links needs --deft")
    try:
        rates = [float(x) for x in links.split(",") if x.strip()]
    except ValueError:
        raise click.UsageError(f"--links {links!r}: give link rates in Mbit/s, e.g. 1000,300") from None
    if not rates or any(not (r > 0) for r in rates):
        raise click.UsageError(f"--links {links!r}: every rate must be > 0 Mbit/s, e.g. 1000,300")
    if bandwidth_mbps is not None and bandwidth_mbps != rates[0]:
        raise click.UsageError("--links sets link 0's rate; do not also give a different --bandwidth-mbps")
    return rates


def print_deft(d: dict[str, Any]) -> None:
    """The text form of ``dpro replay --deft`` (the ``deft`` object of its ``--json``)."""
    echo = click.echo
    echo(f"DeFT (seed 002) on {len(d['rates'])} link(s) {d['rates']}: coverage rate {d['coverage_rate']:.2f} "
         f"(forward {d['forward_ms']:.3f} ms, backward {d['backward_ms']:.3f} ms)")
    for b in d["buckets"]:
        echo(f"  {b['name']}: backward {b['backward_ms']:.3f} ms, communication {b['comm_ms']:.3f} ms")
    echo(f"schedule: {d['parts']} part(s), period {d['period']} iteration(s), "
         f"{d['update_frequency']:.3f} updates per iteration, batch sequence {d['batch_sequence']}")
    for s in d["steady_steps"]:
        fw = ", ".join(f"{n}{it}@{j}" for n, it, j in s["forward"]) or "-"
        bw = ", ".join(f"{n}{it}@{j}" for n, it, j in s["backward"]) or "-"
        echo(f"  it {s['iteration']}: forward (case {s['forward_case']}) {fw} | backward (case "
             f"{s['backward_case']}) {bw} | update {s['updates'] or '-'}")
    sy, late, de = d["synchronous"], d["delay_one"], d["deft"]
    echo(f"steady iteration (replayed): synchronous DDP {sy['iteration_ms']:.3f} ms, every bucket delayed one "
         f"iteration {late['iteration_ms']:.3f} ms, DeFT {de['iteration_ms']:.3f} ms "
         f"(x{d['speedup']:.2f}; lower bound {de['lower_bound_ms']:.3f} ms, {de['busiest_device']})")
    if "delay_one_links" in d:
        dl = d["delay_one_links"]
        on = ", ".join(f"{n}@{j}" for n, j in sorted(dl["assignment"].items()))
        echo(f"every bucket delayed one iteration over the links ({on}): {dl['iteration_ms']:.3f} ms "
             f"(lower bound {dl['lower_bound_ms']:.3f} ms, {dl['busiest_device']})")
        sl = d["synchronous_links"]
        echo(f"synchronous DDP over the same links (no delay): {sl['iteration_ms']:.3f} ms "
             f"(lower bound {sl['lower_bound_ms']:.3f} ms, {sl['busiest_device']})")
    if "partial_delay" in d:
        p = d["partial_delay"]
        echo(f"only {', '.join(p['defer'])} delayed one iteration: {p['one_link']['iteration_ms']:.3f} ms on link 0"
             + (f", {p['links']['iteration_ms']:.3f} ms over the links" if "links" in p else ""))


def print_replay(out: dict[str, Any], bd: Any, cp: dict[str, Any]) -> None:
    """The text form of ``dpro replay``'s result.

    Parameters
    ----------
    out : dict
        The ``--json`` object.
    bd : pandas.DataFrame
        :func:`dpro_kit.analysis.breakdown` of the replay.
    cp : dict
        :func:`dpro_kit.analysis.critical_path_summary` of the replay.
    """
    echo = click.echo
    if "job" in out:
        echo(f"job {out['job']}: {out['framework']} + {out['comm_backend']}, {out['world_size']} worker(s)")
    cm = out.get("comm_model") or {}
    echo(f"replayed {out['ops']} ops x {out['iterations_replayed']} iteration(s)"
         + (f"; comm model {cm.get('origin')}: {cm.get('bandwidth_Mbps', 0):.0f} Mbit/s, "
            f"{cm.get('latency_us', 0):.0f} us latency" if cm else ""))
    if out.get("whatif"):
        echo("what if: " + ", ".join(f"{k.replace('_', ' ')} = {v}" for k, v in out["whatif"].items()))
    if out.get("per_iteration_ms"):
        v = sorted(out["per_iteration_ms"].values())
        if out.get("whatif"):
            echo(f"replayed each of {len(v)} profiled iterations with the what-if: {v[0]:.3f} .. {v[-1]:.3f} ms; "
                 f"shown: the profiled job's median iteration ({out['median_iteration']}) with the what-if "
                 f"(--mean-durations: one replay of mean durations)")
        else:
            echo(f"replayed each of {len(v)} profiled iterations: {v[0]:.3f} .. {v[-1]:.3f} ms; the median one "
                 f"(iteration {out['median_iteration']}) is shown (--mean-durations: one replay of mean durations)")
    if out.get("device_model", "fifo") != "fifo" or out.get("overlap_factor") or out.get("overlap_fit"):
        fit = out.get("overlap_fit")
        echo(f"device model {out['device_model']}, overlap factor {out.get('overlap_factor', 0):g}"
             + (f" (fitted from {fit['ops_used']} op(s) seen with and without communication in flight)"
                if fit and fit.get("gamma") is not None else f" (not fitted: {fit['reason']})" if fit else ""))
    line = f"predicted iteration time: {out['iteration_time_ms']:.3f} ms"
    if "measured_iteration_ms" in out:
        line += f"   (measured {out['measured_iteration_ms']:.3f} ms, error {out['error_pct']:+.1f} %)"
    echo(click.style(line, bold=True))
    for note in out.get("notes") or []:
        echo(f"note: {note}")
    sch = out.get("scheduling") or {}
    if sch.get("E") is not None:
        echo(f"scheduling efficiency E = {sch['E']:.2f}, speed-up bound S = {sch['S']:.2f} (worker "
             f"{sch['reference']}, TicTac §3.2)" + (f"; schedule {out['schedule']}" if out.get("schedule") != "graph"
                                                    else ""))
    echo("")
    echo(f"{'node':<24}{'compute ms':>12}{'comm ms':>12}{'overlap ms':>12}{'idle ms':>12}")
    for r in bd.itertuples():
        echo(f"{r.node:<24}{r.compute_ms:>12.3f}{r.comm_ms:>12.3f}{r.overlap_ms:>12.3f}{r.idle_ms:>12.3f}")
    echo("")
    kinds = ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(cp["by_kind_ms"].items(), key=lambda kv: -kv[1]))
    echo(f"critical path: {len(cp['ops'])} ops ({kinds})")
    for t in cp["top"]:
        echo(f"  {t['start_ms']:>10.3f} ms  {t['dur_ms']:>9.3f} ms  {t['kind']:<7} {t['device']:<28} {t['name']}")
    mem = out.get("memory")
    if mem:
        echo("")
        lim = mem.get("limit_bytes")
        echo("memory per worker (peak over the replay" + (f"; limit {lim / 2**20:.1f} MiB" if lim else "") + ")")
        for node, pk in mem["peak_bytes"].items():
            verdict = ("  OOM" if node in mem["oom"] else "  fits") if lim else ""
            echo(f"  {node:<22}{pk / 2**20:>10.2f} MiB at {mem['peak_ms'][node]:.3f} ms ({mem['peak_op'][node]})"
                 + verdict)
        if lim:
            echo(click.style(f"verdict: {mem['verdict']}", bold=True))
    if out.get("stragglers"):
        from ..stragglers import format_attribution
        echo("")
        echo(format_attribution(out["stragglers"]))
    for w in out.get("warnings") or []:
        echo(click.style("warning: ", fg="yellow") + w, err=True)
    if out.get("timeline"):
        echo(f"\ntimeline written to {out['timeline']} (open in https://ui.perfetto.dev)")


__all__ = ["print_replay", "replay"]
