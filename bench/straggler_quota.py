#!/usr/bin/env python3
"""`dpro replay --recorded-quota` on the kept slowed profiles of earlier `bench/stragglers.py` runs.

For every reverse row (a profile of the slowed job) of each ROWS.json: the plain replay and the
``--recorded-quota`` replay against the slowed job's measured time, and the fix predicted as
"the throttled host gets its CPU back" (``--recorded-quota --cpu-limit HOST=C``, C the balanced
hosts' budget) against the measured speed-up.  Traces recorded before the collector wrote the
stops of each profiled step are copied under --work and their manifest's ``cpu_use`` rebuilt from
their ``meta.json`` files (``dpro_torch.manifest.build_manifest``); the originals are not touched.
Replays only (no jobs); docs/stragglers.md ("CPU quota model") has the numbers.

    python bench/straggler_quota.py /tmp/strag-s30b/rows.json /tmp/strag-s29b/rows.json /tmp/strag-h3/rows.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "collectors" / "torch"))


def replay(trace: Path, *args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "dpro_kit", "replay", str(trace), "--json", "-q", *args],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"dpro replay {trace} {' '.join(args)}: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout)


def with_step_stops(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose manifest's cpu_use is rebuilt from its meta.json files (per profiled step stops)."""
    from dpro_torch.manifest import build_manifest, find_metas
    if not dst.exists():
        shutil.copytree(src, dst)
        m = json.loads((dst / "manifest.json").read_text())
        m.setdefault("extra", {})["cpu_use"] = build_manifest(dst, find_metas(dst))["extra"]["cpu_use"]
        tmp = dst / "manifest.json.tmp"
        tmp.write_text(json.dumps(m, indent=1))
        tmp.replace(dst / "manifest.json")
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", type=Path, help="rows.json of bench/stragglers.py runs (their kept traces)")
    ap.add_argument("--period-ms", type=float, default=10.0, help="the runs' CFS period where a trace did not record it")
    ap.add_argument("--work", type=Path, default=None, help="where the rebuilt copies go (default: a temporary folder)")
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="dpro-strag-quota-"))
    work.mkdir(parents=True, exist_ok=True)
    print("| slowed profile | Mbit/s | slowed job measured ms | plain | error | --recorded-quota | error | "
          "fix measured | fix predicted (quota back) | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rows_file in a.rows:
        rows = json.loads(rows_file.read_text())
        for r in rows:
            if r["direction"] != "fix":
                continue
            slow = [x for x in rows if x["direction"] == "slow" and x["rate"] == r["rate"] and x["injected"] == r["injected"]]
            src = Path(r["trace"])
            cpu_use = (json.loads((src / "manifest.json").read_text()).get("extra") or {}).get("cpu_use") or {}
            if not any((v or {}).get("limit_cpus") for v in cpu_use.values()):
                print(f"| {rows_file.parent.name} {src.parent.name} | {r['rate']:g} | (no CPU records) |")
                continue
            host = r["injected"].split()[1]
            full = max(float(v["limit_cpus"]) for v in cpu_use.values() if (v or {}).get("limit_cpus"))
            t = with_step_stops(src, work / f"{rows_file.parent.name}-{src.parent.name}")
            per = ["--cpu-period-ms", f"{a.period_ms:g}"]
            plain = replay(t)["iteration_time_ms"]
            rq = replay(t, "--recorded-quota", *per)["iteration_time_ms"]
            fix = replay(t, "--recorded-quota", *per, "--cpu-limit", f"{host}={full:g}")["iteration_time_ms"]
            m = slow[0]["measured_ms"] if slow else float("nan")
            sp, msp = rq / fix, r["measured_speedup"]
            print(f"| {rows_file.parent.name} {src.parent.name} | {r['rate']:g} | {m:.2f} | {plain:.2f} | "
                  f"{100 * (plain / m - 1):+.1f} % | {rq:.2f} | {100 * (rq / m - 1):+.1f} % | x{msp:.3f} | "
                  f"x{sp:.3f} | {100 * (sp / msp - 1):+.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
