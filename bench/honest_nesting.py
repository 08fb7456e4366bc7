"""How far honest traces are from the time invariants the readers check (docs/reliability.md).

The readers refuse (or warn about) times that cannot come from one run of a profiler: an MXNet
operator span that does not hold its operator-domain twin, two operators of one compute thread
that overlap, a Kineto CPU event that crosses the end of the range it starts in, NCCL plugin
states / steps outside their event.  This script measures, on real recorded traces, how close
honest data comes to each limit, so each tolerance is picked from data:

    python bench/honest_nesting.py examples/traces ../shared/traces/hta /tmp/some-recorded-job ...

Every argument is a file or a folder searched for ``profile.json`` (MXNet dumps: a ``traceEvents``
with ``B``/``E`` operator events), ``*.json`` / ``*.json.gz`` Kineto files and ``nccl-*.jsonl``.
Files that do not parse are listed and skipped.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def mxnet_dump(path: Path) -> dict[str, Any]:
    """Twin gaps (b - B, E - e, in us) and compute-thread overlaps of one MXNet profiler dump."""
    ev = json.loads(path.read_text())["traceEvents"]
    dev = {e.get("pid"): (e.get("args") or {}).get("name", "") for e in ev
           if e.get("ph") == "M" and e.get("name") == "process_name"}
    open_: dict[tuple, list] = {}
    spans: dict[str, dict[tuple, list]] = {"sync": collections.defaultdict(list), "async": collections.defaultdict(list)}
    threads: dict[tuple, list] = collections.defaultdict(list)
    for e in ev:
        ph = e.get("ph")
        if e.get("cat") != "operator" or ph not in ("B", "E", "b", "e"):
            continue
        k = (ph in "be", e.get("pid"), e.get("tid"), e.get("name"))
        if ph in "Bb":
            open_.setdefault(k, []).append(e["ts"])
            continue
        t0 = open_[k].pop()
        spans["async" if ph == "e" else "sync"][(k[2], k[3])].append((t0, e["ts"]))
        if ph == "E" and str(dev.get(e.get("pid"), "")).startswith("cpu/"):
            threads[(k[1], k[2])].append((t0, e["ts"]))
    out = {"twins": 0, "begin_gap": [], "end_gap": [], "order_broken": 0, "count_mismatch": 0,
           "compute_pairs": 0, "compute_overlaps": 0}
    for k in spans["sync"].keys() | spans["async"].keys():
        s, a = spans["sync"].get(k, []), spans["async"].get(k, [])
        out["count_mismatch"] += len(s) != len(a)
        for (b0, e0), (b1, e1) in zip(s, a):
            out["twins"] += 1
            out["begin_gap"].append(b1 - b0)
            out["end_gap"].append(e0 - e1)
            out["order_broken"] += not (b0 <= b1 <= e1 <= e0)
    for sp in threads.values():
        sp.sort(key=lambda x: (x[0], -x[1]))
        for x, y in zip(sp, sp[1:]):
            out["compute_pairs"] += 1
            out["compute_overlaps"] += y[0] < x[1]
    return out


def kineto_file(path: Path) -> dict[str, Any]:
    """CPU events and those that cross the end of the range they start in (:func:`kineto.nest`)."""
    from dpro_kit.readers import kineto as K
    tr = K.parse_file(path)
    crossed: list = []
    n = 0
    for evs in tr.cpu.values():
        n += len(evs)
        K.nest(evs, crossed)
    cats = collections.Counter(e.cat for evs in tr.cpu.values() for e in evs)
    K.release(tr)
    return {"cpu_events": n, "crossing": len(crossed), "cats": cats}


def nccl_file(path: Path) -> dict[str, Any]:
    """Steps / states / ops of one NCCL plugin file against the nesting the reader checks (raw file, no checks)."""
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][1:-1]
    by = {k: {d["id"]: d for d in docs if d.get("ev") == k} for k in ("coll", "op", "step")}
    out = collections.Counter()
    for kind, evs in by.items():
        for d in evs.values():
            ts = [t for _, t, _ in d["states"]]
            out[kind + "s"] += 1
            out["states out of order or outside"] += bool(ts) and (ts[0] < d["t0"] or ts[-1] > d["t1"]
                                                                   or any(b < a for a, b in zip(ts, ts[1:])))
    for d in by["op"].values():
        c = by["coll"].get(d["parent"])
        out["op before its coll"] += c is not None and d["t0"] < c["t0"]
    last: dict[Any, dict] = {}
    for d in sorted(by["step"].values(), key=lambda d: (d["parent"], d["step"])):
        op = by["op"].get(d["parent"])
        out["step outside its op"] += op is not None and (d["t0"] < op["t0"] or d["t1"] > op["t1"])
        p = last.get(d["parent"])
        out["step out of step order"] += p is not None and d["t0"] < p["t0"]
        last[d["parent"]] = d
    return dict(out)


def _files(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.is_file() and (q.name == "profile.json" or q.name.endswith(
                (".json.gz", ".jsonl")) or (q.suffix == ".json" and "kineto" in q.name or ".pt.trace" in q.name)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("paths", nargs="+", help="files or folders of real traces")
    args = ap.parse_args(argv)
    mx: list[dict] = []
    kin = collections.Counter()
    cats: collections.Counter = collections.Counter()
    nc = collections.Counter()
    n_files = collections.Counter()
    for f in _files(args.paths):
        try:
            if f.name == "profile.json":
                mx.append(mxnet_dump(f))
                n_files["mxnet"] += 1
            elif f.suffix == ".jsonl":
                nc.update(nccl_file(f))
                n_files["nccl"] += 1
            else:
                r = kineto_file(f)
                kin.update({"cpu_events": r["cpu_events"], "crossing": r["crossing"]})
                cats.update(r["cats"])
                n_files["kineto"] += 1
        except Exception as exc:  # noqa: BLE001 - a broken or foreign file: said and skipped
            print(f"skipped {f}: {str(exc)[:120]}")
    if mx:
        bg = sorted(g for m in mx for g in m["begin_gap"])
        eg = sorted(g for m in mx for g in m["end_gap"])
        q = lambda xs, p: xs[min(len(xs) - 1, int(p * (len(xs) - 1)))]  # noqa: E731
        print(f"MXNet: {n_files['mxnet']} dumps, {sum(m['twins'] for m in mx)} twins; b - B: max {bg[-1]:g} us, "
              f"min {bg[0]:g}; E - e: max {eg[-1]:g} us (median {q(eg, .5):g}, 99 % {q(eg, .99):g}, "
              f"99.9 % {q(eg, .999):g}), min {eg[0]:g}; B <= b <= e <= E broken: "
              f"{sum(m['order_broken'] for m in mx)}; span/twin count mismatches: {sum(m['count_mismatch'] for m in mx)}; "
              f"compute-thread neighbours {sum(m['compute_pairs'] for m in mx)}, overlapping "
              f"{sum(m['compute_overlaps'] for m in mx)}")
    if n_files["kineto"]:
        print(f"Kineto: {n_files['kineto']} files, {kin['cpu_events']} CPU events "
              f"({', '.join(f'{k} {v}' for k, v in cats.most_common())}), crossing the end of their range: "
              f"{kin['crossing']}")
    if n_files["nccl"]:
        print(f"NCCL plugin: {n_files['nccl']} files, " + ", ".join(f"{k} {v}" for k, v in sorted(nc.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
