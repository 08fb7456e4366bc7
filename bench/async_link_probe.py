"""What the links and hosts of a real MXNet ``dist_async`` job do at W workers (docs/async.md, issue 13).

A diagnostic for the asynchronous-PS prediction (``dpro async-predict``): runs the real job of
``examples/mxnet/train.py --kvstore dist_async`` (1 server on host 0, W workers, one role per emulated
host, as ``bench/ps_accuracy.py`` does) for every W, unprofiled, and while it runs records

* every shaped device's transmitted bytes about every millisecond (a small sampler inside each
  namespace reads ``/sys/class/net/DEV/statistics/tx_bytes``): the server's ``eth0`` = all pulls
  (PS -> workers, "down"), the bridge port ``h0`` = all pushes (workers -> PS, "up"), and per worker
  its own up (its ``eth0``) and down (bridge port ``hI``);
* the tbf qdiscs' drop counters and every host's TCP counters (``nstat``: retransmitted segments,
  retransmission timeouts, tail-loss probes) at the end of the job;
* every host's CPU cgroup ``cpu.stat`` (CFS periods throttled).

Per W it prints the measured steps/s (sum over workers of 1 / mean step gap after warm-up), the link
utilisation (wire bytes / line rate over the busy window, per direction), the share of 5 ms bins in
which a direction was idle, the drops / retransmissions / timeouts, and, for W = 2, the phase of the two
workers: each worker's push-pull group (start of its push burst to the end of its pull burst, from the
per-worker counters), the offset between the two workers' group starts and ends, and how much of
the time both groups were active.

    sudo bench/quietrun.sh python bench/async_link_probe.py --rate 500 --workers 1,2,4 --out /tmp/probe

Root only (namespaces, tc, cgroups); MXNet 1.9.1 as for bench/ps_accuracy.py.
"""
from __future__ import annotations

import argparse
import bisect
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from dpro_kit.jobs import run_job  # noqa: E402
from ps_accuracy import TRAIN, mxnet_python  # noqa: E402

SAMPLER = r"""
import json, signal, sys, time
dev, out, dur = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows, stop = [], [False]
signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__(0, True))
last, t_end = -1, time.time() + dur
while not stop[0] and time.time() < t_end:
    try:
        with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as fh:
            v = int(fh.read())
    except OSError:
        break
    if v != last:
        rows.append((time.time(), v))
        last = v
    time.sleep(0.0005)
with open(out + ".tmp", "w") as fh:
    json.dump(rows, fh)
import os
os.replace(out + ".tmp", out)
"""
TCP_KEYS = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes")


def _sh(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def _namespaces(prefix: str) -> list[str]:
    return [line.split()[0] for line in _sh(["ip", "netns", "list"]).splitlines() if line.startswith(prefix + "-")]


def _watch(prefix: str, w: int, out: Path, stop: threading.Event, state: dict) -> None:
    """Start the byte samplers once the cluster exists, then keep the last counters until the job ends."""
    started = False
    while not stop.is_set():
        nss = _namespaces(prefix)
        br = [n for n in nss if n.endswith("-br")]
        if not started and br and len(nss) >= w + 2:
            time.sleep(1.0)          # the veths are up before the job's processes start
            base = br[0][:-3]
            for i in range(w + 1):
                for ns, dev, tag in ((br[0], f"h{i}", f"br-h{i}"), (f"{base}-h{i}", "eth0", f"h{i}-eth0")):
                    subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SAMPLER, dev,
                                      str(out / f"bytes-w{w}-{tag}.json"), "600"])
            state["base"] = base
            started = True
        if started:
            snap = state.setdefault("snap", {})     # per namespace, the last reading before it went away
            for ns in _namespaces(prefix):
                tc_now = _sh(["tc", "-n", ns, "-s", "qdisc", "show"])
                if not tc_now:
                    continue
                nst = "" if ns.endswith("-br") else _sh(["ip", "netns", "exec", ns, "nstat", "-az"])
                if "TcpOutSegs" not in nst and ns in snap:
                    nst = snap[ns]["nstat"]
                snap[ns] = {"tc": tc_now, "nstat": nst}
            for g in Path("/sys/fs/cgroup/cpu").glob(prefix + "-*"):
                for h in g.glob("host*"):
                    try:
                        st = dict(line.split() for line in (h / "cpu.stat").read_text().splitlines())
                    except OSError:
                        continue
                    state.setdefault("cpu_first", {}).setdefault(h.name, st)
                    state.setdefault("cpu_last", {})[h.name] = st
        time.sleep(0.5)


def _rates(series: list, t0: float, nb: int, binms: float, full: float) -> list[float]:
    ts = [x[0] for x in series]

    def val(t: float) -> int:
        i = bisect.bisect_right(ts, t) - 1
        return series[max(i, 0)][1] if series else 0
    return [(val(t0 + (b + 1) * binms / 1e3) - val(t0 + b * binms / 1e3)) / full for b in range(nb)]


def _bursts(r: list[float], gap: int, minsum: float) -> list[list[float]]:
    out: list[list[float]] = []
    for b, x in enumerate(r):
        if x > 0.2:
            if out and b - out[-1][1] <= gap:
                out[-1][1] = b
                out[-1][2] += x
            else:
                out.append([b, b, x])
    return [o for o in out if o[2] > minsum]


def analyse(out: Path, w: int, rate: float, state: dict) -> dict:
    binms = 5.0
    full = rate * 1e6 / 8 * binms / 1e3
    load = lambda tag: json.loads((out / f"bytes-w{w}-{tag}.json").read_text())  # noqa: E731
    series = {"down": load("h0-eth0"), "up": load("br-h0")}
    for i in range(1, w + 1):
        series[f"u{i}"], series[f"d{i}"] = load(f"h{i}-eth0"), load(f"br-h{i}")
    t0 = min(s[0][0] for s in series.values() if s)
    t1 = max(s[-1][0] for s in series.values() if s)
    nb = int((t1 - t0) * 1e3 / binms)
    R = {k: _rates(s, t0, nb, binms, full) for k, s in series.items()}
    busy = [b for b in range(nb) if R["down"][b] > 0.2 or R["up"][b] > 0.2]
    lo, hi = busy[0], busy[-1] + 1
    res: dict = {"workers": w}
    for k in ("down", "up"):
        res[f"{k}_utilisation"] = sum(R[k][lo:hi]) / (hi - lo)
        res[f"{k}_idle_bins"] = sum(1 for x in R[k][lo:hi] if x < 0.05) / (hi - lo)
    drops, tcp = 0, {k: 0 for k in TCP_KEYS}
    for ns, v in state.get("snap", {}).items():
        drops += sum(int(m) for m in re.findall(r"dropped (\d+)", v["tc"]))
        for line in v["nstat"].splitlines():
            p = line.split()
            if len(p) >= 2 and p[0] in tcp:
                tcp[p[0]] += int(p[1])
    res["tbf_drops"], res["tcp"] = drops, tcp
    thr = {}
    for h, st in state.get("cpu_last", {}).items():
        a = state["cpu_first"][h]
        periods = int(st["nr_periods"]) - int(a["nr_periods"])
        thr[h] = (int(st["nr_throttled"]) - int(a["nr_throttled"])) / periods if periods else 0.0
    res["cpu_periods_throttled"] = thr
    if w == 2:
        groups = {}
        for i in (1, 2):
            ups, downs = _bursts(R[f"u{i}"], 3, 4 * 5 / binms), _bursts(R[f"d{i}"], 3, 4 * 5 / binms)
            g = []
            for a, b, _ in ups:
                dd = [x for x in downs if a < x[0] < b + 50 / binms]
                if dd:
                    g.append((a * binms, (dd[0][1] + 1) * binms))
            groups[i] = g
        pairs = []
        for a, b in groups[1]:
            c, e = min(groups[2], key=lambda x: abs(x[0] - a))
            pairs.append((c - a, e - b, b - a, e - c))
        both = sum(max(0.0, min(b, e) - max(a, c)) for a, b in groups[1] for c, e in groups[2])
        span = max(x[1] for g in groups.values() for x in g) - min(x[0] for g in groups.values() for x in g)
        res["phase"] = {"pairs_ms": pairs, "both_active_share": both / span if span else 0.0,
                        "group_ms": [p[2] for p in pairs] + [p[3] for p in pairs]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=500.0, help="Mbit/s per host link")
    ap.add_argument("--workers", default="1,2", help="W values, e.g. 1,2,4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cpus-per-host", type=float, default=0.25)
    ap.add_argument("--server-cpus", type=float, default=0.8)
    ap.add_argument("--cpu-period-ms", type=float, default=10.0)
    ap.add_argument("--prefix", default="alp", help="name prefix of the namespaces and cgroups")
    ap.add_argument("--out", type=Path, required=True, help="folder for the samples and the summary (probe.json)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for w in (int(x) for x in args.workers.split(",")):
        prefix = f"{args.prefix}{w}"
        stop, state = threading.Event(), {}
        th = threading.Thread(target=_watch, args=(prefix, w, args.out, stop, state), daemon=True)
        th.start()
        times = args.out / f"times-w{w}-{{w}}.json"
        argv = [mxnet_python(), str(TRAIN), "--kvstore", "dist_async", "--servers", "1", "--workers", str(w),
                "--model", "mlp", "--batch", "64", "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--json-out", str(times)]
        with open(args.out / "jobs.log", "a") as log:
            r = run_job(argv, hosts=1 + w, ranks_per_host=None, rate_mbit=args.rate,
                        cpus_per_host=[args.server_cpus] + [args.cpus_per_host] * w,
                        cpu_period_us=int(args.cpu_period_ms * 1000), log=log, timeout=300, prefix=prefix)
        stop.set()
        th.join()
        time.sleep(1.0)   # the samplers write their files on SIGTERM (the cluster's teardown)
        sps = 0.0
        for k in range(w):
            p = Path(str(times).replace("{w}", str(k)))
            if p.exists():
                g = json.loads(p.read_text())["iteration_ms"]
                sps += 1e3 * len(g) / sum(g)
        try:
            row = analyse(args.out, w, args.rate, state)
        except (OSError, ValueError, IndexError) as exc:
            print(f"W={w}: no samples to analyse ({exc})", file=sys.stderr)
            row = {"workers": w}
        row.update(ok=r.ok, steps_per_s=sps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "probe.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                     "rows": rows}, indent=1))
    print(f"\n| W | steps/s | down / up utilisation | idle 5-ms bins down / up | tbf drops | TCP retrans / out segs | "
          f"RTOs | throttled periods (server; workers) |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "down_utilisation" not in r:
            continue
        thr = r["cpu_periods_throttled"]
        print(f"| {r['workers']} | {r['steps_per_s']:.2f} | {r['down_utilisation']:.2f} / {r['up_utilisation']:.2f} | "
              f"{r['down_idle_bins']:.2f} / {r['up_idle_bins']:.2f} | {r['tbf_drops']} | "
              f"{r['tcp']['TcpRetransSegs']} / {r['tcp']['TcpOutSegs']} | {r['tcp']['TcpExtTCPTimeouts']} | "
              f"{thr.get('host0', 0):.2f}; " + ", ".join(f"{thr[h]:.2f}" for h in sorted(thr) if h != "host0") + " |")
    for r in rows:
        ph = r.get("phase")
        if ph:
            offs = [abs(p[0]) for p in ph["pairs_ms"]]
            print(f"\nW=2: {len(ph['pairs_ms'])} group pairs; both groups active {100 * ph['both_active_share']:.0f} % "
                  f"of the time; |start offset| median {statistics.median(offs):.0f} ms (max {max(offs):.0f}); "
                  f"group duration median {statistics.median(ph['group_ms']):.0f} ms "
                  f"({min(ph['group_ms']):.0f} .. {max(ph['group_ms']):.0f})")
            print("start offset -> end offset (ms): " + ", ".join(f"{p[0]:+.0f}->{p[1]:+.0f}" for p in ph["pairs_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
