"""Measure the collector's overhead (the numbers in README.md, "Overhead").

    python collectors/torch/overhead.py [--reps 4]

One process (world size 1, gloo), the MLP of examples/ddp/train.py, 80 iterations, in three
modes run alternately: no collector; plain torch.profiler on iterations 20..59; the dpro
Recorder profiling iterations 20..59.  Prints the median iteration time of iterations
21..59 (inside the window) and 5..19 (before it) per mode.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CHILD = r"""
import os, sys, time, statistics, socket, torch, torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from train import MLP
torch.set_num_threads(1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
mode = sys.argv[1]
if mode == "recorder":
    from dpro_torch import Recorder
    rec = Recorder(sys.argv[4], steps=(20, 60), auto_step=True)
net = MLP(); m = DDP(net, bucket_cap_mb=0.5); opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
ts, prof = [], None
for i in range(80):
    if mode == "profiler" and i == 20:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]); prof.start()
    if mode == "profiler" and i == 60:
        prof.stop()
    t = time.perf_counter()
    x = torch.randn(32, 256); y = torch.randint(0, 10, (32,))
    opt.zero_grad(set_to_none=True); F.cross_entropy(m(x), y).backward(); opt.step()
    ts.append(time.perf_counter() - t)
print(statistics.median(ts[21:59]) * 1e3, statistics.median(ts[5:19]) * 1e3)
dist.destroy_process_group()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {"none": [], "profiler": [], "recorder": []}
    env = dict(os.environ, DPRO_QUIET="1")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.reps):
            for mode in res:
                out = subprocess.run([sys.executable, "-c", CHILD, mode, HERE, os.path.join(ROOT, "examples", "ddp"),
                                      os.path.join(tmp, f"{mode}{r}")], env=env, capture_output=True, text=True,
                                     check=True).stdout.split()
                res[mode].append((float(out[0]), float(out[1])))
    for mode, vals in res.items():
        inside = statistics.median(v[0] for v in vals)
        before = statistics.median(v[1] for v in vals)
        print(f"{mode:9s} iterations 21-59: {inside:.3f} ms   iterations 5-19: {before:.3f} ms   "
              f"(per run, 21-59: {' '.join(f'{v[0]:.2f}' for v in vals)})")


if __name__ == "__main__":
    main()
