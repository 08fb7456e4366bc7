#!/usr/bin/env python3
"""A plain PyTorch DDP training job used to record real traces for dpro.

gloo on CPU (NCCL when CUDA is available), synthetic data, three small model
families.  Launch it either with torchrun::

    torchrun --nproc-per-node 2 examples/ddp/train.py --model mlp

or let it spawn its own ranks on this machine::

    python examples/ddp/train.py --nproc 2 --model mlp

CPU placement: each rank uses ``cores // ranks on this machine`` intra-op threads
(``--threads``; torch's default of one thread per core in every rank oversubscribes
the machine as soon as ranks share it), and ``--pin local|rank`` binds each rank to
its own core(s) (``rank`` when emulated hosts share one machine, see
bench/accuracy.py).

Each iteration (forward, loss, backward, optimizer.step) is timed with a wall
clock on every rank; the script prints rank 0's times and a final median line,
and ``--json-out FILE`` writes every rank's times.  The loop is deliberately
ordinary: the dpro collector (``collectors/torch``) profiles it unchanged when
its environment variables are set (see ``dpro_torch.auto``).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


# --------------------------------------------------------------------------- models

class MLP(nn.Module):
    checkpoint_segments = 0   # > 0: --checkpoint (see checkpoint_layers)

    def __init__(self, d_in: int = 256, hidden: int = 512, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        dims = [d_in] + [hidden] * (layers - 1)
        self.body = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_segments:
            return checkpoint_layers([lambda x, l=l: F.relu(l(x)) for l in self.body] + [self.head],
                                     self.checkpoint_segments, x)
        for layer in self.body:
            x = F.relu(layer(x))
        return self.head(x)


class CNN(nn.Module):
    checkpoint_segments = 0

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_segments:
            return checkpoint_layers([lambda x, c=c: F.max_pool2d(F.relu(c(x)), 2)
                                      for c in (self.conv1, self.conv2, self.conv3)]
                                     + [lambda x: F.relu(self.fc1(x.flatten(1))), self.fc2],
                                     self.checkpoint_segments, x)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class TinyLM(nn.Module):
    """A small decoder-only transformer language model (causal self-attention)."""

    checkpoint_segments = 0

    def __init__(self, vocab: int = 2000, d_model: int = 128, heads: int = 4, layers: int = 2,
                 seq: int = 64) -> None:
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        # no registered buffers: DDP would broadcast them before every forward (an extra collective)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        if self.checkpoint_segments:
            mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
            return checkpoint_layers([self.tok, lambda x: x + self.pos(pos)]
                                     + [lambda x, l=l: l(x, src_mask=mask, is_causal=True) for l in self.blocks.layers]
                                     + [self.norm, self.head], self.checkpoint_segments, idx)
        x = self.tok(idx) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


def checkpoint_layers(layers: list, segments: int, x: torch.Tensor) -> torch.Tensor:
    """--checkpoint: torch.utils.checkpoint.checkpoint_sequential over the model's parameterised layers.

    One entry of ``layers`` per parameter-name prefix (``body.0``, ``conv1``, ``blocks.layers.0`` ...),
    in forward order: the layers dpro's memory model finds in a trace, so its recomputation estimate
    (``dpro_kit.optimize.memory``: round(sqrt(L)) segments, the last one not checkpointed, as torch
    does) describes exactly this run.
    """
    from torch.utils.checkpoint import checkpoint_sequential
    return checkpoint_sequential(layers, segments, x, use_reentrant=False)


def build(model: str, batch: int, device: torch.device):
    """Model, a batch generator and a loss function for ``model``."""
    if model == "mlp":
        net = MLP()
        def batch_fn():
            return torch.randn(batch, 256, device=device), torch.randint(0, 10, (batch,), device=device)
        loss_fn = F.cross_entropy
    elif model == "cnn":
        net = CNN()
        def batch_fn():
            return torch.randn(batch, 3, 32, 32, device=device), torch.randint(0, 10, (batch,), device=device)
        loss_fn = F.cross_entropy
    elif model == "transformer":
        net = TinyLM()
        def batch_fn():
            tokens = torch.randint(0, 2000, (batch, net.seq + 1), device=device)
            return tokens[:, :-1], tokens[:, 1:]
        def loss_fn(logits, target):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    else:
        raise SystemExit(f"unknown model {model!r}")
    return net.to(device), batch_fn, loss_fn


def teacher_batches(batch_fn, model: str, seed: int, device: torch.device):
    """--data teacher: ``batch_fn``'s inputs, labelled ``argmax(x.flatten(1) @ W)`` by a fixed random ``W``.

    ``W`` comes from its own generator (``seed``), so the data stream (the global RNG) is what
    ``--data random`` draws, and every rank and every run with the same seed has the same teacher.
    """
    if model == "transformer":
        raise SystemExit("train.py: --data teacher supports mlp and cnn")
    x0, _ = batch_fn()
    gen = torch.Generator().manual_seed(10_000 + seed)
    w = torch.randn(x0[0].numel(), 10, generator=gen).to(device)

    def fn():
        x, _ = batch_fn()
        return x, (x.flatten(1) @ w).argmax(1)
    return fn


# --------------------------------------------------------------------------- training

def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()) \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mem = MemoryPeak() if args.memory_peak else None   # before the model: count every allocation
    torch.manual_seed(args.seed)                 # same initial weights everywhere (DDP broadcasts anyway)
    net, batch_fn, loss_fn = build(args.model, args.batch_size, device)
    if args.checkpoint:  # round(sqrt(L)) segments of the L parameterised layers (checkpoint_layers)
        n_layers = len({_layer_of(n) for n, _ in net.named_parameters()})
        net.checkpoint_segments = max(1, round(n_layers ** 0.5))
    if args.data == "teacher":   # labels from a fixed random linear teacher: a learnable task, same on every rank
        batch_fn = teacher_batches(batch_fn, args.model, args.seed, device)
    torch.manual_seed(args.seed + 1 + rank)      # different data per rank
    applied = None
    # --memory-peak: no initial broadcast. Its flat buffer is freed by whichever thread drops the last
    # reference; when that is a gloo worker, the CPU allocator's profiler accounting never subtracts it
    # (frees are counted only on profiled threads), so about 1 run in 3 read one parameter-size too high.
    # The weights are the same on every rank anyway (same seed above).
    opts = {"device_ids": [device.index] if cuda else None}
    if mem:
        opts["init_sync"] = False
    deferred = None
    if args.plan:  # a `dpro optimize` plan: exact tensor groups (bucket cap or comm hook), else the closest cap
        applied = _plan_api().apply_plan(net, args.plan, mode=args.plan_mode, **opts)
        model = applied.model
        if applied.mode == "deft":   # the plan's DeFT section: its hook is the deferred-bucket state
            deferred = applied.hook_state
    else:
        model = DDP(net, bucket_cap_mb=args.bucket_mb, **opts)
    stamps: list | None = [] if args.phase_log else None
    if (args.deft_defer or args.deft_link1) and not args.plan:  # DeFT: delayed updates and/or a second link
        api = _deft_api()
        links = {}
        if args.deft_link1:  # these deferred buckets go over the second link ($DPRO_LINK1_IFNAME)
            second = api.link_group()
            links = {k: second for k in (range(1 << 16) if args.deft_link1 == "all"
                                         else [int(k) for k in args.deft_link1.split(",")])}
        deferred = api.DeferredBuckets(
            defer=range(1 << 16) if args.deft_defer == "all" else
            [int(k) for k in args.deft_defer.split(",") if k.strip()], links=links, stamps=stamps)
        model.register_comm_hook(None, deferred.hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    n_params = sum(p.numel() for p in net.parameters())
    if rank == 0:
        print(f"model={args.model} params={n_params} ({n_params * 4 / 2**20:.2f} MiB fp32) world={world} "
              f"backend={dist.get_backend()} bucket_mb={applied.bucket_cap_mb if applied else args.bucket_mb} "
              f"batch={args.batch_size} "
              f"threads={torch.get_num_threads()}", flush=True)
        if applied:
            print(f"plan: {applied.description}", flush=True)

    times = []
    phases: list[dict] = []   # --phase-log: per iteration, ms since its start (docs/deft.md §9)
    losses: list[float] = []
    total = args.warmup + args.iters
    starts: list[float] = []
    for it in range(total):
        t0 = time.perf_counter()
        starts.append(t0)
        if deferred is not None:
            deferred.iteration = it
        if mem:
            mem.begin(it)
        x, y = batch_fn()
        opt.zero_grad(set_to_none=True)
        if args.accum_steps == 1:
            out = model(x)
            loss = loss_fn(out, y)
            t_fwd = time.perf_counter()
            loss.backward()
            t_bwd = time.perf_counter()
        else:  # M micro-batches of batch/M; DDP synchronises only in the last backward
            for j, (xj, yj) in enumerate(zip(x.chunk(args.accum_steps), y.chunk(args.accum_steps))):
                with model.no_sync() if j < args.accum_steps - 1 else contextlib.nullcontext():
                    out = model(xj)
                    loss = loss_fn(out, yj) / args.accum_steps
                    loss.backward()
        opt.step()
        if stamps is not None:
            t_end = time.perf_counter()
            phases.append({"forward": (t_fwd - t0) * 1e3, "backward_end": (t_bwd - t0) * 1e3,
                           "step_end": (t_end - t0) * 1e3, "ready": {}, "done": {}})
        if args.loss_log:
            losses.append(float(loss.detach()) * args.accum_steps)
        if mem:
            mem.end()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0 and not args.quiet:
            tag = "warmup" if it < args.warmup else "iter"
            print(f"{tag} {it:4d} time_ms={dt * 1e3:.3f}", flush=True)
        if applied and it == 1 and rank == 0:  # after DDP's bucket rebuild (iteration 0): did the plan's groups run?
            ok, how = applied.verify()
            print(f"plan check: {'ok' if ok else 'MISMATCH'} ({how})", flush=True)

    if deferred is not None:
        deferred.flush()
    for i, k, what, t in list(stamps or ()):   # ms since the start of the iteration that launched it
        phases[i][what][str(k)] = (t - starts[i]) * 1e3
    measured = times[args.warmup:]
    # the training window on this machine's monotonic clock (time.perf_counter is CLOCK_MONOTONIC on Linux, one
    # clock for every process): the first measured iteration's start, the last one's end (bench/stragglers.py
    # --sched takes its threads' CPU over exactly this window)
    window = [starts[args.warmup], starts[-1] + times[-1]] if measured else None
    gathered = [None] * world
    dist.all_gather_object(gathered, (measured, window))
    all_times = [g[0] for g in gathered]
    if mem:
        mem.write(args, rank, world)
    if args.loss_log:
        every = [None] * world
        dist.all_gather_object(every, losses)
        if rank == 0:
            doc = {"model": args.model, "data": args.data, "seed": args.seed, "lr": args.lr,
                   "batch_size": args.batch_size, "world_size": world, "deft_defer": args.deft_defer,
                   "deft_link1": args.deft_link1, "loss_per_rank": {str(r): ls for r, ls in enumerate(every)},
                   "loss_mean": [statistics.fmean(ls[i] for ls in every) for i in range(len(losses))]}
            tmp = args.loss_log + f".tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, args.loss_log)
    if args.phase_log:
        every = [None] * world
        dist.all_gather_object(every, phases[args.warmup:])
        if rank == 0:
            tmp = args.phase_log + f".tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                json.dump({"first_iteration": args.warmup, "phases_ms": {str(r): p for r, p in enumerate(every)}}, fh)
            os.replace(tmp, args.phase_log)
    if rank == 0:
        per_iter_max = [max(ts[i] for ts in all_times) for i in range(len(measured))]
        med = statistics.median(measured) if measured else float("nan")
        print(f"median_iteration_ms={med * 1e3:.3f} (rank 0, {len(measured)} iterations after "
              f"{args.warmup} warm-up; slowest-rank median "
              f"{statistics.median(per_iter_max) * 1e3 if measured else float('nan'):.3f})", flush=True)
        if args.json_out:
            doc = {"model": args.model, "world_size": world, "backend": dist.get_backend(),
                   "bucket_mb": args.bucket_mb, "batch_size": args.batch_size, "warmup": args.warmup,
                   "iters": args.iters, "seed": args.seed, "params": n_params, "torch": torch.__version__,
                   "threads_per_rank": torch.get_num_threads(), "pin": args.pin, "host": socket.gethostname(),
                   "first_measured_iteration": args.warmup,
                   "plan": {"file": args.plan, "mode": applied.mode, "description": applied.description}
                   if applied else None,
                   "iteration_times_s": {str(r): ts for r, ts in enumerate(all_times)},
                   "train_window_perf_counter_s": {str(r): g[1] for r, g in enumerate(gathered)},
                   "median_iteration_s": med,
                   "median_slowest_rank_iteration_s": statistics.median(per_iter_max) if measured else None}
            tmp = args.json_out + f".tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                json.dump(doc, fh, indent=1)
            os.replace(tmp, args.json_out)


def _layer_of(param: str) -> str:
    """Parameter name -> its layer: up to the first numeric component (``body.0``), else the first one."""
    parts = param.split(".")
    for i, c in enumerate(parts[:-1]):
        if c.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


class MemoryPeak:
    """--memory-peak FILE: the real peak memory of this run, measured without dpro.

    torch.profiler with ``profile_memory=True`` runs from before the model is built, so the
    allocator's running total ("Total Allocated" of its ``[memory]`` events) counts everything
    the job allocates: parameters, DDP buckets, optimizer state, gradients, activations,
    temporaries.  The peak of iteration k is the largest total inside its ``mem::iteration/k``
    range (or the total when it begins).  It cannot run under ``dpro profile`` (one profiler
    per process); bench/memory_accuracy.py compares these peaks with dpro's estimates.
    """

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=acts, profile_memory=True, record_shapes=False, with_stack=False)
        self.prof.start()
        self._range = None

    def begin(self, it: int) -> None:
        self._range = torch.profiler.record_function(f"mem::iteration/{it}")
        self._range.__enter__()

    def end(self) -> None:
        self._range.__exit__(None, None, None)

    def peaks(self) -> dict:
        """Stop the profiler; per device: the total before iteration 0 and each iteration's peak (bytes)."""
        import tempfile
        self.prof.stop()
        fd, tmp = tempfile.mkstemp(suffix=".json", prefix="dpro-mem-")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(tmp)
            with open(tmp) as fh:
                events = json.load(fh)["traceEvents"]
        finally:
            os.unlink(tmp)
        ranges = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), int(e["name"].rsplit("/", 1)[1]))
                        for e in events if str(e.get("name", "")).startswith("mem::iteration/") and e.get("ph") == "X")
        samples: dict = {}
        for e in events:
            if e.get("name") == "[memory]":
                a = e["args"]
                dev = "cpu" if int(a.get("Device Type", 0)) == 0 else f"cuda:{int(a.get('Device Id', 0))}"
                samples.setdefault(dev, []).append((float(e["ts"]), int(a["Total Allocated"])))
        out = {}
        for dev, ss in samples.items():
            ss.sort()
            per_it, before = {}, None
            for lo, hi, it in ranges:
                prev = [b for t, b in ss if t < lo]
                inside = [b for t, b in ss if lo <= t <= hi]
                level = prev[-1] if prev else 0
                before = level if before is None else before
                per_it[it] = max([level] + inside)
            out[dev] = {"before_first_iteration": before, "iteration_peaks": per_it}
        return out

    def write(self, args: argparse.Namespace, rank: int, world: int) -> None:
        mine = self.peaks()
        every = [None] * world
        dist.all_gather_object(every, mine)
        if rank != 0:
            return
        dev = "cuda" if any(d.startswith("cuda") for r in every for d in r) else "cpu"
        medians = []
        for r in every:
            for d, v in r.items():
                if d.startswith(dev):
                    ps = [b for it, b in v["iteration_peaks"].items() if it >= args.warmup]
                    medians.append(statistics.median_low(ps) if ps else max(v["iteration_peaks"].values(), default=0))
        doc = {"model": args.model, "world_size": world, "batch_size": args.batch_size,
               "accum_steps": args.accum_steps, "checkpoint": args.checkpoint, "device": dev,
               "warmup": args.warmup, "iters": args.iters, "torch": torch.__version__,
               "rule": "per rank: median over the measured iterations of the allocator's largest total in "
                       "the iteration; peak_bytes = the largest rank's",
               "peak_bytes": max(medians) if medians else None,
               "per_rank": {str(i): r for i, r in enumerate(every)}}
        tmp = args.memory_peak + f".tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, args.memory_peak)


def _plan_api():
    """dpro_torch.plan (installed, else from this checkout); imported only for --plan."""
    try:
        from dpro_torch import plan
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.path[:0] = [os.path.join(root, "collectors", "torch"), os.path.join(root, "collectors", "common")]
        from dpro_torch import plan
    return plan


def _deft_api():
    """dpro_torch.deft (installed, else from this checkout); imported only for --deft-defer."""
    try:
        from dpro_torch import deft
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.path[:0] = [os.path.join(root, "collectors", "torch"), os.path.join(root, "collectors", "common")]
        from dpro_torch import deft
    return deft


def check_plan(args: argparse.Namespace) -> None:
    """Fail before any rank starts on a missing/invalid plan or one made for another model."""
    api = _plan_api()
    from dpro_collect.errors import DproError
    try:
        api.plan_groups(args.plan, build(args.model, 1, torch.device("cpu"))[0])
        if args.plan_mode == "deft":
            api.deft_settings(args.plan)
    except DproError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        sys.exit(2)


def _worker(local_rank: int, args: argparse.Namespace) -> None:
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = os.environ["LOCAL_WORLD_SIZE"] = str(args.nproc)
    _run(args)


def default_threads() -> int:
    """Intra-op threads per rank when --threads is 0: the machine's cores shared by the local ranks.

    torch's default (one thread per core in *every* rank) oversubscribes the CPU as soon as
    several ranks share a machine: on 2 cores, 2 ranks x 2 threads made each op 3-7x slower
    and its duration depend on what the other rank did at that moment.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    return max(1, cores // max(1, local))


def pin_rank(spec: str) -> str:
    """Bind this rank to its own core(s): ``--pin local`` (LOCAL_RANK) or ``--pin rank`` (RANK).

    Local rank ``r`` of ``L`` on ``C`` cores gets cores ``r*k .. r*k+k-1`` with ``k = max(1, C // L)``
    (wrapping when there are more ranks than cores); its gloo threads run there too.
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return "unsupported"
    key = "LOCAL_RANK" if spec == "local" else "RANK"
    r = int(os.environ.get(key, 0))
    local = int(os.environ.get("LOCAL_WORLD_SIZE" if spec == "local" else "WORLD_SIZE") or 1)
    k = max(1, len(cores) // max(1, local))
    mine = {cores[(r * k + j) % len(cores)] for j in range(k)}
    os.sched_setaffinity(0, mine)
    return ",".join(str(c) for c in sorted(mine))


def _run(args: argparse.Namespace) -> None:
    if args.pin != "none":
        pin_rank(args.pin)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    elif args.threads == 0:
        torch.set_num_threads(default_threads())
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend)
    try:
        train(args)
        dist.barrier()  # no rank tears gloo down while a peer still has a collective in flight
    finally:
        # free the DDP module (it sits in reference cycles and holds the process group) while the
        # interpreter is alive: left to the final garbage collection, gloo's worker threads and work
        # objects are torn down during interpreter finalization, which occasionally aborted a rank
        # ("terminate called without an active exception", SIGABRT) after all results were written
        gc.collect()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("cnn", "mlp", "transformer"), default="mlp")
    p.add_argument("--nproc", type=int, default=0,
                   help="spawn this many ranks here (without torchrun); 0 = use the torchrun environment")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's own default - 25 MB buckets after a 1 MB first bucket; "
                        "an explicit value also caps the first bucket, torch >= 2.13); ignored with --plan")
    p.add_argument("--plan", default="", help="apply this `dpro optimize` plan.json (dpro_torch.plan.apply_plan)")
    p.add_argument("--plan-mode", default="auto", choices=["auto", "hook", "cap", "deft"],
                   help="how to apply --plan: its tensor groups (auto: bucket caps when exact, else a comm hook; "
                        "hook; cap), or deft: its DeFT section (`dpro optimize --deft`: delayed buckets, a second "
                        "link) on DDP's buckets as traced")
    p.add_argument("--deft-defer", default="", metavar="all|K,...",
                   help="DeFT delayed updates: synchronise these DDP buckets (indices after DDP's rebuild, or all) "
                        "one iteration late (dpro_torch.deft.DeferredBuckets; docs/deft.md); ignored with --plan")
    p.add_argument("--deft-link1", default="", metavar="all|K,...",
                   help="all-reduce these DDP buckets on a gloo group bound to the second interface "
                        "$DPRO_LINK1_IFNAME (dpro cluster --second-rate-mbit; dpro_torch.deft.link_group): one "
                        "iteration late with --deft-defer, else synchronously (stock DDP's gradients on two links)")
    p.add_argument("--data", choices=("random", "teacher"), default="random",
                   help="random: random labels (nothing to learn; the default, as every recorded trace); teacher: "
                        "labels of a fixed random teacher network (seeded by --seed), so the loss falls "
                        "(mlp and cnn; for loss curves, --loss-log)")
    p.add_argument("--loss-log", default="", metavar="FILE",
                   help="write every iteration's loss, per rank and their mean, here (rank 0; JSON)")
    p.add_argument("--phase-log", default="", metavar="FILE",
                   help="a light timer without the profiler: per measured iteration and rank, ms from the "
                        "iteration's start to the end of the forward pass, to each DDP bucket's ready moment "
                        "(with --deft-*: stamped in the DeFT comm hook), to the end of backward and of the optimizer "
                        "step (rank 0 writes it; JSON; not with --accum-steps)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=20, help="measured iterations (after warm-up)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads per rank (0 = cores // ranks on this machine, at least 1; "
                        "-1 = leave torch's default of one thread per core)")
    p.add_argument("--pin", choices=("none", "local", "rank"), default="none",
                   help="bind each rank to its own cores (by LOCAL_RANK, or by RANK when emulated hosts "
                        "share one machine)")
    p.add_argument("--json-out", default="", help="write per-iteration times of every rank here (rank 0)")
    p.add_argument("--accum-steps", type=int, default=1, metavar="M",
                   help="gradient accumulation: M micro-batches of batch/M per iteration, DDP no_sync on the "
                        "first M-1")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: torch.utils.checkpoint over round(sqrt(L)) segments of the "
                        "L parameterised layers (the last segment keeps its activations)")
    p.add_argument("--memory-peak", default="", metavar="FILE",
                   help="measure the real peak memory (torch.profiler allocator events from before the model is "
                        "built) and write it here (rank 0); not under `dpro profile`")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.deft_link1 and not os.environ.get("DPRO_LINK1_IFNAME"):
        print("train.py: error: --deft-link1 needs a second link: DPRO_LINK1_IFNAME is not set; run on an emulated "
              "cluster with `dpro cluster --second-rate-mbit R` (or set DPRO_LINK1_IFNAME to the interface)",
              file=sys.stderr)
        sys.exit(2)
    if args.phase_log and (args.accum_steps != 1 or args.plan):
        print("train.py: error: --phase-log times one forward and one backward through the DeFT comm hook: not with "
              "--accum-steps > 1 or --plan", file=sys.stderr)
        sys.exit(2)
    if args.plan:
        check_plan(args)
    if args.nproc and "LOCAL_RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        import torch.multiprocessing as mp
        mp.spawn(_worker, args=(args,), nprocs=args.nproc, join=True)
    else:
        if "RANK" not in os.environ:
            sys.exit("not launched by torchrun: pass --nproc N to spawn N ranks here")
        _run(args)


if __name__ == "__main__":
    main()
