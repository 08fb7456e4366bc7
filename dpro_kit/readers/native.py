"""Reader for dpro's native per-node files: ``events.json``, ``dag.json``, ``comm.json``.

This is the format :func:`dpro_kit.trace.save_trace` writes and the format a
collector without a framework-specific reader emits.  See docs/trace-format.md.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import TraceFormatError
from ..trace import FORMAT_VERSION, MEMORY_COLUMNS, Manifest, NodeTrace, make_events, read_json

SUPPORTED = (FORMAT_VERSION,)


def _check_header(doc: object, path: Path, key: str) -> list:
    if not isinstance(doc, dict):
        raise TraceFormatError("expected a JSON object", path=path)
    if doc.get("version") not in SUPPORTED:
        raise TraceFormatError(f"unsupported file version {doc.get('version')!r}", path=path,
                               hint=f"this dpro reads versions {list(SUPPORTED)}")
    items = doc.get(key)
    if not isinstance(items, list):
        raise TraceFormatError(f"'{key}' must be a list", path=path)
    return items


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    ev_path = node_dir / "events.json"
    records = _check_header(read_json(ev_path, what="event file"), ev_path, "events")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TraceFormatError("event must be a JSON object", path=ev_path, record=f"events[{i}]")
    events = make_events(records, path=str(ev_path))

    dag_path = node_dir / "dag.json"
    edges = []
    if dag_path.exists():
        for i, e in enumerate(_check_header(read_json(dag_path, what="dependency file"), dag_path, "edges")):
            if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)):
                raise TraceFormatError("edge must be [from_op, to_op]", path=dag_path, record=f"edges[{i}]")
            edges.append((e[0], e[1]))

    comm_path = node_dir / "comm.json"
    colls = []
    if comm_path.exists():
        for i, c in enumerate(_check_header(read_json(comm_path, what="communication file"),
                                            comm_path, "collectives")):
            if not isinstance(c, dict):
                raise TraceFormatError("collective must be a JSON object", path=comm_path,
                                       record=f"collectives[{i}]")
            colls.append(c)
    memory = None
    mem_path = node_dir / "memory.json"
    if mem_path.exists():
        doc = read_json(mem_path, what="memory file")
        rows = _check_header(doc, mem_path, "rows")
        cols = doc.get("columns")
        if cols != [c for c in MEMORY_COLUMNS if c != "node"]:
            raise TraceFormatError(f"unexpected memory columns {cols!r}", path=mem_path)
        try:
            memory = pd.DataFrame(rows, columns=cols).astype({c: MEMORY_COLUMNS[c] for c in cols})
        except (ValueError, TypeError) as exc:
            raise TraceFormatError(f"bad memory rows: {exc}", path=mem_path) from None
    return NodeTrace(events=events, edges=edges, collectives=colls, memory=memory)


__all__ = ["SUPPORTED", "read_node"]
