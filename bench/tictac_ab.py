"""TicTac A/B: default vs TIC vs TAC vs a random transfer order (seed 003; docs/tictac.md).

    python bench/tictac_ab.py --synthetic                 # replayer only: bench/synthetic.py PS graphs

``--synthetic`` replays PS graphs of :mod:`synthetic` (``next_iteration="per_layer"``:
the next forward of layer l waits only for its own pull, as MXNet's engine runs it;
``--barrier``: every op of the next iteration waits for every pull) under each order
and prints, per graph, the replayed iteration time (steady state of ``--iterations``),
TicTac's scheduling efficiency E and speed-up bound S (reference worker), and the
change against the default order.  No MXNet needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402
from dpro_kit.optimize import tictac  # noqa: E402
from dpro_kit.replay import replay  # noqa: E402

ORDERS = ("default", "tic", "tac", "random")


def predict(g, iterations: int) -> dict[str, dict[str, float]]:
    """Replayed iteration time (ms), E and S of ``g`` under each order."""
    out = {}
    for o in ORDERS:
        res = replay(g, iterations=iterations, schedule="graph" if o == "default" else o)
        e = tictac.scheduling_efficiency(res, g)
        out[o] = {"ms": res.iteration_time_us / 1e3, "E": e.get("E"), "S": e.get("S")}
    return out


def synthetic_table(args: argparse.Namespace) -> list[dict]:
    rows = []
    print(f"replayed PS graphs (bench/synthetic.py, next iteration: {'barrier' if args.barrier else 'per layer'}, "
          f"{args.ranks_per_host} worker(s) per host sharing its links, layer gradients up to {args.max_mb:g} MiB, "
          f"{args.iterations} iterations, steady state); ms, E in brackets; change vs default")
    print(f"{'ranks':>5} {'srv':>3} {'layers':>6} {'seed':>4} {'S':>5} "
          + " ".join(f"{o:>17}" for o in ORDERS))
    for servers in args.servers:
        for seed in range(args.seeds):
            g = synthetic.synthetic_dfg(ranks=args.ranks, layers=args.layers, buckets=args.buckets, comm="ps",
                                        servers=servers, update="layer", seed=seed,
                                        ranks_per_host=args.ranks_per_host, max_bytes=int(args.max_mb * 2**20),
                                        next_iteration="barrier" if args.barrier else "per_layer")
            p = predict(g, args.iterations)
            base = p["default"]["ms"]
            cells = [f"{v['ms']:7.2f} [{v['E']:.2f}] {100 * (v['ms'] / base - 1):+5.1f}%" for v in p.values()]
            print(f"{args.ranks:>5} {servers:>3} {args.layers:>6} {seed:>4} {p['default']['S']:>5.2f} " + " ".join(cells))
            rows.append({"ranks": args.ranks, "servers": servers, "layers": args.layers, "seed": seed, **p})
    for o in ORDERS[1:]:
        ch = sorted(100 * (r[o]["ms"] / r["default"]["ms"] - 1) for r in rows)
        print(f"{o:>7}: change vs default over {len(ch)} graphs: median {ch[len(ch) // 2]:+.1f} %, "
              f"best {ch[0]:+.1f} %, worst {ch[-1]:+.1f} %")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", action="store_true", help="replayer-only table on synthetic PS graphs")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--ranks-per-host", type=int, default=2, help="workers sharing one host's links")
    ap.add_argument("--max-mb", type=float, default=16.0, help="largest layer gradient (MiB; smallest 4 KiB)")
    ap.add_argument("--servers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--barrier", action="store_true", help="synthetic: the synchronous iteration rule")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if not args.synthetic:
        ap.error("only --synthetic is implemented so far")
    rows = synthetic_table(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
