"""Names of the ``record_function`` ranges the collector inserts into the Kineto trace.

The reader (``dpro_kit.readers.torch_kineto``) classifies ops by which of these
ranges they fall in; it never guesses an op's role from the op's own name.  All
markers live in the ``dpro::`` namespace, which no framework op uses.  Keep the
strings in sync with ``dpro_kit/readers/torch_kineto.py`` (the collector also
writes them into ``meta.json`` so that the reader can check).
"""

#: Written into meta.json; bump on an incompatible change of meta.json or the markers.
META_FORMAT = "dpro-torch-meta"
META_VERSION = 1

PREFIX = "dpro::"
FORWARD = "dpro::forward"            # DDP module forward (pre-hook .. post-hook)
BACKWARD = "dpro::backward"          # torch.autograd.backward (loss.backward())
OPTIMIZER = "dpro::optimizer_step"   # Optimizer.step (pre-hook .. post-hook)
STEP_END = "dpro::step_end"          # end of one training iteration (one per profiled step)
CLOCK_SYNC = "dpro::clock_sync"      # emitted right after the profiler starts, with time.time_ns() around it
CALIBRATE = "dpro::calibrate"        # profiler-overhead calibration loop, before the first profiled iteration
GRAD_READY = "dpro::grad_ready/"     # + index of the parameter in the DDP parameter list
COMM_WAIT = "dpro::comm_wait"        # the training thread blocks for a framework's collectives (Horovod synchronize)

PHASES = {FORWARD: "FW", BACKWARD: "BW", OPTIMIZER: "UPDATE"}


def as_dict() -> dict:
    return {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "step_end": STEP_END,
            "clock_sync": CLOCK_SYNC, "grad_ready_prefix": GRAD_READY, "calibrate": CALIBRATE,
            "comm_wait": COMM_WAIT}
