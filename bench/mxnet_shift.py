"""Move each MXNet operator event of a real dump by a fixed time, one at a time, and replay.

What the MXNet reader's time checks catch (docs/reliability.md, "MXNet operator twins"): for
every operator event of phase PHASE (``B``, ``E``, ``b`` or ``e``) of one worker's
``profile.json``, a copy of the trace folder with that one ``ts`` moved by SHIFT microseconds
goes through ``dpro replay --json``; each is counted as refused (exit 2), warned (a warning the
unmutated folder does not give) or silent, and the replays that moved more than 1 % are listed.

    python bench/mxnet_shift.py -1000 B
    python bench/mxnet_shift.py 1000 E --trace examples/traces/mxnet-ps-2w1s-loopback --file host2/worker0/profile.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _replay(trace: Path) -> tuple[int, dict]:
    from dpro_kit.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["replay", str(trace), "--json"])
    return rc, json.loads(out.getvalue()) if rc == 0 else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shift", type=float, help="microseconds added to each event's ts (negative: earlier)")
    ap.add_argument("phase", choices=["B", "E", "b", "e"], help="which operator events are moved")
    ap.add_argument("--trace", type=Path, default=REPO / "examples/traces/mxnet-ps-2w1s-loopback")
    ap.add_argument("--file", default="host2/worker0/profile.json", help="the dump, relative to --trace")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpro-mxshift-") as tmp:
        os.environ["DPRO_CACHE"] = str(Path(tmp) / "cache")
        rc, base = _replay(args.trace)
        if rc:
            raise SystemExit(f"{args.trace} does not replay")
        doc = json.loads((args.trace / args.file).read_text())
        idx = [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == args.phase and e.get("cat") == "operator"]
        counts: Counter = Counter()
        moved = []
        case = Path(tmp) / "case"
        for i in idx:
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(args.trace, case)
            d = json.loads(json.dumps(doc))
            d["traceEvents"][i]["ts"] += args.shift
            (case / args.file).write_text(json.dumps(d))
            rc, res = _replay(case)
            if rc:
                counts["refused"] += 1
                continue
            kind = "warned" if set(res.get("warnings") or []) - set(base.get("warnings") or []) else "silent"
            counts[kind] += 1
            pct = 100 * (res["iteration_time_ms"] - base["iteration_time_ms"]) / base["iteration_time_ms"]
            if abs(pct) > 1:
                counts[kind + " > 1 %"] += 1
                moved.append((pct, kind, d["traceEvents"][i]["name"]))
    print(f"{len(idx)} '{args.phase}' events moved {args.shift:+g} us one at a time (baseline "
          f"{base['iteration_time_ms']:.3f} ms): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for pct, kind, name in sorted(moved, key=lambda m: -abs(m[0]))[:8]:
        print(f"  {pct:+7.2f} %  {kind:<6} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
