"""Graph-pass registry (dPRO §5.2): every optimisation is a pass on a :class:`Strategy`.

A pass maps a strategy to a NEW strategy (``apply(state, base, **args)``);
the global DFG is rebuilt from it by :func:`~.state.build`.  Undo = keep the
old strategy (``Change.undo()`` returns it), evaluation = build + replay.
Passes that would make the DFG cyclic raise :class:`PassRefused`.

Register your own pass::

    from dpro_kit.optimize.passes import GraphPass, register_pass

    @register_pass
    class MyPass(GraphPass):
        name = "my_pass"
        def apply(self, state, base, **args):
            ...              # return a new Strategy
            return state

or ship it in a package with the entry point group ``dpro_kit.passes``
(``my_pass = "mypkg.passes:MyPass"``), or give ``dpro optimize --pass mypkg.passes:MyPass``.
Knob passes (``knobs = True``, e.g. :class:`dpro_kit.optimize.horovod.HorovodKnobs`) set a
framework's runtime settings by replaying what-ifs of the whole job; the driver runs them instead
of the strategy search on the traces they apply to.
A user pass is offered to the search through ``GraphPass.propose(state, base, critical_ops)``,
which yields ``(args, reason)`` candidates; the search keeps a candidate when
the replayed iteration time improves.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Iterator

from ..errors import DproError
from ..graph.model import op_key
from .state import BaseJob, Strategy, condensed_graph, fused_name, fusion_creates_cycle, group_name


class PassRefused(DproError):
    """The pass cannot be applied (it would create a cycle, or its arguments make no sense)."""


@dataclass(frozen=True)
class Change:
    """One applied pass: ``after`` is the new state, ``undo()`` gives the previous one back."""

    pass_name: str
    args: dict[str, Any]
    before: Strategy
    after: Strategy
    reason: str = ""

    def undo(self) -> Strategy:
        return self.before


class GraphPass:
    name = "pass"
    #: True for memory passes (invoked only when the memory budget is exceeded)
    memory = False
    #: True for knob passes: they set a framework's runtime settings (not a Strategy) and have
    #: ``applies(session) -> bool`` and ``optimize(session, options) -> Optimized``, which
    #: :func:`dpro_kit.optimize.driver.optimize` runs instead of the strategy search on the
    #: traces they apply to (:class:`dpro_kit.optimize.horovod.HorovodKnobs`)
    knobs = False

    def apply(self, state: Strategy, base: BaseJob, **args: Any) -> Strategy:  # pragma: no cover - abstract
        raise NotImplementedError

    def change(self, state: Strategy, base: BaseJob, reason: str = "", **args: Any) -> Change:
        return Change(self.name, dict(args), state, self.apply(state, base, **args), reason)

    def propose(self, state: Strategy, base: BaseJob, critical_ops: list[str]) -> Iterator[tuple[dict, str]]:
        return iter(())


PASSES: dict[str, type[GraphPass]] = {}


def register_pass(cls: type[GraphPass]) -> type[GraphPass]:
    PASSES[cls.name] = cls
    return cls


def load_pass(spec: str) -> type[GraphPass]:
    """``module:Class`` -> the class, registered under its ``name``."""
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise DproError(f"--pass needs module:Class, got {spec!r}")
    try:
        cls = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise DproError(f"cannot load pass {spec!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, GraphPass)):
        raise DproError(f"{spec!r} is not a GraphPass subclass")
    return register_pass(cls)


def load_entry_point_passes() -> list[str]:
    """Register passes advertised by installed packages (entry point group ``dpro_kit.passes``)."""
    from importlib.metadata import entry_points
    names = []
    for ep in entry_points(group="dpro_kit.passes"):
        cls = ep.load()
        if isinstance(cls, type) and issubclass(cls, GraphPass):
            register_pass(cls)
            names.append(cls.name)
    return names


@register_pass
class OpFusion(GraphPass):
    """Fuse op groups ``a`` then ``b`` (local op ids, execution order) on every node that runs them."""

    name = "op_fusion"

    def apply(self, state: Strategy, base: BaseJob, *, a: list[str], b: list[str], check: bool = True,
              check_nodes: list[str] | None = None, condensed=None) -> Strategy:
        """``condensed``: the condensed graph of ``state`` (of ``check_nodes``), if the caller has it."""
        new = state.with_op_fusion(a, b)
        grp = next(f for f in new.fusions if set(a) <= set(f))
        if base.order:  # keep each fusion group in execution order
            ordered = tuple(sorted(grp, key=lambda o: base.order.get(o, 0)))
            new = replace(new, fusions=tuple(f if f != grp else ordered for f in new.fusions))
            grp = ordered
        for n in base.nodes:
            keys = [op_key(n, o) for o in grp]
            if not all(k in base.local for k in keys):
                continue
            devs = {base.local.nodes[k]["device"] for k in keys}
            if len(devs) != 1:
                raise PassRefused(f"ops {grp} run on different devices {sorted(devs)}")
        if check:
            cg = condensed if condensed is not None else condensed_graph(base, state, check_nodes)
            cur = {}  # op id -> current key (after earlier fusions)
            for f in state.fusions:
                for o in f:
                    cur[o] = fused_name(f)
            for n in (check_nodes or base.nodes):
                keys = {op_key(n, cur.get(o, o)) for o in grp}
                if all(k in cg for k in keys) and fusion_creates_cycle(cg, keys):
                    raise PassRefused(f"fusing {grp} on {n} would create a dependency cycle")
        return new


@register_pass
class TensorFusion(GraphPass):
    """Fuse the tensor groups containing base tensors ``a`` and ``b`` into one collective."""

    name = "tensor_fusion"

    def apply(self, state: Strategy, base: BaseJob, *, a: str, b: str) -> Strategy:
        i, j = state.group_of(a), state.group_of(b)
        if i == j:
            raise PassRefused(f"{a} and {b} are already in one group")
        return state.with_fused_groups(i, j)


@register_pass
class TensorPartition(GraphPass):
    """Split the group containing base tensor ``tensor`` into ``k`` collectives (k=1: undo)."""

    name = "tensor_partition"

    def apply(self, state: Strategy, base: BaseJob, *, tensor: str, k: int) -> Strategy:
        if k < 1:
            raise PassRefused(f"partition number must be >= 1, got {k}")
        return state.with_partitions(group_name(state.groups[state.group_of(tensor)]), k)


@register_pass
class Recomputation(GraphPass):
    """Drop stored activations and recompute them in backward (ESTIMATED time and memory)."""

    name = "recomputation"
    memory = True

    def apply(self, state: Strategy, base: BaseJob, *, enable: bool = True) -> Strategy:
        return state.with_memory(recompute=bool(enable))


@register_pass
class GradientAccumulation(GraphPass):
    """Run ``steps`` micro-batches per iteration, synchronise once (ESTIMATED time and memory)."""

    name = "gradient_accumulation"
    memory = True

    def apply(self, state: Strategy, base: BaseJob, *, steps: int = 2) -> Strategy:
        if steps < 1:
            raise PassRefused("accumulation steps must be >= 1")
        return state.with_memory(accum_steps=int(steps))


__all__ = ["PASSES", "Change", "GradientAccumulation", "GraphPass", "load_entry_point_passes", "load_pass",
           "OpFusion", "PassRefused", "Recomputation", "register_pass", "TensorFusion", "TensorPartition"]
