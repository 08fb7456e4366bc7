"""How do ingest, graph build, compile and replay scale with the number of ranks?

    python bench/scale.py                                  # 64, 128, 256 ranks (a few minutes)
    python bench/scale.py --ranks 1024 --repeat 1          # the 1,024-rank point (~250 MB of JSON)
    python bench/scale.py --ranks 64 --keep /tmp/job64     # keep the generated traces
    python bench/scale.py --trace /work/gpu-big/h100-86mb/big-transformer-b64 --store --arrays
                                                           # an existing (real) trace folder instead

For each rank count a job's plain torch.profiler (Kineto) traces are generated
into a temporary folder (deleted afterwards unless ``--keep``; never in the
repository), one ``.json`` per rank, as ``torch.profiler`` exports them and as
``dpro_kit/readers/kineto_plain.py`` reads them (docs/kineto.md):
``distributedInfo``, ``deviceProperties``, ``ProfilerStep#N`` ranges, the
forward ops on the training thread, the backward ops on autograd's thread,
``cudaLaunchKernel`` calls with ``correlation`` ids and their kernels on the
compute stream, DDP's bucket all-reduces as ``record_param_comms`` ->
``ncclDevKernel_AllReduce_*`` on the NCCL stream (collective name, message
size, process group and sequence number in the kernel's arguments, as newer
PyTorch writes them), an input copy (``gpu_memcpy``) and the optimizer's
kernels, then a ``cudaStreamSynchronize`` (``aten::item``) at the end of the
step.  Durations are log-normal per layer, with a per-rank jitter (ranks run
the same model, not exactly the same times); ``--classes K`` makes ranks of
one class (rank % K) identical in durations (ranks of a real job rarely are;
the symmetry replay uses it).

Then, **each measurement in a fresh Python process** (so one stage's garbage
does not slow the next point, and ``ru_maxrss`` is this point's peak), the
stages ``dpro replay`` runs are timed one after the other:

* ``ingest``: :func:`dpro_kit.trace.load_trace` (discovery + per-rank parse);
* ``build``: :func:`dpro_kit.graph.build.build_global_dfg` (networkx global DFG);
* ``compile``: :func:`dpro_kit.replay.compile_graph` (networkx -> arrays);
* ``replay``: :func:`dpro_kit.replay.replay` on the compiled arrays (numba
  compilation excluded: the process replays a tiny graph first).

Times are wall-clock seconds (CPU seconds in ``--json``), median over
``--repeat`` processes; ``peak MB`` is the process's maximum resident set
size (``ru_maxrss``) after the stage, so it includes the stages before it.

The peer printed beside each row is the original dPRO replayer, measured on
this machine at 19 k ops/s on a 1 M-op graph (52.9 s; issue 17): its replay of
a graph of this size at that rate (an extrapolation from that one
measurement, not a run).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: the original dPRO replayer on this machine: 1 M ops in 52.9 s (issue 17)
DPRO_OPS_PER_S = 19_000

__all__ = ["write_job", "rank_doc", "replicate_job", "tables_job", "DPRO_OPS_PER_S"]


# --------------------------------------------------------------------------- generator

def _layer_scales(layers: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-layer forward kernel (us), backward kernel (us) and gradient elements: one model, all ranks."""
    rng = np.random.default_rng(seed)
    fw = np.exp(rng.normal(math.log(120.0), 0.6, layers))
    bw = fw * np.exp(rng.normal(math.log(2.0), 0.15, layers))
    nelems = np.exp(rng.uniform(math.log(2 ** 14), math.log(2 ** 22), layers)).astype(np.int64)
    return fw, bw, nelems


def rank_doc(rank: int, world: int, *, layers: int = 48, buckets: int = 6, steps: int = 3, first_step: int = 100,
             gpus_per_host: int = 8, seed: int = 0, classes: int | None = None,
             bandwidth_gbps: float = 100.0) -> dict:
    """One rank's torch.profiler document (a dict ready for ``json.dump``).

    Parameters
    ----------
    rank, world : int
        ``distributedInfo``'s rank and world size.
    layers, buckets, steps : int
        Model layers (one forward and one backward kernel each), DDP buckets (one
        all-reduce each, last layers first), profiled steps ``first_step ...``.
    gpus_per_host : int
        ``deviceProperties`` entries: the reader places rank r on ``host<r // gpus_per_host>``.
    seed : int
        The model (layer times and sizes) and the jitter.
    classes : int or None
        None: every rank has its own jitter.  K: rank r's jitter is class ``r % K``'s,
        so ranks of one class have identical durations and gaps (only their clocks differ).
    bandwidth_gbps : float
        Bus bandwidth behind the NCCL kernels' durations (ring all-reduce: 2(N-1)/N x bytes).
    """
    fw, bw, nelems = _layer_scales(layers, seed)
    jit_seed = (seed, rank if classes is None else rank % classes)
    rng = np.random.default_rng(jit_seed)
    pid, tid_main, tid_bw = 1000 + rank, 1000 + rank, 5000 + rank
    s_comp, s_nccl, s_copy = 7, 20, 13
    ev: list[dict] = []
    corr = [rank * 10_000_000]
    host_off = (rank // gpus_per_host) * 1_371.0    # hosts' clocks differ; ranks of one host share one
    t = 1_000_000.0 + host_off
    seq = 0

    def jit(x: float) -> float:
        return round(float(x) * float(np.exp(rng.normal(0.0, 0.06))), 3)

    def x(name, cat, tid, ts, dur, args=None, p=None):
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid if p is None else p, "tid": tid,
             "ts": round(ts, 3), "dur": round(dur, 3)}
        if args:
            e["args"] = args
        ev.append(e)
        return e

    gpu_free = {s_comp: 0.0, s_nccl: 0.0, s_copy: 0.0}

    def launch(tid, ts, kname, stream, kdur, kargs=None, cat="kernel"):
        """A cudaLaunchKernel at ``ts`` on thread ``tid`` and its kernel; returns (call end, kernel end)."""
        corr[0] += 1
        c = corr[0]
        call = jit(6.0)
        x("cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync", "cuda_runtime", tid, ts, call,
          {"correlation": c, "External id": c, "cbid": 211})
        k0 = max(ts + call + 3.0, gpu_free[stream])
        args = {"device": rank % gpus_per_host, "stream": stream, "correlation": c, "External id": c}
        args.update(kargs or {})
        x(kname, cat, stream, k0, kdur, args, p=rank % gpus_per_host)
        gpu_free[stream] = k0 + kdur
        return ts + call, k0 + kdur

    per_bucket = np.array_split(np.arange(layers)[::-1], buckets)   # bucket 0: the last layers
    for s in range(steps):
        step0 = t
        # input copy
        c0 = t + jit(15.0)
        call_end, _ = launch(tid_main, c0 + 2.0, "Memcpy HtoD (Pageable -> Device)", s_copy, jit(80.0),
                             {"bytes": 4 << 20}, cat="gpu_memcpy")
        x("aten::to", "cpu_op", tid_main, c0, call_end - c0 + 2.0)
        t = call_end + 4.0
        gpu_free[s_comp] = max(gpu_free[s_comp], gpu_free[s_copy])
        for l in range(layers):
            t += jit(10.0)                                    # Python between ops
            op0 = t
            call_end, _ = launch(tid_main, op0 + jit(8.0), f"void gemm_fw_kernel_{l % 7}<float>(float const*, float*)",
                                 s_comp, jit(fw[l]))
            t = call_end + jit(4.0)
            x("aten::linear", "cpu_op", tid_main, op0, t - op0, {"External id": corr[0]})
        # backward on autograd's thread; the training thread sits in backward()
        bt = t + jit(20.0)
        bw0 = bt
        for b, lay in enumerate(per_bucket):
            for l in lay:
                bt += jit(6.0)
                op0 = bt
                call_end, _ = launch(tid_bw, op0 + jit(10.0), f"void gemm_bw_kernel_{l % 5}<float>(float const*, float*)",
                                     s_comp, jit(bw[l]))
                bt = call_end + jit(5.0)
                x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", tid_bw, op0, bt - op0)
            # DDP's hook: the bucket's all-reduce on the NCCL stream after the compute stream's work
            n = int(nelems[lay].sum())
            seq += 1
            info = {"Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n, "dtype": "Float",
                    "Process Group Name": "0", "Process Group Ranks": f"[0, ..., {world - 1}]", "Seq": seq}
            xfer = 2.0 * (world - 1) / world * n * 4 / (bandwidth_gbps * 1e3 / 8)   # us
            bt += jit(8.0)
            op0 = bt
            gpu_free[s_nccl] = max(gpu_free[s_nccl], gpu_free[s_comp])
            call_end, _ = launch(tid_bw, op0 + jit(12.0),
                                 "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                                 s_nccl, jit(20.0 + xfer), info)
            bt = call_end + jit(6.0)
            x("record_param_comms", "cpu_op", tid_bw, op0, bt - op0, dict(info))
        x("aten::backward", "cpu_op", tid_main, t, bt - t + 15.0)   # training thread blocked in backward()
        t = bt + 15.0 + jit(10.0)
        # optimizer: waits for the all-reduces (DDP), then a few fused kernels
        gpu_free[s_comp] = max(gpu_free[s_comp], gpu_free[s_nccl])
        op0 = t
        for k in range(4):
            call_end, _ = launch(tid_main, t + jit(5.0), "void multi_tensor_apply_kernel<SGDFunctor<float>>()",
                                 s_comp, jit(60.0))
            t = call_end
        t += jit(5.0)
        x("Optimizer.step#SGD.step", "cpu_op", tid_main, op0, t - op0)
        # loss.item(): the training thread waits for the GPU
        op0 = t + jit(5.0)
        sync0 = op0 + jit(3.0)
        sync_end = max(sync0 + 2.0, gpu_free[s_comp]) + 3.0
        x("cudaStreamSynchronize", "cuda_runtime", tid_main, sync0, sync_end - sync0, {"cbid": 131})
        t = sync_end + jit(4.0)
        x("aten::item", "cpu_op", tid_main, op0, t - op0)
        t += jit(30.0)
        x(f"ProfilerStep#{first_step + s}", "user_annotation", tid_main, step0, t - step0)
        t += 1.0
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"python {rank}"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid_main, "args": {"name": "thread 1 (python)"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid_bw, "args": {"name": "thread 2 (autograd)"}}]
    ev.sort(key=lambda e: (e["pid"] != pid, e["ts"]))
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000}
                                 for i in range(gpus_per_host)],
            "traceEvents": meta + ev, "traceName": f"rank{rank}.json"}


def write_job(out_dir: str | os.PathLike, ranks: int, **kw) -> dict:
    """Write ``ranks`` per-rank Kineto files ``rank<r>.json`` into ``out_dir``; returns sizes.

    Parameters
    ----------
    out_dir : str or PathLike
        Created if missing; files are written whole (temp name + rename).
    ranks : int
        World size; every rank's file is written.
    **kw
        Passed to :func:`rank_doc` (layers, buckets, steps, seed, classes, ...).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nbytes = n_events = 0
    for r in range(ranks):
        doc = rank_doc(r, ranks, **kw)
        tmp = out / f".rank{r}.json.tmp"
        text = json.dumps(doc, separators=(",", ":"))
        tmp.write_text(text)
        tmp.rename(out / f"rank{r}.json")
        nbytes += len(text)
        n_events += len(doc["traceEvents"])
    return {"ranks": ranks, "bytes": nbytes, "events_raw": n_events}


def replicate_job(template, ranks: int, *, gpus_per_host: int = 8, seed: int = 0, jitter: float = 0.06):
    """A ``ranks``-rank :class:`~dpro_kit.trace.TraceSet` made in memory from a loaded template job.

    Rank ``r`` is a copy of template node ``r % T`` (T = the template's nodes, in manifest
    order), renamed ``host<r // gpus_per_host>/<r>`` as the Kineto reader names ranks, with
    every event's duration multiplied by its own log-normal factor (sigma ``jitter``; 0 keeps
    the template's durations), and its own string objects in its dependency list (a parse makes
    new ones; here one per distinct name and rank, to save memory); collectives take every rank.  The event table is the per-rank tables
    concatenated, as :func:`dpro_kit.trace.load_trace` concatenates them.  What it skips is
    the JSON: writing and parsing 10 M ops' traces would take hours here (docs/scale.md).
    """
    from dataclasses import replace

    import pandas as pd

    from dpro_kit.trace import Manifest, NodeInfo

    tnodes = list(template.manifest.nodes)
    by_node = {n: f.reset_index(drop=True) for n, f in template.events.groupby("node", sort=False, observed=True)}
    rng = np.random.default_rng(seed)
    names = [f"host{r // gpus_per_host}/{r}" for r in range(ranks)]
    frames, edges, nodes = [], {}, {}
    for r, name in enumerate(names):
        t = tnodes[r % len(tnodes)]
        f = by_node[t]
        host = f"host{r // gpus_per_host}"
        dur = f["dur"].to_numpy()
        if jitter:
            dur = np.round(dur * np.exp(rng.normal(0.0, jitter, dur.size)), 3)
        frames.append(f.assign(node=pd.Series([name] * len(f), dtype=f["node"].dtype),
                               host=pd.Series([host] * len(f), dtype=f["host"].dtype), dur=dur))
        fresh: dict[str, str] = {}      # this rank's own string objects (one per distinct name, to save memory)

        def own(x: str) -> str:
            y = fresh.get(x)
            if y is None:
                y = fresh[x] = x.encode().decode()
            return y
        edges[name] = [(own(u), own(v)) for u, v in template.edges.get(t, [])]
        nodes[name] = replace(template.manifest.nodes[t], host=host, rank=r) if isinstance(
            template.manifest.nodes[t], NodeInfo) else NodeInfo(host=host, rank=r)
    t_of = {name: tnodes[r % len(tnodes)] for r, name in enumerate(names)}
    colls = [replace(c, participants=list(names),
                     inputs={n: list(c.inputs[t_of[n]]) for n in names if t_of[n] in c.inputs},
                     outputs={n: list(c.outputs[t_of[n]]) for n in names if t_of[n] in c.outputs},
                     param_ready={}) for c in template.collectives]
    man = template.manifest
    man = Manifest(job=man.job, framework=man.framework, comm_backend=man.comm_backend, world_size=ranks,
                   nodes=nodes, iterations=list(man.iterations), raw_format=man.raw_format, extra=dict(man.extra))
    return replace(template, manifest=man, events=pd.concat(frames, ignore_index=True), edges=edges,
                   collectives=colls, path=None)


def tables_job(ranks: int, *, template_ranks: int = 8, **kw):
    """:func:`replicate_job` of a ``template_ranks``-rank job generated by :func:`write_job` (``kw``) and
    parsed by the Kineto reader; returns (TraceSet, template's JSON bytes per rank)."""
    from dpro_kit.trace import load_trace

    with tempfile.TemporaryDirectory(prefix="dpro-scale-tpl-") as d:
        info = write_job(d, template_ranks, **kw)
        tpl = load_trace(d)
    return replicate_job(tpl, ranks, seed=kw.get("seed", 0)), info["bytes"] / template_ranks


def trace_info(d: Path) -> dict:
    """An existing trace folder's size: rank folders (``<host>/<rank>/`` with a Kineto file, or plain
    ``*.json[.gz]`` files) and the Kineto JSON's bytes, uncompressed (a ``.gz``'s trailer: size mod 4 GiB)."""
    files = sorted(d.glob("*/*/kineto_trace.json*")) or sorted(p for p in d.glob("*.json*") if p.name != "manifest.json")
    if not files:
        raise SystemExit(f"{d}: no Kineto trace found (<host>/<rank>/kineto_trace.json[.gz] or *.json[.gz])")
    size = 0
    for f in files:
        if f.suffix == ".gz":
            with open(f, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                size += int.from_bytes(fh.read(4), "little")
        else:
            size += f.stat().st_size
    return {"ranks": len(files), "bytes": size, "file_bytes": sum(f.stat().st_size for f in files), "events_raw": None}


# --------------------------------------------------------------------------- one measurement (child process)

def _rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def measure_child(trace_dir: str, mode: str = "full") -> dict:
    """Run the stages on ``trace_dir`` in this process; times and peak memory after each.

    ``mode`` "full": ingest, build, compile, replay; "sym": ingest, classes
    (:func:`dpro_kit.symmetry.rank_classes`), symreplay (:func:`dpro_kit.symmetry.replay_by_symmetry`:
    the representatives' graph built, compiled and replayed).
    """
    import gc
    sys.path.insert(0, str(ROOT / "bench"))
    import synthetic
    from dpro_kit.graph.build import build_global_dfg
    from dpro_kit.replay import compile_graph, replay
    from dpro_kit.trace import load_trace

    replay(synthetic.synthetic_dfg(2, 2, 1, seed=0))   # numba: compile or load the cached kernel
    gc.collect()
    out: dict = {"rss_start_mb": _rss_mb()}
    state: dict = {}

    def stage(name, fn):
        c0, w0 = time.process_time(), time.perf_counter()
        state[name] = fn()
        out[f"{name}_s"] = time.perf_counter() - w0
        out[f"{name}_cpu_s"] = time.process_time() - c0
        out[f"{name}_peak_mb"] = _rss_mb()

    if mode.startswith("dask:"):   # in an emulated host: serial ingest, then on the Dask cluster; equal?
        address, nworkers = mode[len("dask:"):].rsplit(":", 1)     # dask:tcp://HOST:PORT:WORKERS
        nworkers = int(nworkers)
        from distributed import Client
        with Client(address, timeout="60s") as cl:
            cl.wait_for_workers(nworkers, timeout=180)
            out["workers"] = {w: info.get("host") for w, info in cl.scheduler_info()["workers"].items()}
        stage("serial", lambda: load_trace(trace_dir, scheduler="serial"))
        stage("dask", lambda: load_trace(trace_dir, scheduler=address))
        a, b = state["serial"], state["dask"]
        out["events"] = int(len(a.events))
        out["same"] = bool(a.events.equals(b.events) and a.memory.equals(b.memory) and a.edges == b.edges
                           and a.collectives == b.collectives and a.manifest == b.manifest)
        from dpro_kit.graph.arrays import compile_trace
        ra, rb = replay(compile_trace(a)), replay(compile_trace(b))
        out["same_replay"] = bool(np.array_equal(ra.start, rb.start) and np.array_equal(ra.end, rb.end))
        out["iteration_time_us"] = float(rb.iteration_time_us)
        return out
    if mode.startswith("tables"):  # tables made in memory (replicate_job), then tables -> replay result
        try:                       # if memory runs out, let this process be the one the kernel kills
            Path("/proc/self/oom_score_adj").write_text("1000")
        except OSError:
            pass
        spec = json.loads(trace_dir)
        w0 = time.perf_counter()
        ts, _ = tables_job(spec["ranks"], layers=spec["layers"], buckets=spec["buckets"], steps=spec["steps"],
                           seed=spec["seed"])
        out["gen_s"] = time.perf_counter() - w0
        out["events"] = int(len(ts.events))
        out["table_mb"] = float(ts.events.memory_usage(deep=False).sum() / 1e6)
        out["edges_in"] = sum(len(e) for e in ts.edges.values())
        gc.collect()
        out["rss_tables_mb"] = _rss_now_mb()
        from dpro_kit.graph.arrays import compile_trace
        replay(compile_trace(tables_job(4, template_ranks=2, layers=2, buckets=1, steps=1)[0]))  # numba: load kernels
        out["peak_before_mb"] = _rss_mb()
        stage("arrays", lambda: compile_trace(ts))
        cg = state["arrays"]
        if cg is None:
            raise SystemExit("compile_trace does not cover this job")
        out["ops"], out["edges"] = cg.n, int(cg.succ.size)
        stage("replay", lambda: replay(cg))
        out["iteration_time_us"] = float(state["replay"].iteration_time_us)
        if mode == "tables-check":     # the networkx path on the same tables (slow; memory-hungry)
            from dpro_kit.graph.build import build_global_dfg
            ref = compile_graph(build_global_dfg(ts))
            out["same_arrays"] = bool(ref.keys == cg.keys and all(
                np.array_equal(getattr(ref, f), getattr(cg, f)) for f in
                ("dur", "device", "priority", "indptr", "succ", "indeg", "iter_src", "iter_dst", "tiebreak")))
            out["nx_iteration_time_us"] = float(replay(ref).iteration_time_us)
        return out
    if mode == "store-write":      # first load with the store on: parse + write the store
        stage("ingest", lambda: load_trace(trace_dir, store=True))
        from dpro_kit.store import TraceStore
        st = TraceStore(trace_dir)
        out["stored"] = st.index() is not None
        out["store_mb"] = sum(p.stat().st_size for p in st.path.glob("*")) / 1e6 if out["stored"] else 0.0
        return out
    stage("ingest", lambda: load_trace(trace_dir))
    ts = state["ingest"]
    out["events"] = int(len(ts.events))
    if mode == "ingest":
        return out
    if mode == "arrays":
        from dpro_kit.graph.arrays import compile_trace
        stage("arrays", lambda: compile_trace(ts))
        cg = state["arrays"]
        if cg is None:               # e.g. a dpro collector's trace (not the plain NCCL barrier scheme)
            out["not_covered"] = True
            return out
        out["ops"] = cg.n
        stage("replay", lambda: replay(cg))
        out["iteration_time_us"] = float(state["replay"].iteration_time_us)
        return out
    if mode == "sym":
        from dpro_kit.symmetry import rank_classes, replay_by_symmetry
        stage("classes", lambda: rank_classes(ts))
        stage("symreplay", lambda: replay_by_symmetry(ts, classes=state["classes"]))
        sym = state["symreplay"]
        out.update(classes=state["classes"].k, used=sym.used, sym_report=sym.report(), ops=sym.ops_replayed,
                   iteration_time_us=float(sym.iteration_time_us))
        out["total_s"] = sum(out[f"{s}_s"] for s in ("ingest", "classes", "symreplay"))
        out["total_cpu_s"] = sum(out[f"{s}_cpu_s"] for s in ("ingest", "classes", "symreplay"))
        return out
    stage("build", lambda: build_global_dfg(ts))
    g = state["build"]
    out["ops"], out["edges"] = g.number_of_nodes(), g.number_of_edges()
    stage("compile", lambda: compile_graph(g))
    cg = state["compile"]
    out["devices"] = len(cg.devices)
    stage("replay", lambda: replay(cg))
    out["iteration_time_us"] = float(state["replay"].iteration_time_us)
    out["total_s"] = sum(out[f"{s}_s"] for s in ("ingest", "build", "compile", "replay"))
    out["total_cpu_s"] = sum(out[f"{s}_cpu_s"] for s in ("ingest", "build", "compile", "replay"))
    return out


def measure(trace_dir: Path, repeat: int, mode: str = "full", env_extra: dict | None = None) -> dict:
    """Median over ``repeat`` fresh processes of :func:`measure_child`."""
    runs = []
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for _ in range(repeat):
        p = subprocess.run([sys.executable, __file__, "--child", str(trace_dir), "--mode", mode], capture_output=True, text=True,
                           env=env)
        if p.returncode != 0:
            raise SystemExit(f"measurement on {trace_dir} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    row = {k: (statistics.median(r[k] for r in runs) if type(runs[0][k]) is float else runs[0][k])
           for k in runs[0]}
    row["runs"] = runs
    return row


# --------------------------------------------------------------------------- table

def print_table(rows: list[dict]) -> None:
    head = (f"{'ranks':>6} {'JSON MB':>8} {'events':>10} {'ops':>10} {'ingest s':>9} {'build s':>8} "
            f"{'compile s':>9} {'replay s':>8} {'total s':>8} {'CPU s':>7} {'e2e ops/s':>10} {'peak MB':>8} "
            f"{'dPRO replay s*':>14} {'iter ms':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        rate = r["ops"] / r["total_s"]
        print(f"{r['ranks']:>6,} {r['bytes'] / 1e6:>8.0f} {r['events']:>10,} {r['ops']:>10,} {r['ingest_s']:>9.2f} "
              f"{r['build_s']:>8.2f} {r['compile_s']:>9.2f} {r['replay_s']:>8.2f} {r['total_s']:>8.2f} {r['total_cpu_s']:>7.2f} "
              f"{rate / 1e3:>8.0f} k {r['replay_peak_mb']:>8.0f} {r['ops'] / DPRO_OPS_PER_S:>14.1f} "
              f"{r['iteration_time_us'] / 1e3:>9.3f}")
    print()
    print("times: wall-clock seconds (CPU s: process CPU time of the four stages), median over fresh processes; events = rows of load_trace's event table; "
          "ops = global DFG ops; e2e ops/s = ops / total; peak MB = ru_maxrss after the replay (all stages).")
    print(f"* the original dPRO replayer at its measured {DPRO_OPS_PER_S / 1e3:.0f} k ops/s (1 M ops in 52.9 s on this "
          "machine, issue 17): replay only, extrapolated to this graph's size, not run here.")


def print_sym_table(rows: list[dict]) -> None:
    head = (f"{'ranks':>6} {'classes':>7} {'ingest s':>9} {'classes s':>9} {'sym replay s':>12} {'after ingest s':>14} "
            f"{'full after ingest s':>19} {'ops replayed':>12} {'of ops':>10} {'peak MB':>8} {'iter ms':>9} "
            f"{'= full':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["sym"]
        full_after = r["total_s"] - r["ingest_s"]
        same = "yes" if s["iteration_time_us"] == r["iteration_time_us"] else "NO"
        print(f"{r['ranks']:>6,} {s['classes']:>7,} {s['ingest_s']:>9.2f} {s['classes_s']:>9.2f} {s['symreplay_s']:>12.2f} "
              f"{s['classes_s'] + s['symreplay_s']:>14.2f} {full_after:>19.2f} {s['ops']:>12,} {r['ops']:>10,} "
              f"{s['symreplay_peak_mb']:>8.0f} {s['iteration_time_us'] / 1e3:>9.3f} {same:>7}")
    print()
    print("symmetry (dpro_kit/symmetry.py), in a fresh process: ingest, rank classes, then the representatives' "
          "graph built, compiled and replayed; 'full after ingest' = build + compile + replay of all ranks (table "
          "above); '= full': same iteration time as the full replay (every op's times: tests/test_symmetry.py).")
    for r in rows:
        print(f"  {r['ranks']} ranks: {r['sym']['sym_report']}")


def dask_hosts_point(trace_dir: Path, hosts: int, prefix: str, repeat: int) -> dict:
    """Serial ingest vs ``load_trace(scheduler="tcp://...")`` on a Dask cluster of emulated hosts.

    ``hosts + 1`` network namespaces (:class:`dpro_kit.cluster.EmulatedCluster`, unshaped links):
    host 0 runs ``dask scheduler`` and the measuring process (a fresh one per repeat), hosts
    1..``hosts`` one ``dask worker`` each (one process, one thread); the trace folder is on the
    one filesystem they share.  Namespaces and processes are removed on the way out.
    """
    from dpro_kit.cluster import EmulatedCluster
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "DPRO_SCHEDULER": ""}
    bindir = Path(sys.executable).parent
    runs = []
    with EmulatedCluster(hosts=hosts + 1, rate_mbit=None, prefix=prefix) as c:
        addr = f"tcp://{c.host_ip(0)}:8786"
        logs = Path(tempfile.mkdtemp(prefix="dpro-scale-dask-"))
        try:
            c.run(0, [str(bindir / "dask"), "scheduler", "--host", c.host_ip(0), "--port", "8786",
                      "--dashboard-address", ":0"], env=env, stdout=open(logs / "scheduler.log", "w"),
                  stderr=subprocess.STDOUT)
            for i in range(1, hosts + 1):
                c.run(i, [str(bindir / "dask"), "worker", addr, "--nworkers", "1", "--nthreads", "1",
                          "--host", c.host_ip(i), "--no-dashboard", "--memory-limit", "0"], env=env,
                      stdout=open(logs / f"worker{i}.log", "w"), stderr=subprocess.STDOUT)
            for _ in range(repeat):
                p = c.run(0, [sys.executable, __file__, "--child", str(trace_dir), "--mode", f"dask:{addr}:{hosts}"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                o, e = p.communicate(timeout=1800)
                if p.returncode != 0:
                    raise SystemExit(f"dask measurement failed (exit {p.returncode}):\n{e[-3000:]}")
                runs.append(json.loads(o.strip().splitlines()[-1]))
        finally:
            shutil.rmtree(logs, ignore_errors=True)
    row = {k: (statistics.median(r[k] for r in runs) if type(runs[0][k]) is float else runs[0][k]) for k in runs[0]}
    row["same"] = all(r["same"] and r["same_replay"] for r in runs)
    row["runs"] = runs
    row.update(hosts=hosts, namespaces=c.host_ns)
    return row


def tables_main(a, ranks: list[int]) -> int:
    """``--tables``: tables -> replay result (compile_trace + replay), one fresh process per point."""
    print(f"dpro_kit scale --tables: in-memory tables ({a.layers} layers, {a.buckets} buckets, {a.steps} steps; "
          f"8 template ranks replicated); {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
          f"{a.repeat} fresh process(es) per point")
    rows = []
    for n in ranks:
        spec = json.dumps({"ranks": n, "layers": a.layers, "buckets": a.buckets, "steps": a.steps, "seed": a.seed})
        row = measure(spec, a.repeat, "tables-check" if a.check else "tables")
        row.update(ranks=n, layers=a.layers, steps=a.steps)
        rows.append(row)
        print(f"  ... {n} ranks: {row['ops']:,} ops, generated in {row['gen_s']:.1f} s", flush=True)
    head = (f"{'ranks':>6} {'layers':>6} {'steps':>5} {'events':>11} {'ops':>11} {'edges':>11} {'compile s':>9} "
            f"{'CPU s':>6} {'replay s':>8} {'CPU s':>6} {'tables->result s':>16} {'CPU s':>6} {'us/op CPU':>9} "
            f"{'MB tables':>9} {'peak MB':>8} {'+MB':>6} {'iter ms':>9}" + (f" {'= nx':>5}" if a.check else ""))
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        wall = r["arrays_s"] + r["replay_s"]
        cpu = r["arrays_cpu_s"] + r["replay_cpu_s"]
        same = ""
        if a.check:
            same = " " + ("yes" if r["same_arrays"] and r["nx_iteration_time_us"] == r["iteration_time_us"]
                          else "NO").rjust(5)
        print(f"{r['ranks']:>6,} {r['layers']:>6} {r['steps']:>5} {r['events']:>11,} {r['ops']:>11,} {r['edges']:>11,} "
              f"{r['arrays_s']:>9.2f} {r['arrays_cpu_s']:>6.2f} {r['replay_s']:>8.2f} {r['replay_cpu_s']:>6.2f} "
              f"{wall:>16.2f} {cpu:>6.2f} {cpu / r['ops'] * 1e6:>9.2f} {r['rss_tables_mb']:>9.0f} "
              f"{r['replay_peak_mb']:>8.0f} {r['replay_peak_mb'] - r['peak_before_mb']:>6.0f} "
              f"{r['iteration_time_us'] / 1e3:>9.3f}{same}")
    print()
    print("compile = dpro_kit.graph.arrays.compile_trace (event table + dependency lists + collectives -> replay "
          "arrays), replay = dpro_kit.replay.replay on them (one iteration); wall and process CPU seconds, median "
          "over fresh processes, each timing the first call in its process; MB tables = resident memory holding "
          "the tables (after generation); peak MB = ru_maxrss after the replay, +MB = its rise over the peak "
          "before compile_trace.")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
        print(f"rows written to {a.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,128,256", help="world sizes, comma-separated (default 64,128,256)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--buckets", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per rank (default 3)")
    ap.add_argument("--classes", type=int, default=None, help="ranks of class r %% K get identical durations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per point (median); default 1")
    ap.add_argument("--keep", metavar="DIR", help="generate under DIR/ranks<N> and keep the files")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--symmetry", action="store_true",
                    help="also measure the replay by symmetry (ingest, classes, representatives' build+replay) in a "
                         "fresh process of its own")
    ap.add_argument("--store", action="store_true",
                    help="use the trace store (dpro_kit/store.py) in a temporary DPRO_CACHE: time the first load "
                         "(parse + write), then run the stages with ingest from the store")
    ap.add_argument("--engine", metavar="SCHEDULER",
                    help="also time ingest with this DPRO_SCHEDULER (processes[:N], threads[:N], tcp://...), "
                         "alternating with serial ingest, --repeat times each, one fresh process each")
    ap.add_argument("--arrays", action="store_true",
                    help="also measure the array-native compile (dpro_kit/graph/arrays.py: tables -> replay arrays, "
                         "no networkx) and its replay in a fresh process of its own")
    ap.add_argument("--tables", action="store_true",
                    help="only the array-native path from tables to replay result, on tables made in memory "
                         "(replicate_job: 8 generated and parsed template ranks copied to --ranks ranks, each with "
                         "its own duration jitter); no JSON is written or parsed. Use --layers/--steps to size "
                         "the job (e.g. --ranks 1024 --layers 210: ~0.9 M ops)")
    ap.add_argument("--check", action="store_true",
                    help="with --tables: also build the networkx graph of the same tables and check the arrays "
                         "are equal (slow: ~30 us and ~3 KB per op)")
    ap.add_argument("--dask-hosts", type=int, metavar="K",
                    help="also read each job on a dask.distributed cluster of emulated hosts (network namespaces, "
                         "root only): a scheduler on one host, one worker on each of K others, load_trace("
                         "scheduler='tcp://...') checked equal to the serial load; --repeat fresh processes")
    ap.add_argument("--netns-prefix", default="dpk", help="name prefix of the namespaces --dask-hosts makes")
    ap.add_argument("--trace", metavar="DIR", action="append",
                    help="measure this existing trace folder (e.g. real GPU ranks recorded by bench/gpu_check.sh "
                         "PARTS=big) instead of generated jobs; repeatable; 'ranks' = its rank folders, 'JSON MB' = "
                         "its Kineto JSON uncompressed (a .gz's trailer); --ranks/--layers/... are ignored")
    ap.add_argument("--child", metavar="TRACE_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure_child(a.child, a.mode)))
        return 0
    ranks = [int(s) for s in a.ranks.split(",") if s.strip()]
    if a.tables:
        return tables_main(a, ranks)
    if a.trace:
        print(f"dpro_kit scale: existing trace folders {', '.join(a.trace)}; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.2f}; {a.repeat} fresh process(es) per point")
        points = [(Path(t), trace_info(Path(t))) for t in a.trace]
    else:
        print(f"dpro_kit scale: generated torch.profiler jobs ({a.layers} layers, {a.buckets} buckets, {a.steps} steps, "
              f"classes {a.classes or 'none (every rank jittered)'}); {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.2f}; {a.repeat} fresh process(es) per point")
        points = [(None, n) for n in ranks]
    rows = []
    for d, n in points:
        base = Path(a.keep) if a.keep and d is None else Path(tempfile.mkdtemp(prefix="dpro-scale-"))
        if d is None:
            d = base / f"ranks{n}"
        else:
            n = n["ranks"]
        try:
            t0 = time.perf_counter()
            if a.trace:
                info = trace_info(d)
            elif not (d.is_dir() and len(list(d.glob("rank*.json"))) == n):
                info = write_job(d, n, layers=a.layers, buckets=a.buckets, steps=a.steps, seed=a.seed,
                                 classes=a.classes)
            else:
                info = {"ranks": n, "bytes": sum(p.stat().st_size for p in d.glob("rank*.json")), "events_raw": None}
            gen_s = time.perf_counter() - t0
            env: dict = {}
            first = None
            if a.store:
                env = {"DPRO_CACHE": str(base / f"cache{n}"), "DPRO_STORE": "1"}
                first = measure(d, 1, "store-write", env)      # one process: later ones read the entry
                if not first["stored"]:
                    raise SystemExit("the trace store was not written")
            row = measure(d, a.repeat, "full", env)
            row.update(info, gen_s=gen_s, layers=a.layers, buckets=a.buckets, steps=a.steps, classes=a.classes)
            if first is not None:
                row["store_first"] = first
            if a.engine:
                ser, eng = [], []
                for _ in range(a.repeat):       # alternate: load on the machine changes over time
                    ser.append(measure(d, 1, "ingest", {**env, "DPRO_SCHEDULER": "serial"}))
                    eng.append(measure(d, 1, "ingest", {**env, "DPRO_SCHEDULER": a.engine}))
                row["engine"] = {"scheduler": a.engine,
                                 "serial_s": statistics.median(r["ingest_s"] for r in ser),
                                 "engine_s": statistics.median(r["ingest_s"] for r in eng),
                                 "serial_runs": ser, "engine_runs": eng}
            if a.dask_hosts:
                row["dask"] = dask_hosts_point(d, a.dask_hosts, a.netns_prefix, a.repeat)
            if a.arrays:
                row["arrays"] = measure(d, a.repeat, "arrays", env)
            if a.symmetry:
                srow = measure(d, a.repeat, "sym", env)
                srow.update(info)
                row["sym"] = srow
            rows.append(row)
            print(f"  ... {n} ranks: {info['bytes'] / 1e6:.0f} MB {'found' if a.trace else 'generated'} in "
                  f"{gen_s:.1f} s; stages {row['total_s']:.1f} s", flush=True)
        finally:
            if not a.keep or a.trace:
                shutil.rmtree(base, ignore_errors=True)
            elif a.store:
                shutil.rmtree(base / f"cache{n}", ignore_errors=True)
    print()
    print_table(rows)
    if a.symmetry:
        print()
        print_sym_table(rows)
    if a.arrays:
        print()
        print("array-native compile (dpro_kit/graph/arrays.py) vs build + compile through networkx, after ingest:")
        head = (f"{'ranks':>6} {'ops':>10} {'nx build+compile s':>18} {'CPU s':>6} {'arrays s':>9} {'CPU s':>6} "
                f"{'replay s':>8} {'tables->result s':>16} {'ops/s':>8} {'peak MB nx':>10} {'peak MB arrays':>14} "
                f"{'= full':>6}")
        print(head)
        print("-" * len(head))
        for r in rows:
            x = r["arrays"]
            if x.get("not_covered"):
                print(f"{r['ranks']:>6,} {r['ops']:>10,} {r['build_s'] + r['compile_s']:>18.2f} "
                      f"{r['build_cpu_s'] + r['compile_cpu_s']:>6.2f}  compile_trace does not cover this job "
                      "(networkx path only)")
                continue
            same = "yes" if x["iteration_time_us"] == r["iteration_time_us"] and x["ops"] == r["ops"] else "NO"
            t = x["arrays_s"] + x["replay_s"]
            print(f"{r['ranks']:>6,} {x['ops']:>10,} {r['build_s'] + r['compile_s']:>18.2f} "
                  f"{r['build_cpu_s'] + r['compile_cpu_s']:>6.2f} {x['arrays_s']:>9.2f} {x['arrays_cpu_s']:>6.2f} "
                  f"{x['replay_s']:>8.2f} {t:>16.2f} {x['ops'] / t / 1e3:>6.0f} k {r['replay_peak_mb']:>10.0f} "
                  f"{x['replay_peak_mb']:>14.0f} {same:>6}")
        print("'= full': same op count and iteration time as the networkx path (arrays equal: "
              "tests/test_graph_arrays.py); peak MB includes ingest.")
    if a.dask_hosts:
        print()
        print(f"ingest on dask.distributed, {a.dask_hosts} workers on emulated hosts (network namespaces; scheduler "
              "and the measuring process on another), vs serial in the same process:")
        head = (f"{'ranks':>6} {'hosts':>5} {'workers':>7} {'serial s':>8} {'CPU s':>6} {'dask s':>7} {'CPU s':>6} "
                f"{'x':>5} {'= serial':>8}")
        print(head)
        print("-" * len(head))
        for r in rows:
            x = r["dask"]
            print(f"{r['ranks']:>6,} {x['hosts']:>5} {len(x['workers']):>7} {x['serial_s']:>8.2f} {x['serial_cpu_s']:>6.2f} "
                  f"{x['dask_s']:>7.2f} {x['dask_cpu_s']:>6.2f} {x['serial_s'] / x['dask_s']:>5.2f} "
                  f"{'yes' if x['same'] else 'NO':>8}")
        print("CPU s: the calling process's own CPU time; '= serial': events, memory, edges, collectives and "
              "manifest equal, and the replays of both equal op for op.")
        for r in rows:
            print(f"  {r['ranks']} ranks: workers at {sorted(set(r['dask']['workers'].values()))}")
    if a.engine:
        print()
        print(f"ingest, serial vs Dask ({a.engine}; DPRO_SCHEDULER), alternating fresh processes, median of {a.repeat}:")
        for r in rows:
            e = r["engine"]
            print(f"  {r['ranks']:,} ranks: serial {e['serial_s']:.2f} s, {a.engine} {e['engine_s']:.2f} s "
                  f"(x{e['serial_s'] / e['engine_s']:.2f})")
    if a.store:
        print()
        print("trace store (dpro_kit/store.py, Parquet under a temporary DPRO_CACHE): ingest above is from the store")
        for r in rows:
            f = r["store_first"]
            print(f"  {r['ranks']:,} ranks: first load (parse + write) {f['ingest_s']:.2f} s wall / "
                  f"{f['ingest_cpu_s']:.2f} s CPU, store {f['store_mb']:.0f} MB for {r['bytes'] / 1e6:.0f} MB of JSON; "
                  f"stored load {r['ingest_s']:.2f} s wall / {r['ingest_cpu_s']:.2f} s CPU")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
        print(f"rows written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
