#!/usr/bin/env python3
"""Fused-op times from torch.compile: how faithful the rebuilt regions are (docs/optimizer.md).

For every model of ``examples/ddp/train.py`` (2 gloo ranks, CPU, 1 intra-op thread):

1. ``dpro profile --shapes`` (op input shapes recorded in one iteration after the window);
2. regions rebuilt from the shapes (``dpro_kit.optimize.compile_timing``): the whole
   forward pass (every FW op) and each pair of consecutive FW ops; each timed eager and
   compiled (torch.compile, inductor), as ``dpro optimize --fusion-timing compile`` does;
3. checks: (a) the rebuilt region run eagerly vs the same ops' traced time (median over
   the profiled iterations, rank 0) - does the probe run what the job ran?  (b) the
   whole-forward compiled/eager ratio of the rebuilt region vs the ratio of the REAL
   model's forward (the example's nn.Module, same batch and threads, eager vs
   torch.compile, with autograd recording as in training) - does the probe predict
   what compiling the real module does?

    python bench/fusion_timing.py                       # 3 models (~2 min)
    python bench/fusion_timing.py --models mlp --json rows.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpro_kit.jobs import run_job  # noqa: E402
from dpro_kit.optimize.compile_timing import _time_calls, load_shapes, time_fusions  # noqa: E402
from dpro_kit.trace import load_trace  # noqa: E402

BATCH = {"mlp": 32, "cnn": 32, "transformer": 8}


def profile(model: str, out: Path) -> None:
    """``dpro profile --shapes`` of a 2-rank job on this machine, through :func:`dpro_kit.jobs.run_job`."""
    cmd = [sys.executable, str(ROOT / "examples" / "ddp" / "train.py"), "--nproc", "2", "--model", model,
           "--batch-size", str(BATCH[model]), "--iters", "14", "--warmup", "2", "--threads", "1", "--quiet"]
    log = out.parent / f"{model}-job.log"
    with open(log, "w") as f:
        r = run_job(cmd, ranks_per_host=None, profile=out, steps="8:13", profile_flags=["--shapes"], log=f,
                    timeout=600)
    if not r.ok:
        raise SystemExit(f"profiling {model} failed ({r.codes}):\n{log.read_text()[-2000:]}")


def real_forward_ratio(model: str, samples: int = 15) -> tuple[float, float]:
    """(eager us, compiled us) of the example's real model forward, 1 thread, grad recorded."""
    import torch
    sys.path.insert(0, str(ROOT / "examples" / "ddp"))
    import train  # the example's models
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net, batch_fn, _ = train.build(model, BATCH[model], torch.device("cpu"))[:3]
    x, _ = batch_fn()
    cnet = torch.compile(net, fullgraph=False, dynamic=False)
    cnet(x), net(x)
    eager, comp = [], []
    for _ in range(samples):
        eager.append(_time_calls(lambda: net(x), 0.01))
        comp.append(_time_calls(lambda: cnet(x), 0.01))
    return statistics.median(eager) * 1e6, statistics.median(comp) * 1e6


def run_model(model: str, work: Path) -> list[dict[str, Any]]:
    out = work / model
    profile(model, out)
    ts = load_trace(out)
    node = next(n for n, i in ts.manifest.nodes.items() if i.rank == 0)
    ev = ts.events[(ts.events["node"] == node) & (ts.events["kind"] == "FW")]
    traced = ev.groupby("op")["dur"].median().to_dict()
    order = list(ev[ev["iteration"] == ev["iteration"].min()].sort_values("start")["op"])
    shapes, threads = load_shapes(out)
    regions = [("forward", tuple(order))] + [(f"{a} + {b}", (a, b)) for a, b in zip(order, order[1:])]
    timings = time_fusions([r for _, r in regions], shapes, threads=threads)
    rows = []
    for label, ops in regions:
        t = timings[ops]
        tr = sum(traced[o] for o in ops)
        rows.append({"model": model, "region": label, "ops": len(ops), "traced_us": tr,
                     "eager_us": t.eager_us, "compiled_us": t.compiled_us, "ratio": t.ratio,
                     "predicted_fused_us": (t.ratio * tr) if t.ratio is not None else None,
                     "reason": "" if t.ratio is not None else t.reason})
    e, c = real_forward_ratio(model)
    rows[0].update({"real_eager_us": e, "real_compiled_us": c, "real_ratio": c / e})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def f(x: Any, p: int = 1) -> str:
        return "-" if x is None else f"{x:.{p}f}"
    lines = ["model        region                                        ops  traced us  probe eager  eager/traced  "
             "compiled  ratio  real fwd ratio"]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['region'][:44]:<44} {r['ops']:>4}  {f(r['traced_us']):>9}  "
                     f"{f(r['eager_us']):>11}  {f(r['eager_us'] / r['traced_us'] if r['eager_us'] and r['traced_us'] else None, 2):>12}  "
                     f"{f(r['compiled_us']):>8}  {f(r['ratio'], 2):>5}  {f(r.get('real_ratio'), 2):>14}"
                     + (f"   ({r['reason'][:60]})" if r["reason"] else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces here")
    a = ap.parse_args()
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for m in a.models:
            print(f"[{time.time() - t0:6.1f}s] {m}", file=sys.stderr, flush=True)
            rows += run_model(m, work)
    print(render(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
