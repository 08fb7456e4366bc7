"""Run ps-lite's own benchmark (``tests/test_benchmark``, built by patches/ps-lite/build.sh) on emulated hosts.

Host 0 runs the scheduler and server 0, hosts 1..S-1 one server each, the next W hosts one
worker each (``dpro_kit.cluster.EmulatedCluster``: a network namespace per host, a tbf rate
limit per host link); every process gets ``DMLC_ROLE``, ``DMLC_PS_ROOT_URI/PORT`` (host 0),
``DMLC_NUM_WORKER/SERVER``, ``DMLC_INTERFACE`` (the host's interface) and, with ``--trace``,
``DPRO_PSLITE_TRACE`` (the patch's output folder).  The benchmark (``PUSH_PULL`` mode) pushes
and pulls ``NUM_KEY_PER_SERVER x S`` keys of ``--len`` bytes per round and logs its goodput
after every round (``LOG_DURATION=1``); the round time is read back from that line::

    Application goodput: G Gbps. count = N      # G = 8 * len * keys / round ns

    python tools/pslite_job.py --trace /tmp/pslite-trace --workers 2 --rate-mbit 200
    dpro replay /tmp/pslite-trace
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOODPUT = re.compile(r"Application goodput: ([0-9.eE+-]+) Gbps\. count = (\d+)")
__all__ = ["build", "run", "main"]


def build(python: str = sys.executable) -> Path:
    """The patched ``test_benchmark`` (patches/ps-lite/build.sh: cached after the first build).

    Raises
    ------
    RuntimeError
        The build script failed or may not build (``DPRO_PSLITE_BUILD=0``, exit 3); its last
        stderr line says why.
    """
    r = subprocess.run(["bash", str(REPO / "patches/ps-lite/build.sh"), python], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"patches/ps-lite/build.sh exited {r.returncode}: {last}")
    return Path(r.stdout.strip().splitlines()[-1]) / "tests/test_benchmark"


def run(binary: Path, *, trace: Path | None, workers: int = 2, servers: int = 1, rate_mbit: float | None = 200,
        length: int = 256000, keys_per_server: int = 4, rounds: int = 12, port: int = 9300, prefix: str = "psl",
        timeout: float = 180.0, log_dir: Path | None = None) -> dict[str, Any]:
    """Run one job; return each worker host's round times (ms, from its goodput lines) and the settings.

    Parameters
    ----------
    binary : Path
        ``test_benchmark`` (:func:`build`).
    trace : Path or None
        ``DPRO_PSLITE_TRACE`` folder (created), or None for an untraced run.
    workers, servers : int
        Processes of each role, one per emulated host.
    rate_mbit : float or None
        Per-host link rate (tbf, both directions); None: unshaped veth links.
    length, keys_per_server, rounds : int
        The benchmark's message size (bytes), ``NUM_KEY_PER_SERVER`` and rounds.
    port, prefix : int, str
        Scheduler port; namespace name prefix.
    timeout : float
        Seconds before the job is killed (then RuntimeError).
    log_dir : Path or None
        Where each process's output goes (default: a temporary folder).
    """
    from dpro_kit.cluster import EmulatedCluster

    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pslite-job-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if trace is not None:
        Path(trace).mkdir(parents=True, exist_ok=True)
    with EmulatedCluster(hosts=servers + workers, rate_mbit=rate_mbit, prefix=prefix) as c:
        base = {"DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": str(servers),
                "DMLC_PS_ROOT_URI": c.host_ip(0), "DMLC_PS_ROOT_PORT": str(port),
                "NUM_KEY_PER_SERVER": str(keys_per_server), "LOG_DURATION": "1"}
        if trace is not None:
            base["DPRO_PSLITE_TRACE"] = str(trace)
        roles = [(0, "scheduler")] + [(h, "server") for h in range(servers)] + \
                [(servers + w, "worker") for w in range(workers)]
        procs = []
        for k, (h, role) in enumerate(roles):
            out = open(log_dir / f"{k}-{role}-host{h}.log", "w")
            env = {**base, "DMLC_ROLE": role, "DMLC_INTERFACE": c.iface(h)}
            procs.append((role, f"host{h}", out.name, c.run(h, [str(binary), str(length), str(rounds), "1"], env=env,
                                                stdout=out, stderr=subprocess.STDOUT)))
        try:
            codes = [p.wait(timeout=timeout) for *_, p in procs]
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ps-lite job did not finish in {timeout:.0f} s; logs in {log_dir}") from None
    if any(codes):
        bad = [(role, host, code, log) for (role, host, log, _), code in zip(procs, codes) if code]
        raise RuntimeError(f"ps-lite processes failed: {bad}")
    per_worker = {}
    nbits = 8.0 * length * keys_per_server * servers
    for role, host, log, _ in procs:
        if role == "worker":
            per_worker[host] = [nbits / float(g) / 1e6 for g, _ in GOODPUT.findall(Path(log).read_text())]
    return {"round_ms": per_worker, "length": length, "keys": keys_per_server * servers, "rounds": rounds,
            "workers": workers, "servers": servers, "rate_mbit": rate_mbit, "logs": str(log_dir)}


def main(argv: list[str] | None = None) -> int:
    """Command line: run one job, print the per-worker median round time (ms) as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=None, help="DPRO_PSLITE_TRACE folder (none: untraced)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--rate-mbit", type=float, default=200)
    ap.add_argument("--len", dest="length", type=int, default=256000)
    ap.add_argument("--keys-per-server", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args(argv)
    res = run(build(), trace=a.trace, workers=a.workers, servers=a.servers, rate_mbit=a.rate_mbit,
              length=a.length, keys_per_server=a.keys_per_server, rounds=a.rounds)
    res["median_round_ms"] = {h: statistics.median(r) if r else None for h, r in res["round_ms"].items()}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
