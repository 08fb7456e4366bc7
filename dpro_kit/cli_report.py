"""``dpro report`` (self-contained HTML report) and ``dpro check`` (CI regression gate).

Plain click commands, registered on the ``dpro`` group in :mod:`dpro_kit.cli`
(``cli.add_command(report)``, ``cli.add_command(check)``).  They follow the CLI's
conventions: ``--json`` prints one JSON object, ``--quiet`` (and a pipe) silences
progress, a user mistake is a :class:`~dpro_kit.errors.DproError` (one line,
exit 2).  ``dpro check`` exits 1 when a check fails.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from .errors import DproError


def _progress(enabled: bool) -> Any:
    from .cli import _Progress  # late: cli.py imports this module to register the commands
    return _Progress(enabled)


@click.command(short_help="Write a self-contained HTML report of a trace (works offline).")
@click.argument("trace_dir", type=click.Path(path_type=Path))
@click.option("--output", "-o", default="dpro-report.html", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="HTML file to write.")
@click.option("--plan", type=click.Path(dir_okay=False, path_type=Path),
              help="An optimizer plan (JSON) to show with its predicted gain.")
@click.option("--iterations", "-n", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Replay this many iterations; the report shows the last (steady state).")
@click.option("--timeline-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write measured.json, replayed.json (and aligned.json when offsets exist) "
                   "as Chrome/Perfetto trace JSON into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def report(trace_dir: Path, output: Path, plan: Path | None, iterations: int, timeline_dir: Path | None,
           as_json: bool, quiet: bool) -> None:
    """Write one HTML file about the job in TRACE_DIR that works offline.

    \b
    Sections: measured and replayed timelines (critical path and idle gaps
    marked), computation / communication / overlap / idle per node, per-bucket
    communication times, stragglers across ranks, alignment offsets, memory,
    and the optimizer plan (--plan).  Open it in any browser; nothing is
    loaded from the network.

    \b
      dpro report trace -o report.html
      dpro report trace -o report.html --plan plan.json --timeline-dir tl/
    """
    from .errors import atomic_write_text
    from .report import build_report

    progress = _progress(not (quiet or as_json))
    t0 = time.perf_counter()
    rep = build_report(trace_dir, plan=plan, iterations=iterations, progress=progress)
    atomic_write_text(output, rep.html)
    written = [str(output)]
    if timeline_dir is not None:
        written += [str(p) for p in rep.write_timelines(timeline_dir)]
    out = {"output": str(output), "bytes": len(rep.html.encode()), "seconds": round(time.perf_counter() - t0, 3),
           **rep.summary, "timelines": written[1:]}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"wrote {output} ({out['bytes'] / 1024:.0f} KiB): predicted {out['iteration_time_ms']:.3f} ms"
               + (f", measured {out['measured_iteration_ms']:.3f} ms" if out.get("measured_iteration_ms") else "")
               + f"; sections: {', '.join(out['sections'])}")
    for p in written[1:]:
        click.echo(f"timeline {p} (open in https://ui.perfetto.dev)")


@click.command(short_help="CI gate: fail when a run is slower than a baseline or a budget.")
@click.argument("trace", required=False, type=click.Path(path_type=Path))
@click.option("--baseline", "-b", type=click.Path(path_type=Path),
              help="Baseline run: a trace directory or a `dpro replay --json` file.")
@click.option("--candidate", "-c", type=click.Path(path_type=Path),
              help="Candidate run (default: TRACE): a trace directory or a `dpro replay --json` file.")
@click.option("--max-regression", default="5%", show_default=True,
              help="Fail when the candidate is slower than the baseline by more than this.")
@click.option("--max-iteration-ms", type=float, default=None,
              help="Fail when the candidate's iteration time is above this budget (ms).")
@click.option("--metric", type=click.Choice(["predicted", "measured", "both"]), default="predicted",
              show_default=True,
              help="Which iteration time to gate: replayed (deterministic), measured (manifest), or both.")
@click.option("--iterations", "-n", type=click.IntRange(1, 1000), default=None,
              help="Iterations to replay for trace directories (default: as the saved replay result, else 1).")
@click.option("--no-align", is_flag=True, help="Trace directories: do not apply the time alignment (`dpro align`).")
@click.option("--per-iteration/--mean-durations", default=None,
              help="Trace directories: replay the median profiled iteration or mean durations (default: as "
                   "`dpro replay`; a saved baseline should be made with the same choice).")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the verdict as JUnit XML (one test case per check).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def check(trace: Path | None, baseline: Path | None, candidate: Path | None, max_regression: str,
          max_iteration_ms: float | None, metric: str, iterations: int | None, no_align: bool,
          per_iteration: bool | None, junit: Path | None, as_json: bool, quiet: bool) -> None:
    """Gate a change on training speed (exit 0 pass, 1 slower, 2 bad input).

    \b
      dpro check --baseline main-trace --candidate pr-trace --max-regression 5%
      dpro check --baseline base.json --candidate new.json --junit dpro.xml
      dpro check pr-trace --max-iteration-ms 7.5

    Runs are trace directories (replayed here exactly as `dpro replay` does:
    aligned, median profiled iteration) or saved `dpro replay --json`
    results.  A failure says what got slower: critical-path time per phase
    (FW/BW/UPDATE/comm), measured time per phase, computation vs
    communication, and the ops with the largest increase.
    """
    from . import check as chk

    progress = _progress(not (quiet or as_json))
    t0 = time.perf_counter()
    if candidate is not None and trace is not None:
        raise DproError("give the candidate either as TRACE or as --candidate, not both")
    cand_path = candidate or trace
    if cand_path is None:
        raise DproError("nothing to check: no run given",
                        hint="use --baseline A --candidate B, or TRACE --max-iteration-ms X")
    if baseline is None and max_iteration_ms is None:
        raise DproError("nothing to check against",
                        hint="give --baseline (regression gate) or --max-iteration-ms (budget)")
    if max_iteration_ms is not None and not (max_iteration_ms > 0 and max_iteration_ms < float("inf")):
        raise DproError(f"--max-iteration-ms must be a positive number, got {max_iteration_ms!r}")
    pct = chk.parse_percent(max_regression)
    if iterations is None:
        saved = [n for n in (chk.replay_json_iterations(p) for p in (baseline, cand_path) if p) if n]
        iterations = max(saved) if saved else 1
    how = {"iterations": iterations, "progress": progress.note, "align": not no_align, "per_iteration": per_iteration}
    base = chk.summary(baseline, **how) if baseline is not None else None
    cand = chk.summary(cand_path, **how)
    if base is not None:
        rep = chk.compare(base, cand, max_regression_pct=pct, metric=metric, max_iteration_ms=max_iteration_ms)
    else:
        rep = chk.budget(cand, max_iteration_ms, metric=metric)  # type: ignore[arg-type]
    rep.seconds = time.perf_counter() - t0
    if junit is not None:
        chk.write_junit(rep, junit)
    if as_json:
        out = rep.to_json()
        if junit is not None:
            out["junit"] = str(junit)
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(chk.render_text(rep))
    if not rep.passed:
        sys.exit(chk.EXIT_FAIL)


__all__ = ["check", "report"]
