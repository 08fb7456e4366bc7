"""Critical-path strategy search (dPRO Alg. 1) with the §5.3 speed-ups.

One search step:

1. build the DFG of the current strategy, replay it, take the critical path;
2. memory: if the estimated peak exceeds the budget, apply the memory pass
   (recomputation / gradient accumulation) that gives the shorter time within
   the budget (once, before the throughput search);
3. computation segment: for consecutive computation ops (a, b) on the
   critical path, Theorem 3 (:func:`~.theory.theorem3_joint`) decides between
   no fusion, op fusion (Theorem 1) and op + tensor fusion, with the tensors'
   sync times at their optimal partition numbers;
4. communication segment: for consecutive tensor groups on the critical path,
   Theorem 2 decides tensor fusion; the optimal partition number of every
   group seen is found by grid search;
5. all decisions are applied to a new strategy and the whole DFG is replayed;
   kept if the iteration time improved, else the decisions are tried one at a
   time; the search stops when a step finds nothing (or on a budget).

Speed-ups (switchable, for ``bench/search_speed.py``):

* ``coarsened``: the unit of op fusion is a coarse group — a run of ops on a
  device ending with a tensor-producing op (dPRO Fig. 6) — instead of one op;
* ``partial_replay``: a tensor's sync time comes from replaying only its
  communication subgraph (built by the real topology code) instead of
  rebuilding and replaying the whole DFG;
* ``symmetry``: identical ranks — a decision is evaluated on one rank and
  applied to all (without it, the theorem is evaluated on every rank's copy
  and the cycle check runs on every rank); repeated blocks — sync times are
  memoised by (bytes, partitions), so equal-sized tensors of repeated blocks
  cost one partial replay.
"""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field, replace as dc_replace
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import numpy as np

from ..errors import DproError, GraphError, atomic_write_text
from ..graph.model import op_key
from ..graph.schemes import TensorGroup, get_scheme
from ..graph.topology import CommContext, Links
from ..replay import replay
from ..replay.engine import compile_graph
from ..trace import LAYER_KINDS, OpKind
from .memory import MemoryModel
from .passes import PASSES, GraphPass, PassRefused
from .state import (BaseJob, Strategy, build, condensed_graph, contract, fused_duration,
                    fused_name, group_name, initial_strategy, local_name)
from .theory import theorem2_fuse_tensors, theorem3_joint

CHECKPOINT_FORMAT = "dpro-optimize-checkpoint"


@dataclass
class SearchOptions:
    budget_s: float = 60.0
    max_steps: int = 50
    seed: int = 0
    coarsened: bool = True
    partial_replay: bool = True
    symmetry: bool = True
    partition_grid: tuple[int, ...] = (1, 2, 4, 8)
    min_partition_bytes: int = 4096
    memory_budget: int | None = None
    memory_model: MemoryModel = field(default_factory=MemoryModel)
    op_fusion: bool = True
    tensor_fusion: bool = True
    tensor_partition: bool = True
    extra_passes: list[type[GraphPass]] = field(default_factory=list)
    checkpoint: Path | None = None
    progress: Callable[[str], None] | None = None
    min_gain_us: float = 0.0


@dataclass
class SearchResult:
    before_us: float
    after_us: float
    initial: Strategy
    strategy: Strategy
    changes: list[dict[str, Any]]
    steps: int
    elapsed_s: float
    stopped: str                      # converged | time budget | step budget
    replays: int
    sync_evals: int
    memory: dict[str, Any]
    memory_before: dict[str, Any]


def terminal_progress(enabled: bool = True) -> Callable[[str], None] | None:
    """Progress lines on stderr when it is a terminal (quiet when piped)."""
    if not (enabled and sys.stderr.isatty()):
        return None
    return lambda msg: print(msg, file=sys.stderr, flush=True)


class Searcher:
    def __init__(self, base: BaseJob, opts: SearchOptions | None = None) -> None:
        self.base = base
        self.o = opts or SearchOptions()
        self.rng = random.Random(self.o.seed)
        self._sync_cache: dict[Any, float] = {}
        self._eval_cache: dict[str, tuple[float, Any, nx.DiGraph]] = {}
        self.replays = 0
        self.sync_evals = 0
        self._coarse = self._coarse_groups() if self.o.coarsened else {}
        self._inputs_of = self._tensor_inputs()
        self._cg: tuple[Strategy, nx.DiGraph] | None = None
        self._templates: dict[Any, Any] = {}
        self._deadline = float("inf")

    # ------------------------------------------------------------------ condensed graph (cycle checks)
    @property
    def check_nodes(self) -> list[str] | None:
        return self.base.nodes[:1] if self.o.symmetry else None

    def condensed_for(self, s: Strategy) -> nx.DiGraph:
        """The condensed graph of ``s`` (cached for the last state; updated in place by accepted passes)."""
        if self._cg is None or self._cg[0] != s:
            self._cg = (s, condensed_graph(self.base, s, self.check_nodes))
        return self._cg[1]

    def condensed_moved(self, old: Strategy, new: Strategy) -> None:
        if self._cg is not None and self._cg[0] == old:
            self._cg = (new, self._cg[1])

    # ------------------------------------------------------------------ evaluation
    def forget_evaluations(self) -> None:
        """Drop cached replays (after op or tensor costs of the base job changed)."""
        self._eval_cache.clear()

    def evaluate(self, s: Strategy) -> tuple[float, Any, nx.DiGraph]:
        key = json.dumps(s.to_json(), sort_keys=True)
        if key not in self._eval_cache:
            g = build(self.base, s)
            res = replay(g)
            self.replays += 1
            if len(self._eval_cache) >= 2:   # keep the last two (current state + last candidate)
                self._eval_cache.pop(next(iter(self._eval_cache)))
            self._eval_cache[key] = (res.iteration_time_us, res, g)
        return self._eval_cache[key]

    def sync_time(self, s: Strategy, group: tuple[str, ...], k: int) -> float:
        """Time to synchronise a tensor group split into ``k`` partitions."""
        ts = [self.base.tensors[t] for t in group]
        nbytes = sum(t.bytes for t in ts)
        t0 = ts[0]
        key: Any = (t0.algorithm, tuple(t0.participants), nbytes, k) if self.o.symmetry else (group, k)
        if key in self._sync_cache:
            return self._sync_cache[key]
        if time.perf_counter() > self._deadline:
            raise _OutOfTime()
        self.sync_evals += 1
        if self.o.partial_replay:
            val = self._sync_partial(ts, nbytes, k)
        else:
            val = self._sync_full(s, group, k)
        self._sync_cache[key] = val
        return val

    def _sync_partial(self, ts: list, nbytes: int, k: int) -> float:
        """Partial replay: only this tensor's communication subgraph (In -> SEND/RECV[/AGG] -> Out).

        The subgraph is built once per (algorithm, participants, k) by the real
        topology code at a nominal size and compiled; for another size only the
        SEND durations change (comm model at the scaled chunk bytes), so each
        estimate is one run of the compiled replay kernel.
        """
        t0 = ts[0]
        scheme = get_scheme(t0.algorithm, tensor=t0.name)
        servers = tuple(s for t in ts for s in t.servers) or tuple(
            n for n, i in self.base.manifest.nodes.items() if i.role == "server")
        tkey = (t0.algorithm, tuple(t0.participants), k, servers if scheme.uses_servers else ())
        tpl = self._templates.get(tkey)
        if tpl is None:
            nominal = 1 << 30
            g = nx.DiGraph()
            ctx = CommContext(graph=g, manifest=self.base.manifest, model=self.base.model,
                              links=Links(self.base.manifest))
            for c in scheme.collectives(scheme, TensorGroup(name="T", bytes=nominal, k=k,
                                                            participants=list(t0.participants),
                                                            servers=list(servers))):
                scheme.build(ctx, c)
            cg = compile_graph(g)
            sends = np.array([i for i, key in enumerate(cg.keys) if g.nodes[key]["kind"] == OpKind.SEND.value],
                             dtype=np.int64)
            frac = np.array([g.nodes[cg.keys[i]]["bytes"] / nominal for i in sends])
            lat = np.array([self.base.model.per_link.get(g.nodes[cg.keys[i]]["device"],
                                                         self.base.model.default).latency_us for i in sends])
            inv_bw = np.array([1e6 / self.base.model.per_link.get(g.nodes[cg.keys[i]]["device"],
                                                                  self.base.model.default).bandwidth_Bps
                               for i in sends])
            tpl = self._templates[tkey] = (cg, sends, frac, lat, inv_bw)
        cg, sends, frac, lat, inv_bw = tpl
        dur = cg.dur.copy()
        dur[sends] = lat + np.floor(frac * nbytes) * inv_bw
        return replay(dc_replace(cg, dur=dur)).makespan_us

    def _sync_full(self, s: Strategy, group: tuple[str, ...], k: int) -> float:
        """Strawman: rebuild and replay the whole DFG; sync time = last Out end - last In start."""
        name = group_name(group)
        if tuple(group) not in s.groups:   # a hypothetical fused group: fuse its members' groups first
            for t in group[1:]:
                i, j = s.group_of(group[0]), s.group_of(t)
                if i != j:
                    s = s.with_fused_groups(i, j)
            name = group_name(s.groups[s.group_of(group[0])])
        s2 = s.with_partitions(name, k)
        g = build(self.base, s2, check=False)
        res = replay(g)
        self.replays += 1
        names = {name} if k == 1 else {f"{name}#p{p}" for p in range(k)}
        idx = {key: i for i, key in enumerate(res.graph.keys)}
        ins = [res.start[idx[op_key(n, f"In {t}")]] for t in names for n in group_participants(self.base, group)
               if op_key(n, f"In {t}") in idx]
        outs = [res.end[idx[op_key(n, f"Out {t}")]] for t in names for n in group_participants(self.base, group)
                if op_key(n, f"Out {t}") in idx]
        return float(max(outs) - max(ins)) if ins and outs else 0.0

    def best_partition(self, s: Strategy, group: tuple[str, ...]) -> tuple[int, float]:
        if not self.o.tensor_partition:
            return 1, self.sync_time(s, group, 1)
        nbytes = sum(self.base.tensors[t].bytes for t in group)
        best = (1, self.sync_time(s, group, 1))
        for k in self.o.partition_grid:
            if k <= 1 or nbytes // k < self.o.min_partition_bytes:
                continue
            t = self.sync_time(s, group, k)
            if t < best[1] - 1e-9:
                best = (k, t)
        return best

    # ------------------------------------------------------------------ views
    def _tensor_inputs(self) -> dict[str, str]:
        """local op id -> base tensor it produces (last one wins)."""
        out = {}
        for t in self.base.tensors.values():
            for ops in t.inputs.values():
                for o in ops:
                    out[o] = t.name
        return out

    def _coarse_groups(self) -> dict[str, tuple[str, ...]]:
        """Coarsened view: per device, runs of FW/BW ops (topological order) closed by a tensor producer."""
        producers = {o for t in self.base.tensors.values() for ops in t.inputs.values() for o in ops}
        g = self.base.local
        nodes = self.base.nodes
        ref = nodes[0] if nodes else ""
        groups: dict[str, tuple[str, ...]] = {}
        cur: list[str] = []
        for k in nx.topological_sort(g):
            d = g.nodes[k]
            if d["node"] != ref:
                continue
            if d["kind"] not in LAYER_KINDS:
                cur = []
                continue
            o = local_name(k, ref)
            cur.append(o)
            if o in producers or d["kind"] == OpKind.FW.value and len(cur) >= 8:
                for x in cur:
                    groups[x] = tuple(cur)
                cur = []
        for x in cur:
            groups[x] = tuple(cur)
        return groups

    # ------------------------------------------------------------------ the search
    def run(self, initial: Strategy | None = None, *, resume: dict[str, Any] | None = None) -> SearchResult:
        t_start = time.perf_counter()
        o = self.o
        self._deadline = t_start + o.budget_s
        s0 = initial or initial_strategy(self.base)
        before_us = self.evaluate(s0)[0]
        mem_before = o.memory_model.estimate(self.base, s0)
        state, changes, steps = s0, [], 0
        if resume:
            state = Strategy.from_json(resume["strategy"])
            changes = list(resume.get("changes", []))
            steps = int(resume.get("steps", 0))
        best_us = self.evaluate(state)[0]
        say = o.progress or (lambda m: None)
        say(f"start: {before_us / 1e3:.3f} ms predicted ({len(self.base.tensors)} tensors, "
            f"{self.base.local.number_of_nodes()} computation ops)")
        if o.memory_budget is not None and not state.mem():
            state, best_us, ch = self._memory_step(state, best_us)
            changes += ch
        stopped = "converged"
        while True:
            if steps >= o.max_steps:
                stopped = "step budget"
                break
            if time.perf_counter() - t_start > o.budget_s:
                stopped = "time budget"
                break
            steps += 1
            try:
                cands = self._candidates(state)
            except _OutOfTime:
                stopped = "time budget"
                break
            improved = False
            if cands:
                all_state, applied = state, []
                for c in cands:
                    try:
                        nxt = c.apply_to(all_state, self)
                    except (PassRefused, KeyError, StopIteration):
                        continue
                    if nxt != all_state:
                        all_state = nxt
                        applied.append(c)
                if all_state != state:
                    improved, state, best_us = self._try(state, all_state, best_us, applied, changes, "batch")
                if not improved:
                    rest = list(cands[1:])
                    self.rng.shuffle(rest)      # --seed: order of the single-candidate retries
                    order = list(cands[:1]) + rest
                    for c in order[:6]:
                        if time.perf_counter() - t_start > o.budget_s:
                            break
                        try:
                            s2 = c.apply_to(state, self)
                        except (PassRefused, KeyError, StopIteration):
                            continue
                        ok, state, best_us = self._try(state, s2, best_us, [c], changes, "single")
                        if ok:
                            improved = True
                            break
            say(f"step {steps}: {best_us / 1e3:.3f} ms ({len(cands)} candidate(s), "
                f"{'improved' if improved else 'no improvement'})")
            self._checkpoint(state, changes, steps, before_us, best_us)
            if not improved:
                break
        mem = o.memory_model.estimate(self.base, state)
        return SearchResult(before_us=before_us, after_us=best_us, initial=s0, strategy=state, changes=changes,
                            steps=steps, elapsed_s=time.perf_counter() - t_start, stopped=stopped,
                            replays=self.replays, sync_evals=self.sync_evals, memory=mem, memory_before=mem_before)

    def _try(self, state, s2, best_us, cands, changes, how):
        try:
            t2 = self.evaluate(s2)[0]
        except GraphError:
            return False, state, best_us
        if t2 < best_us - self.o.min_gain_us - 1e-9:
            for c in cands:
                changes.append({"pass": c.pass_name, "args": c.args, "reason": c.reason,
                                "predicted_before_ms": best_us / 1e3, "predicted_after_ms": t2 / 1e3,
                                "applied_as": how})
            return True, s2, t2
        return False, state, best_us

    def _memory_step(self, state: Strategy, best_us: float):
        mm, budget = self.o.memory_model, self.o.memory_budget
        est = mm.estimate(self.base, state)
        if est["peak_bytes"] <= budget:
            return state, best_us, []
        options = [(PASSES["recomputation"](), {"enable": True})]
        options += [(PASSES["gradient_accumulation"](), {"steps": m}) for m in (2, 4, 8, 16)]
        best = None
        for p, args in options:
            s2 = p.apply(state, self.base, **args)
            peak = mm.estimate(self.base, s2)["peak_bytes"]
            if peak > budget:
                continue
            t = self.evaluate(s2)[0]
            if best is None or t < best[0]:
                best = (t, s2, p.name, args, peak)
            if p.name == "gradient_accumulation":
                pass
        if best is None:
            raise DproError(f"no memory pass brings the estimated peak ({est['peak_bytes']} B) under the budget "
                            f"({budget} B)", hint="raise --memory-budget")
        t, s2, name, args, peak = best
        ch = [{"pass": name, "args": args, "predicted_before_ms": best_us / 1e3, "predicted_after_ms": t / 1e3,
               "reason": f"estimated peak memory {est['peak_bytes']} B > budget {budget} B; "
                         f"{name} gives {peak} B with the shorter iteration time of the memory passes",
               "applied_as": "memory"}]
        return s2, t, ch

    # ------------------------------------------------------------------ candidates from the critical path
    def _candidates(self, state: Strategy) -> list["_Cand"]:
        _, res, g = self.evaluate(state)
        cp = [res.key(r) for r in res.critical_path()]
        nodes = g.nodes
        cands: list[_Cand] = []
        seen: set[Any] = set()
        fused_of = {fused_name(f): f for f in state.fusions}
        gname_to_idx = {group_name(gr): i for i, gr in enumerate(state.groups)}
        idx = {k: i for i, k in enumerate(res.graph.keys)}

        def base_ops(key: str) -> tuple[str, ...]:
            lo = local_name(key, nodes[key]["node"])
            return tuple(fused_of.get(lo, (lo,)))

        def tensor_group(ops: tuple[str, ...]) -> tuple[str, ...] | None:
            ts = [self._inputs_of[o] for o in ops if o in self._inputs_of]
            return state.groups[state.group_of(ts[-1])] if ts else None

        # ---- computation segment (Theorems 1 and 3)
        comp = [k for k in cp if nodes[k]["kind"] in LAYER_KINDS]
        if self.o.op_fusion:
            for a, b in zip(comp, comp[1:]):
                if nodes[a]["node"] != nodes[b]["node"] or nodes[a]["device"] != nodes[b]["device"] \
                        or not g.has_edge(a, b):
                    continue
                A, B = base_ops(a), base_ops(b)
                if self._coarse:
                    A = self._expand(A, state)
                    B = self._expand(B, state)
                    if set(A) & set(B):
                        continue
                if (A, B) in seen:
                    continue
                seen.add((A, B))
                ga, gb = tensor_group(A), tensor_group(B)
                t1, t2 = nodes[a]["dur"], nodes[b]["dur"]
                if self._coarse:
                    t1 = sum(self.base.local.nodes[op_key(nodes[a]["node"], x)]["dur"] for x in A
                             if op_key(nodes[a]["node"], x) in self.base.local) or t1
                    t2 = sum(self.base.local.nodes[op_key(nodes[b]["node"], x)]["dur"] for x in B
                             if op_key(nodes[b]["node"], x) in self.base.local) or t2
                tf = fused_duration(self.base, [t1, t2], A + B)
                T1 = self.best_partition(state, ga)[1] if ga else 0.0
                T2 = self.best_partition(state, gb)[1] if gb else 0.0
                T12 = T1 + T2
                if ga and gb and ga != gb and self.o.tensor_fusion:
                    T12 = self.best_partition(state, tuple(ga) + tuple(gb))[1]
                p0 = float(res.start[idx[a]])
                reps = 1 if self.o.symmetry else len(self.base.nodes)
                for _ in range(reps):   # without symmetry every rank's copy is checked
                    choice = theorem3_joint(p0, p0, t1, t2, tf, T1, T2, T12)
                if choice in ("op_fusion", "both"):
                    why = (f"critical path, computation segment: {a} -> {b}: Theorem 1/3 "
                           f"(t1={t1:.1f} t2={t2:.1f} fused={tf:.1f} T1={T1:.1f} T2={T2:.1f} T12={T12:.1f} us) "
                           f"-> {choice}")
                    cands.append(_Cand("op_fusion", {"a": list(A), "b": list(B)}, why))
                    if choice == "both" and ga and gb and ga != gb:
                        cands.append(_Cand("tensor_fusion", {"a": ga[0], "b": gb[0]},
                                           why + " (corresponding tensor fusion, Theorem 3)"))

        # ---- communication segment (Theorem 2) and partitions
        seq: list[int] = []
        for k in cp:
            t = nodes[k]["tensor"]
            if nodes[k]["kind"] in LAYER_KINDS or not t or nodes[k]["kind"] == OpKind.UPDATE.value:
                continue
            gi = gname_to_idx.get(t.rsplit("#p", 1)[0])
            if gi is not None and (not seq or seq[-1] != gi):
                seq.append(gi)
        for gi in seq:
            grp = state.groups[gi]
            k, _ = self.best_partition(state, grp)
            if k != state.parts(group_name(grp)) and ("part", grp) not in seen:
                seen.add(("part", grp))
                cands.append(_Cand("tensor_partition", {"tensor": grp[0], "k": k},
                                   f"critical path, communication segment: {group_name(grp)}: "
                                   f"grid search over {list(self.o.partition_grid)} partitions -> {k}"))
        if self.o.tensor_fusion:
            # neighbours in reduction order of each critical tensor group (the previous/next collective)
            pairs = set()
            for gi in seq:
                if gi > 0:
                    pairs.add((gi - 1, gi))
            first_send: dict[str, float] = {}
            if pairs:
                for i, key in enumerate(res.graph.keys):
                    d = nodes[key]
                    if d["kind"] == OpKind.SEND.value:
                        t = d["tensor"].rsplit("#p", 1)[0]
                        first_send[t] = min(first_send.get(t, float("inf")), float(res.start[i]))
            for g1, g2 in sorted(pairs):
                a, b = state.groups[g1], state.groups[g2]
                p1, p2 = self._ready(res, idx, a, state), self._ready(res, idx, b, state)
                # q0: when the link became free for tensor n-1 = start of its first transfer
                q0 = first_send.get(group_name(a), p1)
                T1 = self.best_partition(state, a)[1]
                T2 = self.best_partition(state, b)[1]
                T12 = self.best_partition(state, tuple(a) + tuple(b))[1]
                if theorem2_fuse_tensors(p1, max(p1, p2), q0, T1, T2, T12):
                    cands.append(_Cand("tensor_fusion", {"a": a[0], "b": b[0]},
                                       f"critical path, communication segment: {group_name(a)} + {group_name(b)}: "
                                       f"Theorem 2 (ready {p1:.1f}/{p2:.1f} us, link free {q0:.1f} us, T1={T1:.1f} T2={T2:.1f} "
                                       f"T12={T12:.1f} us) -> fuse"))
        for P in self.o.extra_passes:
            p = P()
            for args, why in p.propose(state, self.base, cp):
                cands.append(_Cand(p.name, args, why))
        return cands

    def _expand(self, ops: tuple[str, ...], state: Strategy) -> tuple[str, ...]:
        out = list(ops)
        for o in ops:
            for x in self._coarse.get(o, ()):
                if x not in out:
                    out.append(x)
        # keep whole existing fusion groups together
        for f in state.fusions:
            if set(f) & set(out):
                out += [x for x in f if x not in out]
        order = {o: i for i, o in enumerate(self._coarse_order())}
        return tuple(sorted(out, key=lambda x: order.get(x, 0)))

    def _coarse_order(self) -> list[str]:
        if not hasattr(self, "_order_cache"):
            ref = self.base.nodes[0]
            self._order_cache = [local_name(k, ref) for k in nx.topological_sort(self.base.local)
                                 if self.base.local.nodes[k]["node"] == ref]
        return self._order_cache

    def _ready(self, res, idx, grp, state) -> float:
        name = group_name(grp)
        k = state.parts(name)
        names = [name] if k == 1 else [f"{name}#p{p}" for p in range(k)]
        vals = [float(res.start[idx[op_key(n, f"In {t}")]]) for t in names
                for n in group_participants(self.base, grp) if op_key(n, f"In {t}") in idx]
        return max(vals) if vals else 0.0

    def _checkpoint(self, state, changes, steps, before_us, best_us) -> None:
        if self.o.checkpoint is None:
            return
        atomic_write_text(self.o.checkpoint, json.dumps({
            "format": CHECKPOINT_FORMAT, "version": 1, "strategy": state.to_json(), "changes": changes,
            "steps": steps, "before_us": before_us, "best_us": best_us}, indent=1))


def group_participants(base: BaseJob, group: tuple[str, ...]) -> list[str]:
    return list(base.tensors[group[0]].participants)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DproError(f"cannot read checkpoint: {exc}", path=path) from None
    if d.get("format") != CHECKPOINT_FORMAT:
        raise DproError("not a dpro optimize checkpoint", path=path)
    return d


class _OutOfTime(Exception):
    pass


@dataclass
class _Cand:
    pass_name: str
    args: dict[str, Any]
    reason: str

    def apply_to(self, state: Strategy, searcher: Searcher) -> Strategy:
        p = PASSES[self.pass_name]()
        cg = searcher.condensed_for(state)
        if self.pass_name == "op_fusion":
            a = [x for x in self.args["a"]]
            b = [x for x in self.args["b"] if x not in a]
            if not b:
                raise PassRefused("nothing to fuse")
            # cycle check on the condensed graph; with symmetry one rank stands for all
            new = p.apply(state, searcher.base, a=a, b=b, check=True, check_nodes=searcher.check_nodes,
                          condensed=cg)
            grp = next(f for f in new.fusions if set(a) <= set(f))
            cur = {o: fused_name(f) for f in state.fusions for o in f}
            for n in (searcher.check_nodes or searcher.base.nodes):
                contract(cg, {op_key(n, cur.get(o, o)) for o in grp}, op_key(n, fused_name(grp)))
        elif self.pass_name == "tensor_fusion":
            new = p.apply(state, searcher.base, **self.args)
            ga = state.groups[state.group_of(self.args["a"])]
            gb = state.groups[state.group_of(self.args["b"])]
            order = sorted((ga, gb), key=state.groups.index)
            contract(cg, {"TENSOR " + group_name(ga), "TENSOR " + group_name(gb)},
                     "TENSOR " + group_name(tuple(order[0]) + tuple(order[1])))
        else:
            new = p.apply(state, searcher.base, **self.args)
        searcher.condensed_moved(state, new)
        return new


__all__ = ["CHECKPOINT_FORMAT", "group_participants", "load_checkpoint", "Searcher", "SearchOptions",
           "SearchResult", "terminal_progress"]
