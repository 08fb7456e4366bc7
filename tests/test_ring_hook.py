"""The timed ring comm hook (`dpro profile --ring`, collectors/torch/dpro_torch/ringhook.py) on a real job.

A real 2-rank gloo DDP job on this machine (loopback): the hook must give the same gradients as
DDP's own allreduce, and the reader must turn its records into SEND/RECV events whose
transaction ids join up across the ranks and match the ring the graph builder builds.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import profile_ddp  # noqa: E402

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collectors" / "torch"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WORKER = r"""
import os, sys, json, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[3])
from dpro_torch.ringhook import RingAllreduce
rank, world, port, out = int(sys.argv[1]), 3, sys.argv[2], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.manual_seed(0)
res = {}
for mode in ("stock", "ring"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(33, 65), nn.ReLU(), nn.Linear(65, 7))
    ddp = DDP(m, bucket_cap_mb=0.005)
    hook = None
    if mode == "ring":
        hook = RingAllreduce(ddp.process_group)
        ddp.register_comm_hook(None, hook.hook)
    torch.manual_seed(100 + rank)  # different data per rank
    for _ in range(2):
        ddp.zero_grad()
        ddp(torch.randn(8, 33)).pow(2).sum().backward()
    res[mode] = [p.grad.tolist() for p in m.parameters()]
    if hook is not None:
        res["records"] = len(hook.records)
json.dump(res, open(out, "w"))
dist.destroy_process_group()
"""


def test_ring_hook_gives_ddp_gradients(tmp_path):
    port = str(_free_port())
    script = tmp_path / "w.py"
    script.write_text(_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(ROOT / "collectors" / "torch"),
                               str(tmp_path / f"r{r}.json")], env=env) for r in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    import json
    for r in range(3):
        res = json.loads((tmp_path / f"r{r}.json").read_text())
        for a, b in zip(res["stock"], res["ring"]):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
        # 3 ranks: 2(N-1) = 4 steps per bucket, several buckets (tiny cap), 2 iterations
        assert res["records"] > 0 and res["records"] % 4 == 0


def test_profile_ring_gives_joined_send_recv_events(tmp_path):
    out = tmp_path / "t"
    profile_ddp(out, "--ring", steps="3:6",
                train=["--model", "mlp", "--iters", "4", "--warmup", "2", "--threads", "1", "--bucket-mb", "1"])
    from dpro_kit.graph import build_global_dfg
    from dpro_kit.trace import load_trace
    ts = load_trace(out)
    ev = ts.events
    send, recv = ev[ev["kind"] == "SEND"], ev[ev["kind"] == "RECV"]
    n_buckets = len(ts.collectives)
    assert n_buckets >= 2
    # 2 ranks: 2 ring steps per bucket, each rank one SEND and one RECV per step, 3 iterations
    assert len(send) == len(recv) == 2 * 2 * n_buckets * 3
    # every RECV's transaction id is some other node's SEND in the same iteration
    j = recv.merge(send, on=["txn", "iteration"], suffixes=("_r", "_s"))
    assert len(j) == len(recv) and (j["node_r"] != j["node_s"]).all()
    # ... and the graph builder's ring uses the same ids: every topology SEND got a measured time
    g = build_global_dfg(ts)
    sends = [d for _, d in g.nodes(data=True) if d["kind"] == "SEND"]
    assert sends and all(d["source"] == "trace:txn" for d in sends)
