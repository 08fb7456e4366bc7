"""`make demo`: what dpro is for, on a real multi-host PyTorch DDP job.

As root (the emulated cluster needs network namespaces), the demo

1. runs a real 2-host DDP job (examples/ddp/train.py, unchanged; gloo; one rank per
   emulated host, 1000 Mbit/s links) with **one `dpro profile` per host**, as a
   multi-node job is launched, into one folder;
2. replays it: the predicted iteration time next to the time the same job measured on
   its unprofiled iterations, the breakdown and the critical path;
3. asks a what-if question the user cannot answer without buying hardware -- "what if
   the links were 200 Mbit/s?" -- and then answers it for real: runs the job unprofiled
   on 200 Mbit/s links and measures it;
4. writes the simulated timeline (https://ui.perfetto.dev), the HTML report and the DFG.

Why this configuration: on this shared 2-core machine only bandwidth-bound jobs measure
steadily (their own run-to-run spread is ~1-10 %, docs/accuracy.md); loopback jobs spread
by 40-50 % and are not demoed.  Nothing is adjusted: every number printed comes from the
run just made.

The jobs are launched by dpro_kit.jobs.run_job, the harness the benches use.

Without root (or with --recorded), the demo replays the 2-host trace recorded by this same
demo (examples/traces/ddp-2host-1000mbit, see its README; re-record it as root with
``python examples/demo.py --record examples/traces/ddp-2host-1000mbit``) and the same
what-if, next to the 200 Mbit/s run measured when the trace was recorded, and says so.

Outputs go to --out (default demo-out/); the last lines say where.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRAIN = HERE / "ddp" / "train.py"
RECORDED = HERE / "traces" / "ddp-2host-1000mbit"
MEANING = ("predicted = dpro's replay of the profiled iterations (device by device, "
           "from the traces only); measured = the job's own iterations timed without the profiler; "
           "error = predicted / measured - 1; this job's own unprofiled runs differ by up to ~10 % from run to "
           "run on this shared machine (docs/accuracy.md), so an error within that is as close as it can check.")


def dpro_exe() -> str:
    return shutil.which("dpro", path=str(Path(sys.executable).parent)) or "dpro"


def dpro(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([dpro_exe(), *args], text=True, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"demo: `dpro {' '.join(args)}` failed with exit code {r.returncode}")
    return r


def cluster_usable() -> str | None:
    """None if emulated hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    try:
        from dpro_kit.cluster import check_prerequisites
        check_prerequisites()
    except Exception as exc:  # DproError with what is missing
        return str(exc)
    return None


def train_argv(iters: int, json_out: Path, bucket_mb: float) -> list[str]:
    # mlp, batch 64, 1 thread per rank, each rank pinned to its own core (bench/accuracy.py's setup)
    return [sys.executable, str(TRAIN), "--model", "mlp", "--bucket-mb", f"{bucket_mb:g}", "--batch-size", "64",
            "--threads", "1", "--pin", "rank", "--backend", "gloo", "--warmup", "10", "--iters", str(iters),
            "--quiet", "--json-out", str(json_out)]


def run_on_hosts(rate_mbit: float, argv: list[str], *, profile_out: Path | None, log: Path,
                 steps: str) -> None:
    """One process per emulated host (dpro_kit.jobs.run_job); with ``profile_out``, each host's own
    `dpro profile`."""
    from dpro_kit.jobs import run_job

    with open(log, "a") as logf:
        r = run_job(argv, hosts=2, rate_mbit=rate_mbit, profile=profile_out, steps=steps,
                    env={"DPRO_QUIET": "1"}, log=logf, timeout=600)
    if not r.ok:
        raise SystemExit(f"demo: the job failed on the emulated hosts (exit codes {r.codes}); see {log}")


def line(label: str, pred: float, meas: float | None) -> str:
    s = f"  {label:<44} predicted {pred:8.2f} ms"
    if meas:
        s += f"   measured {meas:8.2f} ms   error {100 * (pred - meas) / meas:+5.1f} %"
    return s


def live(a: argparse.Namespace) -> list[str]:
    from dpro_kit.jobs import job_iteration_ms

    out = a.out
    trace, log = (a.record or out / "trace"), out / "jobs.log"
    for p in (trace, out / "times-profiled.json", out / "times-whatif.json", log):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    print(f"== 1. a real 2-host DDP job (mlp, gloo, {a.rate:g} Mbit/s links), one `dpro profile` per host:")
    for i in range(2):
        print(f"     host{i}$ dpro profile --out {trace} --host host{i} -- python examples/ddp/train.py "
              f"--model mlp --bucket-mb {a.bucket_mb:g} ...")
    t0 = time.time()
    run_on_hosts(a.rate, train_argv(40, out / "times-profiled.json", a.bucket_mb), profile_out=trace, log=log,
                 steps=a.steps)
    print(f"   done in {time.time() - t0:.0f} s; {trace} now holds both hosts' ranks\n")

    print(f"== 2. $ dpro replay {trace}")
    print(dpro("replay", str(trace), "--top", "3", "--timeline", str(out / "timeline.json")).stdout)
    base = json.loads(dpro("replay", str(trace), "--json", "-q").stdout)

    print(f"== 3. what if the links were {a.whatif_rate:g} Mbit/s?  "
          f"$ dpro replay {trace} --bandwidth-mbps {a.whatif_rate:g}")
    wi = json.loads(dpro("replay", str(trace), "--json", "-q", "--bandwidth-mbps", f"{a.whatif_rate:g}").stdout)
    print(f"   predicted {wi['iteration_time_ms']:.2f} ms; now running the same job, unprofiled, "
          f"on {a.whatif_rate:g} Mbit/s links to check ...")
    run_on_hosts(a.whatif_rate, train_argv(40, out / "times-whatif.json", a.bucket_mb), profile_out=None, log=log,
                 steps=a.steps)
    wi_meas = job_iteration_ms(out / "times-whatif.json")
    if a.record:   # kept next to the trace: the no-root demo shows them as measured when recorded
        shutil.copy(out / "times-profiled.json", trace / "train_times.json")
        shutil.copy(out / "times-whatif.json", trace / f"train_times_{a.whatif_rate:g}mbit.json")

    dpro("report", str(trace), "-o", str(out / "report.html"), "-q")
    dpro("graph", str(trace), "-o", str(out / "dfg.json"), "-q")
    (out / "replay.json").write_text(json.dumps({"replay": base, "whatif": wi,
                                                 "whatif_measured_ms": wi_meas}, indent=2))
    print("\n== summary")
    print(line(f"2 hosts, {a.rate:g} Mbit/s (profiled)", base["iteration_time_ms"],
               base.get("measured_iteration_ms")))
    print(line(f"what-if {a.whatif_rate:g} Mbit/s (never profiled)", wi["iteration_time_ms"], wi_meas))
    print("  " + MEANING)
    print("  The what-if was predicted from the first run's traces alone, before the second run existed.")
    return [f"{trace}/", *(str(out / f) for f in ("timeline.json", "report.html", "dfg.json", "replay.json",
                                                 "jobs.log"))]


def recorded(a: argparse.Namespace, why: str) -> list[str]:
    from dpro_kit.jobs import job_iteration_ms

    out = a.out
    print(f"== emulated hosts unavailable ({why}): replaying the recorded 2-host trace {RECORDED}")
    print(f"   (recorded by this demo as root; how: {RECORDED / 'README.md'})\n")
    print(f"$ dpro replay {RECORDED}")
    print(dpro("replay", str(RECORDED), "--top", "3", "--timeline", str(out / "timeline.json")).stdout)
    base = json.loads(dpro("replay", str(RECORDED), "--json", "-q").stdout)
    rate = 200.0
    print(f"== what if the links were {rate:g} Mbit/s?  $ dpro replay {RECORDED} --bandwidth-mbps {rate:g}")
    wi = json.loads(dpro("replay", str(RECORDED), "--json", "-q", "--bandwidth-mbps", f"{rate:g}").stdout)
    measured_file = RECORDED / f"train_times_{rate:g}mbit.json"
    wi_meas = job_iteration_ms(measured_file) if measured_file.exists() else None
    dpro("report", str(RECORDED), "-o", str(out / "report.html"), "-q")
    dpro("graph", str(RECORDED), "-o", str(out / "dfg.json"), "-q")
    (out / "replay.json").write_text(json.dumps({"replay": base, "whatif": wi, "whatif_measured_ms": wi_meas},
                                                indent=2))
    print("\n== summary")
    print(line("recorded 2-host run, 1000 Mbit/s", base["iteration_time_ms"], base.get("measured_iteration_ms")))
    print(line(f"what-if {rate:g} Mbit/s (measured when recorded)", wi["iteration_time_ms"], wi_meas))
    print("  " + MEANING)
    print("  Run `sudo make demo` to profile a live 2-host job and check a what-if against a real run.")
    return [str(out / f) for f in ("timeline.json", "report.html", "dfg.json", "replay.json")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo-out", type=Path)
    ap.add_argument("--rate", type=float, default=1000.0, help="link rate of the profiled run, Mbit/s")
    ap.add_argument("--whatif-rate", type=float, default=200.0, help="link rate asked about and then run, Mbit/s")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size of the job")
    ap.add_argument("--steps", default="15:20", help="profiled steps (dpro profile --steps)")
    ap.add_argument("--recorded", action="store_true", help="only replay the recorded trace (no jobs)")
    ap.add_argument("--record", type=Path, default=None, metavar="DIR",
                    help="as root: run the live demo with the trace written to DIR (and the measured iteration "
                         "times next to it), e.g. examples/traces/ddp-2host-1000mbit")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    why = "--recorded given" if a.recorded else cluster_usable()
    if a.record and why:
        raise SystemExit(f"demo: --record needs the emulated hosts ({why})")
    files = recorded(a, why) if why else live(a)
    print(f"outputs in {a.out.resolve()}:")
    for f in files:
        print(f"  {f}")


if __name__ == "__main__":
    main()
