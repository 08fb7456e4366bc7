"""Peak-memory model (ESTIMATED — not yet checked against a real peak; see docs/optimizer.md).

peak = params + grads + optimizer state + live activations

* params = grads = sum of the synchronised tensors' bytes (data parallel: every
  rank holds a full replica; the gradients are what the collectives move);
* optimizer state = ``optimizer_slots`` x params (SGD+momentum 1, Adam 2);
* activations: ``activation_bytes`` given by the user (the trace does not yet
  record activation sizes); with recomputation only ~sqrt(L) of L layers' activations
  are kept (checkpointing every sqrt(L) layers); with m-step gradient accumulation
  each micro-batch holds 1/m of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .state import BaseJob, Strategy


@dataclass
class MemoryModel:
    activation_bytes: int = 0
    optimizer_slots: float = 1.0
    layers: int = 0          # for recomputation's sqrt(L); 0 = number of tensors

    def estimate(self, base: BaseJob, strategy: Strategy) -> dict[str, Any]:
        params = sum(t.bytes for t in base.tensors.values())
        m = strategy.mem()
        act = float(self.activation_bytes)
        L = self.layers or max(1, len(base.tensors))
        if m.get("recompute"):
            act *= min(1.0, 2.0 * math.sqrt(L) / L)
        act /= max(1, int(m.get("accum_steps", 1)))
        parts = {"params": params, "grads": params, "optimizer_state": int(self.optimizer_slots * params),
                 "activations": int(act)}
        return {"peak_bytes": int(sum(parts.values())), "parts": parts, "estimated": True,
                "activation_source": "user (--activation-bytes)" if self.activation_bytes else "unknown (0)"}


def parse_size(text: str | int | None) -> int | None:
    """'16GB', '512MiB', '1e9' -> bytes."""
    if text is None or isinstance(text, int):
        return text
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "K": 2**10, "M": 2**20, "G": 2**30, "B": 1}
    for u, f in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * f)
    return int(float(s))
