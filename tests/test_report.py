"""`dpro report`: a self-contained HTML page, checked as text and in a real headless Chromium.

Browser tests need Debian's ``chromium`` (``apt-get install -y chromium``; ``make test``
installs it).  They load the page with console logging on stderr and fail on any
console message (errors, uncaught exceptions), read the DOM marker the page's
script sets once it ran (``data-report-ready="ok"``), and take a screenshot that is
kept in the pytest tmp dir (and copied to ``$DPRO_SCREENSHOT_DIR`` when set, for CI
artefacts).  ``docs/img/report.png`` was taken the same way.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import tiny_traceset
from dpro_kit.cli import cli, main
from dpro_kit.cli.check import check
from dpro_kit.cli.report import report
from dpro_kit.report import build_report
from dpro_kit.trace import MEMORY_COLUMNS, save_trace
from test_timeline_format import validate_trace_events

REAL = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp-2rank-gloo"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                    "(apt-get install -y chromium); `make test` installs it")


@pytest.fixture(autouse=True, scope="module")
def _registered():
    """The commands as the lead registers them in cli.py (idempotent)."""
    for cmd in (report, check):
        if cmd.name not in cli.commands:
            cli.add_command(cmd)


@pytest.fixture(scope="module")
def real_report():
    return build_report(REAL, iterations=3)


@pytest.fixture
def extras_dir(tmp_path: Path) -> tuple[Path, Path]:
    """tiny_traceset on 2 hosts + memory samples + an alignment result + a plan."""
    ts = tiny_traceset(workers=3, hosts=2)
    ts.manifest.extra["measured_iteration_ms"] = 2.4
    # allocator samples as the trace model holds them (hand-written values; real ones: tests/test_memory.py)
    it = ts.manifest.iterations[1]
    t0 = {n: float(ts.events[(ts.events["node"] == n) & (ts.events["iteration"] == it)]["start"].min())
          for n in ("w0", "w1")}
    rows = [("w0", it, t0["w0"] + t, "cpu", int(b)) for t, b in [(0, 1e8), (500, 3e8), (1500, 5e8), (2100, 2e8)]]
    rows += [("w1", it, t0["w1"] + t, "cpu", int(b)) for t, b in [(0, 1e8), (700, 4e8), (1800, 1.5e8)]]
    ts.memory = pd.DataFrame(rows, columns=list(MEMORY_COLUMNS)).astype(MEMORY_COLUMNS)
    d = save_trace(ts, tmp_path / "trace")
    from dpro_kit.align import ALIGN_VERSION, AlignResult, fingerprint, save_result
    from dpro_kit.trace import load_trace
    save_result(AlignResult.from_json(  # a result as `dpro align` caches it, valid for this trace
        {"version": ALIGN_VERSION, "fingerprint": fingerprint(load_trace(d)),  # (else replay re-solves it)
         "offsets_us": {"w0": 0.0, "w1": -120.5, "w2": 300.0}, "reference": "w0", "mode": "coarse",
         "status": "optimal", "solver": "CLARABEL", "solve_time_s": 0.02, "residuals": {"max_us": 3.5},
         "binding": [], "convention": "aligned = raw - offset"}), d)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"predicted": {"iteration_ms_before": 2.3, "iteration_ms_after": 1.9},
                                "strategies": [{"pass": "tensor_fusion", "buckets": [[0, 1]]}],
                                "ddp": {"bucket_cap_mb": 12}, "search_s": 4.2}))
    return d, plan


# ----------------------------------------------------------------------------- the page as text

def _offline(html: str) -> None:
    assert not re.search(r"<script[^>]+src=", html) and not re.search(r"<link[^>]+stylesheet", html)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html) and "@import" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    # the only absolute URL is the SVG namespace, which is a name, not a fetch
    assert set(re.findall(r"https?://[^\s\"'<)]+", html)) <= {"http://www.w3.org/2000/svg"}


def test_real_trace_report_has_every_section(real_report):
    html = real_report.html
    _offline(html)
    for sid in ("overview", "timelines", "breakdown", "critical", "buckets", "stragglers", "alignment", "memory"):
        assert f'<section id="{sid}">' in html
    for chart in ("measured-timeline", "replayed-timeline", "breakdown-chart", "critical-chart", "bucket-chart",
                  "straggler-chart"):
        assert re.search(f'id="{chart}"[^>]*>.*?<svg', html, re.S), chart
    assert "Time alignment: not computed" in html and "not available: the trace has no memory data" in html
    assert 'id="plan"' not in html
    d = real_report.data
    # measured panel: every event of the shown iteration is a bar; overlapping gloo allreduces got a 2nd lane
    shown = d.ts.events[d.ts.events["iteration"] == int(re.search(r"iteration (\d+)", d.measured_tl.title)[1])]
    assert sum(len(ln.bars) for ln in d.measured_tl.lanes) == len(shown)
    assert any(ln.label == "comm #2" for ln in d.measured_tl.lanes)
    # replayed panel: a critical-path lane, node streams and network links, idle gaps drawn
    groups = {ln.group for ln in d.replayed_tl.lanes}
    assert {"critical path", "host0/0", "host0/1", "network"} <= groups
    assert d.replayed_tl.lanes[0].bars and all(b.critical for b in d.replayed_tl.lanes[0].bars)
    assert d.replayed_tl.span_us == pytest.approx(d.replay["iteration_time_ms"] * 1e3)
    assert 'class="gap"' in html and 'class="op crit"' in html
    # the breakdown adds up: per node, compute + comm - overlap + idle = the iteration it shows
    for b in d.breakdown:
        for side, span in (("measured", b["measured_span_ms"]), ("replayed", d.replay["iteration_time_ms"])):
            total = b[f"{side}_compute_ms"] + b[f"{side}_comm_ms"] - b[f"{side}_overlap_ms"] + b[f"{side}_idle_ms"]
            assert total == pytest.approx(span, rel=1e-6)
    assert [b["tensor"] for b in d.buckets] == ["bucket0", "bucket1", "bucket2"]
    assert all(b["measured_mean_ms"] > 0 and b["replayed_span_ms"] > 0 for b in d.buckets)
    st = d.stragglers
    assert {r["node"] for r in st["nodes"]} == {"host0/0", "host0/1"} and st["compute_spread_pct"] >= 0
    assert sum(d.critical_by_kind.values()) == pytest.approx(d.critical_length_ms)
    assert d.critical_length_ms <= d.replay["iteration_time_ms"] + 1e-9


def test_report_with_alignment_memory_and_plan(extras_dir, tmp_path):
    trace, plan = extras_dir
    rep = build_report(trace, plan=plan, iterations=2)
    html = rep.html
    _offline(html)
    assert 'id="alignment-chart"' in html and "dpro align (applied by the replay)" in html and "-120.500" in html
    assert "CLARABEL" in html and "residuals.max_us" in html
    assert "aligned" in rep.data.measured_tl.note      # the measured panel uses aligned clocks (raw - offset)
    first = {ln.group: min(b.start for b in ln.bars) for ln in rep.data.measured_tl.lanes if ln.label == "compute"}
    assert first["w1"] - first["w0"] == pytest.approx(120.5) and first["w0"] - first["w2"] == pytest.approx(300.0)
    assert 'id="memory-chart"' in html and "<polyline" in html
    assert 'id="plan-chart"' in html and "1.21x" in html and "tensor_fusion" in html and "bucket_cap_mb" in html
    assert rep.summary["plan_speedup"] == pytest.approx(2.3 / 1.9)
    assert rep.summary["alignment"] == "available" and rep.summary["memory"] == "available"
    files = rep.write_timelines(tmp_path / "tl")
    assert [f.name for f in files] == ["measured.json", "replayed.json", "aligned.json"]
    for f in files:
        assert validate_trace_events(json.loads(f.read_text())) == [], f
    aligned = json.loads(files[2].read_text())
    assert aligned["otherData"]["offsets_us"]["w2"] == 300.0 and aligned["otherData"]["kind"] == "aligned"


def test_alignment_hook_in_manifest_and_generic_plan(tmp_path):
    ts = tiny_traceset()
    ts.manifest.extra["alignment"] = {"offsets_us": {"w0": 0, "w1": 42.0}}
    d = save_trace(ts, tmp_path / "t")
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"format": "whatever", "passes": ["a", "b"]}))
    rep = build_report(d, plan=plan, iterations=1)
    assert rep.data.alignment["source"] == "manifest.json (extra)"
    assert "names no predicted iteration time" in rep.html and "passes" in rep.html


# ----------------------------------------------------------------------------- the command

def test_report_cli_json_quiet_and_bad_input(tiny_trace_dir, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(tiny_trace_dir), "-o", str(out), "--json", "--timeline-dir", str(tmp_path / "tl")]) == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    assert cap.err == "" and out.read_text().startswith("<!DOCTYPE html>")
    assert summary["output"] == str(out) and summary["iteration_time_ms"] > 0
    # the report aligns the clocks as `dpro replay` does (the tiny trace's workers are on two hosts): aligned.json too
    assert summary["alignment"] == "available" and len(summary["timelines"]) == 3
    # piped (not a terminal): no progress even without --quiet
    r = subprocess.run([sys.executable, "-c", "import sys; from dpro_kit.cli import main; sys.exit(main())",
                        "report", str(tiny_trace_dir), "-o", str(tmp_path / "p.html")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "" and "wrote" in r.stdout
    for args, must in ((["report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html")], "does not exist"),
                       (["report", str(tiny_trace_dir), "-o", str(tmp_path / "x.html"), "--plan",
                         str(tmp_path / "missing.json")], "plan file not found")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and must in err and "Traceback" not in err, err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["report", str(tiny_trace_dir), "-o", str(tmp_path / "x.html"), "--plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and "not JSON" in err
    assert not (tmp_path / "x.html").exists()


# ----------------------------------------------------------------------------- in a real browser

def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@needs_chromium
def test_console_capture_detects_errors(tmp_path):
    """The negative control: a page that throws is caught by the same check."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>null.foo();</script></body></html>")
    r = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert any("Uncaught TypeError" in line for line in _console(r.stderr)), r.stderr[-2000:]


@needs_chromium
@pytest.mark.parametrize("which", ["real", "extras"])
def test_report_in_headless_chromium(which, real_report, extras_dir, tmp_path):
    import os

    if which == "real":
        html = real_report.html
    else:
        html = build_report(extras_dir[0], plan=extras_dir[1], iterations=2).html
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    r = _chromium(tmp_path, "--dump-dom", "--virtual-time-budget=3000", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    assert _console(r.stderr) == [], _console(r.stderr)
    root = re.search(r"<html[^>]*>", r.stdout)[0]
    assert 'data-report-ready="ok"' in root and "data-report-error" not in root, root
    bars = int(re.search(r'data-timeline-bars="(\d+)"', root)[1])
    assert bars > 50
    shot = tmp_path / "report.png"
    r = _chromium(tmp_path, "--window-size=1280,1400", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert _console(r.stderr) == []
    assert _png_size(shot) == (1280, 1400)
    assert shot.stat().st_size > 40_000   # a blank or unstyled page compresses to a few KiB
    keep = os.environ.get("DPRO_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"report-{which}.png")
