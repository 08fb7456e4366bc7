"""Apply a ``dpro optimize`` plan (plan.json) to a real PyTorch DDP job with stock APIs.

A plan names tensor groups — lists of parameter names, in reduction order, each
reduced as one collective or as ``partitions`` collectives of ``partition_bytes``
— and a DDP ``bucket_cap_mb`` with an ``exact`` flag (``dpro_kit.optimize.plan`` writes it,
in the format of ``dpro_collect.plan``).
DDP can express the groups in two ways, and :func:`apply_plan` says which it used:

* **bucket cap** — when the plan says ``exact`` (DDP's own size-based bucketing
  with ``bucket_cap_mb`` reproduces the groups in the traced gradient order) and
  no group is partitioned, DDP's buckets *are* the plan's groups: nothing runs in
  Python during backward;
* **comm hook** — otherwise DDP is built with a 1-byte bucket cap, so after its
  bucket rebuild every parameter is its own bucket and the hook sees each
  gradient as soon as DDP launches it; the hook (:func:`_plan_comm_hook`) holds
  the buckets of a group until its last member arrives, then launches one
  allreduce of the flattened group (or one per partition) and completes every
  member bucket's future with the averaged gradients.  The hook maps buckets to
  parameters by identity on every call, so DDP's first iteration (one bucket
  holding everything; with ``static_graph`` a delayed reduction) and its bucket
  rebuild need no special case, and coarser buckets (a DDP that was built with
  another cap) still give the exact groups — a group then starts only when the
  DDP bucket holding its last member is ready;
* **closest bucket cap** — when a hook is not possible (one is registered
  already, sparse gradients, a group mixes dtypes, ``mode="cap"``): the plan's
  ``bucket_cap_mb``, which for a non-exact plan is its largest group.

Usage (each rank)::

    from dpro_torch.plan import apply_plan
    applied = apply_plan(net, "plan.json")          # builds DistributedDataParallel(net, ...)
    ddp = applied.model; print(applied.description)

or ``DistributedDataParallel(net, **ddp_kwargs("plan.json"), ...)`` then
``apply_plan(ddp, "plan.json")``.  Plans are JSON (never pickled or evaluated)
and checked with :func:`dpro_collect.plan.validate_plan`; parameter names are
checked against the model before anything is built.  Only the tensor groups and
partitions are applied: op-fusion regions (``frameworks.torch_compile``) and memory
choices (recomputation, gradient accumulation) change the model or the training loop,
so they are left to the job (a warning names the memory choices).
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from dpro_collect.errors import DproError
from dpro_collect.plan import PLAN_FORMAT, PLAN_VERSION, validate_plan

__all__ = ["AppliedPlan", "PlanGroup", "PlanHookState", "apply_plan", "ddp_kwargs", "deft_settings", "load_plan", "plan_groups",
           "ddp_buckets", "cap_bytes_of", "HOOK_BUCKET_CAP_MB"]

#: DDP ``bucket_cap_mb`` for the comm-hook mode: 1 byte, so every parameter closes its own bucket
#: (DDP closes a bucket once its size reaches the cap; torch 2.13 applies an explicit cap to the
#: first bucket too — older versions kept a 1 MiB first bucket, which the hook also handles)
HOOK_BUCKET_CAP_MB = 1.0 / 2**20

PlanLike = Union[dict, str, Path]


# --------------------------------------------------------------------------- plan loading

def load_plan(plan: PlanLike) -> tuple[dict[str, Any], str]:
    """The validated plan document and a label for messages (its file name, or ``"plan"``).

    Why validate here: a plan is written by one machine and applied on others,
    possibly by another dpro version; a wrong file must fail at start-up with
    the file and the field named, not as a hang inside a collective.
    """
    if isinstance(plan, dict):
        doc, where = plan, "plan"
    elif isinstance(plan, (str, Path)):
        path = Path(plan)
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DproError("plan file not found", path=path,
                            hint="write one with `dpro optimize TRACE_DIR -o plan.json`") from None
        except OSError as exc:
            raise DproError(f"cannot read the plan: {exc.strerror or exc}", path=path) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DproError(f"not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})", path=path,
                            hint="plan.json is written by `dpro optimize -o`") from None
    else:
        raise DproError(f"a plan is a dict or a path to plan.json, got {type(plan).__name__}")
    version = doc.get("version") if isinstance(doc, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > PLAN_VERSION:
        raise DproError(f"plan version {doc['version']} is newer than this dpro_torch understands "
                        f"({PLAN_VERSION})", path=_path(where))
    try:
        validate_plan(doc)
    except DproError as exc:
        raise DproError(f"not a valid dpro plan: {exc.what}", path=_path(where),
                        hint=f"expected {PLAN_FORMAT!r} version {PLAN_VERSION} from `dpro optimize -o`") from None
    # consistency the schema cannot say
    seen: dict[str, str] = {}
    for i, g in enumerate(doc["tensor_groups"]):
        rec = f"tensor_groups[{i}] ({g['name']})"
        if not g["params"]:
            raise DproError("group has no parameter names", path=_path(where), record=rec,
                            hint="the trace had no per-parameter gradient sizes; re-profile with dpro_torch")
        if g["partitions"] < 1 or len(g["partition_bytes"]) != g["partitions"]:
            raise DproError(f"partitions={g['partitions']} but {len(g['partition_bytes'])} partition_bytes",
                            path=_path(where), record=rec)
        for p in g["params"]:
            if p in seen:
                raise DproError(f"parameter {p!r} is in two groups ({seen[p]} and {g['name']})",
                                path=_path(where), record=rec)
            seen[p] = g["name"]
    return doc, where


def _path(where: str) -> str | None:
    """The file for DproError messages (None for a plan given as a dict)."""
    return None if where == "plan" else where


@dataclass(frozen=True)
class PlanGroup:
    """One tensor group of a plan, resolved against a model."""

    name: str
    params: tuple[str, ...]          # reduction order (the plan's)
    partitions: tuple[int, ...]      # elements per collective (one entry = no partition)
    numel: int
    from_plan: bool = True           # False: a parameter the plan does not name (its own group)


def _partition_numels(numel: int, plan_bytes: int, part_bytes: list[int]) -> tuple[int, ...]:
    """The plan's partition sizes in elements of this group (boundaries scaled to the real size)."""
    k = min(len(part_bytes), max(1, numel))
    if k == 1:
        return (numel,)
    total = max(1, int(plan_bytes) or sum(part_bytes))
    bounds, acc = [0], 0
    for b in part_bytes[:k - 1]:
        acc += int(b)
        bounds.append(min(numel, max(bounds[-1] + 1, round(acc * numel / total))))
    bounds.append(numel)
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _module_of(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def _resolve_names(doc: dict[str, Any], where: str, module: nn.Module) -> dict[str, str]:
    """plan name -> model name; accepts names recorded with a ``module.`` prefix (from the DDP wrapper)."""
    names = {n for n, _ in module.named_parameters()}
    wanted = [p for g in doc["tensor_groups"] for p in g["params"]]
    out = {}
    missing = []
    for p in wanted:
        if p in names:
            out[p] = p
        elif p.startswith("module.") and p[len("module."):] in names:
            out[p] = p[len("module."):]
        else:
            missing.append(p)
    if missing:
        have = sorted(names)
        raise DproError(f"{len(missing)} parameter name(s) of the plan are not in the model: "
                        f"{', '.join(repr(m) for m in missing[:5])}{' ...' if len(missing) > 5 else ''}",
                        path=_path(where),
                        hint=f"the plan was made for another model? the model has {len(have)} parameters, e.g. "
                             f"{', '.join(have[:4])}")
    return out


def plan_groups(plan: PlanLike, model: nn.Module) -> tuple[list[PlanGroup], list[str]]:
    """The plan's groups resolved against ``model``'s trainable parameters, and warnings.

    Parameters the plan does not name become groups of their own (after the
    plan's groups); plan parameters that DDP does not reduce (``requires_grad``
    False, or in DDP's ``parameters_to_ignore``) are dropped.  Both are reported as warnings, not errors: the plan is
    still right for the parameters it covers.
    """
    doc, where = load_plan(plan)
    return _groups(doc, where, model)


def _groups(doc: dict[str, Any], where: str, model: nn.Module,
            ignored: frozenset[str] = frozenset()) -> tuple[list[PlanGroup], list[str]]:
    """:func:`plan_groups` for a loaded plan; ``ignored``: names DDP does not reduce (``parameters_to_ignore``)."""
    module = _module_of(model)
    to_model = _resolve_names(doc, where, module)
    params = dict(module.named_parameters())
    trainable = [n for n, p in params.items() if p.requires_grad and n not in ignored]
    warn: list[str] = []
    groups: list[PlanGroup] = []
    frozen = []
    for g in doc["tensor_groups"]:
        names = [to_model[p] for p in g["params"]]
        frozen += [n for n in names if not params[n].requires_grad or n in ignored]
        names = [n for n in names if params[n].requires_grad and n not in ignored]
        if not names:
            continue
        numel = sum(params[n].numel() for n in names)
        groups.append(PlanGroup(g["name"], tuple(names), _partition_numels(numel, g["bytes"], g["partition_bytes"]),
                                numel))
    if frozen:
        warn.append(f"{len(frozen)} parameter(s) of the plan are not reduced by DDP (requires_grad=False or "
                    "DDP's parameters_to_ignore): "
                    f"{', '.join(frozen[:5])}")
    covered = {n for g in groups for n in g.params}
    extra = [n for n in trainable if n not in covered]
    if extra:
        warn.append(f"{len(extra)} parameter(s) are not in the plan and are reduced as their own groups: "
                    f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
        for n in reversed(extra):   # gradients usually become ready in reverse definition order
            groups.append(PlanGroup(f"unplanned:{n}", (n,), (params[n].numel(),), params[n].numel(),
                                    from_plan=False))
    actual = {g["name"]: sum(params[to_model[p]].numel() * params[to_model[p]].element_size()
                             for p in g["params"]) for g in doc["tensor_groups"]}
    off = [g["name"] for g in doc["tensor_groups"] if actual[g["name"]] != g["bytes"]]
    if off:
        warn.append(f"{len(off)} group(s) have another size in the model than in the plan (e.g. {off[0]}: "
                    f"{actual[off[0]]} vs {next(g['bytes'] for g in doc['tensor_groups'] if g['name'] == off[0])} "
                    "bytes); partitions are scaled to the real size")
    return groups, warn


def _needs_hook(doc: dict[str, Any]) -> tuple[bool, str]:
    ddp = doc["frameworks"]["pytorch_ddp"]
    if not ddp["exact"]:
        return True, "no single bucket_cap_mb reproduces the groups"
    if any(g["partitions"] > 1 for g in doc["tensor_groups"]):
        return True, "a group is partitioned (DDP buckets cannot be split)"
    return False, ""


def ddp_kwargs(plan: PlanLike, mode: str = "auto") -> dict[str, Any]:
    """``DistributedDataParallel`` keyword arguments for ``plan`` (pass them when wrapping the model).

    Why a separate helper: DDP's bucket cap is fixed at construction, so a job
    that builds DDP itself must know it before calling :func:`apply_plan`.
    ``mode`` as in :func:`apply_plan`: the plan's cap when DDP reproduces the
    groups (or ``mode="cap"``), else a 1-byte cap (one bucket per parameter)
    for the comm hook.
    """
    doc, _ = load_plan(plan)
    _check_mode(mode)
    ddp_doc = doc["frameworks"]["pytorch_ddp"]
    if ddp_doc.get("keep_traced") and mode != "hook":
        return {"bucket_cap_mb": None if ddp_doc.get("traced_default_cap") else _plan_cap_mb(doc)}
    hook, _ = _needs_hook(doc)
    if mode == "hook" or (mode == "auto" and hook):
        return {"bucket_cap_mb": HOOK_BUCKET_CAP_MB}
    return {"bucket_cap_mb": _plan_cap_mb(doc)}


def _check_mode(mode: str) -> None:
    if mode not in ("auto", "hook", "cap", "deft"):
        raise DproError(f"mode must be 'auto', 'hook', 'cap' or 'deft', got {mode!r}")


def _bucket_index(name: Any, where: str, field_name: str) -> int:
    k = str(name).removeprefix("bucket")
    if not k.isdigit():
        raise DproError(f"deft.{field_name}: {name!r} is not a bucket name (bucket<k>)", path=_path(where),
                        hint="plan['deft'] is written by `dpro optimize TRACE --deft`")
    return int(k)


def deft_settings(plan: PlanLike) -> dict[str, Any]:
    """The plan's DeFT section as :func:`apply_plan` ``mode="deft"`` applies it, checked before any rank
    starts: ``defer`` and ``link1`` (bucket indices), ``bucket_cap_mb`` (as traced; None: DDP's
    default), ``bucket_bytes`` (traced, by index), ``measured`` (the Preserver's loop ran).

    Raises :class:`DproError` (file and field named) for a plan without a valid ``deft`` section, or one
    that puts buckets on a second link while ``$DPRO_LINK1_IFNAME`` is not set.
    """
    return _deft_settings(*load_plan(plan))


def _deft_settings(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """``plan["deft"]`` checked, as :func:`deft_settings` returns it (and ``cap_known``: the section
    names the traced bucket cap)."""
    sec = doc.get("deft")
    if not isinstance(sec, dict):
        raise DproError("mode='deft': the plan has no 'deft' section", path=_path(where),
                        hint="write one with `dpro optimize TRACE --deft [--links R0,R1]`")
    delays, links = sec.get("delays"), sec.get("links", {})
    if not isinstance(delays, dict) or not isinstance(links, dict):
        raise DproError("deft.delays / deft.links must be objects of bucket<k> -> int", path=_path(where))
    for fld, d in (("delays", delays), ("links", links)):
        for k, v in d.items():
            if not isinstance(v, int) or isinstance(v, bool) or v not in (0, 1):
                raise DproError(f"deft.{fld}[{k!r}] = {v!r}: must be 0 or 1 (the hook delays by one iteration, "
                                "over at most two links)", path=_path(where))
    defer = sorted(_bucket_index(k, where, "delays") for k, v in delays.items() if v)
    on1 = sorted(_bucket_index(k, where, "links") for k, v in links.items() if v)
    ddp = sec.get("ddp") if isinstance(sec.get("ddp"), dict) else {}
    cap = ddp.get("bucket_cap_mb")
    if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0):
        raise DproError(f"deft.ddp.bucket_cap_mb = {cap!r}: must be a positive number or null", path=_path(where))
    sizes = {}
    for k, v in (sec.get("bucket_bytes") or {}).items():
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            sizes[_bucket_index(k, where, "bucket_bytes")] = v
    pres = sec.get("preserver") if isinstance(sec.get("preserver"), dict) else {}
    measured = not str(pres.get("note", "")).startswith("not measured")
    if on1 and not os.environ.get("DPRO_LINK1_IFNAME"):
        raise DproError(f"the plan puts bucket(s) {', '.join(map(str, on1))} on a second link, and "
                        "DPRO_LINK1_IFNAME is not set", path=_path(where),
                        hint="set DPRO_LINK1_IFNAME to the second network interface on every host "
                             "(dpro cluster --second-rate-mbit R sets it), or plan with one link")
    return {"defer": defer, "link1": on1, "bucket_cap_mb": float(cap) if cap is not None else None,
            "bucket_bytes": sizes, "measured": measured, "cap_known": isinstance(sec.get("ddp"), dict)}


# --------------------------------------------------------------------------- the comm hook

class _Iteration:
    """Per-iteration hook bookkeeping; a new one starts when every parameter has arrived.

    Kept separate from :class:`PlanHookState` so that allreduce callbacks of an
    iteration still complete *that* iteration's bucket futures even if the next
    iteration has started.
    """

    def __init__(self, number: int) -> None:
        self.number = number
        self.grads: dict[str, torch.Tensor] = {}        # parameter -> its gradient view in a bucket buffer
        self.bucket_of: dict[str, int] = {}              # parameter -> bucket index
        self.buckets: dict[int, list[Any]] = {}          # bucket index -> [future, buffer, groups pending]
        self.launched: set[int] = set()


class PlanHookState:
    """State of :func:`_plan_comm_hook` (the ``state`` of ``register_comm_hook``).

    ``launches`` (with ``record=True``: every launch; else only the latest
    iteration's) lists what the hook reduced: iteration, group, parameters and
    elements per collective — the evidence that the plan's groups ran.
    """

    def __init__(self, groups: list[PlanGroup], params: dict[str, torch.Tensor],
                 process_group: Any = None, record: bool = False) -> None:
        self.groups = groups
        self.group_of = {n: i for i, g in enumerate(groups) for n in g.params}
        self._by_id = {id(p): n for n, p in params.items() if n in self.group_of}
        self._by_ptr = {p.data_ptr(): n for n, p in params.items() if n in self.group_of and p.numel()}
        self.process_group = process_group
        self.record = record
        self.launches: list[dict[str, Any]] = []
        self.iterations = 0                              # completed hook iterations
        self.incomplete: list[str] = []                  # planned parameters DDP did not reduce (should be none)
        self.collectives = 0
        self._lock = threading.Lock()
        self._it = _Iteration(0)

    def name_of(self, p: torch.Tensor) -> str:
        """Parameter name by identity (data pointer as a fallback: the bucket may hand out another wrapper)."""
        n = self._by_id.get(id(p))
        if n is None:
            n = self._by_ptr.get(p.data_ptr())
        if n is None:
            raise RuntimeError("dpro plan comm hook: DDP reduced a parameter that is not in the plan's model "
                               f"(shape {tuple(p.shape)}); was apply_plan given another model?")
        return n

    def _world(self) -> int:
        return dist.get_world_size(self.process_group)

    # called by the hook, one bucket at a time, in bucket-index order
    def on_bucket(self, bucket: Any) -> torch.futures.Future:
        buf = bucket.buffer()
        if buf.is_sparse:
            raise RuntimeError("dpro plan comm hook: sparse gradients are not supported; build DDP with "
                               "apply_plan(..., mode='cap')")
        names = [self.name_of(p) for p in bucket.parameters()]
        grads = bucket.gradients()
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            it = self._it
            dup = [n for n in names if n in it.grads]
            if dup:
                raise RuntimeError(f"dpro plan comm hook: parameter {dup[0]!r} reduced twice in one iteration")
            idx = int(bucket.index())
            touched = sorted({self.group_of[n] for n in names})
            it.buckets[idx] = [fut, buf, set(touched)]
            for n, g in zip(names, grads):
                it.grads[n] = g
                it.bucket_of[n] = idx
            ready = [gi for gi in touched if gi not in it.launched
                     and all(n in it.grads for n in self.groups[gi].params)]
            it.launched.update(ready)
            partial: list[int] = []
            if bucket.is_last() and len(it.grads) < len(self.group_of):
                # DDP's last bucket, yet some parameter never came (DDP does not reduce it): reduce what did
                # come rather than leave DDP waiting forever on the member buckets' futures
                partial = [gi for gi, g in enumerate(self.groups)
                           if gi not in it.launched and any(n in it.grads for n in g.params)]
                it.launched.update(partial)
                missing = [n for n in self.group_of if n not in it.grads]
                if not self.incomplete:
                    warnings.warn(f"dpro plan comm hook: DDP did not reduce {len(missing)} planned parameter(s) "
                                  f"({', '.join(missing[:3])}); their groups are reduced without them")
                self.incomplete = missing
            if len(it.grads) == len(self.group_of) or bucket.is_last():   # next call: a new iteration
                self._it = _Iteration(it.number + 1)
                self.iterations += 1
                if not self.record:
                    self.launches = [x for x in self.launches if x["iteration"] == it.number]
        for gi in ready:       # plan order among the groups this bucket completed: the same on every rank
            self._launch(it, gi)
        for gi in partial:
            self._launch(it, gi)
        return fut

    def _launch(self, it: _Iteration, gi: int) -> None:
        g = self.groups[gi]
        if any(n not in it.grads for n in g.params):       # see on_bucket: a group some parameters never joined
            arrived = tuple(n for n in g.params if n in it.grads)
            numel = sum(it.grads[n].numel() for n in arrived)
            g = PlanGroup(g.name, arrived, (numel,), numel, g.from_plan)
        views = [it.grads[n] for n in g.params]
        flat = _contiguous_view(views, it.buckets[it.bucket_of[g.params[0]]][1]) \
            if len({it.bucket_of[n] for n in g.params}) == 1 else None
        copied = flat is None
        if copied:
            flat = torch.cat([v.reshape(-1) for v in views])
        parts = flat.split(list(g.partitions)) if len(g.partitions) > 1 else (flat,)
        futs = [dist.all_reduce(part, group=self.process_group, async_op=True).get_future() for part in parts]
        world = self._world()
        with self._lock:
            self.collectives += len(parts)
            self.launches.append({"iteration": it.number, "group": g.name, "params": list(g.params),
                                  "numel": int(flat.numel()), "partitions": [int(p.numel()) for p in parts],
                                  "from_plan": g.from_plan})

        def done(_: Any) -> None:
            for f in futs:                 # re-raise a failed collective into DDP's wait
                f.value()
            flat.div_(world)
            if copied:
                off = 0
                for v in views:
                    n = v.numel()
                    v.copy_(flat[off:off + n].view_as(v))
                    off += n
            finished = []
            with self._lock:
                for bi in {it.bucket_of[n] for n in g.params}:
                    entry = it.buckets[bi]
                    entry[2].discard(gi)
                    if not entry[2]:
                        finished.append(entry)
            for f, buf, _ in finished:
                f.set_result(buf)

        def failed(all_done: torch.futures.Future) -> None:
            try:
                done(all_done)
            except Exception as exc:       # complete the member buckets with the error, never leave DDP hanging
                with self._lock:
                    entries = [it.buckets[bi] for bi in {it.bucket_of[n] for n in g.params}]
                for f, _, _ in entries:
                    if not f.done():
                        f.set_exception(exc)

        torch.futures.collect_all(futs).then(failed)


def _contiguous_view(views: list[torch.Tensor], buf: torch.Tensor) -> torch.Tensor | None:
    """The slice of ``buf`` holding ``views`` back to back in plan order (no copy), else None."""
    es = buf.element_size()
    start = views[0].data_ptr()
    pos = start
    for v in views:
        if v.data_ptr() != pos or not v.is_contiguous():
            return None
        pos += v.numel() * es
    off = (start - buf.data_ptr()) // es
    return buf.narrow(0, off, sum(v.numel() for v in views))


def _plan_comm_hook(state, bucket):   # no annotations: DDP compares them by identity and this module uses
    """DDP comm hook: reduce the plan's tensor groups instead of DDP's buckets (see :class:`PlanHookState`)."""
    return state.on_bucket(bucket)    # postponed (string) annotations, which DDP's check would refuse


# --------------------------------------------------------------------------- applying

@dataclass
class AppliedPlan:
    """What :func:`apply_plan` did.

    ``mode`` is ``"bucket_cap"`` (DDP's buckets are the plan's groups),
    ``"comm_hook"`` (exact groups through :func:`_plan_comm_hook`) or
    ``"closest_bucket_cap"`` (not exact), ``"deft"`` (``hook_state`` is the
    :class:`dpro_torch.deft.DeferredBuckets`; call its ``flush()`` before
    destroying the process group); ``description`` says it in one line.
    """

    model: DistributedDataParallel
    mode: str
    description: str
    bucket_cap_mb: float
    groups: list[PlanGroup]
    hook_state: PlanHookState | None = None
    warnings: list[str] = field(default_factory=list)
    source: str = "plan"
    #: mode "deft": the traced bytes of bucket k (``plan["deft"]["bucket_bytes"]``), checked by :meth:`verify`
    deft_bucket_bytes: dict[int, int] = field(default_factory=dict)

    def verify(self) -> tuple[bool, str]:
        """Whether the groups really reduced are the plan's (call after at least two iterations).

        Comm hook: the compositions of the latest completed iteration's launches.
        Bucket cap: DDP's current buckets (after its rebuild).  Why: the plan's
        exactness rests on the traced gradient order, which the run may not
        repeat; this says so instead of silently reducing something else.
        """
        if self.mode == "deft":
            return self._verify_deft()
        want = [list(g.params) for g in self.groups]
        if self.hook_state is not None:
            st = self.hook_state
            if st.iterations == 0:
                return False, "no iteration reduced through the hook yet"
            last = st.iterations - 1
            if st.incomplete:
                return False, f"iteration {last}: DDP did not reduce {len(st.incomplete)} planned parameter(s)"
            got = [list(x["params"]) for x in st.launches if x["iteration"] == last]
            ok = sorted(got) == sorted(want)
            return ok, (f"iteration {last}: the {len(got)} groups reduced are the plan's" if ok
                        else f"iteration {last}: the {len(got)} groups reduced differ from the plan's {len(want)}")
        got = ddp_buckets(self.model)
        if got is None:
            return False, "cannot read DDP's buckets"
        ok = [sorted(b) for b in got] == [sorted(g) for g in want]
        return ok, (f"DDP's {len(got)} buckets are the plan's groups" if ok
                    else f"DDP's {len(got)} buckets differ from the plan's {len(want)} groups "
                         f"(gradient order differs from the trace?); use mode='hook' for exact groups")


    def _verify_deft(self) -> tuple[bool, str]:
        """DeFT mode: DDP's rebuilt buckets have the traced sizes (bucket<k> is the bucket the section
        means) and every deferred bucket went through the hook."""
        st = self.hook_state
        got = ddp_buckets(self.model)
        if got is None:
            return False, "cannot read DDP's buckets"
        params = dict(self.model.module.named_parameters())
        have = [sum(params[n].numel() * params[n].element_size() for n in b) for b in got]
        want = self.deft_bucket_bytes
        diff = [k for k, v in want.items() if k >= len(have) or have[k] != v]
        if len(want) and (diff or len(have) != len(want)):
            return False, (f"DDP's {len(have)} buckets are not the {len(want)} traced ones (bucket(s) "
                           f"{', '.join(map(str, diff or sorted(want)))} differ in bytes): the DeFT section names "
                           "other buckets; profile this configuration again")
        missing = sorted(k for k in st.defer if k >= len(have))
        if missing:
            return False, f"no DDP bucket {', '.join(map(str, missing))} to defer (DDP has {len(have)})"
        if st.calls == 0:
            return False, "no bucket went through the DeFT hook yet"
        return True, (f"DDP's {len(have)} buckets are the traced ones"
                      + (f"; bucket(s) {', '.join(map(str, sorted(st.defer)))} deferred" if st.defer else ""))


def ddp_buckets(ddp: DistributedDataParallel) -> list[list[str]] | None:
    """DDP's current buckets as parameter names, in reduction order (None if this torch cannot say).

    Uses the reducer's ``_get_zeros_like_grad_buckets`` (private, present since
    torch 1.10), which allocates one zero buffer per bucket.
    """
    try:
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
    except Exception:
        return None
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    ptrs = {p.data_ptr(): n for n, p in ddp.module.named_parameters()}
    out = []
    for b in sorted(buckets, key=lambda b: b.index()):
        out.append([names.get(id(p), ptrs.get(p.data_ptr(), "?")) for p in b.parameters()])
    return out


def _plan_cap_mb(doc: dict[str, Any]) -> float:
    """The plan's DDP cap in MiB; from ``bucket_cap_bytes`` when present (``bucket_cap_mb`` is rounded
    to 6 decimals, which can move a tiny cap by a byte)."""
    ddp = doc["frameworks"]["pytorch_ddp"]
    if isinstance(ddp.get("bucket_cap_bytes"), int) and ddp["bucket_cap_bytes"] > 0:
        return ddp["bucket_cap_bytes"] / 2**20
    return float(ddp["bucket_cap_mb"])


def _fmt_mb(mb: float) -> str:
    return f"{mb:.6g} MB ({int(mb * 2**20)} bytes)"


def apply_plan(model: DistributedDataParallel | nn.Module, plan: PlanLike, *, mode: str = "auto",
               record: bool = False, warn: bool = True, **ddp_options: Any) -> AppliedPlan:
    """Apply ``plan`` to a DDP job: exact tensor groups where DDP allows, else the closest bucket cap.

    ``model``: an ``nn.Module`` (wrapped here in ``DistributedDataParallel`` with
    :func:`ddp_kwargs` plus ``ddp_options``, e.g. ``device_ids``) or a DDP
    already built (then its bucket cap cannot change; build it with
    ``**ddp_kwargs(plan)`` so that groups start as early as planned).
    ``mode``: ``"auto"`` (bucket cap when it is exact, else the comm hook),
    ``"hook"`` (always the hook), ``"cap"`` (never the hook; closest cap) or
    ``"deft"`` (the plan's ``deft`` section instead of its tensor groups: DDP with
    the traced bucket cap, the chosen buckets synchronised one iteration late and/or
    over a second link on ``$DPRO_LINK1_IFNAME``; :mod:`dpro_torch.deft`).
    ``record``: keep every hook launch in ``hook_state.launches`` (tests).

    Raises :class:`DproError` for a missing or invalid plan, names the model
    lacks or a mode that cannot be applied; warnings (unplanned parameters,
    sizes that differ from the plan, fallbacks) go to :mod:`warnings` and
    ``AppliedPlan.warnings``.  Call on every rank, before the first backward.
    """
    _check_mode(mode)
    doc, where = load_plan(plan)
    prebuilt = isinstance(model, DistributedDataParallel)
    if prebuilt and ddp_options:
        raise DproError(f"DDP options ({', '.join(ddp_options)}) given for a model that is already "
                        "DistributedDataParallel")
    if mode == "deft":
        return _apply_deft(model, doc, where, prebuilt, record=record, warn=warn, **ddp_options)
    # what DDP will not reduce (DDP's parameters_to_ignore, from the module or the delay option)
    if prebuilt:
        ignored = frozenset(getattr(model, "parameters_to_ignore", ()) or ())
    else:
        ignored = frozenset(getattr(model, "_ddp_params_and_buffers_to_ignore", ()) or ()) | frozenset(
            n for n, _ in ddp_options.get("delay_all_reduce_named_params") or ())
    groups, notes = _groups(doc, where, model, ignored)   # names checked before anything is built
    plan_cap = _plan_cap_mb(doc)
    ddp_doc = doc["frameworks"]["pytorch_ddp"]
    if ddp_doc.get("keep_traced") and mode != "hook":
        # the plan recommends no change: DDP exactly as it was traced (its default when it was the default)
        cap_arg = None if ddp_doc.get("traced_default_cap") else plan_cap
        ddp = model if prebuilt else DistributedDataParallel(model, bucket_cap_mb=cap_arg, **ddp_options)
        desc = ("no change: the plan keeps the traced configuration ("
                + ("DDP's default buckets, bucket_cap_mb=None" if cap_arg is None else f"bucket_cap_mb={_fmt_mb(plan_cap)}")
                + ")")
        return AppliedPlan(model=ddp, mode="keep", description=desc, bucket_cap_mb=cap_bytes_of(ddp) / 2**20,
                           groups=groups, hook_state=None, warnings=notes, source=where)
    need_hook, why = _needs_hook(doc)
    use_hook = mode == "hook" or (mode == "auto" and need_hook)
    caps = _cap_list(doc, groups, model) if (mode == "auto" and need_hook and not prebuilt) else None
    if caps is not None:
        # stock DDP with one size limit per bucket (torch >= 2.13): the exact groups, no hook in the loop
        ddp = DistributedDataParallel(model, bucket_cap_mb_list=caps, **ddp_options)
        desc = (f"exact tensor groups: DDP bucket_cap_mb_list reproduces the plan's {len(groups)} groups "
                "after DDP's bucket rebuild (first iteration: DDP's own order)")
        return AppliedPlan(model=ddp, mode="bucket_cap_list", description=desc, bucket_cap_mb=max(caps),
                           groups=groups, hook_state=None, warnings=notes, source=where)
    obstacle = _hook_obstacle(model, groups) if use_hook else ""
    if obstacle:
        if mode == "hook":
            raise DproError(f"the plan's groups cannot be applied with a comm hook: {obstacle}", path=_path(where))
        notes.append(f"{obstacle}: the comm hook cannot apply the plan's exact groups")
        use_hook = False
    ddp = model if prebuilt else DistributedDataParallel(
        model, bucket_cap_mb=HOOK_BUCKET_CAP_MB if use_hook else plan_cap, **ddp_options)
    cap_mb = cap_bytes_of(ddp) / 2**20
    state = None
    if use_hook:
        state = PlanHookState(groups, dict(ddp.module.named_parameters()), process_group=ddp.process_group,
                              record=record)
        ddp.register_comm_hook(state, _plan_comm_hook)
        res_mode = "comm_hook"
        nparts = sum(1 for g in groups if len(g.partitions) > 1)
        planned = sum(1 for g in groups if g.from_plan)
        desc = (f"exact tensor groups via comm hook: {planned} planned group(s)"
                f"{f' ({nparts} partitioned)' if nparts else ''}"
                f"{f' + {len(groups) - planned} unplanned' if planned < len(groups) else ''}, "
                f"DDP bucket_cap_mb={_fmt_mb(cap_mb)}{f' ({why})' if why and mode == 'auto' else ''}")
        if cap_bytes_of(ddp) > 1:
            notes.append(f"DDP's buckets hold several parameters (bucket_cap_mb={_fmt_mb(cap_mb)}): a group starts "
                         "only when the DDP bucket of its last parameter is ready; build DDP with "
                         "**ddp_kwargs(plan) to start groups as planned")
    elif not need_hook and cap_bytes_of(ddp) == int(plan_cap * 2**20):
        res_mode = "bucket_cap"
        desc = f"exact tensor groups: DDP bucket_cap_mb={_fmt_mb(plan_cap)} reproduces the plan's {len(groups)} groups"
    elif prebuilt:
        res_mode = "closest_bucket_cap"
        desc = (f"NOT applied: DDP was built with bucket_cap_mb={_fmt_mb(cap_mb)}, the plan's "
                f"{'closest ' if need_hook else ''}cap is {_fmt_mb(plan_cap)}; build DDP with **ddp_kwargs(plan)")
        notes.append(desc)
    else:
        res_mode = "closest_bucket_cap"
        desc = f"closest bucket cap {_fmt_mb(plan_cap)} (not exact: {why})"
    mem = {k: v for k, v in (doc["memory"].get("choices") or {}).items()
           if (k == "recompute" and v) or (k == "accum_steps" and v not in (None, 1))}
    if mem:   # they change the training loop, which a DDP wrapper cannot do
        notes.append(f"the plan's memory choices {mem} are not applied here: the training loop must do them "
                     "(examples/ddp/train.py: --accum-steps N, --checkpoint)")
    if warn:
        for n in notes:
            warnings.warn(f"dpro plan ({where}): {n}", stacklevel=2)
    return AppliedPlan(model=ddp, mode=res_mode, description=desc, bucket_cap_mb=cap_mb, groups=groups,
                       hook_state=state, warnings=notes, source=where)


def _apply_deft(model: DistributedDataParallel | nn.Module, doc: dict[str, Any], where: str, prebuilt: bool, *,
                record: bool, warn: bool, **ddp_options: Any) -> AppliedPlan:
    """``apply_plan(mode="deft")``: DDP with the traced buckets, and DeFT's per-bucket delays and links
    (:class:`dpro_torch.deft.DeferredBuckets`; the second link's group from :func:`dpro_torch.deft.link_group`
    on ``$DPRO_LINK1_IFNAME``).  The plan's tensor groups are not applied: the DeFT section was solved
    on the buckets as profiled (``deft.applies_to``)."""
    from .deft import DeferredBuckets, link_group
    st = _deft_settings(doc, where)
    defer, on1, cap, sizes, measured = (st["defer"], st["link1"], st["bucket_cap_mb"], st["bucket_bytes"],
                                        st["measured"])
    notes: list[str] = []
    if not st["cap_known"] and not prebuilt:
        notes.append("the DeFT section does not say which bucket_cap_mb its buckets were traced with: DDP's default "
                     "(None) is used; build DDP with the traced cap and pass it here if that differs")
    if prebuilt:
        ddp = model
        if cap is not None and abs(cap_bytes_of(ddp) - cap * 2**20) > 1:
            notes.append(f"DDP was built with bucket_cap_mb={_fmt_mb(cap_bytes_of(ddp) / 2**20)}, the trace with "
                         f"{_fmt_mb(cap)}: its buckets may not be the ones the DeFT section names")
    else:
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap, **ddp_options)
    second = link_group() if on1 else None
    state = DeferredBuckets(defer=defer, process_group=ddp.process_group, links={k: second for k in on1},
                            record=record)
    ddp.register_comm_hook(None, state.hook)
    if defer and not measured:
        notes.append("the DeFT delays were not checked against the loss (the Preserver's loop: bench/deft_ab.py "
                     "--preserver-loop LR, docs/deft.md); compare the loss with synchronous DDP")
    desc = ("DeFT: " + (f"bucket(s) {', '.join(map(str, defer))} one iteration late" if defer else "no delayed bucket")
            + (f"; bucket(s) {', '.join(map(str, on1))} on the second link ({os.environ.get('DPRO_LINK1_IFNAME')})" if on1 else "")
            + f"; DDP bucket_cap_mb={'default (None)' if cap is None else _fmt_mb(cap)} as traced")
    if warn:
        for n in notes:
            warnings.warn(f"dpro plan ({where}): {n}", stacklevel=3)
    return AppliedPlan(model=ddp, mode="deft", description=desc, bucket_cap_mb=cap_bytes_of(ddp) / 2**20,
                       groups=[], hook_state=state, warnings=notes, source=where, deft_bucket_bytes=sizes)


def _cap_list(doc: dict[str, Any], groups: list[PlanGroup], model: nn.Module) -> list[float] | None:
    """Per-bucket caps (MiB) that make DDP's rebuilt buckets the plan's groups, or None when that cannot work.

    DDP (torch >= 2.13, ``bucket_cap_mb_list``) closes bucket *i* as soon as it holds
    ``caps[i]`` bytes, in gradient-ready order at its rebuild; a cap of exactly the group's
    bytes closes it after the group's last parameter.  Needs: no partitioned group, every
    group from the plan (an unplanned parameter has no place in the order), one dtype.
    """
    import inspect
    if "bucket_cap_mb_list" not in inspect.signature(DistributedDataParallel.__init__).parameters:
        return None
    if any(g.get("partitions", 1) > 1 for g in doc["tensor_groups"]) or not all(g.from_plan for g in groups):
        return None
    params = dict(_module_of(model).named_parameters())
    if len({params[n].dtype for g in groups for n in g.params}) > 1:
        return None
    return [sum(params[n].numel() * params[n].element_size() for n in g.params) / 2**20 for g in groups]


def _hook_obstacle(model: nn.Module, groups: list[PlanGroup]) -> str:
    """Why the comm hook cannot reduce these groups ("" if it can)."""
    if isinstance(model, DistributedDataParallel) and getattr(model, "_comm_hooks", None):
        return "DDP already has a comm hook (DDP allows one)"
    module = _module_of(model)
    if any(getattr(m, "sparse", False) is True for m in module.modules()):
        return "the model has sparse gradients (nn.Embedding(sparse=True)); the hook reduces dense ones"
    params = dict(module.named_parameters())
    for g in groups:
        dtypes = {params[n].dtype for n in g.params}
        if len(dtypes) > 1:
            return f"group {g.name!r} mixes dtypes ({', '.join(sorted(map(str, dtypes)))})"
    return ""


def cap_bytes_of(ddp: DistributedDataParallel) -> int:
    """DDP's bucket cap in bytes (``bucket_bytes_cap``; 25 MiB if this torch does not expose it)."""
    return int(getattr(ddp, "bucket_bytes_cap", 25 * 2**20))
