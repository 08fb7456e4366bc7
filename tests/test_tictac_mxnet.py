"""TicTac on a real MXNet PS job (bench/tictac_ab.py, bench/tictac_mxnet_train.py).

The DFG / order tests use a time oracle recorded by ``bench/tictac_mxnet_train.py
--time-layers`` (MXNet 1.9.1, batch 1024, 512 features, the 12-layer MLP, one process in a
0.6-CPU cgroup on this project's 2-core machine; copied from the bench's work folder).  The
job test runs a real 2-worker / 1-server ``dist_sync`` job on loopback with a transfer order
and needs an MXNet 1.9.1 Python: ``DPRO_MXNET_PYTHON``, else the first of the venvs below
that exists; skipped otherwise.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import tictac_ab  # noqa: E402

LAYERS = {
    "fw_ms": [6.1487, 12.7353, 13.4559, 8.2171, 4.5752, 0.8564, 0.9939, 0.9487, 0.5339, 0.486, 0.2146, 0.095],
    "bw_ms": [11.352, 24.4143, 25.408, 13.2042, 5.319, 3.7599, 1.4201, 1.5117, 0.8051, 0.841, 0.3103, 0.1114],
    "params": ["dense0_bias", "dense0_weight", "dense10_bias", "dense10_weight", "dense11_bias", "dense11_weight",
               "dense1_bias", "dense1_weight", "dense2_bias", "dense2_weight", "dense3_bias", "dense3_weight",
               "dense4_bias", "dense4_weight", "dense5_bias", "dense5_weight", "dense6_bias", "dense6_weight",
               "dense7_bias", "dense7_weight", "dense8_bias", "dense8_weight", "dense9_bias", "dense9_weight"],
    "bytes": [2048, 1048576, 256, 32768, 40, 2560, 4096, 2097152, 2048, 2097152, 2048, 1048576, 1024, 524288, 1024,
              262144, 1024, 262144, 1024, 262144, 512, 131072, 512, 65536],
    "layer_of": [0, 0, 10, 10, 11, 11, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9],
    "update_ms_per_mb": 0.9937,
}


def mxnet_python() -> str | None:
    cands = [os.environ.get("DPRO_MXNET_PYTHON", ""), str(Path.home() / ".cache/dpro-kit/mxnet-venv/bin/python"),
             str(REPO / ".venv-mxnet/bin/python")]
    return next((c for c in cands if c and Path(c).exists()), None)


def test_orders_follow_the_forward_pass_not_gluons_sorted_names():
    # Gluon 1.9.1's Trainer sorts parameters by name, so its keys (and priority=-i) put dense10/dense11 third;
    # in the DFG the next forward of layer l waits for layer l's pull: TIC and TAC send layer 0, 1, 2, ... first
    g = tictac_ab.build_mxnet_dfg(LAYERS, workers=2, rate_mbit=1000, latency_us=100)
    orders = tictac_ab.mxnet_orders(g, seed=0)
    by_layer = sorted(range(24), key=lambda i: (LAYERS["layer_of"][i], i))
    assert orders["tac"] == by_layer
    assert orders["tic"] == by_layer
    assert orders["index"] == list(range(24)) != by_layer
    assert sorted(orders["random"]) == list(range(24))


def test_mxnet_dfg_structure_and_gating():
    g = tictac_ab.build_mxnet_dfg(LAYERS, workers=2, rate_mbit=1000, latency_us=100, gated="pushpull")
    sends = [d for _, d in g.nodes(data=True) if d["kind"] == "SEND"]
    assert len(sends) == 24 * 2 * 2                         # 24 parameters x 2 workers x (push + pull)
    assert {d["device"] for d in sends} == {"link:host0:download", "link:host0:upload"}
    # dense1_weight (2 MiB) at 1000 Mbit/s x 95.6 %: 100 us + 2097152 B / 119.5 MB/s
    d = next(d for d in sends if d["tensor"] == "p7")
    assert d["dur"] == pytest.approx(100 + 1e6 * 2097152 / (1000e6 / 8 * 0.956))     # 17649 us
    # gated: every push waits for the last backward op (layer 0's)
    assert all(g.has_edge(f"w{w}|BW L0", f"w{w}|In p{i}") for w in (0, 1) for i in range(24))
    # the next forward of layer l waits for the pulls of layer l's parameters
    assert ("w0|Out p7", "w0|FW L1") in g.graph["iteration_edges"]
    # gated by pulls: every pull to w0 after every aggregation (the worker's waitall), pushes not gated
    h = tictac_ab.build_mxnet_dfg(LAYERS, workers=2, rate_mbit=1000, latency_us=100, gated="pull")
    pulls = [k for k, d in h.nodes(data=True) if d["kind"] == "SEND" and d["phase"] == "pull" and d["peer"] == "w0"]
    assert len(pulls) == 24 and all(h.has_edge("w0|pushes acknowledged", k) for k in pulls)
    assert h.in_degree("w0|pushes acknowledged") == 24 and not h.has_edge("w0|BW L0", "w0|In p7")


@pytest.mark.skipif(mxnet_python() is None, reason="no MXNet 1.9.1 Python (set DPRO_MXNET_PYTHON)")
def test_real_job_with_a_transfer_order(tmp_path):
    from dpro_kit.jobs import run_job
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    order = tmp_path / "order.json"
    order.write_text(json.dumps(list(range(7, -1, -1))))     # 4 Dense layers = 8 parameters, reversed
    out = tmp_path / "w{w}.json"
    r = run_job([mxnet_python(), str(REPO / "bench/tictac_mxnet_train.py"), "--workers", "2", "--iters", "3",
                 "--warmup", "1", "--batch", "16", "--features", "32", "--widths", "32,32,32,4",
                 "--order-file", str(order), "--json-out", str(out)],
                hosts=3, ranks_per_host=None, env={"DMLC_PS_ROOT_PORT": str(port), "PYTHONPATH": ""},
                timeout=180, prefix="tictactest", log=open(tmp_path / "log.txt", "w"))
    assert r.ok, (tmp_path / "log.txt").read_text()[-2000:]
    docs = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in (0, 1)]
    for d in docs:
        assert len(d["iteration_ms"]) == 3 and all(t > 0 for t in d["iteration_ms"])
        assert d["order"] == list(range(7, -1, -1))
    # synchronous training: both workers end with the same weights, so the same loss
    assert docs[0]["loss"] == pytest.approx(docs[1]["loss"])
