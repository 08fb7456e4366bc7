"""The Recorder: profiles a window of training iterations with torch.profiler.

What it inserts (all ``record_function`` ranges, see :mod:`dpro_torch.markers`),
only while the profiler runs:

* ``dpro::forward``  - forward pre/post hooks on every DDP module;
* ``dpro::backward`` - around ``torch.autograd.backward`` (``loss.backward()``);
* ``dpro::optimizer_step`` - global optimizer step pre/post hooks;
* ``dpro::grad_ready/<i>`` - ``register_post_accumulate_grad_hook`` on every
  DDP parameter ``i``: the gradient of parameter *i* is accumulated (the
  reader's per-parameter ready ops, which ``dpro replay --bucket-mb``
  needs).  ``grad_ready=False`` / ``DPRO_GRAD_READY=0`` turns them off (one
  Python hook call per parameter and iteration, inside the window only);
* ``dpro::step_end`` - the end of each profiled iteration;
* ``dpro::clock_sync`` - right after the profiler starts, bracketed by
  ``time.time_ns()`` readings stored in ``meta.json``.

Just before the profiler starts, rank 0 pings one rank of every other host
(:mod:`dpro_torch.clockprobe`, ``DPRO_CLOCK_PROBE=0`` turns it off): the
readings in ``meta.json["clock_probe"]`` bound each host's clock offset.

When the window opens the recorder measures the profiler's cost per recorded
event in this process (:class:`_Calibration`: a C++ loop of tiny ops timed
just before and just after the profiler starts, the latter inside a
``dpro::calibrate`` range); ``meta.json`` keeps the timings under
``profiler_overhead`` and the reader subtracts the cost from the ops it times.

Outside the window only the two global optimizer-step hooks (count iterations)
and a flag test in the ``torch.autograd.backward`` wrapper remain: ~1.2 + ~0.9 us
per iteration (``bench/overhead_pieces.py``; docs/accuracy.md, "Outside the
window").  Every per-op / per-parameter piece (forward hooks, grad-ready hooks,
ranges, step markers) is installed when the window opens and removed when it
ends, and the profiler is stopped, exported and freed.  With CUDA the recorder
also sets ``TEARDOWN_CUPTI=1`` (unless the job set it) so that Kineto detaches
CUPTI at the end of the window: left attached (Kineto's default) it slows every
later kernel launch; ``meta.json["cupti_teardown"]`` records the value used.
``dpro profile --ring`` is the exception: its comm hook runs all iterations.  No shapes, stacks, memory or execution-trace
observer are recorded in the window.  With ``shapes=True`` (``DPRO_SHAPES=1``,
``dpro profile --shapes``) the iteration right after the window is profiled
once more with ``record_shapes=True`` into ``kineto_shapes.json``: op input
shapes, dtypes and scalar arguments, which ``dpro optimize`` uses to rebuild
op-fusion candidates and time them with torch.compile.  Recording shapes costs
more per op, which is why it never happens on the timed steps.

Per rank the recorder writes ``<out>/<host>/<rank>/kineto_trace.json`` (when the
window ends) and ``meta.json`` (at the end of the window and again at exit,
including the measured wall time of every iteration).  Files are written
atomically; an ``atexit`` handler and a SIGTERM handler (chained to the previous
one) flush a window that is still open when the job ends or is killed.
"""
from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from . import hvd as H
from . import markers as M
from dpro_collect.files import atomic_write_text as _atomic_write

_ACTIVE: "Recorder | None" = None
_DDPS: list[weakref.ref] = []       # every DDP module constructed since the DDP patch was installed
_PATCHED = {"ddp": False, "backward": False}
MAX_STEP_RECORDS = 100_000
_FAST_RF = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
TRACE_FILE = "kineto_trace.json"
SHAPES_FILE = "kineto_shapes.json"


def active_recorder() -> "Recorder | None":
    return _ACTIVE


def cpu_placement() -> dict[str, Any]:
    """Where this rank ran: its CPU set, the machine's CPU count and the machine itself.

    ``machine`` is the kernel's boot id: network namespaces (the emulated cluster)
    and containers on one machine share it, so the reader can tell ranks that
    compete for the same cores even when their host names differ.
    """
    try:
        cpus: list[int] | None = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = None
    try:
        machine: str | None = Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        machine = None
    out: dict[str, Any] = {"affinity": cpus, "count": os.cpu_count(), "machine": machine}
    limit = cgroup_cpu_limit()
    if limit is not None:
        out["limit_cpus"] = limit
        period = cgroup_cpu_period_us()
        if period is not None:
            out["period_us"] = period
    return out


def _cgroup_cpu_dir() -> tuple[Path, int] | None:
    """This process's cgroup folder of the ``cpu`` controller and the cgroup version, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if "cpu" in ctrls.split(","):
            for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                d = Path(base + path)
                if (d / "cpu.cfs_quota_us").exists():
                    return d, 1
        if hid == "0" and ctrls == "":
            d = Path("/sys/fs/cgroup" + path)
            if (d / "cpu.max").exists():
                return d, 2
    return None


def cgroup_cpu_limit() -> float | None:
    """CPUs this process's cgroup may use (its CFS quota / period), or None when unlimited or unknown.

    A container's CPU limit (Kubernetes ``limits.cpu``, ``docker --cpus``) and the emulated
    cluster's per-host budget (``dpro_kit.jobs.CpuBudget``) are such a quota.
    """
    found = _cgroup_cpu_dir()
    if found is None:
        return None
    d, ver = found
    try:
        if ver == 1:
            q, per = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
        else:
            a, b = (d / "cpu.max").read_text().split()[:2]
            if a == "max":
                return None
            q, per = int(a), int(b)
    except (OSError, ValueError):
        return None
    return round(q / per, 4) if q > 0 and per > 0 else None


def cgroup_cpu_period_us() -> int | None:
    """The CFS period of this process's cgroup quota in us (``cpu.cfs_period_us``, cgroup v2 ``cpu.max``), or None."""
    found = _cgroup_cpu_dir()
    if found is None:
        return None
    d, ver = found
    try:
        per = int((d / "cpu.cfs_period_us").read_text()) if ver == 1 else int((d / "cpu.max").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return per if per > 0 else None


class CpuClock:
    """Process CPU time and its cgroup's throttled time, read at every step boundary (cheap: one
    clock call and one small file read).  ``throttled_ns`` is None where the cgroup's ``cpu.stat``
    is not readable."""

    def __init__(self) -> None:
        found = _cgroup_cpu_dir()
        self._stat = (found[0] / "cpu.stat", found[1]) if found else None

    def throttled_ns(self) -> int | None:
        if self._stat is None:
            return None
        path, ver = self._stat
        try:
            for line in path.read_text().splitlines():
                k, _, v = line.partition(" ")
                if ver == 1 and k == "throttled_time":
                    return int(v)
                if ver == 2 and k == "throttled_usec":
                    return int(v) * 1000
        except (OSError, ValueError):
            self._stat = None
        return None

    def read(self) -> tuple[int, int | None]:
        return time.process_time_ns(), self.throttled_ns()


def thread_schedstat() -> tuple[int, int, int] | None:
    """The calling thread's ``(tid, cpu_ns, wait_ns)`` from ``/proc/thread-self/schedstat`` (Linux): the CPU
    time it ran and the time it was runnable but waited for a core (run-queue delay, quota stops included),
    or None where not readable.  Read at every step boundary by the thread that trains (``steps[].thread_cpu_us``,
    ``thread_wait_us``): how much of its step the training thread itself computed and waited for its core,
    which the process CPU (all threads) cannot say (docs/stragglers.md, "Thirteenth")."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            cpu, wait = fh.read().split()[:2]
        return threading.get_native_id(), int(cpu), int(wait)
    except (OSError, ValueError, AttributeError):
        return None


def gpu_placement() -> dict[str, Any] | None:
    """The CUDA device this rank used, or None (no CUDA, or CUDA never initialised by the job).

    ``uuid`` names the physical GPU (ranks of one machine with the same uuid share it);
    ``mps``: the CUDA MPS daemon's control pipe exists (the ranks' kernels then share the
    GPU's SMs at once instead of time-slicing it; dpro_kit.placement).  Never raises.
    """
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        i = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
        return {"index": int(i), "uuid": str(uuid) if uuid is not None else None, "name": str(props.name),
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "mps": Path(pipe, "control").exists()}
    except Exception:  # noqa: BLE001 - a placement note must never stop the job
        return None


def _log(msg: str) -> None:
    if os.environ.get("DPRO_QUIET") != "1":
        print(f"[dpro_torch pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


class _Calibration:
    """Measures the profiler's cost per recorded event in this process.

    ``torch._foreach_add_`` over ``n_tensors`` one-element tensors runs a C++
    loop that dispatches a few small aten ops per tensor - no Python between
    them, so the timing is not Python noise.  :meth:`plain` times it ``reps``
    times before the profiler starts, :meth:`profiled` ``reps`` times right
    after, inside a ``dpro::calibrate`` range.  The reader counts the events
    recorded inside that range (events per call) and computes
    ``(best profiled - best plain) / events per call`` - the minimum over
    repetitions being the undisturbed cost on a shared machine.  ~5 ms.
    """

    def __init__(self, n_tensors: int = 400, reps: int = 7) -> None:
        self.xs = [torch.zeros(1) for _ in range(n_tensors)]
        self.reps = reps
        self.plain_ns: list[int] = []
        self.profiled_ns: list[int] = []

    def _once(self) -> int:
        t0 = time.perf_counter_ns()
        torch._foreach_add_(self.xs, 1.0)
        return time.perf_counter_ns() - t0

    def plain(self) -> None:
        for _ in range(2):
            self._once()
        self.plain_ns = [self._once() for _ in range(self.reps)]

    def profiled(self, enter, exit_) -> None:
        self._once()  # the first profiled call pays one-time costs; outside the range
        h = enter(M.CALIBRATE)
        try:
            self.profiled_ns = [self._once() for _ in range(self.reps)]
        finally:
            exit_(h)

    def as_dict(self) -> dict[str, Any]:
        return {"marker": M.CALIBRATE, "calls": self.reps, "n_tensors": len(self.xs),
                "plain_ns": self.plain_ns, "profiled_ns": self.profiled_ns,
                "method": "torch._foreach_add_ over one-element tensors; per event = (min profiled - min plain) "
                          "/ events recorded per call inside the marker"}


# --------------------------------------------------------------------------- global patches

def patch_ddp() -> None:
    """Wrap ``DistributedDataParallel.__init__`` so that every DDP module is registered."""
    if _PATCHED["ddp"]:
        return
    from torch.nn.parallel import DistributedDataParallel as DDP
    orig = DDP.__init__

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        try:
            _DDPS.append(weakref.ref(self))
            if _ACTIVE is not None:
                _ACTIVE._add_ddp(self)
        except Exception as exc:  # never break the user's job
            _log(f"could not inspect DistributedDataParallel: {exc!r}")

    DDP.__init__ = __init__
    DDP._dpro_orig_init = orig
    _PATCHED["ddp"] = True


def patch_backward() -> None:
    """Wrap ``torch.autograd.backward`` (what ``Tensor.backward`` calls) with the backward marker."""
    if _PATCHED["backward"]:
        return
    orig = torch.autograd.backward

    @functools.wraps(orig)
    def backward(*args, **kwargs):
        rec = _ACTIVE
        if rec is None or not rec._marking:
            return orig(*args, **kwargs)
        handle = rec._enter(M.BACKWARD)
        try:
            return orig(*args, **kwargs)
        finally:
            rec._exit(handle)

    backward._dpro_orig = orig
    torch.autograd.backward = backward
    _PATCHED["backward"] = True


# --------------------------------------------------------------------------- the recorder

def layer_names(module: Any, names: list[str]) -> dict[str, str]:
    """Parameter name -> its layer: the unit activation checkpointing takes.

    The child of the outermost ``nn.Sequential`` / ``nn.ModuleList`` on the parameter's path
    (what ``torch.utils.checkpoint.checkpoint_sequential`` runs as one function), else its
    top-level submodule.  Read from the module tree while the job runs, recorded in
    ``meta.json`` (``ddp[].params[].layer``) and ``manifest.extra.layers``, so the memory model
    (``dpro_kit.optimize.memory``) need not infer layers from parameter names.

    Parameters
    ----------
    module : torch.nn.Module
        The DDP-wrapped module.
    names : list of str
        Its parameter names (``named_parameters``).
    """
    containers = {n for n, m in module.named_modules() if isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList))}
    out = {}
    for name in names:
        parts = name.split(".")
        out[name] = parts[0]
        for i in range(len(parts) - 2):   # a container's child is a module, not the parameter itself
            if ".".join(parts[: i + 1]) in containers:
                out[name] = ".".join(parts[: i + 2])
                break
    return out


class Recorder:
    """Profile iterations ``steps[0] .. steps[1]-1`` (0-based) of a training job.

    ``auto_step``: count iterations by ``optimizer.step()`` calls (True) or by
    :meth:`step` calls (False).  Default (None): decided by how you use it -
    ``with Recorder(...):`` around the loop counts optimizer steps; calling
    :meth:`step` at the end of every iteration counts those calls.  (The
    environment auto-enable counts optimizer steps.)  Iteration ``k`` is the
    interval between the ``k``-th and ``k+1``-th boundary; iteration 0 starts
    when the Recorder is created.

    DDP modules are found by the ``DistributedDataParallel.__init__`` patch
    (installed when a Recorder is created) or, for modules built before that,
    by a one-time search of live objects when the profiling window opens.
    ``model``: a non-DDP module whose forward should be marked as FW.
    """

    def __init__(self, out_dir: str | os.PathLike, steps: tuple[int, int] = (10, 15), *,
                 host: str | None = None, auto_step: bool | None = None, job: str | None = None,
                 activities: list | None = None, model: "torch.nn.Module | None" = None,
                 grad_ready: bool | None = None, calibrate: bool | None = None,
                 memory: bool | None = None, ring: bool | None = None, shapes: bool | None = None,
                 _from_env: bool = False) -> None:
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self and not _ACTIVE._closed:
            raise RuntimeError("a dpro Recorder is already active in this process "
                               f"(writing to {_ACTIVE.out_root}); close it first"
                               + (" or unset DPRO_OUT (the environment auto-enable created it)"
                                  if _ACTIVE.from_env else ""))
        self.out_root = Path(out_dir)
        self.start_step, self.stop_step = int(steps[0]), int(steps[1])
        if self.start_step < 0 or self.stop_step <= self.start_step:
            raise ValueError(f"steps must be (start, end) with 0 <= start < end, got {steps}")
        self.host = host or os.environ.get("DPRO_HOST") or socket.gethostname()
        self._job = job
        self.auto_step = auto_step
        self.from_env = _from_env
        self._activities = activities
        self.grad_ready = _env_flag("DPRO_GRAD_READY", True) if grad_ready is None else bool(grad_ready)
        self.calibrate = _env_flag("DPRO_CALIBRATE", True) if calibrate is None else bool(calibrate)
        # allocator events ([memory] in the Kineto trace): off by default, they add profiling overhead
        self.memory = _env_flag("DPRO_MEMORY", False) if memory is None else bool(memory)
        # per-chunk communication timestamps through a timed ring comm hook (dpro_torch.ringhook)
        self.ring = _env_flag("DPRO_RING", False) if ring is None else bool(ring)
        # one extra iteration after the window with record_shapes=True (kineto_shapes.json)
        self.shapes = _env_flag("DPRO_SHAPES", False) if shapes is None else bool(shapes)
        self._shape_prof = None
        self._shapes: dict[str, Any] | None = None   # {"trace_file", "step"} once written
        self._shapes_tried = False
        # time a few tiny allreduces when the window opens: the per-collective cost of this job's
        # process group (the comm model's latency; a 2-bucket trace cannot separate it from bandwidth)
        self.comm_calibrate = _env_flag("DPRO_COMM_CALIBRATE", True)
        # measure the hosts' clock offsets to rank 0 by ping-pong when the window opens (dpro_torch.clockprobe):
        # what aligns collective-level traces to tens of us where the collectives' ends cannot
        self.clock_probe = _env_flag("DPRO_CLOCK_PROBE", True)
        self._probe: dict[str, Any] | None = None
        self._comm_cal: dict[str, Any] | None = None
        self._ring_hooks: list[Any] = []
        # a Horovod rank: every rank writes a timeline into its node folder (patches/horovod's '%r')
        self._hvd_timeline = H.timeline_env(self.out_root, self.host) if H.is_horovod_rank() else None
        self._hvd: dict[str, Any] | None = None      # meta.json["horovod"] once its optimizer is found
        self._hvd_undo: list[Any] = []
        self._overhead: dict[str, Any] | None = None
        self._step = 0
        self._t_activated = time.time_ns()
        self._step_end_ns: list[int] = []
        # process CPU time and the cgroup's throttled time at each step end (meta.json steps[].cpu_us,
        # throttled_us): how much CPU the rank used and how long its CPU quota stopped it
        self._cpu_clock = CpuClock()
        self._cpu_at_activation = self._cpu_clock.read()
        self._step_cpu: list[tuple[int, int | None]] = []
        # the training thread's own CPU and run-queue wait at each step end (steps[].thread_cpu_us, thread_wait_us)
        self._sched_at_activation = thread_schedstat()
        self._step_sched: list[tuple[int, int, int] | None] = []
        self._profiled_steps: list[int] = []
        self._prof = None
        self._profiling = False
        self._done = False
        self._closed = False
        self._flushed_meta = False
        self._hooks: list[Any] = []
        self._opt_handles: list[Any] = []
        self._opt_stack: list[Any] = []
        self._opt_depth = 0          # optimizer steps in progress (nested: Horovod's wraps the user's)
        self._fw_stack: list[Any] = []
        self._ddps: list[dict[str, Any]] = []
        self._models = [weakref.ref(model)] if model is not None else []  # non-DDP modules to mark forward on
        self._clock: list[dict[str, Any]] = []
        self._trace_written: str | None = None
        self._ring_written: str | None = None
        self._optimizer: weakref.ref | None = None   # the (first) optimizer stepped inside the window
        self._optimizer_meta: dict[str, Any] | None = None  # its class and state size, taken at window end
        self._stop_reason = ""
        self._rank: int | None = None
        self._world: int | None = None
        self._backend = ""
        self._main_tid = threading.get_native_id()
        self._main_thread = threading.current_thread()
        self._lock = threading.RLock()
        self._export_s = 0.0
        self._cupti_teardown: str | None = None   # TEARDOWN_CUPTI as the CUDA window ended (None: no CUDA)
        _ACTIVE = self
        patch_ddp()
        patch_backward()
        for ref in list(_DDPS):
            m = ref()
            if m is not None:
                self._add_ddp(m)
        self._install_step_hooks()
        self._install_exit_handlers()
        if self.start_step == 0:
            # window starts now; a manual loop may still call rec.step() - either way iteration 0 is open
            self._start_profiler()

    # ---- public API ------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of one training iteration (manual counting)."""
        if self.auto_step is None:
            self.auto_step = False
        elif self.auto_step:
            raise RuntimeError("this Recorder counts iterations by optimizer.step(); do not call rec.step() "
                               "(create it with auto_step=False to count manually)")
        self._boundary()

    def __enter__(self) -> "Recorder":
        if self.auto_step is None:
            self.auto_step = True
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop profiling (if still running), write meta.json and remove every hook."""
        global _ACTIVE
        if self._closed:
            return
        self.flush("close")
        for h in self._opt_handles:
            h.remove()
        self._opt_handles.clear()
        self._closed = True
        if _ACTIVE is self:
            _ACTIVE = None

    @property
    def job(self) -> str:
        # resolved late: multiprocessing children get their sys.argv only after start-up
        return self._job or os.environ.get("DPRO_JOB") or Path(sys.argv[0] or "python").stem or "job"

    @property
    def node_dir(self) -> Path:
        return self.out_root / self.host / str(self.rank)

    @property
    def rank(self) -> int:
        if self._rank is None:
            self._resolve_identity()
        return int(self._rank)

    # ---- identity ----------------------------------------------------------------------

    def _resolve_identity(self) -> None:
        rank, world, backend = None, None, ""
        for info in self._ddps:
            rank, world, backend = info["rank"], info["world_size"], info["backend"]
            break
        if rank is None:
            try:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
            except Exception:
                pass
        if rank is None and H.identity() is not None:
            (rank, world), backend = H.identity(), "horovod"
        if rank is None:
            rank = int(os.environ.get("RANK", 0))
            world = int(os.environ.get("WORLD_SIZE", 1))
        self._rank, self._world, self._backend = int(rank), int(world), backend

    # ---- DDP bookkeeping ---------------------------------------------------------------

    def _add_ddp(self, ddp) -> None:
        if any(info["ref"]() is ddp for info in self._ddps):
            return
        import torch.distributed as dist
        pg = ddp.process_group
        ignore = getattr(ddp, "parameters_to_ignore", set())
        names, params = [], []
        for name, p in ddp.module.named_parameters():
            if p.requires_grad and name not in ignore:
                names.append(name)
                params.append(p)
        layer = layer_names(ddp.module, names)
        info = {
            "ref": weakref.ref(ddp),
            "index": len(self._ddps),
            "rank": dist.get_rank(pg), "world_size": dist.get_world_size(pg),
            "backend": str(dist.get_backend(pg)),
            "params": [{"index": i, "name": n, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                        "numel": int(p.numel()), "bytes": int(p.numel() * p.element_size()), "layer": layer[n]}
                       for i, (n, p) in enumerate(zip(names, params))],
            "param_refs": [weakref.ref(p) for p in params],
            "bucket_cap_bytes": int(getattr(ddp, "bucket_bytes_cap", 0)),
            # DDP built with bucket_cap_mb=None (its default: 1 MiB first bucket, then 25 MiB)
            "bucket_cap_default": bool(getattr(ddp, "bucket_bytes_cap_default", False)),
            "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", False)),
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "device": str(getattr(ddp, "device", "cpu")),
            "buckets_at_init": self._buckets(ddp, params),
        }
        self._ddps.append(info)
        if self.ring:
            self._install_ring(ddp, info)
        if self._profiling:
            self._hook_ddp(info)

    def _install_ring(self, ddp, info: dict[str, Any]) -> None:
        """Register the timed ring comm hook on the first DDP module (see dpro_torch.ringhook)."""
        if self._ring_hooks or info["world_size"] < 2:
            return
        from .ringhook import RingAllreduce
        try:
            hook = RingAllreduce(ddp.process_group, recording=lambda: self._profiling)
            ddp.register_comm_hook(None, hook.hook)
        except Exception as exc:  # e.g. the job registered its own hook: keep it
            _log(f"per-chunk ring timing not installed: {exc!r}")
            return
        self._ring_hooks.append(hook)
        info["comm_hook"] = "dpro_ring"

    @staticmethod
    def _buckets(ddp, params: list) -> list[dict[str, Any]] | None:
        """Bucket composition in the order DDP reduces the buckets (bucket 0 first)."""
        try:
            grad_buckets = ddp.reducer._get_zeros_like_grad_buckets()
        except Exception as exc:
            _log(f"cannot read the DDP bucket composition: {exc!r}")
            return None
        by_id = {id(p): i for i, p in enumerate(params)}
        by_ptr = {p.data_ptr(): i for i, p in enumerate(params)}
        out = []
        for gb in grad_buckets:
            idx = []
            for p in gb.parameters():
                i = by_id.get(id(p), by_ptr.get(p.data_ptr()))
                idx.append(-1 if i is None else i)
            buf = gb.buffer()
            out.append({"index": int(gb.index()), "params": idx,
                        "bytes": int(sum(p.numel() * p.element_size() for p in gb.parameters())),
                        "buffer_bytes": int(buf.numel() * buf.element_size())})
        out.sort(key=lambda b: b["index"])
        return out

    # ---- markers -------------------------------------------------------------------------

    @staticmethod
    def _enter(name: str):
        if _FAST_RF is not None:  # ~0.5 us instead of ~12 us through the dispatcher (torch >= 2.2)
            rf = _FAST_RF(name)
            rf.__enter__()
            return rf
        return torch.ops.profiler._record_function_enter_new(name, None)

    @staticmethod
    def _exit(handle) -> None:
        if _FAST_RF is not None and isinstance(handle, _FAST_RF):
            handle.__exit__(None, None, None)
        else:
            torch.ops.profiler._record_function_exit._RecordFunction(handle)

    def _marker(self, name: str) -> None:
        self._exit(self._enter(name))

    # ---- hooks -----------------------------------------------------------------------------

    def _install_step_hooks(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self._opt_handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._opt_handles.append(register_optimizer_step_post_hook(self._opt_post))

    @property
    def _marking(self) -> bool:
        """Phase markers are emitted: the window or the shapes iteration is being recorded."""
        return self._profiling or self._shape_prof is not None

    def _opt_pre(self, opt, args, kwargs) -> None:
        # nested steps (Horovod's DistributedOptimizer.step calls the wrapped optimizer's step):
        # only the outermost one is a phase and an iteration boundary
        self._opt_depth += 1
        if self._opt_depth == 1 and self._marking and threading.current_thread() is self._main_thread:
            self._opt_stack.append(self._enter(M.OPTIMIZER))

    def _opt_post(self, opt, args, kwargs) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth:
            return
        if self._opt_stack:
            self._exit(self._opt_stack.pop())
        if self._profiling and self._optimizer is None:
            self._optimizer = weakref.ref(opt)
        if self.auto_step:  # None (not decided yet: no `with`, no rec.step()) counts nothing
            self._boundary()

    def _install_phase_hooks(self) -> None:
        for info in self._ddps:
            self._hook_ddp(info)
        if not self._ddps and self._hvd_timeline is not None:
            try:
                self._hook_horovod()
            except Exception as exc:  # never break the user's job
                _log(f"could not inspect the Horovod optimizer: {exc!r}")
        ddp_modules = {id(info["ref"]()) for info in self._ddps} | {id(getattr(info["ref"](), "module", None))
                                                                   for info in self._ddps}
        for ref in self._models:
            m = ref()
            if m is not None and id(m) not in ddp_modules:
                self._hooks.append(m.register_forward_pre_hook(self._fw_pre))
                self._hooks.append(m.register_forward_hook(self._fw_post, always_call=True))

    def _hook_horovod(self) -> None:
        """A Horovod rank without DDP: grad-ready markers on the DistributedOptimizer's parameters,
        ``dpro::comm_wait`` around its synchronize(), forward markers on the model that owns them."""
        opts = H.find_optimizers()
        if not opts:
            return
        opt = opts[0]
        self._hvd = H.describe(opt, self._hvd_timeline)
        params = [p for _n, p in H.params_of(opt)]
        if self.grad_ready:
            for i, p in enumerate(params):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    functools.partial(self._grad_ready, f"{M.GRAD_READY}{i}")))
        self._hvd_undo.append(H.wrap_synchronize(opt, self._enter, self._exit, lambda: self._marking, M.COMM_WAIT))
        if not self._models:  # the module whose parameters are exactly the optimizer's: its forward is FW
            model = H.find_model(params)
            if model is not None:
                self._models.append(weakref.ref(model))

    def _hook_ddp(self, info: dict[str, Any]) -> None:
        ddp = info["ref"]()
        if ddp is None:
            return
        self._hooks.append(ddp.register_forward_pre_hook(self._fw_pre))
        self._hooks.append(ddp.register_forward_hook(self._fw_post, always_call=True))
        if info["index"] != 0 or not self.grad_ready:
            return  # grad-ready markers (optional) for the first DDP module only
        for i, ref in enumerate(info["param_refs"]):
            p = ref()
            if p is not None:
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    functools.partial(self._grad_ready, f"{M.GRAD_READY}{i}")))

    def _remove_phase_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for undo in self._hvd_undo:
            undo()
        self._hvd_undo.clear()
        while self._fw_stack:
            self._exit(self._fw_stack.pop())
        while self._opt_stack:
            self._exit(self._opt_stack.pop())

    def _fw_pre(self, module, args) -> None:
        self._fw_stack.append(self._enter(M.FORWARD))

    def _fw_post(self, module, args, output) -> None:
        if self._fw_stack:
            self._exit(self._fw_stack.pop())

    def _grad_ready(self, name: str, param) -> None:
        self._marker(name)

    # ---- iteration boundaries and the profiler ----------------------------------------

    def _boundary(self, now: int | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            now = now or time.time_ns()
            k = self._step
            if len(self._step_end_ns) < MAX_STEP_RECORDS:
                self._step_end_ns.append(now)
                self._step_cpu.append(self._cpu_clock.read())
                self._step_sched.append(thread_schedstat())
            if self._profiling:
                self._marker(M.STEP_END)
                self._profiled_steps.append(k)
                if k + 1 >= self.stop_step:
                    self._stop_profiler("window complete")
            elif self._shape_prof is not None:
                self._marker(M.STEP_END)
                self._stop_shapes(k)
            self._step += 1
            if not self._profiling and not self._done and self._step == self.start_step:
                self._start_profiler()
            elif self._done and self.shapes and not self._shapes_tried and self._stop_reason == "window complete":
                self._start_shapes()

    def _find_ddps(self) -> None:
        """DDP modules built before the DDP patch was installed (searched once, when a window opens)."""
        import gc
        from torch.nn.parallel import DistributedDataParallel as DDP
        for obj in gc.get_objects():
            if isinstance(obj, DDP):
                self._add_ddp(obj)

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        if not self._ddps:
            try:
                self._find_ddps()
            except Exception as exc:
                _log(f"could not look for DDP modules: {exc!r}")
        self._resolve_identity()
        self._meta_run_id()  # agree on the run id now, while every rank's process group is alive
        # the training thread: the one that ends iterations (normally the one that created the Recorder)
        self._main_tid = threading.get_native_id()
        self._main_thread = threading.current_thread()
        acts = self._activities
        if acts is None:
            acts = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and any(i["device"].startswith("cuda") for i in self._ddps):
                acts.append(ProfilerActivity.CUDA)
        for info in self._ddps:
            info["buckets_at_start"] = self._buckets(info["ref"](), [r() for r in info["param_refs"]]) \
                if info["ref"]() is not None else None
        if self.comm_calibrate:
            try:
                self._comm_cal = self._time_tiny_allreduce()
            except Exception as exc:  # never break the user's job
                _log(f"communication calibration failed: {exc!r}")
        if self.clock_probe:
            self._probe = self._run_clock_probe()
        cal = None
        if self.calibrate:
            try:
                cal = _Calibration()
                cal.plain()
            except Exception as exc:  # never break the user's job
                _log(f"profiler calibration failed: {exc!r}")
                cal = None
        if any(a == ProfilerActivity.CUDA for a in acts):
            # Kineto detaches CUPTI when the window's session ends (cuptiFinalize) only with
            # TEARDOWN_CUPTI=1; left attached, CUPTI keeps slowing every later kernel launch
            # (pytorch/pytorch#144455: 10-20 % on launch-bound jobs) - outside the window. A value
            # the job set wins (torch itself sets 0 for inductor CUDA graphs before CUDA 12.6).
            os.environ.setdefault("TEARDOWN_CUPTI", "1")
            self._cupti_teardown = os.environ.get("TEARDOWN_CUPTI")
        self._prof = profile(activities=acts, record_shapes=False, with_stack=False, profile_memory=self.memory,
                             with_flops=False, with_modules=False)
        self._prof.start()
        self._profiling = True
        if cal is not None:
            try:
                cal.profiled(self._enter, self._exit)
                self._overhead = cal.as_dict()
            except Exception as exc:
                _log(f"profiler calibration failed: {exc!r}")
        self._install_phase_hooks()
        for k in range(3):  # the first call can be slow; the reader uses the tightest bracket
            t0, m0 = time.time_ns(), time.monotonic_ns()
            self._marker(M.CLOCK_SYNC)
            t1, m1 = time.time_ns(), time.monotonic_ns()
            self._clock.append({"marker": M.CLOCK_SYNC, "occurrence": k, "time_ns_before": t0,
                                "time_ns_after": t1, "monotonic_ns_before": m0, "monotonic_ns_after": m1})

    def _start_shapes(self) -> None:
        """Profile the next iteration with record_shapes=True (never a timed one: it costs more per op)."""
        from torch.profiler import ProfilerActivity, profile
        self._shapes_tried = True
        try:
            self._shape_prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=False,
                                       profile_memory=False, with_flops=False, with_modules=False)
            self._shape_prof.start()
        except Exception as exc:  # never break the user's job
            _log(f"could not start the shapes profiler: {exc!r}")
            self._shape_prof = None
            return
        self._install_phase_hooks()

    def _stop_shapes(self, step: int | None) -> None:
        """End the shapes iteration ``step`` and export it; ``None``: it did not finish, discard it."""
        prof, self._shape_prof = self._shape_prof, None
        self._remove_phase_hooks()
        try:
            prof.stop()
            if step is None:
                return
            out = self.node_dir / SHAPES_FILE
            tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.json")
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, out)
            self._shapes = {"trace_file": out.name, "step": step}
        except Exception as exc:
            _log(f"could not write the shapes trace: {exc!r}")
        finally:
            del prof
            gc.collect()  # as in _stop_profiler
        self._write_meta()

    def _time_tiny_allreduce(self, reps: int = 20, skip: int = 3) -> dict[str, Any] | None:
        """Wall time of ``reps`` allreduces of one element on the first DDP module's process group.

        Every rank opens its window at the same step boundary, so every rank makes the same
        calls.  The first ``skip`` also absorb the ranks' arrival skew and are not used.
        """
        if not self._ddps or self._ddps[0]["world_size"] < 2:
            return None
        ddp = self._ddps[0]["ref"]()
        if ddp is None:
            return None
        import torch.distributed as dist
        dev = torch.device(self._ddps[0]["device"]) if self._ddps[0]["device"].startswith("cuda") else None
        t = torch.zeros(1, device=dev)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            dist.all_reduce(t, group=ddp.process_group)
            if dev is not None:
                torch.cuda.synchronize(dev)
            times.append((time.perf_counter_ns() - t0) / 1e3)
        used = times[skip:]
        return {"op": "allreduce", "bytes": int(t.element_size()), "world_size": self._ddps[0]["world_size"],
                "times_us": [round(x, 1) for x in times], "skipped": skip,
                "median_us": round(statistics.median(used), 1), "min_us": round(min(used), 1)}

    def _run_clock_probe(self) -> dict[str, Any] | None:
        """Clock offsets to rank 0, measured by ping-pong on the first DDP module's process group
        (:mod:`dpro_torch.clockprobe`); None for one host or no DDP module."""
        if not self._ddps or self._ddps[0]["world_size"] < 2:
            return None
        ddp = self._ddps[0]["ref"]()
        if ddp is None:
            return None
        from .clockprobe import probe
        dev = torch.device(self._ddps[0]["device"]) if self._ddps[0]["device"].startswith("cuda") else None
        try:
            return probe(ddp.process_group, self.host, device=dev)
        except Exception as exc:  # never break the user's job
            _log(f"clock probe failed: {exc!r}")
            return None

    def _stop_profiler(self, reason: str) -> None:
        if not self._profiling:
            return
        self._profiling = False
        self._done = True
        self._stop_reason = reason
        self._remove_phase_hooks()
        t0 = time.perf_counter()
        try:
            if self._cupti_teardown is not None:
                self._cupti_teardown = os.environ.get("TEARDOWN_CUPTI")   # what Kineto reads at stop
            self._prof.stop()
            out = self.node_dir / TRACE_FILE
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.json")
            self._prof.export_chrome_trace(str(tmp))
            os.replace(tmp, out)
            self._trace_written = out.name
        except Exception as exc:
            _log(f"could not write the Kineto trace: {exc!r}")
        for info in self._ddps:
            ddp = info["ref"]()
            info["buckets_at_stop"] = self._buckets(ddp, [r() for r in info["param_refs"]]) if ddp else None
        self._optimizer_meta = self._optimizer_info()   # the optimizer may be gone when the process exits
        for hook in self._ring_hooks:
            try:
                from .ringhook import FILE
                _atomic_write(self.node_dir / FILE, json.dumps(hook.take()))
                self._ring_written = FILE
            except Exception as exc:
                _log(f"could not write the ring records: {exc!r}")
        self._prof = None
        # free the profiler's results now (they sit in reference cycles): left to the interpreter's
        # final garbage collection, Kineto's ~MemoryTraceLogger can crash the process at exit
        # (seen with torch 2.13 whenever a second profiler session had run: SIGSEGV after the job's
        # work was done); this iteration's interval is excluded from the measured summary anyway
        gc.collect()
        self._export_s = time.perf_counter() - t0
        self._write_meta()

    # ---- output ----------------------------------------------------------------------------

    def _step_records(self) -> list[dict[str, Any]]:
        profiled = set(self._profiled_steps)
        recs, prev, (pcpu, pthr) = [], self._t_activated, self._cpu_at_activation
        psched = self._sched_at_activation
        for k, end in enumerate(self._step_end_ns):
            rec = {"step": k, "end_time_ns": end, "dur_us": (end - prev) / 1e3, "profiled": k in profiled}
            if k < len(self._step_cpu):
                cpu, thr = self._step_cpu[k]
                rec["cpu_us"] = round((cpu - pcpu) / 1e3, 1)
                if thr is not None and pthr is not None:
                    rec["throttled_us"] = round(max(0, thr - pthr) / 1e3, 1)
                pcpu, pthr = cpu, thr
            if k < len(self._step_sched):
                cur = self._step_sched[k]
                # the same thread at both ends of the step (the first step may start in another thread)
                if cur is not None and psched is not None and cur[0] == psched[0]:
                    rec["thread_cpu_us"] = round((cur[1] - psched[1]) / 1e3, 1)
                    rec["thread_wait_us"] = round((cur[2] - psched[2]) / 1e3, 1)
                psched = cur
            recs.append(rec)
            prev = end
        return recs

    def _summary(self, recs: list[dict[str, Any]]) -> dict[str, Any]:
        """Median wall time of the unprofiled iterations (the job's undisturbed speed)."""
        skip = min(self.start_step, 5)  # first iterations: allocator warm-up, DDP bucket rebuild
        after_stop = self.stop_step      # its interval holds the trace export
        # --shapes: the iteration after the window is recorded with shapes, the next one holds its export
        excluded = {after_stop, after_stop + 1} if self.shapes else {after_stop}
        used = [r for r in recs if not r["profiled"] and r["step"] >= max(skip, 1) and r["step"] not in excluded]
        prof = [r["dur_us"] for r in recs if r["profiled"]]
        cpus = [r["cpu_us"] / r["dur_us"] for r in used if "cpu_us" in r and r["dur_us"] > 0]
        thr = [r["throttled_us"] for r in used if "throttled_us" in r]
        tcpu = [r["thread_cpu_us"] / r["dur_us"] for r in used if "thread_cpu_us" in r and r["dur_us"] > 0]
        twait = [r["thread_wait_us"] / r["dur_us"] for r in used if "thread_wait_us" in r and r["dur_us"] > 0]
        return {
            # CPUs the process used over an unprofiled step (all its threads), and how long per step its
            # cgroup's CPU quota stopped it (absent: not readable here)
            **({"median_cpus": round(statistics.median(cpus), 4)} if cpus else {}),
            # the training thread alone: the part of an unprofiled step it ran, and waited for its core
            **({"median_thread_cpus": round(statistics.median(tcpu), 4)} if tcpu else {}),
            **({"median_thread_wait": round(statistics.median(twait), 4)} if twait else {}),
            **({"median_throttled_us": statistics.median(thr)} if thr else {}),
            # the mean too: a quota stops a rank in some steps only (Horovod at 1 CPU: 1-11 of 14 steps),
            # where the median says 0 (docs/horovod.md, "Accuracy")
            **({"mean_throttled_us": round(statistics.fmean(thr), 1)} if thr else {}),
            "median_unprofiled_us": statistics.median([r["dur_us"] for r in used]) if used else None,
            "unprofiled_steps_used": [r["step"] for r in used],
            "median_profiled_us": statistics.median(prof) if prof else None,
            "rule": (f"steps >= {max(skip, 1)} that were not profiled, excluding step(s) "
                     f"{', '.join(map(str, sorted(excluded)))} (trace export; --shapes iteration)"),
        }

    def _meta(self) -> dict[str, Any]:
        recs = self._step_records()
        ddps = []
        for info in self._ddps:
            d = {k: v for k, v in info.items() if k not in ("ref", "param_refs")}
            d["buckets"] = info.get("buckets_at_stop") or info.get("buckets_at_start") or info["buckets_at_init"]
            ddps.append(d)
        return {
            "format": M.META_FORMAT, "version": M.META_VERSION,
            "job": self.job, "rank": self.rank, "world_size": self._world or 1, "host": self.host,
            "backend": self._backend, "pid": os.getpid(), "main_tid": self._main_tid,
            "torch_version": torch.__version__, "collector": "dpro_torch",
            "run_id": self._meta_run_id(),
            "argv": list(sys.argv),
            "trace_file": self._trace_written,
            "ring_file": self._ring_written,
            "shapes": self._shapes,
            "window": {"start_step": self.start_step, "stop_step": self.stop_step,
                       "profiled_steps": list(self._profiled_steps), "stop_reason": self._stop_reason,
                       "export_seconds": round(self._export_s, 4),
                       "counting": "optimizer.step" if self.auto_step else "Recorder.step"},
            "markers": M.as_dict(),
            "clock": {"kineto": "trace 'ts' in us + baseTimeNanoseconds/1000 = us since the Unix epoch",
                      "sync": self._clock},
            "ddp": ddps,
            "steps": recs,
            "measured": self._summary(recs),
            "threads": torch.get_num_threads(),
            "cpu": cpu_placement(),
            **({"gpu": gpu} if (gpu := gpu_placement()) else {}),
            "profiler_overhead": self._overhead,
            "cupti_teardown": self._cupti_teardown,
            "grad_ready_markers": self.grad_ready,
            "optimizer": self._optimizer_meta or self._optimizer_info(),
            "comm_calibration": self._comm_cal,
            "clock_probe": self._probe,
            "horovod": self._hvd,
        }

    def _optimizer_info(self) -> dict[str, Any] | None:
        """Class and state size of the optimizer stepped in the window (the memory model's optimizer state)."""
        opt = self._optimizer() if self._optimizer is not None else None
        if opt is None:
            return None
        try:
            nbytes = sum(int(t.numel() * t.element_size()) for st in opt.state.values() for t in st.values()
                         if isinstance(t, torch.Tensor))
        except Exception as exc:  # an optimizer with unusual state: leave the field out
            _log(f"cannot size the optimizer state: {exc!r}")
            return None
        return {"class": type(opt).__name__, "state_bytes": nbytes}

    def _write_meta(self) -> None:
        if not self._step_end_ns and not self._profiled_steps and not self._ddps:
            return  # nothing happened in this process (e.g. the launcher)
        try:
            _atomic_write(self.node_dir / "meta.json", json.dumps(self._meta(), indent=1))
            self._flushed_meta = True
        except Exception as exc:
            _log(f"could not write meta.json: {exc!r}")

    def flush(self, reason: str = "exit") -> None:
        """Close an open window (exporting what was recorded) and rewrite meta.json."""
        with self._lock:
            if self._closed:
                return
            if self._shape_prof is not None:  # the shapes iteration did not finish: nothing to keep
                self._stop_shapes(None)
            if self._profiling:
                self._stop_profiler(reason)
            else:
                self._write_meta()
            if self._flushed_meta:
                try:
                    from .manifest import try_write_manifest
                    try_write_manifest(self.out_root, run_id=self._meta_run_id())
                except Exception as exc:
                    _log(f"could not write manifest.json: {exc!r}")

    def _meta_run_id(self) -> str:
        """The run id all ranks of this job share (cached after the first call).

        Each ``dpro profile`` launcher draws its own ``DPRO_RUN_ID``, so on a multi-host job the
        hosts' ids differ. The ranks agree through the job's own rendezvous: rank 0 publishes its
        id in the default process group's c10d store (Horovod ranks: in the gloo rendezvous
        store, :func:`dpro_torch.hvd.agree_run_id`), the others read it (60 s at most, then
        they keep their own id and say so). No variable for the user to set.
        """
        rid = getattr(self, "_agreed_run_id", None)
        if rid:
            return rid
        rid = os.environ.get("DPRO_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID") \
            or f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
        try:
            import datetime as _dt
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()) and H.is_horovod_rank():
                rid = H.agree_run_id(rid) or rid     # Horovod: through its gloo rendezvous store
            elif dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                store = dist.distributed_c10d._get_default_store()
                key = "dpro_torch/run_id"
                if dist.get_rank() == 0:
                    store.set(key, rid)
                else:
                    store.wait([key], _dt.timedelta(seconds=60))
                    rid = store.get(key).decode()
        except Exception as exc:  # never break the user's job over a label
            _log(f"could not agree on a run id through the c10d store ({exc!r}); using {rid}")
        self._agreed_run_id = rid
        return rid

    # ---- exit handling -----------------------------------------------------------------

    def _install_exit_handlers(self) -> None:
        ref = weakref.ref(self)

        def at_exit():
            rec = ref()
            if rec is not None and not rec._closed:
                rec.flush("exit")

        atexit.register(at_exit)
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            prev = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return

        def on_term(signum, frame):
            rec = ref()
            if rec is not None and not rec._closed:
                try:
                    rec.flush("SIGTERM")
                except Exception as exc:
                    _log(f"flush on SIGTERM failed: {exc!r}")
            if callable(prev):
                prev(signum, frame)
            elif prev == signal.SIG_IGN:
                return
            else:  # SIG_DFL (or unknown): die as the default action would
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):
            pass
