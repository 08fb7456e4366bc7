"""Regression gates for CI (``dpro check``): compare two runs, or one run against a budget.

A *run* is a trace directory or a graph file written by ``dpro graph`` (both
replayed here through :class:`~dpro_kit.session.Session`, as ``dpro replay``
does), or a saved ``dpro replay --json`` result.  Every run is reduced to one
:func:`summary` dict with the same keys as ``dpro replay --json``
(``iteration_time_ms``, ``critical_path_ms_by_kind``, ``critical_path_top``,
``nodes``, ``measured_iteration_ms``…); trace directories also contribute their
*measured* per-phase and per-op times (``measured_phases_ms``, ``measured_ops_ms``),
so the verdict can say what got slower.

Checks (each one JUnit test case):

* ``predicted_iteration_time`` — replayed iteration time, candidate vs baseline
  (``metric`` ``predicted`` or ``both``);
* ``measured_iteration_time`` — ``manifest.extra.measured_iteration_ms``
  (``metric`` ``measured`` or ``both``); noisy on shared machines, so off by default;
* ``iteration_time_budget`` — the candidate (or the only run) against ``max_iteration_ms``.

Exit codes: 0 pass, 1 regression/over budget, 2 bad input (:class:`DproError`).
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from xml.sax.saxutils import quoteattr

import networkx as nx

from .errors import DproError, atomic_write_text
from .trace import COMM_KINDS

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
PHASES = ("FW", "BW", "UPDATE", "comm", "other")
_PHASE_OF = {"FW": "FW", "BW": "BW", "UPDATE": "UPDATE", **{k: "comm" for k in COMM_KINDS}}
METRICS = ("predicted", "measured", "both")


def phase_of(kind: str) -> str:
    """FW / BW / UPDATE / comm (COMM, SEND, RECV) / other (AGG, IO, VIRTUAL, OTHER)."""
    return _PHASE_OF.get(str(kind), "other")


# ----------------------------------------------------------------------------- loading runs

def replay_summary(res: Any, g: nx.DiGraph, *, top: int = 50) -> dict[str, Any]:
    """The fields of ``dpro replay --json`` that checks and reports use."""
    from .analysis import breakdown, critical_path_summary

    from .optimize.tictac import scheduling_efficiency

    bd = breakdown(res, g)
    cp = critical_path_summary(res, g, top=top)
    return {"iterations_replayed": res.iterations, "iteration_time_ms": res.iteration_time_us / 1e3,
            "scheduling": scheduling_efficiency(res, g),
            "makespan_ms": res.makespan_us / 1e3, "ops": g.number_of_nodes(), "critical_path": cp["ops"],
            "critical_path_ms_by_kind": cp["by_kind_ms"], "critical_path_top": cp["top"],
            "nodes": {r.node: {k: float(getattr(r, k)) for k in ("compute_ms", "comm_ms", "overlap_ms", "idle_ms")}
                      for r in bd.itertuples()}}


def measured_summary(ts: Any) -> dict[str, Any]:
    """Measured (profiled) times from the event table.

    ``measured_phases_ms``: per phase, time per iteration summed over a node's ops,
    averaged over iterations, max over nodes.  ``measured_ops_ms``: per op id,
    mean duration over iterations and nodes (with its name and kind).
    """
    ev = ts.events
    out: dict[str, Any] = {"measured_phases_ms": {}, "measured_ops_ms": {}}
    if ev.empty:
        return out
    ev = ev.assign(phase_=ev["kind"].astype(str).map(phase_of))
    per = ev.groupby(["node", "iteration", "phase_"], observed=True)["dur"].sum().groupby(
        ["node", "phase_"], observed=True).mean().groupby("phase_", observed=True).max()
    out["measured_phases_ms"] = {str(k): float(v) / 1e3 for k, v in per.items()}
    ops = ev.groupby("op", observed=True).agg(dur=("dur", "mean"), name=("name", "first"), kind=("kind", "first"))
    out["measured_ops_ms"] = {str(op): {"ms": float(r.dur) / 1e3, "name": str(r.name) or str(op), "kind": str(r.kind)}
                              for op, r in ops.iterrows()}
    return out


def _read_replay_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DproError(f"cannot read: {exc}", path=path) from None
    except json.JSONDecodeError as exc:
        raise DproError(f"not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})", path=path,
                        hint="pass a trace directory or a file written by `dpro replay --json`") from None
    return doc


def summary(path: str | Path, *, iterations: int | None = None, top: int = 50,
            progress: Callable[[str], None] | None = None, align: bool = True,
            per_iteration: bool | None = None) -> dict[str, Any]:
    """One run (trace directory, ``dpro graph`` file or ``dpro replay --json`` file) as a summary dict.

    Parameters
    ----------
    path : str or Path
        The run.  Trace directories and graph files are replayed through
        :class:`~dpro_kit.session.Session`, as ``dpro replay`` does.
    iterations : int or None
        Iterations to replay (default 1).
    top : int
        Longest critical-path ops to keep.
    progress : callable or None
        Called with one line before each slow step.
    align, per_iteration
        As :class:`~dpro_kit.session.Session` (defaults: as ``dpro replay``).
    """
    from .session import Session

    path = Path(path)
    note = progress or (lambda _msg: None)
    if not path.exists():
        raise DproError("does not exist", path=path,
                        hint="pass a trace directory or a file written by `dpro replay --json`")
    if path.is_dir():
        note(f"replaying {path}")
        from .job import JobFacts
        s = Session(path, align=align, per_iteration=per_iteration)
        ts, g, res = s.raw, s.graph, s.replay(iterations or 1)
        out = {"source": str(path), "input": "trace", "job": ts.manifest.job, "world_size": ts.manifest.world_size,
               "durations": s.info["durations"], **replay_summary(res, g, top=top), **measured_summary(ts)}
        measured = JobFacts.from_manifest(ts.manifest).measured_iteration_ms
        if measured is not None:
            out["measured_iteration_ms"] = measured
        return out
    doc = _read_replay_json(path)
    if isinstance(doc, dict) and doc.get("format") == "dpro-dfg":
        note(f"replaying graph {path}")
        s = Session(path)
        g, res = s.graph, s.replay(iterations or 1)
        return {"source": str(path), "input": "graph", **replay_summary(res, g, top=top)}
    it = doc.get("iteration_time_ms") if isinstance(doc, dict) else None
    if not isinstance(it, (int, float)) or isinstance(it, bool) or not math.isfinite(it) or it <= 0:
        raise DproError("not a replay result: no positive 'iteration_time_ms'", path=path,
                        hint="pass a trace directory or a file written by `dpro replay --json`")
    out = {"source": str(path), "input": "replay-json", "iteration_time_ms": float(it),
           "iterations_replayed": int(doc.get("iterations_replayed", 1) or 1)}
    for key in ("job", "world_size", "measured_iteration_ms", "critical_path_ms_by_kind", "critical_path_top",
                "critical_path", "nodes", "makespan_ms", "ops", "whatif", "durations"):
        if key in doc:
            out[key] = doc[key]
    for key, typ in (("critical_path_ms_by_kind", dict), ("nodes", dict), ("critical_path_top", list),
                     ("critical_path", list)):
        if key in out and not isinstance(out[key], typ):
            raise DproError(f"'{key}' must be a JSON {typ.__name__}", path=path)
    return out


def replay_json_iterations(path: str | Path) -> int | None:
    """``iterations_replayed`` of a saved replay result (None for directories and other files)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(doc, dict) and "iteration_time_ms" in doc:
        v = doc.get("iterations_replayed")
        return int(v) if isinstance(v, int) and v >= 1 else 1
    return None


# ----------------------------------------------------------------------------- thresholds

def parse_percent(text: str, *, option: str = "--max-regression") -> float:
    """``"5%"``, ``"5"``, ``"+2.5 %"`` -> percent as a float (>= 0)."""
    m = re.fullmatch(r"\s*\+?(\d+(?:\.\d*)?|\.\d+)\s*%?\s*", str(text))
    if not m:
        raise DproError(f"{option} {text!r} is not a percentage", hint="use e.g. 5% or 2.5")
    return float(m.group(1))


# ----------------------------------------------------------------------------- comparing

@dataclass
class Check:
    name: str
    passed: bool
    message: str
    baseline: float | None = None
    candidate: float | None = None
    limit: float | None = None
    unit: str = "ms"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "status": "pass" if self.passed else "fail", "message": self.message}
        for k in ("baseline", "candidate", "limit"):
            if getattr(self, k) is not None:
                d[f"{k}_{self.unit}"] = getattr(self, k)
        if self.baseline is not None and self.candidate is not None:
            d["delta_ms"] = self.candidate - self.baseline
            d["delta_pct"] = 100.0 * (self.candidate - self.baseline) / self.baseline if self.baseline else None
        return d


@dataclass
class CheckReport:
    checks: list[Check]
    baseline: dict[str, Any] | None
    candidate: dict[str, Any]
    explain: dict[str, Any] = field(default_factory=dict)
    max_regression_pct: float | None = None
    max_iteration_ms: float | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_FAIL

    def to_json(self) -> dict[str, Any]:
        return {"status": "pass" if self.passed else "fail", "exit_code": self.exit_code,
                "baseline": self.baseline and self.baseline["source"], "candidate": self.candidate["source"],
                "max_regression_pct": self.max_regression_pct, "max_iteration_ms": self.max_iteration_ms,
                "checks": [c.to_json() for c in self.checks], "what_changed": self.explain}


def _delta_map(a: dict[str, float], b: dict[str, float]) -> dict[str, dict[str, float]]:
    out = {}
    for k in sorted(set(a) | set(b)):
        x, y = float(a.get(k, 0.0)), float(b.get(k, 0.0))
        out[k] = {"baseline_ms": x, "candidate_ms": y, "delta_ms": y - x,
                  "delta_pct": (100.0 * (y - x) / x) if x else None}
    return out


def _by_phase(by_kind: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in by_kind.items():
        out[phase_of(k)] = out.get(phase_of(k), 0.0) + float(v)
    return out


def _comp_comm(nodes: dict[str, dict[str, float]]) -> dict[str, float]:
    """Slowest-node view of a breakdown: max over nodes of compute, comm, exposed comm, idle."""
    if not nodes:
        return {}
    def mx(f: Callable[[dict[str, float]], float]) -> float:
        return max(float(f(v)) for v in nodes.values())
    return {"compute": mx(lambda v: v.get("compute_ms", 0.0)), "comm": mx(lambda v: v.get("comm_ms", 0.0)),
            "exposed comm": mx(lambda v: v.get("comm_ms", 0.0) - v.get("overlap_ms", 0.0)),
            "idle": mx(lambda v: v.get("idle_ms", 0.0))}


def explain(base: dict[str, Any], cand: dict[str, Any], *, top: int = 5) -> dict[str, Any]:
    """What changed between two runs: per-phase, computation vs communication, top ops."""
    out: dict[str, Any] = {}
    if "critical_path_ms_by_kind" in base and "critical_path_ms_by_kind" in cand:
        out["critical_path_by_phase"] = _delta_map(_by_phase(base["critical_path_ms_by_kind"]),
                                                   _by_phase(cand["critical_path_ms_by_kind"]))
    if base.get("measured_phases_ms") and cand.get("measured_phases_ms"):
        out["measured_by_phase"] = _delta_map(base["measured_phases_ms"], cand["measured_phases_ms"])
    if base.get("nodes") and cand.get("nodes"):
        out["compute_vs_comm"] = _delta_map(_comp_comm(base["nodes"]), _comp_comm(cand["nodes"]))
    ops: list[dict[str, Any]] = []
    if base.get("measured_ops_ms") and cand.get("measured_ops_ms"):
        a, b = base["measured_ops_ms"], cand["measured_ops_ms"]
        for op in set(a) | set(b):
            x, y = a.get(op, {}).get("ms", 0.0), b.get(op, {}).get("ms", 0.0)
            info = b.get(op) or a.get(op)
            ops.append({"op": op, "name": info["name"], "kind": info["kind"], "baseline_ms": x, "candidate_ms": y,
                        "delta_ms": y - x, "source": "measured"})
    elif base.get("critical_path_top") is not None and cand.get("critical_path_top") is not None:
        a = {t["op"]: t for t in base["critical_path_top"] if isinstance(t, dict) and "op" in t}
        b = {t["op"]: t for t in cand["critical_path_top"] if isinstance(t, dict) and "op" in t}
        on_a = set(base.get("critical_path") or a)
        on_b = set(cand.get("critical_path") or b)
        for op in set(a) | set(b):
            if op in a and op in b:
                note = {}
            elif op in b and op not in on_a:
                note = {"note": "new on the critical path"}
            elif op in a and op not in on_b:
                note = {"note": "left the critical path"}
            else:
                continue  # on both paths, but only one run listed its duration
            x, y = float(a.get(op, {}).get("dur_ms", 0.0)), float(b.get(op, {}).get("dur_ms", 0.0))
            info = b.get(op) or a.get(op)
            ops.append({"op": op, "name": info.get("name", op), "kind": info.get("kind", ""), "baseline_ms": x,
                        "candidate_ms": y, "delta_ms": y - x, "source": "critical path", **note})
    ops.sort(key=lambda o: (-o["delta_ms"], o["op"]))
    out["top_ops"] = [o for o in ops if abs(o["delta_ms"]) > 1e-9][:top]
    return out


def _pct(a: float, b: float) -> float:
    return 100.0 * (b - a) / a if a else math.inf


def compare(base: dict[str, Any], cand: dict[str, Any], *, max_regression_pct: float = 5.0,
            metric: str = "predicted", max_iteration_ms: float | None = None) -> CheckReport:
    """Candidate vs baseline (and optionally vs a budget)."""
    checks = []
    if metric in ("predicted", "both"):
        a, b = base["iteration_time_ms"], cand["iteration_time_ms"]
        ok = b <= a * (1 + max_regression_pct / 100.0) + 1e-12
        checks.append(Check("predicted_iteration_time", ok,
                            f"predicted iteration time {a:.3f} ms -> {b:.3f} ms ({_pct(a, b):+.1f} %, "
                            f"limit +{max_regression_pct:g} %)", a, b, a * (1 + max_regression_pct / 100.0)))
    if metric in ("measured", "both"):
        for run in (base, cand):
            if "measured_iteration_ms" not in run:
                raise DproError("has no measured iteration time (manifest.extra.measured_iteration_ms)",
                                path=run["source"], hint="use --metric predicted")
        a, b = base["measured_iteration_ms"], cand["measured_iteration_ms"]
        ok = b <= a * (1 + max_regression_pct / 100.0) + 1e-12
        checks.append(Check("measured_iteration_time", ok,
                            f"measured iteration time {a:.3f} ms -> {b:.3f} ms ({_pct(a, b):+.1f} %, "
                            f"limit +{max_regression_pct:g} %)", a, b, a * (1 + max_regression_pct / 100.0)))
    if max_iteration_ms is not None:
        checks.extend(budget_checks(cand, max_iteration_ms, metric=metric))
    return CheckReport(checks=checks, baseline=base, candidate=cand, explain=explain(base, cand),
                       max_regression_pct=max_regression_pct, max_iteration_ms=max_iteration_ms)


def budget_checks(run: dict[str, Any], max_iteration_ms: float, *, metric: str = "predicted") -> list[Check]:
    out = []
    for m in (("predicted", "measured") if metric == "both" else (metric,)):
        key = "iteration_time_ms" if m == "predicted" else "measured_iteration_ms"
        if key not in run:
            raise DproError("has no measured iteration time (manifest.extra.measured_iteration_ms)",
                            path=run["source"], hint="use --metric predicted")
        v = float(run[key])
        ok = v <= max_iteration_ms
        out.append(Check(f"{m}_iteration_time_budget", ok,
                         f"{m} iteration time {v:.3f} ms {'<=' if ok else '>'} budget {max_iteration_ms:g} ms"
                         + ("" if ok else f" (over by {v - max_iteration_ms:.3f} ms, "
                                          f"{100 * (v - max_iteration_ms) / max_iteration_ms:.1f} %)"),
                         None, v, max_iteration_ms))
    return out


def budget(run: dict[str, Any], max_iteration_ms: float, *, metric: str = "predicted") -> CheckReport:
    if not (max_iteration_ms > 0 and math.isfinite(max_iteration_ms)):
        raise DproError(f"--max-iteration-ms must be a positive number, got {max_iteration_ms!r}")
    return CheckReport(checks=budget_checks(run, max_iteration_ms, metric=metric), baseline=None, candidate=run,
                       explain=_single_run_explain(run), max_iteration_ms=max_iteration_ms)


def _single_run_explain(run: dict[str, Any]) -> dict[str, Any]:
    """For a budget: where the candidate's time goes (critical path by phase, slowest node)."""
    out: dict[str, Any] = {}
    if run.get("critical_path_ms_by_kind"):
        out["critical_path_by_phase"] = {k: {"candidate_ms": v} for k, v in
                                         sorted(_by_phase(run["critical_path_ms_by_kind"]).items())}
    if run.get("nodes"):
        out["compute_vs_comm"] = {k: {"candidate_ms": v} for k, v in _comp_comm(run["nodes"]).items()}
    top = sorted((t for t in run.get("critical_path_top") or [] if isinstance(t, dict)),
                 key=lambda t: -float(t.get("dur_ms", 0)))[:5]
    out["top_ops"] = [{"op": t.get("op"), "name": t.get("name"), "kind": t.get("kind"),
                       "candidate_ms": float(t.get("dur_ms", 0)), "source": "critical path"} for t in top]
    return out


# ----------------------------------------------------------------------------- output

def _fmt_deltas(d: dict[str, dict[str, Any]], *, only_changed: bool = True) -> str:
    items = sorted(d.items(), key=lambda kv: -abs(kv[1].get("delta_ms", 0.0)))
    parts = []
    for k, v in items:
        if "delta_ms" not in v:
            parts.append(f"{k} {v['candidate_ms']:.3f} ms")
            continue
        if not only_changed:
            parts.append(f"{k} {v['baseline_ms']:.3f} -> {v['candidate_ms']:.3f} ms ({v['delta_ms']:+.3f})")
            continue
        if abs(v["delta_ms"]) < 5e-4:
            continue
        pct = f" ({v['delta_pct']:+.0f} %)" if v.get("delta_pct") is not None else " (new)"
        parts.append(f"{k} {v['delta_ms']:+.3f} ms{pct}")
    return ", ".join(parts) if parts else "no change"


def render_text(rep: CheckReport) -> str:
    lines = []
    verdict = "PASS" if rep.passed else "FAIL"
    for c in rep.checks:
        lines.append(f"dpro check: {'PASS' if c.passed else 'FAIL'}  {c.message}")
    if not rep.checks:
        lines.append(f"dpro check: {verdict}")
    e = rep.explain
    if rep.baseline is not None:
        lines.append(f"  baseline  {rep.baseline['source']}")
        lines.append(f"  candidate {rep.candidate['source']}")
    if "critical_path_by_phase" in e:
        lines.append("  critical path by phase: " + _fmt_deltas(e["critical_path_by_phase"]))
    if "measured_by_phase" in e:
        lines.append("  measured time by phase: " + _fmt_deltas(e["measured_by_phase"]))
    if "compute_vs_comm" in e:
        lines.append("  computation vs communication (slowest node): " + _fmt_deltas(e["compute_vs_comm"],
                                                                                     only_changed=False))
    if e.get("top_ops"):
        grew = [o for o in e["top_ops"] if o.get("delta_ms", 1.0) > 0]
        if rep.baseline is None:
            lines.append("  longest ops on the critical path:")
        elif grew:
            lines.append(f"  ops that got slower ({grew[0]['source']}):")
        for o in grew[:5]:
            if "delta_ms" in o:
                lines.append(f"    {o['delta_ms']:+9.3f} ms  {o['baseline_ms']:9.3f} -> {o['candidate_ms']:9.3f} ms"
                             f"  {o['kind']:<7} {o['name']}" + (f"  [{o['note']}]" if o.get("note") else ""))
            else:
                lines.append(f"    {o['candidate_ms']:9.3f} ms  {o['kind']:<7} {o['name']}")
    return "\n".join(lines)


def to_junit(rep: CheckReport, *, suite: str = "dpro check") -> str:
    """JUnit XML: one ``<testsuite>`` (inside ``<testsuites>``), one ``<testcase>`` per check."""
    failures = sum(1 for c in rep.checks if not c.passed)
    details = render_text(rep)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name={quoteattr(suite)} tests="{len(rep.checks)}" failures="{failures}" errors="0" '
           f'time="{rep.seconds:.3f}">',
           f'  <testsuite name={quoteattr(suite)} tests="{len(rep.checks)}" failures="{failures}" errors="0" '
           f'skipped="0" time="{rep.seconds:.3f}" timestamp="{time.strftime("%Y-%m-%dT%H:%M:%S")}">']
    for c in rep.checks:
        out.append(f'    <testcase classname="dpro.check" name={quoteattr(c.name)} time="0">')
        if not c.passed:
            out.append(f'      <failure message={quoteattr(c.message)} type="regression">'
                       f'{_xml_text(details)}</failure>')
        out.append(f'      <system-out>{_xml_text(c.message)}</system-out>')
        out.append("    </testcase>")
    out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def _xml_text(s: str) -> str:
    s = "".join(ch for ch in s if ch in "\t\n\r" or ord(ch) >= 0x20)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_junit(rep: CheckReport, path: str | Path) -> None:
    atomic_write_text(path, to_junit(rep))


__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_PASS", "METRICS", "PHASES", "Check", "CheckReport", "budget",
           "budget_checks", "compare", "explain", "measured_summary", "parse_percent",
           "phase_of", "render_text", "replay_json_iterations", "replay_summary", "summary", "to_junit",
           "write_junit"]
