"""One definition of the files a collector writes and a reader reads: ``manifest.json`` and
the PyTorch collector's per-rank ``meta.json`` (names, types, versions, marker names), their
validation, and the typed facts of ``manifest.extra``.

Who imports it
--------------
* the collectors, inside the user's training job, take the marker names, ``meta.json``
  formats/versions and the manifest's format/version from :mod:`dpro_collect.schema`;
* the readers and the rest of dpro_kit: :func:`validate_manifest` (through
  :meth:`dpro_kit.trace.Manifest.from_json`), :func:`validate_torch_meta`
  (:mod:`dpro_kit.readers.torch_kineto`) and :class:`Facts` (``Manifest.facts``).

Standard library only: the format names, versions and marker names are defined in
:mod:`dpro_collect.schema` (``collectors/common``, the collectors' shared package, which runs
inside the user's job in the framework's own environment) and re-exported here; this module
adds their fields, the validation and the typed facts, and imports nothing but the standard
library and :mod:`dpro_collect`.  ``tests/test_schema.py`` checks that importing it loads no
third-party module.

Errors are one line (:class:`dpro_kit.errors.TraceFormatError`): the file, the record
(``nodes.host0/0.role``, ``extra.measured_iteration_ms``), what is wrong and what to do.
The formats themselves are described in ``docs/trace-format.md`` and ``docs/pytorch.md``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from dpro_collect.schema import (HOROVOD_RAW_FORMAT, MANIFEST_FORMAT, MANIFEST_VERSION, MANIFEST_VERSIONS,
                                 MARKER_PREFIX, MARKERS, MXNET_META_FORMAT, MXNET_META_VERSION, MXNET_META_VERSIONS,
                                 MXNET_RAW_FORMAT, PHASE_MARKERS, TF_META_FORMAT, TF_META_VERSION, TF_META_VERSIONS,
                                 TF_RAW_FORMAT, TORCH_META_FORMAT, TORCH_META_VERSION, TORCH_META_VERSIONS,
                                 TORCH_RAW_FORMAT)

from .errors import TraceFormatError

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MANIFEST_VERSIONS", "TORCH_META_FORMAT", "TORCH_META_VERSION",
           "TORCH_META_VERSIONS", "TORCH_RAW_FORMAT", "TF_META_FORMAT", "TF_META_VERSION", "TF_META_VERSIONS",
           "TF_RAW_FORMAT", "HOROVOD_RAW_FORMAT", "MXNET_META_FORMAT", "MXNET_META_VERSION", "MXNET_META_VERSIONS",
           "MXNET_RAW_FORMAT", "MARKER_PREFIX", "MARKERS", "PHASE_MARKERS", "Field",
           "MANIFEST_FIELDS", "NODE_FIELDS", "TORCH_META_FIELDS", "TORCH_PARAM_FIELDS", "TORCH_WINDOW_FIELDS",
           "TORCH_STEP_FIELDS", "TORCH_MEASURED_FIELDS", "TORCH_CLOCK_SYNC_FIELDS", "EXTRA_FIELDS", "OVERHEAD_MODES",
           "HOST_GAP_MODES", "MAX_NAME_CHARS", "check_name", "Facts", "find_offsets", "validate_manifest",
           "validate_torch_meta"]

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
        rec = f"{record}.{self.name}" if record else self.name
        if isinstance(v, bool) and bool not in self.types or not isinstance(v, self.types):
            want = "a number" if self.types == _NUM else " or ".join(_JSON_NAME.get(t, t.__name__) for t in self.types)
            raise TraceFormatError(f"field {self.name!r} must be {want}, got {v!r:.60}", path=path,
                                   record=rec, hint=hint)
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceFormatError(f"field {self.name!r} must be a finite number, got {v!r}", path=path,
                                   record=rec, hint=hint)
        if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
            raise TraceFormatError(f"field {self.name!r} is out of range ({v:.3e})", path=path, record=rec, hint=hint)


_JSON_NAME = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object",
              bool: "true/false"}
_NUM = (int, float)
_TYPE_OF = {"str": (str,), "int": (int,), "number": _NUM, "list": (list,), "dict": (dict,), "bool": (bool,)}

#: longest host, node or run name a reader takes (a DNS name has at most 253 characters, Linux's
#: HOST_NAME_MAX is 64): the name is copied into a column of every event of its node, so a 1 MB one
#: made the replay of a ps-lite folder take 100 s and 4 GB (fuzz cases 14774, 16953)
MAX_NAME_CHARS = 255


def check_name(v: Any, *, what: str, path: Any, record: str, hint: str) -> None:
    """Raise a one-line error unless ``v`` is a non-empty string of at most :data:`MAX_NAME_CHARS`."""
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME_CHARS:
        got = f"{len(v):,} characters" if isinstance(v, str) and v else repr(v)[:60]
        raise TraceFormatError(f"{what} must be a non-empty string of at most {MAX_NAME_CHARS} characters, "
                               f"got {got}", path=path, record=record[:300], hint=hint)


def _table(rows: str) -> tuple[Field, ...]:
    """The fields of a table, one per line: name, JSON type (a key of ``_TYPE_OF``), ``required`` or
    ``optional``, meaning; columns two or more spaces apart."""
    out = []
    for line in rows.strip().splitlines():
        name, kind, req, doc = re.split(r"\s{2,}", line.strip(), maxsplit=3)
        out.append(Field(name, _TYPE_OF[kind], req == "required", doc))
    return tuple(out)


MANIFEST_FIELDS = _table(f"""
format        str     required  always "{MANIFEST_FORMAT}"
version       int     required  format version
job           str     required  job name
framework     str     required  pytorch, tensorflow, mxnet, ...
comm_backend  str     required  gloo, nccl, ps-lite, ...
world_size    int     required  number of worker nodes
nodes         dict    required  node name -> node entry
iterations    list    required  profiled iteration numbers
raw_format    str     optional  reader of the nodes' raw files (default dpro-events)
tool_version  str     optional  collector and framework versions
created       str     optional  ISO time the manifest was written
extra         dict    optional  job facts (EXTRA_FIELDS)
""")
NODE_FIELDS = _table("""
host    str  required  machine the node ran on
role    str  optional  worker (default) or server
rank    int  optional  rank among its role
dir     str  optional  its folder, relative to the trace directory
format  str  optional  reader of its raw files (default: raw_format)
file    str  optional  its one raw file, relative to dir
""")
#: the PyTorch collector's ``meta.json`` (collectors/torch/dpro_torch/recorder.py writes it)
TORCH_META_FIELDS = _table(f"""
format              str   required  always "{TORCH_META_FORMAT}"
version             int   required  format version
rank                int   required  global rank
world_size          int   optional  number of ranks
host                str   optional  host name of the rank
window              dict  required  profiling window: start_step, stop_step, profiled_steps
ddp                 list  required  per DDP module: params (index, name, bytes, ...) and buckets
trace_file          str   optional  the Kineto trace, relative to the folder (absent: none written)
ring_file           str   optional  ring_chunks.json of `dpro profile --ring`
shapes              dict  optional  record_shapes trace of `dpro profile --shapes`: trace_file, step
markers             dict  optional  marker role -> range name (MARKERS)
main_tid            int   optional  thread id of the training thread
clock               dict  optional  clock_sync readings of time.time_ns() around each marker
steps               list  optional  wall time of every iteration (dur_us, profiled)
measured            dict  optional  median_unprofiled_us, median_profiled_us
profiler_overhead   dict  optional  calibration loop: plain_ns, profiled_ns, calls, marker
run_id              str   optional  id the ranks of one run agree on
job                 str   optional  job name (the script's stem)
backend             str   optional  process group backend (gloo, nccl)
pid                 int   optional  process id of the rank
torch_version       str   optional  torch.__version__
collector           str   optional  always "dpro_torch"
argv                list  optional  the job's command line
threads             int   optional  torch.get_num_threads() of the rank
cpu                 dict  optional  CPU affinity, machine id, CPU count (manifest extra.cpu_placement)
gpu                 dict  optional  CUDA device: index, uuid, name, visible_devices, mps (extra.cpu_placement[node].gpu)
grad_ready_markers  bool  optional  whether dpro::grad_ready/<i> markers were recorded
optimizer           dict  optional  optimizer class and state_bytes (manifest extra.optimizer)
comm_calibration    dict  optional  one-element allreduce times (manifest extra.comm_calibration)
clock_probe         dict  optional  ping-pong clock readings to rank 0 (manifest extra.clock_probe)
horovod             dict  optional  Horovod jobs: DistributedOptimizer parameters, timeline file, settings
""")
#: per DDP parameter (``ddp[].params[]``): index, name, shape, dtype, numel, bytes, and ``layer`` (the
#: unit activation checkpointing takes, read from the module tree; manifest ``extra.layers``)
TORCH_PARAM_FIELDS = _table("""
index  int   required  position in the DDP parameter list
name   str   required  named_parameters() name
bytes  int   required  size in bytes
shape  list  optional  tensor shape
dtype  str   optional  dtype without 'torch.'
numel  int   optional  number of elements
layer  str   optional  its layer (dpro_torch.recorder.layer_names)
""")
#: ``meta.json`` ``window``: the profiled steps (the reader numbers the iterations with them)
TORCH_WINDOW_FIELDS = _table("""
start_step      int   optional  first profiled step
stop_step       int   optional  step after the last profiled one
profiled_steps  list  required  the profiled steps, one integer per iteration in the trace
""")
#: ``meta.json`` ``steps[]``: wall time of every iteration
TORCH_STEP_FIELDS = _table("""
step          int     optional  step number
dur_us        number  required  wall time of the step (us)
profiled      bool    optional  whether it was inside the profiling window
end_time_ns   int     optional  time.time_ns() at its end
cpu_us        number  optional  CPU time the process used during the step (all threads)
throttled_us  number  optional  time its cgroup's CPU quota stopped it during the step
thread_cpu_us   number  optional  CPU time of the training thread alone during the step (/proc schedstat)
thread_wait_us  number  optional  time the training thread was runnable but waited for a core (run-queue delay)
""")
#: ``meta.json`` ``measured``: the job's own iteration times
TORCH_MEASURED_FIELDS = _table("""
median_unprofiled_us  number  optional  median wall time of the unprofiled steps (us)
median_profiled_us    number  optional  the same inside the window
median_cpus           number  optional  CPUs used over an unprofiled step (cpu_us / dur_us)
median_throttled_us   number  optional  time the cgroup's CPU quota stopped it per unprofiled step
mean_throttled_us     number  optional  the same, mean over the unprofiled steps (a quota stops some steps only)
median_thread_cpus    number  optional  part of an unprofiled step the training thread ran (thread_cpu_us / dur_us)
median_thread_wait    number  optional  part of it the training thread waited for a core (thread_wait_us / dur_us)
""")
#: ``meta.json`` ``clock.sync[]``: time.time_ns() read around each dpro::clock_sync marker
TORCH_CLOCK_SYNC_FIELDS = _table("""
time_ns_before  int  required  time.time_ns() before the marker
time_ns_after   int  required  time.time_ns() after it
""")
#: ``manifest.extra``: the job facts collectors record and modules read, each parsed once into
#: :class:`Facts` (name, types, meaning)
EXTRA_FIELDS = _table("""
collector                       str     optional  the collector that wrote the folder (dpro_torch, dpro_tf, ...)
run_id                          str     optional  id of the run (ranks of one job agree on it)
measured_iteration_ms           number  optional  the job's iteration time without the profiler (slowest rank)
measured_iteration_ms_per_node  dict    optional  node -> its iteration time without the profiler
profiled_iteration_ms           number  optional  the same inside the profiling window
ddp                             dict    optional  DDP settings (bucket_cap_bytes, gradient_as_bucket_view, ...)
optimizer                       dict    optional  optimizer class and state_bytes (rank 0)
comm_calibration                dict    optional  median_us of a one-element allreduce (slowest rank)
clock_probe                     dict    optional  node -> its own ping-pong clock readings (dpro_torch.clockprobe)
cpu_placement                   dict    optional  node -> affinity, machine, count, threads, gpu, limit_cpus
cpu_use                         dict    optional  node -> cpus (used per unprofiled step), throttled_us (mean per step), limit_cpus, period_us, throttled_us_profiled (step -> us), thread_cpus / thread_wait (the training thread's part of a step running / waiting for a core)
layers                          dict    optional  parameter name -> its layer (the unit activation checkpointing takes)
torch_kineto                    dict    optional  reader options: host_gaps (fold|keep), profiler_overhead
peak_memory_bytes               dict    optional  node -> peak bytes measured another way
alignment                       dict    optional  clock offsets: offsets_us (node -> us); also 'aligned'
offsets_us                      dict    optional  clock offsets (node -> us); also 'offsets'
kineto_plain                    dict    optional  plain torch.profiler input: ranks_present, world_size
notes                           list    optional  lines the commands print about the trace
warnings                        list    optional  what the readers repaired or could not apply (docs/reliability.md)
""")
#: how the torch-kineto reader removes the profiler's cost (``extra.torch_kineto.profiler_overhead``)
OVERHEAD_MODES = ("window", "calibrated", "keep")
#: whether it charges host time between ops to the next op (``extra.torch_kineto.host_gaps``)
HOST_GAP_MODES = ("fold", "keep")

_FIX_MANIFEST = "re-create it (`dpro profile` writes it; `python -m dpro_torch.manifest DIR` rebuilds it)"
_FIX_META = "the folder was not written by this dpro_torch or was edited; re-collect this rank"


# --------------------------------------------------------------------------- validation

#: ``extra`` keys a collector always writes, by ``raw_format``: a manifest that lost one would be
#: replayed with another model silently (fuzz case 54687: an MXNet manifest's ``extra`` renamed, the
#: PS links modelled per host pair instead of per interface, +2.21 %)
EXTRA_WRITTEN_BY: dict[str, tuple[str, ...]] = {"dpro-mxnet": ("link_model",)}


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
        check_name(name, what="a node name", path=path, record=rec, hint=_FIX_MANIFEST)
        if not isinstance(info, dict) or "host" not in info:
            raise TraceFormatError("node entry needs at least a 'host'", path=path, record=rec, hint=_FIX_MANIFEST)
        for f in NODE_FIELDS:
            f.check(info, path=path, record=rec, hint=_FIX_MANIFEST)
        check_name(info["host"], what="a host name", path=path, record=f"{rec}.host", hint=_FIX_MANIFEST)
        for key in ("dir", "file"):   # a relative path inside the trace folder, names the filesystem accepts
            v = info.get(key)
            if isinstance(v, str) and (v.startswith("/") or any(len(p) > 255 or p == ".." for p in v.split("/"))):
                raise TraceFormatError(f"{key} must be a relative path inside the trace folder (no '..', names of at "
                                       f"most 255 characters); got {v!r}"[:300], path=path, record=f"{rec}.{key}",
                                       hint=_FIX_MANIFEST)
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
    extra = doc.get("extra") if isinstance(doc.get("extra"), dict) else {}
    for key in EXTRA_WRITTEN_BY.get(doc.get("raw_format"), ()):
        if key not in extra:
            raise TraceFormatError(f"extra.{key} is missing: the collector of raw_format {doc['raw_format']!r} always "
                                   "writes it, and without it the job would be replayed with another model (the "
                                   "links per host pair instead of per interface)", path=path, record=f"extra.{key}",
                                   hint="restore the manifest.json `dpro profile` wrote, or profile again")
    Facts.from_extra(extra, path=path, strict=True)
    return doc


#: how far a recorded time may be from the collector's own arithmetic on the other fields (us): they
#: are equal up to float rounding in all 180 dpro_torch ``meta.json`` of this machine (7,133 steps)
_STEP_TOLERANCE_US = 0.001


def _check_step_times(steps: list[dict[str, Any]], path: Any) -> None:
    """The steps in order (``step`` and ``end_time_ns`` increase down the list), and each step's ``dur_us`` is
    its ``end_time_ns`` minus the step before's, as the collector computes
    it (``dpro_torch.recorder._step_records``); two steps' times swapped replayed +5.9 % silently
    (fuzz case 16958: the profiled steps' median sets the profiler-cost correction)."""
    # in the order the collector wrote them (fuzz case 52369: the list reversed replayed -2.95 % silently;
    # the profiled steps' first one, left out of the profiler-cost window, was then the last)
    for key in ("step", "end_time_ns"):
        vals = [(k, st.get(key)) for k, st in enumerate(steps) if isinstance(st.get(key), int)]
        bad = next((k for (_, a), (k, b) in zip(vals, vals[1:]) if b <= a), None)
        if bad is not None:
            raise TraceFormatError(f"the steps' {key} must increase down the list (steps[{bad}] is not after the "
                                   "step before it)", path=path, record=f"steps[{bad}].{key}", hint=_FIX_META)
    ends = {st.get("step"): st.get("end_time_ns") for st in steps}
    for k, st in enumerate(steps):
        end, step = st.get("end_time_ns"), st.get("step")
        prev = ends.get(step - 1) if isinstance(step, int) else None
        if end is None or prev is None:
            continue
        want = (end - prev) / 1e3
        if abs(want - st["dur_us"]) > _STEP_TOLERANCE_US:
            raise TraceFormatError(f"dur_us {st['dur_us']!r} is not end_time_ns minus step {step - 1}'s "
                                   f"({want:.3f} us): the step times were edited or damaged", path=path,
                                   record=f"steps[{k}].dur_us", hint=_FIX_META)


def _check_medians(measured: dict[str, Any], steps: list[dict[str, Any]], path: Any) -> None:
    """``measured``'s medians are those of the steps' ``dur_us`` the collector names (the unprofiled
    ``unprofiled_steps_used``, every profiled step; ``dpro_torch.recorder._summary``)."""
    import statistics
    by_step = {st.get("step"): st["dur_us"] for st in steps}
    used = measured.get("unprofiled_steps_used")
    groups = {"median_profiled_us": [st["dur_us"] for st in steps if st.get("profiled")]}
    if isinstance(used, list) and all(isinstance(u, int) and u in by_step for u in used):
        groups["median_unprofiled_us"] = [by_step[u] for u in used]
    for key, durs in groups.items():
        v = measured.get(key)
        if v is None or not durs:
            continue
        want = statistics.median(durs)
        if abs(want - v) > _STEP_TOLERANCE_US:
            raise TraceFormatError(f"{key} {v!r} is not the median of its steps' dur_us ({want:.3f} us): the step "
                                   f"times were edited or damaged", path=path, record=f"measured.{key}",
                                   hint=_FIX_META)


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
    if doc.get("host") is not None:
        check_name(doc["host"], what="a host name", path=path, record="host", hint=_FIX_META)
    _check_object(doc, "window", TORCH_WINDOW_FIELDS, path=path, hint=_FIX_META)
    marks = doc.get("markers")
    for k, v in (marks.items() if isinstance(marks, dict) else ()):
        # the collector's markers are named MARKER_PREFIX...; another name would match no marker of
        # the trace and the reader would go on without them (fuzz case 8482: +2.7 % silently)
        if not (isinstance(v, str) and v.startswith(MARKER_PREFIX) and len(v) <= 200):
            raise TraceFormatError(f"marker name must start with {MARKER_PREFIX!r}; got {v!r}"[:300], path=path,
                                   record=f"markers.{k}"[:200], hint=_FIX_META)
    steps = doc["window"]["profiled_steps"]
    for k, st in enumerate(steps):
        if isinstance(st, bool) or not isinstance(st, int) or not 0 <= st < 2**62:
            raise TraceFormatError(f"a profiled step must be a non-negative integer, got {st!r:.40}", path=path,
                                   record=f"window.profiled_steps[{k}]", hint=_FIX_META)
    if len(set(steps)) != len(steps):
        raise TraceFormatError("a profiled step is listed twice", path=path, record="window.profiled_steps",
                               hint=_FIX_META)
    bad = next((k for k in range(1, len(steps)) if steps[k] < steps[k - 1]), None)
    if bad is not None:   # fuzz case 46938: the list reversed replayed +3.08 % silently (the collector writes it sorted)
        raise TraceFormatError(f"the profiled steps must increase ({steps[bad - 1]} then {steps[bad]})", path=path,
                               record=f"window.profiled_steps[{bad}]", hint=_FIX_META)
    for k, st in enumerate(doc.get("steps") or []):
        _check_object({"s": st}, "s", TORCH_STEP_FIELDS, path=path, hint=_FIX_META, record=f"steps[{k}]")
        if not 0 <= st["dur_us"] <= 86_400e6:   # a step of more than a day: a corrupt time (fuzz case 8236)
            raise TraceFormatError(f"step time {st['dur_us']!r} us is negative or longer than a day", path=path,
                                   record=f"steps[{k}].dur_us", hint=_FIX_META)
    _check_step_times(doc.get("steps") or [], path)
    if doc.get("measured") is not None:
        _check_object(doc, "measured", TORCH_MEASURED_FIELDS, path=path, hint=_FIX_META)
        for key in ("median_unprofiled_us", "median_profiled_us"):   # fuzz case 12342: -2^63 replayed -2 % silently
            v = doc["measured"].get(key)
            if v is not None and not 0 <= v <= 86_400e6:
                raise TraceFormatError(f"{key} {v!r} is negative or longer than a day", path=path,
                                       record=f"measured.{key}", hint=_FIX_META)
        _check_medians(doc["measured"], doc.get("steps") or [], path)
    clock = doc.get("clock")
    if clock is not None:
        if not isinstance(clock, dict) or not isinstance(clock.get("sync", []), list):
            raise TraceFormatError("'clock' must be an object with a 'sync' list", path=path, record="clock",
                                   hint=_FIX_META)
        for k, row in enumerate(clock.get("sync") or []):
            rec = f"clock.sync[{k}]"
            _check_object({"r": row}, "r", TORCH_CLOCK_SYNC_FIELDS, path=path, hint=_FIX_META, record=rec)
            if row["time_ns_after"] < row["time_ns_before"]:
                raise TraceFormatError("time_ns_after is before time_ns_before", path=path, record=rec,
                                       hint=_FIX_META)
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
            if p["bytes"] < 0 or p["index"] < 0:
                raise TraceFormatError("a parameter's index and bytes must be >= 0", path=path,
                                       record=f"{rec}.params[{k}]", hint=_FIX_META)
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


def _check_object(doc: dict[str, Any], key: str, fields: tuple[Field, ...], *, path: Any, hint: str,
                  record: str | None = None) -> None:
    """``doc[key]`` is an object whose fields have the types ``fields`` say (one-line error otherwise)."""
    obj = doc.get(key)
    rec = record or key
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{rec} must be an object, got {obj!r:.40}", path=path, record=rec, hint=hint)
    for f in fields:
        f.check(obj, path=path, record=rec, hint=hint)


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


def _nonneg(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
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
    cpu_use : dict
        Node -> {cpus (used over an unprofiled step), throttled_us (mean per unprofiled step, by its
        cgroup's CPU quota; traces before 2026-11-27 12:00 UTC: the median), limit_cpus (that quota),
        period_us (its CFS period), throttled_us_profiled (profiled step -> us stopped; both
        not in traces before 2026-11-27 17:00 UTC), and where recorded (since 2026-11-28 13:30 UTC)
        thread_cpus / thread_wait (the part of an unprofiled step the training thread ran / waited for a
        core, its ``/proc`` schedstat)}; unusable values are None (:func:`dpro_kit.placement.cpu_limit_warnings`).
    clock_probe : dict
        Node -> its clock-probe readings (``role`` client: ``peers`` node -> [[t1, t4], ...];
        server: ``peer``, ``rows`` [[t2, t3], ...]; ns on that node's clock; :mod:`dpro_kit.align`).
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
    warnings : list of str
        What the readers repaired or could not apply, one line each (commands print them as
        warnings; the allowed repairs are listed in docs/reliability.md).
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
    #: node -> {"cpus", "throttled_us", "limit_cpus", "period_us"} (each a finite number >= 0, or None)
    cpu_use: dict[str, dict[str, float | None]] = field(default_factory=dict)
    clock_probe: dict[str, dict[str, Any]] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)
    host_gaps: str = "fold"
    profiler_overhead: str = "window"
    peak_memory_bytes: dict[str, float] = field(default_factory=dict)
    offsets_us: dict[str, float] = field(default_factory=dict)
    plain_kineto: bool = False
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
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
            cpu_use={str(k): {**{f: _nonneg(v.get(f)) for f in ("cpus", "throttled_us", "limit_cpus", "period_us")},
                              **{f: _nonneg(v[f]) for f in ("thread_cpus", "thread_wait") if _nonneg(v.get(f)) is not None},
                              **({"throttled_us_profiled": {str(i): _nonneg(t) for i, t in v["throttled_us_profiled"].items()
                                                            if _nonneg(t) is not None}}
                                 if isinstance(v.get("throttled_us_profiled"), dict) else {})}
                     for k, v in (get("cpu_use", dict) or {}).items() if isinstance(v, dict)},
            clock_probe={str(k): v for k, v in (get("clock_probe", dict) or {}).items() if isinstance(v, dict)},
            layers={str(k): str(v) for k, v in (get("layers", dict) or {}).items() if isinstance(v, str)},
            host_gaps=host_gaps, profiler_overhead=overhead,
            peak_memory_bytes={str(k): float(v) for k, v in (get("peak_memory_bytes", dict) or {}).items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)},
            offsets_us=find_offsets(extra) or {},
            plain_kineto=bool(extra.get("kineto_plain")),
            notes=[str(x) for x in (get("notes", list) or [])],
            warnings=[str(x) for x in (get("warnings", list) or [])],
            collector=str(extra.get("collector") or ""), run_id=str(extra.get("run_id") or ""))
