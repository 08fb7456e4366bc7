"""``dpro merge``: put the per-host folders of one multi-host ``dpro profile`` run into one folder."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import click

from ..errors import DproError


@click.command(short_help="Copy the per-host folders of one multi-host `dpro profile` run into one folder.",
               epilog="""\b
Examples:
  dpro merge hostA/ hostB/ -o run/ && dpro replay run/
  dpro merge /mnt/host*/trace -o run/ --json
""")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--out", required=True, type=click.Path(path_type=Path),
              help="New folder to write (refused if it exists and is not empty).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def merge(sources: tuple[Path, ...], out: Path, as_json: bool) -> None:
    """Copy every ``<host>/<rank>/`` folder of SOURCES into OUT and check they are one complete run.

    Each host of a multi-host job runs its own ``dpro profile --out DIR --host hostN``; when
    the hosts do not share a file system, copy their DIRs to one machine and merge them:

        dpro merge hostA/ hostB/ -o run/ && dpro replay run/

    Plain ``cp -r hostA/* hostB/* run/`` works as well: the loader builds the manifest from the
    per-rank meta.json. merge also refuses two sources holding the same ``<host>/<rank>``
    folder, and says which ranks are missing or which rank folders belong to an older run.
    """
    from dpro_torch.manifest import find_metas, manifest_from_dir

    if out.exists() and any(out.iterdir()):
        raise DproError("refusing to overwrite a folder that is not empty", path=out, hint="give a new -o folder")
    plan: dict[str, Path] = {}
    for src in sources:
        metas = find_metas(src)
        if not metas:
            raise DproError("no */*/meta.json written by dpro profile", path=src,
                            hint="pass the --out folders of the hosts' `dpro profile` commands")
        for p, _ in metas:
            rel = p.parent.relative_to(src).as_posix()
            if rel in plan:
                raise DproError(f"rank folder {rel} is in both {plan[rel].parent.parent} and {src}", path=src,
                                hint="give each host its own --host name, or drop the older copy")
            plan[rel] = p.parent
    out.mkdir(parents=True, exist_ok=True)
    for rel, d in sorted(plan.items()):
        shutil.copytree(d, out / rel)
    doc, notes, err = manifest_from_dir(out)
    for n in notes:
        click.echo(f"dpro merge: {n}", err=True)
    if err:
        raise DproError(f"merged, but not usable: {err}", path=out)
    summary = {"out": str(out), "rank_folders": sorted(plan), "world_size": doc["world_size"],
               "run_id": doc["extra"].get("run_id"), "stale_ignored": notes}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"dpro merge: {len(plan)} rank folder(s) into {out}, run {summary['run_id']}, world size "
                   f"{doc['world_size']}; next: dpro replay {out}", err=True)
    sys.stdout.flush()


__all__ = ["merge"]
