"""Run one Horovod rank per (emulated) host, without ``horovodrun``'s ssh::

    python -m dpro_torch.hvd_launch [--hosts N --host-rank I --addr A --port P --iface IF] -- python train.py ...

One process per host, as :func:`dpro_kit.jobs.run_job` starts them: the values default to
its variables (``NHOSTS``, ``HOST_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``GLOO_SOCKET_IFNAME``).  Host 0 also runs Horovod's gloo rendezvous server (the HTTP
store ``horovodrun`` would run) on ``ADDR:PORT``; every host then runs the command as rank
``I`` of ``N`` with Horovod's gloo variables (``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_GLOO_RENDEZVOUS_ADDR`` ...), one rank per host (host names ``host<i>``), and
exits with its exit code.  Under ``dpro profile`` the rank is profiled like any other (the
ranks agree on one run id through this rendezvous server: :func:`dpro_torch.hvd.agree_run_id`).

``--plan plan.json`` (a ``dpro optimize`` plan of a Horovod trace) sets the plan's
``HOROVOD_FUSION_THRESHOLD`` and ``HOROVOD_CYCLE_TIME`` for the rank (:func:`plan_env`).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys


def rank_env(rank: int, size: int, addr: str, port: int, iface: str) -> dict[str, str]:
    """Horovod's gloo launch variables for rank ``rank`` of ``size``, one rank per host."""
    return {"HOROVOD_HOSTNAME": f"host{rank}", "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(rank),
            "HOROVOD_CROSS_SIZE": str(size), "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface}


def plan_env(path: str) -> dict[str, str]:
    """``HOROVOD_FUSION_THRESHOLD`` / ``HOROVOD_CYCLE_TIME`` of a ``dpro optimize`` plan (its
    ``frameworks.horovod`` section); raises ValueError with one line saying what is wrong."""
    import json
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the plan ({exc})") from None
    hv = ((doc.get("frameworks") or {}).get("horovod") if isinstance(doc, dict) else None) or {}
    if not isinstance(doc, dict) or doc.get("format") != "dpro-plan":
        raise ValueError(f"{path}: not a dpro optimize plan (format is not 'dpro-plan')")
    t, c = hv.get("HOROVOD_FUSION_THRESHOLD"), hv.get("HOROVOD_CYCLE_TIME")
    if isinstance(t, bool) or not isinstance(t, int) or t < 0 or isinstance(c, bool) \
            or not isinstance(c, (int, float)) or not c > 0:
        raise ValueError(f"{path}: frameworks.horovod needs HOROVOD_FUSION_THRESHOLD (bytes >= 0) and "
                         f"HOROVOD_CYCLE_TIME (ms > 0), got {t!r} / {c!r}; run dpro optimize on a Horovod trace")
    return {"HOROVOD_FUSION_THRESHOLD": str(t), "HOROVOD_CYCLE_TIME": f"{float(c):g}"}


def start_rendezvous(size: int, addr: str, port: int):
    """Horovod's gloo rendezvous HTTP server for ``size`` hosts of one slot each, on ``addr:port``."""
    import threading
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    httpd = RendezvousHTTPServer((addr, port), RendezvousHandler, 0)
    httpd.init(get_host_assignments(parse_hosts(",".join(f"host{i}:1" for i in range(size))), size))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=int(os.environ.get("NHOSTS", "1")))
    ap.add_argument("--host-rank", type=int, default=int(os.environ.get("HOST_RANK", "0")))
    ap.add_argument("--addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", "29500")))
    ap.add_argument("--iface", default=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    ap.add_argument("--plan", default="", help="set the Horovod knobs of this dpro optimize plan (plan.json)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command to run after --")
    knobs = {}
    if args.plan:
        try:
            knobs = plan_env(args.plan)
        except ValueError as exc:
            print(f"hvd_launch: {exc}", file=sys.stderr)
            return 2
    server = start_rendezvous(args.hosts, args.addr, args.port) if args.host_rank == 0 else None
    env = dict(os.environ, **rank_env(args.host_rank, args.hosts, args.addr, args.port, args.iface), **knobs)
    try:
        return subprocess.call(cmd, env=env)
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
