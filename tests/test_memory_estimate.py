"""Peak-memory estimate from the trace (dpro_kit.optimize.memory): hand-computed timeline, real jobs, optimize.

The hand-built trace below is an iteration of a 3-layer job (layers a, b, c; parameters of 10, 20 and
30 bytes) written as allocator samples, so every number of the model can be checked by hand:

    op        kind    increments (bytes)                      level (window-relative, steady state)
    data      OTHER   +8 new input, -8 old input              76, 68
    zero_grad OTHER   -30 -20 -10 (old gradients)             38, 18, 8
    fwA1/fwA2 FW      +60 (a's saved) / +40 (a's output)      68, 108
    fwB1/fwB2 FW      +120 / +80 (b's output)                 228, 308
    fwC       FW      +300                                    608
    loss      OTHER   +40                                     648
    bwC       BW      +30 grad c, +80 d(b out), -300, -80 (b out), -40 (loss)    678, 758 <- peak, ...
    accC      BW      (gradient of c ready)
    bwB       BW      +20 grad b, +40 d(a out), -120, -40 (a out), -80 d(b out)
    accB      BW
    bwA       BW      +10 grad a, -60, -40 d(a out)           ..., 68
    accA      BW
    step      UPDATE  +5, -5

Persistent (not in the samples): params 60 + DDP bucket buffer 60 + optimizer state 60 (1 slot) = 180.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import profile_ddp
from dpro_kit.cli.optimize import optimize
from dpro_kit.optimize.memory import MemoryModel, build_profile, checkpoint_segments, layer_of
from dpro_kit.optimize.state import Strategy
from dpro_kit.trace import Collective, Manifest, NodeInfo, TraceSet, load_trace, make_events, save_trace

ROOT = Path(__file__).resolve().parents[1]

OPS = [("data", "OTHER", [8, -8]), ("zero_grad", "OTHER", [-30, -20, -10]),
       ("fwA1", "FW", [60]), ("fwA2", "FW", [40]), ("fwB1", "FW", [120]), ("fwB2", "FW", [80]),
       ("fwC", "FW", [300]), ("loss", "OTHER", [40]),
       ("bwC", "BW", [30, 80, -300, -80, -40]), ("accC", "BW", []),
       ("bwB", "BW", [20, 40, -120, -40, -80]), ("accB", "BW", []),
       ("bwA", "BW", [10, -60, -40]), ("accA", "BW", []), ("step", "UPDATE", [5, -5])]
#: frees of tensors allocated before the profiling window: not counted in the first profiled iteration
STALE = {("data", -8), ("zero_grad", -30), ("zero_grad", -20), ("zero_grad", -10)}
PERSISTENT = 180


def toy_traceset(iterations: int = 3) -> TraceSet:
    nodes = {f"w{r}": NodeInfo(host=f"h{r}", role="worker", rank=r) for r in range(2)}
    manifest = Manifest(job="toy", framework="pytorch", comm_backend="gloo", world_size=2, nodes=nodes,
                        iterations=list(range(iterations)),
                        extra={"ddp": {"gradient_as_bucket_view": False}})
    records, samples = [], []
    for w in nodes:
        t, level = 0.0, 0
        for it in range(iterations):
            for op, kind, deltas in OPS:
                records.append({"node": w, "op": op, "name": op, "kind": kind, "iteration": it, "start": t,
                                "dur": 8.0})
                for j, d in enumerate(deltas):
                    if it == 0 and (op, d) in STALE:
                        continue
                    level += d
                    samples.append({"node": w, "iteration": it, "time": t + 1 + j * 0.5, "device": "cpu",
                                    "bytes": level})
                t += 10.0
    events = make_events(records)
    events["host"] = events["node"].map({n: i.host for n, i in nodes.items()}).astype("string")
    coll = Collective(tensor="bucket0", op="allreduce", bytes=60, participants=list(nodes),
                      inputs={w: ["accA"] for w in nodes}, outputs={w: ["step"] for w in nodes},
                      params=["c.weight", "b.weight", "a.weight"], param_bytes=[30, 20, 10],
                      param_ready={w: ["accC", "accB", "accA"] for w in nodes})
    edges = {w: [(a[0], b[0]) for a, b in zip(OPS, OPS[1:])] for w in nodes}
    return TraceSet(manifest=manifest, events=events, edges=edges, collectives=[coll],
                    memory=pd.DataFrame(samples))


def _strategy(**mem) -> Strategy:
    return Strategy(groups=(("bucket0",),), memory=tuple(sorted(mem.items())))


def test_layers_and_segments():
    assert layer_of("body.0.weight") == "body.0" and layer_of("blocks.layers.1.self_attn.in_proj_weight") == \
        "blocks.layers.1" and layer_of("conv1.bias") == "conv1" and layer_of("head.weight") == "head"
    # checkpoint_sequential: round(sqrt(L)) segments of L // k layers, the last one takes the rest
    assert checkpoint_segments(3) == [[0], [1, 2]]
    assert checkpoint_segments(6) == [[0, 1, 2], [3, 4, 5]]
    assert checkpoint_segments(10) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert checkpoint_segments(2) == [[0, 1]]          # round(sqrt(2)) = 1: nothing checkpointed


def test_layers_come_from_the_module_tree():
    """The collector reads a parameter's layer from the module tree (the child of the outermost
    Sequential/ModuleList, what checkpoint_sequential runs); the name rule is only the fallback.
    Real torch modules: the example's three models (both rules agree, so the recorded traces keep
    their layers) and a model whose Sequential names its children (they differ; the tree is right)."""
    torch = pytest.importorskip("torch")
    from collections import OrderedDict

    import dpro_torch.recorder as R
    sys.path.insert(0, str(ROOT / "examples" / "ddp"))
    import train
    for model in ("mlp", "cnn", "transformer"):
        net = train.build(model, 2, torch.device("cpu"))[0]
        names = [n for n, _ in net.named_parameters()]
        assert R.layer_names(net, names) == {n: layer_of(n) for n in names}
    nn = torch.nn

    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(OrderedDict(conv=nn.Linear(4, 4), act=nn.ReLU(), fc=nn.Linear(4, 4)))
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.head = nn.Linear(4, 2)
    net = Named()
    names = [n for n, _ in net.named_parameters()]
    got = R.layer_names(net, names)
    assert sorted(set(got.values())) == ["blocks.0", "blocks.1", "body.conv", "body.fc", "head"]
    assert {layer_of(n) for n in names if n.startswith("body.")} == {"body"}       # the name rule's one layer
    assert all(layer_of(n, got) == got[n] for n in names)                         # the recorded layer wins


def test_timeline_model_hand_computed(tmp_path: Path):
    ts = load_trace(save_trace(toy_traceset(), tmp_path / "toy"))   # native round trip keeps the samples
    prof = build_profile(ts)
    assert prof is not None
    assert prof.layers == ["a", "b", "c"]
    assert prof.persistent == {"params": 60, "comm_buffers": 60, "optimizer_state": 60, "grads": 0}
    assert "assumed" in prof.sources["optimizer_state"] and prof.sources["comm_buffers"].startswith("trace")
    # the first profiled iteration is skipped (its pre-window frees are not counted)
    assert {t.iteration for t in prof.usable()} == {1, 2}
    assert all(t.grads_at_start == 60 for t in prof.usable())
    assert all(sum(s.kind == "grad" for s in t.steps) == 3 for t in prof.usable())

    mm = MemoryModel(profile=prof)
    # traced configuration: the replayed samples peak at 758 (bwC), + 180 persistent
    e = mm.estimate(None, _strategy())
    assert e["peak_bytes"] == 758 + PERSISTENT and e["model"] == "timeline"
    assert e["at"]["op"] == "bwC" and e["parts"]["grads"] == 30 and e["parts"]["activations"] == 728
    # 2 micro-batches: forward/loss/backward increments halved and played twice; in the second one the
    # new gradient of c (30) exists next to the accumulated ones (60) until accC: 368 + 20 + 30 + 40 = 458
    assert mm.estimate(None, _strategy(accum_steps=2))["peak_bytes"] == 458 + PERSISTENT
    # recomputation: L = 3 -> segments [a], [b, c]; a's saved activations (60 = its backward's frees 100
    # minus its output 40, kept as b's input) are dropped until a is re-run before bwA: 758 - 60 = 698
    r = mm.estimate(None, _strategy(recompute=True))
    assert r["peak_bytes"] == 698 + PERSISTENT
    assert r["checkpoint"]["checkpointed"] == [["a"]] and r["checkpoint"]["dropped_bytes"] == [60]
    # both: 338 (halved forward, a dropped) + 20 loss + 30 transient gradient + 40 d(b out) = 428
    assert mm.estimate(None, _strategy(recompute=True, accum_steps=2))["peak_bytes"] == 428 + PERSISTENT
    # overrides: optimizer slots, and activations given by the user (sum model with the trace's buffers)
    assert MemoryModel(profile=prof, optimizer_slots=2).estimate(None, _strategy())["peak_bytes"] == 758 + 240
    s = MemoryModel(profile=prof, activation_bytes=1000).estimate(None, _strategy())
    assert s["model"] == "sum" and s["parts"]["comm_buffers"] == 60 and s["parts"]["activations"] == 1000


def test_optimizer_state_recorded_in_the_trace_is_used():
    ts = toy_traceset()
    ts.manifest.extra["optimizer"] = {"class": "Adam", "state_bytes": 120}   # what a collector would record
    prof = build_profile(ts)
    assert prof.persistent["optimizer_state"] == 120 and "Adam" in prof.sources["optimizer_state"]
    assert MemoryModel(profile=prof).estimate(None, _strategy())["peak_bytes"] == 758 + 60 + 60 + 120


def test_no_samples_falls_back_to_the_sum_model(tiny_trace_dir: Path):
    assert build_profile(load_trace(tiny_trace_dir)) is None


# --------------------------------------------------------------------------- real jobs

def _train(model: str, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "ddp" / "train.py"), "--nproc", "2", "--model", model,
            "--quiet", *extra]


@pytest.fixture(scope="module")
def cnn_job(tmp_path_factory) -> dict:
    """A profiled 2-rank CNN job and the real peaks (train.py --memory-peak, no dpro) of two configurations."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("memest")
    trace = d / "trace"
    profile_ddp(trace, "--memory", steps="4:7", train=["--model", "cnn", "--iters", "6", "--warmup", "2"], timeout=300)
    real = {}
    for label, flags in (("default", []), ("accum2", ["--accum-steps", "2"])):
        # one run each: --memory-peak skips DDP's initial broadcast, whose buffer the profiler's CPU
        # accounting missed freeing in about 1 run of 3 (docs/optimizer.md)
        f = d / f"{label}.json"
        r = subprocess.run(_train("cnn", "--iters", "3", "--warmup", "1", "--memory-peak", str(f), *flags),
                           capture_output=True, text=True, timeout=300)
        # gloo can abort at interpreter exit after the job wrote its result (bench/accuracy.py notes
        # the same); a missing result is a failure
        assert r.returncode == 0 or f.exists(), r.stderr[-2000:]
        real[label] = json.loads(f.read_text())["peak_bytes"]
    return {"trace": trace, "real": real}


@pytest.mark.slow
def test_estimate_close_to_the_real_peak(cnn_job: dict):
    prof = build_profile(load_trace(cnn_job["trace"]))
    assert prof is not None and prof.sources["activations"].startswith("trace")
    mm = MemoryModel(profile=prof)
    est = mm.peak()["peak_bytes"]
    real = cnn_job["real"]["default"]
    assert abs(est - real) / real < 0.05, (est, real)
    # a prediction from the default run's trace, checked against a real accumulation run
    pred, real2 = mm.peak(accum_steps=2)["peak_bytes"], cnn_job["real"]["accum2"]
    assert abs(pred - real2) / real2 < 0.05, (pred, real2)
    assert real2 < 0.8 * real          # accumulation really lowers the peak of this activation-heavy job


@pytest.mark.slow
def test_budget_below_the_trace_estimate_forces_a_memory_pass(cnn_job: dict, tmp_path: Path):
    est = MemoryModel(profile=build_profile(load_trace(cnn_job["trace"]))).peak()["peak_bytes"]
    budget = int(est * 0.85)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(optimize, [str(cnn_job["trace"]), "-o", str(out), "-q", "--budget", "20",
                                      "--memory-budget", str(budget)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    mem = plan["memory"]
    assert mem["estimate_before"]["model"] == "timeline" and mem["estimate_before"]["peak_bytes"] == est
    assert mem["choices"] and mem["estimate_after"]["peak_bytes"] <= budget
    assert any(s["applied_as"] == "memory" for s in plan["strategies"])
    assert mem["sources"]["activations"].startswith("trace") and "timeline" in mem["model"]
    # without a budget the estimate is still reported, and nothing is changed for memory
    r = CliRunner().invoke(optimize, [str(cnn_job["trace"]), "-o", str(out), "-q", "--budget", "5"])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["memory"]["choices"] == {}


@pytest.mark.slow
def test_recorded_layers_drive_the_memory_model(cnn_job: dict):
    """A real profiled job's manifest carries each parameter's layer; the memory model's layers are
    those (a different record gives different layers), not a rule borrowed from the example script."""
    import dataclasses
    ts = load_trace(cnn_job["trace"])
    layers = ts.manifest.facts.layers
    assert layers and set(layers.values()) == {"conv1", "conv2", "conv3", "fc1", "fc2"}
    prof = build_profile(ts)
    assert prof.layers == ["conv1", "conv2", "conv3", "fc1", "fc2"]               # forward order
    coarse = {n: ("convs" if lay.startswith("conv") else "fcs") for n, lay in layers.items()}
    man = dataclasses.replace(ts.manifest, extra={**ts.manifest.extra, "layers": coarse})
    assert build_profile(dataclasses.replace(ts, manifest=man)).layers == ["convs", "fcs"]


@pytest.mark.slow
def test_replayed_memory_of_a_real_job_peaks_like_the_timeline_model(cnn_job: dict):
    """`dpro replay --memory`: the real job's allocator increments put on the DFG's ops and played at the
    replayed times peak where the timeline model says (the worker with the largest median peak)."""
    from dpro_kit.session import Session
    s = Session(cnn_job["trace"])
    m = s.memory(s.replay(), limit=None)
    est = MemoryModel(profile=build_profile(load_trace(cnn_job["trace"]))).peak()["peak_bytes"]
    assert abs(max(m.peak.values()) - est) / est < 0.02, (m.peak, est)
    real = cnn_job["real"]["default"]
    assert abs(max(m.peak.values()) - real) / real < 0.05, (m.peak, real)
