"""The model's op graph from one single-process profile (Proteus' op estimator, §VII).

Input: a ``dpro profile --shapes`` trace of the training script run with one process
(``python examples/ddp/train.py --nproc 1 ...``: DDP with world size 1 records the
parameters, their layers and the op in which each gradient became ready;
``--shapes`` records every op's input shapes in one extra iteration,
``kineto_shapes.json``, docs/pytorch.md "Op input shapes").  Output: a
:class:`ModelGraph`, the model as a chain of **layers** (the units a strategy tree
names: ``manifest.extra.layers``, the child of the outermost ``nn.Sequential`` /
``nn.ModuleList`` on a parameter's path, else its top-level module), each with

* its forward ops in program order (measured duration, input shapes; Linear ops with
  their ``in``/``out`` features, which :mod:`.compiler` splits for tensor parallelism);
* its backward time;
* its parameter bytes and its activation bytes (what the forward keeps for the backward).

Rules (docs/simulate.md "Model graph"):

* **Forward op -> layer.**  The forward ops (kind FW) are walked in order; an op whose
  weight-position inputs (positions 1-3; position 0 for ``aten::embedding``) have the
  shape of a parameter not yet used moves the walk to that parameter's layer (the
  current layer first, then the later ones in registration order); other ops stay in the
  current layer.  Ops before the first parameterised op go to the first layer, the
  loss to the last.
* **Backward op -> layer.**  Each gradient-ready op (DDP's ``dpro::grad_ready`` markers)
  names a parameter, hence a layer; a backward op belongs to the layer of the next
  gradient-ready op at or after it (the gradient it is computing), the ops after the
  last one to that op's layer.
* **Loss**: the host ops (kind OTHER) between the first forward and the first backward op
  (``cross_entropy``, outside the module's forward) belong to the last layer.
* **Activation bytes** of a layer: with allocator samples (``dpro profile --memory``), what
  its backward frees (:func:`dpro_kit.optimize.memory.saved_activations`), spread over its
  ops in proportion to their input bytes; without them, the bytes of the non-parameter
  tensor inputs of its forward ops that are not views (``view``, ``reshape``, ...): an
  upper bound on what autograd saves (a tensor read by two ops is counted twice).
* **Transient bytes** (allocator samples only): the peak of the profiled run by the
  timeline model of :mod:`dpro_kit.optimize.memory` minus what the compiled graph holds when
  the backward starts (parameters, optimizer state, DDP buffers, every saved activation, the
  last layer's gradient) - the loss's and backward's temporaries.
* **Durations**: those of the iteration that stands for the job in ``dpro replay`` (the
  Session's rule, docs/accuracy.md: the median of one replay per profiled iteration, or
  every op's mean when the trace is large), so a one-rank strategy predicts what
  ``dpro replay`` predicts for the profile.
* ``update_us``: the optimizer step (kind UPDATE); ``other_us``: the rest of the
  iteration's host ops (kind OTHER: data, ``zero_grad``).

References
----------
.. [1] Duan et al., "Proteus: Simulating the Performance of Distributed DNN Training",
       §VII (op estimator: profiled operator costs) (``/work/shared/seeds/001_b74cee54beaaa4e0.txt``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DproError

#: ops that return views (no new memory, not saved for backward)
VIEW_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::select", "aten::slice",
    "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::t", "aten::unflatten", "aten::flatten",
    "aten::detach", "aten::as_strided", "aten::alias", "aten::contiguous", "aten::split", "aten::chunk",
    "aten::narrow", "aten::unbind", "aten::arange", "aten::full", "aten::zeros", "aten::ones", "aten::empty",
    "aten::dropout",  # p = 0 in eval-like configs; with p > 0 its mask is counted by the next op's input
})
#: Kineto "Input type" -> bytes per element
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
               "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8}
LINEAR_OPS = frozenset({"aten::linear"})


@dataclass
class Op:
    """One forward op of a layer.

    Attributes
    ----------
    name : str
        ATen name (``aten::linear``).
    fwd_us : float
        Measured duration (of the stand-in iteration; the median when several iterations are read).
    act_bytes : int
        Bytes of its non-parameter tensor inputs (0 for view ops).
    linear : tuple of int or None
        ``(in_features, out_features)`` of a Linear; None for other ops.
    in_bytes, out_bytes : int
        A Linear's input and output activation bytes (0 for other ops).
    weight_bytes, bias_bytes : int
        A Linear's weight and bias bytes (0 for other ops).
    """

    name: str
    fwd_us: float
    act_bytes: int = 0
    linear: tuple[int, int] | None = None
    in_bytes: int = 0
    out_bytes: int = 0
    weight_bytes: int = 0
    bias_bytes: int = 0
    #: measured ``(batch fraction, us)`` points of this op from profiles at other batch sizes
    #: (:func:`fit_batches`; the fraction is of the main profile's batch, which is ``(1, fwd_us)``);
    #: empty: one profile, time linear in the batch
    at: tuple[tuple[float, float], ...] = ()

    def time(self, x: float) -> float:
        """Duration at batch fraction ``x`` of the profiled batch (:func:`batch_time`)."""
        return batch_time(self.at or ((1.0, self.fwd_us),), x)


@dataclass
class Layer:
    """One layer (strategy-tree leaf) of the model."""

    name: str
    params: dict[str, int] = field(default_factory=dict)   # parameter name -> bytes
    ops: list[Op] = field(default_factory=list)
    bwd_us: float = 0.0
    #: bytes of the tensor that enters the layer (what a recomputed layer keeps, what a pipeline sends)
    input_bytes: int = 0
    #: measured ``(batch fraction, us)`` points of the backward (:attr:`Op.at`)
    bwd_at: tuple[tuple[float, float], ...] = ()

    @property
    def fwd_us(self) -> float:
        return float(sum(o.fwd_us for o in self.ops))

    def fwd_time(self, x: float) -> float:
        """Forward time at batch fraction ``x`` (the sum of its ops' :meth:`Op.time`)."""
        return float(sum(o.time(x) for o in self.ops))

    def bwd_time(self, x: float) -> float:
        """Backward time at batch fraction ``x`` (:func:`batch_time`)."""
        return batch_time(self.bwd_at or ((1.0, self.bwd_us),), x)

    @property
    def param_bytes(self) -> int:
        return int(sum(self.params.values()))

    @property
    def act_bytes(self) -> int:
        return int(sum(o.act_bytes for o in self.ops))


@dataclass
class ModelGraph:
    """The model as a chain of layers with measured times and sizes (module docstring).

    Attributes
    ----------
    layers : list of Layer
        Forward order.
    update_us : float
        Optimizer step of the whole model on one process.
    other_us : float
        Host ops outside forward/backward/update (data, zero_grad).
    optimizer_state_bytes : int
        Optimizer state of the whole model (collector's record, else 1 x parameters: SGD momentum).
    transient_bytes : int
        With allocator samples: the traced peak minus the parts the memory model counts.
    runtime_bytes : int
        The profiled process's measured peak minus its modelled one (0 unless measured).
    activation_source : str
        Where the layers' activation bytes come from.
    source : str
        The profile it came from.
    notes : list of str
        Assumptions made while reading it.
    """

    layers: list[Layer]
    update_us: float = 0.0
    other_us: float = 0.0
    optimizer_state_bytes: int = 0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: memory at the traced peak beyond parameters, gradients, optimizer state, buffers and saved
    #: activations (temporaries of the loss and backward), from allocator samples; 0 without them
    transient_bytes: int = 0
    #: memory every process holds that no part of the model is: framework and library buffers, Python
    #: objects, autograd's temporaries -- the profiled process's measured peak minus its modelled one
    #: (:func:`dpro_kit.simulate.predict.with_measured_peak`); 0 when not measured
    runtime_bytes: int = 0
    activation_source: str = ""
    #: the profiled job's communication backend (``manifest.comm_backend``: gloo, nccl, ...)
    comm_backend: str = ""
    #: measured ``(batch fraction, us)`` points of ``other_us`` (:attr:`Op.at`)
    other_at: tuple[tuple[float, float], ...] = ()
    #: batch fractions (of this profile's batch) at which op times were measured: ``[1.0]`` for one
    #: profile (times scale linearly), more after :func:`fit_batches`
    batch_fractions: list[float] = field(default_factory=lambda: [1.0])

    def other_time(self, x: float) -> float:
        """The host's other ops (data, ``zero_grad``) at batch fraction ``x``: interpolated
        (:func:`batch_time`) between profiles at several batch sizes; with one profile kept whole
        (part of them, ``zero_grad``, does not depend on the batch)."""
        return batch_time(self.other_at, x) if self.other_at else float(self.other_us)

    @property
    def batch_scaling(self) -> str:
        """How op times depend on the batch: ``linear`` (one profile) or ``fitted``."""
        return "fitted" if len(self.batch_fractions) > 1 else "linear"

    @property
    def param_bytes(self) -> int:
        return int(sum(layer.param_bytes for layer in self.layers))

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def describe(self) -> dict[str, Any]:
        """Per-layer facts as a JSON-able dict."""
        return {"source": self.source, "update_us": self.update_us, "other_us": self.other_us,
                "batch_scaling": self.batch_scaling, "batch_fractions": list(self.batch_fractions),
                "param_bytes": self.param_bytes, "optimizer_state_bytes": self.optimizer_state_bytes,
                "transient_bytes": self.transient_bytes, "runtime_bytes": self.runtime_bytes,
                "activation_source": self.activation_source,
                "layers": [{"name": lay.name, "fwd_us": round(lay.fwd_us, 3), "bwd_us": round(lay.bwd_us, 3),
                            **({"fwd_us_at": {f"{x:g}": round(lay.fwd_time(x), 3) for x in self.batch_fractions},
                                "bwd_us_at": {f"{x:g}": round(lay.bwd_time(x), 3) for x in self.batch_fractions}}
                               if len(self.batch_fractions) > 1 else {}),
                            "param_bytes": lay.param_bytes, "act_bytes": lay.act_bytes,
                            "linears": sum(1 for o in lay.ops if o.linear)} for lay in self.layers],
                "notes": list(self.notes)}


def batch_time(points: tuple[tuple[float, float], ...] | list[tuple[float, float]], x: float) -> float:
    """A duration at batch fraction ``x`` from measured ``(fraction, us)`` points (docs/simulate.md
    "Op time as a function of the batch").

    One point ``(x1, t1)``: ``t1 * x / x1`` (linear in the batch through 0: today's rule, an assumption).
    Two or more: the piecewise-linear interpolation of the points, and beyond the smallest / largest
    fraction the line through the two nearest points (``t(b) = a + c b`` with two profiles); never
    below 0.

    Examples
    --------
    >>> batch_time([(1.0, 40.0)], 0.25)
    10.0
    >>> batch_time([(0.5, 30.0), (1.0, 40.0)], 0.25)   # a = 20, c = 20 per batch
    25.0
    >>> batch_time([(0.25, 30.0), (0.5, 30.0), (1.0, 42.0)], 0.75)
    36.0
    """
    pts = sorted((float(a), float(b)) for a, b in points)
    if len(pts) == 1:
        x1, t1 = pts[0]
        return t1 * x / x1 if x1 > 0 else t1
    i = 1
    while i < len(pts) - 1 and x > pts[i][0]:
        i += 1
    (xa, ta), (xb, tb) = pts[i - 1], pts[i]
    t = ta + (tb - ta) * (x - xa) / (xb - xa) if xb != xa else ta
    return max(0.0, t)


def batch_fraction(main: ModelGraph, other: ModelGraph) -> float:
    """The batch of ``other``'s profile as a fraction of ``main``'s, from the op input shapes: the
    input bytes of the first layer that has any (the model's input: tokens, features), checked
    against every Linear's input bytes (each must scale by the same factor, else the profiles differ
    in more than the batch).

    Raises
    ------
    DproError
        No input bytes to compare, or the Linear inputs scale differently.
    """
    ref = next(((a, b) for a, b in zip(main.layers, other.layers) if a.input_bytes > 0), None)
    if ref is None or ref[1].input_bytes <= 0:
        raise DproError("cannot tell its batch size: no layer input recorded", path=other.source,
                        hint="profile it with `dpro profile --shapes` like the main profile")
    x = ref[1].input_bytes / ref[0].input_bytes
    for la, lb in zip(main.layers, other.layers):
        for k, (oa, ob) in enumerate(zip(la.ops, lb.ops)):
            if oa.in_bytes and abs(ob.in_bytes / oa.in_bytes - x) > 1e-6 * max(1.0, x):
                raise DproError(f"layer {la.name} op {k} ({oa.name}) input is {ob.in_bytes} B against {oa.in_bytes} B "
                                f"in {main.source}: {ob.in_bytes / oa.in_bytes:.4g}x, but the model's input is "
                                f"{x:.4g}x (the profiles differ in more than the batch size)", path=other.source,
                                hint="profile the same script at another --batch-size only")
    return float(x)


def fit_batches(main: ModelGraph, others: list[ModelGraph]) -> ModelGraph:
    """Give ``main``'s ops measured times at other batch sizes, from profiles of the same model.

    Every op, every layer's backward and the host's other ops (data, ``zero_grad``) get the
    points ``(x, t)``: ``x`` the profile's batch as a fraction of ``main``'s (:func:`batch_fraction`),
    ``t`` its median duration there; :meth:`Op.time` interpolates them (:func:`batch_time`).  Ops
    are matched by layer and position: the layers (names, parameters) and each layer's op names
    must be the same in every profile.  Activation bytes, parameters and the optimizer step stay
    ``main``'s (tensor sizes are linear in the batch; the step does not depend on it).

    Parameters
    ----------
    main : ModelGraph
        The profile whose batch is the job's global batch (fraction 1).
    others : list of ModelGraph
        The same script profiled at other batch sizes.

    Returns
    -------
    ModelGraph
        ``main``, modified in place.

    Raises
    ------
    DproError
        A profile with other layers, parameters or op sequence, the same batch as another, or
        Linear inputs that do not scale with the model's input (one line naming the profile).
    """
    seen = {1.0: main.source}
    for o in others:
        names_a, names_b = main.layer_names(), o.layer_names()
        if names_a != names_b:
            raise DproError(f"its layers ({', '.join(names_b)}) are not those of {main.source} ({', '.join(names_a)})",
                            path=o.source, hint="--profile-at-batch takes the same script at another --batch-size")
        for la, lb in zip(main.layers, o.layers):
            if la.params != lb.params:
                raise DproError(f"layer {la.name}: its parameters differ from {main.source}'s", path=o.source,
                                hint="--profile-at-batch takes the same model at another --batch-size")
            sa, sb = [op.name for op in la.ops], [op.name for op in lb.ops]
            if sa != sb:
                k = next((i for i, (p, q) in enumerate(zip(sa, sb)) if p != q), min(len(sa), len(sb)))
                what = (f"op {k} is {sb[k]} where {main.source} has {sa[k]}" if k < min(len(sa), len(sb))
                        else f"{len(sb)} forward ops where {main.source} has {len(sa)}")
                raise DproError(f"layer {la.name}: {what} (the op sequences differ)", path=o.source,
                                hint="profile the same script and library versions at another --batch-size")
        x = batch_fraction(main, o)
        key = round(x, 9)
        if key in seen:
            raise DproError(f"its batch is {x:g} x that of {main.source}, the same as {seen[key]}'s", path=o.source,
                            hint="give profiles at different batch sizes")
        seen[key] = o.source
        main.notes.extend(n for n in o.notes if n.startswith("op times of ") and n not in main.notes)
        for la, lb in zip(main.layers, o.layers):
            for oa, ob in zip(la.ops, lb.ops):
                oa.at = (oa.at or ((1.0, oa.fwd_us),)) + ((x, ob.fwd_us),)
            la.bwd_at = (la.bwd_at or ((1.0, la.bwd_us),)) + ((x, lb.bwd_us),)
        main.other_at = (main.other_at or ((1.0, main.other_us),)) + ((x, o.other_us),)
    main.batch_fractions = sorted(seen)
    if others:
        main.notes.append("op times measured at batch fractions " + ", ".join(f"{x:g}" for x in main.batch_fractions)
                          + " of the profiled batch (" + ", ".join(seen[round(x, 9)] for x in main.batch_fractions)
                          + "), interpolated between them")
    return main


def _numel(dims: Any) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _tensor_inputs(args: dict[str, Any]) -> list[tuple[int, tuple[int, ...], int]]:
    """(position, shape, bytes per element) of each tensor input recorded for an op."""
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else ""
        if isinstance(d, list) and d and t in DTYPE_BYTES and all(isinstance(x, int) for x in d):
            out.append((i, tuple(int(x) for x in d), DTYPE_BYTES[t]))
    return out


def _weight_positions(name: str) -> tuple[int, ...]:
    if name == "aten::embedding":
        return (0,)
    if name == "aten::batch_norm":
        return (1, 2)
    return (1, 2, 3)


def from_profile(path: str | Path, *, session: Any = None, allocator: bool = True) -> ModelGraph:
    """Read a :class:`ModelGraph` from a ``dpro profile --shapes`` trace of one process.

    Parameters
    ----------
    path : str or Path
        The trace directory.
    session : dpro_kit.session.Session or None
        An open session on ``path`` (the CLI's); None: one is opened (no clock alignment:
        one process has one clock).
    allocator : bool, default True
        Use the allocator samples for activations and transient memory when the profile has
        them (False: input shapes only).

    Raises
    ------
    DproError
        Not a torch profile, no parameters/gradient-ready ops (not run under DDP), no
        ``--shapes`` iteration, or no forward op.
    """
    from ..readers.torch_kineto import read_op_shapes
    from ..session import Session
    from ..trace import read_json

    s = session if session is not None else Session(path, align=False)
    if s.is_graph_file:
        raise DproError("dpro simulate needs a trace directory, not a graph file", path=path)
    ts = s.graph_trace            # the iteration dpro replay predicts from (one clock: one process)
    m = ts.manifest
    workers = m.workers()
    if not workers:
        raise DproError("the trace has no worker", path=path)
    node = workers[0]
    notes: list[str] = []
    from ..readers.torch_kineto import COST_NOT_MEASURED
    # op times that keep part of the profiler's cost (no unprofiled iteration to measure it on): say so, the
    # prediction inherits it (docs/simulate.md "Where the error comes from", 2026-11-27 sim3)
    notes.extend(f"op times of {path}: {w}" for w in (m.extra.get("warnings") or []) if COST_NOT_MEASURED in str(w))
    if len(workers) > 1:
        notes.append(f"the profile has {len(workers)} ranks; the model is read from {node} (a single-process "
                     "profile is the intended input)")
    info = m.nodes[node]
    node_dir = Path(ts.path) / (info.dir or node)
    meta_path = node_dir / "meta.json"
    meta = read_json(meta_path, what="rank meta.json") if meta_path.exists() else {}
    shapes = read_op_shapes(node_dir) if meta_path.exists() else {}
    if not shapes:
        raise DproError("the profile has no op shapes", path=path,
                        hint="profile one process with `dpro profile --shapes` (docs/simulate.md)")
    # parameters: names, bytes, shapes, layers, registration order
    layer_map = m.facts.layers or {}
    shape_of: dict[str, tuple[int, ...]] = {}
    order: list[str] = []
    for entry in meta.get("ddp") or []:
        for p in entry.get("params") or []:
            nm = str(p.get("name"))
            shape_of[nm] = tuple(int(x) for x in p.get("shape") or [])
            order.append(nm)
    from ..graph.schemes import is_allreduce
    from ..optimize.memory import layer_of
    pbytes: dict[str, int] = {}
    ready: dict[str, str] = {}
    for c in ts.collectives:
        if not is_allreduce(c):
            continue
        for j, nm in enumerate(c.params):
            if j < len(c.param_bytes):
                pbytes[nm] = int(c.param_bytes[j])
            ops = (c.param_ready or {}).get(node) or []
            if j < len(ops) and ops[j]:
                ready[nm] = str(ops[j])
    if not pbytes:
        raise DproError("the profile records no parameters (no DDP bucket)", path=path,
                        hint="run the script under DistributedDataParallel with one process "
                             "(e.g. examples/ddp/train.py --nproc 1)")
    if not order:
        order = sorted(pbytes)
    layers: dict[str, Layer] = {}
    for nm in order:
        if nm in pbytes:
            lay = layer_of(nm, layer_map)
            layers.setdefault(lay, Layer(name=lay)).params[nm] = pbytes[nm]
    names = list(layers)
    ev = ts.events
    ev = ev[ev["node"] == node]
    stream = ev["stream"].astype(str)
    ev = ev[(stream != "comm") & ~stream.str.startswith("gpu")]
    iters = sorted(int(i) for i in ev["iteration"].unique())
    if not iters:
        raise DproError("the profile has no iteration", path=path)
    per_iter: list[tuple[list[list[tuple[str, float, dict]]], list[float], float, float]] = []
    for it in iters:
        e = ev[ev["iteration"] == it].sort_values("start", kind="stable")
        kinds = e["kind"].astype(str).to_list()
        ids = e["op"].astype(str).to_list()
        opnames = e["name"].astype(str).to_list()
        durs = e["dur"].to_numpy(dtype=float)
        # forward ops -> layers (shape matching)
        remaining = {n: sorted(shape_of.get(p, ()) for p in layers[n].params) for n in names}
        cur = 0
        fwd: list[list[tuple[str, float, dict]]] = [[] for _ in names]
        first_fw = next((i for i, k in enumerate(kinds) if k == "FW"), len(kinds))
        first_bw = next((i for i, k in enumerate(kinds) if k == "BW"), len(kinds))
        loss = [i for i in range(first_fw, first_bw) if kinds[i] == "OTHER"]
        loss_in = 0
        for i, (k, oid, nm, d) in enumerate(zip(kinds, ids, opnames, durs)):
            if i in loss:   # the loss: outside the model's forward, before the backward -> the last layer
                fwd[len(names) - 1].append((nm, float(d), shapes.get(oid, {})))
                if nm not in VIEW_OPS:
                    loss_in = max([loss_in] + [_numel(shp) * b for _p, shp, b in _tensor_inputs(shapes.get(oid, {}))[:1]])
                continue
            if k != "FW":
                continue
            args = shapes.get(oid, {})
            for pos, shp, _b in _tensor_inputs(args):
                if pos not in _weight_positions(nm):
                    continue
                for j in range(cur, len(names)):
                    if shp in remaining[names[j]]:
                        remaining[names[j]].remove(shp)
                        cur = j
                        break
            fwd[cur].append((nm, float(d), args))
        # backward ops -> layers (next gradient-ready op)
        bwd = [0.0] * len(names)
        pos_of = {oid: i for i, oid in enumerate(ids)}
        marks = sorted((pos_of[o], names.index(layer_of(p, layer_map))) for p, o in ready.items()
                       if o in pos_of and layer_of(p, layer_map) in layers)
        bw_idx = [i for i, k in enumerate(kinds) if k == "BW"]
        mi = 0
        for i in bw_idx:
            while mi < len(marks) and marks[mi][0] < i:
                mi += 1
            lay = marks[mi][1] if mi < len(marks) else (marks[-1][1] if marks else 0)
            bwd[lay] += float(durs[i])
        upd = float(sum(d for k, d in zip(kinds, durs) if k == "UPDATE"))
        oth = float(sum(d for i, (k, d) in enumerate(zip(kinds, durs)) if k == "OTHER" and i not in loss))
        per_iter.append((fwd, bwd, upd, oth, loss_in))
    if not any(per_iter[0][0]):
        raise DproError("the profile has no forward op (kind FW)", path=path)
    # medians over iterations; op lists from the median-length iteration, durations per position
    out_layers = []
    for li, n in enumerate(names):
        lay = layers[n]
        seqs = [p[0][li] for p in per_iter]
        ref = seqs[len(seqs) // 2]
        same = [sq for sq in seqs if [o[0] for o in sq] == [o[0] for o in ref]]
        for k, (nm, _d, args) in enumerate(ref):
            dur = statistics.median(sq[k][1] for sq in same)
            tin = _tensor_inputs(args)
            wpos = _weight_positions(nm)
            pshapes = {shape_of.get(p) for p in lay.params}
            acts = [(pos, shp, b) for pos, shp, b in tin if not (pos in wpos and shp in pshapes)]
            act = 0 if nm in VIEW_OPS else int(sum(_numel(shp) * b for _p, shp, b in acts))
            op = Op(name=nm, fwd_us=float(dur), act_bytes=act)
            if nm in LINEAR_OPS and len(tin) >= 2 and tin[0][0] == 0 and tin[1][0] == 1 and len(tin[1][1]) == 2:
                out_f, in_f = tin[1][1]
                x_shape, xb = tin[0][1], tin[0][2]
                op.linear = (int(in_f), int(out_f))
                op.in_bytes = _numel(x_shape) * xb
                op.out_bytes = op.in_bytes // max(1, in_f) * out_f
                op.weight_bytes = _numel(tin[1][1]) * tin[1][2]
                op.bias_bytes = _numel(tin[2][1]) * tin[2][2] if len(tin) >= 3 and tin[2][0] == 2 else 0
            lay.ops.append(op)
        if lay.ops:
            first = next((a for a in (_tensor_inputs(o[2]) for o in ref) if a), [])
            acts0 = [(pos, shp, b) for pos, shp, b in first if shp not in {shape_of.get(p) for p in lay.params}]
            lay.input_bytes = int(_numel(acts0[0][1]) * acts0[0][2]) if acts0 else 0
        lay.bwd_us = float(statistics.median(p[1][li] for p in per_iter))
        out_layers.append(lay)
    opt = m.facts.optimizer_state_bytes
    total_p = sum(lay.param_bytes for lay in out_layers)
    if opt is None:
        opt = total_p
        notes.append("optimizer state assumed 1 x parameters (the profile does not record it)")
    # without allocator samples: the loss's backward temporaries, from shapes -- when the backward starts
    # the gradient of the loss's input (the logits) and the gradient it is computed from (the same shape:
    # log_softmax's output gradient) exist together, beside the saved output the activations count
    # (docs/simulate.md "Memory per device"); 2 x the loss's largest input, 0 when the profile has no loss op
    transient = 2 * int(statistics.median(p[4] for p in per_iter))
    act_source = "input shapes (upper bound; profile with --memory for the allocator's)"
    from ..optimize.memory import MemoryModel, build_profile, saved_activations
    prof = build_profile(s.profiled) if allocator and not s.profiled.memory.empty else None
    if prof is not None:
        saved = saved_activations(prof)
        for lay in out_layers:
            if lay.name not in saved:
                continue
            tot = lay.act_bytes
            for o in lay.ops:   # the allocator's total, spread over the ops as their input bytes are
                o.act_bytes = int(round(saved[lay.name] * (o.act_bytes / tot if tot else 0.0)))
            if not tot and lay.ops:
                lay.ops[0].act_bytes = saved[lay.name]
        traced = MemoryModel(profile=prof).peak()
        per = prof.persistent
        # the replayed timeline of the profiled run peaks when its backward starts: every activation
        # alive and the last layer's gradient taken (compiler.annotate_memory)
        modelled = per["params"] + per["comm_buffers"] + per["optimizer_state"] + out_layers[-1].param_bytes \
            + sum(lay.act_bytes for lay in out_layers)
        transient = max(0, int(traced["peak_bytes"]) - int(modelled))
        act_source = ("allocator (dpro profile --memory): what each layer's backward frees; transient = the traced "
                      f"peak {int(traced['peak_bytes'])} B - the model's parts for the profiled run")
    return ModelGraph(layers=out_layers, update_us=float(statistics.median(p[2] for p in per_iter)),
                      other_us=float(statistics.median(p[3] for p in per_iter)), optimizer_state_bytes=int(opt),
                      source=str(path), notes=notes, transient_bytes=transient, activation_source=act_source,
                      comm_backend=str(m.comm_backend or ""))


__all__ = ["DTYPE_BYTES", "Layer", "ModelGraph", "Op", "VIEW_OPS", "batch_fraction", "batch_time", "fit_batches",
           "from_profile"]
