"""Count steps of a TensorFlow job and record the profiled ones (imports TensorFlow).

Files written per task, in ``DPRO_OUT/<host>/<task>/`` (``task`` = ``worker0``, ``ps0``,
``chief0`` from ``TF_CONFIG``, else ``worker0``):

* ``tf_ops.json``   op executions of the window, converted from the profiler's XSpace
  (:mod:`dpro_tf.xplane`) inside this process, where TensorFlow (and its protobuf) is present;
* ``tf_graph.json`` the step function's traced graph: every op with its data and control
  inputs, output bytes, device, and the keys of collective ops (:mod:`dpro_tf.graph`);
* ``meta.json``     written last: task, cluster, window, clock readings, measured step times.

The raw ``*.xplane.pb`` stays under ``xplane/`` (what TensorBoard's profile plugin reads).
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dpro_collect.files import atomic_write_text
from dpro_collect.schema import TF_META_FORMAT, TF_META_VERSION

#: op types that write a variable: the function that runs one is the training step
UPDATE_TYPES = frozenset({"AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp",
                          "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate"})


def _writes_variables(op_type: str) -> bool:
    return op_type in UPDATE_TYPES or op_type.startswith("ResourceApply") \
        or op_type.startswith("ResourceSparseApply")


def _fn_name(fn) -> str:
    return str(getattr(fn, "__name__", None) or getattr(fn, "_name", None) or type(fn).__name__)


def task_of_env() -> tuple[str, int, dict[str, Any]]:
    """``(task type, index, cluster spec)`` from ``TF_CONFIG`` (``("worker", 0, {})`` without it)."""
    try:
        cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        cfg = {}
    task = cfg.get("task") or {}
    return str(task.get("type") or "worker"), int(task.get("index") or 0), dict(cfg.get("cluster") or {})


class Recorder:
    """Counts steps (top-level calls of the variable-updating ``tf.function``) and profiles a window.

    Parameters
    ----------
    out : str
        Trace directory.
    steps : (int, int)
        Profile steps ``start .. end-1`` (step 0 is the first call, which traces the function).
    host : str, optional
        Host name for the folder layout (default: the machine's host name).
    """

    def __init__(self, out: str, steps: tuple[int, int], host: str | None = None):
        self.out = Path(out)
        self.start, self.end = steps
        self.host = host or socket.gethostname()
        self.task_type, self.task_index, self.cluster = task_of_env()
        self.task = f"{self.task_type}{self.task_index}"
        self.dir = self.out / self.host / self.task
        self.step_fn = None
        self.count = 0
        self.durations_ns: list[int] = []
        self.window_ns: list[tuple[int, int]] = []   # (wall start, wall end) of each profiled step
        self.clock: dict[str, Any] = {}
        self.profiling = False
        self.done = False
        self._lock = threading.Lock()
        self.quiet = os.environ.get("DPRO_QUIET") == "1"

    def run_id(self) -> str:
        """The id the tasks of one job share: with a multi-task ``TF_CONFIG`` it is derived from the
        cluster spec, which every task gets identical (one ``dpro profile`` per host, each with its own
        ``DPRO_RUN_ID``, still agree); else ``DPRO_RUN_ID``."""
        tasks = sum(len(v) for v in self.cluster.values() if isinstance(v, list))
        if tasks > 1:
            import hashlib
            return "tf-" + hashlib.sha1(json.dumps(self.cluster, sort_keys=True).encode()).hexdigest()[:10]
        return os.environ.get("DPRO_RUN_ID", "")

    # -- wiring -------------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap ``Function.__call__`` (the Python object ``@tf.function`` returns); in the coordinator
        of a ParameterServerStrategy job (the ``chief`` of a cluster with ``ps`` tasks) install
        :class:`dpro_tf.ps.CoordinatorRecorder` instead."""
        self.coordinator = None
        if self.cluster.get("ps") and self.task_type == "chief":
            from .ps import CoordinatorRecorder
            self.coordinator = CoordinatorRecorder(str(self.out), (self.start, self.end), self.host, self.task,
                                                   self.cluster, self.run_id(), self.log)
            self.coordinator.install()
            return
        from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf
        orig = pf.Function.__call__
        rec = self

        def __call__(fn, *args, **kwargs):
            return rec.call(fn, orig, args, kwargs)

        __call__.__wrapped__ = orig
        pf.Function.__call__ = __call__
        import atexit
        atexit.register(self._explain_nothing_written)

    def _explain_nothing_written(self) -> None:
        """At exit: say in one line why this task wrote no trace (never silent)."""
        if self.done:
            return
        if self.step_fn is None and self.cluster.get("ps") and self.task_type in ("ps", "worker"):
            self.log("no trace written here: a ParameterServerStrategy server task is traced by the coordinator "
                     "(the chief under dpro profile, through the server's profiler service)")
        elif self.step_fn is None:
            self.log("no trace written: no top-level @tf.function that updates variables ran in this process "
                     "(an eager training loop?; docs/tensorflow.md)")
        elif not self.done:
            self.log(f"no trace written: the job ran {self.count} step(s), the window {self.start}:{self.end} "
                     f"needs {self.end}; profile earlier steps with --steps")

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[dpro_tf] {self.task}: {msg}", file=sys.stderr, flush=True)

    # -- the step counter ---------------------------------------------------------------------
    def call(self, fn, orig, args, kwargs):
        from tensorflow.python.eager import context
        if self.done or not context.executing_eagerly() or (self.step_fn is not None and fn is not self.step_fn) \
                or threading.current_thread() is not threading.main_thread():
            return orig(fn, *args, **kwargs)
        i = self.count
        if self.step_fn is not None and i == self.start:
            self._start_profiler()
        t0 = time.time_ns()
        if self.profiling:
            import tensorflow as tf
            with tf.profiler.experimental.Trace("dpro_step", step_num=i, _r=1):
                result = orig(fn, *args, **kwargs)
        else:
            result = orig(fn, *args, **kwargs)
        t1 = time.time_ns()
        if self.step_fn is None:
            if not self._is_step_function(fn):
                return result
            self.step_fn = fn
            self.log(f"step function: {_fn_name(fn)!r}; profiling steps {self.start}..{self.end - 1}")
        if self.profiling:
            self.window_ns.append((t0, t1))
        else:
            self.durations_ns.append(t1 - t0)
        self.count += 1
        if self.profiling and self.count >= self.end:
            self._finish()
        return result

    @staticmethod
    def _is_step_function(fn) -> bool:
        try:
            cfs = fn._list_all_concrete_functions()
        except Exception:
            return False
        from .graph import function_ops
        for cf in cfs:
            for _prefix, op in function_ops(cf.graph):
                if _writes_variables(op.type):
                    return True
        return False

    # -- the window -------------------------------------------------------------------------
    def _start_profiler(self) -> None:
        import tensorflow as tf
        self.dir.mkdir(parents=True, exist_ok=True)
        before = time.time_ns()
        opts = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                        device_tracer_level=1)
        tf.profiler.experimental.start(str(self.dir / "xplane"), options=opts)
        after = time.time_ns()
        self.clock = {"profiler_start": {"time_ns_before": before, "time_ns_after": after,
                                         "monotonic_ns": time.monotonic_ns()}}
        self.profiling = True

    def _finish(self) -> None:
        import tensorflow as tf
        self.profiling = False
        self.done = True
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:
            self.log(f"profiler stop failed: {exc!r}")
            return
        try:
            self._write()
        except Exception as exc:  # never break the user's job
            self.log(f"writing the trace failed: {exc!r}")

    def _write(self) -> None:
        from . import graph as G
        from . import xplane as X
        pbs = sorted((self.dir / "xplane").glob("**/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
        if not pbs:
            raise RuntimeError(f"the profiler wrote no .xplane.pb under {self.dir / 'xplane'}")
        ops_doc = X.convert(pbs[-1], steps=list(range(self.start, self.end)), window_ns=self.window_ns)
        atomic_write_text(self.dir / "tf_ops.json", json.dumps(ops_doc))
        gdoc = G.export(self.step_fn)
        atomic_write_text(self.dir / "tf_graph.json", json.dumps(gdoc))
        unprof = self.durations_ns[2:] or self.durations_ns[1:]   # step 0 traces, step 1 may warm up
        prof = [b - a for a, b in self.window_ns]
        import tensorflow as tf
        meta = {
            "format": TF_META_FORMAT, "version": TF_META_VERSION,
            "job": os.environ.get("DPRO_JOB") or Path(sys.argv[0] or "job").stem,
            "run_id": self.run_id(),
            "host": self.host, "task_type": self.task_type, "task_index": self.task_index,
            "task": self.task, "cluster": self.cluster,
            "role": "server" if self.task_type == "ps" else "worker",
            "step_function": _fn_name(self.step_fn),
            "window": {"start": self.start, "end": self.end, "profiled_steps": list(range(self.start, self.end)),
                       "wall_ns": self.window_ns},
            "measured": {"median_unprofiled_us": statistics.median(unprof) / 1e3 if unprof else None,
                         "unprofiled_steps": len(unprof),
                         "median_profiled_us": statistics.median(prof) / 1e3 if prof else None},
            "clock": {**self.clock, "xspace_start_ns": ops_doc.get("profile_start_ns")},
            "files": {"ops": "tf_ops.json", "graph": "tf_graph.json",
                      "xplane": pbs[-1].relative_to(self.dir).as_posix()},
            "tf_version": tf.__version__, "pid": os.getpid(),
        }
        atomic_write_text(self.dir / "meta.json", json.dumps(meta, indent=1))
        self.log(f"wrote {self.dir} ({len(ops_doc['ops'])} op executions, {len(gdoc['ops'])} graph ops)")
        from .manifest import try_write_manifest
        try_write_manifest(self.out, run_id=meta["run_id"])
