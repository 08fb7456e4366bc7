#!/usr/bin/env python3
"""One real training job under a parallelisation strategy: DDP, ZeRO-1, FSDP2, pipeline, tensor parallel.

The strategy is the same YAML/JSON file ``dpro simulate --strategy`` reads (docs/simulate.md;
keys: ``ranks``, ``hosts``, ``strategy.data_parallel{degree,sharding}``,
``strategy.tensor_parallel{degree}``, ``strategy.pipeline{stages,micro_batches,schedule}``,
``strategy.recompute`` and ``strategy.children[{module, recompute}]``), so a bench hands the one file
to the real job and to the simulator.  Without ``--strategy`` the job is plain DDP over the ranks;
at ``--ranks 1`` DDP over a 1-rank gloo group: the single-process run ``dpro profile --shapes``
records for the simulator (DDP makes the collector record parameters and gradient-ready ops).

What each strategy runs (torch 2.13, CPU, gloo; every one of them works there):

=====================  ===========================================================================
sharding none          ``DistributedDataParallel`` (one all-reduce per 25 MB bucket)
sharding zero1         DDP + ``ZeroRedundancyOptimizer`` (optimizer state sharded; parameters
                       broadcast from their owner after the step)
sharding zero2         FSDP2 ``fully_shard(reshard_after_forward=False)`` per layer and on the root
                       (parameters stay gathered from forward to backward: ZeRO-2's traffic)
sharding zero3 / fsdp  FSDP2 ``fully_shard`` per layer and on the root (all-gather before forward
                       and before backward, reduce-scatter of gradients; gloo has both collectives)
tensor_parallel        DTensor ``parallelize_module``: in every block the first Linear of each pair
                       ``ColwiseParallel``, the second ``RowwiseParallel`` (Megatron; attention:
                       q/k/v column, o row); embeddings, norms and the head replicated
pipeline               ``torch.distributed.pipelining``: the layers cut into ``stages`` contiguous
                       stages by count (``split: even`` required: dpro simulate's default is
                       ``balanced``; stage 0 also holds ``inp``, the last ``head`` and the loss),
                       ``ScheduleGPipe`` or ``Schedule1F1B`` over ``micro_batches``
recompute              ``checkpoint_wrapper`` (non-reentrant activation checkpointing) on every
                       layer, or on the ``layers.K`` the strategy's children name
=====================  ===========================================================================

One parallel dimension per job (data, tensor or pipeline); a product of two is refused.
``--batch-size`` is the GLOBAL batch of one iteration: data parallel ranks take batch/degree each,
tensor parallel ranks all take the whole batch, a pipeline splits it into micro-batches.  So every
strategy does the same work per iteration and their times compare.

Launch: ``--ranks N`` spawns N ranks here (loopback); under torchrun or ``dpro_kit.jobs.run_job``
(``RANK``/``WORLD_SIZE`` set) it is one rank.  Output: one JSON line on stdout (rank 0) and
``--json-out FILE`` with every rank's iteration times (``iteration_times_s``, what
``dpro_kit.jobs.job_iteration_ms`` reads).  Time: wall clock of each iteration (batch, forward,
backward, optimizer step) per rank; the job's iteration time is the slowest rank's median after the
warm-up.  Memory (``--memory``, a separate run: it slows the iterations): ``peak_bytes`` is each
rank's peak ANONYMOUS resident growth from just before the model is built to the end of the measured
iterations (see :class:`RssPeak`: glibc returns every block >= 64 KiB to the kernel when freed, so
this follows the live tensors whichever thread frees them); ``peak_rss_mib`` is the whole process's
``ru_maxrss``.  (torch's
CPU allocator has no statistics, and ``torch.profiler(profile_memory=True)`` misses frees on threads
it does not profile: under FSDP2 its running total grew ~2 MiB per iteration, so it is not used.)

    python examples/strategies/train.py --ranks 2 --model mlp --strategy examples/strategies/fsdp-2.yaml
    dpro profile --shapes -o T -- python examples/strategies/train.py --ranks 1 --model mlp
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")
SCHEDULES = ("gpipe", "1f1b")


# --------------------------------------------------------------------------- models
# Every model is  inp -> layers.0 .. layers.{L-1} -> head ; a "layer" is the unit of pipeline
# cuts, FSDP units, recomputation and tensor-parallel plans.

class FFN(nn.Module):
    """Residual feed-forward block: x + fc2(relu(fc1(x))) -- one Megatron column/row pair."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm causal transformer block with explicit q/k/v/o and fc1/fc2 Linears (TP-splittable)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.hd = d // heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.ln1(x)
        # -1 heads: under tensor parallelism q/k/v hold heads/degree heads of this rank
        q, k, v = (t(h).view(b, s, -1, self.hd).transpose(1, 2) for t in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Embed(nn.Module):
    def __init__(self, vocab: int, d: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, d: int, out: int, norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d) if norm else nn.Identity()
        self.proj = nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class Net(nn.Module):
    def __init__(self, inp: nn.Module, layers: list[nn.Module], head: nn.Module) -> None:
        super().__init__()
        self.inp = inp
        self.layers = nn.ModuleList(layers)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


MODELS = {
    # d_in 256 -> 4 FFN blocks of 256 -> 1024 -> 256 -> 10 classes: 2.2 M parameters (8.5 MiB fp32)
    "mlp": dict(d_in=256, d=256, hidden=1024, layers=4, classes=10, batch=64),
    # vocab 1000, seq 32, d 128, 4 heads, 4 blocks: 1.05 M parameters (4.0 MiB fp32)
    "transformer": dict(vocab=1000, seq=32, d=128, heads=4, layers=4, batch=8),
}


def build(model: str, width_div: int = 1) -> tuple[Net, dict]:
    """The model; ``width_div`` > 1 divides every width (features, hidden, d_model) by it, keeping the
    layers, Linears, parameter tensors, batch and sequence: the same ops and runtime calls on tiny
    tensors (a strategy runtime's fixed costs, ``--width-div``; docs/simulate.md)."""
    c = dict(MODELS[model])
    for k in ("d_in", "d", "hidden"):
        if k in c:
            c[k] = max(1, c[k] // width_div)
    if model == "transformer" and width_div > 1:
        c["d"] = max(c["heads"], c["d"] // c["heads"] * c["heads"])
    if model == "mlp":
        net = Net(nn.Linear(c["d_in"], c["d"]), [FFN(c["d"], c["hidden"]) for _ in range(c["layers"])],
                  Head(c["d"], c["classes"], norm=False))
    else:
        net = Net(Embed(c["vocab"], c["d"], c["seq"]), [Block(c["d"], c["heads"]) for _ in range(c["layers"])],
                  Head(c["d"], c["vocab"], norm=True))
    return net, c


def make_batch(model: str, c: dict, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if model == "mlp":
        return torch.randn(batch, c["d_in"], generator=gen), torch.randint(0, c["classes"], (batch,), generator=gen)
    tok = torch.randint(0, c["vocab"], (batch, c["seq"] + 1), generator=gen)
    return tok[:, :-1], tok[:, 1:]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


# --------------------------------------------------------------------------- strategy file

class StrategyError(Exception):
    pass


def load_strategy(path: str | None, ranks: int) -> dict:
    """The parts of a strategy file this job runs: dp degree/sharding, tp degree, pipeline, recompute."""
    if not path:
        return {"name": f"ddp-{ranks}", "ranks": ranks, "dp": ranks, "sharding": "none", "tp": 1, "stages": 1,
                "micro_batches": 1, "schedule": "gpipe", "recompute": set()}
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise StrategyError(f"{path}: cannot read the strategy file ({e.strerror})")
    try:
        if p.suffix == ".json":
            doc = json.loads(text)
        else:
            import yaml
            doc = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - one line naming the file
        raise StrategyError(f"{path}: not valid YAML/JSON ({str(e).splitlines()[0]})")
    if not isinstance(doc, dict) or not isinstance(doc.get("strategy"), dict):
        raise StrategyError(f"{path}: needs a mapping with a 'strategy' key (see docs/simulate.md)")
    s = doc["strategy"]

    def sub(key: str) -> dict:
        v = s.get(key) or {}
        if not isinstance(v, dict):
            raise StrategyError(f"{path}: strategy.{key} must be a mapping, got {v!r}")
        return v

    dp, tp, pp = sub("data_parallel"), sub("tensor_parallel"), sub("pipeline")
    try:
        out = {"name": str(doc.get("name") or p.stem), "ranks": int(doc.get("ranks", ranks)),
               "dp": int(dp.get("degree", 1)), "sharding": str(dp.get("sharding", "none")),
               "tp": int(tp.get("degree", 1)), "stages": int(pp.get("stages", 1)),
               "micro_batches": int(pp.get("micro_batches", 1)), "schedule": str(pp.get("schedule", "gpipe"))}
    except (TypeError, ValueError) as e:
        raise StrategyError(f"{path}: a degree/stages/micro_batches value is not an integer ({e})")
    if out["sharding"] not in SHARDINGS:
        raise StrategyError(f"{path}: strategy.data_parallel.sharding {out['sharding']!r} is not one of {SHARDINGS}")
    if out["schedule"] not in SCHEDULES:
        raise StrategyError(f"{path}: strategy.pipeline.schedule {out['schedule']!r} is not one of {SCHEDULES}")
    if out["dp"] * out["tp"] * out["stages"] != out["ranks"]:
        raise StrategyError(f"{path}: data_parallel.degree {out['dp']} x tensor_parallel.degree {out['tp']} x "
                            f"pipeline.stages {out['stages']} != ranks {out['ranks']}")
    split = str(pp.get("split", "balanced"))
    if out["stages"] > 1 and split != "even":
        raise StrategyError(f"{path}: strategy.pipeline.split is {split!r}: this job cuts the layers by count; add "
                            "`split: even` to the pipeline (so dpro simulate cuts them the same way)")
    if sum(x > 1 for x in (out["dp"], out["tp"], out["stages"])) > 1:
        raise StrategyError(f"{path}: this job runs one parallel dimension at a time (data, tensor or pipeline); "
                            "use a file with only one of the degrees above 1")
    rec: set[str] = {"*"} if s.get("recompute") else set()
    for ch in s.get("children") or []:
        if isinstance(ch, dict) and "module" in ch and "recompute" in ch:
            (rec.add if ch["recompute"] else rec.discard)(str(ch["module"]))
    out["recompute"] = rec
    return out


# --------------------------------------------------------------------------- strategies

def apply_recompute(net: Net, rec: set[str]) -> list[str]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    done = []
    for i, layer in enumerate(list(net.layers)):
        name = f"layers.{i}"
        if "*" in rec or any(name == m or name.startswith(m + ".") for m in rec):
            net.layers[i] = checkpoint_wrapper(layer)
            done.append(name)
    return done


def tp_plan(model: str, net: Net) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {}
    for i, layer in enumerate(net.layers):
        pre = f"layers.{i}" + ("._checkpoint_wrapped_module" if hasattr(layer, "_checkpoint_wrapped_module") else "")
        if model == "mlp":
            plan.update({f"{pre}.fc1": ColwiseParallel(), f"{pre}.fc2": RowwiseParallel()})
        else:
            plan.update({f"{pre}.{n}": ColwiseParallel() for n in ("q", "k", "v", "fc1")})
            plan.update({f"{pre}.{n}": RowwiseParallel() for n in ("o", "fc2")})
    return plan


class Stage(nn.Module):
    """A contiguous slice of the model for one pipeline stage (first: + inp, last: + head)."""

    def __init__(self, net: Net, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.inp = net.inp if first else None
        self.layers = nn.ModuleList(net.layers[lo:hi])
        self.head = net.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x) if self.head is not None else x


def stage_bounds(n_layers: int, stages: int, s: int) -> tuple[int, int]:
    """Layers [lo, hi) of stage s: contiguous, as even as possible, earlier stages take the remainder."""
    base, extra = divmod(n_layers, stages)
    lo = s * base + min(s, extra)
    return lo, lo + base + (1 if s < extra else 0)


class Job:
    """The model wrapped for the strategy; ``step(x, y)`` runs one iteration (forward, backward, optimizer)."""

    def __init__(self, args: argparse.Namespace, st: dict, rank: int, world: int) -> None:
        self.args, self.st, self.rank, self.world = args, st, rank, world
        torch.manual_seed(args.seed)             # same initial weights on every rank
        net, self.cfg = build(args.model, args.width_div)
        self.n_params = sum(p.numel() for p in net.parameters())
        self.recomputed = apply_recompute(net, st["recompute"]) if st["recompute"] else []
        self.local_batch = args.batch_size
        self.pipe = None
        self.describe = ""
        lr = args.lr
        if st["stages"] > 1:
            self._pipeline(net)
        elif st["tp"] > 1:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import parallelize_module
            mesh = init_device_mesh("cpu", (world,))
            parallelize_module(net, mesh, tp_plan(args.model, net))
            self.model = net
            self.opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
            self.describe = "DTensor parallelize_module (Colwise/Rowwise pairs)"
        else:   # data parallel, degree >= 1 (1 process: DDP over one rank, as dpro simulate's profile wants)
            if args.batch_size % st["dp"]:
                raise StrategyError(f"--batch-size {args.batch_size} is not divisible by data_parallel.degree {st['dp']}")
            self.local_batch = args.batch_size // st["dp"]
            if st["sharding"] in ("none", "zero1"):
                from torch.nn.parallel import DistributedDataParallel as DDP
                self.model = DDP(net)
                if st["sharding"] == "zero1":
                    from torch.distributed.optim import ZeroRedundancyOptimizer
                    self.opt = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=torch.optim.SGD,
                                                       lr=lr, momentum=0.9)
                    self.describe = "DDP + ZeroRedundancyOptimizer"
                else:
                    self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
                    self.describe = "DDP"
            else:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import fully_shard
                mesh = init_device_mesh("cpu", (world,))
                reshard = st["sharding"] != "zero2"
                for layer in net.layers:
                    fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
                fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
                self.model = net
                self.opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
                self.describe = f"FSDP2 fully_shard per layer + root (reshard_after_forward={reshard})"
        self.gen = torch.Generator().manual_seed(args.seed + 1 + (rank if st["dp"] > 1 else 0))

    def _pipeline(self, net: Net) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        st, rank = self.st, self.rank
        m = st["micro_batches"]
        if self.args.batch_size % m:
            raise StrategyError(f"--batch-size {self.args.batch_size} is not divisible by pipeline.micro_batches {m}")
        lo, hi = stage_bounds(len(net.layers), st["stages"], rank)
        self.first, self.last = rank == 0, rank == st["stages"] - 1
        mod = Stage(net, lo, hi, self.first, self.last)
        stage = PipelineStage(mod, rank, st["stages"], torch.device("cpu"))
        sched = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[st["schedule"]]
        self.pipe = sched(stage, n_microbatches=m, loss_fn=loss_fn)
        self.model = mod
        self.opt = torch.optim.SGD(mod.parameters(), lr=self.args.lr, momentum=0.9)
        self.describe = f"{sched.__name__} stage {rank} layers {lo}..{hi - 1}, {m} micro-batches"

    def step(self) -> None:
        x, y = make_batch(self.args.model, self.cfg, self.local_batch, self.gen)
        self.opt.zero_grad(set_to_none=True)
        if self.pipe is not None:
            if self.first:
                self.pipe.step(x)
            elif self.last:
                self.pipe.step(target=y, losses=[])
            else:
                self.pipe.step()
        else:
            loss_fn(self.model(x), y).backward()
        self.opt.step()


# --------------------------------------------------------------------------- run

class RssPeak:
    """Peak resident memory the job adds on top of the process it starts in (thread-agnostic; --memory).

    glibc is told (``mallopt``) to serve every allocation of >= 64 KiB by its own ``mmap`` and to return
    it with ``munmap`` when freed (no dynamic threshold, no caching in the heap), so resident memory
    follows the live tensors (whichever thread frees them: gloo, autograd, FSDP).  The constructor runs
    one step of a tiny model (lazy kernel buffers) and reads the ANONYMOUS resident size (``RssAnon``)
    before the model is built (torch, gloo and the process group already up);
    ``reset()`` (after the warm-up) sets the kernel's high-water mark to the current resident size
    (``/proc/self/clear_refs`` 5); ``peak()`` = ``VmHWM - RssFile - RssShmem`` - that base: the largest anonymous
    resident growth in the measured iterations (file-backed pages -- libtorch's code -- are all touched
    by the end of the warm-up and constant after it) (parameters, gradients, optimizer state, buffers, activations, gloo
    scratch; plus allocator and Python-object noise of a few hundred KiB).
    """

    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

    def __init__(self, enabled: bool) -> None:
        import ctypes
        if not enabled or os.environ.get("DPRO_OUT"):
            # off by default: a fresh mmap per block costs page faults every iteration (timing runs keep glibc's
            # heap); never under dpro profile (with every block >= 64 KiB unmapped when freed, the profiler's
            # trace export crashed: SIGSEGV at the window's end)
            self.ok, self.base = False, None
            return
        try:
            libc = ctypes.CDLL("libc.so.6")
            self.ok = bool(libc.mallopt(self.M_MMAP_THRESHOLD, 64 * 1024)) and bool(libc.mallopt(self.M_TRIM_THRESHOLD, 128 * 1024))
        except OSError:
            self.ok = False
        self._touch()
        self.base = self._status("RssAnon")

    @staticmethod
    def _touch() -> None:
        """The strategies' imports and one step of a tiny copy of each model: one-time lazy allocations (the
        first optimizer step's imports, kernel buffers: ~70 MiB here) happen now, before the base is read,
        not counted as the job's.
        Not under ``dpro profile`` (its collector counts optimizer steps; memory is not measured there)."""
        # the strategies' libraries (Python modules: code and objects, 0.5-3.6 MiB each) are imported before
        # the base too, whichever strategy runs: no strategy's peak counts its library's import
        # (torch.distributed.pipelining alone was 3.6 MiB of a pipeline rank's 19 MiB; docs/simulate.md "Memory")
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torch.distributed.optim  # noqa: F401
        import torch.distributed.pipelining  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper  # noqa: F401
        tiny = Net(nn.Sequential(Embed(16, 8, 4), FFN(8, 16)), [Block(8, 2)], Head(8, 16, norm=True))
        opt = torch.optim.SGD(tiny.parameters(), lr=0.1, momentum=0.9)
        loss_fn(tiny(torch.randint(0, 16, (2, 4))), torch.randint(0, 16, (2, 4))).backward()
        opt.step()   # the first optimizer step imports torch._dynamo & co. (~60 MiB of Python objects)

    @staticmethod
    def _status(key: str) -> int | None:
        try:
            for line in open("/proc/self/status"):
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def reset(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            self.ok = False
            return False

    def peak(self) -> int | None:
        hwm, file, shm = self._status("VmHWM"), self._status("RssFile"), self._status("RssShmem")
        if not self.ok or None in (hwm, file, shm, self.base):
            return None
        return hwm - file - shm - self.base


def train(args: argparse.Namespace, st: dict) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    rss = RssPeak(args.memory)                    # before the model: its resident growth is the job's
    job = Job(args, st, rank, world)
    if rank == 0 and not args.quiet:
        print(f"model={args.model} params={job.n_params} strategy={st['name']} world={world}: {job.describe}"
              + (f"; recompute {','.join(job.recomputed)}" if job.recomputed else ""), flush=True)
    times = []
    for it in range(args.warmup + args.iters):
        if it == args.warmup:
            rss.reset()
        t0 = time.perf_counter()
        job.step()
        times.append(time.perf_counter() - t0)
        if rank == 0 and not args.quiet:
            print(f"{'warmup' if it < args.warmup else 'iter'} {it:4d} time_ms={times[-1] * 1e3:.3f}", flush=True)
    measured = times[args.warmup:]
    mine = {"times": measured, "rss_peak": rss.peak(), "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    every = [mine]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, mine)
    if rank != 0:
        return
    per_rank = {str(r): e["times"] for r, e in enumerate(every)}
    slow = max(statistics.median(ts) for ts in per_rank.values())
    doc = {"model": args.model, "strategy": st["name"], "world_size": world, "dp": st["dp"],
           "sharding": st["sharding"], "tp": st["tp"], "stages": st["stages"], "micro_batches": st["micro_batches"],
           "schedule": st["schedule"], "recompute": job.recomputed, "describe": job.describe,
           "batch_size": args.batch_size, "params": job.n_params, "warmup": args.warmup, "iters": args.iters,
           "threads_per_rank": torch.get_num_threads(), "torch": torch.__version__, "host": socket.gethostname(),
           "iteration_ms": round(slow * 1e3, 3),
           "per_rank_median_ms": {r: round(statistics.median(ts) * 1e3, 3) for r, ts in per_rank.items()},
           "peak_rss_mib": {str(r): round(e["maxrss_kib"] / 1024, 1) for r, e in enumerate(every)},
           "peak_bytes": {str(r): e["rss_peak"] for r, e in enumerate(every)},
           "memory_rule": "peak_bytes: per rank VmHWM - RssFile - RssShmem in the measured iterations - RssAnon "
                          "before the model was built (glibc mmap threshold 64 KiB, so freed tensors leave RSS; "
                          "see RssPeak); peak_rss_mib: ru_maxrss of the "
                          "whole process (torch itself included)",
           "iteration_times_s": per_rank}
    line = {k: v for k, v in doc.items() if k != "iteration_times_s"}
    print(json.dumps(line), flush=True)
    if args.json_out:
        tmp = f"{args.json_out}.tmp{os.getpid()}"
        Path(tmp).write_text(json.dumps(doc, indent=1))
        os.replace(tmp, args.json_out)


def _run(args: argparse.Namespace, st: dict) -> None:
    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != st["ranks"]:
        raise StrategyError(f"the strategy is for {st['ranks']} ranks but the job has {world}")
    if world == 1:   # one process: a 1-rank gloo group, so data parallel is DDP (what dpro simulate's profile records)
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo")
    try:
        train(args, st)
        dist.barrier()
    finally:
        import gc
        gc.collect()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(local_rank: int, args: argparse.Namespace, st: dict) -> None:
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = os.environ["LOCAL_WORLD_SIZE"] = str(args.ranks)
    _run(args, st)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example:\n  python examples/strategies/train.py --ranks 2 --strategy "
                                       "examples/strategies/fsdp-2.yaml --model transformer")
    p.add_argument("--strategy", default="", help="strategy YAML/JSON (the file `dpro simulate --strategy` reads); "
                   "default: plain data parallel over the ranks")
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--ranks", type=int, default=0,
                   help="spawn this many ranks here (loopback; default: the strategy file's ranks, else 1); under a "
                        "launcher (RANK/WORLD_SIZE set) this process is one rank")
    p.add_argument("--batch-size", type=int, default=0, help="GLOBAL batch per iteration (default: the model's)")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (after warm-up)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--width-div", type=int, default=1,
                   help="divide every width of the model by this (tiny tensors, the same layers and ops: what the "
                        "strategy's runtime costs besides compute; docs/simulate.md \"Runtime overheads\")")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--memory", action="store_true",
                   help="measure peak memory (peak_bytes; RssPeak): glibc then maps and unmaps every block >= 64 KiB, "
                        "whose page faults slow the iterations, so time and memory come from separate runs; "
                        "not under dpro profile")
    p.add_argument("--json-out", default="", help="write every rank's iteration times and the summary here")
    p.add_argument("--quiet", action="store_true", help="print only the JSON line")
    a = p.parse_args(argv)
    if not a.batch_size:
        a.batch_size = MODELS[a.model]["batch"]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched and args.ranks and args.ranks != int(os.environ["WORLD_SIZE"]):
        print(f"train.py: error: --ranks {args.ranks} but the launcher set WORLD_SIZE={os.environ['WORLD_SIZE']}",
              file=sys.stderr)
        return 2
    try:
        # ranks: the launcher's, else --ranks, else the strategy file's, else 1
        ranks = int(os.environ["WORLD_SIZE"]) if launched else args.ranks or \
            (load_strategy(args.strategy, 1)["ranks"] if args.strategy else 1)
        args.ranks = ranks
        st = load_strategy(args.strategy, ranks)
        if st["ranks"] != ranks:
            raise StrategyError(f"{args.strategy}: ranks {st['ranks']} but the job has {ranks} "
                                "(pass --ranks or launch that many)")
        if args.model == "transformer" and st["tp"] > 1 and MODELS["transformer"]["heads"] % st["tp"]:
            raise StrategyError(f"tensor_parallel.degree {st['tp']} does not divide the transformer's "
                                f"{MODELS['transformer']['heads']} heads")
        if st["stages"] > MODELS[args.model]["layers"]:
            raise StrategyError(f"pipeline.stages {st['stages']} > the model's {MODELS[args.model]['layers']} layers")
        if launched or ranks == 1:
            os.environ.setdefault("WORLD_SIZE", "1")
            _run(args, st)
        else:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                os.environ["MASTER_PORT"] = str(_free_port())
            import torch.multiprocessing as mp
            mp.spawn(_worker, args=(args, st), nprocs=ranks, join=True)
    except StrategyError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
