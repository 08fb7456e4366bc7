"""Applying a `dpro optimize` plan to real 2-rank gloo DDP jobs (dpro_torch.plan, examples/ddp --plan).

* one real job (2 processes, gloo, this file run as a script) trains the example MLP with
  default DDP and, on the same batches, with plans applied in several DDP set-ups; each
  rank writes its gradient comparison and what the comm hook reduced (tests (a), (b));
* bad plans fail with a DproError naming the file and the problem (c), also from
  examples/ddp/train.py before any rank starts;
* the plan `dpro optimize` writes for the recorded fixture examples/traces/ddp-2rank-gloo
  applies to the same model: in the job above (DDP's buckets after its rebuild are the
  plan's groups) and through `examples/ddp/train.py --plan` with the fixture's arguments (d).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "examples" / "traces" / "ddp-2rank-gloo"
TRAIN = ROOT / "examples" / "ddp" / "train.py"
COLLECTOR = ROOT / "collectors" / "torch"
PY = sys.executable
if importlib.util.find_spec("dpro_torch") is None:   # not installed: the checkout's collector
    sys.path.insert(0, str(COLLECTOR))

# MLP parameters in gradient-ready order (reverse definition order; see the fixture's meta.json)
READY = ["head.bias", "head.weight", "body.2.bias", "body.2.weight", "body.1.bias", "body.1.weight",
         "body.0.bias", "body.0.weight"]
NUMEL = {"head.bias": 10, "head.weight": 5120, "body.2.bias": 512, "body.2.weight": 262144,
         "body.1.bias": 512, "body.1.weight": 262144, "body.0.bias": 512, "body.0.weight": 131072}

# A plan no bucket cap gives: a 3-parameter group, a group partitioned in 3, a group whose members
# are not adjacent in gradient order (body.1.bias ... body.0.bias) with a 2-way partition after
# body.1.weight between them, and body.0.weight left out of the plan (reduced on its own).
HAND_GROUPS = [(["head.bias", "head.weight", "body.2.bias"], 1), (["body.2.weight"], 3),
               (["body.1.weight"], 2), (["body.1.bias", "body.0.bias"], 1)]


# Contiguous in gradient order, unpartitioned, and no single cap gives them (20 KiB, 1 MiB, 1.5 MiB):
# DDP's per-bucket caps (bucket_cap_mb_list, torch >= 2.13) apply them with no hook.
LIST_GROUPS = [(["head.bias", "head.weight"], 1), (["body.2.bias", "body.2.weight", "body.1.bias"], 1),
               (["body.1.weight", "body.0.bias", "body.0.weight"], 1)]


def make_plan(groups: list[tuple[list[str], int]], exact: bool = False, cap_mb: float = 1.0) -> dict:
    """A minimal valid plan (what `dpro optimize` writes, without the prediction details)."""
    from dpro_kit.graph.topology import split_bytes
    tg = []
    for i, (params, k) in enumerate(groups):
        nbytes = 4 * sum(NUMEL.get(p, 1) for p in params)
        tg.append({"name": f"g{i}", "tensors": [f"t{i}"], "params": params, "bytes": nbytes, "partitions": k,
                   "partition_bytes": split_bytes(nbytes, k)})
    return {"format": "dpro-plan", "version": 1, "trace": "hand-made",
            "predicted": {"before_ms": 1.0, "after_ms": 1.0, "speedup": 1.0}, "strategies": [],
            "tensor_groups": tg, "op_fusion_groups": [],
            "memory": {"choices": {}, "estimate_before": {}, "estimate_after": {}},
            "frameworks": {"pytorch_ddp": {"bucket_cap_mb": cap_mb, "exact": exact,
                                           "bucket_plan": [g["params"] for g in tg]},
                           "horovod": {"HOROVOD_FUSION_THRESHOLD": 0, "HOROVOD_CYCLE_TIME": 1.0},
                           "byteps": {"BYTEPS_PARTITION_BYTES": 4096}, "xla": {}, "torch_compile": {}},
            "search": {}, "estimated": []}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(COLLECTOR), str(ROOT / "collectors" / "common"), str(ROOT),
                                         env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def fixture_plan(tmp_path_factory) -> Path:
    """`dpro optimize` on the recorded fixture (the real CLI); --min-gain 0: its small predicted gain
    (0.8 %) would otherwise make the plan keep the traced configuration, and these tests apply groups."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    proc = subprocess.run([PY, "-m", "dpro_kit.cli", "optimize", str(FIXTURE), "-o", str(out), "--quiet",
                           "--seed", "0", "--min-gain", "0"], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory, fixture_plan) -> dict:
    """Run the 2-rank job (this file as a script) once; every rank's results."""
    d = tmp_path_factory.mktemp("job")
    (d / "hand.json").write_text(json.dumps(make_plan(HAND_GROUPS)))
    mem = make_plan(HAND_GROUPS)
    mem["memory"]["choices"] = {"accum_steps": 2, "recompute": False}
    (d / "hand_mem.json").write_text(json.dumps(mem))
    (d / "list.json").write_text(json.dumps(make_plan(LIST_GROUPS)))
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    t0 = time.time()
    procs = [subprocess.Popen([PY, __file__, str(d), str(fixture_plan)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(outs)
    res = {r: json.loads((d / f"rank{r}.json").read_text()) for r in range(2)}
    res["wall_s"] = time.time() - t0
    res["fixture_plan"] = str(fixture_plan)
    return res


# --------------------------------------------------------------------------- (a) numerically DDP

HOOK_SETUPS = ["hook", "hook_coarse_view", "hook_static", "hook_unused"]


@pytest.mark.slow
@pytest.mark.parametrize("setup", HOOK_SETUPS)
def test_gradients_equal_default_ddp(job, setup):
    """Every iteration (DDP's first one-bucket iteration, the rebuild, after it) the averaged gradients
    and the updated weights equal default DDP's on the same batches, on both ranks."""
    for r in range(2):
        res = job[r][setup]
        assert res["mode"] == "comm_hook", res["description"]
        assert len(res["iterations"]) == 3
        for it in res["iterations"]:
            assert it["grads_allclose"], (setup, r, it)
            assert it["params_allclose"], (setup, r, it)
            assert it["max_abs_diff"] <= 1e-6
            assert it["grad_norm"] > 0
            assert it["differs_from_local"] > 1e-4          # averaged over ranks, not this rank's own


@pytest.mark.slow
def test_contiguous_groups_use_per_bucket_caps(job):
    """A non-exact, unpartitioned plan whose groups are contiguous in gradient order: stock DDP with
    bucket_cap_mb_list, the same gradients as default DDP, and after the rebuild DDP's buckets are the groups."""
    for r in range(2):
        res = job[r]["list"]
        assert res["mode"] == "bucket_cap_list", res["description"]
        assert all(it["grads_allclose"] and it["params_allclose"] for it in res["iterations"])
        assert res["verify"][0], res["verify"]
        assert [sorted(b) for b in res["buckets"]] == [sorted(g) for g, _ in LIST_GROUPS]


# --------------------------------------------------------------------------- (b) the plan's groups ran

@pytest.mark.slow
@pytest.mark.parametrize("setup", HOOK_SETUPS)
def test_hook_launched_the_plans_groups(job, setup):
    unplanned = [["body.0.weight"]] + ([["unused.weight"], ["unused.bias"]] if setup == "hook_unused" else [])
    want = [g for g, _ in HAND_GROUPS] + unplanned
    parts = {tuple(g): k for g, k in HAND_GROUPS} | {tuple(g): 1 for g in unplanned}
    numel = NUMEL | {"unused.weight": 16, "unused.bias": 4}
    for r in range(2):
        res = job[r][setup]
        launches = res["launches"]
        assert {x["iteration"] for x in launches} == {0, 1, 2}
        for it in range(3):
            got = [x for x in launches if x["iteration"] == it]
            assert sorted(x["params"] for x in got) == sorted(want)      # exactly the plan's groups, once each
            for x in got:
                assert x["numel"] == sum(numel[p] for p in x["params"])
                assert len(x["partitions"]) == parts[tuple(x["params"])]
                assert sum(x["partitions"]) == x["numel"]
                assert max(x["partitions"]) - min(x["partitions"]) <= 1   # equal split, as partition_bytes
                assert x["from_plan"] == (x["params"] not in unplanned)
        # one collective per partition, nothing else
        assert res["collectives"] == 3 * sum(parts.values())
        assert res["verify"][0], res["verify"][1]
        assert any("not in the plan" in w for w in res["warnings"])
    # every rank launched the same collectives in the same order (else gloo would have mismatched)
    assert job[0][setup]["launches"] == job[1][setup]["launches"]


@pytest.mark.slow
def test_parameters_ddp_ignores_leave_their_group(job):
    """A planned parameter in DDP's parameters_to_ignore is dropped from its group (not waited for)."""
    for r in range(2):
        res = job[r]["hook_ignored"]
        assert all(it["grads_allclose"] for it in res["iterations"])
        got = [x["params"] for x in res["launches"] if x["iteration"] == 2]
        assert sorted(got) == sorted([g for g, _ in HAND_GROUPS[:3]] + [["body.0.bias"], ["body.0.weight"]])
        assert any("body.1.bias" in w and "not reduced by DDP" in w for w in res["warnings"])
        assert res["verify"][0]


@pytest.mark.slow
def test_launch_order_follows_gradient_order_after_rebuild(job):
    """With one parameter per DDP bucket, a group starts when its last gradient is ready."""
    got = [x["params"] for x in job[0]["hook"]["launches"] if x["iteration"] == 2]
    last = [max(READY.index(p) for p in g) for g in got]
    assert last == sorted(last)
    assert got[:2] == [HAND_GROUPS[0][0], HAND_GROUPS[1][0]]


@pytest.mark.slow
def test_exact_plan_uses_the_bucket_cap(job):
    """(d) the fixture's plan is exact: DDP's own buckets after the rebuild are the plan's groups."""
    for r in range(2):
        res = job[r]["fixture_auto"]
        assert res["mode"] == "bucket_cap", res["description"]
        assert "bucket_cap_mb" in res["description"]
        assert res["verify"][0], res["verify"][1]
        assert all(it["grads_allclose"] for it in res["iterations"])
        plan = json.loads(Path(job["fixture_plan"]).read_text())
        assert res["buckets"] == plan["frameworks"]["pytorch_ddp"]["bucket_plan"]
        hook = job[r]["fixture_hook"]                 # and the same groups through the hook
        assert hook["mode"] == "comm_hook" and hook["verify"][0]
        assert all(it["grads_allclose"] for it in hook["iterations"])


@pytest.mark.slow
def test_closest_bucket_cap_says_so(job):
    """Without the hook a non-exact plan gets its closest cap (largest group); a DDP built with another cap
    cannot be changed, and apply_plan says the plan was not applied."""
    res = job[0]["hand_cap"]
    assert res["mode"] == "closest_bucket_cap"
    assert res["description"].startswith("closest bucket cap 1 MB (1048576 bytes) (not exact: no single")
    assert not res["verify"][0]
    assert any("memory choices {'accum_steps': 2} are not applied" in w for w in res["warnings"])
    res = job[0]["fixture_prebuilt_25mb"]
    assert res["mode"] == "closest_bucket_cap" and res["description"].startswith("NOT applied: DDP was built")
    assert any("NOT applied" in w for w in res["warnings"])
    assert res["buckets"] == [READY[:4], READY[4:]]   # DDP default: 1 MiB first bucket
    plan = json.loads(Path(job["fixture_plan"]).read_text())["frameworks"]["pytorch_ddp"]["bucket_plan"]
    assert res["verify"][0] == ([sorted(b) for b in res["buckets"]] == [sorted(g) for g in plan])


# --------------------------------------------------------------------------- (c) bad plans

def _mlp():
    spec = importlib.util.spec_from_file_location("dpro_example_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MLP()


def test_bad_plans_raise_clear_errors(tmp_path):
    from dpro_kit.errors import DproError
    from dpro_torch.plan import apply_plan, ddp_kwargs, plan_groups
    net = _mlp()
    missing = tmp_path / "nope.json"
    with pytest.raises(DproError, match=r"nope\.json: plan file not found"):
        apply_plan(net, missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DproError, match=r"bad\.json: not JSON"):
        ddp_kwargs(bad)
    doc = make_plan(HAND_GROUPS)
    del doc["frameworks"]["pytorch_ddp"]["exact"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(DproError, match=r"bad\.json: not a valid dpro plan: plan\.frameworks\.pytorch_ddp: "
                                        r"missing 'exact'"):
        apply_plan(net, bad)
    doc = make_plan(HAND_GROUPS)
    doc["tensor_groups"][0]["partitions"] = "2"
    with pytest.raises(DproError, match=r"tensor_groups\[0\]\.partitions: expected integer"):
        apply_plan(net, doc)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(DproError, match="expected 'dpro-plan'"):
        apply_plan(net, bad)
    bad.write_text(json.dumps(make_plan([(["head.bias"], 1), (["body.9.weight", "decoder.bias"], 1)])))
    with pytest.raises(DproError, match=r"bad\.json: 2 parameter name\(s\) of the plan are not in the model: "
                                        r"'body\.9\.weight', 'decoder\.bias'.*another model"):
        apply_plan(net, bad)
    with pytest.raises(DproError, match=r"'head\.bias' is in two groups"):
        plan_groups(make_plan([(["head.bias"], 1), (["head.bias", "head.weight"], 1)]), net)
    doc = make_plan(HAND_GROUPS)
    doc["tensor_groups"][1]["partition_bytes"] = [1]
    with pytest.raises(DproError, match=r"partitions=3 but 1 partition_bytes"):
        plan_groups(doc, net)
    with pytest.raises(DproError, match="mode must be"):
        apply_plan(net, make_plan(HAND_GROUPS), mode="fast")
    half = _mlp()
    half.head.bias.data = half.head.bias.data.half()
    with pytest.raises(DproError, match=r"comm hook: group 'g0' mixes dtypes \(torch.float16, torch.float32\)"):
        apply_plan(half, make_plan(HAND_GROUPS), mode="hook")


def test_plan_resolution_without_a_process_group():
    """Groups, partitions in elements, unplanned parameters and DDP kwargs: no DDP needed."""
    from dpro_torch.plan import HOOK_BUCKET_CAP_MB, ddp_kwargs, plan_groups
    net = _mlp()
    groups, warns = plan_groups(make_plan(HAND_GROUPS), net)
    assert [list(g.params) for g in groups] == [g for g, _ in HAND_GROUPS] + [["body.0.weight"]]
    assert groups[1].partitions == (87382, 87381, 87381)
    assert not groups[-1].from_plan and any("body.0.weight" in w for w in warns)
    assert ddp_kwargs(make_plan(HAND_GROUPS)) == {"bucket_cap_mb": HOOK_BUCKET_CAP_MB}
    assert int(HOOK_BUCKET_CAP_MB * 2**20) == 1
    exact = make_plan([([p], 1) for p in READY], exact=True, cap_mb=3.8e-05)
    assert ddp_kwargs(exact) == {"bucket_cap_mb": 3.8e-05}
    assert ddp_kwargs(exact, mode="hook") == {"bucket_cap_mb": HOOK_BUCKET_CAP_MB}
    assert ddp_kwargs(make_plan(HAND_GROUPS, cap_mb=1.0), mode="cap") == {"bucket_cap_mb": 1.0}
    # names recorded through the DDP wrapper ("module." prefix) resolve too
    prefixed = make_plan([(["head.bias"], 1)])
    prefixed["tensor_groups"][0]["params"] = ["module.head.bias"]
    assert [g.params for g in plan_groups(prefixed, net)[0]][0] == ("head.bias",)


# --------------------------------------------------------------------------- (d) examples/ddp --plan

def _train(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, str(TRAIN), "--nproc", "2", "--model", "mlp", "--threads", "1", "--batch-size", "32",
                           "--seed", "0", *args], capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.mark.slow
def test_train_py_applies_the_fixture_plan(fixture_plan, tmp_path):
    """The plan `dpro optimize` made for the fixture, applied by examples/ddp/train.py with the fixture's args."""
    plan = json.loads(fixture_plan.read_text())
    assert sorted(p for g in plan["tensor_groups"] for p in g["params"]) == sorted(READY)
    out = tmp_path / "times.json"
    proc = _train("--plan", str(fixture_plan), "--warmup", "2", "--iters", "3", "--json-out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    (how,) = [ln for ln in lines if ln.startswith("plan: ")]
    assert "exact tensor groups" in how and "bucket_cap_mb" in how, how
    assert sum(ln.startswith("iter ") for ln in lines) == 3            # measured times still printed
    assert any(ln.startswith("median_iteration_ms=") for ln in lines)
    assert any(ln.startswith("plan check: ok") for ln in lines), proc.stdout
    doc = json.loads(out.read_text())
    assert doc["plan"]["mode"] == "bucket_cap" and len(doc["iteration_times_s"]["0"]) == 3


@pytest.mark.slow
def test_train_py_rejects_a_bad_plan_before_starting(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(make_plan([(["head.bias"], 1), (["decoder.weight"], 1)])))
    proc = _train("--plan", str(bad), "--iters", "1", timeout=60)
    assert proc.returncode != 0
    assert "plan.json: 1 parameter name(s) of the plan are not in the model: 'decoder.weight'" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- the job (run as a script)

def _worker(out_dir: Path, fixture_plan: Path) -> None:
    """One rank: default DDP vs planned DDP on the same batches, 3 iterations per set-up."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpro_torch.plan import apply_plan, ddp_buckets, ddp_kwargs

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hand = out_dir / "hand.json"
    setups = {  # name: (plan, how DDP is built)
        "hook": (hand, {}),
        "hook_coarse_view": (hand, {"prebuilt": {"bucket_cap_mb": 25, "gradient_as_bucket_view": True}}),
        "hook_static": (hand, {"static_graph": True}),
        "hook_unused": (hand, {"find_unused_parameters": True, "unused": True}),
        "hook_ignored": (hand, {"ignore": ["body.1.bias"]}),
        "fixture_auto": (fixture_plan, {}),
        "fixture_hook": (fixture_plan, {"mode": "hook"}),
        "hand_cap": (out_dir / "hand_mem.json", {"mode": "cap"}),
        "fixture_prebuilt_25mb": (fixture_plan, {"prebuilt": {}}),
        "list": (out_dir / "list.json", {}),
    }
    results: dict = {}
    torch.manual_seed(0)
    base = _mlp()
    for name, (plan, how) in setups.items():
        how = dict(how)
        src = copy.deepcopy(base)
        if how.pop("unused", False):        # a parameter the forward never uses (and the plan does not name)
            src.unused = torch.nn.Linear(4, 4)
        if "ignore" in how:                 # a parameter DDP is told not to reduce
            DDP._set_params_and_buffers_to_ignore_for_model(src, how.pop("ignore"))
        ref = DDP(copy.deepcopy(src), find_unused_parameters=how.get("find_unused_parameters", False))
        net = copy.deepcopy(src)
        local = copy.deepcopy(src)                                     # no DDP: this rank's own gradients
        with __import__("warnings").catch_warnings(record=True):
            if "prebuilt" in how:
                applied = apply_plan(DDP(net, **how["prebuilt"]), plan, record=True)
            else:
                applied = apply_plan(net, plan, record=True, mode=how.pop("mode", "auto"), **how)
        model = applied.model
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
        gen = torch.Generator().manual_seed(100 + rank)
        its = []
        for _ in range(3):
            x, y = torch.randn(8, 256, generator=gen), torch.randint(0, 10, (8,), generator=gen)
            local.load_state_dict(model.module.state_dict())
            for m, o in zip((ref, model), opts):
                o.zero_grad(set_to_none=True)
                F.cross_entropy(m(x), y).backward()
            F.cross_entropy(local(x), y).backward()
            g_ref = [p.grad for p in ref.parameters()]
            g_new = [p.grad for p in model.parameters()]
            pairs = [(a, b) for a, b in zip(g_ref, g_new) if a is not None or b is not None]
            ok = all(a is not None and b is not None and torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                     for a, b in pairs)
            diff = max(float((a - b).abs().max()) for a, b in pairs) if ok else float("inf")
            # the reduction did something: the average differs from this rank's own gradients
            own = max(float((p.grad - g).abs().max()) for p, g in zip(local.parameters(), g_new)
                      if p.grad is not None and g is not None)
            for o in opts:
                o.step()
            its.append({"grads_allclose": ok, "max_abs_diff": diff, "differs_from_local": own,
                        "grad_norm": float(sum(float(g.norm()) for g in g_new if g is not None)),
                        "params_allclose": all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                                               for a, b in zip(ref.parameters(), model.parameters()))})
        st = applied.hook_state
        results[name] = {"mode": applied.mode, "description": applied.description, "iterations": its,
                         "warnings": applied.warnings, "verify": list(applied.verify()),
                         "launches": st.launches if st else [], "collectives": st.collectives if st else 0,
                         "buckets": ddp_buckets(model), "ddp_kwargs": ddp_kwargs(plan)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
