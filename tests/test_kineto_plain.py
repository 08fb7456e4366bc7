"""Plain torch.profiler (Kineto) folders: the real HTA GPU/NCCL traces, every command, the bad variants.

Inputs are the real traces in ``<repo>/../shared/traces/hta`` (:func:`conftest.shared_traces`) (copied from
facebookresearch/HolisticTraceAnalysis, see the README there), copied per job into
a tmp dir (the shared folder is never written).  Bad variants are built from those
real files (a key removed, the gzip stream cut short, two jobs in one folder).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import shared_traces
from dpro_kit.cli import main
from dpro_kit.readers import kineto as K
from dpro_kit.readers import kineto_plain as P

HTA = shared_traces() / "hta"
pytestmark = pytest.mark.skipif(not HTA.is_dir(), reason=f"real Kineto traces not found at {HTA}")

FILES = {"r2": ["nccl_2rank_rank0.json.gz"], "r128": ["sampled_128rank_rank0.json.gz",
                                                       "sampled_128rank_rank1.json.gz"],
         "r16": ["allgather_reducescatter_16rank_rank0.json.gz"]}
#: |replay - measured| / measured allowed for a job replayed as profiled.  One rank's replay
#: is built from that rank's own step (its dependencies and host time are read from it), so
#: it must reproduce the step closely; the reader's earlier misses were -47 % (host time
#: left out) and -32 % (a sampled trace's untraced work); the shared traces give 0.0, -0.5 and
#: -2.5 % (docs/accuracy.md), so 10 % separates a reading bug from the noise of 2-5 steps.
BAND = 0.10


def job(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    for f in FILES[name]:
        shutil.copy(HTA / f, d / f)
    return d


def raw_doc(name: str) -> dict:
    return json.loads(gzip.decompress((HTA / name).read_bytes()))


def test_kineto_layer_reads_the_real_facts():
    """distributedInfo, steps, streams, launches (correlation/ac2g flows) and NCCL collectives."""
    p = HTA / FILES["r2"][0]
    tr = K.parse(K.load_doc(p), p)
    assert (tr.distributed["rank"], tr.distributed["world_size"], tr.distributed["backend"]) == (0, 2, "nccl")
    assert [s.number for s in tr.steps] == [4, 5, 6]
    assert {str(s) for s in tr.gpu} == {"7", "40"}
    doc = raw_doc(FILES["r2"][0])
    kernels = [e for e in doc["traceEvents"] if e.get("cat") in K.GPU_CATS and e.get("ph") == "X"]
    assert len(tr.launch) == sum(1 for e in kernels if "correlation" in e.get("args", {})) > 0
    assert tr.n_flows > 0
    nccl = [e for s in tr.gpu.values() for e in s if K.is_nccl_kernel(e)]
    infos = [K.nccl_info(e, tr.launch.get(id(e))) for e in nccl]
    # the kernels carry their collective, size and process group in this (newer) trace
    assert {i["collective"] for i in infos} == {"allreduce", "broadcast"}
    assert all(i["bytes"] > 0 and i["process_group"] == "0" for i in infos)
    # older traces: the name comes from the nccl:<collective> range around the launch
    p16 = HTA / FILES["r16"][0]
    tr16 = K.parse(K.load_doc(p16), p16)
    names = {K.nccl_info(e, tr16.launch.get(id(e)))["collective"] for s in tr16.gpu.values() for e in s
             if K.is_nccl_kernel(e)}
    assert {"all_to_all", "all_reduce", "all_gather_base", "reduce_scatter_base"} <= names
    assert tr16.distributed["world_size"] == 16 and [s.number for s in tr16.steps] == [550, 551, 552, 553, 554]


def test_call_tree_counts_nested_ops_once():
    """Top-level work of a thread never contains another top-level op (no double counting)."""
    p = HTA / FILES["r2"][0]
    tr = K.parse(K.load_doc(p), p)
    for evs in tr.cpu.values():
        tops = K.top_level(evs)
        for a, b in zip(tops, tops[1:]):
            assert a.end <= b.ts + 1e-3, (a.name, b.name)
        assert not any(K.STEP_RE.match(e.name) for e in tops)   # ProfilerStep ranges are looked through


@pytest.mark.parametrize("name, world, ranks", [("r2", 2, [0]), ("r128", 128, [0, 1])])
def test_replay_matches_the_traces_own_step_times(tmp_path: Path, capsys, name: str, world: int, ranks: list[int]):
    d = job(tmp_path, name)
    assert main(["replay", str(d), "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == world and out["comm_backend"] == "nccl"
    assert sorted(int(n.split("/")[1]) for n in out["nodes"]) == ranks
    assert abs(out["error_pct"]) <= 100 * BAND, out["error_pct"]
    # measured = per step the slowest present rank's ProfilerStep span, median over steps
    spans: dict[int, float] = {}
    for f in FILES[name]:
        for e in raw_doc(f)["traceEvents"]:
            m = K.STEP_RE.match(str(e.get("name", "")))
            if m and e.get("ph") == "X":
                spans[int(m.group(1))] = max(spans.get(int(m.group(1)), 0.0), e["dur"] / 1e3)
    v = sorted(spans.values())
    median = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    assert out["measured_iteration_ms"] == pytest.approx(median)
    assert len(out["notes"]) == 2 and f"of {world} replayed" in out["notes"][0]
    assert "--bucket-mb" in out["notes"][1]
    # the NCCL kernels are the job's communication: each rank's collectives are in the graph
    assert out["critical_path_ms_by_kind"] and all(v["comm_ms"] > 0 for v in out["nodes"].values())


def test_two_present_ranks_share_their_collectives(tmp_path: Path):
    """Rank 0 and 1 of the 128-rank job: one collective per NCCL kernel, both ranks in each."""
    from dpro_kit.trace import load_trace
    ts = load_trace(job(tmp_path, "r128"))
    assert ts.manifest.world_size == 128 and len(ts.manifest.workers()) == 2
    assert ts.collectives and all(len(c.participants) == 2 and c.algorithm == "nccl" for c in ts.collectives)
    kinds = {str(c.tensor).split(":")[1].split("#")[0] for c in ts.collectives}
    assert kinds == {"all_to_all", "all_reduce", "all_gather_base"}
    assert set(ts.events["stream"]) >= {"cpu0", "cpu1", "gpu:7", "gpu:84", "gpu:203"}


def test_every_command_on_a_plain_folder(tmp_path: Path, capsys):
    d = job(tmp_path, "r2")
    tl, g, rep, base = (tmp_path / x for x in ("tl.json", "g.json", "r.html", "base.json"))
    assert main(["replay", str(d), "--timeline", str(tl), "-q"]) == 0
    text = capsys.readouterr().out
    assert "measured" in text and "note: plain torch.profiler input" in text
    assert any(e.get("ph") == "X" for e in json.loads(tl.read_text())["traceEvents"])
    assert main(["graph", str(d), "-o", str(g), "-q"]) == 0
    capsys.readouterr()
    assert main(["replay", str(g), "--json", "-q"]) == 0     # the graph file replays to the same time
    from_graph = json.loads(capsys.readouterr().out)["iteration_time_ms"]
    assert main(["replay", str(d), "--json", "-q"]) == 0
    direct = capsys.readouterr().out
    base.write_text(direct)
    assert from_graph == pytest.approx(json.loads(direct)["iteration_time_ms"])
    assert main(["report", str(d), "-o", str(rep), "-q"]) == 0 and rep.stat().st_size > 0
    assert main(["check", "-b", str(base), "-c", str(d)]) == 0
    capsys.readouterr()
    assert main(["align", str(d)]) == 0
    assert "nothing to align" in capsys.readouterr().out
    # what-ifs: world size works, those that need the collector refuse in one line
    assert main(["replay", str(d), "--world-size", "4", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 4
    for opt in (["--bucket-mb", "5"], ["--bandwidth-mbps", "1000"]):
        assert main(["replay", str(d), *opt, "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "plain torch.profiler trace does not record" in err[0] and opt[0] in err[0]


def _write_gz(path: Path, doc: dict) -> None:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def _bad(tmp_path: Path, capsys, d: Path, *expect: str) -> None:
    assert main(["replay", str(d), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for x in expect:
        assert x in err[0], err[0]


def test_bad_variants_one_line_exit_2(tmp_path: Path, capsys):
    src = raw_doc(FILES["r2"][0])
    # a single rank's file without distributedInfo
    d = tmp_path / "nodi"
    d.mkdir()
    _write_gz(d / "trace.json.gz", {k: v for k, v in src.items() if k != "distributedInfo"})
    _bad(tmp_path, capsys, d, "trace.json.gz", "distributedInfo")
    # empty traceEvents
    d = tmp_path / "empty"
    d.mkdir()
    _write_gz(d / "trace.json.gz", dict(src, traceEvents=[]))
    _bad(tmp_path, capsys, d, "trace.json.gz", "'traceEvents' is empty")
    # truncated .gz (the real file cut in half)
    d = tmp_path / "trunc"
    d.mkdir()
    data = (HTA / FILES["r2"][0]).read_bytes()
    (d / "rank0.json.gz").write_bytes(data[: len(data) // 2])
    _bad(tmp_path, capsys, d, "rank0.json.gz", "truncated")
    # two jobs of different world sizes in one folder
    d = tmp_path / "mixed"
    d.mkdir()
    for f in FILES["r2"] + FILES["r16"]:
        shutil.copy(HTA / f, d / f)
    _bad(tmp_path, capsys, d, "different jobs", "world size 16", "and 2 (nccl_2rank_rank0.json.gz)")
    # one rank twice
    d = tmp_path / "dup"
    d.mkdir()
    shutil.copy(HTA / FILES["r2"][0], d / "a.json.gz")
    shutil.copy(HTA / FILES["r2"][0], d / "b.json.gz")
    _bad(tmp_path, capsys, d, "two traces of rank 0")
    # invalid JSON (truncated text, not gzip)
    d = tmp_path / "badjson"
    d.mkdir()
    (d / "r.json").write_text(json.dumps(dict(src, traceEvents=src["traceEvents"][:50]))[:-200])
    _bad(tmp_path, capsys, d, "r.json", "JSON")


def test_a_single_file_is_refused_with_the_commands_that_read_it(tmp_path: Path, capsys, monkeypatch):
    """`dpro replay rank0.json.gz` (what a torch.profiler user types first): one line that gives the
    commands making a job folder of it; run as given, they replay it."""
    f = tmp_path / "dl" / FILES["r2"][0]
    f.parent.mkdir()
    shutil.copy(HTA / FILES["r2"][0], f)
    _bad(tmp_path, capsys, f, str(f), "a file, not a trace folder", "mkdir nccl_2rank &&")
    assert main(["replay", str(f), "-q"]) == 2
    hint = capsys.readouterr().err.strip()
    cmds = hint[hint.index("mkdir"):].rstrip(")").split(" && ")
    monkeypatch.chdir(tmp_path)
    mk, ln, rp = (c.split() for c in cmds)
    assert mk[0] == "mkdir" and ln[:2] == ["ln", "-s"] and rp[:2] == ["dpro", "replay"]
    Path(mk[1]).mkdir()
    (Path(ln[3]) / Path(ln[2]).name).symlink_to(ln[2])
    assert main(["replay", rp[2], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_ms"] > 0


def test_discoverer_leaves_dpro_collector_folders_alone(tmp_path: Path):
    """A folder with dpro's meta.json is not claimed as plain Kineto input (dpro's reader keeps it)."""
    ex = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"
    d = tmp_path / "t"
    shutil.copytree(ex, d)
    (d / "manifest.json").unlink()
    assert P.discover(d) is None


def test_stand_ins_cannot_change_the_replayed_time(tmp_path: Path, capsys):
    """Why missing ranks are not built: materialising copies (--world-size) gives the same time."""
    d = job(tmp_path, "r128")
    times = []
    for extra in ([], ["--world-size", "6"]):
        assert main(["replay", str(d), "--mean-durations", "--json", "-q", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        times.append((out["iteration_time_ms"], len(out["nodes"])))
    assert times[0][1] == 2 and times[1][1] == 6
    assert times[1][0] == pytest.approx(times[0][0], rel=1e-9)


def test_discovery_without_parsing_gives_the_same_manifest(tmp_path: Path, monkeypatch):
    """Folders of more than PEEK_ABOVE_FILES files are discovered from the event stream alone
    (:func:`kineto_plain._peek`); the manifest is the one a full parse of every file gives."""
    d = tmp_path / "r4"
    d.mkdir()
    src = raw_doc(FILES["r128"][0])
    for r in range(4):       # the real rank-0 file as ranks 0..3 of 4 (a folder of more than 2 files)
        _write_gz(d / f"rank{r}.json.gz", dict(src, distributedInfo=dict(src["distributedInfo"], rank=r,
                                                                            world_size=4)))
    peeked = P.discover(d)
    P._cache.clear()
    monkeypatch.setattr(P, "PEEK_ABOVE_FILES", 100)
    parsed = P.discover(d)
    assert peeked == parsed
    assert peeked.world_size == 4 and len(peeked.nodes) == 4 and peeked.iterations


@pytest.mark.parametrize("files", [1, 3])
@pytest.mark.parametrize("bad", ["abc", None, float("inf")])
def test_profiler_step_without_a_valid_time_is_refused(tmp_path: Path, capsys, files: int, bad):
    """A ProfilerStep range whose ts is not a number: one line naming the file and the record, exit 2,
    whether discovery parses the file (1 file) or only streams it (3 files).  Was a ValueError
    traceback from discovery."""
    src = raw_doc(FILES["r128"][0])
    i = next(i for i, e in enumerate(src["traceEvents"]) if str(e.get("name", "")).startswith("ProfilerStep#"))
    d = tmp_path / f"bad{files}"
    d.mkdir()
    for r in range(files):
        doc = dict(src, distributedInfo=dict(src["distributedInfo"], rank=r, world_size=files))
        if r == files - 1:
            doc["traceEvents"] = [dict(e, ts=bad) if j == i else e for j, e in enumerate(src["traceEvents"])]
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    assert main(["replay", str(d), "-q"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"rank{files - 1}.json" in err[0] and f"traceEvents[{i}]" in err[0], err


@pytest.mark.parametrize("damage,words", [
    (lambda e: e.update(name="ProfilerStep#x"), "name 'ProfilerStep#x' is not ProfilerStep#N"),
    (lambda e: e.update(ph="i"), "ph 'i': a step range is a complete event (X)"),
    (lambda e: e.update(dur=0), "duration 0: a step range has a positive duration"),
    (lambda e: e.update(cat="cpu_op"), "cat 'cpu_op': Kineto writes a step range as user_annotation"),
])
def test_damaged_step_range_is_refused(tmp_path: Path, capsys, damage, words):
    """A ProfilerStep event that is not a whole step range (renamed, not complete, zero length, another
    category) dropped that step without a word: the replayed iteration moved by -1.2 % (a focused fuzz
    of step ranges on nccl_2rank).  Now refused in one line naming the record."""
    src = raw_doc(FILES["r2"][0])
    i = [i for i, e in enumerate(src["traceEvents"]) if str(e.get("name", "")).startswith("ProfilerStep#")][1]
    damage(src["traceEvents"][i])
    d = tmp_path / "bad"
    d.mkdir()
    _write_gz(d / FILES["r2"][0], src)
    assert main(["replay", str(d), "-q"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"traceEvents[{i}]" in err[0] and words in err[0], err


def test_missing_step_range_is_said(tmp_path: Path, capsys):
    """A step range deleted from the middle: the steps around it still replay, with a warning that
    names the gap (torch.profiler numbers one export's steps consecutively)."""
    src = raw_doc(FILES["r2"][0])
    steps = [e for e in src["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") == "user_annotation"]
    nums = sorted(int(e["name"].split("#")[1]) for e in steps)
    assert len(nums) >= 3 and nums == list(range(nums[0], nums[0] + len(nums)))   # consecutive as recorded
    gone = steps[len(steps) // 2]
    src["traceEvents"] = [e for e in src["traceEvents"] if e is not gone]
    d = tmp_path / "gap"
    d.mkdir()
    _write_gz(d / FILES["r2"][0], src)
    assert main(["replay", str(d), "-q", "--json"]) == 0
    warns = json.loads(capsys.readouterr().out)["warnings"]
    n = int(gone["name"].split("#")[1])
    assert any(f"ProfilerStep#{n - 1} is followed by ProfilerStep#{n + 1}" in w for w in warns), warns


def test_event_moved_out_of_its_threads_order_is_said(tmp_path: Path, capsys):
    """Fuzz case 43229: the ts of an aten::slice and of a cudaEventRecord (another thread) swapped, both still
    inside the file's span: +1.1 % without a word.  Kineto numbers a thread's events in the order they start
    (External id; correlation for runtime calls: 0 inversions in 5.7 M events of 300 real files), so the
    replay now warns, naming the record."""
    src = raw_doc(FILES["r2"][0])
    evs = src["traceEvents"]
    a, b = evs[10644], evs[23570]
    assert (a["name"], b["name"]) == ("aten::slice", "cudaEventRecord") and a["tid"] != b["tid"]
    a["ts"], b["ts"] = b["ts"], a["ts"]
    d = tmp_path / "moved"
    d.mkdir()
    _write_gz(d / FILES["r2"][0], src)
    assert main(["replay", str(d), "-q", "--json"]) == 0
    warns = [w for w in json.loads(capsys.readouterr().out)["warnings"] if "numbers a thread's events" in w]
    assert len(warns) == 1 and "[traceEvents[23570]]: 'cudaEventRecord' (correlation 27024)" in warns[0], warns
    # the unedited file: no such warning
    assert main(["replay", str(job(tmp_path, "r2")), "-q", "--json"]) == 0
    assert not [w for w in json.loads(capsys.readouterr().out)["warnings"] if "numbers a thread's events" in w]


def test_a_file_too_big_for_the_memory_is_refused_before_reading(tmp_path: Path, capsys, monkeypatch):
    """A file whose parse needs more memory than the process can get (the measured bound, 4.0 MiB per MB
    + 90 MiB) is refused in one line naming it, before it is read; DPRO_MEMORY_CHECK=0 reads it."""
    from dpro_kit import resources
    d = tmp_path / "big"
    d.mkdir()
    src = raw_doc(FILES["r2"][0])          # 9.8 MB of JSON: about 129 MiB to read
    (d / "rank0.json").write_text(json.dumps(src))
    n = (d / "rank0.json").stat().st_size
    assert K.json_bytes(d / "rank0.json") == n
    monkeypatch.setattr(K, "MEMORY_CHECK_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 100 << 20)
    assert main(["replay", str(d), "-q"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "rank0.json" in err[0] and "needs about 0.1 GiB" in err[0] \
        and "0.1 GiB is available" in err[0], err
    monkeypatch.setenv("DPRO_MEMORY_CHECK", "0")
    assert main(["replay", str(d), "-q", "--json"]) == 0
    capsys.readouterr()
    # the gzip trailer's size is the JSON's size
    gz = tmp_path / "r.json.gz"
    _write_gz(gz, src)
    assert K.json_bytes(gz) == len(gzip.decompress(gz.read_bytes()))


def test_available_memory_is_read():
    from dpro_kit.resources import available_memory_bytes
    have = available_memory_bytes()
    assert have is not None and have > 0
