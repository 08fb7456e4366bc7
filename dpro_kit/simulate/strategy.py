"""Strategy trees (Proteus §IV): parse, validate and propagate a parallelization strategy.

A strategy file (YAML or JSON, same keys; ``/work/notes/strategy-format.md``,
``docs/simulate.md``) names the world size, the hosts the ranks are spread over and a
tree of parallel configurations whose root covers the whole model::

    name: fsdp-2x1
    ranks: 2
    hosts: 2
    bandwidth_mbps: 1000            # optional
    strategy:
      data_parallel: {degree: 2, sharding: fsdp}   # none | zero1 | zero2 | zero3 | fsdp
      tensor_parallel: {degree: 1}
      pipeline: {stages: 1, micro_batches: 1, schedule: gpipe}   # gpipe | 1f1b; max_in_flight optional
      recompute: false
      children:
        - {module: "blocks.layers.0", recompute: true}

Optional keys this implementation adds (documented in docs/simulate.md):
``intra_host_bandwidth_mbps`` and ``latency_us`` (the link model of ranks that share a
host, and the per-transfer latency), ``link_efficiency`` (goodput / line rate of the
inter-host links, default :data:`dpro_kit.whatif.TCP_EFFICIENCY`), ``memory_limit`` (``"8GiB"``; the CLI's
``--memory-limit`` overrides it), ``pipeline.split`` (``balanced`` by time, or ``even``),
``data_parallel.bucket_mb`` (DDP's gradient bucket
cap, default 25), ``runtime_overhead_ms`` (the strategy runtime's own CPU time per rank and
iteration, measured: docs/simulate.md "Runtime overheads"), ``runtime_memory`` (the memory per rank
it holds besides the model's parts, measured likewise: "Memory predicted from mechanism") and, per node, ``tensor_parallel.degree`` 1 (replicate that subtree).

Propagation (§VII "Strategy Propagation", first step): a configuration not set on a
node is inherited from its parent; a child applies to every module whose name starts
with its ``module`` prefix (dot-separated components: ``layers.1`` covers
``layers.1.mlp`` but not ``layers.10``); the deepest matching node wins.  The second
step of §VII (tensor configs inferred along data dependencies) is the compiler's
Megatron pairing of Linear layers (:mod:`dpro_kit.simulate.compiler`).

Every problem is a :class:`~dpro_kit.errors.DproError` naming the file and the key
(exit code 2).

References
----------
.. [1] Duan et al., "Proteus: Simulating the Performance of Distributed DNN Training",
       §IV (strategy tree), §VII (strategy propagation)
       (``/work/shared/seeds/001_b74cee54beaaa4e0.txt``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import DproError

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")
SCHEDULES = ("gpipe", "1f1b")

_TOP_KEYS = {"name", "ranks", "hosts", "bandwidth_mbps", "intra_host_bandwidth_mbps", "latency_us", "memory_limit",
             "link_efficiency", "runtime_overhead_ms", "runtime_memory", "strategy"}
_NODE_KEYS = {"data_parallel", "tensor_parallel", "pipeline", "recompute", "children"}
_DP_KEYS = {"degree", "sharding", "bucket_mb"}
_TP_KEYS = {"degree"}
_PP_KEYS = {"stages", "micro_batches", "schedule", "max_in_flight", "split"}
SPLITS = ("balanced", "even")


@dataclass(frozen=True)
class Settings:
    """The configuration that applies to one module after propagation.

    Attributes
    ----------
    sharding : str
        ``none`` (DDP all-reduce), ``zero1`` (optimizer state sharded), ``zero2`` (+ gradients:
        reduce-scatter), ``zero3`` / ``fsdp`` (+ parameters: all-gather before forward and backward).
    tp : int
        Tensor-parallel degree of the module (1: replicated on the TP group).
    recompute : bool
        Activation checkpointing: the forward is re-run before the backward.
    """

    sharding: str = "none"
    tp: int = 1
    recompute: bool = False


@dataclass
class StrategyNode:
    """One node of the tree: a module prefix and the configurations set on it (None: inherited)."""

    module: str
    sharding: str | None = None
    tp: int | None = None
    recompute: bool | None = None
    children: list["StrategyNode"] = field(default_factory=list)
    key: str = "strategy"          # where it is in the file, for error messages


@dataclass
class Strategy:
    """A parsed, validated strategy file.

    Attributes
    ----------
    name : str
        Free text (tables); the file's stem when not given.
    ranks, hosts : int
        World size; hosts the ranks are spread over evenly (``ranks / hosts`` per host).
    dp, tp, stages : int
        Root degrees; ``dp * tp * stages == ranks``.
    micro_batches : int
        Pipeline micro-batches per iteration (the profiled batch is split into them).
    schedule : str
        ``gpipe`` or ``1f1b``.
    split : str
        How the layers are cut into stages: ``balanced`` (by time) or ``even`` (the numbered layers by count).
    max_in_flight : int or None
        Most forward micro-batches a stage runs ahead of its backward (Proteus'
        ``max_ongoing_micro_batch``); None: the schedule's own (GPipe all, 1F1B ``stages - s``).
    bucket_mb : float
        DDP gradient bucket cap (MB) of ``sharding: none``.
    root : StrategyNode
        The tree (root: module ``""``).
    """

    name: str
    ranks: int
    hosts: int
    dp: int
    tp: int
    stages: int
    micro_batches: int
    schedule: str
    root: StrategyNode
    max_in_flight: int | None = None
    split: str = "balanced"
    bucket_mb: float = 25.0
    bandwidth_mbps: float | None = None
    intra_host_bandwidth_mbps: float | None = None
    latency_us: float | None = None
    memory_limit: int | None = None
    link_efficiency: float | None = None
    #: CPU time per rank and iteration the strategy's runtime spends besides the model's ops (DTensor
    #: dispatch, FSDP2's copies, the pipelining schedule; measured, not modelled: docs/simulate.md)
    runtime_overhead_ms: float | None = None
    #: memory per rank the strategy's runtime holds besides the model's parts (DTensor's and FSDP2's
    #: Python state, the pipelining runtime's buffers; measured on the tiny twin: docs/simulate.md)
    runtime_memory: int | None = None
    path: str | None = None

    def settings(self, module: str) -> Settings:
        """The propagated configuration of ``module`` (a dotted module name).

        Parameters
        ----------
        module : str
            Module name as in the profile (``blocks.layers.0``).

        Returns
        -------
        Settings
            Root values overridden, level by level, by every node whose prefix covers ``module``.
        """
        s = Settings(sharding=self.root.sharding or "none", tp=self.root.tp or 1,
                     recompute=bool(self.root.recompute))
        node = self.root
        while True:
            nxt = None
            for c in node.children:
                if covers(c.module, module) and (nxt is None or len(c.module) > len(nxt.module)):
                    nxt = c
            if nxt is None:
                return s
            s = replace(s, sharding=nxt.sharding if nxt.sharding is not None else s.sharding,
                        tp=nxt.tp if nxt.tp is not None else s.tp,
                        recompute=nxt.recompute if nxt.recompute is not None else s.recompute)
            node = nxt

    def nodes(self) -> list[StrategyNode]:
        """Every node below the root, depth first."""
        out: list[StrategyNode] = []

        def walk(n: StrategyNode) -> None:
            for c in n.children:
                out.append(c)
                walk(c)
        walk(self.root)
        return out

    def check_modules(self, modules: list[str]) -> None:
        """Each child must cover at least one of the model's modules (layers), else a DproError.

        Parameters
        ----------
        modules : list of str
            The model's layer names (:class:`dpro_kit.simulate.model.ModelGraph`).
        """
        for c in self.nodes():
            if not any(covers(c.module, m) for m in modules):
                inside = [m for m in modules if covers(m, c.module)]
                hint = (f"{c.module!r} is inside layer {inside[0]!r}; the profile's layers are the finest unit"
                        if inside else "the profile's layers: " + ", ".join(modules[:12])
                        + (" ..." if len(modules) > 12 else ""))
                raise DproError(f"module {c.module!r} matches no layer of the model", path=self.path,
                                record=f"{c.key}.module", hint=hint)

    def describe(self) -> dict[str, Any]:
        """The strategy as a JSON-able dict (outputs, tables)."""
        return {"name": self.name, "ranks": self.ranks, "hosts": self.hosts, "dp": self.dp,
                "sharding": self.root.sharding or "none", "tp": self.tp, "stages": self.stages,
                "micro_batches": self.micro_batches, "schedule": self.schedule, "split": self.split,
                "max_in_flight": self.max_in_flight, "recompute": bool(self.root.recompute),
                "children": [{"module": c.module, **({"sharding": c.sharding} if c.sharding else {}),
                              **({"tp": c.tp} if c.tp is not None else {}),
                              **({"recompute": c.recompute} if c.recompute is not None else {})}
                             for c in self.nodes()]}


def covers(prefix: str, module: str) -> bool:
    """Whether the node for ``prefix`` applies to ``module`` (whole dotted components; ``""`` covers all).

    Examples
    --------
    >>> covers("layers.1", "layers.1.mlp"), covers("layers.1", "layers.10"), covers("", "x")
    (True, False, True)
    """
    return prefix == "" or module == prefix or module.startswith(prefix + ".")


# --------------------------------------------------------------------------- parsing

def load_strategy(path: str | Path) -> Strategy:
    """Read and validate a strategy file (``.yaml`` / ``.yml`` / ``.json``).

    Parameters
    ----------
    path : str or Path
        The file.

    Raises
    ------
    DproError
        Unreadable file, bad syntax, unknown key, bad value: one line naming the file and the key.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise DproError(f"cannot read the strategy file: {exc.strerror or exc}", path=p) from None
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DproError(f"not valid JSON: {exc.msg} at line {exc.lineno}", path=p) from None
    else:
        import yaml
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise DproError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}", path=p) from None
    return parse_strategy(doc, path=str(p), default_name=p.stem)


def parse_strategy(doc: Any, *, path: str | None = None, default_name: str = "strategy") -> Strategy:
    """Validate a strategy document (the parsed YAML/JSON) into a :class:`Strategy`.

    Parameters
    ----------
    doc : Any
        The parsed file.
    path : str or None
        The file, for error messages.
    default_name : str
        ``name`` when the document has none.
    """
    def err(key: str, what: str, hint: str | None = None) -> DproError:
        return DproError(what, path=path, record=key, hint=hint)

    if not isinstance(doc, dict):
        raise err("", "a strategy file is a mapping with keys ranks, hosts, strategy",
                  "see docs/simulate.md for an example")
    _unknown(doc, _TOP_KEYS, "", err)
    name = doc.get("name", default_name)
    if not isinstance(name, (str, int, float)) or isinstance(name, bool):
        raise err("name", f"must be text, got {name!r}")
    if "ranks" not in doc:
        raise err("ranks", "missing (the world size)", "add e.g. 'ranks: 2'")
    ranks = _int(doc["ranks"], "ranks", err)
    hosts = _int(doc.get("hosts", 1), "hosts", err)
    if ranks % hosts:
        raise err("hosts", f"{ranks} ranks cannot be spread evenly over {hosts} hosts", "hosts must divide ranks")
    bw = _pos(doc.get("bandwidth_mbps"), "bandwidth_mbps", err)
    ibw = _pos(doc.get("intra_host_bandwidth_mbps"), "intra_host_bandwidth_mbps", err)
    lat = doc.get("latency_us")
    if lat is not None and (not _is_num(lat) or lat < 0 or not math.isfinite(lat)):
        raise err("latency_us", f"must be a number >= 0, got {lat!r}")
    eff = doc.get("link_efficiency")
    if eff is not None and (not _is_num(eff) or not 0 < eff <= 1):
        raise err("link_efficiency", f"must be a number in (0, 1], got {eff!r}",
                  "TCP goodput / line rate; default 1448/1514 (docs/whatif.md)")
    ovh = doc.get("runtime_overhead_ms")
    if ovh is not None and (not _is_num(ovh) or ovh < 0 or not math.isfinite(ovh)):
        raise err("runtime_overhead_ms", f"must be a number >= 0, got {ovh!r}",
                  "the runtime's CPU time per rank and iteration besides the model's ops (docs/simulate.md)")
    mem = doc.get("memory_limit")
    if mem is not None:
        mem = parse_memory(mem, path=path, record="memory_limit")
    rmem = doc.get("runtime_memory")
    if rmem is not None:
        rmem = parse_memory(rmem, path=path, record="runtime_memory", zero=True)
    if "strategy" not in doc:
        raise err("strategy", "missing (the root of the strategy tree)",
                  "add e.g. 'strategy: {data_parallel: {degree: 2}}'")
    root_doc = doc["strategy"]
    if not isinstance(root_doc, dict):
        raise err("strategy", f"must be a mapping, got {type(root_doc).__name__}")
    _unknown(root_doc, _NODE_KEYS, "strategy", err)
    dp_doc = _mapping(root_doc.get("data_parallel", {}), "strategy.data_parallel", err)
    _unknown(dp_doc, _DP_KEYS, "strategy.data_parallel", err)
    dp = _int(dp_doc.get("degree", 1), "strategy.data_parallel.degree", err)
    sharding = _sharding(dp_doc.get("sharding", "none"), "strategy.data_parallel.sharding", err)
    bucket = _pos(dp_doc.get("bucket_mb", 25.0), "strategy.data_parallel.bucket_mb", err)
    tp_doc = _mapping(root_doc.get("tensor_parallel", {}), "strategy.tensor_parallel", err)
    _unknown(tp_doc, _TP_KEYS, "strategy.tensor_parallel", err)
    tp = _int(tp_doc.get("degree", 1), "strategy.tensor_parallel.degree", err)
    pp_doc = _mapping(root_doc.get("pipeline", {}), "strategy.pipeline", err)
    _unknown(pp_doc, _PP_KEYS, "strategy.pipeline", err)
    stages = _int(pp_doc.get("stages", 1), "strategy.pipeline.stages", err)
    mbs = _int(pp_doc.get("micro_batches", 1), "strategy.pipeline.micro_batches", err)
    sched = pp_doc.get("schedule", "gpipe")
    if sched not in SCHEDULES:
        raise err("strategy.pipeline.schedule", f"unknown schedule {sched!r}", "one of: " + ", ".join(SCHEDULES))
    split = pp_doc.get("split", "balanced")
    if split not in SPLITS:
        raise err("strategy.pipeline.split", f"unknown split {split!r}", "one of: " + ", ".join(SPLITS))
    mif = pp_doc.get("max_in_flight")
    if mif is not None:
        mif = _int(mif, "strategy.pipeline.max_in_flight", err)
    rec = _bool(root_doc.get("recompute", False), "strategy.recompute", err)
    if dp * tp * stages != ranks:
        raise err("strategy", f"data_parallel.degree {dp} x tensor_parallel.degree {tp} x pipeline.stages "
                  f"{stages} = {dp * tp * stages}, but ranks is {ranks}", "the product must equal ranks")
    if sharding != "none" and dp < 2:
        raise err("strategy.data_parallel.sharding", f"{sharding} needs data_parallel.degree >= 2, got {dp}")
    root = StrategyNode(module="", sharding=sharding, tp=tp, recompute=rec, key="strategy")
    root.children = _children(root_doc.get("children"), "strategy", root, dp, tp, err)
    return Strategy(name=str(name), ranks=ranks, hosts=hosts, dp=dp, tp=tp, stages=stages, micro_batches=mbs,
                    schedule=sched, root=root, max_in_flight=mif, split=split, bucket_mb=float(bucket), bandwidth_mbps=bw,
                    intra_host_bandwidth_mbps=ibw, latency_us=None if lat is None else float(lat),
                    memory_limit=mem, link_efficiency=None if eff is None else float(eff),
                    runtime_overhead_ms=None if ovh is None else float(ovh), runtime_memory=rmem, path=path)


def _children(items: Any, key: str, parent: StrategyNode, dp: int, tp: int, err) -> list[StrategyNode]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise err(f"{key}.children", f"must be a list, got {type(items).__name__}")
    out: list[StrategyNode] = []
    seen: set[str] = set()
    for i, c in enumerate(items):
        k = f"{key}.children[{i}]"
        if not isinstance(c, dict):
            raise err(k, f"must be a mapping with 'module', got {c!r}")
        _unknown(c, _NODE_KEYS | {"module"}, k, err)
        if "pipeline" in c:
            raise err(f"{k}.pipeline", "a pipeline is set on the root only",
                      "move 'pipeline' to 'strategy' (its stages split the whole model)")
        mod = c.get("module")
        if not isinstance(mod, str) or not mod.strip():
            raise err(f"{k}.module", f"must be a module name prefix such as 'layers.0', got {mod!r}")
        if parent.module and not covers(parent.module, mod):
            raise err(f"{k}.module", f"{mod!r} is not inside its parent {parent.module!r}",
                      "a child names a module within its parent's")
        if mod in seen:
            raise err(f"{k}.module", f"{mod!r} appears twice among the children of {key}")
        seen.add(mod)
        node = StrategyNode(module=mod, key=k)
        if "data_parallel" in c:
            d = _mapping(c["data_parallel"], f"{k}.data_parallel", err)
            _unknown(d, {"degree", "sharding"}, f"{k}.data_parallel", err)
            if "degree" in d and _int(d["degree"], f"{k}.data_parallel.degree", err) != dp:
                raise err(f"{k}.data_parallel.degree", f"must equal the root's degree {dp} (devices are set at the root)")
            if "sharding" in d:
                node.sharding = _sharding(d["sharding"], f"{k}.data_parallel.sharding", err)
                if node.sharding != "none" and dp < 2:
                    raise err(f"{k}.data_parallel.sharding", f"{node.sharding} needs data_parallel.degree >= 2")
        if "tensor_parallel" in c:
            t = _mapping(c["tensor_parallel"], f"{k}.tensor_parallel", err)
            _unknown(t, _TP_KEYS, f"{k}.tensor_parallel", err)
            if "degree" in t:
                v = _int(t["degree"], f"{k}.tensor_parallel.degree", err)
                if v not in (1, tp):
                    raise err(f"{k}.tensor_parallel.degree", f"must be 1 (replicated) or the root's degree {tp}, got {v}")
                node.tp = v
        if "recompute" in c:
            node.recompute = _bool(c["recompute"], f"{k}.recompute", err)
        node.children = _children(c.get("children"), k, node, dp, tp, err)
        out.append(node)
    return out


def parse_memory(value: Any, *, path: str | None = None, record: str = "memory_limit", zero: bool = False) -> int:
    """``"8GiB"``, ``"512MB"``, ``1e9`` -> bytes (binary and decimal units); a DproError otherwise.

    Parameters
    ----------
    value : str or number
        The size.
    path, record : str
        Where it came from, for the error message.
    zero : bool
        Accept 0 (an amount added on top, such as ``runtime_memory``); a limit must be positive.

    Examples
    --------
    >>> parse_memory("8GiB"), parse_memory("1.5 GB"), parse_memory(1024)
    (8589934592, 1500000000, 1024)
    """
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "TB": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "B": 1, "": 1}
    if isinstance(value, bool):
        value = None
    if _is_num(value):
        n = float(value)
    else:
        s = str(value).strip().upper().replace(" ", "")
        n = math.nan
        for u in sorted(units, key=len, reverse=True):
            if s.endswith(u):
                try:
                    n = float(s[: len(s) - len(u)]) * units[u]
                except ValueError:
                    n = math.nan
                break
    if not math.isfinite(n) or n < 0 or (n == 0 and not zero):
        raise DproError(f"not a memory size: {value!r}", path=path, record=record,
                        hint=f"a {'' if zero else 'positive '}size such as 8GiB, 512MB or 1e9 (bytes)"
                        + (" or 0" if zero else ""))
    return int(n)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unknown(d: dict, allowed: set[str], key: str, err) -> None:
    for k in d:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise err(where, f"unknown key {k!r}", "known here: " + ", ".join(sorted(allowed)))


def _mapping(v: Any, key: str, err) -> dict:
    if not isinstance(v, dict):
        raise err(key, f"must be a mapping, got {v!r}")
    return v


def _int(v: Any, key: str, err) -> int:
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())) or v < 1:
        raise err(key, f"must be an integer >= 1, got {v!r}")
    return int(v)


def _pos(v: Any, key: str, err) -> float | None:
    if v is None:
        return None
    if not _is_num(v) or not math.isfinite(v) or v <= 0:
        raise err(key, f"must be a number > 0, got {v!r}")
    return float(v)


def _bool(v: Any, key: str, err) -> bool:
    if not isinstance(v, bool):
        raise err(key, f"must be true or false, got {v!r}")
    return v


def _sharding(v: Any, key: str, err) -> str:
    if v not in SHARDINGS:
        raise err(key, f"unknown sharding {v!r}", "one of: " + ", ".join(SHARDINGS))
    return str(v)


__all__ = ["SCHEDULES", "SHARDINGS", "SPLITS", "Settings", "Strategy", "StrategyNode", "covers", "load_strategy",
           "parse_memory", "parse_strategy"]
