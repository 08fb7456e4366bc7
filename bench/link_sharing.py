"""How TCP flows really share one shaped link of the emulated cluster (docs/async.md, "Link sharing").

The asynchronous-PS model (dpro_kit/async_ps.py, seed 004 §3.1) shares a link equally among the
transfers active on it. This bench measures what the emulated cluster's links (dpro_kit.cluster:
a tbf shaper per host and direction, 20 ms queue) really do with the traffic of a parameter server:
host 0 is the "PS", hosts 1..k are "workers", each with one persistent TCP connection to the PS
(like gRPC's channel), idle between transfers as in training. Transfers are ``--mb`` MB messages:
``down`` = PS -> worker (the PS's upload shaper is the shared queue), ``up`` = worker -> PS (the
fan-in at the PS's download shaper).

Experiments, per bandwidth (each repeated ``--reps`` times, the first repetition left out):

* ``alone``: one transfer, nothing else on the link: T1 = its duration (the calibration).
* ``newcomer f``: worker 1 starts a transfer at 0, worker 2 the same at ``f * T1``. Equal sharing
  predicts worker 1 ends at ``f*T1 + 2(1-f)*T1 = (2-f)*T1``; first-come-first-served predicts T1.
  The newcomer's share while both are active, from worker 1's end ``e1``:
  ``phi = 1 - (1-f)*T1 / (e1 - f*T1)`` (0 = FIFO, 1/2 = equal).
* ``together k``: k workers start at once: aggregate goodput k*S / (last end) relative to one
  transfer alone (per-flow goodput loss when k flows share), and the spread of the k ends.
* ``reverse``: worker 1 downloads while worker 2 uploads (the two directions of the PS link; ACKs of
  one cross the other's queue).
* ``reverse2 f``: workers 2 and 3 upload at once from 0 (together twice a worker link's rate into the
  PS's download, whose queue then stays full), worker 1 downloads from ``f * T1``: its duration over T1
  (down) is what an oversubscribed fan-in does to a download whose acknowledgements cross it
  (docs/async.md, "Reverse-path queueing"; ``--only-reverse2`` runs just this and ``alone``).
* ``reverse2u f``: the mirror image: workers 2 and 3 download at once from 0 (two flows into the PS's
  upload shaper), worker 1 uploads from ``f * T1``: its duration over T1 (up). The equal-window rule
  (``dpro async-predict --reverse-path window``) predicts the same slowdown as ``reverse2``.
* ``ping``: worker 1 makes a 64-byte request-response every 5 ms while worker 2 moves its bytes in one
  direction: how long a small message (an RPC, a step's dispatch) waits behind bulk data.

    sudo bench/quietrun.sh python bench/link_sharing.py --bandwidths 100,300 --out /tmp/link.json

Prints a table and writes every transfer's times (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PORT = 24567
CLIENT = "_client"     # "_client_grpc" with --transport grpc
STARTUP_S = 1.0       # the clients start their schedules this long after they are launched
HDR = struct.Struct("!cQ")
BUF = 1 << 16


def _recv_exact(s: socket.socket, n: int, buf: bytearray) -> None:
    view = memoryview(buf)
    while n > 0:
        got = s.recv_into(view[:min(n, len(buf))])
        if not got:
            raise ConnectionError("peer closed")
        n -= got


def serve() -> None:
    """The PS: per connection, ``G n`` -> send n bytes; ``P n`` + n bytes -> one byte back."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", PORT))
    ls.listen(16)
    payload = bytes(BUF)

    def handle(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(BUF)
        try:
            while True:
                h = bytearray(HDR.size)
                _recv_exact(c, HDR.size, h)
                op, n = HDR.unpack(h)
                if op == b"G":
                    while n > 0:
                        k = c.send(payload[:min(n, BUF)])
                        n -= k
                else:
                    _recv_exact(c, n, buf)
                    c.sendall(b"k")
        except (ConnectionError, OSError):
            c.close()

    print("ready", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def serve_grpc() -> None:
    """The PS over gRPC (TensorFlow's transport: HTTP/2 streams, flow control, BDP probing): unary
    ``/link/G`` (8-byte size -> that many bytes) and ``/link/P`` (bytes -> one byte)."""
    from concurrent import futures

    import grpc
    payload = bytes(8 << 20)

    def get(req: bytes, ctx) -> bytes:
        return payload[:struct.unpack("!Q", req)[0]]

    def put(req: bytes, ctx) -> bytes:
        return b"k"
    h = grpc.method_handlers_generic_handler("link", {"G": grpc.unary_unary_rpc_method_handler(get),
                                                      "P": grpc.unary_unary_rpc_method_handler(put)})
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=opts)
    srv.add_generic_rpc_handlers((h,))
    srv.add_insecure_port(f"0.0.0.0:{PORT}")
    srv.start()
    print("ready", flush=True)
    srv.wait_for_termination()


def client_grpc(server: str, schedule: str) -> None:
    """:func:`client` over one gRPC channel (as TensorFlow keeps one per worker and PS)."""
    import grpc
    items = json.loads(schedule)
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    ch = grpc.insecure_channel(f"{server}:{PORT}", options=opts)
    get, put = ch.unary_unary("/link/G"), ch.unary_unary("/link/P")
    get(struct.pack("!Q", 1))
    payload, out = bytes(8 << 20), []
    for t, op, n in items:
        while (d := t - time.monotonic()) > 0:
            time.sleep(min(d, 0.05) if d > 0.002 else 0)
        t0 = time.monotonic()
        if op == "down":
            get(struct.pack("!Q", n))
        else:
            put(payload[:n])
        out.append([op, t0, time.monotonic()])
    ch.close()
    print(json.dumps(out), flush=True)


def client(server: str, schedule: str) -> None:
    """Run ``[[t_monotonic, op, bytes], ...]`` on one connection; print ``[[op, start, end], ...]``."""
    items = json.loads(schedule)
    s = socket.create_connection((server, PORT))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, buf, out = bytes(BUF), bytearray(BUF), []
    for t, op, n in items:
        while (d := t - time.monotonic()) > 0:
            time.sleep(min(d, 0.05) if d > 0.002 else 0)
        t0 = time.monotonic()
        s.sendall(HDR.pack(b"G" if op == "down" else b"P", n))
        if op == "down":
            _recv_exact(s, n, buf)
        else:
            left = n
            while left > 0:
                left -= s.send(payload[:min(left, BUF)])
            _recv_exact(s, 1, buf)
        out.append([op, t0, time.monotonic()])
    s.close()
    print(json.dumps(out), flush=True)


def run_schedules(c, schedules: dict[int, list]) -> dict[int, list]:
    """Start one client per host with its schedule (absolute monotonic times); their records."""
    procs = {h: c.run(h, [sys.executable, __file__, CLIENT, c.host_ip(0), json.dumps(s)],
                      stdout=subprocess.PIPE, text=True) for h, s in schedules.items()}
    out = {}
    for h, p in procs.items():
        o, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"client on host {h} failed ({p.returncode})")
        out[h] = json.loads(o.strip().splitlines()[-1])
    return out


def experiment(c, kind: str, starts: dict[int, tuple[str, float]], size: int, t1: float, reps: int) -> list[dict]:
    """``starts``: host -> (direction, offset in s within a repetition). Repetitions ``period`` apart."""
    k = len(starts)
    period = max(2.5, k + 1.5) * t1 + max(o for _, o in starts.values())
    t0 = time.monotonic() + STARTUP_S     # the clients' start-up
    sched = {h: [[t0 + r * period + off, d, size] for r in range(reps)] for h, (d, off) in starts.items()}
    recs = run_schedules(c, sched)
    rows = []
    for r in range(1, reps):        # the first repetition opens the connections' windows: left out
        base = t0 + r * period
        rows.append({h: [recs[h][r][1] - base, recs[h][r][2] - base] for h in starts})
    return rows


def ping_under_load(c, direction: str, size: int, t1: float, reps: int, every: float = 0.005) -> list[dict]:
    """Worker 1 sends a small request (64 B back) every ``every`` s while worker 2 moves ``size`` bytes in
    ``direction``: the round trips that start and end inside the bulk transfer, and ones on the idle link."""
    period = 2.5 * t1
    t0 = time.monotonic() + STARTUP_S
    n = int(period / every) - 1
    sched = {1: [[t0 + r * period + j * every, "down", 64] for r in range(reps) for j in range(n)],
             2: [[t0 + r * period + 0.2 * t1, direction, size] for r in range(reps)]}
    recs = run_schedules(c, sched)
    rows = []
    for r in range(1, reps):
        b0, b1 = recs[2][r][1], recs[2][r][2]
        small = recs[1][r * n:(r + 1) * n]
        rows.append({"busy": [e - s for _, s, e in small if s > b0 + 0.01 and e < b1],
                     "idle": [e - s for _, s, e in small if e < b0 or s > b1 + 0.05]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default="100,300")
    ap.add_argument("--mb", type=float, default=2.0, help="bytes of one transfer, MB (the job moves 2.12 MB each way)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--only-ping", action="store_true", help="only the alone and ping experiments")
    ap.add_argument("--only-reverse2", action="store_true", help="only the alone and reverse2 experiments")
    ap.add_argument("--transport", choices=["tcp", "grpc"], default="tcp",
                    help="one TCP socket per worker (default), or one gRPC channel per worker with unary calls "
                         "(TensorFlow's transport: HTTP/2 flow control on top of TCP)")
    ap.add_argument("--prefix", default="lnk")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from dpro_kit.cluster import EmulatedCluster
    size = int(args.mb * 1e6)
    global CLIENT, STARTUP_S
    CLIENT = "_client_grpc" if args.transport == "grpc" else "_client"
    STARTUP_S = 4.0 if args.transport == "grpc" else 1.0     # importing grpc takes a while on a busy machine
    doc: dict = {"mb": args.mb, "reps": args.reps, "transport": args.transport, "results": {}}
    for b in [float(x) for x in args.bandwidths.split(",")]:
        res: dict = {}
        with EmulatedCluster(1 + args.max_k, rate_mbit=b, prefix=args.prefix) as c:
            srv = c.run(0, [sys.executable, __file__, "_serve_grpc" if args.transport == "grpc" else "_serve"],
                        stdout=subprocess.PIPE, text=True)
            srv.stdout.readline()
            t1 = {}
            for d in ("down", "up"):
                rows = experiment(c, "alone", {1: (d, 0.0)}, size, 8 * size / (b * 1e6), args.reps)
                t1[d] = statistics.median(r[1][1] for r in rows)
                res[f"alone {d}"] = rows
            quick = args.only_ping or args.only_reverse2
            for d in ("down", "up") if not quick else ():
                for f in (0.25, 0.5, 0.75):
                    res[f"newcomer {d} {f:g}"] = experiment(c, "newcomer", {1: (d, 0.0), 2: (d, f * t1[d])},
                                                            size, t1[d], args.reps)
                for k in range(2, args.max_k + 1):
                    res[f"together {d} {k}"] = experiment(c, "together", {h: (d, 0.0) for h in range(1, k + 1)},
                                                          size, t1[d], args.reps)
            if args.max_k >= 3:
                for f in (0.25, 0.5):
                    res[f"reverse2 {f:g}"] = [] if args.only_ping else experiment(
                        c, "reverse2", {1: ("down", f * t1["up"]), 2: ("up", 0.0), 3: ("up", 0.0)}, size, t1["up"], args.reps)
                    res[f"reverse2u {f:g}"] = [] if args.only_ping else experiment(
                        c, "reverse2u", {1: ("up", f * t1["down"]), 2: ("down", 0.0), 3: ("down", 0.0)}, size, t1["down"],
                        args.reps)
            res["reverse"] = [] if quick else experiment(c, "reverse", {1: ("down", 0.0), 2: ("up", 0.0)}, size,
                                        max(t1.values()), args.reps)
            ping = {d: ping_under_load(c, d, size, t1[d], args.reps) for d in ("down", "up")} if not args.only_reverse2 else {}
            srv.kill()
        doc["results"][f"{b:g}"] = {"t1": t1, "rows": res, "ping": ping}
        print(f"\n## {b:g} Mbit/s, {args.mb:g} MB transfers: alone down {t1['down'] * 1e3:.1f} ms "
              f"({8 * size / t1['down'] / 1e6:.1f} Mbit/s goodput), up {t1['up'] * 1e3:.1f} ms "
              f"({8 * size / t1['up'] / 1e6:.1f} Mbit/s)")
        print("| experiment | worker ends / T1 (median over reps) | equal sharing | FIFO | derived |")
        print("|---|---|---|---|---|")
        for name, rows in res.items():
            if name.startswith("alone") or not rows:
                continue
            d = name.split()[1] if not name.startswith("reverse") else "down"
            if name.startswith("reverse2"):
                one, two = ("up", "down") if name.startswith("reverse2u") else ("down", "up")
                f = float(name.split()[1])
                slow = [(r[1][1] - r[1][0]) / t1[one] for r in rows]
                # the equal-window rule: 1/2 of the link while the other two run (f T1 .. 2 T1), then all of it:
                # (2 - f)/2 of the work by 2 T1, the rest alone, so its duration is (2 - f) + 1 - (2 - f)/2 = 2 - f/2
                rule = 2 - f / 2
                print(f"| {name} ({one} while 2 {two}) | {statistics.median(slow):.2f} ({min(slow):.2f} .. {max(slow):.2f}) "
                      f"({one}load / its T1) | 1 | 1 | {one}load rate / alone = {1 / statistics.median(slow):.2f}; "
                      f"equal-window rule {rule:.3f} |")
                continue
            ends = {h: statistics.median(r[h][1] for r in rows) / t1[d] for h in rows[0]}
            e = ", ".join(f"{v:.2f}" for v in ends.values())
            if name.startswith("newcomer"):
                f = float(name.split()[2])
                phis = [1 - (1 - f) * t1[d] / (r[1][1] - f * t1[d]) for r in rows]
                extra = f"phi = {statistics.median(phis):.2f} ({min(phis):.2f} .. {max(phis):.2f})"
                print(f"| {name} | {e} | {2 - f:.2f}, 2.00 | 1.00, 2.00 | {extra} |")
            elif name.startswith("together"):
                k = int(name.split()[2])
                agg = [k * t1[d] / max(r[h][1] for h in r) for r in rows]
                extra = f"aggregate goodput / alone = {statistics.median(agg):.3f} ({min(agg):.3f} .. {max(agg):.3f})"
                print(f"| {name} | {e} | all {k:.2f} | 1 .. {k} | {extra} |")
            else:
                e2 = statistics.median(r[2][1] for r in rows) / t1["up"]
                print(f"| reverse (down, up) | {ends[1]:.2f}, {e2:.2f} (each / its own T1) | 1, 1 | 1, 1 | |")
        for d, rows in ping.items():
            busy = [x for r in rows for x in r["busy"]]
            idle = [x for r in rows for x in r["idle"]]
            if busy and idle:
                print(f"| ping (64 B request-response) during a bulk {d} | | | | round trip median "
                      f"{statistics.median(busy) * 1e3:.1f} ms (p90 {sorted(busy)[int(0.9 * len(busy))] * 1e3:.1f}), "
                      f"idle link {statistics.median(idle) * 1e3:.2f} ms |")
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve()
    elif len(sys.argv) > 1 and sys.argv[1] == "_client":
        client(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "_serve_grpc":
        serve_grpc()
    elif len(sys.argv) > 1 and sys.argv[1] == "_client_grpc":
        client_grpc(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
