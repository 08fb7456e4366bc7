"""Array-native compile: the replay arrays straight from a trace's tables, without networkx.

``compile_graph(build_global_dfg(ts))`` builds a networkx graph of every op of every rank and
then flattens it; at 1,024 ranks that graph costs ~30 µs and ~3 KB per op (``docs/scale.md``).
:func:`compile_trace` produces the **same** :class:`~dpro_kit.replay.CompiledGraph` (same keys,
arrays, devices, tie-breaks and iteration edges, so the same replay op for op) from the event
table, the dependency lists and the collectives, for the jobs it covers:

* every collective's scheme is a barrier (``nccl``: plain torch.profiler traces, docs/kineto.md),
* the profiled configuration (no fusions, no re-bucketing, no memory options), synchronous
  iterations (``STEP_END`` per node, :func:`dpro_kit.graph.build.add_iteration_boundaries`),
* every op a dependency list or a collective names was traced.

Anything else returns None and the caller builds the networkx graph (``compile_trace_or_graph``
does both).  It reproduces, in arrays, each step of ``Job.from_trace`` + ``build`` + the
``nccl`` scheme + the iteration rule + ``compile_graph``, including the order networkx would
keep (ops in insertion order, each op's successors in the order their first edge was added),
because the order sets the replay's last tie-break.  ``tests/test_graph_arrays.py`` checks
equality with the networkx path on generated jobs and on real HTA Kineto traces.

References
----------
.. [1] Hu et al., "dPRO", MLSys 2022, §4.1 (global DFG) and §4.3 (replayer)
       (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
"""
from __future__ import annotations

import gc
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

try:    # numba reads the Arrow buffers at their addresses (_encode_all); without it _encode uses Arrow
    from numba import carray
    from numba.core import cgutils, types
    from numba.extending import intrinsic
except Exception:  # pragma: no cover - exercised only without numba
    carray = None

    def intrinsic(f):  # type: ignore[misc]
        return f

from ..replay._kernel import njit
from ..trace import COMM_KINDS, OpKind, TraceSet

__all__ = ["compile_trace", "compile_trace_or_graph"]

_NOT_FIRST = {OpKind.VIRTUAL.value, OpKind.SEND.value, OpKind.RECV.value}
#: the dense ``node x op-name`` table is used while it has at most ``a * rows + b`` entries (else a hash)
_DENSE_LIMIT = (8, 1 << 20)


def compile_trace(ts: TraceSet) -> Any:
    """``compile_graph(build_global_dfg(ts))`` computed from the tables, or None when not covered.

    Parameters
    ----------
    ts : TraceSet
        A loaded trace whose collectives all use the ``nccl`` barrier scheme.

    Returns
    -------
    CompiledGraph or None
        None: a collective of another scheme, an op named by a dependency list or a
        collective but not traced, a bad duration or a cycle — build the networkx graph
        (which also words the error).

    Notes
    -----
    Vectorised: the string columns are dictionary-encoded once (pyarrow), ops are the
    ``(node, op)`` pairs of the non-communication rows numbered in order of first appearance
    (``Job.from_trace``'s ``groupby(sort=False)``), their mean durations summed as pandas does
    (:func:`_group_reduce`); dependency lists and collectives become integer edge arrays
    through those codes; the keys stay codes into two name tables (:class:`~dpro_kit.replay.engine.OpKeys`).
    Where every node's rows are one run, the ops are then renumbered position-major (:func:`_position_major`) for
    the memory locality of ``compile_arrays``' passes, which gets the ops without predecessors in first-appearance
    order (``sources``), so the result is the same.
    """
    from ..replay.engine import small_pages
    gc_was = gc.isenabled()
    gc.disable()        # no reference cycles are made here; collections over a big heap cost ~30 %
    try:
        with small_pages():         # first touches of 4 KB pages cost less here than huge pages
            return _compile_trace(ts)
    finally:
        if gc_was:
            gc.enable()


def _compile_trace(ts: TraceSet) -> Any:
    from ..replay.engine import OpKeys, compile_arrays, csr_from_edges, index_dtype

    if any(c.algorithm != "nccl" for c in ts.collectives):
        return None
    ev = ts.events
    nc, node_u = _encode(ev["node"], runs=True, small=False)   # (int16 codes: 2x slower here, numba's code)
    oc, op_u = _encode(ev["op"])
    if "" in node_u or "STEP_END" in op_u:
        return None                     # would collide with the SYNC / STEP_END ops' keys
    kc, kind_u = _encode(ev["kind"], runs=True)
    comm = np.array([k in COMM_KINDS for k in kind_u], dtype=bool)     # per kind code
    dur_ev = ev["dur"].to_numpy(dtype=np.float64)
    n_ev_nodes, nop = len(node_u), max(len(op_u), 1)
    ncomb = n_ev_nodes * nop
    table = None
    sums = None             # (dense path: the means' array, with room for the virtual ops: it becomes `dur`)
    if ncomb <= _DENSE_LIMIT[0] * len(ev) + _DENSE_LIMIT[1]:   # ops numbered through a dense node x op-name table
        nv_max = len(node_u) + sum(1 + 3 * len(c.participants) for c in ts.collectives)   # >= virtual ops
        r0, sums, table = _group_dense(nc, oc, kc, comm, dur_ev, nop, ncomb,
                                       np.zeros(0, dtype=index_dtype(len(ev), ncomb)), len(ev) + nv_max)
        ng = r0.size
        mean = sums[:ng]
    else:                               # many distinct op names per node: hash, then binary search
        rows = np.flatnonzero(~comm[kc])
        gid, ucomb = pd.factorize(nc[rows].astype(np.int64) * nop + oc[rows])
        gid = gid.astype(np.int64, copy=False)
        ng = len(ucomb)
        srt = np.argsort(ucomb, kind="stable")
        su = np.asarray(ucomb)[srt]

        def lookup(c: np.ndarray) -> np.ndarray:
            pos = np.minimum(np.searchsorted(su, c), max(su.size - 1, 0))
            return np.where(su[pos] == c, srt[pos], -1) if su.size else np.full(c.size, -1, dtype=np.int64)
        first, mean = _group_reduce(gid, ng, dur_ev[rows])
        r0 = rows[first]
    if not bool(np.all(np.isfinite(mean) & (mean >= 0))):
        return None                     # the builder's validate() words it
    gnode, gop, gkind = _at_rows(nc, r0), _at_rows(oc, r0), _at_rows(kc, r0)     # (int32 / int16 codes)
    gstream, stream_u = _encode(ev["stream"], r0)  # stream only at each op's first row
    # arrays are dropped once used: memory freed during the call is reused by later arrays, and a first
    # call pays ~2 ms of system time per MB of fresh memory here (docs/scale.md "Sixth pass")
    del nc, oc, kc
    # the ops, numbered in first-appearance order so far, renumbered position-major, node-minor where each
    # node's ops are one run (:func:`_position_major`: ops close in time close in memory); ``inv``: new -> old
    inv = None
    if (table is not None and r0.flags.writeable and gnode.flags.writeable and gop.dtype.itemsize <= 4
            and gkind.dtype == np.int16 and gstream.dtype == np.int16):
        perm = np.empty(ng, dtype=r0.dtype)
        if _position_major(gnode, perm, r0):   # (gnode rewritten in the new order in place)
            inv = r0                    # (written into r0's buffer, no longer needed)
            _remap_table(table, perm)   # (the dependency lists and collectives are looked up in it)
            o_op = perm.view(gop.dtype)[:ng] if gop.dtype.itemsize <= perm.dtype.itemsize else np.empty_like(gop)
            del perm
            o_kind, o_stream, o_sums = np.empty_like(gkind), np.empty_like(gstream), np.empty(sums.size)
            _gather4(inv, gop, gkind, gstream, mean, o_op, o_kind, o_stream, o_sums)
            gop, gkind, gstream, sums = o_op, o_kind, o_stream, o_sums    # (sums: room for the virtual ops)
            mean = sums[:ng]
            del o_op, o_kind, o_stream, o_sums
    del r0
    node_idx: dict[str, int] = {n: i for i, n in enumerate(node_u)}
    op_idx: dict[str, int] = {o: i for i, o in enumerate(op_u)}
    names = list(node_u)

    def ncode(n: str) -> int:
        i = node_idx.get(n)
        if i is None:
            i = node_idx[n] = len(names)
            names.append(n)
        return i

    def find(seg_node: np.ndarray, seg_len: np.ndarray, ops: list[str] | np.ndarray) -> np.ndarray:
        """Op index of each (node code, op name or op code), the node given per segment of ``ops``
        (``seg_len`` long each); -1 where it was not traced."""
        o = ops if isinstance(ops, np.ndarray) else np.fromiter(map(op_idx.get, ops, repeat(-1)), dtype=np.int64,
                                                                 count=len(ops))
        if table is not None:
            return _find_dense(table, nop, n_ev_nodes, seg_node, np.cumsum(seg_len), o)
        ncodes = np.repeat(seg_node, seg_len)
        ok = (o >= 0) & (ncodes < n_ev_nodes)
        out = np.full(o.size, -1, dtype=np.int64)
        out[ok] = lookup(ncodes[ok] * nop + o[ok])
        return out

    # local dependencies, in the order Job.from_trace adds them; a node whose list equals one seen
    # before (ranks of one job name their ops alike; a few variants, e.g. one rank per host
    # copying the input) reuses its op codes: up to 4 lists per length are kept, the last used first
    variants: list[np.ndarray] = []     # the distinct code arrays (kept: their ids stay unique)
    var_of: dict[int, int] = {}
    node_var: list[int] = []
    seen_lists: dict[int, tuple[Any, list[tuple[Any, Any, np.ndarray]]]] = {}
    for edges in ts.edges.values():
        ln = len(edges)
        got = seen_lists.get(ln)
        if got is None:         # ~17 pairs from the end: lists of two variants often differ only there
            got = seen_lists[ln] = (itemgetter(*range(ln - 1, -1, -max(ln // 16, 1))) if ln else None, [])
        probe, cands = got
        sample = probe(edges) if probe is not None else None
        for j, (lst, lsample, codes) in enumerate(cands):
            if lsample == sample and lst == edges:      # (a sampled pair differs: no full comparison)
                if j:
                    cands.insert(0, cands.pop(j))
                break
        else:
            flat = list(chain.from_iterable(edges))
            if len(flat) != 2 * len(edges):
                return None
            codes = np.fromiter(map(op_idx.get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
            cands.insert(0, (edges, sample, codes))
            del cands[4:]
        vi = var_of.get(id(codes))
        if vi is None:
            vi = var_of[id(codes)] = len(variants)
            variants.append(codes)
        node_var.append(vi)
    del seen_lists
    seg_node = np.array([node_idx.get(n, n_ev_nodes) for n in ts.edges], dtype=np.int64)
    seg_var = np.asarray(node_var, dtype=np.int64)
    vlen = np.array([v.size for v in variants], dtype=np.int64)
    vstart = np.concatenate([[0], np.cumsum(vlen)[:-1]]).astype(np.int64)
    vcodes = np.concatenate(variants) if variants else np.zeros(0, dtype=np.int64)
    n_dep = int(vlen[seg_var].sum()) // 2 if seg_var.size else 0
    # the nccl scheme per collective (identity strategy: one group per tensor, in the trace's order)
    # virtual ops' keys as (left, right) codes: node code (-1: none) and a name in op_u + rnames
    v_left: list[int] = []
    v_right: list[int] = []
    rnames: list[str] = []
    v_prio: list[float] = []
    v_owner: list[int] = []
    c_src: list[int] = []
    c_dst: list[int] = []
    seen_tensor: set[str] = set()
    for c in ts.collectives:
        t = c.tensor
        if t in seen_tensor or f"In {t}" in op_idx or f"Out {t}" in op_idx or "" in c.participants:
            return None
        seen_tensor.add(t)
        p = float(c.priority)
        named: list[tuple[bool, str, int, int]] = []
        ops: list[str] = []
        nodes: list[int] = []
        lens: list[int] = []
        for is_in, side in ((True, c.inputs), (False, c.outputs)):
            for n, o in side.items():
                o = list(dict.fromkeys(o))
                named.append((is_in, n, len(ops), len(ops) + len(o)))
                ops += o
                nodes.append(node_idx.get(n, n_ev_nodes))
                lens.append(len(o))
        got = find(np.asarray(nodes, dtype=np.int64), np.asarray(lens, dtype=np.int64), ops)
        if (got < 0).any():
            return None                 # the builder refuses it, with a message
        got_l = got.tolist()
        ins = {n: got_l[a:b] for is_in, n, a, b in named if is_in}
        outs = {n: got_l[a:b] for is_in, n, a, b in named if not is_in}
        sync = ng + len(v_left)
        r_in = len(op_u) + len(rnames)
        rnames += [f"SYNC {t}", f"In {t}", f"Out {t}"]
        v_left.append(-1)
        v_right.append(r_in)
        v_prio.append(p)
        v_owner.append(-1)
        made: dict[str, tuple[int, int]] = {}
        for r in c.participants:
            if r in made:
                kin, kout = made[r]
            else:
                kin = ng + len(v_left)
                kout = kin + 1
                rc = ncode(r)
                v_left += [rc, rc]
                v_right += [r_in + 1, r_in + 2]
                v_prio += [p, p]
                v_owner += [rc, rc]
                made[r] = (kin, kout)
                gi = ins.get(r, ())
                c_src += gi
                c_dst += [kin] * len(gi)
                go = outs.get(r, ())
                c_src += [kout] * len(go)
                c_dst += go
            c_src += [kin, sync]
            c_dst += [sync, kout]
    # synchronous iterations: per node a STEP_END after its last ops, before its next first ops
    if any("|" in n for n in names):
        return None                     # keys "node|op" might collide
    n0 = ng + len(v_left)
    # edges: the dependency lists', the collectives', then the iteration rule's, written in place into
    # arrays sized for all of them (no concatenation; np.empty: the unused tail is never touched);
    # op indices int32 where they fit (compile_arrays then keeps int32 throughout)
    n_c = len(c_src)
    dt = index_dtype(n0 + len(names), n_dep + n_c + n0)
    s_all = np.empty(n_dep + n_c + n0, dtype=dt)
    d_all = np.empty(n_dep + n_c + n0, dtype=dt)
    if table is not None:
        if _pairs_dense(table, nop, n_ev_nodes, seg_node, seg_var, vstart, vlen, vcodes, s_all, d_all, 64) < 0:
            return None                 # an op only in the dependency list: contracted by the builder
    else:
        ends = find(seg_node, vlen[seg_var], np.concatenate([variants[v] for v in node_var]) if node_var
                    else np.zeros(0, dtype=np.int64))
        if (ends < 0).any():
            return None
        s_all[:n_dep] = ends[0::2]
        d_all[:n_dep] = ends[1::2]
        del ends
    table = None                        # (find is not called after this)
    del variants, vcodes
    s_all[n_dep:n_dep + n_c] = c_src
    d_all[n_dep:n_dep + n_c] = c_dst
    del c_src, c_dst
    s_arr, d_arr = s_all[:n_dep + n_c], d_all[:n_dep + n_c]
    owner = np.concatenate([gnode.astype(dt, copy=False), np.asarray(v_owner, dtype=dt)])
    has_succ, has_pred = _local_ends(s_arr, d_arr, owner, n_dep)  # (repeated edges: compile_arrays drops them)
    not_first_kind = np.array([k in _NOT_FIRST for k in kind_u], dtype=bool)
    not_first = np.concatenate([not_first_kind[gkind] if kind_u else np.zeros(0, dtype=bool),
                                np.ones(len(v_left), dtype=bool)])
    valid = owner >= 0
    _, n_nodes, rank_of = _first_ids(owner[valid], max(len(names), 1))   # node -> order of its first op
    sinks = np.flatnonzero(valid & ~has_succ)
    sinks = sinks[np.argsort(rank_of[owner[sinks]], kind="stable")]     # node by node, each in op order
    sources = np.flatnonzero(valid & ~not_first & ~has_pred)
    sources = sources[np.argsort(rank_of[owner[sources]], kind="stable")]
    m = n_dep + n_c
    s_all[m:m + sinks.size] = sinks
    d_all[m:m + sinks.size] = n0 + rank_of[owner[sinks]]
    s_arr, d_arr = s_all[:m + sinks.size], d_all[:m + sinks.size]
    it_pairs = np.stack([n0 + rank_of[owner[sources]], sources], axis=1).astype(dt)
    node_by_rank = np.empty(n_nodes, dtype=np.int64)
    used_nodes = rank_of >= 0
    node_by_rank[rank_of[used_nodes]] = np.flatnonzero(used_nodes)
    del owner, has_succ, has_pred, not_first, valid, sinks, sources, used_nodes
    # (networkx's adjacency order - sources in insertion order, each one's successors in order of
    # addition - is what compile_arrays' stable counting sort by source makes of this order)
    # devices: node:stream of each traced op (numbered by compile_arrays in topological order)
    nsu = max(len(stream_u), 1)
    if n_ev_nodes * nsu <= 8 * ng + (1 << 20):        # pairs numbered by first appearance (dense table)
        dcode, nd_, dtab = _first_ids(gnode.astype(index_dtype(n_ev_nodes * nsu), copy=False) * nsu + gstream,
                                      n_ev_nodes * nsu)
        seen = np.flatnonzero(dtab >= 0)
        dpairs = np.empty(nd_, dtype=np.int64)
        dpairs[dtab[seen]] = seen
    else:
        dcode, dpairs = pd.factorize(gnode.astype(np.int64) * nsu + gstream)
    dev_names: dict[str, int] = {}
    dmap = np.array([dev_names.setdefault(f"{node_u[int(x) // max(len(stream_u), 1)]}:"
                                          f"{stream_u[int(x) % max(len(stream_u), 1)]}", len(dev_names))
                     for x in np.asarray(dpairs)], dtype=np.int64)
    nv = len(v_left) + n_nodes
    ntot = ng + nv
    dev0 = np.empty(ntot, dtype=dt)                 # (filled in place: no int64 temporaries)
    if dmap.size:
        np.take(dmap.astype(dt), dcode, out=dev0[:ng])
    dev0[ng:] = -1
    del dcode, gstream
    if sums is not None and sums.size >= ntot:     # the means in place (no copy)
        dur = sums[:ntot]
        dur[ng:] = 0.0
    else:
        dur = np.zeros(ntot)
        dur[:ng] = mean
    del mean, sums
    vp = np.asarray(v_prio, dtype=np.float64)
    if vp.view(np.int64).any():         # (else every priority is +0.0: compile_arrays makes the zeros)
        prio = np.zeros(ntot)
        prio[ng:ng + len(v_left)] = vp
    else:
        prio = None
    del vp
    # keys "node|op" (SYNC: "|SYNC t") as codes into two name tables (OpKeys: strings on demand)
    v_l = np.asarray(v_left, dtype=np.int64)
    kl = np.empty(ntot, dtype=np.int32 if len(names) + 1 < 2 ** 31 else np.int64)
    kl[:ng] = gnode
    kl[ng:ng + v_l.size] = np.where(v_l < 0, len(names), v_l)
    kl[ng + v_l.size:] = node_by_rank
    nright = len(op_u) + len(rnames) + 1
    kr = np.empty(ntot, dtype=np.int32 if nright < 2 ** 31 else np.int64)
    kr[:ng] = gop
    kr[ng:ng + v_l.size] = v_right
    kr[ng + v_l.size:] = nright - 1
    del gnode, gop, gkind
    keys = OpKeys(names + [""], ["|" + o for o in op_u + rnames + ["STEP_END"]], kl, kr)
    # the CSR here (repeated edges dropped), so that the edge arrays are freed before compile_arrays' work;
    # given up to it (a list it empties, reuse=True): renumbered into the buffers of these arrays
    csr = list(csr_from_edges(ntot, s_arr, d_arr, dedupe=True))
    del s_arr, d_arr, s_all, d_all
    sources = None
    if inv is not None:                 # the ops without predecessors, in first-appearance order
        z = np.flatnonzero(csr[2] == 0)
        zt = z[z < ng]
        sources = np.concatenate([zt[np.argsort(inv[zt], kind="stable")], z[z >= ng]])
        del z, zt, inv
    return compile_arrays(keys, dur, prio, dev0, list(dev_names), None, None, it_pairs, csr=csr, reuse=True,
                          sources=sources)


@njit(cache=True)
def _position_major(gnode, perm, inv):  # pragma: no cover - compiled
    """Ops ``g`` given node by node (``gnode``: each op's node code, non-decreasing: every node's ops one run)
    numbered position-major, node-minor instead: every node's first op, in node order, then every node's second
    op, ... (a counting sort by position in the node).  Writes ``perm`` (old -> new index) and ``inv`` (new ->
    old) and rewrites ``gnode`` in the new order; returns False (nothing written) when ``gnode`` decreases
    somewhere.

    Why: ranks' ops at one position run at about the same time, so that ``compile_arrays``' passes over the ops
    in generation order and in time order read neighbouring memory, not one place per rank (docs/scale.md
    "Tenth pass").  The caller keeps each op's successors in their order and gives ``compile_arrays`` the ops
    without predecessors in their old order: the compiled result is the same."""
    n = gnode.size
    nn = 0
    kmax = 0
    run = 0
    for g in range(n):
        if g == 0 or gnode[g] != gnode[g - 1]:
            if g > 0 and gnode[g] < gnode[g - 1]:
                return False
            run = 0
            nn += 1
        run += 1
        if run > kmax:
            kmax = run
    pstart = np.zeros(kmax + 1, dtype=np.int64)
    nfirst = np.empty(nn, dtype=np.int64)
    nk = np.zeros(nn, dtype=np.int64)
    m = -1
    for g in range(n):
        if g == 0 or gnode[g] != gnode[g - 1]:
            m += 1
            nfirst[m] = g
        pstart[nk[m] + 1] += 1
        nk[m] += 1
    for p in range(kmax):
        pstart[p + 1] += pstart[p]
    cur = pstart[:kmax].copy()
    for m in range(nn):
        g0 = nfirst[m]
        for p in range(nk[m]):
            perm[g0 + p] = cur[p]
            cur[p] += 1
    code = gnode[nfirst]
    i = 0
    for p in range(kmax):
        for m in range(nn):
            if nk[m] > p:
                inv[i] = nfirst[m] + p
                gnode[i] = code[m]
                i += 1
    return True


@njit(cache=True)
def _gather4(idx, a, b, c, d, oa, ob, oc, od):  # pragma: no cover - compiled
    """``out[i] = x[idx[i]]`` for three arrays of codes (``a`` below 2**31, ``b`` and ``c`` int16, all >= 0) and a
    float64 one: packed first into one 16-byte row per element (sequential), so that the gather, whose reads are
    one place per rank, reads one cache line per element instead of four."""
    n = idx.size
    rec = np.empty((n, 2), dtype=np.int64)
    dv = d.view(np.int64)
    for j in range(n):
        rec[j, 0] = dv[j]
        rec[j, 1] = (np.int64(a[j]) << 32) | ((np.int64(b[j]) & 0xFFFF) << 16) | (np.int64(c[j]) & 0xFFFF)
    odv = od.view(np.int64)
    for i in range(n):
        j = idx[i]
        odv[i] = rec[j, 0]
        x = rec[j, 1]
        oa[i] = x >> 32
        ob[i] = np.int16((x >> 16) & 0xFFFF)
        oc[i] = np.int16(x & 0xFFFF)


@njit(cache=True)
def _remap_table(table, perm):  # pragma: no cover - compiled
    """``table[c] = perm[table[c]]`` where it names an op (-1: none)."""
    for c in range(table.size):
        g = table[c]
        if g >= 0:
            table[c] = perm[g]


@njit(cache=True)
def _local_ends(src, dst, owner, n_local):  # pragma: no cover - compiled
    """Per op: has it a successor / a predecessor on its own node (``owner``; edges between two ops of
    one node; the first ``n_local`` edges are known to be such: a node's dependency list)."""
    n = owner.size
    has_succ = np.zeros(n, dtype=np.bool_)
    has_pred = np.zeros(n, dtype=np.bool_)
    for k in range(src.size):
        u = src[k]
        v = dst[k]
        if k < n_local or owner[u] == owner[v]:
            has_succ[u] = True
            has_pred[v] = True
    return has_succ, has_pred


@njit(cache=True)
def _pairs_dense(table, nop, n_ev_nodes, seg_node, seg_var, vstart, vlen, vcodes, s_out, d_out, tile):  # pragma: no cover - compiled
    """The dependency edges as op indices, into ``s_out``/``d_out``: node ``i``'s list is the
    ``(u, v)`` op-name codes ``vcodes[vstart[seg_var[i]]:][:vlen[seg_var[i]]]`` (interleaved; nodes with
    equal lists share them), looked up in the dense ``node x op`` table.  Returns the edges written,
    or -1 if an op was not traced.

    Written ``tile`` nodes at a time, pair by pair across the tile's nodes (their first pairs, their second
    pairs, ...): each node's edges stay in their order, which is all that the CSR keeps of it, and with ops
    numbered position-major (:func:`_position_major`) neighbouring edges have neighbouring sources."""
    k = 0
    for t0 in range(0, seg_node.size, tile):
        t1 = min(t0 + tile, seg_node.size)
        lmax = 0
        for i in range(t0, t1):
            lmax = max(lmax, vlen[seg_var[i]])
        for q in range(0, lmax, 2):
            for i in range(t0, t1):
                if q >= vlen[seg_var[i]]:
                    continue
                nd = seg_node[i]
                a = vstart[seg_var[i]] + q
                cu = vcodes[a]
                cv = vcodes[a + 1]
                if nd >= n_ev_nodes or cu < 0 or cv < 0:
                    return -1
                u = table[nd * nop + cu]
                v = table[nd * nop + cv]
                if u < 0 or v < 0:
                    return -1
                s_out[k] = u
                d_out[k] = v
                k += 1
    return k


@njit(cache=True)
def _find_dense(table, nop, n_ev_nodes, seg_node, seg_end, o):  # pragma: no cover - compiled
    """``table[node * nop + op]`` per element, the node given per segment; -1 for an untraced pair."""
    out = np.empty(o.size, dtype=np.int64)
    k0 = 0
    for i in range(seg_node.size):
        nd = seg_node[i]
        for k in range(k0, seg_end[i]):
            c = o[k]
            out[k] = table[nd * nop + c] if (c >= 0 and nd < n_ev_nodes) else -1
        k0 = seg_end[i]
    return out


def _encode(col: pd.Series, at: np.ndarray | None = None, runs: bool = False, small: bool = True
            ) -> tuple[np.ndarray, list[str]]:
    """Codes (int16, int32 or int64, numbered in order of first appearance) and the distinct values of a string
    column (of its rows ``at``, increasing, only, if given).

    A column of Arrow strings without nulls is read by :func:`_encode_buffers` (no Arrow allocations: on
    a first call the ``take`` and the index arrays of Arrow's ``dictionary_encode`` cost more in fresh
    pages than the hashing) when ``at`` is given, when ``runs`` (its values come in runs, as ``node``
    and ``kind`` do), or when most of its rows are in chunks that repeat an earlier chunk byte for byte
    (ranks with the same op sequence); else by Arrow's ``dictionary_encode`` (faster at hashing many
    distinct long values, e.g. ``op`` of ranks that all differ).  ``small``: int16 codes where they fit."""
    import pyarrow as pa
    import pyarrow.compute as pc
    try:
        arr = pa.array(col)
    except (pa.ArrowException, TypeError, ValueError):
        arr = None
    if arr is None or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        vals = col.astype(object).to_numpy()
        codes, uniq = pd.factorize(vals if at is None else vals[at], use_na_sentinel=False)
        return codes.astype(np.int64, copy=False), [str(u) for u in uniq]
    fast = _encode_buffers(arr, at, runs, np.int16 if small else np.int32)
    if fast is not None:
        return fast
    if at is not None:
        arr = arr.take(pa.array(at))
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    chunks = [c for c in chunks if len(c)]
    if not chunks:
        return np.zeros(0, dtype=np.int64), []
    enc = pc.dictionary_encode(pa.chunked_array(chunks, type=arr.type), null_encoding="encode")
    d = enc.chunks[0].dictionary
    if any(len(c.dictionary) != len(d) for c in enc.chunks):   # arrow unifies them; do not rely on it blindly
        codes, uniq = pd.factorize(col.astype(object).to_numpy(), use_na_sentinel=False)
        return codes.astype(np.int64, copy=False), [str(u) for u in uniq]
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in enc.chunks])   # int32 as a rule
    return codes, d.to_pylist()


def _encode_buffers(arr: Any, at: np.ndarray | None, runs: bool = False, dtype: Any = np.int16
                    ) -> tuple[np.ndarray, list[str]] | None:
    """:func:`_encode` of an Arrow string column (rows ``at``, increasing, if given) read straight from
    its chunks' offset and data buffers: the codes Arrow's ``dictionary_encode`` gives (first appearance;
    equal UTF-8 bytes = equal value), in one int16 array (int32 if there are more than 32,768 distinct
    values: then encoded again; less fresh memory).  A chunk equal byte for byte to an earlier chunk
    (:func:`_chunk_print`, :func:`_same_chunk`) takes that chunk's codes (it has no new value, so the
    numbering is unchanged); with ``at``, when the same rows of both are selected.  None: a chunk has
    nulls, or (neither ``at`` nor ``runs``) more than a quarter of the rows would be hashed here (Arrow
    then).

    Python only collects each chunk's buffer addresses; one numba call (:func:`_encode_all`) reads the
    buffers through them and does the rest, chunk by chunk (the per-chunk Python work of buffer views
    and calls cost ~25 µs per chunk and column, ~0.1 s at 1,024 ranks: docs/scale.md "Fifth pass")."""
    import pyarrow as pa
    chunks = [c for c in (arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]) if len(c)]
    if arr.null_count or carray is None:
        return None
    if at is not None and at.size > 1 and not bool((at[1:] > at[:-1]).all()):
        return None
    meta = []                                       # per chunk: offsets address, offset, rows, data address, bytes
    keep = []                                       # the buffers, alive while numba reads them
    for c in chunks:
        _, ob, db = c.buffers()
        keep.append((ob, db))
        dsz = db.size if db is not None else 0
        meta.append((ob.address, c.offset, len(c), db.address if dsz else 0, dsz))
    meta_a = np.array(meta, dtype=np.int64).reshape(-1, 5)
    n = int(meta_a[:, 2].sum()) if at is None else int(at.size)
    codes = np.empty(n, dtype=dtype)
    cap = max(n, 1)
    uh = np.empty(cap, dtype=np.uint64)             # (np.empty: pages touched only as far as used)
    pool = np.empty(max(int(meta_a[:, 4].sum()), 1), dtype=np.uint8)
    poff = np.empty(cap + 1, dtype=np.int64)
    poff[0] = 0
    st = np.array([0, -1], dtype=np.int64)          # distinct values so far, last code
    limit = n // 4 if at is None and not runs else -1
    owit = np.zeros(0, dtype=np.int64 if pa.types.is_large_string(arr.type) else np.int32)
    at_a = (np.zeros(0, dtype=np.int64) if at is None else at if at.dtype in (np.int32, np.int64)
            else np.asarray(at, dtype=np.int64))      # (int32 rows as they come: no int64 copy)
    status = _encode_all(meta_a, owit, at_a, at is not None, bool(runs), codes, st, uh, pool, poff,
                         int(np.iinfo(dtype).max) + 1, limit)
    del keep
    if status == -1:
        return _encode_buffers(arr, at, runs, np.int32)     # more values than the codes' type holds
    if status == -2:
        return None
    nu = int(st[0])
    pb = pool[:int(poff[nu])].tobytes()
    po = poff[:nu + 1].tolist()
    return codes, [pb[po[i]:po[i + 1]].decode("utf-8") for i in range(nu)]


@intrinsic
def _address(typingctx, addr):  # pragma: no cover - compiled
    """An integer address as a ``void *`` (for ``numba.carray`` over a buffer numba did not allocate)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(addr), codegen


@njit(inline="always")
def _chunk_offsets(meta, ci, owit):  # pragma: no cover - compiled
    """Chunk ``ci``'s offsets (``owit``'s integer type), its own ``rows + 1`` of them."""
    a = meta[ci, 1]
    return carray(_address(meta[ci, 0]), a + meta[ci, 2] + 1, owit.dtype)[a:]


@njit(inline="always")
def _chunk_data(meta, ci, dummy):  # pragma: no cover - compiled
    """Chunk ``ci``'s data buffer as bytes (``dummy`` if it has none)."""
    if meta[ci, 4] == 0:
        return dummy
    return carray(_address(meta[ci, 3]), meta[ci, 4], np.uint8)


@njit(inline="always")
def _chunk_words(meta, ci, dummyw):  # pragma: no cover - compiled
    """Chunk ``ci``'s data buffer as 8-byte words (its whole words)."""
    if meta[ci, 4] < 8:
        return dummyw
    return carray(_address(meta[ci, 3]), meta[ci, 4] // 8, np.uint64)


@njit(inline="always")
def _one_value(offs, data, words):  # pragma: no cover - compiled
    """Do all of a chunk's strings equal its first: every length the first's, the first 8 strings' bytes each
    the byte one length before it, and every later byte the byte 8 lengths before it (string ``i`` equals
    string ``i - 8``, hence the first).  A shift of 8 lengths is a whole number of 8-byte words, so that
    part is compared a word at a time (``words``: the data buffer as 8-byte words); checked block by block
    without branches, so that it vectorises.  (Byte by byte it read ~1 GB/s: 0.1 s of the ``node`` column at
    10 M rows, docs/scale.md "Ninth pass".)"""
    m = offs.size - 1
    ln = offs[1] - offs[0]
    B = 4096
    for i0 in range(1, m, B):
        acc = 0
        for i in range(i0, min(i0 + B, m)):
            acc |= (offs[i + 1] - offs[i]) ^ ln
        if acc != 0:
            return False
    if ln > 0:
        a = offs[0]
        end = offs[m]
        e8 = min(a + 8 * ln, end)
        accb = np.uint8(0)
        for j in range(a + ln, e8):                 # strings 1..7: equal to the one before
            accb |= data[j] ^ data[j - ln]
        if accb != 0:
            return False
        j = e8
        sh = 8 * ln
        while j < end and j % 8 != 0:               # then string i equal to string i - 8
            if data[j] != data[j - sh]:
                return False
            j += 1
        if j < end:
            kw1 = end // 8
            for k0 in range(j // 8, kw1, B):
                accw = np.uint64(0)
                for k in range(k0, min(k0 + B, kw1)):
                    accw |= words[k] ^ words[k - ln]
                if accw != 0:
                    return False
            j = max(j, 8 * kw1)
            for q in range(j, end):
                if data[q] != data[q - sh]:
                    return False
    return True


@njit(cache=True)
def _encode_all(meta, owit, at, has_at, runs, codes, st, uh, pool, poff, maxc, limit):  # pragma: no cover - compiled
    """:func:`_encode_buffers`' work over all chunks (``meta``: per chunk its offsets' address, offset, rows,
    data address and bytes; offsets of ``owit``'s type): chunks that repeat an earlier chunk byte for byte
    found (a table of (rows, bytes, :func:`_chunk_print`) keys, up to 8 earlier distinct chunks of a key
    compared, newest first), then the chunks (rows ``at`` of them if ``has_at``) encoded by
    :func:`_encode_chunk` into ``codes`` or copied from the chunk they repeat; with ``runs``, a chunk of
    one value (:func:`_one_value`: a node's rows) has its first row encoded and its code repeated.  Returns 0; -1 when a new
    value would need code ``maxc``; -2 when ``limit >= 0`` and more than ``limit`` rows are in chunks
    that repeat none."""
    nch = meta.shape[0]
    dummy = np.zeros(8, dtype=np.uint8)
    dummyw = np.zeros(1, dtype=np.uint64)
    row_of = np.zeros(nch + 1, dtype=np.int64)
    prt = np.empty(nch, dtype=np.uint64)
    tot = np.empty(nch, dtype=np.int64)
    for ci in range(nch):
        row_of[ci + 1] = row_of[ci] + meta[ci, 2]
        offs = _chunk_offsets(meta, ci, owit)
        tot[ci] = offs[offs.size - 1] - offs[0]
        prt[ci] = _chunk_print(offs, _chunk_data(meta, ci, dummy))
    size = 16
    while size < 2 * nch:
        size *= 2
    mask = size - 1
    htab = np.full(size, -1, dtype=np.int64)        # key -> newest distinct chunk of that key
    chain = np.full(max(nch, 1), -1, dtype=np.int64)   # the previous distinct chunk of the same key
    rep = np.full(max(nch, 1), -1, dtype=np.int64)  # the earlier chunk each one repeats, or -1
    fresh_rows = 0
    for ci in range(nch):
        h = (np.uint64(meta[ci, 2]) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(tot[ci])
        h = (h ^ prt[ci]) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        s = np.int64(h & np.uint64(mask))
        while True:
            c0 = htab[s]
            if c0 < 0 or (meta[c0, 2] == meta[ci, 2] and tot[c0] == tot[ci] and prt[c0] == prt[ci]):
                break
            s = (s + 1) & mask
        pj = htab[s]
        if pj >= 0:
            oa = _chunk_offsets(meta, ci, owit)
            da = _chunk_data(meta, ci, dummy)
            wa = _chunk_words(meta, ci, dummyw)
            cnt = 0
            while pj >= 0 and cnt < 8:
                if _same_chunk(oa, da, wa, _chunk_offsets(meta, pj, owit), _chunk_data(meta, pj, dummy),
                               _chunk_words(meta, pj, dummyw)):
                    rep[ci] = pj
                    break
                pj = chain[pj]
                cnt += 1
        if rep[ci] < 0:
            chain[ci] = htab[s]
            htab[s] = ci
            fresh_rows += meta[ci, 2]
    if limit >= 0 and fresh_rows > limit:
        return -2
    tab = np.full(1 << 10, -1, dtype=np.int32)
    k = 0
    first = np.zeros(1, dtype=np.int64)              # (row 0 of a chunk of one value)
    if not has_at:
        for ci in range(nch):
            m = meta[ci, 2]
            pj = rep[ci]
            if pj >= 0:
                r0 = row_of[pj]
                for q in range(m):
                    codes[k + q] = codes[r0 + q]
                st[1] = codes[k + m - 1]
            else:
                offs = _chunk_offsets(meta, ci, owit)
                data = _chunk_data(meta, ci, dummy)
                one = runs and m > 1 and _one_value(offs, data, _chunk_words(meta, ci, dummyw))
                j = 0
                while True:
                    j = _encode_chunk(offs, data, first, not one, j, codes, k, st, tab, uh, pool, poff, maxc)
                    if j < 0:
                        return -1
                    if 2 * st[0] > tab.size:            # half full: grown before it is used again
                        tab = _grown(tab, uh, st[0])
                    if j >= (1 if one else m):
                        break
                if one:
                    c = codes[k]
                    for q in range(1, m):
                        codes[k + q] = c
            k += m
        return 0
    bounds = np.searchsorted(at, row_of)
    segk = np.empty(max(nch, 1), dtype=np.int64)
    for ci in range(nch):
        a = bounds[ci]
        b = bounds[ci + 1]
        segk[ci] = k
        if b > a:
            pj = rep[ci]
            same = False
            if pj >= 0 and bounds[pj + 1] - bounds[pj] == b - a:
                same = True
                d = row_of[ci] - row_of[pj]
                aj = bounds[pj]
                for q in range(b - a):
                    if at[a + q] - at[aj + q] != d:
                        same = False
                        break
            if same:
                kj = segk[pj]
                for q in range(b - a):
                    codes[k + q] = codes[kj + q]
                st[1] = codes[k + b - a - 1]
            else:
                sel = at[a:b] - row_of[ci]
                offs = _chunk_offsets(meta, ci, owit)
                data = _chunk_data(meta, ci, dummy)
                j = 0
                while True:
                    j = _encode_chunk(offs, data, sel, False, j, codes, k, st, tab, uh, pool, poff, maxc)
                    if j < 0:
                        return -1
                    if 2 * st[0] > tab.size:
                        tab = _grown(tab, uh, st[0])
                    if j >= b - a:
                        break
            k += b - a
    return 0


@njit(inline="always")
def _word(buf, a, ln):  # pragma: no cover - compiled
    """The ``ln <= 8`` bytes ``buf[a:a + ln]`` as a little-endian integer."""
    w = np.uint64(0)
    for q in range(ln):
        w |= np.uint64(buf[a + q]) << np.uint64(8 * q)
    return w


@njit(inline="always")
def _hash_bytes(buf, a, b):  # pragma: no cover - compiled
    """A 64-bit hash of ``buf[a:b]``, 8 bytes at a time (multiply-xorshift mixing)."""
    h = np.uint64(b - a) * np.uint64(0x9E3779B97F4A7C15)
    q = a
    while q + 8 <= b:
        h = (h ^ _word(buf, q, 8)) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        q += 8
    if q < b:
        h = (h ^ _word(buf, q, b - q)) * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return h


@njit(inline="always")
def _same_bytes(x, a, y, b, ln):  # pragma: no cover - compiled
    """``x[a:a + ln] == y[b:b + ln]``, 8 bytes at a time."""
    q = 0
    while q + 8 <= ln:
        if _word(x, a + q, 8) != _word(y, b + q, 8):
            return False
        q += 8
    for r in range(q, ln):
        if x[a + r] != y[b + r]:
            return False
    return True


@njit(cache=True)
def _chunk_print(offs, data):  # pragma: no cover - compiled
    """A cheap fingerprint of a chunk (offsets, data): a hash of 64 string lengths and 64 8-byte words
    at evenly spaced places (equal chunks have equal prints; :func:`_same_chunk` decides)."""
    n = offs.size - 1
    a = offs[0]
    tot = offs[n] - a
    h = np.uint64(n) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(tot)
    for j in range(64):
        if n > 0:
            i = (j * n) // 64
            h = (h ^ np.uint64(offs[i + 1] - offs[i])) * np.uint64(0xBF58476D1CE4E5B9)
        if tot > 0:
            q = a + (j * tot) // 64
            h = (h ^ _word(data, q, min(8, a + tot - q))) * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


@njit(cache=True)
def _same_chunk(oa, da, wa, ob, db, wb):  # pragma: no cover - compiled
    """Do two chunks (offsets, data, the data as 8-byte words ``w``) hold the same strings, row for row?
    Bytes compared 8 at a time where both start at the same place in a word (as a rule: Arrow's buffers
    are 64-byte aligned), else one by one; the bytes before the offsets (chunks of one length and equal
    offsets, e.g. two nodes' names, differ in their bytes)."""
    if oa.size != ob.size or oa[oa.size - 1] - oa[0] != ob[ob.size - 1] - ob[0]:
        return False
    a = oa[0]
    b = ob[0]
    ln = oa[oa.size - 1] - a
    if a % 8 == b % 8:
        while ln > 0 and a % 8 != 0:
            if da[a] != db[b]:
                return False
            a += 1
            b += 1
            ln -= 1
        ia = a // 8
        ib = b // 8
        for w in range(ln // 8):
            if wa[ia + w] != wb[ib + w]:
                return False
        k = 8 * (ln // 8)
        a += k
        b += k
        ln -= k
    for q in range(ln):
        if da[a + q] != db[b + q]:
            return False
    for i in range(oa.size):
        if oa[i] - oa[0] != ob[i] - ob[0]:
            return False
    return True


@njit(cache=True)
def _encode_chunk(offs, data, sel, all_rows, j0, codes, k0, st, tab, uh, pool, poff, maxc):  # pragma: no cover - compiled
    """Dictionary-encode one chunk's strings (its rows ``sel``, or all), from its ``j0``-th, into
    ``codes[k0:]``, carrying the state across chunks: ``st`` = (distinct values, last code), the
    open-addressing table ``tab`` (code per slot, -1 empty), each code's hash ``uh``
    (:func:`_hash_bytes`) and bytes (``pool[poff[c]:poff[c + 1]]``).  A row equal to the previous
    row's value (runs, e.g. a node's rows) is recognised by one comparison, without hashing (tried
    again every 64 rows after 4 misses in a row).  Returns the rows done: fewer than all when the
    table got half full (the caller grows it, :func:`_grown`, and calls again from there); -1 when a
    new value would need code ``maxc`` (the codes' type is too small)."""
    nu = st[0]
    prev = st[1]
    mask = tab.size - 1
    m = offs.size - 1 if all_rows else sel.size
    miss = 0
    for j in range(j0, m):
        i = j if all_rows else sel[j]
        a = offs[i]
        b = offs[i + 1]
        ln = b - a
        if prev >= 0 and (miss < 4 or (j & 63) == 0):
            if poff[prev + 1] - poff[prev] == ln and _same_bytes(pool, poff[prev], data, a, ln):
                codes[k0 + j] = prev
                miss = 0
                continue
            miss += 1
        h = _hash_bytes(data, a, b)
        s = np.int64(h & np.uint64(mask))
        while True:
            c = tab[s]
            if c < 0:                                    # a new value
                if nu >= maxc:
                    return -1
                c = nu
                nu += 1
                tab[s] = c
                uh[c] = h
                p0 = poff[c]
                for q in range(ln):
                    pool[p0 + q] = data[a + q]
                poff[c + 1] = p0 + ln
                if 2 * nu > tab.size:                    # half full: the caller grows it, then goes on
                    codes[k0 + j] = c
                    st[0] = nu
                    st[1] = c
                    return j + 1
                break
            if uh[c] == h and poff[c + 1] - poff[c] == ln and _same_bytes(pool, poff[c], data, a, ln):
                break
            s = (s + 1) & mask
        codes[k0 + j] = c
        prev = c
    st[0] = nu
    st[1] = prev
    return m


@njit(cache=True)
def _grown(tab, uh, nu):  # pragma: no cover - compiled
    """:func:`_encode_chunk`'s table at twice the size, every code re-inserted by its hash."""
    t2 = np.full(2 * tab.size, -1, dtype=np.int32)
    mask = t2.size - 1
    for c in range(nu):
        s = np.int64(uh[c] & np.uint64(mask))
        while t2[s] >= 0:
            s = (s + 1) & mask
        t2[s] = c
    return t2


@njit(cache=True)
def _group_dense(nc, oc, kc, comm, dur, nop, ncomb, like, cap):  # pragma: no cover - compiled
    """Ops of the rows whose kind is not ``comm`` (per kind code): the ``(node, op)`` pairs numbered in
    order of first appearance through the dense table ``node * nop + op``, in one pass over the rows.
    Returns (each op's first row, the means: op ``g``'s mean duration as :func:`_group_reduce` computes
    it at ``[g]``, in an array of at least ``cap`` entries, the table: op per pair or -1); index arrays in
    ``like``'s type (int32 where the rows fit).  Arrays are allocated for every row (the means for
    ``cap``) and touched only as far as used.

    When every node's rows are one run (what ``load_trace``'s concatenation of per-rank tables gives),
    a node's ops are numbered ``g0 .. g0 + nop - 1`` at most, so the running sums' compensations and
    counts live in two ``nop``-long scratch arrays, reset per node (12 bytes per row less fresh memory,
    docs/scale.md "Eighth pass"); otherwise in arrays for every row."""
    table = np.full(ncomb, -1, dtype=like.dtype)        # (int32 where rows and pairs fit)
    n = nc.size
    runs = True                                         # is each node's rows one run?
    seen = np.zeros(ncomb // nop + 1 if nop > 0 else 1, dtype=np.bool_)
    for i in range(n):
        if i == 0 or nc[i] != nc[i - 1]:
            if seen[nc[i]]:
                runs = False
                break
            seen[nc[i]] = True
    first = np.empty(n, dtype=like.dtype)
    sumx = np.empty(max(n, cap))
    m = nop if runs else n
    comp = np.empty(m)                                  # (per op: at g - base)
    nobs = np.empty(m, dtype=like.dtype)
    ng = 0
    base = 0
    for i in range(n):
        if runs and i > 0 and nc[i] != nc[i - 1]:      # a node's last row: its ops' means, scratch reused
            for g in range(base, ng):
                sumx[g] = sumx[g] / nobs[g - base] if nobs[g - base] > 0 else np.nan
            base = ng
        if comm[kc[i]]:
            continue
        c = np.int64(nc[i]) * nop + oc[i]
        g = table[c]
        if g < 0:
            g = ng
            table[c] = g
            ng += 1
            first[g] = i
            sumx[g] = 0.0
            comp[g - base] = 0.0
            nobs[g - base] = 0
        val = dur[i]
        # as _group_reduce: pandas' group_mean, bit for bit.  Written out in both loops on purpose: the
        # same step as a shared @njit helper (even inline="always") made the two 2.5x slower (in-process
        # A/B, 2.6 M rows: 0.12-0.17 s vs 0.32-0.38 s CPU for both functions, equal results)
        if val == val:
            j = g - base
            nobs[j] += 1
            y = val - comp[j]
            t = sumx[g] + y
            comp[j] = t - sumx[g] - y
            if comp[j] != comp[j]:
                comp[j] = 0.0
            sumx[g] = t
    for g in range(base, ng):                           # the means, in place of the sums
        sumx[g] = sumx[g] / nobs[g - base] if nobs[g - base] > 0 else np.nan
    return first[:ng], sumx, table


def _at_rows(codes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``codes[rows]`` for increasing ``rows`` (each op's first row), in place in ``codes``' own buffer when it is
    writable (no fresh array; ``codes`` is no longer needed), else a copy."""
    if codes.flags.writeable and codes.flags.c_contiguous and codes.ndim == 1:
        _compact(codes, rows)
        return codes[:rows.size]
    return codes[rows]


@njit(cache=True)
def _compact(a, rows):  # pragma: no cover - compiled
    """``a[:rows.size] = a[rows]`` in place, ``rows`` increasing (so ``rows[g] >= g``: nothing is read after
    it was overwritten)."""
    for g in range(rows.size):
        a[g] = a[rows[g]]


@njit(cache=True)
def _group_reduce(gid, ng, dur):  # pragma: no cover - compiled
    """Per group: its first row and the mean of its durations, NaN skipped, summed as pandas'
    ``group_mean`` does (Kahan-compensated, rows in order), so the means are bit for bit pandas'."""
    first = np.full(ng, -1, dtype=np.int64)
    sumx = np.zeros(ng)
    comp = np.zeros(ng)
    nobs = np.zeros(ng, dtype=np.int64)
    for i in range(gid.size):
        g = gid[i]
        if first[g] < 0:
            first[g] = i
        val = dur[i]
        if val == val:
            nobs[g] += 1
            y = val - comp[g]
            t = sumx[g] + y
            comp[g] = t - sumx[g] - y
            if comp[g] != comp[g]:
                comp[g] = 0.0
            sumx[g] = t
    mean = np.empty(ng)
    for g in range(ng):
        mean[g] = sumx[g] / nobs[g] if nobs[g] > 0 else np.nan
    return first, mean


@njit(cache=True)
def _first_ids(comb, ncomb):  # pragma: no cover - compiled
    """Ids numbered in order of first appearance for codes ``0 <= comb < ncomb`` (dense table):
    (id per element, number of ids, id per code or -1), in ``comb``'s integer type."""
    table = np.full(ncomb, -1, dtype=comb.dtype)
    out = np.empty(comb.size, dtype=comb.dtype)
    ng = 0
    for i in range(comb.size):
        c = comb[i]
        g = table[c]
        if g < 0:
            g = ng
            table[c] = g
            ng += 1
        out[i] = g
    return out, ng, table


def compile_trace_or_graph(ts: TraceSet, *, comm_model: Any = None) -> tuple[Any, str]:
    """The compiled replay arrays of ``ts``: :func:`compile_trace` where it applies, else through networkx.

    Parameters
    ----------
    ts : TraceSet
        A loaded trace.
    comm_model : CommModel or None
        For the networkx path (:func:`dpro_kit.graph.build.build_global_dfg`).

    Returns
    -------
    (CompiledGraph, str)
        The arrays and which path made them (``arrays`` or ``networkx``).
    """
    cg = compile_trace(ts)
    if cg is not None:
        return cg, "arrays"
    from ..replay import compile_graph
    from .build import build_global_dfg
    return compile_graph(build_global_dfg(ts, comm_model=comm_model)), "networkx"
