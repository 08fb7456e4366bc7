"""``dpro report``: one self-contained HTML page about a trace (works offline; docs/report.md)."""
from __future__ import annotations

import time
from pathlib import Path

import click

from ._common import Progress, echo_json, output_options, session_options

EPILOG = """\b
Examples:
  dpro report trace -o report.html
  dpro report trace -o report.html --plan plan.json --timeline-dir tl/
"""


@click.command(short_help="Write a self-contained HTML report of a trace (works offline).", epilog=EPILOG)
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
@session_options()
@output_options("Print a JSON summary instead of text.")
def report(trace_dir: Path, output: Path, plan: Path | None, iterations: int, timeline_dir: Path | None,
           no_align: bool, per_iteration: bool | None, as_json: bool, quiet: bool) -> None:
    """Write one HTML file about the job in TRACE_DIR that works offline.

    \b
    Sections: measured and replayed timelines (critical path and idle gaps
    marked), computation / communication / overlap / idle per node, per-bucket
    communication times, stragglers across ranks, alignment offsets, memory,
    and the optimizer plan (--plan).  Open it in any browser; nothing is
    loaded from the network.
    """
    from ..errors import atomic_write_text
    from ..report import build_report

    progress = Progress(not (quiet or as_json))
    t0 = time.perf_counter()
    rep = build_report(trace_dir, plan=plan, iterations=iterations, progress=progress, align=not no_align,
                       per_iteration=per_iteration)
    atomic_write_text(output, rep.html)
    written = [str(output)]
    if timeline_dir is not None:
        written += [str(p) for p in rep.write_timelines(timeline_dir)]
    out = {"output": str(output), "bytes": len(rep.html.encode()), "seconds": round(time.perf_counter() - t0, 3),
           **rep.summary, "timelines": written[1:]}
    if as_json:
        echo_json(out)
        return
    click.echo(f"wrote {output} ({out['bytes'] / 1024:.0f} KiB): predicted {out['iteration_time_ms']:.3f} ms"
               + (f", measured {out['measured_iteration_ms']:.3f} ms" if out.get("measured_iteration_ms") else "")
               + f"; sections: {', '.join(out['sections'])}")
    for p in written[1:]:
        click.echo(f"timeline {p} (open in https://ui.perfetto.dev)")


__all__ = ["report"]
