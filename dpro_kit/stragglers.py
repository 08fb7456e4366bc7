"""Straggler attribution: which worker holds the job back, and what fixing it would buy.

For every worker rank the job is replayed again with that rank computing as fast as the
median worker (:func:`dpro_kit.whatif.like_median`; the time saved is what its slow
computation costs the whole job).  With per-iteration durations (the default) every profiled
iteration is replayed as profiled and with the fix, and the saving is that of all of them
together (:func:`saved_over_iterations`), not of the one median iteration: a straggler is the
slowest rank in most iterations, not necessarily in the one that stands for the job.  It would
also replay the rank when its host is not alone on the link model, with its
with its host's link at the others' rate, but that is not separable from one fitted link model
(reported as not measured). From the trace itself: how late the rank enters collectives compared with the
earliest rank (median over collective instances; HTA's late-start signal, here next to the
replayed saving that HTA cannot give). Ranked by time saved.

Stateless: takes a :class:`dpro_kit.session.Session`, returns plain dicts (``dpro replay
--stragglers``, the HTML report).

References
----------
.. [1] Hu et al., "dPRO", MLSys 2022, §4.3 (replay) and §6 (what-if analysis)
       (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

#: at most this many ranks are replayed (the slowest by traced computation); the others are listed
MAX_REPLAYED_RANKS = 16


def late_start_ms(ts: Any) -> dict[str, float]:
    """Per node: median over collective instances of (its entry - the earliest rank's entry), ms."""
    ev = ts.events
    comm = ev[ev["kind"].astype(str) == "COMM"]
    if comm.empty:
        return {}
    first = comm.groupby(["op", "iteration", "node"], observed=True)["start"].min().reset_index()
    first["late"] = first["start"] - first.groupby(["op", "iteration"], observed=True)["start"].transform("min")
    return {str(n): float(g["late"].median()) / 1e3 for n, g in first.groupby("node", observed=True)}


def saved_over_iterations(base_its: dict[str, float], fixed_its: dict[str, float],
                          held_pct: float = 1.0) -> tuple[float | None, list[int] | None]:
    """The fraction of the job's time a fix saves, over every profiled iteration, paired.

    ``1 - sum(fixed_i) / sum(base_i)`` over the iterations both replayed (each iteration as profiled
    and with the fix, so the same op times on the other ranks): the saving of the whole run, which
    is the sum of its iterations.  Not the saving of one iteration: which rank is the slowest moves
    from iteration to iteration, and the one iteration whose replay is the median can be one where
    the straggler happened to be fast (docs/stragglers.md, "Fifth run").

    Returns ``(fraction, [k, n])``: ``k`` of the ``n`` iterations where the fix saves more than
    ``held_pct`` % (the iterations the rank held back); ``(None, None)`` with fewer than 2 in common.
    """
    common = sorted(set(base_its) & set(fixed_its))
    if len(common) < 2:
        return None, None
    sb = sum(float(base_its[i]) for i in common)
    sf = sum(float(fixed_its[i]) for i in common)
    if sb <= 0:
        return None, None
    held = sum(1 for i in common if float(base_its[i]) - float(fixed_its[i]) > held_pct / 100.0 * float(base_its[i]))
    return 1.0 - sf / sb, [held, len(common)]


def attribute(session: Any) -> dict[str, Any]:
    """Per worker rank: the iteration time saved if it computed like the median of the other workers, its late start.

    Parameters
    ----------
    session : dpro_kit.session.Session
        A session on a trace directory (what-ifs are applied on copies of it).

    Returns
    -------
    dict
        ``baseline_ms`` (the session's prediction), ``ranks``: one dict per worker, most costly
        first - ``node``, ``rank``, ``host``, ``compute_ms`` (traced computation per iteration),
        ``compute_vs_median`` (ratio), ``like_median_ms`` (predicted if it computed like the
        median worker), ``saved_ms`` / ``saved_pct`` (per iteration durations: the fraction of all
        profiled iterations' replayed time the fix saves, :func:`saved_over_iterations`, times
        ``baseline_ms``; with it ``held_back_iterations`` [k, n], the iterations where the fix saves
        over 1 %, and ``saved_median_iteration_ms``, the saving in the median iteration alone), ``late_start_ms``, and where the collector recorded them ``cpus_used`` / ``limit_cpus`` / ``throttled_ms`` (its CPU per step, its cgroup's quota, time stopped by it per step); ``first`` (the node
        ranked first, or None when no rank saves more than 1 % of the iteration), ``note``.
    """
    from .whatif import COMPUTE_KINDS, WhatIf

    ts = session.trace          # the job asked about (a what-if applied), aligned
    base = session.iteration_time_ms()
    workers = [(n, i) for n, i in ts.manifest.nodes.items() if i.role == "worker"]
    ev = ts.events
    comp = ev[ev["kind"].astype(str).isin(COMPUTE_KINDS)]
    n_it = max(1, int(ev["iteration"].nunique()))
    per = comp.groupby(comp["node"].astype(str), observed=True)["dur"].sum() / n_it / 1e3
    med = float(np.median([per.get(n, 0.0) for n, _ in workers])) if workers else 0.0
    late = late_start_ms(ts)
    cpu_use = ts.manifest.facts.cpu_use   # the collector's CPU time and cgroup throttling per step
    order = sorted(workers, key=lambda w: -per.get(w[0], 0.0))
    rows = []
    prior = session.whatif or WhatIf()
    base_its = session.info.get("per_iteration_ms") or {}   # the job asked about, each profiled iteration replayed
    for k, (node, info) in enumerate(order):
        row: dict[str, Any] = {"node": node, "rank": int(info.rank), "host": info.host,
                               "compute_ms": round(float(per.get(node, 0.0)), 3),
                               "compute_vs_median": round(float(per.get(node, 0.0)) / med, 3) if med > 0 else None,
                               "late_start_ms": round(late[node], 3) if node in late else None}
        u = cpu_use.get(node) or {}
        if any(v is not None for v in u.values()):
            row.update(cpus_used=u.get("cpus"), limit_cpus=u.get("limit_cpus"),
                       throttled_ms=round(u["throttled_us"] / 1e3, 3) if u.get("throttled_us") is not None else None)
            if u.get("thread_wait") is not None:
                # the part of its unprofiled step its training thread was runnable but waited for its core (a
                # busy neighbour, ranks sharing a core, a quota's stops): a host slowed by its CPU, in the record
                row["core_wait"] = u["thread_wait"]
        if k < MAX_REPLAYED_RANKS and len(workers) > 1:
            wi = replace(prior, like_median=sorted(set(prior.like_median) | {int(info.rank)}))
            fixed = session.derive(wi)   # shares the read trace, the fit and the per-iteration base replays
            t = fixed.iteration_time_ms()
            saved, held = saved_over_iterations(base_its, fixed.info.get("per_iteration_ms") or {})
            if saved is None:        # one graph of mean durations (or one iteration): that replay alone
                saved = base - t
            else:
                row.update(saved_median_iteration_ms=round(base - t, 3), held_back_iterations=held)
                saved = base * saved
            row.update(like_median_ms=round(base - saved, 3), saved_ms=round(saved, 3),
                       saved_pct=round(100.0 * saved / base, 2) if base > 0 else None)
        rows.append(row)
    rows.sort(key=lambda r: -(r.get("saved_ms") if r.get("saved_ms") is not None else -1e18))
    first = rows[0]["node"] if rows and (rows[0].get("saved_pct") or 0.0) > 1.0 else None
    return {"baseline_ms": round(base, 3), "ranks": rows, "first": first,
            "note": "saved = the replayed iteration time minus the same with that rank computing like the median "
                    "worker (per op), over all profiled iterations (held back: in how many the fix saves > 1 %); late start = median lateness entering collectives vs the earliest rank "
                    "(from the trace); a slow link is not separated from the fitted link model: use "
                    "--slow-link HOST=F to ask"}


def format_attribution(doc: dict[str, Any]) -> str:
    """The text block ``dpro replay --stragglers`` prints."""
    cpu = any("cpus_used" in r for r in doc["ranks"])
    wait = any(r.get("core_wait") is not None for r in doc["ranks"])

    def held(r: dict[str, Any]) -> str:
        h = r.get("held_back_iterations")
        return f"{h[0]}/{h[1]} it" if h else "-"
    per_it = any(r.get("held_back_iterations") for r in doc["ranks"])
    lines = [f"stragglers (predicted {doc['baseline_ms']:.3f} ms; saved = if this rank computed like the median of the other workers"
             + (", over the profiled iterations; held back = iterations where that saves > 1 %):" if per_it else
                ", one replay of mean durations):"),
             f"  {'node':<22}{'rank':>5}{'compute ms':>12}{'x median':>10}{'saved ms':>10}{'saved %':>9}{'held back':>11}{'late start ms':>15}"
             + (f"{'CPU used/limit':>16}{'throttled ms':>14}" if cpu else "") + (f"{'core wait':>11}" if wait else "")]
    for r in doc["ranks"]:
        f = (lambda v, w, p: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}")
        used = (f"{r['cpus_used']:.2f}" if r.get("cpus_used") is not None else "-") + "/" + \
            (f"{r['limit_cpus']:g}" if r.get("limit_cpus") is not None else "-")
        lines.append(f"  {r['node']:<22}{r['rank']:>5}{f(r['compute_ms'], 12, 3)}{f(r['compute_vs_median'], 10, 2)}"
                     f"{f(r.get('saved_ms'), 10, 3)}{f(r.get('saved_pct'), 9, 1)}{held(r):>11}{f(r.get('late_start_ms'), 15, 3)}"
                     + (f"{used:>16}{f(r.get('throttled_ms'), 14, 2)}" if cpu else "")
                     + (f"{f(r.get('core_wait'), 11, 2)}" if wait else ""))
    lines.append(f"  -> {doc['first']} holds the job back most" if doc["first"] else
                 "  -> no rank costs the job more than 1 % of an iteration")
    return "\n".join(lines)


__all__ = ["MAX_REPLAYED_RANKS", "attribute", "format_attribution", "late_start_ms", "saved_over_iterations"]
