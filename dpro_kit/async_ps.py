"""Throughput of asynchronous parameter-server SGD for W workers, predicted from a 1-worker trace.

Li, Yan, Paolieri, Golubchik, *Throughput Prediction of Asynchronous SGD in TensorFlow*, ICPE'20
(``shared/seeds/004_*``), §3: a discrete-event simulation of W workers, each running SGD steps
sampled from the profiled ones, sharing the parameter server's downlink and uplink. The formulas,
and what this implementation takes from the trace, are written out in docs/async.md.

One step (:class:`StepTemplate`) is a DAG of ops, each on one resource of its worker:
``down`` (a variable sent PS -> worker), ``worker`` (a computation), ``up`` (a gradient sent
worker -> PS), ``ps`` (applying it on the PS). Per worker and resource a scheduler runs at most
one chunk at a time (Alg. 3.1); transfers are served by the link's HTTP/2 model (a stream is
first served up to ``WIN`` bytes, then re-queued and served to completion, §3.2.2); a link's
bandwidth is shared equally among the workers active on it (§3.1; or, ``sharing="arrival"``, by
arrival order with the newcomer share and goodput measured on the link, :func:`link_model`), and
with 2 PS a worker active on both gets at most ``1 - 1/n`` on the less loaded one (§5).
Computation is not shared (§3.2.3).
"""
from __future__ import annotations

import heapq
import json
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["StepOp", "StepTemplate", "template_from_trace", "simulate", "predict", "SimResult", "Prediction",
           "calibrate", "link_model"]

RESOURCES = ("down", "worker", "up", "ps")


@dataclass
class StepOp:
    """One op of a step: ``res`` in RESOURCES, ``work`` = us (worker/ps) or bytes (down/up),
    ``deps`` = indices of the ops it waits for, ``ps`` = the parameter server it talks to."""

    name: str
    res: str
    work: float
    deps: list[int] = field(default_factory=list)
    ps: int = 0


@dataclass
class StepTemplate:
    """The ops of one SGD step and, per profiled iteration, the durations of the compute ops."""

    ops: list[StepOp]
    samples: list[list[float]]            # per profiled step: work of every op (bytes unchanged)
    variables: dict[str, int] = field(default_factory=dict)   # variable -> bytes
    node: str = ""                        # the worker whose steps these are
    trace_workers: int = 1                # workers in the traced job (the method wants 1)

    def total_bytes(self, res: str) -> int:
        return int(sum(o.work for o in self.ops if o.res == res))


@dataclass
class SimResult:
    workers: int
    steps_per_s: float
    step_ms_mean: float
    completions: int
    finish_us: list[tuple[float, int]] = field(default_factory=list)   # (time, worker) of every completed step


# ----------------------------------------------------------------------------------------------
def template_from_trace(trace_dir: str | Path, *, node: str | None = None, num_ps: int = 1,
                        placement: dict[str, int] | None = None) -> StepTemplate:
    """Build the step DAG from a dpro_tf trace of the training step (collectors/tf).

    Parameters
    ----------
    trace_dir : path
        A ``dpro profile --framework tensorflow`` folder.
    node : str, optional
        The worker to use (default: the first).
    num_ps : int
        Parameter servers; without ``placement`` variables are placed greedily on the least
        loaded PS by bytes (the byte-balanced placement of §5 of the paper).
    placement : dict, optional
        Variable name -> PS index, as the real job placed them (TF2's ParameterServerStrategy
        places round-robin in creation order by default, which can be very uneven; the
        collector does not see it, ``examples/tf/train.py --strategy ps`` prints it).

    What comes from where: variables and their bytes from the traced graph (each
    ``ReadVariableOp``'s resource input and output bytes); a ``down`` op per variable read by the
    step, feeding the ops that consume its read; worker ops = the FW/BW/step-launch ops that ran,
    with each profiled iteration's durations, dependencies = the graph's, contracted to them;
    an ``up`` op per updated variable (its gradient, same bytes), after the nearest worker ops
    upstream of the update; a ``ps`` op per updated variable whose duration is the profiled
    UPDATE time split over the variables by bytes.

    A trace of a real ParameterServerStrategy job (``dpro profile`` on its coordinator, docs/tensorflow.md)
    gives more, measured: :func:`_template_from_ps_trace`.
    """
    from .trace import load_trace

    ts = load_trace(trace_dir)
    workers = ts.manifest.workers()
    node = node or workers[0]
    if (ts.manifest.extra or {}).get("strategy") == "ps" and ts.manifest.raw_format == "tf-xplane":
        tpl = _template_from_ps_trace(ts, Path(trace_dir), node, num_ps, placement)
    else:
        from .schema import MXNET_RAW_FORMAT
        if ts.manifest.raw_format == MXNET_RAW_FORMAT:
            tpl = _template_from_mxnet_trace(ts, Path(trace_dir), node, num_ps, placement)
        else:
            tpl = _template_from_step_trace(ts, Path(trace_dir), node, num_ps, placement)
    tpl.node, tpl.trace_workers = node, len(workers)
    return tpl


def _template_from_step_trace(ts: Any, trace_dir: Path, node: str, num_ps: int,
                              placement: dict[str, int] | None) -> StepTemplate:
    """:func:`template_from_trace` for a dpro_tf trace of the training step in one process."""
    from .readers.tf import _graph, classify
    ndir = Path(trace_dir) / (ts.manifest.nodes[node].dir or node)
    if ts.manifest.raw_format != "tf-xplane" and ts.manifest.nodes[node].format != "tf-xplane":
        from .errors import DproError
        raise DproError(f"async-predict needs a TensorFlow step trace or an MXNet parameter-server trace; "
                        f"this one is {ts.manifest.raw_format!r}",
                        path=trace_dir, hint="profile the training step with `dpro profile --framework tensorflow` (or an MXNet dist kvstore "
                             "job with `--framework mxnet`)")
    from .trace import read_json
    gdoc = read_json(ndir / "tf_graph.json", what="TensorFlow collector file tf_graph.json")
    gops, gedges = _graph(gdoc, ndir / "tf_graph.json")
    succ, pred = defaultdict(list), defaultdict(list)
    for a, b in gedges:
        succ[a].append(b)
        pred[b].append(a)
    kinds = classify(gops, succ)
    ev = ts.events[ts.events["node"] == node]
    iters = sorted(ev["iteration"].unique())
    dur = {(r.op, int(r.iteration)): float(r.dur) for r in ev.itertuples()}
    ran_kind = dict(zip(ev["op"], ev["kind"]))

    # variables and their reads
    var_bytes: dict[str, int] = {}

    def variable(ph: str) -> str:
        """The variable a resource input resolves to: walk up single-input edges (a nested function's
        argument -> the call's input) to the placeholder that captures it (``variable`` in the graph)."""
        n = ph
        for _ in range(32):
            info = gops.get(n, {}).get("variable")
            if info:
                var_bytes[info["name"]] = int(info["bytes"])
                return info["name"]
            ps = pred.get(n, [])
            if len(ps) != 1:
                break
            n = ps[0]
        return ph

    reads: dict[str, str] = {}   # ReadVariableOp name -> variable
    for name, o in gops.items():
        if o["type"] == "ReadVariableOp" and o.get("inputs"):
            v = variable(o["inputs"][0])
            reads[name] = v
            var_bytes[v] = max(var_bytes.get(v, 0), int(o.get("bytes") or 0))
    updates: dict[str, list[str]] = defaultdict(list)  # variable -> update ops writing it
    for name, o in gops.items():
        if kinds.get(name) is not None and kinds[name].value == "UPDATE" and o.get("inputs") and \
                (o["type"].startswith(("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter"))):
            updates[variable(o["inputs"][0])].append(name)
    worker_ops = [op for op, k in ran_kind.items() if k in ("FW", "BW", "OTHER") and op not in reads]
    wset = set(worker_ops)

    # PS placement: greedy by bytes (largest first onto the least loaded PS)
    load = [0] * num_ps
    ps_of: dict[str, int] = {}
    for v in sorted(var_bytes, key=lambda v: -var_bytes[v]):
        p = min(range(num_ps), key=lambda i: load[i])
        if placement is not None:
            p = int(placement.get(v, placement.get(v.split(":")[0], p))) % num_ps
        ps_of[v] = p
        load[p] += var_bytes[v]

    ops: list[StepOp] = []
    index: dict[str, int] = {}
    for op in worker_ops:
        index[op] = len(ops)
        ops.append(StepOp(op, "worker", 0.0))
    down_of: dict[str, int] = {}
    for v in sorted({reads[r] for r in reads if any(s in wset or s in reads for s in succ.get(r, ()))} |
                    {reads[r] for r in reads if _reaches(r, succ, wset)}):
        down_of[v] = len(ops)
        ops.append(StepOp(f"down:{v}", "down", float(var_bytes.get(v, 0)), ps=ps_of.get(v, 0)))

    def nearest_worker_preds(name: str) -> set[int]:
        out, seen, todo = set(), {name}, deque(pred.get(name, ()))
        while todo:
            n = todo.popleft()
            if n in seen:
                continue
            seen.add(n)
            if n in wset:
                out.add(index[n])
            elif n in reads:
                if reads[n] in down_of:
                    out.add(down_of[reads[n]])
            else:
                todo.extend(pred.get(n, ()))
        return out

    for op in worker_ops:
        ops[index[op]].deps = sorted(nearest_worker_preds(op) - {index[op]})
    upd_total = defaultdict(float)
    upd_ops = [op for op, k in ran_kind.items() if k == "UPDATE"]
    total_upd_bytes = sum(var_bytes.get(v, 0) for v in updates) or 1
    for v, writers in sorted(updates.items()):
        deps = set()
        for w in writers:
            deps |= nearest_worker_preds(w)
        deps -= {down_of.get(v, -1)}
        up = len(ops)
        ops.append(StepOp(f"up:{v}", "up", float(var_bytes.get(v, 0)), sorted(deps), ps=ps_of.get(v, 0)))
        ops.append(StepOp(f"apply:{v}", "ps", 0.0, [up], ps=ps_of.get(v, 0)))
        upd_total[v] = var_bytes.get(v, 0) / total_upd_bytes
    samples = []
    for it in iters:
        row = [o.work for o in ops]
        for op in worker_ops:
            row[index[op]] = dur.get((op, it), 0.0)
        ps_time = sum(dur.get((op, it), 0.0) for op in upd_ops)
        for i, o in enumerate(ops):
            if o.res == "ps":
                row[i] = ps_time * upd_total[o.name[len("apply:"):]]
        samples.append(row)
    return StepTemplate(ops=ops, samples=samples, variables=var_bytes)


def _template_from_ps_trace(ts: Any, trace_dir: Path, node: str, num_ps: int,
                            placement: dict[str, int] | None) -> StepTemplate:
    """The step DAG of one worker of a traced ParameterServerStrategy job (:mod:`dpro_kit.readers.tf_ps`).

    Measured where the step trace had to assume: the variables the step really moves (pushed and
    pulled) and their bytes; their PS (the job's own placement: the PS each transfer went to);
    the PS's update of each (its ``AGG``, per profiled iteration); the step's launch
    (``dpro/step_launch``: the last update's completion reaching the worker, the result to the
    coordinator, its next dispatch, until the reads are posted) as a ``worker`` op every read
    waits for. Worker ops = the worker's FW/BW kernels with each iteration's durations,
    dependencies the graph's (a kernel that consumes a read waits for that variable's ``down``);
    a variable's ``up`` waits for the kernels upstream of its gradient's ``_Send``.
    ``placement`` / ``num_ps`` override the traced placement (a what-if).
    """
    from .readers.tf import _nearest
    from .readers.tf_ps import LAUNCH, job_transfers

    man = ts.manifest
    job = job_transfers(man, trace_dir)
    g = job["graph"]
    servers = man.servers()
    ev = ts.events[ts.events["node"] == node]
    iters = sorted(int(i) for i in ev["iteration"].unique())
    dur = {(r.op, int(r.iteration)): float(r.dur) for r in ev.itertuples()}
    worker_ops = sorted(set(ev.loc[ev["kind"].isin(["FW", "BW", "UPDATE"]), "op"]))
    wset = set(worker_ops)
    mine = [x for x in job["xfers"] if x["worker"] == node]
    var_bytes = {x["tensor"]: x["bytes"] for x in mine}
    traced_ps = {x["tensor"]: servers.index(x["server"]) if x["server"] in servers else 0 for x in mine}
    ps_of = {}
    for v in var_bytes:
        p = traced_ps[v]
        if placement is not None:
            p = int(placement.get(v, placement.get(v.split(":")[0], p)))
        ps_of[v] = p % max(1, num_ps)
    read_var = {x["from"]: x["tensor"] for x in mine if x["phase"] == "pull"}
    ops: list[StepOp] = [StepOp(LAUNCH, "worker", 0.0)]
    index = {LAUNCH: 0}
    for op in worker_ops:
        index[op] = len(ops)
        ops.append(StepOp(op, "worker", 0.0))
    down_of = {}
    for v in sorted(set(read_var.values())):
        down_of[v] = len(ops)
        ops.append(StepOp(f"down:{v}", "down", float(var_bytes[v]), [0], ps=ps_of[v]))
    for op in worker_ops:
        deps, seen, todo = set(), {op}, deque(g.pred.get(op, ()))
        while todo:
            n = todo.popleft()
            if n in seen:
                continue
            seen.add(n)
            if n in wset:
                deps.add(index[n])
            elif n in read_var:
                deps.add(down_of[read_var[n]])
            else:
                todo.extend(g.pred.get(n, ()))
        ops[index[op]].deps = sorted(deps - {index[op]}) or [0]
    apply_of = {}
    for v in sorted({x["tensor"] for x in mine if x["phase"] == "push"}):
        x = next(x for x in mine if x["phase"] == "push" and x["tensor"] == v)
        src = [x["from"]] if x["from"] in wset else _nearest(x["from"], g.pred, wset)   # the gradient's producer
        deps = sorted(index[o] for o in src) or [0]
        up = len(ops)
        ops.append(StepOp(f"up:{v}", "up", float(var_bytes[v]), deps, ps=ps_of[v]))
        apply_of[v] = len(ops)
        ops.append(StepOp(f"apply:{v}", "ps", 0.0, [up], ps=ps_of[v]))
    agg = {}
    for r in ts.events[ts.events["kind"] == "AGG"].itertuples():
        if str(r.peer) == node:
            agg[(int(r.chunk), int(r.iteration))] = float(r.dur)
    chunk = {x["tensor"]: x["chunk"] for x in mine}     # the variable's partition (AGG events carry it)
    samples = []
    for it in iters:
        row = [o.work for o in ops]
        row[0] = dur.get((LAUNCH, it), 0.0)
        for op in worker_ops:
            row[index[op]] = dur.get((op, it), 0.0)
        for v, i in apply_of.items():
            row[i] = agg.get((chunk.get(v, -1), it), 0.0)
        samples.append(row)
    if not samples:
        from .errors import DproError
        raise DproError(f"no replayable step of {node} in the trace", path=trace_dir,
                        hint="profile more steps (--steps START:END with END-START >= 3)")
    return StepTemplate(ops=ops, samples=samples, variables=var_bytes)


def _template_from_mxnet_trace(ts: Any, trace_dir: Path, node: str, num_ps: int,
                               placement: dict[str, int] | None) -> StepTemplate:
    """The step DAG of one worker of a traced MXNet ``dist_async`` / ``dist_sync`` job (:mod:`dpro_kit.readers.mxnet`).

    MXNet's Gluon Trainer (``update_on_kvstore``) sends each parameter as one push-pull: the push of
    its gradient once the backward op that computes it has run, the server's update, then the pull of
    the new weight; the next step's forward waits for every pull.  So per partition of a parameter
    (``KVStoreDist::EncodeDefaultKey``, the reader's ``partitions``) an ``up`` op after its gate (the
    collective's input op), a ``ps`` op (the server's update: not traced, 0) and a ``down`` op after it,
    in the same step; worker ops = the worker's compute ops chained in their traced order, with each
    profiled iteration's durations (the reader's host gaps included; an op absent from a step costs 0
    there).  A partition's PS is its traced server; ``placement`` (parameter name -> PS index) or a
    different ``num_ps`` re-places it (``num_ps``: round-robin by partition, as MXNet's key hash
    spreads keys; a what-if).
    """
    man = ts.manifest
    servers = man.servers()
    ev = ts.events[(ts.events["node"] == node) & ts.events["kind"].isin(["FW", "BW", "OTHER"])]
    ev = ev.sort_values(["iteration", "start"], kind="stable")
    iters = sorted(int(i) for i in ev["iteration"].unique())
    order = list(dict.fromkeys(ev["op"].astype(str)))
    if not iters or not order:
        from .errors import DproError
        raise DproError(f"no compute op of {node} in the trace", path=trace_dir, hint="profile more steps")
    dur = {(str(r.op), int(r.iteration)): float(r.dur) for r in ev.itertuples()}
    ops: list[StepOp] = []
    index = {}
    for k, op in enumerate(order):
        index[op] = len(ops)
        ops.append(StepOp(op, "worker", 0.0, [k - 1] if k else []))
    var_bytes: dict[str, int] = {}
    n = 0
    for c in ts.collectives:
        if node not in c.participants:
            continue
        var_bytes[c.tensor] = int(c.bytes)
        gate = next((index[o] for o in c.inputs.get(node, []) if o in index), len(order) - 1)
        for part in (c.partitions or [{"bytes": c.bytes, "server": servers[0] if servers else ""}]):
            srv = part.get("server")
            p = servers.index(srv) if srv in servers else n
            if placement is not None and c.tensor in placement:
                p = int(placement[c.tensor])
            elif num_ps != max(1, len(servers)):
                p = n
            p %= max(1, num_ps)
            n += 1
            b = float(part.get("bytes") or 0)
            up = len(ops)
            ops.append(StepOp(f"up:{c.tensor}:{n}", "up", b, [gate], ps=p))
            ops.append(StepOp(f"apply:{c.tensor}:{n}", "ps", 0.0, [up], ps=p))
            ops.append(StepOp(f"down:{c.tensor}:{n}", "down", b, [up + 1], ps=p))
    if not var_bytes:
        from .errors import DproError
        raise DproError(f"no push-pull of {node} in the trace", path=trace_dir,
                        hint="async-predict needs a parameter-server job (a dist kvstore)")
    samples = []
    for it in iters:
        row = [o.work for o in ops]
        for op, i in index.items():
            row[i] = dur.get((op, it), 0.0)
        samples.append(row)
    return StepTemplate(ops=ops, samples=samples, variables=var_bytes)


def _reaches(start: str, succ: dict[str, list[str]], targets: set[str], limit: int = 10000) -> bool:
    seen, todo = {start}, deque(succ.get(start, ()))
    while todo and len(seen) < limit:
        n = todo.popleft()
        if n in targets:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(succ.get(n, ()))
    return False


# ----------------------------------------------------------------------------------------------
def link_model(doc: dict[str, Any], bandwidth_mbit: float, *, path: str | Path = "link file") -> dict[str, Any]:
    """The measured link properties :func:`simulate` takes, from a ``bench/link_sharing.py --out`` file.

    Per direction (``down`` = PS -> workers, ``up`` = workers -> PS), from the experiments at
    ``bandwidth_mbit`` (within 1 %):

    * ``newcomer_share``: one ``phi`` per repetition of the ``newcomer f`` experiments (worker 1
      alone from 0, worker 2 joins at ``f*T1``; worker 1 ends at ``e1``):
      ``phi = 1 - (1 - f) T1 / (e1 - f T1)``, clipped to [0, 0.95] (docs/async.md, "Link sharing").
    * ``goodput``: ``[1, g2, g3, ...]``, ``g_k`` = bytes of the k transfers / (k bytes at the
      one-transfer rate) over the time the link was busy with them, pooled over the repetitions
      (sum of ideal durations / sum of measured ones, at most 1): k = 2 from the ``newcomer`` and
      ``together 2`` experiments, k >= 3 from ``together k``.

    Returns ``{"bandwidth_mbit", "newcomer_share": {"down": [...], "up": [...]}, "goodput": {...}}``;
    DproError when the file has no experiments at that bandwidth.
    """
    from .errors import DproError
    res = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(res, dict) or not res:
        raise DproError("not a bench/link_sharing.py result (no 'results')", path=path,
                        hint="run `python bench/link_sharing.py --out FILE` on the emulated link")
    try:
        key = min(res, key=lambda k: abs(float(k) - bandwidth_mbit))
    except ValueError:
        raise DproError("a 'results' key is not a bandwidth", path=path, hint="keys are Mbit/s, e.g. '300'") from None
    if abs(float(key) - bandwidth_mbit) > 0.01 * bandwidth_mbit:
        raise DproError(f"no link experiments at {bandwidth_mbit:g} Mbit/s (measured: {', '.join(sorted(res))})",
                        path=path, hint="measure the link at this bandwidth with bench/link_sharing.py --bandwidths")
    try:
        t1, rows = res[key]["t1"], res[key]["rows"]
        phis: dict[str, list[float]] = {"down": [], "up": []}
        ideal: dict[tuple[str, int], float] = defaultdict(float)
        real: dict[tuple[str, int], float] = defaultdict(float)
        for name, reps in rows.items():
            part = name.split()
            if part[0] == "newcomer":
                d, f = part[1], float(part[2])
                for r in reps:
                    e1 = float(r["1"][1])
                    phis[d].append(min(0.95, max(0.0, 1 - (1 - f) * t1[d] / (e1 - f * t1[d]))))
                    ideal[(d, 2)] += 2 * t1[d]
                    real[(d, 2)] += max(float(v[1]) for v in r.values())
            elif part[0] == "together":
                d, k = part[1], int(part[2])
                for r in reps:
                    ideal[(d, k)] += k * t1[d]
                    real[(d, k)] += max(float(v[1]) for v in r.values())
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise DproError(f"malformed link experiment at {key} Mbit/s ({exc!r})", path=path,
                        hint="regenerate it with bench/link_sharing.py") from None
    goodput = {}
    for d in ("down", "up"):
        ks = sorted(k for dd, k in ideal if dd == d)
        # at most 1: above it is a client's fixed per-call time (in T1) overlapping another's transfer
        goodput[d] = [1.0] + [min(1.0, ideal[(d, k)] / real[(d, k)]) for k in ks if k >= 2]
        if not phis[d]:
            raise DproError(f"no newcomer experiment for {d!r} at {key} Mbit/s", path=path,
                            hint="regenerate it with bench/link_sharing.py")
    return {"bandwidth_mbit": float(key), "newcomer_share": phis, "goodput": goodput}


# ----------------------------------------------------------------------------------------------
class _Stream:
    __slots__ = ("op", "remaining", "served")

    def __init__(self, op: int, remaining: float):
        self.op, self.remaining, self.served = op, remaining, False


def simulate(tpl: StepTemplate, workers: int, *, bandwidth_mbit: float, steps: int = 200,
             win_bytes: float = 28e6, num_ps: int = 1, alpha_us_per_mb: float = 0.0, beta_us: float = 0.0,
             step_overhead_us: float = 0.0, start_spread_us: float = 0.0, warmup: int = 20,
             seed: int = 0, sharing: str = "equal", newcomer_share: Any = 0.5,
             goodput: Any = None, start_offsets_us: Sequence[float] | None = None,
             total_steps: int | None = None, reverse_path: str = "none") -> SimResult:
    """Alg. 3.1 of the paper for ``workers`` workers; returns the steps/s of all workers together.

    Parameters
    ----------
    tpl : StepTemplate
        The step DAG (:func:`template_from_trace`).
    workers : int
        W.
    bandwidth_mbit : float
        Each direction of the PS link (and of each worker's link), Mbit/s.
    steps : int
        Steps simulated per worker (sampled with replacement from ``tpl.samples``).
    win_bytes : float
        HTTP/2 flow-control window of the stream model (§3.2.2).
    num_ps : int
        Parameter servers (the ops' ``ps`` field says which one each transfer uses).
    alpha_us_per_mb, beta_us : float
        Parsing overhead of a received tensor, ``alpha * size + beta`` (§3.2.1), run after the
        transfer on the receiver's compute resource (worker for ``down``, ps for ``up``).
    step_overhead_us : float
        A fixed per-step delay before a step's first op (dispatch of the step; private, not shared).
    start_spread_us : float
        Workers other than the first start their first step at a uniformly random time in
        ``[0, start_spread_us)`` (the paper's simulation starts all at once; see docs/async.md).
    warmup : int
        Steps (all workers together) left out before throughput is measured (§4.1).
    seed : int
        Sampling seed.
    start_offsets_us : sequence of float, optional
        Worker w starts its first step at ``start_offsets_us[w]`` (instead of ``start_spread_us``).
    total_steps : int, optional
        A run of ``total_steps`` steps handed out to whichever worker is free, all workers starting
        at 0 (what ``ClusterCoordinator.schedule`` N times then ``join()`` does, as in
        bench/async_tf.py): throughput = ``total_steps`` / time the last one ends; ``steps`` and
        ``warmup`` are then not used. Default: every worker runs ``steps`` steps and the steady
        window after ``warmup`` is measured (§4.1).
    sharing : str
        How a link's bandwidth is split among the workers active on it. ``"equal"`` (default, the
        paper's §3.1): ``1/n`` each. ``"arrival"``: by arrival order on the link (docs/async.md,
        "Link sharing"): a worker's *session* on a link starts when it begins a chunk there with
        none running and lasts while it has one running; a session that started while ``m``
        others (still active) had started before it gets weight ``(phi / (1 - phi)) ** m``, the
        oldest weight 1 (sessions that start at the same instant are ordered at random: no two
        transfers reach a real queue at once); shares are the weights normalised. Two workers: the newcomer gets ``phi``, the incumbent ``1 - phi``;
        ``phi = 1/2`` is equal sharing, ``phi = 0`` first-come-first-served.
    newcomer_share : float, sequence of float, or {"down": ..., "up": ...}
        ``phi`` of ``sharing="arrival"``, in [0, 1): one value, or the values measured on the link
        (bench/link_sharing.py, :func:`link_model`), one drawn at random for every session that
        joins a link; per direction with a mapping.
    goodput : sequence of float or {"down": [...], "up": [...]}, optional
        ``goodput[k-1]`` = aggregate rate of ``k`` concurrent sessions on one link relative to one
        alone (1.0 for k = 1; the last value holds beyond), measured on the link; default all 1.
    reverse_path : str
        ``"none"`` (default, the paper's model): the two directions of a PS's link are independent.
        ``"window"``: every transfer touching a PS runs at the same rate when one direction of that
        PS's link holds a standing queue: with ``n_up`` uploads to the PS and ``n_down`` downloads from
        it at once and ``m = max(n_up, n_down) >= 2``, each direction's transfers together get at most
        ``n_x / m`` of the link (split in proportion to their shares), i.e. ``1/m`` each under equal
        sharing. Derivation (docs/async.md, "Reverse-path queueing: the equal-window rule"): all
        transfers are window-limited TCP flows with the same window ``C`` (BBR on identical links);
        ``m >= 2`` flows into one direction's shaper hold a queue of ``m·C`` bytes, ``m·C/B`` seconds,
        which every flow of the PS has on its round trip (its data or its acknowledgements cross
        it), so each runs at ``C / (m·C/B) = B/m``. One flow per direction builds no queue (each
        sender is paced to the link rate by its own shaper), so W = 1 is unchanged. No parameter.
    """
    if reverse_path not in ("none", "window"):
        raise ValueError(f"reverse_path must be 'none' or 'window', not {reverse_path!r}")
    if sharing not in ("equal", "arrival"):
        raise ValueError(f"sharing must be 'equal' or 'arrival', not {sharing!r}")

    def per_res(v: Any, default: list[float]) -> dict[str, list[float]]:
        if v is None:
            v = default
        if isinstance(v, dict):
            return {r: [float(x) for x in (v[r] if isinstance(v.get(r), (list, tuple)) else [v.get(r, default[0])])]
                    for r in ("down", "up")}
        vals = [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        return {"down": vals, "up": vals}
    phis = per_res(newcomer_share, [0.5])
    gps = per_res(goodput, [1.0])
    for r in ("down", "up"):
        if not phis[r] or not all(0.0 <= x < 1.0 for x in phis[r]):
            raise ValueError(f"newcomer_share ({r}) must be values in [0, 1), not {phis[r]!r}")
        if not gps[r] or not all(x > 0 for x in gps[r]):
            raise ValueError(f"goodput ({r}) must be positive, not {gps[r]!r}")
    lrng = random.Random(seed * 1_000_003 + 17)   # the link's draws; the steps' sampling stays as with "equal"
    rng = random.Random(seed)
    bpus = bandwidth_mbit * 1e6 / 8 / 1e6    # bytes per microsecond, whole link
    n_ops = len(tpl.ops)
    ndeps = [len(o.deps) for o in tpl.ops]
    dependents: list[list[int]] = [[] for _ in range(n_ops)]
    for i, o in enumerate(tpl.ops):
        for d in o.deps:
            dependents[d].append(i)
    ovh = [0.0] * n_ops
    for i, o in enumerate(tpl.ops):
        if o.res in ("down", "up") and (alpha_us_per_mb or beta_us):
            ovh[i] = alpha_us_per_mb * o.work / 1e6 + beta_us

    # per worker state
    waiting = [[0] * n_ops for _ in range(workers)]
    left = [0] * workers
    work = [None] * workers
    queues = [defaultdict(deque) for _ in range(workers)]   # (res, ps) -> deque of _Stream
    running: dict[tuple[int, str, int], list[Any]] = {}     # (w, res, ps) -> [stream, is_last, remaining]
    joined: dict[tuple[int, str, int], tuple[float, float]] = {}   # (w, res, ps) -> (start of its session, tie-break)
    ratio: dict[tuple[int, str, int], float] = {}           # (w, res, ps) -> phi / (1 - phi) of that session
    done_steps = [0] * workers
    completions: list[tuple[float, int]] = []
    now = 0.0
    extra: list[tuple[float, int, int]] = []   # (time, worker, op) pending private delays (overhead)

    def res_key(i: int) -> tuple[str, int]:
        o = tpl.ops[i]
        return (o.res, o.ps if o.res in ("down", "up", "ps") else 0)

    def start_chunk(w: int, key: tuple[str, int]) -> None:
        q = queues[w][key]
        if (w,) + key in running or not q:
            return
        s = q.popleft()
        res = key[0]
        if res in ("down", "up") and not s.served and s.remaining > win_bytes:
            chunk, last = win_bytes, False
            s.served = True
        else:
            chunk, last = s.remaining, True
        running[(w,) + key] = [s, last, chunk]
        if (w,) + key not in joined:
            # no two transfers reach a real queue at the same instant: ties go by a random draw
            joined[(w,) + key] = (now, lrng.random() if sharing == "arrival" else 0.0)
            if res in phis:
                p = phis[res]
                f = p[0] if len(p) == 1 else p[lrng.randrange(len(p))]
                ratio[(w,) + key] = f / (1.0 - f)

    def add_ready(w: int, i: int) -> None:
        queues[w][res_key(i)].append(_Stream(i, work[w][i]))
        start_chunk(w, res_key(i))

    def start_step(w: int, t: float) -> None:
        work[w] = tpl.samples[rng.randrange(len(tpl.samples))]
        waiting[w] = list(ndeps)
        left[w] = n_ops
        if step_overhead_us > 0:
            heapq.heappush(extra, (t + step_overhead_us, w, -1))
        else:
            for i in range(n_ops):
                if ndeps[i] == 0:
                    add_ready(w, i)

    def finish_op(w: int, i: int, t: float) -> None:
        left[w] -= 1
        for d in dependents[i]:
            waiting[w][d] -= 1
            if waiting[w][d] == 0:
                add_ready(w, d)
        if left[w] == 0:
            done_steps[w] += 1
            completions.append((t, w))
            if total_steps is not None:
                if handed[0] < total_steps:
                    handed[0] += 1
                    start_step(w, t)
            elif done_steps[w] < steps:
                start_step(w, t)

    handed = [0]     # steps handed out so far (total_steps)
    if total_steps is not None:
        if total_steps < workers:
            raise ValueError(f"total_steps ({total_steps}) must be at least the workers ({workers})")
        start_offsets_us, handed[0] = [0.0] * workers, workers
    if start_offsets_us is not None and len(start_offsets_us) != workers:
        raise ValueError(f"start_offsets_us has {len(start_offsets_us)} values for {workers} workers")
    for w in range(workers):
        if start_offsets_us is not None and start_offsets_us[w] > 0:
            heapq.heappush(extra, (float(start_offsets_us[w]), w, -2))
        elif start_offsets_us is None and start_spread_us > 0 and w > 0:   # the coordinator hands the first steps out one by one
            heapq.heappush(extra, (rng.uniform(0.0, start_spread_us), w, -2))
        else:
            start_step(w, 0.0)

    def rates() -> dict[tuple[int, str, int], float]:
        on_link: dict[tuple[str, int], list[tuple[int, str, int]]] = defaultdict(list)
        for k in running:
            if k[1] in ("down", "up"):
                on_link[(k[1], k[2])].append(k)
        share: dict[tuple[int, str, int], float] = {}     # of the link, before the worker's NIC cap
        for keys in on_link.values():
            n = len(keys)
            gp = gps[keys[0][1]]
            total = gp[min(n, len(gp)) - 1]
            if sharing == "equal" or n == 1:
                for k in keys:
                    share[k] = total / n
                continue
            # m = sessions still active that joined strictly before this one
            weight = {k: ratio[k] ** sum(1 for j in keys if joined[j] < joined[k]) for k in keys}
            wsum = sum(weight.values())
            for k in keys:
                share[k] = total * weight[k] / wsum
        if reverse_path == "window":
            for p in {p for _, p in on_link}:
                n = {res: len(on_link.get((res, p), ())) for res in ("down", "up")}
                m = max(n.values())
                if m < 2:
                    continue
                for res in ("down", "up"):
                    keys = on_link.get((res, p), ())
                    total = sum(share[k] for k in keys)
                    if n[res] < m and total > n[res] / m:
                        for k in keys:
                            share[k] *= n[res] / m / total
        out = {}
        links: dict[tuple[int, str], list[tuple[str, int]]] = defaultdict(list)
        for k in running:
            w, res, p = k
            if res in ("down", "up"):
                links[(w, res)].append(p)
            else:
                out[k] = 1.0
        for (w, res), ps in links.items():
            # §3.1: a PS link is shared equally by the workers active on it (cap 1/n); §5: a worker's
            # own NIC carries at most the whole bandwidth, filled max-min fair over its PS links
            # (alone on PS1 while sharing PS2 with n-1 others: 1/n to PS2, 1 - 1/n to PS1)
            caps = sorted((share[(w, res, p)], p) for p in ps)
            left = 1.0
            for j, (cap, p) in enumerate(caps):
                give = min(cap, left / (len(caps) - j))
                out[(w, res, p)] = give * bpus
                left -= give
        return out

    guard = 0
    while running or extra:
        guard += 1
        if guard > 50_000_000:
            raise RuntimeError("simulation did not finish")
        r = rates()
        dt, key = float("inf"), None
        for k, (s, last, rem) in running.items():
            t = rem / r[k] if r[k] > 0 else float("inf")
            if t < dt:
                dt, key = t, k
        if extra and extra[0][0] - now <= dt:
            t, w, i = heapq.heappop(extra)
            dt = t - now
            for k in running:
                running[k][2] -= r[k] * dt
            now = t
            if i == -2:
                start_step(w, now)
            elif i == -1:
                for j in range(n_ops):
                    if ndeps[j] == 0:
                        add_ready(w, j)
            else:
                finish_op(w, i, now)
            continue
        for k in running:
            running[k][2] -= r[k] * dt
        now += dt
        s, last, _ = running.pop(key)
        w, res, p = key
        if last:
            if ovh[s.op] > 0:   # parsing overhead: private delay on the receiver (§3.2.1)
                heapq.heappush(extra, (now + ovh[s.op], w, s.op))
            else:
                finish_op(w, s.op, now)
        else:
            s.remaining -= win_bytes
            queues[w][(res, p)].append(s)
        start_chunk(w, (res, p))
        if key not in running:      # the worker left the link: its session is over
            joined.pop(key, None)
            ratio.pop(key, None)
    completions.sort()
    if total_steps is not None:
        end = completions[-1][0]
        sps = len(completions) / (end / 1e6) if end > 0 else 0.0
        return SimResult(workers=workers, steps_per_s=sps, step_ms_mean=(workers / sps * 1e3) if sps else float("inf"),
                         completions=len(completions), finish_us=completions)
    end = min(max(t for t, ww in completions if ww == w) for w in range(workers))
    t0 = completions[min(warmup, len(completions) - 1)][0]
    n = sum(1 for t, _ in completions if t0 < t <= end)
    sps = n / ((end - t0) / 1e6) if end > t0 else 0.0
    return SimResult(workers=workers, steps_per_s=sps, step_ms_mean=(workers / sps * 1e3) if sps else float("inf"),
                     completions=len(completions), finish_us=completions)


@dataclass
class Prediction:
    workers: int
    steps_per_s: float           # mean over the seeds
    low: float
    high: float


def start_offsets(n: int, d: int) -> list[list[float]]:
    """``n`` points of ``[0, 1)^d`` that cover it evenly: the additive recurrence ``x_s = (1/2 + (s + 1) a) mod 1``
    with ``a_j = g^-(j+1)``, ``g`` the positive root of ``g^(d+1) = g + 1`` (M. Roberts' R_d sequence, a
    low-discrepancy sequence; d = 1: the golden ratio).

    :func:`predict` uses them as the start offsets of workers 2..W (fractions of one step): its
    prediction is the model's expectation over a uniform offset, and ``n`` random draws estimate it
    with an error of ``sd / sqrt(n)`` — measured on the TF W = 2 traces of docs/async.md, 8 random draws
    gave means 5-9 % apart from seed to seed, these 8 points are within ~1.5 % of a 32-point grid.
    """
    g = 2.0
    for _ in range(100):
        g = (1.0 + g) ** (1.0 / (d + 1))
    a = [g ** -(j + 1) for j in range(d)]
    return [[(0.5 + (s + 1) * aj) % 1.0 for aj in a] for s in range(n)]


def predict(tpl: StepTemplate, workers: Sequence[int], *, seeds: int = 8, **kw: Any) -> list[Prediction]:
    """Steps/s for every W in ``workers``: the mean over ``seeds`` simulations whose workers 2..W start at
    offsets within one 1-worker step spread evenly over all combinations (:func:`start_offsets`; docs/async.md:
    with equal sharing the interleaving the workers settle into depends on how they started, so the prediction
    is its expectation over a uniform offset); simulation ``s`` samples its steps with seed ``s``. With
    ``total_steps=N`` in ``kw``, ``seeds`` runs of N steps that all start together (their sampled
    steps and link draws differ).

    Parameters
    ----------
    tpl : StepTemplate
        The step DAG.
    workers : sequence of int
        The W values.
    seeds : int
        Simulations per W (W = 1 needs one).
    **kw
        Passed to :func:`simulate` (bandwidth_mbit, step_overhead_us, ...).
    """
    kw = dict(kw)
    kw.pop("start_spread_us", None)
    kw.pop("seed", None)
    if kw.get("total_steps"):     # a run of N steps handed out from a common start: every seed starts together
        out = []
        for w in workers:
            runs = [simulate(tpl, w, seed=s, **kw).steps_per_s for s in range(seeds if w > 1 else 1)]
            out.append(Prediction(w, sum(runs) / len(runs), min(runs), max(runs)))
        return out
    one = simulate(tpl, 1, **kw)
    step_us = 1e6 / one.steps_per_s if one.steps_per_s else 0.0
    out = []
    for w in workers:
        if w == 1:
            out.append(Prediction(1, one.steps_per_s, one.steps_per_s, one.steps_per_s))
            continue
        runs = [simulate(tpl, w, start_offsets_us=[0.0] + [step_us * x for x in pt], seed=s, **kw).steps_per_s
                for s, pt in enumerate(start_offsets(seeds, w - 1))]
        out.append(Prediction(w, sum(runs) / len(runs), min(runs), max(runs)))
    return out


def calibrate(tpl: StepTemplate, measured_1w: float, *, how: str = "bandwidth", **kw: Any) -> dict[str, float]:
    """Fit the one free constant to the measured 1-worker steps/s (the paper's 1-worker profile run).

    Parameters
    ----------
    tpl : StepTemplate
        The step DAG.
    measured_1w : float
        Steps/s of the real 1-worker, 1-PS job at ``kw["bandwidth_mbit"]``.
    how : str
        ``"bandwidth"``: the link's goodput ``B_eff`` (what the paper measured with iperf: protocol
        headers and framing on the wire), found by bisection so that the simulated W=1 matches;
        it is then shared like the link. ``"overhead"``: a private per-step delay
        ``c = 1/measured - T1(sim)`` instead. Falls back to ``overhead`` when no bandwidth reaches
        the measurement (the step is compute-bound).
    **kw
        The other :func:`simulate` arguments (``bandwidth_mbit`` required).

    Returns ``{"bandwidth_mbit": ..., "step_overhead_us": ..., "reached": ...}``: the first two to pass on
    to :func:`predict`; ``reached`` False when the simulated W=1 stays slower than the measurement at any
    bandwidth and with no overhead (the traced step itself is slower than the measured one, e.g. the
    profiler's cost on a loaded machine): then W=1 is not calibrated and the predictions are low.
    """
    kw = dict(kw)
    b = float(kw.pop("bandwidth_mbit"))
    kw.pop("step_overhead_us", None)
    one = lambda bw: simulate(tpl, 1, bandwidth_mbit=bw, **kw).steps_per_s  # noqa: E731
    if how == "bandwidth" and one(b * 100) > measured_1w:
        lo, hi = b / 100, b * 100
        for _ in range(60):
            mid = (lo * hi) ** 0.5
            if one(mid) < measured_1w:
                lo = mid
            else:
                hi = mid
        return {"bandwidth_mbit": (lo * hi) ** 0.5, "step_overhead_us": 0.0, "reached": True}
    base = one(b)
    c = 1e6 / measured_1w - 1e6 / base
    return {"bandwidth_mbit": b, "step_overhead_us": max(0.0, c), "reached": c >= 0.0}
