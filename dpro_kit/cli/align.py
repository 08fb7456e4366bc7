"""``dpro align TRACE_DIR``: estimate per-node clock offsets (dPRO §4.2) and cache them.

Caches the result outside the trace folder (``$DPRO_CACHE/aligned/``,
:func:`dpro_kit.align.cache_dir`; atomic writes; trace folders are never written), where
``dpro replay`` and the other commands find it (:func:`dpro_kit.align.align_trace`).
"""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import DproError
from ._common import echo_json, output_options

EPILOG = """\b
Examples:
  dpro align trace                 offsets, residuals, error bounds; stored for `dpro replay`
  dpro align trace --json --no-write
  dpro align trace --family paper --statistic mean     dPRO's objective as published
"""


@click.command(short_help="Align the clocks of a job's nodes (dPRO trace time alignment).", epilog=EPILOG)
@click.argument("trace_dir", type=click.Path(path_type=Path))
@click.option("--alpha", default=1.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Weight of the RECV-family variance term.")
@click.option("--beta", default=100.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Weight of the same-machine spread term.")
@click.option("--family", type=click.Choice(["size", "paper"]), default="size", show_default=True,
              help="Fine-grained RECV families: by transfer size and link kind, or dPRO's (receiver, sender, "
                   "tensor).")
@click.option("--statistic", type=click.Choice(["min", "mean"]), default="min", show_default=True,
              help="Per-chunk SEND/RECV records: the fastest transfer per sender->receiver pair (robust to "
                   "scheduling delays) or dPRO's variance of the clipped RECV durations.")
@click.option("--max-uncertainty", "max_unc", default=100.0, show_default=True, type=click.FloatRange(min=0.0),
              metavar="US", help="Collective-level traces: an offset whose ~95 % error bound exceeds this is "
                                 "reported UNDETERMINED (with the interval the dependencies prove) instead of a number.")
@click.option("--no-write", is_flag=True,
              help="Do not cache the result for the other commands (they then solve with the default options).")
@output_options()
def align(trace_dir: Path, alpha: float, beta: float, family: str, statistic: str, max_unc: float, no_write: bool,
          as_json: bool, quiet: bool) -> None:
    """Estimate every node's clock offset against the reference node and store the result.

    \b
    Uses per-chunk SEND/RECV events when the trace has them (`dpro profile --ring` for
    gloo, NCCL / ps-lite patches, synthetic jobs: offsets to microseconds), otherwise
    whole collectives (plain gloo / NCCL traces): the same collective ends on all ranks
    within about one transfer step, and no rank's collective ends before the last rank
    entered it.  Ends pin an offset only as well as they agree; an offset whose error
    bound exceeds --max-uncertainty is printed as UNDETERMINED with the interval the
    dependencies prove, and is applied as the point of that interval nearest to 0.
    Prints the offsets (aligned time = raw time - offset), residuals, the error bound
    (+- us), the proven interval, binding constraints and the solve time.  `dpro replay`
    applies the stored offsets automatically.  Details: docs/alignment.md.
    """
    from ..align import align as run_align
    from ..align import format_report, save_result
    from ..trace import load_trace

    ts = load_trace(trace_dir)
    res = run_align(ts, alpha=alpha, beta=beta, family=family, statistic=statistic, undetermined_us=max_unc)
    out = res.to_json()
    out["trace"] = str(trace_dir)
    if not no_write:
        try:
            out["written"] = str(save_result(res, trace_dir, ts))
        except OSError as exc:
            raise DproError(f"cannot write the alignment cache: {exc.strerror}", path=exc.filename or trace_dir,
                            hint="set DPRO_CACHE to a writable folder, or use --no-write") from None
    if as_json:
        echo_json(out)
        return
    click.echo(format_report(res))
    if out.get("written") and not quiet:
        click.echo(f"written to {out['written']}")


__all__ = ["align"]
