"""``dpro check``: the CI gate (exit 0 pass, 1 slower than a baseline or budget, 2 bad input; docs/ci.md)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..errors import DproError
from ._common import Progress, echo_json, output_options, session_options

EPILOG = """\b
Examples:
  dpro check --baseline main-trace --candidate pr-trace --max-regression 5%
  dpro check --baseline base.json --candidate new.json --junit dpro.xml
  dpro check pr-trace --max-iteration-ms 7.5
  dpro replay main-trace --json > base.json     (a saved baseline)
"""


@click.command(short_help="CI gate: fail when a run is slower than a baseline or a budget.", epilog=EPILOG)
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
@session_options(align_help="Trace directories: do not apply the time alignment (`dpro align`).",
                  per_iteration_help="Trace directories: replay the median profiled iteration or mean durations "
                                     "(default: as `dpro replay`; a saved baseline should be made with the same "
                                     "choice).")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the verdict as JUnit XML (one test case per check).")
@output_options()
def check(trace: Path | None, baseline: Path | None, candidate: Path | None, max_regression: str,
          max_iteration_ms: float | None, metric: str, iterations: int | None, no_align: bool,
          per_iteration: bool | None, junit: Path | None, as_json: bool, quiet: bool) -> None:
    """Gate a change on training speed (exit 0 pass, 1 slower, 2 bad input).

    Runs are trace directories (replayed here exactly as `dpro replay` does:
    aligned, median profiled iteration) or saved `dpro replay --json`
    results.  A failure says what got slower: critical-path time per phase
    (FW/BW/UPDATE/comm), measured time per phase, computation vs
    communication, and the ops with the largest increase.
    """
    from .. import check as chk

    progress = Progress(not (quiet or as_json))
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
        echo_json(out)
    else:
        click.echo(chk.render_text(rep))
    if not rep.passed:
        sys.exit(chk.EXIT_FAIL)


__all__ = ["check"]
