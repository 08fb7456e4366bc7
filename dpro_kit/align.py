"""Trace time alignment across machines (dPRO §4.2), as one convex program per round.

Every node records ``start`` on its own clock.  We estimate, per node ``n``, its
**clock offset** ``theta[n]``: how far node ``n``'s clock is ahead of the
reference node's (the first worker, ``theta = 0``).  Aligned time is
``raw - theta[n]``.  (Shifting every timestamp of node ``n`` by ``+d`` therefore
changes the recovered ``theta[n]`` by ``+d``.)

What the traces give us (derivation and assumptions in ``docs/alignment.md``):

* **records** - one per "data arrives at node r" event:

  - fine-grained (per-chunk SEND/RECV joined by transaction id and iteration):
    receiver r, its RECV launch ``start`` and ``end``, and one sender q with its
    SEND ``start``;
  - coarse (whole collectives, kind COMM, e.g. gloo): per (op id, iteration,
    rank r): r's start, its span end (:func:`comm_spans`), and *every other*
    rank q as a "sender" with q's COMM start: a collective cannot finish
    anywhere before every rank joined it (dependency constraints only).

* **adjusted duration** of a record (RECV start clipped by its senders'):
  ``D = (end - theta_r) - max(start - theta_r, max_q (S_q - theta_q))``.
  For a fixed *clip pattern* (which term attains the max) ``D`` is affine in
  theta: ``c - (theta_r - theta_q*)``, or the constant ``end - start``.

* **collective ends** (coarse traces): the same collective ends on all ranks at
  about the same time, ``sum_k sum_r huber(E_kr - theta_r - m_k - p_slot(r))``
  with a free common end per instance (:func:`_end_term`).  An offset whose
  error bound from the ends (:func:`_end_uncertainty`) exceeds
  ``undetermined_us`` is reported undetermined with the interval the
  constraints prove (:func:`_proven_bounds`).

* **clock probe** (``dpro profile`` traces, :mod:`dpro_torch.clockprobe`): ping-pong
  readings between rank 0 and one rank per other host prove ``t3 - t4 <= theta_peer -
  theta_0 <= t2 - t1`` per ping (:func:`probe_offsets`).  On collective-level traces the
  probe's estimate replaces the collective-end estimate of the probed machines, with the
  proven half-width as its error bound; on every trace its intervals join the proven bounds.

* **objective** ``alpha * sum_families Var(D) + beta * sum_machines spread(theta)``:
  a family is a group of records whose transfer times should be alike (same
  byte size over the same kind of link; coarse: the same tensor).  The
  variance is written as a weighted sum of squares of affine expressions of
  per-(family, sender->receiver pair) means, so the program is a small QP
  whatever the number of events.  ``spread`` is the sum of squared deviations
  of the offsets of nodes on one machine from their mean.

* **constraints** (every cross-node dependency holds after adjustment): for
  every record and sender q, ``end_r - theta_r >= S_q - theta_q``, i.e.
  ``theta_r - theta_q <= min(end_r - S_q)`` (one constraint per node pair).

``max`` inside a variance is not DCP (the clipped duration is concave in theta),
so the clip pattern is fixed from the current estimate, the QP is solved, the
pattern is recomputed from the new offsets, and this repeats until the pattern
no longer changes (a few rounds).  Infeasible constraint sets are negative
cycles of a difference-constraint graph; they are found before solving and
reported with the ops and nodes that contradict each other.
"""
from __future__ import annotations

import hashlib
import math
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import DproError, atomic_write_text
from .trace import TraceSet

ALIGN_VERSION = 4
ALIGNED_DIR = "aligned"
SOLVERS = ("CLARABEL", "OSQP", "SCS")

#: statistic of fine-grained records (see :func:`align`)
STATISTICS = ("min", "mean")
DEFAULT_STATISTIC = "min"
#: defaults of the objective weights (see docs/alignment.md)
DEFAULT_ALPHA = 1.0
DEFAULT_BETA = 100.0
#: weight of the squared violation of a coarse (collective) dependency, a soft constraint
DEFAULT_GAMMA = 100.0
#: Huber threshold (us) of the min-statistic terms: residuals beyond it count linearly
HUBER_US = 20.0
#: Huber threshold (us) of the collective end-agreement term (median-like below a few us)
END_HUBER_US = 5.0
#: an offset whose ~95 % uncertainty (us) from collective ends exceeds this is reported as
#: undetermined, with the interval the dependency constraints prove
UNDETERMINED_US = 100.0
#: a constraint with slack below this many microseconds is reported as binding
BINDING_TOL_US = 1.0
#: the clip-pattern iteration stops when no offset moves more than this between rounds
THETA_TOL_US = 0.01
#: and below minus this as violated (solver tolerance)
VIOLATION_TOL_US = 0.5


class NoCommunicationError(DproError):
    """The nodes never communicate in the trace, so their clocks cannot be related."""


@dataclass
class Records:
    """Flat arrays of the alignment inputs (times relative to ``base`` us)."""

    recv: np.ndarray          # int: receiver node index, per record
    start: np.ndarray         # float: receiver's own launch time (its clock)
    end_obj: np.ndarray       # float: best estimate of the completion (objective)
    end_con: np.ndarray       # float: completion upper bound (constraints; >= true completion)
    family: np.ndarray        # int: family index per record
    rec_op: np.ndarray        # per record: op id, node name, iteration (for messages)
    rec_node: np.ndarray
    rec_iter: np.ndarray
    cand_rec: np.ndarray      # int: record index, per sender candidate
    cand_node: np.ndarray     # int: sender node index
    cand_start: np.ndarray    # float: sender start (sender's clock)
    cand_op: np.ndarray       # per candidate: sender op id and node name
    cand_name: np.ndarray
    families: list[str]       # family names
    kind: str                 # fine | coarse | mixed
    coarse: np.ndarray        # bool: a coarse record (soft constraint, min statistic)
    minstat: np.ndarray | None = None  # bool: record uses the min statistic (default: the coarse ones)
    # collective ends, one row per (instance, rank): the end-agreement term (coarse traces)
    end_inst: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    end_node: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    end_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    instances: list[str] = field(default_factory=list)
    end_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    @property
    def use_min(self) -> np.ndarray:
        return self.coarse if self.minstat is None else self.minstat

    def desc(self, k: int) -> str:
        return _op_desc(self.rec_op[k], self.rec_node[k], self.rec_iter[k])

    def cand_desc(self, c: int) -> str:
        return f"op {self.cand_op[c]!r} on node {self.cand_name[c]!r}"


@dataclass
class AlignResult:
    """Offsets and the evidence for them; :meth:`to_json` is what ``dpro align --json`` prints."""

    offsets_us: dict[str, float]
    reference: str
    mode: str                                 # fine | coarse | mixed | skipped
    skipped: str | None = None                # why alignment was skipped
    status: str = "optimal"
    solver: str | None = None
    solve_time_s: float = 0.0
    rounds: int = 0
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    statistic: str = DEFAULT_STATISTIC
    n_records: int = 0
    n_families: int = 0
    n_constraints: int = 0
    objective: float | None = None
    residuals: dict[str, Any] = field(default_factory=dict)
    binding: list[dict[str, Any]] = field(default_factory=list)
    violated: list[dict[str, Any]] = field(default_factory=list)
    undetermined: list[str] = field(default_factory=list)
    fingerprint: str = ""
    #: the solver's estimate for every node (``offsets_us`` differs only for undetermined nodes)
    estimate_us: dict[str, float] = field(default_factory=dict)
    #: ~95 % half-width of offsets pinned by collective ends only (coarse traces)
    uncertainty_us: dict[str, float] = field(default_factory=dict)
    #: per non-reference node, [lo, hi] that the dependency constraints prove (None: unbounded)
    bounds_us: dict[str, list[float | None]] = field(default_factory=dict)
    #: per probed non-reference node: the clock probe's estimate, proven [lo, hi] and fastest round trip (us)
    probe_us: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": ALIGN_VERSION, "offsets_us": self.offsets_us,
            "convention": "offset = how far the node's clock is ahead of the reference's; aligned = raw - offset",
            "reference": self.reference, "mode": self.mode, "skipped": self.skipped, "status": self.status,
            "solver": self.solver, "solve_time_s": self.solve_time_s, "rounds": self.rounds,
            "alpha": self.alpha, "beta": self.beta, "statistic": self.statistic, "records": self.n_records, "families": self.n_families,
            "constraints": self.n_constraints, "objective": self.objective, "residuals": self.residuals,
            "binding": self.binding, "violated": self.violated, "undetermined": self.undetermined,
            "fingerprint": self.fingerprint, "estimate_us": self.estimate_us,
            "uncertainty_us": self.uncertainty_us, "bounds_us": self.bounds_us, "probe_us": self.probe_us,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AlignResult":
        return cls(offsets_us={k: float(v) for k, v in d["offsets_us"].items()}, reference=d["reference"],
                   mode=d["mode"], skipped=d.get("skipped"), status=d.get("status", "optimal"),
                   solver=d.get("solver"), solve_time_s=float(d.get("solve_time_s", 0.0)),
                   rounds=int(d.get("rounds", 0)), alpha=float(d.get("alpha", DEFAULT_ALPHA)),
                   beta=float(d.get("beta", DEFAULT_BETA)), statistic=str(d.get("statistic", DEFAULT_STATISTIC)),
                   n_records=int(d.get("records", 0)),
                   n_families=int(d.get("families", 0)), n_constraints=int(d.get("constraints", 0)),
                   objective=d.get("objective"), residuals=d.get("residuals", {}), binding=d.get("binding", []),
                   violated=d.get("violated", []), undetermined=d.get("undetermined", []),
                   fingerprint=d.get("fingerprint", ""), estimate_us=d.get("estimate_us", {}),
                   uncertainty_us=d.get("uncertainty_us", {}), bounds_us=d.get("bounds_us", {}),
                   probe_us=d.get("probe_us", {}))


# --------------------------------------------------------------------------- records from a trace

def _op_desc(op: Any, node: str, it: Any) -> str:
    return f"op {op!r} on node {node!r} (iteration {int(it)})"


def fine_records(ev: pd.DataFrame, index: dict[str, int], hosts: dict[str, str], base: float,
                 family: str = "size") -> pd.DataFrame:
    """SEND/RECV pairs joined by (txn, iteration): one row per RECV with its SEND's start."""
    recv = ev[(ev["kind"] == "RECV") & (ev["txn"] != "")]
    send = ev[(ev["kind"] == "SEND") & (ev["txn"] != "")]
    if recv.empty or send.empty:
        return pd.DataFrame()
    s = send[["txn", "iteration", "node", "start", "op"]].rename(
        columns={"node": "s_node", "start": "s_start", "op": "s_op"})
    s = s.drop_duplicates(["txn", "iteration"])
    r = recv[["txn", "iteration", "node", "start", "dur", "op", "bytes", "tensor"]]
    j = r.merge(s, on=["txn", "iteration"], how="inner")
    j = j[j["node"] != j["s_node"]]
    if j.empty:
        return j
    j = j.assign(recv=j["node"].astype(str).map(index).astype(int),
                 send=j["s_node"].astype(str).map(index).astype(int))
    start = j["start"].to_numpy(float) - base
    end = start + j["dur"].to_numpy(float)
    host_of = np.array([hosts[nd] for nd in sorted(index, key=index.get)], dtype=object)
    same = host_of[j["recv"].to_numpy()] == host_of[j["send"].to_numpy()]
    if family == "paper":   # dPRO's RECV op family: receiver, sender, tensor
        fam = ("recv " + j["node"].astype(str) + " <- " + j["s_node"].astype(str) + " " + j["tensor"].astype(str))
        fam = fam.to_numpy()
    else:                   # same-size transfers over the same kind of link take similar time
        nb = j["bytes"].to_numpy(dtype="int64")
        # sizes within ~1 % are one family (ring chunks of one tensor differ by a byte)
        binned = np.where(nb > 0, np.round(1.01 ** np.round(np.log(np.maximum(nb, 1)) / math.log(1.01))), 0)
        code = binned.astype("int64") * 2 + same.astype("int64")
        uniq, inv = np.unique(code, return_inverse=True)
        names = np.array(["recv ~%d B %s" % (u // 2, "intra-machine" if u % 2 else "inter-machine") for u in uniq],
                         dtype=object)
        fam = names[inv]
    return pd.DataFrame({
        "recv": j["recv"].to_numpy(), "start": start, "end_obj": end, "end_con": end,
        "family": fam, "node": j["node"].astype(str).to_numpy(),
        "op": j["op"].astype(str).to_numpy(), "iteration": j["iteration"].to_numpy(),
        "s_node_idx": j["send"].to_numpy(), "s_start": j["s_start"].to_numpy(float) - base,
        "s_node": j["s_node"].astype(str).to_numpy(), "s_op": j["s_op"].astype(str).to_numpy(),
        "coarse": False,
    })


#: readers whose COMM ``dur`` is not the span but a processor-sharing share of overlapped time
#: (torch-kineto: "time alone + equal share of overlapped time"); their spans are recovered
#: exactly by :func:`comm_spans`
SHARED_COMM_DUR_FORMATS = ("torch-kineto",)


def _processor_sharing_ends(starts: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Departure times of jobs arriving at ``starts`` with service ``shares`` under processor sharing.

    The inverse of the torch-kineto reader's ``_exclusive_ns`` (each active interval accrues
    ``dt / n_active``): an interval ends when its accrued share reaches its recorded share.
    """
    n = len(starts)
    order = np.argsort(starts, kind="stable")
    end = starts + shares
    rem: dict[int, float] = {}
    t, k = 0.0, 0
    while k < n or rem:
        if not rem:
            i = int(order[k])
            t, rem[i], k = float(starts[i]), float(shares[i]), k + 1
            continue
        nxt = float(starts[order[k]]) if k < n else math.inf
        j = min(rem, key=rem.__getitem__)
        done = t + rem[j] * len(rem)
        step = min(done, nxt) - t
        for i in rem:
            rem[i] -= step / len(rem)
        t += step
        if done <= nxt:
            end[j] = done
            del rem[j]
        else:
            i = int(order[k])
            rem[i], k = float(shares[i]), k + 1
    return end


def comm_spans(ts: TraceSet) -> pd.DataFrame:
    """COMM events with ``end``: when the collective really finished on that node (its span end).

    For readers in :data:`SHARED_COMM_DUR_FORMATS` the recorded ``dur`` is a share of
    overlapped time (shorter than the span), and the span is recovered by replaying the
    sharing rule; otherwise ``end = start + dur``.
    """
    ev = ts.events
    # parameter-server push-pull spans (phase push_pull, MXNet) are no rendezvous: the server
    # answers the workers' pulls one after another, so they do not end together (docs/ps.md)
    comm = ev[(ev["kind"] == "COMM") & (ev["phase"] != "push_pull")].copy()
    comm["end"] = comm["start"].to_numpy(float) + comm["dur"].to_numpy(float)
    if ts.manifest.raw_format in SHARED_COMM_DUR_FORMATS and not comm.empty:
        for _, g in comm.groupby("node", observed=True):
            comm.loc[g.index, "end"] = _processor_sharing_ends(g["start"].to_numpy(float), g["dur"].to_numpy(float))
    return comm


def coarse_records(ts: TraceSet, ev: pd.DataFrame, index: dict[str, int], base: float,
                   skip_tensors: set[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Whole collectives (kind COMM, one op id per collective and iteration) on >= 2 nodes.

    Returns ``(deps, ends)``.  ``deps``: one record per (rank r, other rank q) and instance:
    r's collective cannot end before q entered it (``end_r - theta_r >= start_q - theta_q``),
    a dependency constraint (soft, see docs/alignment.md).  ``ends``: one row per (instance,
    rank) with its end time: the same collective ends on all ranks within about one transfer
    step of each other, the objective term that pins the offsets.  An instance is the op id
    (``allreduce:bucket3``, ``broadcast#0``: collective type and per-iteration sequence number)
    in one iteration.  Ends are span ends (:func:`comm_spans`), not ``start + dur``.
    """
    comm = comm_spans(ts)
    if skip_tensors:
        comm = comm[~comm["tensor"].isin(list(skip_tensors))]
    empty = pd.DataFrame()
    if comm.empty:
        return empty, empty
    comm = comm.sort_values("start").drop_duplicates(["node", "op", "iteration"])
    rows, erows = [], []
    slot = _ring_slots(ts, list(index))
    for (op, it), grp in comm.groupby(["op", "iteration"], observed=True, sort=True):
        if grp["node"].nunique() < 2:
            continue
        nodes = grp["node"].astype(str).to_numpy()
        starts = grp["start"].to_numpy(float) - base
        ends = grp["end"].to_numpy(float) - base
        inst = f"{op} @{int(it)}"
        for i, n in enumerate(nodes):
            erows.append((inst, index[n], ends[i], slot[n]))
            for k, q in enumerate(nodes):
                if k != i:
                    rows.append((index[n], starts[i], ends[i], ends[i], f"collective {op}", n, str(op), int(it),
                                 index[q], starts[k], q, str(op), True))
    if not rows:
        return empty, empty
    return (pd.DataFrame(rows, columns=["recv", "start", "end_obj", "end_con", "family", "node", "op", "iteration",
                                        "s_node_idx", "s_start", "s_node", "s_op", "coarse"]),
            pd.DataFrame(erows, columns=["instance", "node", "end", "slot"]))


def _ring_slots(ts: TraceSet, nodes: list[str]) -> dict[str, int]:
    """Per node its slot ``rank position mod R`` when every machine holds R consecutive ranks
    (R > 1), else 0.  Rotating the ring by one machine maps the job onto itself, so ranks of one
    slot are equivalent: a systematic lateness of a ring position (e.g. the rank after the
    machine boundary) is the same on every machine and is fitted, not taken for an offset."""
    ring = sorted(nodes, key=lambda nd: ts.manifest.nodes[nd].rank)
    hosts = [ts.manifest.nodes[nd].host for nd in ring]
    n_hosts = len(set(hosts))
    per = len(ring) // n_hosts if len(ring) % n_hosts == 0 else 1
    blocks = [hosts[i:i + per] for i in range(0, len(ring), per)]
    if per < 2 or not all(len(set(b)) == 1 for b in blocks) or len({b[0] for b in blocks}) != n_hosts:
        return {nd: 0 for nd in nodes}
    return {nd: k % per for k, nd in enumerate(ring)}


def build_records(ts: TraceSet, family: str = "size") -> Records | None:
    """All alignment records of a trace, or None when there is no cross-node communication."""
    nodes = ts.nodes()
    index = {n: i for i, n in enumerate(nodes)}
    hosts = {n: ts.manifest.nodes[n].host for n in nodes}
    ev = ts.events
    base = float(ev["start"].min()) if len(ev) else 0.0
    fine = fine_records(ev, index, hosts, base, family)
    covered: set[str] = set()   # tensors with per-chunk events: their coarse COMM events add nothing
    if not fine.empty:
        recv = ev[(ev["kind"] == "RECV") & (ev["txn"] != "")]
        covered = set(recv["tensor"].astype(str))
    coarse, ends = coarse_records(ts, ev, index, base, covered)
    parts = [p for p in (fine, coarse) if not p.empty]
    if not parts:
        return None
    kind = "mixed" if len(parts) == 2 else ("fine" if not fine.empty else "coarse")
    cand = pd.concat(parts, ignore_index=True)
    # one record per (receiver, op, iteration, family); candidates hang off it
    key = (cand["node"] + "\x00" + cand["op"] + "\x00" + cand["iteration"].astype(str) + "\x00" + cand["family"]
           + "\x00" + np.where(cand["coarse"].to_numpy(bool), cand["s_node"], ""))
    codes, uniq = pd.factorize(key, sort=False)
    first = pd.Series(np.arange(len(cand))).groupby(codes).first().to_numpy()
    rec = cand.iloc[first]
    fam_codes, fam_names = pd.factorize(rec["family"], sort=True)
    return Records(
        recv=rec["recv"].to_numpy(int), start=rec["start"].to_numpy(float),
        end_obj=rec["end_obj"].to_numpy(float), end_con=rec["end_con"].to_numpy(float),
        family=np.asarray(fam_codes, dtype=int),
        rec_op=rec["op"].to_numpy(), rec_node=rec["node"].to_numpy(), rec_iter=rec["iteration"].to_numpy(),
        cand_rec=np.asarray(codes, dtype=int), cand_node=cand["s_node_idx"].to_numpy(int),
        cand_start=cand["s_start"].to_numpy(float),
        cand_op=cand["s_op"].to_numpy(), cand_name=cand["s_node"].to_numpy(),
        families=[str(f) for f in fam_names], kind=kind, coarse=rec["coarse"].to_numpy(bool),
        **_end_arrays(ends))


def _end_arrays(ends: pd.DataFrame) -> dict[str, Any]:
    if ends.empty:
        return {}
    codes, names = pd.factorize(ends["instance"], sort=False)
    return {"end_inst": np.asarray(codes, dtype=int), "end_node": ends["node"].to_numpy(int),
            "end_time": ends["end"].to_numpy(float), "instances": [str(x) for x in names],
            "end_slot": ends["slot"].to_numpy(int)}


# --------------------------------------------------------------------------- the optimisation

def _pair_bounds(rec: Records, n: int, coarse: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (sender q, receiver r) pair: the tightest bound ``theta_r - theta_q <= b`` and its candidate.

    ``coarse`` selects the records of whole collectives (soft constraints), else the
    fine-grained SEND/RECV ones (hard constraints)."""
    sel = np.flatnonzero(rec.coarse[rec.cand_rec] == coarse)
    r = rec.recv[rec.cand_rec[sel]]
    b = rec.end_con[rec.cand_rec[sel]] - rec.cand_start[sel]
    pair = r * n + rec.cand_node[sel]
    if not len(sel):
        return pair, b, sel
    order = np.lexsort((b, pair))
    pair_s = pair[order]
    firsts = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1]])
    idx = order[firsts]
    return pair[idx], b[idx], sel[idx]


def _check_feasible(rec: Records, nodes: list[str], pairs: np.ndarray, bounds: np.ndarray,
                    cand_idx: np.ndarray, path: str | None) -> None:
    """Difference constraints are infeasible iff their graph has a negative cycle: name it."""
    import networkx as nx
    n = len(nodes)
    g = nx.DiGraph()
    for p, b, c in zip(pairs, bounds, cand_idx):
        r, q = divmod(int(p), n)
        g.add_edge(q, r, weight=float(b), cand=int(c))   # theta_r <= theta_q + b
    src = n
    g.add_edges_from((src, i, {"weight": 0.0}) for i in range(n))
    try:
        cycle = nx.find_negative_cycle(g, src, weight="weight")
    except nx.NetworkXError:
        return
    total = sum(g[u][v]["weight"] for u, v in zip(cycle[:-1], cycle[1:]))
    if total > -VIOLATION_TOL_US:   # tolerance: sub-microsecond rounding is not a contradiction
        return
    parts = []
    for u, v in zip(cycle[:-1], cycle[1:]):
        c = g[u][v]["cand"]
        k = rec.cand_rec[c]
        parts.append(f"{rec.desc(k)} ends {g[u][v]['weight']:.1f} us after {rec.cand_desc(c)} starts")
    raise DproError(
        f"contradictory cross-node dependencies: no clock offsets satisfy them (the cycle "
        f"{' -> '.join(nodes[i] for i in cycle)} is short by {-total:.1f} us): " + "; ".join(parts),
        path=path, hint="a trace is broken (wrong timestamps, mixed-up runs or transaction ids); re-collect it")


def _clip_pattern(rec: Records, theta: np.ndarray) -> np.ndarray:
    """Per record: the candidate index that clips its start, or -1 when its own launch is latest."""
    adj = rec.cand_start - theta[rec.cand_node]
    order = np.lexsort((-adj, rec.cand_rec))
    rs = rec.cand_rec[order]
    firsts = order[np.r_[True, rs[1:] != rs[:-1]]]
    best = np.full(len(rec.recv), -1, dtype=int)
    best[rec.cand_rec[firsts]] = firsts
    own = rec.start - theta[rec.recv]
    has = best >= 0
    later = np.zeros(len(best), dtype=bool)
    later[has] = adj[best[has]] > own[has]
    best[~later] = -1
    return best


def _adjusted(rec: Records, theta: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """Adjusted durations D for a clip pattern."""
    d = rec.end_obj - rec.start
    m = clip >= 0
    c = clip[m]
    d[m] = (rec.end_obj[m] - theta[rec.recv[m]]) - (rec.cand_start[c] - theta[rec.cand_node[c]])
    return d


def _effective_clip(rec: Records, clip: np.ndarray) -> np.ndarray:
    """Min-statistic records count from their (one) sender's start: a minimum over iterations picks
    the iterations where that sender joined (sent) last by itself."""
    if not rec.use_min.any():
        return clip
    one = np.empty(len(rec.recv), dtype=int)
    one[rec.cand_rec] = np.arange(len(rec.cand_rec))
    return np.where(rec.use_min, one, clip)


def _in_objective(rec: Records, clip: np.ndarray) -> np.ndarray:
    """Fine-grained records whose adjusted duration is a transfer time: the clipped ones.

    ``clip`` is the real clip pattern (not :func:`_effective_clip`'s).  A fine-grained RECV that
    was posted after its SEND started (unclipped) mostly copies data that already arrived: its
    duration is not the transfer time and would bias the family mean (or minimum).  Coarse
    (whole-collective) records are dependency constraints only: a collective's duration is
    mostly waiting for the last rank, not a transfer time; their ends enter the objective
    through the end-agreement term (:func:`_end_term`).
    """
    return (clip >= 0) & ~rec.coarse


def _objective_terms(rec: Records, clip: np.ndarray, n: int):
    """Sufficient statistics per (family, pair): counts, means of c, weights; pair -1 means constant."""
    use = _in_objective(rec, clip)
    clip = _effective_clip(rec, clip)
    m = clip >= 0
    q = np.where(m, rec.cand_node[np.where(m, clip, 0)], -1)
    c = np.where(m, rec.end_obj - rec.cand_start[np.where(m, clip, 0)], rec.end_obj - rec.start)
    r = np.where(m, rec.recv, -1)
    q, c, r, fam_all, coarse = q[use], c[use], r[use], rec.family[use], rec.use_min[use]
    key = (fam_all.astype(np.int64) * (n + 1) + (r + 1)) * (n + 1) + (q + 1)
    uk, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    mu = np.bincount(inv, weights=c) / cnt
    mins = np.full(len(uk), np.inf)
    np.minimum.at(mins, inv, c)
    is_min = np.zeros(len(uk), dtype=bool)
    is_min[inv[coarse]] = True
    mu = np.where(is_min, mins, mu)
    fam = uk // ((n + 1) * (n + 1))
    rr = (uk // (n + 1)) % (n + 1) - 1
    qq = uk % (n + 1) - 1
    fam_size = np.bincount(fam_all, minlength=len(rec.families)).astype(float)
    groups = np.bincount(fam, minlength=len(rec.families)).astype(float)
    # mean statistic: weight = share of the family's records; min statistic: every pair counts once
    w = np.where(is_min, 1.0 / groups[fam], cnt / fam_size[fam])
    return fam, rr, qq, mu, w, is_min


def _difference_matrix(pairs: np.ndarray, n: int):
    import scipy.sparse as sp
    k = np.arange(len(pairs))
    vals = np.r_[np.ones(len(pairs)), -np.ones(len(pairs))]
    return sp.csr_matrix((vals, (np.r_[k, k], np.r_[pairs // n, pairs % n])), shape=(len(pairs), n))


def _solve_qp(rec: Records, clip: np.ndarray, n: int, ref: int, machines: list[list[int]], pairs: np.ndarray,
              bounds: np.ndarray, alpha: float, beta: float, solvers: tuple[str, ...],
              soft_pairs: np.ndarray | None = None, soft_bounds: np.ndarray | None = None, gamma: float = 0.0):
    import cvxpy as cp
    import scipy.sparse as sp

    fam, rr, qq, mu, w, is_min = _objective_terms(rec, clip, n)
    P = len(mu)
    F = len(rec.families)
    rows = np.flatnonzero(rr >= 0)
    A = sp.csr_matrix((np.r_[np.ones(len(rows)), -np.ones(len(rows))],
                       (np.r_[rows, rows], np.r_[rr[rows], qq[rows]])), shape=(P, n))
    E = sp.csr_matrix((np.ones(P), (np.arange(P), fam)), shape=(P, F))   # term -> its family
    theta = cp.Variable(n)
    center = cp.Variable(F)   # each family's common transfer time
    # residual of each (family, pair) statistic from its family's centre: mu_p - x_p - m_F.  For the
    # mean statistic, sum_p w_p res_p^2 at the optimal centre is the within-family variance (minus
    # the within-pair part, a constant); minima use a Huber loss, so that one family whose fastest
    # transfers are not alike (e.g. a token-bucket link's bursts) cannot drag the offsets (delta
    # HUBER_US: quadratic below, linear above)
    parts = []
    if P:
        res = mu - A @ theta - E @ center
        sq = np.flatnonzero(~is_min)
        hu = np.flatnonzero(is_min)
        if len(sq):
            parts.append(alpha * cp.sum_squares(cp.multiply(np.sqrt(w[sq]), res[sq])))
        if len(hu):
            parts.append(alpha * cp.sum(cp.multiply(w[hu], cp.huber(res[hu], HUBER_US))))
    if len(rec.end_time):
        parts.append(alpha * _end_term(rec, theta, n))
    # same-machine spread: (I - H) theta, H replaces each node's offset by its machine's mean
    hr, hc, hv = [], [], []
    for grp in machines:             # a machine with one node contributes a zero row
        for i in grp:
            hr.extend([i] * len(grp))
            hc.extend(grp)
            hv.extend([1.0 / len(grp)] * len(grp))
    if beta > 0 and any(len(g) > 1 for g in machines):
        H = sp.csr_matrix((hv, (hr, hc)), shape=(n, n))
        parts.append(beta * cp.sum_squares((sp.identity(n, format="csr") - H) @ theta))
    obj = cp.sum(cp.hstack(parts)) if len(parts) > 1 else parts[0]
    cons = [theta[ref] == 0]
    if len(pairs):
        cons.append(_difference_matrix(pairs, n) @ theta <= bounds)
    if soft_pairs is not None and len(soft_pairs) and gamma > 0:
        # squared hinge: violating a coarse dependency by v us costs gamma * v^2
        obj = obj + gamma * cp.sum_squares(cp.pos(_difference_matrix(soft_pairs, n) @ theta - soft_bounds))
    prob = cp.Problem(cp.Minimize(obj), cons)
    last_err = None
    for name in solvers:
        if name not in cp.installed_solvers():
            continue
        try:
            kw = {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iter": 200000, "polish": True} if name == "OSQP" else {}
            prob.solve(solver=name, **kw)
        except cp.error.SolverError as exc:
            last_err = exc
            continue
        if prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and theta.value is not None:
            return np.asarray(theta.value, dtype=float), name, prob.status, float(prob.value)
        if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            return None, name, prob.status, None
        last_err = RuntimeError(f"{name}: status {prob.status}")
    raise DproError(f"no solver could solve the alignment problem ({last_err})",
                    hint="install one of " + ", ".join(solvers) + " (pip install clarabel)")


def _end_term(rec: Records, theta: Any, n: int) -> Any:
    """End agreement of whole collectives: sum over instances k and ranks r of
    ``w_k huber(end_kr - theta_r - m_k, END_HUBER_US)`` with a free common end ``m_k`` per
    instance and ``w_k = 1 / ranks in k`` (every instance weighs the same).  With a small Huber
    threshold this is a median-like fit: a rank whose thread noticed the end late in a few
    instances cannot drag the offsets."""
    import cvxpy as cp
    import scipy.sparse as sp
    k = len(rec.instances)
    m = cp.Variable(k)
    rows = np.arange(len(rec.end_time))
    A = sp.csr_matrix((np.ones(len(rows)), (rows, rec.end_node)), shape=(len(rows), n))
    M = sp.csr_matrix((np.ones(len(rows)), (rows, rec.end_inst)), shape=(len(rows), k))
    w = 1.0 / np.bincount(rec.end_inst, minlength=k)[rec.end_inst]
    fit = A @ theta + M @ m
    n_slots = int(rec.end_slot.max()) + 1 if len(rec.end_slot) else 1
    if n_slots > 1:   # systematic lateness per ring slot (slot 0 is the reference)
        p = cp.Variable(n_slots - 1)
        sel = np.flatnonzero(rec.end_slot > 0)
        S = sp.csr_matrix((np.ones(len(sel)), (sel, rec.end_slot[sel] - 1)), shape=(len(rows), n_slots - 1))
        fit = fit + S @ p
    return cp.sum(cp.multiply(w, cp.huber(rec.end_time - fit, END_HUBER_US)))


def _end_corrected(rec: Records, theta: np.ndarray) -> np.ndarray:
    """``end_kr - theta_r`` less the median lateness of r's ring slot (see :func:`_ring_slots`)."""
    x = rec.end_time - theta[rec.end_node]
    if len(rec.end_slot) and rec.end_slot.max() > 0:
        x0 = x - pd.Series(x).groupby(rec.end_inst).transform("median").to_numpy(float)
        x = x - pd.Series(x0).groupby(rec.end_slot).transform("median").to_numpy(float)
    return x


def _end_residuals(rec: Records, theta: np.ndarray) -> np.ndarray:
    """``end_kr - theta_r - m_k`` (slot-corrected) with ``m_k`` the median over the instance's ranks."""
    x = _end_corrected(rec, theta)
    return x - pd.Series(x).groupby(rec.end_inst).transform("median").to_numpy(float)


def _end_uncertainty(rec: Records, theta: np.ndarray, machines: list[list[int]], ref: int) -> dict[int, float]:
    """Per node off the reference machine: a ~95 % bound (us) of the error of its offset.

    Per instance k, ``d_k`` = mean corrected end on the node's machine - mean on the reference
    machine; with the fitted offsets its median is ~0.  Statistical part: the standard error of
    a median, ``1.2533 * 1.4826 * MAD(d) / sqrt(K)``, times 1.96.  Systematic part: the
    offset must come out the same from each collective op alone and from each half of the
    iterations (a ring position or a link direction that ends late looks like an offset, and
    different buckets and times see it differently): the largest ``|median(d)|`` over these
    subsets.  The bound is the larger of the two.
    """
    if not len(rec.end_time):
        return {}
    x = pd.Series(_end_corrected(rec, theta))
    ref_grp = next(g for g in machines if ref in g)
    op_of = np.array([name.rsplit(" @", 1)[0] for name in rec.instances], dtype=object)
    it_of = np.array([int(name.rsplit(" @", 1)[1]) for name in rec.instances])
    ref_end = x[np.isin(rec.end_node, ref_grp)].groupby(rec.end_inst[np.isin(rec.end_node, ref_grp)]).mean()
    out: dict[int, float] = {}
    for grp in machines:
        if ref in grp:
            continue
        sel = np.isin(rec.end_node, grp)
        mine = x[sel].groupby(rec.end_inst[sel]).mean()
        d = (mine - ref_end).dropna()
        if d.empty:
            continue
        inst = d.index.to_numpy(int)
        dv = d.to_numpy(float)
        mad = float(np.median(np.abs(dv - np.median(dv))))
        half = 1.96 * 1.2533 * 1.4826 * mad / math.sqrt(len(dv))
        med_it = np.median(it_of[inst])
        subsets = [np.ones(len(dv), dtype=bool), it_of[inst] <= med_it, it_of[inst] > med_it]
        subsets += [op_of[inst] == o for o in np.unique(op_of[inst])]
        for sub in subsets:
            if sub.sum() >= 5:
                half = max(half, abs(float(np.median(dv[sub]))))
        for i in grp:
            out[i] = half
    return out


def _proven_bounds(n: int, ref: int, machines: list[list[int]], pairs: list[np.ndarray],
                   bounds: list[np.ndarray]) -> dict[int, tuple[float, float]] | None:
    """Per node, the interval of ``theta_n - theta_ref`` that the dependency constraints allow
    (shortest paths of the difference-constraint graph; nodes of one machine share a clock).
    None when the constraints contradict each other (a negative cycle)."""
    import networkx as nx
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for prs, bds in zip(pairs, bounds):
        for p, b in zip(prs.tolist(), bds.tolist()):
            r, q = divmod(int(p), n)
            if not g.has_edge(q, r) or g[q][r]["weight"] > b:
                g.add_edge(q, r, weight=float(b))     # theta_r <= theta_q + b
    for grp in machines:
        for a, b in zip(grp[:-1], grp[1:]):
            g.add_edge(a, b, weight=0.0)
            g.add_edge(b, a, weight=0.0)
    try:
        hi = nx.single_source_bellman_ford_path_length(g, ref, weight="weight")
        lo = nx.single_source_bellman_ford_path_length(g.reverse(copy=True), ref, weight="weight")
    except nx.NetworkXUnbounded:
        return None
    return {i: (-lo.get(i, math.inf), hi.get(i, math.inf)) for i in range(n)}


def _undetermined(rec: Records, n: int, ref: int, machines: list[list[int]]) -> list[int]:
    import networkx as nx
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(rec.recv[rec.cand_rec].tolist(), rec.cand_node.tolist()))
    for grp in machines:
        g.add_edges_from(zip(grp[:-1], grp[1:]))
    reach = nx.node_connected_component(g, ref)
    return [i for i in range(n) if i not in reach]


def _probe_pair(client: dict[str, Any], server: dict[str, Any], server_node: str) -> dict[str, float] | None:
    """``theta_server - theta_client`` (us) from one probed pair's readings, or None if unusable."""
    rows_c = (client.get("peers") or {}).get(server_node)
    rows_s = server.get("rows")
    if not isinstance(rows_c, list) or not isinstance(rows_s, list):
        return None
    skip = int(client.get("skip", 0) or 0)
    try:
        # t1 t4 t2 t3, ns since the epoch: differences in integers (a float64 of ~1.7e18 ns steps by 256 ns)
        t = np.array([[int(a), int(d), int(b), int(c)]
                      for (a, d), (b, c) in list(zip(rows_c, rows_s))[skip:]], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if len(t) < 1:
        return None
    t1, t4, t2, t3 = (t[:, j] for j in range(4))
    lo_i, hi_i = (t3 - t4) / 1e3, (t2 - t1) / 1e3
    rtt = ((t4 - t1) - (t3 - t2)) / 1e3
    mid = (lo_i + hi_i) / 2
    fast = np.argsort(rtt)[:max(3, len(rtt) // 4)]
    est = float(np.median(mid[fast]))
    lo, hi = float(lo_i.max()), float(hi_i.min())
    consistent = lo <= hi
    if not consistent:           # the intervals contradict each other (a clock stepped mid-probe): fastest ping only
        k = int(np.argmin(rtt))
        lo, hi = float(lo_i[k]), float(hi_i[k])
    return {"estimate_us": est, "lo_us": lo, "hi_us": hi, "rtt_min_us": float(rtt.min()), "pings": int(len(t)),
            "consistent": bool(consistent)}


def probe_offsets(ts: TraceSet) -> dict[str, dict[str, float]]:
    """Per node, its clock offset to the reference node (the first) from the clock probe.

    The collector (:mod:`dpro_torch.clockprobe`) pings one rank of every other host from
    rank 0; every node of a probed host gets that host's offset (one machine, one clock).

    Parameters
    ----------
    ts : TraceSet
        A trace whose manifest has ``extra.clock_probe`` (``dpro profile`` traces of multi-host
        DDP jobs); otherwise the result is empty.

    Returns
    -------
    dict
        node -> ``estimate_us`` (the median midpoint of the fastest quarter of the round trips:
        symmetric one-way delays), ``lo_us`` / ``hi_us`` (the intersection of every ping's
        causality interval: proven), ``rtt_min_us``, ``pings``, ``consistent`` (False when the
        intervals contradicted each other and only the fastest ping's is used); the reference
        node's host is not listed.

    References
    ----------
    .. [1] D. L. Mills, "Internet time synchronization: the Network Time Protocol", IEEE Trans.
           Communications 39(10), 1991 (the offset and delay of one exchange).
    """
    probes = ts.manifest.facts.clock_probe if hasattr(ts.manifest, "facts") else {}
    if not probes:
        return {}
    nodes = ts.nodes()
    host = {n: ts.manifest.nodes[n].host for n in nodes}
    clients = [n for n, d in probes.items() if d.get("role") == "client" and n in host]
    if len(clients) != 1:
        return {}
    client = clients[0]
    per_host: dict[str, dict[str, float]] = {host[client]: {"estimate_us": 0.0, "lo_us": 0.0, "hi_us": 0.0}}
    for n, d in probes.items():
        if d.get("role") != "server" or n not in host or d.get("peer") != client:
            continue
        r = _probe_pair(probes[client], d, n)
        if r is not None:
            per_host[host[n]] = r
    ref_host = host[nodes[0]]
    if ref_host not in per_host:
        return {}
    base = per_host[ref_host]
    out = {}
    for n in nodes:
        h = host[n]
        if h == ref_host or h not in per_host:
            continue
        r = per_host[h]
        # theta_n - theta_ref = (theta_h - theta_client) - (theta_ref - theta_client)
        out[n] = {"estimate_us": round(r["estimate_us"] - base["estimate_us"], 3),
                  "lo_us": round(r["lo_us"] - base["hi_us"], 3), "hi_us": round(r["hi_us"] - base["lo_us"], 3),
                  **{k: r[k] for k in ("rtt_min_us", "pings", "consistent") if k in r}}
    return out


def fingerprint(ts: TraceSet) -> str:
    """Identifies the trace content the offsets were computed from (cache key)."""
    ev = ts.events
    h = hashlib.sha256(json.dumps(ts.manifest.to_json(), sort_keys=True, default=str).encode())
    if len(ev):
        agg = ev.groupby("node", observed=True).agg(n=("start", "size"), s=("start", "sum"), d=("dur", "sum"),
                                                     lo=("start", "min"))
        h.update(agg.round(3).to_csv().encode())
    h.update(f"v{ALIGN_VERSION}".encode())
    return h.hexdigest()[:16]


def align(ts: TraceSet, *, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, family: str = "size",
          gamma: float = DEFAULT_GAMMA, solvers: tuple[str, ...] = SOLVERS, max_rounds: int = 6,
          statistic: str = DEFAULT_STATISTIC, undetermined_us: float = UNDETERMINED_US) -> AlignResult:
    """Estimate per-node clock offsets of ``ts`` (see the module docstring).

    ``statistic`` for fine-grained records: ``"min"`` (default) - per (family, sender->receiver
    pair) the fastest observed "SEND started -> RECV done" time, pooled across pairs like the
    coarse records; robust to one-sided delays (a descheduled thread only ever adds time) and
    independent of the clip pattern, hence exactly shift-equivariant.  ``"mean"`` - dPRO's
    variance of the clipped RECV durations themselves (clip pattern iterated).

    Parameters
    ----------
    ts : TraceSet
        The trace as loaded (each node on its own clock).
    alpha : float
        Weight of the RECV-family variance term (``dpro align --alpha``).
    beta : float
        Weight of the same-machine spread term.
    family : {"size", "paper"}
        Fine-grained RECV families: by transfer size and link kind, or dPRO's (receiver,
        sender, tensor).
    gamma : float
        Weight of the squared violation of a coarse (collective) dependency.
    solvers : tuple of str
        CVXPY solvers tried in order.
    max_rounds : int
        Rounds of "fix the clip pattern, solve, recompute the pattern".
    statistic : {"min", "mean"}
        See above.
    undetermined_us : float
        Coarse traces: an offset whose ~95 % error bound exceeds this is reported undetermined.

    Returns
    -------
    AlignResult
        Offsets (aligned = raw - offset), residuals, binding constraints, solve facts.

    Raises
    ------
    NoCommunicationError
        The nodes never communicate in the trace.
    DproError
        Contradictory dependencies (a broken trace), naming the ops and nodes.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.2 (trace time alignment) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    if statistic not in STATISTICS:
        raise DproError(f"unknown alignment statistic {statistic!r}", hint="use one of " + ", ".join(STATISTICS))
    t0 = time.perf_counter()
    nodes = ts.nodes()
    ref_name = nodes[0]
    fp = fingerprint(ts)
    zero = {n: 0.0 for n in nodes}
    hosts = {n: ts.manifest.nodes[n].host for n in nodes}
    if len(nodes) < 2:
        return AlignResult(offsets_us=zero, reference=ref_name, mode="skipped", status="skipped",
                           skipped="single-node job: nothing to align", fingerprint=fp)
    if len(set(hosts.values())) < 2:
        return AlignResult(offsets_us=zero, reference=ref_name, mode="skipped", status="skipped",
                           skipped=f"all {len(nodes)} nodes run on machine {next(iter(hosts.values()))!r} "
                                   "and share its clock", fingerprint=fp)
    rec = build_records(ts, family)
    if rec is None:
        raise NoCommunicationError("the nodes never communicate in the trace (no SEND/RECV pairs and no "
                                   "collective run on two or more nodes), so their clocks cannot be related",
                                   path=ts.path, hint="profile iterations that synchronise gradients")
    if statistic == "min":
        rec.minstat = np.ones(len(rec.recv), dtype=bool)
    n = len(nodes)
    ref = 0
    by_host: dict[str, list[int]] = {}
    for i, nd in enumerate(nodes):
        by_host.setdefault(hosts[nd], []).append(i)
    machines = list(by_host.values())
    pairs, bounds, cand_idx = _pair_bounds(rec, n)                 # fine-grained: hard
    spairs, sbounds, scand = _pair_bounds(rec, n, coarse=True)    # coarse: soft (see docs/alignment.md)
    _check_feasible(rec, nodes, pairs, bounds, cand_idx, ts.path)
    undet = _undetermined(rec, n, ref, machines)

    theta = np.zeros(n)
    clip = _clip_pattern(rec, theta)
    before = _adjusted(rec, theta, clip)
    use_before = _in_objective(rec, clip)
    if statistic == "min" and not rec.coarse.all():
        # start from the minima over *all* records (independent of any clip pattern, so the
        # estimate is shift-equivariant); the rounds below keep only the records whose RECV
        # waited for its SEND under the current offsets - a receiver that is systematically
        # late on one pair would otherwise inflate that pair's minimum
        every = _effective_clip(rec, np.full(len(rec.recv), -1))
        start, *_ = _solve_qp(rec, every, n, ref, machines, pairs, bounds, alpha, beta, solvers,
                              spairs, sbounds, gamma)
        if start is not None:
            start[undet] = 0.0
            theta = start
            clip = _clip_pattern(rec, theta)
    seen: list[tuple[float, np.ndarray, np.ndarray]] = []
    prev = None
    solver = status = None
    obj = None
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        new, solver, status, obj = _solve_qp(rec, clip, n, ref, machines, pairs, bounds, alpha, beta, solvers,
                                             spairs, sbounds, gamma)
        if new is None:   # cannot happen after the negative-cycle check, but never return a silent 0
            raise DproError(f"the alignment problem is {status} according to {solver}", path=ts.path,
                            hint="a trace is broken; re-collect it")
        new[undet] = 0.0
        theta = new
        new_clip = _clip_pattern(rec, theta)
        true_obj = _true_objective(rec, theta, new_clip, machines, alpha, beta)
        seen.append((true_obj, theta.copy(), new_clip))
        moved = float(np.max(np.abs(new - prev))) if prev is not None else np.inf
        prev = new
        if np.array_equal(new_clip, clip) or moved < THETA_TOL_US:
            break
        clip = new_clip
    best_obj, theta, clip = min(seen, key=lambda s: s[0])
    theta = theta - theta[ref]
    after = _adjusted(rec, theta, clip)

    # constraints after adjustment
    binding, violated = [], []
    for prs, bds, cids, kind in ((pairs, bounds, cand_idx, "hard"), (spairs, sbounds, scand, "soft")):
        pr, pq = prs // n, prs % n
        slack = bds - (theta[pr] - theta[pq])
        for k in np.argsort(slack):
            if slack[k] > BINDING_TOL_US:
                break
            c = cids[k]
            item = {"receiver": nodes[pr[k]], "sender": nodes[pq[k]], "slack_us": round(float(slack[k]), 3),
                    "constraint": kind, "op": rec.desc(rec.cand_rec[c]), "depends_on": rec.cand_desc(c)}
            (violated if slack[k] < -VIOLATION_TOL_US else binding).append(item)
    res = _residuals(rec, before, use_before, after, _in_objective(rec, clip), theta, machines, nodes)
    # what the data can pin: an offset from collective ends alone whose uncertainty is too large,
    # or with no communication path at all, is undetermined; it is reported with the interval the
    # dependency constraints prove, and applied as the point of that interval nearest to 0 (the
    # clocks as recorded, moved only as far as causality demands)
    estimate = theta.copy()
    unc = _end_uncertainty(rec, theta, machines, ref) if rec.kind == "coarse" else {}
    proven = _proven_bounds(n, ref, machines, [pairs, spairs], [bounds, sbounds])
    # the clock probe: its proven interval narrows every proven bound; on collective-level traces its
    # estimate (error <= the interval's half-width) replaces the one from collective ends
    probe = probe_offsets(ts)
    for i, nd in enumerate(nodes):
        p = probe.get(nd)
        if p is None:
            continue
        lo, hi = proven[i] if proven else (-math.inf, math.inf)
        if max(lo, p["lo_us"]) <= min(hi, p["hi_us"]):
            lo, hi = max(lo, p["lo_us"]), min(hi, p["hi_us"])
        else:   # the probe and the collectives disagree: the probe measured the clocks directly
            lo, hi = p["lo_us"], p["hi_us"]
        if proven is not None:
            proven[i] = (lo, hi)
        if rec.kind == "coarse" or i in undet:
            est = min(max(p["estimate_us"], lo), hi)
            estimate[i] = theta[i] = est
            unc[i] = max(est - lo, hi - est)
            undet = [j for j in undet if j != i]
    undet_all = sorted(set(undet) | {i for i, u in unc.items() if u > undetermined_us})
    for i in undet_all:
        lo, hi = proven[i] if proven else (-math.inf, math.inf)
        theta[i] = min(max(0.0, lo), hi)
    if unc:
        er = _end_residuals(rec, estimate)
        res["end_median_abs_us"] = {nodes[i]: round(float(np.median(np.abs(er[rec.end_node == i]))), 3)
                                    for i in range(n) if np.any(rec.end_node == i)}
    return AlignResult(
        offsets_us={nd: round(float(theta[i]), 3) for i, nd in enumerate(nodes)}, reference=ref_name,
        estimate_us={nd: round(float(estimate[i]), 3) for i, nd in enumerate(nodes)},
        uncertainty_us={nodes[i]: round(u, 3) for i, u in unc.items()},
        bounds_us={nd: [_finite_or_none(proven[i][0]), _finite_or_none(proven[i][1])]
                   for i, nd in enumerate(nodes) if i != ref} if proven else {},
        probe_us={nd: p for nd, p in probe.items()},
        mode=rec.kind + ("+probe" if probe else ""), status=str(status), solver=solver, solve_time_s=round(time.perf_counter() - t0, 4),
        rounds=rounds, alpha=alpha, beta=beta, statistic=statistic, n_records=len(rec.recv), n_families=len(rec.families),
        n_constraints=len(pairs) + len(spairs), objective=float(best_obj), residuals=res, binding=binding[:50],
        violated=violated, undetermined=[nodes[i] for i in undet_all], fingerprint=fp)


def _finite_or_none(x: float) -> float | None:
    return round(float(x), 3) if math.isfinite(x) else None


def _true_objective(rec: Records, theta: np.ndarray, clip: np.ndarray, machines: list[list[int]],
                    alpha: float, beta: float) -> float:
    use = _in_objective(rec, clip) & ~rec.use_min
    d = _adjusted(rec, theta, clip)[use]
    df = pd.DataFrame({"f": rec.family[use], "d": d})
    var = float(df.groupby("f")["d"].var(ddof=0).sum())
    if rec.use_min.any():   # min statistic: variance over pairs of the per-pair minima
        fam, rr, qq, mu, w, _ = _objective_terms(rec, clip, len(theta))
        sel = np.isin(fam, np.unique(rec.family[rec.use_min]))
        x = np.where(rr >= 0, theta[np.maximum(rr, 0)] - theta[np.maximum(qq, 0)], 0.0)
        val = (mu - x)[sel]
        f, ww = fam[sel], w[sel]
        m = np.bincount(f, weights=ww * val, minlength=len(rec.families))
        var += float(np.sum(ww * (val - m[f]) ** 2))
    if len(rec.end_time):
        r = np.abs(_end_residuals(rec, theta))
        hub = np.where(r <= END_HUBER_US, r ** 2, 2 * END_HUBER_US * r - END_HUBER_US ** 2)
        w = 1.0 / np.bincount(rec.end_inst)[rec.end_inst]
        var += float(np.sum(w * hub))
    spread = sum(float(np.sum((theta[g] - theta[g].mean()) ** 2)) for g in machines if len(g) > 1)
    return alpha * var + beta * spread


def _residuals(rec: Records, before: np.ndarray, use_before: np.ndarray, after: np.ndarray,
               use_after: np.ndarray, theta: np.ndarray, machines: list[list[int]], nodes: list[str]) -> dict[str, Any]:
    """Spread of adjusted durations per family (records in the objective), before and after alignment."""
    out: dict[str, Any] = {"family_std_us": {}}
    dev = np.full(len(after), np.nan)
    for f, name in enumerate(rec.families):
        mb, ma = (rec.family == f) & use_before, (rec.family == f) & use_after
        if not ma.any():
            continue
        mean_a = float(np.mean(after[ma]))
        dev[ma] = after[ma] - mean_a
        out["family_std_us"][name] = {"records": int(ma.sum()),
                                      "before": round(float(np.std(before[mb])), 3) if mb.any() else None,
                                      "after": round(float(np.std(after[ma])), 3), "mean_after": round(mean_a, 3)}
    ok = ~np.isnan(dev)
    out["rms_us"] = round(float(np.sqrt(np.mean(dev[ok] ** 2))), 3) if ok.any() else None
    out["per_node_rms_us"] = {nodes[i]: round(float(np.sqrt(np.mean(dev[ok & (rec.recv == i)] ** 2))), 3)
                              for i in range(len(nodes)) if np.any(ok & (rec.recv == i))}
    out["machine_spread_us"] = {str(nodes[g[0]]): round(float(np.ptp(theta[g])), 3) for g in machines if len(g) > 1}
    return out


# --------------------------------------------------------------------------- applying offsets, cache

def apply_offsets(ts: TraceSet, offsets_us: dict[str, float], *, clip_recv: bool = True) -> TraceSet:
    """A copy of ``ts`` with every node's ``start`` moved onto the reference clock.

    With ``clip_recv``, each RECV that has its SEND in the trace starts no earlier than the
    SEND (its duration becomes the transfer time, not the time it waited for the sender).
    Coarse collectives keep their durations: a reader may have set them to something other
    than end - start (e.g. an exclusive share), so clipping them is left to the cost model.
    Memory samples (``ts.memory``, ``dpro profile --memory``) move with their node's events.

    Parameters
    ----------
    ts : TraceSet
        The trace, each node on its own clock.
    offsets_us : dict
        Node -> its clock's offset from the reference clock (us; subtracted); absent: 0.
    clip_recv : bool
        Start each RECV no earlier than its SEND.
    """
    def shift(df: pd.DataFrame, col: str) -> pd.DataFrame:
        df = df.copy()
        off = df["node"].astype(str).map(lambda n: float(offsets_us.get(n, 0.0))).to_numpy(float)
        df[col] = df[col].to_numpy(float) - off
        return df

    ev = shift(ts.events, "start")
    memory = shift(ts.memory, "time") if ts.memory is not None else None
    if clip_recv:
        recv = (ev["kind"] == "RECV") & (ev["txn"] != "")
        send = (ev["kind"] == "SEND") & (ev["txn"] != "")
        if recv.any() and send.any():
            s = ev.loc[send, ["txn", "iteration", "start"]].drop_duplicates(["txn", "iteration"])
            s = s.rename(columns={"start": "s_start"})
            r = ev.loc[recv, ["txn", "iteration", "start", "dur"]].reset_index().merge(
                s, on=["txn", "iteration"], how="inner")
            late = r["s_start"] > r["start"]
            r = r[late]
            end = r["start"] + r["dur"]
            new_start = r["s_start"].to_numpy(float)
            ev.loc[r["index"].to_numpy(), "start"] = new_start
            ev.loc[r["index"].to_numpy(), "dur"] = np.maximum(0.0, end.to_numpy(float) - new_start)
    return replace(ts, events=ev, memory=memory if memory is not None else ts.memory)


_SAID: set[str] = set()


def _say_once(key: str, line: str) -> None:
    """Print ``line`` on stderr the first time ``key`` comes up in this process."""
    if key not in _SAID:
        _SAID.add(key)
        print(line, file=sys.stderr)


def cache_dir() -> Path:
    """Where alignment results are cached: ``$DPRO_CACHE/aligned`` (default ``~/.cache/dpro-kit/aligned``).

    ``DPRO_CACHE`` is the cache root every dpro-kit cache uses (``patches/horovod/build.sh``
    keeps its wheels under it too).  Nothing is ever written into a trace folder: trace
    folders may be read-only (a shared store) or under version control (``examples/traces``).
    """
    root = os.environ.get("DPRO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dpro-kit")
    return Path(root) / ALIGNED_DIR


def offsets_path(trace_dir: str | os.PathLike, ts: TraceSet | None = None, *, fp: str | None = None) -> Path:
    """The cache file of the alignment of the trace in ``trace_dir``.

    Parameters
    ----------
    trace_dir : str or PathLike
        The trace folder (its resolved path is part of the key, so copies of one trace are
        cached separately, as ``dpro align`` results with other options would be).
    ts : TraceSet or None
        The loaded trace; its content :func:`fingerprint` is the other part of the key, so a
        changed trace never gets an old result.  Loaded from ``trace_dir`` when None.
    fp : str or None
        ``fingerprint(ts)`` when the caller has it (it costs a pass over the events).
    """
    if fp is None:
        if ts is None:
            from .trace import load_trace
            ts = load_trace(trace_dir)
        fp = fingerprint(ts)
    key = hashlib.sha256(f"{Path(trace_dir).resolve()}\0{fp}".encode()).hexdigest()[:24]
    return cache_dir() / f"{key}.json"


def save_result(result: AlignResult, trace_dir: str | os.PathLike, ts: TraceSet | None = None) -> Path:
    """Cache ``result`` for the trace in ``trace_dir`` (atomic write under :func:`cache_dir`; returns the file).

    Parameters
    ----------
    result : AlignResult
        Offsets computed from the trace (``dpro align`` with any options); commands that
        align (``dpro replay`` ...) apply the cached result of a trace instead of solving.
    trace_dir : str or PathLike
        The trace folder (never written to).
    ts : TraceSet or None
        The loaded trace (saves reading it again).
    """
    p = offsets_path(trace_dir, ts, fp=result.fingerprint or None)
    doc = result.to_json()
    doc["trace_dir"] = str(Path(trace_dir).resolve())   # for a human looking at the cache
    atomic_write_text(p, json.dumps(doc, indent=1))
    return p


def load_cached(ts: TraceSet, trace_dir: str | os.PathLike) -> AlignResult | None:
    """The cached result if it was computed from exactly this trace content in this folder, else None."""
    fp = fingerprint(ts)
    p = offsets_path(trace_dir, fp=fp)
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        res = AlignResult.from_json(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if d.get("version") != ALIGN_VERSION or res.fingerprint != fp:
        return None
    if set(res.offsets_us) != set(ts.nodes()):
        return None
    return res


def align_cached(ts: TraceSet, trace_dir: str | os.PathLike | None = None, *, recompute: bool = False,
                 write: bool = True, **kw: Any) -> AlignResult:
    """Cached offsets of ``trace_dir`` when valid, else solve and (if possible) cache them.

    Parameters
    ----------
    ts : TraceSet
        The trace as loaded (not aligned).
    trace_dir : str or PathLike or None
        Its folder (default ``ts.path``); None: no cache.
    recompute : bool
        Solve even when a cached result is valid.
    write : bool
        Cache a freshly solved result (skipped jobs are free to recompute and are not cached).
    **kw
        Options of :func:`align`.
    """
    trace_dir = trace_dir if trace_dir is not None else ts.path
    if trace_dir is not None and not recompute:
        cached = load_cached(ts, trace_dir)
        if cached is not None:
            return cached
    res = align(ts, **kw)
    if trace_dir is not None and write and res.mode != "skipped":   # skipping is free to recompute
        try:
            save_result(res, trace_dir, ts)   # (keyed by res.fingerprint: no second pass over the events)
        except OSError as exc:   # an unwritable cache: the offsets are still used, just not cached
            _say_once("cache", f"dpro: note: cannot write the alignment cache in {cache_dir()} ({exc.strerror or exc}); "
                               "clocks are aligned again on every run (set DPRO_CACHE to a writable folder)")
    return res


def align_trace(ts: TraceSet, trace_dir: str | os.PathLike | None = None, *, recompute: bool = False,
                **kw: Any) -> tuple[TraceSet, AlignResult | None]:
    """``ts`` on one clock, and the alignment result applied (None when none was).

    Cached (or freshly solved, :func:`align_cached`) offsets applied, RECVs clipped by their
    SENDs.  A job whose nodes never communicate is returned unchanged, as is a skipped one
    (one node, one machine) without fine-grained RECVs; contradictory dependencies (a broken
    trace) raise :class:`DproError`.

    Parameters
    ----------
    ts : TraceSet
        The trace as loaded.
    trace_dir : str or PathLike or None
        Its folder, the cache key (default ``ts.path``).
    recompute : bool
        Solve even when a cached result is valid.
    **kw
        Options of :func:`align`.

    References
    ----------
    .. [1] Hu et al., "dPRO", MLSys 2022, §4.2 (trace time alignment).
    """
    try:
        res = align_cached(ts, trace_dir, recompute=recompute, **kw)
    except NoCommunicationError:
        return ts, None
    if res.mode == "skipped" and not ((ts.events["kind"] == "RECV") & (ts.events["txn"] != "")).any():
        return ts, None
    return apply_offsets(ts, res.offsets_us), res


def aligned_traceset(ts: TraceSet, trace_dir: str | os.PathLike | None = None, *, recompute: bool = False,
                     **kw: Any) -> TraceSet:
    """``ts`` on one clock (the TraceSet of :func:`align_trace`)."""
    return align_trace(ts, trace_dir, recompute=recompute, **kw)[0]


def shift_trace(ts: TraceSet, shifts_us: dict[str, float]) -> TraceSet:
    """A copy of ``ts`` with ``shifts_us[node]`` added to every start of that node (testing aid)."""
    ev = ts.events.copy()
    ev["start"] = ev["start"].to_numpy(float) + ev["node"].astype(str).map(
        lambda n: float(shifts_us.get(n, 0.0))).to_numpy(float)
    man = ts.manifest
    probes = (man.extra or {}).get("clock_probe")
    if isinstance(probes, dict) and any(shifts_us.get(n) for n in probes):
        man = replace(man, extra={**man.extra, "clock_probe": shift_probe_readings(probes, shifts_us)})
    return TraceSet(manifest=man, events=ev, edges=ts.edges, collectives=ts.collectives, path=None)


def shift_probe_readings(probes: dict[str, Any], shifts_us: dict[str, float]) -> dict[str, Any]:
    """``extra.clock_probe`` with every reading of node n moved by ``shifts_us[n]`` (its clock off)."""
    out = {}
    for n, d in probes.items():
        d_ns = round(float(shifts_us.get(n, 0.0)) * 1000)
        d = dict(d)
        if d_ns and d.get("role") == "client":
            d["peers"] = {q: [[a + d_ns, b + d_ns] for a, b in rows] for q, rows in (d.get("peers") or {}).items()}
        elif d_ns and d.get("role") == "server":
            d["rows"] = [[a + d_ns, b + d_ns] for a, b in (d.get("rows") or [])]
        out[n] = d
    return out


def shift_trace_dir(src: str | os.PathLike, dst: str | os.PathLike, shifts_us: dict[str, float]) -> Path:
    """Copy a trace directory to ``dst`` (native format) with per-node shifted timestamps."""
    from .trace import load_trace, save_trace
    return save_trace(shift_trace(load_trace(src), shifts_us), dst)


def format_report(res: AlignResult) -> str:
    """Human-readable summary for ``dpro align``."""
    lines = []
    if res.mode == "skipped":
        return f"alignment skipped: {res.skipped}"
    lines.append(f"aligned {len(res.offsets_us)} nodes from {res.n_records} {res.mode.split('+')[0]}-grained records in "
                 f"{res.n_families} families ({res.n_constraints} pairwise constraints); solver {res.solver} "
                 f"({res.status}), {res.rounds} round(s), {res.solve_time_s:.3f} s")
    lines.append(f"reference node {res.reference}; aligned = raw - offset")
    if res.probe_us:
        lines.append("clock probe (ping-pong with rank 0 when the window opened): " + "; ".join(
            f"{nd} {p['estimate_us']:.1f} us in [{p['lo_us']:.1f}, {p['hi_us']:.1f}] (fastest round trip "
            f"{p.get('rtt_min_us', float('nan')):.0f} us)" for nd, p in res.probe_us.items()))
    # residual: rms of adjusted transfer times (per-chunk), median |end - common end| (collectives)
    lines.append(f"{'node':<28}{'offset us':>14}{'resid us':>14}{'+- us (95%)':>13}  proven interval us")
    pn = {**res.residuals.get("per_node_rms_us", {}), **res.residuals.get("end_median_abs_us", {})}
    for nd, o in res.offsets_us.items():
        r, u, b = pn.get(nd), res.uncertainty_us.get(nd), res.bounds_us.get(nd)
        off = "UNDETERMINED" if nd in res.undetermined else f"{o:.3f}"
        lines.append(f"{nd:<28}{off:>14}{'' if r is None else f'{r:>14.3f}':>14}{'' if u is None else f'{u:>13.1f}':>13}"
                     + (f"  {_interval(b)}" if b else ""))
    fam = res.residuals.get("family_std_us", {})
    if fam:
        lines.append("families (std of adjusted durations, us, before -> after): " + "; ".join(
            f"{k}: {v['before'] if v['before'] is None else round(v['before'], 1)} -> {v['after']:.1f} "
            f"(n={v['records']})" for k, v in list(fam.items())[:8])
            + (" ..." if len(fam) > 8 else ""))
    lines.append(f"binding constraints: {len(res.binding)}; violated: {len(res.violated)}")
    for b in res.binding[:5]:
        lines.append(f"  binding: {b['op']} after {b['depends_on']} (slack {b['slack_us']} us)")
    for b in res.violated[:5]:
        lines.append(f"  VIOLATED: {b['op']} after {b['depends_on']} (slack {b['slack_us']} us)")
    if res.undetermined:
        lines.append("UNDETERMINED (no communication path to the reference, or collective ends too noisy to pin "
                     "the offset within the 95 % tolerance): " + "; ".join(
                         f"{nd}: offset in {_interval(res.bounds_us.get(nd))}"
                         + (f", estimate {res.estimate_us[nd]:.1f} +- {res.uncertainty_us[nd]:.0f}"
                            if nd in res.uncertainty_us and nd in res.estimate_us else "")
                         + f"; applied {res.offsets_us[nd]:.1f}" for nd in res.undetermined))
        lines.append("  (applied = the point of the proven interval nearest to 0: the clock as recorded unless "
                     "causality says otherwise; profile with --ring for per-chunk times that pin offsets to us)")
    return "\n".join(lines)


def _interval(b: list[float | None] | None) -> str:
    lo, hi = (b or [None, None])
    return f"[{'-inf' if lo is None else f'{lo:.1f}'}, {'+inf' if hi is None else f'{hi:.1f}'}] us"


__all__ = ["AlignResult", "NoCommunicationError", "align", "align_cached", "align_trace", "aligned_traceset", "cache_dir", "apply_offsets",
           "build_records",
           "fingerprint", "probe_offsets", "shift_probe_readings", "format_report", "load_cached", "offsets_path", "save_result", "shift_trace",
           "shift_trace_dir"]
