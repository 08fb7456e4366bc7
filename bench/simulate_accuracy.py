#!/usr/bin/env python3
"""How well does ``dpro simulate`` predict real strategies?  (issue 16 item 5; docs/simulate.md Validation)

For every model, this runs the REAL job of ``examples/strategies/train.py`` (torch CPU, gloo, one
rank per emulated host, every host a FIXED CPU budget: ``dpro_kit.jobs.run_job(cpus_per_host=C,
cpu_period_us=10000)``; links shaped by ``dpro_kit.cluster.EmulatedCluster``):

1. the single-process job under ``dpro profile --shapes`` (one host, the same CPU budget): the
   simulator's only input; at the model's global batch, and (``--profile-batches auto``, the
   default) again at every per-rank batch the strategies run their ops at (``batch/(dp m)``, and
   ``/tp`` for tensor-parallel ranks), given to ``dpro simulate --profile-at-batch`` so op times are
   measured at the ranks' batch instead of scaled linearly (``--profile-batches none``: one profile);
2. every strategy file (``examples/strategies/<name>.yaml``, the file the real job reads too) at
   every link rate, WITHOUT the profiler, ``--rounds`` times in alternating order (forward, then
   reversed); measured = median over rounds of the job's iteration time (the slowest rank's median
   after warm-up, as train.py timed it);
3. every strategy once more with ``train.py --memory`` on the emulated hosts at the first rate
   (a separate run: its allocator setting slows the iterations): measured peak = the largest
   rank's ``peak_bytes`` (peak anonymous resident growth from before the model was built, glibc
   returning freed blocks >= 64 KiB; train.py's RssPeak);
4. ``dpro simulate TRACE [--profile-at-batch T2 ...] --strategy S.yaml --bandwidth-mbps R --json`` per
   (strategy, rate), when the command exists (else the prediction columns say ``-``; re-fill them later
   from the recorded rows with ``--repredict OUT/rows.json``, which runs no job; ``--reprofile
   OUT/rows.json`` runs only the profiles again, with this run's ``--profile-batches``, and predicts the
   recorded measurements from them);
5. the single process WITHOUT the profiler at every profiled batch (same host budget): measured vs
   ``dpro replay`` of its profile -- how faithful the op times the simulator starts from are, per batch.

``--pin 0,1`` replaces the CPU quota by cores: host ``i`` runs alone on the ``i``-th cpu list
(``dpro_kit.jobs.CpuBudget(cpus=None, cpusets=...)``, no CFS quota, so no throttle stops), and the
single-process runs (profiles and plain) on the first list, the same kind of CPU as a rank.  A
strategy with more ranks than lists is refused (4 ranks cannot run one per core on 2 cores).

Tables: per row measured vs predicted time and error; per (model, rate) the rank order of the
strategies measured vs predicted; per model peak memory measured vs predicted, and OOM verdicts
under a memory cap (``--cap-mib``, default: for each model halfway between the two middle measured
peaks, so some strategies fit and some do not): measured verdict = measured peak > cap (no real OOM is
provoked: the job's allocations are not capped), predicted = ``dpro simulate --memory-limit``.

    python bench/simulate_accuracy.py --models mlp,transformer --strategies ddp-2,fsdp-2,tp-2,gpipe-2,1f1b-2 \\
        --rates 1000,200 --rounds 2 --out bench-simulate
    python bench/simulate_accuracy.py --repredict bench-simulate/rows.json
    python bench/simulate_accuracy.py --pin 0,1 --rounds 1 --prefix sim7 --out bench-pinned   # one core per host
    python bench/simulate_accuracy.py --reprofile bench-simulate/rows.json --models mlp --out bench-reprofile
    python bench/simulate_accuracy.py --remeasure-memory bench-simulate/rows.json --out bench-memory   # memory only
    python bench/simulate_accuracy.py --calibrate bench-simulate/rows.json --pin 0,1 --no-predict --out bench-cal
    python bench/simulate_accuracy.py --repredict bench-cal/rows.json   # predicted with the runtimes' overheads
    python bench/simulate_accuracy.py --calibrate-memory bench-cal/rows.json --memory-rounds 3 --out bench-cmem
    python bench/simulate_accuracy.py --repredict bench-cal/rows.json --link-burst   # links with the tbf's burst
    python bench/simulate_accuracy.py --repredict bench-cal/rows.json --overlap-factor 1000=0.38,200=1.58 --out bench-cal-g  # gamma: bench/overlap_probe.py
    python bench/simulate_accuracy.py --pin 0,1 --profile-rounds 3 --out bench-median   # the median of 3 profiles

``--calibrate ROWS`` measures what each strategy's runtime costs besides the model's ops (DTensor
dispatch, FSDP2's copies and per-call collective cost, the pipelining schedule) on each model's tiny
twin (``train.py --width-div 16``: the same layers and ops on tiny tensors): the twin is profiled and
run under every strategy once, and the overhead is its measured iteration minus ``dpro simulate``'s
prediction of it; ``--repredict`` then passes it as ``--runtime-overhead NAME=MS`` (docs/simulate.md
"Runtime overheads").  Measured once per model and machine, never on the rows it predicts.
``--calibrate-memory ROWS`` does the same for memory: the twin's single process and every strategy under
``train.py --memory`` (loopback, nice 19, no lock); a strategy's runtime memory is the twin's measured peak
minus ``dpro simulate``'s prediction of it, passed as ``--runtime-memory NAME=BYTES`` to the memory rows.

Writes ``OUT/rows.json`` (every measurement, kept traces) after every job, so a cut-off run keeps
what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpro_kit.jobs import run_job  # noqa: E402

TRAIN = ROOT / "examples" / "strategies" / "train.py"
STRATS = ROOT / "examples" / "strategies"
PY = sys.executable
ENV = dict(DPRO_QUIET="1", PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
    [str(ROOT / "collectors" / "torch"), str(ROOT / "collectors" / "common"), str(ROOT),
     os.environ.get("PYTHONPATH", "")]))


def strategy_file(name: str) -> Path:
    p = Path(name)
    return p if p.suffix in (".yaml", ".yml", ".json") else STRATS / f"{name}.yaml"


def strategy_ranks(path: Path) -> int:
    import yaml
    return int(yaml.safe_load(path.read_text())["ranks"])


def strategy_name(path: Path) -> str:
    """The strategy file's ``name`` (what ``dpro simulate --runtime-overhead NAME=MS`` matches)."""
    from dpro_kit.simulate.strategy import load_strategy
    return load_strategy(path).name


def simulate_available() -> bool:
    try:
        import dpro_kit.simulate.predict  # noqa: F401
    except ImportError:
        return False
    return True


#: profiles read once per bench process: trace -> its session (``dpro replay``'s), (trace, at-batch traces) ->
#: (model graph, the profile's link rate): a ``--repredict`` reads each profile once instead of once per row
_SESSIONS: dict[str, Any] = {}
_MODELS: dict[tuple, tuple[Any, float | None]] = {}


def _session(trace: str) -> Any:
    """The trace's session as ``dpro simulate`` / ``dpro replay --no-align`` open it (cached)."""
    if str(trace) not in _SESSIONS:
        from dpro_kit.cli._common import Progress, open_session
        _SESSIONS[str(trace)] = open_session(Path(trace), no_align=True, progress=Progress(False))
    return _SESSIONS[str(trace)]


def _model(trace: str, at_batch: list[str]) -> tuple[Any, float | None]:
    """``dpro simulate``'s model of ``trace`` (op times fitted over ``at_batch``, ``--profile-at-batch``) and the
    profile's link rate (its default when no rate is given), cached."""
    key = (str(trace), tuple(str(t) for t in at_batch))
    if key not in _MODELS:
        from dpro_kit.simulate.model import fit_batches, from_profile
        session = _session(trace)
        model = from_profile(Path(trace), session=session)
        if at_batch:
            fit_batches(model, [from_profile(Path(t), allocator=False) for t in at_batch])
        cm = session.comm_model
        _MODELS[key] = (model, cm.default.bandwidth_Bps if cm is not None and cm.origin != "default" else None)
    return _MODELS[key]


def _num(doc: Any, *keys: str) -> float | None:
    """First of ``keys`` found at the top of ``doc`` (a number)."""
    for k in keys:
        if isinstance(doc, dict) and isinstance(doc.get(k), (int, float)):
            return float(doc[k])
    return None


def model_batch(model: str) -> int:
    """The model's default global batch (``examples/strategies/train.py`` MODELS: what the jobs run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("strategies_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return int(mod.MODELS[model]["batch"])


def rank_fractions(sfiles: list[Path]) -> list[float]:
    """The batch fractions a rank's ops run at under these strategies: ``1/(dp m)`` and, for
    tensor-parallel ranks, ``1/(dp m tp)`` (dpro simulate's rule for split ops), without 1."""
    from dpro_kit.simulate.strategy import load_strategy
    out = set()
    for sf in sfiles:
        st = load_strategy(sf)
        x = 1.0 / (st.dp * st.micro_batches)
        out.add(x)
        if st.tp > 1:
            out.add(x / st.tp)
    return sorted((x for x in out if x < 1.0), reverse=True)


def simulate(trace: str, sfile: Path, rate: float, cap_bytes: int | None, at_batch: list[str] = (),
             profiled_peak: int | None = None, overhead_ms: float | None = None,
             runtime_memory: int | None = None, burst: bool = False, gamma: float = 0.0) -> dict[str, Any]:
    """What ``dpro simulate TRACE --strategy SFILE --bandwidth-mbps RATE --json`` prints, computed in this process
    (the command's own steps, each profile read once: :func:`_model`): predicted ms, peak bytes (largest device),
    OOM verdict (with a cap); ``cmd``: the equivalent command line.  ``profiled_peak``: the single process's
    measured peak (``--profiled-peak``); ``overhead_ms``: the strategy runtime's measured overhead
    (``--runtime-overhead``, from ``--calibrate``); ``runtime_memory``: its measured memory (``--runtime-memory``,
    from ``--calibrate-memory``); ``burst``: the emulated links' tbf burst at ``rate``
    (``dpro_kit.cluster.tbf_params``) as ``--link-burst``; ``gamma``: the overlap factor at ``rate``
    (``--overlap-factor``, measured: :func:`overlap_factors`)."""
    from dpro_kit.cluster import tbf_params
    from dpro_kit.simulate.predict import pick_device_model, predict as sim_predict, with_measured_peak
    from dpro_kit.simulate.strategy import load_strategy
    cmd = ["simulate", trace] + [a for t in at_batch for a in ("--profile-at-batch", t)] + [
        "--strategy", str(sfile), "--bandwidth-mbps", f"{rate:g}", "--json"]
    ovh = None if overhead_ms is None else round(float(overhead_ms), 3)    # as the option carries it
    link_burst = tbf_params(rate)["burst"] if burst else None
    if ovh is not None:
        cmd += ["--runtime-overhead", f"{strategy_name(sfile)}={ovh:.3f}"]
    if link_burst:
        cmd += ["--link-burst", str(link_burst)]
    if gamma:
        cmd += ["--overlap-factor", f"{gamma:g}"]
    if runtime_memory is not None:
        cmd += ["--runtime-memory", f"{strategy_name(sfile)}={max(0, int(runtime_memory))}"]
    if cap_bytes is not None:
        cmd += ["--memory-limit", str(int(cap_bytes))]
    if profiled_peak is not None:
        cmd += ["--profiled-peak", str(int(profiled_peak))]
    try:
        model, default_bw = _model(trace, list(at_batch))
        if profiled_peak is not None:
            model = with_measured_peak(model, int(profiled_peak))
        p = sim_predict(model, load_strategy(sfile), bandwidth_mbps=rate, default_bandwidth_Bps=default_bw,
                        memory_limit=None if cap_bytes is None else int(cap_bytes), device_model=pick_device_model(),
                        runtime_overhead_ms=ovh, runtime_memory=None if runtime_memory is None else max(0, int(runtime_memory)),
                        link_burst=link_burst, overlap_factor=float(gamma))
    except Exception as e:     # noqa: BLE001 - a row's failure is recorded, the others are still predicted
        return {"error": f"{type(e).__name__}: {str(e)[-300:]}", "cmd": " ".join(cmd)}
    return {"ms": round(p.iteration_ms, 4), "peak_bytes": float(p.peak_memory_bytes), "oom": p.oom,
            "cmd": " ".join(cmd)}


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        a.out.mkdir(parents=True, exist_ok=True)
        self.log = open(a.out / "jobs.log", "a")
        self.n = 0

    def job(self, model: str, sfile: Path | None, ranks: int, rate: float | None, *, memory: bool = False,
            profile: bool = False, batch: int | None = None, width_div: int = 1) -> dict[str, Any]:
        a = self.a
        self.n += 1
        tag = f"{self.n:03d}-{model}-{sfile.stem if sfile else 'single'}-{'prof' if profile else 'mem' if memory else 'plain' if rate is None else f'{rate:g}'}"
        if batch is not None:
            tag += f"-b{batch}"
        if width_div > 1:
            tag += f"-w{width_div}"
        jdir = a.out / tag
        jdir.mkdir(exist_ok=True)
        times = jdir / "times.json"
        # profiled: warm-up, the window, its export and the --shapes iteration, then --post-steps unprofiled
        # iterations: the reader measures the profiler's cost on this process from them ("window" mode,
        # docs/simulate.md "Where the error comes from"); without them it subtracts only the calibration loop's
        iters = a.prof_start + a.prof_steps + 2 + a.post_steps - a.warmup if profile else a.iters
        argv = [PY, str(TRAIN), "--model", model, "--warmup", str(a.warmup), "--iters", str(iters),
                "--threads", "1", "--quiet", "--json-out", str(times)]
        if sfile is not None:
            argv += ["--strategy", str(sfile)]
        if batch is not None:
            argv += ["--batch-size", str(batch)]
        if memory:
            argv.append("--memory")
        if width_div > 1:
            argv += ["--width-div", str(width_div)]
        trace = jdir / "trace"
        print(f"  job {tag} ...", end="", flush=True)
        self.log.write(f"\n=== {tag}: {' '.join(argv)}\n")
        self.log.flush()
        res = run_job(argv, hosts=ranks, ranks_per_host=1, rate_mbit=rate, cpus_per_host=None if a.pin else a.cpus,
                      cpusets=a.pin[:ranks] if a.pin else None,
                      cpu_period_us=a.period_us, cpu_shares=a.shares, profile=trace if profile else None,
                      steps=f"{a.prof_start}:{a.prof_start + a.prof_steps}",
                      profile_flags=["--shapes"] if profile else (), env=ENV, log=self.log,
                      timeout=a.job_timeout, prefix=a.prefix)
        if not times.exists() or (profile and not (trace / "manifest.json").exists()):
            print(" FAILED")
            raise RuntimeError(f"job {tag} failed (exit codes {res.codes}); see {a.out / 'jobs.log'}")
        doc = json.loads(times.read_text())
        row = {"tag": tag, "ms": doc["iteration_ms"], "per_rank_ms": doc["per_rank_median_ms"],
               "peak_rss_mib": doc["peak_rss_mib"], "peak_bytes": max(doc["peak_bytes"].values()) if memory else None,
               "wall_s": res.wall_s}
        if profile:
            row["trace"] = str(trace)
            row["batch"] = batch
            meas = _profile_measured(trace)
            row["profiled_window_ms"] = meas.get("profiled_ms")
            row["unprofiled_ms"] = meas.get("unprofiled_ms")
        print(f" {row['ms']:.2f} ms ({res.wall_s:.0f} s)", flush=True)
        return row


def _profile_measured(trace: Path) -> dict[str, float | None]:
    """The profiled process's own step times (the collector's ``meta.json`` ``measured``): the median profiled
    and unprofiled iteration, ms (None where absent: no unprofiled step after warm-up outside the window)."""
    out: dict[str, float | None] = {"profiled_ms": None, "unprofiled_ms": None}
    for meta in sorted(Path(trace).glob("*/*/meta.json")):
        m = (json.loads(meta.read_text()).get("measured") or {})
        for k, key in (("profiled_ms", "median_profiled_us"), ("unprofiled_ms", "median_unprofiled_us")):
            if isinstance(m.get(key), (int, float)):
                out[k] = round(m[key] / 1e3, 3)
        break
    return out


def pct(p: float | None, m: float | None) -> float | None:
    return None if p is None or not m else round(100.0 * (p / m - 1.0), 2)


def order(d: dict[str, float | None]) -> list[str] | None:
    if any(v is None for v in d.values()):
        return None
    return sorted(d, key=lambda k: d[k])


def _sfile(r: dict[str, Any]) -> Path:
    """The row's strategy file; this checkout's copy when the recorded path is gone (another checkout)."""
    p = Path(r["strategy_file"])
    return p if p.exists() else STRATS / p.name


def predict(rows: dict[str, Any], at_batch: bool = True) -> None:
    """Fill the prediction columns of every row from ``dpro simulate`` (nothing if it does not exist);
    ``at_batch`` False: from the global-batch profile alone (op times linear in the batch)."""
    if not simulate_available():
        rows["simulate"] = "dpro simulate not available in this checkout: prediction columns empty"
        return
    rows["simulate"] = "dpro simulate"
    for r in rows.get("single", []):
        r["replay_ms"] = replay_ms(r["trace"])
    extra = (rows.get("profiles_at_batch") or {}) if at_batch else {}
    rows["simulate"] = "dpro simulate" + ("" if at_batch else " (global-batch profile only: --profile-batches none)")
    ovh = calibrated_overheads(rows, at_batch) if rows.get("calibration") else {}
    if ovh:
        rows["simulate"] += " with --runtime-overhead from --calibrate"
    burst = bool(rows.get("link_burst"))
    if burst:
        rows["simulate"] += ", --link-burst = the emulated links' tbf burst"
    gam = overlap_factors(rows)
    if gam:
        rows["simulate"] += ", --overlap-factor " + ", ".join(f"{g:g} at {r} Mbit/s" for r, g in gam.items())
    for r in rows["time"]:
        trace = rows["profiles"][r["model"]]["trace"]
        cap = rows["caps"].get(r["model"])
        r["pred"] = simulate(trace, _sfile(r), r["rate"], cap, [p["trace"] for p in extra.get(r["model"], [])],
                             overhead_ms=(ovh.get(r["model"]) or {}).get(r["strategy"]), burst=burst,
                             gamma=gam.get(f"{r['rate']:g}", 0.0))
    single = rows.get("single_memory") or {}
    rmem = calibrated_memory(rows, at_batch)
    if rmem:
        rows["simulate"] += ", --runtime-memory from --calibrate-memory"
    for r in rows["memory"]:
        trace = rows["profiles"][r["model"]]["trace"]
        rate = rows["rates"][0]
        r["pred"] = simulate(trace, _sfile(r), rate, rows["caps"].get(r["model"]),
                             [p["trace"] for p in extra.get(r["model"], [])],
                             (single.get(r["model"]) or {}).get("peak_bytes"),
                             runtime_memory=(rmem.get(r["model"]) or {}).get(r["strategy"]))


def calibrate(a: argparse.Namespace, rows: dict[str, Any], models: list[str]) -> None:
    """The strategy runtimes' own cost, measured once per model on its tiny-width twin (``train.py
    --width-div``: every width / ``a.width_div``, the same layers, Linears, parameter tensors, batch and
    sequence, so the same ops and runtime calls on tiny tensors): the single process profiled as for the
    full model (``--profile-batches``), and every strategy of ``rows`` once at the first rate, on the same
    emulated hosts.  ``rows["calibration"][model]``: the tiny profiles and each strategy's measured
    iteration; :func:`calibrated_overheads` turns them into overheads (no job)."""
    b = Bench(a)
    sfiles = sorted({_sfile(r) for r in rows["time"]})
    rate = rows["rates"][0]
    cal = rows.setdefault("calibration", {})
    for model in models:
        batch = model_batch(model)
        print(f"== {model} / {a.width_div} (tiny twin): profiles and one run per strategy at {rate:g} Mbit/s, "
              f"{budget(a)}", flush=True)
        c: dict[str, Any] = {"width_div": a.width_div, "rate": rate, "started_utc": time.strftime(
            "%Y-%m-%d %H:%M:%S", time.gmtime())}
        old = cal.get(model) or {}
        if a.keep_profiles and old.get("width_div") == a.width_div and old.get("profile"):
            c["profile"], c["profiles_at_batch"] = old["profile"], old.get("profiles_at_batch", [])
            c["profiles_from"] = old.get("started_utc")
        else:
            c["profile"] = b.job(model, None, 1, None, profile=True, batch=batch, width_div=a.width_div)
            c["profiles_at_batch"] = []
        if a.profile_batches == "auto" and "profiles_from" not in c:
            for x in rank_fractions(sfiles):
                bx = batch * x
                if abs(bx - round(bx)) < 1e-9 and round(bx) >= 1:
                    c["profiles_at_batch"].append(b.job(model, None, 1, None, profile=True, batch=int(round(bx)),
                                                        width_div=a.width_div))
        c["strategies"] = {}
        runs: dict[str, list[dict[str, Any]]] = {sf.stem: [] for sf in sfiles}
        for rnd in range(a.cal_rounds):    # alternating order, as the timed rows' rounds
            for sf in (sfiles if rnd % 2 == 0 else sfiles[::-1]):
                runs[sf.stem].append(b.job(model, sf, strategy_ranks(sf), rate, width_div=a.width_div))
        for sf in sfiles:
            js = runs[sf.stem]
            c["strategies"][sf.stem] = {"strategy_file": str(sf), "measured_ms": statistics.median(j["ms"] for j in js),
                                        "rounds_ms": [j["ms"] for j in js], "tag": js[0]["tag"]}
        c["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        cal[model] = c
        save(a, rows)


def overlap_factors(rows: dict[str, Any]) -> dict[str, float]:
    """Proteus' overlap factor per link rate (``"1000"`` -> gamma), as ``rows["overlap_factor"]`` holds it (given
    with ``--overlap-factor``): the twins' overheads and the rows are predicted with it."""
    return {f"{float(k):g}": float(v) for k, v in (rows.get("overlap_factor") or {}).items()}


def calibrated_overheads(rows: dict[str, Any], at_batch: bool = True) -> dict[str, dict[str, float]]:
    """Per model and strategy: the runtime overhead (ms per rank and iteration) = the tiny twin's measured
    iteration minus ``dpro simulate``'s prediction of it without overhead (from the twin's own profiles, at
    the calibration's rate), at least 0 -- what the simulator misses on a job whose compute and bytes are
    negligible: the runtime's own CPU time and the per-call cost of its collectives.  Measured once per
    model and machine, never on the rows being predicted.  Stored back into ``rows["calibration"]``."""
    out: dict[str, dict[str, float]] = {}
    for model, c in (rows.get("calibration") or {}).items():
        extra = [p["trace"] for p in c.get("profiles_at_batch", [])] if at_batch else []
        for name, sr in c["strategies"].items():
            sf = Path(sr["strategy_file"])
            sf = sf if sf.exists() else STRATS / sf.name
            pr = simulate(c["profile"]["trace"], sf, c["rate"], None, extra, burst=bool(rows.get("link_burst")),
                          gamma=overlap_factors(rows).get(f"{c['rate']:g}", 0.0))
            sr["predicted_ms"] = pr.get("ms")
            sr["overhead_ms"] = None if pr.get("ms") is None else round(max(0.0, sr["measured_ms"] - pr["ms"]), 3)
            if sr["overhead_ms"] is not None:
                out.setdefault(model, {})[name] = sr["overhead_ms"]
    return out


def memory_run(model: str, sfile: Path | None, ranks: int, out: Path, iters: int, warmup: int, width_div: int = 1,
               rounds: int = 1) -> dict[str, Any]:
    """``rounds`` ``train.py --memory`` runs on loopback under ``nice -n 19`` (memory does not depend on the CPU
    share or the link: the emulated hosts are not needed, and the run takes no bench lock): the largest rank's
    ``peak_bytes``, the median over the rounds (a run's peak moves by ~0.1-0.5 MiB: docs/simulate.md)."""
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{model}-{sfile.stem if sfile else 'single'}" + (f"-w{width_div}" if width_div > 1 else "")
    peaks, per_rank, rss, argv = [], [], [], []
    for k in range(rounds):
        times = out / f"mem-{tag}{f'-{k}' if k else ''}.json"
        argv = ["nice", "-n", "19", PY, str(TRAIN), "--model", model, "--memory", "--ranks", str(ranks), "--warmup",
                str(warmup), "--iters", str(iters), "--threads", "1", "--quiet", "--json-out", str(times)]
        if sfile is not None:
            argv += ["--strategy", str(sfile)]
        if width_div > 1:
            argv += ["--width-div", str(width_div)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**os.environ, **ENV})
        if p.returncode != 0 or not times.exists():
            raise RuntimeError(f"memory run {tag} failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        doc = json.loads(times.read_text())
        peaks.append(max(doc["peak_bytes"].values()))
        per_rank.append(doc["peak_bytes"])
        rss.append(doc["peak_rss_mib"])
    peak = int(statistics.median(peaks))
    print(f"  memory {tag}: {peak / 2**20:.2f} MiB" + (f" (median of {', '.join(f'{x / 2**20:.2f}' for x in peaks)})"
                                                      if rounds > 1 else ""), flush=True)
    return {"peak_bytes": peak, "rounds_bytes": peaks, "per_rank": per_rank[peaks.index(sorted(peaks)[len(peaks) // 2])],
            "peak_rss_mib": rss[0], "cmd": " ".join(argv[3:])}


def remeasure_memory(a: argparse.Namespace, rows: dict[str, Any], models: list[str]) -> None:
    """Peak memory again, every strategy of ``rows`` and the single process (the profiled configuration,
    ``--profiled-peak``), with this checkout's ``train.py``; caps recomputed from the new peaks."""
    rows.setdefault("single_memory", {})
    for model in models:
        rows["single_memory"][model] = memory_run(model, None, 1, a.out, a.iters, a.warmup, rounds=a.memory_rounds)
        for r in rows["memory"]:
            if r["model"] == model:
                j = memory_run(model, _sfile(r), strategy_ranks(_sfile(r)), a.out, a.iters, a.warmup,
                               rounds=a.memory_rounds)
                r.update(measured_peak_bytes=j["peak_bytes"], peak_rss_mib=j["peak_rss_mib"], memory_cmd=j["cmd"],
                         rounds_bytes=j["rounds_bytes"])
        peaks = sorted(r["measured_peak_bytes"] for r in rows["memory"] if r["model"] == model)
        k = max(1, len(peaks) // 2)
        rows["caps"][model] = int(a.cap_mib * 2**20) if a.cap_mib else int((peaks[k - 1] + peaks[min(k, len(peaks) - 1)]) / 2)


def calibrate_memory(a: argparse.Namespace, rows: dict[str, Any], models: list[str]) -> None:
    """The strategy runtimes' own memory, measured once per model on its tiny twin (the twin of ``--calibrate``:
    its profiles and width, which ``rows`` must hold): the single process and every strategy of ``rows`` with
    ``train.py --memory --width-div`` (:func:`memory_run`: loopback, nice 19, no lock).  Stored in
    ``rows["calibration"][model]["memory"]``; :func:`calibrated_memory` turns them into bytes (no job)."""
    sfiles = sorted({_sfile(r) for r in rows["memory"]})
    for model in models:
        c = (rows.get("calibration") or {}).get(model)
        if not c:
            raise SystemExit(f"{model}: no twin in ROWS (run --calibrate first: its profiles are the twin's model)")
        w = c["width_div"]
        print(f"== {model} / {w} (tiny twin): peak memory, single process and every strategy", flush=True)
        cm: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "strategies": {}}
        cm["single"] = memory_run(model, None, 1, a.out, a.iters, a.warmup, width_div=w, rounds=a.memory_rounds)
        for sf in sfiles:
            cm["strategies"][sf.stem] = {"strategy_file": str(sf), **memory_run(
                model, sf, strategy_ranks(sf), a.out, a.iters, a.warmup, width_div=w, rounds=a.memory_rounds)}
        cm["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        c["memory"] = cm
        save(a, rows)


def calibrated_memory(rows: dict[str, Any], at_batch: bool = True) -> dict[str, dict[str, int]]:
    """Per model and strategy: the runtime memory (bytes per rank) = the tiny twin's measured peak (largest rank)
    minus ``dpro simulate``'s prediction of it (its own profiles, ``--profiled-peak`` = the twin's single process),
    at least 0 -- what a strategy's runtime holds that the single process does not and no part of the model is
    (DTensor's and FSDP2's Python state, the pipelining runtime's buffers).  Measured once per model, never on
    the rows it predicts.  Stored back into ``rows["calibration"][model]["memory"]``."""
    out: dict[str, dict[str, int]] = {}
    for model, c in (rows.get("calibration") or {}).items():
        cm = c.get("memory")
        if not cm:
            continue
        extra = [p["trace"] for p in c.get("profiles_at_batch", [])] if at_batch else []
        for name, sr in cm["strategies"].items():
            sf = Path(sr["strategy_file"])
            sf = sf if sf.exists() else STRATS / sf.name
            pr = simulate(c["profile"]["trace"], sf, c["rate"], None, extra, cm["single"]["peak_bytes"])
            sr["predicted_bytes"] = pr.get("peak_bytes")
            if pr.get("peak_bytes") is not None:
                sr["runtime_memory_bytes"] = int(max(0, sr["peak_bytes"] - pr["peak_bytes"]))
                out.setdefault(model, {})[name] = sr["runtime_memory_bytes"]
    return out


def f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def tables(rows: dict[str, Any]) -> str:
    used = "(global-batch profile only" not in str(rows.get("simulate"))
    prof = "; ".join(f"{m}: batch {p.get('batch') or 'default'}"
                     + "".join(f", {q['batch']}" for q in (rows.get("profiles_at_batch") or {}).get(m, []) if used)
                     for m, p in rows["profiles"].items())
    out = [f"prediction: {rows.get('simulate', '-')}; profiles ({prof})", "",
           "| model | strategy | ranks | Mbit/s | measured ms | rounds | predicted ms | error % |",
           "|---|---|---|---|---|---|---|---|"]
    errs = []
    for r in rows["time"]:
        p = (r.get("pred") or {}).get("ms")
        e = pct(p, r["measured_ms"])
        if e is not None:
            errs.append(abs(e))
        out.append(f"| {r['model']} | {r['strategy']} | {r['ranks']} | {r['rate']:g} | {r['measured_ms']:.2f} | "
                   f"{', '.join(f'{x:.1f}' for x in r['rounds_ms'])} | {f(p)} | {f(e, '{:+.1f}')} |")
    if errs:
        out.append(f"\nabs error: mean {statistics.mean(errs):.1f} %, max {max(errs):.1f} % over {len(errs)} rows")
    out += ["", "| model | Mbit/s | measured order (fastest first) | predicted order | same |", "|---|---|---|---|---|"]
    groups: dict[tuple, dict] = {}
    for r in rows["time"]:
        g = groups.setdefault((r["model"], r["rate"]), {"m": {}, "p": {}})
        g["m"][r["strategy"]] = r["measured_ms"]
        g["p"][r["strategy"]] = (r.get("pred") or {}).get("ms")
    for (model, rate), g in groups.items():
        mo, po = order(g["m"]), order(g["p"])
        out.append(f"| {model} | {rate:g} | {' < '.join(mo or [])} | {' < '.join(po) if po else '-'} | "
                   f"{'-' if po is None else 'yes' if po == mo else 'NO'} |")
    if rows.get("calibration"):
        out += ["", "runtime overheads (tiny twins, `--calibrate`): measured vs predicted without overhead", "",
                "| model | width / | strategy | Mbit/s | tiny measured ms | tiny predicted ms | overhead ms |",
                "|---|---|---|---|---|---|---|"]
        for model, c in rows["calibration"].items():
            for name, sr in c["strategies"].items():
                out.append(f"| {model} | {c['width_div']} | {name} | {c['rate']:g} | {sr['measured_ms']:.2f} | "
                           f"{f(sr.get('predicted_ms'))} | {f(sr.get('overhead_ms'))} |")
    if any(c.get("memory") for c in (rows.get("calibration") or {}).values()):
        out += ["", "runtime memory (tiny twins, `--calibrate-memory`): measured vs predicted without it", "",
                "| model | width / | strategy | tiny measured MiB | tiny predicted MiB | runtime memory MiB |",
                "|---|---|---|---|---|---|"]
        for model, c in rows["calibration"].items():
            cm = c.get("memory") or {}
            if cm:
                out.append(f"| {model} | {c['width_div']} | single | {cm['single']['peak_bytes'] / 2**20:.2f} | - | - |")
            for name, sr in (cm.get("strategies") or {}).items():
                pb, rb = sr.get("predicted_bytes"), sr.get("runtime_memory_bytes")
                out.append(f"| {model} | {c['width_div']} | {name} | {sr['peak_bytes'] / 2**20:.2f} | "
                           f"{f(pb / 2**20 if pb is not None else None)} | {f(rb / 2**20 if rb is not None else None)} |")
    if rows.get("single"):
        out += ["", "single process, no profiler, one host at the same budget, vs `dpro replay` of its profile:", "",
                "| model | batch | measured ms | profiled window ms | unprofiled steps of the profiled run ms | "
                "dpro replay ms | error % |", "|---|---|---|---|---|---|---|"]
        for r in rows["single"]:
            out.append(f"| {r['model']} | {r['batch']} | {r['measured_ms']:.2f} | {r['profiled_window_ms']:.2f} | "
                       f"{f(r.get('unprofiled_in_profile_ms'))} | "
                       f"{f(r.get('replay_ms'))} | {f(pct(r.get('replay_ms'), r['measured_ms']), '{:+.1f}')} |")
    for model, sm in (rows.get("single_memory") or {}).items():
        out.append(f"\n{model}: the single process (profiled configuration) measured {sm['peak_bytes'] / 2**20:.2f} MiB "
                   f"(`{sm['cmd']}`), given as --profiled-peak")
    out += ["", "| model | strategy | measured peak MiB (largest rank) | predicted MiB | error % | cap MiB | "
                "measured OOM | predicted OOM |", "|---|---|---|---|---|---|---|---|"]
    for r in rows["memory"]:
        cap = rows["caps"].get(r["model"])
        pr = r.get("pred") or {}
        pb = pr.get("peak_bytes")
        m = r["measured_peak_bytes"]
        out.append(f"| {r['model']} | {r['strategy']} | {m / 2**20:.2f} | {f(pb / 2**20 if pb else None)} | "
                   f"{f(pct(pb, m), '{:+.1f}')} | {cap / 2**20:.2f} | {'OOM' if m > cap else 'fits'} | "
                   f"{'-' if pr.get('oom') is None else 'OOM' if pr['oom'] else 'fits'} |")
    return "\n".join(out)


def replay_ms(trace: str) -> float | None:
    """``dpro replay TRACE --no-align --json``'s ``iteration_time_ms`` (the profile's own predicted iteration, the
    1-rank simulation), computed in this process on the cached session."""
    try:
        return _session(trace).replay(1).iteration_time_us / 1e3
    except Exception:     # noqa: BLE001
        return None


def single_rows(a: argparse.Namespace, b: Bench, rows: dict[str, Any], model: str) -> None:
    """The single process without the profiler at every profiled batch: ``rows["single"]``."""
    for p in [rows["profiles"][model]] + (rows.get("profiles_at_batch") or {}).get(model, []):
        j = b.job(model, None, 1, None, batch=p.get("batch"))
        rows.setdefault("single", []).append({"model": model, "batch": p.get("batch"), "measured_ms": j["ms"],
                                              "profiled_window_ms": p.get("profiled_window_ms") or p["ms"],
                                              "unprofiled_in_profile_ms": p.get("unprofiled_ms"), "trace": p["trace"]})


def profile_job(a: argparse.Namespace, b: Bench, model: str, batch: int) -> dict[str, Any]:
    """One single-process profile at ``batch``; with ``--profile-rounds N``, N of them and the one whose process ran
    its unprofiled iterations (after the window: its speed without the profiler) at the median speed -- one
    process's speed on this machine varies by 20 % from run to run (docs/simulate.md sim12), and the simulator
    takes every op time of every rank from the profile it is given."""
    runs = [b.job(model, None, 1, None, profile=True, batch=batch) for _ in range(max(1, a.profile_rounds))]
    if len(runs) == 1:
        return runs[0]
    keyed = sorted(runs, key=lambda j: j.get("unprofiled_ms") if j.get("unprofiled_ms") is not None else j["ms"])
    pick = dict(keyed[(len(keyed) - 1) // 2])
    pick["rounds_unprofiled_ms"] = [j.get("unprofiled_ms") for j in runs]
    pick["rounds_tags"] = [j["tag"] for j in runs]
    return pick


def profile_model(a: argparse.Namespace, b: Bench, rows: dict[str, Any], model: str, sfiles: list[Path]) -> None:
    """The single process under ``dpro profile --shapes`` at the global batch and (``--profile-batches auto``)
    at every per-rank batch of ``sfiles``: ``rows["profiles"][model]``, ``rows["profiles_at_batch"][model]``."""
    batch = model_batch(model)
    print(f"== {model}: single-process profile (--shapes) at {budget(a)}, batch {batch}", flush=True)
    rows["profiles"][model] = profile_job(a, b, model, batch)
    rows["single"] = [r for r in rows.get("single", []) if r["model"] != model]
    extra = []
    if a.profile_batches == "auto":
        for x in rank_fractions(sfiles):
            bx = batch * x
            if abs(bx - round(bx)) > 1e-9 or round(bx) < 1:
                print(f"   (no profile at {x:g} of batch {batch}: not an integer batch)", flush=True)
                continue
            extra.append(profile_job(a, b, model, int(round(bx))))
    rows.setdefault("profiles_at_batch", {})[model] = extra
    single_rows(a, b, rows, model)


def budget(a: argparse.Namespace) -> str:
    """The hosts' CPU budget in words (for the progress lines)."""
    return f"pinned to cores {','.join(a.pin)}, no quota" if a.pin else f"{a.cpus:g} CPU (period {a.period_us} us)"


def save(a: argparse.Namespace, rows: dict[str, Any]) -> None:
    tmp = a.out / "rows.json.tmp"
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, a.out / "rows.json")


def finish(a: argparse.Namespace, rows: dict[str, Any], at_batch: bool = True) -> int:
    """The end of every mode that measured something: with ``--no-predict`` say how to predict later,
    else fill the prediction columns (:func:`predict`), write ``--out/rows.json`` and print the tables."""
    if a.no_predict:
        print(f"measured; predict with: {Path(sys.argv[0]).name} --repredict {a.out / 'rows.json'}")
        return 0
    predict(rows, at_batch=at_batch)
    save(a, rows)
    text = tables(rows)
    (a.out / "tables.md").write_text(text + "\n")
    print(text)
    return 0


def _rate_values(text: str) -> dict[str, float]:
    """``1000=0.41,200=1.87`` -> {"1000": 0.41, "200": 1.87} (argparse type)."""
    out = {}
    for item in text.split(","):
        k, eq, v = item.partition("=")
        try:
            out[f"{float(k):g}"] = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected RATE=VALUE") from None
        if not eq or out[f"{float(k):g}"] < 0:
            raise argparse.ArgumentTypeError(f"{item!r}: expected RATE=VALUE with VALUE >= 0")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--strategies", default="ddp-2,fsdp-2,tp-2,gpipe-2,1f1b-2",
                    help="strategy files: names in examples/strategies/ or paths")
    ap.add_argument("--rates", default="1000,200", help="link rates (Mbit/s)")
    ap.add_argument("--cpus", type=float, default=0.5, help="CPU budget of every host (and of the profiled process)")
    ap.add_argument("--period-us", type=int, default=10000)
    ap.add_argument("--pin", default="", metavar="LAYOUT",
                    help="pin the hosts to cores instead of a CPU quota: one kernel cpu list per host, comma-separated "
                         "(0,1: host0 on CPU 0, host1 on CPU 1; the single-process profiles and plain runs on the "
                         "first list, so they run on the same kind of CPU as a rank); no CFS quota then (--cpus and "
                         "--period-us are ignored; dpro_kit.jobs.CpuBudget cpusets, docs/simulate.md \"pinned\")")
    ap.add_argument("--shares", type=int, default=8192, help="cpu.shares of the job's cgroup parent")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--prof-start", type=int, default=5)
    ap.add_argument("--prof-steps", type=int, default=5)
    ap.add_argument("--profile-rounds", type=int, default=1,
                    help="profiles per batch; the one whose process ran its unprofiled iterations at the median speed "
                         "is used (one process's speed varies by ~20 %% between runs here: docs/simulate.md sim12)")
    ap.add_argument("--post-steps", type=int, default=8,
                    help="unprofiled iterations after the profiled window (and its export / --shapes iteration) in "
                         "the single-process profiles: the reader measures the profiler's cost on them and takes it "
                         "out of the op times (0: only the calibration loop's cost is taken out, the profile's op "
                         "times carry the rest; docs/simulate.md)")
    ap.add_argument("--cap-mib", type=float, default=None, help="memory cap for the OOM verdicts (default: per model "
                    "the median of the measured peaks)")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--profile-batches", choices=["auto", "none"], default="auto",
                    help="auto: profile the single process also at every per-rank batch of the strategies (dpro "
                         "simulate --profile-at-batch); none: only at the global batch (op times linear in the batch)")
    ap.add_argument("--prefix", default="sv", help="name prefix of the emulated hosts' cgroups and namespaces")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of rows.json and tables.md (default bench-simulate; --repredict ROWS: ROWS's folder "
                         "name + -repredict beside it; never ROWS's own folder)")
    ap.add_argument("--repredict", type=Path, default=None,
                    help="rows.json of an earlier run: predict and print, no job (in this process, each profile read "
                         "once); writes --out/rows.json and --out/tables.md, not into ROWS's folder")
    ap.add_argument("--reprofile", type=Path, default=None,
                    help="rows.json of an earlier run: run only the profiles again (--models, --profile-batches) into "
                         "--out and predict that run's measurements from them")
    ap.add_argument("--remeasure-memory", type=Path, default=None, metavar="ROWS",
                    help="rows.json of an earlier run: measure peak memory again (every strategy and the single "
                         "process, train.py --memory on loopback at nice 19: no emulated hosts, no lock needed), "
                         "recompute the caps, predict with --profiled-peak, write --out/rows.json")
    ap.add_argument("--calibrate", type=Path, default=None, metavar="ROWS",
                    help="rows.json of an earlier run: measure the strategy runtimes' overheads on each model's tiny "
                         "twin (train.py --width-div; profiles + one run per strategy at the first rate, the same "
                         "hosts: needs the lock), then predict ROWS's measurements with them (--runtime-overhead); "
                         "writes --out/rows.json")
    ap.add_argument("--calibrate-memory", type=Path, default=None, metavar="ROWS",
                    help="rows.json with a --calibrate twin: measure the strategy runtimes' memory on each model's "
                         "tiny twin (train.py --memory --width-div, the single process and every strategy, loopback "
                         "at nice 19: no lock needed), then predict ROWS's memory rows with it (--runtime-memory); "
                         "writes --out/rows.json")
    ap.add_argument("--overlap-factor", type=_rate_values, default=None, metavar="RATE=G,...",
                    help="Proteus' overlap factor per link rate (dpro simulate --overlap-factor at that rate; e.g. "
                         "1000=0.41,200=1.87), for the twins' overheads and the rows; stored in rows.json")
    ap.add_argument("--link-burst", action="store_true",
                    help="predict with the emulated links' token bucket (dpro simulate --link-burst = the tbf burst "
                         "of dpro_kit.cluster.tbf_params at each rate; the twins' overheads likewise); stored in "
                         "rows.json, so --repredict keeps it")
    ap.add_argument("--memory-rounds", type=int, default=1,
                    help="--remeasure-memory, --calibrate-memory: runs per configuration (measured = the median)")
    ap.add_argument("--width-div", type=int, default=16, help="--calibrate: the tiny twin's width divisor")
    ap.add_argument("--cal-rounds", type=int, default=1,
                    help="--calibrate: runs per strategy of the twin (alternating order; measured = their median)")
    ap.add_argument("--keep-profiles", action="store_true",
                    help="--calibrate: reuse the twin profiles ROWS already has (same --width-div) instead of "
                         "profiling again; only the strategies run")
    ap.add_argument("--no-predict", action="store_true",
                    help="run the jobs and stop (no dpro simulate / replay: those need no lock on a shared machine); "
                         "predict later with --repredict OUT/rows.json")
    a = ap.parse_args(argv)
    a.pin = [x.strip() for x in a.pin.split(",")] if a.pin else None
    if a.out is None and not a.repredict:
        a.out = Path("bench-simulate")
    if a.calibrate:
        rows = json.loads(a.calibrate.read_text())
        rows["measured_in"] = rows.get("measured_in") or str(a.calibrate)
        models = [m for m in a.models.split(",") if m and m in rows["profiles"]]
        calibrate(a, rows, models)
        return finish(a, rows)
    if a.calibrate_memory:
        rows = json.loads(a.calibrate_memory.read_text())
        models = [m for m in a.models.split(",") if m and m in rows["profiles"]]
        a.out.mkdir(parents=True, exist_ok=True)
        calibrate_memory(a, rows, models)
        save(a, rows)
        return finish(a, rows)
    if a.pin and not (a.repredict or a.reprofile):
        need = max(strategy_ranks(strategy_file(s)) for s in a.strategies.split(",") if s)
        if len(a.pin) < need:
            ap.error(f"--pin: {len(a.pin)} cpu lists for {need} hosts (one per host, e.g. 0,1; a strategy of "
                     f"{need} ranks cannot be pinned one host per list)")
    if a.reprofile:
        rows = json.loads(a.reprofile.read_text())
        rows["measured_in"] = str(a.reprofile)
        b = Bench(a)
        models = [m for m in a.models.split(",") if m]
        rows["time"] = [r for r in rows["time"] if r["model"] in models]
        rows["memory"] = [r for r in rows["memory"] if r["model"] in models]
        sfiles = sorted({_sfile(r) for r in rows["time"]})
        for model in models:
            profile_model(a, b, rows, model, sfiles)
            save(a, rows)
        return finish(a, rows)
    if a.remeasure_memory:
        rows = json.loads(a.remeasure_memory.read_text())
        models = [m for m in a.models.split(",") if m]
        rows["memory"] = [r for r in rows["memory"] if r["model"] in models]
        rows["time"] = [r for r in rows["time"] if r["model"] in models]
        a.out.mkdir(parents=True, exist_ok=True)
        remeasure_memory(a, rows, models)
        save(a, rows)
        return finish(a, rows)
    if a.repredict:
        rows = json.loads(a.repredict.read_text())
        rows["link_burst"] = bool(a.link_burst or rows.get("link_burst"))
        if a.overlap_factor is not None:
            rows["overlap_factor"] = a.overlap_factor
        a.no_predict = False
        a.out = a.out or a.repredict.parent.with_name(a.repredict.parent.name + "-repredict")
        if a.out.resolve() == a.repredict.parent.resolve():
            ap.error(f"--out {a.out}: the folder of the rows it re-predicts (give another folder)")
        a.out.mkdir(parents=True, exist_ok=True)
        return finish(a, rows, at_batch=a.profile_batches == "auto")
    b = Bench(a)
    models = [m for m in a.models.split(",") if m]
    sfiles = [strategy_file(s) for s in a.strategies.split(",") if s]
    rates = [float(r) for r in a.rates.split(",") if r]
    rows: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "profiles": {}, "time": [], "memory": [],
                            "caps": {}, "rates": rates}
    t0 = time.time()
    for model in models:
        profile_model(a, b, rows, model, sfiles)
        save(a, rows)
        print(f"== {model}: peak memory (--memory runs at {rates[0]:g} Mbit/s)", flush=True)
        for sf in sfiles:
            j = b.job(model, sf, strategy_ranks(sf), rates[0], memory=True)
            rows["memory"].append({"model": model, "strategy": sf.stem, "strategy_file": str(sf),
                                   "measured_peak_bytes": j["peak_bytes"], "peak_rss_mib": j["peak_rss_mib"]})
        peaks = sorted(r["measured_peak_bytes"] for r in rows["memory"] if r["model"] == model)
        k = max(1, len(peaks) // 2)   # halfway between the two middle peaks: no strategy sits on the cap
        rows["caps"][model] = int(a.cap_mib * 2**20) if a.cap_mib else int((peaks[k - 1] + peaks[min(k, len(peaks) - 1)]) / 2)
        save(a, rows)
        for rate in rates:
            print(f"== {model} at {rate:g} Mbit/s, {budget(a)} per host", flush=True)
            meas: dict[str, list[float]] = {sf.stem: [] for sf in sfiles}
            for rnd in range(a.rounds):
                for sf in (sfiles if rnd % 2 == 0 else list(reversed(sfiles))):
                    meas[sf.stem].append(b.job(model, sf, strategy_ranks(sf), rate)["ms"])
            for sf in sfiles:
                rows["time"].append({"model": model, "strategy": sf.stem, "strategy_file": str(sf),
                                     "ranks": strategy_ranks(sf), "rate": rate,
                                     "measured_ms": round(statistics.median(meas[sf.stem]), 3),
                                     "rounds_ms": meas[sf.stem]})
            save(a, rows)
    rows["wall_s"] = round(time.time() - t0, 1)
    save(a, rows)
    return finish(a, rows)


if __name__ == "__main__":
    sys.exit(main())
