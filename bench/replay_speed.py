"""How fast does the replayer simulate?  Ops per second for synthetic global DFGs, next to a naive replay.

    python bench/replay_speed.py                          # 10 k, 100 k, 1 M ops (about 4 minutes)
    python bench/replay_speed.py --sizes 10000,2000000 --repeat 5 --naive-max 100000 --json out.json

For each size, a synthetic DFG (``bench/synthetic.py``: ring AllReduce by
default, ``--comm ps`` for parameter servers) is built with networkx (not
timed), then timed, median of ``--repeat`` runs:

* ``compile``: ``dpro_kit.replay.compile_graph(g)`` (networkx -> arrays);
* ``kernel``: ``dpro_kit.replay._kernel.simulate`` on the compiled (and, for
  several iterations, unrolled) arrays, as ``replay()`` runs it (numba compilation excluded by a warm-up call);
* ``end-to-end``: ``dpro_kit.replay.replay(g)`` from the networkx graph
  (compile + unroll + simulate + result);
* ``naive``: ``bench/naive_replay.py`` (plain Python over the networkx graph), run
  ``--naive-repeat`` times, only for graphs of at most ``--naive-max`` ops.

The last row replays ``--iterations`` iterations (unrolled) of one size.  The
``same`` column says whether the naive replay and ``replay()`` gave identical
start and end times for every op (``all ops``), else how many differ.

The process is pinned to one CPU (``--cpu``) where the OS allows it; rates are
computed from the process's CPU time (``time.process_time``), so other load on
the machine slows them less than wall-clock rates (both are in ``--json``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import naive_replay  # noqa: E402
import synthetic  # noqa: E402
from dpro_kit.replay import compile_graph, replay, unroll  # noqa: E402
from dpro_kit.replay._kernel import HAVE_NUMBA  # noqa: E402
from dpro_kit.replay.engine import run_kernel  # noqa: E402


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    """Median CPU seconds, median wall seconds, last result of ``repeat`` calls."""
    cpu, wall, out = [], [], None
    for _ in range(repeat):
        out = None
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall), out


def _kernel(cg, iterations: int):
    u = unroll(cg, iterations)
    return lambda: run_kernel(u)


def measure(g, *, iterations: int, repeat: int, naive: bool, naive_repeat: int) -> dict:
    n_ops, n_edges = g.number_of_nodes(), g.number_of_edges()
    c_cpu, c_wall, cg = _timed(lambda: compile_graph(g), repeat)
    k_cpu, k_wall, _ = _timed(_kernel(cg, iterations), repeat)
    e_cpu, e_wall, res = _timed(lambda: replay(g, iterations=iterations), repeat)
    sim = n_ops * iterations
    row = {"ops": n_ops, "edges": n_edges, "devices": len(cg.devices), "iterations": iterations,
           "simulated_ops": sim, "compile_s": c_cpu, "kernel_s": k_cpu, "end_to_end_s": e_cpu,
           "compile_wall_s": c_wall, "kernel_wall_s": k_wall, "end_to_end_wall_s": e_wall,
           "kernel_ops_per_s": sim / k_cpu, "end_to_end_ops_per_s": sim / e_cpu,
           "kernel_ops_per_s_wall": sim / k_wall, "iteration_time_us": res.iteration_time_us}
    if naive:
        n_cpu, n_wall, (start, end) = _timed(lambda: naive_replay.naive_replay(g, iterations), naive_repeat)
        keys, n = cg.keys, cg.n
        rows = range(sim)
        name = (lambda r: keys[r]) if iterations == 1 else (lambda r: (keys[r % n], r // n))
        ns = np.fromiter((start[name(r)] for r in rows), dtype=np.float64, count=sim)
        ne = np.fromiter((end[name(r)] for r in rows), dtype=np.float64, count=sim)
        differ = int(np.count_nonzero((ns != res.start) | (ne != res.end)))
        if iterations == 1:
            it_naive = float(ne.max(initial=0.0))
        else:
            it_naive = float(ne[(iterations - 1) * n:].max(initial=0.0) - ne[(iterations - 2) * n:(iterations - 1) * n].max(initial=0.0))
        row.update({"naive_s": n_cpu, "naive_wall_s": n_wall, "naive_ops_per_s": sim / n_cpu,
                    "naive_iteration_time_us": it_naive, "ops_differing": differ,
                    "same_iteration_time": it_naive == res.iteration_time_us})
    return row


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def print_table(rows: list[dict]) -> None:
    head = (f"{'ops':>10} {'edges':>10} {'devices':>7} {'iters':>5} {'compile s':>9} {'kernel ops/s':>12} "
            f"{'e2e ops/s':>10} {'naive ops/s':>11} {'kern/naive':>10} {'e2e/naive':>9} {'iter time ms':>12} "
            f"{'same (naive vs replay)':>22}")
    print(head)
    print("-" * len(head))
    for r in rows:
        nv = r.get("naive_ops_per_s")
        if nv is None:
            same = "not run"
        elif r["ops_differing"] == 0:
            same = "all ops"
        else:
            same = f"NO: {r['ops_differing']} ops differ" + (", same iter time" if r["same_iteration_time"] else "")
        kx = f"{r['kernel_ops_per_s'] / nv:.0f}x" if nv else "-"
        ex = f"{r['end_to_end_ops_per_s'] / nv:.1f}x" if nv else "-"
        print(f"{r['ops']:>10,} {r['edges']:>10,} {r['devices']:>7,} {r['iterations']:>5} {r['compile_s']:>9.2f} "
              f"{_fmt_rate(r['kernel_ops_per_s']):>12} {_fmt_rate(r['end_to_end_ops_per_s']):>10} {_fmt_rate(nv):>11} "
              f"{kx:>10} {ex:>9} "
              f"{r['iteration_time_us'] / 1e3:>12.3f} {same:>22}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="approximate op counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (median); default 3")
    ap.add_argument("--naive-max", type=int, default=1_000_000,
                    help="run the naive replay only for graphs of at most this many ops (it is slow)")
    ap.add_argument("--naive-repeat", type=int, default=1, help="runs of the naive replay (median); default 1")
    ap.add_argument("--iterations", type=int, default=2, help="iterations for the multi-iteration row (0: none)")
    ap.add_argument("--iter-size", type=int, default=None, help="size of the multi-iteration row (default: largest)")
    ap.add_argument("--comm", choices=("ring", "ps"), default="ring")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=0, help="CPU to pin to (default 0; -1: do not pin)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    a = ap.parse_args(argv)
    sizes = [int(float(s)) for s in a.sizes.split(",") if s.strip()]

    pinned = "not pinned"
    if a.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {a.cpu})
            pinned = f"pinned to CPU {a.cpu} (os.sched_setaffinity)"
        except OSError as exc:
            pinned = f"could not pin to CPU {a.cpu}: {exc}"
    print(f"dpro_kit replay speed: synthetic {a.comm} global DFGs (bench/synthetic.py, seed {a.seed}); {pinned}")
    print(f"numba: {'yes' if HAVE_NUMBA else 'NO (pure-Python fallback)'}; rates = simulated ops / process CPU "
          f"time, median of {a.repeat} runs (naive: {a.naive_repeat}); numba compilation excluded by a warm-up; "
          f"load average at start {os.getloadavg()[0]:.2f}")
    # warm-up: compile (or load from cache) the kernel once
    replay(synthetic.synthetic_dfg(2, 2, 1, seed=0))

    rows = []
    iter_size = a.iter_size if a.iter_size is not None else max(sizes)
    plan = [(s, 1) for s in sizes] + ([(iter_size, a.iterations)] if a.iterations > 1 else [])
    graphs: dict[int, object] = {}
    for size, iters in plan:
        if size not in graphs:
            graphs.clear()
            gc.collect()
            gc.disable()  # building a big networkx graph is much faster without the cyclic GC
            t0 = time.perf_counter()
            graphs[size] = synthetic.dfg_with_about(size, seed=a.seed, comm=a.comm)
            gc.enable()
            build_s = time.perf_counter() - t0
        g = graphs[size]
        row = measure(g, iterations=iters, repeat=a.repeat, naive=size <= a.naive_max,
                      naive_repeat=a.naive_repeat)
        row["target_size"] = size
        row["build_s"] = build_s
        row["spec"] = g.graph["meta"]["synthetic"]
        rows.append(row)
        print(f"  ... {row['ops']:,} ops x {iters} iteration(s) done (graph built in {build_s:.1f} s)", flush=True)
    print()
    print_table(rows)
    print()
    print("kernel = _kernel.simulate on compiled arrays; e2e = replay(g) from the networkx graph (compile_graph "
          "included); naive = bench/naive_replay.py; kern/naive and e2e/naive = speed-ups over naive.")
    big = [r for r in rows if r["iterations"] == 1 and r["ops"] >= 1_000_000]
    if big:
        r = big[-1]
        ok = "meets" if r["kernel_ops_per_s"] >= 2e6 else "MISSES"
        print(f"target >= 2 M ops/s on a 1 M-op graph: kernel {_fmt_rate(r['kernel_ops_per_s'])}ops/s "
              f"(wall {_fmt_rate(r['kernel_ops_per_s_wall'])}ops/s) -> {ok} the target; see docs/replayer.md")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
        print(f"rows written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
