#!/usr/bin/env python3
"""Focused fuzz of Kineto step ranges (``ProfilerStep#N``), which ``bench/fuzz.py``'s generic mutations
rarely reach (docs/reliability.md, "What the readers check"): every case damages one or two step-range
events of a Kineto file of a seed (NaN / negative / zero / huge times, renamed, swapped, duplicated,
deleted, overlapping, wrong ``ph`` / ``cat`` / ``tid``) and replays it in-process; prints the outcome
counts (``bench/fuzz.py``'s classes) and every case that is not ok / repaired / refused or that replayed
more than 1 % away from the seed without a warning.

    python bench/fuzz_steps.py 150      # cases 0..149 (seeded by the case number)
"""
import copy
import gzip
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz  # noqa: E402

w = Path(tempfile.mkdtemp(prefix="dpro-fuzz-steps"))
os.environ["DPRO_CACHE"] = str(w / "cache")
seeds = fuzz.seed_folders(w / "seeds")
names = [n for n in seeds if n.startswith("kineto") or "h100" in n or n.startswith("ddp")]
base = fuzz.baseline({n: seeds[n] for n in names}, w)

def load(p):
    op = gzip.open if p.suffix == ".gz" else open
    with op(p, "rt") as f:
        return json.load(f)

def dump(p, d):
    op = gzip.open if p.suffix == ".gz" else open
    with op(p, "wt") as f:
        json.dump(d, f)

def steps(doc):
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in evs if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep")]

MUTS = []
def mut(f): MUTS.append(f); return f
@mut
def nan_ts(rng, ss, evs): rng.choice(ss)["ts"] = float("nan")
@mut
def nan_dur(rng, ss, evs): rng.choice(ss)["dur"] = float("nan")
@mut
def neg_dur(rng, ss, evs): rng.choice(ss)["dur"] = -rng.choice([1, 1000, 1e6])
@mut
def zero_dur(rng, ss, evs): rng.choice(ss)["dur"] = 0
@mut
def huge_dur(rng, ss, evs): rng.choice(ss)["dur"] = rng.choice([1e12, 1e18, 2**63])
@mut
def shift_ts(rng, ss, evs): e = rng.choice(ss); e["ts"] = e["ts"] + rng.choice([-1, 1]) * rng.choice([10, 1000, 100000, 1e9])
@mut
def swap_names(rng, ss, evs):
    if len(ss) > 1:
        a, b = rng.sample(ss, 2); a["name"], b["name"] = b["name"], a["name"]
@mut
def dup_step(rng, ss, evs): evs.append(copy.deepcopy(rng.choice(ss)))
@mut
def del_step(rng, ss, evs): evs.remove(rng.choice(ss))
@mut
def rename_bad(rng, ss, evs): rng.choice(ss)["name"] = rng.choice(["ProfilerStep#x", "ProfilerStep#-3", "ProfilerStep#", "ProfilerStep#99999999999999999999", "ProfilerStep#1e3"])
@mut
def overlap(rng, ss, evs):
    s = sorted(ss, key=lambda e: e["ts"])
    if len(s) > 1:
        i = rng.randrange(len(s) - 1); s[i]["dur"] = s[i]["dur"] + (s[i + 1]["ts"] - s[i]["ts"]) * rng.choice([0.5, 1.5])
@mut
def wrong_ph(rng, ss, evs): rng.choice(ss)["ph"] = rng.choice(["i", "B", "E", "M", None, 5])
@mut
def str_ts(rng, ss, evs): rng.choice(ss)["ts"] = str(rng.choice(ss)["ts"])
@mut
def wrong_tid(rng, ss, evs): rng.choice(ss)["tid"] = rng.choice([999, "x", None, -1])
@mut
def del_all(rng, ss, evs):
    for e in ss: evs.remove(e)
@mut
def same_number(rng, ss, evs):
    if len(ss) > 1:
        a, b = rng.sample(ss, 2); b["name"] = a["name"]

counts = {}
bad = []
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for i in range(N):
    rng = random.Random(i)
    name = rng.choice(names)
    case = w / f"c{i}"
    shutil.copytree(seeds[name], case)
    files = [p for p in case.rglob("*.json*") if "trace" in p.name or p.suffix == ".gz" or "rank" in p.name]
    kin = []
    for p in files:
        try:
            d = load(p)
        except Exception:
            continue
        if steps(d): kin.append((p, d))
    if not kin:
        shutil.rmtree(case); continue
    p, d = rng.choice(kin)
    evs = d["traceEvents"] if isinstance(d, dict) else d
    ms = []
    for _ in range(rng.choice([1, 1, 2])):
        ss = steps(d)
        if not ss: break
        f = rng.choice(MUTS); f(rng, ss, evs); ms.append(f.__name__)
    dump(p, d)
    res = fuzz.replay(case, timeout=120)
    kind, detail = fuzz.classify(res, case, set(base[name]["warnings"]))
    change = None
    if kind in ("ok", "repaired"):
        it = float(json.loads(res["stdout"])["iteration_time_ms"]); change = 100 * (it - base[name]["iteration_time_ms"]) / base[name]["iteration_time_ms"]
    counts[kind] = counts.get(kind, 0) + 1
    if kind not in ("ok", "repaired", "refused") or (kind == "ok" and abs(change) > 1):
        bad.append((i, name, p.name, ms, kind, change, (res.get("traceback") or detail)[-600:]))
    shutil.rmtree(case)
print(counts)
for b in bad: print(b)
shutil.rmtree(w, ignore_errors=True)
