"""Assemble the report page: one HTML file, inline CSS, inline SVG, a few lines of inline JS."""
from __future__ import annotations

import json
from typing import Any

from .. import __version__
from ..trace import COMM_KINDS
from . import svg
from .data import ReportData
from .svg import BREAKDOWN_COLORS, CRIT, KIND_COLORS, esc

CSS = """
:root{color-scheme:light}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;background:#fafafa}
header{background:#1f2a44;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header .sub{opacity:.8}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 28px;z-index:2}
nav a{margin-right:14px;color:#1f4e99;text-decoration:none;font-size:13px}
main{padding:8px 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:10px 18px 16px;margin:16px 0}
h2{font-size:17px;margin:6px 0 8px}
h3{font-size:14px;margin:12px 0 4px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:10px 0}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:8px 14px;flex:1 1 0;min-width:120px}
.card b{display:block;font-size:20px}
.card span{color:#666;font-size:12px}
.card.bad b{color:#c62828}.card.good b{color:#2e7d32}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{border-bottom:1px solid #eee;padding:3px 10px;text-align:right;white-space:nowrap}
th{background:#f4f4f4;font-weight:600}
td.l,th.l{text-align:left;white-space:normal;max-width:520px;overflow-wrap:anywhere}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;margin:4px 0 6px}
.legend .key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
.note{color:#666;font-size:12.5px}
.warn{color:#8a5a00;background:#fff4d6;padding:4px 8px;border-radius:4px}
.na{color:#8a6d00;background:#fff8e1;border:1px solid #ffe08a;border-radius:4px;padding:6px 10px;display:inline-block}
.scroll{overflow-x:auto}
svg{display:block;margin:4px 0}
svg.timeline rect.op:hover{opacity:.75}
body.crit-only svg.timeline rect.op:not(.crit){opacity:.15}
label.toggle{font-size:12.5px;user-select:none}
pre{background:#f6f6f6;padding:6px 10px;border-radius:4px;font-size:12px;overflow-x:auto;max-height:220px}
"""

JS = """
(function(){
  var root=document.documentElement;
  window.addEventListener('error',function(e){root.setAttribute('data-report-error',String(e.message||e));});
  try{
    var t=document.getElementById('crit-only');
    if(t){t.addEventListener('change',function(){document.body.classList.toggle('crit-only',t.checked);});}
    var need=['measured-timeline','replayed-timeline','breakdown-chart'];
    var missing=need.filter(function(id){var el=document.getElementById(id);return !el||!el.querySelector('svg');});
    var bars=document.querySelectorAll('svg.timeline rect.op').length;
    root.setAttribute('data-timeline-bars',String(bars));
    root.setAttribute('data-report-ready',missing.length?('missing:'+missing.join(',')):'ok');
    var m=document.getElementById('ready-marker'); if(m){m.textContent='report script ran: '+root.getAttribute('data-report-ready')+', '+bars+' timeline bars';}
  }catch(err){root.setAttribute('data-report-error',String(err));throw err;}
})();
"""


def _table(headers: list[str], rows: list[list[Any]], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = []
    for r in rows:
        tds = []
        for i, v in enumerate(r):
            txt = f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))
            tds.append(f'<td class="{"l" if i < left else ""}">{esc(txt)}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _card(value: str, label: str, cls: str = "") -> str:
    return f'<div class="card {cls}"><b>{esc(value)}</b><span>{esc(label)}</span></div>'


def _na(text: str) -> str:
    return f'<p class="na">{esc(text)}</p>'


def render(d: ReportData) -> str:
    f = d.facts
    rs = d.replay
    sections: list[tuple[str, str, str]] = []

    # ---------------------------------------------------------------- overview
    cards = [_card(f"{rs['iteration_time_ms']:.3f} ms", "predicted iteration time (replay)")]
    if "measured_iteration_ms" in f:
        err = f["error_pct"]
        cards.append(_card(f"{f['measured_iteration_ms']:.3f} ms", "measured iteration time (unprofiled median)"))
        cards.append(_card(f"{err:+.1f} %", "prediction error", "good" if abs(err) <= 10 else "bad"))
    cp_total = sum(d.critical_by_kind.values())
    comm_cp = sum(v for k, v in d.critical_by_kind.items() if k in COMM_KINDS)
    cards.append(_card(f"{100 * comm_cp / cp_total:.0f} %" if cp_total else "n/a", "of the critical path is communication"))
    cards.append(_card(str(f["world_size"]), f"workers on {f['hosts']} host(s)"))
    cm = f.get("comm_model") or {}
    facts_rows = [["job", f["job"]], ["framework / backend", f"{f['framework']} / {f['comm_backend']}"],
                  ["profiled iterations", ", ".join(map(str, f["profiled_iterations"]))],
                  ["global DFG", f"{f['ops']} ops, {f['edges']} edges"],
                  ["replayed", f"{f['iterations_replayed']} iteration(s); the report shows the last one"],
                  ["comm model", f"{cm.get('origin', '?')}: {cm.get('bandwidth_Mbps', 0):.0f} Mbit/s, "
                                 f"{cm.get('latency_us', 0):.0f} us latency" if cm else "n/a"],
                  ["collected", f"{f.get('created') or '?'} by {f.get('tool_version') or '?'}"]]
    sch = rs.get("scheduling") or {}
    if sch.get("E") is not None:
        facts_rows.append(["scheduling efficiency (TicTac §3.2)",
                           f"E = {sch['E']:.2f}, speed-up bound S = {sch['S']:.2f} (worker {sch['reference']}; "
                           "E = 1: as fast as its busiest resource allows, 0: fully serial; docs/tictac.md)"])
    overview = '<div class="cards">' + "".join(cards) + "</div>" + _table(["fact", "value"], facts_rows, left=2)
    overview += "".join(f'<p class="warn">warning: {esc(w)}</p>' for w in f.get("warnings") or [])
    sections.append(("overview", "Overview", overview))

    # ---------------------------------------------------------------- timelines
    span = max(d.measured_tl.span_us, d.replayed_tl.span_us) or 1.0
    kinds = sorted({b.kind for tl in (d.measured_tl, d.replayed_tl) for ln in tl.lanes for b in ln.bars})
    leg = svg.legend([(k, KIND_COLORS.get(k, "#8c8c8c")) for k in kinds],
                     extra=[f'<span class="key"><i style="background:#fff;border:2px solid {CRIT}"></i>'
                            f'critical path (outlined; own lane in the replay)</span>',
                            '<span class="key"><i style="background:repeating-linear-gradient(45deg,#fdecea 0 3px,'
                            '#e15759 3px 5px)"></i>idle gap (&ge; 1 % of the iteration)</span>'])
    toggle = '<label class="toggle"><input type="checkbox" id="crit-only"> dim ops off the critical path</label>'
    mt = (f'<div id="measured-timeline" class="scroll"><h3>{esc(d.measured_tl.title)}</h3>'
          + (svg.timeline(d.measured_tl, span=span) if d.measured_tl.lanes else _na(d.measured_tl.note))
          + (f'<p class="note">{esc(d.measured_tl.note)}; same op ids as the replay, so critical ops are '
             f'outlined here too. Streams whose ops overlap (e.g. two allreduces in flight) get a second lane '
             f'("comm #2").</p>' if d.measured_tl.lanes else "") + "</div>")
    rt = (f'<div id="replayed-timeline" class="scroll"><h3>{esc(d.replayed_tl.title)}</h3>'
          + svg.timeline(d.replayed_tl, span=span)
          + '<p class="note">Per node stream and network link (SEND ops occupy links; RECV ops are on the '
            'receiver\'s comm stream). Both panels share one time axis (ms from the iteration start).</p></div>')
    sections.append(("timelines", "Timelines: measured vs replayed", leg + toggle + mt + rt))

    # ---------------------------------------------------------------- breakdown
    rows = []
    for b in d.breakdown:
        for side in ("measured", "replayed"):
            if f"{side}_compute_ms" not in b:
                continue
            c, m, o, i = (b[f"{side}_{k}_ms"] for k in ("compute", "comm", "overlap", "idle"))
            rows.append((f"{b['node']} · {side}", [("computation only", max(c - o, 0), BREAKDOWN_COLORS["compute"]),
                                                   ("overlap", o, BREAKDOWN_COLORS["overlap"]),
                                                   ("communication only", max(m - o, 0), BREAKDOWN_COLORS["comm"]),
                                                   ("idle", max(i, 0), BREAKDOWN_COLORS["idle"])]))
    bl = svg.legend([("computation only", BREAKDOWN_COLORS["compute"]), ("overlap (both)", BREAKDOWN_COLORS["overlap"]),
                     ("communication only", BREAKDOWN_COLORS["comm"]), ("idle", BREAKDOWN_COLORS["idle"])])
    table_rows = [[b["node"], *[b.get(f"{s}_{k}_ms") for s in ("measured", "replayed")
                                for k in ("compute", "comm", "overlap", "idle")]] for b in d.breakdown]
    bd = (bl + f'<div id="breakdown-chart" class="scroll">{svg.stacked_bars(rows, title="breakdown per node")}</div>'
          + '<p class="note">Bar length = the iteration as the node sees it. Measured: mean over the profiled '
            'iterations, within each node\'s own iteration span. Replayed: the last replayed iteration.</p>'
          + _table(["node", "meas. compute", "meas. comm", "meas. overlap", "meas. idle", "repl. compute",
                    "repl. comm", "repl. overlap", "repl. idle"], table_rows))
    sections.append(("breakdown", "Computation / communication / overlap / idle per node (ms)", bd))

    # ---------------------------------------------------------------- critical path
    kinds_rows = [(k, [(k, v, KIND_COLORS.get(k, "#888"), None)]) for k, v in
                  sorted(d.critical_by_kind.items(), key=lambda kv: -kv[1]) if v >= 5e-4]
    cp = (f'<div id="critical-chart" class="scroll">{svg.grouped_bars(kinds_rows, title="critical path by kind")}</div>'
          + f'<p class="note">{d.critical_ops_last} ops on the critical path of the shown (last replayed) '
            f'iteration, {d.critical_length_ms:.3f} ms of op time; its longest ops:</p>'
          + _table(["op", "kind", "node", "device", "iteration", "start ms (in iteration)", "dur ms"],
                   [[t["name"], t["kind"], t["node"], t["device"], t["iteration"], t["start_ms"], t["dur_ms"]]
                    for t in d.critical_top]))
    sections.append(("critical", "Critical path", cp))

    # ---------------------------------------------------------------- buckets
    if d.buckets:
        brows = []
        for b in d.buckets:
            mm = b.get("measured_mean_ms")
            wh = (b["measured_min_ms"], b["measured_max_ms"]) if mm is not None else None
            brows.append((f"{b['tensor']} ({b['bytes'] / 2 ** 20:.2f} MiB)",
                          [("measured collective (min over ranks, mean over iterations)", mm, "#f28e2b", wh),
                           ("replayed synchronisation span", b.get("replayed_span_ms"), "#4e79a7", None)]))
        bk = (svg.legend([("measured collective time (whisker: min–max over iterations)", "#f28e2b"),
                          ("replayed span, first transfer to last", "#4e79a7")])
              + f'<div id="bucket-chart" class="scroll">{svg.grouped_bars(brows, title="per-bucket communication")}</div>'
              + _table(["tensor / bucket", "bytes", "meas. mean ms", "meas. min ms", "meas. max ms",
                        "meas. goodput Mbit/s", "repl. span ms", "repl. link busy ms", "repl. start ms"],
                       [[b["tensor"], f"{b['bytes']:,}", b.get("measured_mean_ms"), b.get("measured_min_ms"),
                         b.get("measured_max_ms"), b.get("measured_goodput_Mbps"), b.get("replayed_span_ms"),
                         b.get("replayed_link_busy_ms"), b.get("replayed_start_ms")] for b in d.buckets]))
    else:
        bk = _na("no tensors are synchronised in this trace")
    sections.append(("buckets", "Per-bucket (tensor) communication", bk))

    # ---------------------------------------------------------------- stragglers
    st = d.stragglers
    srows = [(f"{r['node']} (rank {r['rank']})", [("iteration span", r["span_ms"], "#4e79a7"),
                                                  ("computation", r["compute_ms"], "#59a14f"),
                                                  ("communication", r["comm_ms"], "#f28e2b")]) for r in st["nodes"]]
    slow = next((f"{r['node']} (rank {r['rank']})" for r in st["nodes"]
                 if r["node"] == st.get("slowest") and st.get("straggler")), None)
    verdict = ""
    if "compute_spread_pct" in st:
        verdict = (f'<p><b>Computation spread across ranks: {st["compute_spread_pct"]:.1f} %</b> '
                   f'(slowest {esc(st["slowest"])}, fastest {esc(st["fastest"])}). '
                   + ("<b style='color:#c62828'>A straggler: the others wait for it in every collective.</b>"
                      if st.get("straggler") else "No straggler (spread &le; 10 %).") + "</p>")
    sg = (verdict + svg.legend([("iteration span", "#4e79a7"), ("computation", "#59a14f"), ("communication", "#f28e2b")],
                               extra=['<span class="key">dots: one per profiled iteration; black tick: mean</span>'])
          + f'<div id="straggler-chart" class="scroll">{svg.dots(srows, highlight=slow, title="stragglers")}</div>'
          + _table(["node", "host", "rank", "mean span ms", "mean compute ms", "mean comm ms",
                    "unprofiled iteration ms"],
                   [[r["node"], r["host"], r["rank"], r["mean_span_ms"], r["mean_compute_ms"], r["mean_comm_ms"],
                     r.get("unprofiled_iteration_ms")] for r in st["nodes"]]))
    att = st.get("attribution")
    if att:
        sg += (f'<p><b>What each rank costs the job</b> (dpro_kit.stragglers): the predicted iteration '
               f'({att["baseline_ms"]:.3f} ms) minus the same with that rank computing like the median of the '
               f'other workers, over all profiled iterations (held back: iterations where that saves over 1 %); '
               f'late start = median lateness entering collectives. '
               + (f'<b>{esc(att["first"])} holds the job back most.</b>' if att.get("first") else
                  "No rank costs the job more than 1 % of an iteration.") + "</p>"
               + _table(["node", "rank", "compute ms / iteration", "x median", "saved ms", "saved %",
                         "held back", "late start ms"],
                        [[r["node"], r["rank"], r["compute_ms"], r.get("compute_vs_median"), r.get("saved_ms"),
                          r.get("saved_pct"),
                          f'{r["held_back_iterations"][0]}/{r["held_back_iterations"][1]}'
                          if r.get("held_back_iterations") else None,
                          r.get("late_start_ms")] for r in att["ranks"]]))
    elif st.get("attribution_error"):
        sg += _na("Straggler attribution: " + st["attribution_error"])
    sections.append(("stragglers", "Stragglers across ranks", sg))

    # ---------------------------------------------------------------- alignment
    al = d.alignment
    if al.get("available"):
        offs = al["offsets_us"]
        und = set(al.get("undetermined") or [])   # shown as the proven interval, not as a number
        arows = [(n, [("offset", v, "#76b7b2", None)]) for n, v in offs.items() if n not in und]
        extra = {k: v for k, v in al.items() if k not in ("available", "offsets_us", "source", "undetermined",
                                                          "bounds_us")}
        ag = (f'<p>Per-node clock offsets from <code>{esc(al["source"])}</code> (aligned = raw &minus; offset: how far a node\'s clock is ahead of the reference\'s).</p>'
              + f'<div id="alignment-chart" class="scroll">'
                f'{svg.grouped_bars(arows, zero_centered=True, unit="us", title="clock offsets")}</div>'
              + _table(["node", "offset us"], [[n, _undetermined_cell(al.get("bounds_us", {}).get(n)) if n in und else v]
                                               for n, v in offs.items()])
              + (f'<p>UNDETERMINED: the traces cannot pin these offsets (collective ends too noisy, or no '
                 f'communication path); the measured timeline keeps their clocks as recorded (moved only as far '
                 f'as the proven interval demands). Profile with <code>--ring</code> for per-chunk times.</p>'
                 if und else "")
              + (_table(["result", "value"], [[k, v] for k, v in extra.items()], left=2) if extra else ""))
    else:
        ag = _na("Time alignment: " + al.get("reason", "not computed"))
    sections.append(("alignment", "Time alignment offsets", ag))

    # ---------------------------------------------------------------- memory
    mem = d.memory
    if mem.get("available"):
        mg = ""
        if mem.get("series"):
            mg += f'<div id="memory-chart" class="scroll">{svg.lines(mem["series"], title="memory")}</div>'
        mg += _table(["node", "peak MiB"], [[n, v / 2 ** 20] for n, v in mem["peak_bytes"].items()])
    else:
        mg = _na(mem.get("reason", "not available"))
    sections.append(("memory", "Memory over the iteration", mg))

    # ---------------------------------------------------------------- plan
    if d.plan is not None:
        p = d.plan
        pg = f'<p>Plan <code>{esc(p["path"])}</code>.</p>'
        if "before_ms" in p:
            prow = [("predicted iteration time", [("before", p["before_ms"], "#8c8c8c", None),
                                                  ("after", p["after_ms"], "#59a14f", None)])]
            before_card = _card(f"{p['before_ms']:.3f} ms", f"before ({p['before_key']})")
            after_card = _card(f"{p['after_ms']:.3f} ms", f"after ({p['after_key']})", "good")
            gain_card = (_card(f"{p['speedup']:.2f}x", "predicted speed-up", "good" if p["speedup"] >= 1 else "bad")
                         if p.get("speedup") else "")
            pg += (f'<div class="cards">{before_card}{after_card}{gain_card}</div>'
                   + f'<div id="plan-chart" class="scroll">{svg.grouped_bars(prow, title="plan gain")}</div>')
        else:
            pg += _na("the plan names no predicted iteration time before/after")
        rows_p = []
        for k, v in p["entries"]:
            txt = v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, indent=1)
            rows_p.append([k, txt])
        pg += ('<table><tr><th class="l">key</th><th class="l">value</th></tr>'
               + "".join(f'<tr><td class="l">{esc(k)}</td><td class="l">'
                         + (f"<pre>{esc(v[:4000])}</pre>" if isinstance(v, str) and "\n" in v else esc(v))
                         + "</td></tr>" for k, v in rows_p) + "</table>")
        sections.append(("plan", "Optimizer plan", pg))

    nav = "".join(f'<a href="#{sid}">{esc(t.split(":")[0].split(" (")[0])}</a>' for sid, t, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{esc(t)}</h2>{c}</section>' for sid, t, c in sections)
    title = f"dpro report: {f['job']}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><div class=\"sub\">{esc(d.trace_dir)} · {esc(f['framework'])} + "
            f"{esc(f['comm_backend'])}, {f['world_size']} worker(s) · dpro-kit {esc(__version__)}</div></header>"
            f"<nav>{nav}</nav><main>{body}<p class=\"note\" id=\"ready-marker\">report script did not run</p>"
            f"</main><script>{JS}</script></body></html>\n")


def section_ids(d: ReportData) -> list[str]:
    return ["overview", "timelines", "breakdown", "critical", "buckets", "stragglers", "alignment", "memory"] + (
        ["plan"] if d.plan is not None else [])


def _undetermined_cell(b: Any) -> str:
    """An undetermined offset: the interval the dependency constraints prove."""
    lo, hi = (list(b) + [None, None])[:2] if isinstance(b, (list, tuple)) else (None, None)
    f = lambda x, inf: inf if x is None else f"{float(x):.1f}"  # noqa: E731
    return f"UNDETERMINED, in [{f(lo, '-inf')}, {f(hi, '+inf')}]"


__all__ = ["CSS", "JS", "render", "section_ids"]
