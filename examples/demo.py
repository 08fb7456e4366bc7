"""`make demo`: dpro end to end on a real PyTorch DDP job.

1. replays the recorded real 2-rank gloo DDP trace shipped in examples/traces/
   (how it was recorded: examples/traces/ddp-2rank-gloo/README.md) and compares the
   prediction with the iteration time measured in that run;
2. exports its global DFG and the simulated timeline (open it in https://ui.perfetto.dev).

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


def dpro(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("dpro", path=str(Path(sys.executable).parent)) or "dpro"
    r = subprocess.run([exe, *args], text=True, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"demo: `dpro {' '.join(args)}` failed with exit code {r.returncode}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo-out", type=Path)
    ap.add_argument("--trace", default=HERE / "traces" / "ddp-2rank-gloo", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    print(f"== replaying the recorded trace {a.trace}")
    r = dpro("replay", str(a.trace), "--timeline", str(a.out / "timeline.json"))
    print(r.stdout)
    res = json.loads(dpro("replay", str(a.trace), "--json", "-q").stdout)
    (a.out / "replay.json").write_text(json.dumps(res, indent=2))
    dpro("graph", str(a.trace), "-o", str(a.out / "dfg.json"), "-q")

    print("== summary")
    pred = res["iteration_time_ms"]
    meas = res.get("measured_iteration_ms")
    if meas:
        print(f"predicted {pred:.2f} ms vs measured {meas:.2f} ms (error {100 * (pred - meas) / meas:+.1f} %)")
    else:
        print(f"predicted {pred:.2f} ms (the trace carries no measured time)")
    print(f"outputs in {a.out.resolve()}:")
    for f in ("replay.json", "timeline.json", "dfg.json"):
        print(f"  {a.out / f}")


if __name__ == "__main__":
    main()
