"""Profile an unmodified MXNet (1.9.x) job, driven by environment variables.

=================  ==========================================================
``DPRO_OUT``       trace directory (required; nothing happens without it)
``DPRO_STEPS``     ``START:END`` steps to profile, 0-based, END exclusive (default ``10:15``)
``DPRO_HOST``      host name used in the directory layout (default: hostname)
``DPRO_JOB``       job name for the manifest (default: the script's name)
``DPRO_RUN_ID``    groups the processes of one run (a PS job: ``DMLC_PS_ROOT_URI:PORT``)
``DPRO_QUIET=1``   no log lines on stderr
=================  ==========================================================

Roles (``DMLC_ROLE``): the scheduler records nothing; a server writes ``meta.json`` at start
(MXNet 1.9.1 runs the server loop inside ``import mxnet``, and its profiler wrote no server
trace in our attempts, docs/ps.md); a worker (or a process without ``DMLC_ROLE``) is profiled:

* a *step* is one call of ``gluon.Trainer.step`` (or ``Trainer.update``); after step ``START-1``
  returns the recorder waits for the engine (``mx.nd.waitall``), starts ``mx.profiler``
  (operators, imperative and symbolic; no C API), and after step ``END-1`` waits again, stops
  and dumps ``profile.json``: the dump holds exactly steps ``START..END-1``;
* every step's return time (``time.time()``, the clock MXNet's profiler uses too: its
  ``ts`` are microseconds since the epoch) goes to ``meta.json`` at exit: unprofiled gaps
  give the measured iteration time;
* the Trainer's parameters in key order (name, shape, bytes), the kvstore type, rank and
  sizes, ``MXNET_KVSTORE_BIGARRAY_BOUND`` and the number of servers (the reader derives the
  partitions as ``KVStoreDist::EncodeDefaultKey`` does).
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time

from dpro_collect.auto import when_imported
from dpro_collect.files import atomic_write_text
from dpro_collect.launch import parse_steps
from dpro_collect.schema import MXNET_META_FORMAT, MXNET_META_VERSION

_STATE = {"hook": None, "recorder": None}


def _log(msg: str) -> None:
    if os.environ.get("DPRO_QUIET") != "1":
        print(f"[dpro_mxnet] {msg}", file=sys.stderr, flush=True)


def _host() -> str:
    return os.environ.get("DPRO_HOST") or socket.gethostname()


def _run_id() -> str:
    uri, port = os.environ.get("DMLC_PS_ROOT_URI"), os.environ.get("DMLC_PS_ROOT_PORT")
    if uri and port:
        return f"ps-{uri}:{port}"
    return os.environ.get("DPRO_RUN_ID", "")


def _ps_facts() -> dict:
    env = os.environ
    return {"num_workers": int(env.get("DMLC_NUM_WORKER", "1") or 1),
            "num_servers": int(env.get("DMLC_NUM_SERVER", "0") or 0),
            "root": f"{env.get('DMLC_PS_ROOT_URI', '')}:{env.get('DMLC_PS_ROOT_PORT', '')}",
            "interface": env.get("DMLC_INTERFACE", ""),
            "bigarray_bound": int(env.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))}


def _base_meta(role: str) -> dict:
    return {"format": MXNET_META_FORMAT, "version": MXNET_META_VERSION, "role": role, "host": _host(),
            "run_id": _run_id(), "pid": os.getpid(), "job": os.environ.get("DPRO_JOB") or os.path.basename(sys.argv[0] or "job"),
            "started": time.time(), "ps": _ps_facts()}


def write_server_meta() -> None:
    """A parameter server: its meta.json (host, pid, the job's PS facts) under ``DPRO_OUT/<host>/server-<pid>/``."""
    meta = _base_meta("server")
    atomic_write_text(os.path.join(os.environ["DPRO_OUT"], meta["host"], f"server-{os.getpid()}", "meta.json"),
                      json.dumps(meta, indent=1))


class Recorder:
    """Counts Trainer steps, profiles the window, writes ``profile.json`` + ``meta.json``."""

    def __init__(self, out: str, steps: tuple[int, int]):
        self.out, (self.a, self.b) = out, steps
        self.n = 0
        self.stamps: list[float] = []
        self.window: list[float] = []
        self.meta = _base_meta("worker")
        self.dir = None
        self.dumped = False

    def _trainer_facts(self, trainer) -> None:
        kv = getattr(trainer, "_kvstore", None)
        params = []
        for i, p in enumerate(getattr(trainer, "_params", [])):
            d = p.data()
            params.append({"key": i, "name": p.name, "shape": list(d.shape), "size": int(d.size),
                           "bytes": int(d.size) * int(sys.modules["numpy"].dtype(d.dtype).itemsize),
                           "grad_req": p.grad_req})
        self.meta["params"] = params
        self.meta["kvstore"] = {"type": getattr(kv, "type", None) if kv is not None else None,
                                "rank": int(getattr(kv, "rank", 0)) if kv is not None else 0,
                                "num_workers": int(getattr(kv, "num_workers", 1)) if kv is not None else 1,
                                "update_on_kvstore": bool(getattr(trainer, "_update_on_kvstore", False))}

    def after_step(self, trainer) -> None:
        import mxnet as mx
        self.n += 1
        self.stamps.append(time.time())
        if self.n == self.a:
            self._trainer_facts(trainer)
            rank = self.meta["kvstore"]["rank"]
            self.dir = os.path.join(self.out, self.meta["host"], f"worker{rank}")
            os.makedirs(self.dir, exist_ok=True)
            mx.nd.waitall()
            mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, profile_memory=False,
                                   profile_api=False, aggregate_stats=False,
                                   filename=os.path.join(self.dir, "profile.json"))
            self.window.append(time.time())
            mx.profiler.set_state("run")
        elif self.n == self.b and self.dir is not None:
            mx.nd.waitall()
            mx.profiler.set_state("stop")
            self.window.append(time.time())
            mx.profiler.dump()
            self.dumped = True
            self.write_meta()
            _log(f"profiled steps {self.a}..{self.b - 1} -> {self.dir}")

    def write_meta(self) -> None:
        if self.dir is None or not self.dumped:
            return
        m = dict(self.meta, steps=[self.a, self.b], step_end_times=self.stamps, window=self.window,
                 mxnet_version=sys.modules["mxnet"].__version__ if "mxnet" in sys.modules else "?",
                 env={k: os.environ[k] for k in ("MXNET_EXEC_BULK_EXEC_TRAIN", "MXNET_CPU_WORKER_NTHREADS",
                                                 "OMP_NUM_THREADS", "MXNET_ENGINE_TYPE") if k in os.environ})
        atomic_write_text(os.path.join(self.dir, "meta.json"), json.dumps(m, indent=1))

    def install(self) -> None:
        from mxnet import gluon
        rec = self
        for meth in ("step", "update"):
            orig = getattr(gluon.Trainer, meth)

            def wrapped(trainer, *args, __orig=orig, **kw):
                r = __orig(trainer, *args, **kw)
                try:
                    rec.after_step(trainer)
                except Exception as exc:  # never break the user's job
                    _log(f"profiling stopped: {exc!r}")
                    rec.n = -10 ** 9
                return r
            setattr(gluon.Trainer, meth, wrapped)
        atexit.register(self.write_meta)


def enable():
    """Start recording as the environment says (idempotent); returns the Recorder or None."""
    if _STATE["recorder"] is not None or not os.environ.get("DPRO_OUT"):
        return _STATE["recorder"]
    rec = Recorder(os.environ["DPRO_OUT"], parse_steps(os.environ.get("DPRO_STEPS", "10:15"), first=1))
    rec.install()
    _STATE["recorder"] = rec
    return rec


def install() -> None:
    """What the auto-load does: a server writes its meta now, a worker gets the import hook."""
    if not os.environ.get("DPRO_OUT"):
        return
    role = os.environ.get("DMLC_ROLE", "worker")
    if role == "server":
        write_server_meta()
    elif role == "worker":
        if _STATE["hook"] is None:
            _STATE["hook"] = when_imported("mxnet", enable, "dpro_mxnet")


__all__ = ["enable", "install", "Recorder", "write_server_meta"]
