"""The ``dpro`` command line: a thin facade over the library, one module per command.

=================  ==========================================================
``profile``        :mod:`dpro_kit.cli.profile` (collectors through the environment)
``replay``         :mod:`dpro_kit.cli.replay` (:class:`~dpro_kit.session.Session`)
``graph``          :mod:`dpro_kit.cli.graph`
``align``          :mod:`dpro_kit.cli.align` (:mod:`dpro_kit.align`)
``optimize``       :mod:`dpro_kit.cli.optimize` (:func:`dpro_kit.optimize.driver.optimize`)
``report``         :mod:`dpro_kit.cli.report` (:mod:`dpro_kit.report`)
``check``          :mod:`dpro_kit.cli.check` (:mod:`dpro_kit.check`)
``merge``          :mod:`dpro_kit.cli.merge`
``async-predict``  :mod:`dpro_kit.cli.async_predict` (:mod:`dpro_kit.async_ps`)
``cluster``        :mod:`dpro_kit.cli.cluster` (:mod:`dpro_kit.jobs`, :mod:`dpro_kit.cluster`)
``simulate``       :mod:`dpro_kit.cli.simulate` (:mod:`dpro_kit.simulate`)
=================  ==========================================================

Conventions (:mod:`dpro_kit.cli._common`): every command has ``--json`` (one JSON
object on stdout) and ``--quiet``; progress goes to stderr and only on a terminal;
a user mistake is one line on stderr and exit code 2; outputs are written
atomically; the options that say how a trace is read are shared
(``session_options``, ``whatif_options``).  A command module imports the library
and ``_common`` only, never this package, so there is no import cycle.
"""
from __future__ import annotations

import sys

import click

from .. import __version__
from ..cleanup import exit_on_sigterm
from ..errors import DproError
from . import align, async_predict, check, cluster, graph, merge, optimize, profile, replay, report, simulate
from ._common import CONTEXT_SETTINGS, EXIT_BAD_INPUT, Progress


@click.group(context_settings=CONTEXT_SETTINGS)
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
      dpro merge A/ B/ -o T             per-host folders of one multi-host run into one
      dpro cluster --hosts 2 -- CMD     run CMD on emulated hosts (netns + shaped links; root)
      dpro simulate ONE --strategy S.yaml   predict DP / FSDP / TP / pipeline strategies from one profile

    Exit codes: 0 success, 1 check failed (dpro check), 2 bad input (one line on stderr says what and where).
    """


for _command in (profile.profile, replay.replay, graph.graph, align.align, optimize.optimize, report.report,
                 check.check, merge.merge, async_predict.async_predict, cluster.cluster, simulate.simulate):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning user errors into one line and exit code 2.

    Parameters
    ----------
    argv : list of str or None
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0, 1 (``dpro check`` failed), 2 (bad input), 130 (interrupted).
    """
    restore = exit_on_sigterm()
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
    finally:
        restore()
    return 0


__all__ = ["EXIT_BAD_INPUT", "Progress", "cli", "main"]
