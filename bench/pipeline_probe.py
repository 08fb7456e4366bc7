#!/usr/bin/env python3
"""Where a real pipeline job's time goes, per rank and iteration (docs/simulate.md "GPipe vs 1F1B").

``run``: runs ``examples/strategies/train.py`` under a pipeline strategy on the bench's pinned emulated hosts
(``dpro_kit.jobs.run_job``, one core per host, ``--rate`` Mbit/s) with this file as a wrapper around it (the
``rank`` mode, one per rank): the wrapper timestamps, with ``time.monotonic_ns`` (one clock for every
process on the machine), every ``forward_one_chunk`` / ``backward_one_chunk`` of
``torch.distributed.pipelining``, every p2p post (``schedules._batch_p2p``) and wait (``_wait_batch_p2p``),
the stage module's forward, ``torch.autograd.backward``, the loss, ``PipelineScheduleSingle.step`` and the
iteration (with ``ru_minflt`` around it), and writes them to ``OUT/<tag>-r<rank>.json``.  ``--early-receives``
replaces ``ScheduleGPipe._step_microbatches`` by the same schedule with every receive of a phase posted at
the phase's start (the test of gloo's rendezvous: the schedule posts each receive only right before the
action that needs it).

``parts``: per rank, medians over the iterations after the first two, ms: iteration, module forwards,
autograd backwards, loss, p2p waits, and ``runtime`` = ``step()`` minus those (the schedule's own work).

    python bench/pipeline_probe.py run --model transformer --strategy gpipe-2 --out /tmp/pp [--early-receives]
    python bench/pipeline_probe.py parts /tmp/pp/transformer-gpipe-2-1000
(the wrapper replaces private functions of torch 2.13's pipelining; it is a measurement tool, not a runtime.)
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "strategies"


def rank_main(argv: list[str]) -> int:
    """One rank: train.py's main with the probes in place (environment: PROBE_OUT, PROBE_EARLY)."""
    sys.path.insert(0, str(TRAIN))
    import torch
    import torch.distributed.pipelining.schedules as sch
    import torch.distributed.pipelining.stage as stg
    import train
    ev: list[tuple] = []
    now = time.monotonic_ns
    post_of: dict[int, int] = {}

    def timed(owner, name: str, kind: str) -> None:
        f = getattr(owner, name)

        def g(*a, **k):
            t = now()
            try:
                return f(*a, **k)
            finally:
                ev.append((kind, t, now(), None))
        setattr(owner, name, g)

    for owner, name, kind in ((stg._PipelineStageBase, "forward_one_chunk", "F"),
                              (stg._PipelineStageBase, "backward_one_chunk", "B"),
                              (sch.PipelineScheduleSingle, "step", "pstep"), (torch.autograd, "backward", "ag"),
                              (train.Stage, "forward", "mod"), (train, "loss_fn", "loss")):
        timed(owner, name, kind)
    batch_p2p, wait_p2p = sch._batch_p2p, sch._wait_batch_p2p

    def post(ops, desc=None):
        t = now()
        works = batch_p2p(ops, desc=desc)
        ev.append(("post", t, now(), desc, [("send" if o.op is torch.distributed.isend else "recv", o.peer,
                                              o.tensor.numel() * o.tensor.element_size()) for o in ops]))
        for w in works:
            post_of[id(w)] = len(ev) - 1
        return works

    def wait(works):
        t = now()
        wait_p2p(works)
        ev.append(("wait", t, now(), [post_of.get(id(w)) for w in works]))
    sch._batch_p2p, sch._wait_batch_p2p = post, wait
    if os.environ.get("PROBE_EARLY") == "1":
        sch.ScheduleGPipe._step_microbatches = _gpipe_early_receives
    step = train.Job.step

    def iteration(self):
        flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = now()
        step(self)
        ev.append(("iter", t, now(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt))
    train.Job.step = iteration
    out = Path(os.environ["PROBE_OUT"])
    atexit.register(lambda: Path(f"{out}-r{os.environ.get('RANK', '0')}.json").write_text(json.dumps(ev)))
    return train.main(argv)


def _gpipe_early_receives(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
                          loss_kwargs=None):
    """``ScheduleGPipe._step_microbatches`` (torch 2.13) with each phase's receives all posted at its start."""
    import torch.distributed.pipelining.schedules as sch
    arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
    self._initialize_stage(arg_mbs[0], kwarg_mbs[0], target_mbs[0] if target_mbs is not None else None, loss_kwargs)
    m, stage = self._n_microbatches, self._stage
    recvs = [sch._sorted_batch_p2p(stage.get_fwd_recv_ops(i), desc="fwd_recv") for i in range(m)]
    sends = []
    for i in range(m):
        for w in recvs[i].values():
            sch._wait_batch_p2p(w)
        out = stage.forward_one_chunk(i, arg_mbs[i], kwarg_mbs[i], save_forward_output=return_outputs)
        sends.extend(sch._sorted_batch_p2p(stage.get_fwd_send_ops(i), desc="fwd_send").values())
        self._maybe_compute_loss(stage, out, target_mbs, i, loss_kwargs)
    recvs = [sch._sorted_batch_p2p(stage.get_bwd_recv_ops(i), desc="bwd_recv") for i in range(m)]
    for w in sends:
        sch._wait_batch_p2p(w)
    sends = []
    for i in range(m):
        for w in recvs[i].values():
            sch._wait_batch_p2p(w)
        stage.backward_one_chunk(i, loss=self._maybe_get_loss(stage, i), last_backward=i == m - 1)
        sends.extend(sch._sorted_batch_p2p(stage.get_bwd_send_ops(i), desc="bwd_send").values())
    for w in sends:
        sch._wait_batch_p2p(w)
    self._update_losses(stage, losses)
    stage.perform_reduce_grad(m if self.scale_grads else 1)


def run(a: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from dpro_kit.jobs import run_job
    a.out.mkdir(parents=True, exist_ok=True)
    tag = f"{a.model}-{a.strategy}-{a.rate:g}" + ("-early" if a.early_receives else "") + \
        (f"-w{a.width_div}" if a.width_div > 1 else "")
    argv = [sys.executable, str(Path(__file__).resolve()), "rank", "--model", a.model, "--strategy",
            str(TRAIN / f"{a.strategy}.yaml"), "--warmup", str(a.warmup), "--iters", str(a.iters), "--threads", "1",
            "--quiet", "--json-out", str(a.out / f"{tag}.times.json")] + \
        (["--width-div", str(a.width_div)] if a.width_div > 1 else [])
    env = dict(PROBE_OUT=str(a.out / tag), PROBE_EARLY="1" if a.early_receives else "0", DPRO_QUIET="1",
               PYTHONWARNINGS="ignore")
    res = run_job(argv, hosts=2, ranks_per_host=1, rate_mbit=a.rate, cpus_per_host=None, cpusets=a.pin.split(","),
                  cpu_shares=8192, env=env, log=open(a.out / f"{tag}.log", "w"), timeout=300, prefix=a.prefix)
    times = a.out / f"{tag}.times.json"
    if not times.exists():
        print(f"{tag}: FAILED (exit codes {res.codes}; {a.out / (tag + '.log')})", file=sys.stderr)
        return 1
    print(f"{tag}: {json.loads(times.read_text())['iteration_ms']:.2f} ms per iteration ({a.out / tag})")
    return 0


def parts(prefix: str, skip: int = 2) -> str:
    """The per-rank table of one probed job (OUT/<tag>; module docstring)."""
    lines = []
    for r in (0, 1):
        ev = json.loads(Path(f"{prefix}-r{r}.json").read_text())
        rows = []
        for it in [e for e in ev if e[0] == "iter"][skip:]:
            inside = [e for e in ev if it[1] <= e[1] < it[2]]

            def tot(kind: str) -> float:
                return sum(e[2] - e[1] for e in inside if e[0] == kind) / 1e6
            parts_ = [tot(k) for k in ("mod", "ag", "loss", "wait")]
            rows.append([(it[2] - it[1]) / 1e6, *parts_, tot("pstep") - sum(parts_), it[3]])
        med = [statistics.median(x[i] for x in rows) for i in range(7)]
        lines.append(f"rank {r}: iteration {med[0]:.2f}, module fwd {med[1]:.2f}, autograd bwd {med[2]:.2f}, loss "
                     f"{med[3]:.2f}, p2p wait {med[4]:.2f}, runtime {med[5]:.2f} ms; minor faults {med[6]:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "rank":
        return rank_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="transformer")
    r.add_argument("--strategy", default="gpipe-2", help="a 2-stage pipeline file of examples/strategies")
    r.add_argument("--rate", type=float, default=1000.0)
    r.add_argument("--pin", default="0,1")
    r.add_argument("--warmup", type=int, default=4)
    r.add_argument("--iters", type=int, default=12)
    r.add_argument("--width-div", type=int, default=1)
    r.add_argument("--early-receives", action="store_true")
    r.add_argument("--prefix", default="ppp")
    r.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("parts")
    p.add_argument("prefix", help="OUT/<tag> of a run")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        return run(a)
    print(parts(a.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
