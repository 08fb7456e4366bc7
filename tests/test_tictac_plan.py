"""TicTac's plan on real MXNet jobs: dpro optimize of a recorded MXNet PS trace -> plan["schedule"] ->
examples/mxnet/train.py --order PLAN[:NAME] -> the Gluon Trainer built from a list (docs/tictac.md §4).

The MXNet parts need an MXNet 1.9.1 Python (``DPRO_MXNET_PYTHON``, else ~/.cache/dpro-kit/mxnet-venv) and
are skipped without one; the plan -> order part runs everywhere (train.py imports MXNet only in its roles).
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.cli import main as dpro

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "examples/traces/mxnet-ps-2w1s-loopback"
NAMES = sorted(f"dense{i}_{k}" for i in range(6) for k in ("weight", "bias"))   # the fixture's MLP


def mxnet_python() -> str | None:
    cands = [os.environ.get("DPRO_MXNET_PYTHON", ""), str(Path.home() / ".cache/dpro-kit/mxnet-venv/bin/python")]
    return next((c for c in cands if c and Path(c).exists()), None)


def load_train():
    spec = importlib.util.spec_from_file_location("mxnet_train_example", REPO / "examples/mxnet/train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert dpro(["optimize", str(FIXTURE), "-o", str(out), "--budget", "5", "--max-steps", "3", "--quiet"]) in (0, None)
    return out


def test_optimize_of_an_mxnet_trace_writes_orders_of_its_parameters(plan):
    # before: dpro optimize refused every MXNet trace (the op-fusion timing read the server's meta.json
    # as a PyTorch one); the PS schedule names the Gluon parameters of the trace
    doc = json.loads(plan.read_text())
    sch = doc["schedule"]
    members = {g["name"]: g["tensors"] for g in doc["tensor_groups"]}      # the plan's DFG may fuse tensors
    assert sorted(n for g in members.values() for n in g) == NAMES
    assert sch["recommended"] in ("default", "tic", "tac")
    for o in ("tic", "tac", "random"):
        for entries in sch["orders"][o].values():
            assert sorted({e["tensor"] for e in entries}) == sorted(members)     # one entry per partition
            ranks = sorted(e["rank"] for e in entries)
            if o == "tic":       # TIC's priority numbers tie (the job then keeps the name order among them)
                assert ranks[0] == 0 and all(isinstance(r, int) for r in ranks)
            else:
                assert ranks == list(range(len(entries)))


def test_the_job_reads_the_plans_order(plan, tmp_path, capsys):
    train = load_train()
    sch = json.loads(plan.read_text())["schedule"]
    members = {g["name"]: g["tensors"] for g in json.loads(plan.read_text())["tensor_groups"]}
    for o in ("tic", "tac", "random"):
        first = sch["orders"][o][sorted(sch["orders"][o])[0]]
        want = list(dict.fromkeys(n for e in sorted(first, key=lambda e: e["rank"])
                                  for n in sorted(members[e["tensor"]])))     # a tensor at its first partition's rank
        assert train.transfer_order(f"{plan}:{o}", NAMES) == want
    rec = sch["recommended"]
    assert train.transfer_order(str(plan), NAMES) == (None if rec == "default" else train.transfer_order(
        f"{plan}:{rec}", NAMES))
    assert train.transfer_order(f"{plan}:default", NAMES) is None
    # a plain list; parameters it leaves out follow in name order
    lst = tmp_path / "order.json"
    lst.write_text(json.dumps(["dense5_weight", "dense0_weight"]))
    got = train.transfer_order(str(lst), NAMES)
    assert got[:2] == ["dense5_weight", "dense0_weight"] and sorted(got) == NAMES and got[2:] == sorted(got[2:])
    # bad input: one line naming the file, exit 2
    for spec, words in ((f"{plan}:fastest", "no order 'fastest'"), (str(tmp_path / "nope.json"), "cannot read"),
                        (str(lst), "does not have")):
        if "does not have" in words:
            lst.write_text(json.dumps(["conv9_weight"]))
        with pytest.raises(SystemExit) as e:
            train.transfer_order(spec, NAMES)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and spec.split(":")[0] in err


ISSUE_ORDER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
from mxnet import autograd, gluon
import train
issued = []
orig = mx.kv.KVStore.pushpull
def pushpull(self, key, value, out=None, priority=0):
    issued.append(key)
    return orig(self, key, value, out=out, priority=priority)
mx.kv.KVStore.pushpull = pushpull
ctx = [mx.cpu(0), mx.cpu(1)]            # two devices: Gluon uses a 'local' kvstore (one device: none)
net = train.build("mlp", 10, "reverse")
net.initialize(mx.init.Xavier(), ctx=ctx)
params = net.collect_params()
front = [f"l{l:02d}_{k}" for l in range(5, -1, -1) for k in ("weight", "bias")]
out = {}
for name, arg in (("dict", params), ("list", [params[n] for n in front])):
    tr = gluon.Trainer(arg, "sgd", {"learning_rate": 0.01}, kvstore="local", update_on_kvstore=True)
    for _ in range(2):
        issued.clear()
        with autograd.record():
            losses = [net(mx.nd.ones((4, 784), ctx=c)).sum() for c in ctx]
        autograd.backward(losses)
        tr.step(4)
    mx.nd.waitall()
    out[name] = [tr._params[k].name for k in issued]
# --enforce chain: the added engine ops leave every gradient as it was
with autograd.record():
    losses = [net(mx.nd.ones((4, 784), ctx=c)).sum() for c in ctx]
autograd.backward(losses)
before = {n: p.list_grad()[0].copy() for n, p in params.items()}
train.chain_pushes(mx, [params[n] for n in front])
out["chain_unchanged"] = all(bool((before[n] == p.list_grad()[0]).min().asscalar()) for n, p in params.items())
print(json.dumps(out))
"""


@pytest.mark.skipif(mxnet_python() is None, reason="no MXNet 1.9.1 Python (make mxnet, or set DPRO_MXNET_PYTHON)")
def test_a_trainer_built_from_a_list_issues_in_the_lists_order(tmp_path):
    # the real Gluon 1.9.1 Trainer: a ParameterDict is sorted by name (the reverse-named MLP: last layer first),
    # a list keeps its order; key i is the i-th parameter and pushpull is issued in key order
    script = tmp_path / "issue.py"
    script.write_text(ISSUE_ORDER)
    r = subprocess.run([mxnet_python(), str(script), str(REPO / "examples/mxnet")], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    names = sorted(f"l{l:02d}_{k}" for l in range(6) for k in ("weight", "bias"))
    assert got["dict"] == names and got["dict"][:2] == ["l00_bias", "l00_weight"]        # l00 = the output layer
    assert got["list"] == [f"l{l:02d}_{k}" for l in range(5, -1, -1) for k in ("weight", "bias")]
    assert got["chain_unchanged"] is True


@pytest.mark.skipif(mxnet_python() is None, reason="no MXNet 1.9.1 Python (make mxnet, or set DPRO_MXNET_PYTHON)")
def test_a_real_job_runs_with_the_plans_order(plan, tmp_path):
    # the recorded trace's plan applied to the same (stock-named) MLP in a real 2-worker / 1-server dist_sync job
    from dpro_kit.jobs import run_job
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "w{w}.json"
    r = run_job([mxnet_python(), str(REPO / "examples/mxnet/train.py"), "--workers", "2", "--steps", "4",
                 "--warmup", "1", "--batch", "16", "--order", f"{plan}:tac", "--json-out", str(out)],
                hosts=3, ranks_per_host=None, env={"DMLC_PS_ROOT_PORT": str(port), "PYTHONPATH": ""},
                timeout=180, prefix="zttest", log=open(tmp_path / "log.txt", "w"))
    assert r.ok, (tmp_path / "log.txt").read_text()[-2000:]
    docs = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in (0, 1)]
    want = load_train().transfer_order(f"{plan}:tac", NAMES)
    for d in docs:
        assert d["order"] == want and [p[0] for p in d["params"]] == want     # key i = the i-th of the order
        assert len(d["iteration_ms"]) == 2                                    # 4 steps, 1 warm-up: 2 gaps
    assert all(0 < d["loss"] < 10 for d in docs)          # each worker's own data (seeded by its index), trained
