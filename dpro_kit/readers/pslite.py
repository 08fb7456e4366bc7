"""Reader for ps-lite message timestamps (``patches/ps-lite``; raw format ``dpro-pslite``).

With ``DPRO_PSLITE_TRACE=<dir>`` the patched ps-lite writes, per worker and server process,
``<dir>/pslite-<role>-<node id>.<pid>.json``: a header (role, ps-lite node id, host, the run's
scheduler address, a CLOCK_REALTIME / CLOCK_MONOTONIC pair read together at start and at the
end) and one record per data message this node sent (``send``: ``Van::Send``), received
(``recv``: the whole message in, ``Van::Receiving``) or processed (``process``: the app's
handler, ``Customer::Receiving``)::

    ["send"|"recv"|"process", t0_ns, t1_ns, sender, recver, timestamp, request, push,
     key, nkeys, bytes, val_bytes]

``timestamp`` is ps-lite's request id: a response repeats its request's, so (worker, server,
timestamp) joins a request, its response and the four ends of both.  Times are CLOCK_MONOTONIC
(one clock for every process of a host); each file's start pair puts them on the epoch clock.

What becomes of it (docs/ps.md, "ps-lite message timestamps"):

* a folder of such files (or of per-host sub-folders holding them) is a trace directory: the
  manifest is built in memory (:func:`discover`), node ``<host>/worker<rank>`` /
  ``<host>/server<rank>``, ``extra.link_model = "interface"`` (a ps-lite job is a star);
* each request's first key is a tensor ``key<K>`` (ps-lite slices a request per server; each
  slice is its own tensor with one partition on that server). Iteration ``i`` of a key is its
  ``i``-th push by that worker; a pull belongs to the iteration of the worker's latest push of
  the key. Iterations where any worker lacks any key's push or pull are left out (e.g. the
  benchmark's initial push-only round);
* push request: ``SEND`` on the worker (``Van::Send`` span), ``RECV`` on the server; pull
  response: ``SEND`` on the server, ``RECV`` on the worker; transaction ids
  ``topology.txn_id(key<K>, push, 0, 0, worker, server)`` / ``(key<K>, pull, 1, 0, server,
  worker)``, the graph builder's. A RECV starts at the previous arrival on the same link
  device (``topology.Links``), so once clipped by its SEND's start its duration is the link's
  service time ``arrival - max(sent, previous arrival)``, not the queueing before it (the
  replayer queues transfers on the link itself);
* the server's handler span of a push request is an ``AGG`` op (``phase`` ``update``);
  the scheme is ``ps`` (synchronous: one AGG per key after every worker's push) when every
  pull response left the server after all workers' pushes of that key and iteration had
  arrived, else ``ps_async`` (one update per worker, the benchmark's server answers at once);
* per worker and iteration one ``OTHER`` op ``app``: from the end of the previous iteration
  (its last response handled) to the first request sent (the program's own time between
  rounds); it feeds every key of the iteration.
"""
from __future__ import annotations

import functools
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import DproError, TraceFormatError
from ..schema import check_name
from ..trace import Manifest, NodeInfo, NodeTrace, OpKind, make_events, read_json

FORMAT = "dpro-pslite"
VERSIONS = (1,)
COLUMNS = ["event", "t0_ns", "t1_ns", "sender", "recver", "timestamp", "request", "push", "key", "nkeys",
           "bytes", "val_bytes"]
EVENTS = ("send", "recv", "process")
GLOB = "pslite-*.json"
__all__ = ["COLUMNS", "FORMAT", "VERSIONS", "discover", "files", "read_file", "read_node", "transfers"]


def _id_rank(node_id: int) -> int:
    """ps-lite's ``Postoffice::IDtoRank``: servers have ids 8, 10, ..., workers 9, 11, ..."""
    return max((node_id - 8) // 2, 0)


def read_file(path: Path) -> dict[str, Any]:
    """One node's file, checked; ``records`` become tuples with times in epoch microseconds.

    Parameters
    ----------
    path : Path
        A ``pslite-<role>-<id>.<pid>.json`` file.

    Raises
    ------
    TraceFormatError
        Not JSON / truncated, another format or version, a missing header field, or a record
        that is not 12 values of the right kinds (one line: the file, the record, what to do).
    """
    try:
        doc = read_json(path, what="ps-lite trace file")
    except TraceFormatError as exc:   # the patch writes one record per line from line 3 on: say which one
        m = re.search(r"JSON at line (\d+)", exc.what)
        if m is None:
            raise
        line = int(m.group(1))
        raise TraceFormatError(exc.what, path=path, record=f"records[{line - 3}]" if line >= 3 else "header",
                               hint=exc.hint) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceFormatError(f"not a {FORMAT} file", path=path,
                               hint="files written by ps-lite built with patches/ps-lite (DPRO_PSLITE_TRACE)")
    if doc.get("version") not in VERSIONS:
        raise TraceFormatError(f"unsupported version {doc.get('version')!r}", path=path,
                               hint=f"this dpro reads versions {list(VERSIONS)}; rebuild ps-lite with this "
                                    "dpro-kit's patches/ps-lite")
    fix = "the file was not written by patches/ps-lite or was edited; re-collect"
    clock = doc.get("clock_start")
    if not isinstance(clock, dict):
        raise TraceFormatError("header field 'clock_start' missing or not an object", path=path,
                               record="clock_start", hint=fix)
    for obj, key, low, rec in ((doc, "node_id", 0, "node_id"), (doc, "num_workers", 1, "num_workers"),
                               (doc, "num_servers", 0, "num_servers"), (clock, "realtime_ns", 1, "clock_start.realtime_ns"),
                               (clock, "monotonic_ns", 0, "clock_start.monotonic_ns")):
        v = obj.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 2**63:
            raise TraceFormatError(f"header field {key!r} must be an integer >= {low}, got {v!r:.40}", path=path,
                                   record=rec, hint=fix)
    for key in ("role", "host", "run"):   # bounded: a 1 MB host hung the replay (fuzz cases 14774, 16953)
        check_name(doc.get(key), what=f"header field {key!r}", path=path, record=key, hint=fix)
    role, node_id, host, run = doc["role"], doc["node_id"], doc["host"], doc["run"]
    nw, ns = doc["num_workers"], doc["num_servers"]
    offset_ns = clock["realtime_ns"] - clock["monotonic_ns"]
    if role not in ("worker", "server"):
        raise TraceFormatError(f"role {role!r} is neither worker nor server", path=path, record="role")
    if doc.get("columns") != COLUMNS:
        raise TraceFormatError(f"unexpected columns {doc.get('columns')!r}", path=path, record="columns",
                               hint=f"expected {COLUMNS}")
    recs = doc.get("records")
    if not isinstance(recs, list):
        raise TraceFormatError("no records list", path=path, record="records")
    out = []
    for k, r in enumerate(recs):
        if (not isinstance(r, list) or len(r) != len(COLUMNS) or r[0] not in EVENTS
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**62 for x in r[1:])):
            raise TraceFormatError(f"record {k} is not [event, 11 integers >= 0] with event one of {list(EVENTS)}",
                                   path=path, record=f"records[{k}]", hint="re-collect this node")
        if r[2] < r[1]:
            raise TraceFormatError(f"record {k} ends before it starts", path=path, record=f"records[{k}]")
        out.append((r[0], (r[1] + offset_ns) / 1e3, (r[2] + offset_ns) / 1e3, *r[3:]))
    return {"path": path, "role": role, "id": node_id, "rank": _id_rank(node_id), "host": host, "run": run,
            "num_workers": nw, "num_servers": ns, "records": out,
            "node": f"{host}/{role}{_id_rank(node_id)}"}


def files(trace_dir: Path) -> list[Path]:
    """The ps-lite files of a trace directory (in it or one folder down, e.g. one per host)."""
    trace_dir = Path(trace_dir)
    return sorted([*trace_dir.glob(GLOB), *trace_dir.glob("*/" + GLOB)])


def _stamp(paths: list[Path]) -> tuple:
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)


@functools.lru_cache(maxsize=8)
def _load(stamp: tuple) -> dict[str, Any]:
    """Every file of one job, checked for being one complete run: {node: file doc}."""
    docs = [read_file(Path(p)) for p, _, _ in stamp]
    runs = sorted({d["run"] for d in docs})
    if len(runs) > 1:
        raise DproError(f"ps-lite files of {len(runs)} runs ({', '.join(runs)}) in one folder",
                        path=Path(stamp[0][0]).parent, hint="keep one job's pslite-*.json files per folder")
    by_node: dict[str, dict[str, Any]] = {}
    for d in docs:
        if d["node"] in by_node:
            raise DproError(f"two files for {d['role']} id {d['id']} on {d['host']}", path=d["path"],
                            record=str(by_node[d["node"]]["path"].name),
                            hint="keep one job's pslite-*.json files per folder")
        by_node[d["node"]] = d
    d0 = docs[0]
    for role, want in (("worker", d0["num_workers"]), ("server", d0["num_servers"])):
        have = sum(1 for d in docs if d["role"] == role)
        if have != want:
            raise DproError(f"{have} {role} files for a job of {want} {role}s (DMLC_NUM_{role.upper()})",
                            path=Path(stamp[0][0]).parent,
                            hint="a process did not reach Finalize (it writes its file there), or its "
                                 "host's folder was not copied here")
    return by_node


def _job_files(trace_dir: Path) -> dict[str, Any]:
    paths = files(trace_dir)
    if not paths:
        raise DproError("no pslite-*.json file", path=trace_dir, hint="run ps-lite with DPRO_PSLITE_TRACE=<dir>")
    return _load(_stamp(paths))


def discover(trace_dir: Path) -> Manifest | None:
    """The manifest of a folder of ps-lite files (None when it holds none), built in memory."""
    if not files(trace_dir):
        return None
    by_node = _job_files(trace_dir)
    job = transfers(trace_dir)
    nodes = {}
    for name, d in by_node.items():
        rel = d["path"].parent.relative_to(Path(trace_dir))
        nodes[name] = NodeInfo(host=d["host"], role=d["role"], rank=d["rank"], dir=str(rel) or ".",
                               format=FORMAT, file=d["path"].name)
    d0 = next(iter(by_node.values()))
    return Manifest(job=f"ps-lite {d0['run']}", framework="ps-lite", comm_backend="ps-lite",
                    world_size=d0["num_workers"], nodes=nodes, iterations=job["iterations"],
                    raw_format=FORMAT, extra={"link_model": "interface", "collector": "patches/ps-lite",
                                              "run_id": d0["run"]})


def _root(manifest: Manifest, node: str, node_dir: Path) -> Path:
    root = Path(node_dir)
    for _ in Path(manifest.node_dir(node)).parts:
        if _ != ".":
            root = root.parent
    return root


def _check_request_ends(by_node: dict[str, dict[str, Any]], req: dict[tuple[int, int, int], dict[str, Any]],
                        ends: dict[tuple[int, int, int], dict[str, tuple]], wname: dict[int, str],
                        sname: dict[int, str]) -> None:
    """Refuse a pair of files where one end of a request is missing (a deleted record), naming the file.

    * A request the server received that its worker's file does not have: a missing pull request
      dropped its iteration from the replayed ones without a word (fuzz case 34300: +9.46 %); a
      missing push request would shift the iteration count of the key's later pushes.
    * The mirror: a request the worker sent that its server's file does not have. ps-lite numbers a
      customer's requests, so inside the span of request timestamps the server recorded from that
      worker a gap is a deleted record (no clocks are compared); a server that recorded none of a
      worker's requests lost its records (fuzz case 74696: a server's records emptied replayed as 0.0 ms).
    """
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)   # (worker, server) -> request ts received
    for (w, s, ts), e in ends.items():
        if "server_recv_req" not in e:
            continue
        seen[(w, s)].append(ts)
        if s in sname and w in wname and (w, s, ts) not in req:
            raise TraceFormatError(f"server node id {s} received a request (timestamp {ts}) from node id {w} that "
                                   "this file does not record: a record is missing", path=by_node[wname[w]]["path"],
                                   hint="copy the worker's file again from the job's trace folder")
    sent: dict[tuple[int, int], list[int]] = defaultdict(list)
    for (w, s, ts) in req:
        sent[(w, s)].append(ts)
    for (w, s), tss in sorted(sent.items()):
        got = seen.get((w, s))
        path = by_node[sname[s]]["path"]
        if not got:
            raise TraceFormatError(f"server node id {s} recorded none of the {len(tss)} requests node id {w} sent "
                                   "to it", path=path, record="records",
                                   hint="copy the server's file again from the job's trace folder")
        lo, hi = min(got), max(got)
        gone = [ts for ts in tss if lo <= ts <= hi and "server_recv_req" not in ends[(w, s, ts)]]
        if gone:
            raise TraceFormatError(f"node id {w} sent a request (timestamp {gone[0]}) that this server's file does "
                                   f"not record ({len(gone)} such): a record is missing", path=path,
                                   hint="copy the server's file again from the job's trace folder")


@functools.lru_cache(maxsize=8)
def _transfers(stamp: tuple) -> dict[str, Any]:
    from ..graph.topology import Links, txn_id

    by_node = _load(stamp)
    name = {(d["role"], d["id"]): n for n, d in by_node.items()}
    wname = {d["id"]: n for n, d in by_node.items() if d["role"] == "worker"}
    sname = {d["id"]: n for n, d in by_node.items() if d["role"] == "server"}
    # requests as the worker sent them: (worker, server, ts) -> facts; iteration per key = push count
    req: dict[tuple[int, int, int], dict[str, Any]] = {}
    for n, d in by_node.items():
        if d["role"] != "worker":
            continue
        pushes: dict[int, int] = defaultdict(int)
        for r in sorted((r for r in d["records"] if r[0] == "send" and r[6]), key=lambda r: r[1]):
            ev, t0, t1, snd, rcv, ts, _, push, key, nkeys, nbytes, vbytes = r
            if snd != d["id"]:
                raise TraceFormatError(f"a request sent by node id {snd} in the file of node id {d['id']}"[:300],
                                       path=d["path"], record=f"send at {t0}",
                                       hint="the file's node_id or its records were edited; copy the worker's file "
                                            "again from the job's trace folder")
            if rcv not in sname:
                continue
            it = pushes[key] if push else pushes[key] - 1
            if push:
                pushes[key] += 1
            if (snd, rcv, ts) in req:
                raise TraceFormatError(f"two requests to server id {rcv} with timestamp {ts}", path=d["path"],
                                       hint="ps-lite numbers requests per customer; a worker with several "
                                            "KVWorkers (customers) is not supported by this reader")
            req[(snd, rcv, ts)] = {"push": bool(push), "key": key, "it": it, "t0": t0, "t1": t1,
                                   "bytes": nbytes, "val_bytes": vbytes}
    # the other three ends of each exchange, and the handlers
    ends: dict[tuple[int, int, int], dict[str, tuple]] = defaultdict(dict)
    for n, d in by_node.items():
        for r in d["records"]:
            ev, snd, rcv, ts, request = r[0], r[3], r[4], r[5], r[6]
            w, s = (snd, rcv) if request else (rcv, snd)
            where = "worker" if d["role"] == "worker" else "server"
            own = w if where == "worker" else s
            if own != d["id"]:   # fuzz case 13100: a server's node_id edited replayed as 0 ms
                raise TraceFormatError(f"a {ev} record of node id {own} in the file of node id {d['id']}"[:300],
                                       path=d["path"], record=f"{ev} at {r[1]}",
                                       hint="the file's node_id or its records were edited; copy the node's file "
                                            "again from the job's trace folder")
            ends[(w, s, ts)][f"{where}_{ev}_{'req' if request else 'res'}"] = r
    _check_request_ends(by_node, req, ends, wname, sname)
    # transfers of the DFG: push requests and pull responses
    xfers = []
    for (w, s, ts), q in req.items():
        e = ends[(w, s, ts)]
        if q["it"] < 0:
            continue
        tensor = f"key{q['key']}"
        wn, sn = wname[w], sname[s]
        if q["push"] and "server_recv_req" in e:
            rr = e["server_recv_req"]
            xfers.append({"tensor": tensor, "it": q["it"], "phase": "push", "src": wn, "dst": sn,
                          "s0": q["t0"], "s1": q["t1"], "arr": rr[1], "bytes": rr[10], "val_bytes": rr[11],
                          "txn": txn_id(tensor, "push", 0, 0, wn, sn), "proc": e.get("server_process_req"),
                          "worker": wn})
        elif not q["push"] and "server_send_res" in e and "worker_recv_res" in e:
            sr, wr = e["server_send_res"], e["worker_recv_res"]
            xfers.append({"tensor": tensor, "it": q["it"], "phase": "pull", "src": sn, "dst": wn,
                          "s0": sr[1], "s1": sr[2], "arr": wr[1], "bytes": wr[10], "val_bytes": wr[11],
                          "txn": txn_id(tensor, "pull", 1, 0, sn, wn), "proc": None, "worker": wn})
    # keep the (tensor, iteration)s every worker pushed and pulled; then iterations complete in every tensor
    have: dict[tuple[str, int], set] = defaultdict(set)
    for x in xfers:
        have[(x["tensor"], x["it"])].add((x["worker"], x["phase"]))
    full = {k for k, v in have.items() if len(v) == 2 * len(wname)}
    tensors = sorted({t for t, _ in full}, key=lambda t: int(t[3:]))
    its = sorted({i for _, i in full})
    its = [i for i in its if all((t, i) in full for t in tensors)]
    keep = set(its)
    xfers = [x for x in xfers if x["it"] in keep and x["tensor"] in tensors]
    # RECV start: the previous arrival on the transfer's link device (module docstring)
    hosts = {n: d["host"] for n, d in by_node.items()}
    man = Manifest(job="", framework="", comm_backend="", world_size=len(wname),
                   nodes={n: NodeInfo(host=hosts[n], role=d["role"], rank=d["rank"]) for n, d in by_node.items()},
                   iterations=its, extra={"link_model": "interface"})
    links = Links(man)
    last: dict[str, float] = {}
    for x in sorted(xfers, key=lambda x: x["arr"]):
        dev = links.device(x["src"], x["dst"])
        x["posted"] = min(last.get(dev, x["s0"]), x["arr"])
        last[dev] = x["arr"]
    # synchronous server? every pull response sent after all workers' pushes of its key and iteration arrived
    last_push: dict[tuple[str, int], float] = {}
    for x in xfers:
        if x["phase"] == "push":
            k = (x["tensor"], x["it"])
            last_push[k] = max(last_push.get(k, float("-inf")), x["arr"])
    sync = all(x["s0"] >= last_push[(x["tensor"], x["it"])] for x in xfers if x["phase"] == "pull")
    # per worker iteration bounds: first request sent .. last response handled
    bounds: dict[tuple[str, int], list[float]] = {}
    for (w, s, ts), q in req.items():
        proc = ends[(w, s, ts)].get("worker_process_res")
        if proc is None:
            continue
        b = bounds.setdefault((wname[w], q["it"]), [q["t0"], proc[2]])
        b[0], b[1] = min(b[0], q["t0"]), max(b[1], proc[2])
    return {"xfers": xfers, "iterations": its, "tensors": tensors, "sync": sync, "bounds": bounds,
            "servers": sorted(sname.values(), key=lambda n: by_node[n]["rank"]), "by_node": by_node}


def transfers(trace_dir: Path) -> dict[str, Any]:
    """The job's transfers as the reader pairs them (also what tests and docs check).

    Returns
    -------
    dict
        ``xfers``: one dict per push request / pull response kept (``tensor``, ``it``, ``phase``,
        ``src``, ``dst``, ``s0``/``s1`` (send call, us), ``arr`` (arrival, us), ``posted``,
        ``bytes``, ``val_bytes``, ``txn``); ``iterations``; ``tensors``; ``sync``.
    """
    _job_files(trace_dir)
    return _transfers(_stamp(files(trace_dir)))


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One node's :class:`~dpro_kit.trace.NodeTrace` from the job's ps-lite files (module docstring)."""
    job = transfers(_root(manifest, node, node_dir))
    if node not in job["by_node"]:
        raise TraceFormatError(f"node {node!r} has no ps-lite file", path=node_dir)
    role = job["by_node"][node]["role"]
    sync = job["sync"]
    rows: list[dict[str, Any]] = []
    for x in job["xfers"]:
        common = {"iteration": x["it"], "stream": "comm", "tensor": x["tensor"], "phase": x["phase"],
                  "step": 0 if x["phase"] == "push" else 1, "chunk": 0, "txn": x["txn"], "bytes": x["bytes"]}
        if x["src"] == node:
            rows.append({**common, "kind": OpKind.SEND.value, "op": f"SEND {x['txn']}",
                         "name": f"SEND {x['tensor']}", "start": x["s0"], "dur": x["s1"] - x["s0"],
                         "peer": x["dst"]})
        if x["dst"] == node:
            rows.append({**common, "kind": OpKind.RECV.value, "op": f"RECV {x['txn']}",
                         "name": f"RECV {x['tensor']}", "start": x["posted"], "dur": x["arr"] - x["posted"],
                         "peer": x["src"]})
        if x["dst"] == node and x["phase"] == "push" and x["proc"] is not None:
            op = f"AGG {x['tensor']} p0" + ("" if sync else f" {x['src']}")
            rows.append({"op": op, "name": f"AGG {x['tensor']}", "kind": OpKind.AGG.value, "iteration": x["it"],
                         "start": x["proc"][1], "dur": x["proc"][2] - x["proc"][1], "tensor": x["tensor"],
                         "bytes": x["bytes"], "phase": "aggregate" if sync else "update", "chunk": 0,
                         "peer": x["src"]})
    if sync:   # one AGG per key and iteration: the handler of the push that arrived last
        best: dict[tuple[str, int], dict] = {}
        for r in rows:
            if r["kind"] == OpKind.AGG.value:
                k = (r["op"], r["iteration"])
                if k not in best or r["start"] > best[k]["start"]:
                    best[k] = r
        rows = [r for r in rows if r["kind"] != OpKind.AGG.value] + list(best.values())
    colls: list[dict[str, Any]] = []
    edges: list[tuple[str, str]] = []
    if role == "worker":
        for i in job["iterations"]:
            b = job["bounds"].get((node, i))
            prev = job["bounds"].get((node, i - 1))
            if b is None:
                continue
            start = prev[1] if prev is not None else b[0]
            rows.append({"op": "app", "name": "app (between rounds)", "kind": OpKind.OTHER.value,
                         "iteration": i, "start": start, "dur": max(0.0, b[0] - start)})
        nbytes = {x["tensor"]: x["bytes"] for x in job["xfers"] if x["phase"] == "push" and x["src"] == node}
        server_of = {x["tensor"]: x["dst"] for x in job["xfers"] if x["phase"] == "push" and x["src"] == node}
        for t in job["tensors"]:
            colls.append({"tensor": t, "op": "push_pull" if sync else "push_pull_async",
                          "algorithm": "ps" if sync else "ps_async", "bytes": int(nbytes[t]),
                          "inputs": ["app"], "outputs": [], "params": [t],
                          "partitions": [{"bytes": int(nbytes[t]), "server": server_of[t]}]})
    path = str(node_dir / (manifest.nodes[node].file or ""))
    return NodeTrace(events=make_events(rows, path=path), edges=edges, collectives=colls)
