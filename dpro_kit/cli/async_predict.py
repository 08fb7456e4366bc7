"""``dpro async-predict TRACE``: steps/s of asynchronous PS training for W = 1..N workers.

The model is
:mod:`dpro_kit.async_ps` (Li et al., ICPE'20; formulas in docs/async.md).
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import DproError

__all__ = ["async_predict", "parse_range", "saturation"]


def parse_range(text: str) -> list[int]:
    """``"1-8"`` -> [1..8], ``"1,2,4"`` -> [1, 2, 4]; DproError otherwise."""
    try:
        out = []
        for part in text.split(","):
            a, _, b = part.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    except ValueError:
        raise DproError(f"--workers {text!r} is not a range", hint="use e.g. 1-8 or 1,2,4") from None
    if not out or min(out) < 1:
        raise DproError(f"--workers {text!r}: need W >= 1")
    return sorted(set(out))


def saturation(rows: list[tuple[int, float]], gain: float = 0.05) -> int | None:
    """The smallest W after which one more worker adds less than ``gain`` (relative) throughput."""
    for (w, t), (_w2, t2) in zip(rows, rows[1:]):
        if t2 < t * (1 + gain):
            return w
    return None


@click.command("async-predict", short_help="Predict asynchronous-PS steps/s for W workers from a 1-worker trace.")
@click.argument("trace_dir", type=click.Path(path_type=Path))
@click.option("--bandwidth", "bandwidth", required=True, type=click.FloatRange(min=0.001), metavar="MBIT",
              help="Bandwidth of the PS link (each direction) and of each worker's link, Mbit/s.")
@click.option("--workers", default="1-8", show_default=True, help="W values: a range 1-8 or a list 1,2,4.")
@click.option("--placement", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON {variable name: PS index} as the job placed them (default with --ps 2: greedy by bytes).")
@click.option("--ps", "num_ps", default=1, show_default=True, type=click.IntRange(1, 2),
              help="Parameter servers (variables placed greedily by bytes; §5 bandwidth sharing for 2).")
@click.option("--measured-1w", "measured", type=click.FloatRange(min=0.0, min_open=True), default=None,
              metavar="STEPS_PER_S", help="Measured steps/s of the 1-worker run at this bandwidth: calibrates "
                                          "the fixed per-step dispatch overhead (docs/async.md).")
@click.option("--calibrate", "calibrate_how", type=click.Choice(["bandwidth", "overhead"]), default="bandwidth",
              show_default=True, help="What --measured-1w fits: the link's goodput (shared, like iperf's number) "
                                      "or a private per-step delay.")
@click.option("--step-overhead-ms", type=click.FloatRange(min=0.0), default=None,
              help="The per-step overhead directly (instead of --measured-1w).")
@click.option("--win-mb", default=28.0, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="HTTP/2 flow-control window of the stream model, MB (the paper's average).")
@click.option("--alpha-us-per-mb", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Parsing overhead per MB received (alpha of §3.2.1).")
@click.option("--beta-us", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Parsing overhead per received tensor (beta of §3.2.1).")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(min=10),
              help="Steps simulated per worker.")
@click.option("--seeds", default=8, show_default=True, type=click.IntRange(min=1),
              help="Simulations per W (start offsets within one step spread evenly, a low-discrepancy set); the mean "
                   "is the prediction.")
@click.option("--sharing", type=click.Choice(["equal", "arrival"]), default="equal", show_default=True,
              help="How concurrent transfers share a link: equally (the paper's model) or by arrival order "
                   "with the newcomer share and goodput measured on the link (--link; docs/async.md, "
                   "\"Link sharing\").")
@click.option("--link", "link_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A `bench/link_sharing.py --out` file measured at --bandwidth: the newcomer shares and the "
                   "goodput of k concurrent transfers that --sharing arrival uses.")
@click.option("--reverse-path", type=click.Choice(["window", "none"]), default="window", show_default=True,
              help="window: while two or more transfers run in one direction of a PS's link, every transfer of "
                   "that PS, in either direction, gets the same rate (1/m of the link for m of them): the standing "
                   "queue they build is on every flow's round trip (equal TCP windows; docs/async.md, \"The "
                   "equal-window rule\"). No parameter; W = 1 is unchanged. It fits bursts of short transfers (the "
                   "validated jobs: <= ~2 MB per tensor); with long transfers the effect fades. none: the two "
                   "directions are independent (the paper's model).")
@click.option("--run-steps", type=click.IntRange(min=1), default=None, metavar="N",
              help="Predict a run of N steps that all workers start together (ClusterCoordinator.schedule N "
                   "times, then join(): steps/s = N / time until the last ends) instead of the steady window "
                   "after evenly spread start offsets. With --sharing equal such a start stays in lockstep.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def async_predict(trace_dir: Path, bandwidth: float, workers: str, num_ps: int, placement: Path | None,
                  measured: float | None, step_overhead_ms: float | None, win_mb: float, alpha_us_per_mb: float,
                  beta_us: float, steps: int, seeds: int, calibrate_how: str, sharing: str, link_file: Path | None,
                  reverse_path: str, run_steps: int | None, as_json: bool) -> None:
    """Predict the steps/s of asynchronous parameter-server SGD with W workers.

    \b
      dpro async-predict TRACE --bandwidth 100 --workers 1-8 --measured-1w 2.8

    TRACE is a `dpro profile --framework tensorflow` folder: of a real 1-worker ParameterServerStrategy
    job (its coordinator under dpro profile: variables, placement, update and launch times measured;
    without --measured-1w its own measured steps/s calibrate it, so --bandwidth must be the rate it ran
    at), or of the training step in one process; or a `dpro profile --framework mxnet` folder of a
    dist_async (or dist_sync) kvstore job, calibrated the same way when it has 1 worker. Each of W
    workers runs steps sampled from the profiled ones: the variables come down from the PS,
    the step computes, the gradients go up and the PS applies them; concurrent transfers share
    the PS link equally (discrete-event simulation, Li et al. ICPE'20), or, with `--sharing arrival
    --link FILE`, as the link measured by bench/link_sharing.py shares it (a transfer joining a busy
    link gets the measured newcomer share). Prints steps/s per W and the saturation point (the W
    after which one more worker adds < 5 %).
    """
    from ..async_ps import calibrate, link_model, predict, template_from_trace

    ws = parse_range(workers)
    if run_steps is not None and run_steps < max(ws):
        raise DproError(f"--run-steps {run_steps} is fewer than the {max(ws)} workers",
                        hint="give at least one step per worker")
    link = None
    if sharing == "arrival":
        if link_file is None:
            raise DproError("--sharing arrival needs --link FILE (the link's measured sharing)",
                            hint="measure it: python bench/link_sharing.py --bandwidths RATE --out FILE")
        from ..trace import read_json
        link = link_model(read_json(link_file, what="link experiment file"), bandwidth, path=link_file)
    elif link_file is not None:
        raise DproError("--link is used only with --sharing arrival", hint="add --sharing arrival or drop --link")
    place = None
    if placement is not None:
        from ..trace import read_json
        place = read_json(placement, what="placement file")
        if not isinstance(place, dict) or not all(isinstance(v, int) for v in place.values()):
            raise DproError("expected a JSON object {variable name: PS index}", path=placement)
    tpl = template_from_trace(trace_dir, num_ps=num_ps, placement=place)
    many = None
    if tpl.trace_workers > 1:
        # the method (seed 004) takes one worker's steps run alone; here they ran beside other workers
        many = (f"the traced job has {tpl.trace_workers} workers: the step is {tpl.node}'s, whose compute and "
                f"transfers ran beside the other {tpl.trace_workers - 1}, so its times may include their "
                "contention and are not calibrated by the trace; profile a 1-worker job (or give --measured-1w) "
                "for the prediction the method describes")
        click.echo(f"dpro: note: {trace_dir}: {many}", err=True)
    from_trace = None
    if measured is None and step_overhead_ms is None:
        # a traced ParameterServerStrategy job measured its own 1-worker steps (the coordinator's, unprofiled)
        from ..trace import load_trace
        man = load_trace(trace_dir).manifest
        ms = (man.extra or {}).get("measured_iteration_ms") if (man.extra or {}).get("strategy") == "ps" else None
        if ms and man.world_size == 1:
            measured = from_trace = 1e3 / float(ms)
    kw = dict(bandwidth_mbit=bandwidth, steps=steps, win_bytes=win_mb * 1e6, num_ps=num_ps,
              alpha_us_per_mb=alpha_us_per_mb, beta_us=beta_us, sharing=sharing, reverse_path=reverse_path)
    if link is not None:
        kw.update(newcomer_share=link["newcomer_share"], goodput=link["goodput"])
    ovh_us = (step_overhead_ms or 0.0) * 1e3
    calibrated = None
    if measured is not None:
        fit = calibrate(tpl, measured, how=calibrate_how, **kw)
        kw["bandwidth_mbit"], ovh_us, calibrated = fit["bandwidth_mbit"], fit["step_overhead_us"], fit["reached"]
        if not calibrated:
            click.echo(f"dpro: warning: {trace_dir}: the traced step is slower than the measured 1-worker step "
                       f"({1e3 / measured:.1f} ms) at any bandwidth (the profiler's cost, or a loaded machine when "
                       "profiled): W = 1 is not calibrated and every prediction is low; re-profile on a quiet "
                       "machine, or give --measured-1w from a run like the traced one", err=True)
    if run_steps is not None:
        kw["total_steps"] = run_steps
    preds = predict(tpl, ws, seeds=seeds, step_overhead_us=ovh_us, **kw)
    rows = [(p.workers, p.steps_per_s) for p in preds]
    sat = saturation(rows)
    doc = {"trace": str(trace_dir), "bandwidth_mbit": bandwidth, "effective_bandwidth_mbit": kw["bandwidth_mbit"],
           "ps": num_ps, "step_overhead_ms": ovh_us / 1e3, "measured_1w": measured,
           "measured_1w_from_trace": from_trace is not None, "calibrated": calibrated,
           "trace_workers": tpl.trace_workers, "worker": tpl.node, "note": many,
           "bytes_down_per_step": tpl.total_bytes("down"), "bytes_up_per_step": tpl.total_bytes("up"),
           "seeds": seeds, "saturation_workers": sat, "sharing": sharing, "run_steps": run_steps,
           "reverse_path": reverse_path,
           "link": None if link is None else {"file": str(link_file), "goodput": link["goodput"],
                                              "newcomer_share_mean": {d: sum(v) / len(v) for d, v in
                                                                      link["newcomer_share"].items()}},
           "predicted": [{"workers": p.workers, "steps_per_s": p.steps_per_s, "low": p.low, "high": p.high}
                         for p in preds]}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"{trace_dir}: {len(tpl.ops)} ops per step, {tpl.total_bytes('down') / 1e6:.2f} MB down / "
               f"{tpl.total_bytes('up') / 1e6:.2f} MB up per step, {num_ps} PS at {bandwidth:g} Mbit/s "
               f"(effective {kw['bandwidth_mbit']:.1f}), step overhead {ovh_us / 1e3:.2f} ms")
    if from_trace is not None:
        click.echo(f"calibrated on the trace's own measured 1-worker steps: {from_trace:.2f} steps/s "
                   f"(--bandwidth must be the rate the traced job ran at)")
    if link is not None:
        click.echo("sharing by arrival on the measured link: mean newcomer share " +
                   ", ".join(f"{d} {sum(v) / len(v):.2f}" for d, v in link["newcomer_share"].items()) +
                   "; goodput of k = 1.. transfers " +
                   "; ".join(f"{d} " + " ".join(f"{g:.2f}" for g in v) for d, v in link["goodput"].items()))
    if reverse_path == "none":
        click.echo("--reverse-path none: the two directions of a PS's link are independent (the paper's model)")
    click.echo(f"workers  steps/s  speed-up  range over {seeds} start offsets")
    for p in preds:
        click.echo(f"{p.workers:7d}  {p.steps_per_s:7.2f}  {p.steps_per_s / preds[0].steps_per_s:7.2f}x  "
                   f"{p.low:.2f} .. {p.high:.2f}")
    click.echo(f"saturation: {sat} workers (one more adds < 5 %)" if sat else
               "no saturation within the W range")
