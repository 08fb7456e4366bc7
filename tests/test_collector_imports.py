"""Collectors run inside the user's framework environment: they import only the standard library,
their own package, ``dpro_collect`` (collectors/common) and their framework — never dpro_kit.

Two checks: every ``import`` under collectors/ (parsed with ``ast``, so imports inside
functions count too), and a real import of every collector module in a Python environment that
has no dpro-kit and no third-party package at all (a fresh ``venv``; also MXNet's own venv when
``make mxnet`` built it), with ``PYTHONPATH`` exactly as the launcher sets it.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from dpro_kit.collectors import FRAMEWORKS, import_collector

ROOT = Path(__file__).resolve().parents[1]
COLLECTORS = ROOT / "collectors"
#: collectors/<folder> -> (its package, the framework modules it may import)
ALLOWED = {
    "common": ("dpro_collect", set()),
    "torch": ("dpro_torch", {"torch", "horovod"}),          # dpro_torch.hvd_launch: Horovod's rendezvous server
    "tf": ("dpro_tf", {"tensorflow", "tsl"}),              # dpro_tf.xplane: TF's xplane_pb2 (tsl in older layouts)
    "mxnet": ("dpro_mxnet", {"mxnet"}),
    "nccl": ("", set()),                                   # a C plugin (NCCL profiler), no Python
}
SOURCES = sorted(COLLECTORS.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def test_every_collector_folder_is_known():
    assert {p.name for p in COLLECTORS.iterdir() if p.is_dir()} == set(ALLOWED)
    assert len(SOURCES) > 20


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(COLLECTORS).as_posix())
def test_collector_imports_only_stdlib_dpro_collect_and_its_framework(path: Path):
    folder = path.relative_to(COLLECTORS).parts[0]
    own, framework = ALLOWED[folder]
    bad = [f"{path.relative_to(ROOT)}:{line}: import {mod}" for line, mod in _imports(path)
           if mod not in sys.stdlib_module_names and mod not in {own, "dpro_collect"} | framework]
    assert not bad, "collectors import only the standard library, dpro_collect and their framework:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- a real environment without dpro-kit

_PROBE = r"""
import importlib, json, sys
frameworks, modules = set(sys.argv[1].split(",")), sys.argv[2].split(",")
done, skipped = [], {}
for name in modules:
    try:
        importlib.import_module(name)
        done.append(name)
    except ModuleNotFoundError as exc:        # only the framework itself may be missing
        if (exc.name or "").split(".")[0] not in frameworks:
            raise
        skipped[name] = exc.name
third = sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")} - set(sys.stdlib_module_names) - {"sitecustomize"})
print(json.dumps({"imported": done, "skipped": skipped, "third_party": third}))
"""


def _modules(folder: str) -> list[str]:
    base = COLLECTORS / folder
    names = []
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base).with_suffix("")
        if rel.parts[0] != ALLOWED[folder][0] or "autoload" in rel.parts:
            continue                      # collectors/torch/overhead.py: a script; autoload: a sitecustomize
        names.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return names


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A fresh virtual environment with no packages at all (not even pip)."""
    d = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(d)
    return str(d / "bin" / "python")


def _pythons(bare: str) -> list[str]:
    mx = os.environ.get("DPRO_MXNET_PYTHON") or str(Path.home() / ".cache/dpro-kit/mxnet-venv/bin/python")
    return [bare] + ([mx] if Path(mx).exists() else [])


def _launcher_env(fw: str, out: Path) -> dict[str, str]:
    """What ``dpro profile --framework fw`` gives the job, on top of nothing but PATH."""
    return import_collector(fw, "launch").profile_env(str(out), "3:5", "h0", base={"PATH": os.environ.get("PATH", "")})


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_collector_modules_import_without_dpro_kit(fw, bare_python, tmp_path):
    """Every module of the collector imports in an environment without dpro-kit (only modules whose
    own framework is missing there may fail, and only for that reason); nothing third-party loads."""
    folder = FRAMEWORKS[fw][1]
    own, framework = ALLOWED[folder]
    mods = _modules(folder) + _modules("common")
    for py in _pythons(bare_python):
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _launcher_env(fw, tmp_path / "t")["PYTHONPATH"]}
        r = subprocess.run([py, "-c", _PROBE, ",".join(framework), ",".join(mods)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{py}: {r.stderr[-3000:]}"
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert "dpro_kit" not in got["third_party"], got
        extra = set(got["third_party"]) - {own, "dpro_collect"} - framework
        assert not extra, f"{py}: collector modules loaded {sorted(extra)}"
        assert {own, f"{own}.launch", f"{own}.manifest", f"{own}.auto", "dpro_collect.auto"} <= set(got["imported"])
        if py == bare_python:                 # no framework there: exactly the framework modules are skipped
            assert all(v.split(".")[0] in framework for v in got["skipped"].values())


def test_autoload_starts_the_collector_without_dpro_kit(bare_python, tmp_path):
    """The launcher's environment in a bare interpreter: its sitecustomize starts dpro_mxnet's
    auto-load (a worker waits for ``import mxnet`` with an import hook) and loads no dpro_kit."""
    env = _launcher_env("mxnet", tmp_path / "t")
    code = ("import sys, json; print(json.dumps({'hook': [type(h).__name__ for h in sys.meta_path], "
            "'mods': sorted(m for m in sys.modules if m.startswith(('dpro', 'sitecustomize')))}))")
    r = subprocess.run([bare_python, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = json.loads(r.stdout)
    assert got["hook"][0] == "ImportHook", got
    assert "dpro_mxnet.auto" in got["mods"] and not any(m.startswith("dpro_kit") for m in got["mods"]), got


def test_profile_env_puts_common_and_the_collector_on_pythonpath(tmp_path):
    for fw, (pkg, folder) in FRAMEWORKS.items():
        env = import_collector(fw, "launch").profile_env(str(tmp_path), "2:4", base={"PYTHONPATH": "/x"})
        parts = env["PYTHONPATH"].split(os.pathsep)
        assert parts == [str(COLLECTORS / "common" / "dpro_collect" / "autoload"), str(COLLECTORS / "common"),
                         str(COLLECTORS / folder), "/x"], fw
        assert env["DPRO_COLLECTOR"] == pkg and env["DPRO_STEPS"] == "2:4"


def test_installed_layout_keeps_dpro_kits_site_packages_off_the_jobs_path(bare_python, tmp_path):
    """dpro-kit installed (not a checkout): dpro_collect and dpro_mxnet sit in a site-packages
    beside dpro-kit's numpy.  The job's PYTHONPATH must reach the two packages and nothing else
    there (else that numpy shadows the one the MXNet venv needs); it is a folder of links."""
    import shutil
    site = tmp_path / "site-packages"
    shutil.copytree(COLLECTORS / "common" / "dpro_collect", site / "dpro_collect")
    shutil.copytree(COLLECTORS / "mxnet" / "dpro_mxnet", site / "dpro_mxnet")
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("raise ImportError('dpro-kit site-packages numpy leaked')\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site), "DPRO_CACHE": str(tmp_path / "cache")}
    code = ("import json, os; from dpro_collect.launch import profile_env; "
            "print(json.dumps(profile_env('dpro_mxnet', 'out', '3:5', base={})['PYTHONPATH']))")
    for _ in range(2):                        # made once, then reused
        r = subprocess.run([bare_python, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        path = json.loads(r.stdout)
        parts = path.split(os.pathsep)
        assert str(site) not in parts and parts[0] == str(site / "dpro_collect" / "autoload"), parts
        links = Path(parts[1])
        assert sorted(p.name for p in links.iterdir()) == ["dpro_collect", "dpro_mxnet"]
        assert str(links).startswith(str(tmp_path / "cache"))
    r = subprocess.run([bare_python, "-c", "import dpro_mxnet.auto, dpro_collect.files, importlib.util as u; "
                        "print(u.find_spec('numpy') is None)"], env={"PYTHONPATH": path}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
