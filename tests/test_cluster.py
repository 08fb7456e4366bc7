"""Tests of :mod:`dpro_kit.cluster`: real, bandwidth-limited traffic on one box.

Everything here creates network namespaces, so it needs root and a working
``ip netns``/``tc tbf``; otherwise the cluster tests are skipped with the
reason.  All traffic stays between addresses inside namespaces created here
(private subnet, no default route).  Namespaces use the prefix ``dpkt`` so
that :func:`cleanup_stale` checks cannot touch other users' clusters.
Whole file: ~20 s on 2 cores (mostly importing torch in the gloo test).
"""
from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import textwrap

import pytest

from dpro_kit import cluster as cl
from dpro_kit.cluster import EmulatedCluster, cleanup_stale, list_namespaces
from dpro_kit.errors import DproError

from conftest import netns_unusable_reason  # noqa: E402

PREFIX = "dpkt"
PY = sys.executable


_REASON = netns_unusable_reason(PREFIX)
needs_netns = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


# ---------------------------------------------------------------------------
# helper programs run inside the hosts
# ---------------------------------------------------------------------------
SERVER = textwrap.dedent(r'''
    import json, socket, sys, time
    mode = sys.argv[1]
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5201)); s.listen(1); s.settimeout(20)
    print("READY", flush=True)
    c, peer = s.accept(); c.settimeout(20)
    if mode == "echo":
        data = c.recv(1024); c.sendall(data); c.close()
        print(json.dumps({"peer": peer[0], "data": data.decode()}), flush=True)
        sys.exit(0)
    n = first = 0; t0 = None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        if t0 is None:          # clock starts at the first byte: excludes connect
            t0 = time.perf_counter(); first = len(b)
        n += len(b)
    secs = time.perf_counter() - t0
    c.sendall(b"k"); c.close()
    print(json.dumps({"bytes": n, "secs": secs,
                      "mbit": (n - first) * 8 / secs / 1e6}), flush=True)
''')

CLIENT = textwrap.dedent(r'''
    import socket, sys
    host, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = socket.create_connection((host, 5201), timeout=20)
    if mode == "echo":
        c.sendall(b"hello from host1"); print(c.recv(1024).decode(), flush=True)
        sys.exit(0)
    buf = b"x" * (1 << 20); left = size
    while left > 0:
        k = min(left, len(buf)); c.sendall(buf[:k]); left -= k
    c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
''')

# One rank per host; times a 4 MiB gloo all_reduce after a warm-up.  The
# process ends with os._exit: torch's interpreter teardown costs ~2 s here.
ALLREDUCE = textwrap.dedent(r'''
    import datetime, json, os, sys, time
    import torch, torch.distributed as dist
    rank, nbytes, iters = int(os.environ["HOST_RANK"]), int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:29500",
                            rank=rank, world_size=int(os.environ["NHOSTS"]),
                            timeout=datetime.timedelta(seconds=30))
    x = torch.ones(nbytes // 4)
    dist.all_reduce(torch.ones(16)); y = x.clone(); dist.all_reduce(y)   # warm-up
    times = []
    for _ in range(iters):
        y = x.clone(); dist.barrier()
        t0 = time.perf_counter(); dist.all_reduce(y); times.append(time.perf_counter() - t0)
        assert float(y[0]) == 2.0 and float(y[-1]) == 2.0, (y[0], y[-1])
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "iface": os.environ["GLOO_SOCKET_IFNAME"],
                      "times": times}), flush=True)
    sys.stdout.flush(); os._exit(0)
''')


def _wait_ready(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Block until the server printed READY (bounded: never hangs the suite)."""
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    assert r, "server did not start in time"
    line = proc.stdout.readline().decode().strip()
    assert line == "READY", line


def _finish(proc: subprocess.Popen, timeout: float = 30.0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    out = out.decode() if isinstance(out, bytes) else (out or "")
    err = err.decode() if isinstance(err, bytes) else (err or "")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:{out}\nstderr:{err}"
    return out, err


def _bulk_transfer(c: EmulatedCluster, src: int, dst: int, nbytes: int) -> dict:
    """Send ``nbytes`` over TCP from host ``src`` to host ``dst``; receiver's numbers."""
    srv = c.run(dst, [PY, "-c", SERVER, "bulk"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_ready(srv)
    cli = c.run(src, [PY, "-c", CLIENT, c.host_ip(dst), "bulk", str(nbytes)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, _ = _finish(srv)
    _finish(cli)
    return json.loads(out.strip().splitlines()[-1])


def _ours(name: str) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(name + "-")]


# ---------------------------------------------------------------------------
# (a) reachability
# ---------------------------------------------------------------------------
@needs_netns
def test_two_hosts_reach_each_other() -> None:
    with EmulatedCluster(hosts=2, rate_mbit=200, prefix=PREFIX) as c:
        assert c.host_ip(0) == "10.213.0.1" and c.host_ip(1) == "10.213.0.2"
        assert c.iface(0) == c.iface(1) == "eth0"
        srv = c.run(0, [PY, "-c", SERVER, "echo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_ready(srv)
        cli = c.run(1, [PY, "-c", CLIENT, c.host_ip(0), "echo", "0"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out_cli, _ = _finish(cli, timeout=15)
        out_srv, _ = _finish(srv, timeout=15)
        assert out_cli.strip() == "hello from host1"
        rec = json.loads(out_srv)
        assert rec == {"peer": c.host_ip(1), "data": "hello from host1"}


@needs_netns
def test_hosts_are_isolated_and_get_env() -> None:
    """No default route (nothing can leave the cluster); loopback up; env vars set."""
    with EmulatedCluster(hosts=2, prefix=PREFIX) as c:
        for i in range(2):
            ns = c.netns(i)
            routes = subprocess.run(["ip", "-n", ns, "route", "show"],
                                    capture_output=True, text=True).stdout
            assert "default" not in routes and "10.213.0.0/24" in routes, routes
            lo = subprocess.run(["ip", "-n", ns, "link", "show", "lo"],
                                capture_output=True, text=True).stdout
            assert "UP" in lo, lo
        procs = c.run_all([PY, "-c", "import os,json;print(json.dumps({k: os.environ[k] for k in "
                           "('DPRO_HOST','HOST_RANK','MASTER_ADDR','GLOO_SOCKET_IFNAME','NHOSTS')}))",
                           ], stdout=subprocess.PIPE)
        envs = [json.loads(_finish(p)[0]) for p in procs]
        assert envs[1] == {"DPRO_HOST": "host1", "HOST_RANK": "1", "MASTER_ADDR": "10.213.0.1",
                           "GLOO_SOCKET_IFNAME": "eth0", "NHOSTS": "2"}
        assert c.substitute(1, ["--rank={i}", "{ip}", "{x}"]) == ["--rank=1", "10.213.0.2", "{x}"]


# ---------------------------------------------------------------------------
# (b) throughput
# ---------------------------------------------------------------------------
@needs_netns
@pytest.mark.parametrize("rate", [200, 100])
def test_bulk_throughput_matches_rate(rate: int) -> None:
    nbytes = 10_000_000
    with EmulatedCluster(hosts=2, rate_mbit=rate, prefix=PREFIX) as c:
        rec = _bulk_transfer(c, src=1, dst=0, nbytes=nbytes)
    print(f"\n[cluster] bulk TCP host1->host0 at {rate} Mbit/s (tbf {c.tbf}): "
          f"{rec['bytes'] / 1e6:.1f} MB in {rec['secs']:.3f} s = {rec['mbit']:.1f} Mbit/s "
          f"({rec['mbit'] / rate - 1:+.1%})")
    assert rec["bytes"] == nbytes
    assert abs(rec["mbit"] - rate) <= 0.15 * rate, rec


SINK = textwrap.dedent(r"""
    import json, socket, sys, threading, time
    nconn = int(sys.argv[1]); stats = []
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5202)); s.listen(nconn); s.settimeout(20)
    print("READY", flush=True)
    def drain(c):
        c.settimeout(20); n = 0; t0 = None
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            if t0 is None:
                t0 = time.monotonic()   # CLOCK_MONOTONIC: comparable across processes
            n += len(b)
        stats.append((n, t0, time.monotonic())); c.close()
    ts = [threading.Thread(target=drain, args=(s.accept()[0],)) for _ in range(nconn)]
    [t.start() for t in ts]; [t.join(30) for t in ts]
    print(json.dumps({"bytes": sum(x[0] for x in stats), "t0": min(x[1] for x in stats),
                      "t1": max(x[2] for x in stats)}), flush=True)
""")

SOURCE = textwrap.dedent(r"""
    import socket, sys, threading
    size = int(sys.argv[1])
    def send(host):
        c = socket.create_connection((host, 5202), timeout=20)
        buf = b"x" * (1 << 20); left = size
        while left > 0:
            k = min(left, len(buf)); c.sendall(buf[:k]); left -= k
        c.close()
    ts = [threading.Thread(target=send, args=(h,)) for h in sys.argv[2:]]
    [t.start() for t in ts]; [t.join(30) for t in ts]
""")


@needs_netns
@pytest.mark.parametrize("pattern", ["fan-in", "fan-out"])
def test_both_directions_are_limited(pattern: str) -> None:
    """Two concurrent flows into (fan-in) or out of (fan-out) one host share ONE
    link of ``rate``: fan-in checks the download shaper (bridge-side veth),
    fan-out the upload shaper (host-side veth).  Unshaped in the other
    direction this would give ~2x the rate."""
    rate, size = 200, 5_000_000

    def once(c: EmulatedCluster) -> tuple[float, list[dict]]:
        if pattern == "fan-in":     # host1 + host2 -> host0
            sinks = [c.run(0, [PY, "-c", SINK, "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
            _wait_ready(sinks[0])
            srcs = [c.run(i, [PY, "-c", SOURCE, str(size), c.host_ip(0)]) for i in (1, 2)]
        else:                       # host1 -> host0 + host2
            sinks = [c.run(i, [PY, "-c", SINK, "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for i in (0, 2)]
            for p in sinks:
                _wait_ready(p)
            srcs = [c.run(1, [PY, "-c", SOURCE, str(size), c.host_ip(0), c.host_ip(2)])]
        recs = [json.loads(_finish(p)[0].strip().splitlines()[-1]) for p in sinks]
        for p in srcs:
            assert p.wait(timeout=30) == 0
        assert sum(r["bytes"] for r in recs) == 2 * size
        secs = max(r["t1"] for r in recs) - min(r["t0"] for r in recs)
        return 2 * size * 8 / secs / 1e6, recs

    # the shaper caps every attempt; reaching the rate needs the senders to get CPU, which a loaded
    # machine (a CI run beside other engineers' benches) may not give: the best of up to 3 attempts
    tries = []
    with EmulatedCluster(hosts=3, rate_mbit=rate, prefix=PREFIX) as c:
        while len(tries) < 3 and (not tries or max(m for m, _ in tries) < 0.85 * rate):
            tries.append(once(c))
    mbit, recs = max(tries, key=lambda t: t[0])
    print(f"\n[cluster] {pattern}: 2 flows x {size / 1e6:.0f} MB through one {rate} Mbit/s "
          f"link: aggregate {mbit:.1f} Mbit/s ({mbit / rate - 1:+.1%}; {len(tries)} attempt(s))")
    assert all(m <= 1.15 * rate for m, _ in tries), tries    # unshaped, two flows would give ~2x
    assert mbit >= 0.85 * rate, tries


@needs_netns
def test_per_host_rates_one_slow_link() -> None:
    """``rate_mbit=[200, 100]``: host1's link is shaped at its own rate (a slowed host's link):
    a bulk transfer host0 -> host1 runs at host1's 100 Mbit/s, and the qdiscs say so."""
    size = 2_500_000
    with EmulatedCluster(hosts=2, rate_mbit=[200, 100], prefix=PREFIX) as c:
        qd = [subprocess.run(["tc", "-n", c.netns(i), "qdisc", "show", "dev", "eth0"], capture_output=True,
                             text=True).stdout for i in range(2)]
        # the link's rate is the fastest of up to 3 transfers: on a loaded machine (a CI run beside other
        # engineers' benches) a starved sender measured below the 100 Mbit/s the link allows
        rec = _bulk_transfer(c, 0, 1, size)
        for _ in range(2):
            if rec["mbit"] >= 80:
                break
            again = _bulk_transfer(c, 0, 1, size)
            rec = again if again["mbit"] > rec["mbit"] else rec
        assert c.tbf is None and [t["rate_mbit"] for t in c.tbfs] == [200, 100]
    assert "rate 200Mbit" in qd[0] and "rate 100Mbit" in qd[1], qd
    mbit = rec["mbit"]
    print(f"\n[cluster] host0 (200 Mbit/s) -> host1 (100 Mbit/s): {mbit:.1f} Mbit/s")
    assert rec["bytes"] == size and 0.8 * 100 <= mbit <= 1.1 * 100, rec


# ---------------------------------------------------------------------------
# (c) cleanup
# ---------------------------------------------------------------------------
def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", out, re.M)}


@needs_netns
def test_cleanup_normal_and_on_exception() -> None:
    links_before = _root_links()
    with EmulatedCluster(hosts=3, rate_mbit=100, prefix=PREFIX) as c:
        assert sorted(_ours(c.name)) == sorted([c.bridge_ns, *c.host_ns])
    assert _ours(c.name) == []

    sleeper = None
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(hosts=2, rate_mbit=100, prefix=PREFIX) as c2:
            sleeper = c2.run(1, ["sleep", "60"])
            assert len(_ours(c2.name)) == 3
            raise RuntimeError("boom")
    assert _ours(c2.name) == []
    assert sleeper is not None and sleeper.poll() is not None   # process was stopped
    # nothing was ever created in the root namespace
    new = _root_links() - links_before
    assert not [n for n in new if n.startswith(PREFIX) or re.fullmatch(r"h\d+|br0", n)], new
    c2.close()   # idempotent


@needs_netns
def test_cleanup_stale_removes_only_dead_runs() -> None:
    dead = subprocess.Popen(["true"]); dead.wait()           # a pid that no longer exists
    stale = f"{PREFIX}-{dead.pid}-0-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        subprocess.run(["ip", "-n", stale, "link", "add", "br0", "type", "bridge"], check=True)
        with EmulatedCluster(hosts=1, prefix=PREFIX) as live:
            removed = cleanup_stale(PREFIX)
            assert stale in removed
            assert stale not in list_namespaces()
            assert len(_ours(live.name)) == 2              # live cluster untouched
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


_KILLED_BENCH = """
import sys, time
from dpro_kit.cluster import EmulatedCluster
from dpro_kit.jobs import CpuBudget, cgroup_cpu_root
c = EmulatedCluster(hosts=1, rate_mbit=100, prefix=sys.argv[1])   # a bench that never reaches its close()
b = CpuBudget(1, 0.5, prefix=sys.argv[1]) if cgroup_cpu_root() is not None else None
print(c.name, b.parent if b else "", flush=True)
time.sleep(120)
"""


@needs_netns
def test_killed_bench_removes_its_namespaces_and_cgroups() -> None:
    """`kill PID` of a bench (SIGTERM) still deletes the namespaces and cgroups it made: Python's
    default SIGTERM ends the process without atexit; dpro_kit.errors.exit_on_sigterm makes it unwind."""
    import os
    import signal
    from pathlib import Path
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BENCH, PREFIX], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        name, *group = proc.stdout.readline().split()
        assert len(_ours(name)) == 2
        if group:
            assert Path(group[0]).is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert _ours(name) == []
        if group:
            assert not Path(group[0]).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup_stale(PREFIX)


# ---------------------------------------------------------------------------
# (d) real gloo all_reduce across two hosts
# ---------------------------------------------------------------------------
@needs_netns
def test_gloo_allreduce_time_follows_link_rate() -> None:
    nbytes, iters = 4 * 1024 * 1024, 3
    env = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    results: dict[object, float] = {}
    for rate in (100, 200, None):
        with EmulatedCluster(hosts=2, rate_mbit=rate, prefix=PREFIX) as c:
            procs = c.run_all([PY, "-c", ALLREDUCE, str(nbytes), str(iters)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            recs = [json.loads(_finish(p, timeout=60)[0].strip().splitlines()[-1]) for p in procs]
        assert {r["rank"] for r in recs} == {0, 1} and all(r["iface"] == "eth0" for r in recs)
        # the fastest of the iterations: the link bounds it from below whatever the load, while a
        # median on the shared 2-core machine carried other jobs' stalls past the upper bound (load 8.7)
        t = min(max(r["times"][k] for r in recs) for k in range(iters))
        results[rate] = t
        if rate is None:
            print(f"\n[cluster] gloo all_reduce {nbytes / 2**20:.0f} MiB, 2 hosts, unshaped: "
                  f"{t * 1e3:.1f} ms")
            continue
        # ring/bcube allreduce on 2 ranks: each host sends S/2 (reduce-scatter)
        # + S/2 (all-gather) = S bytes per direction -> time >= S*8/rate.
        bound = nbytes * 8 / (rate * 1e6)
        print(f"\n[cluster] gloo all_reduce {nbytes / 2**20:.0f} MiB, 2 hosts, {rate} Mbit/s: "
              f"{t * 1e3:.1f} ms (S*8/rate = {bound * 1e3:.1f} ms, ratio {t / bound:.2f}, "
              f"effective {nbytes * 8 / t / 1e6:.1f} Mbit/s per direction)")
        assert t >= 0.9 * bound, (t, bound)
        assert t <= 2.0 * bound, (t, bound)
    assert results[None] < 0.5 * results[200]


# ---------------------------------------------------------------------------
# errors (no root needed)
# ---------------------------------------------------------------------------
def test_not_root_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl.os, "geteuid", lambda: 1000)
    with pytest.raises(DproError, match="needs root"):
        EmulatedCluster(hosts=2)


def test_missing_tc_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cl.shutil, "which", lambda tool: None if tool == "tc" else "/bin/" + tool)
    with pytest.raises(DproError, match="iproute2"):
        EmulatedCluster(hosts=2)


def test_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl, "check_prerequisites", lambda: None)   # nothing is created
    for kwargs, msg in [({"hosts": 0}, "positive"), ({"subnet": "8.8.8.0/24"}, "private"),
                        ({"subnet": "10.213.0.0/30", "hosts": 3}, "room for 2"),
                        ({"rate_mbit": 0}, "rate_mbit"), ({"prefix": "a-b"}, "prefix")]:
        with pytest.raises(DproError, match=msg):
            EmulatedCluster(**kwargs)


@needs_netns
def test_dpro_cluster_runs_one_command_per_host_and_passes_exit_codes(tmp_path):
    """`dpro cluster` (the one command line of the emulated cluster): per-host variables and {i}
    substitution, the first failing host's exit code, namespaces removed afterwards."""
    prefix = "dpclitst"
    code = ("import os, sys; open(sys.argv[1] + '/h' + os.environ['HOST_RANK'], 'w').write("
            "os.environ['DPRO_HOST'] + ' ' + os.environ['RANK'] + ' ' + os.environ['WORLD_SIZE']); "
            "sys.exit(int(sys.argv[2]))")
    r = subprocess.run([sys.executable, "-m", "dpro_kit", "cluster", "--hosts", "2", "--rate-mbit", "100",
                        "--prefix", prefix, "--", sys.executable, "-c", code, str(tmp_path), "{i}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "host1 exited with 1" in r.stderr, r.stderr
    assert (tmp_path / "h0").read_text() == "host0 0 2" and (tmp_path / "h1").read_text() == "host1 1 2"
    assert not [n for n in list_namespaces() if n.startswith(prefix)]
    r = subprocess.run([sys.executable, "-m", "dpro_kit", "cluster", "--prefix", prefix],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("dpro: error: no command given")
