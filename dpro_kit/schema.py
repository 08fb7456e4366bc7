"""One definition of the files a collector writes and a reader reads: ``manifest.json`` and
the PyTorch collector's per-rank ``meta.json`` (names, types, versions, marker names), their
validation, and the typed facts of ``manifest.extra``.

Who imports it
--------------
* the collectors, inside the user's training job: ``dpro_torch`` takes its marker names,
  ``meta.json`` format/version and the manifest's format/version from here;
* the readers and the rest of dpro_kit: :func:`validate_manifest` (through
  :meth:`dpro_kit.trace.Manifest.from_json`), :func:`validate_torch_meta`
  (:mod:`dpro_kit.readers.torch_kineto`) and :class:`Facts` (``Manifest.facts``).

Standard library only: this module imports nothing but :mod:`dpro_kit.errors`, and
``dpro_kit/__init__.py`` and ``errors.py`` import only the standard library, so a job whose
framework lives in an environment without dpro-kit's dependencies (MXNet 1.9 with numpy<1.24)
can import it too: put the directory holding ``dpro_kit/`` on that job's ``PYTHONPATH`` when it
holds no other packages (a checkout), or ``pip install --no-deps dpro-kit`` into that environment.
``tests/test_schema.py`` checks that importing it loads no third-party module.

Errors are one line (:class:`dpro_kit.errors.TraceFormatError`): the file, the record
(``nodes.host0/0.role``, ``extra.measured_iteration_ms``), what is wrong and what to do.
The formats themselves are described in ``docs/trace-format.md`` and ``docs/pytorch.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import TraceFormatError

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MANIFEST_VERSIONS", "TORCH_META_FORMAT", "TORCH_META_VERSION",
           "TORCH_META_VERSIONS", "TORCH_RAW_FORMAT", "TF_META_FORMAT", "TF_META_VERSION", "TF_META_VERSIONS",
           "TF_RAW_FORMAT", "MXNET_META_FORMAT", "MXNET_META_VERSIONS", "MXNET_RAW_FORMAT", "MARKER_PREFIX", "MARKERS", "PHASE_MARKERS", "Field",
           "MANIFEST_FIELDS", "NODE_FIELDS", "TORCH_META_FIELDS", "TORCH_PARAM_FIELDS", "EXTRA_FIELDS", "OVERHEAD_MODES",
           "HOST_GAP_MODES", "Facts", "find_offsets", "validate_manifest", "validate_torch_meta"]

# --------------------------------------------------------------------------- formats and versions

#: ``manifest.json`` (docs/trace-format.md); bump the version on an incompatible change
MANIFEST_FORMAT = "dpro-trace"
MANIFEST_VERSION = 1
MANIFEST_VERSIONS = (1,)
#: the PyTorch collector's per-rank ``<host>/<rank>/meta.json``
TORCH_META_FORMAT = "dpro-torch-meta"
TORCH_META_VERSION = 1
TORCH_META_VERSIONS = (1,)
#: ``manifest.raw_format`` of the PyTorch collector's folders (reader ``torch-kineto``)
TORCH_RAW_FORMAT = "torch-kineto"
#: the TensorFlow collector's per-task ``<host>/<task>/meta.json`` (collectors/tf/README.md) and its
#: ``manifest.raw_format`` (reader ``dpro_kit.readers.tf``)
TF_META_FORMAT = "dpro-tf-meta"
TF_META_VERSION = 1
TF_META_VERSIONS = (1,)
TF_RAW_FORMAT = "tf-xplane"
#: the MXNet collector's per-process ``<host>/<worker<rank>|server-<pid>>/meta.json`` and its
#: ``manifest.raw_format`` (reader ``dpro_kit.readers.mxnet``); collectors/mxnet/dpro_mxnet/__init__.py
#: repeats them (it runs in MXNet's own environment; tests/test_mxnet.py checks they agree)
MXNET_META_FORMAT = "dpro-mxnet-meta"
MXNET_META_VERSIONS = (1,)
MXNET_RAW_FORMAT = "dpro-mxnet"

# --------------------------------------------------------------------------- markers

#: namespace of the collector's ``record_function`` ranges (no framework op uses it)
MARKER_PREFIX = "dpro::"
#: marker role -> range name, as the PyTorch collector inserts them and lists them in ``meta.json``
#: (``markers``); the reader classifies ops by the ranges they fall in, never by their own names
MARKERS = {
    "forward": "dpro::forward",            # DDP module forward (pre-hook .. post-hook)
    "backward": "dpro::backward",          # torch.autograd.backward (loss.backward())
    "optimizer": "dpro::optimizer_step",   # Optimizer.step (pre-hook .. post-hook)
    "step_end": "dpro::step_end",          # end of one training iteration (one per profiled step)
    "clock_sync": "dpro::clock_sync",      # right after the profiler starts, time.time_ns() around it
    "grad_ready_prefix": "dpro::grad_ready/",  # + index of the parameter in the DDP parameter list
    "calibrate": "dpro::calibrate",        # profiler-overhead calibration loop, before the first iteration
    "comm_wait": "dpro::comm_wait",        # the training thread blocks for a framework's collectives (Horovod)
}
#: the marker roles that are phases, and the op kind (:class:`dpro_kit.trace.OpKind` value) inside them
PHASE_MARKERS = {"forward": "FW", "backward": "BW", "optimizer": "UPDATE"}

# --------------------------------------------------------------------------- fields


@dataclass(frozen=True)
class Field:
    """One field of a JSON object: name, accepted JSON types, required or not, meaning."""

    name: str
    types: tuple[type, ...]
    required: bool
    doc: str

    def check(self, obj: dict[str, Any], *, path: Any, record: str, hint: str) -> None:
        """Raise a one-line error when ``obj`` lacks this required field or has it with a wrong type."""
        if self.name not in obj or obj[self.name] is None:
            if self.required:
                raise TraceFormatError(f"missing field {self.name!r} ({self.doc})", path=path,
                                       record=record or None, hint=hint)
            return
        v = obj[self.name]
        if isinstance(v, bool) and bool not in self.types or not isinstance(v, self.types):
            want = "a number" if self.types == _NUM else " or ".join(_JSON_NAME.get(t, t.__name__) for t in self.types)
            raise TraceFormatError(f"field {self.name!r} must be {want}, got {v!r:.60}", path=path,
                                   record=f"{record}.{self.name}" if record else self.name, hint=hint)


_JSON_NAME = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object",
              bool: "true/false"}
_NUM = (int, float)

MANIFEST_FIELDS = (
    Field("format", (str,), True, f'always "{MANIFEST_FORMAT}"'),
    Field("version", (int,), True, "format version"),
    Field("job", (str,), True, "job name"),
    Field("framework", (str,), True, "pytorch, tensorflow, mxnet, ..."),
    Field("comm_backend", (str,), True, "gloo, nccl, ps-lite, ..."),
    Field("world_size", (int,), True, "number of worker nodes"),
    Field("nodes", (dict,), True, "node name -> node entry"),
    Field("iterations", (list,), True, "profiled iteration numbers"),
    Field("raw_format", (str,), False, "reader of the nodes' raw files (default dpro-events)"),
    Field("tool_version", (str,), False, "collector and framework versions"),
    Field("created", (str,), False, "ISO time the manifest was written"),
    Field("extra", (dict,), False, "job facts (EXTRA_FIELDS)"),
)
NODE_FIELDS = (
    Field("host", (str,), True, "machine the node ran on"),
    Field("role", (str,), False, "worker (default) or server"),
    Field("rank", (int,), False, "rank among its role"),
    Field("dir", (str,), False, "its folder, relative to the trace directory"),
    Field("format", (str,), False, "reader of its raw files (default: raw_format)"),
    Field("file", (str,), False, "its one raw file, relative to dir"),
)
#: the PyTorch collector's ``meta.json`` (collectors/torch/dpro_torch/recorder.py writes it)
TORCH_META_FIELDS = (
    Field("format", (str,), True, f'always "{TORCH_META_FORMAT}"'),
    Field("version", (int,), True, "format version"),
    Field("rank", (int,), True, "global rank"),
    Field("world_size", (int,), False, "number of ranks"),
    Field("host", (str,), False, "host name of the rank"),
    Field("window", (dict,), True, "profiling window: start_step, stop_step, profiled_steps"),
    Field("ddp", (list,), True, "per DDP module: params (index, name, bytes, ...) and buckets"),
    Field("trace_file", (str,), False, "the Kineto trace, relative to the folder (absent: none written)"),
    Field("ring_file", (str,), False, "ring_chunks.json of `dpro profile --ring`"),
    Field("shapes", (dict,), False, "record_shapes trace of `dpro profile --shapes`: trace_file, step"),
    Field("markers", (dict,), False, "marker role -> range name (MARKERS)"),
    Field("main_tid", (int,), False, "thread id of the training thread"),
    Field("clock", (dict,), False, "clock_sync readings of time.time_ns() around each marker"),
    Field("steps", (list,), False, "wall time of every iteration (dur_us, profiled)"),
    Field("measured", (dict,), False, "median_unprofiled_us, median_profiled_us"),
    Field("profiler_overhead", (dict,), False, "calibration loop: plain_ns, profiled_ns, calls, marker"),
    Field("run_id", (str,), False, "id the ranks of one run agree on"),
    Field("job", (str,), False, "job name (the script's stem)"),
    Field("backend", (str,), False, "process group backend (gloo, nccl)"),
    Field("pid", (int,), False, "process id of the rank"),
    Field("torch_version", (str,), False, "torch.__version__"),
    Field("collector", (str,), False, 'always "dpro_torch"'),
    Field("argv", (list,), False, "the job's command line"),
    Field("threads", (int,), False, "torch.get_num_threads() of the rank"),
    Field("cpu", (dict,), False, "CPU affinity, machine id, CPU count (manifest extra.cpu_placement)"),
    Field("grad_ready_markers", (bool,), False, "whether dpro::grad_ready/<i> markers were recorded"),
    Field("optimizer", (dict,), False, "optimizer class and state_bytes (manifest extra.optimizer)"),
    Field("comm_calibration", (dict,), False, "one-element allreduce times (manifest extra.comm_calibration)"),
    Field("horovod", (dict,), False, "Horovod jobs: DistributedOptimizer parameters, timeline file, settings"),
)
#: per DDP parameter (``ddp[].params[]``): index, name, shape, dtype, numel, bytes, and ``layer`` (the
#: unit activation checkpointing takes, read from the module tree; manifest ``extra.layers``)
TORCH_PARAM_FIELDS = (
    Field("index", (int,), True, "position in the DDP parameter list"),
    Field("name", (str,), True, "named_parameters() name"),
    Field("bytes", (int,), True, "size in bytes"),
    Field("shape", (list,), False, "tensor shape"),
    Field("dtype", (str,), False, "dtype without 'torch.'"),
    Field("numel", (int,), False, "number of elements"),
    Field("layer", (str,), False, "its layer (dpro_torch.recorder.layer_names)"),
)
#: ``manifest.extra``: the job facts collectors record and modules read, each parsed once into
#: :class:`Facts` (name, types, meaning)
EXTRA_FIELDS = (
    Field("collector", (str,), False, "the collector that wrote the folder (dpro_torch, dpro_tf, ...)"),
    Field("run_id", (str,), False, "id of the run (ranks of one job agree on it)"),
    Field("measured_iteration_ms", _NUM, False, "the job's iteration time without the profiler (slowest rank)"),
    Field("measured_iteration_ms_per_node", (dict,), False, "node -> its iteration time without the profiler"),
    Field("profiled_iteration_ms", _NUM, False, "the same inside the profiling window"),
    Field("ddp", (dict,), False, "DDP settings (bucket_cap_bytes, gradient_as_bucket_view, ...)"),
    Field("optimizer", (dict,), False, "optimizer class and state_bytes (rank 0)"),
    Field("comm_calibration", (dict,), False, "median_us of a one-element allreduce (slowest rank)"),
    Field("cpu_placement", (dict,), False, "node -> affinity, machine, count, threads"),
    Field("layers", (dict,), False, "parameter name -> its layer (the unit activation checkpointing takes)"),
    Field("torch_kineto", (dict,), False, "reader options: host_gaps (fold|keep), profiler_overhead"),
    Field("peak_memory_bytes", (dict,), False, "node -> peak bytes measured another way"),
    Field("alignment", (dict,), False, "clock offsets: offsets_us (node -> us); also 'aligned'"),
    Field("offsets_us", (dict,), False, "clock offsets (node -> us); also 'offsets'"),
    Field("kineto_plain", (dict,), False, "plain torch.profiler input: ranks_present, world_size"),
    Field("notes", (list,), False, "lines the commands print about the trace"),
)
#: how the torch-kineto reader removes the profiler's cost (``extra.torch_kineto.profiler_overhead``)
OVERHEAD_MODES = ("window", "calibrated", "keep")
#: whether it charges host time between ops to the next op (``extra.torch_kineto.host_gaps``)
HOST_GAP_MODES = ("fold", "keep")

_FIX_MANIFEST = "re-create it (`dpro profile` writes it; `python -m dpro_torch.manifest DIR` rebuilds it)"
_FIX_META = "the folder was not written by this dpro_torch or was edited; re-collect this rank"


# --------------------------------------------------------------------------- validation

def validate_manifest(doc: Any, path: Any = None) -> dict[str, Any]:
    """Check a ``manifest.json`` document; return it unchanged.

    Parameters
    ----------
    doc : any
        The parsed JSON.
    path : str or Path, optional
        The file, named in errors.

    Raises
    ------
    TraceFormatError
        One line naming the file, the record and what to do: not an object, another format
        or an unknown version, a missing or mistyped field, an empty or inconsistent node
        list, a known ``extra`` key of the wrong type, unknown reader options.
    """
    if not isinstance(doc, dict):
        raise TraceFormatError("manifest must be a JSON object", path=path, hint=_FIX_MANIFEST)
    if doc.get("format") != MANIFEST_FORMAT:
        raise TraceFormatError(f"not a dpro trace manifest (format={doc.get('format')!r})",
                               path=path, hint=f'expected "format": "{MANIFEST_FORMAT}"')
    if doc.get("version") not in MANIFEST_VERSIONS:
        raise TraceFormatError(
            f"unsupported trace format version {doc.get('version')!r}", path=path,
            hint=f"this dpro reads versions {list(MANIFEST_VERSIONS)}; upgrade dpro-kit or re-collect")
    for f in MANIFEST_FIELDS:
        f.check(doc, path=path, record="", hint=_FIX_MANIFEST)
    if not doc["nodes"]:
        raise TraceFormatError("'nodes' must be a non-empty object of node name -> info", path=path,
                               hint=_FIX_MANIFEST)
    for name, info in doc["nodes"].items():
        rec = f"nodes.{name}"
        if not isinstance(info, dict) or "host" not in info:
            raise TraceFormatError("node entry needs at least a 'host'", path=path, record=rec, hint=_FIX_MANIFEST)
        for f in NODE_FIELDS:
            f.check(info, path=path, record=rec, hint=_FIX_MANIFEST)
        if info.get("role", "worker") not in ("worker", "server"):
            raise TraceFormatError(f"role must be 'worker' or 'server', got {info['role']!r}", path=path,
                                   record=rec, hint=_FIX_MANIFEST)
    n_workers = sum(1 for i in doc["nodes"].values() if i.get("role", "worker") == "worker")
    if doc["world_size"] != n_workers:
        raise TraceFormatError(f"world_size is {doc['world_size']} but {n_workers} worker node(s) are listed",
                               path=path, hint="a rank's entry is missing from 'nodes'")
    bad = [i for i in doc["iterations"] if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise TraceFormatError(f"iterations must be integers, got {bad[0]!r}", path=path, record="iterations",
                               hint=_FIX_MANIFEST)
    Facts.from_extra(doc.get("extra") or {}, path=path, strict=True)
    return doc


def validate_torch_meta(doc: Any, path: Any = None) -> dict[str, Any]:
    """Check a PyTorch collector ``meta.json``; return it unchanged.

    Parameters
    ----------
    doc : any
        The parsed JSON.
    path : str or Path, optional
        The file, named in errors.

    Raises
    ------
    TraceFormatError
        Not a dpro_torch meta.json, an unknown version, a missing or mistyped field, a DDP
        parameter without index/name/bytes, a bucket naming an unknown parameter, or no
        Kineto trace written (the job ended before the profiling window).
    """
    if not isinstance(doc, dict) or doc.get("format") != TORCH_META_FORMAT:
        raise TraceFormatError("not a dpro_torch meta.json", path=path, hint=f'expected "format": "{TORCH_META_FORMAT}"')
    if doc.get("version") not in TORCH_META_VERSIONS:
        raise TraceFormatError(f"unsupported meta.json version {doc.get('version')!r}", path=path,
                               hint=f"this reader understands versions {list(TORCH_META_VERSIONS)}")
    for f in TORCH_META_FIELDS:
        f.check(doc, path=path, record="", hint=_FIX_META)
    for j, d in enumerate(doc["ddp"]):
        rec = f"ddp[{j}]"
        if not isinstance(d, dict):
            raise TraceFormatError("DDP entry must be an object", path=path, record=rec, hint=_FIX_META)
        known = set()
        for k, p in enumerate(d.get("params") or []):
            if not isinstance(p, dict):
                raise TraceFormatError("parameter entry must be an object", path=path, record=f"{rec}.params[{k}]",
                                       hint=_FIX_META)
            for f in TORCH_PARAM_FIELDS:
                f.check(p, path=path, record=f"{rec}.params[{k}]", hint=_FIX_META)
            known.add(p["index"])
        for b, bucket in enumerate(d.get("buckets") or []):
            idx = bucket.get("params") if isinstance(bucket, dict) else None
            if not isinstance(idx, list) or any(i not in known for i in idx):
                raise TraceFormatError(f"DDP bucket {b} names a parameter missing from meta.json", path=path,
                                       record=f"{rec}.buckets[{b}]", hint=_FIX_META)
    if not doc.get("trace_file"):
        w = doc.get("window", {})
        raise TraceFormatError(
            f"no Kineto trace was written (the job ran {len(doc.get('steps') or [])} iteration(s); the "
            f"profiling window was {w.get('start_step')}:{w.get('stop_step')})", path=path,
            hint="profile iterations the job actually reaches (DPRO_STEPS)")
    return doc


# --------------------------------------------------------------------------- typed facts


def find_offsets(doc: Any) -> dict[str, float] | None:
    """Per-node clock offsets (us) in ``doc``: ``offsets_us`` or ``offsets`` (a non-empty object of
    numbers), else the same under ``alignment`` or ``aligned``; None when there are none.

    Parameters
    ----------
    doc : any
        ``manifest.extra``, or an alignment result (``TRACE_DIR/alignment.json``, :meth:`dpro_kit.align.AlignResult.to_json`).
    """
    if not isinstance(doc, dict):
        return None
    for key in ("offsets_us", "offsets"):
        v = doc.get(key)
        if isinstance(v, dict) and v and all(isinstance(x, (int, float)) for x in v.values()):
            return {str(k): float(x) for k, x in v.items()}
    for key in ("alignment", "aligned"):
        found = find_offsets(doc.get(key))
        if found:
            return found
    return None


def _pos(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


@dataclass(frozen=True)
class Facts:
    """The job facts of ``manifest.extra`` (:data:`EXTRA_FIELDS`), parsed once and typed.

    Modules read these attributes (``manifest.facts`` / ``Job.facts``), never the
    ``extra`` dict.  Absent or unusable values are None / empty.

    Parameters
    ----------
    measured_iteration_ms : float or None
        Iteration time measured by the collector without profiling (finite, > 0).
    measured_iteration_ms_per_node : dict
        Node -> the same per node (finite, > 0 only).
    profiled_iteration_ms : float or None
        Iteration time inside the profiling window.
    ddp : dict
        DDP settings recorded by the collector (``bucket_cap_bytes``, ``gradient_as_bucket_view``, ...).
    optimizer_class : str or None
        Optimizer class name (rank 0).
    optimizer_state_bytes : int or None
        Its state size in bytes when recorded.
    collective_latency_us : float or None
        Per-collective cost: the slowest rank's median one-element allreduce (``comm_calibration``).
    cpu_placement : dict
        Node -> {affinity, machine, count, threads} (read by :mod:`dpro_kit.placement`).
    layers : dict
        Parameter name -> its layer, as the collector recorded it (the module that
        ``checkpoint_sequential`` would take as one unit; :mod:`dpro_kit.optimize.memory`).
    host_gaps, profiler_overhead : str
        Reader options of ``torch_kineto`` (:data:`HOST_GAP_MODES`, :data:`OVERHEAD_MODES`; as
        written: only :func:`validate_manifest` refuses other values).
    peak_memory_bytes : dict
        Node -> peak bytes measured another way.
    offsets_us : dict
        Node -> clock offset recorded in the manifest (:func:`find_offsets`).
    plain_kineto : bool
        The manifest was built from plain torch.profiler files (no collector facts).
    notes : list of str
        Lines commands print about the trace.
    collector, run_id : str
        Who wrote the folder, and the run id.
    """

    measured_iteration_ms: float | None = None
    measured_iteration_ms_per_node: dict[str, float] = field(default_factory=dict)
    profiled_iteration_ms: float | None = None
    ddp: dict[str, Any] = field(default_factory=dict)
    optimizer_class: str | None = None
    optimizer_state_bytes: int | None = None
    collective_latency_us: float | None = None
    cpu_placement: dict[str, dict[str, Any]] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)
    host_gaps: str = "fold"
    profiler_overhead: str = "window"
    peak_memory_bytes: dict[str, float] = field(default_factory=dict)
    offsets_us: dict[str, float] = field(default_factory=dict)
    plain_kineto: bool = False
    notes: list[str] = field(default_factory=list)
    collector: str = ""
    run_id: str = ""

    @classmethod
    def from_manifest(cls, manifest: Any) -> "Facts":
        """The facts of a :class:`dpro_kit.trace.Manifest` (its ``extra``), leniently."""
        extra = getattr(manifest, "extra", None)
        return cls.from_extra(extra if isinstance(extra, dict) else {})

    @classmethod
    def from_extra(cls, extra: dict[str, Any], *, path: Any = None, strict: bool = False) -> "Facts":
        """Parse ``manifest.extra``.

        Parameters
        ----------
        extra : dict
            The ``extra`` object.
        path : str or Path, optional
            The manifest, named in errors (``strict``).
        strict : bool
            Raise a one-line :class:`TraceFormatError` for a known key of the wrong type or an
            unknown reader option (what :func:`validate_manifest` does); otherwise such values
            are ignored.
        """
        hint = "fix or remove the key in manifest.json"
        if strict:
            for f in EXTRA_FIELDS:
                f.check(extra, path=path, record="extra", hint=hint)
        get = lambda k, t: extra.get(k) if isinstance(extra.get(k), t) else None  # noqa: E731
        opts = get("torch_kineto", dict) or {}
        host_gaps, overhead = str(opts.get("host_gaps", "fold")), str(opts.get("profiler_overhead", "window"))
        if strict and overhead not in OVERHEAD_MODES:
            raise TraceFormatError(f"unknown torch_kineto.profiler_overhead {overhead!r} in the manifest", path=path,
                                   record="extra.torch_kineto", hint="use one of " + ", ".join(OVERHEAD_MODES))
        if strict and host_gaps not in HOST_GAP_MODES:
            raise TraceFormatError(f"unknown torch_kineto.host_gaps {host_gaps!r}", path=path,
                                   record="extra.torch_kineto", hint="use one of " + ", ".join(HOST_GAP_MODES))
        opt = get("optimizer", dict) or {}
        state = opt.get("state_bytes")
        cal = get("comm_calibration", dict) or {}
        return cls(
            measured_iteration_ms=_pos(extra.get("measured_iteration_ms")),
            measured_iteration_ms_per_node={str(k): float(v) for k, v in
                                            (get("measured_iteration_ms_per_node", dict) or {}).items()
                                            if _pos(v) is not None},
            profiled_iteration_ms=_pos(extra.get("profiled_iteration_ms")),
            ddp=dict(get("ddp", dict) or {}),
            optimizer_class=str(opt["class"]) if opt.get("class") is not None else None,
            optimizer_state_bytes=int(state) if isinstance(state, (int, float)) and not isinstance(state, bool)
            else None,
            collective_latency_us=_pos(cal.get("median_us")),
            cpu_placement={str(k): v for k, v in (get("cpu_placement", dict) or {}).items() if isinstance(v, dict)},
            layers={str(k): str(v) for k, v in (get("layers", dict) or {}).items() if isinstance(v, str)},
            host_gaps=host_gaps, profiler_overhead=overhead,
            peak_memory_bytes={str(k): float(v) for k, v in (get("peak_memory_bytes", dict) or {}).items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)},
            offsets_us=find_offsets(extra) or {},
            plain_kineto=bool(extra.get("kineto_plain")),
            notes=[str(x) for x in (get("notes", list) or [])],
            collector=str(extra.get("collector") or ""), run_id=str(extra.get("run_id") or ""))
