"""DeFT's delayed updates on stock PyTorch DDP: a comm hook that synchronises chosen buckets one iteration late.

DeFT (seed ``002``, §III-A) removes the dependency between a bucket's
synchronisation and the next forward pass: bucket *k*'s gradient of iteration
*i* is all-reduced while iteration *i+1* runs, and the update at the end of
iteration *i+1* applies it.  With stock APIs that is a DDP communication hook
(``ddp.register_comm_hook(None, state.hook)``):

* a bucket not in ``defer`` is all-reduced and averaged now (what DDP does);
* a bucket in ``defer`` is copied and its all-reduce launched asynchronously
  (on ``delayed_group``: e.g. a second gloo process group bound to a second
  network interface, DeFT §III-C); the hook's future completes at once with the
  previous iteration's synchronised copy of the same bucket (averaged), which
  DDP writes into ``.grad`` for the optimizer step.  The first iteration, and
  an iteration right after DDP rebuilt its buckets (the bucket's parameters
  changed), have no previous copy: zeros, as DeFT's reducer does.

``defer`` names DDP bucket indices after its bucket rebuild (the torch reader's
``bucket<k>``, the ``name`` of :func:`dpro_kit.optimize.deft.bucket_times`).
With ``defer`` empty the hook gives DDP's gradients (tests/test_deft_hook.py).
This is the fixed-delay form (``dpro_kit.optimize.deft.delayed_syncs``); the
merged updates of a full DeFT schedule (several iterations summed, updates
skipped) need the training loop to skip optimizer steps and are not applied
here (docs/deft.md §9).

A second link (DeFT §III-C): :func:`link_group` makes a gloo process group whose
device is bound to another network interface (the emulated cluster's ``eth1``,
``DPRO_LINK1_IFNAME``); ``DeferredBuckets(links={k: group})`` sends bucket *k*'s
all-reduce over it, deferred or (not in ``defer``) synchronous.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

import torch
import torch.distributed as dist

__all__ = ["DeferredBuckets", "link_group"]

_LINK_GROUPS = 0


def link_group(interface: str | None = None, *, timeout_s: float = 1800.0) -> Any:
    """A gloo process group of every rank whose traffic goes over ``interface`` (a second link).

    ``interface`` default: ``$DPRO_LINK1_IFNAME`` (set on every host of an emulated cluster with
    ``second_rate_mbit``).  torch 2.13's ``dist.new_group(backend="gloo", pg_options=...)`` ignores
    gloo options, so the backend is built directly: ``ProcessGroupGloo(PrefixStore(..., default
    store), rank, world, options)`` with ``options._devices = [create_device(interface=...)]``
    (gloo binds its listening socket to that interface's address and publishes it through the
    store, so every peer connects to the second-link addresses).  Call it on every rank, in the
    same order, after ``init_process_group``.  The result is a gloo backend: the hook calls its
    ``allreduce([t])`` and ``size()``.
    """
    import datetime
    import os

    global _LINK_GROUPS
    iface = interface or os.environ.get("DPRO_LINK1_IFNAME", "")
    if not iface:
        raise RuntimeError("link_group: no interface given and DPRO_LINK1_IFNAME is not set; run on an emulated "
                           "cluster with a second link (dpro cluster --second-rate-mbit R) or pass interface=")
    Gloo = dist.ProcessGroupGloo
    opts = Gloo._Options()
    opts._devices = [Gloo.create_device(interface=iface)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._threads = 2   # gloo's default: two collectives of the group in flight at once
    _LINK_GROUPS += 1
    store = dist.PrefixStore(f"dpro_deft_link/{_LINK_GROUPS}", dist.distributed_c10d._get_default_store())
    return Gloo(store, dist.get_rank(), dist.get_world_size(), opts)


def _allreduce(t: torch.Tensor, group: Any) -> Any:
    """Start a sum all-reduce of ``t`` on ``group`` (a ProcessGroup, a raw gloo backend, or None); its Work."""
    if group is None or isinstance(group, dist.ProcessGroup):
        return dist.all_reduce(t, group=group, async_op=True)
    return group.allreduce([t])


def _size(group: Any) -> int:
    if group is None or isinstance(group, dist.ProcessGroup):
        return dist.get_world_size(group)
    return int(group.size())


class DeferredBuckets:
    """State and hook of DeFT's one-iteration delay for the buckets in ``defer``.

    Parameters
    ----------
    defer : iterable of int
        DDP bucket indices (after the rebuild) synchronised one iteration late.
    process_group : ProcessGroup or None
        The group of the other buckets (None: the default group, as DDP's).
    delayed_group : ProcessGroup or None
        The group the deferred buckets are all-reduced on (None: ``process_group``).
    record : bool, default False
        Keep ``launches``: ``(iteration, bucket index, deferred)`` per hook call.
    stamps : list or None
        If a list, a light timer without the profiler (``train.py --phase-log``): every hook call appends
        ``(iteration, bucket index, "ready", time.perf_counter())`` on entry (the moment DDP found the
        bucket ready) and ``(iteration, bucket index, "done", t)`` when its all-reduce completes (a callback
        on the gloo thread); ``iteration`` is the attribute the training loop sets.
    links : dict of int to group, optional
        Per bucket, the group its all-reduce goes on instead of ``delayed_group`` (deferred) or
        ``process_group`` (not deferred), e.g. a :func:`link_group` on the second interface.  With
        ``defer`` empty: stock DDP's gradients, the buckets spread over two links.

    References
    ----------
    .. [1] Meng and Sun, "DeFT: Mitigating Data Dependencies for Flexible Communication Scheduling in
           Distributed Training", §III-A (delayed updates), §III-C (a second link)
           (``/work/shared/seeds/002_d6311c65601a268e.txt``).
    """

    def __init__(self, defer: Iterable[int] = (), process_group: Any = None, delayed_group: Any = None,
                 record: bool = False, links: dict[int, Any] | None = None, stamps: list | None = None) -> None:
        self.stamps = stamps
        self.iteration = 0
        self.defer = {int(k) for k in defer}
        self.links = {int(k): g for k, g in (links or {}).items()}
        self.process_group = process_group
        self.delayed_group = delayed_group if delayed_group is not None else process_group
        self.record = record
        self.launches: list[tuple[int, int, bool]] = []
        self.calls = 0
        self._pending: dict[int, tuple[tuple[int, ...], Any, torch.Tensor, Any]] = {}

    def _world(self, group: Any) -> int:
        return _size(group)

    def hook(self, state, bucket):  # noqa: ANN001, ANN201  (DDP checks the annotations it finds: none)
        """The comm hook (``ddp.register_comm_hook(None, deferred.hook)``): a future of the bucket's gradient."""
        idx = int(bucket.index())
        stamps, it = self.stamps, self.iteration
        if stamps is not None:
            stamps.append((it, idx, "ready", time.perf_counter()))
        buf = bucket.buffer()
        self.calls += 1
        deferred = idx in self.defer
        if self.record:
            self.launches.append((self.calls, idx, deferred))
        if not deferred:   # synchronised now, on its link's group if it has one (delay 0 over two links)
            group = self.links.get(idx, self.process_group)
            world = self._world(group)
            fut = _allreduce(buf, group).get_future()
            if stamps is not None:
                fut = fut.then(lambda f: (stamps.append((it, idx, "done", time.perf_counter())), f.value())[1])
            return fut.then(lambda f: f.value()[0].div_(world))
        key = tuple(p.data_ptr() for p in bucket.parameters())
        prev = self._pending.pop(idx, None)
        mine = buf.detach().clone()
        group = self.links.get(idx, self.delayed_group)
        work = _allreduce(mine, group)
        if stamps is not None:
            work.get_future().then(lambda f: stamps.append((it, idx, "done", time.perf_counter())))
        self._pending[idx] = (key, work, mine, group)
        out: torch.futures.Future = torch.futures.Future()
        if prev is not None and prev[0] == key:
            prev[1].wait()
            out.set_result(prev[2].div_(self._world(prev[3])))
        else:
            out.set_result(torch.zeros_like(buf))
        return out

    def flush(self) -> None:
        """Wait for the deferred all-reduces still in flight (call before destroying the process groups)."""
        for entry in self._pending.values():
            entry[1].wait()
