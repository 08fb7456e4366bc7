"""Replayer (dPRO §4.3): simulate iterations of a global DFG, device by device.

``compile_graph`` turns the networkx DFG into flat arrays once (CSR successor
lists, durations, device ids, priorities); ``replay`` runs the compiled kernel
in :mod:`._kernel` over one or several iterations and wraps the result in a
:class:`ReplayResult`, which gives the iteration time, per-op start/end,
per-device utilisation, the execution graph and its critical path.

Several iterations are replayed by unrolling: iteration *i+1* is a copy of the
graph whose ops are offset by ``i*n`` and joined to iteration *i* through the
graph's ``iteration_edges``.  A partial replay is a replay of an induced
subgraph (``replay(g, ops=[...])``).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from collections.abc import Sequence
from typing import Iterable

import networkx as nx
import numpy as np
import pandas as pd

from ..errors import GraphError
from . import rules
from ._kernel import njit, simulate


_pages = {"lock": threading.Lock(), "depth": 0, "was": None}
_M_MMAP_MAX = -4                        # glibc <malloc.h>: mallopt's parameter; 65536 is its default
_MMAP_MAX_DEFAULT = 65536


def _glibc_mallopt():
    """glibc's ``mallopt`` through ctypes, or None (another C library, or no ctypes)."""
    try:
        import ctypes
        import platform
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return None
        f = ctypes.CDLL(None).mallopt
        f.argtypes, f.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        return f
    except Exception:                   # pragma: no cover - not glibc
        return None


@contextmanager
def small_pages():
    """numpy's ``madvise(MADV_HUGEPAGE)`` on its large arrays off inside the block (restored when the
    outermost block of all threads ends).

    numpy advises transparent huge pages for every array of 4 MB or more; on this machine (a VM whose
    ``transparent_hugepage/defrag`` is ``madvise``) a first touch of such memory cost ~1.3-2.4 ms of system
    time per MB against ~0.3-0.8 ms with 4 KB pages, and the compile and the replay of a big job are mostly
    first touches (docs/scale.md "Eighth pass").  Left alone when ``NUMPY_MADVISE_HUGEPAGE`` is set (the
    user's choice) or numpy lacks the switch.

    Also, with glibc, large arrays come from the heap instead of their own ``mmap`` inside the block
    (``mallopt(M_MMAP_MAX, 0)``; the default, 65536, restored by the outermost block): glibc gives every
    array of 32 MB or more its own mapping and unmaps it when freed, so that each of the many arrays a 10 M-op
    compile makes and drops is fresh memory at its first touch, which on this VM may fault on the host too
    (docs/scale.md "Sixth pass"); in the heap a freed array's pages are reused by the next one.  Measured at
    9.7 M ops: minor faults in ``compile_trace`` 478 k -> 199 k, in the kernel 105 k -> 20 k (docs/scale.md
    "Eleventh pass").  The cost: memory freed inside the block stays in the process (glibc returns only the
    top of its heap), and glibc's adaptive mmap threshold stays where it is once ``mallopt`` was called.  Left
    alone when ``MALLOC_MMAP_MAX_`` is set (the user's choice)."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:                 # pragma: no cover - numpy < 2
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        _set_madvise_hugepage = None
    if "mallopt" not in _pages:
        _pages["mallopt"] = _glibc_mallopt()
    mallopt = None if "MALLOC_MMAP_MAX_" in os.environ else _pages["mallopt"]
    if _set_madvise_hugepage is None and mallopt is None:
        yield
        return
    with _pages["lock"]:                # (a process-wide switch: nested and concurrent blocks counted)
        if _pages["depth"] == 0:
            if _set_madvise_hugepage is not None:
                _pages["was"] = _set_madvise_hugepage(False)
            if mallopt is not None:
                mallopt(_M_MMAP_MAX, 0)
        _pages["depth"] += 1
    try:
        yield
    finally:
        with _pages["lock"]:
            _pages["depth"] -= 1
            if _pages["depth"] == 0:
                if _set_madvise_hugepage is not None:
                    _set_madvise_hugepage(_pages["was"])
                if mallopt is not None:
                    mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)


class OpKeys(Sequence):
    """Op keys made on demand: key ``i`` is ``left_names[left[i]] + right_names[right[i]]``.

    What the array-native compile (:mod:`dpro_kit.graph.arrays`) gives as ``CompiledGraph.keys``
    instead of one Python ``str`` per op (~0.1 µs and ~80 B per op at 1-10 M ops, docs/scale.md):
    two small tables of name parts and two int32 code arrays.  It is a read-only sequence of
    ``str`` that behaves as the list would: ``len``, indexing (a slice gives an ``OpKeys``),
    iteration (made chunk by chunk), ``in``, ``index``, ``count``, and ``==`` with a list, a tuple
    or another ``OpKeys`` (equal when the strings are equal); ``tolist()`` makes the list.
    """

    __slots__ = ("left_names", "right_names", "left", "right")
    _CHUNK = 1 << 16

    def __init__(self, left_names: Sequence[str], right_names: Sequence[str], left: np.ndarray, right: np.ndarray):
        self.left_names = np.asarray(left_names, dtype=object).reshape(-1)
        self.right_names = np.asarray(right_names, dtype=object).reshape(-1)
        self.left = np.asarray(left)
        self.right = np.asarray(right)
        if self.left.shape != self.right.shape or self.left.ndim != 1:
            raise ValueError("OpKeys: left and right must be 1-d code arrays of one length")

    def __len__(self) -> int:
        return int(self.left.size)

    def _strings(self, a: int, b: int) -> np.ndarray:
        return self.left_names[self.left[a:b]] + self.right_names[self.right[a:b]]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return OpKeys(self.left_names, self.right_names, self.left[i], self.right[i])
        return self.left_names[self.left[i]] + self.right_names[self.right[i]]

    def __iter__(self):
        for a in range(0, len(self), self._CHUNK):
            yield from self._strings(a, a + self._CHUNK).tolist()

    def tolist(self) -> list[str]:
        return self._strings(0, len(self)).tolist()

    def take(self, idx: np.ndarray) -> "OpKeys":
        """The keys at ``idx`` (an index array), as ``OpKeys``."""
        return OpKeys(self.left_names, self.right_names, self.left[idx], self.right[idx])

    def index(self, key, start: int = 0, stop: int | None = None) -> int:
        stop = len(self) if stop is None else min(stop, len(self))
        for a in range(max(start, 0), stop, self._CHUNK):
            hit = np.flatnonzero(self._strings(a, min(a + self._CHUNK, stop)) == key)
            if hit.size:
                return a + int(hit[0])
        raise ValueError(f"{key!r} is not in the keys")

    def __contains__(self, key) -> bool:
        if not isinstance(key, str):
            return False
        try:
            self.index(key)
        except ValueError:
            return False
        return True

    def __eq__(self, other) -> bool:
        if not isinstance(other, (OpKeys, list, tuple)):
            return NotImplemented
        if len(other) != len(self):
            return False
        if isinstance(other, OpKeys):
            return all(np.array_equal(self._strings(a, a + self._CHUNK), other._strings(a, a + self._CHUNK))
                       for a in range(0, len(self), self._CHUNK))
        return all(x == y for x, y in zip(self, other))

    __hash__ = None  # type: ignore[assignment]   # mutable-looking sequence, as a list

    def __repr__(self) -> str:
        head = ", ".join(repr(k) for k in self[:3])
        return f"OpKeys([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


@dataclass
class CompiledGraph:
    """A DFG as arrays; index ``i`` is op ``keys[i]`` (keys are in a topological order).

    ``keys`` is a list of str, or an :class:`OpKeys` (the same strings, made on demand) where the
    array-native compile made the graph; there the index arrays are int32 where they fit
    (:func:`index_dtype`), else int64."""

    keys: list[str] | OpKeys
    dur: np.ndarray          # float64 us
    device: np.ndarray       # int64 (int32: array path), -1 = takes no device
    devices: list[str]
    priority: np.ndarray     # float64, lower runs first
    indptr: np.ndarray       # int64 (int32: array path) CSR over successors
    succ: np.ndarray         # as indptr
    indeg: np.ndarray        # as indptr
    iter_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # iteration edges u -> v(next)
    iter_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: last tie-break of the device queues (after priority and ready time): the op's index
    #: in topological-generation order, kept apart from its array index (see ``locality_order``)
    tiebreak: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.tiebreak is None:
            self.tiebreak = np.arange(self.dur.size, dtype=np.int64)

    @property
    def n(self) -> int:
        """Number of ops in the arrays (an unrolled graph keeps the keys of one iteration)."""
        return int(self.dur.size)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        src = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.indptr))
        return src, self.succ


def csr_from_edges(n: int, src: np.ndarray, dst: np.ndarray, dedupe: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR successor arrays and in-degrees for ``n`` ops from edge arrays (each op's successors
    in the order of the edge arrays: a stable counting sort by source).  ``dedupe``: a repeated
    edge is kept at its first position only (what networkx's ``add_edge`` keeps)."""
    dt = index_dtype(n, np.asarray(src).size) if np.asarray(src).dtype == np.int32 == np.asarray(dst).dtype else np.int64
    src, dst = np.asarray(src, dtype=dt), np.asarray(dst, dtype=dt)
    return _csr_first(n, src, dst) if dedupe else _csr(n, src, dst)


def index_dtype(*sizes: int) -> type:
    """int32 when every index and count of arrays of these sizes fits (half the memory of int64 and
    half the fresh pages on a first call, docs/scale.md "Fourth pass"), else int64."""
    return np.int32 if max(sizes, default=0) < 2 ** 31 - 1 else np.int64


@njit(cache=True)
def _csr(n, src, dst):  # pragma: no cover - compiled
    indptr, succ = _csr_only(n, src, dst)
    indeg = np.zeros(n, dtype=src.dtype)
    for k in range(dst.size):
        indeg[dst[k]] += 1
    return indptr, succ, indeg


@njit(cache=True)
def _csr_only(n, src, dst):  # pragma: no cover - compiled
    """The CSR of the edges (a stable counting sort by source); ``indptr`` is the fill cursor, then
    shifted back (no separate cursor array)."""
    indptr = np.zeros(n + 1, dtype=src.dtype)
    for k in range(src.size):
        indptr[src[k] + 1] += 1
    for i in range(n):
        indptr[i + 1] += indptr[i]
    succ = np.empty(src.size, dtype=src.dtype)
    for k in range(src.size):
        u = src[k]
        succ[indptr[u]] = dst[k]
        indptr[u] += 1
    for i in range(n, 0, -1):
        indptr[i] = indptr[i - 1]
    indptr[0] = 0
    return indptr, succ


@njit(cache=True)
def _csr_first(n, src, dst):  # pragma: no cover - compiled
    """:func:`_csr` keeping each edge's first occurrence only: per source, in edge order, a
    destination is kept the first time it is seen (a last-seen marker per destination)."""
    indptr, succ = _csr_only(n, src, dst)
    mark = np.full(n, -1, dtype=src.dtype)
    indeg = np.zeros(n, dtype=src.dtype)
    k = 0
    start = 0
    for u in range(n):
        end = indptr[u + 1]
        for j in range(start, end):
            v = succ[j]
            if mark[v] != u:
                mark[v] = u
                succ[k] = v
                indeg[v] += 1
                k += 1
        start = end
        indptr[u + 1] = k
    return indptr, succ[:k].copy() if k < succ.size else succ, indeg


def _take(keys, order: np.ndarray) -> list | OpKeys:
    """``[keys[i] for i in order]`` through a numpy object array (a list or an object array); an
    :class:`OpKeys` gives an ``OpKeys``."""
    if isinstance(keys, OpKeys):
        return keys.take(order)
    arr = keys if isinstance(keys, np.ndarray) else np.fromiter(keys, dtype=object, count=len(keys))
    return arr[order].tolist()


def induced_subgraph(g: nx.DiGraph, ops: Iterable[str]) -> nx.DiGraph:
    """Copy of the subgraph induced by ``ops``, keeping ``g``'s node and edge order.

    (``g.subgraph`` may iterate over a set, which would make tie-breaking, and so
    partial replays, depend on the interpreter's hash seed.)
    """
    keep = set(ops)
    unknown = [k for k in keep if k not in g]
    if unknown:
        raise GraphError(f"partial replay names {len(unknown)} op(s) not in the graph, e.g. {sorted(unknown)[0]!r}")
    order = [k for k in g if k in keep]
    h = nx.DiGraph()
    h.graph.update(g.graph)
    h.add_nodes_from((k, g.nodes[k]) for k in order)
    h.add_edges_from((u, v) for u, v in g.edges(order) if v in keep)
    h.graph["iteration_edges"] = [(u, v) for u, v in g.graph.get("iteration_edges", []) if u in keep and v in keep]
    return h


@njit(cache=True)
def _generations_and_starts(indptr, succ, indeg0, dur, dev0, ndev, sources):  # pragma: no cover - compiled
    """``nx.topological_sort``'s order (generation by generation, children in edge insertion order)
    on a CSR built from the edges in insertion order (shorter than n if there is a cycle; ``sources``,
    if not empty, are the ops without predecessors in insertion order, else they are taken in index
    order; a wrong count of them gives the short order too) and, in
    the same pass, the earliest starts (:func:`_earliest_starts`) in that order: when
    op ``u`` is taken (generation by generation) all its predecessors were, so its earliest start is
    final; it is written at ``u``'s place in the order and pushed to its successors.  Also the devices
    numbered in order of first appearance in that order (``remap``: old -> new number, -1 unused;
    ``by_first``: old number of each new one).

    Each op's earliest start and remaining in-degree (a float: exact below 2**53) sit side by side in
    one array, so that a successor's update reads one cache line, not two: the ops are visited in
    generation order, far from their numbering (~15 % less time at 10 M ops, docs/scale.md "Eighth pass")."""
    n = indeg0.size
    st = np.empty(2 * n)                # [2u]: earliest start so far, [2u + 1]: predecessors not yet taken
    order = np.empty(n, dtype=indeg0.dtype)
    m = 0
    for i in range(n):
        st[2 * i] = 0.0
        st[2 * i + 1] = indeg0[i]
        if indeg0[i] == 0:
            order[m] = i
            m += 1
    if sources.size:
        if sources.size != m:
            return order[:0], np.empty(0), np.full(ndev, -1, dtype=np.int64), np.empty(0, dtype=np.int64)
        for j in range(m):
            order[j] = sources[j]
    out = np.empty(n)
    remap = np.full(ndev, -1, dtype=np.int64)
    by_first = np.empty(ndev, dtype=np.int64)
    nd = 0
    lo = 0
    while lo < m:
        hi = m
        for j in range(lo, hi):
            u = order[j]
            t = st[2 * u]
            out[j] = t
            d = dev0[u]
            if d >= 0 and remap[d] < 0:
                remap[d] = nd
                by_first[nd] = d
                nd += 1
            e = t + dur[u]
            for k in range(indptr[u], indptr[u + 1]):
                v = succ[k]
                if e > st[2 * v]:
                    st[2 * v] = e
                r = st[2 * v + 1] - 1.0
                st[2 * v + 1] = r
                if r == 0.0:
                    order[m] = v
                    m += 1
        lo = hi
    return order[:m], out[:m], remap, by_first[:nd]


def compile_graph(g: nx.DiGraph, ops: Iterable[str] | None = None) -> CompiledGraph:
    """Flatten ``g`` (or the subgraph induced by ``ops``) for the kernel.

    Parameters
    ----------
    g : networkx.DiGraph
        A global DFG (``graph/model.py`` attributes).
    ops : iterable of str or None
        Op keys to keep (partial replay of the optimizer); None: all.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.3 (replayer) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    if ops is not None:
        g = induced_subgraph(g, ops)
    keys0 = list(g)                                   # insertion order
    n = len(keys0)
    index0 = dict(zip(keys0, range(n)))
    dur0 = np.empty(n, dtype=np.float64)
    prio0 = np.empty(n, dtype=np.float64)
    dev0 = np.empty(n, dtype=np.int64)
    dev_names: dict[str, int] = {}
    for i, (k, d) in enumerate(g.nodes(data=True)):  # one pass over the attribute dicts
        dur0[i] = d.get("dur", 0.0)
        prio0[i] = d.get("priority", 0.0)
        dv = d.get("device", "")
        dev0[i] = dev_names.setdefault(dv, len(dev_names)) if dv else -1
    m = g.number_of_edges()
    src0 = np.empty(m, dtype=np.int64)
    dst0 = np.empty(m, dtype=np.int64)
    j = 0
    for u, nbrs in g.adj.items():                     # successors in insertion order
        iu = index0[u]
        for v in nbrs:
            src0[j] = iu
            dst0[j] = index0[v]
            j += 1
    it = [(index0[u], index0[v]) for u, v in g.graph.get("iteration_edges", []) if u in index0 and v in index0]
    cg = compile_arrays(keys0, dur0, prio0, dev0, list(dev_names), src0, dst0, np.array(it, dtype=np.int64))
    if cg is None:
        cycle = nx.find_cycle(g)
        raise GraphError("the dependency graph has a cycle: " + " -> ".join(repr(u) for u, _ in cycle[:6]),
                         hint="an op cannot depend on itself; check the dependency files")
    return cg


def compile_arrays(keys0, dur0: np.ndarray, prio0: np.ndarray | None, dev0: np.ndarray, dev_names: list[str],
                   src0: np.ndarray | None, dst0: np.ndarray | None, iter_pairs: np.ndarray, dedupe: bool = False,
                   csr: tuple[np.ndarray, np.ndarray, np.ndarray] | list[np.ndarray] | None = None,
                   reuse: bool = False, sources: np.ndarray | None = None) -> CompiledGraph | None:
    """The :class:`CompiledGraph` of ops given as arrays in insertion order (what :func:`compile_graph` reads
    from a networkx graph; :mod:`dpro_kit.graph.arrays` builds them from the trace tables directly).

    Parameters
    ----------
    keys0 : list of str, numpy.ndarray of str objects, or OpKeys
        Op keys, in insertion order (``OpKeys`` stay ``OpKeys``, reordered by their codes).
    dur0, prio0 : numpy.ndarray
        Duration (us) and priority per op; ``prio0`` None: every priority ``+0.0`` (the result's array is then
        made by ``np.zeros``, not gathered: 8 bytes per op neither read nor written, docs/scale.md "Ninth pass").
    dev0 : numpy.ndarray
        Index into ``dev_names`` per op, -1 for no device.
    dev_names : list of str
        Device names.
    src0, dst0 : numpy.ndarray
        Edges (op indices), in the order they were added (each op's successors keep that order,
        as networkx's adjacency does).
    iter_pairs : numpy.ndarray
        ``(k, 2)`` iteration edges (op indices).
    dedupe : bool, default False
        Drop repeated edges, each kept at its first position (as networkx's ``add_edge`` does).
    csr : (indptr, succ, indeg) or None
        Instead of ``src0``/``dst0`` (then None): their :func:`csr_from_edges` (``dedupe`` applied), made
        by the caller so that it can free the edge arrays first (less fresh memory at the peak).  A
        ``list`` is emptied here, so that the insertion-order CSR is freed once renumbered when the
        caller keeps no other reference to it.
    reuse : bool, default False
        The caller gives up ``dur0``, ``prio0``, ``dev0``, the CSR's in-degrees and (``OpKeys``) the
        keys' code arrays: they are used as buffers of the renumbered arrays, their contents undefined
        afterwards.  The result is the same; the call needs ~28 bytes per op less fresh memory (what a
        first call pays for, docs/scale.md "Seventh pass").
    sources : numpy.ndarray or None
        The ops without predecessors, in insertion order, when that is not their index order (a caller
        that numbered its ops for locality rather than in insertion order, keeping each op's successors
        in insertion order: :func:`dpro_kit.graph.arrays.compile_trace`); None: index order.

    Returns None when the edges have a cycle (the caller names it).

    Notes
    -----
    Ops are numbered in topological-generation order (``nx.topological_sort``'s; it is also the
    queue tie-break), then renumbered by :func:`locality_order`; both permutations are composed
    here (what ``renumber`` of the generation-ordered graph gives, array for array): the
    locality sort is a bucket sort (:func:`stable_argsort_nonneg`), and the final arrays and CSR
    are gathered from the insertion-order ones (:func:`_final_inv`, :func:`_renumbered_csr`, one
    gather per array), the keys taken once.
    """
    n = int(np.asarray(dur0).size)
    dur0 = np.asarray(dur0, dtype=np.float64)
    ip0, s0, deg0 = csr_from_edges(n, src0, dst0, dedupe) if csr is None else csr
    if isinstance(csr, list):
        csr.clear()
    del csr
    dev0 = np.asarray(dev0, dtype=s0.dtype)         # (int32 where the edges came as int32 and fit)
    src_order = np.zeros(0, dtype=s0.dtype) if sources is None else np.asarray(sources, dtype=s0.dtype)
    order, est, remap, by_first = _generations_and_starts(ip0, s0, deg0, dur0, dev0, max(len(dev_names), 1),
                                                          src_order)
    if order.size < n:
        return None
    bad = ~np.isfinite(dur0) | (dur0 < 0)
    if bad.any():
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        o = int(np.flatnonzero(bad)[np.argmin(pos[bad])])         # the first bad op in generation order
        k = _keys_at(keys0, np.array([o], dtype=np.int64))[0]
        raise GraphError(f"op {k!r} has duration {float(dur0[o])!r}; durations must be finite and >= 0")
    # locality_order of the generation-ordered graph: earliest starts, stable by generation index
    loc = stable_argsort_nonneg(est, s0.dtype)
    del est
    devices = [dev_names[int(i)] for i in by_first]
    # the arrays gathered one at a time; with ``reuse`` each into the buffer of one already gathered
    # (or of ``order``): fresh memory only for final/inv, the new CSR and one float array
    final, inv = _final_inv(order, loc)
    free = [order]
    del order
    indptr, succ = _renumbered_csr(final, inv, ip0, s0)
    del ip0, s0                         # (freed here when the caller gave them up: csr as a list)
    it_arr = inv[np.asarray(iter_pairs, dtype=np.int64).reshape(-1, 2)]
    del inv

    def gather(a: np.ndarray, remap_: np.ndarray | None = None) -> np.ndarray:
        j = next((j for j, b in enumerate(free) if b.dtype == a.dtype and b.shape == a.shape), -1)
        out = np.empty_like(a) if j < 0 else free.pop(j)
        if remap_ is None:
            _gather_into(a, final, out)
        else:
            _gather_remapped(a, final, out, remap_)
        if reuse and a.flags.c_contiguous and a.flags.writeable:
            free.append(a)
        return out
    device = gather(dev0, remap)
    del dev0
    indeg = gather(deg0)
    del deg0
    if isinstance(keys0, OpKeys) and keys0.left.ndim == 1 and keys0.right.ndim == 1:
        keys = OpKeys(keys0.left_names, keys0.right_names, gather(keys0.left), gather(keys0.right))
    else:
        keys = _keys_at(keys0, final)
    del keys0
    dur = gather(dur0)
    del dur0
    prio = np.zeros(n) if prio0 is None else gather(np.asarray(prio0, dtype=np.float64))
    del prio0, free
    return CompiledGraph(keys=keys, dur=dur, device=device, devices=devices,
                         priority=prio, indptr=indptr, succ=succ, indeg=indeg,
                         iter_src=it_arr[:, 0].copy(), iter_dst=it_arr[:, 1].copy(), tiebreak=loc)


def _keys_at(keys0, idx: np.ndarray) -> list | OpKeys:
    return _take(keys0, idx)


@njit(cache=True)
def _final_inv(order, loc):  # pragma: no cover - compiled
    """``final = order[loc]`` (new index -> op) and its inverse."""
    n = order.size
    final = np.empty(n, dtype=order.dtype)
    inv = np.empty(n, dtype=order.dtype)
    for i in range(n):
        o = order[loc[i]]
        final[i] = o
        inv[o] = i
    return final, inv


@njit(cache=True)
def _renumbered_csr(final, inv, ip0, s0):  # pragma: no cover - compiled
    """The renumbered CSR: new op ``i``'s successors are old op ``final[i]``'s, in their order (what a
    stable counting sort of the renumbered edges by source gives)."""
    n = final.size
    indptr = np.empty(n + 1, dtype=s0.dtype)
    succ = np.empty(s0.size, dtype=s0.dtype)
    indptr[0] = 0
    k = 0
    for i in range(n):
        o = final[i]
        for e in range(ip0[o], ip0[o + 1]):
            succ[k] = inv[s0[e]]
            k += 1
        indptr[i + 1] = k
    return indptr, succ


@njit(cache=True)
def _gather_into(a, idx, out):  # pragma: no cover - compiled
    """``out[i] = a[idx[i]]``."""
    for i in range(idx.size):
        out[i] = a[idx[i]]


@njit(cache=True)
def _gather_remapped(a, idx, out, remap):  # pragma: no cover - compiled
    """``out[i] = remap[a[idx[i]]]`` (-1 kept)."""
    for i in range(idx.size):
        d = a[idx[i]]
        out[i] = remap[d] if d >= 0 else -1


def stable_argsort_nonneg(x: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """``np.argsort(x, kind="stable")`` for float64 values that are ``>= 0`` or ``-0.0`` (``inf`` allowed, no
    NaN): a two-level bucket sort (:func:`_bucket_argsort`).  ``dtype``: of the indices returned.  ``x`` is
    only read."""
    return _bucket_argsort(np.ascontiguousarray(x, dtype=np.float64), np.zeros(0, dtype=dtype))


@njit(inline="always")
def _bucket_of(v, lo, s, nb):
    """Bucket of value ``v`` among ``nb`` buckets of width ``1 / s`` from ``lo``: a non-decreasing function of
    ``v`` (float subtraction and multiplication are monotone), so that buckets never reorder values; ``inf``
    last."""
    if v == np.inf:
        return nb - 1
    return min(np.int64((v - lo) * s), nb - 1)


@njit(inline="always")
def _bucket_scale(lo, hi, nb):
    """``s`` of :func:`_bucket_of` for values in ``[lo, hi]`` (``(v - lo) * s <= ~nb``); 0 (one bucket) when
    the width is 0 or too small for a finite ``s``."""
    w = hi - lo
    if w > 0.0:
        s = nb / w
        if s < np.inf:
            return s
    return 0.0


@njit(inline="always")
def _insertion_sort(k, ix, a, e):
    """``k[a:e]`` sorted in place, stably (equal values keep their order), ``ix`` moved along."""
    for j in range(a + 1, e):
        v = k[j]
        w = ix[j]
        p = j - 1
        while p >= a and k[p] > v:
            k[p + 1] = k[p]
            ix[p + 1] = ix[p]
            p -= 1
        k[p + 1] = v
        ix[p + 1] = w


@njit(cache=True)
def _bucket_argsort(x, like):  # pragma: no cover - compiled
    """The stable argsort of :func:`stable_argsort_nonneg`, in two levels of buckets by value.

    Level 1: 2,048 buckets of equal width over ``[0, max finite]`` (a counting pass and one scatter pass, in
    index order: stable).  Level 2, bucket by bucket (a bucket of a 10 M-op job's earliest starts is ~5 k
    values, in cache): as many sub-buckets as values, over the bucket's own range, then an insertion sort of
    each sub-bucket (~1 value each; one of more than 32, from values piled up in a narrow range, is merge-
    sorted).  Why: the replaced LSD radix sort made 6 passes of 11 bits over the whole array (the earliest
    starts' float bits all differ), each a read and a scattered write of 12 bytes per value out of cache:
    0.55-0.66 s of a 10 M-op compile (docs/scale.md "Tenth pass"); this makes one such pass, the rest in
    cache (docs/scale.md "Eleventh pass").  Both buckets and the insertion sort keep equal values in index
    order, so the result is ``np.argsort(kind="stable")``'s (``-0.0 == 0.0`` as values)."""
    n = x.size
    out = np.empty(n, dtype=like.dtype)
    if n == 0:
        return out
    hi = 0.0
    for i in range(n):
        v = x[i]
        if v > hi and v != np.inf:
            hi = v
    nb = 2048
    s1 = _bucket_scale(0.0, hi, nb)
    cnt = np.zeros(nb + 1, dtype=np.int64)
    for i in range(n):
        cnt[_bucket_of(x[i], 0.0, s1, nb) + 1] += 1
    for b in range(nb):
        cnt[b + 1] += cnt[b]
    k1 = np.empty(n, dtype=np.float64)
    i1 = np.empty(n, dtype=like.dtype)
    pos = cnt[:nb].copy()
    for i in range(n):
        v = x[i]
        b = _bucket_of(v, 0.0, s1, nb)
        j = pos[b]
        k1[j] = v
        i1[j] = i
        pos[b] = j + 1
    mmax = 0
    for b in range(nb):
        mmax = max(mmax, cnt[b + 1] - cnt[b])
    k2 = np.empty(mmax, dtype=np.float64)          # one bucket's values and indices, sorted here
    i2 = np.empty(mmax, dtype=like.dtype)
    c2 = np.empty(mmax + 1, dtype=np.int64)
    for b in range(nb):
        a = cnt[b]
        e = cnt[b + 1]
        m = e - a
        if m <= 32:
            for j in range(a, e):
                k2[j - a] = k1[j]
                i2[j - a] = i1[j]
            _insertion_sort(k2, i2, 0, m)
        else:
            lo = k1[a]
            h2 = lo
            for j in range(a, e):
                v = k1[j]
                if v < lo:
                    lo = v
                if v > h2 and v != np.inf:
                    h2 = v
            s2 = _bucket_scale(lo, h2, m)
            c2[:m + 1] = 0
            for j in range(a, e):
                c2[_bucket_of(k1[j], lo, s2, m) + 1] += 1
            for q in range(m):
                c2[q + 1] += c2[q]
            for j in range(a, e):
                v = k1[j]
                q = _bucket_of(v, lo, s2, m)
                t = c2[q]
                k2[t] = v
                i2[t] = i1[j]
                c2[q] = t + 1
            st = 0
            for q in range(m):                      # (c2[q]: the end of sub-bucket q now)
                en = c2[q]
                if en - st <= 32:
                    _insertion_sort(k2, i2, st, en)
                else:
                    o = np.argsort(k2[st:en], kind="mergesort")
                    kk = k2[st:en][o]
                    ii = i2[st:en][o]
                    k2[st:en] = kk
                    i2[st:en] = ii
                st = en
        for j in range(m):
            out[a + j] = i2[j]
    return out


def unroll(cg: CompiledGraph, iterations: int) -> CompiledGraph:
    """``iterations`` copies of ``cg`` joined by its iteration edges (one big DAG)."""
    if iterations == 1:
        return cg
    n = cg.n
    src0, dst0 = cg.edges()
    offs = np.arange(iterations, dtype=np.int64) * n
    src = [(src0[None, :] + offs[:, None]).ravel()]
    dst = [(dst0[None, :] + offs[:, None]).ravel()]
    if cg.iter_src.size:
        src.append((cg.iter_src[None, :] + offs[:-1, None]).ravel())
        dst.append((cg.iter_dst[None, :] + offs[1:, None]).ravel())
    src_a, dst_a = np.concatenate(src), np.concatenate(dst)
    total = n * iterations
    indptr, succ, indeg = csr_from_edges(total, src_a, dst_a)
    tiebreak = (cg.tiebreak[None, :] + offs[:, None]).ravel()
    return CompiledGraph(keys=cg.keys, dur=np.tile(cg.dur, iterations), device=np.tile(cg.device, iterations),
                         devices=cg.devices, priority=np.tile(cg.priority, iterations), indptr=indptr,
                         succ=succ, indeg=indeg, tiebreak=tiebreak)


@dataclass
class ReplayResult:
    """Simulated schedule of ``iterations`` iterations of a DFG.

    Op ``i`` of iteration ``it`` is row ``it * n + i`` of ``start``/``end``.
    """

    graph: CompiledGraph
    iterations: int
    start: np.ndarray
    end: np.ndarray
    crit_pred: np.ndarray
    dev_prev: np.ndarray
    _nx: nx.DiGraph | None = None
    #: asynchronous jobs: worker node -> its op indices in one iteration; ``iteration_time_us`` is then
    #: the slowest worker's steady state (see there)
    steady: dict[str, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return self.graph.n

    @property
    def makespan_us(self) -> float:
        return float(self.end.max(initial=0.0))

    @property
    def iteration_time_us(self) -> float:
        """One iteration: the makespan when replaying one; else the steady-state gap between the last two.

        With ``steady`` set (asynchronous workers, :func:`dpro_kit.graph.schemes.asynchronous_workers`)
        and at least 4 iterations: per worker, the mean gap between the ends of its consecutive
        iterations over the second half of the replay (its own pace once the start-up transient,
        every worker pushing at once, has passed); the slowest worker's.
        """
        if self.steady and self.iterations >= 4:
            return max(self.worker_steady_us().values())
        if self.iterations == 1:
            return self.makespan_us
        n = self.n
        last = self.end[(self.iterations - 1) * n:].max(initial=0.0)
        prev = self.end[(self.iterations - 2) * n:(self.iterations - 1) * n].max(initial=0.0)
        return float(last - prev)

    def worker_steady_us(self) -> dict[str, float]:
        """Per node of ``steady``: its mean iteration gap over the second half of the replayed iterations."""
        n, k = self.n, self.iterations
        out = {}
        for node, idx in (self.steady or {}).items():
            ends = np.array([self.end[i * n + idx].max(initial=0.0) for i in range(k)])
            gaps = np.diff(ends)[(k - 1) // 2:]
            out[node] = float(gaps.mean()) if gaps.size else float(ends[-1])
        return out

    def iteration_of(self, row: np.ndarray | int) -> np.ndarray | int:
        return row // self.n

    def key(self, row: int) -> str:
        return self.graph.keys[row % self.n]

    def critical_path(self) -> list[int]:
        """Rows on a longest path of the execution graph, in execution order.

        The kernel records, for every op, the op whose end fixed its start (a
        DFG predecessor or the previous op on its device); following those
        links back from the op that ends last yields the critical path.
        """
        if self.end.size == 0:
            return []
        row = int(np.argmax(self.end))
        path = [row]
        while self.crit_pred[row] >= 0:
            row = int(self.crit_pred[row])
            path.append(row)
        path.reverse()
        return path

    def device_of(self, row: int) -> str:
        d = int(self.graph.device[row % self.n])
        return self.graph.devices[d] if d >= 0 else ""

    def device_busy_us(self) -> dict[str, float]:
        dev = np.tile(self.graph.device, self.iterations)
        busy = np.bincount(dev[dev >= 0], weights=(self.end - self.start)[dev >= 0],
                           minlength=len(self.graph.devices))
        return {name: float(busy[i]) for i, name in enumerate(self.graph.devices)}

    def utilisation(self) -> dict[str, float]:
        span = self.makespan_us or 1.0
        return {d: b / span for d, b in self.device_busy_us().items()}

    def execution_graph(self) -> nx.DiGraph:
        """The DFG plus same-device ordering edges (for the first replayed iteration's keys).

        With one iteration the vertices are the op keys; with several they are
        ``(key, iteration)`` pairs.  Edge attribute ``order=True`` marks device-order edges.
        """
        cg = self.graph
        rows = self.start.size
        src, dst = _unrolled_edges(cg, self.iterations)
        name = (lambda r: cg.keys[r]) if self.iterations == 1 else (lambda r: (cg.keys[r % cg.n], r // cg.n))
        h = nx.DiGraph()
        for r in range(rows):
            h.add_node(name(r), start=float(self.start[r]), end=float(self.end[r]),
                       dur=float(self.end[r] - self.start[r]), device=self.device_of(r))
        h.add_edges_from((name(int(u)), name(int(v))) for u, v in zip(src, dst))
        for r in range(rows):
            p = int(self.dev_prev[r])
            if p >= 0 and not h.has_edge(name(p), name(r)):
                h.add_edge(name(p), name(r), order=True)
        return h

    def to_frame(self, g: nx.DiGraph | None = None) -> pd.DataFrame:
        """One row per simulated op: key, iteration, device, start, end (+ node/kind/name if ``g`` given)."""
        n = self.n
        rows = np.arange(self.start.size)
        df = pd.DataFrame({
            "key": [self.graph.keys[r % n] for r in rows],
            "iteration": rows // n,
            "device": [self.device_of(int(r)) for r in rows],
            "start": self.start, "end": self.end,
        })
        if g is not None:
            for attr in ("node", "kind", "name", "tensor", "bytes", "phase", "step", "chunk", "peer"):
                df[attr] = [g.nodes[k].get(attr) for k in df["key"]]
        return df


@njit(cache=True)
def _earliest_starts(dur, indptr, succ):  # pragma: no cover - compiled
    """Start times with unlimited devices (indices must be a topological order)."""
    est = np.zeros(dur.size)
    for u in range(dur.size):
        e = est[u] + dur[u]
        for k in range(indptr[u], indptr[u + 1]):
            if e > est[succ[k]]:
                est[succ[k]] = e
    return est


def locality_order(cg: CompiledGraph) -> np.ndarray:
    """A renumbering (new index -> old index) that follows simulated time.

    The kernel visits ops in time order; numbered in topological-generation
    order, consecutive visits are ~10^5 indices apart on a 1 M-op graph and
    every array access is a cache miss.  Sorting by (earliest start with
    unlimited devices, old index) keeps a topological order and puts ops that
    run together next to each other in memory (~1.5x faster at 1 M ops).
    ``compile_graph`` applies it once; the queue tie-break stays the
    generation index (``CompiledGraph.tiebreak``), so schedules do not change.
    """
    est = _earliest_starts(cg.dur, cg.indptr, cg.succ)
    return np.argsort(est, kind="stable")          # = lexsort((arange(n), est))


def renumber(cg: CompiledGraph, order: np.ndarray) -> CompiledGraph:
    """``cg`` with op ``order[i]`` moved to index ``i`` (same graph, same schedule, same tie-breaks)."""
    return _renumber(cg, order, _take(cg.keys, order))


def _renumber(cg: CompiledGraph, order: np.ndarray, keys: list[str]) -> CompiledGraph:
    n = cg.n
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n, dtype=np.int64)
    src, dst = cg.edges()
    indptr, succ, indeg = csr_from_edges(n, inv[src], inv[dst])
    return CompiledGraph(keys=keys, dur=cg.dur[order], device=cg.device[order],
                         devices=cg.devices, priority=cg.priority[order], indptr=indptr, succ=succ, indeg=indeg,
                         iter_src=inv[cg.iter_src], iter_dst=inv[cg.iter_dst], tiebreak=cg.tiebreak[order])


def run_kernel(cg: CompiledGraph, device_model: str = "fifo", model_options: dict | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The compiled replay loop on ``cg``'s arrays (``replay`` = compile + unroll + this + wrap).

    ``device_model`` names a kernel of :data:`dpro_kit.replay.rules.DEVICE_MODELS`;
    ``model_options`` go to a model registered with ``takes_graph=True`` (``shared``).
    """
    if device_model != "fifo" and rules.takes_graph(device_model):
        try:
            return rules.device_model(device_model)(cg, **(model_options or {}))
        except TypeError as e:
            raise GraphError(f"device model {device_model!r}: {e}") from None
    if model_options:
        raise GraphError(f"device model {device_model!r} takes no options (got {sorted(model_options)})",
                         hint="the Proteus options (overlap_factor, capacity, ...) are the 'shared' model's")
    kernel = simulate if device_model == "fifo" else rules.device_model(device_model)
    return kernel(cg.dur, cg.device, cg.priority, cg.indptr, cg.succ, cg.indeg, np.zeros(cg.n),
                  max(len(cg.devices), 1), cg.tiebreak)


def _unrolled_edges(cg: CompiledGraph, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    u = unroll(cg, iterations)
    return u.edges()


def replay(g: nx.DiGraph | CompiledGraph, *, iterations: int = 1, ops: Sequence[str] | None = None,
           schedule: str = "graph", device_model: str = "fifo", model_options: dict | None = None) -> ReplayResult:
    """Simulate ``iterations`` iterations of ``g`` (or of the subgraph induced by ``ops``).

    Parameters
    ----------
    g : networkx.DiGraph or CompiledGraph
        A global DFG (``docs/replayer.md``) or its compiled arrays.
    iterations : int, default 1
        Iterations to unroll through the graph's ``iteration_edges``.
    ops : sequence of str or None
        Replay only the subgraph these ops induce (partial replay; networkx graph only).
    schedule : str, default "graph"
        A priority order of :data:`dpro_kit.replay.rules.SCHEDULES` (``tic`` / ``tac`` /
        ``random``: TicTac's orders of PS transfers, :mod:`dpro_kit.optimize.tictac`).
    device_model : str, default "fifo"
        A kernel of :data:`dpro_kit.replay.rules.DEVICE_MODELS` (``shared``: Proteus' bandwidth
        sharing and overlap factor, :mod:`dpro_kit.replay.sharing`).
    model_options : dict or None
        Options of a ``takes_graph`` device model, e.g. ``{"overlap_factor": 0.1, "share": False,
        "hosts": {...}, "capacity": {"egress:host0": 0.5}}`` for ``shared``
        (:func:`dpro_kit.replay.sharing.run_shared`).

    Raises :class:`~dpro_kit.errors.GraphError` for a cycle, a bad duration or an unknown rule.
    """
    if iterations < 1:
        raise GraphError(f"iterations must be >= 1, got {iterations}")
    if ops is not None and isinstance(g, CompiledGraph):
        raise GraphError("partial replay (ops=...) needs the networkx graph, not a compiled one")
    cg = g if isinstance(g, CompiledGraph) else compile_graph(g, ops)
    if schedule != "graph":
        sub = None if isinstance(g, CompiledGraph) else (g if ops is None else induced_subgraph(g, ops))
        prio = rules.schedule_priorities(cg, schedule, sub)
        cg = replace(cg, priority=prio)
    u = unroll(cg, iterations)
    with small_pages():
        start, end, crit, prev, done = run_kernel(u, device_model, model_options)
    if done < u.dur.size:
        raise GraphError(f"only {done} of {u.dur.size} ops could run: the iteration edges form a cycle",
                         hint="an op of iteration i+1 must not precede its own iteration's ops")
    return ReplayResult(graph=cg, iterations=iterations, start=start, end=end, crit_pred=crit, dev_prev=prev)


__all__ = ["compile_arrays", "compile_graph", "CompiledGraph", "OpKeys", "csr_from_edges", "index_dtype", "induced_subgraph", "locality_order", "renumber",
           "replay", "ReplayResult", "run_kernel", "unroll"]
