#!/usr/bin/env python3
"""Diagnostics behind docs/simulate.md "Where the error comes from" (issue 16): no prediction, measurements only.

``stalls TRACE...``      per profiled iteration of a single-process profile: the sum of its op durations, the sum
                         of every op's median over the iterations, and the ops more than 2 ms above their median
                         (a CPU-budget throttle stall, or a preemption, lands on whichever op is running);
``opcost OP TRACE...``   per trace and rank, the median / mean duration of op OP (e.g. aten::linear) per call: as
                         recorded, with the host gap before it, and as the reader gives it (minus the profiler's
                         cost, measured differently per trace: compare the first two across traces);
``waits TRACE...``       per rank, the host ops by kind and the top OTHER ops per iteration (gloo send/recv waits);
``linear-probe``         per-call ``nn.Linear`` time without the profiler: one batch per iteration vs micro-batches
                         back to back (a GPipe stage), in a CPU-budget group; ``--threads``, ``--cpus`` variants;
``budget-noise``         the single process's iteration times plain vs under ``dpro profile`` (window or not);
``wire STRATEGY``        the real strategy job without the profiler on emulated hosts: per iteration and rank, the
                         bytes its interface sent, TCP retransmits, and every torch.distributed collective the job
                         called (calls, input bytes, wall ms) -- what the compiled graph's collectives should match;
``profile-job STRATEGY`` the real strategy job (examples/strategies/train.py) under ``dpro profile`` on emulated
                         hosts (one rank per host, the bench's CPU budget and period), to compare its ops with the
                         single-process profiles.

    python bench/simulate_diagnostics.py profile-job gpipe-2 --model mlp --rate 1000 --cpus 0.5 --out /tmp/pp
    python bench/simulate_diagnostics.py opcost aten::linear /tmp/pp/trace bench2-mlp/003-mlp-single-prof-b16/trace
    python bench/simulate_diagnostics.py stalls bench2-mlp/001-mlp-single-prof-b64/trace
    python bench/simulate_diagnostics.py wire fsdp-2 --model mlp --rate 200 --pin 0,1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _events(path: str):
    from dpro_kit.session import Session
    ev = Session(path, align=False).profiled.events
    st = ev["stream"].astype(str)
    return ev[(st != "comm") & ~st.str.startswith("gpu")]


def stalls(paths: list[str]) -> None:
    import numpy as np
    for path in paths:
        ev = _events(path)
        for node in sorted(ev["node"].unique()):
            e = ev[ev["node"] == node]
            seqs = []
            for it in sorted(e["iteration"].unique()):
                x = e[e["iteration"] == it].sort_values("start", kind="stable")
                seqs.append((x["name"].astype(str).to_list(), x["dur"].to_numpy(float)))
            n = min(len(q[0]) for q in seqs)
            same = [q for q in seqs if q[0][:n] == seqs[0][0][:n]]
            D = np.array([q[1][:n] for q in same])
            med = np.median(D, axis=0)
            excess = np.clip(D - med, 0, None)
            big = excess > 2000.0
            print(f"{path} {node}: {len(same)} iterations x {n} ops; op sum per iteration "
                  f"{', '.join(f'{v / 1e3:.1f}' for v in D.sum(axis=1))} ms; per-op medians {med.sum() / 1e3:.1f} ms; "
                  f"ops > 2 ms above their median per iteration: {', '.join(str(int(v)) for v in big.sum(axis=1))}, "
                  f"carrying {', '.join(f'{v / 1e3:.1f}' for v in (excess * big).sum(axis=1))} ms")


def opcost(op: str, paths: list[str]) -> None:
    """Per rank: OP's per-call median as recorded (Kineto ``dur``), with the host gap before it folded in, and as
    the reader gives it (gap folded, minus the profiler's per-event cost times the events inside the op), and that
    per-event cost: the reader's correction differs between traces (measured on the job's own unprofiled
    iterations, or the calibration loop's only when it has none), so compare the first two columns across traces."""
    import glob
    from dpro_kit.readers import kineto as K
    from dpro_kit.readers import torch_kineto as R
    for path in paths:
        for f in sorted(glob.glob(f"{path}/*/*/kineto_trace.json")):
            meta = json.loads((Path(f).parent / "meta.json").read_text())
            doc = K.load_doc(Path(f)) if hasattr(K, "load_doc") else json.loads(Path(f).read_text())
            cols, cost = {}, {}
            real = R._subtract_profiler_cost

            def spy(ops, sizes, meta, overhead, main, markers, _real=real):
                before = {id(o): o.dur for o in ops}
                warn = _real(ops, sizes, meta, overhead, main, markers)
                lin = [o for o in ops if o.name == op and sizes.get(id(o.ev), 1)]
                if lin and overhead != "keep":
                    o = lin[0]
                    cost["ns"] = (before[id(o)] - o.dur) / sizes.get(id(o.ev), 1) if o.dur > 0 else None
                    cost["events"] = sizes.get(id(o.ev), 1)
                return warn
            R._subtract_profiler_cost = spy
            try:
                for name, fold, ov in (("recorded", False, "keep"), ("+host gap", True, "keep"),
                                       ("as read", True, "window")):
                    ev = R.parse_node(meta, doc, path=Path(f), fold_gaps=fold, overhead=ov).events
                    x = ev[ev["name"].astype(str) == op]["dur"]
                    cols[name] = (len(x), float(x.median()) if len(x) else float("nan"), float(x.mean()) if len(x) else 0.0)
            finally:
                R._subtract_profiler_cost = real
            if cols["recorded"][0]:
                m = meta.get("measured") or {}
                print(f"{f}: {op} n={cols['recorded'][0]} per-call median (mean) us: "
                      + ", ".join(f"{k} {v[1]:.0f} ({v[2]:.0f})" for k, v in cols.items())
                      + (f"; profiler cost taken out {cost['ns'] / 1e3:.2f} us/event x {cost['events']} events"
                         if cost.get("ns") is not None else "")
                      + f"; unprofiled steps used {m.get('unprofiled_steps_used')}")


def waits(paths: list[str]) -> None:
    for path in paths:
        ev = _events(path)
        n_it = max(1, ev["iteration"].nunique())
        for node in sorted(ev["node"].unique()):
            e = ev[ev["node"] == node]
            by = (e.groupby(e["kind"].astype(str))["dur"].sum() / 1e3 / n_it).round(2).to_dict()
            o = e[e["kind"].astype(str) == "OTHER"]
            top = (o.groupby(o["name"].astype(str))["dur"].sum() / 1e3 / n_it).sort_values(ascending=False).head(5)
            print(f"{path} {node}: per iteration by kind (ms) {by}; top OTHER: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in top.items()))


_PROBE = r"""
import sys, time, json, statistics, collections
sys.path.insert(0, sys.argv[1])
import torch, torch.nn as nn
import train as T
mode, batch, m, iters, warmup, threads, prof = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6]), int(sys.argv[7]), sys.argv[8] == "1"
torch.set_num_threads(threads)
torch.manual_seed(0)
net, c = T.build("mlp")
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
gen = torch.Generator().manual_seed(1)
rec, on, orig = collections.defaultdict(list), [False], nn.Linear.forward
def fwd(self, x):
    t0 = time.perf_counter(); y = orig(self, x); t1 = time.perf_counter()
    if on[0]:
        rec[f"{self.in_features}x{self.out_features}"].append((t1 - t0) * 1e6)
    return y
nn.Linear.forward = fwd
def step():
    opt.zero_grad(set_to_none=True)
    losses = []
    for _ in range(1 if mode == "single" else m):   # micro: m micro-batches forward, then their backward
        x, y = T.make_batch("mlp", c, batch, gen)
        losses.append(T.loss_fn(net(x), y))
    for l in losses:
        l.backward()
    opt.step()
for _ in range(warmup):
    step()
on[0] = True
p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if prof else None
if p is not None:
    p.__enter__()
wall, cpu0 = [], time.process_time()
for _ in range(iters):
    t0 = time.perf_counter(); step(); wall.append(time.perf_counter() - t0)
cpu = time.process_time() - cpu0
out = {"iter_ms": round(statistics.median(wall) * 1e3, 2), "cpu_ms_per_iter": round(cpu / iters * 1e3, 2),
       "linear_us": {k: round(statistics.median(v), 1) for k, v in rec.items()},
       "linear_all_us": round(statistics.median([d for v in rec.values() for d in v]), 1)}
if p is not None:
    p.__exit__(None, None, None)
    out["profiler_aten_linear_us"] = round(statistics.median(
        e.time_range.elapsed_us() for e in p.events() if e.name == "aten::linear"), 1)
print(json.dumps(out), flush=True)
"""


def linear_probe(a: argparse.Namespace) -> None:
    """The mlp of examples/strategies/train.py in one process per variant, each in a fresh CpuBudget group:
    per-call nn.Linear time (perf_counter, no profiler unless --prof) with one batch per iteration ("single",
    the single-process profile) vs M micro-batches back to back ("micro", a GPipe stage's order)."""
    import subprocess
    from dpro_kit.jobs import CpuBudget
    for cpus in a.cpus:
        for mode in ("single", "micro"):
            for threads in a.threads:
                argv = [sys.executable, "-c", _PROBE, str(ROOT / "examples" / "strategies"), mode, str(a.batch),
                        str(a.micro_batches), str(a.iters), "5", str(threads), "1" if a.prof else "0"]
                with CpuBudget(1, cpus, prefix=a.prefix, period_us=a.period_us, shares=8192) as b:
                    r = subprocess.run(argv, capture_output=True, text=True, preexec_fn=b.preexec(0), timeout=600)
                line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"failed: {r.stderr[-300:]}"
                print(f"{cpus:g} CPU {mode:6s} batch {a.batch}{f' x {a.micro_batches}' if mode == 'micro' else ''} "
                      f"threads {threads}: {line}", flush=True)


def budget_noise(a: argparse.Namespace) -> None:
    """train.py --ranks 1 (mlp) on one CpuBudget host, loopback: plain, under dpro profile with a window that never
    opens, with a real window (+ --post-steps-like unprofiled iterations after it), plain again; every iteration."""
    import statistics
    from dpro_kit.jobs import run_job
    train = ROOT / "examples" / "strategies" / "train.py"
    env = dict(DPRO_QUIET="1", PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "collectors" / "torch"), str(ROOT / "collectors" / "common"), str(ROOT)]))
    a.out.mkdir(parents=True, exist_ok=True)
    for name, prof, steps, flags in [("plain", False, "", ()), ("instrumented, window never opens", True, "100:105", ()),
                                     ("profiled --steps 5:10 --shapes", True, "5:10", ("--shapes",)),
                                     ("plain again", False, "", ())]:
        j = a.out / f"{name.split()[0]}-{steps.replace(':', '_') or 'none'}.json"
        argv = [sys.executable, str(train), "--model", "mlp", "--batch-size", str(a.batch), "--warmup", "1",
                "--iters", "19", "--threads", "1", "--quiet", "--json-out", str(j)]
        r = run_job(argv, hosts=1, ranks_per_host=1, rate_mbit=None, cpus_per_host=a.cpus[0], cpu_period_us=a.period_us,
                    cpu_shares=8192, profile=(a.out / f"trace-{steps.replace(':', '_')}") if prof else None,
                    steps=steps or "10:15", profile_flags=flags, env=env, timeout=300, prefix=a.prefix)
        ms = [round(t * 1e3, 1) for t in json.loads(j.read_text())["iteration_times_s"]["0"]]
        print(f"{name}: exit {r.codes}; median {statistics.median(ms):.1f} ms; iterations {ms}", flush=True)


def profile_job(a: argparse.Namespace) -> None:
    import os
    from dpro_kit.jobs import run_job
    train = ROOT / "examples" / "strategies" / "train.py"
    sfile = Path(a.strategy) if a.strategy.endswith((".yaml", ".yml", ".json")) else \
        ROOT / "examples" / "strategies" / f"{a.strategy}.yaml"
    import yaml
    ranks = int(yaml.safe_load(sfile.read_text())["ranks"])
    env = dict(DPRO_QUIET="1", PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "collectors" / "torch"), str(ROOT / "collectors" / "common"), str(ROOT)]))
    a.out.mkdir(parents=True, exist_ok=True)
    times = a.out / "times.json"
    argv = [sys.executable, str(train), "--model", a.model, "--strategy", str(sfile), "--warmup", "4", "--iters", "10",
            "--threads", "1", "--quiet", "--json-out", str(times)] + (["--batch-size", str(a.batch_size)] if a.batch_size else [])
    r = run_job(argv, hosts=ranks, ranks_per_host=1, rate_mbit=a.rate if a.rate > 0 else None, cpus_per_host=a.cpus,
                cpu_period_us=a.period_us, cpu_shares=8192, profile=a.out / "trace", steps="5:10",
                profile_flags=["--shapes"] if a.shapes else (), env=env, timeout=300, prefix=a.prefix)
    print(f"exit codes {r.codes}; iteration {json.loads(times.read_text())['iteration_ms']:.2f} ms (profiled); "
          f"trace {a.out / 'trace'}")


#: torch.distributed functions the ``wire`` probe counts (module attributes: FSDP2, DTensor's c10d fallbacks,
#: pipelining and DDP's Python side call them there; DDP's bucket all-reduces run in C++ and show only in the bytes)
WIRE_COLLECTIVES = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
                    "reduce_scatter_tensor", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "isend",
                    "irecv", "batch_isend_irecv", "all_to_all_single")


def _tx_bytes(iface: str) -> int:
    """Bytes sent by ``iface`` (this network namespace's /proc/net/dev)."""
    for line in open("/proc/net/dev"):
        name, _, rest = line.partition(":")
        if rest and name.strip() == iface:
            return int(rest.split()[8])
    return 0


def _tcp_retrans() -> int:
    """TCP segments retransmitted in this network namespace (/proc/net/snmp ``RetransSegs``)."""
    rows = [line.split() for line in open("/proc/net/snmp") if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])


def wire_rank(train_argv: list[str]) -> int:
    """One rank of ``wire``: examples/strategies/train.py with every iteration's sent bytes, retransmits and
    torch.distributed calls recorded; writes ``$DPRO_WIRE_OUT/wire-rank<RANK>.json`` (the measured iterations only;
    one file per rank: the ranks share one log)."""
    import importlib.util
    import time
    import torch
    import torch.distributed as dist
    spec = importlib.util.spec_from_file_location("strategies_train", ROOT / "examples" / "strategies" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    calls: list[tuple[str, int, float]] = []
    steps: list[dict] = []

    def wrap(name: str):
        fn = getattr(dist, name)

        def counted(*args, **kw):
            ts = [x for x in list(args) + list(kw.values()) if isinstance(x, torch.Tensor)]
            nb = ts[-1].numel() * ts[-1].element_size() if ts else 0   # (output, input): the input
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            calls.append((name, nb, (time.perf_counter() - t0) * 1e3))
            return out
        setattr(dist, name, counted)
    for n in WIRE_COLLECTIVES:
        if hasattr(dist, n):
            wrap(n)
    step = train.Job.step

    def recorded(self) -> None:
        tx, rt, k, t0 = _tx_bytes(iface), _tcp_retrans(), len(calls), time.perf_counter()
        step(self)
        kinds: dict[str, list[float]] = {}
        for name, nb, ms in calls[k:]:
            c = kinds.setdefault(name, [0, 0, 0.0])
            c[0] += 1
            c[1] += nb
            c[2] += ms
        steps.append({"ms": (time.perf_counter() - t0) * 1e3, "tx_bytes": _tx_bytes(iface) - tx,
                      "retrans": _tcp_retrans() - rt, "calls": kinds})
    train.Job.step = recorded
    rc = train.main(train_argv)
    a = train.parse_args(train_argv)
    out = Path(os.environ.get("DPRO_WIRE_OUT", ".")) / f"wire-rank{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps({"rank": os.environ.get("RANK"), "steps": steps[a.warmup:]}))
    return rc


def wire(a: argparse.Namespace) -> None:
    """The strategy job on emulated hosts with :func:`wire_rank` as every rank; a table per rank."""
    import statistics
    import yaml
    from dpro_kit.jobs import run_job
    sfile = Path(a.strategy) if a.strategy.endswith((".yaml", ".yml", ".json")) else \
        ROOT / "examples" / "strategies" / f"{a.strategy}.yaml"
    ranks = int(yaml.safe_load(sfile.read_text())["ranks"])
    pin = [x.strip() for x in a.pin.split(",")] if a.pin else None
    if pin and len(pin) < ranks:
        raise SystemExit(f"wire: --pin has {len(pin)} cpu lists for {ranks} hosts")
    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.glob("wire-rank*.json"):
        old.unlink()
    env = dict(PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join([str(ROOT)]), DPRO_WIRE_OUT=str(a.out.resolve()))
    log = a.out / "wire.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "wire-rank", "--model", a.model, "--strategy", str(sfile),
            "--warmup", "2", "--iters", str(a.iters), "--threads", "1", "--quiet"]
    with open(log, "w") as f:
        r = run_job(argv, hosts=ranks, ranks_per_host=1, rate_mbit=a.rate, cpus_per_host=None if pin else a.cpus,
                    cpusets=pin[:ranks] if pin else None, cpu_period_us=a.period_us, cpu_shares=8192, env=env,
                    log=f, timeout=300, prefix=a.prefix)
    docs = [json.loads(f.read_text()) for f in sorted(a.out.glob("wire-rank*.json"))]
    print(f"{sfile.stem} {a.model} at {a.rate:g} Mbit/s, {'pinned ' + a.pin if pin else f'{a.cpus:g} CPU'}: "
          f"exit codes {r.codes}; per iteration (median over {a.iters}):")
    for d in sorted(docs, key=lambda d: str(d["rank"])):
        st = d["steps"]
        med = lambda xs: statistics.median(xs) if xs else 0.0   # noqa: E731
        print(f"  rank {d['rank']}: {med([s['ms'] for s in st]):.2f} ms, sent {med([s['tx_bytes'] for s in st]) / 1e6:.3f} MB, "
              f"TCP retransmits {sum(s['retrans'] for s in st)} in {len(st)} iterations")
        for kind in sorted({k for s in st for k in s["calls"]}):
            c = [s["calls"].get(kind, [0, 0, 0.0]) for s in st]
            print(f"    {kind}: {med([x[0] for x in c]):g} calls, input {med([x[1] for x in c]) / 1e6:.3f} MB, "
                  f"{med([x[2] for x in c]):.2f} ms inside")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["wire-rank"]:
        return wire_rank(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stalls")
    s.add_argument("traces", nargs="+")
    o = sub.add_parser("opcost")
    o.add_argument("op")
    o.add_argument("traces", nargs="+")
    w = sub.add_parser("waits")
    w.add_argument("traces", nargs="+")
    p = sub.add_parser("profile-job")
    p.add_argument("strategy")
    p.add_argument("--model", default="mlp")
    p.add_argument("--rate", type=float, default=1000, help="link rate (Mbit/s); 0: no emulated cluster (loopback)")
    p.add_argument("--batch-size", type=int, default=0, help="global batch (default: the model's)")
    p.add_argument("--shapes", action="store_true", help="dpro profile --shapes (as the simulator's profile)")
    p.add_argument("--cpus", type=float, default=0.5)
    p.add_argument("--period-us", type=int, default=10000)
    p.add_argument("--prefix", default="sd")
    p.add_argument("--out", type=Path, required=True)
    lp = sub.add_parser("linear-probe", help="per-call nn.Linear cost, one batch vs micro-batches, no profiler")
    lp.add_argument("--batch", type=int, default=16)
    lp.add_argument("--micro-batches", type=int, default=4)
    lp.add_argument("--iters", type=int, default=30)
    lp.add_argument("--cpus", type=lambda v: [float(x) for x in v.split(",")], default=[0.5], help="e.g. 0.5,2")
    lp.add_argument("--threads", type=lambda v: [int(x) for x in v.split(",")], default=[1], help="e.g. 1,2")
    lp.add_argument("--prof", action="store_true", help="inside torch.profiler (plain, no dpro collector)")
    lp.add_argument("--period-us", type=int, default=10000)
    lp.add_argument("--prefix", default="sd")
    wi = sub.add_parser("wire", help="bytes on the wire and collectives per iteration of the real job, no profiler")
    wi.add_argument("strategy")
    wi.add_argument("--model", default="mlp")
    wi.add_argument("--rate", type=float, default=1000, help="link rate (Mbit/s)")
    wi.add_argument("--iters", type=int, default=6)
    wi.add_argument("--pin", default="", help="one kernel cpu list per host (0,1), no quota; else --cpus")
    wi.add_argument("--cpus", type=float, default=0.5)
    wi.add_argument("--period-us", type=int, default=10000)
    wi.add_argument("--prefix", default="sd")
    wi.add_argument("--out", type=Path, default=Path("/tmp/sd-wire"))
    bn = sub.add_parser("budget-noise", help="iteration times of the single process: plain vs under dpro profile")
    bn.add_argument("--batch", type=int, default=16)
    bn.add_argument("--cpus", type=lambda v: [float(x) for x in v.split(",")], default=[0.5])
    bn.add_argument("--period-us", type=int, default=10000)
    bn.add_argument("--prefix", default="sd")
    bn.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "stalls":
        stalls(a.traces)
    elif a.cmd == "opcost":
        opcost(a.op, a.traces)
    elif a.cmd == "waits":
        waits(a.traces)
    elif a.cmd == "linear-probe":
        linear_probe(a)
    elif a.cmd == "budget-noise":
        budget_noise(a)
    elif a.cmd == "wire":
        wire(a)
    else:
        profile_job(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
