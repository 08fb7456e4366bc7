"""Per-iteration cost of each thing the PyTorch collector leaves in a process OUTSIDE its window.

One process, no communication, microseconds per call (minimum over repetitions of the median
of N calls, alternating with/without)::

    python bench/overhead_pieces.py [--reps 7] [--calls 2000]

* ``optimizer hooks``: the two global ``Optimizer.step`` hooks that count iterations
  (``opt.step()`` of a one-parameter SGD, Recorder armed with a window far ahead vs none);
* ``backward wrapper``: the ``torch.autograd.backward`` patch (``loss.backward()`` of a tiny
  graph through the wrapper vs the original function);
* ``grad-ready hook removed``: a parameter whose post-accumulate-grad hook was registered (in
  the window) and removed: torch keeps a C++ hook object that enters Python on every gradient
  accumulation (backward of a 100-parameter model / 100, never hooked vs hooked and removed);
* ``op dispatch after a window``: one small aten op and a ``torch._foreach_add_`` C++ loop timed
  before any profiler session and after one (``torch.profiler`` started, stopped, exported);
  a leftover RecordFunction callback or observer would show here.  CPU only: what CUPTI costs
  after a CUDA window needs a GPU (docs/accuracy.md, "Outside the window").
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics as st
import sys
import tempfile
import time


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from dpro_torch.recorder import Recorder, patch_backward
    rows = []

    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.zeros(4)
    opt = torch.optim.SGD([p], lr=0.0)
    without, with_ = [], []
    with tempfile.TemporaryDirectory(prefix="dpro-pieces-") as td:
        for _ in range(args.reps):
            without.append(per_call_us(opt.step, args.calls))
            rec = Recorder(td, steps=(10**9, 10**9 + 1), auto_step=True, calibrate=False)
            with_.append(per_call_us(opt.step, args.calls))
            rec._step_end_ns.clear()
            rec._closed = True   # close() would write meta.json; only the hooks are measured here
            for h in rec._opt_handles:
                h.remove()
            import dpro_torch.recorder as R
            R._ACTIVE = None
    rows.append(("optimizer hooks (per optimizer.step)", min(without), min(with_)))

    patch_backward()
    orig = torch.autograd.backward._dpro_orig
    x = torch.ones(4, requires_grad=True)

    def bw(f):
        return lambda: f((x * 2).sum())
    without = [per_call_us(bw(orig), args.calls // 4) for _ in range(args.reps)]
    with_ = [per_call_us(bw(torch.autograd.backward), args.calls // 4) for _ in range(args.reps)]
    rows.append(("backward wrapper (per loss.backward)", min(without), min(with_)))

    # grad-ready hooks after the window: their handles are removed, but torch keeps the C++
    # post-accumulate-grad hook object of every parameter that ever had one (no API clears it),
    # so each gradient accumulation still enters Python once (an empty dict of hooks)
    def mlp():
        return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(50)])   # 100 parameters
    never, removed = mlp(), mlp()
    for h in [q.register_post_accumulate_grad_hook(lambda q: None) for q in removed.parameters()]:
        h.remove()
    inp = torch.ones(1, 8)

    def bwd_us(m, n=max(args.calls // 40, 10)):
        ts = []
        for _ in range(n):
            m.zero_grad(set_to_none=True)
            out = m(inp).sum()
            t0 = time.perf_counter_ns()
            out.backward()
            ts.append(time.perf_counter_ns() - t0)
        return st.median(ts) / 1e3 / 100
    a_, b_ = [], []
    for _ in range(2 * args.reps):
        a_.append(bwd_us(never))
        b_.append(bwd_us(removed))
    rows.append(("grad-ready hook removed after the window (per parameter and backward)", min(a_), min(b_)))

    y = torch.zeros(4)
    xs = [torch.zeros(1) for _ in range(400)]

    def ops():
        return (min(per_call_us(lambda: y.add_(1.0), args.calls) for _ in range(args.reps)),
                min(per_call_us(lambda: torch._foreach_add_(xs, 1.0), args.calls // 100) / 400
                    for _ in range(args.reps)))
    before = ops()
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    for _ in range(100):
        y.add_(1.0)
    prof.stop()
    with tempfile.TemporaryDirectory() as td:
        prof.export_chrome_trace(f"{td}/t.json")
    del prof
    gc.collect()
    after = ops()
    rows.append(("one Python-dispatched op (y.add_), after a window", before[0], after[0]))
    rows.append(("one op inside torch._foreach_add_ (C++ loop), after a window", before[1], after[1]))

    print(f"torch {torch.__version__}, 1 thread, min over {args.reps} repetitions")
    print("| piece | without | with | cost per call |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.3f} us | {b:.3f} us | {b - a:+.3f} us |")
    if args.json:
        print(json.dumps([{"piece": n, "without_us": a, "with_us": b} for n, a, b in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
