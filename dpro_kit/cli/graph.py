"""``dpro graph``: export the global data-flow graph that ``dpro replay`` replays (JSON or GraphML)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from ._common import Progress, echo_json, open_session, output_options, session_options

EPILOG = """\b
Examples:
  dpro graph trace -o dfg.json        node-link JSON (networkx.node_link_data)
  dpro graph trace -o dfg.graphml     GraphML (Gephi, yEd, networkx.read_graphml)
  dpro replay dfg.json                replays it: the same prediction as `dpro replay trace`
"""


@click.command(short_help="Export the global data-flow graph (JSON or GraphML).", epilog=EPILOG)
@click.argument("trace_dir", type=click.Path(path_type=Path))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Output file: .json (node-link) or .graphml.")
@session_options(per_iteration_help="Op durations of the median profiled iteration (as `dpro replay`), or every "
                                    "op's mean duration.  Default: as `dpro replay`.")
@output_options("Print a JSON summary instead of text.")
def graph(trace_dir: Path, output: Path, no_align: bool, per_iteration: bool | None, as_json: bool,
          quiet: bool) -> None:
    """Build the global data-flow graph of a trace and save it (JSON or GraphML).

    The graph is the one `dpro replay TRACE_DIR` replays (same alignment and
    durations rule), so `dpro replay` of the file predicts the same time.
    """
    from ..graph import save_graph

    session = open_session(trace_dir, no_align=no_align, per_iteration=per_iteration,
                           progress=Progress(not (quiet or as_json)))
    g = session.graph
    save_graph(g, output)
    kinds = Counter(d["kind"] for _, d in g.nodes(data=True))
    summary = {"output": str(output), "ops": g.number_of_nodes(), "edges": g.number_of_edges(),
               "ops_by_kind": dict(sorted(kinds.items())),
               "devices": len({d["device"] for _, d in g.nodes(data=True) if d["device"]}),
               "durations": session.info.get("durations")}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"wrote {output}: {summary['ops']} ops, {summary['edges']} edges, {summary['devices']} devices "
                   f"({', '.join(f'{k} {v}' for k, v in summary['ops_by_kind'].items())})")


__all__ = ["graph"]
