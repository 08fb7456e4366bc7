"""Seeded mutation fuzzing of every trace format dpro reads (issue 19).

Each case copies one real recorded trace folder (:func:`seed_folders`), damages it as a user's
file could be damaged (:func:`mutate`: keys deleted, values of the wrong type, NaN / negative /
overflowing numbers, huge strings, times out of order, files truncated or emptied, ranks
missing or duplicated) and runs the real command line on it, ``dpro replay CASE --json``
(:func:`dpro_kit.cli.main`), then sorts the outcome (:func:`classify`):

``ok``
    exit 0, a finite positive iteration time, no warning (the mutation did not matter);
``repaired``
    exit 0 with a warning on stderr or in the JSON's ``warnings`` that the unmutated folder
    does not give (the reader repaired something and said what);
``refused``
    exit 2 with one line on stderr that names a file of the case (a clean refusal);
``bad_refusal``
    exit 2 but the line names no file of the case, or is several lines;
``bad_output``
    exit 0 but no JSON, or an iteration time that is not finite and positive (a silent wrong answer);
``traceback``
    any other exception (a bug: the reader did not check its input);
``hang``
    the case used more than ``--timeout`` CPU seconds, or ran more than ``--wall-timeout`` seconds
    (a case blocked without using CPU);
``crash`` / ``oom``
    the worker process died, or ran out of the per-case memory limit (``--memory-mb``).

A replay (ok or repaired) whose iteration time moved more than 1 % from the unmutated seed's is
listed in the summary: the mutation mattered, and without a warning it may be a silent wrong answer.

Every case is reproducible from its number: ``python bench/fuzz.py --case 1234 --keep DIR``
writes the mutated folder to DIR and prints its outcome.

Usage::

    python bench/fuzz.py --cases 2000                 # the long run; summary on stdout
    python bench/fuzz.py --cases 2000 --json out.json # and every non-ok case with its mutation
    python bench/fuzz.py --case 17 --keep /tmp/c17    # one case, its folder kept

Cases run in worker subprocesses (``--jobs``), each under an address-space limit; a case
whose worker spends more than ``--timeout`` CPU seconds on it (``/proc/PID/stat``), or that runs
more than ``--wall-timeout`` seconds, has its worker killed and counts as a hang.  The limit is on
CPU time because the long run shares the machine at idle priority: counted in wall-clock seconds,
a loaded machine turned healthy 1-second cases into "hangs" (chunks 18000 and 26000,
docs/reliability.md).
``tests/test_fuzz.py`` runs a few dozen cases in-process (:func:`run_case`).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import zlib
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]

#: outcome kinds (module docstring); the ones that are defects
OUTCOMES = ("ok", "repaired", "refused", "bad_refusal", "bad_output", "traceback", "hang", "crash", "oom")
DEFECTS = ("bad_refusal", "bad_output", "traceback", "hang", "crash", "oom")
#: an ok replay whose iteration time moved more than this (%) from the seed's is listed for a look:
#: a mutation that mattered without a warning may be a silent wrong answer
CHANGED_PCT = 1.0

#: files of a seed folder that are documentation or tools, not trace input
_NOT_INPUT = {"README.md", "make_fixture.py"}


# --------------------------------------------------------------------------- seeds


def shared_traces() -> Path:
    """``../shared/traces`` as ``tests/conftest.shared_traces`` finds it (one definition: imported)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from conftest import shared_traces as st  # type: ignore
    except Exception:  # noqa: BLE001 - pytest absent: the plain default
        return REPO.parent / "shared" / "traces"
    finally:
        sys.path.pop(0)
    return st()


#: examples/traces folders left out of the short run (``large=False``, ``--small``): a dpro_torch
#: folder with CUDA kernels costs ~0.9 s of CPU per case, and its twin ddp-h100-2rank-nccl-cnn
#: (same format, same readers) stays in; ddp-3host-200mbit-slowed (3 ranks x 12 iterations, ~2 s per load;
#: the same dpro_torch CPU format as ddp-2host-1000mbit, which stays in)
LARGE_EXAMPLES = frozenset({"ddp-h100-2rank-nccl-mlp", "ddp-3host-200mbit-slowed"})


def seed_folders(stage: Path, *, large: bool = True) -> dict[str, Path]:
    """The real trace folders the cases start from, by name.

    ``examples/traces/*`` (dpro_torch DDP on one and two hosts, MXNet PS, ps-lite), the BytePS
    fixture, and plain Kineto folders made of the shared HTA traces (copied into ``stage``,
    one job per folder) when ``../shared/traces/hta`` exists.

    Parameters
    ----------
    stage : Path
        A folder for the plain-Kineto seed folders.
    large : bool
        Also the larger seeds: the HTA NCCL trace (109 k events; several seconds per case) and
        :data:`LARGE_EXAMPLES` (about 1 s per case, 10x the others).
    """
    seeds = {p.name: p for p in sorted((REPO / "examples" / "traces").iterdir())
             if p.is_dir() and (large or p.name not in LARGE_EXAMPLES)}
    seeds["byteps-2w1s"] = REPO / "tests" / "fixtures" / "byteps-2w1s"
    hta = shared_traces() / "hta"
    groups = {"kineto-128rank-sampled": ["sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"]}
    if large:
        groups["kineto-nccl-2rank"] = ["nccl_2rank_rank0.json.gz"]
    for name, files in groups.items():
        if all((hta / f).is_file() for f in files):
            d = stage / name
            if not d.is_dir():
                d.mkdir(parents=True)
                for f in files:
                    shutil.copy2(hta / f, d / f)
            seeds[name] = d
    return seeds


# --------------------------------------------------------------------------- mutations

HUGE_STRING = "A" * 1_000_000
#: values a damaged or hostile file can hold where anything else was expected
HOSTILE: tuple[Any, ...] = (None, "", "x", "12", [], {}, [1, "a", None], True, False, 0, -1, -10**6, 0.5, 2**63,
                            2**64 + 1, 10**30, -(2**63), float("nan"), float("inf"), float("-inf"), 1e308, -1e308,
                            HUGE_STRING)
TIME_KEYS = ("ts", "dur", "start", "end", "time", "t", "start_us", "end_us", "dur_us", "time_ns", "start_ns",
             "end_ns", "send", "recv", "process", "t0", "t1")


def _load(path: Path) -> Any:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if path.suffix == ".jsonl":   # the dpro NCCL plugin's files: one JSON document a line, mutated as a list
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    return json.loads(raw)


def _dump(path: Path, doc: Any) -> None:
    if path.suffix == ".jsonl":
        path.write_bytes("".join(json.dumps(d) + "\n" for d in doc).encode())
        return
    raw = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)


def _walk(rng: random.Random, doc: Any, stop: float = 0.35) -> tuple[Any, Any] | None:
    """A random (container, key) in ``doc``: descend from the root, stopping with probability ``stop``
    at each level, so shallow keys (meta fields, manifest entries) are hit as often as deep ones."""
    cur = doc
    found = None
    for _ in range(12):
        if isinstance(cur, dict) and cur:
            key = rng.choice(list(cur))
        elif isinstance(cur, list) and cur:
            key = rng.randrange(len(cur))
        else:
            break
        found = (cur, key)
        nxt = cur[key]
        if not isinstance(nxt, (dict, list)) or not nxt or rng.random() < stop:
            break
        cur = nxt
    return found


def _time_fields(doc: Any, limit: int = 200_000) -> list[tuple[Any, Any]]:
    """(container, key) of every numeric field whose key names a time, breadth first."""
    out, stack = [], [doc]
    while stack and len(out) < limit:
        cur = stack.pop()
        items = cur.items() if isinstance(cur, dict) else enumerate(cur) if isinstance(cur, list) else ()
        for k, v in items:
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif isinstance(k, str) and k in TIME_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((cur, k))
    return out


def _lists(doc: Any) -> list[list]:
    out, stack = [], [doc]
    while stack:
        cur = stack.pop()
        if isinstance(cur, list):
            if len(cur) >= 1:
                out.append(cur)
            stack.extend(v for v in cur if isinstance(v, (dict, list)))
        elif isinstance(cur, dict):
            stack.extend(v for v in cur.values() if isinstance(v, (dict, list)))
    return out


def _json_mutation(rng: random.Random, doc: Any) -> str | None:
    """Damage ``doc`` in place; a short description, or None when nothing applied."""
    op = rng.choice(["delete_key", "wrong_type", "wrong_type", "time", "time", "list", "huge_string"])
    if op == "time":
        fields = _time_fields(doc)
        if not fields:
            return None
        cont, key = rng.choice(fields)
        old = cont[key]
        how = rng.choice(["negative", "huge", "nan", "earlier", "swap", "overflow", "float_str"])
        if how == "negative":
            cont[key] = -abs(old) - 1
        elif how == "huge":
            cont[key] = old + 10**15
        elif how == "nan":
            cont[key] = float("nan")
        elif how == "earlier":
            cont[key] = old - rng.choice([1, 1000, 10**6, 10**9])
        elif how == "overflow":
            cont[key] = 2**64 + 7
        elif how == "float_str":
            cont[key] = str(old)
        else:
            c2, k2 = rng.choice(fields)
            cont[key], c2[k2] = c2[k2], old
        return f"time {how} [{key}]={old!r:.40}"
    if op == "list":
        lists = _lists(doc)
        if not lists:
            return None
        lst = rng.choice(lists)
        how = rng.choice(["dup", "drop", "shuffle", "reverse", "truncate", "empty"])
        n = len(lst)
        if how == "dup":
            i = rng.randrange(n)
            lst.insert(rng.randrange(n + 1), copy.deepcopy(lst[i]))
        elif how == "drop":
            del lst[rng.randrange(n)]
        elif how == "shuffle":
            rng.shuffle(lst)
        elif how == "reverse":
            lst.reverse()
        elif how == "truncate":
            del lst[rng.randrange(n):]
        else:
            lst.clear()
        return f"list {how} (len {n})"
    if op == "huge_string":
        at = _walk(rng, doc)
        if at is None:
            return None
        cont, key = at
        if isinstance(cont, dict) and rng.random() < 0.3:
            cont[HUGE_STRING[:100_000] + "k"] = cont.pop(key)
            return f"huge key for [{key!r:.40}]"
        cont[key] = HUGE_STRING
        return f"huge string at [{key!r:.40}]"
    at = _walk(rng, doc)
    if at is None:
        return None
    cont, key = at
    if op == "delete_key":
        if isinstance(cont, dict):
            del cont[key]
        else:
            del cont[key]
        return f"delete [{key!r:.40}]"
    val = rng.choice(HOSTILE)
    old = cont[key]
    cont[key] = copy.copy(val)
    return f"[{key!r:.40}]: {old!r:.30} -> {val!r:.30}"


def _files(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*") if p.is_file() and p.name not in _NOT_INPUT)


def _node_dirs(case: Path) -> list[Path]:
    """Folders that hold one node's files (``host/node/`` of the dpro collectors), else the files of a
    flat folder (plain Kineto, ps-lite)."""
    dirs = sorted({p.parent for p in _files(case) if p.parent != case})
    return dirs


def mutate(rng: random.Random, case: Path) -> list[str]:
    """Apply one to three random mutations to the trace folder ``case`` (in place).

    Parameters
    ----------
    rng : random.Random
        The case's generator (the case number seeds it).
    case : Path
        A copy of a seed folder.

    Returns
    -------
    list of str
        What was done, one entry per mutation (``file: what``).
    """
    done: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        files = _files(case)
        if not files:
            break
        kind = rng.choices(["json", "file", "folder"], weights=[70, 20, 10])[0]
        if kind == "folder":
            dirs = _node_dirs(case)
            how = rng.choice(["drop_rank", "dup_rank"])
            if dirs:
                d = rng.choice(dirs)
                if how == "drop_rank":
                    shutil.rmtree(d)
                else:
                    new = d.with_name(d.name + "_copy" if rng.random() < 0.5 else str(rng.randrange(2, 300)))
                    if not new.exists():
                        shutil.copytree(d, new)
                done.append(f"{d.relative_to(case)}: {how}")
            else:  # flat folder: files are the ranks
                f = rng.choice(files)
                if how == "drop_rank":
                    f.unlink()
                else:
                    shutil.copy2(f, f.with_name("copy_" + f.name))
                done.append(f"{f.relative_to(case)}: {how}")
            continue
        f = rng.choice(files)
        rel = f.relative_to(case)
        if kind == "file":
            raw = f.read_bytes()

            def _inner(raw: bytes) -> bytes:
                """A .gz file's content; an earlier mutation of this case may have left it no gzip stream."""
                try:
                    return gzip.decompress(raw)
                except (OSError, EOFError, zlib.error):
                    return raw
            how = rng.choice(["truncate", "truncate", "truncate_inner", "empty", "delete", "garbage", "not_utf8"])
            if how == "truncate":
                f.write_bytes(raw[:rng.randrange(max(1, len(raw)))])
            elif how == "truncate_inner" and f.suffix == ".gz":
                inner = _inner(raw)
                f.write_bytes(gzip.compress(inner[:rng.randrange(max(1, len(inner)))], mtime=0))
            elif how == "truncate_inner":
                f.write_bytes(raw[:len(raw) // 2])
            elif how == "empty":
                f.write_bytes(b"")
            elif how == "delete":
                f.unlink()
            elif how == "garbage":
                f.write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([1, 17, 4096]))))
            else:
                pos = rng.randrange(max(1, len(raw)))
                f.write_bytes(raw[:pos] + b"\xff\xfe" + raw[pos:]) if f.suffix != ".gz" else \
                    f.write_bytes(gzip.compress(b"\xff" + _inner(raw), mtime=0))
            done.append(f"{rel}: {how}")
            continue
        try:
            doc = _load(f)
        except (ValueError, OSError, EOFError):
            continue  # already damaged by an earlier mutation of this case
        what = _json_mutation(rng, doc)
        if what is None:
            continue
        _dump(f, doc)
        done.append(f"{rel}: {what}")
    return done


def make_case(number: int, seeds: dict[str, Path], dest: Path) -> tuple[str, list[str]]:
    """Write case ``number`` to ``dest`` (a new folder): (seed name, mutations).

    Parameters
    ----------
    number : int
        The case number; the same number always gives the same case for the same seeds.
    seeds : dict
        :func:`seed_folders`.
    dest : Path
        Where the mutated copy goes (must not exist).
    """
    rng = random.Random(number)
    name = rng.choice(sorted(seeds))
    shutil.copytree(seeds[name], dest, ignore=shutil.ignore_patterns(*_NOT_INPUT))
    return name, mutate(rng, dest)


# --------------------------------------------------------------------------- running one case


class CaseTimeout(Exception):
    """The in-process per-case time limit (SIGALRM) ran out."""


@contextlib.contextmanager
def _alarm(seconds: float):
    if not seconds or threading_main() is False:
        yield
        return

    def fire(signum, frame):  # noqa: ARG001
        raise CaseTimeout()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def replay(case: Path, *, timeout: float = 0) -> dict[str, Any]:
    """Run ``dpro replay CASE --json`` in this process: rc, stdout, stderr, and the traceback if any.

    Parameters
    ----------
    case : Path
        The trace folder.
    timeout : float
        Seconds before the case counts as a hang (SIGALRM; 0: none).  A hang inside compiled
        code is only caught by the subprocess runner of :func:`main`.
    """
    from dpro_kit.cli import main as dpro_main

    out, err = io.StringIO(), io.StringIO()
    rc, tb = None, None
    t0 = time.perf_counter()
    try:
        with _alarm(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = dpro_main(["replay", str(case), "--json"])
    except CaseTimeout:
        rc = "hang"
    except MemoryError:
        rc, tb = "oom", traceback.format_exc(limit=-8)
    except BaseException:  # noqa: BLE001 - that is what is counted
        rc, tb = "traceback", traceback.format_exc(limit=-8)
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(), "traceback": tb,
            "seconds": time.perf_counter() - t0}


def classify(res: dict[str, Any], case: Path, baseline_warnings: set[str] = frozenset()) -> tuple[str, str]:
    """(outcome, detail) of a :func:`replay` result (module docstring).

    Parameters
    ----------
    res : dict
        :func:`replay`'s result.
    case : Path
        The case folder (a refusal must name a file in it).
    baseline_warnings : set of str
        Warnings the unmutated seed gives already (not repairs).
    """
    rc = res["rc"]
    if rc in ("hang", "oom", "traceback"):
        tb = (res.get("traceback") or "").strip().splitlines()
        return rc, (tb[-1] if tb else "") + (" @ " + _where(res["traceback"]) if res.get("traceback") else "")
    err_lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    if rc == 2:
        errs = [ln for ln in err_lines if ln.startswith("dpro: error: ")]
        if len(errs) != 1:
            return "bad_refusal", " | ".join(err_lines)[:300]
        line = errs[0]
        if str(case) not in line or len(line) > 5000:
            return "bad_refusal", line[:300]
        return "refused", line.replace(str(case), "CASE")[:300]
    if rc != 0:
        return "bad_refusal", f"exit {rc}: " + " | ".join(err_lines)[:300]
    try:
        out = json.loads(res["stdout"])
        it = float(out["iteration_time_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        return "bad_output", f"no JSON result: {exc}"
    if not math.isfinite(it) or it <= 0:
        return "bad_output", f"iteration_time_ms = {it}"
    warns = [w for w in (out.get("warnings") or []) if w not in baseline_warnings]
    warns += [ln for ln in err_lines if ln not in baseline_warnings]
    if warns:
        return "repaired", warns[0].replace(str(case), "CASE")[:300]
    return "ok", f"{it:.3f} ms"


def _where(tb: str) -> str:
    """``file:line`` of the innermost dpro_kit frame of a traceback (groups tracebacks by bug)."""
    frames = [ln.strip() for ln in tb.splitlines() if ln.strip().startswith('File "')]
    mine = [f for f in frames if "dpro_kit" in f or "dpro_collect" in f] or frames
    if not mine:
        return "?"
    f = mine[-1]
    try:
        path = f.split('"')[1]
        line = f.split("line ")[1].split(",")[0]
        func = f.split(", in ")[-1]
        return f"{Path(path).relative_to(REPO) if Path(path).is_relative_to(REPO) else path}:{line} ({func})"
    except (IndexError, ValueError):
        return f


def baseline(seeds: dict[str, Path], work: Path) -> dict[str, dict[str, Any]]:
    """Per seed, what its unmutated folder gives: ``warnings`` (so only new ones count as repairs) and
    ``iteration_time_ms`` (so an ok case that predicts another time is counted as ``changed``)."""
    out = {}
    for name, path in seeds.items():
        case = work / f"base-{name}"
        shutil.copytree(path, case, ignore=shutil.ignore_patterns(*_NOT_INPUT))
        res = replay(case)
        kind, detail = classify(res, case)
        if kind not in ("ok", "repaired"):
            raise SystemExit(f"seed {name} does not replay cleanly: {kind}: {detail}")
        doc = json.loads(res["stdout"])
        out[name] = {"warnings": sorted(set(doc.get("warnings") or []) |
                                        {ln for ln in res["stderr"].splitlines() if ln.strip()}),
                     "iteration_time_ms": float(doc["iteration_time_ms"])}
        shutil.rmtree(case)
    return out


def run_case(number: int, seeds: dict[str, Path], work: Path, base: dict[str, dict[str, Any]], *,
             timeout: float = 0, keep: Path | None = None) -> dict[str, Any]:
    """Make case ``number`` under ``work``, replay it in-process and classify it.

    Returns
    -------
    dict
        ``case``, ``seed``, ``mutations``, ``outcome``, ``detail``, ``seconds``; for a replay
        (ok, repaired) also ``change_pct``: its iteration time against the unmutated seed's.
    """
    case = keep if keep is not None else work / f"case-{number}"
    if case.exists():
        shutil.rmtree(case)
    name, muts = make_case(number, seeds, case)
    res = replay(case, timeout=timeout)
    b = base.get(name) or {}
    kind, detail = classify(res, case, set(b.get("warnings") or ()))
    out = {"case": number, "seed": name, "mutations": muts, "outcome": kind, "detail": detail,
           "seconds": round(res["seconds"], 3)}
    if kind in ("ok", "repaired") and b.get("iteration_time_ms"):
        it = float(json.loads(res["stdout"])["iteration_time_ms"])
        out["change_pct"] = round(100.0 * (it - b["iteration_time_ms"]) / b["iteration_time_ms"], 3)
    if res.get("traceback") and kind == "traceback":
        out["traceback"] = res["traceback"]
    if keep is None:
        shutil.rmtree(case, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- the long run (subprocess workers)


def _worker(args: argparse.Namespace) -> None:
    """Read case numbers on stdin, write one JSON result per line on stdout (run by :func:`main`)."""
    import resource
    if args.memory_mb:
        lim = args.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    work = Path(args.work)
    seeds = seed_folders(work / "seeds", large=not args.small)
    os.environ["DPRO_CACHE"] = str(work / "cache")
    base = json.loads(Path(args.base).read_text())
    real_out = sys.stdout
    sys.stdout = sys.stderr  # nothing but results on the pipe
    print("ready", file=real_out, flush=True)
    for line in sys.stdin:
        n = int(line)
        if args.stall and args.stall_sleep:   # tests/test_fuzz.py: a case blocked without using CPU
            time.sleep(args.stall)
        elif args.stall:                    # tests/test_fuzz.py: a case that never ends, spinning
            t0 = time.process_time()
            while time.process_time() - t0 < args.stall:
                pass
        try:
            r = run_case(n, seeds, work / f"w{os.getpid()}", base)
        except MemoryError:
            r = {"case": n, "outcome": "oom", "detail": "MemoryError while making the case"}
        print(json.dumps(r), file=real_out, flush=True)


class _Worker:
    def __init__(self, args: argparse.Namespace, base_file: Path) -> None:
        cmd = [sys.executable, __file__, "--worker", "--work", str(args.work), "--base", str(base_file),
               "--memory-mb", str(args.memory_mb), "--stall", str(args.stall)] + (["--small"] if args.small else []) \
            + (["--stall-sleep"] if args.stall_sleep else [])
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, bufsize=1, start_new_session=True)
        self.case: int | None = None
        self.since = 0.0
        # the limit counts from the case, not from the worker's start (imports, seed folders)
        if self.p.stdout.readline().strip() != "ready":
            raise SystemExit(f"a fuzz worker did not start (exit {self.p.wait()}); run with --case N to see why")

    def give(self, n: int) -> None:
        self.case, self.since, self.cpu0 = n, time.monotonic(), self.cpu()
        self.p.stdin.write(f"{n}\n")
        self.p.stdin.flush()

    def cpu(self) -> float:
        """CPU seconds (user + system) the worker process has used so far (0 once it is gone)."""
        try:
            fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def over(self, args: argparse.Namespace) -> str | None:
        """Why the current case is past its limits (None: it is not)."""
        cpu, wall = self.cpu() - self.cpu0, time.monotonic() - self.since
        if cpu > args.timeout:
            return f"over {args.timeout:g} CPU s"
        if wall > args.wall_timeout:
            return f"over {args.wall_timeout:g} s wall ({cpu:.1f} CPU s)"
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="how many cases (numbers FIRST .. FIRST+CASES-1)")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--case", type=int, help="run this one case in-process and print it")
    ap.add_argument("--keep", type=Path, help="with --case: write the mutated folder here")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--timeout", type=float, default=60.0, help="CPU seconds per case before it counts as a hang "
                    "(healthy cases take 0.01-2 s)")
    ap.add_argument("--wall-timeout", type=float, default=None, help="wall-clock seconds per case before it counts "
                    "as a hang (a case blocked without using CPU; default 10 x --timeout)")
    ap.add_argument("--memory-mb", type=int, default=8192, help="address-space limit per worker (0: none; 4096 made healthy pslite replays abort or raise MemoryError now and then: the limit counts reserved virtual memory, not RSS)")
    ap.add_argument("--small", action="store_true", help="leave out the large seeds (the HTA NCCL trace and "
                    "ddp-h100-2rank-nccl-mlp, ddp-3host-200mbit-slowed), as the short run in tests/test_fuzz.py does")
    ap.add_argument("--json", type=Path, help="write every case (mutations, outcome, detail) here")
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stall", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: cases that hang
    ap.add_argument("--stall-sleep", action="store_true", help=argparse.SUPPRESS)  # ... blocked, not spinning
    args = ap.parse_args(argv)
    if args.wall_timeout is None:
        args.wall_timeout = 10 * args.timeout
    if args.worker:
        _worker(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="dpro-fuzz-") as tmp:
        work = Path(tmp)
        os.environ["DPRO_CACHE"] = str(work / "cache")
        seeds = seed_folders(work / "seeds", large=not args.small)
        base = baseline(seeds, work)
        if args.case is not None:
            r = run_case(args.case, seeds, work, base, timeout=args.timeout, keep=args.keep)
            print(json.dumps(r, indent=1))
            return 0
        base_file = work / "base.json"
        base_file.write_text(json.dumps(base))
        args.work = str(work)
        return _run_many(args, base_file, sorted(seeds))


def _run_many(args: argparse.Namespace, base_file: Path, seed_names: list[str]) -> int:
    import selectors
    todo = list(range(args.first, args.first + args.cases))[::-1]
    results: list[dict[str, Any]] = []
    workers = [_Worker(args, base_file) for _ in range(max(1, args.jobs))]
    sel = selectors.DefaultSelector()
    for w in workers:
        sel.register(w.p.stdout, selectors.EVENT_READ, w)
    t0 = time.monotonic()

    def feed(w: _Worker) -> None:
        if todo:
            w.give(todo.pop())
        else:
            w.case = None

    for w in workers:
        feed(w)
    while any(w.case is not None for w in workers):
        for key, _ in sel.select(timeout=1.0):
            w = key.data
            line = w.p.stdout.readline()
            if not line:  # the worker died: the case crashed it
                results.append({"case": w.case, "outcome": "crash", "detail": f"worker exit {w.p.wait()}"})
                sel.unregister(w.p.stdout)
                nw = _Worker(args, base_file)
                workers[workers.index(w)] = nw
                sel.register(nw.p.stdout, selectors.EVENT_READ, nw)
                feed(nw)
                continue
            r = json.loads(line)
            why = w.over(args)
            if why:   # it ended, but past the limit
                r.update(outcome="hang", detail=f"{why} ({r['outcome']} after {time.monotonic() - w.since:.1f} s)")
            results.append(r)
            feed(w)
        for i, w in enumerate(workers):
            why = w.over(args) if w.case is not None else None
            if why:
                results.append({"case": w.case, "outcome": "hang", "detail": f"{why}, killed"})
                sel.unregister(w.p.stdout)
                w.kill()
                nw = _Worker(args, base_file)
                workers[i] = nw
                sel.register(nw.p.stdout, selectors.EVENT_READ, nw)
                feed(nw)
        done = len(results)
        if done and done % 100 == 0 and sys.stderr.isatty():
            print(f"\r{done}/{args.cases}", end="", file=sys.stderr)
    for w in workers:
        w.p.stdin.close()
        w.kill()
    wall = time.monotonic() - t0
    return _summary(args, results, wall, seed_names)


def _summary(args: argparse.Namespace, results: list[dict[str, Any]], wall: float, seed_names: list[str]) -> int:
    counts = Counter(r["outcome"] for r in results)
    by_seed: dict[str, Counter] = {}
    for r in results:
        by_seed.setdefault(r.get("seed", "?"), Counter())[r["outcome"]] += 1
    print(f"cases {len(results)} (numbers {args.first}..{args.first + args.cases - 1}), seeds "
          f"{', '.join(seed_names)}; wall {wall:.0f} s, {args.jobs} worker(s), limit {args.timeout:g} CPU s "
          f"and {args.memory_mb} MiB per case")
    print("  ".join(f"{k} {counts.get(k, 0)}" for k in OUTCOMES))
    for s, c in sorted(by_seed.items()):
        print(f"  {s:<28}" + "  ".join(f"{k} {c.get(k, 0)}" for k in OUTCOMES if c.get(k)))
    changed = [r for r in results if abs(r.get("change_pct", 0.0)) > CHANGED_PCT]
    print(f"replays whose iteration time moved more than {CHANGED_PCT:g} % from the unmutated seed's: "
          f"{sum(r['outcome'] == 'ok' for r in changed)} without a warning, "
          f"{sum(r['outcome'] == 'repaired' for r in changed)} with one")
    for r in sorted(changed, key=lambda r: -abs(r["change_pct"]))[:15]:
        print(f"  {r['change_pct']:+9.2f} %  {r['outcome']:<8} --case {r['case']} {r['seed']}: {'; '.join(r['mutations'])}"[:250])
    defects = [r for r in results if r["outcome"] in DEFECTS]
    groups = Counter((r["outcome"], r.get("detail", "")) for r in defects)
    for (kind, detail), n in groups.most_common(40):
        first = min(r["case"] for r in defects if (r["outcome"], r.get("detail", "")) == (kind, detail))
        print(f"  {n:>5} x {kind}: {detail[:300]}   (e.g. --case {first})")
    if args.json:
        args.json.write_text(json.dumps({"counts": dict(counts), "wall_s": wall,
                                         "cases": sorted(results, key=lambda r: r["case"])}, indent=1))
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
