"""What every ``dpro`` command shares: progress, the Session options, output and exit codes.

Conventions (each command module follows them through these helpers):

* ``--json`` prints one JSON object on stdout (:func:`json_option`, :func:`echo_json`);
  ``--quiet`` / a pipe / ``--json`` silence the progress on stderr (:class:`Progress`).
* A user mistake is a :class:`~dpro_kit.errors.DproError`: :func:`dpro_kit.cli.main`
  prints it as one line on stderr and exits with :data:`EXIT_BAD_INPUT` (2).
* The options that say how a trace becomes a prediction are the arguments of
  :class:`~dpro_kit.session.Session`; they come from :func:`session_options` (``--no-align``,
  ``--per-iteration/--mean-durations``) and :func:`whatif_options` (``--bucket-mb``,
  ``--first-bucket-mb``, ``--bandwidth-mbps``, ``--world-size``), and :func:`open_session`
  turns the parsed values into the Session, so every command reads a trace the same way.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from ..session import PER_ITERATION_MAX_EVENTS

#: exit code of a user mistake (bad input, bad option): one line on stderr says what and where
EXIT_BAD_INPUT = 2

F = TypeVar("F", bound=Callable[..., Any])

#: click settings of every command (``-h`` as ``--help``, wide help)
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Progress:
    """Progress on stderr for long steps; silent when piped, with ``--quiet`` or ``--json``.

    Implements :class:`dpro_kit.session.Progress`.

    Parameters
    ----------
    enabled : bool
        False for ``--quiet`` / ``--json``; progress is also off when stderr is not a terminal.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def step(self, label: str) -> Callable[[int, int], None] | None:
        """A ``(done, total)`` callback printing ``label: done/total``, or None when silent."""
        if not self.enabled:
            return None

        def report(done: int, total: int) -> None:
            end = "\n" if done >= total else ""
            click.echo(f"\r{label}: {done}/{total}", err=True, nl=False)
            if end:
                click.echo("", err=True)
        return report

    def note(self, msg: str) -> None:
        """One line on stderr about what happens next (when enabled)."""
        if self.enabled:
            click.echo(msg, err=True)


def _apply(options: list[Callable[[F], F]], f: F) -> F:
    for opt in reversed(options):
        f = opt(f)
    return f


def output_options(what: str = "Print one JSON object instead of text.") -> Callable[[F], F]:
    """``--json`` (as ``as_json``) and ``--quiet/-q``, the options every command has.

    Parameters
    ----------
    what : str
        Help text of ``--json``.
    """
    def deco(f: F) -> F:
        return _apply([click.option("--json", "as_json", is_flag=True, help=what),
                       click.option("--quiet", "-q", is_flag=True, help="No progress output.")], f)
    return deco


def session_options(per_iteration_help: str | None = None, align_help: str | None = None) -> Callable[[F], F]:
    """``--no-align`` and ``--per-iteration/--mean-durations``: how a trace becomes the replayed graph.

    The values are :class:`~dpro_kit.session.Session`'s ``align`` (negated) and
    ``per_iteration`` (None: the Session's default); pass them to :func:`open_session`.

    Parameters
    ----------
    per_iteration_help, align_help : str or None
        Help texts when a command wants to say more (default: the ``dpro replay`` texts).
    """
    per_help = per_iteration_help or (
        "Replay each profiled iteration with its own op durations and report the median one, or replay once "
        "with every op's mean duration.  Default: per iteration (robust to outlier iterations; "
        f"docs/accuracy.md) unless the trace has more than {PER_ITERATION_MAX_EVENTS:,} events.")

    def deco(f: F) -> F:
        return _apply([
            click.option("--no-align", is_flag=True,
                         help=align_help or "Do not apply the trace time alignment (`dpro align`)."),
            click.option("--per-iteration/--mean-durations", default=None, help=per_help),
        ], f)
    return deco


def whatif_options(bucket_help: str | None = None, first_bucket_help: str | None = None) -> Callable[[F], F]:
    """``--bucket-mb``, ``--first-bucket-mb``, ``--bandwidth-mbps``, ``--world-size``: a :class:`~dpro_kit.whatif.WhatIf`.

    Parameters
    ----------
    bucket_help, first_bucket_help : str or None
        Help texts of the bucket options when the command uses them differently
        (``dpro optimize`` starts its search from those buckets).
    """
    def deco(f: F) -> F:
        return _apply([
            click.option("--bucket-mb", type=float, default=None,
                         help=bucket_help or "What if: re-group gradients into DDP buckets of this size "
                                             "(MiB, like bucket_cap_mb)."),
            click.option("--first-bucket-mb", type=float, default=None,
                         help=first_bucket_help or "What if: size cap of the first bucket (default: the "
                         "--bucket-mb value, as DDP does when bucket_cap_mb is given; give 1 for DDP's default "
                         "bucketing, bucket_cap_mb=None)."),
            click.option("--bandwidth-mbps", type=float, default=None,
                         help="What if: every network link at this line rate (Mbit/s; TCP goodput ~95.6 % of it)."),
            click.option("--world-size", type=click.IntRange(1), default=None,
                         help="What if: this many workers (profiled ranks replicated, ring re-formed)."),
        ], f)
    return deco


def _pairs(kind: Callable[[str], Any], what: str, value: str = "FACTOR", example: str = "1.5") -> Callable[[Any, Any, tuple[str, ...]], dict[Any, float]]:
    def parse(ctx: Any, param: Any, values: tuple[str, ...]) -> dict[Any, float]:
        out = {}
        for v in (p for raw in values for p in raw.split(",") if p.strip()):   # repeated, or R=F,R2=F2
            k, sep, f = v.partition("=")
            try:
                out[kind(k.strip())] = float(f)
            except ValueError:
                sep = ""
            if not sep:
                raise click.BadParameter(f"{v!r}: expected {what}={value}, e.g. {'1' if kind is int else 'host1'}={example}"
                                         " (repeat the option, or separate pairs with commas)")
        return out
    return parse


def straggler_options() -> Callable[[F], F]:
    """``--slow-rank``, ``--like-median``, ``--slow-link``, ``--slow-host``, ``--cpu-limit``: stragglers, what if (docs/stragglers.md)."""
    def deco(f: F) -> F:
        return _apply([
            click.option("--slow-rank", "slow_rank", multiple=True, callback=_pairs(int, "RANK"), metavar="R=F",
                         help="What if worker rank R's computation took F times as long (1.5: 50 % slower, "
                              "0.8: faster). Repeatable, or comma-separated (0=1.5,1=0.8)."),
            click.option("--like-median", "like_median", multiple=True, type=int, metavar="R",
                         help="What if worker rank R computed as fast as the median worker (per op). Repeatable."),
            click.option("--slow-link", "slow_link", multiple=True, callback=_pairs(str, "HOST"), metavar="HOST=F",
                         help="What if HOST's network interface had F times its bandwidth (0.5: half). Repeatable, or comma-separated."),
            click.option("--slow-host", "slow_host", multiple=True, callback=_pairs(str, "HOST", "F", "2"), metavar="HOST=F",
                         help="What if HOST got 1/F of the CPU it had (2: half; every thread, e.g. beside a busy "
                              "neighbour): its computation F times as long, and the CPU-bound part of its transfers "
                              "(the CPUs it used while not computing, from the collector's record) too "
                              "(docs/stragglers.md). Repeatable, or comma-separated."),
            click.option("--cpu-share", "cpu_share", multiple=True, callback=_pairs(str, "HOST", "S", "0.5"), metavar="HOST=S",
                         help="With --slow-host: the part of its core HOST got while runnable when profiled (default "
                              "1; 0.5 beside a busy neighbour of equal weight)."),
            click.option("--host-busy", "host_busy", multiple=True, callback=_pairs(str, "HOST", "B", "0.95"), metavar="HOST=B",
                         help="With --slow-host: the part B (0-1] of its iteration HOST's training thread was runnable "
                              "(running or waiting for a core) in the job without the profiler, e.g. from "
                              "/proc/TID/schedstat; used instead of the collector's CPU record (docs/stragglers.md)."),
            click.option("--wire-mbps", "wire_mbps", type=float, default=None, metavar="MBPS",
                         help="With --slow-host: the links' line rate when profiled. The collectives whose fastest "
                              "profiled instance took their wire's time at that rate (within 15 %) were bound by "
                              "the wire, and keep their time; the others are stretched (docs/whatif.md, 'Wire- or "
                              "CPU-paced')."),
            click.option("--cpu-limit", "cpu_limit", multiple=True, callback=_pairs(str, "HOST", "CPUS", "0.667"), metavar="HOST=CPUS",
                         help="What if HOST's cgroup had a CPU quota of CPUS (0.667: 2/3 of a CPU; split over its "
                              "workers): Linux CFS - full speed until the period's quota is spent, then stopped "
                              "until the next period, its transfers waiting too (docs/whatif.md, 'CPU quota'). The "
                              "profile must be unthrottled, or use --recorded-quota beside it (the recorded stops out "
                              "first). Repeatable, or comma-separated (host0=1,host1=0.5)."),
            click.option("--cpu-period-ms", "cpu_period_ms", type=float, default=100.0, show_default=True,
                         help="With --cpu-limit (and --recorded-quota on traces that did not record it): the "
                              "quota's period (cpu.cfs_period_us / 1000)."),
            click.option("--recorded-quota", "recorded_quota", is_flag=True,
                         help="Replay the CPU quota each rank's cgroup had when profiled, for the ranks the kernel "
                              "throttled (the collector's throttled_us): the kernel's recorded stops taken out of "
                              "its traced ops first (from the ops above their median), then the CFS model of "
                              "--cpu-limit with the recorded quota and period (docs/whatif.md, 'CPU quota'). "
                              "Nothing throttled: the plain replay, bit for bit."),
        ], f)
    return deco


def horovod_options() -> Callable[[F], F]:
    """``--fusion-threshold-mb``, ``--cycle-time-ms``: Horovod's knobs, what if (docs/horovod.md)."""
    def deco(f: F) -> F:
        return _apply([
            click.option("--fusion-threshold-mb", type=float, default=None,
                         help="What if (Horovod): HOROVOD_FUSION_THRESHOLD of this many MiB (docs/horovod.md)."),
            click.option("--cycle-time-ms", type=float, default=None,
                         help="What if (Horovod): HOROVOD_CYCLE_TIME of this many ms (docs/horovod.md)."),
        ], f)
    return deco


def make_whatif(bucket_mb: float | None = None, first_bucket_mb: float | None = None,
                bandwidth_mbps: float | None = None, world_size: int | None = None,
                fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None) -> Any:
    """The :class:`~dpro_kit.whatif.WhatIf` of the :func:`whatif_options` (and :func:`horovod_options`) values.

    Parameters
    ----------
    bucket_mb, first_bucket_mb, bandwidth_mbps, world_size
        The option values (None: not asked).
    """
    from ..whatif import WhatIf
    return WhatIf(bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, bandwidth_mbps=bandwidth_mbps,
                  world_size=world_size, fusion_threshold_mb=fusion_threshold_mb, cycle_time_ms=cycle_time_ms)


def open_session(trace: Path, *, no_align: bool = False, per_iteration: bool | None = None,
                 whatif: Any = None, progress: Progress | None = None) -> Any:
    """The :class:`~dpro_kit.session.Session` of a command's TRACE and its shared options.

    Parameters
    ----------
    trace : Path
        A trace directory or a graph file.
    no_align, per_iteration
        The values of :func:`session_options`.
    whatif : dpro_kit.whatif.WhatIf or None
        From :func:`make_whatif`.
    progress : Progress or None
    """
    from ..session import Session
    return Session(trace, align=not no_align, whatif=whatif, per_iteration=per_iteration, progress=progress)


def echo_json(obj: Any, indent: int | None = 2) -> None:
    """Print ``obj`` as the command's one JSON object on stdout.

    Parameters
    ----------
    obj : any
        A JSON-serialisable object.
    indent : int or None
        ``json.dumps`` indent.
    """
    click.echo(json.dumps(obj, indent=indent))


__all__ = ["CONTEXT_SETTINGS", "EXIT_BAD_INPUT", "Progress", "echo_json", "make_whatif", "open_session",
           "output_options", "session_options", "whatif_options"]
