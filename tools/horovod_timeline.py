#!/usr/bin/env python3
"""What a bare Horovod timeline says, and what it cannot: ``python tools/horovod_timeline.py TIMELINE.json``.

Prints :func:`dpro_kit.readers.horovod.summarize` as JSON: fusion groups and how often each ran,
median negotiation / fusion-buffer copy / allreduce times, which rank was last ready in the
negotiations (the straggler; rank 0's file only has negotiations), and the limits of a timeline
without the ranks' compute traces. Exit 2 with one line on bad input.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpro_kit.errors import DproError  # noqa: E402
from dpro_kit.readers.horovod import summarize  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tools/horovod_timeline.py HOROVOD_TIMELINE.json", file=sys.stderr)
        return 2
    try:
        print(json.dumps(summarize(args[0]), indent=1))
    except DproError as exc:
        print(f"dpro: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
