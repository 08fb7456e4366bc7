"""Array-native compile (dpro_kit/graph/arrays.py): compile_trace(ts) equals
compile_graph(build_global_dfg(ts)) array for array (keys, durations, devices, priorities, CSR,
in-degrees, iteration edges, tie-breaks), so the replay is the same op for op; on generated
torch.profiler jobs and on real HTA Kineto traces; jobs it does not cover return None."""
from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_traces

from dpro_kit.graph.arrays import compile_trace, compile_trace_or_graph
from dpro_kit.graph.build import build_global_dfg
from dpro_kit.replay import compile_graph, replay
from dpro_kit.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
HTA = shared_traces() / "hta"
sys.path.insert(0, str(REPO / "bench"))


def assert_same_compiled(a, b):
    assert a.keys == b.keys
    assert a.devices == b.devices
    for f in ("dur", "device", "priority", "indptr", "succ", "indeg", "iter_src", "iter_dst", "tiebreak"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def check(ts):
    ref = compile_graph(build_global_dfg(ts))
    cg = compile_trace(ts)
    assert cg is not None
    assert_same_compiled(cg, ref)
    for it in (1, 2):
        r1, r2 = replay(cg, iterations=it), replay(ref, iterations=it)
        assert np.array_equal(r1.start, r2.start) and np.array_equal(r1.end, r2.end)
        assert r1.iteration_time_us == r2.iteration_time_us


@pytest.mark.parametrize("ranks,classes", [(3, None), (12, 3)])
def test_generated_jobs(tmp_path, ranks, classes):
    import scale
    scale.write_job(tmp_path / "job", ranks, layers=6, buckets=3, steps=2, classes=classes)
    check(load_trace(tmp_path / "job"))


def test_generated_job_through_the_hash_path(tmp_path, monkeypatch):
    """Ops numbered by hashing (node, op) pairs instead of the dense table (jobs whose op names differ
    per rank): same arrays."""
    import scale
    import dpro_kit.graph.arrays as arrays
    monkeypatch.setattr(arrays, "_DENSE_LIMIT", (0, 0))
    calls = []
    reduce = arrays._group_reduce
    monkeypatch.setattr(arrays, "_group_reduce", lambda *a: calls.append(1) or reduce(*a))   # the hash path's
    scale.write_job(tmp_path / "job", 12, layers=6, buckets=3, steps=2, classes=3)
    check(load_trace(tmp_path / "job"))
    assert calls


@pytest.mark.skipif(not HTA.is_dir(), reason="shared/traces/hta not present")
@pytest.mark.parametrize("files", [("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"),
                                   ("nccl_2rank_rank0.json.gz",), ("allgather_reducescatter_16rank_rank0.json.gz",)],
                         ids=["sampled128", "nccl2", "allgather16"])
def test_real_kineto(tmp_path, files):
    for f in files:
        shutil.copy(HTA / f, tmp_path / f)
    check(load_trace(tmp_path))


def test_not_covered_falls_back():
    ts = load_trace(REPO / "examples" / "traces" / "ddp-2host-1000mbit")    # dpro's ring topology
    assert compile_trace(ts) is None
    cg, how = compile_trace_or_graph(ts)
    assert how == "networkx"
    assert_same_compiled(cg, compile_graph(build_global_dfg(ts)))


def test_replicated_tables_job():
    """bench/scale.py's in-memory generator (template ranks copied with their own jitter): same arrays."""
    import scale
    ts, _ = scale.tables_job(20, template_ranks=3, layers=4, buckets=2, steps=2)
    assert ts.events["node"].nunique() == 20
    check(ts)


def test_ops_without_predecessors_keep_their_first_appearance_order(monkeypatch):
    """Several ops without predecessors per node (pairs dropped from the dependency lists): the position-major
    numbering lists them in another order than their first appearance (every node's first, then every node's
    second); compile_arrays is given them in first-appearance order, so the arrays are still networkx's."""
    import scale
    import dpro_kit.replay.engine as engine
    ts, _ = scale.tables_job(6, template_ranks=3, layers=4, buckets=2, steps=2)
    ts = replace(ts, edges={n: [e for i, e in enumerate(el) if i % 5 != 1] for n, el in ts.edges.items()})
    seen = []
    real = engine.compile_arrays
    monkeypatch.setattr(engine, "compile_arrays", lambda *a, **k: seen.append(k.get("sources")) or real(*a, **k))
    check(ts)
    src = [x for x in seen if x is not None]                # (compile_trace's call; compile_graph's gives None)
    assert len(src) == 1 and (np.diff(src[0]) < 0).any()    # not the index order: the order given matters


def test_position_major_numbering():
    """_position_major: ops given node by node (nodes of different sizes, node codes with gaps) renumbered every
    node's first op in node order, then every node's second op, ...; perm and inv are inverse permutations;
    nodes not in runs are refused."""
    from dpro_kit.graph.arrays import _position_major
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 9, 40)
    sizes[[3, 17]] = [20, 1]
    codes = np.sort(rng.choice(100, 40, replace=False))
    gnode = np.repeat(codes, sizes).astype(np.int32)
    perm, inv = np.empty(gnode.size, dtype=np.int32), np.empty(gnode.size, dtype=np.int32)
    g2 = gnode.copy()
    assert _position_major(g2, perm, inv)
    pos = np.arange(gnode.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    assert np.array_equal(inv, np.lexsort((gnode, pos)))          # new -> old: by position, then node
    assert np.array_equal(perm[inv], np.arange(gnode.size))
    assert np.array_equal(g2, gnode[inv])                          # the node codes in the new order, in place
    g3 = gnode[::-1].copy()
    assert not _position_major(g3, perm, inv) and np.array_equal(g3, gnode[::-1])


def test_group_means_are_pandas_means():
    """_group_reduce sums as pandas' groupby mean does (compensated, in row order, NaN skipped): equal bits
    on values of mixed magnitudes, where a plain sum would differ."""
    import pandas as pd
    from dpro_kit.graph.arrays import _group_reduce
    rng = np.random.default_rng(3)
    n, groups = 200_000, 5_000
    gid = rng.integers(0, groups, n)
    dur = rng.lognormal(0.0, 4.0, n) * rng.choice([1e-6, 1.0, 1e6], n)
    dur[rng.integers(0, n, 500)] = np.nan
    first, mean = _group_reduce(gid.astype(np.int64), groups, dur)
    ref = pd.Series(dur).groupby(gid).mean()
    assert np.array_equal(mean[ref.index.to_numpy()], ref.to_numpy(), equal_nan=True)
    plain = np.bincount(gid, weights=np.nan_to_num(dur), minlength=groups) / np.bincount(gid[~np.isnan(dur)],
                                                                                          minlength=groups)
    assert not np.array_equal(plain, mean)          # the data does exercise the compensation
    assert np.array_equal(first, pd.Series(np.arange(n)).groupby(gid).first().to_numpy())


@pytest.mark.parametrize("node_runs", [True, False], ids=["node-runs", "interleaved"])
def test_group_dense_is_group_reduce(node_runs):
    """_group_dense (one pass through the dense node x op table; per-node scratch when each node's rows are
    one run) gives _group_reduce's first rows and means, bit for bit, communication rows skipped."""
    from dpro_kit.graph.arrays import _group_dense, _group_reduce
    rng = np.random.default_rng(5)
    n, nodes, nop = 60_000, 7, 300
    nc = np.sort(rng.integers(0, nodes, n)) if node_runs else rng.integers(0, nodes, n)
    nc = nc.astype(np.int32)
    oc = rng.integers(0, nop, n).astype(np.int32)
    kc = rng.integers(0, 3, n).astype(np.int16)
    comm = np.array([False, True, False])
    dur = rng.lognormal(0.0, 4.0, n) * rng.choice([1e-6, 1.0, 1e6], n)
    dur[rng.integers(0, n, 300)] = np.nan
    dur[(nc == 3) & (oc == 7)] = np.nan                # a group of NaN only
    first, sums, table = _group_dense(nc, oc, kc, comm, dur, nop, nodes * nop, np.zeros(0, dtype=np.int32), n + 10)
    rows = np.flatnonzero(~comm[kc])
    comb = nc[rows].astype(np.int64) * nop + oc[rows]
    _, idx, gid = np.unique(comb, return_index=True, return_inverse=True)
    rank = np.empty(idx.size, dtype=np.int64)
    rank[np.argsort(idx, kind="stable")] = np.arange(idx.size)     # groups by first appearance
    f_ref, m_ref = _group_reduce(rank[gid], idx.size, dur[rows])
    assert np.array_equal(first, rows[f_ref])
    assert np.array_equal(sums[:first.size], m_ref, equal_nan=True)
    assert np.isnan(m_ref).any() and sums.size >= n + 10


def test_small_pages_restores_numpys_advice(monkeypatch):
    """compile_trace and replay switch numpy's huge-page advice off inside and restore it; a user's
    NUMPY_MADVISE_HUGEPAGE is left alone."""
    from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage
    from dpro_kit.replay.engine import small_pages
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    was = _set_madvise_hugepage(True)
    try:
        with small_pages():
            assert not _get_madvise_hugepage()
            with small_pages():                 # nested (or another thread's): restored by the outermost only
                assert not _get_madvise_hugepage()
            assert not _get_madvise_hugepage()
        assert _get_madvise_hugepage()
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
        with small_pages():
            assert _get_madvise_hugepage()
    finally:
        _set_madvise_hugepage(was)


def test_small_pages_keeps_freed_arrays_in_the_heap(monkeypatch):
    """Inside the block glibc's mmap of large arrays is off (mallopt(M_MMAP_MAX, 0)) and its default is put
    back by the outermost block; a user's MALLOC_MMAP_MAX_ is left alone."""
    from dpro_kit.replay import engine
    calls = []
    monkeypatch.setitem(engine._pages, "mallopt", lambda p, v: calls.append((p, v)) or 1)
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    with engine.small_pages():
        with engine.small_pages():
            assert calls == [(-4, 0)]
    assert calls == [(-4, 0), (-4, 65536)]
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    with engine.small_pages():
        pass
    assert len(calls) == 2


def _generations_reference(indptr, succ, indeg0):
    """Generation order written out (``nx.topological_sort``'s: generation by generation, children in
    the CSR's order; a duplicated edge counts twice, as in the CSR)."""
    indeg = indeg0.copy()
    order = [i for i in range(indeg.size) if indeg[i] == 0]
    lo = 0
    while lo < len(order):
        hi = len(order)
        for u in order[lo:hi]:
            for v in succ[indptr[u]:indptr[u + 1]]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    order.append(int(v))
        lo = hi
    return np.asarray(order, dtype=np.int64)


def test_compile_arrays_is_generation_order_then_locality():
    """compile_arrays composes its two renumberings; equal to doing them one after the other (the
    definition: generation order, then renumber(locality_order)) on a random DAG."""
    from dpro_kit.replay.engine import (CompiledGraph, _earliest_starts, compile_arrays,
                                        csr_from_edges, locality_order, renumber)
    rng = np.random.default_rng(7)
    n = 3000
    rank = rng.permutation(n)                        # a hidden topological order
    u, v = rng.integers(0, n, 12_000), rng.integers(0, n, 12_000)
    keep = rank[u] < rank[v]
    src, dst = u[keep], v[keep]
    dur = np.round(rng.exponential(5.0, n), 1)       # ties in earliest starts
    dev = rng.integers(-1, 9, n)
    names = [f"d{i}" for i in range(9)]
    it = np.stack([rng.integers(0, n, 50), rng.integers(0, n, 50)], axis=1)
    prio = rng.integers(0, 3, n).astype(float)
    keys = [f"op{i}" for i in range(n)]
    got = compile_arrays(keys, dur, prio, dev, names, src, dst, it)
    # the two steps
    ip0, s0, deg0 = csr_from_edges(n, src, dst)
    order = _generations_reference(ip0, s0, deg0)
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    dev_t = dev[order]
    ids, firstpos = np.unique(dev_t[dev_t >= 0], return_index=True)
    by_first = ids[np.argsort(firstpos, kind="stable")]
    remap = np.full(9, -1)
    remap[by_first] = np.arange(by_first.size)
    ip, sc, dg = csr_from_edges(n, inv[src], inv[dst])
    cg1 = CompiledGraph(keys=[keys[i] for i in order], dur=dur[order], device=np.where(dev_t >= 0, remap[dev_t], -1),
                        devices=[names[i] for i in by_first], priority=prio[order], indptr=ip, succ=sc, indeg=dg,
                        iter_src=inv[it[:, 0]], iter_dst=inv[it[:, 1]])
    loc = np.lexsort((np.arange(n), _earliest_starts(cg1.dur, cg1.indptr, cg1.succ)))   # by time, then index
    assert np.array_equal(loc, locality_order(cg1))
    assert_same_compiled(got, renumber(cg1, loc))
    # the CSR made by the caller (compile_trace does, to free its edge arrays first) gives the same arrays,
    # repeated edges dropped as with dedupe=True
    src2, dst2 = np.concatenate([src, src[:500]]), np.concatenate([dst, dst[:500]])
    want = compile_arrays(keys, dur, prio, dev, names, src2, dst2, it, dedupe=True)
    csr = csr_from_edges(n, src2.astype(np.int32), dst2.astype(np.int32), dedupe=True)
    assert_same_compiled(compile_arrays(keys, dur, prio, dev, names, None, None, it, csr=csr), want)
    # reuse=True (the caller gives up its arrays as buffers; the CSR as a list, emptied): the same arrays,
    # with list keys and with OpKeys (whose code arrays are reused too), int32 and int64 arrays
    from dpro_kit.replay.engine import OpKeys
    okeys = OpKeys([f"op{i}" for i in range(n)], [""], np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int32))
    for kk, dt in ((keys, np.int64), (okeys, np.int32), (okeys, np.int64)):
        kk2 = kk if isinstance(kk, list) else OpKeys(kk.left_names, kk.right_names, kk.left.copy(), kk.right.copy())
        csr2 = list(csr_from_edges(n, src2.astype(dt), dst2.astype(dt), dedupe=True))
        got2 = compile_arrays(kk2, dur.copy(), prio.copy(), dev.astype(dt), names, None, None, it, csr=csr2,
                              reuse=True)
        assert csr2 == []
        assert got2.keys == want.keys
        assert_same_compiled(got2, want)
    # prio0=None: every priority +0.0 (the zeros made, not gathered)
    zero = compile_arrays(keys, dur, np.zeros(n), dev, names, src2, dst2, it, dedupe=True)
    none = compile_arrays(keys, dur.copy(), None, dev, names, None, None, it, csr=list(csr_from_edges(
        n, src2.astype(np.int32), dst2.astype(np.int32), dedupe=True)), reuse=True)
    assert_same_compiled(none, zero)
    assert none.priority.dtype == np.float64 and not np.signbit(none.priority).any()
    # the ops renumbered by any permutation (edges in the same order, so each op's successors keep theirs),
    # the ops without predecessors given in their old order (sources): the same arrays
    perm = rng.permutation(n)
    at = np.empty(n, dtype=np.int64)
    at[perm] = np.arange(n)                             # new -> old
    src0 = np.flatnonzero(csr_from_edges(n, src2, dst2, dedupe=True)[2] == 0)
    moved = compile_arrays([keys[i] for i in at], dur[at], prio[at], dev[at], names, perm[src2], perm[dst2], perm[it],
                           dedupe=True, sources=perm[src0])
    assert_same_compiled(moved, want)
    assert not np.array_equal(np.sort(perm[src0]), perm[src0])      # (the order given is not the index order)


def test_csr_drops_repeated_edges_at_first_occurrence():
    """csr_from_edges(dedupe=True): repeated edges dropped, each kept at its first position (what networkx's
    add_edge keeps), i.e. the CSR of the first occurrences; in-degrees count kept edges only."""
    import pandas as pd
    from dpro_kit.replay.engine import csr_from_edges
    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 50, 5000), rng.integers(0, 50, 5000)
    keep = ~pd.Index(src * 50 + dst).duplicated(keep="first")
    want = csr_from_edges(50, src[keep], dst[keep])
    got = csr_from_edges(50, src, dst, dedupe=True)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert got[1].size == keep.sum() < src.size
    empty = csr_from_edges(3, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), dedupe=True)
    assert empty[0].tolist() == [0, 0, 0, 0] and empty[1].size == 0
    for dedupe in (False, True):       # int32 edges give int32 arrays, the same values
        got32 = csr_from_edges(50, src.astype(np.int32), dst.astype(np.int32), dedupe=dedupe)
        want64 = csr_from_edges(50, src, dst, dedupe=dedupe)
        assert all(x.dtype == np.int32 and y.dtype == np.int64 and np.array_equal(x, y) for x, y in zip(got32, want64))


def test_index_arrays_are_int32_where_they_fit():
    """The array path's index arrays (CSR, in-degrees, devices, tie-breaks, iteration edges) are int32 (half
    the memory and fresh pages of int64); int64 only past 2**31 - 1."""
    import scale
    from dpro_kit.replay.engine import index_dtype
    cg = compile_trace(scale.tables_job(6, template_ranks=2, layers=3, buckets=2, steps=1)[0])
    for f in ("device", "indptr", "succ", "indeg", "iter_src", "iter_dst", "tiebreak"):
        assert getattr(cg, f).dtype == np.int32, f
    assert index_dtype(10, 2 ** 31 - 2) is np.int32 and index_dtype(2 ** 31 - 1) is np.int64


def test_op_keys_behave_as_the_list():
    """compile_trace's keys are OpKeys (codes into two name tables, strings made on demand); they act as
    the list of strings the networkx path gives: len, indexing, slices, iteration, in, index, ==."""
    import scale
    from dpro_kit.replay.engine import OpKeys, renumber
    ts, _ = scale.tables_job(6, template_ranks=2, layers=3, buckets=2, steps=1)
    cg, ref = compile_trace(ts), compile_graph(build_global_dfg(ts))
    assert isinstance(cg.keys, OpKeys) and isinstance(ref.keys, list)
    keys = ref.keys
    assert cg.keys.tolist() == keys and list(cg.keys) == keys and len(cg.keys) == len(keys)
    assert cg.keys == keys and keys == cg.keys and cg.keys == tuple(keys) and not cg.keys != keys
    assert cg.keys != keys[:-1] and cg.keys != keys[::-1] and cg.keys != "x"
    assert all(type(k) is str for k in cg.keys)
    for i in (0, 1, len(keys) // 2, len(keys) - 1, -1, -len(keys)):
        assert cg.keys[i] == keys[i]
    with pytest.raises(IndexError):
        cg.keys[len(keys)]
    assert list(cg.keys[3:17:2]) == keys[3:17:2] and isinstance(cg.keys[3:17], OpKeys)
    for k in (keys[0], keys[-1], next(k for k in keys if k.startswith("|SYNC")), next(k for k in keys if "STEP_END" in k)):
        assert k in cg.keys and cg.keys.index(k) == keys.index(k) and cg.keys.count(k) == 1
    assert "nope" not in cg.keys and 3 not in cg.keys
    with pytest.raises(ValueError):
        cg.keys.index("nope")
    order = np.random.default_rng(1).permutation(len(keys))
    assert renumber(cg, order).keys == renumber(ref, order).keys
    big = OpKeys(["a", "b"], ["|x", "|y"], np.arange(200_000) % 2, np.arange(200_000) // 100_000)   # several chunks
    assert big.index("b|y") == 100_001 and big == big.take(np.arange(200_000))
    assert list(big)[-1] == "b|y" and big != big.take(np.arange(200_000)[::-1])
    r1, r2 = replay(cg), replay(ref)
    assert r1.to_frame()["key"].tolist() == keys and r1.key(5) == keys[5]


def test_locality_sort_is_numpys_stable_argsort():
    """The locality sort (buckets by value, then insertion or merge sorts) orders as np.argsort(kind="stable"):
    ties kept in index order, -0.0 equal to 0.0, tiny and huge magnitudes, inf; empty and one value; values
    piled up in one bucket or sub-bucket; int32 indices."""
    from dpro_kit.replay.engine import stable_argsort_nonneg
    rng = np.random.default_rng(11)
    x = np.round(rng.exponential(50.0, 300_000), 1)                      # many ties
    x[rng.integers(0, x.size, 2000)] = 0.0
    x[rng.integers(0, x.size, 2000)] = -0.0
    x[rng.integers(0, x.size, 50)] = np.inf
    x[rng.integers(0, x.size, 500)] = rng.lognormal(0.0, 30.0, 500)     # 1e-30 .. 1e30
    piled = rng.random(20_000) * 1e-9 + 5.0                             # all in one bucket and few sub-buckets
    piled[::97] = 1e6
    for v in (x, x[:1], x[:0], np.zeros(1000), np.full(7, 3.5), np.full(3, np.inf), piled, rng.random(50_000)):
        assert np.array_equal(stable_argsort_nonneg(v), np.argsort(v, kind="stable"))
    assert np.array_equal(stable_argsort_nonneg(x, np.int32), np.argsort(x, kind="stable"))


def test_encode_buffers_is_arrows_dictionary_encode():
    """The buffer-reading encoder (node, kind; stream at each op's first row; op when ranks repeat) gives
    Arrow's codes and dictionary: chunks of both string types (one sliced), empty strings, non-ASCII, runs, values equal
    up to their last byte, one that is a prefix of another, 40,000 distinct values (the table grows many
    times), rows ``at`` across chunk borders; a column with a null goes back to Arrow."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    from dpro_kit.graph.arrays import _encode, _encode_buffers
    rng = np.random.default_rng(5)
    vocab = ["", "a", "ab", "abcdefgh", "abcdefghi", "abcdefgX", "héllo/ünï", "gpu:7/void k<float>()#41",
             "gpu:7/void k<float>()#42"] + [f"host{i}/op#{i * 7919 % 40_000}" for i in range(40_000)]
    vals = [vocab[i] for i in np.minimum(rng.zipf(1.3, 120_000), len(vocab)) - 1]
    vals[1000:1500] = ["run"] * 500
    parts = [pa.array(vals[:30_000], type=pa.large_string()), pa.array(vals[30_000:70_000], type=pa.large_string()),
             pa.array(["pad"] * 10 + vals[70_000:], type=pa.large_string()).slice(10)]
    col = pa.chunked_array(parts)
    at = np.unique(rng.integers(0, len(vals), 30_000))
    for rows in (None, at, np.array([29_999, 30_000, 69_999, 70_000]), np.zeros(0, dtype=np.int64)):
        codes, uniq = _encode_buffers(col, rows, True)
        ref = pc.dictionary_encode(col if rows is None else col.take(pa.array(rows)))
        ref_codes = np.concatenate([c.indices.to_numpy() for c in ref.chunks]) if ref.num_chunks else np.zeros(0)
        assert np.array_equal(codes, ref_codes)
        assert uniq == (ref.chunks[0].dictionary.to_pylist() if ref.num_chunks else [])
        assert codes.dtype == (np.int32 if len(uniq) > 32_768 else np.int16)   # int16 overflowed: again as int32
    # repeated chunks (their codes copied): equal ones, one with the same bytes split differently, one
    # with the same lengths but another byte, a new value after them; with and without runs
    base = vals[:5_000]
    moved = ["".join(base[:2])] + base[2:] + [""]
    other = list(base)
    other[4_321] = other[4_321][:-1] + "#" if other[4_321] else "#"
    rep = pa.chunked_array([pa.array(x, type=pa.large_string()) for x in
                            (base, base, moved, other, base, other, base + ["brand new"], base) + (base,) * 12])
    ref = pc.dictionary_encode(rep)
    for runs in (False, True):
        codes, uniq = _encode_buffers(rep, None, runs)
        assert np.array_equal(codes, np.concatenate([c.indices.to_numpy() for c in ref.chunks]))
        assert uniq == ref.chunks[0].dictionary.to_pylist()
    # rows ``at`` of repeated chunks: the same rows of a repeated chunk (codes copied), other rows of one
    lens = np.cumsum([0] + [len(c) for c in rep.chunks])
    pick = np.unique(rng.integers(0, 5_000, 900))
    sel = [pick + lens[i] for i in range(len(rep.chunks))]
    sel[5] = np.unique(rng.integers(0, 5_000, 900)) + lens[5]     # other rows of a repeated chunk
    sel[8] = pick[:-1] + lens[8]                                   # one row fewer
    at_rep = np.concatenate(sel)
    codes, uniq = _encode_buffers(rep, at_rep, False)
    ref = pc.dictionary_encode(rep.take(pa.array(at_rep)))
    assert np.array_equal(codes, np.concatenate([c.indices.to_numpy() for c in ref.chunks]))
    assert uniq == ref.chunks[0].dictionary.to_pylist()
    assert _encode_buffers(col, None, False) is None          # few repeats, many values: Arrow hashes them
    many = pa.chunked_array([pa.array(vocab[:20_000], type=pa.large_string()),
                             pa.array(vocab[20_000:] + vocab[:5], type=pa.large_string())])
    codes, uniq = _encode_buffers(many, None, True)                         # past int16: encoded again
    assert codes.dtype == np.int32 and uniq == vocab and codes.tolist() == list(range(len(vocab))) + [0, 1, 2, 3, 4]
    small = pa.chunked_array([pa.array(["x", "y", "x"])])                    # 32-bit offsets
    assert _encode_buffers(small, None, True)[1] == ["x", "y"] and _encode_buffers(small, None, True)[0].tolist() == [0, 1, 0]
    assert _encode_buffers(pa.chunked_array([pa.array(["x", None])]), None) is None
    codes, uniq = _encode(pd.Series(["x", None, "x"], dtype="string[pyarrow]"), runs=True)    # via Arrow
    assert codes.tolist() == [0, 1, 0] and uniq == ["x", None]
    assert _encode_buffers(col, np.array([5, 3])) is None                     # rows must increase



def test_encode_all_chunks_in_one_call_is_arrows_dictionary_encode():
    """The one-call encoder over many chunks (docs/scale.md "Fifth pass"): chunks of one value (nodes' rows,
    some of empty strings), chunks of one row, chunks repeating earlier ones byte for byte, chunks of equal
    offsets but other bytes (two nodes' names), sliced chunks, 32- and 64-bit offsets, a new value at the
    end of each of 3,000 chunks (the hash table grows between chunks); with and without ``runs``, all rows
    or rows ``at``: Arrow's codes and dictionary."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from dpro_kit.graph.arrays import _encode_buffers
    rng = np.random.default_rng(17)
    vocab = [f"gpu:{i % 7}/aten::op{i}" for i in range(300)] + ["", "é/ü", "x" * 40]
    for typ in (pa.large_string(), pa.string()):
        parts = []
        for i in range(400):
            kind = i % 6
            if kind == 0:
                vals = [f"host{i // 8}/{i:04d}"] * int(rng.integers(1, 3000))      # one value (a node)
            elif kind == 1:
                vals = [""] * int(rng.integers(1, 50))
            elif kind == 2 and parts:
                parts.append(parts[int(rng.integers(0, len(parts)))])              # a repeat
                continue
            elif kind == 3:
                vals = [vocab[int(rng.integers(0, len(vocab)))]]
            else:
                vals = [vocab[j] for j in rng.integers(0, len(vocab), int(rng.integers(1, 2000)))]
            a = pa.array(["pad"] * 3 + vals, type=typ).slice(3) if i % 5 == 0 else pa.array(vals, type=typ)
            parts.append(a)
        col = pa.chunked_array(parts)
        n = len(col)
        for runs in (True, False):
            for rows in (None, np.unique(rng.integers(0, n, n // 3)), np.arange(0, n, 7)):
                got = _encode_buffers(col, rows, runs)
                if got is None:
                    assert rows is None and not runs        # few repeats: Arrow hashes them
                    continue
                codes, uniq = got
                ref = pc.dictionary_encode(col if rows is None else col.take(pa.array(rows)))
                assert np.array_equal(codes, np.concatenate([c.indices.to_numpy() for c in ref.chunks]))
                assert uniq == ref.chunks[0].dictionary.to_pylist()
    grow = pa.chunked_array([pa.array(["x", f"new{i}"], type=pa.large_string()) for i in range(3_000)])
    codes, uniq = _encode_buffers(grow, None, True)
    assert uniq == ["x"] + [f"new{i}" for i in range(3_000)]
    assert codes.tolist() == [c for i in range(3_000) for c in (0, i + 1)]


def test_one_value_is_every_string_equal_to_the_first():
    """The one-value check of a chunk (a node's rows; docs/scale.md "Ninth pass": strings 1-7 against the one
    before, later bytes against the byte 8 strings before, whole words at a time): against ``len(set(...)) == 1``
    on chunks of 2-40 strings of 1-13 bytes starting at every place in a word, with one byte changed at every
    position (in the first 8 strings, in the word-aligned middle, in the tail bytes) or one length changed."""
    from dpro_kit.graph.arrays import _one_value
    rng = np.random.default_rng(5)
    for _ in range(120):
        ln = int(rng.integers(1, 14))
        m = int(rng.integers(2, 41))
        pad = int(rng.integers(0, 16))
        base = rng.integers(97, 123, ln).astype(np.uint8)
        buf = np.zeros(pad + ln * m + 16, dtype=np.uint8)
        buf[pad:pad + ln * m] = np.tile(base, m)
        offs = pad + ln * np.arange(m + 1, dtype=np.int64)
        words = buf[:buf.size // 8 * 8].view(np.uint64)
        assert _one_value(offs, buf, words)
        for j in range(pad + ln, pad + ln * m):                     # one byte changed: not one value
            buf[j] ^= 1
            assert not _one_value(offs, buf, words), (ln, m, pad, j)
            buf[j] ^= 1
        for i in range(1, m):                                       # one length changed
            o2 = offs.copy()
            o2[i] += 1
            assert not _one_value(o2, buf, words)


def test_dependency_lists_that_differ_off_the_sampled_pairs():
    """Nodes whose dependency lists have one length and equal sampled pairs (the 17 compared before a full
    comparison) but differ elsewhere (a pair replaced by its neighbour: one edge fewer, which changes the
    CSR, the tie-breaks and the order) or at a sampled pair: each node keeps its own list; same arrays as
    networkx's."""
    import scale
    ts, _ = scale.tables_job(12, template_ranks=3, layers=6, buckets=2, steps=2)
    nodes = list(ts.edges)
    ln = len(ts.edges[nodes[0]])
    step = max(ln // 16, 1)
    i = next(i for i in range(ln // 3, ln - 2) if (ln - 1 - i) % step and (ln - 2 - i) % step)
    for k, node in enumerate(nodes[:8]):
        e = list(ts.edges[node])
        if len(e) != ln:
            continue
        if k % 2:
            e[i] = e[i + 1]                             # off the sample
        if k % 4 == 3:
            e[ln - 1] = e[ln - 2]                       # on it
        ts.edges[node] = e
    assert len({tuple(ts.edges[n]) for n in nodes[:8]}) >= 3      # unchanged, off the sample, on it
    check(ts)

@pytest.mark.skipif(not HTA.is_dir(), reason="shared/traces/hta not present")
def test_cli_replay_fast(tmp_path, capsys, monkeypatch):
    """`dpro replay --fast`: the iteration time of `--mean-durations` from the arrays (plain Kineto with NCCL)
    or through networkx (a job the arrays do not cover); other outputs and what-ifs are refused (exit 2)."""
    import json

    from dpro_kit.cli import main
    monkeypatch.setenv("DPRO_CACHE", str(tmp_path / "cache"))
    job = tmp_path / "s128"
    job.mkdir()
    for f in ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"):
        shutil.copy(HTA / f, job / f)
    for trace, how in ((job, "arrays"), (REPO / "examples" / "traces" / "ddp-2rank-gloo", "networkx")):
        assert main(["replay", str(trace), "--fast", "--json", "-n", "2"]) == 0
        fast = json.loads(capsys.readouterr().out)
        assert main(["replay", str(trace), "--mean-durations", "--json", "-q", "-n", "2"]) == 0
        full = json.loads(capsys.readouterr().out)
        assert fast["compiled_by"] == how and fast["fast"] is True and fast["ops"] == full["ops"]
        assert fast["iteration_time_ms"] == full["iteration_time_ms"]
        assert fast["measured_iteration_ms"] == full["measured_iteration_ms"]
        assert fast["error_pct"] == pytest.approx(full["error_pct"])
    for extra in (["--bandwidth-mbps", "100"], ["--timeline", str(tmp_path / "t.json")], ["--stragglers"]):
        assert main(["replay", str(job), "--fast", *extra]) == 2
        assert "--fast gives the iteration time only" in capsys.readouterr().err
