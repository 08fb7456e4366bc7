"""Reader for the MXNet collector's folders (``collectors/mxnet``; raw format ``dpro-mxnet``).

A worker folder holds ``profile.json`` (MXNet 1.9.1's profiler dump of the profiled Trainer
steps: Chrome trace events, ``ts`` in microseconds since the epoch) and ``meta.json`` (the
Trainer's parameters in key order, the kvstore, the PS facts, step return times); a server
folder holds only ``meta.json`` (MXNet wrote no server trace, docs/ps.md).

What becomes of the dump (docs/ps.md, "What MXNet 1.9.1 records"):

* operators on the compute device (``cpu/0``): one op each, in execution order, chained (one
  engine worker thread); the i-th equal share of them is step ``START + i`` (each step runs the
  same op sequence; a dump where they differ is refused). Kind: ``FW`` before the first
  ``_backward_*`` op, then ``BW`` for ``_backward_*`` and ``ImperativeBulk`` (a hybridized
  block's segment), ``OTHER`` for the rest (``CopyCPU2CPU``: a gradient copied into the
  kvstore's send buffer, ``SetValueOp``). ``DeleteVariable`` / ``WaitForVar`` are dropped;
* ``KVStoreDistDefaultStoragePushPull`` spans (device ``cpu pinned``): one per parameter and
  step, without the key. The Trainer issues them in key order after the backward pass and the
  CPU engine runs the ready ones FIFO; with a backward in several bulk segments the keys whose
  gradients the first segment computes go first (:func:`_push_gates`). They become ``COMM``
  events (``phase`` ``push_pull``) that only feed the link model;
* one ``push_pull`` collective (scheme ``ps``; ``dist_async``: ``push_pull_async``, scheme
  ``ps_async``, :func:`dpro_kit.graph.topology.ps_async_push_pull`) per parameter, input: the
  backward op its push-pull spans followed (:func:`_push_gates`), partitions as
  ``KVStoreDist::EncodeDefaultKey`` makes them: below ``MXNET_KVSTORE_BIGARRAY_BOUND``
  elements one partition on server ``(key * 9973) % num_servers``, else one slice per server.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..schema import MXNET_META_FORMAT, MXNET_META_VERSIONS, MXNET_RAW_FORMAT
from ..trace import Manifest, NodeTrace, empty_events, make_events, read_json
from .gaps import fold_gaps

FORMAT = MXNET_RAW_FORMAT
PUSHPULL = "KVStoreDistDefaultStoragePushPull"
DROP = {"DeleteVariable", "WaitForVar", "WaitForAll"}
__all__ = ["FORMAT", "PUSHPULL", "partitions", "read_node", "read_meta"]


def read_meta(node_dir: Path) -> dict[str, Any]:
    """The node's ``meta.json``, checked (one-line TraceFormatError otherwise)."""
    path = node_dir / "meta.json"
    doc = read_json(path, what="dpro_mxnet meta file")
    if not isinstance(doc, dict) or doc.get("format") != MXNET_META_FORMAT:
        raise TraceFormatError(f"not a {MXNET_META_FORMAT} file", path=path,
                               hint="point dpro at the folder `dpro profile --framework mxnet` wrote")
    if doc.get("version") not in MXNET_META_VERSIONS:
        raise TraceFormatError(f"unsupported meta version {doc.get('version')!r}", path=path,
                               hint=f"this dpro reads versions {list(MXNET_META_VERSIONS)}")
    if doc.get("role") not in ("worker", "server", "scheduler"):
        raise TraceFormatError(f"'role' must be worker, server or scheduler; got {doc.get('role')!r}"[:300], path=path,
                               record="role", hint="the file was damaged; profile again (dpro profile --framework mxnet)")
    if doc.get("role") == "worker":
        if not isinstance(doc.get("kvstore"), dict):
            raise TraceFormatError("'kvstore' must be an object ({type: dist_sync|dist_async, ...})", path=path,
                                   record="kvstore", hint="the file was damaged; profile again")
        for key in ("params", "steps", "kvstore"):
            if key not in doc:
                raise TraceFormatError(f"worker meta lacks {key!r}", path=path,
                                       hint="the worker stopped before its profiled window ended; profile again")
        ps = doc["params"]
        for j, prm in enumerate(ps if isinstance(ps, list) else [None]):
            if not (isinstance(prm, dict) and isinstance(prm.get("name"), str)
                    and type(prm.get("bytes")) is int and 0 <= prm["bytes"] < 2 ** 40
                    and all(type(prm.get(k, 0)) is int and 0 <= prm.get(k, 0) < 2 ** 40 for k in ("size", "key"))):
                raise TraceFormatError("each 'params' entry must be {name: str, bytes: int, size: int, key: int} "
                                       f"with sizes in [0, 2^40); got {prm!r}"[:300], path=path, record=f"params[{j}]",
                                       hint="the file was damaged; profile again (dpro profile --framework mxnet)")
            if prm.get("key", j) != j:   # fuzz case 55686: the list shuffled paired spans with other sizes, +5.8 %
                raise TraceFormatError(f"params[{j}] has key {prm['key']}: the collector lists the parameters in key "
                                       "order (the reader pairs the j-th push-pull of a step with key j)", path=path,
                                       record=f"params[{j}].key",
                                       hint="the file was damaged; profile again (dpro profile --framework mxnet)")
        st = doc["steps"]
        if (not isinstance(st, list) or len(st) < 2
                or not all(type(x) is int and 0 <= x < 2 ** 62 for x in st[:2]) or st[0] >= st[1]):
            raise TraceFormatError(f"'steps' must be [first, end] profiled steps, integers with first < end; "
                                   f"got {st!r}"[:300], path=path, record="steps",
                                   hint="the file was damaged; profile again (dpro profile --framework mxnet)")
    ps_info = doc.get("ps")
    if ps_info is not None:
        bb = ps_info.get("bigarray_bound") if isinstance(ps_info, dict) else None
        if not isinstance(ps_info, dict) or not (bb is None or (type(bb) is int and 0 < bb < 2 ** 40)):
            raise TraceFormatError("'ps' must be an object whose 'bigarray_bound' is a positive integer "
                                   f"(MXNET_KVSTORE_BIGARRAY_BOUND); got {ps_info!r}"[:300], path=path, record="ps",
                                   hint="the file was damaged; profile again (dpro profile --framework mxnet)")
    return doc


def partitions(key: int, size: int, itemsize: int, servers: list[str], bound: int) -> list[dict[str, Any]]:
    """The ps-lite partitions of kvstore key ``key`` (``size`` elements), as MXNet 1.9.1 places them.

    Parameters
    ----------
    key : int
        The kvstore key (Gluon: the parameter's index in the Trainer).
    size, itemsize : int
        Elements and bytes per element.
    servers : list of str
        Server nodes in server-rank order.
    bound : int
        ``MXNET_KVSTORE_BIGARRAY_BOUND`` (elements; MXNet's default 1000000).

    References
    ----------
    MXNet 1.9.1 ``src/kvstore/kvstore_dist.h``, ``EncodeDefaultKey``.
    """
    n = len(servers)
    if n == 0:
        return []
    if size < bound:
        return [{"bytes": size * itemsize, "server": servers[(key * 9973) % n]}]
    out = []
    for i in range(n):
        part = round(size / n * (i + 1)) - round(size / n * i)
        out.append({"bytes": part * itemsize, "server": servers[i]})
    return out


#: how far an operator's duration event (``B``/``E``) may start before / end after its twin in MXNet's
#: ``operator`` domain (``b``/``e``) before the replay says so (us).  ``ProfileOperator`` reads the clock
#: for B then b, and for e then E: at the begin two reads in a row (largest honest gap measured: 3 us), at
#: the end with the task's record written between them (707 us).  Measured on 8 worker dumps of 4 real
#: jobs, 1,952 twins (docs/reliability.md, "MXNet operator twins").  A thread preempted between the two
#: reads makes a longer honest gap, so a longer one is said, not refused.
TWIN_GAP_US = (100.0, 2000.0)


def _twin_check(sync: dict[tuple, list], asy: dict[tuple, list], path: Path) -> list[str]:
    """Check the operator spans against their ``operator``-domain twins; the warnings to print.

    MXNet 1.9.1 records every operator twice: ``ProfileOperator::start`` reads the clock for the
    duration event (``B``) and then for the async task (``b``), ``stop`` for ``e`` and then ``E``,
    so ``B <= b <= e <= E`` always.  A time moved or swapped with another (fuzz case 2653: two
    ``ts`` swapped, every begin still before its end, the replay +60.7 %) breaks that order (refused)
    or widens a gap beyond :data:`TWIN_GAP_US` (said, with the record).  Spans pair up per (thread,
    name) in the order MXNet wrote them; a dump without twins is not checked."""
    if not asy:
        return []
    wide: list[str] = []
    for k in sorted(sync.keys() | asy.keys(), key=repr):
        s, a = sync.get(k, []), asy.get(k, [])
        if len(s) != len(a):
            i = (s if len(s) > len(a) else a)[min(len(s), len(a))][2]
            raise TraceFormatError(f"{k[1]!r:.60} on thread {k[0]!r:.30} has {len(s)} duration spans (B/E) but "
                                   f"{len(a)} operator-domain twins (b/e); MXNet writes both for every operator",
                                   path=path, record=f"traceEvents[{i}]",
                                   hint="events were lost or added; the dump is damaged, profile again")
        for (b0, e0, i), (b1, e1, j) in zip(s, a):
            if not (b0 <= b1 <= e1 <= e0):
                raise TraceFormatError(
                    f"{k[1]!r:.60} and its operator-domain twin (traceEvents[{j}]) disagree: the twin begins "
                    f"{b1 - b0:+.0f} us and ends {e1 - e0:+.0f} us from it, MXNet records it inside the span",
                    path=path, record=f"traceEvents[{i}]",
                    hint="a time was changed or swapped; the dump is damaged, profile again")
            if b1 - b0 > TWIN_GAP_US[0] or e0 - e1 > TWIN_GAP_US[1]:
                wide.append(f"{path.name} [traceEvents[{i}]]: {k[1]!r:.60} begins {b1 - b0:.0f} us before and ends "
                            f"{e0 - e1:.0f} us after its operator-domain twin (traceEvents[{j}]; MXNet's two clock "
                            f"reads are at most {TWIN_GAP_US[0]:g} / {TWIN_GAP_US[1]:g} us apart unless the thread was "
                            f"paused between them): taken as written; if the dump was edited, its times are wrong")
    if len(wide) > 1:
        wide = [f"{wide[0]} (and {len(wide) - 1} more such operator(s))"]
    return wide


def _sequential_check(spans: list[tuple[float, float, int, str]], path: Path) -> None:
    """Refuse two operators of one compute thread that overlap at all: an engine worker thread
    runs one operator at a time, and its next ``B`` is read after the last ``E`` (1,480 adjacent
    pairs of the dumps of :data:`TWIN_GAP_US`: none overlaps, none is inside another).  The
    :data:`DROP` ops are not given here: a CNN's ``DeleteVariable`` runs inside the backward's
    ``ImperativeBulk`` segment (6 per dump of 3 steps, dist_async CNN jobs of bench/ps_accuracy.py)."""
    spans = sorted(spans, key=lambda x: (x[0], -x[1], x[2]))
    for o, sp in zip(spans, spans[1:]):
        if sp[0] < o[1]:
            raise TraceFormatError(f"{sp[3]!r:.60} starts {sp[0] - o[0]:.0f} us into {o[3]!r:.60} "
                                   f"(traceEvents[{o[2]}], {o[1] - o[0]:.0f} us long) on the same compute thread: "
                                   "one thread runs one operator at a time", path=path, record=f"traceEvents[{sp[2]}]",
                                   hint="a time was changed or swapped; the dump is damaged, profile again")


def _spans(doc: Any, path: Path) -> tuple[list[dict], list[dict], list[str]]:
    """(compute ops, push-pull spans, warnings): spans as ``{"name", "start", "dur"}`` sorted by start;
    the times checked against their twins (:func:`_twin_check`) and per compute thread
    (:func:`_sequential_check`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError("not an MXNet profiler dump (no traceEvents list)", path=path)
    dev = {e.get("pid"): (e.get("args") or {}).get("name", "") for e in doc["traceEvents"]
           if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"}
    open_: dict[tuple, list] = {}
    compute, comm = [], []
    sync: dict[tuple, list] = {}     # (tid, name) -> [(begin, end, index of the end)], B/E spans
    asy: dict[tuple, list] = {}      # the same of the b/e twins
    threads: dict[tuple, list] = {}  # (pid, tid) of a compute device -> its spans
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") not in ("B", "E", "b", "e") or e.get("cat") != "operator":
            continue
        try:
            ts = float(e["ts"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise TraceFormatError("operator event without a numeric ts", path=path, record=f"traceEvents[{i}]") from None
        if not (math.isfinite(ts) and 0 <= ts < 1e17):
            raise TraceFormatError(f"ts {ts!r} is not a time in us since the epoch", path=path,
                                   record=f"traceEvents[{i}]", hint="the dump is corrupt; profile again")
        ph = e["ph"]
        k = (ph in "be", e.get("pid"), e.get("tid"), e.get("name"))
        if any(isinstance(x, (list, dict)) for x in k):
            raise TraceFormatError("pid, tid and name must be numbers or strings", path=path,
                                   record=f"traceEvents[{i}]", hint="the dump is corrupt; profile again")
        if ph in "Bb":
            open_.setdefault(k, []).append(ts)
            continue
        if not open_.get(k):
            raise TraceFormatError(f"end of {e.get('name')!r} without a begin", path=path, record=f"traceEvents[{i}]",
                                   hint="the dump is truncated or not MXNet's; profile again")
        t0 = open_[k].pop()
        if ts < t0:
            raise TraceFormatError(f"{e.get('name')!r:.60} ends {t0 - ts:.3f} us before it begins", path=path,
                                   record=f"traceEvents[{i}]", hint="the dump is corrupt; profile again")
        (asy if ph == "e" else sync).setdefault((k[2], k[3]), []).append((t0, ts, i))
        if ph == "e":
            continue
        rec = {"name": str(e.get("name")), "start": t0, "dur": ts - t0}
        if str(dev.get(e.get("pid"), "")).startswith("cpu/") and rec["name"] not in DROP:
            # DeleteVariable runs inside a bulk segment (ImperativeBulk) of a CNN's backward, on the
            # same thread (every dump of bench/ps_accuracy.py --model cnn): it is dropped, so not checked
            threads.setdefault(k[1:3], []).append((t0, ts, i, rec["name"]))
        if rec["name"] == PUSHPULL:
            comm.append(rec)
        elif rec["name"] not in DROP and str(dev.get(e.get("pid"), "")).startswith("cpu/"):
            compute.append(rec)
    for spans in threads.values():
        _sequential_check(spans, path)
    warnings = _twin_check(sync, asy, path)
    return sorted(compute, key=lambda r: r["start"]), sorted(comm, key=lambda r: r["start"]), warnings


#: how far (us) a push-pull span may start before the end its gating backward op records: MXNet reads
#: an operator's end clock after it marked the op done, a dependent op can start in between
GATE_SLACK_US = 100.0


def _push_gates(ops: list[dict], spans: list[dict], bw_ops: set[str], n_keys: int) -> tuple[list[int], list[str | None]]:
    """For one step: each push-pull span's key and the backward op it was issued after.

    A span waits for its key's gradient, i.e. for the backward op (a bulk segment) that computes
    it; the gate of a span is the last backward op of ``bw_ops`` (present in every step) that
    ended by the span's start (+ :data:`GATE_SLACK_US`).  Spans that share a gate form a group.
    The Trainer issues pushes in key order and the engine runs the ready ones first-in first-out,
    so within a group the spans are in key order; the backward pass runs from the last layer to
    the first (Gluon's keys are the parameters in layer order), so the first group holds the
    highest keys.  A CNN's backward in two bulks (examples/mxnet/train.py --model cnn: keys 2-9
    after the first, 0-1 after the second) gives groups of 8 and 2; one backward bulk (the MLP)
    one group, the j-th span key j.

    Returns
    -------
    (keys, gates)
        Per span (in the order given: by start), its key and its gate's op id (None: no backward
        op ended before it).
    """
    ends = sorted((r["start"] + r["dur"], r["op"]) for r in ops if r["op"] in bw_ops)
    gates: list[str | None] = []
    for sp in spans:
        g = None
        for e, op in ends:
            if e <= sp["start"] + GATE_SLACK_US:
                g = op
        gates.append(g)
    groups: list[int] = []          # sizes of the runs of equal gates, in start order
    for k, g in enumerate(gates):
        if k == 0 or g != gates[k - 1]:
            groups.append(0)
        groups[-1] += 1
    keys, top = [], n_keys
    for n in groups:
        keys.extend(range(top - n, top))
        top -= n
    return keys, gates


def _fold_host_gaps(ops: list[dict], pull_ends: list[float]) -> None:
    """One step's compute ops (by start): the time between an op and the end of the ops before it is
    charged to the op (``start`` moves back, ``dur`` grows), unless a push-pull span of the worker
    ended in that time (the op waited for a pulled weight, e.g. the ``CopyCPU2CPU`` after a pull).

    The DFG chains a worker's compute ops without gaps, but the step also spends time between them:
    the Trainer's Python code dispatching the pushes, the engine's ``WaitForVar`` (dropped from the
    ops), and, on a host with a CPU quota, the stops that fall between two ops.  Without it every PS
    row was predicted 1-10 % short (docs/ps.md, "Host gaps").  The first op of a step keeps its start.
    """
    starts = [r["start"] for r in ops]

    def pulled(i: int, frm: float) -> bool:   # a pull ended between the ops: the op waited for it
        k = bisect.bisect_right(pull_ends, frm)
        return k < len(pull_ends) and pull_ends[k] <= starts[i] + GATE_SLACK_US

    for r, s in zip(ops, fold_gaps(starts, [r["start"] + r["dur"] for r in ops], keep=pulled)):
        r["dur"] += r["start"] - s
        r["start"] = s


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One node's :class:`~dpro_kit.trace.NodeTrace` (a server: no events, its collectives come from the workers)."""
    meta = read_meta(node_dir)
    if meta.get("role") != "worker":
        return NodeTrace(events=empty_events(), edges=[], collectives=[])
    ppath = node_dir / "profile.json"
    compute, comm, warnings = _spans(read_json(ppath, what="MXNet profiler dump"), ppath)
    a, b = (int(x) for x in meta["steps"][:2])
    n_it = b - a
    params = meta["params"]
    n_keys = len(params)
    if not compute:
        raise TraceFormatError("no operator on a cpu device", path=ppath, hint="profile again")
    if len(comm) != n_keys * n_it:
        raise TraceFormatError(f"{len(comm)} {PUSHPULL} spans for {n_keys} parameters x {n_it} steps", path=ppath,
                               hint="a dist kvstore with update_on_kvstore (Gluon's default) is what this reader knows")
    # steps: each begins with the step's first operator (the forward pass's first op or bulk segment)
    first = compute[0]["name"]
    starts = [i for i, r in enumerate(compute) if r["name"] == first]
    if len(starts) < n_it:
        raise TraceFormatError(f"{first!r} starts {len(starts)} of the {n_it} profiled steps", path=ppath,
                               hint="profile steps after warm-up (dpro profile --steps)")
    if len(starts) > n_it:   # the first op occurs more than once per step: every k-th occurrence
        k = len(starts) // n_it
        starts = starts[::k][:n_it]
    bounds = starts + [len(compute)]
    steps_ops = [compute[bounds[i]:bounds[i + 1]] for i in range(n_it)]
    servers = manifest.servers()
    bound = int((meta.get("ps") or {}).get("bigarray_bound") or 1000000)
    recs, order = [], []
    step_recs: list[list[dict]] = []
    for i, ops in enumerate(steps_ops):
        seen: Counter = Counter()
        backward = False
        mine = []
        for r in ops:
            nm = r["name"]
            op = f"{nm}#{seen[nm]}"
            seen[nm] += 1
            backward = backward or nm.startswith("_backward") or (nm == "ImperativeBulk" and seen[nm] > 1)
            kind = ("BW" if nm.startswith("_backward") or (backward and nm == "ImperativeBulk") else
                    "OTHER" if nm in ("CopyCPU2CPU", "SetValueOp") else "FW")
            if i == 0:
                order.append(op)
            mine.append({"op": op, "name": nm, "kind": kind, "iteration": a + i, "start": r["start"], "dur": r["dur"]})
        recs.extend(mine)
        step_recs.append(mine)
    pull_ends = sorted(r["start"] + r["dur"] for r in comm)
    for mine in step_recs:
        _fold_host_gaps(mine, pull_ends)
    ids = order
    common = set.intersection(*({r["op"] for r in mine} for mine in step_recs))
    bws = [o for o in order if o in common and any(r["op"] == o and r["kind"] == "BW" for r in recs)]
    last_bw = bws[-1] if bws else None
    # which backward op each step's push-pull spans follow, and so which key each span is (_push_gates)
    gate_votes: list[Counter] = [Counter() for _ in params]
    for i, mine in enumerate(step_recs):
        spans = comm[i * n_keys:(i + 1) * n_keys]
        keys, gates = _push_gates(mine, spans, set(bws), n_keys)
        for r, j, gt in zip(spans, keys, gates):
            p = params[j]
            if gt is not None:
                gate_votes[j][gt] += 1
            recs.append({"op": f"PUSHPULL {p['name']}", "name": PUSHPULL, "kind": "COMM", "stream": "comm",
                         "iteration": a + i, "start": r["start"], "dur": r["dur"], "tensor": p["name"],
                         "bytes": int(p["bytes"]), "phase": "push_pull"})
    rank = {o: k for k, o in enumerate(order)}
    edges = list(zip(ids, ids[1:]))
    colls = []
    asynchronous = (meta.get("kvstore") or {}).get("type") == "dist_async"
    for j, p in enumerate(params):
        size = int(p.get("size") or 0)
        itemsize = int(p["bytes"]) // size if size else 4
        votes = gate_votes[j]
        # the backward op most steps pushed this key after (ties: the earlier one); else the last backward op
        gate = min(votes, key=lambda o: (-votes[o], rank[o])) if votes else None
        colls.append({"tensor": p["name"], "op": "push_pull_async" if asynchronous else "push_pull",
                      "algorithm": "ps_async" if asynchronous else "ps", "bytes": int(p["bytes"]),
                      "inputs": [gate or last_bw or ids[-1]], "outputs": [],
                      "params": [p["name"]], "param_bytes": [int(p["bytes"])],
                      "partitions": partitions(int(p.get("key", j)), size, itemsize, servers, bound)})
    return NodeTrace(events=make_events(recs, path=str(ppath)), edges=edges, collectives=colls, warnings=warnings)
