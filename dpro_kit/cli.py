"""The ``dpro`` command line: a thin facade over the library.

Conventions: every command has ``--json`` (one JSON object on stdout) and
``--quiet``; progress goes to stderr and only on a terminal; a user mistake is
one line on stderr and exit code 2; outputs are written atomically.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click
import networkx as nx

from . import __version__
from .errors import DproError
from .session import PER_ITERATION_MAX_EVENTS  # the replay help names it

EXIT_BAD_INPUT = 2


class _Progress:
    """Progress on stderr for long steps; silent when piped, with --quiet or --json."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def step(self, label: str) -> Callable[[int, int], None] | None:
        if not self.enabled:
            return None

        def report(done: int, total: int) -> None:
            end = "\n" if done >= total else ""
            click.echo(f"\r{label}: {done}/{total}", err=True, nl=False)
            if end:
                click.echo("", err=True)
        return report

    def note(self, msg: str) -> None:
        if self.enabled:
            click.echo(msg, err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpro")
def cli() -> None:
    """dpro: find out why distributed training is slow, and what to change.

    \b
    Typical use:
      dpro replay TRACE_DIR             predict the iteration time, show the critical path
      dpro replay TRACE_DIR --json      the same as one JSON object (for scripts and CI)
      dpro profile -o T -- torchrun ...  profile a job without changing it
      dpro graph TRACE_DIR -o dfg.json  export the global data-flow graph
      dpro align TRACE_DIR              align the nodes' clocks (replay applies it)
      dpro optimize TRACE -o plan.json  search fusion / partition / memory strategies
      dpro report TRACE_DIR -o r.html   one HTML page: timelines, breakdown, stragglers
      dpro check -b base.json -c TRACE  CI gate: exit 1 if slower (docs/ci.md)

    Exit codes: 0 success, 1 check failed (dpro check), 2 bad input (one line on stderr says what and where).
    """


@cli.command(short_help="Predict the iteration time and show the critical path.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--iterations", "-n", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Replay this many iterations back to back; the iteration time is the steady-state gap.")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the simulated timeline as Chrome/Perfetto trace JSON to this file.")
@click.option("--measured-timeline", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the measured (aligned, when alignment applies) trace as Chrome/Perfetto JSON.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(0, 10000),
              help="How many of the longest critical-path ops to list.")
@click.option("--bucket-mb", type=float, default=None,
              help="What if: re-group gradients into DDP buckets of this size (MiB, like bucket_cap_mb).")
@click.option("--first-bucket-mb", type=float, default=None,
              help="What if: size cap of the first bucket (default: the --bucket-mb value, as DDP does when "
                   "bucket_cap_mb is given; give 1 for DDP's default bucketing, bucket_cap_mb=None).")
@click.option("--bandwidth-mbps", type=float, default=None,
              help="What if: every network link at this line rate (Mbit/s; TCP goodput ~95.6 %% of it).")
@click.option("--world-size", type=click.IntRange(1), default=None,
              help="What if: this many workers (profiled ranks replicated, ring re-formed).")
@click.option("--no-align", is_flag=True, help="Do not apply the trace time alignment (`dpro align`).")
@click.option("--per-iteration/--mean-durations", default=None,
              help="Replay each profiled iteration with its own op durations and report the median one, or "
                   "replay once with every op's mean duration.  Default: per iteration (robust to outlier "
                   f"iterations; docs/accuracy.md) unless the trace has more than {PER_ITERATION_MAX_EVENTS:,} "
                   "events.")
@click.option("--schedule", default="graph", show_default=True,
              type=click.Choice(["graph", "fifo", "tic", "tac", "random"]),
              help="Order of the transfers on each link / server: as the graph says (traced: FIFO), or "
                   "TicTac's TIC / TAC order of a parameter-server job's transfers, or a random one "
                   "(docs/tictac.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def replay(trace: Path, iterations: int, timeline: Path | None, measured_timeline: Path | None, top: int, bucket_mb: float | None,
           first_bucket_mb: float | None, bandwidth_mbps: float | None, world_size: int | None, no_align: bool,
           per_iteration: bool | None, schedule: str, as_json: bool, quiet: bool) -> None:
    """Predict the iteration time of a job by replaying its global DFG.

    TRACE is a trace directory (with manifest.json) or a graph file written by
    `dpro graph`.  Prints the predicted iteration time, the computation /
    communication / overlap / idle time of every node, and the longest ops on
    the critical path.

    \b
    What-if: predict a configuration you did not profile, e.g.
      dpro replay T --bucket-mb 1          smaller DDP buckets
      dpro replay T --bandwidth-mbps 200   slower network
      dpro replay T --world-size 8         more workers
    """
    from .analysis import breakdown, critical_path_summary
    from .optimize.tictac import scheduling_efficiency
    from .session import Session
    from .timeline import replay_to_chrome, trace_to_chrome, write_chrome
    from .whatif import WhatIf

    progress = _Progress(not (quiet or as_json))
    wi = WhatIf(bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, bandwidth_mbps=bandwidth_mbps,
                world_size=world_size)
    session = Session(trace, align=not no_align, whatif=wi, per_iteration=per_iteration, progress=progress)
    g, info, ts = session.graph, session.info, session.profiled
    if measured_timeline is not None and ts is None:
        raise DproError("--measured-timeline needs a trace directory, not a graph file", path=trace)
    progress.note(f"replaying {g.number_of_nodes()} ops x {iterations} iteration(s)")
    res = session.replay(iterations, schedule=schedule)
    bd = breakdown(res, g)
    cp = critical_path_summary(res, g, top=top)
    if timeline is not None:
        write_chrome(replay_to_chrome(res, g), timeline)
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
    }
    if "measured_iteration_ms" in info:
        out["error_pct"] = 100.0 * (it_ms - info["measured_iteration_ms"]) / info["measured_iteration_ms"]
    if ts is not None:
        from .placement import placement_warnings, world_size_warnings
        # one line each about what the input is and cannot tell (e.g. plain torch.profiler folders)
        out["notes"] = [str(x) for x in (ts.manifest.extra.get("notes") or [])]
        out["warnings"] = placement_warnings(ts.manifest.extra)
        if world_size is not None:
            out["warnings"] += world_size_warnings(ts.manifest.extra, world_size)
    if timeline is not None:
        out["timeline"] = str(timeline)
    if measured_timeline is not None:
        out["measured_timeline"] = str(measured_timeline)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    _print_replay(out, bd, cp)


def _print_replay(out: dict[str, Any], bd: Any, cp: dict[str, Any]) -> None:
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
        echo(f"replayed each of {len(v)} profiled iterations: {v[0]:.3f} .. {v[-1]:.3f} ms; the median one "
             f"(iteration {out['median_iteration']}) is shown (--mean-durations: one replay of mean durations)")
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
    for w in out.get("warnings") or []:
        echo(click.style("warning: ", fg="yellow") + w, err=True)
    if out.get("timeline"):
        echo(f"\ntimeline written to {out['timeline']} (open in https://ui.perfetto.dev)")


@cli.command(short_help="Export the global data-flow graph (JSON or GraphML).")
@click.argument("trace_dir", type=click.Path(path_type=Path))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Output file: .json (node-link) or .graphml.")
@click.option("--no-align", is_flag=True, help="Do not apply the trace time alignment (`dpro align`).")
@click.option("--per-iteration/--mean-durations", default=None,
              help="Op durations of the median profiled iteration (as `dpro replay`), or every op's mean "
                   "duration.  Default: as `dpro replay`.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def graph(trace_dir: Path, output: Path, no_align: bool, per_iteration: bool | None, as_json: bool,
          quiet: bool) -> None:
    """Build the global data-flow graph of a trace and save it (JSON or GraphML).

    The graph is the one `dpro replay TRACE_DIR` replays (same alignment and
    durations rule), so `dpro replay` of the file predicts the same time.
    """
    from collections import Counter

    from .graph import save_graph
    from .session import Session
    session = Session(trace_dir, align=not no_align, per_iteration=per_iteration,
                      progress=_Progress(not (quiet or as_json)))
    g = session.graph
    save_graph(g, output)
    kinds = Counter(d["kind"] for _, d in g.nodes(data=True))
    summary = {"output": str(output), "ops": g.number_of_nodes(), "edges": g.number_of_edges(),
               "ops_by_kind": dict(sorted(kinds.items())),
               "devices": len({d["device"] for _, d in g.nodes(data=True) if d["device"]}),
               "durations": session.info.get("durations")}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"wrote {output}: {summary['ops']} ops, {summary['edges']} edges, {summary['devices']} devices "
                   f"({', '.join(f'{k} {v}' for k, v in summary['ops_by_kind'].items())})")


@cli.command(short_help="Run a training command with the profiler enabled (no code change).",
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "-o", default="dpro-trace", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Trace directory to write (one folder per rank under <host>/<rank>/, plus manifest.json).")
@click.option("--steps", default="10:15", show_default=True,
              help="Profile iterations A..B-1 (counted at optimizer.step()); A >= 2 skips DDP's bucket rebuild.")
@click.option("--host", default=None, help="Host name recorded for the ranks (default: $DPRO_HOST or hostname).")
@click.option("--memory", is_flag=True,
              help="Also record allocator events (memory over the iteration, peak); adds profiling overhead.")
@click.option("--ring", is_flag=True,
              help="gloo: run DDP's bucket AllReduce as a timed ring (a comm hook) to record per-chunk SEND/RECV "
                   "times (what `dpro align` needs for microsecond clock alignment across hosts).")
@click.option("--shapes", is_flag=True,
              help="Record op input shapes in one extra iteration after the window (kineto_shapes.json); "
                   "`dpro optimize` rebuilds op-fusion candidates from them and times them with torch.compile.")
@click.option("--framework", type=click.Choice(["torch", "tensorflow"]), default="torch", show_default=True,
              help="Which collector to enable (tensorflow: collectors/tf, tf.profiler on every task).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary after the job ends.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile(out: Path, steps: str, host: str | None, memory: bool, ring: bool, shapes: bool, framework: str,
            as_json: bool, command: tuple[str, ...]) -> None:
    """Profile COMMAND (e.g. `python train.py`, `torchrun ...`) without changing it.

    \b
      dpro profile --out trace -- torchrun --nproc_per_node 2 train.py
      dpro profile --steps 20:25 --host node3 -- python train.py --epochs 1

    The collector is switched on through the environment: every Python process
    the command starts imports it, marks iterations at optimizer.step() and
    profiles steps A..B-1 after warm-up. The job's output and exit code pass
    through unchanged; if it crashes or is killed, what was collected stays
    readable. Then run `dpro replay OUT`.
    """
    import signal
    import subprocess

    if framework == "tensorflow":
        return _profile_tf(out, steps, host, as_json, command)
    from dpro_torch.launch import profile_env
    from dpro_torch.recorder import parse_steps

    try:
        parse_steps(steps)
    except ValueError as exc:
        raise DproError(f"--steps {steps!r}: {exc}", hint="use A:B with 1 <= A < B, e.g. 10:15") from None
    cmd = list(command[1:] if command[:1] == ("--",) else command)
    if not cmd:
        raise DproError("no command given", hint="put the training command after --")
    if (out / "manifest.json").exists():
        raise DproError("refusing to overwrite an existing trace directory", path=out,
                        hint="choose a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    import time
    t_launch = time.time() - 1.0  # meta.json newer than this are this launch's (1 s: mtime granularity)
    env = profile_env(str(out), steps, host or os.environ.get("DPRO_HOST"), memory=memory, ring=ring,
                      shapes=shapes)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise DproError(f"cannot start {cmd[0]!r}: {exc.strerror}", hint="check the command after --") from None
    forwarded = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        forwarded[sig] = signal.signal(sig, lambda s, _f: proc.send_signal(s))
    try:
        code = proc.wait()
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)
    from dpro_torch.manifest import find_metas, try_write_manifest
    # this launcher's ranks: the meta.json written since it started (their run id is the job's,
    # agreed through the job's c10d store, so it can differ from this launcher's DPRO_RUN_ID)
    mine = [d for p, d in find_metas(out) if p.stat().st_mtime >= t_launch
            and (not env.get("DPRO_HOST") or d.get("host") == env["DPRO_HOST"])]
    run_ids = {d.get("run_id") for d in mine}
    run_id = run_ids.pop() if len(run_ids) == 1 else env.get("DPRO_RUN_ID")
    have_manifest = (out / "manifest.json").exists() or try_write_manifest(out, run_id=run_id)
    ranks, world = len(mine), max([int(d.get("world_size") or 1) for d in mine] or [0])
    here = len({int(d["rank"]) for p, d in find_metas(out) if d.get("run_id") == run_id})
    summary = {"out": str(out), "exit_code": code, "ranks_written": ranks, "manifest": have_manifest,
               "run_id": run_id, "world_size": world, "ranks_of_run_here": here}
    if as_json:
        click.echo(json.dumps(summary))
    elif have_manifest or not ranks:
        click.echo(f"dpro: {ranks} rank trace(s) in {out}" + (f"; next: dpro replay {out}" if have_manifest else ""),
                   err=True)
    else:  # a multi-host job: the other hosts' launchers write the other ranks
        click.echo(f"dpro: {ranks} rank trace(s) of run {run_id} in {out}; {here} of its {world} ranks are here. "
                   f"The other hosts' `dpro profile` write the rest: with a shared folder, `dpro replay {out}` "
                   f"once all hosts finished; else copy every host's folder into one (cp -r HOST_DIR/* {out}/ "
                   f"or dpro merge) and replay that", err=True)
    sys.exit(code if code >= 0 else 128 - code)


def _profile_tf(out: Path, steps: str, host: str | None, as_json: bool, command: tuple[str, ...]) -> None:
    """`dpro profile --framework tensorflow`: run the command with collectors/tf enabled."""
    import subprocess

    from .collectors import import_collector

    launch, manifest = import_collector("tensorflow", "launch"), import_collector("tensorflow", "manifest")
    cmd = list(command[1:] if command[:1] == ("--",) else command)
    if not cmd:
        raise DproError("no command given", hint="put the training command after --")
    if (out / "manifest.json").exists():
        raise DproError("refusing to overwrite an existing trace directory", path=out, hint="choose a new --out folder")
    try:
        env = launch.profile_env(str(out), steps, host or os.environ.get("DPRO_HOST"))
    except ValueError as exc:
        raise DproError(f"--steps {steps!r}: {exc}", hint="use A:B with 1 <= A < B, e.g. 10:15") from None
    out.mkdir(parents=True, exist_ok=True)
    import time
    t_launch = time.time() - 1.0   # meta.json newer than this are this launch's (1 s: mtime granularity)
    try:
        code = subprocess.call(cmd, env=env)
    except OSError as exc:
        raise DproError(f"cannot start {cmd[0]!r}: {exc.strerror}", hint="check the command after --") from None
    # this launcher's tasks (a multi-task job's run id comes from its TF_CONFIG cluster, not DPRO_RUN_ID)
    mine = [d for p, d in manifest.find_metas(out) if p.stat().st_mtime >= t_launch]
    run_id = mine[0].get("run_id") if mine else env["DPRO_RUN_ID"]
    have = (out / "manifest.json").exists() or manifest.try_write_manifest(out, run_id=run_id)
    summary = {"out": str(out), "exit_code": code, "tasks_written": len(mine), "manifest": have, "run_id": run_id}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"dpro: {len(mine)} task trace(s) in {out}" + (
            f"; next: dpro replay {out}" if have else
            "; the job's other tasks write the rest (one dpro profile per host): replay once all finished"), err=True)
    sys.exit(code if code >= 0 else 128 - code)


from .cli_report import check, report  # noqa: E402  (cli_report imports cli lazily, no cycle)

cli.add_command(report)
cli.add_command(check)

from .cli_align import align as _align_cmd  # noqa: E402
from .cli_async import async_predict as _async_cmd  # noqa: E402

cli.add_command(_async_cmd)

cli.add_command(_align_cmd)

from .cli_optimize import optimize as _optimize_cmd  # noqa: E402

cli.add_command(_optimize_cmd)

from .cli_merge import merge as _merge_cmd  # noqa: E402

cli.add_command(_merge_cmd)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning user errors into one line and exit code 2."""
    try:
        cli.main(args=argv, prog_name="dpro", standalone_mode=False)
    except DproError as exc:
        click.echo(f"dpro: error: {exc.one_line()}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("dpro: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
