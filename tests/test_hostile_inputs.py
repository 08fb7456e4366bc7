"""Regression tests for the damaged inputs bench/fuzz.py found (issue 19, docs/reliability.md).

Each test damages a copy of a real recorded trace folder the way one fuzz case did and runs
``dpro replay --json`` through the real command line: the trace must be refused with one line
naming the file and the record (exit 2), or replay with a warning naming the repair.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from dpro_kit.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "examples" / "traces"


def _copy(tmp_path: Path, name: str) -> Path:
    src = TRACES / name if (TRACES / name).is_dir() else REPO / "tests" / "fixtures" / name
    return Path(shutil.copytree(src, tmp_path / name))


def _edit(path: Path, fn) -> None:
    raw = path.read_bytes()
    gz = path.suffix == ".gz"
    if path.suffix == ".jsonl":   # the NCCL plugin's files: one document a line, edited as a list
        doc = [json.loads(line) for line in raw.splitlines() if line.strip()]
        fn(doc)
        path.write_text("".join(json.dumps(d) + "\n" for d in doc))
        return
    doc = json.loads(gzip.decompress(raw) if gz else raw)
    fn(doc)
    out = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(out) if gz else out)


def _replay(trace: Path, capsys, monkeypatch, tmp_path) -> tuple[int, str, str]:
    monkeypatch.setenv("DPRO_CACHE", str(tmp_path / "cache"))
    rc = main(["replay", str(trace), "--json"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _first_x(doc, **where):
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and all(e.get(k) == v for k, v in where.items()))


def _swap_step_times_16958(doc):
    """Fuzz case 16958: steps 13 and 32 of rank 1 swap ``dur_us`` (9257.167 and 7189.032 us); the median of
    the profiled steps moved and with it the profiler-cost correction: +5.9 % without a word."""
    a, b = doc["steps"][13], doc["steps"][32]
    assert a["dur_us"] == 9257.167
    a["dur_us"], b["dur_us"] = b["dur_us"], a["dur_us"]


def _mx_swap_2653(doc):
    """Fuzz case 2653: a push-pull's begin (B) and a DeleteVariable's async end (e) swap ``ts``; every
    begin still precedes its end, and before the twin check this replayed +60.7 % without a word."""
    ev = doc["traceEvents"]
    i = next(i for i, e in enumerate(ev) if e.get("ph") == "B" and e["ts"] == 1795553606964309)
    j = next(j for j, e in enumerate(ev) if e.get("ph") == "e" and e["ts"] == 1795553606950649)
    ev[i]["ts"], ev[j]["ts"] = ev[j]["ts"], ev[i]["ts"]


def _mx_overlap_without_twins(doc):
    """No operator-domain twins (a dump that has none is not twin-checked) and the compute thread's
    third operator begun 1 ms earlier, inside the ones before it: the thread check refuses it."""
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") not in ("b", "e")]
    # (DeleteVariable is dropped and not checked: a CNN runs it inside a bulk segment)
    begins = [e for e in doc["traceEvents"] if e.get("ph") == "B" and e.get("pid") == 0 and e.get("name") != "DeleteVariable"]
    begins[2]["ts"] -= 1000


def _mx_drop_twin_end(doc):
    ev = doc["traceEvents"]
    del ev[next(i for i, e in enumerate(ev) if e.get("ph") == "e" and e.get("name") == "log_softmax")]


NCCL_RING, NCCL_R0 = "nccl-h100-ring-4rank", "nccl-c316d26534568395-r0.503.jsonl"

CASES = {
    # (seed, file, edit, words the one-line refusal must contain)
    "base time NaN": ("ddp-2rank-gloo", "host0/0/kineto_trace.json",
                      lambda d: d.update(baseTimeNanoseconds=float("nan")), ["[baseTimeNanoseconds]", "integer"]),
    "base time string": ("ddp-2rank-gloo", "host0/0/kineto_trace.json",
                         lambda d: d.update(baseTimeNanoseconds="A" * 5000), ["[baseTimeNanoseconds]"]),
    "ts NaN": ("ddp-2rank-gloo", "host0/1/kineto_trace.json",
               lambda d: _first_x(d, cat="cpu_op").update(ts=float("nan")), ["not a finite time"]),
    "ts -inf": ("ddp-2host-1000mbit", "host1/1/kineto_trace.json.gz",
                lambda d: _first_x(d, cat="cpu_op").update(ts=float("-inf")), ["not a finite time"]),
    "ts 31 years later": ("ddp-2rank-gloo", "host0/0/kineto_trace.json",
                          lambda d: _first_x(d, name="gloo:all_reduce").update(ts=_first_x(d)["ts"] + 1e15),
                          ["days from the file's other events"]),
    "profiled step not an int": ("ddp-2rank-gloo", "host0/0/meta.json",
                                 lambda d: d["window"]["profiled_steps"].__setitem__(0, "x" * 10**6),
                                 ["[window.profiled_steps[0]]"]),
    "step time NaN": ("ddp-2rank-gloo", "host0/1/meta.json",
                      lambda d: d["steps"][3].update(dur_us=float("nan")), ["[steps[3].dur_us]", "finite"]),
    "rank overflows int64": ("ddp-2rank-gloo", "host0/1/meta.json", lambda d: d.update(rank=2**64 + 1),
                             ["[rank]", "out of range"]),
    "mxnet negative ts": ("mxnet-ps-2w1s-loopback", "host2/worker0/profile.json",
                          lambda d: next(e for e in d["traceEvents"] if e.get("ph") == "B").update(ts=-5.0),
                          ["not a time in us since the epoch"]),
    "mxnet end before begin": ("mxnet-ps-2w1s-loopback", "host1/worker1/profile.json",
                               lambda d: next(e for e in d["traceEvents"] if e.get("ph") == "E"
                                              and e.get("cat") == "operator").update(ts=1.0),
                               ["ends", "before it begins"]),
    "pslite negative realtime": ("pslite-2w1s-200mbit", "pslite-worker-11.5159.json",
                                 lambda d: d["clock_start"].update(realtime_ns=-10**6), ["[clock_start.realtime_ns]"]),
    "pslite infinite node id": ("pslite-2w1s-200mbit", "pslite-server-8.5158.json",
                                lambda d: d.update(node_id=float("inf")), ["[node_id]"]),
    "byteps worker missing": ("byteps-2w1s", None, None, ["[workers]", "1 folder(s)"]),
    # long run, cases 1000-1999 (2026-11-27)
    "mxnet steps not ints (case 1433)": ("mxnet-ps-2w1s-loopback", "host1/worker1/meta.json",
                                         lambda d: d["steps"].__setitem__(0, "x"), ["[steps]", "integers"]),
    "byteps total moved 1000 s earlier (case 1690)": (
        "byteps-2w1s", "worker1/0/comm.json",
        lambda d: next(e for e in d["traceEvents"] if e.get("tid") == "total").update(
            ts=next(e for e in d["traceEvents"] if e.get("tid") == "total")["ts"] - 10**9),
        ["[tid total,", "does not contain its stages"]),
    # cases 2000-2999
    "kineto tid a list (case 2053)": ("ddp-2rank-gloo", "host0/0/kineto_trace.json",
                                      lambda d: _first_x(d, cat="cpu_op").update(tid=[1, "a", None]),
                                      ["pid, tid and args.stream"]),
    "mxnet params entry a string (case 2139)": ("mxnet-ps-2w1s-loopback", "host2/worker0/meta.json",
                                                lambda d: d["params"].__setitem__(1, ""), ["[params[1]]"]),
    "ring_file a 1 MB name (case 2462)": ("ddp-2host-1000mbit", "host1/1/meta.json",
                                          lambda d: d.update(ring_file="A" * 10**6), ["[ring_file]"]),
    "byteps no total events (case 2852)": ("byteps-2w1s", "worker1/0/comm.json",
                                           lambda d: d.update(traceEvents=[e for e in d["traceEvents"]
                                                                           if e.get("tid") != "total"]),
                                           ["no 'total' event"]),
    "byteps tensor of 1e29 bytes (case 2901)": ("byteps-2w1s", "byteps_meta.json",
                                                lambda d: d["tensors"].update({"byteps.gradient_2": 10**29}),
                                                ["[tensors]"]),
    # cases 3000-4999
    "mxnet kvstore a string (case 3616)": ("mxnet-ps-2w1s-loopback", "host1/worker1/meta.json",
                                           lambda d: d.update(kvstore="A" * 1000), ["[kvstore]"]),
    "mxnet role True (case 3552: replayed -5.7 % as a missing worker)": (
        "mxnet-ps-2w1s-loopback", "host2/worker0/meta.json", lambda d: d.update(role=True), ["[role]"]),
    "byteps dur NaN (case 4461: replayed +1.2 %)": (
        "byteps-2w1s", "worker0/0/comm.json",
        lambda d: next(e for e in d["traceEvents"] if e.get("tid") == "total").update(dur=float("nan")),
        ["dur nan"]),
    "byteps partition tid -inf (case 32438: OverflowError traceback)": (
        "byteps-2w1s", "worker1/0/comm.json",
        lambda d: next(e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("tid") != "total").update(
            tid=float("-inf")), ["partition event with tid -inf", "integer >= 0"]),
    "pslite worker record deleted (case 34300: +9.46 % silently)": (
        "pslite-2w1s-200mbit", "pslite-worker-11.5159.json", lambda d: d["records"].pop(211),
        ["pslite-worker-11.5159.json", "received a request", "a record is missing"]),
    "kineto fwdbwd flow ts NaN (case 40704: -2.82 % silently)": (
        "ddp-2rank-gloo", "host0/1/kineto_trace.json",
        lambda d: next(e for e in d["traceEvents"] if e.get("ph") == "s" and e.get("cat") == "fwdbwd").update(
            ts=float("nan")), ["flow event ts nan", "[traceEvents["]),
    "byteps partition tid 1.5": (
        "byteps-2w1s", "worker1/0/comm.json",
        lambda d: next(e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("tid") != "total").update(
            tid=1.5), ["partition event with tid 1.5"]),
    "mxnet two ts swapped (case 2653: +60.7 % silently)": ("mxnet-ps-2w1s-loopback", "host2/worker0/profile.json",
                                                           _mx_swap_2653, ["[traceEvents[", "operator-domain twin"]),
    "mxnet compute ops overlap, no twins": ("mxnet-ps-2w1s-loopback", "host1/worker1/profile.json",
                                            _mx_overlap_without_twins, ["one thread runs one operator at a time"]),
    "mxnet twin lost": ("mxnet-ps-2w1s-loopback", "host1/worker1/profile.json", _mx_drop_twin_end,
                        ["'log_softmax'", "operator-domain twins"]),
    # the NCCL plugin's .jsonl files, mutated since 9def6d7 (lines: 1 header, 2 a coll, 3 its op, 7 a step of it)
    "nccl op parent a list": (NCCL_RING, NCCL_R0, lambda d: d[2].update(parent=[0]), ["[line 3]", "'parent'"]),
    "nccl event kind a list": (NCCL_RING, NCCL_R0, lambda d: d[6].update(ev=[]),
                                            ["[line 7]", "unknown event kind"]),
    "nccl step before its op": (NCCL_RING, NCCL_R0, lambda d: d[6].update(t0=d[2]["t0"] - 1000),
                                ["[line 7]", "outside its op"]),
    "nccl states out of order": (NCCL_RING, NCCL_R0, lambda d: d[6]["states"].reverse(),
                                 ["[line 7]", "state times are not in order"]),
    "nccl op before its collective": (NCCL_RING, NCCL_R0, lambda d: d[2].update(t0=d[1]["t0"] - 1000),
                                      ["[line 3]", "before its collective"]),
    "kineto cat a list (case 5592)": ("ddp-2rank-gloo", "host0/1/kineto_trace.json",
                                      lambda d: _first_x(d, cat="cpu_op").update(cat=[]), ["cat must be a string"]),
    "nccl event kind an object (case 5439)": (NCCL_RING, NCCL_R0, lambda d: d[6].update(ev={}),
                                              ["[line 7]", "unknown event kind"]),
    "trace_file a 1 MB name (case 6615)": ("ddp-2rank-gloo", "host0/1/meta.json",
                                           lambda d: d.update(trace_file="A" * 10**6),
                                           ["[trace_file]", "must name a file in the node's folder"]),
    "trace_file a path out of the folder": ("ddp-2rank-gloo", "host0/1/meta.json",
                                            lambda d: d.update(trace_file="../1/kineto_trace.json"), ["[trace_file]"]),
    "one rank's ddp emptied (case 6838: +6.0 % silently)": ("ddp-2rank-gloo", "host0/1/meta.json",
                                                           lambda d: d["ddp"].clear(),
                                                           ["host0/1/meta.json [ddp]", "no DDP bucket"]),
    "step time 31 years (case 8236: -2.95 % silently)": ("ddp-2host-1000mbit", "host1/1/meta.json",
                                                          lambda d: d["steps"][3].update(dur_us=d["steps"][3]["dur_us"]
                                                                                         + 10**15),
                                                          ["[steps[3].dur_us]", "longer than a day"]),
    "marker name a 1 MB string (case 8482: +2.7 % silently)": ("ddp-2rank-gloo", "host0/1/meta.json",
                                                                lambda d: d["markers"].update(clock_sync="A" * 10**6),
                                                                ["[markers.clock_sync]", "marker name"]),
    "MXNet meta 'ps' a string (case 10348)": ("mxnet-ps-2w1s-loopback", "host2/worker0/meta.json",
                                              lambda d: d.update(ps="A" * 1000), ["[ps]", "'ps' must be an object"]),
    "ps-lite worker node_id edited (case 10945)": ("pslite-2w1s-200mbit", "pslite-worker-9.5160.json",
                                                   lambda d: d.update(node_id=0),
                                                   ["pslite-worker-9.5160.json", "sent by node id 9 in the file of "
                                                    "node id 0"]),
    "BytePS start_step 10^29 (case 11390)": ("byteps-2w1s", "byteps_meta.json", lambda d: d.update(start_step=10**29),
                                             ["[start_step]", "plausible size"]),
    "median_unprofiled_us -2^63 (case 12342: -2.0 % silently)": ("ddp-2rank-gloo", "host0/0/meta.json",
                                                                  lambda d: d["measured"].update(
                                                                      median_unprofiled_us=-2 ** 63),
                                                                  ["[measured.median_unprofiled_us]", "negative"]),
    "ps-lite server node_id edited (case 13100: replayed as 0 ms)": ("pslite-2w1s-200mbit", "pslite-server-8.5158.json",
                                                                     lambda d: d.update(node_id=0),
                                                                     ["pslite-server-8.5158.json", "of node id 8 in "
                                                                      "the file of node id 0"]),
    "ps-lite host a 1 MB string (cases 14774, 16953: 117 s and 4.3 GB)": (
        "pslite-2w1s-200mbit", "pslite-worker-11.5159.json", lambda d: d.update(host="h" * 10**6),
        ["pslite-worker-11.5159.json [host]", "at most 255 characters", "1,000,000 characters"]),
    "nccl host a 1 MB string (110 s and 11 GB before)": (NCCL_RING, NCCL_R0, lambda d: d[0].update(host="h" * 10**6),
                                                        ["[line 1.host]", "at most 255 characters"]),
    "manifest host a 1 MB string": ("ddp-2rank-gloo", "manifest.json",
                                    lambda d: d["nodes"]["host0/1"].update(host="h" * 10**6),
                                    ["[nodes.host0/1.host]", "at most 255 characters"]),
    "meta.json host a 1 MB string": ("ddp-2rank-gloo", "host0/1/meta.json", lambda d: d.update(host="h" * 10**6),
                                     ["host0/1/meta.json [host]", "at most 255 characters"]),
    "two steps' dur_us swapped (case 16958: +5.9 % silently)": ("ddp-h100-2rank-nccl-cnn", "host1/1/meta.json",
                                                               _swap_step_times_16958,
                                                               ["host1/1/meta.json [steps[13].dur_us]",
                                                                "not end_time_ns minus step 12's (9257.167 us)"]),
    "median_profiled_us another step's time": ("ddp-2rank-gloo", "host0/0/meta.json",
                                               lambda d: d["measured"].update(median_profiled_us=9822.857),
                                               ["[measured.median_profiled_us]",
                                                "not the median of its steps' dur_us (9027.142 us)"]),
    "MXNet server node deleted from the manifest (case 41565: refused without naming a file)": (
        "mxnet-ps-2w1s-loopback", "manifest.json", lambda d: d["nodes"].pop("host0/server0"),
        ["manifest.json [nodes]", "pushed to a parameter server", "no node with role 'server'"]),
    "asynchronous MXNet job's server deleted from the manifest (case 87074: refused without naming a file)": (
        "mxnet-ps-mlp-async-3w1s-200mbit", "manifest.json", lambda d: d["nodes"].pop("host0/server0"),
        ["manifest.json [nodes]", "pushed to a parameter server", "no node with role 'server'"]),
    "profiled steps reversed (case 46938: +3.08 % silently)": (
        "ddp-h100-2rank-nccl-cnn", "host1/1/meta.json", lambda d: d["window"]["profiled_steps"].reverse(),
        ["host1/1/meta.json [window.profiled_steps[1]]", "the profiled steps must increase"]),
    "meta.json steps reversed (case 52369: -2.95 % silently)": (
        "ddp-2host-1000mbit", "host1/1/meta.json", lambda d: d["steps"].reverse(),
        ["host1/1/meta.json [steps[1].step]", "the steps' step must increase down the list"]),
    "an MXNet manifest without extra (case 54687: links per host pair, +2.21 % silently)": (
        "mxnet-ps-cnn-async-2w1s-200mbit", "manifest.json", lambda d: d.pop("extra"),
        ["manifest.json [extra.link_model]", "extra.link_model is missing"]),
    "MXNet params out of key order (case 55686: +5.8 % silently)": (
        "mxnet-ps-2w1s-loopback", "host2/worker0/meta.json", lambda d: d["params"].reverse(),
        ["host2/worker0/meta.json [params[0].key]", "the collector lists the parameters in key order"]),
    "a Kineto CPU event's pid replaced by a long string (case 98988: another thread, +2.1 % silently)": (
        "ddp-2rank-gloo", "host0/0/kineto_trace.json", lambda d: d["traceEvents"][977].__setitem__("pid", "x" * 100000),
        ["host0/0/kineto_trace.json [traceEvents[977]]", "is not one of the file's processes", "'xxxx"]),
    "a Kineto event replaced by -1 (case 47722: skipped, +1.74 % silently)": (
        "ddp-2rank-gloo", "host0/1/kineto_trace.json", lambda d: d["traceEvents"].__setitem__(1544, -1),
        ["[traceEvents[1544]]", "an event must be a JSON object, not int"]),
    "a flow event's pid a list (case 72992: TypeError traceback)": (
        "ddp-h100-2rank-nccl-cnn", "host1/1/kineto_trace.json.gz",
        lambda d: next(e for e in d["traceEvents"] if e.get("cat") == "ac2g").update(pid=[]),
        ["host1/1/kineto_trace.json.gz [traceEvents[", "a flow event's pid and tid must be numbers or strings"]),
    "a ps-lite server's records emptied (case 74696: replayed as 0.0 ms)": (
        "pslite-2w1s-200mbit", "pslite-server-8.5158.json", lambda d: d.update(records=[]),
        ["pslite-server-8.5158.json [records]", "server node id 8 recorded none of the"]),
    "a ps-lite server record deleted": (
        "pslite-2w1s-200mbit", "pslite-server-8.5158.json", lambda d: d["records"].pop(300),
        ["pslite-server-8.5158.json", "this server's file does not record", "a record is missing"]),
    "manifest dir a 1 MB name (case 3557)": ("ddp-2host-1000mbit", "manifest.json",
                                             lambda d: next(iter(d["nodes"].values())).update(dir="A" * 10**6),
                                             ["dir must be a relative path"]),
}


def test_distributed_info_infinite_rank_is_unusable():
    """Case 1231: ``distributedInfo.rank`` = Infinity raised OverflowError from int(); now 'unusable' (None),
    which the plain reader refuses with its one line (no usable distributedInfo)."""
    from dpro_kit.readers.kineto import distributed_info
    assert distributed_info({"distributedInfo": {"rank": float("inf"), "world_size": 2}}) is None
    assert distributed_info({"distributedInfo": {"rank": 1, "world_size": float("-inf")}}) is None
    assert distributed_info({"distributedInfo": {"rank": 1, "world_size": 2}})["rank"] == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_with_one_line(name, tmp_path, capsys, monkeypatch):
    seed, rel, fn, words = CASES[name]
    trace = _copy(tmp_path, seed)
    if rel is None:
        shutil.rmtree(trace / "worker0")
    else:
        _edit(trace / rel, fn)
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and out == "", (rc, out[:200], err)
    assert len(lines) == 1 and lines[0].startswith("dpro: error: " + str(trace)), err
    assert len(lines[0]) < 1000, len(lines[0])
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_step_times_replay_with_a_warning(tmp_path, capsys, monkeypatch):
    """A meta.json without step times: the profiler's cost comes from the calibration loop alone, and
    the replay says so instead of quietly predicting another number (fuzz case 614: -10 %)."""
    trace = _copy(tmp_path, "ddp-2rank-gloo")
    _edit(trace / "host0/0/meta.json", lambda d: d.pop("steps"))
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc == 0, err
    warns = json.loads(out)["warnings"]
    assert any(w.startswith("host0/0: meta.json has no step times") for w in warns), warns


def test_byteps_without_worker_count_warns(tmp_path, capsys, monkeypatch):
    trace = _copy(tmp_path, "byteps-2w1s")
    _edit(trace / "byteps_meta.json", lambda d: d.pop("workers"))
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc == 0, err
    assert any("does not say how many workers" in w for w in json.loads(out)["warnings"])


def test_mxnet_span_wider_than_its_twin_warns(tmp_path, capsys, monkeypatch):
    """A push-pull begun 1 ms before its operator-domain twin: an honest dump has them <= 3 us apart
    (docs/reliability.md), a preempted thread could make more, so it replays with a warning naming the
    record, never silently (the unmutated dump gives no warning)."""
    trace = _copy(tmp_path, "mxnet-ps-2w1s-loopback")
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc == 0 and json.loads(out)["warnings"] == [], err
    f = trace / "host2/worker0/profile.json"
    def earlier(doc):
        next(e for e in doc["traceEvents"] if e.get("ph") == "B" and e["name"] == "KVStoreDistDefaultStoragePushPull")[
            "ts"] -= 1000
    _edit(f, earlier)
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc == 0, err
    warns = json.loads(out)["warnings"]
    assert len(warns) == 1 and warns[0].startswith("host2/worker0: profile.json [traceEvents["), warns
    assert "begins 1000 us before" in warns[0] and "operator-domain twin" in warns[0], warns



def _cross_parent(doc):
    """The first cpu_op with a cpu_op inside it: the inner one made to end 1 ms after the outer one."""
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    for a in ops:
        for b in ops:
            if b is not a and b["tid"] == a["tid"] and a["ts"] < b["ts"] and b["ts"] + b["dur"] < a["ts"] + a["dur"]:
                b["dur"] = a["ts"] + a["dur"] - b["ts"] + 1000
                return


def test_kineto_range_crossing_its_parent_warns(tmp_path, capsys, monkeypatch):
    """CPU ranges of one thread nest in every real Kineto trace measured (0 of 1.03 M events cross
    the end of the range they start in, docs/reliability.md); a crossing one is kept as a sibling,
    as before, and now said, naming the record."""
    trace = _copy(tmp_path, "ddp-2rank-gloo")
    _edit(trace / "host0/1/kineto_trace.json", _cross_parent)
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc == 0, err
    warns = json.loads(out)["warnings"]
    assert len(warns) == 1 and warns[0].startswith("host0/1: kineto_trace.json [traceEvents["), warns
    assert "starts inside" in warns[0] and "ends 1000.000 us after it" in warns[0], warns


def test_infinite_profiler_calibration_is_ignored(tmp_path, capsys, monkeypatch):
    """Case 13074: a ``profiler_overhead.plain_ns`` reading of -inf raised OverflowError; an unusable
    calibration is ignored as a missing one is (the window estimate stands), and the replay is the seed's."""
    trace = _copy(tmp_path, "ddp-2host-1000mbit")
    rc0, out0, _ = _replay(trace, capsys, monkeypatch, tmp_path)
    meta = trace / "host0" / "0" / "meta.json"
    doc = json.loads(meta.read_text())
    doc["profiler_overhead"]["plain_ns"][0] = float("-inf")
    meta.write_text(json.dumps(doc))
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    assert rc0 == 0 and rc == 0, err
    assert abs(json.loads(out)["iteration_time_ms"] - json.loads(out0)["iteration_time_ms"]) < 0.01 * json.loads(out0)[
        "iteration_time_ms"]


@pytest.mark.parametrize("field,value,words", [("host", None, "must be a host name"),
                                               ("rank", "x", "must be an integer >= 0"),
                                               ("world_size", 0, "must be an integer >= 1"),
                                               ("rank", 5, "rank 5 is not below world_size 2")])
def test_manifest_rebuilt_from_a_damaged_meta_is_refused(field, value, words, tmp_path, capsys, monkeypatch):
    """Fuzz case 47210: manifest.json deleted (the loader rebuilds it from the meta.json files) and one
    meta.json without ``host``: a KeyError traceback.  Now one line naming that meta.json and the field."""
    trace = _copy(tmp_path, "ddp-2rank-gloo")
    (trace / "manifest.json").unlink()
    _edit(trace / "host0/0/meta.json", lambda d: d.pop(field) if value is None else d.update({field: value}))
    rc, out, err = _replay(trace, capsys, monkeypatch, tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert f"host0/0/meta.json [{field}]" in lines[0] and words in lines[0], lines[0]


def test_folder_of_job_folders_is_refused(tmp_path, capsys, monkeypatch):
    """A folder holding several jobs' folders (here a DDP job and a ps-lite job): the ps-lite discoverer,
    which looks one folder down for its files, replayed the ps-lite job as the folder's (exit 0, 104.8 ms
    for `dpro replay examples/traces`); now one line naming the job folders, exit 2."""
    root = tmp_path / "jobs"
    root.mkdir()
    for name in ("ddp-2rank-gloo", "pslite-2w1s-200mbit"):
        shutil.copytree(TRACES / name, root / name)
    rc, out, err = _replay(root, capsys, monkeypatch, tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert "sub-folder(s) ddp-2rank-gloo" in lines[0] and f"pass one job's folder, e.g. {root / 'ddp-2rank-gloo'}" in lines[0]
