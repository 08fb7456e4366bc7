"""Reader for the NCCL profiler plugin's files (``collectors/nccl``; raw format ``dpro-nccl``).

With ``NCCL_PROFILER_PLUGIN=libnccl-profiler-dpro.so DPRO_NCCL_TRACE=<dir>`` every rank writes,
per communicator, ``<dir>/nccl-<commId>-r<rank>.<pid>.jsonl``: a header line (format, version, API,
communicator id, rank, nranks, host, a CLOCK_REALTIME / CLOCK_MONOTONIC pair read together), one
line per event and an end line (event count, events dropped).  Events (docs/nccl.md):

* ``coll``: a collective as enqueued (``seq``, ``func``, ``count``, ``datatype``, ``algo``,
  ``proto``, ``nchannels``; ``t0``/``t1`` bracket the enqueue, not the execution);
* ``op``: one proxy operation per channel, peer and direction (``channel``, ``peer``, ``send``,
  ``nsteps``, ``parent`` = its collective's id), ``t0`` appended, ``t1`` all steps done;
* ``step``: one network transfer of an op (``step`` number, ``parent`` = the op's id) with its
  state transitions ``[state, t_ns, size]``: send 8 (buffer posted to the GPU), 20 (data ready),
  9 (isend posted; size = bytes sent), stop = isend completed; recv 10 (irecv posted), 11 (data
  arrived; size = bytes received), 12 (flushed, handed to the GPU), stop = the GPU consumed it.

What becomes of it: each ring all-reduce (``algo`` Ring, ``func`` AllReduce) is, per channel and
per loop of NCCL's ring (``nchannels * nranks * chunk`` bytes each), one ring pass of 2(N-1) steps:
tensor ``<func>.c<channel>.l<loop>``, iteration = the collective's ``seq``.  A ring step is one
network transfer per slice (2 slices per chunk with the Simple protocol, NCCL's
``ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS``; 1 with LL / LL128).  Per rank, ring pass and step:

* ``SEND`` on the sender: first slice's isend posted (state 9) to the last slice's completion
  (stop); bytes = the sizes recorded with state 9;
* ``RECV`` on the receiver: first slice's irecv posted (state 10) to the last slice's arrival
  (state 11); bytes = the sizes recorded with state 11 (checked equal to the sender's);
* ``txn`` = :func:`dpro_kit.graph.topology.txn_id` ``(tensor, phase, step, chunk, src, dst)``
  with the chunk the ring DFG (:func:`dpro_kit.graph.topology.ring_allreduce`) gives ring
  position ``i`` at that step, ``i`` being the rank's place in the channel's ring (followed
  from the send peers).  When that ring is the rank order, these are exactly the DFG's ids.

Each tree all-reduce (``algo`` Tree) is, per channel and chunk (proxy step), one collective of
the tree DFG (:func:`dpro_kit.graph.topology.tree_allreduce`): tensor ``<func>.c<channel>.l<chunk>``,
per tree edge a ``reduce`` SEND/RECV child -> parent and a ``broadcast`` one parent -> child, the
parent and children of a rank read from the start order of its proxy ops (NCCL's
``ncclProxySaveOp``: recv from each child, send to the parent, send to each child, recv from the
parent); the collective's participants are the tree's labelling as NCCL's binary tree, which
:func:`finish` puts into the loaded collectives (docs/nccl.md, "Tree all-reduce").

Times are moved from CLOCK_MONOTONIC onto the epoch clock with each file's clock pair (µs).
"""
from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import DproError, TraceFormatError
from ..schema import check_name
from ..trace import EVENT_COLUMNS, Manifest, NodeInfo, NodeTrace, make_events

FORMAT = "dpro-nccl"
VERSIONS = (1,)
GLOB = "nccl-*.jsonl"
ST_SEND_POSTED, ST_SEND_WAIT, ST_RECV_WAIT, ST_RECV_ARRIVED = 8, 9, 10, 11
#: network transfers (slices) per ring chunk: NCCL's ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS
SLICES_PER_CHUNK = {"Simple": 2, "LL": 1, "LL128": 1}
#: NCCL's own spellings (``ncclAlgoStr`` / ``ncclProtoStr``: "RING", "TREE", "SIMPLE", as NCCL 2.28.9
#: passes them to the plugin on a real GPU) -> the names used here; matched case-insensitively
_CANONICAL = {"ring": "Ring", "tree": "Tree", "simple": "Simple", "ll": "LL", "ll128": "LL128"}
__all__ = ["FORMAT", "VERSIONS", "discover", "files", "finish", "read_file", "read_node", "ring_transfers",
           "SLICES_PER_CHUNK", "transfers"]

_FIX = "the file was not written by collectors/nccl's plugin or was edited; re-collect"


def _int(obj: dict, key: str, path: Path, record: str, low: int = 0, *, null: bool = False) -> int | None:
    v = obj.get(key)
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 2**63:
        raise TraceFormatError(f"field {key!r} must be an integer >= {low}, got {v!r:.40}", path=path,
                               record=record, hint=_FIX)
    return v


def _str(obj: dict, key: str, path: Path, record: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str):
        raise TraceFormatError(f"field {key!r} must be a string, got {v!r:.40}", path=path, record=record, hint=_FIX)
    return v


def read_file(path: Path) -> dict[str, Any]:
    """One rank's file, checked; times become epoch microseconds.

    Parameters
    ----------
    path : Path
        A ``nccl-<commId>-r<rank>.<pid>.jsonl`` file written by the plugin.

    Returns
    -------
    dict
        ``path``, ``comm``, ``rank``, ``nranks``, ``host``, ``api``, ``dropped`` and the events by
        id: ``colls``, ``ops``, ``steps`` (dicts as in the file, ``t0``/``t1`` and state times in
        µs on the epoch clock).

    Raises
    ------
    TraceFormatError
        Unreadable, not JSON lines (names the line), another format or version, a field missing
        or of the wrong type, an event that never stopped, a parent that is not in the file, or a
        missing end line (the file was cut).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read NCCL plugin trace: {exc}", path=path) from None
    lines = text.splitlines()
    if not lines:
        raise TraceFormatError("NCCL plugin trace is empty", path=path, hint="re-collect")
    docs = []
    for k, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"line {k} is not JSON ({exc.msg})", path=path, record=f"line {k}",
                                   hint=_FIX) from None
        if not isinstance(d, dict):
            raise TraceFormatError(f"line {k} is not a JSON object", path=path, record=f"line {k}", hint=_FIX)
        docs.append(d)
    head = docs[0]
    if head.get("format") != FORMAT:
        raise TraceFormatError(f"not a {FORMAT} file", path=path, record="line 1",
                               hint="pass files written by collectors/nccl's plugin (DPRO_NCCL_TRACE)")
    if head.get("version") not in VERSIONS:
        raise TraceFormatError(f"unsupported version {head.get('version')!r}", path=path, record="line 1",
                               hint=f"this dpro reads versions {list(VERSIONS)}; rebuild the plugin from this dpro-kit")
    clock = head.get("clock")
    if not isinstance(clock, dict):
        raise TraceFormatError("header field 'clock' missing or not an object", path=path, record="line 1", hint=_FIX)
    rank = _int(head, "rank", path, "line 1")
    nranks = _int(head, "nranks", path, "line 1", 1)
    if rank >= nranks:
        raise TraceFormatError(f"rank {rank} >= nranks {nranks}", path=path, record="line 1", hint=_FIX)
    offset_ns = _int(clock, "realtime_ns", path, "line 1 clock", 1) - _int(clock, "monotonic_ns", path, "line 1 clock")
    end = docs[-1]
    if len(docs) < 2 or end.get("end") is not True:
        raise TraceFormatError("no end line: the file was cut", path=path, record=f"line {len(docs)}",
                               hint="the plugin writes it last (temp file + rename); re-collect")
    if end.get("events") != len(docs) - 2:
        raise TraceFormatError(f"end line says {end.get('events')!r} events, the file has {len(docs) - 2}", path=path,
                               record=f"line {len(docs)}", hint=_FIX)

    def us(t: int) -> float:
        return (t + offset_ns) / 1e3

    host = _str(head, "host", path, "line 1") or "localhost"
    # bounded: the host names the node of every event (a 1 MB one took 110 s and 11 GB to replay)
    check_name(host, what="field 'host'", path=path, record="line 1.host", hint=_FIX)
    out: dict[str, Any] = {"path": path, "comm": _str(head, "comm", path, "line 1"), "rank": rank,
                           "nranks": nranks, "host": host,
                           "api": head.get("api"), "dropped": _int(end, "dropped", path, f"line {len(docs)}"),
                           "colls": {}, "ops": {}, "steps": {}}
    kinds = {"coll": "colls", "op": "ops", "step": "steps"}
    for k, d in enumerate(docs[1:-1], 2):
        rec = f"line {k}"
        ev = d.get("ev")
        if not isinstance(ev, str) or ev not in kinds:
            raise TraceFormatError(f"unknown event kind {ev!r:.40}", path=path, record=rec, hint=_FIX)
        eid = _int(d, "id", path, rec)
        t0 = _int(d, "t0", path, rec)
        t1 = _int(d, "t1", path, rec, null=True)
        if t1 is None:
            raise TraceFormatError(f"{ev} event {eid} never stopped", path=path, record=rec,
                                   hint="the communicator was destroyed mid-operation; profile complete collectives")
        if t1 < t0:
            raise TraceFormatError(f"{ev} event {eid} stops before it starts", path=path, record=rec, hint=_FIX)
        states = d.get("states")
        if not isinstance(states, list) or not all(
                isinstance(s, list) and len(s) == 3 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                            for x in s) for s in states):
            raise TraceFormatError("field 'states' must be a list of [state, time_ns, size] integers", path=path,
                                   record=rec, hint=_FIX)
        e = dict(d, t0=us(t0), t1=us(t1), states=[(s, us(t), z) for s, t, z in states], line=k)
        if ev == "coll":
            _int(d, "seq", path, rec)
            _int(d, "nchannels", path, rec)
            for key in ("func", "algo", "proto"):
                _str(d, key, path, rec)
            for key in ("algo", "proto"):
                e[key] = _CANONICAL.get(d[key].lower(), d[key])
        elif ev == "op":
            for key in ("channel", "peer", "nsteps", "send"):
                _int(d, key, path, rec)
            if d["peer"] >= nranks:
                raise TraceFormatError(f"peer {d['peer']} >= nranks {nranks}", path=path, record=rec, hint=_FIX)
        else:
            _int(d, "step", path, rec)
        want = {"op": "colls", "step": "ops"}.get(ev)
        parent = d.get("parent") if want is None else _int(d, "parent", path, rec, -1)
        if want is not None and parent not in out[want] and parent != -1:
            raise TraceFormatError(f"{ev} event {eid}: parent {parent!r:.40} is not an earlier "
                                   f"{want[:-1]} event of the file", path=path, record=rec, hint=_FIX)
        if eid in out[kinds[ev]]:
            raise TraceFormatError(f"two events with id {eid}", path=path, record=rec, hint=_FIX)
        out[kinds[ev]][eid] = e
    _check_nesting(out, path)
    return out


def _check_nesting(out: dict[str, Any], path: Path) -> None:
    """Refuse times that cannot come from one run of the plugin: a state outside its event or
    before the previous state, a step outside its proxy op, an op that starts before its
    collective, the steps of one op starting out of step order.  Every such time is one
    ``CLOCK_MONOTONIC`` reading, taken in that order by the plugin; the 16 files of the four real
    seeds (examples/traces/nccl-h100-*, ddp-h100-2rank-nccl-*: 12,324 steps, 2,036 ops) hold all of
    it exactly (docs/reliability.md, "NCCL plugin files"), so the tolerance is none."""
    def bad(e: dict[str, Any], what: str) -> TraceFormatError:
        return TraceFormatError(f"{e['ev']} event {e['id']}: {what}", path=path, record=f"line {e['line']}",
                                hint="a time was changed or swapped; the file is damaged, re-collect")
    for kind in ("colls", "ops", "steps"):
        for e in out[kind].values():
            ts = [t for _, t, _ in e["states"]]
            if ts and (ts[0] < e["t0"] or ts[-1] > e["t1"] or any(b < a for a, b in zip(ts, ts[1:]))):
                raise bad(e, f"its state times are not in order within its span {e['t0']:.3f}..{e['t1']:.3f} us")
    for e in out["ops"].values():
        c = out["colls"].get(e.get("parent"))
        if c is not None and e["t0"] < c["t0"]:
            raise bad(e, f"starts {c['t0'] - e['t0']:.3f} us before its collective (line {c['line']})")
    last: dict[Any, dict[str, Any]] = {}
    for e in sorted(out["steps"].values(), key=lambda e: (str(e.get("parent")), e["step"], e["line"])):
        op = out["ops"].get(e.get("parent"))
        if op is not None and (e["t0"] < op["t0"] or e["t1"] > op["t1"]):
            raise bad(e, f"spans {e['t0']:.3f}..{e['t1']:.3f} us, outside its op {op['t0']:.3f}..{op['t1']:.3f} "
                         f"(line {op['line']})")
        prev = last.get(e.get("parent"))
        if prev is not None and e["t0"] < prev["t0"]:
            raise bad(e, f"step {e['step']} starts before step {prev['step']} of the same op (line {prev['line']})")
        last[e.get("parent")] = e


def files(trace_dir: Path) -> list[Path]:
    """The plugin's files in a directory (in it or one folder down, e.g. one per host)."""
    trace_dir = Path(trace_dir)
    return sorted([*trace_dir.glob(GLOB), *trace_dir.glob("*/" + GLOB)])


def _ring_of(sends: dict[int, int], nranks: int, where: Path) -> list[int]:
    """The ring order (starting at the lowest rank) from each rank's send peer on one channel."""
    ring, r = [], min(sends)
    while r not in ring:
        ring.append(r)
        r = sends.get(r, -1)
    if len(ring) != nranks or r != ring[0]:
        raise DproError(f"the send peers {dict(sorted(sends.items()))} do not form one ring of {nranks} ranks",
                        path=where, hint="a rank's file is missing or from another run; keep one job's files")
    return ring


def _dfg_chunk(n: int, pos: int, k: int) -> int:
    """The chunk ring position ``pos`` sends at ring step ``k`` (topology.ring_allreduce)."""
    return (pos - k) % n if k < n - 1 else (pos + 1 - (k - n + 1)) % n


def ring_transfers(paths: list[Path], *, node_of_rank: dict[int, str] | None = None) -> dict[str, Any]:
    """SEND/RECV events of every ring and tree all-reduce in one communicator's files (module docstring).

    Parameters
    ----------
    paths : list of Path
        One file per rank of one communicator (``files(dir)``).
    node_of_rank : dict, optional
        Node name per rank; default ``<host>/rank<r>``.

    Returns
    -------
    dict
        ``rows``: event-table rows (``node``, ``op``, ``name``, ``kind`` SEND/RECV, ``iteration``
        = collective ``seq``, ``start``/``dur`` µs, ``tensor``, ``bytes``, ``txn``, ``phase``,
        ``step``, ``chunk``, ``peer``, plus ``channel``, ``loop``, ``rank``); ``collectives``:
        per ring pass / tree chunk ``{tensor, bytes, algorithm, op, participants}`` (ring: plus
        ``ring``, its nodes in ring order; tree: ``participants`` in tree order);
        ``rank_order``: whether every channel's ring is the rank order (then the ``txn`` ids are
        the ring DFG's); ``tree_order``: whether every tree channel's tree is NCCL's binary tree (then
        the tree collectives' ids are the tree DFG's); ``skipped``: collectives that are neither
        ring nor tree all-reduces (func/algo, count);
        ``nranks``; ``nodes``.

    Raises
    ------
    DproError
        Files of several communicators, a rank missing or twice, collectives or proxy ops that
        differ between ranks, step counts that are not a ring all-reduce's, or a receiver that got
        other sizes than its ring predecessor sent (one line: the file, what, what to do).
    """
    from ..graph.topology import txn_id

    if not paths:
        raise DproError("no nccl-*.jsonl file", hint="run the job with DPRO_NCCL_TRACE=<dir> and the dpro NCCL plugin")
    docs = [read_file(p) for p in paths]
    comms = sorted({d["comm"] for d in docs})
    if len(comms) > 1:
        raise DproError(f"files of {len(comms)} communicators ({', '.join(comms)}) in one folder",
                        path=Path(paths[0]).parent,
                        hint="keep one communicator's nccl-<commId>-r*.jsonl files per folder")
    n = docs[0]["nranks"]
    by_rank: dict[int, dict[str, Any]] = {}
    for d in docs:
        if d["nranks"] != n:
            raise DproError(f"nranks {d['nranks']} but rank {docs[0]['rank']}'s file says {n}", path=d["path"],
                            hint="keep one job's files per folder")
        if d["rank"] in by_rank:
            raise DproError(f"two files for rank {d['rank']}", path=d["path"],
                            record=by_rank[d["rank"]]["path"].name, hint="keep one job's files per folder")
        by_rank[d["rank"]] = d
    missing = sorted(set(range(n)) - set(by_rank))
    if missing:
        raise DproError(f"no file for rank(s) {missing} of {n}", path=Path(paths[0]).parent,
                        hint="a rank did not destroy its communicator (the plugin writes at finalize), or its "
                             "host's folder was not copied here")
    node = node_of_rank or {r: f"{d['host']}/rank{r}" for r, d in by_rank.items()}
    # per rank: collective key (func, seq) -> {coll, ops by (channel, send, peer) -> (op, steps by number)}
    per: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
    for r, d in by_rank.items():
        colls: dict[tuple[str, int], dict[str, Any]] = {}
        for c in d["colls"].values():
            colls[(c["func"], c["seq"])] = {"coll": c, "ops": {}}
        cid = {c["id"]: (c["func"], c["seq"]) for c in d["colls"].values()}
        for op in d["ops"].values():
            if op["parent"] in cid:
                okey = (op["channel"], bool(op["send"]), op["peer"])
                if okey in colls[cid[op["parent"]]]["ops"]:
                    raise DproError(f"two {'send' if op['send'] else 'recv'} proxy ops with peer {op['peer']} on "
                                    f"channel {op['channel']} in one collective", path=d["path"],
                                    record=f"line {op['line']}", hint=_FIX)
                colls[cid[op["parent"]]]["ops"][okey] = [op, {}]
        opkey = {op["id"]: (cid[op["parent"]], (op["channel"], bool(op["send"]), op["peer"]))
                 for op in d["ops"].values() if op["parent"] in cid}
        for s in d["steps"].values():
            if s["parent"] in opkey:
                ck, ok = opkey[s["parent"]]
                colls[ck]["ops"][ok][1][s["step"]] = s
        per[r] = colls
    rows: list[dict[str, Any]] = []
    collectives: dict[str, dict[str, Any]] = {}
    skipped: dict[str, int] = defaultdict(int)
    rank_order = True
    tree_ok = True
    keys = sorted(set().union(*(set(c) for c in per.values())))
    for key in keys:
        func, seq = key
        have = [r for r in range(n) if key in per[r]]
        c0 = per[have[0]][key]["coll"]
        if len(have) != n:
            raise DproError(f"collective {func} #{seq} is in the files of ranks {have} only",
                            path=by_rank[have[0]]["path"], record=f"line {c0['line']}",
                            hint="keep one job's complete files per folder")
        if func == "AllReduce" and c0["algo"] == "Tree":
            tree_ok = _tree_rows(func, seq, n, per, key, by_rank, node, rows, collectives) and tree_ok
            continue
        if func != "AllReduce" or c0["algo"] != "Ring":
            skipped[f"{func}/{c0['algo']}"] += 1
            continue
        spc = SLICES_PER_CHUNK.get(c0["proto"])
        if spc is None:
            raise DproError(f"collective {func} #{seq}: unknown protocol {c0['proto']!r}",
                            path=by_rank[have[0]]["path"], record=f"line {c0['line']}",
                            hint=f"this reader knows {sorted(SLICES_PER_CHUNK)}")
        per_loop = 2 * (n - 1) * spc
        channels = sorted({ch for r in range(n) for ch, _, _ in per[r][key]["ops"]})
        for ch in channels:
            sends, recvs = {}, {}
            for r in range(n):
                ops = {}
                for (c, snd, _), v in per[r][key]["ops"].items():
                    if c == ch:
                        if (c, snd) in ops:
                            raise DproError(f"collective {func} #{seq}: rank {r} has two "
                                            f"{'send' if snd else 'recv'} proxy ops on channel {ch}, a ring one",
                                            path=by_rank[r]["path"], record=f"line {v[0]['line']}", hint=_FIX)
                        ops[(c, snd)] = v
                for is_send, into in ((True, sends), (False, recvs)):
                    if (ch, is_send) not in ops:
                        raise DproError(f"collective {func} #{seq}: rank {r} has no "
                                        f"{'send' if is_send else 'recv'} proxy op on channel {ch}",
                                        path=by_rank[r]["path"], hint="NCCL ran it without the network "
                                        "transport on this channel (P2P/SHM); profile with NCCL_P2P_DISABLE=1 "
                                        "NCCL_SHM_DISABLE=1, or keep one job's complete files")
                    into[r] = ops[(ch, is_send)]
            ring = _ring_of({r: op[0]["peer"] for r, op in sends.items()}, n, by_rank[0]["path"])
            rank_order = rank_order and ring == sorted(ring) and ring == list(range(n))
            pos = {r: i for i, r in enumerate(ring)}
            nsteps = sends[ring[0]][0]["nsteps"]
            for r in range(n):
                for op, steps in (sends[r], recvs[r]):
                    where = by_rank[r]["path"]
                    if op["nsteps"] != nsteps or nsteps % per_loop or sorted(steps) != list(range(nsteps)):
                        raise DproError(
                            f"collective {func} #{seq} channel {ch}: proxy op has {op['nsteps']} steps "
                            f"({len(steps)} recorded), rank {ring[0]}'s send op {nsteps}; a ring all-reduce of "
                            f"{n} ranks with {c0['proto']} moves a multiple of {per_loop}",
                            path=where, record=f"line {op['line']}",
                            hint="re-collect; if NCCL changed its ring chunking, this reader needs updating")
                    if not op["send"] and op["peer"] != ring[(pos[r] - 1) % n]:
                        raise DproError(f"rank {r} receives from {op['peer']} on channel {ch}, its ring predecessor "
                                        f"is {ring[(pos[r] - 1) % n]}", path=where, record=f"line {op['line']}",
                                        hint="keep one job's files per folder")
            for loop in range(nsteps // per_loop):
                tensor = f"{func}.c{ch}.l{loop}"
                pass_bytes = 0
                for k in range(2 * (n - 1)):
                    phase = "reduce_scatter" if k < n - 1 else "all_gather"
                    net = range(loop * per_loop + k * spc, loop * per_loop + (k + 1) * spc)
                    for r in ring:
                        i = pos[r]
                        dst = ring[(i + 1) % n]
                        ss = [sends[r][1][p] for p in net]
                        rs = [recvs[dst][1][p] for p in net]
                        sent = [_state(s, ST_SEND_WAIT, by_rank[r]["path"]) for s in ss]
                        got = [_state(s, ST_RECV_ARRIVED, by_rank[dst]["path"]) for s in rs]
                        if [z for _, z in sent] != [z for _, z in got]:
                            raise DproError(
                                f"collective {func} #{seq} channel {ch} ring step {k}: rank {r} sent "
                                f"{[z for _, z in sent]} bytes, rank {dst} received {[z for _, z in got]}",
                                path=by_rank[dst]["path"], record=f"line {rs[0]['line']}",
                                hint="the files are from different runs; keep one job's files per folder")
                        nbytes = sum(z for _, z in sent)
                        pass_bytes += nbytes
                        c = _dfg_chunk(n, i, k)
                        txn = txn_id(tensor, phase, k, c, node[r], node[dst])
                        common = {"iteration": int(seq), "stream": "comm", "tensor": tensor, "phase": phase,
                                  "step": k, "chunk": c, "txn": txn, "bytes": int(nbytes), "channel": ch,
                                  "loop": loop}
                        s0, s1 = sent[0][0], max(s["t1"] for s in ss)
                        rows.append({**common, "node": node[r], "rank": r, "kind": "SEND", "op": f"SEND {txn}",
                                     "name": f"SEND {tensor}", "start": s0, "dur": s1 - s0, "peer": node[dst]})
                        arrived = [_state(s, ST_RECV_ARRIVED, by_rank[dst]["path"])[0] for s in rs]
                        r0 = _state(rs[0], ST_RECV_WAIT, by_rank[dst]["path"])[0]
                        rows.append({**common, "node": node[dst], "rank": dst, "kind": "RECV", "op": f"RECV {txn}",
                                     "name": f"RECV {tensor}", "start": r0, "dur": max(arrived) - r0,
                                     "peer": node[r]})
                if tensor not in collectives:
                    collectives.setdefault(tensor, {"tensor": tensor, "bytes": pass_bytes // (2 * (n - 1)),
                                                    "algorithm": "ring", "op": "allreduce",
                                                    "ring": [node[r] for r in ring],
                                                    "participants": [node[r] for r in range(n)]})
    for row in rows:
        if not (math.isfinite(row["start"]) and row["dur"] >= 0):
            raise DproError(f"{row['op']}: negative duration {row['dur']:.3f} us", path=by_rank[row["rank"]]["path"],
                            hint=_FIX)
    return {"rows": rows, "collectives": list(collectives.values()), "rank_order": rank_order,
            "tree_order": tree_ok, "skipped": dict(skipped), "nranks": n, "nodes": [node[r] for r in range(n)]}


transfers = ring_transfers


def _tree_rows(func: str, seq: int, n: int, per: dict, key: tuple, by_rank: dict, node: dict, rows: list,
               collectives: dict) -> bool:
    """Append the SEND/RECV rows of one tree all-reduce (module docstring); whether every channel's
    tree is NCCL's binary tree (then the txn ids are the tree DFG's).

    Per rank and channel the proxy ops, in the order they were started (their ids), are NCCL's
    ``ncclProxySaveOp`` order for ``ncclPatternTreeUpDown``: recv from each child, send to the
    parent, send to each child, recv from the parent.  So the children are the peers of the recv
    ops before the first send op, the parent the peer of the recv op after it (none: the root).
    """
    from ..graph.topology import tree_order, txn_id

    hint_net = ("NCCL ran it without the network transport on this channel (P2P/SHM); profile with "
                "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, or keep one job's complete files")
    channels = sorted({ch for r in range(n) for ch, _, _ in per[r][key]["ops"]})
    shaped = True
    for ch in channels:
        parent: dict[int, int | None] = {}
        kids: dict[int, list[int]] = {}
        lanes: dict[int, dict[tuple[bool, int], list]] = {}
        for r in range(n):
            where = by_rank[r]["path"]
            mine = sorted(((k, v) for k, v in per[r][key]["ops"].items() if k[0] == ch), key=lambda kv: kv[1][0]["id"])
            first_send = next((i for i, ((_, snd, _), _) in enumerate(mine) if snd), None)
            if first_send is None:
                raise DproError(f"collective {func} #{seq} (Tree): rank {r} has no send proxy op on channel {ch}",
                                path=where, hint=hint_net)
            before = [peer for (_, snd, peer), _ in mine[:first_send] if not snd]
            after = [peer for (_, snd, peer), _ in mine[first_send:] if not snd]
            line = f"line {mine[first_send][1][0]['line']}"
            if len(after) > 1:
                raise DproError(f"collective {func} #{seq} channel {ch} (Tree): rank {r} receives from {after} after "
                                f"its first send; in NCCL's tree only the parent's recv op comes after the sends",
                                path=where, record=line, hint=_FIX)
            sends = sorted(peer for (_, snd, peer), _ in mine if snd)
            if sends != sorted(before + after):
                raise DproError(f"collective {func} #{seq} channel {ch} (Tree): rank {r} sends to {sends} but "
                                f"receives from {sorted(before + after)}; a tree rank sends to and receives from "
                                f"the same peers (children and parent)", path=where, record=line, hint=_FIX)
            parent[r] = after[0] if after else None
            kids[r] = before
            lanes[r] = {(snd, peer): v for (_, snd, peer), v in mine}
        roots = [r for r, p in parent.items() if p is None]
        if len(roots) != 1:
            raise DproError(f"collective {func} #{seq} channel {ch} (Tree): {len(roots)} ranks without a parent "
                            f"({roots}); a tree has one root", path=by_rank[roots[0] if roots else 0]["path"],
                            hint="a rank's file is from another run; keep one job's files per folder")
        for r, p in parent.items():
            if p is not None and r not in kids[p]:
                raise DproError(f"collective {func} #{seq} channel {ch} (Tree): rank {r} sends up to rank {p}, which "
                                f"does not receive from it before its own sends", path=by_rank[p]["path"],
                                hint="keep one job's files per folder")
        root = roots[0]
        nsteps = next(iter(lanes[root].values()))[0]["nsteps"]
        for r in range(n):
            for op, steps in lanes[r].values():
                if op["nsteps"] != nsteps or sorted(steps) != list(range(nsteps)):
                    raise DproError(f"collective {func} #{seq} channel {ch} (Tree): proxy op has {op['nsteps']} steps "
                                    f"({len(steps)} recorded), rank {root}'s {nsteps}; every op of a tree channel "
                                    f"moves the same chunks", path=by_rank[r]["path"], record=f"line {op['line']}",
                                    hint="re-collect; if NCCL changed its tree chunking, this reader needs updating")
        order = tree_order({node[r]: (node[p] if p is not None else None) for r, p in parent.items()},
                           {node[r]: by_rank[r]["host"] for r in range(n)})
        if order is None:       # not NCCL's tree over these hosts (e.g. another intra-node pattern)
            shaped = False
            order = [node[root]] + [node[r] for r in range(n) if r != root]
        edges = [(c, parent[c]) for c in range(n) if parent[c] is not None]
        for loop in range(nsteps):
            tensor = f"{func}.c{ch}.l{loop}"
            sizes = []
            for c, p in edges:
                for phase, step, src, dst in (("reduce", 0, c, p), ("broadcast", 1, p, c)):
                    ss, rs = lanes[src][(True, dst)][1][loop], lanes[dst][(False, src)][1][loop]
                    t_sent, z_sent = _state(ss, ST_SEND_WAIT, by_rank[src]["path"])
                    t_arr, z_got = _state(rs, ST_RECV_ARRIVED, by_rank[dst]["path"])
                    if z_sent != z_got:
                        raise DproError(f"collective {func} #{seq} channel {ch} chunk {loop} ({phase}): rank {src} "
                                        f"sent {z_sent} bytes, rank {dst} received {z_got}",
                                        path=by_rank[dst]["path"], record=f"line {rs['line']}",
                                        hint="the files are from different runs; keep one job's files per folder")
                    sizes.append(z_sent)
                    txn = txn_id(tensor, phase, step, 0, node[src], node[dst])
                    common = {"iteration": int(seq), "stream": "comm", "tensor": tensor, "phase": phase, "step": step,
                              "chunk": 0, "txn": txn, "bytes": int(z_sent), "channel": ch, "loop": loop}
                    rows.append({**common, "node": node[src], "rank": src, "kind": "SEND", "op": f"SEND {txn}",
                                 "name": f"SEND {tensor}", "start": t_sent, "dur": ss["t1"] - t_sent,
                                 "peer": node[dst]})
                    r0 = _state(rs, ST_RECV_WAIT, by_rank[dst]["path"])[0]
                    rows.append({**common, "node": node[dst], "rank": dst, "kind": "RECV", "op": f"RECV {txn}",
                                 "name": f"RECV {tensor}", "start": r0, "dur": t_arr - r0, "peer": node[src]})
            prev = collectives.setdefault(tensor, {"tensor": tensor, "bytes": max(sizes), "algorithm": "tree",
                                                   "op": "allreduce_tree", "participants": order})
            if prev["algorithm"] != "tree":
                raise DproError(f"{tensor}: collective {func} #{seq} ran as Tree, an earlier one as "
                                f"{prev['algorithm']}", path=by_rank[root]["path"],
                                hint="profile collectives of one size (one algorithm) per folder, or set NCCL_ALGO")
    return shaped


def _state(step: dict[str, Any], state: int, path: Path) -> tuple[float, int]:
    """(time µs, size) of a step's first transition into ``state``."""
    for s, t, z in step["states"]:
        if s == state:
            return t, z
    raise DproError(f"step {step['step']} has no state {state} (states {[s for s, _, _ in step['states']]})",
                    path=path, record=f"line {step['line']}",
                    hint="the plugin records NCCL's net transport states; a step without them did not go "
                         "through the network (re-collect with the network transport)")


# ------------------------------------------------------------------------------- as a trace directory

def _stamp(paths: list[Path]) -> tuple:
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)


@functools.lru_cache(maxsize=8)
def _job(stamp: tuple) -> dict[str, Any]:
    return ring_transfers([Path(p) for p, _, _ in stamp])


def _job_of(trace_dir: Path) -> dict[str, Any]:
    paths = files(trace_dir)
    if not paths:
        raise DproError("no nccl-*.jsonl file", path=trace_dir,
                        hint="run the job with NCCL_PROFILER_PLUGIN=<libnccl-profiler-dpro.so> DPRO_NCCL_TRACE=<dir>")
    return _job(_stamp(paths))


def discover(trace_dir: Path) -> Manifest | None:
    """The manifest of a folder of plugin files (None when it holds none), built in memory.

    Parameters
    ----------
    trace_dir : Path
        A ``DPRO_NCCL_TRACE`` folder of one communicator (or per-host sub-folders of it).

    Returns
    -------
    Manifest or None
        Nodes ``<host>/rank<r>`` (workers), iterations = the ring all-reduces' ``seq`` numbers,
        ``extra.rank_order`` (every channel's ring is the rank order, so the transaction ids are
        the ring DFG's) and ``extra.skipped`` (collectives that are not ring all-reduces).
    """
    trace_dir = Path(trace_dir)
    paths = files(trace_dir)
    if not paths:
        return None
    job = _job(_stamp(paths))
    by_rank = {}
    for p in paths:
        d = read_file(p)
        by_rank[d["rank"]] = d
    nodes = {}
    for r, name in enumerate(job["nodes"]):
        d = by_rank[r]
        rel = d["path"].parent.relative_to(trace_dir)
        nodes[name] = NodeInfo(host=d["host"], role="worker", rank=r, dir=str(rel) or ".", format=FORMAT,
                               file=d["path"].name)
    its = sorted({row["iteration"] for row in job["rows"]})
    return Manifest(job=f"nccl {by_rank[0]['comm']}", framework="nccl", comm_backend="nccl",
                    world_size=job["nranks"], nodes=nodes, iterations=its, raw_format=FORMAT,
                    extra={"collector": "collectors/nccl", "rank_order": job["rank_order"],
                           "tree_order": job["tree_order"],
                           "skipped": job["skipped"], "nccl_api": by_rank[0]["api"]})


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One rank's :class:`~dpro_kit.trace.NodeTrace`: its SEND and RECV events and one ring
    all-reduce collective per ring pass (module docstring)."""
    root = Path(node_dir)
    for part in Path(manifest.node_dir(node)).parts:
        if part != ".":
            root = root.parent
    job = _job_of(root)
    if node not in job["nodes"]:
        raise TraceFormatError(f"node {node!r} has no NCCL plugin file", path=node_dir)
    keep = set(EVENT_COLUMNS)
    rows = [{k: v for k, v in r.items() if k in keep} for r in job["rows"] if r["node"] == node]
    colls = [{"tensor": c["tensor"], "op": c["op"], "algorithm": c["algorithm"], "bytes": int(c["bytes"]),
              "inputs": [], "outputs": [], "params": []} for c in job["collectives"]]
    warnings = []
    if not job["rank_order"]:
        warnings.append("an NCCL channel's ring is not the rank order: its transfers keep their own ids and the "
                        "ring DFG (rank order) models them with the cost model")
    if not job["tree_order"]:
        warnings.append("an NCCL channel's tree is not NCCL's double binary tree over the hosts with a chain of "
                        "each host's ranks below its head (e.g. the SPLIT_TREE pattern, or host names that are "
                        "not NCCL's nodes): the tree DFG models that tree, the transfers that differ get the "
                        "cost model")
    if job["skipped"]:
        warnings.append(f"collectives other than ring and tree all-reduces are not modelled: {job['skipped']}")
    path = str(Path(node_dir) / (manifest.nodes[node].file or ""))
    return NodeTrace(events=make_events(rows, path=path), edges=[], collectives=colls, warnings=warnings)


def finish(ts: Any) -> Any:
    """Tree collectives' participants in tree order (``participants[p]`` at binary-tree position p),
    as :func:`dpro_kit.graph.topology.tree_allreduce` reads them; the merged collectives come in rank
    order (registered as this format's finisher: :func:`dpro_kit.trace.load_trace`)."""
    import dataclasses

    if ts.path is None or not any(c.algorithm == "tree" for c in ts.collectives):
        return ts
    order = {c["tensor"]: c["participants"] for c in _job_of(Path(ts.path))["collectives"]}
    colls = [dataclasses.replace(c, participants=list(order[c.tensor]))
             if c.algorithm == "tree" and c.tensor in order and sorted(order[c.tensor]) == sorted(c.participants)
             else c for c in ts.collectives]
    return dataclasses.replace(ts, collectives=colls)
