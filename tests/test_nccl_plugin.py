"""The NCCL profiler plugin (collectors/nccl), driven as NCCL drives it by the C harness.

The harness forks one process per rank, each with a proxy thread that follows the control flow of
NCCL's network transport and moves the bytes over socketpairs (docs/nccl.md); these tests build
plugin and harness with make, run 2- and 4-rank ring all-reduces and check the plugin's files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "collectors" / "nccl"

SEND_STATES = [8, 20, 9]         # GPUWait, PeerWait, SendWait (net.cc sendProxyProgress)
RECV_STATES = [10, 11, 12]       # RecvWait, FlushWait, GPUWait (net.cc recvProxyProgress)


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Plugin and harness built by collectors/nccl/Makefile into a private folder."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on PATH: the NCCL profiler plugin cannot be built")
    out = tmp_path_factory.mktemp("nccl-build")
    r = subprocess.run(["make", "-s", "-C", str(SRC), f"BUILD={out}", f"CC={cc}"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def run_ring(built: Path, out: Path, *, ranks: int, channels: int, nbytes: int, iters: int = 2, api: int = 6,
             proto: str = "Simple", chunk: int = 131072, algo: str = "ring", ppn: int | None = None) -> Path:
    """Run the harness (it checks counts itself and exits non-zero otherwise); return the trace dir.
    ``ppn``: ranks per emulated node (tree only)."""
    env = dict(os.environ, DPRO_NCCL_TRACE=str(out))
    r = subprocess.run([str(built / "nccl_harness"), "run", "--algo", algo, str(built / "libnccl-profiler-dpro.so"),
                        str(ranks), str(channels), str(nbytes), str(iters), str(api), proto, str(chunk)]
                       + ([str(ppn)] if ppn else []), capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok "), r.stdout
    return out


def load_raw(path: Path) -> tuple[dict, list[dict], dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines[0], lines[1:-1], lines[-1]


@pytest.mark.parametrize("ranks,channels,nbytes,api,proto", [
    (2, 2, 1_048_576, 6, "Simple"),
    (4, 2, 4_194_304 + 12_345, 5, "Simple"),
    (4, 3, 1_000_003, 4, "LL"),
])
def test_plugin_files(built, tmp_path, ranks, channels, nbytes, api, proto):
    """Per rank: the header, one proxy op per channel and direction with ring-neighbour peers, every
    step's states in NCCL's order with non-decreasing times, and the transferred sizes adding up."""
    out = run_ring(built, tmp_path / "t", ranks=ranks, channels=channels, nbytes=nbytes, api=api, proto=proto)
    files = sorted(out.glob("nccl-*.jsonl"))
    assert len(files) == ranks and not list(out.glob("*.tmp"))
    spc = 2 if proto == "Simple" else 1
    for f in files:
        head, events, end = load_raw(f)
        r = head["rank"]
        assert (head["format"], head["version"], head["api"], head["nranks"]) == ("dpro-nccl", 1, api, ranks)
        assert end == {"end": True, "events": len(events), "dropped": 0}
        by_id = {e["id"]: e for e in events}
        colls = [e for e in events if e["ev"] == "coll"]
        ops = [e for e in events if e["ev"] == "op"]
        steps = [e for e in events if e["ev"] == "step"]
        assert [c["seq"] for c in colls] == [0, 1]
        assert all(c["func"] == "AllReduce" and c["proto"] == proto.upper() and c["nchannels"] == channels for c in colls)
        assert len(ops) == 2 * 2 * channels
        for op in ops:
            assert by_id[op["parent"]]["ev"] == "coll"
            assert op["peer"] == ((r + 1) % ranks if op["send"] else (r - 1) % ranks)
            assert op["states"][0][0] == 19 and op["t0"] <= op["states"][0][1] <= op["t1"]
        per_op = defaultdict(list)
        for s in steps:
            per_op[s["parent"]].append(s)
        sent = defaultdict(int)
        for op in ops:
            ss = per_op[op["id"]]
            assert [s["step"] for s in ss] == list(range(op["nsteps"]))
            assert op["nsteps"] % (2 * (ranks - 1) * spc) == 0
            for s in ss:
                states = [x[0] for x in s["states"]]
                assert states == (SEND_STATES if op["send"] else RECV_STATES)
                times = [s["t0"]] + [x[1] for x in s["states"]] + [s["t1"]]
                assert times == sorted(times), s
                assert op["t0"] <= s["t0"] and s["t1"] <= op["t1"]
                if op["send"]:
                    sent[op["parent"]] += s["states"][2][2]      # the size recorded with SendWait
        # a rank sends 2(N-1) of the N chunks of each channel's share of every loop
        for coll in colls:
            assert sent[coll["id"]] > 0
    # all ranks together: every chunk of the message crosses each of the 2(N-1) ring steps once
    total = 0
    for f in files:
        _, events, _ = load_raw(f)
        ops = {e["id"]: e for e in events if e["ev"] == "op" and e["send"]}
        coll0 = next(e["id"] for e in events if e["ev"] == "coll" and e["seq"] == 0)
        total += sum(s["states"][2][2] for s in events if s["ev"] == "step" and s["parent"] in ops
                     and ops[s["parent"]]["parent"] == coll0)
    assert total == 2 * (ranks - 1) * nbytes


def test_recv_matches_send(built, tmp_path):
    """What rank r sends on a channel at step p is what rank r+1 receives there at step p (same size,
    received after it was posted for sending)."""
    out = run_ring(built, tmp_path / "t", ranks=4, channels=2, nbytes=3_000_000, iters=1)
    per_rank = {}
    for f in out.glob("nccl-*.jsonl"):
        head, events, _ = load_raw(f)
        ops = {e["id"]: e for e in events if e["ev"] == "op"}
        per_rank[head["rank"]] = {(ops[s["parent"]]["channel"], bool(ops[s["parent"]]["send"]), s["step"]): s
                                  for s in events if s["ev"] == "step"}
    n = 0
    for r, steps in per_rank.items():
        for (ch, is_send, p), s in steps.items():
            if not is_send:
                continue
            rv = per_rank[(r + 1) % 4][(ch, False, p)]
            assert s["states"][2][2] == rv["states"][1][2]           # SendWait size == FlushWait size
            assert s["states"][2][1] <= rv["states"][1][1]           # posted for sending before it arrived
            n += 1
    loops = -(-3_000_000 // (2 * 4 * 131072))
    assert n == 4 * 2 * loops * 2 * (4 - 1) * 2      # ranks x channels x loops x ring steps x slices


def test_init_refuses_unusable_directory(built, tmp_path):
    """When DPRO_NCCL_TRACE cannot be created, init fails (NCCL then disables the plugin), says why
    through NCCL's logger, and nothing is written."""
    (tmp_path / "file").write_text("x")
    env = dict(os.environ, DPRO_NCCL_TRACE=str(tmp_path / "file" / "sub"))
    r = subprocess.run([str(built / "nccl_harness"), "ring", str(built / "libnccl-profiler-dpro.so"), "2", "1",
                        "1000", "1", "6", "Simple", "65536"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert "cannot create DPRO_NCCL_TRACE" in r.stderr and "plugin init failed" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_bench_reports_cost(built, tmp_path):
    """The overhead benchmark runs and reports finite per-call costs (values: docs/nccl.md)."""
    env = dict(os.environ, DPRO_NCCL_TRACE=str(tmp_path / "b"))
    r = subprocess.run([str(built / "nccl_harness"), "bench", str(built / "libnccl-profiler-dpro.so"), "6", "20000"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.split()[1:])
    assert int(fields["calls"]) == 100_000
    assert 0 < float(fields["plugin_ns_per_call"]) < 1e6 and 0 < float(fields["finalize_ns_per_event"]) < 1e7


# --------------------------------------------------------------------------- the reader (dpro_kit.readers.nccl)

@pytest.mark.parametrize("ranks,channels,nbytes,proto", [(2, 2, 1_048_576, "Simple"), (4, 2, 3_000_000, "Simple"),
                                                         (4, 3, 777_777, "LL")])
def test_reader_ring_events(built, tmp_path, ranks, channels, nbytes, proto):
    """SEND/RECV per rank, channel, loop and ring step; each SEND's RECV on its ring successor with the
    same transaction id; per-step times in order; the bytes of every ring step add up to the message."""
    from dpro_kit.readers import nccl

    chunk, iters = 131072, 2
    out = run_ring(built, tmp_path / "t", ranks=ranks, channels=channels, nbytes=nbytes, iters=iters, proto=proto,
                   chunk=chunk)
    job = nccl.ring_transfers(nccl.files(out))
    rows = job["rows"]
    loops = -(-nbytes // (channels * ranks * chunk))
    steps = 2 * (ranks - 1)
    sends = [r for r in rows if r["kind"] == "SEND"]
    recvs = {(r["iteration"], r["txn"]): r for r in rows if r["kind"] == "RECV"}
    assert job["rank_order"] and job["skipped"] == {}
    assert len(sends) == len(recvs) == iters * ranks * channels * loops * steps
    assert len({s["txn"] for s in sends}) == len(sends) // iters      # txn ids repeat per iteration only
    node = job["nodes"]
    for s in sends:
        rv = recvs[(s["iteration"], s["txn"])]
        r = node.index(s["node"])
        assert s["peer"] == node[(r + 1) % ranks] == rv["node"] and rv["peer"] == s["node"]
        assert rv["bytes"] == s["bytes"] and rv["chunk"] == s["chunk"] and rv["step"] == s["step"]
        assert s["txn"] == f"{s['tensor']}:{s['phase']}:{s['step']}:{s['chunk']}:{s['node']}->{s['peer']}"
        assert s["start"] <= rv["start"] + rv["dur"]                      # sent before it arrived
    per_lane = defaultdict(list)
    for s in sends:
        per_lane[(s["iteration"], s["node"], s["tensor"])].append(s)
    for lane in per_lane.values():
        lane.sort(key=lambda s: s["step"])
        assert [s["step"] for s in lane] == list(range(steps))
        starts = [s["start"] for s in lane]
        assert starts == sorted(starts)
    for it in range(iters):
        for k in range(steps):
            assert sum(s["bytes"] for s in sends if s["iteration"] == it and s["step"] == k) == nbytes


def test_reader_matches_ring_dfg(built, tmp_path):
    """The folder loads as a trace (manifest discovered), and the ring DFG the graph builder makes from
    it has exactly the reader's transactions: every SEND op's duration comes from the trace."""
    from dpro_kit.graph.build import build_global_dfg
    from dpro_kit.trace import load_trace

    out = run_ring(built, tmp_path / "t", ranks=4, channels=2, nbytes=2_000_000, iters=2)
    ts = load_trace(out)
    assert ts.manifest.raw_format == "dpro-nccl" and ts.manifest.world_size == 4
    assert ts.manifest.iterations == [0, 1] and ts.manifest.extra["rank_order"] is True
    g = build_global_dfg(ts)
    dfg_sends = {d["txn"]: d for _, d in g.nodes(data=True) if d.get("kind") == "SEND"}
    assert set(dfg_sends) == set(ts.events.loc[ts.events["kind"] == "SEND", "txn"])
    assert {d["source"] for d in dfg_sends.values()} == {"trace:txn"}


def _one_line_error(path_dir: Path, match: str, name: str | None = None) -> str:
    from dpro_kit.errors import DproError
    from dpro_kit.readers import nccl

    with pytest.raises(DproError) as exc:
        nccl.ring_transfers(nccl.files(path_dir))
    msg = str(exc.value)
    assert "\n" not in msg and match in msg, msg
    if name:
        assert name in msg, msg
    return msg


def test_reader_bad_input(built, tmp_path):
    """Cut, damaged, unstopped, missing or mixed files: one line naming the file, the line and the fix."""
    good = run_ring(built, tmp_path / "good", ranks=2, channels=1, nbytes=100_000, iters=1)
    f0, f1 = sorted(good.glob("nccl-*.jsonl"))

    def variant(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d / f0.name)
        return d

    def cut(p: Path):
        p.write_text("\n".join(p.read_text().splitlines()[:-3]) + "\n")

    _one_line_error(variant("cut", cut), "no end line: the file was cut", f0.name)

    def garble(p: Path):
        lines = p.read_text().splitlines()
        lines[4] = lines[4][:20]
        p.write_text("\n".join(lines) + "\n")

    _one_line_error(variant("garbled", garble), "[line 5]: line 5 is not JSON", f0.name)

    def unstopped(p: Path):
        lines = p.read_text().splitlines()
        k = next(i for i, x in enumerate(lines) if '"ev":"step"' in x)
        e = json.loads(lines[k])
        e["t1"] = None
        lines[k] = json.dumps(e)
        p.write_text("\n".join(lines) + "\n")

    _one_line_error(variant("unstopped", unstopped), "never stopped", f0.name)
    _one_line_error(variant("missing", lambda p: p.unlink()), "no file for rank(s) [0] of 2")

    def other_run(p: Path):
        p.write_text(p.read_text().replace('"comm":"5eed0000d9a0c0de"', '"comm":"00000000000000aa"', 1))

    _one_line_error(variant("mixed", other_run), "files of 2 communicators")

    def resize(p: Path):
        lines = p.read_text().splitlines()
        k = next(i for i, x in enumerate(lines) if '"ev":"step"' in x and "[9," in x)
        e = json.loads(lines[k])
        e["states"] = [[s, t, z + 1 if s == 9 else z] for s, t, z in e["states"]]
        lines[k] = json.dumps(e)
        p.write_text("\n".join(lines) + "\n")

    _one_line_error(variant("resized", resize), "received", f1.name)
    _one_line_error(variant("notours", lambda p: p.write_text('{"format":"x"}\n')), "not a dpro-nccl file")


# --------------------------------------------------------------------------- tree all-reduce (harness tree mode)

def nccl_tree(ranks: int, channels: int, ch: int, ppn: int = 1) -> tuple[dict[int, int | None], dict[int, list[int]]]:
    """Parent and children (NCCL's order) of every rank on channel ``ch``, ``ppn`` ranks per node: tree 0 of
    the double binary tree over the nodes when 2 ch < channels, else tree 1, a chain within each node
    (dpro_kit.graph.topology, written from ncclGetBtree/ncclGetDtree/connectTrees)."""
    from dpro_kit.graph.topology import double_tree_orders, nccl_tree as tree

    host = {r: f"node{r // ppn}" for r in range(ranks)}
    return tree(double_tree_orders(list(range(ranks)), host)[0 if 2 * ch < channels else 1], host)


@pytest.mark.parametrize("ranks,channels,nbytes,api,proto,ppn", [
    (2, 2, 1_048_576, 6, "Simple", 1),
    (4, 2, 3_000_000 + 48, 5, "Simple", 1),
    (4, 4, 777_776, 4, "LL", 1),
    (4, 2, 1_000_000, 6, "Simple", 2),      # 2 nodes of 2 ranks: chains
    (6, 4, 1_000_000, 6, "Simple", 2),      # 3 nodes (odd: tree 1 shifted)
])
def test_tree_plugin_files(built, tmp_path, ranks, channels, nbytes, api, proto, ppn):
    """Per rank and channel: the proxy ops of NCCL's tree (recv from each child, send to the parent, send
    to each child, recv from the parent, in that order), one step per chunk on every op, states in NCCL's
    order; the chunks sent to the parent add up to the channel's share, the channels' to the message."""
    chunk, iters = 131072, 2
    out = run_ring(built, tmp_path / "t", ranks=ranks, channels=channels, nbytes=nbytes, iters=iters, api=api,
                   proto=proto, chunk=chunk, algo="tree", ppn=ppn)
    files = sorted(out.glob("nccl-*.jsonl"))
    assert len(files) == ranks
    nloops = -(-nbytes // (channels * chunk))
    up_bytes = defaultdict(int)        # (seq, channel) -> bytes the non-roots sent to their parents, per rank
    for f in files:
        head, events, end = load_raw(f)
        r = head["rank"]
        assert (head["api"], head["nranks"], head["nnodes"], end["dropped"]) == (api, ranks, ranks // ppn, 0)
        assert head["host"] == f"node{r // ppn}"
        colls = {e["id"]: e for e in events if e["ev"] == "coll"}
        assert sorted(c["seq"] for c in colls.values()) == list(range(iters))
        assert all(c["algo"] == "TREE" and c["func"] == "AllReduce" and c["proto"] == proto.upper() for c in colls.values())
        ops = [e for e in events if e["ev"] == "op"]
        steps = defaultdict(list)
        for s in events:
            if s["ev"] == "step":
                steps[s["parent"]].append(s)
        for cid, coll in colls.items():
            for ch in range(channels):
                parent, kids = nccl_tree(ranks, channels, ch, ppn)
                mine = sorted((o for o in ops if o["parent"] == cid and o["channel"] == ch), key=lambda o: o["id"])
                p = parent[r]
                want = [(0, k) for k in kids[r]] + ([(1, p)] if p is not None else []) + \
                       [(1, k) for k in kids[r]] + ([(0, p)] if p is not None else [])
                assert [(o["send"], o["peer"]) for o in mine] == want
                for o in mine:
                    ss = sorted(steps[o["id"]], key=lambda s: s["step"])
                    assert o["nsteps"] == nloops and [s["step"] for s in ss] == list(range(nloops))
                    for s in ss:
                        assert [x[0] for x in s["states"]] == (SEND_STATES if o["send"] else RECV_STATES)
                        times = [s["t0"]] + [x[1] for x in s["states"]] + [s["t1"]]
                        assert times == sorted(times)
                    if o["send"] and o["peer"] == p:
                        up_bytes[(coll["seq"], ch, r)] = sum(s["states"][2][2] for s in ss)
    for seq in range(iters):
        shares = []
        for ch in range(channels):
            parent, _ = nccl_tree(ranks, channels, ch, ppn)
            sent = {up_bytes[(seq, ch, r)] for r in range(ranks) if parent[r] is not None}
            assert len(sent) == 1          # every non-root sends its parent the whole channel share
            shares.append(sent.pop())
        assert sum(shares) == nbytes


@pytest.mark.parametrize("ranks,channels,nbytes,proto,ppn", [(2, 2, 1_048_576, "Simple", 1),
                                                             (4, 2, 3_000_000, "Simple", 1),
                                                             (4, 4, 777_776, "LL", 1), (4, 2, 1_000_000, "Simple", 2)])
def test_reader_tree_events(built, tmp_path, ranks, channels, nbytes, proto, ppn):
    """Per channel and chunk, one reduce SEND from every non-root to its parent and one broadcast SEND
    back, each with its RECV on the peer under the same txn; sizes equal along the tree; the chunks of
    every (child, parent) edge add up to the message."""
    from dpro_kit.readers import nccl

    chunk, iters = 131072, 2
    out = run_ring(built, tmp_path / "t", ranks=ranks, channels=channels, nbytes=nbytes, iters=iters, proto=proto,
                   chunk=chunk, algo="tree", ppn=ppn)
    job = nccl.transfers(nccl.files(out))
    rows, node = job["rows"], job["nodes"]
    nloops = -(-nbytes // (channels * chunk))
    assert job["tree_order"] and job["skipped"] == {}
    sends = [r for r in rows if r["kind"] == "SEND"]
    recvs = {(r["iteration"], r["txn"]): r for r in rows if r["kind"] == "RECV"}
    assert len(sends) == len(recvs) == iters * channels * nloops * 2 * (ranks - 1)
    for s in sends:
        rv = recvs[(s["iteration"], s["txn"])]
        parent, _ = nccl_tree(ranks, channels, s["channel"], ppn)
        src, dst = node.index(s["node"]), node.index(s["peer"])
        assert (parent[src] == dst) if s["phase"] == "reduce" else (parent[dst] == src)
        assert rv["node"] == s["peer"] and rv["peer"] == s["node"] and rv["bytes"] == s["bytes"]
        assert s["txn"] == f"{s['tensor']}:{s['phase']}:{s['step']}:0:{s['node']}->{s['peer']}"
        assert s["tensor"] == f"AllReduce.c{s['channel']}.l{s['loop']}"
        assert s["start"] <= rv["start"] + rv["dur"]
    per_tensor = defaultdict(set)
    for s in sends:
        per_tensor[(s["iteration"], s["tensor"])].add(s["bytes"])
    assert all(len(b) == 1 for b in per_tensor.values())     # a chunk has one size on every tree edge
    for it in range(iters):
        for phase in ("reduce", "broadcast"):
            edge = defaultdict(int)
            for s in sends:
                if s["iteration"] == it and s["phase"] == phase:
                    edge[(s["channel"], s["node"], s["peer"])] += s["bytes"]
            per_channel = defaultdict(set)
            for (ch, _, _), b in edge.items():
                per_channel[ch].add(b)
            assert all(len(b) == 1 for b in per_channel.values())
            assert sum(b.pop() for b in per_channel.values()) == nbytes
    # the collectives: one per (channel, chunk), participants in tree order of the channel's tree
    colls = {c["tensor"]: c for c in job["collectives"]}
    assert len(colls) == channels * nloops
    from dpro_kit.graph.topology import nccl_tree as tree
    host = {x: x.split("/")[0] for x in node}
    for c in colls.values():
        ch = int(c["tensor"].split(".c")[1].split(".")[0])
        parent, _ = nccl_tree(ranks, channels, ch, ppn)
        got, _ = tree(c["participants"], host)        # the DFG's tree of the participants
        assert c["algorithm"] == "tree"
        assert {node.index(k): (node.index(v) if v else None) for k, v in got.items()} == parent


@pytest.mark.parametrize("ranks,channels,ppn", [(2, 2, 1), (4, 2, 1), (6, 2, 2), (4, 2, 4)])
def test_reader_matches_tree_dfg(built, tmp_path, ranks, channels, ppn):
    """The folder loads as a trace whose tree collectives the builder expands into exactly the reader's
    transactions (every SEND's duration from the trace); it replays, and the graph's tensors are
    recognised as tree all-reduces."""
    from dpro_kit.graph.build import build, build_global_dfg
    from dpro_kit.job import Job, identity
    from dpro_kit.replay import replay
    from dpro_kit.trace import load_trace

    out = run_ring(built, tmp_path / "t", ranks=ranks, channels=channels, nbytes=2_000_000, iters=2, algo="tree",
                   ppn=ppn)
    ts = load_trace(out)
    assert ts.manifest.world_size == ranks and ts.manifest.iterations == [0, 1]
    assert ts.manifest.extra["tree_order"] is True
    assert {c.algorithm for c in ts.collectives} == {"tree"}
    g = build_global_dfg(ts)
    dfg_sends = {d["txn"]: d for _, d in g.nodes(data=True) if d.get("kind") == "SEND"}
    assert set(dfg_sends) == set(ts.events.loc[ts.events["kind"] == "SEND", "txn"])
    assert {d["source"] for d in dfg_sends.values()} == {"trace:txn"}
    res = replay(g)
    assert 0 < res.iteration_time_us < 60e6
    job = Job.from_graph(g)
    assert {t.algorithm for t in job.tensors.values()} == {"tree"}
    g2 = build(job, identity(job))
    assert {d["txn"] for _, d in g2.nodes(data=True) if d.get("kind") == "SEND"} == set(dfg_sends)


def test_reader_tree_bad_input(built, tmp_path):
    """A tree file whose sizes or peers do not fit the other ranks': one line naming the file and the fix."""
    good = run_ring(built, tmp_path / "good", ranks=4, channels=2, nbytes=600_000, iters=1, algo="tree")
    files = sorted(good.glob("nccl-*.jsonl"))

    def variant(name: str, f: Path, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d / f.name)
        return d

    def resize(p: Path):
        lines = p.read_text().splitlines()
        k = next(i for i, x in enumerate(lines) if '"ev":"step"' in x and "[9," in x)
        e = json.loads(lines[k])
        e["states"] = [[s, t, z + 16 if s == 9 else z] for s, t, z in e["states"]]
        lines[k] = json.dumps(e)
        p.write_text("\n".join(lines) + "\n")

    msg = _one_line_error(variant("resized", files[1], resize), "received")
    assert "channel" in msg and "chunk" in msg and "different runs" in msg, msg

    def repeer(p: Path):      # rank 1 (a leaf of tree 0) now "sends up" to rank 3 on channel 0
        lines = p.read_text().splitlines()
        k = next(i for i, x in enumerate(lines) if '"ev":"op"' in x and '"channel":0' in x and '"send":1' in x)
        e = json.loads(lines[k])
        e["peer"] = 3
        lines[k] = json.dumps(e)
        p.write_text("\n".join(lines) + "\n")

    _one_line_error(variant("repeered", files[1], repeer), "sends to [3] but receives from [2]", files[1].name)


REAL = Path(__file__).resolve().parent.parent / "examples" / "traces"


@pytest.mark.parametrize("name,algorithm", [("nccl-h100-ring-4rank", "ring"), ("nccl-h100-tree-4rank", "tree")])
def test_real_nccl_traces(name, algorithm):
    """Files the plugin wrote inside real NCCL 2.28.9 on an H100 (examples/traces/<name>/README.md):
    NCCL's own spellings ("RING", "SIMPLE") are read, every channel's ring / tree is recovered in
    NCCL's order, the graph builder's transactions are exactly the reader's, and the bytes add up:
    per collective, a ring rank sends 2(n-1)/n of the buffer; a tree sends it 2(n-1) times in all
    (reduce up and broadcast down each of the n-1 edges, the channels' halves summed)."""
    from dpro_kit.graph.build import build_global_dfg
    from dpro_kit.replay import replay
    from dpro_kit.trace import load_trace

    ts = load_trace(REAL / name)
    m = ts.manifest
    assert m.raw_format == "dpro-nccl" and m.world_size == 4 and m.iterations == list(range(12))
    assert m.extra["rank_order"] is True and m.extra["tree_order"] is True and not m.extra["skipped"]
    assert {c.algorithm for c in ts.collectives} == {algorithm}
    ev = ts.events
    sends = ev[ev["kind"] == "SEND"]
    size = {it: (1 << 20) * (1, 8, 32)[it // 4] for it in range(12)}    # --sizes-mb 1,8,32, 1 + 3 each
    n = 4
    for it, per_it in sends.groupby("iteration"):
        if algorithm == "ring":
            for _, per_rank in per_it.groupby("node"):
                assert per_rank["bytes"].sum() == 2 * (n - 1) * size[it] // n
        else:
            assert per_it["bytes"].sum() == 2 * (n - 1) * size[it]
    g = build_global_dfg(ts)
    dfg_sends = {d["txn"]: d for _, d in g.nodes(data=True) if d.get("kind") == "SEND"}
    assert set(dfg_sends) == set(sends["txn"])
    assert {d["source"] for d in dfg_sends.values()} == {"trace:txn"}
    assert 0 < replay(g).iteration_time_us < 1e6
