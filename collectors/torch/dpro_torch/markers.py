"""Names of the ``record_function`` ranges the collector inserts into the Kineto trace.

One definition, shared with the reader: :mod:`dpro_collect.schema` (standard library
only; :mod:`dpro_kit.schema` re-exports it) holds the marker names and the ``meta.json``
format and version; this module gives them the collector's short names.  The reader (``dpro_kit.readers.torch_kineto``) classifies
ops by which of these ranges they fall in; it never guesses an op's role from the op's own
name.  All markers live in the ``dpro::`` namespace, which no framework op uses; the
collector also writes them into ``meta.json`` (``markers``).
"""
from dpro_collect.schema import MARKER_PREFIX, MARKERS, PHASE_MARKERS, TORCH_META_FORMAT, TORCH_META_VERSION

#: Written into meta.json; bump (in dpro_collect/schema.py) on an incompatible change of meta.json or the markers.
META_FORMAT = TORCH_META_FORMAT
META_VERSION = TORCH_META_VERSION

PREFIX = MARKER_PREFIX
FORWARD = MARKERS["forward"]          # DDP module forward (pre-hook .. post-hook)
BACKWARD = MARKERS["backward"]        # torch.autograd.backward (loss.backward())
OPTIMIZER = MARKERS["optimizer"]      # Optimizer.step (pre-hook .. post-hook)
STEP_END = MARKERS["step_end"]        # end of one training iteration (one per profiled step)
CLOCK_SYNC = MARKERS["clock_sync"]    # emitted right after the profiler starts, with time.time_ns() around it
CALIBRATE = MARKERS["calibrate"]      # profiler-overhead calibration loop, before the first profiled iteration
GRAD_READY = MARKERS["grad_ready_prefix"]  # + index of the parameter in the DDP parameter list
COMM_WAIT = MARKERS["comm_wait"]      # the training thread blocks for a framework's collectives (Horovod synchronize)

PHASES = {MARKERS[role]: kind for role, kind in PHASE_MARKERS.items()}


def as_dict() -> dict:
    """Marker role -> range name (``meta.json`` ``markers``)."""
    return dict(MARKERS)
