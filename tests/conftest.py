"""Shared fixtures: small traces written through the public trace model (hand-built, documented)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpro_kit.trace import Collective, Manifest, NodeInfo, TraceSet, make_events, save_trace

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "ddp" / "train.py"


def shared_traces() -> Path:
    """The read-only third-party traces (``../shared/traces`` beside the checkout, see its README).

    Looked up in order: ``$DPRO_SHARED_TRACES``; ``<repo>/../shared/traces``; for a clone (CI
    runs the suite on a clean clone somewhere else) ``<origin>/../shared/traces`` where
    ``<origin>`` is the local path the clone came from.  Returns the first that exists, else
    the second (so a skip reason names the expected place).
    """
    repo = Path(__file__).resolve().parents[1]
    default = repo.parent / "shared" / "traces"
    candidates = [Path(os.environ["DPRO_SHARED_TRACES"])] if os.environ.get("DPRO_SHARED_TRACES") else []
    candidates.append(default)
    try:
        origin = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared" / "traces")
    return next((c for c in candidates if c.is_dir()), default)


def profile_ddp(out: Path, *options: str, steps: str, train: list[str], timeout: float = 240) -> Path:
    """Run a real 2-rank ``examples/ddp/train.py`` job under ``dpro profile OPTIONS`` into ``out``.

    ``train``: the script's arguments after ``--nproc 2 --quiet``.  Fails the test
    (with the job's stderr) on a non-zero exit; returns ``out``.
    """
    cmd = [sys.executable, "-m", "dpro_kit.cli", "profile", *options, "--out", str(out), "--steps", steps,
           "--", sys.executable, str(TRAIN), "--nproc", "2", "--quiet", *train]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def tiny_traceset(workers: int = 2, iterations: int = 3, layers: int = 3, hosts: int | None = None,
                  bucket_bytes: int = 4_000_000) -> TraceSet:
    """A hand-built data-parallel job in the canonical model (not recorded from a real run).

    Per worker and iteration: FW l0..l{L-1}, BW l{L-1}..l0, one COMM event per
    bucket and one UPDATE.  Two buckets: the gradients of the last layer, and the rest.
    Durations vary a little across iterations so that means are exercised.
    """
    hosts = hosts or workers
    nodes = {f"w{r}": NodeInfo(host=f"h{r % hosts}", role="worker", rank=r) for r in range(workers)}
    manifest = Manifest(job="tiny", framework="synthetic", comm_backend="ring", world_size=workers, nodes=nodes,
                        iterations=list(range(iterations)))
    records, edges = [], {}
    for w in nodes:
        t = 0.0
        for it in range(iterations):
            jitter = 1.0 + 0.1 * ((it % 3) - 1)
            ops = [(f"fw{l}", "FW", 100.0 * (l + 1)) for l in range(layers)]
            ops += [(f"bw{l}", "BW", 200.0 * (l + 1)) for l in reversed(range(layers))]
            for op, kind, d in ops:
                records.append({"node": w, "op": op, "kind": kind, "iteration": it, "start": t, "dur": d * jitter})
                t += d * jitter
            for b in range(2):
                records.append({"node": w, "op": f"allreduce_b{b}", "kind": "COMM", "iteration": it, "start": t,
                                "dur": 900.0 * jitter, "tensor": f"bucket{b}", "bytes": bucket_bytes // (b + 1),
                                "stream": "comm"})
            records.append({"node": w, "op": "update", "kind": "UPDATE", "iteration": it, "start": t + 1000,
                            "dur": 50.0})
            t += 2000
        chain = [f"fw{l}" for l in range(layers)] + [f"bw{l}" for l in reversed(range(layers))]
        edges[w] = list(zip(chain, chain[1:])) + [("bw0", "update")]
    colls = [Collective(tensor="bucket0", op="allreduce", bytes=bucket_bytes, participants=list(nodes),
                        inputs={w: [f"bw{layers - 1}"] for w in nodes}, outputs={w: ["update"] for w in nodes},
                        params=[f"l{layers - 1}.weight"]),
             Collective(tensor="bucket1", op="allreduce", bytes=bucket_bytes // 2, participants=list(nodes),
                        inputs={w: ["bw0"] for w in nodes}, outputs={w: ["update"] for w in nodes},
                        params=[f"l{l}.weight" for l in range(layers - 1)])]
    events = make_events(records)
    events["host"] = events["node"].map({n: i.host for n, i in nodes.items()}).astype("string")
    return TraceSet(manifest=manifest, events=events, edges=edges, collectives=colls)


@pytest.fixture
def tiny_trace_dir(tmp_path: Path) -> Path:
    return save_trace(tiny_traceset(), tmp_path / "trace")


def netns_unusable_reason(prefix: str = "dpkt") -> str | None:
    """Why namespaces can't be used here (None if they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root: network namespaces and tc qdiscs require CAP_NET_ADMIN"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) not installed"
    probe = f"{prefix}probe{os.getpid()}"
    try:
        for argv in (["ip", "netns", "add", probe],
                     ["ip", "-n", probe, "link", "set", "lo", "up"],
                     ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf",
                      "rate", "1mbit", "burst", "32k", "latency", "10ms"]):
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            if cp.returncode != 0:
                return f"`{' '.join(argv)}` unusable here: {cp.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns unusable here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture(scope="session", autouse=True)
def _alignment_cache_of_the_suite(tmp_path_factory):
    """Alignment results are cached under ``$DPRO_CACHE/aligned`` (:func:`dpro_kit.align.cache_dir`),
    one per trace folder: the suite's go to its own temporary folder, not the user's ~/.cache."""
    if "DPRO_CACHE" not in os.environ:
        os.environ["DPRO_CACHE"] = str(tmp_path_factory.mktemp("dpro-cache"))
    yield
