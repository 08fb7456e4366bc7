"""Reader for BytePS communication timelines (``BYTEPS_TRACE_ON=1``; raw format ``byteps-comm``).

**Untested against real BytePS**: BytePS needs a GPU, so this reader was written from
BytePS's documentation (``docs/timeline.md``) and the writer in its source
(``byteps/common/global.cc``: ``EmitTrace`` / ``OutputTraces``, 0.2.5) and is tested on a
hand-written fixture in that format (``tests/fixtures/byteps-2w1s``), not on a recorded trace.

What BytePS writes, per GPU: ``<BYTEPS_TRACE_DIR>/<local rank>/comm.json`` =
``{"traceEvents": [...], "displayTimeUnit": "ms"}`` for the steps
``BYTEPS_TRACE_START_STEP .. BYTEPS_TRACE_END_STEP``, complete events (``ph: X``, ``ts`` /
``dur`` in microseconds of the system clock) named ``Comm.<tensor>`` with

* ``tid: "total"`` - one per tensor and step: from the gradient's enqueue to the end of its
  synchronisation, queueing included;
* ``tid: "<key>"`` - one per partition, queue stage and step, named
  ``Comm.<tensor>.<QueueType>`` (``COORDINATE_REDUCE``, ``REDUCE``, ``COPYD2H``,
  ``PCIE_REDUCE``, ``COORDINATE_PUSH``, ``COMPRESS``, ``PUSH``, ``PULL``, ``DECOMPRESS``,
  ``COPYH2D``, ``COORDINATE_BROADCAST``, ``BROADCAST``).  The key is BytePS's partition key
  ``(declared key << 16) + partition index``; only the root GPU of a machine (the largest
  local rank) has ``PUSH`` / ``PULL``.

What it does not write, and this reader takes from ``byteps_meta.json`` (dpro's, at the top
of the trace folder; written by hand for a trace you have): the tensors' sizes, the
partition size (``BYTEPS_PARTITION_BYTES``), the number of servers and the key hash
(``BYTEPS_KEY_HASH_FN``), and the first traced step::

    {"format": "dpro-byteps-meta", "version": 1, "servers": 1, "partition_bytes": 4096000,
     "key_hash": "djb2", "start_step": 10, "tensors": {"byteps.gradient_0": 6000000, ...}}

Trace folder (no ``manifest.json`` needed, :func:`discover`)::

    T/byteps_meta.json
    T/worker0/<local rank>/comm.json     # worker machine 0's BYTEPS_TRACE_DIR
    T/worker1/<local rank>/comm.json

One node per worker machine: its root GPU's ``comm.json`` (the largest local rank); the
servers are nodes without files.  The DFG (the parameter-server one of
:mod:`dpro_kit.readers.mxnet`, scheme ``ps``):

* per tensor and step, **computation is not in the trace**: the gradients' enqueue times
  (``total`` starts) stand for it - op ``bps:ready:<tensor>`` (kind ``BW``) lasts from the
  previous gradient's enqueue to this one's, in enqueue order, and ``bps:gap`` (kind
  ``FW``) from the end of the previous step's last synchronisation to the step's first
  enqueue (forward pass, loss, optimizer; the median of the traced steps for the first);
  these are estimates, not measured op times;
* per tensor: ``bps:pre:<tensor>`` (the stages before ``PUSH``: coordination, local reduce,
  device-to-host copy, compression; the longest partition's sum) -> one ``push_pull``
  collective (``ps``: every partition pushed to, aggregated on and pulled from its server,
  servers by BytePS's key hash, :func:`partitions`) -> ``bps:post:<tensor>`` (the stages after
  ``PULL``: decompression, host-to-device copy, local broadcast); ``PUSH``..``PULL`` spans
  become ``COMM`` events (phase ``push_pull``) that fit the link model.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..trace import Manifest, NodeInfo, NodeTrace, empty_events, make_events

__all__ = ["FORMAT", "META_FILE", "META_FORMAT", "QUEUE_TYPES", "discover", "djb2", "load_comm", "partitions",
           "read_meta", "read_node"]

FORMAT = "byteps-comm"
META_FILE = "byteps_meta.json"
META_FORMAT = "dpro-byteps-meta"
COMM_FILE = "comm.json"
#: BytePS 0.2.5's ``QueueType`` names (``byteps/common/common.h``, ``LogStrings``), in pipeline order
QUEUE_TYPES = ("COORDINATE_REDUCE", "REDUCE", "COPYD2H", "PCIE_REDUCE", "COORDINATE_PUSH", "COMPRESS", "PUSH", "PULL",
               "DECOMPRESS", "COPYH2D", "COORDINATE_BROADCAST", "BROADCAST")
_PRE = QUEUE_TYPES[:QUEUE_TYPES.index("PUSH")]
_POST = QUEUE_TYPES[QUEUE_TYPES.index("PULL") + 1:]
#: BytePS's default partition size (``BYTEPS_PARTITION_BYTES``) and page size it rounds up to
DEFAULT_PARTITION_BYTES = 4096000
PAGE_BYTES = 4096
_HASHES = ("djb2", "sdbm", "naive")


def djb2(key: int) -> int:
    """BytePS's default key hash (``BytePSGlobal::Hash_DJB2``: djb2 over the decimal digits, 64-bit)."""
    h = 5381
    for c in str(int(key)).encode():
        h = ((h << 5) + h + c) & 0xFFFFFFFFFFFFFFFF
    return h


def _sdbm(key: int) -> int:
    h = 0
    for c in str(int(key)).encode():
        h = (c + (h << 6) + (h << 16) - h) & 0xFFFFFFFFFFFFFFFF
    return h


def _server_of(key: int, n: int, how: str) -> int:
    if how == "naive":
        return (((key >> 16) + (key % 65536)) * 9973) % n
    return (djb2(key) if how == "djb2" else _sdbm(key)) % n


def partitions(declared_key: int, nbytes: int, partition_bytes: int, servers: list[str],
               key_hash: str = "djb2") -> list[dict[str, Any]]:
    """A tensor's BytePS partitions: ``{"bytes", "server", "key"}`` each, as BytePS 0.2.5 makes them.

    The partition size is rounded up to a whole page (BytePS rounds to ``local_size x page``;
    one GPU per machine here); a tensor is cut into partitions of that size (the last one
    smaller); partition ``i`` has key ``(declared_key << 16) + i`` and goes to server
    ``hash(key) % len(servers)``.

    Parameters
    ----------
    declared_key : int
        The tensor's declared key (BytePS numbers tensors in declaration order).
    nbytes : int
        The tensor's size.
    partition_bytes : int
        ``BYTEPS_PARTITION_BYTES``.
    servers : list of str
        Server nodes in server-rank order.
    key_hash : str
        ``BYTEPS_KEY_HASH_FN``: ``djb2`` (BytePS's default), ``sdbm`` or ``naive``.

    References
    ----------
    BytePS 0.2.5 ``byteps/common/operations.cc`` (``PartitionTensor``, ``InitTensor``) and
    ``global.cc`` (``EncodeDefaultKey``, ``Hash_DJB2``).
    """
    if not servers:
        raise TraceFormatError("a BytePS job needs at least one server")
    if key_hash not in _HASHES:
        raise TraceFormatError(f"unknown BYTEPS_KEY_HASH_FN {key_hash!r}", hint="one of " + ", ".join(_HASHES))
    bound = max(PAGE_BYTES, -(-int(partition_bytes) // PAGE_BYTES) * PAGE_BYTES)
    out, off, i = [], 0, 0
    while off < nbytes or (nbytes == 0 and i == 0):
        b = min(bound, nbytes - off)
        key = (int(declared_key) << 16) + i
        out.append({"bytes": int(b), "server": servers[_server_of(key, len(servers), key_hash)], "key": key})
        off, i = off + b, i + 1
        if nbytes == 0:
            break
    return out


def read_meta(trace_dir: Path) -> dict[str, Any]:
    """``byteps_meta.json`` of a BytePS trace folder, checked (one-line TraceFormatError otherwise)."""
    path = Path(trace_dir) / META_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceFormatError(f"cannot read it ({exc.strerror})", path=path,
                               hint="write it next to the workers' folders (docs/byteps.md): BytePS's comm.json "
                                    "has no tensor sizes") from None
    except ValueError as exc:
        raise TraceFormatError(f"not JSON ({exc})", path=path) from None
    if not isinstance(doc, dict) or doc.get("format") != META_FORMAT:
        raise TraceFormatError(f"not a {META_FORMAT} file (format field)", path=path, hint="docs/byteps.md")
    if doc.get("version") != 1:
        raise TraceFormatError(f"unsupported version {doc.get('version')!r}", path=path, hint="this dpro reads version 1")
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict) or not tensors or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 40 for v in tensors.values()):
        raise TraceFormatError("'tensors' must map each tensor name to its size in bytes (0 .. 2^40)", path=path,
                               record="tensors", hint='e.g. {"byteps.gradient_0": 6000000}')
    for key, ok in (("servers", lambda v: isinstance(v, int) and 1 <= v < 2 ** 31),
                    ("workers", lambda v: isinstance(v, int) and 1 <= v < 2 ** 31),
                    ("partition_bytes", lambda v: isinstance(v, int) and 1 <= v < 2 ** 40),
                    ("start_step", lambda v: isinstance(v, int) and 0 <= v < 2 ** 40)):
        if key in doc and (isinstance(doc[key], bool) or not ok(doc[key])):
            raise TraceFormatError(f"{key!r} must be a positive integer of a plausible size, got {doc[key]!r}"[:300],
                                   path=path, record=key)
    if doc.get("key_hash", "djb2") not in _HASHES:
        raise TraceFormatError(f"unknown key_hash {doc.get('key_hash')!r}", path=path, record="key_hash",
                               hint="one of " + ", ".join(_HASHES))
    return doc


def load_comm(path: str | Path) -> list[dict[str, Any]]:
    """The events of one ``comm.json``: ``{"tensor", "stage", "key", "start", "dur"}`` (stage ``total`` or a
    :data:`QUEUE_TYPES` name; key None for ``total``), sorted by start.

    Raises
    ------
    TraceFormatError
        Not JSON, no ``traceEvents`` list, an event without the documented fields.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceFormatError(f"cannot read it ({exc.strerror})", path=path) from None
    except ValueError as exc:
        raise TraceFormatError(f"not JSON ({exc}); BytePS writes it after BYTEPS_TRACE_END_STEP", path=path,
                               hint="let the job run past BYTEPS_TRACE_END_STEP, or record again") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceFormatError("not a BytePS communication trace (no traceEvents list)", path=path)
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name, tid = e.get("name"), e.get("tid")
        para = (e.get("args") or {}).get("name") if isinstance(e.get("args"), dict) else None
        try:
            ts, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise TraceFormatError("event without a numeric ts/dur", path=path, record=f"traceEvents[{i}]") from None
        if not (math.isfinite(ts) and math.isfinite(dur) and 0 <= ts < 1e17 and 0 <= dur <= 1e12):
            raise TraceFormatError(f"ts {ts!r} / dur {dur!r} is not a time in us (finite, >= 0)", path=path,
                                   record=f"traceEvents[{i}]", hint="the file is corrupt; record again")
        if not isinstance(name, str) or not isinstance(para, str) or not para.startswith("Comm."):
            raise TraceFormatError("event without args.name 'Comm.<tensor>'", path=path, record=f"traceEvents[{i}]",
                                   hint="BytePS's comm.json (BYTEPS_TRACE_ON=1) is what this reader reads")
        tensor = para[len("Comm."):]
        if tid == "total":
            out.append({"tensor": tensor, "stage": "total", "key": None, "start": ts, "dur": dur})
            continue
        stage = name[len(para) + 1:] if name.startswith(para + ".") else ""
        if stage not in QUEUE_TYPES:
            raise TraceFormatError(f"unknown queue stage {stage!r} in {name!r}", path=path, record=f"traceEvents[{i}]",
                                   hint="BytePS 0.2.5 stages: " + ", ".join(QUEUE_TYPES))
        key = _partition_key(tid)
        if key is None:   # fuzz case 32438: tid -inf was an OverflowError traceback
            raise TraceFormatError(f"partition event with tid {tid!r:.40} (a partition key is an integer >= 0)",
                                   path=path, record=f"traceEvents[{i}]", hint="the file is corrupt; record again")
        out.append({"tensor": tensor, "stage": stage, "key": key, "start": ts, "dur": dur})
    if not out:
        raise TraceFormatError("no communication event", path=path, hint="record with BYTEPS_TRACE_ON=1")
    out.sort(key=lambda r: r["start"])
    return out


def _partition_key(tid: Any) -> int | None:
    """A partition event's ``tid`` as its key: an integer in [0, 2^62), written as a number or a string of
    digits (BytePS writes the key); None for anything else (a fraction, inf, NaN, a bool, a negative)."""
    if isinstance(tid, bool):
        return None
    if isinstance(tid, float):
        key = int(tid) if tid.is_integer() else None     # inf and NaN are not integers
    elif isinstance(tid, int):
        key = tid
    elif isinstance(tid, str) and tid.strip().isdigit():
        key = int(tid.strip())
    else:
        return None
    return key if key is not None and 0 <= key < 2**62 else None


def _root_comm(node_dir: Path) -> Path:
    """The root GPU's comm.json of a worker folder (the largest local rank that has PUSH/PULL)."""
    ranks = sorted((int(p.parent.name), p) for p in Path(node_dir).glob(f"*/{COMM_FILE}") if p.parent.name.isdigit())
    if not ranks:
        raise TraceFormatError(f"no <local rank>/{COMM_FILE} in the worker folder", path=node_dir,
                               hint="copy that worker machine's BYTEPS_TRACE_DIR here")
    return ranks[-1][1]


def discover(trace_dir: Path) -> Manifest | None:
    """The Manifest of a BytePS trace folder without ``manifest.json`` (layout in the module docstring),
    or None when the folder has no ``byteps_meta.json``."""
    trace_dir = Path(trace_dir)
    if not (trace_dir / META_FILE).is_file():
        return None
    meta = read_meta(trace_dir)
    workers = sorted((p for p in trace_dir.iterdir() if p.is_dir() and any(p.glob(f"*/{COMM_FILE}"))),
                     key=lambda p: p.name)
    if not workers:
        raise TraceFormatError(f"no worker folder with <local rank>/{COMM_FILE}", path=trace_dir,
                               hint="one folder per worker machine holding its BYTEPS_TRACE_DIR")
    warnings = []
    if "workers" in meta and meta["workers"] != len(workers):
        raise TraceFormatError(f"byteps_meta.json says {meta['workers']} worker(s) ran; {len(workers)} folder(s) with "
                               f"<local rank>/{COMM_FILE} are here ({', '.join(w.name for w in workers)})",
                               path=trace_dir / META_FILE, record="workers",
                               hint="copy the missing worker's BYTEPS_TRACE_DIR here, or remove extra folders")
    if "workers" not in meta:
        warnings.append(f"byteps_meta.json does not say how many workers ran (\"workers\": N); the {len(workers)} "
                        "worker folder(s) found are taken as the whole job, a missing one would go unnoticed")
    nodes = {f"{w.name}/0": NodeInfo(host=w.name, role="worker", rank=i, dir=w.name) for i, w in enumerate(workers)}
    for j in range(int(meta.get("servers", 1))):
        nodes[f"server{j}/server{j}"] = NodeInfo(host=f"server{j}", role="server", rank=j, dir=".")
    steps = _steps(load_comm(_root_comm(workers[0])), _root_comm(workers[0]))
    start = int(meta.get("start_step", 0))
    return Manifest(job=str(meta.get("job", "byteps")), framework=str(meta.get("framework", "byteps")),
                    comm_backend="byteps", world_size=len(workers), nodes=nodes,
                    iterations=list(range(start, start + len(steps))), raw_format=FORMAT,
                    tool_version=str(meta.get("tool_version", "")),
                    extra={"strategy": "ps", "link_model": "interface", **({"warnings": warnings} if warnings else {}),
                           "byteps": {"partition_bytes": int(meta.get("partition_bytes", DEFAULT_PARTITION_BYTES)),
                                      "key_hash": str(meta.get("key_hash", "djb2")),
                                      "servers": int(meta.get("servers", 1))}})


def _steps(evs: list[dict[str, Any]], path: Path) -> list[list[dict[str, Any]]]:
    """Events per traced step: the k-th ``total`` of each tensor and the k-th event of each (key, stage)."""
    per_tensor: dict[str, int] = defaultdict(int)
    per_part: dict[tuple[int, str], int] = defaultdict(int)
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in evs:
        if e["stage"] == "total":
            k = per_tensor[e["tensor"]]
            per_tensor[e["tensor"]] += 1
        else:
            k = per_part[(e["key"], e["stage"])]
            per_part[(e["key"], e["stage"])] += 1
        steps[k].append(e)
    counts = set(per_tensor.values())
    if not counts:
        raise TraceFormatError("no 'total' event (tid \"total\"): not a whole BytePS comm.json", path=path,
                               hint="the file is truncated or damaged; record again (BYTEPS_TRACE_ON=1)")
    if len(counts) != 1:
        raise TraceFormatError("tensors were traced for different numbers of steps "
                               f"({min(counts)}..{max(counts)})", path=path,
                               hint="the trace is truncated; record again")
    n = counts.pop()
    if any(v != n for v in per_part.values()):
        raise TraceFormatError(f"a partition stage occurs other than {n} times (once per traced step)", path=path)
    return [steps[k] for k in range(n)]


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One worker machine (its root GPU's ``comm.json``) as a NodeTrace (module docstring); a server: empty."""
    if manifest.nodes[node].role != "worker":
        return NodeTrace(events=empty_events(), edges=[], collectives=[])
    node_dir = Path(node_dir)
    trace_dir = node_dir.parent if manifest.nodes[node].dir not in (None, "", ".") else node_dir
    meta = read_meta(trace_dir)
    path = _root_comm(node_dir)
    steps = _steps(load_comm(path), path)
    if len(steps) != len(manifest.iterations):
        raise TraceFormatError(f"{len(steps)} traced steps, the other workers have {len(manifest.iterations)}",
                               path=path, hint="every worker must trace the same BYTEPS_TRACE_START/END_STEP")
    sizes = meta["tensors"]
    hv = (manifest.extra or {}).get("byteps") or {}
    pbytes = int(hv.get("partition_bytes", meta.get("partition_bytes", DEFAULT_PARTITION_BYTES)))
    key_hash = str(hv.get("key_hash", meta.get("key_hash", "djb2")))
    servers = manifest.servers()
    rows: list[dict[str, Any]] = []
    order: list[str] | None = None
    gaps: list[float] = []
    prev_end = None
    declared: dict[str, int] = {}
    for i, evs in enumerate(steps):
        it = manifest.iterations[i]
        totals = sorted((e for e in evs if e["stage"] == "total"), key=lambda e: e["start"])
        unknown = [e["tensor"] for e in totals if e["tensor"] not in sizes]
        if unknown:
            raise TraceFormatError(f"tensor {unknown[0]!r} has no size in {META_FILE}", path=path,
                                   hint=f"add it to 'tensors' in {trace_dir / META_FILE}")
        if not any(e["stage"] == "PUSH" for e in evs):
            raise TraceFormatError("no PUSH in this comm.json: not the machine's root GPU", path=path,
                                   hint="keep the largest local rank's folder (it talks to the servers)")
        names = [e["tensor"] for e in totals]
        if order is None:
            order = names
        first, last = totals[0]["start"], max(e["start"] + e["dur"] for e in totals)
        if prev_end is not None:
            gaps.append(max(0.0, first - prev_end))
        prev_end = last
        by_tensor: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for e in evs:
            if e["key"] is not None:
                by_tensor[e["tensor"]][e["stage"]].append(e)
                declared.setdefault(e["tensor"], e["key"] >> 16)
        rows.append({"op": "bps:gap", "name": "BYTEPS_COMPUTE_GAP", "kind": "FW", "iteration": it,
                     "start": first, "dur": 0.0})      # duration set below (median of the traced gaps)
        t_prev = first
        for e in totals:
            t = e["tensor"]
            rows.append({"op": f"bps:ready:{t}", "name": "BYTEPS_GRADIENT_READY", "kind": "BW", "iteration": it,
                         "start": t_prev, "dur": e["start"] - t_prev, "tensor": t})
            t_prev = e["start"]
            st = by_tensor[t]

            def stage_sum(stages: tuple[str, ...]) -> float:
                per_key: dict[int, float] = defaultdict(float)
                for s in stages:
                    for x in st.get(s, []):
                        per_key[x["key"]] += x["dur"]
                return max(per_key.values(), default=0.0)

            pre, post = stage_sum(_PRE), stage_sum(_POST)
            pushes, pulls = st.get("PUSH", []), st.get("PULL", [])
            if not pushes or not pulls:
                raise TraceFormatError(f"tensor {t!r} has no PUSH/PULL in traced step {i}", path=path)
            # the 'total' span runs from the enqueue to the end of the tensor's last stage: every stage
            # of that step lies inside it (1 ms of slack for the two threads that write them)
            inside = [x for xs in st.values() for x in xs]
            lo = min(x["start"] for x in inside)
            hi = max(x["start"] + x["dur"] for x in inside)
            if lo < e["start"] - 1000.0 or hi > e["start"] + e["dur"] + 1000.0:
                raise TraceFormatError(
                    f"tensor {t!r}, traced step {i}: its 'total' span [{e['start']:.0f}, {e['start'] + e['dur']:.0f}] us "
                    f"does not contain its stages [{lo:.0f}, {hi:.0f}] us", path=path, record=f"tid total, {t}",
                    hint="the file was damaged or its times edited; record again (BYTEPS_TRACE_ON=1)")
            p0 = min(x["start"] for x in pushes)
            p1 = max(x["start"] + x["dur"] for x in pulls)
            rows.append({"op": f"bps:pre:{t}", "name": "BYTEPS_PRE_PUSH", "kind": "OTHER", "stream": "bps",
                         "iteration": it, "start": p0 - pre, "dur": pre, "tensor": t, "bytes": int(sizes[t])})
            rows.append({"op": f"PUSHPULL {t}", "name": "BYTEPS_PUSH_PULL", "kind": "COMM", "stream": "comm",
                         "iteration": it, "start": p0, "dur": p1 - p0, "tensor": t, "bytes": int(sizes[t]),
                         "phase": "push_pull"})
            rows.append({"op": f"bps:post:{t}", "name": "BYTEPS_POST_PULL", "kind": "OTHER", "stream": "bps",
                         "iteration": it, "start": p1, "dur": post, "tensor": t, "bytes": int(sizes[t])})
        if names != order:
            raise TraceFormatError(f"traced step {i} enqueued the gradients in another order than step 0", path=path,
                                   hint="this reader needs one gradient order for all traced steps")
    gap = statistics.median(gaps) if gaps else 0.0
    for r in rows:
        if r["op"] == "bps:gap":
            r["dur"] = gap
            r["start"] -= gap
    ready_ops = ["bps:gap"] + [f"bps:ready:{t}" for t in order]
    edges = list(zip(ready_ops, ready_ops[1:]))
    colls = []
    keys = defaultdict(set)
    for e in steps[0]:
        if e["key"] is not None:
            keys[e["tensor"]].add(e["key"])
    for t in order:
        parts = partitions(declared[t], int(sizes[t]), pbytes, servers, key_hash)
        if sorted(keys[t]) != [p["key"] for p in parts]:
            raise TraceFormatError(f"tensor {t!r} has partition keys {sorted(keys[t])} in the trace, "
                                   f"{[p['key'] for p in parts]} for {sizes[t]} bytes in partitions of {pbytes}",
                                   path=path, hint=f"check its size and partition_bytes in {trace_dir / META_FILE}")
        edges.append((f"bps:ready:{t}", f"bps:pre:{t}"))
        colls.append({"tensor": t, "op": "push_pull", "algorithm": "ps", "bytes": int(sizes[t]),
                      "inputs": [f"bps:pre:{t}"], "outputs": [f"bps:post:{t}"], "params": [t],
                      "param_bytes": [int(sizes[t])], "partitions": parts})
    return NodeTrace(events=make_events(rows, path=str(path)), edges=edges, collectives=colls)
