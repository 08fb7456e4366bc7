"""Horovod + PyTorch jobs: what the Recorder adds when the process is a Horovod rank.

A process is a Horovod rank when ``HOROVOD_RANK`` is in its environment (``horovodrun`` and
Horovod's gloo rendezvous set it before the script starts).  Then:

* :func:`timeline_env` (called when the Recorder is created, before the script's
  ``hvd.init()``) points ``HOROVOD_TIMELINE`` at ``<out>/<host>/%r/horovod_timeline.json``.
  The ``%r`` is the project's Horovod patch (``patches/horovod``): every rank writes its own
  timeline (stock Horovod: rank 0 only).  A ``HOROVOD_TIMELINE`` the user set is kept.
* :func:`find_optimizers` finds ``hvd.DistributedOptimizer`` instances when the profiling
  window opens; :func:`describe` lists their parameters (index, name, Horovod tensor name
  ``allreduce.<name>``, bytes) for ``meta.json["horovod"]``, with the Horovod settings of
  the environment (fusion threshold, cycle time, autotune);
* :func:`wrap_synchronize` puts a ``dpro::comm_wait`` range around the optimizer's
  ``synchronize()`` while the window is open: the training thread blocks there for the
  allreduces, and the reader must not charge that wait to the next op.

Standard library and torch only; Horovod itself is never imported here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["agree_run_id", "is_horovod_rank", "timeline_env", "find_optimizers", "describe", "wrap_synchronize",
           "TIMELINE_FILE", "SETTINGS"]

TIMELINE_FILE = "horovod_timeline.json"
#: the environment variables that set what dpro's Horovod model needs to know
SETTINGS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE", "HOROVOD_CACHE_CAPACITY",
            "HOROVOD_TIMELINE", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER")


def is_horovod_rank() -> bool:
    """Whether this process was started as a Horovod rank (``HOROVOD_RANK`` set)."""
    return os.environ.get("HOROVOD_RANK", "") != ""


def identity() -> tuple[int, int] | None:
    """(rank, size) from Horovod's launch environment, or None."""
    try:
        return int(os.environ["HOROVOD_RANK"]), int(os.environ.get("HOROVOD_SIZE", "1"))
    except (KeyError, ValueError):
        return None


def agree_run_id(run_id: str, *, timeout_s: float = 60.0) -> str | None:
    """The run id of Horovod rank 0, agreed through the job's gloo rendezvous KV store; None without one.

    The Horovod counterpart of the c10d store agreement of ``Recorder._meta_run_id``: every
    host's ``dpro profile`` draws its own ``DPRO_RUN_ID``; rank 0 PUTs its id into the HTTP
    key-value store that ``horovodrun`` (or ``dpro_torch.hvd_launch``) runs for the job's gloo
    rendezvous (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``), the other ranks GET it (polling, at
    most ``timeout_s``).  Jobs without that store (MPI / NCCL controllers) return None.

    Parameters
    ----------
    run_id : str
        This rank's own id (rank 0's becomes the job's).
    timeout_s : float
        How long a rank other than 0 waits for rank 0's id.
    """
    import time
    import urllib.error
    import urllib.request
    addr, port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    ident = identity()
    if not addr or not port or ident is None or ident[1] < 2:
        return None
    url = f"http://{addr}:{port}/dpro_torch/run_id"
    if ident[0] == 0:
        req = urllib.request.Request(url, data=run_id.encode(), method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass
        return run_id
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as exc:   # 404 until rank 0 has put it
            if exc.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def timeline_env(out_root: Path, host: str) -> str | None:
    """Point ``HOROVOD_TIMELINE`` at this rank's node folder (unless the user set it); returns the path.

    Parameters
    ----------
    out_root : Path
        The trace directory (``DPRO_OUT``).
    host : str
        The host name of the directory layout (``<out>/<host>/<rank>``).
    """
    ident = identity()
    if ident is None:
        return None
    if os.environ.get("HOROVOD_TIMELINE"):
        return os.environ["HOROVOD_TIMELINE"]
    node_dir = Path(out_root) / host / str(ident[0])
    node_dir.mkdir(parents=True, exist_ok=True)   # Horovod opens the file, it does not create folders
    os.environ["HOROVOD_TIMELINE"] = str(Path(out_root) / host / "%r" / TIMELINE_FILE)
    return os.environ["HOROVOD_TIMELINE"]


def _is_hvd_optimizer(obj: Any) -> bool:
    return hasattr(obj, "_parameter_names") and hasattr(obj, "synchronize") and hasattr(obj, "_handles") \
        and type(obj).__module__.startswith(("horovod.", "torch.optim"))


def find_optimizers() -> list[Any]:
    """The ``hvd.DistributedOptimizer`` instances alive in this process (a one-time search of live objects)."""
    import gc
    import warnings
    import torch
    with warnings.catch_warnings():   # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer) and _is_hvd_optimizer(o)]


def find_model(params: list[Any]) -> Any:
    """The module whose parameters are exactly ``params`` (the model the optimizer trains), or None."""
    import gc
    import warnings
    import torch
    want = {id(p) for p in params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.nn.Module) and {id(p) for p in obj.parameters()} == want:
                return obj
    return None


def params_of(opt: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of a Horovod optimizer, in its param-group order (Horovod's own names)."""
    names = getattr(opt, "_parameter_names", {}) or {}
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                out.append((str(names.get(p, f"noname.{len(out)}")), p))
    return out


def describe(opt: Any, timeline: str | None) -> dict[str, Any]:
    """``meta.json["horovod"]``: the optimizer's parameters and the Horovod settings of the environment."""
    ident = identity() or (0, 1)
    return {
        "rank": ident[0], "size": ident[1],
        "local_rank": int(os.environ.get("HOROVOD_LOCAL_RANK", "0") or 0),
        "timeline": timeline, "timeline_file": TIMELINE_FILE,
        "env": {k: os.environ[k] for k in SETTINGS if k in os.environ},
        "params": [{"index": i, "name": n, "tensor": f"allreduce.{n}", "shape": list(p.shape),
                    "dtype": str(p.dtype).replace("torch.", ""), "bytes": int(p.numel() * p.element_size())}
                   for i, (n, p) in enumerate(params_of(opt))],
    }


def wrap_synchronize(opt: Any, enter: Callable[[str], Any], exit_: Callable[[Any], None],
                     active: Callable[[], bool], marker: str) -> Callable[[], None]:
    """Put a ``marker`` range around ``opt.synchronize()`` while ``active()``; returns the undo function."""
    orig = opt.synchronize

    def synchronize(*args, **kwargs):
        if not active():
            return orig(*args, **kwargs)
        h = enter(marker)
        try:
            return orig(*args, **kwargs)
        finally:
            exit_(h)

    opt.synchronize = synchronize

    def undo() -> None:
        if opt.__dict__.get("synchronize") is synchronize:
            del opt.synchronize
    return undo
