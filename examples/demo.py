"""`make demo`: dpro end to end on a real PyTorch DDP job.

1. profiles a real 2-rank gloo DDP job on this machine (examples/ddp/train.py,
   unchanged) with `dpro profile`, replays it and compares the prediction with
   the iteration time the job measured on its unprofiled iterations;
2. replays the recorded real trace shipped in examples/traces/ (how it was
   recorded: examples/traces/ddp-2rank-gloo/README.md), and asks two what-if
   questions of it (a 200 Mbit/s network, 4 workers);
3. exports the global DFG and the simulated timeline (open it in https://ui.perfetto.dev).

Outputs go to --out (default demo-out/); the last lines say where.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def dpro(*args: str, quiet: bool = False) -> subprocess.CompletedProcess:
    exe = shutil.which("dpro", path=str(Path(sys.executable).parent)) or "dpro"
    r = subprocess.run([exe, *args], text=True, capture_output=True)
    if not quiet and r.stderr.strip() and r.returncode == 0:
        sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"demo: `dpro {' '.join(args)}` failed with exit code {r.returncode}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo-out", type=Path)
    ap.add_argument("--trace", default=HERE / "traces" / "ddp-2rank-gloo", type=Path)
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn", "transformer"])
    ap.add_argument("--skip-live", action="store_true", help="only replay the recorded trace")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results = {}

    if not a.skip_live:
        live = a.out / "trace"
        if live.exists():
            shutil.rmtree(live)
        print(f"== 1. profiling a real 2-rank DDP job ({a.model}, gloo on CPU) into {live}")
        dpro("profile", "--out", str(live), "--steps", "10:15", "--", sys.executable,
             str(HERE / "ddp" / "train.py"), "--nproc", "2", "--model", a.model, "--iters", "40", quiet=True)
        print(dpro("replay", str(live), "--timeline", str(a.out / "timeline.json")).stdout)
        results["live"] = json.loads(dpro("replay", str(live), "--json", "-q").stdout)

    print(f"== 2. replaying the recorded trace {a.trace}")
    print(dpro("replay", str(a.trace), "--top", "5").stdout)
    results["recorded"] = json.loads(dpro("replay", str(a.trace), "--json", "-q").stdout)
    for label, args in (("200 Mbit/s links", ["--bandwidth-mbps", "200"]), ("4 workers", ["--world-size", "4"])):
        r = json.loads(dpro("replay", str(a.trace), "--json", "-q", *args).stdout)
        results[f"what-if {label}"] = r
    dpro("graph", str(a.trace), "-o", str(a.out / "dfg.json"), "-q")
    (a.out / "replay.json").write_text(json.dumps(results, indent=2))

    print("== summary")
    for label, r in results.items():
        pred, meas = r["iteration_time_ms"], r.get("measured_iteration_ms")
        line = f"  {label:<24} predicted {pred:9.2f} ms"
        if meas:
            line += f"   measured {meas:8.2f} ms   error {100 * (pred - meas) / meas:+6.1f} %"
        print(line)
    print(f"outputs in {a.out.resolve()}:")
    for f in (["trace/", "timeline.json"] if not a.skip_live else []) + ["replay.json", "dfg.json"]:
        print(f"  {a.out / f}")


if __name__ == "__main__":
    main()
