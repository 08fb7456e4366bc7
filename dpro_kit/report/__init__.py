"""``dpro report``: one self-contained HTML page about a job (works offline, no CDN).

:func:`build_report` reads and replays a trace directory (:mod:`.data`), draws
inline SVG plots (:mod:`.svg`) and assembles the page (:mod:`.html`).  See
``docs/report.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import ReportData, collect
from .html import render, section_ids


@dataclass
class Report:
    data: ReportData
    html: str

    @property
    def summary(self) -> dict[str, Any]:
        d = self.data
        out: dict[str, Any] = {"trace": d.trace_dir, "job": d.facts["job"],
                               "iteration_time_ms": d.replay["iteration_time_ms"],
                               "sections": section_ids(d),
                               "alignment": "available" if d.alignment.get("available") else "not computed",
                               "memory": "available" if d.memory.get("available") else "not available"}
        if "measured_iteration_ms" in d.facts:
            out["measured_iteration_ms"] = d.facts["measured_iteration_ms"]
            out["error_pct"] = d.facts["error_pct"]
        if "compute_spread_pct" in d.stragglers:
            out["compute_spread_pct"] = d.stragglers["compute_spread_pct"]
            out["slowest_rank"] = d.stragglers["slowest"]
        if d.plan is not None and "speedup" in d.plan:
            out["plan_speedup"] = d.plan["speedup"]
        return out

    def write_timelines(self, folder: str | Path) -> list[Path]:
        """measured.json, replayed.json (and aligned.json with offsets) as Chrome/Perfetto trace JSON."""
        from ..timeline import replay_to_chrome, trace_to_chrome, write_chrome

        d = self.data
        folder = Path(folder)
        crit = d.replay.get("critical_path", [])
        out = [folder / "measured.json", folder / "replayed.json"]
        write_chrome(trace_to_chrome(d.ts, critical_ops=crit), out[0])
        write_chrome(replay_to_chrome(d.result, d.graph), out[1])
        if d.alignment.get("available"):
            out.append(folder / "aligned.json")
            write_chrome(trace_to_chrome(d.ts, offsets_us=d.alignment["offsets_us"], critical_ops=crit), out[2])
        return out


def build_report(trace_dir: str | Path, *, plan: str | Path | None = None, iterations: int = 3,
                 progress: Any = None, align: bool = True, per_iteration: bool | None = None) -> Report:
    """Collect the data of ``trace_dir`` (and ``plan``) and render the HTML page.

    Parameters
    ----------
    trace_dir : str or Path
        A trace directory.
    plan : str or Path or None
        An optimizer plan (``dpro optimize``) to show with its predicted gain.
    iterations : int
        Iterations to replay; the report shows the last (steady state).
    progress : dpro_kit.session.Progress or None
    align, per_iteration
        As :class:`~dpro_kit.session.Session` (defaults: as ``dpro replay``).
    """
    data = collect(trace_dir, plan=plan, iterations=iterations, progress=progress, align=align,
                   per_iteration=per_iteration)
    return Report(data=data, html=render(data))


__all__ = ["Report", "ReportData", "build_report", "collect", "render"]
