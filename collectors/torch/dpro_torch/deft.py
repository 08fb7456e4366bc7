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
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist

__all__ = ["DeferredBuckets"]


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

    References
    ----------
    .. [1] Meng and Sun, "DeFT: Mitigating Data Dependencies for Flexible Communication Scheduling in
           Distributed Training", §III-A (delayed updates), §III-C (a second link)
           (``/work/shared/seeds/002_d6311c65601a268e.txt``).
    """

    def __init__(self, defer: Iterable[int] = (), process_group: Any = None, delayed_group: Any = None,
                 record: bool = False) -> None:
        self.defer = {int(k) for k in defer}
        self.process_group = process_group
        self.delayed_group = delayed_group if delayed_group is not None else process_group
        self.record = record
        self.launches: list[tuple[int, int, bool]] = []
        self.calls = 0
        self._pending: dict[int, tuple[tuple[int, ...], Any, torch.Tensor]] = {}

    def _world(self, group: Any) -> int:
        return dist.get_world_size(group)

    def hook(self, state, bucket):  # noqa: ANN001, ANN201  (DDP checks the annotations it finds: none)
        """The comm hook (``ddp.register_comm_hook(None, deferred.hook)``): a future of the bucket's gradient."""
        idx = int(bucket.index())
        buf = bucket.buffer()
        self.calls += 1
        deferred = idx in self.defer
        if self.record:
            self.launches.append((self.calls, idx, deferred))
        if not deferred:
            world = self._world(self.process_group)
            fut = dist.all_reduce(buf, group=self.process_group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0].div_(world))
        key = tuple(p.data_ptr() for p in bucket.parameters())
        prev = self._pending.pop(idx, None)
        mine = buf.detach().clone()
        work = dist.all_reduce(mine, group=self.delayed_group, async_op=True)
        self._pending[idx] = (key, work, mine)
        out: torch.futures.Future = torch.futures.Future()
        if prev is not None and prev[0] == key:
            prev[1].wait()
            out.set_result(prev[2].div_(self._world(self.delayed_group)))
        else:
            out.set_result(torch.zeros_like(buf))
        return out

    def flush(self) -> None:
        """Wait for the deferred all-reduces still in flight (call before destroying the process groups)."""
        for _, work, _ in self._pending.values():
            work.wait()
