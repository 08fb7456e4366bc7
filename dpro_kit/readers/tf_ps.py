"""TensorFlow ParameterServerStrategy traces (``dpro_tf``, ``strategy: "ps"``) -> the PS DFG.

The coordinator traced every worker and PS task through their profiler service
(``collectors/tf/dpro_tf/ps.py``); each task folder holds ``tf_ps_ops.json`` (kernels, ``_Send``
kernels, ``_Recv`` start/done pairs, step ids, and ``step_of``: step id -> ``{worker, step}``)
and the scheduled function's ``tf_graph.json``. A step's function runs on its worker and its
components on the PS tasks under one step id, so rows of every task join by id.

What becomes of it (the ``ps_step`` scheme of :mod:`dpro_kit.graph.schemes`: TF's
ParameterServerStrategy is asynchronous, each worker's gradients are applied alone, and a worker's
step ends only when all its updates are done):

* **transfers**: a ``_Send`` on one task and the ``_Recv`` on another of one step are one
  transfer (graph partitioning names the pair ``<tensor producer>/_<n>`` and ``.../_<n+1>``).
  PS -> worker (a variable read, ``from`` = a ``ReadVariableOp``) is the *pull*; worker -> PS
  (``to`` = the PS op that consumes the gradient) the *push*. The tensor is the variable: the
  read's resource input, or the variable written downstream of the gradient's consumer, both
  followed through function-call arguments to the captured variable; bytes = the variable's.
  Transfers that carry no variable (cross-device control edges) are not DFG transfers.
* **times**: a transfer is posted when both ends are ready (the sender's ``_Send``, the
  receiver's ``_Recv`` request) and arrives at the receiver's ``_Recv`` done. ``SEND`` on the
  sender = the ``_Send`` kernel; ``RECV`` on the receiver starts at the later of the posting and
  the previous arrival on the same link device (:class:`~dpro_kit.graph.topology.Links`), so its
  duration is the link's service time, not its queueing (as for ps-lite).
* **one collective per step**, tensor :data:`TENSOR`: every variable the workers both read and
  update is one partition (``chunk`` = its index in name order) on the PS that holds it;
* **iterations** (dPRO's PS order within one iteration: push -> update -> pull): iteration ``j``
  of a worker = step ``j``'s forward/backward ops, its gradients' pushes, the PS's update of each
  (``AGG``: the PS kernels from the gradient's consumer to the variable write, summed), and the
  reads that step ``j+1`` pulls. Per worker step ``j`` one ``OTHER`` op ``dpro/step_launch``:
  from step ``j-1``'s last update on the PS to step ``j``'s first read posted (the update's
  completion signal back to the worker, the step's result to the coordinator, the
  coordinator's next dispatch), plus the wait from the last read's arrival to the first kernel
  (clipped at 0); it precedes every op of the step. A worker iteration needs steps ``j-1``,
  ``j`` and ``j+1`` traced.
* **worker ops**: the executor's kernels that are nodes of the traced graph, kinds as in
  :func:`dpro_kit.readers.tf.classify`; edges = the graph's; a variable's push waits for the
  nearest kernels that ran upstream of its gradient's ``_Send``.
"""
from __future__ import annotations

import functools
import re
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError
from ..trace import Manifest, NodeInfo, NodeTrace, OpKind, make_events, read_json

__all__ = ["OPS_FORMAT", "TENSOR", "job_transfers", "read_node"]

OPS_FORMAT = "dpro-tf-task-ops"
#: the one collective of a worker's step: every variable it reads and updates, one partition each
TENSOR = "variables"
LAUNCH = "dpro/step_launch"
_WRITES = re.compile(r"^(Assign(Sub|Add)?VariableOp|ResourceApply.*|ResourceSparseApply.*|ResourceScatter.*)$")
_NUM = re.compile(r"^(.*)/_(\d+)$")


def _load_ops(node_dir: Path) -> dict[str, Any]:
    path = node_dir / "tf_ps_ops.json"
    doc = read_json(path, what="TensorFlow PS task file")
    if not isinstance(doc, dict) or doc.get("format") != OPS_FORMAT or doc.get("version") != 1:
        raise TraceFormatError(f"not a {OPS_FORMAT} version 1 file", path=path,
                               hint="re-collect with `dpro profile --framework tensorflow` on the coordinator")
    for key, cols, times in (("ops", 6, (3, 4)), ("sends", 7, (5, 6)), ("recvs", 4, (2, 3))):
        rows = doc.get(key)
        if not isinstance(rows, list):
            raise TraceFormatError(f"{key!r} is not a list", path=path, record=key)
        for i, r in enumerate(rows):
            if not isinstance(r, list) or len(r) != cols or not all(
                    isinstance(r[c], int) and not isinstance(r[c], bool) and 0 <= r[c] < 2**63 for c in times):
                raise TraceFormatError(f"{key} row is not {cols} values with integer times >= 0", path=path,
                                       record=f"{key}[{i}]", hint="re-collect")
    step_of = doc.get("step_of")
    if not isinstance(step_of, dict) or not all(isinstance(v, dict) and isinstance(v.get("step"), int)
                                                and isinstance(v.get("worker"), str) for v in step_of.values()):
        raise TraceFormatError("'step_of' must map step ids to {worker, step}", path=path, record="step_of",
                               hint="re-collect")
    return doc


class _Graph:
    """The scheduled function's graph: variable of a resource, variable written downstream of an op."""

    def __init__(self, gdoc: dict[str, Any], path: Path) -> None:
        from .tf import _graph
        self.ops, edges = _graph(gdoc, path)
        self.succ: dict[str, list[str]] = defaultdict(list)
        self.pred: dict[str, list[str]] = defaultdict(list)
        for a, b in edges:
            self.succ[a].append(b)
            self.pred[b].append(a)
        self.arg_of: dict[str, str] = {}          # a function body's argument -> the call op's input
        for o in self.ops.values():
            for src, arg in zip(o.get("inputs") or [], o.get("body_inputs") or []):
                self.arg_of[arg] = src

    def variable(self, name: str) -> dict[str, Any] | None:
        """The captured variable ``name`` (a resource, a read or a write of one) stands for."""
        for _ in range(32):
            o = self.ops.get(name)
            if o is None:
                return None
            if o.get("variable"):
                return o["variable"]
            if name in self.arg_of:
                name = self.arg_of[name]
            elif o.get("inputs"):
                name = o["inputs"][0]
            else:
                return None
        return None

    def written_after(self, name: str) -> tuple[dict[str, Any] | None, list[str]]:
        """The variable written downstream of ``name`` and the ops from ``name`` to that write."""
        seen, todo, path = {name}, deque([name]), []
        while todo:
            n = todo.popleft()
            path.append(n)
            o = self.ops.get(n)
            if o is not None and _WRITES.match(o["type"]):
                v = self.variable(o["inputs"][0]) if o.get("inputs") else None
                return v, path
            for s in self.succ.get(n, ()):
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return None, []


def _device(meta: dict[str, Any]) -> str:
    return f"/job:{meta.get('task_type')}/replica:0/task:{meta.get('task_index')}/"


def _root(manifest: Manifest, node: str, node_dir: Path) -> Path:
    root = Path(node_dir)
    for part in Path(manifest.node_dir(node)).parts:
        if part != ".":
            root = root.parent
    return root


@functools.lru_cache(maxsize=4)
def _job(root: str, nodes: tuple[tuple[str, str, str, str, int], ...], link_model: str) -> dict[str, Any]:
    from ..graph.topology import Links, txn_id
    rootp = Path(root)
    docs, metas = {}, {}
    for node, rel, _host, _role, _rank in nodes:
        d = rootp / rel
        metas[node] = read_json(d / "meta.json", what="collector meta file")
        docs[node] = _load_ops(d)
    g = _Graph(read_json(rootp / nodes[0][1] / "tf_graph.json", what="TensorFlow collector file tf_graph.json"),
               rootp / nodes[0][1] / "tf_graph.json")
    dev_node = {_device(metas[n]): n for n in docs}
    worker_node = {metas[n]["task"]: n for n in docs if metas[n].get("role") == "worker"}
    step_of: dict[str, tuple[str, int]] = {}
    for n, d in docs.items():
        for sid, v in d["step_of"].items():
            if v["worker"] in worker_node:
                step_of[sid] = (worker_node[v["worker"]], int(v["step"]))
    # receives by (node, step id, producer, number)
    recvs: dict[tuple[str, str, str, int], tuple[int, int]] = {}
    for n, d in docs.items():
        for name, sid, t0, t1 in d["recvs"]:
            m = _NUM.match(name)
            if m and sid in step_of:
                recvs[(n, sid, m.group(1), int(m.group(2)))] = (t0, t1)
    xfers, warnings = [], []
    unnamed = 0
    for n, d in docs.items():
        for name, frm, to, key, sid, t0, dur in d["sends"]:
            m = _NUM.match(name)
            if not m or sid not in step_of:
                continue
            parts = key.split(";")
            dst = next((nn for dev, nn in dev_node.items() if len(parts) > 2 and parts[2].startswith(dev)), None)
            if dst is None or dst == n:
                continue
            r = recvs.get((dst, sid, m.group(1), int(m.group(2)) + 1))
            if r is None:
                continue
            worker, step = step_of[sid]
            pull = metas[n].get("role") == "server"
            if pull:
                var, agg_ops = g.variable(frm), []
            else:
                var, agg_ops = g.written_after(to)
            if var is None:
                unnamed += 1
                continue
            server = n if pull else dst
            xfers.append({"tensor": var["name"], "bytes": int(var.get("bytes") or 0), "phase": "pull" if pull else "push",
                          "src": n, "dst": dst, "worker": worker, "server": server, "step": step, "sid": sid,
                          "it": step - 1 if pull else step, "send": (t0, dur), "req": r[0], "arr": r[1],
                          "from": frm, "to": to, "agg_ops": agg_ops})
    if unnamed:
        warnings.append(f"{unnamed} transfer(s) carried no variable (cross-device control edges): not DFG transfers")
    # the step's variables: pushed and pulled (a read-only or write-only one is not a PS exchange)
    both = {x["tensor"] for x in xfers if x["phase"] == "push"} & {x["tensor"] for x in xfers if x["phase"] == "pull"}
    one_way = sorted({x["tensor"] for x in xfers} - both)
    if one_way:
        warnings.append(f"variable(s) {one_way} only read or only written by the workers: not in the DFG")
    variables = sorted(both)
    chunk = {v: i for i, v in enumerate(variables)}
    server_of: dict[str, str] = {}
    xfers = [x for x in xfers if x["tensor"] in chunk]
    for x in xfers:
        x["chunk"] = chunk[x["tensor"]]
        server_of.setdefault(x["tensor"], x["server"])
    man = Manifest(job="", framework="", comm_backend="", world_size=len(worker_node),
                   nodes={n: NodeInfo(host=h, role=ro, rank=rk) for n, _r, h, ro, rk in nodes},
                   iterations=[], extra={"link_model": link_model} if link_model else {})
    links = Links(man)
    last: dict[str, float] = {}
    for x in sorted(xfers, key=lambda x: x["arr"]):
        x["posted"] = max(x["send"][0], x["req"])
        dev = links.device(x["src"], x["dst"])
        x["rstart"] = min(max(x["posted"], last.get(dev, x["posted"])), x["arr"])
        last[dev] = x["arr"]
        x["txn"] = txn_id(TENSOR, x["phase"], 0 if x["phase"] == "push" else 1, x["chunk"], x["src"], x["dst"])
    # the PS's update of each pushed gradient: its kernels from the consumer to the variable write
    ops_by: dict[tuple[str, str], dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for n, d in docs.items():
        for name, _typ, sid, t0, dur, _th in d["ops"]:
            if sid in step_of:
                ops_by[(n, sid)][name].append((t0, dur))
    for x in xfers:
        if x["phase"] != "push":
            continue
        spans = [s for op in x["agg_ops"] for s in ops_by[(x["dst"], x["sid"])].get(op, ())]
        x["agg"] = (min(a for a, _ in spans), sum(b for _, b in spans)) if spans else None
    # per worker step: last update end, first read posted, last read arrival
    per_step: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for x in xfers:
        k = (x["worker"], x["step"])
        if x["phase"] == "push" and x["agg"] is not None:
            e = x["agg"][0] + x["agg"][1]
            per_step[k]["agg_end"] = max(per_step[k].get("agg_end", e), e)
        elif x["phase"] == "pull":
            per_step[k]["first_posted"] = min(per_step[k].get("first_posted", x["posted"]), x["posted"])
            per_step[k]["last_arr"] = max(per_step[k].get("last_arr", x["arr"]), x["arr"])
    have = defaultdict(set)
    for x in xfers:
        have[x["worker"]].add(x["step"])
    iters = {w: sorted(j for j in s if j - 1 in s and j + 1 in s and "agg_end" in per_step[(w, j - 1)]
                       and "first_posted" in per_step[(w, j)] and "first_posted" in per_step[(w, j + 1)])
             for w, s in have.items()}
    sid_of = {(w, j): sid for sid, (w, j) in step_of.items()}
    return {"xfers": xfers, "iters": iters, "per_step": per_step, "docs": docs, "metas": metas, "graph": g,
            "sid_of": sid_of, "warnings": warnings, "variables": variables, "server_of": server_of}


def job_transfers(manifest: Manifest, root: Path) -> dict[str, Any]:
    """The job's transfers as the reader pairs them (what tests and docs check).

    Parameters
    ----------
    manifest : Manifest
        The trace's manifest (``extra.strategy == "ps"``).
    root : Path
        The trace directory.

    Returns
    -------
    dict
        ``xfers``: one dict per transfer (``tensor``, ``phase``, ``src``, ``dst``, ``worker``,
        ``step``, ``it``, ``bytes``, ``posted``, ``arr``, ``rstart``, ``txn``, ``agg``);
        ``iters``: the iterations each worker node can replay; ``warnings``.
    """
    nodes = tuple((n, manifest.node_dir(n), i.host, i.role, i.rank) for n, i in sorted(manifest.nodes.items()))
    lm = str((manifest.extra or {}).get("link_model") or "")
    return _job(str(Path(root).resolve()), nodes, lm)


def read_node(manifest: Manifest, node: str, node_dir: Path) -> NodeTrace:
    """One task's events (module docstring): worker kernels, launch, transfers, the PS's updates."""
    from .tf import _nearest, classify
    job = job_transfers(manifest, _root(manifest, node, node_dir))
    role = manifest.nodes[node].role
    wanted = set(manifest.iterations) if manifest.iterations else None
    ok = {w: {j for j in its if wanted is None or j in wanted} for w, its in job["iters"].items()}
    rows: list[dict[str, Any]] = []
    for x in job["xfers"]:
        if x["it"] not in ok.get(x["worker"], ()):
            continue
        common = {"iteration": x["it"], "stream": "comm", "tensor": TENSOR, "phase": x["phase"],
                  "step": 0 if x["phase"] == "push" else 1, "chunk": x["chunk"], "txn": x["txn"], "bytes": x["bytes"]}
        if x["src"] == node:
            rows.append({**common, "kind": OpKind.SEND.value, "op": f"SEND {x['txn']}", "name": f"SEND {x['tensor']}",
                         "start": x["send"][0] / 1e3, "dur": x["send"][1] / 1e3, "peer": x["dst"]})
        if x["dst"] == node:
            rows.append({**common, "kind": OpKind.RECV.value, "op": f"RECV {x['txn']}", "name": f"RECV {x['tensor']}",
                         "start": x["rstart"] / 1e3, "dur": (x["arr"] - x["rstart"]) / 1e3, "peer": x["src"]})
            if x["phase"] == "push" and x["agg"] is not None:
                rows.append({"op": f"AGG {TENSOR} p{x['chunk']} {x['worker']}", "name": f"AGG {x['tensor']}",
                             "kind": OpKind.AGG.value, "iteration": x["it"], "start": x["agg"][0] / 1e3,
                             "dur": x["agg"][1] / 1e3, "tensor": TENSOR, "bytes": x["bytes"], "phase": "update",
                             "chunk": x["chunk"], "peer": x["worker"]})
    colls: list[dict[str, Any]] = []
    edges: list[tuple[str, str]] = []
    g = job["graph"]
    if role == "worker":
        kinds = classify(g.ops, g.succ)
        doc = job["docs"][node]
        its = ok.get(node, set())
        step_num = {sid: v["step"] for sid, v in doc["step_of"].items()}
        seen: dict[tuple[int, str], int] = defaultdict(int)
        first: dict[int, float] = {}
        for name, typ, sid, t0, dur, _th in doc["ops"]:
            j = step_num.get(sid)
            if j is None or j not in its or name not in g.ops:
                continue
            k = seen[(j, name)]
            seen[(j, name)] += 1
            rows.append({"op": name if k == 0 else f"{name}#{k}", "name": f"{name}:{typ}",
                         "kind": kinds.get(name, OpKind.FW).value, "iteration": j, "start": t0 / 1e3,
                         "dur": dur / 1e3, "stream": "compute"})
            first[j] = min(first.get(j, t0), t0)
        for j in sorted(its):
            prev, cur = job["per_step"][(node, j - 1)], job["per_step"][(node, j)]
            if j not in first:
                continue
            gap = max(0.0, cur["first_posted"] - prev["agg_end"]) + max(0.0, first[j] - cur["last_arr"])
            rows.append({"op": LAUNCH, "name": "step launch (update done .. reads posted, reads .. first kernel)",
                         "kind": OpKind.OTHER.value, "iteration": j, "start": prev["agg_end"] / 1e3, "dur": gap / 1e3})
        ran = {r["op"] for r in rows if r["kind"] in (OpKind.FW.value, OpKind.BW.value, OpKind.UPDATE.value)}
        edges = [(a, b) for a, bs in g.succ.items() for b in bs]
        edges += [(LAUNCH, op) for op in ran]
        pushes = [x for x in job["xfers"] if x["worker"] == node and x["phase"] == "push"]
        inputs = sorted({op for x in pushes for op in ([x["from"]] if x["from"] in ran
                                                        else _nearest(x["from"], g.pred, ran))}) or [LAUNCH]
        nbytes = {}
        for x in pushes:
            nbytes.setdefault(x["tensor"], x["bytes"])
        variables = [v for v in job["variables"] if v in nbytes]
        if variables:
            colls.append({"tensor": TENSOR, "op": "push_pull_step", "algorithm": "ps_step",
                          "bytes": sum(nbytes[v] for v in variables), "inputs": inputs, "outputs": [],
                          "params": variables,
                          "partitions": [{"bytes": nbytes[v], "server": job["server_of"][v], "variable": v}
                                         for v in variables]})
    if not rows:
        raise TraceFormatError(f"no replayable step of {node} (a worker step needs the steps before and after it "
                               "traced)", path=node_dir / "tf_ps_ops.json",
                               hint="profile more steps (--steps START:END with END-START >= 3)")
    return NodeTrace(events=make_events(rows, path=str(node_dir / "tf_ps_ops.json")), edges=edges,
                     collectives=colls, warnings=list(job["warnings"]))
