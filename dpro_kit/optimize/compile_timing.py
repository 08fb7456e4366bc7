"""Fused-op times measured with torch.compile instead of modelled.

dPRO (§5, "op fusion") profiled every fused op it considered offline, in a
forked framework.  Here the fused region is rebuilt from the trace and timed
for real:

1. ``dpro profile --shapes`` records one extra iteration (after the timed
   window) with ``record_shapes=True``: for every top-level op its input
   shapes, dtypes and scalar arguments (``kineto_shapes.json``, read by
   :func:`dpro_kit.readers.torch_kineto.read_op_shapes`; the ops carry the
   window's op ids);
2. :class:`Region` turns a fusion group's ops back into calls of the same
   ATen operators (``torch.ops.aten.<name>``, the overload whose schema fits
   the recorded inputs), as a ``torch.fx`` graph over random inputs of the
   recorded shapes (no code is generated from trace text).  Data flow is
   not in a Kineto trace, so it is inferred: an op's first tensor input is the
   latest earlier output of the region with the same shape and dtype, other
   tensor inputs are fresh region inputs (weights, biases) unless an unused
   earlier output matches.  Every op's output is returned, i.e. materialised,
   as in training where the autograd graph saves activations for backward;
3. :func:`time_region` times the region eagerly and compiled
   (``torch.compile``, inductor, ``fullgraph=True``), alternating the two
   (medians of many runs), on the traced rank's number of intra-op threads.

The optimizer uses the *ratio* compiled / eager: a fused group takes
``ratio x (sum of its traced op times)``.  The ratio carries over what
fusion saves (kernel launches, interpreter time between ops, memory traffic
of pointwise ops) while the traced times keep what the probe cannot see (the
job's own thread placement and caches).

Limits: only forward ops (the shapes trace has no inputs for autograd's
backward nodes, so a group with a backward op keeps the model); ops with
list-of-tensor arguments (``aten::cat``) are not rebuilt; the inferred data
flow is right for chains (linear -> relu -> linear), approximate for
branching code.  Every timing says where it came from (``source``).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

SOURCE = "torch.compile"

#: Kineto "Input type" strings -> torch dtype names
_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
           "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
           "unsigned char": "uint8", "bool": "bool"}
#: c10::ScalarType codes as recorded for dtype arguments
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 11: "bool", 15: "bfloat16"}


class RegionError(ValueError):
    """A fusion group that cannot be rebuilt from the recorded inputs (the reason is the message)."""


@dataclass(frozen=True)
class RecordedOp:
    """One top-level op as the shapes trace recorded it."""

    op_id: str
    name: str                                 # aten::linear
    dims: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    concrete: tuple[str, ...]

    @classmethod
    def from_args(cls, op_id: str, args: dict[str, Any]) -> "RecordedOp":
        name = op_id.split("#")[0]
        dims, types = args.get("Input Dims"), args.get("Input type")
        if dims is None or types is None or len(dims) != len(types):
            raise RegionError(f"{op_id}: no recorded inputs (record the trace with `dpro profile --shapes`)")
        conc = args.get("Concrete Inputs") or [""] * len(types)
        return cls(op_id=op_id, name=name, dims=tuple(tuple(int(x) for x in d) for d in dims),
                   types=tuple(str(t) for t in types), concrete=tuple(str(c) for c in conc))


def parse_concrete(text: str) -> Any:
    """A recorded scalar argument: '' -> None, 'True'/'False', int, float ('-inf' too), '[1, 2]' -> list."""
    t = text.strip()
    if t == "":
        return None
    if t in ("True", "False"):
        return t == "True"
    if t.startswith("["):
        try:
            return json.loads(t)
        except ValueError:
            raise RegionError(f"cannot read the list argument {text!r}") from None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        raise RegionError(f"cannot read the scalar argument {text!r}") from None


@dataclass
class _Call:
    fn: Any                                   # an OpOverload
    args: list[tuple[str, Any]]               # ("in", input index) | ("out", op index) | ("const", value)
    kwargs: dict[str, tuple[str, Any]] = field(default_factory=dict)


class Region:
    """A fusion group rebuilt as a Python function over ATen ops (see the module docstring)."""

    def __init__(self, ops: list[RecordedOp], *, seed: int = 0) -> None:
        import torch
        self.ops = ops
        self._torch = torch
        gen = torch.Generator().manual_seed(seed)
        self.inputs: list[Any] = []
        self.calls: list[_Call] = []
        results: list[Any] = []                          # each op's eager result while building
        outs: list[tuple[tuple[int, ...], str]] = []     # (shape, dtype) of each op's first output
        used_outs: set[int] = set()
        for op in ops:
            call, result, used = self._call(op, results, outs, used_outs, gen)
            self.calls.append(call)
            results.append(result)
            used_outs |= used
            out = self._first_tensor(result)
            outs.append((tuple(out.shape), str(out.dtype).replace("torch.", ""))
                        if isinstance(out, torch.Tensor) else ((), "none"))

    # ---- building
    def _tensor(self, dims: tuple[int, ...], dtype: str, gen: Any) -> Any:
        torch = self._torch
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            return torch.randn(dims, dtype=dt, generator=gen)
        return torch.zeros(dims, dtype=dt)    # indices / masks: 0 is valid for every index op

    def _overloads(self, name: str, n: int) -> list[Any]:
        ns, _, op = name.partition("::")
        if ns != "aten" or not op:
            raise RegionError(f"{name}: not an ATen operator")
        packet = getattr(self._torch.ops.aten, op, None)
        if packet is None:
            raise RegionError(f"{name}: unknown ATen operator in this torch")
        cands = [getattr(packet, o) for o in packet.overloads()]
        fits = [c for c in cands if len(c._schema.arguments) == n]
        if not fits:
            raise RegionError(f"{name}: no overload takes {n} arguments")
        return sorted(fits, key=lambda c: c._schema.overload_name != "")  # the default overload first

    def _call(self, op: RecordedOp, results: list[Any], outs: list, used_outs: set[int],
              gen: Any) -> tuple[_Call, Any, set[int]]:
        """The first overload that accepts the recorded arguments (run eagerly once), its result,
        and the earlier outputs it consumes."""
        n = len(op.types)
        errors = []
        for fn in self._overloads(op.name, n):
            specs: list[tuple[str, Any]] = []
            used: set[int] = set()
            n_inputs0 = len(self.inputs)
            try:
                first_tensor = True
                for a, dims, typ, conc in zip(fn._schema.arguments, op.dims, op.types, op.concrete):
                    atype = str(a.type)
                    if typ in _DTYPES:
                        if "Tensor" not in atype:
                            raise RegionError(f"argument {a.name} is a tensor in the trace, {atype} in the schema")
                        dtype = _DTYPES[typ]
                        src = None
                        if first_tensor:
                            src = next((j for j in range(len(outs) - 1, -1, -1) if outs[j] == (dims, dtype)), None)
                        else:
                            src = next((j for j in range(len(outs) - 1, -1, -1)
                                        if outs[j] == (dims, dtype) and j not in used_outs | used), None)
                        first_tensor = False
                        if src is not None:
                            used.add(src)
                            specs.append(("out", src))
                        else:
                            self.inputs.append(self._tensor(dims, dtype, gen))
                            specs.append(("in", len(self.inputs) - 1))
                    elif typ in ("Scalar", "ScalarList", ""):
                        v = parse_concrete(conc)
                        if "ScalarType" in atype and isinstance(v, int):
                            v = getattr(self._torch, _SCALAR_TYPES.get(v, "float32"))
                        elif any(k in atype for k in ("Layout", "Device", "MemoryFormat")):
                            v = None
                        specs.append(("const", v))
                    else:
                        raise RegionError(f"argument type {typ!r} is not rebuilt")
                args = [s for a, s in zip(fn._schema.arguments, specs) if not a.kwarg_only]
                kwargs = {a.name: s for a, s in zip(fn._schema.arguments, specs) if a.kwarg_only}
                call = _Call(fn=fn, args=args, kwargs=kwargs)
                return call, self._exec(call, self.inputs, results), used
            except RegionError as exc:
                errors.append(str(exc))
                del self.inputs[n_inputs0:]
            except Exception as exc:  # the overload rejected the arguments: try the next one
                errors.append(f"{fn}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                del self.inputs[n_inputs0:]
        raise RegionError(f"{op.op_id}: cannot rebuild the call ({'; '.join(errors[:2])})")

    # ---- running
    def _resolve(self, spec: tuple[str, Any], ins: list[Any], results: list[Any]) -> Any:
        kind, v = spec
        if kind == "in":
            return ins[v]
        if kind == "out":
            return self._first_tensor(results[v])
        return v

    @staticmethod
    def _first_tensor(x: Any) -> Any:
        return x[0] if isinstance(x, (tuple, list)) else x

    def _exec(self, c: _Call, ins: list[Any], results: list[Any]) -> Any:
        return c.fn(*[self._resolve(s, ins, results) for s in c.args],
                    **{k: self._resolve(s, ins, results) for k, s in c.kwargs.items()})

    def function(self) -> Callable[..., tuple]:
        """``f(*inputs) -> every op's output`` as a ``torch.fx.GraphModule``.

        An FX graph, not a Python closure over the call list: torch.compile would guard on
        every object of such a closure and the guards would cost more than small regions.
        """
        import operator

        import torch.fx as fx
        g = fx.Graph()
        ins = [g.placeholder(f"in{k}") for k in range(len(self.inputs))]
        nodes: list[Any] = []
        firsts: list[Any] = []

        def arg(spec: tuple[str, Any]) -> Any:
            kind, v = spec
            return ins[v] if kind == "in" else firsts[v] if kind == "out" else v

        for c in self.calls:
            n = g.call_function(c.fn, tuple(arg(sp) for sp in c.args), {k: arg(sp) for k, sp in c.kwargs.items()})
            nodes.append(n)
            multi = len(c.fn._schema.returns) > 1
            firsts.append(g.call_function(operator.getitem, (n, 0)) if multi else n)
        g.output(tuple(nodes))
        return fx.GraphModule(self._torch.nn.Module(), g)


@dataclass
class FusionTiming:
    """What the probe measured for one fusion group (or why it could not)."""

    ops: tuple[str, ...]
    eager_us: float | None = None
    compiled_us: float | None = None
    compile_s: float | None = None
    reason: str = ""

    @property
    def ratio(self) -> float | None:
        if self.eager_us and self.compiled_us is not None and self.eager_us > 0:
            return self.compiled_us / self.eager_us
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "source": SOURCE if self.ratio is not None else "model",
                "eager_us": self.eager_us, "compiled_us": self.compiled_us, "ratio": self.ratio,
                "compile_s": self.compile_s, "reason": self.reason}


def _time_calls(fn: Callable[[], Any], target_s: float) -> float:
    """Seconds per call of ``fn``, from one batch sized to take about ``target_s``."""
    n, t0 = 1, time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(target_s / one))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def time_region(region: Region, *, samples: int = 15, sample_s: float = 0.004,
                threads: int | None = None, grad: bool = True) -> tuple[float, float, float]:
    """(eager us, compiled us, compile seconds) of a region; eager and compiled samples alternate.

    ``grad``: floating-point inputs require grad and autograd records the region, as in a
    training forward pass (compiled, that includes AOTAutograd's saving for backward).
    Inductor compiles in this process (``compile_threads=1``): its worker pool would
    still be busy while the first samples are taken.
    """
    import torch
    import torch._inductor.config as inductor_config
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        f = region.function()
        ins = [t.detach().requires_grad_(grad and t.is_floating_point()) for t in region.inputs]
        with inductor_config.patch(compile_threads=1), torch.set_grad_enabled(grad):
            t0 = time.perf_counter()
            cf = torch.compile(f, fullgraph=True, dynamic=False)
            cf(*ins)
            compile_s = time.perf_counter() - t0
            eager, comp = [], []
            for _ in range(3):
                f(*ins), cf(*ins)
            for _ in range(samples):
                eager.append(_time_calls(lambda: f(*ins), sample_s))
                comp.append(_time_calls(lambda: cf(*ins), sample_s))
        return statistics.median(eager) * 1e6, statistics.median(comp) * 1e6, compile_s
    finally:
        torch.set_num_threads(old)


def load_shapes(trace: Path) -> tuple[dict[str, dict[str, Any]], int | None]:
    """Recorded op inputs of the first rank that has a shapes trace, and its intra-op thread count."""
    from ..readers.torch_kineto import read_op_shapes
    from ..schema import TORCH_META_FORMAT
    for meta_path in sorted(Path(trace).glob("*/*/meta.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta = None
        if isinstance(meta, dict) and meta.get("format") != TORCH_META_FORMAT:
            continue        # another framework's rank (an MXNet PS trace): no torch op shapes there
        shapes = read_op_shapes(meta_path.parent)
        if shapes:
            return shapes, meta.get("threads") if isinstance(meta, dict) else None
    return {}, None


def time_fusions(groups: Iterable[tuple[str, ...]], shapes: dict[str, dict[str, Any]], *,
                 threads: int | None = None, deadline: float | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[tuple[str, ...], FusionTiming]:
    """Time every fusion group it can rebuild before ``deadline`` (perf_counter seconds)."""
    out: dict[tuple[str, ...], FusionTiming] = {}
    groups = [tuple(g) for g in groups]
    for n, grp in enumerate(groups, 1):
        ft = FusionTiming(ops=grp)
        out[grp] = ft
        if deadline is not None and time.perf_counter() > deadline:
            ft.reason = "time budget spent before this group was timed"
            continue
        missing = [o for o in grp if o not in shapes]
        if missing:
            ft.reason = f"{missing[0]}: not in the shapes trace"
            continue
        not_fw = [o for o in grp if shapes[o].get("kind") != "FW"]
        if not_fw:
            ft.reason = f"{not_fw[0]}: a {shapes[not_fw[0]].get('kind')} op (only forward ops are rebuilt)"
            continue
        try:
            region = Region([RecordedOp.from_args(o, shapes[o]) for o in grp])
            if progress:
                progress(f"torch.compile: timing fusion group {n}/{len(groups)} ({len(grp)} ops)")
            ft.eager_us, ft.compiled_us, ft.compile_s = time_region(region, threads=threads)
            ft.reason = f"rebuilt from recorded shapes, timed eager vs torch.compile ({threads or 'default'} threads)"
        except RegionError as exc:
            ft.reason = str(exc)
        except Exception as exc:  # torch.compile failed on this region: keep the model, say why
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            ft.reason = f"torch.compile failed: {type(exc).__name__}: {first[:200]}"
    return out


__all__ = ["SOURCE", "FusionTiming", "load_shapes", "parse_concrete", "RecordedOp", "Region", "RegionError",
           "time_fusions", "time_region"]
