"""Per-chunk communication timestamps for gloo: DDP's bucket AllReduce as explicit, timed ring steps.

Why: gloo runs a bucket's AllReduce inside one opaque worker-thread range, so a
trace says when each rank *joined* the collective and (roughly) when it was
done, but not when any byte moved.  dPRO gets per-chunk timestamps by patching
the communication library (NCCL / ps-lite); for gloo the stock way in is a DDP
communication hook.  :class:`RingAllreduce` is such a hook: it performs the
bucket's AllReduce as the ring of ``dpro_kit.graph.topology.ring_allreduce``
(2(N-1) steps; in step *s* rank *i* sends chunk ``(i-s) mod N`` during
reduce-scatter, ``(i+1-(s-N+1)) mod N`` during all-gather, to rank *i+1*) with
point-to-point ``isend``/``irecv`` on the job's own process group, and records
per step

* SEND: posted (``isend`` called) .. completed (its ``wait()`` returned),
* RECV: posted (``irecv`` called) .. completed,

with ``time.time_ns()`` (the clock the reader puts Kineto times on).  These are
real transfers over the real network; the reader turns them into SEND/RECV
events whose transaction ids are the ones the graph builder gives the same
transfers (the Middleman), so ``dpro align`` gets fine-grained cross-node
evidence and the replay gets measured per-chunk times.

Cost and limits: the ring runs on one Python thread per process (like gloo's
worker thread it overlaps the backward pass); each step costs a few Python
calls, so it is slower than gloo's C++ ring for tiny buckets.  Only dense CPU
buckets are handled; other buckets (CUDA) fall back to the stock
``allreduce``.  The hook replaces DDP's allreduce for the whole run (profiled
and unprofiled steps alike, so the measured iteration time is of the same
job); records are kept only while the profiler runs.  Enabled with
``dpro profile --ring`` / ``DPRO_RING=1`` / ``Recorder(ring=True)``; a DDP
module that already has a comm hook keeps it (no ring records then).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

#: range on the thread that launches a bucket (inside the backward op, like ``c10d::allreduce_``)
LAUNCH = "dpro_ring::allreduce"
#: range on the ring thread around one bucket's whole ring (like ``gloo:all_reduce``)
WORK = "dpro_ring::work"
FILE = "ring_chunks.json"
FORMAT = "dpro-ring-chunks"
VERSION = 1
#: one record per (bucket, step) on this rank
COLUMNS = ["bucket", "step", "send_chunk", "recv_chunk", "send_bytes", "recv_bytes",
           "send_start_ns", "send_end_ns", "recv_start_ns", "recv_end_ns"]


def ring_chunks(n: int, i: int, s: int) -> tuple[int, int]:
    """(chunk rank *i* sends, chunk it receives from rank i-1) in ring step *s* of *n* ranks."""
    if s < n - 1:
        return (i - s) % n, (i - 1 - s) % n
    a = s - n + 1
    return (i + 1 - a) % n, (i - a) % n


class RingAllreduce:
    """A DDP comm hook (``ddp.register_comm_hook(None, ring.hook)``) that times every ring transfer.

    ``recording`` is a callable telling whether records should be kept now (the
    Recorder passes "the profiler runs").
    """

    def __init__(self, process_group: Any = None, recording: Callable[[], bool] = lambda: True) -> None:
        self.pg = process_group
        self.recording = recording
        self.records: list[list[int]] = []
        self.rank = dist.get_rank(process_group)
        self.world = dist.get_world_size(process_group)
        #: global rank of every group rank (ring order = group rank order)
        self.global_ranks = [dist.get_global_rank(process_group, r) if process_group is not None else r
                             for r in range(self.world)] if self.world > 1 else [dist.get_rank()]
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.thread_id: int | None = None

    # ---- the hook -----------------------------------------------------------------------

    @property
    def hook(self) -> Callable:
        """The function to register (DDP checks hook annotations against the real classes; this
        module's annotations are strings, so the registered function carries none)."""
        def dpro_ring_hook(state, bucket):
            return self.run_bucket(bucket)
        return dpro_ring_hook

    def run_bucket(self, bucket: "dist.GradBucket") -> torch.futures.Future:
        """Queue ``bucket`` for the ring thread; the future completes with the averaged buffer."""
        t = bucket.buffer()
        if self.world == 1 or t.is_cuda or t.is_sparse or not t.is_contiguous():
            return dist.all_reduce(t.div_(self.world), group=self.pg, async_op=True).get_future().then(
                lambda f: f.value()[0])
        fut: torch.futures.Future = torch.futures.Future()
        with torch.profiler.record_function(LAUNCH):
            self._ensure_thread()
            self._q.put((bucket.index(), t, fut))
        return fut

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="dpro-ring", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        self.thread_id = threading.get_native_id()
        while True:
            index, t, fut = self._q.get()
            try:
                with torch.profiler.record_function(WORK):
                    self._ring(index, t.view(-1))
                t.div_(self.world)
                fut.set_result(t)
            except Exception as exc:  # surfaces in the training thread at DDP's wait
                fut.set_exception(exc)

    def _ring(self, index: int, flat: torch.Tensor) -> None:
        n, i = self.world, self.rank
        right, left = self.global_ranks[(i + 1) % n], self.global_ranks[(i - 1) % n]
        chunks = torch.tensor_split(flat, n)
        keep = self.recording()
        esize = flat.element_size()
        for s in range(2 * (n - 1)):
            cs, cr = ring_chunks(n, i, s)
            buf = torch.empty_like(chunks[cr])
            r0 = time.time_ns()
            rq = dist.irecv(buf, src=left, group=self.pg, tag=s)
            s0 = time.time_ns()
            sq = dist.isend(chunks[cs], dst=right, group=self.pg, tag=s)
            rq.wait()
            r1 = time.time_ns()
            sq.wait()
            s1 = time.time_ns()
            if s < n - 1:
                chunks[cr].add_(buf)
            else:
                chunks[cr].copy_(buf)
            if keep:
                self.records.append([index, s, cs, cr, chunks[cs].numel() * esize, chunks[cr].numel() * esize,
                                     s0, s1, r0, r1])

    # ---- output -------------------------------------------------------------------------

    def take(self) -> dict[str, Any]:
        """The records so far as the ``ring_chunks.json`` document (and forget them)."""
        recs, self.records = self.records, []
        return {"format": FORMAT, "version": VERSION, "rank": self.rank, "world_size": self.world,
                "global_ranks": self.global_ranks, "thread_id": self.thread_id,
                "clock": "time.time_ns()", "columns": COLUMNS, "records": recs}
