"""plan.json schema and `dpro optimize` on the real example trace."""
import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpro_kit.cli.optimize import optimize
from dpro_kit.errors import DproError
from dpro_kit.optimize import Searcher, extract_base
from dpro_kit.optimize.examples import tiny_dfg
from dpro_kit.optimize.plan import PLAN_SCHEMA, make_plan, validate_plan

TRACE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"


def _plan():
    base = extract_base(tiny_dfg(latency_us=500.0, bandwidth_Bps=1e12),
                        params={"g1": ["layer1.weight"], "g0": ["layer0.weight"]})
    return make_plan(base, Searcher(base).run())


def test_plan_schema_valid_and_invalid():
    p = _plan()
    validate_plan(p)
    assert p["tensor_groups"][0]["params"] == ["layer1.weight", "layer0.weight"]
    assert p["frameworks"]["horovod"]["HOROVOD_FUSION_THRESHOLD"] == 2_000_000
    assert p["predicted"]["speedup"] == pytest.approx(2157 / 1197)
    for bad in (lambda d: d.pop("predicted"), lambda d: d["predicted"].update(after_ms="x"),
                lambda d: d["tensor_groups"][0].update(partitions=1.5),
                lambda d: d["frameworks"]["pytorch_ddp"].pop("bucket_cap_mb"),
                lambda d: d.update(format="other")):
        q = copy.deepcopy(p)
        bad(q)
        with pytest.raises(DproError):
            validate_plan(q)
    json.dumps(PLAN_SCHEMA)


@pytest.mark.skipif(not TRACE.exists(), reason="example trace missing")
def test_cli_on_example_trace(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(out), "--budget", "20", "--json", "--no-align"])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())
    validate_plan(p)
    assert p["predicted"]["after_ms"] <= p["predicted"]["before_ms"]
    params = [x for g in p["tensor_groups"] for x in g["params"]]
    assert all(not n.startswith("torch.distributed") for r in p["frameworks"]["torch_compile"]["regions"] for n in r)
    assert "head.weight" in params and len(params) == 8
    slow = tmp_path / "slow.json"
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(slow), "--bandwidth-mbps", "200", "-q", "--no-align"])
    assert r.exit_code == 0, r.output
    ps = json.loads(slow.read_text())
    assert ps["whatif"] == {"bandwidth_mbps": 200.0}
    assert ps["predicted"]["before_ms"] > p["predicted"]["before_ms"]


@pytest.mark.skipif(not TRACE.exists(), reason="example trace missing")
def test_cli_user_pass_checkpoint_resume_memory(tmp_path):
    ck = tmp_path / "ck.json"
    args = [str(TRACE), "-o", str(tmp_path / "p.json"), "-q", "--no-align", "--checkpoint", str(ck),
            "--pass", "tests.test_optimize_passes:HalfLatency"]
    r = CliRunner().invoke(optimize, args)
    assert r.exit_code == 0, r.output
    assert json.loads(ck.read_text())["format"] == "dpro-optimize-checkpoint"
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(tmp_path / "p2.json"), "-q", "--no-align",
                                      "--resume", str(ck)])
    assert r.exit_code == 0, r.output
    # 2.53 MiB of gradients: params + grads + 1 optimizer slot ~ 7.9 MB, + 40 MB activations > 30 MB budget
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(tmp_path / "m.json"), "-q", "--no-align",
                                      "--memory-budget", "30MB", "--activation-bytes", "40MB"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["memory"]["choices"] and m["memory"]["estimate_after"]["peak_bytes"] <= 30_000_000
    assert any(s["applied_as"] == "memory" for s in m["strategies"])


@pytest.mark.skipif(not TRACE.exists(), reason="example trace missing")
def test_min_gain_keeps_the_traced_configuration(tmp_path):
    """A predicted gain below --min-gain is not worth a change (real collectives cost more than the model says):
    the plan keeps the traced DDP settings, and applying it leaves DDP as traced."""
    keep, change = tmp_path / "keep.json", tmp_path / "change.json"
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(keep), "-q", "--no-align", "--min-gain", "50"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(optimize, [str(TRACE), "-o", str(change), "-q", "--no-align", "--min-gain", "0"])
    assert r.exit_code == 0, r.output
    pk, pc = json.loads(keep.read_text()), json.loads(change.read_text())
    validate_plan(pk)
    assert pc["predicted"]["after_ms"] < pc["predicted"]["before_ms"]          # something was found ...
    assert [s["pass"] for s in pk["strategies"]] == ["keep"]                    # ... but it is below 50 %
    assert "less than --min-gain 50 %" in pk["strategies"][0]["reason"]
    assert pk["predicted"]["after_ms"] == pytest.approx(pk["predicted"]["before_ms"])
    ddp = pk["frameworks"]["pytorch_ddp"]
    assert ddp["keep_traced"] and ddp["exact"] and not pk["op_fusion_groups"]
    traced = json.loads((TRACE / "manifest.json").read_text())["extra"]["ddp"]["bucket_cap_bytes"]
    assert ddp["bucket_cap_bytes"] == traced
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors" / "torch"))
    pytest.importorskip("torch")
    from dpro_torch.plan import ddp_kwargs
    assert ddp_kwargs(str(keep)) == {"bucket_cap_mb": traced / 2**20}
