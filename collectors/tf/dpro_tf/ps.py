"""ParameterServerStrategy: the coordinator traces its workers and parameter servers (imports TensorFlow).

The workers and PS tasks of a ParameterServerStrategy job run ``tf.distribute.Server(...).join()``:
no Python step loop runs there. Every TensorFlow gRPC server also serves TensorFlow's profiler
service on its own port, so the *coordinator* (the ``chief`` task, the one process with a
Python loop) records the job:

* **steps**: the coordinator's worker threads run one closure at a time per worker
  (``cluster_coordinator.Worker._process_closure``: dispatch the function, wait for its result);
  the collector wraps it and times every closure of every worker (wall clock). Step ``j`` of
  worker ``K`` is the ``j``-th closure that worker ran (0-based; closure 0 traces the function).
* **the window**: when the first worker finished step ``START-3`` (one step of slack for the
  profilers to start), a thread calls ``tf.profiler.experimental.client.trace`` on every worker
  and PS address of ``TF_CONFIG`` (host tracer level 2) for about ``END-START+3`` steps (their median time so far x4
  -- x2 for the profiler's own cost, x2 for a loaded machine -- or twice the slowest step so far, + 1 s; the
  workers wait at ``END`` for the trace, so the slack costs idle time, not data); the steps the trace holds whole are kept (the reader needs
  the step before and after each profiled step: its gradients' update and its successor's reads);
  a worker past step ``END`` waits for the trace to come back before its next closure, and so does
  ``ClusterCoordinator.join`` once a worker is past ``END`` (the job never tears down while its
  servers are being traced; a ``join`` inside the window, e.g. after a warm-up, returns at once);
* **files**, written by that thread once the trace is back, per traced task in
  ``OUT/<address host>/<task>/``: ``tf_ps_ops.json`` (:func:`dpro_tf.xplane.convert_task`
  plus ``step_of``: the task's step ids -> ``{worker, step}``), ``tf_graph.json`` (the scheduled
  function's traced graph, :mod:`dpro_tf.graph`), the raw ``*.xplane.pb`` and ``meta.json``
  (written last, when the job exits: the measured closure intervals need the job's later steps;
  ``strategy: "ps"``, role ``worker`` or ``server``); the coordinator's own closure timings go to
  ``OUT/<host>/chief0/coordinator.json``. Then the manifest.

Step ids: one step's function runs on the worker and its components on every PS under the same
step id (checked on TF 2.21), so the worker's XSpace maps step ids to closures (the worker's
step starts inside its closure's dispatch .. result span) and the PS's rows join by id.
Clocks: emulated hosts share one clock; across real machines the coordinator's closure times
and the tasks' XSpaces are each on their own host's clock (closures are matched by containment,
which tolerates offsets far below a step; the reader pairs transfers across hosts as recorded).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dpro_collect.files import atomic_write_text
from dpro_collect.schema import TF_META_FORMAT, TF_META_VERSION

__all__ = ["CoordinatorRecorder", "task_dirs"]


def task_dirs(cluster: dict[str, Any]) -> list[tuple[str, int, str, str]]:
    """``(task type, index, address, host folder)`` of every worker and PS task of ``cluster``."""
    out = []
    for typ in ("worker", "ps"):
        for i, addr in enumerate(cluster.get(typ) or []):
            host = str(addr).rsplit(":", 1)[0].strip("[]") or "localhost"
            out.append((typ, i, str(addr), host.replace("/", "_")))
    return out


class CoordinatorRecorder:
    """Times the coordinator's closures and traces the servers for a window (module docstring).

    Parameters
    ----------
    out : str
        Trace directory.
    steps : (int, int)
        Profile steps ``start .. end-1`` of every worker (``start >= 2``).
    host : str
        This (the coordinator's) host folder.
    task : str
        This task's name (``chief0``).
    cluster : dict
        ``TF_CONFIG``'s cluster spec.
    run_id : str
        The run id every task folder gets.
    log : callable
        One-line logger.
    """

    def __init__(self, out: str, steps: tuple[int, int], host: str, task: str, cluster: dict[str, Any],
                 run_id: str, log) -> None:
        self.out = Path(out)
        self.start, self.end = max(2, steps[0]), max(steps[1], max(2, steps[0]) + 1)
        self.host, self.task, self.cluster, self.run_id, self.log = host, task, cluster, run_id, log
        self.closures: dict[int, list[tuple[int, int]]] = {}
        self.fn = None
        self.state = "counting"          # counting -> tracing -> done
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.window_wall: tuple[int, int] | None = None
        self._pending: tuple | None = None
        self.traced = threading.Event()

    # -- wiring ---------------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap ``Worker._process_closure`` and ``ClusterCoordinator.schedule``."""
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
        rec = self
        orig_proc, orig_sched = cc.Worker._process_closure, cc.ClusterCoordinator.schedule
        orig_join = cc.ClusterCoordinator.join

        def _process_closure(worker, closure):
            if rec.state == "tracing" and len(rec.closures.get(int(worker.worker_index), ())) > rec.end:
                rec.traced.wait()     # the window is over for this worker: hold it until the trace is back
            t0 = time.time_ns()
            try:
                return orig_proc(worker, closure)
            finally:
                rec.closure_done(int(worker.worker_index), t0, time.time_ns())

        def schedule(coord, fn, args=None, kwargs=None):
            if rec.fn is None:
                rec.fn = fn
            return orig_sched(coord, fn, args=args, kwargs=kwargs)

        def join(coord):
            result = orig_join(coord)
            # the window is over (a worker ran past END): the trace must come back before the job goes on
            # (it may tear down); a join before that (e.g. after a warm-up) must not stall the job the
            # trace is recording -- more steps follow, and exit waits for the (non-daemon) trace thread
            if rec.state == "tracing" and max(map(len, rec.closures.values()), default=0) > rec.end:
                rec.traced.wait()
            return result

        _process_closure.__wrapped__ = orig_proc
        schedule.__wrapped__ = orig_sched
        join.__wrapped__ = orig_join
        cc.Worker._process_closure = _process_closure
        cc.ClusterCoordinator.schedule = schedule
        cc.ClusterCoordinator.join = join
        import atexit
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if self._pending is not None:
            try:
                self._write_metas()
            except Exception as exc:   # never break the user's job
                self.log(f"writing the task metas failed: {exc!r}")
        elif self.state == "counting" and self.closures:
            n = min(len(v) for v in self.closures.values())
            self.log(f"no trace written: the workers ran {n} step(s) each, the window {self.start}:{self.end} "
                     f"needs {self.end + 1}; profile earlier steps with --steps")

    # -- steps and the window -------------------------------------------------------------------
    def closure_done(self, worker: int, t0: int, t1: int) -> None:
        with self._lock:
            self.closures.setdefault(worker, []).append((t0, t1))
            if self.state != "counting" or len(self.closures[worker]) < max(1, self.start - 2):
                return
            self.state = "tracing"
        durs = [b - a for a, b in self.closures[worker][1:]] or [b - a for a, b in self.closures[worker]]
        # generous: a worker past END waits for the trace to come back, so a longer window costs idle wall time
        # only, while a short one loses the steps (a loaded machine made steps 3x slower than before the
        # window: "no replayable step"); x4 the median (x2 for the profiler's own cost), at least x2 the
        # slowest step so far, + 1 s
        per = max(4.0 * statistics.median(durs), 2.0 * max(durs))
        seconds = (self.end - self.start + 3) * per / 1e9 + 1.0
        self._thread = threading.Thread(target=self._trace, args=(seconds,), name="dpro_tf-ps-trace")
        self._thread.start()

    def _trace(self, seconds: float) -> None:
        try:
            import tensorflow as tf
            tasks = task_dirs(self.cluster)
            logdir = self.out / self.host / self.task / "xplane"
            logdir.mkdir(parents=True, exist_ok=True)
            addrs = ",".join(f"grpc://{a}" for _, _, a, _ in tasks)
            self.log(f"tracing {len(tasks)} server task(s) for {seconds:.2f} s (steps {self.start}..{self.end - 1})")
            a = time.time_ns()
            tf.profiler.experimental.client.trace(addrs, str(logdir), int(seconds * 1000), num_tracing_attempts=3)
            self.window_wall = (a, time.time_ns())
            self._write(tasks, logdir)
        except Exception as exc:   # never break the user's job
            self.log(f"tracing the servers failed: {exc!r}")
        finally:
            self.state = "done"
            self.traced.set()

    # -- files ----------------------------------------------------------------------------------
    def _step_map(self, wdoc: dict[str, Any], k: int) -> dict[str, int]:
        """The worker's step ids -> its closure numbers (the step starts inside the closure's span)."""
        spans = self.closures.get(k, [])
        out: dict[str, int] = {}
        for sid, a, _b in wdoc["steps"]:
            for j, (t0, t1) in enumerate(spans):
                if t0 <= a <= t1:
                    out[sid] = j
                    break
        return out

    def _write(self, tasks, logdir: Path) -> None:
        from . import graph as G
        from . import xplane as X
        pbs = {p.name: p for p in logdir.glob("plugins/profile/*/*.xplane.pb")}
        docs: dict[tuple[str, int], dict[str, Any]] = {}
        files: dict[tuple[str, int], Path] = {}
        for typ, i, addr, _host in tasks:
            p = pbs.get(addr.replace(":", "_") + ".xplane.pb")
            if p is None:
                raise RuntimeError(f"the profiler returned no XSpace for {typ}{i} ({addr}); got {sorted(pbs)}")
            docs[(typ, i)] = X.convert_task(p)
            files[(typ, i)] = p
        lo = max(d["profile_start_ns"] for d in docs.values())
        hi = min(d["profile_stop_ns"] or 2**63 for d in docs.values())
        step_of: dict[str, dict[str, Any]] = {}
        kept: dict[int, list[int]] = {}
        for typ, i, _a, _h in tasks:
            if typ != "worker":
                continue
            spans = self.closures.get(i, [])
            for sid, j in self._step_map(docs[(typ, i)], i).items():
                t0, t1 = spans[j]
                if lo <= t0 and t1 <= hi:        # the whole step is in every task's trace
                    step_of[sid] = {"worker": f"worker{i}", "step": j}
                    kept.setdefault(i, []).append(j)
        if not step_of:
            raise RuntimeError("no step lies whole inside the servers' trace (the job ended, or steps are longer "
                               "than the window): profile more steps with --steps")
        gdoc = G.export(self.fn)
        for typ, i, addr, host in tasks:
            d = self.out / host / f"{typ}{i}"
            d.mkdir(parents=True, exist_ok=True)
            doc = docs[(typ, i)]
            doc["step_of"] = {sid: v for sid, v in step_of.items()}
            doc["task"], doc["address"] = f"{typ}{i}", addr
            atomic_write_text(d / "tf_ps_ops.json", json.dumps(doc))
            atomic_write_text(d / "tf_graph.json", json.dumps(gdoc))
            (d / "xplane").mkdir(exist_ok=True)
            shutil.copyfile(files[(typ, i)], d / "xplane" / files[(typ, i)].name)
        import tensorflow as tf
        self._pending = (tasks, files, kept, tf.__version__)
        self.log(f"traced {len(tasks)} task(s); steps kept per worker: "
                 + ", ".join(f"worker{k}: {sorted(v)}" for k, v in sorted(kept.items()))
                 + " (meta.json and the manifest follow when the job exits: the measured steps need its end)")

    def _write_metas(self) -> None:
        """meta.json of every traced task (last: a reader takes a folder with meta.json as complete),
        the coordinator's closures, the manifest."""
        tasks, files, kept, tf_version = self._pending
        measured = self._measured(kept)
        for typ, i, addr, host in tasks:
            d = self.out / host / f"{typ}{i}"
            # a replayable step needs its neighbours traced (the update before it, the reads after it)
            whole = {k: sorted(j for j in v if j - 1 in v and j + 1 in v) for k, v in kept.items()}
            steps = whole.get(i, []) if typ == "worker" else sorted({j for v in whole.values() for j in v})
            meta = {
                "format": TF_META_FORMAT, "version": TF_META_VERSION,
                "job": os.environ.get("DPRO_JOB") or Path(sys.argv[0] or "job").stem, "run_id": self.run_id,
                "host": host, "task_type": typ, "task_index": i, "task": f"{typ}{i}", "cluster": self.cluster,
                "role": "server" if typ == "ps" else "worker", "strategy": "ps", "address": addr,
                "step_function": str(getattr(self.fn, "__name__", "")),
                "window": {"start": self.start, "end": self.end, "profiled_steps": steps,
                           "wall_ns": list(self.window_wall or ())},
                "measured": measured.get(i, {}) if typ == "worker" else {},
                "traced_by": {"host": self.host, "task": self.task},
                "files": {"ops": "tf_ps_ops.json", "graph": "tf_graph.json",
                          "xplane": f"xplane/{files[(typ, i)].name}"},
                "tf_version": tf_version,
            }
            atomic_write_text(d / "meta.json", json.dumps(meta, indent=1))
        atomic_write_text(self.out / self.host / self.task / "coordinator.json", json.dumps({
            "format": "dpro-tf-coordinator", "version": 1, "run_id": self.run_id,
            "closure_columns": ["start_ns", "end_ns"],
            "closures": {f"worker{k}": v for k, v in sorted(self.closures.items())},
            "window_wall_ns": list(self.window_wall or ())}, indent=1))
        self.log(f"wrote {len(tasks)} task trace(s) under {self.out}")
        from .manifest import try_write_manifest
        try_write_manifest(self.out, run_id=self.run_id)

    def _measured(self, kept: dict[int, list[int]]) -> dict[int, dict[str, Any]]:
        """Per worker: median closure-to-closure interval outside (unprofiled) and inside the trace (us)."""
        out = {}
        for k, spans in self.closures.items():
            starts = [a for a, _ in spans]
            inside = set(kept.get(k, []))
            lo, hi = (min(inside), max(inside)) if inside else (len(starts), len(starts))
            unprof = [starts[j + 1] - starts[j] for j in range(2, len(starts) - 1) if j + 1 < lo - 1 or j > hi + 1]
            prof = [starts[j + 1] - starts[j] for j in range(len(starts) - 1) if j in inside and j + 1 in inside]
            out[k] = {"median_unprofiled_us": statistics.median(unprof) / 1e3 if unprof else None,
                      "unprofiled_steps": len(unprof),
                      "median_profiled_us": statistics.median(prof) / 1e3 if prof else None,
                      "what": "the coordinator's closure-to-closure interval of this worker"}
        return out
