"""DeFT's delayed-update comm hook (collectors/torch/dpro_torch/deft.py) on a real 2-rank gloo DDP job.

Loopback, no optimizer step (parameters constant, so every iteration's stock gradient is known):
with nothing deferred the hook gives DDP's gradients; with bucket 0 deferred (on a second gloo
process group) its parameters get the previous iteration's stock gradient and the others the
current one, from the iteration after DDP's bucket rebuild on.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

_WORKER = r"""
import sys, json, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[3])
from dpro_torch.deft import DeferredBuckets
rank, world, port, out = int(sys.argv[1]), 2, sys.argv[2], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
second = dist.new_group(backend="gloo")
res = {}
for mode in ("stock", "deft0", "deft1"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(33, 65), nn.ReLU(), nn.Linear(65, 40), nn.ReLU(), nn.Linear(40, 7))
    names = [n for n, _ in m.named_parameters()]
    ddp = DDP(m, bucket_cap_mb=0.005)
    st = None
    if mode != "stock":
        st = DeferredBuckets(defer=[0] if mode == "deft1" else [], delayed_group=second, record=True)
        ddp.register_comm_hook(None, st.hook)
    torch.manual_seed(100 + rank)
    grads = []
    for _ in range(5):
        ddp.zero_grad()
        ddp(torch.randn(8, 33)).pow(2).sum().backward()
        grads.append([p.grad.tolist() for p in m.parameters()])
    res[mode] = grads
    if st is not None:
        st.flush()
    if mode == "deft1":
        res["launches"] = st.launches
json.dump(res, open(out, "w"))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deferred_buckets_hook_real_ddp(tmp_path):
    port = str(_free_port())
    script = tmp_path / "w.py"
    script.write_text(_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(ROOT / "collectors" / "torch"),
                               str(tmp_path / f"r{r}.json")], env=env) for r in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    for r in range(2):
        res = json.loads((tmp_path / f"r{r}.json").read_text())
        stock, d0, d1 = res["stock"], res["deft0"], res["deft1"]
        # nothing deferred: DDP's gradients, every iteration
        for it in range(5):
            for a, b in zip(stock[it], d0[it]):
                assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
        # bucket 0 deferred: from iteration 2 on (DDP rebuilds its buckets in iteration 1), every
        # parameter's gradient is either this iteration's stock one or the previous iteration's; at
        # least one parameter (bucket 0's) is the previous one, at least one the current one
        late = now = 0
        for it in range(2, 5):
            for p, (a, prev, b) in enumerate(zip(stock[it], stock[it - 1], d1[it])):
                ta, tp, tb = torch.tensor(a), torch.tensor(prev), torch.tensor(b)
                if torch.allclose(tb, ta, rtol=1e-5, atol=1e-6):
                    now += 1
                else:
                    assert torch.allclose(tb, tp, rtol=1e-5, atol=1e-6), (r, it, p)
                    late += 1
        assert late > 0 and now > 0 and late % 3 == 0
        assert any(d for _, i, d in res["launches"]) and any(not d for _, i, d in res["launches"])


def test_train_loss_log_same_seed_same_data(tmp_path):
    """examples/ddp/train.py --data teacher --loss-log: stock DDP, --deft-link1 1,2 (no delay, two groups) and
    --deft-defer all with one seed see the same
    data (identical loss in iterations 0 and 1: same weights, the deferred update gives zeros in iteration 0), and
    the teacher's labels are learnable (the loss falls)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "collectors" / "torch"), os.environ.get("PYTHONPATH", "")]))
    curves = {}
    env["DPRO_LINK1_IFNAME"] = "lo"   # the "second link" of a loopback job: a second gloo group on lo
    for name, extra in (("sync", []), ("deft", ["--deft-defer", "all"]), ("sync2", ["--deft-link1", "1,2"])):
        log = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, str(ROOT / "examples" / "ddp" / "train.py"), "--nproc", "2", "--model", "mlp",
                        "--batch-size", "32", "--bucket-mb", "1", "--data", "teacher", "--lr", "0.1", "--iters", "40", "--warmup", "0",
                        "--quiet", "--loss-log", str(log), *extra], env=env, check=True, timeout=300,
                       capture_output=True)
        doc = json.loads(log.read_text())
        assert doc["deft_defer"] == ("all" if name == "deft" else "") and len(doc["loss_per_rank"]) == 2
        assert doc["deft_link1"] == ("1,2" if name == "sync2" else "")
        curves[name] = doc["loss_mean"]
    s, d = curves["sync"], curves["deft"]
    assert len(s) == len(d) == 40
    assert s[0] == d[0]                      # same weights, same data
    assert s[1] != d[1]                      # stock DDP applied iteration 0's gradient, the deferred job zeros
    for c in (s, d):
        assert sum(c[-10:]) < sum(c[:10]) - 0.03 * 10
    # buckets 1 and 2 synchronised now on the second group: stock DDP's gradients, the same training
    assert curves["sync2"] == pytest.approx(s, rel=1e-6, abs=1e-6)


def test_train_applies_the_plans_deft_section(tmp_path):
    """`dpro optimize --deft --links` on the recorded mlp job, then train.py --plan P --plan-mode deft
    (dpro_torch.plan.apply_plan(mode="deft")): DDP gets the traced bucket cap, the plan's buckets are
    deferred and put on the second link, the check finds DDP's buckets the traced ones, and the loss curve
    is the one of the same delays given by hand (--deft-defer / --deft-link1, the plan's `run`).
    A plan without the section, or with link-1 buckets and no second interface: one line, exit 2."""
    from click.testing import CliRunner

    from dpro_kit.cli.optimize import optimize as cmd
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cmd, [str(ROOT / "examples" / "traces" / "ddp-2rank-gloo"), "--deft", "--links", "500,500",
                                 "--budget", "5", "-o", str(plan), "-q"])
    assert r.exit_code == 0, r.output
    assert "--plan-mode deft" in r.output
    doc = json.loads(plan.read_text())
    run = doc["deft"]["run"]
    assert "--deft-link1" in run   # the second link is used: the test covers link_group too
    env = dict(os.environ, OMP_NUM_THREADS="1", DPRO_LINK1_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([str(ROOT / "collectors" / "torch"), os.environ.get("PYTHONPATH", "")]))
    base = [sys.executable, str(ROOT / "examples" / "ddp" / "train.py"), "--nproc", "2", "--model", "mlp",
            "--batch-size", "32", "--data", "teacher", "--lr", "0.1", "--iters", "12", "--warmup", "0"]
    curves = {}
    for name, extra in (("plan", ["--plan", str(plan), "--plan-mode", "deft"]),
                        ("hand", ["--bucket-mb", "0.5", *run])):
        log = tmp_path / f"loss-{name}.json"
        p = subprocess.run([*base, "--loss-log", str(log), *extra], env=env, timeout=300, capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        if name == "plan":
            assert "plan: DeFT: bucket(s) " in p.stdout and "on the second link (lo)" in p.stdout
            assert "plan check: ok (DDP's 3 buckets are the traced ones; bucket(s) " in p.stdout
            assert "not checked against the loss" in p.stderr   # the solver's delays: the Preserver did not run
        curves[name] = json.loads(log.read_text())["loss_mean"]
    assert curves["plan"] == curves["hand"] and len(curves["plan"]) == 12
    # bad inputs, refused before any rank starts
    nodeft = tmp_path / "nodeft.json"
    nodeft.write_text(json.dumps({k: v for k, v in doc.items() if k != "deft"}))
    p = subprocess.run([*base, "--plan", str(nodeft), "--plan-mode", "deft"], env=env, timeout=120,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "has no 'deft' section" in p.stderr and str(nodeft) in p.stderr
    p = subprocess.run([*base, "--plan", str(plan), "--plan-mode", "deft"], timeout=120, capture_output=True, text=True,
                       env={k: v for k, v in env.items() if k != "DPRO_LINK1_IFNAME"})
    assert p.returncode == 2 and "DPRO_LINK1_IFNAME is not set" in p.stderr and p.stderr.count("\n") == 1


def test_deft_settings_refuses_a_damaged_section(tmp_path, monkeypatch):
    """dpro_torch.plan.deft_settings: the section as apply_plan(mode="deft") applies it, and one line naming
    the file and the field for each kind of damage (checked before any rank starts)."""
    sys.path.insert(0, str(ROOT / "collectors" / "torch"))
    from dpro_collect.errors import DproError
    from dpro_torch.plan import deft_settings
    from click.testing import CliRunner

    from dpro_kit.cli.optimize import optimize as cmd
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cmd, [str(ROOT / "examples" / "traces" / "ddp-2rank-gloo"), "--deft", "--budget", "5",
                                 "-o", str(plan), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    monkeypatch.delenv("DPRO_LINK1_IFNAME", raising=False)
    st = deft_settings(plan)   # one link: no second interface needed
    assert st["defer"] == sorted(int(k.removeprefix("bucket")) for k, v in doc["deft"]["delays"].items() if v)
    assert st["link1"] == [] and st["bucket_cap_mb"] == 0.5 and st["measured"] is False
    assert st["bucket_bytes"] == {0: 1071144, 1: 1050624, 2: 526336}
    for damage, msg in ((lambda d: d["deft"]["delays"].update(bucket0=2), "must be 0 or 1"),
                        (lambda d: d["deft"]["delays"].update(weights=1), "'weights' is not a bucket name"),
                        (lambda d: d["deft"].__setitem__("delays", [1, 0]), "plan.deft.delays: expected object"),
                        (lambda d: d["deft"]["ddp"].update(bucket_cap_mb=-1), "must be a positive number or null"),
                        (lambda d: d["deft"]["links"].update(bucket1=1), "DPRO_LINK1_IFNAME is not set")):
        bad = json.loads(json.dumps(doc))
        damage(bad)
        f = tmp_path / "bad.json"
        f.write_text(json.dumps(bad))
        with pytest.raises(DproError) as e:
            deft_settings(f)
        assert msg in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)
