"""Inline SVG plots, generated in Python (no JavaScript library, no network).

Every function returns an ``<svg>`` string; hover text is a native ``<title>``.
"""
from __future__ import annotations

import html
import math
from typing import Any, Iterable, Sequence

from .data import Bar, Lane, TimelinePanel

KIND_COLORS = {"FW": "#4e79a7", "BW": "#59a14f", "UPDATE": "#b07aa1", "COMM": "#f28e2b", "SEND": "#f28e2b",
               "RECV": "#ffbe7d", "AGG": "#76b7b2", "IO": "#9c755f", "VIRTUAL": "#bab0ac", "OTHER": "#8c8c8c"}
BREAKDOWN_COLORS = {"compute": "#4e79a7", "overlap": "#8cd17d", "comm": "#f28e2b", "idle": "#e15759"}
CRIT = "#d62728"
FONT = 'font-family="system-ui,-apple-system,Segoe UI,Roboto,sans-serif"'

_uid = [0]


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _id(prefix: str) -> str:
    _uid[0] += 1
    return f"{prefix}{_uid[0]}"


def nice_step(span: float, target: int = 8) -> float:
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt(v: float, digits: int = 3) -> str:
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.3g}"


def _svg(w: float, h: float, body: list[str], cls: str, label: str) -> str:
    return (f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" role="img" aria-label="{esc(label)}" {FONT} font-size="11">'
            + "".join(body) + "</svg>")


def _axis(x0: float, width: float, span: float, y: float, height: float, unit_div: float = 1e3,
          unit: str = "ms") -> list[str]:
    """Vertical grid lines and tick labels for a 0..span axis (span in us, labels in ms)."""
    out = []
    step = nice_step(span / unit_div) * unit_div
    t = 0.0
    while t <= span * 1.0001 and step > 0:
        x = x0 + width * (t / span if span else 0)
        out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + height:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x:.1f}" y="{y - 4:.1f}" text-anchor="middle" fill="#555">{fmt(t / unit_div)}</text>')
        t += step
    out.append(f'<text x="{x0 + width + 8:.1f}" y="{y - 4:.1f}" fill="#555">{unit}</text>')
    return out


def _busy_gaps(bars: Sequence[Bar], span: float, min_gap: float) -> list[tuple[float, float]]:
    iv = sorted((b.start, b.start + b.dur) for b in bars if b.dur > 0)
    gaps, cur = [], 0.0
    for s, e in iv:
        if s - cur >= min_gap:
            gaps.append((cur, s))
        cur = max(cur, e)
    if span - cur >= min_gap and iv:
        gaps.append((cur, span))
    return gaps


def timeline(panel: TimelinePanel, *, span: float | None = None, width: int = 1120, lane_h: int = 16,
             label_w: int = 190, max_bars_per_lane: int = 4000) -> str:
    """Lanes of bars (one lane per node stream / link); critical ops outlined red; idle gaps hatched."""
    span = span or panel.span_us or 1.0
    plot_w = width - label_w - 36
    top = 34
    gap_min = max(span * 0.01, 1.0)
    pat = _id("hatch")
    body = [f'<defs><pattern id="{pat}" width="6" height="6" patternUnits="userSpaceOnUse" '
            f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fdecea"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="#e15759" stroke-width="2" opacity=".55"/></pattern></defs>']
    rows: list[tuple[str, Lane | None]] = []
    last_group = None
    for lane in panel.lanes:
        if lane.group != last_group:
            rows.append((lane.group, None))
            last_group = lane.group
        rows.append((lane.label, lane))
    height = top + len(rows) * (lane_h + 4) + 10
    body += _axis(label_w, plot_w, span, top, height - top - 6)
    y = top
    sx = plot_w / span
    for label, lane in rows:
        if lane is None:
            body.append(f'<text x="4" y="{y + lane_h - 3}" font-weight="600" fill="#222">{esc(label)}</text>')
            body.append(f'<line x1="4" y1="{y + lane_h + 1}" x2="{width - 10}" y2="{y + lane_h + 1}" stroke="#ccc"/>')
            y += lane_h + 4
            continue
        crit_lane = lane.group == "critical path"
        body.append(f'<text x="16" y="{y + lane_h - 4}" fill="{CRIT if crit_lane else "#444"}">{esc(label)}</text>')
        body.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{lane_h}" fill="#f7f7f7"/>')
        if lane.gaps and lane.bars:
            for a, b in _busy_gaps(lane.bars, panel.span_us or span, gap_min):
                body.append(f'<rect class="gap" x="{label_w + a * sx:.2f}" y="{y}" width="{max((b - a) * sx, 1):.2f}" '
                            f'height="{lane_h}" fill="url(#{pat})"><title>idle {(b - a) / 1e3:.3f} ms '
                            f'({fmt(a / 1e3)} to {fmt(b / 1e3)} ms)</title></rect>')
        for bar in _coalesce(lane.bars, sx, max_bars_per_lane):
            x = label_w + bar.start * sx
            w = max(bar.dur * sx, 0.8)
            color = CRIT if crit_lane else KIND_COLORS.get(bar.kind, "#8c8c8c")
            stroke = (f' stroke="{CRIT}" stroke-width="1.6"' if bar.critical and not crit_lane else "")
            cls = "op crit" if bar.critical else "op"
            body.append(f'<rect class="{cls}" x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{lane_h - 4}" '
                        f'fill="{color}"{stroke}><title>{esc(bar.tip or bar.name)}</title></rect>')
        y += lane_h + 4
    if panel.span_us and panel.span_us < span * 0.999:
        xe = label_w + panel.span_us * sx
        body.append(f'<line x1="{xe:.1f}" y1="{top}" x2="{xe:.1f}" y2="{height - 6}" stroke="#333" '
                    f'stroke-dasharray="4 3"><title>end of this iteration: {panel.span_us / 1e3:.3f} ms</title></line>')
        near_right = xe > label_w + plot_w - 70
        body.append(f'<text x="{xe + (-3 if near_right else 3):.1f}" y="{top + 10}" fill="#333" '
                    f'text-anchor="{"end" if near_right else "start"}">end {panel.span_us / 1e3:.2f} ms</text>')
    return _svg(width, height, body, "timeline", panel.title)


def _coalesce(bars: Sequence[Bar], sx: float, limit: int) -> list[Bar]:
    """Merge runs of sub-pixel, non-critical bars when a lane has more than ``limit`` bars."""
    if len(bars) <= limit:
        return list(bars)
    out: list[Bar] = []
    for b in sorted(bars, key=lambda b: b.start):
        prev = out[-1] if out else None
        if (prev is not None and not b.critical and not prev.critical and b.dur * sx < 1
                and b.start - (prev.start + prev.dur) < 1 / sx and (prev.start + prev.dur - prev.start) * sx < 3):
            end = max(prev.start + prev.dur, b.start + b.dur)
            out[-1] = Bar(prev.start, end - prev.start, prev.kind, "several ops", False, "several short ops")
        else:
            out.append(b)
    return out


def legend(items: Iterable[tuple[str, str]], *, extra: Sequence[str] = ()) -> str:
    parts = [f'<span class="key"><i style="background:{c}"></i>{esc(n)}</span>' for n, c in items]
    return '<div class="legend">' + "".join(parts) + "".join(extra) + "</div>"


def stacked_bars(rows: Sequence[tuple[str, Sequence[tuple[str, float, str]]]], *, width: int = 900,
                 label_w: int = 210, bar_h: int = 18, unit: str = "ms", title: str = "") -> str:
    """Horizontal stacked bars: rows of (label, [(segment name, value, colour), ...])."""
    total = max((sum(v for _, v, _ in segs) for _, segs in rows), default=1.0) or 1.0
    plot_w = width - label_w - 70
    height = 24 + len(rows) * (bar_h + 8)
    body = _axis(label_w, plot_w, total, 20, height - 24, unit_div=1.0, unit=unit)
    y = 24
    for label, segs in rows:
        body.append(f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end" fill="#333">{esc(label)}</text>')
        x = float(label_w)
        for name, v, color in segs:
            w = plot_w * v / total
            if w > 0:
                body.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{color}">'
                            f'<title>{esc(label)}: {esc(name)} {v:.3f} {unit}</title></rect>')
                if w > 34:
                    body.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h - 5}" text-anchor="middle" fill="#fff">'
                                f'{v:.2f}</text>')
            x += w
        s = sum(v for _, v, _ in segs)
        body.append(f'<text x="{x + 4:.1f}" y="{y + bar_h - 5}" fill="#333">{s:.2f}</text>')
        y += bar_h + 8
    return _svg(width, height, body, "chart", title)


def grouped_bars(rows: Sequence[tuple[str, Sequence[tuple[str, float | None, str, tuple[float, float] | None]]]], *,
                 width: int = 900, label_w: int = 210, bar_h: int = 12, unit: str = "ms", title: str = "",
                 zero_centered: bool = False) -> str:
    """Horizontal grouped bars: rows of (label, [(series, value, colour, (lo, hi) whisker or None)])."""
    vals = [abs(v) for _, ss in rows for _, v, _, _ in ss if v is not None]
    vals += [abs(w[1]) for _, ss in rows for _, _, _, w in ss if w is not None]
    vmax = max(vals, default=1.0) or 1.0
    plot_w = width - label_w - 80
    n_series = max((len(ss) for _, ss in rows), default=1)
    row_h = n_series * (bar_h + 2) + 10
    height = 26 + len(rows) * row_h
    if zero_centered:
        x0, half = label_w + plot_w / 2, plot_w / 2
        body = [f'<line x1="{x0:.1f}" y1="20" x2="{x0:.1f}" y2="{height - 4}" stroke="#999"/>',
                f'<text x="{x0:.1f}" y="14" text-anchor="middle" fill="#555">0 {unit}</text>',
                f'<text x="{label_w:.1f}" y="14" fill="#555">-{fmt(vmax)}</text>',
                f'<text x="{label_w + plot_w:.1f}" y="14" text-anchor="end" fill="#555">+{fmt(vmax)}</text>']
    else:
        body = _axis(label_w, plot_w, vmax, 20, height - 24, unit_div=1.0, unit=unit)
    y = 26
    for label, series in rows:
        body.append(f'<text x="{label_w - 6}" y="{y + (row_h - 10) / 2 + 4:.1f}" text-anchor="end" fill="#333">'
                    f'{esc(label)}</text>')
        for i, (name, v, color, whisk) in enumerate(series):
            yy = y + i * (bar_h + 2)
            if v is None:
                body.append(f'<text x="{label_w + 4}" y="{yy + bar_h - 2}" fill="#999">{esc(name)}: n/a</text>')
                continue
            if zero_centered:
                w = half * abs(v) / vmax
                x = x0 if v >= 0 else x0 - w
            else:
                x, w = float(label_w), plot_w * v / vmax
            body.append(f'<rect x="{x:.2f}" y="{yy}" width="{max(w, 0.8):.2f}" height="{bar_h}" fill="{color}">'
                        f'<title>{esc(label)} · {esc(name)}: {v:.3f} {unit}</title></rect>')
            tx = (x + w + 4) if (not zero_centered or v >= 0) else (x - 4)
            anchor = "start" if (not zero_centered or v >= 0) else "end"
            if whisk is not None and not zero_centered:
                a, b = (label_w + plot_w * whisk[0] / vmax, label_w + plot_w * whisk[1] / vmax)
                cy = yy + bar_h / 2
                body.append(f'<g stroke="#333"><line x1="{a:.1f}" y1="{cy}" x2="{b:.1f}" y2="{cy}"/>'
                            f'<line x1="{a:.1f}" y1="{cy - 4}" x2="{a:.1f}" y2="{cy + 4}"/>'
                            f'<line x1="{b:.1f}" y1="{cy - 4}" x2="{b:.1f}" y2="{cy + 4}"/>'
                            f'<title>{esc(name)} range {whisk[0]:.3f} to {whisk[1]:.3f} {unit}</title></g>')
                tx = max(tx, b + 4)
            body.append(f'<text x="{tx:.1f}" y="{yy + bar_h - 2}" text-anchor="{anchor}" fill="#333">'
                        f'{v:.3f}</text>')
        y += row_h
    return _svg(width, height, body, "chart", title)


def dots(rows: Sequence[tuple[str, Sequence[tuple[str, Sequence[float], str]]]], *, width: int = 900,
         label_w: int = 210, unit: str = "ms", title: str = "", highlight: str | None = None) -> str:
    """Per row (rank), one strip per series: a dot per iteration and a tick at the mean."""
    vmax = max((v for _, ss in rows for _, vs, _ in ss for v in vs), default=1.0) or 1.0
    plot_w = width - label_w - 70
    n_series = max((len(ss) for _, ss in rows), default=1)
    row_h = n_series * 14 + 10
    height = 26 + len(rows) * row_h
    body = _axis(label_w, plot_w, vmax, 20, height - 24, unit_div=1.0, unit=unit)
    y = 26
    for label, series in rows:
        hot = label == highlight
        body.append(f'<text x="{label_w - 6}" y="{y + row_h / 2 - 1:.1f}" text-anchor="end" '
                    f'fill="{CRIT if hot else "#333"}" font-weight="{600 if hot else 400}">{esc(label)}'
                    f'{" (slowest)" if hot else ""}</text>')
        for i, (name, vs, color) in enumerate(series):
            cy = y + i * 14 + 6
            body.append(f'<line x1="{label_w}" y1="{cy}" x2="{label_w + plot_w}" y2="{cy}" stroke="#f0f0f0"/>')
            for v in vs:
                body.append(f'<circle cx="{label_w + plot_w * v / vmax:.1f}" cy="{cy}" r="3.5" fill="{color}" '
                            f'fill-opacity=".6"><title>{esc(label)} · {esc(name)}: {v:.3f} {unit}</title></circle>')
            if vs:
                m = sum(vs) / len(vs)
                mx = label_w + plot_w * m / vmax
                body.append(f'<line x1="{mx:.1f}" y1="{cy - 6}" x2="{mx:.1f}" y2="{cy + 6}" stroke="#111" '
                            f'stroke-width="2"><title>{esc(name)} mean {m:.3f} {unit}</title></line>')
                body.append(f'<text x="{label_w + plot_w + 6}" y="{cy + 4}" fill="#333">{m:.2f}</text>')
        y += row_h
    return _svg(width, height, body, "chart", title)


def lines(series: dict[str, Sequence[tuple[float, float]]], *, width: int = 900, height: int = 240,
          x_unit: str = "ms", y_unit: str = "MiB", x_div: float = 1e3, y_div: float = 2 ** 20, title: str = "") -> str:
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#9c755f", "#edc948"]
    xs = [p[0] for pts in series.values() for p in pts]
    ys = [p[1] for pts in series.values() for p in pts]
    xmax = max(xs, default=1.0) or 1.0
    ymax = max(ys, default=1.0) or 1.0
    left, top, pw, ph = 70, 24, width - 200, height - 50
    body = _axis(left, pw, xmax, top, ph, unit_div=x_div, unit=x_unit)
    step = nice_step(ymax / y_div, 4) * y_div
    v = 0.0
    while v <= ymax * 1.0001:
        yy = top + ph - ph * v / ymax
        body.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#eee"/>'
                    f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#555">{fmt(v / y_div)}</text>')
        v += step
    body.append(f'<text x="8" y="{top - 8}" fill="#555">{y_unit}</text>')
    for i, (name, pts) in enumerate(series.items()):
        c = palette[i % len(palette)]
        d = " ".join(f"{left + pw * x / xmax:.1f},{top + ph - ph * y / ymax:.1f}" for x, y in pts)
        body.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"><title>{esc(name)}</title>'
                    f'</polyline>')
        body.append(f'<text x="{left + pw + 10}" y="{top + 14 + 16 * i}" fill="{c}">{esc(name)}</text>')
    return _svg(width, height, body, "chart", title)


__all__ = ["BREAKDOWN_COLORS", "CRIT", "FONT", "KIND_COLORS", "dots", "esc", "fmt", "grouped_bars", "legend",
           "lines", "nice_step", "stacked_bars", "timeline"]
