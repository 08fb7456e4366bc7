"""What this process may use of the machine: memory available to it now.

Used to refuse, in one line and before any work, an input whose reading is known to need more
memory than the process can get (``dpro_kit.readers.kineto.check_memory``): a 2 GB
torch.profiler file needs about 9 GiB (docs/reliability.md, "Memory"), and running out of it
ends in the kernel's OOM killer or a ``MemoryError`` minutes later, not in an error message.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path

__all__ = ["available_memory_bytes"]

_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None   # "max" (no limit) and anything odd: None


def available_memory_bytes() -> int | None:
    """Bytes this process can still get: the smallest of the machine's ``MemAvailable``
    (``/proc/meminfo``), its cgroup's memory limit minus its usage, and the address-space limit
    (``RLIMIT_AS``) minus what the process has mapped; None when none of them can be read.

    Swap is not counted: a trace read through swap takes hours, which is not a way to read it.
    """
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    for lim_f, use_f in _CGROUP_FILES:
        lim, use = _read_int(lim_f), _read_int(use_f)
        if lim is not None and use is not None and lim < 1 << 60:   # v1 "no limit" is ~2^63
            found.append(max(lim - use, 0))
            break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            vm = int(Path(f"/proc/{os.getpid()}/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            vm = 0
        found.append(max(soft - vm, 0))
    return min(found) if found else None
