"""Names of the files collectors write: formats, versions, raw formats, marker names (standard library only).

One definition for the collectors (inside the user's job) and dpro-kit's readers:
:mod:`dpro_kit.schema` re-exports these and adds the fields and validation
(``validate_manifest``, ``validate_torch_meta``, ``Facts``).  Bump a version on an
incompatible change; ``docs/trace-format.md`` describes the formats.
"""
from __future__ import annotations

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MANIFEST_VERSIONS", "TORCH_META_FORMAT", "TORCH_META_VERSION",
           "TORCH_META_VERSIONS", "TORCH_RAW_FORMAT", "HOROVOD_RAW_FORMAT", "TF_META_FORMAT", "TF_META_VERSION",
           "TF_META_VERSIONS", "TF_RAW_FORMAT", "MXNET_META_FORMAT", "MXNET_META_VERSION", "MXNET_META_VERSIONS",
           "MXNET_RAW_FORMAT", "MARKER_PREFIX", "MARKERS", "PHASE_MARKERS"]

# --------------------------------------------------------------------------- formats and versions

#: ``manifest.json`` (docs/trace-format.md)
MANIFEST_FORMAT = "dpro-trace"
MANIFEST_VERSION = 1
MANIFEST_VERSIONS = (1,)
#: the PyTorch collector's per-rank ``<host>/<rank>/meta.json``
TORCH_META_FORMAT = "dpro-torch-meta"
TORCH_META_VERSION = 1
TORCH_META_VERSIONS = (1,)
#: ``manifest.raw_format`` of the PyTorch collector's folders (reader ``torch-kineto``)
TORCH_RAW_FORMAT = "torch-kineto"
#: ... of a Horovod job's folders: Kineto + each rank's Horovod timeline (reader ``dpro_kit.readers.horovod``)
HOROVOD_RAW_FORMAT = "horovod-torch"
#: the TensorFlow collector's per-task ``<host>/<task>/meta.json`` (collectors/tf/README.md) and its
#: ``manifest.raw_format`` (reader ``dpro_kit.readers.tf``)
TF_META_FORMAT = "dpro-tf-meta"
TF_META_VERSION = 1
TF_META_VERSIONS = (1,)
TF_RAW_FORMAT = "tf-xplane"
#: the MXNet collector's per-process ``<host>/<worker<rank>|server-<pid>>/meta.json`` and its
#: ``manifest.raw_format`` (reader ``dpro_kit.readers.mxnet``)
MXNET_META_FORMAT = "dpro-mxnet-meta"
MXNET_META_VERSION = 1
MXNET_META_VERSIONS = (1,)
MXNET_RAW_FORMAT = "dpro-mxnet"

# --------------------------------------------------------------------------- markers

#: namespace of the PyTorch collector's ``record_function`` ranges (no framework op uses it)
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
